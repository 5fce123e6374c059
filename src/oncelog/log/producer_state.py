"""Per-partition producer state: spec 000, "PID-Sequence Management", "PID Snapshots",
"PID Expiration"; the ProduceRequest steps of "Client-Broker request handling".

Sans-IO. Everything that decides whether a batch from an idempotent producer may be appended
lives in this file, and nothing here touches a file or a clock: the caller passes batch headers
and times in, and gets verdicts and snapshot bytes out.

For each producer id we keep its epoch and the metadata of its last five batches (first and last
sequence, last offset, offset delta, timestamp). A retried batch that matches one of those five is
a duplicate: it is answered with its original offsets instead of being written twice. Any other
sequence that does not follow the last one is OUT_OF_ORDER_SEQUENCE_NUMBER; an older epoch is
INVALID_PRODUCER_EPOCH; a newer epoch must begin at sequence 0.

Transactions (spec 000, "Last Stable Offset Tracking"): a producer's first transactional batch
opens its transaction at that batch's offset (``current_txn_first_offset``); its COMMIT or ABORT
marker closes it. The first offset of the oldest open transaction bounds the last stable offset.
A marker from an older producer epoch is INVALID_PRODUCER_EPOCH, one from an older coordinator
epoch TRANSACTION_COORDINATOR_FENCED; a marker with a newer producer epoch (the coordinator
fencing a zombie) makes that epoch current. A transactional batch without sequence numbers (the
group coordinator's TxnOffsetCommit records) is checked for its epoch only.
"""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from crc32c import crc32c
from kio.schema.errors import ErrorCode

from ..records.batch import INT32_MAX, NO_SEQUENCE, BatchHeader

MAX_EPOCH = 32767  # int16: a transaction at the maximum epoch ends with a marker at it
NUM_BATCHES_TO_RETAIN = 5  # spec: the broker dedupes up to 5 in-flight requests per partition


