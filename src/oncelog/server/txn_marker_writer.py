"""The partition leader's half of ending a transaction (spec 000, Data Flow step 5.2,
"WriteTxnMarkerRequest"): ``TxnMarkerWriter`` writes one transaction's COMMIT or ABORT marker
on the partitions this broker leads.

Two callers, one path: the WriteTxnMarkers handler (server/handlers/txn_markers.py: another
broker's transaction coordinator, or Kafka's admin tools aborting a hanging transaction, over
the wire) and this broker's own transaction coordinator (server/txn_service.py) for the
partitions it leads, in process (Kafka's coordinator sends itself the request through its
network client; here the replica side is called directly, with the same outcome).

Each partition appends the control batch built here through the one append path (origin
MARKER, log/log.py): the producer's transaction closes there and the last stable offset moves
on. A marker whose producer epoch is older than the partition's is INVALID_PRODUCER_EPOCH (at
transaction version 2, the request's TransactionVersion, KIP-1228: one not newer than the epoch
of the producer's open transaction there, KAFKA-17754); one from an older coordinator epoch,
TRANSACTION_COORDINATOR_FENCED. On a ``__consumer_offsets`` partition, once the append
completed (the ISR has the marker), the group coordinator makes that producer's pending
transactional offsets visible (commit) or drops them (abort).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Protocol

from kio.schema.errors import ErrorCode

from ..log import AppendResult
from ..records import split_batches
from ..records.batch import CONTROL_ABORT, CONTROL_COMMIT, build_control_batch
from .clock import now_ms
from .replication import AppendEntry, AppendError, AppendOrigin
from .topics import CONSUMER_OFFSETS

log = logging.getLogger("oncelog.broker.markers")
MARKER_REPLICATION_TIMEOUT_MS = 30_000

TP = tuple[str, int]


class MarkerAppender(Protocol):
    """The one append path (server/replication.py's ReplicaManager.append_records)."""

    async def append_records(self, entries: dict[TP, AppendEntry], *, origin: AppendOrigin,
                             required_acks: int, timeout_ms: int
                             ) -> dict[TP, AppendResult | AppendError]: ...


class PendingTxnOffsets(Protocol):
    """The group coordinator's pending transactional offsets (server/group_service.py)."""

    def complete_txn_offsets(self, partition_index: int, producer_id: int,
                             commit: bool) -> None: ...


class TxnMarkerWriter:
    def __init__(self, replicas: MarkerAppender, offsets: PendingTxnOffsets) -> None:
        self.replicas = replicas
        self.offsets = offsets

    async def write(self, partitions: Iterable[TP], *, producer_id: int, producer_epoch: int,
                    commit: bool, coordinator_epoch: int, transaction_version: int = 0
                    ) -> dict[TP, ErrorCode | None]:
        """The marker on each partition (acks=all): the error of each, None where it is
        written and the ISR has it."""
        now = now_ms()
        entries = {tp: self._entry(producer_id, producer_epoch, commit, coordinator_epoch,
                                   transaction_version, now) for tp in partitions}
        # Kafka writes markers with acks=all: below min.insync.replicas a partition refuses
        # one (NOT_ENOUGH_REPLICAS) and the coordinator sends it again until the ISR is back.
        appended = await self.replicas.append_records(
            entries, origin=AppendOrigin.MARKER, required_acks=-1,
            timeout_ms=MARKER_REPLICATION_TIMEOUT_MS)
        errors: dict[TP, ErrorCode | None] = {}
        for tp, result in appended.items():
            if isinstance(result, AppendError):
                log.info("marker for producer %d on %s-%d refused: %s", producer_id, *tp,
                         result)
                errors[tp] = result.error_name
            else:
                errors[tp] = None
                if tp[0] == CONSUMER_OFFSETS:
                    # Kafka's onTransactionCompleted: once the ISR has the marker, the group
                    # coordinator makes the producer's pending offsets visible (or drops them).
                    self.offsets.complete_txn_offsets(tp[1], producer_id, commit)
        return errors

    @staticmethod
    def _entry(producer_id: int, producer_epoch: int, commit: bool, coordinator_epoch: int,
               transaction_version: int, now: int) -> AppendEntry:
        """One partition's marker: the COMMIT or ABORT control batch (each partition its own
        copy: the append rewrites it in place)."""
        data = bytearray(build_control_batch(
            CONTROL_COMMIT if commit else CONTROL_ABORT, producer_id=producer_id,
            producer_epoch=producer_epoch, coordinator_epoch=coordinator_epoch, timestamp=now))
        return AppendEntry(data, split_batches(data), transaction_version=transaction_version)
