"""WriteTxnMarkers: the partition leader's half of ending a transaction (spec 000, Data Flow
step 5.2, "WriteTxnMarkerRequest").

The transaction coordinator sends this request to every partition leader of a transaction, with
its coordinator epoch; oncelog's coordinator does so in process through this same handler
(server/txn_service.py), Kafka's admin tools over the wire to abort a hanging transaction. Each
partition appends a COMMIT or ABORT control batch (log/log.py ``append_marker``): the producer's
transaction closes there and the last stable offset moves on. A marker whose producer epoch is
older than the partition's is INVALID_PRODUCER_EPOCH; one from an older coordinator epoch,
TRANSACTION_COORDINATOR_FENCED. On a ``__consumer_offsets`` partition the group coordinator then
makes that producer's pending transactional offsets visible (commit) or drops them (abort).
"""

from __future__ import annotations

import asyncio
import logging

from ...log import LogAppendError, LogWriteError
from ...protocol import ApiKey, make, response_module
from ..clock import now_ms
from ..replication import ReplicationError
from ..topics import CONSUMER_OFFSETS
from . import acl
from .util import error_code

log = logging.getLogger("oncelog.broker.markers")
MARKER_REPLICATION_TIMEOUT_MS = 30_000


def _write_marker(broker, topic: str, index: int, marker, now: int, waits: dict
                  ) -> str | None:
    """Append one marker; the error name, or None. In cluster mode only the leader writes
    it, and the answer waits until the ISR has it (``waits``)."""
    replica = None
    if broker.replication is not None:
        try:
            replica = broker.replication.leader_replica(topic, index)
        except ReplicationError as exc:
            return exc.error_name
        partition = replica.partition
    else:
        partition = broker.topics.partition(topic, index)
    if partition is None:
        return "unknown_topic_or_partition"
    commit = bool(marker.transaction_result)
    try:
        result = partition.log.append_marker(
            marker.producer_id, marker.producer_epoch, commit, marker.coordinator_epoch, now,
            leader_epoch=replica.leader_epoch if replica is not None else None)
    except LogAppendError as exc:
        log.info("marker for producer %d on %s-%d refused: %s", marker.producer_id, topic,
                 index, exc)
        return exc.error_name
    except LogWriteError as exc:
        log.error("marker for producer %d on %s-%d not written: %s", marker.producer_id, topic,
                  index, exc)
        return "kafka_storage_error"
    partition.notify_append()  # read_committed long polls wait for the LSO to move
    if replica is not None:
        broker.replication.appended(replica)
        waits[(topic, index)] = broker.replication.wait_replicated(
            replica, result.last_offset + 1, MARKER_REPLICATION_TIMEOUT_MS)
    if topic == CONSUMER_OFFSETS:
        broker.group_coordinator.complete_txn_offsets(index, marker.producer_id, commit)
    return None


async def handle_write_txn_markers(broker, ctx, request):
    mod = response_module(ApiKey.WRITE_TXN_MARKERS, ctx.version)
    now = now_ms()
    results = []
    # Spec 000: only brokers (ClusterAction on the cluster) may write markers.
    allowed = acl.cluster(broker, ctx, acl.Op.CLUSTER_ACTION)
    for marker in request.markers:
        errors: dict[tuple[str, int], str | None] = {}
        waits: dict = {}
        for t in marker.topics:
            for index in t.partition_indexes:
                errors[(t.name, index)] = (_write_marker(broker, t.name, index, marker, now, waits)
                                           if allowed else "cluster_authorization_failed")
        if waits:  # cluster mode: Kafka writes markers with acks=all
            done = await asyncio.gather(*waits.values())
            for tp, err in zip(waits, done, strict=True):
                if err is not None:
                    errors[tp] = err
        topics_out = []
        for t in marker.topics:
            parts = tuple(
                make(mod.WritableTxnMarkerPartitionResult, partition_index=index,
                     error_code=error_code(errors[(t.name, index)]))
                for index in t.partition_indexes)
            topics_out.append(make(mod.WritableTxnMarkerTopicResult, name=t.name,
                                   partitions=parts))
        results.append(make(mod.WritableTxnMarkerResult, producer_id=marker.producer_id,
                            topics=tuple(topics_out)))
    return make(mod.WriteTxnMarkersResponse, markers=tuple(results))
