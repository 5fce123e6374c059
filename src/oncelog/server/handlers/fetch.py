"""Fetch: read batches from the logs, long-polling up to max_wait for min_bytes.

Batches are served exactly as stored. A read_committed fetch stops at the last stable offset.
The first partition with data always gets at least one whole batch even beyond the byte limits
(KIP-74), so that a consumer can always make progress. Fetch sessions: server/fetch_sessions.py.
"""

from __future__ import annotations

import asyncio

from ...log import OffsetOutOfRangeError
from ...protocol import ApiKey, make, millis, response_module
from ..fetch_sessions import FetchSessionError
from ..replication import ReplicationError
from . import acl
from .util import error_code

READ_COMMITTED = 1


def _read_partition(broker, topic, index, sp, isolation, budget, first, replica_id=-1,
                    leader_epoch=-1, follower_log_start=-1):
    """Returns (error name, hw, lso, log start, records bytes, aborted transactions).
    ``replica_id`` >= 0: a follower's fetch, which reads to the log end (and says where the
    follower's log starts: DeleteRecords' low watermark)."""
    upto = None
    try:
        replica = broker.replication.leader_replica(topic, index, leader_epoch)
    except ReplicationError as exc:
        return exc.error_name, -1, -1, -1, b"", ()
    partition = replica.partition
    if replica_id >= 0:
        broker.replication.follower_fetched(replica, replica_id, sp.fetch_offset,
                                            follower_log_start)
        upto = partition.log.log_end_offset
    plog = partition.log
    hw = plog.high_watermark
    lso = plog.last_stable_offset
    start = plog.log_start_offset
    limit = min(sp.max_bytes, budget)
    if limit <= 0 and not first:
        return None, hw, lso, start, b"", ()
    if upto is None:
        upto = lso if isolation == READ_COMMITTED else hw
    try:
        # Only the response's first partition with data may go past the limits with its first
        # batch (KIP-74); a later partition whose next batch does not fit returns nothing.
        # Left in the segment file: the network sends it in chunks as the reader drains them.
        data = plog.read_region(sp.fetch_offset, max(limit, 1), max_offset=upto,
                                min_one=first)
    except OffsetOutOfRangeError:
        return "offset_out_of_range", hw, lso, start, b"", ()
    aborted = ()
    if isolation == READ_COMMITTED and data:
        # spec 000, "Fetch": the aborted transactions that intersect the fetched range, so the
        # consumer can skip their batches (bounded by the LSO: nothing above it is returned).
        aborted = tuple(plog.aborted_transactions(sp.fetch_offset, lso))
    return None, hw, lso, start, data, aborted


def _collect(broker, session, full, isolation, max_bytes, replica_id=-1, epochs=None,
             starts=None):
    results = []  # (topic, partition, error, hw, lso, start, data, aborted, session partition)
    total = 0
    budget = max_bytes
    for (topic, index), sp in session.partitions.items():
        err, hw, lso, start, data, aborted = _read_partition(
            broker, topic, index, sp, isolation, budget, first=total == 0,
            replica_id=replica_id, leader_epoch=(epochs or {}).get((topic, index), -1),
            follower_log_start=(starts or {}).get((topic, index), -1))
        budget -= len(data)
        total += len(data)
        changed = (data or err or hw != sp.high_watermark or lso != sp.last_stable_offset
                   or start != sp.log_start_offset)
        if full or changed:
            results.append((topic, index, err, hw, lso, start, data, aborted, sp))
    return results, total


def _waiters(broker, session):
    loop = asyncio.get_running_loop()
    futs = []
    for topic, index in session.partitions:
        p = broker.topics.partition(topic, index)
        if p is not None:
            fut = loop.create_future()
            p.waiters.add(fut)
            futs.append((p, fut))
    return futs


