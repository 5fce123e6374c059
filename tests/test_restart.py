"""Restarting a real broker process on the same data directory: what was written is still
there, offsets continue, and the idempotent producer's state survives (spec 000, "PID
Snapshots"), whether the broker stopped cleanly (SIGTERM), was killed (SIGKILL), or left a torn
tail in its active segment."""

from __future__ import annotations

import time

import pytest
from support.raw_wire import (
    BASE_TIMESTAMP,
    RawConnection,
    create_topics_request,
    fetch_all,
    idempotent_batch,
    init_producer_id_request,
    latest_offset,
    list_offsets_request,
    produce,
)

from oncelog.harness.broker_process import BrokerProcess
from oncelog.records import build_batch, iter_batches

pytestmark = pytest.mark.slow

OUT_OF_ORDER_SEQUENCE_NUMBER = 45
TOPIC = "restart"
BATCH = 5  # records per batch


def _setup(conn: RawConnection, configs: dict[str, str] | None = None) -> int:
    created = conn.request(create_topics_request(TOPIC, 1, configs))
    assert created.topics[0].error_code == 0, created
    init = conn.request(init_producer_id_request())
    assert init.error_code == 0
    return init.producer_id


def _values(seq: int) -> list[bytes]:
    return [b"value-%06d" % (seq + i) for i in range(BATCH)]


def _produce_batches(conn, pid, count, first_seq=0):
    offsets = []
    for n in range(count):
        seq = first_seq + n * BATCH
        r = produce(conn, TOPIC, 0, idempotent_batch(pid, 0, seq, _values(seq),
                                                     timestamp=BASE_TIMESTAMP + seq))
        assert r.error_code == 0, r
        offsets.append(r.base_offset)
    return offsets


def _expected(n_records):
    return [(o, b"k-value-%06d" % o, b"value-%06d" % o, [("h", b"1")]) for o in range(n_records)]


def _partition_dir(broker: BrokerProcess):
    return broker.data_dir / f"{TOPIC}-0"


def test_clean_restart_reloads_segments_indexes_and_producer_state(tmp_path):
    settings = {"log.segment.bytes": "2048", "log.index.interval.bytes": "300"}
    with BrokerProcess(tmp_path / "data", settings=settings) as broker:
        with RawConnection(broker.bootstrap_servers) as conn:
            pid = _setup(conn)
            offsets = _produce_batches(conn, pid, 40)
            assert offsets == [n * BATCH for n in range(40)]
        assert broker.stop() == 0

        pdir = _partition_dir(broker)
        logs = sorted(pdir.glob("*.log"))
        assert len(logs) >= 4, "expected several segments with log.segment.bytes=2048"
        for log in logs:
            assert log.with_suffix(".index").exists() and log.with_suffix(".timeindex").exists()
        assert (pdir / ".clean-shutdown").exists()
        assert (pdir / "00000000000000000200.snapshot").exists()
        # The sealed segments' indexes are loaded as they are, not rebuilt.
        sealed = {p.name: p.read_bytes() for log in logs[:-1]
                  for p in (log.with_suffix(".index"), log.with_suffix(".timeindex"))}
        assert any(sealed.values())

        broker.start()
        assert not (pdir / ".clean-shutdown").exists()
        assert {name: (pdir / name).read_bytes() for name in sealed} == sealed
        with RawConnection(broker.bootstrap_servers) as conn:
            assert latest_offset(conn, TOPIC) == 200
            assert fetch_all(conn, TOPIC) == _expected(200)
            # Reads from the middle of a batch in the middle of a sealed segment.
            assert fetch_all(conn, TOPIC, start=123) == _expected(200)[123:]
            # The time index answers too: timestamps are BASE_TIMESTAMP + offset.
            lo = conn.request(list_offsets_request(TOPIC, 0, BASE_TIMESTAMP + 77))
            assert lo.topics[0].partitions[0].offset == 77

            # A retry of the last batch, and of one three batches back, are duplicates:
            # answered with their original offsets, nothing appended.
            for seq in (195, 180):
                r = produce(conn, TOPIC, 0, idempotent_batch(pid, 0, seq, _values(seq),
                                                             timestamp=BASE_TIMESTAMP + seq))
                assert (r.error_code, r.base_offset) == (0, seq)
            assert latest_offset(conn, TOPIC) == 200
            # A gap is refused; the next batch in sequence goes on at offset 200.
            r = produce(conn, TOPIC, 0, idempotent_batch(pid, 0, 210, _values(210)))
            assert r.error_code == OUT_OF_ORDER_SEQUENCE_NUMBER
            assert _produce_batches(conn, pid, 1, first_seq=200) == [200]
            assert fetch_all(conn, TOPIC) == _expected(205)


