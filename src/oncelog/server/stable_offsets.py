"""Where each partition's last stable offset (LSO) is held, and for how long: the one place the
metrics page and the console read a stuck LSO from.

A read_committed consumer stops at the LSO: the first offset of the oldest open transaction
(KIP-98). A transaction in flight holds it for a moment; one left open (a crashed producer
before its timeout, a KIP-939 two-phase-commit transaction waiting for its external decision,
which never times out) holds it while the high watermark (HW) climbs, and every read_committed
consumer of the partition waits.

``StableOffsetWatch`` keeps, per partition whose LSO is below its HW, the LSO it saw and when it
first saw it there. The broker's maintenance tick (once a second, ``Broker.maintain``) looks at
every hosted partition, and a reader (a scrape, a console page) looks again at what it reads, so
"stuck for" is exact to the tick: the LSO's moves are not hooked on the append path, which
stays as lean as it was. A partition whose LSO equals its HW is not stuck (0) and costs no
entry. After a restart the watch starts afresh: a partition held since before it counts from
the broker's start (the transaction's own start time is on the console and in ``oncelog groups
describe``, from the transaction coordinator).

``holder()`` names the transaction that holds an LSO: its producer id and epoch, first offset,
and, when this broker coordinates it, its transactional id, state and start time.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..txn.state import TransactionMetadata

if TYPE_CHECKING:
    from ..txn.coordinator import TransactionCoordinator

TP = tuple[str, int]


class StableOffsetWatch:
    def __init__(self) -> None:
        self._held: dict[TP, tuple[int, int]] = {}  # (topic, index) -> (LSO, first seen ms)

    def stuck_ms(self, topic: str, index: int, plog, now: int) -> int:
        """How long the partition's LSO has stood where it is below the HW (0 when it is at
        the HW, or has just moved)."""
        lso, hw = plog.last_stable_offset, plog.high_watermark
        key = (topic, index)
        if lso >= hw:
            self._held.pop(key, None)
            return 0
        seen = self._held.get(key)
        if seen is None or seen[0] != lso:
            self._held[key] = (lso, now)
            return 0
        return max(0, now - seen[1])

    def observe(self, partitions: Iterable, now: int) -> None:
        """One look at every hosted partition (``Partition`` objects); forgets those no longer
        hosted."""
        hosted = set()
        for p in partitions:
            hosted.add((p.topic, p.index))
            self.stuck_ms(p.topic, p.index, p.log, now)
        for key in [k for k in self._held if k not in hosted]:
            del self._held[key]


@dataclass(frozen=True)
class LsoHolder:
    """The oldest open transaction of a partition whose LSO is below its HW."""

    lso: int
    hw: int
    producer_id: int
    producer_epoch: int
    first_offset: int
    stuck_ms: int
    transactional_id: str | None = None  # None: not coordinated by this broker (or unknown)
    state: str | None = None  # the coordinator's state (Ongoing, PrepareCommit, ...)
    txn_start_ms: int | None = None  # when the coordinator began the transaction
    two_phase: bool = False  # KIP-939: it never times out
    # Not coordinated here: the timestamp of the transaction's first batch in this partition
    first_write_ms: int | None = None


def coordinated_by_producer_id(cores: Iterable[TransactionCoordinator]
                               ) -> dict[int, TransactionMetadata]:
    """Producer id -> TransactionMetadata of every transactional id of ``cores`` (the
    transaction coordinator's, of the partitions this broker leads)."""
    out: dict[int, TransactionMetadata] = {}
    for core in cores:
        for m in core.transactions.values():
            out[m.producer_id] = m
    return out


def _batch_timestamp(plog, offset: int) -> int | None:
    """The first timestamp of the batch holding ``offset`` (one index lookup and a header
    read), or None when it is gone or has none."""
    try:
        for _seg, _pos, header in plog.iter_headers_from(offset):
            if header.base_offset <= offset and header.base_timestamp >= 0:
                return int(header.base_timestamp)
            return None
    except (OSError, ValueError):
        return None
    return None


def holder(watch: StableOffsetWatch, partition, now: int,
           by_pid: dict[int, TransactionMetadata]) -> LsoHolder | None:
    """Who holds ``partition``'s LSO below its HW, or None when nothing does: ``watch`` knows
    since when, ``by_pid`` (``coordinated_by_producer_id``) which transactions this broker
    coordinates."""
    plog = partition.log
    lso, hw = plog.last_stable_offset, plog.high_watermark
    if lso >= hw:
        return None
    entries = [e for e in plog.producer_state.producers.values()
               if e.current_txn_first_offset >= 0]
    if not entries:
        return None
    oldest = min(entries, key=lambda e: e.current_txn_first_offset)
    stuck = watch.stuck_ms(partition.topic, partition.index, plog, now)
    m = by_pid.get(oldest.producer_id)
    if m is None:
        return LsoHolder(lso, hw, oldest.producer_id, oldest.producer_epoch,
                         oldest.current_txn_first_offset, stuck,
                         first_write_ms=_batch_timestamp(plog, oldest.current_txn_first_offset))
    return LsoHolder(lso, hw, oldest.producer_id, oldest.producer_epoch,
                     oldest.current_txn_first_offset, stuck, m.transactional_id,
                     m.state.display, m.txn_start_ms if m.txn_start_ms >= 0 else None,
                     m.two_phase)
