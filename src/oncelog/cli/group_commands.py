"""``oncelog consumer-groups --list``: Kafka's kafka-consumer-groups.sh --list, with its
``--state`` (KIP-518) and ``--type`` (KIP-848) filters: group ids alone, or a table with the
columns the filters ask for (GROUP, then TYPE, then STATE), as Kafka prints it.
``--describe``: its describe views (offsets and lag, ``--members``, ``--state``)."""

from __future__ import annotations

import sys


def run_list(args, admin) -> int:
    """``args.state`` / ``args.type``: lists of filters (empty: none); given, even as
    ``--state`` without a value (every state), they add their column."""
    states = [s for s in args.state or () if s]
    types = [t for t in args.type or () if t]
    groups = admin.list_consumer_groups(states=states or None, types=types or None)
    show_state, show_type = args.state is not None, args.type is not None
    if not show_state and not show_type:
        for g in groups:
            print(g.group_id)
        return 0
    width = max([15, *(len(g.group_id) for g in groups)])
    header = ["GROUP".ljust(width)]
    if show_type:
        header.append("TYPE".ljust(15) if show_state else "TYPE")
    if show_state:
        header.append("STATE")
    print(" ".join(header))
    for g in groups:
        row = [g.group_id.ljust(width)]
        if show_type:
            row.append(g.type.ljust(15) if show_state else g.type)
        if show_state:
            row.append(g.state)
        print(" ".join(row))
    return 0


# --- --describe: Kafka's ConsumerGroupCommand describe views ------------------------------------

MISSING = "-"  # Kafka's MISSING_COLUMN_VALUE
LATEST = -1  # ListOffsets spec: the log end offset


def run_describe(args, admin) -> int:
    """``--describe --group G`` (repeatable, or ``--all-groups``): per partition the committed
    offset, log end offset and lag with the member consuming it (Kafka's default view),
    ``--members`` (``--verbose``: with assignments) the members, ``--state`` the group's
    coordinator, assignor, state and member count. Groups in id order, as Kafka's TreeMap."""
    if args.all_groups:
        group_ids = [g.group_id for g in admin.list_consumer_groups()]
    elif args.group:
        group_ids = list(dict.fromkeys(args.group))
    else:
        raise ValueError("--describe needs --group or --all-groups")
    described = admin.describe_consumer_groups(group_ids)
    for group_id in sorted(described):
        group = described[group_id]
        if args.members:
            _print_members(group, args.verbose)
        elif args.state is not None:
            _print_state(group)
        else:
            _print_offsets(admin, group)
    return 0


def _should_print(group, rows: int) -> bool:
    """Kafka's shouldPrintMemberState: a word on stderr for a group that is not Stable."""
    state = group.state
    if state == "Dead":
        print(f"Error: Consumer group '{group.group_id}' does not exist.", file=sys.stderr)
    elif state == "Empty":
        print(f"\nConsumer group '{group.group_id}' has no active members.", file=sys.stderr)
    elif state in ("PreparingRebalance", "CompletingRebalance"):
        print(f"\nWarning: Consumer group '{group.group_id}' is rebalancing.", file=sys.stderr)
    return state != "Dead" and rows > 0