@pytest.mark.parametrize("snapshot", ["kept", "damaged", "deleted"])
def test_producer_state_survives_kill_and_is_rebuilt_without_a_good_snapshot(tmp_path,
                                                                              snapshot):
    with BrokerProcess(tmp_path / "data") as broker:
        with RawConnection(broker.bootstrap_servers) as conn:
            pid = _setup(conn)
            _produce_batches(conn, pid, 4)
        assert broker.stop() == 0  # leaves a snapshot at offset 20
        broker.start()
        with RawConnection(broker.bootstrap_servers) as conn:
            _produce_batches(conn, pid, 4, first_seq=20)  # only in the log, not in a snapshot
        broker.kill()

        snap = _partition_dir(broker) / "00000000000000000020.snapshot"
        assert snap.exists()
        if snapshot == "damaged":
            data = bytearray(snap.read_bytes())
            data[-1] ^= 0xFF
            snap.write_bytes(bytes(data))
        elif snapshot == "deleted":
            snap.unlink()

        broker.start()
        with RawConnection(broker.bootstrap_servers) as conn:
            assert latest_offset(conn, TOPIC) == 40
            for seq in (35, 30, 20, 15):  # 20 and 15: the last five batches span both runs
                r = produce(conn, TOPIC, 0, idempotent_batch(pid, 0, seq, _values(seq),
                                                             timestamp=BASE_TIMESTAMP + seq))
                assert (r.error_code, r.base_offset) == (0, seq), seq
            assert latest_offset(conn, TOPIC) == 40
            assert _produce_batches(conn, pid, 1, first_seq=40) == [40]
            assert fetch_all(conn, TOPIC) == _expected(45)


def _damage_garbage(path, batches):
    with open(path, "ab") as f:
        f.write(b"\xde\xad\xbe\xef" * 40)
    return batches[-1][1].next_offset


