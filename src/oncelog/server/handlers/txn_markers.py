"""WriteTxnMarkers: the partition leader's half of ending a transaction (spec 000, Data Flow
step 5.2, "WriteTxnMarkerRequest").

The transaction coordinator sends this request to every partition leader of a transaction, with
its coordinator epoch; oncelog's coordinator does so in process through this same handler
(server/txn_service.py), Kafka's admin tools over the wire to abort a hanging transaction. Each
partition appends the COMMIT or ABORT control batch built here (origin MARKER, log/log.py): the
producer's transaction closes there and the last stable offset moves on. A marker whose producer epoch is
older than the partition's is INVALID_PRODUCER_EPOCH (at transaction version 2, v2's
TransactionVersion field, KIP-1228: one not newer than the epoch of the producer's open
transaction there, KAFKA-17754); one from an older coordinator epoch,
TRANSACTION_COORDINATOR_FENCED. On a ``__consumer_offsets`` partition, once the append completed
(the ISR has the marker), the group coordinator makes that producer's pending transactional
offsets visible (commit) or drops them (abort).
"""

from __future__ import annotations

import logging
from typing import Any

from kio.schema.errors import ErrorCode

from ...protocol import ApiKey, make, response_module
from ...records import split_batches
from ...records.batch import CONTROL_ABORT, CONTROL_COMMIT, build_control_batch
from ..clock import now_ms
from ..context import RequestContext
from ..ports import BrokerPort
from ..replication import AppendEntry, AppendError, AppendOrigin
from ..topics import CONSUMER_OFFSETS
from . import acl
from .util import error_code

log = logging.getLogger("oncelog.broker.markers")
MARKER_REPLICATION_TIMEOUT_MS = 30_000


def _marker_entry(marker, now: int) -> AppendEntry:
    """One partition's marker: the COMMIT or ABORT control batch (each partition its own
    copy: the append rewrites it in place)."""
    data = bytearray(build_control_batch(
        CONTROL_COMMIT if marker.transaction_result else CONTROL_ABORT,
        producer_id=marker.producer_id, producer_epoch=marker.producer_epoch,
        coordinator_epoch=marker.coordinator_epoch, timestamp=now))
    return AppendEntry(data, split_batches(data),
                       transaction_version=int(getattr(marker, "transaction_version", 0)))


async def handle_write_txn_markers(broker: BrokerPort, ctx: RequestContext, request: Any) -> Any:
    mod = response_module(ApiKey.WRITE_TXN_MARKERS, ctx.version)
    now = now_ms()
    results = []
    # Spec 000: only brokers (ClusterAction on the cluster) may write markers.
    allowed = acl.cluster(broker, ctx, acl.Op.CLUSTER_ACTION)
    for marker in request.markers:
        errors: dict[tuple[str, int], ErrorCode | None] = {}
        entries = {}
        for t in marker.topics:
            for index in t.partition_indexes:
                if allowed:
                    entries[(t.name, index)] = _marker_entry(marker, now)
                else:
                    errors[(t.name, index)] = ErrorCode.cluster_authorization_failed
        # Kafka writes markers with acks=all: below min.insync.replicas a partition refuses
        # one (NOT_ENOUGH_REPLICAS) and the coordinator sends it again until the ISR is back.
        appended = await broker.replication.append_records(
            entries, origin=AppendOrigin.MARKER, required_acks=-1,
            timeout_ms=MARKER_REPLICATION_TIMEOUT_MS)
        for tp, result in appended.items():
            if isinstance(result, AppendError):
                log.info("marker for producer %d on %s-%d refused: %s", marker.producer_id,
                         *tp, result)
                errors[tp] = result.error_name
            else:
                errors[tp] = None
                if tp[0] == CONSUMER_OFFSETS:
                    # Kafka's onTransactionCompleted: once the ISR has the marker, the group
                    # coordinator makes the producer's pending offsets visible (or drops them).
                    broker.group_coordinator.complete_txn_offsets(
                        tp[1], marker.producer_id, bool(marker.transaction_result))
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
