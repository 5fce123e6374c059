"""The log start offset of one partition's log (KIP-107, log/log_start.py): moved by
DeleteRecords, honoured by reads, retention and the producer state, kept across a reopen, and
what a follower's truncation does to it."""

from __future__ import annotations

import pytest
from support.logs import advance_high_watermark, open_log

from oncelog.log import OffsetOutOfRangeError
from oncelog.records import build_batch, split_batches


def produce(log, values, pid=-1, seq=-1, now=1_000):
    data = bytearray(build_batch([(None, v, [], now) for v in values], producer_id=pid,
                                 producer_epoch=0 if pid >= 0 else -1, base_sequence=seq))
    result = log.append(data, split_batches(data), now)
    advance_high_watermark(log)  # a lone replica: all of it is committed
    return result


def segment_bases(path) -> list[int]:
    return sorted(int(p.name[:-4]) for p in path.glob("*.log"))


def test_reads_below_the_log_start_are_out_of_range_and_it_survives_a_reopen(tmp_path):
    d = tmp_path / "t-0"
    log = open_log(d)
    for i in range(10):
        produce(log, [b"v%d" % i])
    assert log.increment_log_start_offset(4, 2_000)
    assert not log.increment_log_start_offset(3, 2_000)  # never backwards
    assert log.log_start_offset == 4
    with pytest.raises(OffsetOutOfRangeError):
        log.read(3, 1 << 20)
    assert log.read(4, 1 << 20)
    log.close(3_000)
    again = open_log(d)
    assert again.log_start_offset == 4
    with pytest.raises(OffsetOutOfRangeError):
        again.read(3, 1 << 20)
    # Also after a crash (no clean close).
    again.close_unclean()
    assert open_log(d).log_start_offset == 4


def test_retention_deletes_the_segments_wholly_below_it(tmp_path):
    d = tmp_path / "t-0"
    log = open_log(d, segment_bytes=300, retention_ms=-1)
    for i in range(30):
        produce(log, [b"x" * 40])
    bases = segment_bases(d)
    assert len(bases) > 4
    start = bases[2] + 1
    log.increment_log_start_offset(start, 2_000)
    assert log.apply_retention(2_000) == bases[:2]
    assert segment_bases(d) == bases[2:]
    assert log.log_start_offset == start  # inside the first segment left
    # Nothing more to delete: the segment it starts in stays.
    assert log.apply_retention(3_000) == []
    log.close(4_000)
    assert open_log(d, segment_bytes=300, retention_ms=-1).log_start_offset == start


def test_retention_past_the_stored_start_moves_it_up(tmp_path):
    d = tmp_path / "t-0"
    log = open_log(d, segment_bytes=300, retention_bytes=600)
    for i in range(30):
        produce(log, [b"x" * 40])
    log.increment_log_start_offset(1, 2_000)
    deleted = log.apply_retention(2_000)
    assert deleted and log.log_start_offset == log.segments[0].base_offset > 1
    log.close(3_000)
    assert open_log(d, segment_bytes=300).log_start_offset == segment_bases(d)[0]


def test_producers_are_kept_when_the_log_start_passes_their_batches(tmp_path):
    # Kafka >= 2.5 (KIP-360): DeleteRecords does not make a producer unknown; it carries on
    # with its next sequence number (librdkafka's 0103 deletes a transactional producer's
    # records, then sends its next transaction).
    d = tmp_path / "t-0"
    log = open_log(d)
    produce(log, [b"a", b"b"], pid=7, seq=0)  # 0-1
    produce(log, [b"c"], pid=8, seq=0)  # 2
    log.update_high_watermark(log.log_end_offset)
    log.increment_log_start_offset(3, 2_000)
    assert set(log.producer_state.producers) == {7, 8}
    log.close(3_000)
    log = open_log(d)
    assert set(log.producer_state.producers) == {7, 8}
    produce(log, [b"d"], pid=7, seq=2)  # accepted: no OutOfOrderSequence, no UnknownProducerId
    assert log.log_end_offset == 4
    log.close(4_000)


def test_a_producer_with_an_open_transaction_is_kept(tmp_path):
    log = open_log(tmp_path / "t-0")
    data = bytearray(build_batch([(None, b"t", [], 1_000)], producer_id=9, producer_epoch=0,
                                 base_sequence=0, is_transactional=True))
    log.append(data, split_batches(data), 1_000)
    produce(log, [b"x"])
    produce(log, [b"y"])
    log.update_high_watermark(log.log_end_offset)
    log.increment_log_start_offset(2, 2_000)
    assert set(log.producer_state.producers) == {9}
    # The open transaction still holds the LSO back (below the high watermark, 3), at the log
    # start: never below it, as Kafka's UnifiedLog (issue 29).
    assert (log.last_stable_offset, log.high_watermark) == (2, 3)


def test_a_follower_truncated_below_it_lowers_it_and_can_start_over(tmp_path):
    d = tmp_path / "t-0"
    log = open_log(d)
    for i in range(10):
        produce(log, [b"v%d" % i])
    log.increment_log_start_offset(6, 2_000)
    assert log.truncate_to(4) <= 6
    assert log.log_start_offset == log.log_end_offset  # Kafka's truncateTo lowers it there
    # A follower whose log ends below its leader's start starts again, empty, there.
    log.truncate_fully_and_start_at(20, 3_000)
    assert (log.log_start_offset, log.log_end_offset, log.high_watermark) == (20, 20, 20)
    assert segment_bases(d) == [20]
    data = bytearray(build_batch([(None, b"next", [], 4_000)]))
    assert log.append(data, split_batches(data), 4_000).base_offset == 20
    log.close(5_000)
    reopened = open_log(d)
    assert (reopened.log_start_offset, reopened.log_end_offset) == (20, 21)
