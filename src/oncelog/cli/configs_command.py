"""``oncelog configs``: describe and change topic and broker configs, as Kafka's
kafka-configs.sh (``--entity-type topics|brokers``, ``--entity-name`` or
``--entity-default``, ``--describe [--all]`` or ``--alter --add-config k=v,k2=v2
--delete-config k``). Changes go through IncrementalAlterConfigs."""

from __future__ import annotations

import argparse
import re

# kafka-configs' --add-config: pairs split at commas outside brackets (a list value is written
# [a,b]); the brackets themselves are dropped.
_PAIR_SPLIT = re.compile(r",(?=[^\]]*(?:\[|$))")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--entity-type", choices=["topics", "brokers", "users"], default=None)
    p.add_argument("--entity-name", default=None,
                   help="the topic, the broker's node id, or the user")
    p.add_argument("--entity-default", action="store_true",
                   help="the brokers' cluster-wide default (with --entity-type brokers)")
    p.add_argument("--topic", default=None, help="same as --entity-type topics --entity-name")
    p.add_argument("--broker", default=None, help="same as --entity-type brokers --entity-name")
    p.add_argument("--broker-defaults", action="store_true",
                   help="same as --entity-type brokers --entity-default")
    action = p.add_mutually_exclusive_group(required=True)
    action.add_argument("--describe", action="store_true")
    action.add_argument("--alter", action="store_true")
    p.add_argument("--all", action="store_true",
                   help="with --describe: every config, not only the dynamic ones")
    p.add_argument("--add-config", action="append", default=[],
                   help="k1=v1,k2=[v1,v2] (repeatable)")
    p.add_argument("--delete-config", action="append", default=[],
                   help="k1,k2 (repeatable)")


def parse_add_config(texts: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for text in texts:
        for pair in _PAIR_SPLIT.split(text.strip()):
            if not pair.strip():
                continue
            if "=" not in pair:
                raise ValueError(f"--add-config: expected key=value, got {pair!r}")
            key, value = pair.split("=", 1)
            value = value.strip()
            if value.startswith("[") and value.endswith("]"):
                value = value[1:-1]
            out[key.strip()] = value
    return out


def _resources(args, admin) -> list:
    """(resource, what it is called) of the entities named, or of every one of the type for
    --describe without a name, as kafka-configs."""
    from ..client.admin.admin_configs import ConfigResource

    if args.topic is not None:
        args.entity_type, args.entity_name = "topics", args.topic
    elif args.broker is not None:
        args.entity_type, args.entity_name = "brokers", args.broker
    elif args.broker_defaults:
        args.entity_type, args.entity_default = "brokers", True
    if args.entity_type is None:
        raise ValueError("give --entity-type (topics or brokers), or --topic / --broker")
    if args.entity_type == "topics":
        if args.entity_name:
            names = [args.entity_name]
        elif args.describe:
            names = admin.list_topics(include_internal=True)
        else:
            raise ValueError("--entity-type topics needs --entity-name")
        return [(ConfigResource.topic(n), f"topic {n}") for n in names]
    if args.entity_default:
        return [(ConfigResource.broker_default(), "brokers in the cluster")]
    if args.entity_name:
        try:
            nodes = [int(args.entity_name)]
        except ValueError:
            raise ValueError("The entity name for brokers must be a valid integer broker id, "
                             f"found: {args.entity_name}") from None
    elif args.describe:
        nodes = sorted(admin.describe_cluster().nodes)
    else:
        raise ValueError("--entity-type brokers needs --entity-name or --entity-default")
    out = [(ConfigResource.broker(n), f"broker {n}") for n in nodes]
    if not args.entity_name:
        out.append((ConfigResource.broker_default(), "brokers in the cluster"))
    return out


def run(args, connect) -> int:
    from .. import Admin

    with Admin(**connect(args)) as admin:
        if args.entity_type == "users":  # SCRAM credentials (KIP-554)
            from .scram_commands import run_users

            return run_users(args, admin)
        resources = _resources(args, admin)
        if args.alter:
            return _alter(args, admin, *resources[0])
        for resource, what in resources:
            _describe(args, admin, resource, what)
        return 0


def _alter(args, admin, resource, what: str) -> int:
    from ..client.admin.admin_configs import AlterConfigOp, OpType

    added = parse_add_config(args.add_config)
    deleted = [k.strip() for text in args.delete_config for k in text.split(",") if k.strip()]
    if not added and not deleted:
        raise ValueError("--alter needs --add-config or --delete-config")
    both = sorted(set(added) & set(deleted))
    if both:
        raise ValueError(f"both added and deleted: {', '.join(both)}")
    if deleted:  # kafka-configs: only what is set may be deleted
        current = _dynamic(admin, resource, all_configs=False)
        missing = [k for k in deleted if k not in current]
        if missing:
            raise ValueError(f"Invalid config(s): {','.join(missing)}")
    ops = [AlterConfigOp(k, v, OpType.SET) for k, v in added.items()]
    ops += [AlterConfigOp(k, None, OpType.DELETE) for k in deleted]
    admin.incremental_alter_configs({resource: ops})
    default = "default " if resource.name == "" else ""
    print(f"Completed updating {default}config for {what}.")
    return 0


def _dynamic(admin, resource, all_configs: bool) -> dict:
    """The resource's entries: all of them, or those set at its own level (a topic's
    overrides, a broker's own dynamic configs, the cluster-wide defaults)."""
    from ..client.admin.admin_configs import ConfigResourceType, ConfigSource

    entries = admin.describe_configs([resource], include_synonyms=True)[resource]
    if all_configs:
        return entries
    if resource.type == ConfigResourceType.TOPIC:
        own = ConfigSource.DYNAMIC_TOPIC_CONFIG
    elif resource.name:
        own = ConfigSource.DYNAMIC_BROKER_CONFIG
    else:
        own = ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG
    return {k: e for k, e in entries.items() if e.source == own}


def _describe(args, admin, resource, what: str) -> None:
    if resource.name == "":
        print("Default configs for brokers in the cluster are:")
    else:
        print(f"{'All' if args.all else 'Dynamic'} configs for {what} are:")
    entries = _dynamic(admin, resource, args.all)
    for name in sorted(entries):
        e = entries[name]
        synonyms = ", ".join(f"{s.source.name}:{s.name}={s.value}" for s in e.synonyms)
        print(f"  {name}={e.value} sensitive={str(e.is_sensitive).lower()} "
              f"synonyms={{{synonyms}}}")
