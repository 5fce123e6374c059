"""The log layer of replication (docs/cluster.md): leader epochs stamped into batches and kept in
the leader-epoch cache, follower appends of the leader's bytes that rebuild the same producer
state, transactions and aborted-transaction index, truncation of a diverged tail, and the stored
high watermark. Real files in tmp_path, driven through PartitionLog's public interface."""

from __future__ import annotations

import os

import pytest
from kio.schema.errors import ErrorCode
from support.logs import open_log

from oncelog.log import (
    LeaderEpochCache,
    LogAppendError,
    UnexpectedAppendOffsetError,
)
from oncelog.log.leader_epoch import (
    CHECKPOINT_FILE,
    UNDEFINED_EPOCH,
    UNDEFINED_EPOCH_OFFSET,
    EpochEntry,
    read_checkpoint,
)
from oncelog.log.txn_index import AbortedTxn
from oncelog.records import build_batch, iter_batches, split_batches, validate_batch

SMALL = {"segment_bytes": 400, "index_interval_bytes": 100}


def produce(log, pid, epoch, seq, values, *, txn=False, leader_epoch=None, now=1_000):
    data = bytearray(build_batch([(None, v, [], now) for v in values], producer_id=pid,
                                 producer_epoch=epoch, base_sequence=seq, is_transactional=txn))
    return log.append(data, split_batches(data), now, leader_epoch=leader_epoch)


def log_bytes(log, end=None):
    """Every batch from the log start to ``end`` (default: the log end), as stored."""
    end = log.log_end_offset if end is None else end
    out = bytearray()
    offset = log.log_start_offset
    while offset < end:
        chunk = log.read(offset, 1 << 24, end)
        if not chunk:
            break
        out += chunk
        offset = [h for _, h in iter_batches(chunk)][-1].next_offset
    return bytes(out)


def headers(log):
    return [h for _, h in iter_batches(log_bytes(log))]


def replicate(leader, follower, up_to=None, max_bytes=250):
    """The follower's fetch loop: read from the leader at the follower's log end, as a Fetch
    response would carry it (whole batches up to ``max_bytes``, then the first bytes of the next
    one), append, and take the leader's high watermark."""
    end = leader.log_end_offset if up_to is None else up_to
    while follower.log_end_offset < end:
        chunk = leader.read(follower.log_end_offset, max_bytes, end)
        after = [h for _, h in iter_batches(chunk)][-1].next_offset
        if after < end:
            chunk += leader.read(after, 1, end)[:45]  # a partial batch: must be ignored
        before = follower.log_end_offset
        result = follower.append_as_follower(chunk)
        assert result.log_end_offset == follower.log_end_offset == after > before
        assert result.first_offset == before and result.last_offset == after - 1
    follower.update_high_watermark(min(leader.high_watermark, follower.log_end_offset))


def producers(log):
    # A batch's own timestamp is not compared: a producer snapshot (Kafka's layout) keeps the
    # producer's last timestamp in its last batch's entry, as Kafka's does.
    return {pid: (e.producer_epoch, e.coordinator_epoch, e.current_txn_first_offset,
                  e.last_timestamp,
                  [(b.first_seq, b.last_seq, b.last_offset, b.offset_delta) for b in e.batches])
            for pid, e in sorted(log.producer_state.producers.items())}


def txn_view(log):
    return (log.producer_state.open_transactions(), log.last_stable_offset, log.high_watermark,
            log.aborted_transactions(0, log.log_end_offset + 1))


def same_log(a, b):
    assert a.log_end_offset == b.log_end_offset
    assert log_bytes(a) == log_bytes(b)
    assert producers(a) == producers(b)
    assert txn_view(a) == txn_view(b)
    assert a.leader_epoch_cache.entries == b.leader_epoch_cache.entries


