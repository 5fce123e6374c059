"""Fetch: read batches from the logs, long-polling up to max_wait for min_bytes.

Batches are served exactly as stored. A read_committed fetch stops at the last stable offset.
The first partition with data always gets at least one whole batch even beyond the byte limits
(KIP-74), so that a consumer can always make progress. Fetch sessions: server/fetch_sessions.py.

Fetch v13+ names topics by id (KIP-516): an id resolves to its topic through the metadata's
view; an id no topic has (one deleted, or re-created under a new id) is answered
UNKNOWN_TOPIC_ID, and a partition whose local log belongs to another incarnation of the topic
INCONSISTENT_TOPIC_ID, as Kafka's KafkaApis and ReplicaManager do. v15 moves the follower's id
into replica_state (KIP-903); v16 tells a client that asked the wrong broker who leads the
partition now (current_leader and node_endpoints, KIP-951); v14 (KIP-405) and v17 (KIP-853's
replica_directory_id, a follower's) change nothing a broker without tiered storage or JBOD
does.
"""

from __future__ import annotations

import asyncio
from types import ModuleType
from typing import Any

from kio.schema.errors import ErrorCode

from ...log import OffsetOutOfRangeError
from ...protocol import ApiKey, make, millis, response_module
from ...protocol.fetch_response import FetchResponseWriter
from ..context import RequestContext
from ..fetch_sessions import FetchSessionError
from ..ports import BrokerPort
from ..replication import ReplicationError
from . import acl
from .util import error_code

READ_COMMITTED = 1


def _read_partition(broker: BrokerPort, topic, index, sp, isolation, budget, first, replica_id=-1,
                    leader_epoch=-1, follower_log_start=-1, topic_id=None):
    """Returns (error name, hw, lso, log start, records bytes, aborted transactions).
    ``replica_id`` >= 0: a follower's fetch, which reads to the log end (and says where the
    follower's log starts: DeleteRecords' low watermark). ``topic_id``: the id the request
    named the topic by (v13+), which the local log must belong to."""
    upto = None
    try:
        replica = broker.replication.leader_replica(topic, index, leader_epoch)
    except ReplicationError as exc:
        return exc.error_name, -1, -1, -1, b"", ()
    if topic_id is not None:
        local = broker.topics.get(topic)
        if local is None or local.topic_id != topic_id:
            # The view names the id, the log here is an older (or newer) topic of that name.
            return ErrorCode.inconsistent_topic_id, -1, -1, -1, b"", ()
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
        if replica_id < 0:  # as Kafka: an error's partition carries no offsets for a consumer
            return ErrorCode.offset_out_of_range, -1, -1, -1, b"", ()
        return ErrorCode.offset_out_of_range, hw, lso, start, b"", ()  # a follower starts from it
    aborted: tuple = ()
    if isolation == READ_COMMITTED and data:
        # spec 000, "Fetch": the aborted transactions that intersect the fetched range, so the
        # consumer can skip their batches (bounded by the LSO: nothing above it is returned).
        aborted = tuple(plog.aborted_transactions(sp.fetch_offset, lso))
    return None, hw, lso, start, data, aborted


# Errors Kafka answers before reading the log (KafkaApis' erroneous partitions), with an
# empty list of aborted transactions where a read's error has none.
_UNREAD = {ErrorCode.unknown_topic_or_partition, ErrorCode.unknown_topic_id, ErrorCode.topic_authorization_failed}


def _aborted(err, isolation, aborted):
    """The partition's aborted transactions as Kafka answers them: the list for
    read_committed, null for read_uncommitted and for a read that failed, an empty list for
    a partition refused before the read."""
    if err:
        return type(aborted)() if err in _UNREAD else None
    return aborted if isolation == READ_COMMITTED else None


def _topic_name(key, names):
    """A session's topic key (a name, or an id from v13 on) as the topic's name; None for an
    id no topic has."""
    return key if isinstance(key, str) else names.get(key)


