"""``oncelog topics add-partitions`` (kafka-topics --alter --partitions) and ``oncelog
delete-records`` (kafka-delete-records), through our Admin client."""

from __future__ import annotations

import json
from pathlib import Path


def parse_replica_assignment(text: str) -> list[list[int]]:
    """kafka-topics' ``--replica-assignment``: partitions separated by commas, each one's
    replicas (broker ids) by colons, e.g. ``1:2,2:3`` (with --alter: the added partitions)."""
    out = []
    for part in text.split(","):
        try:
            out.append([int(b) for b in part.split(":")])
        except ValueError:
            raise ValueError(f"--replica-assignment: {part!r} is not broker ids joined by "
                             "':'") from None
    return out


def add_partitions(admin, args) -> int:
    from .. import NewPartitions

    assignment = parse_replica_assignment(args.replica_assignment) \
        if args.replica_assignment else None
    admin.create_partitions({args.topic: NewPartitions(args.partitions, assignment)})
    print(f"Topic {args.topic} now has {args.partitions} partitions.")
    return 0


def offsets_from_json(path: str) -> dict[tuple[str, int], int]:
    """kafka-delete-records' ``--offset-json-file``:
    ``{"partitions": [{"topic": "t", "partition": 0, "offset": 10}], "version": 1}``."""
    try:
        doc = json.loads(Path(path).read_text())
    except OSError as exc:
        raise ValueError(f"--offset-json-file {path}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"--offset-json-file {path}: not JSON ({exc.msg} at line "
                         f"{exc.lineno} column {exc.colno})") from None
    out: dict[tuple[str, int], int] = {}
    try:
        entries = list(doc["partitions"])
    except (KeyError, TypeError):
        raise ValueError(f"--offset-json-file {path}: expected "
                         '{"partitions": [...], "version": 1}') from None
    for e in entries:
        try:
            tp = (str(e["topic"]), int(e["partition"]))
            offset = int(e["offset"])
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"--offset-json-file {path}: each partition needs topic, "
                             f"partition (a number) and offset (a number), not {json.dumps(e)}") from None
        if tp in out:
            raise ValueError(f"--offset-json-file {path}: {tp[0]}-{tp[1]} is listed twice")
        out[tp] = offset
    return out


def delete_records(args, client_config: dict) -> int:
    """``client_config``: the client settings of the common flags (client_commands.connect)."""
    from .. import Admin

    if args.offset_json_file:
        if args.topic:
            raise ValueError("give --offset-json-file or --topic, not both")
        wanted = offsets_from_json(args.offset_json_file)
    elif args.topic:
        if args.offset is None:
            raise ValueError("--topic needs --offset (-1: the high watermark)")
        wanted = {}
    else:
        raise ValueError("give --offset-json-file or --topic/--offset")
    with Admin(**client_config) as admin:
        if args.topic:
            if args.partition is not None:
                indexes = [args.partition]
            else:  # every partition of the topic
                desc = admin.describe_topics([args.topic])[args.topic]
                indexes = [p.partition for p in desc.partitions]
            wanted = {(args.topic, i): args.offset for i in indexes}
        print("Executing records delete operation")
        low = admin.delete_records(wanted)
    print("Records delete operation completed:")
    for tp in sorted(low):
        print(f"partition: {tp.topic}-{tp.partition}\tlow_watermark: {low[tp]}")
    return 0
