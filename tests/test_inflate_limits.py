"""Decompression on the produce path, from the attacker's side (issue 29): a compressed batch is
read as Kafka's streaming iterator reads it, stopping at the first bad record (it costs a window
of inflation, not the whole bound); the bound does not grow with the batch (a 2 MiB batch of good
records inflating to 80 MiB is refused, where 64 x its size allowed 128 MiB); large payloads are
inflated off the event loop, so bombs on several connections do not keep a legitimate producer
from being answered; and ``queued.max.request.bytes`` bounds the bytes of requests read and not
yet answered (Kafka's memory pool): many connections sending large requests wait for room,
every request is answered, and the broker's queued-bytes peak stays near the budget."""

from __future__ import annotations

import os
import struct
import threading
import uuid

import cramjam
import pytest
from support.metrics import families, metrics_url, value
from support.raw_wire import RawConnection, create_topics_request, produce

from oncelog import Producer
from oncelog.harness.broker_process import BrokerProcess
from oncelog.records import batch as batch_module
from oncelog.records.batch import (
    ATTRIBUTES_OFFSET,
    CRC_OFFSET,
    HEADER_SIZE,
    PROBE_BYTES,
    RECORDS_COUNT_OFFSET,
    CorruptRecordError,
    InvalidRecordError,
    batch_crc,
    build_batch,
    check_records,
    encode_record,
    encode_varint,
    parse_header,
)
from oncelog.records.compression import Compression

CORRUPT_MESSAGE = 2
INVALID_RECORD = 87


def _compress(codec: Compression, chunks) -> bytes:
    module = {Compression.GZIP: cramjam.gzip, Compression.ZSTD: cramjam.zstd}[codec]
    c = module.Compressor()
    for chunk in chunks:
        c.compress(chunk)
    return bytes(c.finish())


def _batch(codec: Compression, count: int, chunks) -> bytes:
    """A batch of ``count`` records whose payload is ``chunks`` compressed by streaming (the
    test never holds the inflated bytes)."""
    header = build_batch([(b"k", b"v", [], 0)], compression=codec)
    out = bytearray(header[:HEADER_SIZE]) + _compress(codec, chunks)
    struct.pack_into(">i", out, 8, len(out) - 12)
    struct.pack_into(">h", out, ATTRIBUTES_OFFSET, int(codec))
    struct.pack_into(">i", out, RECORDS_COUNT_OFFSET, count)
    struct.pack_into(">i", out, 23, count - 1)  # last offset delta
    struct.pack_into(">I", out, CRC_OFFSET, batch_crc(out, 0, len(out)))
    return bytes(out)


def _zeros(n: int):
    chunk = bytes(1 << 20)
    for _ in range(n >> 20):
        yield chunk


def _record(i: int, value: bytes) -> bytes:
    return encode_record(i, 0, b"k", value, [])


def _good_then_zeros(good: int, zeros: int):
    yield b"".join(_record(i, b"x" * 100) for i in range(good))
    yield from _zeros(zeros)


@pytest.fixture
def windows(monkeypatch):
    """The windows ``check_records`` inflated, in bytes."""
    asked: list[int] = []
    real = batch_module.inflate_prefix

    def counting(codec, data, window):
        asked.append(window)
        return real(codec, data, window)

    monkeypatch.setattr(batch_module, "inflate_prefix", counting)
    return asked


@pytest.mark.parametrize("codec", [Compression.GZIP, Compression.ZSTD])
def test_a_bomb_whose_first_record_is_bad_is_refused_after_one_window(windows, codec):
    data = _batch(codec, 1000, _zeros(60 << 20))  # 60 MiB of zeros: record 0 has length 0
    with pytest.raises(InvalidRecordError, match="record 0"):
        check_records(data, 0, parse_header(data))
    assert windows == [PROBE_BYTES]  # the first window only, not the 60 MiB


def test_good_records_then_garbage_are_refused_at_the_first_bad_record(windows):
    # 5,000 good records (about 600 KB: within the first window), then 60 MiB of zeros
    data = _batch(Compression.ZSTD, 10_000, _good_then_zeros(5000, 60 << 20))
    with pytest.raises(InvalidRecordError, match="record 5000"):
        check_records(data, 0, parse_header(data))
    assert max(windows) <= PROBE_BYTES * 8, windows
    assert sum(windows) < 3 << 20


def test_a_record_claiming_more_than_the_bound_is_refused_at_once(windows):
    claim = b"\x00" + encode_varint(0) + encode_varint(0) + encode_varint(-1) + \
        encode_varint(1 << 30)
    data = _batch(Compression.ZSTD, 1,
                  [encode_varint(len(claim) + (1 << 30) + 1) + claim, *_zeros(8 << 20)])
    with pytest.raises(CorruptRecordError, match="past the limit"):
        check_records(data, 0, parse_header(data))
    assert windows == [PROBE_BYTES]


