"""Which groups and partitions a ``groups`` action's flags name, as kafka-consumer-groups.sh
reads them (shared by cli/group_commands.py and cli/group_reset.py)."""

from __future__ import annotations

from ..client.types import TopicPartition


def group_ids(args, admin) -> list[str]:
    """``--group G`` (repeatable, in the order given) or ``--all-groups``."""
    if getattr(args, "all_groups", False):
        return [g.group_id for g in admin.list_consumer_groups()]
    if args.group:
        return list(dict.fromkeys(args.group))
    raise ValueError("give --group or --all-groups")


def topic_partitions(admin, topics: list[str]) -> list:
    """``--topic`` values as Kafka's tool reads them: ``T:0,1`` names partitions, ``T`` alone
    every partition of the topic."""
    named: list[TopicPartition] = []
    whole: list[str] = []
    for arg in topics:
        topic, colon, parts = arg.partition(":")
        if not colon:
            whole.append(topic)
            continue
        try:
            named += [TopicPartition(topic, int(p)) for p in parts.split(",")]
        except ValueError:
            raise ValueError(f"--topic {arg!r}: expected TOPIC or TOPIC:PARTITION,PARTITION"
                             ) from None
    if whole:
        for name, desc in admin.describe_topics(whole).items():
            named += [TopicPartition(name, p.partition) for p in desc.partitions]
    return list(dict.fromkeys(named))
