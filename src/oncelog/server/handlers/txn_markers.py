"""WriteTxnMarkers: the partition leader's half of ending a transaction (spec 000, Data Flow
step 5.2, "WriteTxnMarkerRequest").

The transaction coordinator sends this request to every partition leader of a transaction, with
its coordinator epoch; Kafka's admin tools send it too, to abort a hanging transaction. Only
brokers (ClusterAction on the cluster) may write markers; each marker is written by the replica
side's marker writer (server/txn_marker_writer.py: the control batch, its checks, the pending
transactional offsets it completes), which this broker's own coordinator calls in process for
the partitions it leads.
"""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from ...protocol import ApiKey, make, response_module
from ..context import RequestContext
from ..ports import TxnApiPort
from . import acl
from .util import error_code


async def handle_write_txn_markers(broker: TxnApiPort, ctx: RequestContext, request: Any) -> Any:
    mod = response_module(ApiKey.WRITE_TXN_MARKERS, ctx.version)
    results = []
    # Spec 000: only brokers (ClusterAction on the cluster) may write markers.
    allowed = acl.cluster(broker, ctx, acl.Op.CLUSTER_ACTION)
    for marker in request.markers:
        tps = [(t.name, index) for t in marker.topics for index in t.partition_indexes]
        errors: dict[tuple[str, int], ErrorCode | None]
        if allowed:
            errors = await broker.txn_markers.write(
                tps, producer_id=marker.producer_id, producer_epoch=marker.producer_epoch,
                commit=bool(marker.transaction_result),
                coordinator_epoch=marker.coordinator_epoch,
                transaction_version=int(getattr(marker, "transaction_version", 0)))
        else:
            errors = dict.fromkeys(tps, ErrorCode.cluster_authorization_failed)
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
