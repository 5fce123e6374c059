"""``oncelog groups`` (also ``consumer-groups``): Kafka's kafka-consumer-groups.sh.
``list``: its --list, with the ``--state`` (KIP-518) and ``--type`` (KIP-848) filters: group ids
alone, or a table with the columns the filters ask for (GROUP, then TYPE, then STATE), as
Kafka prints it. ``describe``: its describe views (offsets and lag, ``--members``,
``--state``). ``delete`` and ``delete-offsets``: its --delete and --delete-offsets.
``reset-offsets`` lives in cli/group_reset.py. Every view also prints as JSON (``--output
json``): one array of objects keyed by the columns' names in snake case (``current_offset``,
``log_end_offset``: what ``jq`` reads without quoting), null where the table prints ``-``."""

from __future__ import annotations

import sys

from ..spark_markers import is_marker_offset
from .group_args import group_ids, topic_partitions
from .group_lso import lso_holds, note
from .group_reset import run_reset
from .table import MISSING, cell, dump_json, json_key, table_line


def run(args, admin) -> int:
    """One ``groups`` action (``args.groups_command``) with an Admin client."""
    action = args.groups_command
    if action == "list":
        return run_list(args, admin)
    if action == "describe":
        return run_describe(args, admin)
    if action == "delete":
        return run_delete(args, admin)
    if action == "delete-offsets":
        return run_delete_offsets(args, admin)
    return run_reset(args, admin)


def run_list(args, admin) -> int:
    """``args.state`` / ``args.type``: lists of filters (empty: none); given, even as
    ``--state`` without a value (every state), they add their column."""
    states = [s for s in args.state or () if s]
    types = [t for t in args.type or () if t]
    groups = admin.list_consumer_groups(states=states or None, types=types or None)
    show_state, show_type = args.state is not None, args.type is not None
    if args.output == "json":
        dump_json([{"group": g.group_id, "type": g.type, "state": g.state} for g in groups])
        return 0
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


# --- describe: Kafka's ConsumerGroupCommand describe views --------------------------------------

LATEST = -1  # ListOffsets spec: the log end offset


def run_describe(args, admin) -> int:
    """``--group G`` (repeatable, or ``--all-groups``): per partition the committed
    offset, log end offset and lag with the member consuming it (Kafka's default view),
    ``--members`` (``--verbose``: with assignments) the members, ``--state`` the group's
    coordinator, assignor, state and member count. Groups in id order, as Kafka's TreeMap."""
    described = admin.describe_consumer_groups(group_ids(args, admin))
    as_json = args.output == "json"
    rows_json: list[dict] = []
    for group_id in sorted(described):
        group = described[group_id]
        holds = None
        if args.members:
            header, rows, widths = _members(group, args.verbose)
        elif args.state is not None:
            header, rows, widths = _state(group)
        else:
            header, rows, widths = _offsets(admin, group)
            holds = lso_holds(admin, rows)  # oncelog's own: lag an open transaction holds
        if as_json:
            rows_json += [dict(zip(map(json_key, header), row, strict=True)) for row in rows]
            if holds is not None:
                for obj in rows_json[len(rows_json) - len(rows):]:
                    obj["held_by_transaction"] = holds.get((obj["topic"], obj["partition"]))
        elif rows or args.members:  # as Kafka's printMembers: the header even with no one
            print()
            for row in [header, *rows]:
                print(table_line([cell(c) for c in row], widths))
            if holds:
                print()
                for (topic, partition), hold in sorted(holds.items()):
                    print(note(topic, partition, hold))
    if as_json:
        dump_json(rows_json)
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


OFFSETS_HEADER = ["GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG",
                  "CONSUMER-ID", "HOST", "CLIENT-ID"]


