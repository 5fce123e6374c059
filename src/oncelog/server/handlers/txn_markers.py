"""WriteTxnMarkers: the partition leader's half of ending a transaction (spec 000, Data Flow
step 5.2, "WriteTxnMarkerRequest").

The transaction coordinator sends this request to every partition leader of a transaction, with
its coordinator epoch; oncelog's coordinator does so in process through this same handler
(server/txn_service.py), Kafka's admin tools over the wire to abort a hanging transaction. Each
partition appends a COMMIT or ABORT control batch (log/log.py ``append_marker``): the producer's
transaction closes there and the last stable offset moves on. A marker whose producer epoch is
older than the partition's is INVALID_PRODUCER_EPOCH (at transaction version 2, v2's
TransactionVersion field, KIP-1228: one not newer than the epoch of the producer's open
transaction there, KAFKA-17754); one from an older coordinator epoch,
TRANSACTION_COORDINATOR_FENCED. On a ``__consumer_offsets`` partition the group coordinator then
makes that producer's pending transactional offsets visible (commit) or drops them (abort).
"""

from __future__ import annotations

import logging
from typing import Any

from kio.schema.errors import ErrorCode

from ...protocol import ApiKey, make, response_module
from ..clock import now_ms
from ..context import RequestContext
from ..ports import BrokerPort
from ..replication import AppendError
from ..topics import CONSUMER_OFFSETS
from . import acl
from .util import error_code

log = logging.getLogger("oncelog.broker.markers")
MARKER_REPLICATION_TIMEOUT_MS = 30_000


def _marker_writer(broker: BrokerPort, topic: str, index: int, marker, now: int):
    """One partition's marker, as the replica manager appends it on the leader. On
    ``__consumer_offsets`` the group coordinator learns the transaction's outcome at once."""
    commit = bool(marker.transaction_result)

    def write(plog, leader_epoch: int):
        result = plog.append_marker(marker.producer_id, marker.producer_epoch, commit,
                                    marker.coordinator_epoch, now, leader_epoch=leader_epoch,
                                    transaction_version=int(getattr(marker,
                                                                    "transaction_version", 0)))
        if topic == CONSUMER_OFFSETS:
            broker.group_coordinator.complete_txn_offsets(index, marker.producer_id, commit)
        return result

    return write


async def handle_write_txn_markers(broker: BrokerPort, ctx: RequestContext, request: Any) -> Any:
    mod = response_module(ApiKey.WRITE_TXN_MARKERS, ctx.version)
    now = now_ms()
    results = []
    # Spec 000: only brokers (ClusterAction on the cluster) may write markers.
    allowed = acl.cluster(broker, ctx, acl.Op.CLUSTER_ACTION)
    for marker in request.markers:
        errors: dict[tuple[str, int], ErrorCode | None] = {}
        writes = {}
        for t in marker.topics:
            for index in t.partition_indexes:
                if allowed:
                    writes[(t.name, index)] = _marker_writer(broker, t.name, index, marker, now)
                else:
                    errors[(t.name, index)] = ErrorCode.cluster_authorization_failed
        # Kafka writes markers with acks=all.
        appended = await broker.replication.append_records(
            writes, required_acks=-1, timeout_ms=MARKER_REPLICATION_TIMEOUT_MS,
            check_min_isr=False)
        for tp, result in appended.items():
            if isinstance(result, AppendError):
                log.info("marker for producer %d on %s-%d refused: %s", marker.producer_id,
                         *tp, result)
                errors[tp] = result.error_name
            else:
                errors[tp] = None
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