def build_leader(path, **config):
    """Idempotent and transactional data over two leader epochs, with commits and aborts:

    epoch 1: 0-1 p1 [a b] | 2 p1 [c] | 3-4 p2 txn | 5 p3 txn | 6 p1 [d] | 7 COMMIT p2
    epoch 3: 8 p2 txn | 9 ABORT p3 | 10-12 p4 txn | 13 ABORT p2 | 14 p1 [e]; p4 stays open
    """
    leader = open_log(path, **config)
    produce(leader, 1, 0, 0, [b"a", b"b"], leader_epoch=1)
    produce(leader, 1, 0, 2, [b"c"], leader_epoch=1)
    produce(leader, 2, 0, 0, [b"t1", b"t2"], txn=True, leader_epoch=1)
    produce(leader, 3, 0, 0, [b"u1"], txn=True, leader_epoch=1)
    produce(leader, 1, 0, 3, [b"d"], leader_epoch=1)
    leader.append_marker(2, 0, True, 0, 2_000, leader_epoch=1)
    produce(leader, 2, 0, 2, [b"t3"], txn=True, leader_epoch=3)
    leader.append_marker(3, 0, False, 0, 2_000, leader_epoch=3)
    produce(leader, 4, 0, 0, [b"v1", b"v2", b"v3"], txn=True, leader_epoch=3)
    leader.append_marker(2, 0, False, 1, 2_000, leader_epoch=3)
    produce(leader, 1, 0, 4, [b"e"], leader_epoch=3)
    leader.update_high_watermark(leader.log_end_offset)
    return leader


BATCH_ENDS = [2, 3, 5, 6, 7, 8, 9, 10, 13, 14, 15]  # the leader's batch boundaries


# -- the leader ----------------------------------------------------------------------------------


def test_leader_stamps_its_epoch_into_every_batch_and_records_where_epochs_start(tmp_path):
    leader = build_leader(tmp_path / "t-0")
    hs = headers(leader)
    assert [h.next_offset for h in hs] == BATCH_ENDS
    assert [h.partition_leader_epoch for h in hs] == [1] * 6 + [3] * 5
    data = log_bytes(leader)
    for pos, _h in iter_batches(data):
        validate_batch(data, pos)  # the epoch is outside the CRC
    assert leader.leader_epoch_cache.entries == [EpochEntry(1, 0), EpochEntry(3, 8)]
    assert (tmp_path / "t-0" / CHECKPOINT_FILE).read_text() == "0\n2\n1 0\n3 8\n"
    assert leader.aborted_transactions(0, 15) == [AbortedTxn(3, 5, 9, 8), AbortedTxn(2, 8, 13, 10)]
    assert leader.producer_state.open_transactions() == [(4, 10)]
    assert leader.last_stable_offset == 10 and leader.high_watermark == 15


# -- the follower --------------------------------------------------------------------------------


def test_follower_fed_in_chunks_ends_with_the_leaders_log_and_state(tmp_path):
    leader = build_leader(tmp_path / "leader")
    follower = open_log(tmp_path / "follower", **SMALL)
    replicate(leader, follower)
    assert len(follower.segments) > 1  # the follower rolled its own segments
    same_log(follower, leader)
    assert follower.producer_state.open_transactions() == [(4, 10)]
    assert follower.last_stable_offset == 10
    assert follower.aborted_transactions(9, 11) == [AbortedTxn(3, 5, 9, 8),
                                                    AbortedTxn(2, 8, 13, 10)]
    # Refetching what is already there appends nothing.
    again = follower.append_as_follower(log_bytes(leader))
    assert (again.batches, again.first_offset) == (0, -1)
    assert again.log_end_offset == 15
    same_log(follower, leader)
    # And it all survives a restart (indexes, snapshots, epochs, high watermark).
    follower.close(3_000)
    follower = open_log(tmp_path / "follower", **SMALL)
    same_log(follower, leader)


def test_follower_keeps_following_the_leader_as_it_appends(tmp_path):
    leader = build_leader(tmp_path / "leader")
    follower = open_log(tmp_path / "follower")
    replicate(leader, follower, up_to=10)
    leader.append_marker(4, 0, True, 0, 3_000, leader_epoch=3)
    produce(leader, 1, 0, 5, [b"f"], leader_epoch=5)
    leader.update_high_watermark(leader.log_end_offset)
    replicate(leader, follower, max_bytes=1)  # one batch per fetch
    same_log(follower, leader)
    assert follower.leader_epoch_cache.entries == [(1, 0), (3, 8), (5, 16)]
    assert follower.producer_state.open_transactions() == []
    assert follower.last_stable_offset == follower.log_end_offset == 17