class ProducerStateError(Exception):
    """A batch the producer state rejects; ``error_name`` is the Kafka error code (ErrorCode)."""

    def __init__(self, error_name: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.error_name = error_name


@dataclass(frozen=True, slots=True)
class BatchMetadata:
    first_seq: int
    last_seq: int
    last_offset: int
    offset_delta: int
    timestamp: int

    @property
    def first_offset(self) -> int:
        return self.last_offset - self.offset_delta


@dataclass(slots=True)
class ProducerStateEntry:
    producer_id: int
    producer_epoch: int
    batches: deque[BatchMetadata] = field(default_factory=lambda: deque(maxlen=NUM_BATCHES_TO_RETAIN))
    last_timestamp: int = -1
    coordinator_epoch: int = -1
    current_txn_first_offset: int = -1

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else NO_SEQUENCE

    @property
    def last_offset(self) -> int:
        return self.batches[-1].last_offset if self.batches else -1

    def find_duplicate(self, first_seq: int, last_seq: int) -> BatchMetadata | None:
        for b in self.batches:
            if b.first_seq == first_seq and b.last_seq == last_seq:
                return b
        return None


def in_sequence(last_seq: int, next_seq: int) -> bool:
    return next_seq == last_seq + 1 or (next_seq == 0 and last_seq == INT32_MAX)


@dataclass(frozen=True, slots=True)
class CompletedTxn:
    """A transaction ended by a marker: the producer's first offset in it, the marker's offset,
    and whether it was aborted (then it goes into the aborted-transaction index)."""

    producer_id: int
    first_offset: int
    last_offset: int
    is_aborted: bool


class VerificationGuard:
    """KIP-890: the token of one verification of a producer's transaction on this partition
    (the coordinator was asked whether the transaction is ongoing and holds the partition).
    A marker written meanwhile drops it, and a batch that carries a dropped guard is refused:
    that closes the race between the coordinator's answer and the append."""

    __slots__ = ("producer_epoch",)

    def __init__(self, producer_epoch: int) -> None:
        self.producer_epoch = producer_epoch


class ProducerStateManager:
    """The producer-id → state map of one partition."""

    def __init__(self) -> None:
        self.producers: dict[int, ProducerStateEntry] = {}
        self.verifications: dict[int, VerificationGuard] = {}
        # Kafka's unreplicatedTxns: first offset -> marker offset of the transactions a marker
        # ended whose marker the high watermark has not passed yet. They hold the LSO back
        # like open ones: a consumer reads none of a transaction before the in-sync replicas
        # have how it ended. Not in snapshots (rebuilt from the markers replayed after one).
        self.unreplicated: dict[int, int] = {}

    # -- verification (KIP-890) ----------------------------------------------------------------

    def needs_verification(self, producer_id: int, producer_epoch: int) -> bool:
        """Whether a transactional batch must be checked with the coordinator first: no
        transaction of this producer and epoch is open here yet."""
        e = self.producers.get(producer_id)
        return e is None or e.current_txn_first_offset < 0 or e.producer_epoch != producer_epoch

    def start_verification(self, producer_id: int, producer_epoch: int) -> VerificationGuard:
        """The guard of a verification about to be asked for (shared by requests pipelined
        while one is under way)."""
        guard = self.verifications.get(producer_id)
        if guard is None or guard.producer_epoch != producer_epoch:
            guard = self.verifications[producer_id] = VerificationGuard(producer_epoch)
        return guard

    def check_verified(self, header: BatchHeader, guard: VerificationGuard | None) -> None:
        if not header.is_transactional or header.producer_id < 0:
            return
        pid, epoch = header.producer_id, header.producer_epoch
        if not self.needs_verification(pid, epoch):
            return
        if guard is None or self.verifications.get(pid) is not guard \
                or guard.producer_epoch != epoch:
            raise ProducerStateError(
                ErrorCode.invalid_txn_state,
                f"producer {pid} epoch {epoch} has no verified ongoing transaction on this "
                "partition (it ended, or was never added)")

    # -- transactions -------------------------------------------------------------------------

    def first_undecided_offset(self) -> int | None:
        """The first offset of the oldest open transaction, or None when none is open."""
        firsts = [e.current_txn_first_offset for e in self.producers.values()
                  if e.current_txn_first_offset >= 0]
        return min(firsts) if firsts else None

    def first_unstable_offset(self) -> int | None:
        """The first offset of the oldest transaction that is open or whose marker is not below
        the high watermark yet (Kafka's firstUnstableOffset), None when there is none. (Read
        by every fetch: one pass, no call to first_undecided_offset.)"""
        firsts = [e.current_txn_first_offset for e in self.producers.values()
                  if e.current_txn_first_offset >= 0]
        if self.unreplicated:
            firsts.extend(self.unreplicated)  # their first offsets
        return min(firsts) if firsts else None

    def on_high_watermark_updated(self, high_watermark: int) -> None:
        """The high watermark moved (up, or down by a truncation): the ended transactions whose
        marker is below it are stable."""
        if self.unreplicated:
            self.unreplicated = {first: marker for first, marker in self.unreplicated.items()
                                 if marker >= high_watermark}

    def open_transactions(self) -> list[tuple[int, int]]:
        """(producer id, first offset) of every open transaction, oldest first."""
        return sorted(((pid, e.current_txn_first_offset) for pid, e in self.producers.items()
                       if e.current_txn_first_offset >= 0), key=lambda t: t[1])

    def check_marker(self, producer_id: int, producer_epoch: int, coordinator_epoch: int,
                     transaction_version: int = 0) -> None:
        """Validate a COMMIT/ABORT marker before it is appended (WriteTxnMarkers).

        Transaction version 2 (KIP-890, KIP-1228's WriteTxnMarkers v2): the marker carries the
        transaction's epoch + 1, so it must be newer than the partition's epoch. A marker at
        the partition's epoch is a late or duplicated one of the previous transaction
        (KAFKA-17754): the producer's next transaction already writes with that epoch. It is
        taken only as a retry, while no transaction of the producer is open here (or at the
        maximum epoch, which cannot be bumped), as Kafka's ProducerAppendInfo does."""
        entry = self.producers.get(producer_id)
        if entry is None:
            return
        if transaction_version >= 2 and producer_epoch == entry.producer_epoch \
                and entry.current_txn_first_offset >= 0 and producer_epoch != MAX_EPOCH:
            raise ProducerStateError(
                ErrorCode.invalid_producer_epoch,
                f"transaction version 2 marker for producer {producer_id} has epoch "
                f"{producer_epoch}, not newer than the epoch {entry.producer_epoch} of its "
                f"open transaction")
        if producer_epoch < entry.producer_epoch:
            raise ProducerStateError(
                ErrorCode.invalid_producer_epoch,
                f"marker for producer {producer_id} has epoch {producer_epoch}, older than "
                f"its current epoch {entry.producer_epoch}")
        if coordinator_epoch < entry.coordinator_epoch:
            raise ProducerStateError(
                ErrorCode.transaction_coordinator_fenced,
                f"marker for producer {producer_id} comes from coordinator epoch "
                f"{coordinator_epoch}, older than {entry.coordinator_epoch}")

    def complete_txn(self, header: BatchHeader, commit: bool, coordinator_epoch: int
                     ) -> CompletedTxn:
        """Record an appended marker batch (``header.base_offset`` assigned): the producer's
        transaction is closed."""
        pid = header.producer_id
        entry = self.producers.get(pid)
        if entry is None or header.producer_epoch > entry.producer_epoch:
            prev = entry
            entry = ProducerStateEntry(pid, header.producer_epoch)
            if prev is not None:
                entry.current_txn_first_offset = prev.current_txn_first_offset
            self.producers[pid] = entry
        self.verifications.pop(pid, None)
        first = entry.current_txn_first_offset
        if first < 0:
            first = header.base_offset  # nothing of this producer's in the transaction here
        else:
            self.unreplicated[first] = header.base_offset
        entry.current_txn_first_offset = -1
        entry.coordinator_epoch = max(entry.coordinator_epoch, coordinator_epoch)
        entry.last_timestamp = max(entry.last_timestamp, header.max_timestamp)
        return CompletedTxn(pid, first, header.base_offset, not commit)

    # -- validation (before append) ---------------------------------------------------------

    def check_batch(self, header: BatchHeader, new_client: bool = False
                    ) -> BatchMetadata | None:
        """Validate a batch about to be appended.

        Returns the original batch's metadata if this is a duplicate (answer with it, append
        nothing), None if the batch may be appended, and raises ProducerStateError otherwise.
        ``new_client``: the producer uses KIP-890's protocol (Produce v12+), for which a first
        batch that does not start at sequence 0 is OUT_OF_ORDER_SEQUENCE_NUMBER.
        """
        pid = header.producer_id
        if pid < 0 or header.is_control:
            return None
        epoch = header.producer_epoch
        first_seq = header.base_sequence
        entry = self.producers.get(pid)
        if first_seq == NO_SEQUENCE:
            if not header.is_transactional:
                raise ProducerStateError(
                    ErrorCode.invalid_record,
                    f"producer {pid} sent a batch without sequence numbers")
            if entry is not None and epoch < entry.producer_epoch:
                raise ProducerStateError(
                    ErrorCode.invalid_producer_epoch,
                    f"producer {pid} epoch {epoch} is older than current epoch "
                    f"{entry.producer_epoch}")
            return None
        if entry is None:
            # Unknown producer: any sequence is accepted, as Kafka does since KIP-360 (its
            # state expired, or its first batches were lost with a leader that died before
            # they were replicated: refusing it with UNKNOWN_PRODUCER_ID is fatal to
            # librdkafka's idempotent producer), except a transactional batch of a KIP-890
            # (Produce v12+) producer, which must start at 0.
            if first_seq != 0 and new_client and header.is_transactional:
                raise ProducerStateError(
                    ErrorCode.out_of_order_sequence_number,
                    f"producer {pid} is unknown to this partition and sent sequence {first_seq}",
                )
            return None
        if epoch < entry.producer_epoch:
            raise ProducerStateError(
                ErrorCode.invalid_producer_epoch,
                f"producer {pid} epoch {epoch} is older than current epoch {entry.producer_epoch}",
            )
        if epoch > entry.producer_epoch:
            if first_seq != 0:
                raise ProducerStateError(
                    ErrorCode.out_of_order_sequence_number,
                    f"producer {pid} new epoch {epoch} must start at sequence 0, got {first_seq}",
                )
            return None
        duplicate = entry.find_duplicate(first_seq, header.last_sequence)
        if duplicate is not None:
            return duplicate
        if not entry.batches and first_seq != 0 and new_client:
            # The epoch was set by a marker (transaction version 2 bumps it on every
            # transaction): the producer's sequences start again at 0.
            raise ProducerStateError(
                ErrorCode.out_of_order_sequence_number,
                f"producer {pid} epoch {epoch} must start at sequence 0, got {first_seq}")
        if entry.batches and not in_sequence(entry.last_seq, first_seq):
            raise ProducerStateError(
                ErrorCode.out_of_order_sequence_number,
                f"producer {pid} epoch {epoch}: expected sequence "
                f"{entry.last_seq + 1 if entry.last_seq < INT32_MAX else 0}, got {first_seq}",
            )
        return None

    # -- update (after append, and when replaying the log) ----------------------------------

    def update(self, header: BatchHeader) -> None:
        """Record an appended batch; ``header.base_offset`` must be its assigned offset."""
        pid = header.producer_id
        if pid < 0:
            return
        if header.is_control:
            raise ValueError("markers go through complete_txn")
        entry = self.producers.get(pid)
        if entry is None or header.producer_epoch > entry.producer_epoch:
            prev = entry
            entry = ProducerStateEntry(pid, header.producer_epoch)
            if prev is not None:
                entry.coordinator_epoch = prev.coordinator_epoch
                entry.current_txn_first_offset = prev.current_txn_first_offset
            self.producers[pid] = entry
        entry.last_timestamp = max(entry.last_timestamp, header.max_timestamp)
        if header.is_transactional and entry.current_txn_first_offset < 0:
            entry.current_txn_first_offset = header.base_offset
        if header.base_sequence == NO_SEQUENCE:
            return
        entry.batches.append(
            BatchMetadata(
                header.base_sequence,
                header.last_sequence,
                header.last_offset,
                header.last_offset_delta,
                header.max_timestamp,
            )
        )

    def replay(self, headers: Iterable[BatchHeader]) -> None:
        """Replay data batches (markers are replayed with ``complete_txn``)."""
        for h in headers:
            self.update(h)

    # -- expiration (spec 000, "PID Expiration") --------------------------------------------

    def expire(self, now_ms: int, expiration_ms: int) -> list[int]:
        """Forget producers whose last write is older than ``expiration_ms``."""
        expired = [
            pid
            for pid, e in self.producers.items()
            if e.current_txn_first_offset < 0 and now_ms - e.last_timestamp >= expiration_ms
        ]
        for pid in expired:
            del self.producers[pid]
        return expired

    def truncate_to(self, offset: int) -> None:
        """Drop every batch at or after ``offset`` (used when the log tail is cut)."""
        for pid in list(self.producers):
            entry = self.producers[pid]
            kept = [b for b in entry.batches if b.last_offset < offset]
            if entry.current_txn_first_offset >= offset:
                entry.current_txn_first_offset = -1
            if not kept and entry.current_txn_first_offset < 0:
                del self.producers[pid]
            else:
                entry.batches = deque(kept, maxlen=NUM_BATCHES_TO_RETAIN)

    # -- snapshots (spec 000, "PID Snapshots") ----------------------------------------------
    #
    # Kafka's producer snapshot file (its ProducerSnapshot message, version 1):
    #   Version int16, Crc uint32 (CRC-32C of what follows), [ProducerEntry] (count int32):
    #   ProducerId int64, Epoch int16, LastSequence int32, LastOffset int64, OffsetDelta int32,
    #   Timestamp int64, CoordinatorEpoch int32, CurrentTxnFirstOffset int64
    # Kafka writes one entry per producer, for its last batch. We write one per retained batch,
    # oldest first, so that every in-flight retry is still recognised after a clean restart;
    # Kafka's reader keeps the last entry of a producer (its current state), so a Kafka broker
    # and kafka-dump-log read the file. A producer with no batch (only markers) has one entry
    # with LastSequence and LastOffset -1, as Kafka writes it. The last entry's Timestamp is
    # the producer's last timestamp, as in Kafka's.

    SNAPSHOT_VERSION = 1
    _HEAD = struct.Struct(">hI")
    _COUNT = struct.Struct(">i")
    _ENTRY = struct.Struct(">qhiqiqiq")

    def snapshot_bytes(self) -> bytes:
        entries = bytearray()
        count = 0
        for e in self.producers.values():
            batches: list[BatchMetadata | None] = list(e.batches) or [None]
            for i, b in enumerate(batches):
                last = i == len(batches) - 1
                entries += self._ENTRY.pack(
                    e.producer_id, e.producer_epoch,
                    b.last_seq if b else NO_SEQUENCE, b.last_offset if b else -1,
                    b.offset_delta if b else 0,
                    e.last_timestamp if last or b is None else b.timestamp,
                    e.coordinator_epoch, e.current_txn_first_offset)
                count += 1
        body = self._COUNT.pack(count) + bytes(entries)
        return self._HEAD.pack(self.SNAPSHOT_VERSION, crc32c(body)) + body

    @classmethod
    def from_snapshot(cls, data: bytes) -> ProducerStateManager:
        """Parse snapshot bytes; raise ValueError if damaged."""
        if len(data) < cls._HEAD.size + cls._COUNT.size:
            raise ValueError("snapshot truncated")
        version, crc = cls._HEAD.unpack_from(data, 0)
        if version != cls.SNAPSHOT_VERSION:
            raise ValueError(f"unknown snapshot version {version}")
        body = data[cls._HEAD.size :]
        if crc32c(body) != crc:
            raise ValueError("snapshot CRC mismatch")
        mgr = cls()
        (count,) = cls._COUNT.unpack_from(body, 0)
        if count < 0 or cls._COUNT.size + count * cls._ENTRY.size != len(body):
            raise ValueError(f"snapshot of {len(body)} bytes cannot hold {count} entries")
        for pid, epoch, last_seq, last_offset, delta, ts, coord, txn_first in \
                cls._ENTRY.iter_unpack(body[cls._COUNT.size:]):
            entry = mgr.producers.get(pid)
            if entry is None:
                entry = mgr.producers[pid] = ProducerStateEntry(pid, epoch)
            entry.producer_epoch = epoch
            entry.coordinator_epoch = coord
            entry.current_txn_first_offset = txn_first
            entry.last_timestamp = ts
            if last_offset >= 0:
                first_seq = last_seq - delta
                if first_seq < 0 and last_seq != NO_SEQUENCE:  # the sequence wrapped
                    first_seq += INT32_MAX + 1
                entry.batches.append(BatchMetadata(first_seq, last_seq, last_offset, delta, ts))
        return mgr