def _offsets(admin, group) -> tuple[list[str], list[list], list[int]]:
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
    rows: list[list] = []
    for tps, m in owners:
        for tp in tps:
            offset = committed.get(tp)
            end = ends[tp].offset if tp in ends else None
            lag = end - offset if offset is not None and end is not None else None
            if is_marker_offset(tp.topic):
                lag = None  # a Spark sink's marker: a batch id, not a position (no lag)
            rows.append([group.group_id, tp.topic, tp.partition, offset, end, lag,
                         m.member_id if m else None, m.host if m else None,
                         m.client_id if m else None])
    if not _should_print(group, len(rows)):
        rows = []
    widths = [max([15, *(len(r[0]) for r in rows)]), max([15, *(len(r[1]) for r in rows)]),
              10, 15, 15, 15, max([15, *(len(cell(r[6])) for r in rows)]),
              max([15, *(len(cell(r[7])) for r in rows)])]
    return OFFSETS_HEADER, rows, widths


def _members(group, verbose: bool) -> tuple[list[str], list[list], list[int]]:
    """GROUP CONSUMER-ID [GROUP-INSTANCE-ID] HOST CLIENT-ID #PARTITIONS [ASSIGNMENT]: the
    instance id column only when a member has one; the header even for a group without
    members, as Kafka's printMembers."""
    members = group.members
    if not _should_print(group, len(members)):
        members = ()
    with_instance = any(m.group_instance_id for m in members)
    rows: list[list] = []
    for m in members:
        row: list = [group.group_id, m.member_id]
        if with_instance:
            row.append(m.group_instance_id or "")
        row += [m.host, m.client_id, len(m.assignment)]
        if verbose:
            row.append(_assignment_text(m.assignment))
        rows.append(row)
    header = ["GROUP", "CONSUMER-ID"] + (["GROUP-INSTANCE-ID"] if with_instance else []) + [
        "HOST", "CLIENT-ID", "#PARTITIONS"] + (["ASSIGNMENT"] if verbose else [])
    mins = [15, 15] + ([17] if with_instance else []) + [15, 15]
    widths = [max([w, *(len(r[i]) for r in rows)]) for i, w in enumerate(mins)] + [15]
    return header, rows, widths


def _assignment_text(assignment) -> str:
    """Kafka's verbose ASSIGNMENT: ``topic(0,1), other(2)``."""
    if not assignment:
        return MISSING
    by_topic: dict[str, list[int]] = {}
    for tp in assignment:
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    return ", ".join(sorted(f"{t}({','.join(str(p) for p in sorted(ps))})"
                            for t, ps in by_topic.items()))


def _state(group) -> tuple[list[str], list[list], list[int]]:
    """GROUP COORDINATOR (ID) ASSIGNMENT-STRATEGY STATE #MEMBERS."""
    header = ["GROUP", "COORDINATOR (ID)", "ASSIGNMENT-STRATEGY", "STATE", "#MEMBERS"]
    if not _should_print(group, 1):
        return header, [], []
    c = group.coordinator
    coordinator = f"{c.host}:{c.port}  ({c.node_id})"
    # As Kafka: the first column is as wide as the coordinator's text (or 25)
    widths = [max(25, len(coordinator)), 25, 20, 15]
    return header, [[group.group_id, coordinator, group.partition_assignor, group.state,
                     len(group.members)]], widths


# --- delete -------------------------------------------------------------------------------------

# Kafka's Errors descriptions for what DeleteGroups answers (its tool prints the exception's
# message).
ERROR_TEXT = {
    "NonEmptyGroupError": "The group is not empty.",
    "GroupIdNotFoundError": "The group id does not exist.",
    "GroupAuthorizationFailedError": "Group authorization failed.",
    "InvalidGroupIdError": "The configured groupId is invalid.",
    "GroupSubscribedToTopicError": "The consumer group is actively subscribed to the topic",
    "UnknownTopicOrPartitionError": "This server does not host this topic-partition.",
    "TopicAuthorizationFailedError": "Topic authorization failed.",
}

