"""``oncelog topics describe``: Kafka's kafka-topics.sh --describe lines (the topic id and only
the configs that are not defaults), and with ``--offsets`` a partition's offsets and open
transactions: the first thing to look at when read_committed consumers stall.

    Topic: orders	TopicId: 1gUOxrJ5T8WKbUYlM0cF1A	PartitionCount: 2	ReplicationFactor: 1	Configs: retention.ms=3600000
    	Topic: orders	Partition: 0	Leader: 1	Replicas: 1	Isr: 1

``--offsets``: per partition the log start offset, the high watermark and the last stable
offset (ListOffsets: earliest, latest read_uncommitted, latest read_committed), the number of
open transactions and the oldest one's producer id and first offset (DescribeProducers,
KIP-664): an LSO below the high watermark is held there by that transaction.
"""

from __future__ import annotations

import argparse
import base64
import json
import uuid

from .table import print_json, print_table

OFFSETS_COLUMNS = ["Topic", "Partition", "LogStartOffset", "HighWatermark",
                   "LastStableOffset", "OpenTransactions", "OldestTxnProducerId",
                   "OldestTxnStartOffset"]

EARLIEST, LATEST = -2, -1


def add_arguments(td: argparse.ArgumentParser) -> None:
    td.add_argument("--offsets", action="store_true",
                    help="per partition: log start offset, high watermark, last stable offset "
                    "and open transactions (count, the oldest one's producer id and start "
                    "offset)")
    td.add_argument("--output", choices=["text", "json"], default="text",
                    help="text (Kafka's layout, default) or json")
    for flag, text in FILTERS.items():
        td.add_argument(f"--{flag}", action="store_true", help=text)


# kafka-topics.sh --describe's filters, with its words
FILTERS = {
    "under-replicated-partitions": "if set when describing topics, only show under-replicated "
    "partitions",
    "unavailable-partitions": "if set when describing topics, only show partitions whose "
    "leader is not available",
    "under-min-isr-partitions": "if set when describing topics, only show partitions whose isr "
    "count is less than the configured minimum",
    "at-min-isr-partitions": "if set when describing topics, only show partitions whose isr "
    "count is equal to the configured minimum",
    "topics-with-overrides": "if set when describing topics, only show topics that have "
    "overridden configs",
}
PARTITION_FILTERS = [f.replace("-", "_") for f in FILTERS if f != "topics-with-overrides"]


def _partition_filter(args, live: set[int], min_isr: int):
    """Kafka's DescribeOptions: which partition lines the filters asked for keep (None: no
    filter, every line and the topic line)."""
    wanted = [f for f in PARTITION_FILTERS if getattr(args, f, False)]
    if not wanted:
        return None

    def keep(p: dict) -> bool:
        leader, isr = p["leader"], len(p["isr"])
        return (("under_replicated_partitions" in wanted and len(p["replicas"]) > isr)
                or ("unavailable_partitions" in wanted and (leader is None
                                                             or leader not in live))
                or ("under_min_isr_partitions" in wanted and (leader is None
                                                               or isr < min_isr))
                or ("at_min_isr_partitions" in wanted and isr == min_isr))
    return keep


def kafka_uuid(topic_id: uuid.UUID | None) -> str | None:
    """A topic id as Kafka prints it (Uuid.toString: URL-safe base64 of its 16 bytes, no
    padding); None for none or the zero id."""
    if topic_id is None or topic_id.int == 0:
        return None
    return base64.urlsafe_b64encode(topic_id.bytes).decode().rstrip("=")


def describe(admin, args) -> int:
    from ..client.admin.admin_configs import ConfigResource, ConfigSource

    exclude = getattr(args, "exclude_internal", False)
    names = args.topic or admin.list_topics(include_internal=not exclude)
    descriptions = admin.describe_topics(names)
    if exclude:
        descriptions = {n: d for n, d in descriptions.items() if not d.internal}
        names = list(descriptions)
    if args.offsets:
        return _offsets(admin, descriptions, args.output)
    filtering = any(getattr(args, f, False) for f in PARTITION_FILTERS)
    if filtering and args.topics_with_overrides:
        from .args import UsageError

        raise UsageError("--topics-with-overrides cannot be used with the partition filters")
    live = set(admin.describe_cluster().nodes) if filtering else set()
    configs = admin.describe_configs([ConfigResource.topic(n) for n in names])
    out = []
    for name, desc in descriptions.items():
        entries = configs[ConfigResource.topic(name)]
        # As Kafka's TopicCommand: every config whose source is not the default (overrides,
        # and values the broker's own settings give).
        overridden = {k: e.value for k, e in sorted(entries.items())
                      if e.source != ConfigSource.DEFAULT_CONFIG}
        if args.topics_with_overrides and not overridden:
            continue
        min_isr = entries.get("min.insync.replicas")
        keep = _partition_filter(args, live, int(min_isr.value) if min_isr and
                                 min_isr.value else 1)
        out.append({
            "topic": name, "topic_id": kafka_uuid(desc.topic_id),
            "partition_count": len(desc.partitions),
            "replication_factor": len(desc.partitions[0].replicas) if desc.partitions else 0,
            "configs": overridden,
            "partitions": [{"partition": p.partition, "leader": p.leader if p.leader >= 0
                            else None, "replicas": list(p.replicas), "isr": list(p.isr)}
                           for p in desc.partitions]})
        if keep is not None:  # only the partitions asked for, and no topic line (Kafka's)
            out[-1]["partitions"] = [p for p in out[-1]["partitions"] if keep(p)]
            if not out[-1]["partitions"]:
                out.pop()
    if args.output == "json":
        print(json.dumps(out, indent=2))
        return 0
    for t in out:
        if not filtering:
            print(f"Topic: {t['topic']}"
                  + (f"\tTopicId: {t['topic_id']}" if t["topic_id"] else "")
                  + f"\tPartitionCount: {t['partition_count']}"
                  f"\tReplicationFactor: {t['replication_factor']}"
                  "\tConfigs: " + ",".join(f"{k}={v}" for k, v in t["configs"].items()))
        if args.topics_with_overrides:  # Kafka's: the topic lines only
            continue
        for p in t["partitions"]:
            print(f"\tTopic: {t['topic']}\tPartition: {p['partition']}\t"
                  f"Leader: {'none' if p['leader'] is None else p['leader']}\t"
                  f"Replicas: {','.join(map(str, p['replicas']))}\t"
                  f"Isr: {','.join(map(str, p['isr']))}")
    return 0


def _offsets(admin, descriptions, output: str) -> int:
    from .. import TopicPartition

    tps = [TopicPartition(name, p.partition) for name, desc in descriptions.items()
           for p in desc.partitions]
    start = admin.list_offsets({tp: EARLIEST for tp in tps})
    high = admin.list_offsets({tp: LATEST for tp in tps})
    stable = admin.list_offsets({tp: LATEST for tp in tps}, isolation_level="read_committed")
    producers = admin.describe_producers(tps)
    rows = []
    for tp in tps:
        open_txns = sorted((p.current_txn_start_offset, p.producer_id)
                           for p in producers[tp] if p.current_txn_start_offset >= 0)
        oldest_start, oldest_pid = open_txns[0] if open_txns else (None, None)
        rows.append([tp.topic, tp.partition, start[tp].offset, high[tp].offset,
                     stable[tp].offset, len(open_txns), oldest_pid, oldest_start])
    (print_json if output == "json" else print_table)(OFFSETS_COLUMNS, rows)
    return 0
