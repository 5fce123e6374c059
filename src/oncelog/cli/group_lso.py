"""``oncelog groups describe``: the partitions whose lag an open transaction holds.

A read_committed consumer reads up to the partition's last stable offset (LSO, KIP-98): the
first offset of the oldest open transaction. When a group has committed at or past the LSO and
the LSO is under the log end offset (the high watermark), its LAG cannot shrink until that
transaction ends, however fast the consumers are. Kafka's ``kafka-consumer-groups --describe``
does not say so; oncelog keeps Kafka's columns and adds a note under the table, one line per
such partition, naming the transaction (and ``held_by_transaction`` in ``--output json``):

    orders-0: lag 6 held by open transaction app-1 (producer 1000, Ongoing) since
    2026-11-29T06:00:00Z (5m12s): the last stable offset stays at 10

All through the public API, as any client could: ListOffsets read_committed (the LSO),
DescribeProducers on the partition leader (KIP-664: which producer's transaction starts at the
LSO), ListTransactions filtered by producer id and DescribeTransactions (KIP-664: its
transactional id, state and start time, from its transaction coordinator). A producer id no
coordinator lists is a hanging transaction (``oncelog transactions find-hanging``).
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

LATEST = -1


def duration(ms: int) -> str:
    """5m12s, 1h3m, 42s, 2d4h."""
    s = max(0, ms // 1000)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60}m"
    return f"{s // 86400}d{s % 86400 // 3600}h"


def timestamp(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def lso_holds(admin, rows: list[list]) -> dict[tuple[str, int], dict]:
    """(topic, partition) -> what holds its lag, for the offsets view's rows (GROUP TOPIC
    PARTITION CURRENT-OFFSET LOG-END-OFFSET LAG ...) whose lag an open transaction holds."""
    from .. import TopicPartition
    from ..errors import KafkaError, TransactionalIdNotFoundError

    lagging = {TopicPartition(r[1], r[2]): (r[3], r[4], r[5]) for r in rows
               if r[3] is not None and r[4] is not None and r[5] is not None and r[5] > 0}
    if not lagging:
        return {}
    stable = admin.list_offsets(dict.fromkeys(lagging, LATEST), isolation_level="read_committed")
    held = {tp: stable[tp].offset for tp, (committed, end, _lag) in lagging.items()
            if tp in stable and stable[tp].offset < end and committed >= stable[tp].offset}
    if not held:
        return {}
    now = int(time.time() * 1000)
    oldest = {}
    for tp, lso in held.items():
        try:
            states = admin.describe_producers([tp])[tp]
        except KafkaError:
            states = []  # the leader moved, or Read on the topic is refused: no name to give
        open_txns = sorted((p for p in states if p.current_txn_start_offset >= 0),
                           key=lambda p: p.current_txn_start_offset)
        # the transaction whose first offset is the LSO (the oldest one open)
        oldest[tp] = next((p for p in open_txns if p.current_txn_start_offset == lso),
                          open_txns[0] if open_txns else None)
    pids = {p.producer_id for p in oldest.values() if p is not None}
    txn_ids: dict[int, str] = {}
    if pids:
        try:
            txn_ids = {t.producer_id: t.transactional_id
                       for t in admin.list_transactions(producer_ids=pids)
                       if t.producer_id in pids}
        except KafkaError:
            pass
    described = {}
    for txn_id in set(txn_ids.values()):
        try:
            described[txn_id] = admin.describe_transactions([txn_id])[txn_id]
        except (TransactionalIdNotFoundError, KafkaError):
            pass
    out = {}
    for tp, lso in held.items():
        lag = lagging[tp][2]
        p = oldest[tp]
        holder_id = txn_ids.get(p.producer_id) if p is not None else None
        d = described.get(holder_id) if holder_id is not None else None
        start = d.start_ms if d is not None else None
        out[(tp.topic, tp.partition)] = {
            "last_stable_offset": lso, "lag": lag,
            "producer_id": p.producer_id if p is not None else None,
            "producer_epoch": p.producer_epoch if p is not None else None,
            "first_offset": p.current_txn_start_offset if p is not None else None,
            "last_write": timestamp(p.last_timestamp)
            if p is not None and p.last_timestamp >= 0 else None,
            "transactional_id": holder_id, "state": d.state if d is not None else None,
            "since": timestamp(start) if start is not None else None,
            "open_ms": now - start if start is not None else None}
    return out


def note(topic: str, partition: int, hold: dict) -> str:
    """One line under the table."""
    where = f"{topic}-{partition}: lag {hold['lag']} held by "
    tail = f": the last stable offset stays at {hold['last_stable_offset']}"
    if hold["producer_id"] is None:
        return where + "an open transaction" + tail
    if hold["transactional_id"] is None:
        return (where + f"an open transaction of producer {hold['producer_id']} that no "
                "transaction coordinator lists (hanging: oncelog transactions find-hanging)"
                + (f", last written {hold['last_write']}" if hold["last_write"] else "")
                + tail)
    since = (f" since {hold['since']} ({duration(hold['open_ms'])})"
             if hold["since"] is not None else "")
    return (where + f"open transaction {hold['transactional_id']} (producer "
            f"{hold['producer_id']}, {hold['state']}){since}" + tail)