# Kafka's deleteOffsets: its words for the group's own error
DELETE_OFFSETS_ERRORS = {
    "InvalidGroupIdError": "'{}' is not valid.",
    "GroupIdNotFoundError": "'{}' does not exist.",
    "GroupAuthorizationFailedError": "Access to '{}' is not authorized.",
    "NonEmptyGroupError": "Deleting offsets of a consumer group '{}' is forbidden if the "
                          "group is not empty.",
}


def error_text(exc: BaseException) -> str:
    return ERROR_TEXT.get(type(exc).__name__, str(exc))


def run_delete(args, admin) -> int:
    """Kafka's --delete: every group asked (``--group``, repeatable, or ``--all-groups``) is
    deleted with its offsets unless it has members (NON_EMPTY_GROUP) or is unknown; Kafka's
    messages. Exit 1 when one could not be deleted."""
    results = admin.delete_consumer_groups(group_ids(args, admin))
    deleted = [g for g, e in results.items() if e is None]
    failed = {g: e for g, e in results.items() if e is not None}
    if args.output == "json":
        dump_json([{"group": g, "deleted": e is None,
                     "error": None if e is None else error_text(e)}
                    for g, e in results.items()])
    elif not failed:
        print("Deletion of requested consumer groups ('" + "', '".join(deleted)
              + "') was successful.")
    else:
        print("\nError: Deletion of some consumer groups failed:")
        for g, e in failed.items():
            print(f"* Group '{g}' could not be deleted due to: {error_text(e)}")
        if deleted:
            print("\nThese consumer groups were deleted successfully: '"
                  + "', '".join(deleted) + "'")
    return 1 if failed else 0


def run_delete_offsets(args, admin) -> int:
    """Kafka's --delete-offsets: forget one group's committed offsets of some partitions
    (OffsetDelete, KIP-496); a partition of a topic a member is subscribed to keeps its
    offset (GROUP_SUBSCRIBED_TO_TOPIC). Kafka's messages and TOPIC PARTITION STATUS table;
    exit 1 on any error."""
    from ..errors import KafkaError

    if not args.group or len(args.group) != 1 or not args.topic:
        raise ValueError("delete-offsets takes one --group and at least one --topic")
    group_id = args.group[0]
    partitions = topic_partitions(admin, args.topic)
    try:
        results = admin.delete_consumer_group_offsets(group_id, partitions)
    except KafkaError as exc:
        text = DELETE_OFFSETS_ERRORS.get(type(exc).__name__)
        if text is None:
            raise
        print("\nError: " + text.format(group_id))
        return 1
    rows = sorted(results.items(), key=lambda item: (item[0].topic, item[0].partition))
    failed = any(e is not None for _, e in rows)
    if args.output == "json":
        dump_json([{"topic": tp.topic, "partition": tp.partition,
                     "error": None if e is None else error_text(e)} for tp, e in rows])
        return 1 if failed else 0
    if failed:
        print("\nError: Encounter some partition level error, see the follow-up details:")
    else:
        print(f"Request succeed for deleting offsets with topic {', '.join(args.topic)} "
              f"group {group_id}")
    print()
    print(table_line(["TOPIC", "PARTITION", "STATUS"], [30, 15]))
    for tp, e in rows:
        print(table_line([tp.topic, str(tp.partition),
                          "Successful" if e is None else f"Error: :{error_text(e)}"],
                         [30, 15]))
    return 1 if failed else 0


# --- the command line ---------------------------------------------------------------------------

