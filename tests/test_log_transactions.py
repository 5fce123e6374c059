"""Transactions in one partition's log: open transactions, COMMIT/ABORT markers, the last stable
offset and the aborted-transaction index (spec 000, "Last Stable Offset Tracking", "Aborted
Transaction Index"), through appends, restarts and crashes."""

from __future__ import annotations

import pytest
from kio.schema.errors import ErrorCode
from support.logs import advance_high_watermark, open_log

from oncelog.log import LogAppendError
from oncelog.log.txn_index import AbortedTxn
from oncelog.records import build_batch, decode_batch, iter_batches, split_batches
from oncelog.records.batch import parse_control_record

# Every append below is a single node's leader's: its replica manager, the only in-sync
# replica, moves the high watermark to the log end after it.


def txn_produce(log, pid, epoch, seq, values, now=1_000, transactional=True):
    data = bytearray(build_batch([(None, v, [], now) for v in values], producer_id=pid,
                                 producer_epoch=epoch, base_sequence=seq,
                                 is_transactional=transactional))
    result = log.append(data, split_batches(data), now)
    advance_high_watermark(log)
    return result


def marker(log, pid, epoch, commit, coordinator_epoch, now):
    result = log.append_marker(pid, epoch, commit, coordinator_epoch, now)
    advance_high_watermark(log)
    return result


def batches(log):
    data = log.read(0, 1 << 24)
    return [decode_batch(data, pos) for pos, _ in iter_batches(data)]


def test_lso_is_the_first_offset_of_the_oldest_open_transaction(tmp_path):
    log = open_log(tmp_path / "t-0")
    txn_produce(log, 1, 0, 0, [b"plain"], transactional=False)  # idempotent, not in a txn
    assert log.last_stable_offset == log.high_watermark == 1
    txn_produce(log, 2, 0, 0, [b"a1", b"a2"])  # offsets 1-2: producer 2's transaction
    txn_produce(log, 3, 0, 0, [b"b1"])  # offset 3: producer 3's
    txn_produce(log, 2, 0, 2, [b"a3"])  # offset 4
    assert log.high_watermark == 5 and log.last_stable_offset == 1
    assert log.producer_state.open_transactions() == [(2, 1), (3, 3)]
    marker(log, 2, 0, True, 0, 2_000)  # offset 5: producer 2 commits
    assert log.last_stable_offset == 3  # producer 3 still open
    marker(log, 3, 0, False, 0, 2_000)  # offset 6: producer 3 aborts
    assert log.last_stable_offset == log.high_watermark == 7
    assert log.aborted_transactions(0, 7) == [AbortedTxn(3, 3, 6, 7)]
    markers = [(h.base_offset, h.producer_id, parse_control_record(rs[0]))
               for h, rs in batches(log) if h.is_control]
    assert markers == [(5, 2, (1, 0)), (6, 3, (0, 0))]


def test_aborted_transactions_are_those_that_intersect_the_range(tmp_path):
    log = open_log(tmp_path / "t-0")
    txn_produce(log, 1, 0, 0, [b"x"])  # 0
    marker(log, 1, 0, False, 0, 1_000)  # 1
    txn_produce(log, 2, 0, 0, [b"y"])  # 2
    txn_produce(log, 1, 0, 1, [b"z"])  # 3
    marker(log, 2, 0, False, 0, 1_000)  # 4
    marker(log, 1, 0, True, 0, 1_000)  # 5: a commit is not indexed
    first, second = AbortedTxn(1, 0, 1, 2), AbortedTxn(2, 2, 4, 3)
    assert log.aborted_transactions(0, 6) == [first, second]
    assert log.aborted_transactions(2, 6) == [second]  # the first ended before 2
    assert log.aborted_transactions(0, 2) == [first]  # the second starts at 2
    assert log.aborted_transactions(5, 6) == []


def test_markers_from_old_producer_or_coordinator_epochs_are_refused(tmp_path):
    log = open_log(tmp_path / "t-0")
    txn_produce(log, 7, 3, 0, [b"x"])
    with pytest.raises(LogAppendError) as e:
        marker(log, 7, 2, True, 0, 1_000)
    assert e.value.error_name == ErrorCode.invalid_producer_epoch
    marker(log, 7, 3, True, 5, 1_000)
    txn_produce(log, 7, 3, 1, [b"y"])
    with pytest.raises(LogAppendError) as e:
        marker(log, 7, 3, True, 4, 1_000)
    assert e.value.error_name == ErrorCode.transaction_coordinator_fenced
    assert log.last_stable_offset == 2  # the refused markers ended nothing