def test_follower_refuses_corrupt_batches_and_appends_nothing(tmp_path):
    leader = build_leader(tmp_path / "leader")
    follower = open_log(tmp_path / "follower")
    data = bytearray(log_bytes(leader))
    second = [pos for pos, _ in iter_batches(data)][1]
    data[second + 63] ^= 0xFF  # a record byte of the second batch
    with pytest.raises(LogAppendError) as e:
        follower.append_as_follower(data)
    assert e.value.error_name == ErrorCode.corrupt_message
    assert follower.log_end_offset == 0 and follower.size_bytes == 0
    bad_length = bytearray(log_bytes(leader))
    bad_length[8:12] = (5).to_bytes(4, "big")
    with pytest.raises(LogAppendError):
        follower.append_as_follower(bad_length)
    assert follower.log_end_offset == 0


def test_follower_refuses_an_overlap_and_takes_a_compacted_gap(tmp_path):
    leader = build_leader(tmp_path / "leader")
    follower = open_log(tmp_path / "follower")
    gapped = open_log(tmp_path / "gapped")
    # A compacted leader's log has gaps where the cleaner removed batches: taken as they are.
    data = leader.read(3, 1 << 20, 15)
    sent = [h for _pos, h in iter_batches(data)]
    result = gapped.append_as_follower(data)
    assert sent[0].base_offset > 0 and result.first_offset == sent[0].base_offset
    assert gapped.log_end_offset == sent[-1].next_offset == result.log_end_offset
    # A follower whose log ends inside one of the leader's batches (a diverged history).
    other = open_log(tmp_path / "other")
    produce(other, 9, 0, 0, [b"x"], leader_epoch=0)
    follower.append_as_follower(log_bytes(other))
    assert follower.log_end_offset == 1
    with pytest.raises(UnexpectedAppendOffsetError):
        follower.append_as_follower(log_bytes(leader))  # batch 0-1 overlaps offset 0
    assert follower.log_end_offset == 1


def test_a_partial_batch_alone_appends_nothing(tmp_path):
    leader = build_leader(tmp_path / "leader")
    follower = open_log(tmp_path / "follower")
    first = log_bytes(leader)[: headers(leader)[0].size]
    for cut in (0, 5, 12, 61, len(first) - 1):
        result = follower.append_as_follower(first[:cut])
        assert result.batches == 0 and follower.log_end_offset == 0
    assert follower.append_as_follower(first).log_end_offset == 2


# -- truncation ----------------------------------------------------------------------------------


def reference(leader, path, end):
    """A follower that only ever got the leader's log below ``end``."""
    ref = open_log(path)
    replicate(leader, ref, up_to=end)
    ref.update_high_watermark(end)
    return ref


@pytest.mark.parametrize("offset, end", [(0, 0), (1, 0), (2, 2), (3, 3), (4, 3), (7, 7),
                                         (8, 8), (9, 9), (11, 10), (13, 13), (14, 14)])
def test_truncated_follower_is_the_follower_that_never_got_the_tail(tmp_path, offset, end):
    leader = build_leader(tmp_path / "leader")
    follower = open_log(tmp_path / "follower", **SMALL)
    replicate(leader, follower)
    follower.take_snapshot(2_000)
    assert follower.truncate_to(offset) == end  # a batch holding ``offset`` goes whole
    assert follower.log_end_offset == end and follower.high_watermark == end
    assert all(int(p.name[:20]) <= end for p in (tmp_path / "follower").glob("*.snapshot"))
    assert all(seg.base_offset <= max(end, 0) for seg in follower.segments)
    same_log(follower, reference(leader, tmp_path / "ref", end))
    # The same state after a restart, and refetching gives the leader's log again.
    follower.close(3_000)
    follower = open_log(tmp_path / "follower", **SMALL)
    assert follower.log_end_offset == end
    replicate(leader, follower)
    same_log(follower, leader)


