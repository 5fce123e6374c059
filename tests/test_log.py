"""One partition's log on disk: offsets, segments and indexes, roll, retention, recovery,
producer snapshots."""

from __future__ import annotations

import os
import time

import pytest
from kio.schema.errors import ErrorCode
from support.logs import advance_high_watermark, open_log

from oncelog.log import LogAppendError, LogConfig, OffsetOutOfRangeError
from oncelog.log.log import COPY_BELOW
from oncelog.records import build_batch, decode_batch, iter_batches, split_batches


def produce(log, values, now=1_000, ts=None, pid=-1, epoch=-1, seq=-1):
    """Append a batch as a single node's leader does: its replica manager, the only in-sync
    replica, then moves the high watermark to the log end."""
    data = bytearray(build_batch([(None, v, [], ts if ts is not None else now) for v in values],
                                 producer_id=pid, producer_epoch=epoch, base_sequence=seq))
    result = log.append(data, split_batches(data), now)
    advance_high_watermark(log)
    return result


def read_all(log, start=0):
    """What a consumer reads from ``start``: up to the high watermark."""
    out = []
    offset = start
    while offset < log.high_watermark:
        data = log.read(offset, 1 << 20)
        for pos, h in iter_batches(data):
            _, records = decode_batch(data, pos)
            out.extend((r.offset, r.value) for r in records if r.offset >= offset)
        offset = out[-1][0] + 1
    return out


def test_offsets_are_assigned_consecutively_and_read_back(tmp_path):
    log = open_log(tmp_path / "t-0", LogConfig(), 0)
    assert produce(log, [b"a", b"b"]).base_offset == 0
    assert produce(log, [b"c"]).base_offset == 2
    assert read_all(log) == [(0, b"a"), (1, b"b"), (2, b"c")]
    assert read_all(log, 1) == [(1, b"b"), (2, b"c")]
    with pytest.raises(OffsetOutOfRangeError):
        log.read(4, 100)
    assert log.read(3, 100) == b""


def test_segments_roll_by_size_and_are_named_by_base_offset(tmp_path):
    d = tmp_path / "t-0"
    log = open_log(d, LogConfig(segment_bytes=1000, index_interval_bytes=300), 0)
    for i in range(60):
        produce(log, [b"x" * 50])
    names = sorted(p.name for p in d.glob("*.log"))
    assert len(names) > 5 and names[0] == "00000000000000000000.log"
    assert all(len(n) == 24 for n in names)
    bases = [int(n[:20]) for n in names]
    assert bases == sorted(bases)
    assert all((d / n).stat().st_size <= 1000 for n in names)
    assert [o for o, _ in read_all(log)] == list(range(60))
    # the sparse index: an entry every index.interval.bytes, not every batch
    seg = log.segments[0]
    assert 1 <= len(seg.index_offsets) < seg.next_offset - seg.base_offset
    assert (d / "00000000000000000000.index").stat().st_size == 8 * len(seg.index_offsets)


def test_segments_roll_by_age(tmp_path):
    log = open_log(tmp_path / "t-0", LogConfig(segment_ms=1000), 0)
    produce(log, [b"a"], now=1_000, ts=1_000)
    produce(log, [b"b"], now=1_500, ts=1_500)
    assert len(log.segments) == 1
    produce(log, [b"c"], now=2_100, ts=2_100)
    assert len(log.segments) == 2 and log.active_segment.base_offset == 2


def test_retention_by_time_removes_whole_old_segments(tmp_path):
    log = open_log(tmp_path / "t-0", LogConfig(segment_bytes=200, retention_ms=10_000), 0)
    for i in range(10):
        produce(log, [b"x" * 60], now=1_000 + i, ts=1_000 + i)
    for i in range(3):
        produce(log, [b"y" * 60], now=50_000, ts=50_000)
    before = len(log.segments)
    deleted = log.apply_retention(now_ms=55_000)
    assert deleted and len(log.segments) == before - len(deleted)
    assert log.log_start_offset >= 10 - 1
    assert all(v == b"y" * 60 for o, v in read_all(log, log.log_start_offset) if o >= 10)
    with pytest.raises(OffsetOutOfRangeError):
        log.read(0, 100)


def test_retention_by_bytes_keeps_the_newest(tmp_path):
    log = open_log(tmp_path / "t-0", LogConfig(segment_bytes=300, retention_bytes=700), 0)
    for i in range(30):
        produce(log, [b"%03d" % i + b"x" * 60])
    log.apply_retention(now_ms=2_000)
    assert log.size_bytes - log.segments[0].size < 700
    assert read_all(log, log.log_start_offset)[-1][0] == 29