def test_good_compressed_batches_are_read_whole(windows):
    small = build_batch([(b"k", b"v" * 100, [], 0) for _ in range(100)],
                        compression=Compression.ZSTD)
    assert check_records(small, 0, parse_header(small)) is not None
    assert windows == [PROBE_BYTES]
    windows.clear()
    big = _batch(Compression.ZSTD, 90_000,
                 [b"".join(_record(i, b"y" * 100) for i in range(90_000))])  # ~9.7 MB
    assert check_records(big, 0, parse_header(big)) is not None
    assert windows == [PROBE_BYTES, PROBE_BYTES * 8, PROBE_BYTES * 64]


# -- against a broker process -------------------------------------------------------------------


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    settings = {"message.max.bytes": str(16 << 20), "queued.max.request.bytes": str(16 << 20),
                "metrics.port": "0"}
    with BrokerProcess(tmp_path_factory.mktemp("inflate") / "data", settings=settings) as b:
        yield b
        assert b.running, "the broker died\n" + b.log_tail()


def _topic(broker) -> str:
    name = f"inflate-{uuid.uuid4().hex[:8]}"
    with RawConnection(broker.bootstrap_servers) as conn:
        assert conn.request(create_topics_request(name)).topics[0].error_code == 0
    return name


def test_the_bound_does_not_grow_with_the_batch(broker):
    """2 MiB of random bytes and 78 MiB of zeros, all good records: 64 x 2 MiB allowed it."""
    topic = _topic(broker)
    chunks = [_record(0, os.urandom(2 << 20))]
    chunks += [_record(i, bytes(1 << 20)) for i in range(1, 79)]
    data = _batch(Compression.ZSTD, 79, chunks)
    assert 2 << 20 < len(data) < 3 << 20
    with RawConnection(broker.bootstrap_servers) as conn:
        r = produce(conn, topic, 0, data)
        assert r.error_code == CORRUPT_MESSAGE, r
        assert "past the limit" in r.error_message
        # a good batch of the same size that inflates within the bound is stored
        ok = _batch(Compression.ZSTD, 20, [_record(0, os.urandom(2 << 20))] +
                    [_record(i, bytes(1 << 20)) for i in range(1, 20)])
        assert produce(conn, topic, 0, ok).error_code == 0


def _valid_bomb() -> bytes:
    """Good records of 64 KiB of zeros, 70 MiB of them: every window checks out, and the
    payload is refused only once it passes the bound, inflated off the event loop."""
    return _batch(Compression.ZSTD, 1120, (_record(i, bytes(64 << 10)) for i in range(1120)))


def test_bombs_on_several_connections_do_not_starve_a_producer(broker):
    topic = _topic(broker)
    bombs = [_valid_bomb(), _batch(Compression.GZIP, 1000, _zeros(60 << 20))]
    stop = threading.Event()
    answers: list[int] = []
    in_flight_during_legit: list[int] = []

    def attacker(bomb: bytes) -> None:
        with RawConnection(broker.bootstrap_servers, timeout=120) as conn:
            while not stop.is_set():
                answers.append(produce(conn, topic, 0, bomb).error_code)

    threads = [threading.Thread(target=attacker, args=(bombs[i % 2],)) for i in range(6)]
    for t in threads:
        t.start()
    try:
        while len(answers) < 6:  # the bombs are in flight
            threading.Event().wait(0.05)
        before = len(answers)
        with Producer(bootstrap_servers=broker.bootstrap_servers, acks="all",
                      compression_type="zstd", linger_ms=0) as producer:
            for i in range(30):
                producer.send(topic, f"legit-{i}".encode(), partition=0).result(60)
        in_flight_during_legit.append(len(answers) - before)
    finally:
        stop.set()
        for t in threads:
            t.join(120)
    assert set(answers) <= {CORRUPT_MESSAGE, INVALID_RECORD}, set(answers)
    assert CORRUPT_MESSAGE in answers and INVALID_RECORD in answers
    assert in_flight_during_legit[0] > 0  # bombs kept being answered while it produced


def test_queued_max_request_bytes_pauses_reading(broker):
    """10 connections each sending 6 MiB produce requests at once, against a 16 MiB budget:
    every request is answered, and the most ever queued stays within the budget plus one
    request (Kafka's pool lends to a reader while any memory is left)."""
    topic = _topic(broker)
    payload = build_batch([(b"k", os.urandom(6 << 20), [], 0)])
    results: list[int] = []

    def sender() -> None:
        # a connection may wait its turn for long on a busy machine: not a failure
        with RawConnection(broker.bootstrap_servers, timeout=240) as conn:
            for _ in range(2):
                results.append(produce(conn, topic, 0, payload).error_code)

    threads = [threading.Thread(target=sender) for _ in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert results == [0] * 20
    fams = families(metrics_url(broker))
    peak = value(fams, "oncelog_queued_request_bytes_max")
    assert 6 << 20 < peak <= (16 << 20) + len(payload) + 1024, peak
    assert value(fams, "oncelog_queued_request_bytes") == 0