def _collect(broker: BrokerPort, session, full, isolation, max_bytes, replica_id=-1, epochs=None,
             starts=None):
    # (topic key, name, partition, error, hw, lso, start, data, aborted, session partition)
    results = []
    total = 0
    budget = max_bytes
    names = broker.metadata.view.topic_names if session.uses_topic_ids else {}
    for (key, index), sp in session.partitions.items():
        name = _topic_name(key, names)
        if name is None:
            err, hw, lso, start, data, aborted = ErrorCode.unknown_topic_id, -1, -1, -1, b"", ()
        else:
            err, hw, lso, start, data, aborted = _read_partition(
                broker, name, index, sp, isolation, budget, first=total == 0,
                replica_id=replica_id, leader_epoch=(epochs or {}).get((key, index), -1),
                follower_log_start=(starts or {}).get((key, index), -1),
                topic_id=None if isinstance(key, str) else key)
        budget -= len(data)
        total += len(data)
        changed = (data or err or hw != sp.high_watermark or lso != sp.last_stable_offset
                   or start != sp.log_start_offset)
        if full or changed:
            results.append((key, name, index, err, hw, lso, start, data, aborted, sp))
    return results, total


def _waiters(broker: BrokerPort, session, follower=False):
    loop = asyncio.get_running_loop()
    futs = []
    names = broker.metadata.view.topic_names if session.uses_topic_ids else {}
    for key, index in session.partitions:
        topic = _topic_name(key, names)
        p = broker.topics.partition(topic, index) if topic is not None else None
        if p is not None:
            fut = loop.create_future()
            # A follower reads to the log end: a moved high watermark does not wake it.
            (p.replica_waiters if follower else p.waiters).add(fut)
            futs.append((p, fut))
    return futs


def _replica_id(request: Any) -> int:
    """The fetching follower's broker id, -1 for a consumer (in replica_state from v15)."""
    state = getattr(request, "replica_state", None)
    if state is not None:
        return state.replica_id
    return getattr(request, "replica_id", -1)


def _current_leader(broker: BrokerPort, mod: ModuleType, topic, index, node_endpoints):
    """v16+ (KIP-951): the leader and epoch the view knows for a partition this broker does
    not lead (or leads at another epoch), its endpoint added to ``node_endpoints``."""
    view = broker.metadata.view
    state = view.state(topic, index) if topic is not None else None
    if state is None:
        return make(mod.LeaderIdAndEpoch, leader_id=-1, leader_epoch=-1)
    info = view.brokers.get(state.leader)
    if info is None:
        return make(mod.LeaderIdAndEpoch, leader_id=-1, leader_epoch=state.leader_epoch)
    node_endpoints[state.leader] = make(mod.NodeEndpoint, node_id=state.leader, host=info.host,
                                        port=info.port, rack=getattr(info, "rack", None))
    return make(mod.LeaderIdAndEpoch, leader_id=state.leader, leader_epoch=state.leader_epoch)