def _print_offsets(admin, group) -> None:
    """GROUP TOPIC PARTITION CURRENT-OFFSET LOG-END-OFFSET LAG CONSUMER-ID HOST CLIENT-ID:
    the members' partitions (members with the most partitions first, each's partitions in
    partition order), then partitions with a committed offset that nobody consumes."""
    committed = admin.list_consumer_group_offsets(group.group_id) \
        if group.state != "Dead" else {}
    owners = []  # (partitions, member or None)
    assigned: set = set()
    for m in sorted((m for m in group.members if m.assignment),
                    key=lambda m: len(m.assignment), reverse=True):
        owners.append((sorted(m.assignment, key=lambda tp: tp.partition), m))
        assigned |= m.assignment
    unowned = [tp for tp in committed if tp not in assigned]
    if unowned:
        owners.append((sorted(unowned, key=lambda tp: tp.partition), None))
    partitions = [tp for tps, _ in owners for tp in tps]
    ends = admin.list_offsets(dict.fromkeys(partitions, LATEST)) if partitions else {}
    rows = []
    for tps, m in owners:
        for tp in tps:
            offset = committed.get(tp)
            end = ends[tp].offset if tp in ends else None
            lag = end - offset if offset is not None and end is not None else None
            rows.append([group.group_id, tp.topic, str(tp.partition), _or_missing(offset),
                         _or_missing(end), _or_missing(lag),
                         m.member_id if m else MISSING, m.host if m else MISSING,
                         m.client_id if m else MISSING])
    if not _should_print(group, len(rows)):
        return
    header = ["GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG",
              "CONSUMER-ID", "HOST", "CLIENT-ID"]
    widths = [max([15, *(len(r[0]) for r in rows)]), max([15, *(len(r[1]) for r in rows)]),
              10, 15, 15, 15, max([15, *(len(r[6]) for r in rows)]),
              max([15, *(len(r[7]) for r in rows)])]
    print()
    for row in [header, *rows]:
        print(_line(row, widths))


def _print_members(group, verbose: bool) -> None:
    """GROUP CONSUMER-ID [GROUP-INSTANCE-ID] HOST CLIENT-ID #PARTITIONS [ASSIGNMENT]: the
    instance id column only when a member has one; the header even for a group without
    members, as Kafka's printMembers."""
    members = group.members
    if not _should_print(group, len(members)):
        members = ()
    with_instance = any(m.group_instance_id for m in members)
    rows = []
    for m in members:
        row = [group.group_id, m.member_id]
        if with_instance:
            row.append(m.group_instance_id or "")
        row += [m.host, m.client_id, str(len(m.assignment))]
        if verbose:
            row.append(_assignment_text(m.assignment))
        rows.append(row)
    header = ["GROUP", "CONSUMER-ID"] + (["GROUP-INSTANCE-ID"] if with_instance else []) + [
        "HOST", "CLIENT-ID", "#PARTITIONS"] + (["ASSIGNMENT"] if verbose else [])
    mins = [15, 15] + ([17] if with_instance else []) + [15, 15]
    widths = [max([w, *(len(r[i]) for r in rows)]) for i, w in enumerate(mins)] + [15]
    print()
    for row in [header, *rows]:
        print(_line(row, widths))


def _assignment_text(assignment) -> str:
    """Kafka's verbose ASSIGNMENT: ``topic(0,1), other(2)``."""
    if not assignment:
        return MISSING
    by_topic: dict[str, list[int]] = {}
    for tp in assignment:
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    return ", ".join(sorted(f"{t}({','.join(str(p) for p in sorted(ps))})"
                            for t, ps in by_topic.items()))


def _print_state(group) -> None:
    """GROUP COORDINATOR (ID) ASSIGNMENT-STRATEGY STATE #MEMBERS."""
    if not _should_print(group, 1):
        return
    c = group.coordinator
    coordinator = f"{c.host}:{c.port}  ({c.node_id})"
    # As Kafka: the first column is as wide as the coordinator's text (or 25)
    widths = [max(25, len(coordinator)), 25, 20, 15]
    print()
    print(_line(["GROUP", "COORDINATOR (ID)", "ASSIGNMENT-STRATEGY", "STATE", "#MEMBERS"],
                widths))
    print(_line([group.group_id, coordinator, group.partition_assignor, group.state,
                 str(len(group.members))], widths))


def _line(cells: list[str], widths: list[int]) -> str:
    """Cells left-justified to their widths, one space apart; the last cell as it is."""
    return " ".join([c.ljust(w) for c, w in zip(cells, widths, strict=False)]
                    + cells[len(widths):]).rstrip()


def _or_missing(value: int | None) -> str:
    return MISSING if value is None else str(value)