def test_truncating_below_a_marker_reopens_its_transaction(tmp_path):
    leader = build_leader(tmp_path / "leader")
    follower = open_log(tmp_path / "follower")
    replicate(leader, follower)
    follower.truncate_to(13)  # p2's ABORT
    assert follower.producer_state.open_transactions() == [(2, 8), (4, 10)]
    assert follower.last_stable_offset == 8  # back from 10
    assert follower.aborted_transactions(0, 20) == [AbortedTxn(3, 5, 9, 8)]
    follower.truncate_to(7)  # p2's COMMIT of its first transaction
    assert follower.producer_state.open_transactions() == [(2, 3), (3, 5)]
    assert follower.last_stable_offset == 3
    assert follower.aborted_transactions(0, 20) == []
    assert follower.leader_epoch_cache.entries == [(1, 0)]
    replicate(leader, follower)
    same_log(follower, leader)


def test_truncating_below_a_transactions_first_batch_restores_the_producer(tmp_path):
    leader = build_leader(tmp_path / "leader")
    follower = open_log(tmp_path / "follower")
    replicate(leader, follower, up_to=8)
    before = producers(follower)[2]
    replicate(leader, follower)
    assert producers(follower)[2] != before
    follower.truncate_to(8)  # p2's batch that opened its second transaction
    assert producers(follower)[2] == before
    assert producers(follower)[2][2] == -1  # no open transaction
    assert 4 not in producers(follower)  # p4 only wrote after 8
    # A producer retry after a leader change is judged on the restored state.
    assert follower.producer_state.check_batch(headers(leader)[6]) is None


def test_truncating_at_or_past_the_end_keeps_the_log_but_drops_later_epochs(tmp_path):
    log = build_leader(tmp_path / "t-0")
    before = log_bytes(log)
    log.leader_epoch_cache.assign(6, 15)  # became leader at epoch 6, wrote nothing yet
    assert log.truncate_to(20) == 15
    assert log.leader_epoch_cache.latest_epoch == 6
    assert log.truncate_to(15) == 15  # KAFKA-10706: the empty epoch goes
    assert log.leader_epoch_cache.entries == [(1, 0), (3, 8)]
    assert log_bytes(log) == before


def test_truncated_log_takes_new_appends_after_a_crash(tmp_path):
    """The recovery point goes down with the log: data written after a truncation is
    validated when the log is opened after a crash."""
    leader = build_leader(tmp_path / "leader")
    follower = open_log(tmp_path / "follower", **SMALL)
    replicate(leader, follower)
    follower.flush()
    follower.truncate_to(3)
    replicate(leader, follower)
    follower.close_unclean()
    follower = open_log(tmp_path / "follower", **SMALL)
    # The high watermark stored last (flush, roll) at most: the next fetch brings it up.
    assert follower.high_watermark <= leader.high_watermark
    follower.update_high_watermark(leader.high_watermark)
    same_log(follower, leader)


# -- the leader-epoch cache ----------------------------------------------------------------------


def test_epoch_cache_assign_follows_kafka(tmp_path):
    path = tmp_path / CHECKPOINT_FILE
    cache = LeaderEpochCache(path)
    assert cache.latest_epoch is None and cache.entries == []
    assert cache.assign(2, 10)
    assert not cache.assign(2, 15)  # the same epoch, later: nothing to record
    assert not path.with_name(CHECKPOINT_FILE + ".tmp").exists()
    assert cache.assign(4, 20) and cache.assign(5, 30)
    assert path.read_text() == "0\n3\n2 10\n4 20\n5 30\n"
    assert cache.assign(5, 25)  # the same epoch, earlier: moved back
    assert cache.entries == [(2, 10), (4, 20), (5, 25)]
    assert cache.assign(6, 20)  # conflicts with every entry starting at or after 20
    assert cache.entries == [(2, 10), (6, 20)]
    assert cache.assign(3, 40)  # an older epoch replaces the newer ones
    assert cache.entries == [(2, 10), (3, 40)]
    with pytest.raises(ValueError):
        cache.assign(-1, 5)
    assert read_checkpoint(path) == [(2, 10), (3, 40)]
    assert LeaderEpochCache.load(path).entries == [(2, 10), (3, 40)]