def test_offset_for_timestamp_uses_the_time_index(tmp_path):
    log = open_log(tmp_path / "t-0", LogConfig(index_interval_bytes=100), 0)
    for i in range(50):
        produce(log, [b"v"], ts=10_000 + i * 10)
    assert log.offset_for_timestamp(10_000) == (0, 10_000)
    assert log.offset_for_timestamp(10_105) == (11, 10_110)
    assert log.offset_for_timestamp(99_999) is None
    assert log.max_timestamp() == (10_490, 49)


def test_log_append_time_topics_stamp_the_broker_time(tmp_path):
    log = open_log(tmp_path / "t-0", LogConfig(message_timestamp_type="LogAppendTime"), 0)
    result = produce(log, [b"a"], now=77_000, ts=5)
    assert result.log_append_time == 77_000
    data = log.read(0, 1000)
    header, records = decode_batch(data)  # the CRC was redone after the rewrite
    assert header.timestamp_type == 1 and records[0].timestamp == 77_000


def test_oversized_batch_is_refused(tmp_path):
    log = open_log(tmp_path / "t-0", LogConfig(max_message_bytes=200), 0)
    with pytest.raises(LogAppendError) as e:
        produce(log, [b"x" * 300])
    assert e.value.error_name == ErrorCode.message_too_large
    assert log.log_end_offset == 0


def test_reopen_after_clean_close_continues_offsets_and_dedup(tmp_path):
    d = tmp_path / "t-0"
    log = open_log(d, LogConfig(segment_bytes=400), 0)
    for i in range(10):
        produce(log, [b"v%d" % i * 10], pid=3, epoch=0, seq=i)
    log.close(5_000)
    assert (d / "00000000000000000010.snapshot").exists()
    log = open_log(d, LogConfig(segment_bytes=400), 6_000)
    assert log.log_end_offset == 10
    dup = produce(log, [b"v9" * 10], pid=3, epoch=0, seq=9)
    assert dup.duplicate and dup.base_offset == 9
    assert produce(log, [b"new"], pid=3, epoch=0, seq=10).base_offset == 10


def test_producer_state_is_rebuilt_from_the_log_without_snapshots(tmp_path):
    d = tmp_path / "t-0"
    log = open_log(d, LogConfig(segment_bytes=300), 0)
    for i in range(8):
        produce(log, [b"x" * 40], pid=3, epoch=0, seq=i)
    log.close_unclean()
    for snap in d.glob("*.snapshot"):
        snap.unlink()
    log = open_log(d, LogConfig(segment_bytes=300), 0)
    assert produce(log, [b"x" * 40], pid=3, epoch=0, seq=7).duplicate
    assert produce(log, [b"x" * 40], pid=3, epoch=0, seq=8).base_offset == 8


def test_damaged_snapshot_falls_back_to_the_log(tmp_path):
    d = tmp_path / "t-0"
    log = open_log(d, LogConfig(), 0)
    for i in range(3):
        produce(log, [b"a"], pid=3, epoch=0, seq=i)
    log.close(1_000)
    snap = next(d.glob("*.snapshot"))
    snap.write_bytes(b"\x00\x01garbage")
    log = open_log(d, LogConfig(), 2_000)
    assert produce(log, [b"a"], pid=3, epoch=0, seq=2).duplicate


@pytest.mark.parametrize("damage", ["torn_header", "torn_body", "flipped_bit", "zeros"])
def test_torn_or_corrupt_tail_is_truncated_never_served(tmp_path, damage):
    d = tmp_path / "t-0"
    log = open_log(d, LogConfig(), 0)
    for i in range(5):
        produce(log, [b"record-%d" % i], pid=1, epoch=0, seq=i)
    path = log.active_segment.log_path
    log.close_unclean()
    data = bytearray(path.read_bytes())
    last_batch_len = len(build_batch([(None, b"record-4", [], 1000)], producer_id=1,
                                     producer_epoch=0, base_sequence=4))
    if damage == "torn_header":
        data = data[: len(data) - last_batch_len + 30]
    elif damage == "torn_body":
        data = data[:-5]
    elif damage == "flipped_bit":
        data[-3] ^= 0x40
    else:
        data += b"\x00" * 100
    path.write_bytes(bytes(data))
    log = open_log(d, LogConfig(), 0)
    expected = 5 if damage == "zeros" else 4
    assert log.log_end_offset == expected
    assert log.high_watermark == 0  # none stored before the crash
    advance_high_watermark(log)  # the replica manager, taking the lead again
    assert [v for _, v in read_all(log)] == [b"record-%d" % i for i in range(expected)]
    assert path.stat().st_size == log.active_segment.size
    # the producer continues exactly where the surviving log ends
    assert produce(log, [b"again"], pid=1, epoch=0, seq=expected).base_offset == expected


