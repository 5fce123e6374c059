"""``oncelog groups reset-offsets``: Kafka's kafka-consumer-groups.sh --reset-offsets.

Scope: ``--topic T`` (every partition) or ``--topic T:0,2`` (repeatable), or ``--all-topics``
(every partition the group has committed). Scenario: ``--to-earliest``, ``--to-latest``,
``--to-current``, ``--to-offset N``, ``--shift-by N``, ``--to-datetime ISO``, ``--by-duration
PnDTnHnMnS``, ``--from-file CSV`` (the partitions and offsets the file names; no scope needed).
The plan (GROUP TOPIC PARTITION NEW-OFFSET, or with ``--export`` Kafka's CSV) is printed; it is
written only with ``--execute`` (``--dry-run`` is the default, as Kafka's). Only a group without active members (Empty, or unknown: Dead) is
reset, as Kafka's tool refuses: a live member would overwrite the offsets with its own.
"""

from __future__ import annotations

import re
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from ..client.types import TopicPartition
from .group_args import group_ids, topic_partitions
from .table import dump_json, table_line

EARLIEST, LATEST = -2, -1  # ListOffsets specs


def run_reset(args, admin) -> int:
    if not args.execute and not args.dry_run:
        print("WARN: No action will be performed as the --execute option is missing.",
              file=sys.stderr)
    if not args.topic and not args.all_topics and args.from_file is None:
        raise ValueError("One of the reset scopes should be defined: --all-topics, --topic.")
    timestamp = parse_datetime(args.to_datetime) if args.to_datetime is not None else None
    if args.by_duration is not None:
        timestamp = int(time.time() * 1000) - parse_duration(args.by_duration)
    ids = group_ids(args, admin)
    from_file = parse_reset_plan(args.from_file, ids) if args.from_file is not None else None
    described = admin.describe_consumer_groups(ids)
    plans: dict[str, dict[TopicPartition, int]] = {}
    refused = False
    for group_id, group in described.items():
        if group.state not in ("Empty", "Dead"):
            print(f"\nError: Assignments can only be reset if the group '{group_id}' is "
                  f"inactive, but the current state is {group.state}.", file=sys.stderr)
            refused = True
            continue
        if from_file is not None:
            if group_id not in from_file:
                raise ValueError(f"No reset plan for group {group_id} found")
            plans[group_id] = _in_range(admin, from_file[group_id])
        else:
            partitions = _partitions(args, admin, group_id)
            plans[group_id] = _new_offsets(args, admin, group_id, partitions, timestamp)
        if args.execute:
            admin.alter_consumer_group_offsets(group_id, plans[group_id])
    if args.export:  # Kafka's exportOffsetsToCsv: the group column only for several groups
        for g, plan in plans.items():
            for tp, offset in plan.items():
                print(",".join(([g] if len(ids) > 1 else [])
                               + [tp.topic, str(tp.partition), str(offset)]))
    elif args.output == "json":
        dump_json([{"group": g, "topic": tp.topic, "partition": tp.partition,
                     "new_offset": offset}
                    for g, plan in plans.items() for tp, offset in plan.items()])
    elif plans:
        # Kafka's printOffsetsToReset: "%n%-30s %-30s %-10s %-15s" per line
        print()
        print(table_line(["GROUP", "TOPIC", "PARTITION", "NEW-OFFSET"], [30, 30, 10]))
        for g, plan in plans.items():
            for tp, offset in plan.items():
                print(table_line([g, tp.topic, str(tp.partition), str(offset)], [30, 30, 10]))
    return 1 if refused else 0


def _partitions(args, admin, group_id: str) -> list[TopicPartition]:
    """``--all-topics``: the partitions the group has committed offsets for; ``--topic``:
    those named."""
    if args.all_topics:
        return sorted(admin.list_consumer_group_offsets(group_id))
    return topic_partitions(admin, args.topic)


def _new_offsets(args, admin, group_id: str, partitions: list[TopicPartition],
                 timestamp: int | None) -> dict[TopicPartition, int]:
    """Kafka's prepareOffsetsToReset: the new offset of each partition for the scenario."""
    if not partitions:
        return {}
    if args.to_earliest:
        return _offsets(admin, partitions, EARLIEST)
    if args.to_latest:
        return _offsets(admin, partitions, LATEST)
    if args.to_offset is not None:
        return _in_range(admin, dict.fromkeys(partitions, args.to_offset))
    if args.shift_by is not None or args.to_current:
        committed = admin.list_consumer_group_offsets(group_id, partitions)
        if args.to_current:  # a partition without a committed offset: its end
            ends = _offsets(admin, [tp for tp in partitions if committed.get(tp) is None],
                            LATEST)
            return {tp: ends[tp] if committed.get(tp) is None else committed[tp]
                    for tp in partitions}
        for tp in partitions:
            if committed.get(tp) is None:
                raise ValueError(f"Cannot shift offset for partition {tp.topic}-"
                                 f"{tp.partition} since there is no current committed "
                                 "offset")
        return _in_range(admin, {tp: committed[tp] + args.shift_by for tp in partitions})
    if timestamp is not None:
        found = admin.list_offsets(dict.fromkeys(partitions, timestamp))
        out = {tp: found[tp].offset for tp in partitions}
        empty = [tp for tp in partitions if out[tp] < 0]
        for tp in empty:
            print(f"\nWarn: Partition {tp.partition} from topic {tp.topic} is empty. "
                  "Falling back to latest known offset.", file=sys.stderr)
        out.update(_offsets(admin, empty, LATEST))
        return out
    raise ValueError("reset-offsets needs one of --to-earliest, --to-latest, --to-current, "
                     "--to-offset, --shift-by, --to-datetime, --by-duration, --from-file")