def test_epoch_cache_end_offset_for_and_epoch_for_offset(tmp_path):
    cache = LeaderEpochCache(tmp_path / CHECKPOINT_FILE, [(2, 10), (4, 20), (5, 30)])
    leo = 40
    assert cache.end_offset_for(5, leo) == (5, 40)  # the latest epoch: the log end
    assert cache.end_offset_for(4, leo) == (4, 30)
    assert cache.end_offset_for(3, leo) == (2, 20)  # the largest epoch below, its end
    assert cache.end_offset_for(2, leo) == (2, 20)
    # Below the first epoch (its entries went with old segments): the first epoch's start.
    assert cache.end_offset_for(1, leo) == (1, 10)
    undefined = (UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET)
    assert cache.end_offset_for(-1, leo) == undefined
    assert cache.end_offset_for(6, leo) == undefined  # newer than any epoch here
    assert LeaderEpochCache(None).end_offset_for(0, leo) == undefined
    assert [cache.epoch_for_offset(o) for o in (0, 9, 10, 19, 20, 30, 99)] == \
        [None, None, 2, 2, 4, 5, 5]
    assert cache.start_offset_of(4) == 20 and cache.start_offset_of(3) is None


def test_epoch_cache_truncation_from_either_end(tmp_path):
    path = tmp_path / CHECKPOINT_FILE
    cache = LeaderEpochCache(path, [(2, 10), (4, 20), (5, 30)])
    assert not cache.truncate_from_end(31)
    assert cache.truncate_from_end(30) and cache.entries == [(2, 10), (4, 20)]
    assert cache.truncate_from_start(25)  # epoch 4 now starts at the log start
    assert cache.entries == [(4, 25)]
    assert not cache.truncate_from_start(25) and not cache.truncate_from_start(5)
    assert read_checkpoint(path) == [(4, 25)]
    cache = LeaderEpochCache(path, [(2, 10), (4, 20)])
    assert not cache.truncate_from_start(10)  # an entry starting exactly there stays
    assert cache.truncate_from_start(20) and cache.entries == [(4, 20)]
    assert cache.truncate_from_end(0) and cache.entries == []


@pytest.mark.parametrize("text", ["", "1\n1\n0 0\n", "0\n2\n0 0\n", "0\n1\n0 0\n1 5\n",
                                  "0\n2\n3 0\n2 5\n", "0\n1\nx y\n", "0\n1\n0\t0\n", "\x00\x01"])
def test_damaged_checkpoint_files_are_not_read(tmp_path, text):
    path = tmp_path / CHECKPOINT_FILE
    path.write_text(text)
    assert read_checkpoint(path) is None
    assert read_checkpoint(tmp_path / "missing") is None


@pytest.mark.parametrize("damage", ["missing", "garbage", "truncated"])
def test_a_log_rebuilds_a_lost_checkpoint_from_its_batches(tmp_path, damage):
    d = tmp_path / "t-0"
    log = build_leader(d, **SMALL)
    log.close(3_000)
    path = d / CHECKPOINT_FILE
    if damage == "missing":
        path.unlink()
    elif damage == "garbage":
        path.write_text("nonsense\n")
    else:
        path.write_text(path.read_text()[:-3])
    log = open_log(d, **SMALL)
    assert log.leader_epoch_cache.entries == [(1, 0), (3, 8)]
    assert read_checkpoint(path) == [(1, 0), (3, 8)]
    assert log.end_offset_for_epoch(1) == (1, 8)
    assert log.end_offset_for_epoch(3) == (3, 15)


def test_retention_moves_the_first_epoch_up_to_the_log_start(tmp_path):
    log = open_log(tmp_path / "t-0", segment_bytes=200, retention_bytes=250)
    for i in range(6):
        produce(log, 1, 0, i, [b"x" * 40], leader_epoch=1 if i < 4 else 2)
    log.update_high_watermark(log.log_end_offset)
    assert log.apply_retention(10_000) == [0, 1, 2]
    assert log.log_start_offset == 3
    assert log.leader_epoch_cache.entries == [(1, 3), (2, 4)]
    assert read_checkpoint(tmp_path / "t-0" / CHECKPOINT_FILE) == [(1, 3), (2, 4)]
    log.segments[0].delete()  # as retention would take the next one
    del log.segments[0]
    log.close(20_000)
    log = open_log(tmp_path / "t-0", segment_bytes=200, retention_bytes=250)
    assert log.log_start_offset == 4
    assert log.leader_epoch_cache.entries == [(2, 4)]  # moved up when opened, as Kafka
    assert log.high_watermark == 6


# -- the high watermark --------------------------------------------------------------------------