async def handle_fetch(broker: BrokerPort, ctx: RequestContext, request: Any) -> Any:
    mod = response_module(ApiKey.FETCH, ctx.version)
    by_id = ctx.version >= 13  # KIP-516: topics named by id

    def key(t):
        return t.topic_id if by_id else t.topic

    def topic_field(k):
        return {"topic_id": k} if by_id else {"topic": k}

    requested = [((key(t), p.partition), p.fetch_offset, p.partition_max_bytes)
                 for t in request.topics for p in t.partitions]
    # Fetch v4-v6 predate sessions (KIP-227): sessionless full fetches.
    forgotten = [(key(t), p) for t in getattr(request, "forgotten_topics_data", ())
                 for p in t.partitions]
    try:
        session, full = broker.fetch_sessions.begin(getattr(request, "session_id", 0),
                                                    getattr(request, "session_epoch", -1),
                                                    requested, forgotten, uses_topic_ids=by_id)
    except FetchSessionError as exc:
        return make(mod.FetchResponse, throttle_time=0, error_code=error_code(exc.error_name),
                    session_id=0, responses=())
    isolation = getattr(request, "isolation_level", 0)
    replica_id = _replica_id(request)
    if replica_id >= 0 and not acl.cluster(broker, ctx, acl.Op.CLUSTER_ACTION):
        # Kafka: a follower's fetch (which reads past the high watermark and moves the ISR)
        # needs ClusterAction; without it every partition is TOPIC_AUTHORIZATION_FAILED.
        return make(mod.FetchResponse, throttle_time=0, error_code=0, session_id=0,
                    responses=tuple(make(
                        mod.FetchableTopicResponse, **topic_field(key(t)), partitions=tuple(make(
                            mod.PartitionData, partition_index=p.partition,
                            error_code=ErrorCode.topic_authorization_failed,
                            high_watermark=-1, last_stable_offset=-1, log_start_offset=-1,
                            aborted_transactions=None, preferred_read_replica=-1,
                            records=None) for p in t.partitions))
                        for t in request.topics))
    epochs = {(key(t), p.partition): getattr(p, "current_leader_epoch", -1)
              for t in request.topics for p in t.partitions}
    starts = {(key(t), p.partition): getattr(p, "log_start_offset", -1)
              for t in request.topics for p in t.partitions} if replica_id >= 0 else None
    max_bytes = request.max_bytes if request.max_bytes > 0 else 0x7FFFFFFF
    max_bytes = min(max_bytes, broker.config.int("fetch.max.bytes"))
    max_wait = millis(request.max_wait)
    results, total = _collect(broker, session, full, isolation, max_bytes, replica_id, epochs,
                               starts)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + max_wait / 1000
    # Long poll: wait for appends until min_bytes is reached or max_wait runs out.
    while (total < max(request.min_bytes, 1) and not any(r[3] for r in results)
           and loop.time() < deadline):
        futs = _waiters(broker, session, follower=replica_id >= 0)
        if not futs:
            break
        try:
            await asyncio.wait([f for _, f in futs], timeout=deadline - loop.time(),
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            for p, f in futs:
                p.waiters.discard(f)
                p.replica_waiters.discard(f)
                f.cancel()
        results, total = _collect(broker, session, full, isolation, max_bytes, replica_id, epochs,
                                   starts)
    by_topic: dict = {}
    node_endpoints: dict[int, object] = {}
    may_read = acl.topics_checker(broker, ctx, acl.Op.READ)
    for k, name, index, err, hw, lso, start, data, aborted, sp in results:
        # An unknown id is answered as such before authorization, as Kafka does: it names
        # no topic whose existence could leak.
        if name is not None and not may_read(name):
            err, data, aborted, hw, lso, start = ErrorCode.topic_authorization_failed, b"", (), -1, -1, -1
        sp.high_watermark, sp.last_stable_offset, sp.log_start_offset = hw, lso, start
        broker.stats.fetched(name, len(data), replica_id)
        leader = None
        if ctx.version >= 16 and err in (ErrorCode.not_leader_or_follower, ErrorCode.fenced_leader_epoch):
            leader = _current_leader(broker, mod, name, index, node_endpoints)
        by_topic.setdefault(k, []).append((index, err, hw, lso, start, data, aborted, leader))
    if not node_endpoints:  # no tagged field to write: the hand encoder (protocol/fetch_response)
        writer = FetchResponseWriter(ctx.version, 0, 0, session.session_id, len(by_topic))
        for k, partitions in by_topic.items():
            writer.topic(k, len(partitions))
            for index, err, hw, lso, start, data, aborted, _leader in partitions:
                writer.partition(
                    index, error_code(err) if err else 0, hw, lso, start,
                    _aborted(err, isolation, [(a.producer_id, a.first_offset)
                                              for a in aborted]), data)
            writer.end_topic()
        return writer
    responses = tuple(make(
        mod.FetchableTopicResponse, **topic_field(k), partitions=tuple(make(
            mod.PartitionData, partition_index=index, error_code=error_code(err),
            high_watermark=hw, last_stable_offset=lso, log_start_offset=start,
            aborted_transactions=_aborted(err, isolation, tuple(
                make(mod.AbortedTransaction, producer_id=a.producer_id,
                     first_offset=a.first_offset) for a in aborted)),
            preferred_read_replica=-1, records=data,
            **({"current_leader": leader} if leader is not None else {}))
            for index, err, hw, lso, start, data, aborted, leader in partitions))
        for k, partitions in by_topic.items())
    return make(mod.FetchResponse, throttle_time=0, error_code=0,
                session_id=session.session_id, responses=responses,
                node_endpoints=tuple(node_endpoints.values()))