def _offsets(admin, partitions: list[TopicPartition], spec: int) -> dict[TopicPartition, int]:
    if not partitions:
        return {}
    found = admin.list_offsets(dict.fromkeys(partitions, spec))
    return {tp: found[tp].offset for tp in partitions}


def _in_range(admin, wanted: dict[TopicPartition, int]) -> dict[TopicPartition, int]:
    """Kafka's checkOffsetsRange: an offset past the log end is set to the end, one before
    the log start to the start, with its warning."""
    starts = _offsets(admin, list(wanted), EARLIEST)
    ends = _offsets(admin, list(wanted), LATEST)
    out = {}
    for tp, offset in wanted.items():
        name = f"{tp.topic}-{tp.partition}"
        if offset > ends[tp]:
            print(f"New offset ({offset}) is higher than latest offset for topic partition "
                  f"{name}. Value will be set to {ends[tp]}", file=sys.stderr)
            offset = ends[tp]
        elif offset < starts[tp]:
            print(f"New offset ({offset}) is lower than earliest offset for topic partition "
                  f"{name}. Value will be set to {starts[tp]}", file=sys.stderr)
            offset = starts[tp]
        out[tp] = offset
    return out


def parse_datetime(text: str) -> int:
    """Kafka's Utils.getDateTime: ``YYYY-MM-DDTHH:mm:SS.sss`` with an optional zone (``Z``,
    ``+01:00``); without one, UTC. Milliseconds since the epoch."""
    if "T" not in text:
        raise ValueError(f"--to-datetime {text!r}: Error parsing timestamp. It does not "
                         "contain a 'T' according to ISO8601 format")
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"--to-datetime {text!r}: expected YYYY-MM-DDTHH:mm:SS.sss with an "
                         "optional zone (Z, +01:00)") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


_DURATION = re.compile(
    r"([-+]?)P(?:([-+]?\d+)D)?(?:T(?:([-+]?\d+)H)?(?:([-+]?\d+)M)?"
    r"(?:([-+]?\d+)(?:[.,](\d{0,9}))?S)?)?", re.IGNORECASE)


def parse_duration(text: str) -> int:
    """Java's Duration.parse (Kafka's --by-duration): ``PnDTnHnMn.nS``, e.g. ``PT30M``,
    ``P1DT12H``, ``PT0.5S``; milliseconds."""
    m = _DURATION.fullmatch(text.strip())
    if m is None or not any(m.group(i) for i in (2, 3, 4, 5)) or \
            (text.strip().upper().endswith("T")):
        raise ValueError(f"--by-duration {text!r}: expected an ISO-8601 duration "
                         "PnDTnHnMnS (e.g. PT30M, P1DT12H)")
    days, hours, minutes, seconds = (int(m.group(i) or 0) for i in (2, 3, 4, 5))
    fraction = (m.group(6) or "").ljust(9, "0")
    millis = ((days * 24 + hours) * 60 + minutes) * 60_000 + seconds * 1000
    millis += (-1 if (m.group(5) or "").startswith("-") else 1) * int(fraction[:3] or 0)
    return -millis if m.group(1) == "-" else millis


def parse_reset_plan(path: str, groups: list[str]) -> dict[str, dict[TopicPartition, int]]:
    """Kafka's parseResetPlan: ``topic,partition,offset`` lines for the one group asked,
    ``group,topic,partition,offset`` lines when more are."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ValueError(f"--from-file {path}: {exc.strerror or exc}") from None
    columns = 3 if len(groups) == 1 else 4
    plan: dict[str, dict[TopicPartition, int]] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != columns:
            raise ValueError(f"--from-file {path}: line {number}: expected "
                             + ("topic,partition,offset" if columns == 3
                                else "group,topic,partition,offset") + f", got {line!r}")
        group = groups[0] if columns == 3 else cells.pop(0)
        try:
            tp, offset = TopicPartition(cells[0], int(cells[1])), int(cells[2])
        except ValueError:
            raise ValueError(f"--from-file {path}: line {number}: the partition and offset "
                             f"must be numbers, got {line!r}") from None
        plan.setdefault(group, {})[tp] = offset
    return plan