def test_high_watermark_is_stored_persisted_and_clamped(tmp_path):
    d = tmp_path / "t-0"
    log = open_log(d)
    produce(log, -1, -1, -1, [b"a", b"b"], leader_epoch=0)
    produce(log, -1, -1, -1, [b"c"], leader_epoch=0)
    produce(log, -1, -1, -1, [b"d", b"e"], leader_epoch=0)
    assert log.log_end_offset == 5 and log.high_watermark == 0
    assert log.read(0, 1 << 20) == b""  # consumers read below the high watermark only
    assert log.last_stable_offset == 0
    assert log.update_high_watermark(3) == 3
    assert log.update_high_watermark(2) == 3  # never backwards
    assert [h.next_offset for h in headers(log)] == [2, 3, 5]
    assert [h.next_offset for _, h in iter_batches(log.read(0, 1 << 20))] == [2, 3]
    log.close(2_000)
    assert (d / "high-watermark").read_text() == "3"
    log = open_log(d)
    assert log.high_watermark == 3
    assert log.update_high_watermark(99) == 5  # clamped to the log end
    log.maintain(3_000)  # written every 5 s (replica.high.watermark.checkpoint.interval.ms)
    assert (d / "high-watermark").read_text() == "3"
    log.maintain(5_000)
    assert (d / "high-watermark").read_text() == "5"
    # A crash that loses the tail below the stored high watermark: clamped when opened.
    log.close_unclean()
    with open(d / "00000000000000000000.log", "r+b") as f:
        f.truncate(os.path.getsize(d / "00000000000000000000.log") - 10)
    log = open_log(d)
    assert log.log_end_offset == 3 and log.high_watermark == 3
    assert log.update_high_watermark(-5) == 3


def test_appends_move_the_log_end_and_never_the_high_watermark(tmp_path):
    """A single node's log too: what consumers read (the high watermark, the LSO) moves when
    the replica manager says the in-sync replicas have the data, and is checkpointed."""
    d = tmp_path / "t-0"
    log = open_log(d)
    produce(log, 1, 0, 0, [b"a", b"b"], leader_epoch=0)
    produce(log, 2, 0, 0, [b"t1"], txn=True, leader_epoch=0)  # offset 2: opens a transaction
    log.append_marker(2, 0, True, 0, 2_000, leader_epoch=0)  # offset 3
    produce(log, 1, 0, 2, [b"c"], leader_epoch=0)  # offset 4
    assert (log.log_end_offset, log.high_watermark, log.last_stable_offset) == (5, 0, 0)
    assert log.read(0, 1 << 20) == b""
    log.flush()
    assert (d / "high-watermark").read_text() == "0"
    assert log.update_high_watermark(2) == 2
    assert log.last_stable_offset == 2
    assert [h.next_offset for _, h in iter_batches(log.read(0, 1 << 20))] == [2]
    assert log.update_high_watermark(3) == 3  # the transaction's data, not its marker
    assert log.last_stable_offset == 2  # how it ended is not in the in-sync replicas yet
    assert log.update_high_watermark(log.log_end_offset) == 5
    assert log.last_stable_offset == 5
    log.flush()
    assert (d / "high-watermark").read_text() == "5"


def test_the_high_watermark_is_never_below_the_log_start(tmp_path):
    """A follower's log start follows its leader's (DeleteRecords) and retention, possibly past
    the high watermark it has: the high watermark comes up with it."""
    leader = build_leader(tmp_path / "leader")
    follower = open_log(tmp_path / "follower", segment_bytes=200, retention_bytes=300)
    follower.append_as_follower(log_bytes(leader))
    assert follower.high_watermark == 0
    assert follower.increment_log_start_offset(3, 2_000)
    assert follower.high_watermark == 3 and follower.last_stable_offset == 3
    assert follower.apply_retention(3_000)
    assert follower.log_start_offset > 3
    assert follower.high_watermark == follower.log_start_offset
    follower.truncate_fully_and_start_at(20, 4_000)
    assert follower.high_watermark == 20
    follower.close(5_000)
    assert open_log(tmp_path / "follower").high_watermark == 20


