"""``oncelog consumer-groups --list``: Kafka's kafka-consumer-groups.sh --list, with its
``--state`` (KIP-518) and ``--type`` (KIP-848) filters: group ids alone, or a table with the
columns the filters ask for (GROUP, then TYPE, then STATE), as Kafka prints it."""

from __future__ import annotations


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