def test_a_marker_with_a_newer_epoch_fences_the_zombie(tmp_path):
    """The coordinator aborts a fenced producer's transaction with the bumped epoch: the
    partition learns the new epoch, and the zombie's next batch is refused."""
    log = open_log(tmp_path / "t-0")
    txn_produce(log, 7, 0, 0, [b"zombie-1"])
    marker(log, 7, 1, False, 0, 1_000)
    assert log.aborted_transactions(0, 10) == [AbortedTxn(7, 0, 1, 2)]
    with pytest.raises(LogAppendError) as e:
        txn_produce(log, 7, 0, 1, [b"zombie-2"])
    assert e.value.error_name == ErrorCode.invalid_producer_epoch
    assert txn_produce(log, 7, 1, 0, [b"new"]).base_offset == 2  # new epoch starts at 0


def test_sequenceless_transactional_batches_are_checked_for_their_epoch_only(tmp_path):
    """The group coordinator's TxnOffsetCommit records carry no sequence numbers."""
    log = open_log(tmp_path / "t-0")
    txn_produce(log, 9, 2, -1, [b"offsets"])
    txn_produce(log, 9, 2, -1, [b"offsets again"])
    assert log.last_stable_offset == 0
    with pytest.raises(LogAppendError) as e:
        txn_produce(log, 9, 1, -1, [b"stale"])
    assert e.value.error_name == ErrorCode.invalid_producer_epoch
    with pytest.raises(LogAppendError) as e:
        txn_produce(log, 10, 0, -1, [b"not transactional"], transactional=False)
    assert e.value.error_name == ErrorCode.invalid_record
    marker(log, 9, 2, True, 0, 1_000)
    assert log.last_stable_offset == 3


def test_a_marker_for_a_producer_that_wrote_nothing_here_is_written(tmp_path):
    log = open_log(tmp_path / "t-0")
    marker(log, 4, 0, False, 0, 1_000)
    assert log.high_watermark == log.last_stable_offset == 1
    assert log.aborted_transactions(0, 1) == [AbortedTxn(4, 0, 0, 1)]


@pytest.mark.parametrize("shutdown", ["clean", "crash", "crash-no-snapshot-no-index"])
def test_open_transactions_and_the_index_survive_a_restart(tmp_path, shutdown):
    d = tmp_path / "t-0"
    log = open_log(d, segment_bytes=400)
    txn_produce(log, 1, 0, 0, [b"a" * 50])
    marker(log, 1, 0, False, 0, 1_000)
    for i in range(6):  # several segments, producer 2's transaction left open
        txn_produce(log, 2, 0, i, [b"b" * 50])
    txn_produce(log, 3, 0, 0, [b"c" * 50])
    marker(log, 3, 0, False, 0, 1_000)
    end = log.high_watermark
    before = log.aborted_transactions(0, end)
    assert len(log.segments) > 2 and log.last_stable_offset == 2
    if shutdown == "clean":
        log.close(5_000)
    else:
        log.close_unclean()
        if shutdown == "crash-no-snapshot-no-index":
            for p in list(d.glob("*.snapshot")) + list(d.glob("*.txnindex")):
                p.unlink()
    log = open_log(d, segment_bytes=400)
    if shutdown == "clean":
        assert log.high_watermark == end  # written at the close
    else:  # written at the last roll: the replica manager moves it when it takes the lead
        assert log.high_watermark < end
        advance_high_watermark(log)
    assert log.high_watermark == end and log.last_stable_offset == 2
    assert log.aborted_transactions(0, end) == before
    assert log.producer_state.open_transactions() == [(2, 2)]
    assert sorted(p.name for p in d.glob("*.txnindex"))
    marker(log, 2, 0, True, 0, 6_000)
    assert log.last_stable_offset == log.high_watermark


def test_a_torn_marker_is_cut_and_its_transaction_is_open_again(tmp_path):
    d = tmp_path / "t-0"
    log = open_log(d)
    txn_produce(log, 1, 0, 0, [b"x"])
    marker(log, 1, 0, False, 0, 1_000)
    seg_file = d / "00000000000000000000.log"
    log.close_unclean()
    with open(seg_file, "r+b") as f:  # the marker's last bytes never reached the disk
        f.truncate(seg_file.stat().st_size - 3)
    log = open_log(d)
    assert log.high_watermark == 0  # none written before the crash
    advance_high_watermark(log)  # the replica manager, taking the lead
    assert log.high_watermark == 1 and log.last_stable_offset == 0
    assert log.aborted_transactions(0, 10) == []
    marker(log, 1, 0, True, 0, 2_000)
    assert log.last_stable_offset == 2 and log.aborted_transactions(0, 10) == []


def test_retention_removes_the_index_with_its_segment(tmp_path):
    d = tmp_path / "t-0"
    log = open_log(d, segment_bytes=300, retention_bytes=1)
    txn_produce(log, 1, 0, 0, [b"x" * 100])
    marker(log, 1, 0, False, 0, 1_000)
    txn_produce(log, 2, 0, 0, [b"y" * 100], transactional=False)
    txn_produce(log, 2, 0, 1, [b"y" * 100], transactional=False)
    assert (d / "00000000000000000000.txnindex").exists()
    log.apply_retention(1_000)
    assert not (d / "00000000000000000000.txnindex").exists()
    assert log.aborted_transactions(0, log.high_watermark) == []
