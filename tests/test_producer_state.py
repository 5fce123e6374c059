"""The sans-IO producer state: spec 000 "PID-Sequence Management" and the ProduceRequest steps,
and the three failure scenarios of spec 001's idempotent producer, in milliseconds."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from oncelog.log.producer_state import ProducerStateError, ProducerStateManager
from oncelog.records import build_batch, parse_header


def batch(pid=1, epoch=0, seq=0, count=1, offset=0, ts=1000):
    data = build_batch([(None, b"x", [], ts)] * count, base_offset=offset, producer_id=pid,
                       producer_epoch=epoch, base_sequence=seq)
    return parse_header(data)


def append(mgr, h):
    """What the log does: check, then record the batch at its assigned offset."""
    dup = mgr.check_batch(h)
    if dup is None:
        mgr.update(h)
    return dup


def test_an_unknown_producer_may_start_at_any_sequence_as_in_kafka():
    """Kafka since KIP-360: a producer the partition does not know (its state expired, or its
    first batches died with a leader) is accepted at any sequence; only a KIP-890 producer's
    transactional batch must start at 0 (OUT_OF_ORDER_SEQUENCE_NUMBER)."""
    mgr = ProducerStateManager()
    assert mgr.check_batch(batch(seq=5)) is None
    assert mgr.check_batch(batch(seq=5), new_client=True) is None
    assert mgr.check_batch(batch(seq=0)) is None
    transactional = parse_header(build_batch([(None, b"x", [], 1000)], producer_id=1,
                                             producer_epoch=0, base_sequence=5,
                                             is_transactional=True))
    assert mgr.check_batch(transactional) is None
    with pytest.raises(ProducerStateError) as e:
        mgr.check_batch(transactional, new_client=True)
    assert e.value.error_name == ErrorCode.out_of_order_sequence_number
    append(mgr, batch(seq=5))
    with pytest.raises(ProducerStateError) as e:  # known from then on: in sequence
        mgr.check_batch(batch(seq=7, offset=1))
    assert e.value.error_name == ErrorCode.out_of_order_sequence_number


def test_gap_is_out_of_order():
    mgr = ProducerStateManager()
    append(mgr, batch(seq=0, count=3, offset=0))
    with pytest.raises(ProducerStateError) as e:
        mgr.check_batch(batch(seq=4, offset=3))
    assert e.value.error_name == ErrorCode.out_of_order_sequence_number
    assert mgr.check_batch(batch(seq=3, offset=3)) is None


def test_retry_of_any_of_the_last_five_batches_returns_original_offsets():
    mgr = ProducerStateManager()
    for i in range(7):
        append(mgr, batch(seq=i * 2, count=2, offset=100 + i * 2))
    for i in range(2, 7):  # the last five are remembered
        dup = mgr.check_batch(batch(seq=i * 2, count=2, offset=999))
        assert dup is not None and dup.first_offset == 100 + i * 2
        assert dup.last_offset == 101 + i * 2
    with pytest.raises(ProducerStateError):  # older than the last five: not a known duplicate
        mgr.check_batch(batch(seq=0, count=2))


def test_older_epoch_is_fenced_newer_epoch_restarts_at_zero():
    mgr = ProducerStateManager()
    append(mgr, batch(epoch=3, seq=0, offset=0))
    with pytest.raises(ProducerStateError) as e:
        mgr.check_batch(batch(epoch=2, seq=1))
    assert e.value.error_name == ErrorCode.invalid_producer_epoch
    with pytest.raises(ProducerStateError) as e:
        mgr.check_batch(batch(epoch=4, seq=1))
    assert e.value.error_name == ErrorCode.out_of_order_sequence_number
    append(mgr, batch(epoch=4, seq=0, offset=1))
    assert mgr.producers[1].producer_epoch == 4


def test_sequence_wraps_after_int32_max():
    mgr = ProducerStateManager()
    append(mgr, batch(seq=0))
    mgr.producers[1].batches[-1] = mgr.producers[1].batches[-1].__class__(
        2**31 - 3, 2**31 - 1, 0, 0, 1000)
    assert mgr.check_batch(batch(seq=0, offset=1)) is None


def test_request_timeout_retry_is_not_written_twice():
    """Spec 001 scenario 1: the broker wrote the batch, the response was lost, the producer
    retries with the same sequence; the retry is answered, not appended."""
    mgr = ProducerStateManager()
    assert append(mgr, batch(seq=0, count=5, offset=0)) is None
    dup = append(mgr, batch(seq=0, count=5, offset=5))
    assert dup is not None and dup.first_offset == 0
    assert append(mgr, batch(seq=5, count=1, offset=5)) is None


def test_broker_restart_state_survives_snapshot_and_replay():
    """Spec 001 scenario 3: after a restart the state is rebuilt (snapshot + log replay)
    and a retry is still recognised."""
    mgr = ProducerStateManager()
    append(mgr, batch(seq=0, count=2, offset=0))
    snap = mgr.snapshot_bytes()
    restored = ProducerStateManager.from_snapshot(snap)
    restored.replay([batch(seq=2, count=2, offset=2)])
    assert restored.check_batch(batch(seq=0, count=2)).first_offset == 0
    assert restored.check_batch(batch(seq=2, count=2)).first_offset == 2
    assert restored.check_batch(batch(seq=4, offset=4)) is None


def test_producer_restart_gets_a_fresh_state():
    """Spec 001 scenario 2: a restarted producer has a new producer id; the broker treats it
    as new (the duplicate that follows is what transactions fix, not idempotence)."""
    mgr = ProducerStateManager()
    append(mgr, batch(pid=1, seq=0))
    assert append(mgr, batch(pid=2, seq=0, offset=1)) is None
    assert set(mgr.producers) == {1, 2}


def test_damaged_snapshot_is_refused():
    mgr = ProducerStateManager()
    append(mgr, batch(seq=0))
    snap = bytearray(mgr.snapshot_bytes())
    snap[-1] ^= 0xFF
    with pytest.raises(ValueError, match="CRC"):
        ProducerStateManager.from_snapshot(bytes(snap))
    with pytest.raises(ValueError):
        ProducerStateManager.from_snapshot(bytes(snap[:5]))


def test_expiration_forgets_idle_producers():
    mgr = ProducerStateManager()
    append(mgr, batch(pid=1, ts=1000))
    append(mgr, batch(pid=2, ts=5000, offset=1))
    assert mgr.expire(now_ms=7000, expiration_ms=3000) == [1]
    assert set(mgr.producers) == {2}
    # expired: unknown again, its next batch is taken at any sequence (as Kafka's)
    assert mgr.check_batch(batch(pid=1, seq=1)) is None


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 4), min_size=1, max_size=30), st.data())
def test_any_retry_pattern_appends_each_batch_once(sizes, data):
    """A producer sends batches in order; any batch may be retried right away (lost response).
    Whatever the pattern, the log gets every batch exactly once, in order."""
    mgr = ProducerStateManager()
    log: list[int] = []
    seq = offset = 0
    for size in sizes:
        h = batch(seq=seq, count=size, offset=offset)
        assert append(mgr, h) is None
        log.append(seq)
        offset += size
        for _ in range(data.draw(st.integers(0, 2))):
            retry = batch(seq=seq, count=size, offset=offset)
            assert append(mgr, retry) is not None
        seq += size
    assert log == sorted(set(log))
