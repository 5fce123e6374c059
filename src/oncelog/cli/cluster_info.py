"""``oncelog cluster info``: what a Kafka user looks up first about a cluster, in one place.

The cluster id, the controller and the brokers (id, host:port, rack), as Kafka's
``kafka-cluster.sh cluster-id`` and ``kafka-metadata-quorum.sh`` / ``Admin.describeCluster``
report them; the KIP-584 features (finalized levels and their epoch, and the levels the
broker supports, as ``kafka-features.sh describe``); and each broker's API version ranges,
as ``kafka-broker-api-versions.sh`` prints them (``Produce(0): 3 to 12 [usable: 12]``: usable
is the highest version this client and that broker both speak). ``--output json`` gives the
same as one object.
"""

from __future__ import annotations

import argparse
import json

from ..protocol.apis import SUPPORTED_VERSIONS, ApiKey


def add_parser(cluster_parser: argparse.ArgumentParser, add_bootstrap) -> None:
    """``cluster info`` beside ``cluster up`` and ``cluster down``."""
    sub = next(a for a in cluster_parser._actions
               if isinstance(a, argparse._SubParsersAction))
    p = sub.add_parser("info", help="the cluster's id, controller, brokers, features and API "
                       "versions", description=(__doc__ or "").split("\n\n")[1])
    add_bootstrap(p)
    p.add_argument("--output", choices=["text", "json"], default="text")
    p.add_argument("--no-api-versions", dest="api_versions", action="store_false",
                   help="leave out the API version ranges of each broker")


def api_name(key: int) -> str:
    """Kafka's ApiKeys name: ``ListOffsets`` for LIST_OFFSETS; ``Unknown`` for a key we do
    not know."""
    try:
        return "".join(w.capitalize() for w in ApiKey(key).name.split("_"))
    except ValueError:
        return "Unknown"


def usable(key: int, theirs: tuple[int, int]) -> str:
    """NodeApiVersions' ``[usable: N]`` (or why none is)."""
    ours = SUPPORTED_VERSIONS.get(key)
    if ours is None:
        return "unusable: not supported by this client"
    if theirs[1] < ours[0]:
        return "unusable: node too old"
    if theirs[0] > ours[1]:
        return "unusable: node too new"
    return f"usable: {min(ours[1], theirs[1])}"


def gather(admin, with_api_versions: bool) -> dict:
    cluster = admin.describe_cluster()
    features = admin.describe_features()
    brokers = []
    for node_id in sorted(cluster.nodes):
        node = cluster.nodes[node_id]
        entry: dict = {"id": node_id, "host": node.host, "port": node.port, "rack": node.rack}
        if with_api_versions:
            entry["api_versions"] = [
                {"api_key": key, "name": api_name(key), "min_version": lo, "max_version": hi,
                 "usable": usable(key, (lo, hi))}
                for key, (lo, hi) in sorted(admin.api_versions(node_id).items())]
        brokers.append(entry)
    return {
        "cluster_id": cluster.cluster_id,
        "controller_id": cluster.controller_id if cluster.controller_id >= 0 else None,
        "brokers": brokers,
        "finalized_features_epoch": features.finalized_epoch,
        "finalized_features": {k: {"min_version_level": lo, "max_version_level": hi}
                               for k, (lo, hi) in sorted(features.finalized.items())},
        "supported_features": {k: {"min_version": lo, "max_version": hi}
                               for k, (lo, hi) in sorted(features.supported.items())},
    }


def run(args, admin) -> int:
    info = gather(admin, args.api_versions)
    if args.output == "json":
        print(json.dumps(info, indent=2))
        return 0
    print(f"Cluster ID: {info['cluster_id']}")
    controller = info["controller_id"]
    print(f"Controller: {'none' if controller is None else controller}")
    print("Brokers:")
    for b in info["brokers"]:
        print(f"\tid: {b['id']}\t{b['host']}:{b['port']}\track: {b['rack'] or 'null'}")
    print("Features:")  # kafka-features.sh describe's lines
    for name in sorted(set(info["finalized_features"]) | set(info["supported_features"])):
        supported = info["supported_features"].get(name, {})
        finalized = info["finalized_features"].get(name, {})
        print(f"\tFeature: {name}\tSupportedMinVersion: {supported.get('min_version', '-')}\t"
              f"SupportedMaxVersion: {supported.get('max_version', '-')}\t"
              f"FinalizedVersionLevel: {finalized.get('max_version_level', '-')}\t"
              f"Epoch: {info['finalized_features_epoch']}")
    for b in info["brokers"] if args.api_versions else []:
        # kafka-broker-api-versions.sh's layout
        print(f"{b['host']}:{b['port']} (id: {b['id']} rack: {b['rack'] or 'null'}) -> (")
        lines = [f"\t{v['name']}({v['api_key']}): {v['min_version']} to {v['max_version']} "
                 f"[{v['usable']}]" for v in b["api_versions"]]
        print(",\n".join(lines))
        print(")")
    return 0