def test_missing_index_is_rebuilt(tmp_path):
    d = tmp_path / "t-0"
    log = open_log(d, LogConfig(segment_bytes=300, index_interval_bytes=50), 0)
    for i in range(20):
        produce(log, [b"x" * 40])
    log.close(1)
    first = d / "00000000000000000000.index"
    original = first.read_bytes()
    first.unlink()
    (d / "00000000000000000000.timeindex").write_bytes(b"\x01\x02\x03")  # damaged
    log = open_log(d, LogConfig(segment_bytes=300, index_interval_bytes=50), 2)
    assert first.read_bytes() == original
    assert [o for o, _ in read_all(log)] == list(range(20))


def test_fsync_policy_flushes_every_n_messages(tmp_path):
    log = open_log(tmp_path / "t-0", LogConfig(flush_messages=1), 0)
    produce(log, [b"a"])
    assert log.unflushed_messages == 0
    assert int((tmp_path / "t-0" / "recovery-point").read_text()) == 1
    lazy = open_log(tmp_path / "u-0", LogConfig(), 0)
    produce(lazy, [b"a"])
    assert lazy.unflushed_messages == 1


def test_failed_write_leaves_no_partial_batch(tmp_path):
    """A full disk: the write fails part-way; the segment is cut back, nothing is served."""
    import resource
    import signal

    log = open_log(tmp_path / "t-0", LogConfig(), 0)
    produce(log, [b"a" * 100])
    size = log.active_segment.size
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    # Files may not grow past size + 50 bytes: the next 300-byte batch cannot fit.
    resource.setrlimit(resource.RLIMIT_FSIZE, (size + 50, hard))
    try:
        from oncelog.log import LogWriteError

        with pytest.raises(LogWriteError):
            produce(log, [b"b" * 300])
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, old_handler)
    assert log.active_segment.size == size
    assert os.path.getsize(log.active_segment.log_path) == size
    assert produce(log, [b"c"]).base_offset == 1
    assert [v for _, v in read_all(log)] == [b"a" * 100, b"c"]


def test_preallocated_zeros_are_never_part_of_the_log(tmp_path):
    """Busy segments get page cache preallocated ahead (log/preallocator.py): the zeros are
    invisible to readers, cut at roll and clean close, and cut by recovery after a crash."""
    from oncelog.log.preallocator import Preallocator

    pre = Preallocator()
    try:
        d = tmp_path / "t-0"
        cfg = LogConfig(segment_bytes=8 << 20, preallocate_ahead_bytes=64 << 20)
        log = open_log(d, cfg, 0, pre)
        big = [b"x" * 100_000] * 2  # 200 KB appends: 16 of them ahead = 3.2 MB
        produce(log, big)
        seg = log.active_segment
        deadline = time.monotonic() + 10
        while (seg.prealloc_pending or seg.allocated <= seg.size) and \
                time.monotonic() < deadline:
            time.sleep(0.001)  # the preallocator thread works in the background
        assert seg.allocated > seg.size
        assert os.path.getsize(seg.log_path) == seg.allocated
        produce(log, [b"y"])
        assert [v[:1] for _, v in read_all(log)] == [b"x", b"x", b"y"]
        log.close_unclean()  # a crash: the zero tail stays on disk
        assert os.path.getsize(seg.log_path) > seg.size
        log = open_log(d, cfg, 0, pre)
        assert log.log_end_offset == 3 and log.recovered_bytes > 0
        assert os.path.getsize(log.active_segment.log_path) == log.active_segment.size
        produce(log, big)
        log.close(1)
        assert os.path.getsize(log.active_segment.log_path) == log.active_segment.size
    finally:
        pre.stop()


def test_segment_rolls_before_a_relative_offset_overflows_32_bits(tmp_path):
    """Kafka's LogSegment.canConvertToRelativeOffset: a segment whose offsets jump (a gap, as
    compaction leaves) rolls before the next batch's offset minus the segment's base stops
    fitting the index's 32 bits; nothing is written and refused, and the log reopens."""
    d = tmp_path / "t-0"
    d.mkdir()
    high = 2**31 - 3
    segment = build_batch([(None, b"a", [], 1)], base_offset=0) + build_batch(
        [(None, b"b", [], 1)], base_offset=high)
    (d / "00000000000000000000.log").write_bytes(segment)
    log = open_log(d, LogConfig(), 0)
    assert log.log_end_offset == high + 1
    result = produce(log, [b"c%d" % i for i in range(5)], ts=1)
    assert (result.base_offset, result.last_offset) == (high + 1, high + 5)
    assert [s.base_offset for s in log.segments] == [0, high + 1]
    assert [v for _o, v in read_all(log, high)] == [b"b"] + [b"c%d" % i for i in range(5)]
    log.close(1_000)
    log = open_log(d, LogConfig(), 2_000)
    assert log.log_end_offset == high + 6
    assert [v for _o, v in read_all(log, high + 1)] == [b"c%d" % i for i in range(5)]


