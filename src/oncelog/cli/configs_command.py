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
    p.add_argument("--entity-type", choices=["topics", "brokers"], default=None)
    p.add_argument("--entity-name", default=None, help="the topic, or the broker's node id")
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


def _resource(args):
    from ..client.admin_configs import ConfigResource

    if args.topic is not None:
        return ConfigResource.topic(args.topic), f"topic {args.topic}"
    if args.broker is not None:
        return ConfigResource.broker(args.broker), f"broker {args.broker}"
    if args.broker_defaults:
        return ConfigResource.broker_default(), "brokers in the cluster"
    if args.entity_type is None:
        raise ValueError("give --entity-type (topics or brokers), or --topic / --broker")
    if args.entity_type == "topics":
        if not args.entity_name:
            raise ValueError("--entity-type topics needs --entity-name")
        return ConfigResource.topic(args.entity_name), f"topic {args.entity_name}"
    if args.entity_default:
        return ConfigResource.broker_default(), "brokers in the cluster"
    if not args.entity_name:
        raise ValueError("--entity-type brokers needs --entity-name or --entity-default")
    return ConfigResource.broker(args.entity_name), f"broker {args.entity_name}"


def run(args, connect) -> int:
    from .. import Admin
    from ..client.admin_configs import AlterConfigOp, ConfigSource, OpType

    resource, what = _resource(args)
    with Admin(**connect(args)) as admin:
        if args.alter:
            added = parse_add_config(args.add_config)
            deleted = [k.strip() for text in args.delete_config for k in text.split(",")
                       if k.strip()]
            if not added and not deleted:
                raise ValueError("--alter needs --add-config or --delete-config")
            both = sorted(set(added) & set(deleted))
            if both:
                raise ValueError(f"both added and deleted: {', '.join(both)}")
            ops = [AlterConfigOp(k, v, OpType.SET) for k, v in added.items()]
            ops += [AlterConfigOp(k, None, OpType.DELETE) for k in deleted]
            admin.incremental_alter_configs({resource: ops})
            default = "default " if resource.name == "" else ""
            print(f"Completed updating {default}config for {what}.")
            return 0
        entries = admin.describe_configs([resource], include_synonyms=True)[resource]
        dynamic = {ConfigSource.DYNAMIC_TOPIC_CONFIG, ConfigSource.DYNAMIC_BROKER_CONFIG,
                   ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG}
        if resource.name == "":
            heading = "Default configs for brokers in the cluster are:"
        else:
            heading = f"{'All' if args.all else 'Dynamic'} configs for {what} are:"
        print(heading)
        for name in sorted(entries):
            e = entries[name]
            if not args.all and e.source not in dynamic:
                continue
            synonyms = ", ".join(f"{s.source.name}:{s.name}={s.value}" for s in e.synonyms)
            print(f"  {name}={e.value} sensitive={str(e.is_sensitive).lower()} "
                  f"synonyms={{{synonyms}}}")
        return 0