def test_an_ended_transaction_is_unstable_until_its_marker_is_below_the_high_watermark(
        tmp_path):
    """Kafka's unreplicatedTxns: a read_committed consumer reads none of a transaction before
    the in-sync replicas have its marker, also when replayed after a crash, and a truncation
    that cuts the marker opens the transaction again."""
    d = tmp_path / "t-0"
    log = open_log(d)
    produce(log, 2, 0, 0, [b"t1", b"t2"], txn=True)  # 0-1
    log.update_high_watermark(2)
    assert log.last_stable_offset == 0
    log.append_marker(2, 0, False, 0, 2_000)  # 2: the abort
    assert log.producer_state.open_transactions() == []
    assert log.last_stable_offset == 0  # ended, but the marker is not replicated
    assert log.aborted_transactions(0, 3) == [AbortedTxn(2, 0, 2, 3)]
    log.flush()  # the high watermark written
    log.close_unclean()
    log = open_log(d)
    assert (log.high_watermark, log.last_stable_offset) == (2, 0)  # the marker replayed
    log.update_high_watermark(3)
    assert log.last_stable_offset == 3
    log.truncate_to(2)  # a follower cutting the marker: the transaction is open again
    assert (log.high_watermark, log.last_stable_offset) == (2, 0)
    assert log.producer_state.open_transactions() == [(2, 0)]
    log.append_marker(2, 0, True, 0, 4_000)  # the new leader's marker
    assert log.last_stable_offset == 0
    log.update_high_watermark(3)
    assert log.last_stable_offset == 3 and log.aborted_transactions(0, 3) == []


def test_lso_never_passes_the_high_watermark(tmp_path):
    leader = build_leader(tmp_path / "leader")
    follower = open_log(tmp_path / "follower")
    replicate(leader, follower)
    follower.truncate_to(15)  # nothing to cut
    assert follower.last_stable_offset == 10
    other = open_log(tmp_path / "other")
    other.append_as_follower(log_bytes(leader, end=10))
    assert other.high_watermark == 0 and other.last_stable_offset == 0
    other.update_high_watermark(6)
    # p2's COMMIT (7) and p3's ABORT (9) are not below the high watermark yet: their
    # transactions (from 3 and 5) hold the LSO as open ones do (Kafka's unreplicatedTxns).
    assert other.last_stable_offset == 3
    other.update_high_watermark(8)
    assert other.last_stable_offset == 5
    other.update_high_watermark(10)
    assert other.last_stable_offset == 8  # p2's second transaction is open at 8


# -- crashes -------------------------------------------------------------------------------------


def test_follower_recovers_after_an_unclean_close(tmp_path):
    leader = build_leader(tmp_path / "leader")
    d = tmp_path / "follower"
    follower = open_log(d, **SMALL)
    replicate(leader, follower, up_to=10)
    follower.leader_epoch_cache.assign(7, 10)  # became leader at 7, wrote nothing: then crashed
    follower.close_unclean()
    active = max(d.glob("*.log"))
    with open(active, "ab") as f:
        f.write(log_bytes(leader)[-30:])  # a torn write
    follower = open_log(d, **SMALL)
    assert follower.recovered_bytes == 30
    assert follower.log_end_offset == 10
    assert follower.leader_epoch_cache.entries == [(1, 0), (3, 8)]  # (7, 10) is past the end
    assert follower.high_watermark <= 10  # what was stored last, clamped
    follower.update_high_watermark(10)
    same_log(follower, reference(leader, tmp_path / "ref", 10))
    replicate(leader, follower)
    same_log(follower, leader)


def test_unclean_close_recovers_epochs_whose_checkpoint_was_lost(tmp_path):
    """Kafka's recovery re-assigns the epochs of the batches it validates."""
    leader = build_leader(tmp_path / "leader")
    d = tmp_path / "follower"
    follower = open_log(d)
    replicate(leader, follower, up_to=8)
    saved = (d / CHECKPOINT_FILE).read_text()
    replicate(leader, follower)
    follower.close_unclean()
    (d / CHECKPOINT_FILE).write_text(saved)  # an old copy that misses epoch 3
    follower = open_log(d)
    assert follower.leader_epoch_cache.entries == [(1, 0), (3, 8)]
    assert read_checkpoint(d / CHECKPOINT_FILE) == [(1, 0), (3, 8)]