def _damage_truncate_mid_batch(path, batches):
    pos, h = batches[-1]
    with open(path, "r+b") as f:
        f.truncate(pos + h.size // 2)
    return h.base_offset


def _damage_flip_crc_covered_byte(path, batches):
    pos, h = batches[-1]
    with open(path, "r+b") as f:
        f.seek(pos + h.size - 3)
        b = f.read(1)
        f.seek(pos + h.size - 3)
        f.write(bytes([b[0] ^ 0x55]))
    return h.base_offset


def _damage_half_a_header(path, batches):
    """A batch whose write stopped inside its 61-byte header."""
    pos, h = batches[-1]
    with open(path, "r+b") as f:
        f.truncate(pos + 30)
    return h.base_offset


@pytest.mark.parametrize("stop", ["sigterm", "sigkill"])
@pytest.mark.parametrize("damage", [_damage_garbage, _damage_truncate_mid_batch,
                                    _damage_flip_crc_covered_byte, _damage_half_a_header],
                         ids=["garbage", "truncated", "crc", "half-header"])
def test_torn_tail_is_cut_and_produce_continues_at_the_right_offset(tmp_path, stop, damage):
    with BrokerProcess(tmp_path / "data") as broker:
        with RawConnection(broker.bootstrap_servers) as conn:
            pid = _setup(conn)
            _produce_batches(conn, pid, 6)
            plain = produce(conn, TOPIC, 0, build_batch([(None, b"plain", [], 1)]))
            assert plain.base_offset == 30
            _produce_batches(conn, pid, 2, first_seq=30)  # offsets 31..40
        getattr(broker, "stop" if stop == "sigterm" else "kill")()

        log_path = _partition_dir(broker) / "00000000000000000000.log"
        data = log_path.read_bytes()
        batches = list(iter_batches(data))
        assert len(batches) == 9 and batches[-1][1].next_offset == 41
        end = damage(log_path, batches)
        good_bytes = batches[-1][0] if end < 41 else len(data)

        broker.start()
        assert log_path.stat().st_size == good_bytes
        with RawConnection(broker.bootstrap_servers) as conn:
            assert latest_offset(conn, TOPIC) == end
            records = fetch_all(conn, TOPIC)
            assert [r[0] for r in records] == list(range(end))
            assert records[30][2] == b"plain"
            assert records[:30] == _expected(30)
            # The idempotent producer goes on from what survived: the lost batch (seq 35)
            # is new data again, not a duplicate and not out of order.
            next_seq = 35 if end < 41 else 40
            r = produce(conn, TOPIC, 0, idempotent_batch(pid, 0, next_seq, _values(next_seq)))
            assert (r.error_code, r.base_offset) == (0, end)
            r = produce(conn, TOPIC, 0, build_batch([(None, b"after", [], 1)]))
            assert r.base_offset == end + BATCH
            assert fetch_all(conn, TOPIC, start=end + BATCH)[0][2] == b"after"


def test_kill_with_preallocated_zeros_past_the_log_end(tmp_path):
    """A busy segment's file runs ahead of the log with zeros (log/preallocator.py); after a
    SIGKILL recovery cuts them like a torn tail, and the offsets and the producer go on."""
    settings = {"log.preallocate.ahead.bytes": str(4 << 20)}
    with BrokerProcess(tmp_path / "data", settings=settings) as broker:
        big = 200  # records of ~1 KB: each batch is ~200 KB, enough to preallocate
        with RawConnection(broker.bootstrap_servers) as conn:
            pid = _setup(conn)
            for n in range(3):
                values = [b"%06d-" % (n * big + i) + b"x" * 1000 for i in range(big)]
                r = produce(conn, TOPIC, 0, idempotent_batch(pid, 0, n * big, values))
                assert (r.error_code, r.base_offset) == (0, n * big)
        log_path = _partition_dir(broker) / "00000000000000000000.log"
        batches = list(iter_batches(log_path.read_bytes()))  # stops at the zeros, if any
        assert len(batches) == 3
        logical = sum(h.size for _, h in batches)
        deadline = time.monotonic() + 30
        while log_path.stat().st_size <= logical:  # the zeros come from another thread
            assert time.monotonic() < deadline, "the segment was never preallocated"
            time.sleep(0.01)
        broker.kill()

        broker.start()
        assert log_path.stat().st_size == logical
        with RawConnection(broker.bootstrap_servers) as conn:
            assert latest_offset(conn, TOPIC) == 3 * big
            r = produce(conn, TOPIC, 0, idempotent_batch(
                pid, 0, 2 * big, [b"%06d-" % (2 * big + i) + b"x" * 1000 for i in range(big)]))
            assert (r.error_code, r.base_offset) == (0, 2 * big)  # the retry is a duplicate
            r = produce(conn, TOPIC, 0, idempotent_batch(pid, 0, 3 * big, [b"next"]))
            assert (r.error_code, r.base_offset) == (0, 3 * big)
            records = fetch_all(conn, TOPIC)
            assert [o for o, *_ in records] == list(range(3 * big + 1))
            assert records[-2][2].startswith(b"000599-") and records[-1][2] == b"next"
