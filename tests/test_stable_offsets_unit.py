"""Who holds a partition's last stable offset (server/stable_offsets.py ``holder``), against an
in-memory partition: its log's LSO, high watermark, open transactions and batch headers are
doubles, so the answer is checked without a broker (tests/test_lso_stuck.py checks the pages and
commands that show it, on a broker)."""

from __future__ import annotations

from types import SimpleNamespace

from oncelog.server.stable_offsets import StableOffsetWatch, holder
from oncelog.txn.state import TransactionMetadata, TransactionState


class _Log:
    def __init__(self, lso: int, hw: int, open_txns: dict[int, tuple[int, int]],
                 batches: dict[int, int]) -> None:
        """``open_txns``: producer id -> (epoch, first offset of its open transaction);
        ``batches``: base offset -> first timestamp of the batches still in the log."""
        self.last_stable_offset, self.high_watermark = lso, hw
        self.producer_state = SimpleNamespace(producers={
            pid: SimpleNamespace(producer_id=pid, producer_epoch=epoch,
                                 current_txn_first_offset=first)
            for pid, (epoch, first) in open_txns.items()})
        self.batches = batches

    def iter_headers_from(self, offset: int):
        for base in sorted(b for b in self.batches if b >= offset):
            yield None, 0, SimpleNamespace(base_offset=base, base_timestamp=self.batches[base])


def _partition(log: _Log):
    return SimpleNamespace(topic="t", index=0, log=log)


def test_nothing_holds_an_lso_at_the_high_watermark():
    p = _partition(_Log(5, 5, {1: (0, 3)}, {3: 100}))
    assert holder(StableOffsetWatch(), p, 1_000, by_pid={}) is None


def test_the_oldest_open_transaction_holds_it_and_how_long_is_timed():
    watch = StableOffsetWatch()
    p = _partition(_Log(3, 9, {1: (0, 6), 2: (4, 3), 3: (0, -1)}, {3: 111, 6: 222}))
    first = holder(watch, p, 1_000, by_pid={})
    assert (first.producer_id, first.producer_epoch, first.first_offset) == (2, 4, 3)
    assert (first.lso, first.hw, first.stuck_ms) == (3, 9, 0)
    # not coordinated here: the transaction is known by the time of its first batch
    assert first.transactional_id is None and first.first_write_ms == 111
    assert holder(watch, p, 4_500, by_pid={}).stuck_ms == 3_500


def test_a_transaction_this_broker_coordinates_is_named():
    m = TransactionMetadata("payments", 2, 4, 60_000, TransactionState.ONGOING,
                            txn_start_ms=777)
    p = _partition(_Log(3, 9, {2: (4, 3)}, {3: 111}))
    found = holder(StableOffsetWatch(), p, 1_000, by_pid={2: m})
    assert (found.transactional_id, found.state, found.txn_start_ms) == \
        ("payments", "Ongoing", 777)
    assert found.first_write_ms is None and not found.two_phase


def test_a_first_batch_no_longer_in_the_log_has_no_time():
    p = _partition(_Log(3, 9, {2: (4, 3)}, {5: 111}))  # offset 3 is below the log's start
    assert holder(StableOffsetWatch(), p, 1_000, by_pid={}).first_write_ms is None