def test_append_refuses_a_batch_whose_records_disagree_with_its_header(tmp_path):
    """Kafka's LogValidator runs before anything is written: the log end does not move."""
    import struct

    from oncelog.records.batch import CRC_OFFSET, batch_crc

    log = open_log(tmp_path / "t-0", LogConfig(), 0)
    produce(log, [b"x"])
    data = bytearray(build_batch([(None, b"a", [], 1)]))
    struct.pack_into(">i", data, 23, 2**31 - 2)  # lastOffsetDelta
    struct.pack_into(">i", data, 57, 2**31 - 1)  # recordsCount
    struct.pack_into(">I", data, CRC_OFFSET, batch_crc(data, 0, len(data)))
    size = log.size_bytes
    with pytest.raises(LogAppendError) as err:
        log.append(data, split_batches(data), 1_000)
    assert err.value.error_name == ErrorCode.invalid_record
    assert (log.log_end_offset, log.size_bytes) == (1, size)


@pytest.mark.parametrize("timestamp_type", ["CreateTime", "LogAppendTime"])
def test_the_requests_bytes_are_appended_without_being_rewritten(tmp_path, timestamp_type):
    """A record set as a request brings it (immutable bytes): the log writes each batch with
    its header rewritten (base offset, leader epoch; LogAppendTime and its CRC), and the
    caller's bytes stay as they came."""
    log = open_log(tmp_path / "t-0", LogConfig(message_timestamp_type=timestamp_type), 0)
    produce(log, [b"first"])
    data = b"".join(build_batch([(None, v, [], 900)]) for v in (b"a" * 100, b"b", b"c" * 70_000))
    assert len(data) >= COPY_BELOW  # else it is copied and rewritten in place
    before = bytes(data)
    result = log.append(data, split_batches(data), 1_000, leader_epoch=3)
    assert data == before
    assert (result.base_offset, result.last_offset) == (1, 3)
    advance_high_watermark(log)
    assert read_all(log) == [(0, b"first"), (1, b"a" * 100), (2, b"b"), (3, b"c" * 70_000)]
    stored = log.read(1, 1 << 20)
    for expected, (pos, h) in enumerate(split_batches(stored), start=1):  # every CRC checked
        assert h.base_offset == expected and h.partition_leader_epoch == 3
        assert h.max_timestamp == (900 if timestamp_type == "CreateTime" else 1_000)
        decode_batch(stored, pos)


def test_periodic_snapshots_skip_a_partition_with_nothing_new(tmp_path):
    """Each snapshot costs an fsync on the broker's loop: a partition whose log has not moved
    since its last one is not snapshotted again."""
    log = open_log(tmp_path / "t-0", LogConfig(producer_snapshot_interval_ms=1_000), 0)
    produce(log, [b"a"], pid=7, epoch=0, seq=0)
    log.maintain(2_000)
    first = sorted(p.name for p in (tmp_path / "t-0").glob("*.snapshot"))
    assert len(first) == 1
    snapshot = tmp_path / "t-0" / first[0]
    stamp = snapshot.stat().st_mtime_ns
    log.maintain(4_000)
    log.maintain(6_000)
    assert sorted(p.name for p in (tmp_path / "t-0").glob("*.snapshot")) == first
    assert snapshot.stat().st_mtime_ns == stamp  # not rewritten either
    produce(log, [b"b"], pid=7, epoch=0, seq=1)
    log.maintain(8_000)
    assert len(list((tmp_path / "t-0").glob("*.snapshot"))) == 2


def test_a_new_log_writes_its_leader_epoch_checkpoint_at_its_first_epoch(tmp_path):
    """Creating a partition fsyncs no empty checkpoint (a missing file reads as empty, and
    50 of them made the first FindCoordinator's offsets topic slow); the first epoch the
    leader assigns is written, and read back on reopening."""
    from oncelog.log.leader_epoch import CHECKPOINT_FILE

    d = tmp_path / "t-0"
    log = open_log(d, LogConfig(), 0)
    assert not (d / CHECKPOINT_FILE).exists()
    data = bytearray(build_batch([(None, b"v", [], 1_000)]))
    log.append(data, split_batches(data), 1_000, leader_epoch=4)
    assert (d / CHECKPOINT_FILE).exists()
    log.close(2_000)
    again = open_log(d, LogConfig(), 3_000)
    assert again.leader_epoch_cache.latest_epoch == 4
    again.close(4_000)