async def handle_fetch(broker, ctx, request):
    mod = response_module(ApiKey.FETCH, ctx.version)
    requested = [((t.topic, p.partition), p.fetch_offset, p.partition_max_bytes)
                 for t in request.topics for p in t.partitions]
    # Fetch v4-v6 predate sessions (KIP-227): sessionless full fetches.
    forgotten = [(t.topic, p) for t in getattr(request, "forgotten_topics_data", ())
                 for p in t.partitions]
    try:
        session, full = broker.fetch_sessions.begin(getattr(request, "session_id", 0),
                                                    getattr(request, "session_epoch", -1),
                                                    requested, forgotten)
    except FetchSessionError as exc:
        return make(mod.FetchResponse, throttle_time=0, error_code=error_code(exc.error_name),
                    session_id=0, responses=())
    isolation = getattr(request, "isolation_level", 0)
    replica_id = getattr(request, "replica_id", -1)
    if replica_id >= 0 and not acl.cluster(broker, ctx, acl.Op.CLUSTER_ACTION):
        # Kafka: a follower's fetch (which reads past the high watermark and moves the ISR)
        # needs ClusterAction; without it every partition is TOPIC_AUTHORIZATION_FAILED.
        return make(mod.FetchResponse, throttle_time=0, error_code=0, session_id=0,
                    responses=tuple(make(
                        mod.FetchableTopicResponse, topic=t.topic, partitions=tuple(make(
                            mod.PartitionData, partition_index=p.partition,
                            error_code=error_code("topic_authorization_failed"),
                            high_watermark=-1, last_stable_offset=-1, log_start_offset=-1,
                            aborted_transactions=None, preferred_read_replica=-1,
                            records=None) for p in t.partitions))
                        for t in request.topics))
    epochs = {(t.topic, p.partition): getattr(p, "current_leader_epoch", -1)
              for t in request.topics for p in t.partitions}
    starts = {(t.topic, p.partition): getattr(p, "log_start_offset", -1)
              for t in request.topics for p in t.partitions} if replica_id >= 0 else None
    max_bytes = request.max_bytes if request.max_bytes > 0 else 0x7FFFFFFF
    max_bytes = min(max_bytes, broker.config.int("fetch.max.bytes"))
    max_wait = millis(request.max_wait)
    results, total = _collect(broker, session, full, isolation, max_bytes, replica_id, epochs,
                               starts)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + max_wait / 1000
    # Long poll: wait for appends until min_bytes is reached or max_wait runs out.
    while (total < max(request.min_bytes, 1) and not any(r[2] for r in results)
           and loop.time() < deadline):
        futs = _waiters(broker, session)
        if not futs:
            break
        try:
            await asyncio.wait([f for _, f in futs], timeout=deadline - loop.time(),
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            for p, f in futs:
                p.waiters.discard(f)
                f.cancel()
        results, total = _collect(broker, session, full, isolation, max_bytes, replica_id, epochs,
                               starts)
    by_topic: dict[str, list] = {}
    may_read = acl.topics_checker(broker, ctx, acl.Op.READ)
    for topic, index, err, hw, lso, start, data, aborted, sp in results:
        if not may_read(topic):
            err, data, aborted, hw, lso, start = "topic_authorization_failed", b"", [], -1, -1, -1
        sp.high_watermark, sp.last_stable_offset, sp.log_start_offset = hw, lso, start
        by_topic.setdefault(topic, []).append(make(
            mod.PartitionData, partition_index=index, error_code=error_code(err),
            high_watermark=hw, last_stable_offset=lso, log_start_offset=start,
            aborted_transactions=tuple(
                make(mod.AbortedTransaction, producer_id=a.producer_id,
                     first_offset=a.first_offset) for a in aborted)
            if isolation == READ_COMMITTED else None,
            preferred_read_replica=-1, records=data,
        ))
    responses = tuple(make(mod.FetchableTopicResponse, topic=t, partitions=tuple(ps))
                      for t, ps in by_topic.items())
    return make(mod.FetchResponse, throttle_time=0, error_code=0,
                session_id=session.session_id, responses=responses)