def add_parser(sub, add_bootstrap) -> None:
    """The ``groups`` command (alias ``consumer-groups``) and its actions."""
    g = sub.add_parser(
        "groups", aliases=["consumer-groups"],
        help="list, describe, reset the offsets of or delete consumer groups",
        description="Consumer groups, as Kafka's kafka-consumer-groups.sh (whose action "
        "flags --list, --describe, --reset-offsets, --delete are accepted too).")
    gsub = g.add_subparsers(dest="groups_command", required=True, metavar="ACTION")

    def action(name: str, text: str, description: str):
        p = gsub.add_parser(name, help=text, description=description)
        add_bootstrap(p)
        p.add_argument("--output", choices=["table", "json"], default="table",
                       help="table (Kafka's columns) or json (one array of objects)")
        return p

    def groups(p, text: str) -> None:
        p.add_argument("--group", action="append", default=None, help=text + " (repeatable)")
        p.add_argument("--all-groups", action="store_true", help="every consumer group")

    lp = action("list", "list consumer groups", "Every consumer group, optionally only in some "
                "states (--state Stable) or of some types (--type classic); either flag adds "
                "its column.")
    lp.add_argument("--state", nargs="?", action="append", const="", default=None,
                    help="only groups in this state (repeatable; alone: show the states)")
    lp.add_argument("--type", nargs="?", action="append", const="", default=None,
                    help="only groups of this type: classic, consumer (repeatable; alone: "
                    "show the types)")

    dp = action("describe", "offsets and lag, members or state of groups",
                "Per partition the committed offset (CURRENT-OFFSET), log end offset, lag "
                "and consumer; with --members the members (--verbose: and their "
                "partitions); with --state the coordinator, assignor and state.")
    groups(dp, "the group")
    dp.add_argument("--members", action="store_true", help="the members")
    dp.add_argument("--verbose", action="store_true", help="with --members: each member's "
                    "partitions")
    dp.add_argument("--state", nargs="?", action="append", const="", default=None,
                    help="the group's state view")
    dp.add_argument("--offsets", action="store_true",
                    help="the offsets view (the default)")

    rp = action("reset-offsets", "move a group's committed offsets",
                "Set the committed offsets of a group without active members. Prints the "
                "plan; writes it only with --execute (--dry-run is the default).")
    groups(rp, "the group")
    rp.add_argument("--topic", action="append", default=[], metavar="TOPIC[:P,P]",
                    help="a topic, or some of its partitions (repeatable)")
    rp.add_argument("--all-topics", action="store_true",
                    help="every partition the group has committed")
    to = rp.add_mutually_exclusive_group(required=True)
    to.add_argument("--to-earliest", action="store_true", help="each partition's log start")
    to.add_argument("--to-latest", action="store_true", help="each partition's log end")
    to.add_argument("--to-current", action="store_true", help="the committed offset (the "
                    "log end where there is none)")
    to.add_argument("--to-offset", type=int, default=None, metavar="N", help="offset N")
    to.add_argument("--shift-by", type=int, default=None, metavar="N",
                    help="the committed offset plus N (negative: back)")
    to.add_argument("--to-datetime", default=None, metavar="YYYY-MM-DDTHH:mm:SS.sss",
                    help="the first record at or after this time (UTC unless a zone "
                    "follows: Z, +01:00)")
    to.add_argument("--by-duration", default=None, metavar="PnDTnHnMnS",
                    help="the first record at or after this long ago (an ISO-8601 duration, "
                    "as Kafka's: PT30M, P1DT12H)")
    to.add_argument("--from-file", default=None, metavar="CSV",
                    help="the offsets a CSV file gives: topic,partition,offset lines (with one "
                    "--group), or group,topic,partition,offset (as --export writes them)")
    rp.add_argument("--export", action="store_true",
                    help="print the plan as CSV (topic,partition,offset; with more than one "
                    "group group,topic,partition,offset), for --from-file")
    run_mode = rp.add_mutually_exclusive_group()
    run_mode.add_argument("--dry-run", action="store_true", help="only print the plan "
                          "(the default)")
    run_mode.add_argument("--execute", action="store_true", help="write the new offsets")

    xp = action("delete", "delete groups and their offsets",
                "Delete groups without active members, with their committed offsets.")
    groups(xp, "the group")

    op = action("delete-offsets", "forget a group's offsets of some partitions",
                "Delete one group's committed offsets of some partitions (KIP-496); those of "
                "a topic a member is subscribed to are kept.")
    op.add_argument("--group", action="append", default=None, help="the group")
    op.add_argument("--topic", action="append", default=[], metavar="TOPIC[:P,P]",
                    help="a topic, or some of its partitions (repeatable)")
