"""Issue 16, sections 2 and 3: a broker process refuses batches whose insides are not what their
header says (Kafka's LogValidator), records whose timestamps lie outside
message.timestamp.before/after.max.ms, and compressed payloads that inflate past their limit;
a refused batch leaves the log untouched, and the broker keeps serving and restarts cleanly."""

from __future__ import annotations

import os
import struct
import time
from pathlib import Path

import cramjam
import pytest
from support.raw_wire import (
    RawConnection,
    create_topics_request,
    fetch_all,
    latest_offset,
    list_offsets_request,
    produce,
)

from oncelog.harness.broker_process import BrokerProcess
from oncelog.records import build_batch
from oncelog.records.batch import (
    ATTRIBUTES_OFFSET,
    CRC_OFFSET,
    HEADER_SIZE,
    LOG_OVERHEAD,
    RECORDS_COUNT_OFFSET,
    batch_crc,
    encode_record,
    encode_varint,
)
from oncelog.records.compression import DEFAULT_INFLATE_LIMIT, Compression

CORRUPT_MESSAGE = 2
INVALID_TIMESTAMP = 32
INVALID_RECORD = 87
TOPIC = "validation"
LAST_OFFSET_DELTA_OFFSET = 23


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    with BrokerProcess(tmp_path_factory.mktemp("validation") / "data") as b:
        with RawConnection(b.bootstrap_servers) as conn:
            assert conn.request(create_topics_request(TOPIC)).topics[0].error_code == 0
        yield b
        assert b.running, "the broker died\n" + b.log_tail()


def now_ms() -> int:
    return int(time.time() * 1000)


def good_batch(n: int = 1, value: bytes = b"v") -> bytes:
    ts = now_ms()
    return build_batch([(b"k", value, [], ts) for _ in range(n)])


def patched(batch: bytes, **fields: int) -> bytes:
    """``batch`` with header fields rewritten and its CRC made right again."""
    out = bytearray(batch)
    if "count" in fields:
        struct.pack_into(">i", out, RECORDS_COUNT_OFFSET, fields["count"])
    if "last_offset_delta" in fields:
        struct.pack_into(">i", out, LAST_OFFSET_DELTA_OFFSET, fields["last_offset_delta"])
    if "attributes" in fields:
        struct.pack_into(">h", out, ATTRIBUTES_OFFSET, fields["attributes"])
    struct.pack_into(">I", out, CRC_OFFSET, batch_crc(out, 0, len(out)))
    return bytes(out)


def with_payload(batch: bytes, payload: bytes, attributes: int) -> bytes:
    """``batch``'s header over another payload (length, attributes and CRC fixed)."""
    out = bytearray(batch[:HEADER_SIZE] + payload)
    struct.pack_into(">i", out, 8, len(out) - LOG_OVERHEAD)
    struct.pack_into(">h", out, ATTRIBUTES_OFFSET, attributes)
    struct.pack_into(">I", out, CRC_OFFSET, batch_crc(out, 0, len(out)))
    return bytes(out)


def assert_refused(broker, batch: bytes, error: int, topic: str = TOPIC) -> None:
    """The batch gets ``error``, the log end does not move, the next good batch lands there."""
    with RawConnection(broker.bootstrap_servers) as conn:
        end = latest_offset(conn, topic)
        r = produce(conn, topic, 0, batch)
        assert r.error_code == error, r
        assert latest_offset(conn, topic) == end
        ok = produce(conn, topic, 0, good_batch(value=b"after"))
        assert ok.error_code == 0 and ok.base_offset == end
        assert fetch_all(conn, topic, start=end)[-1][2] == b"after"


# -- section 2: the records inside --------------------------------------------------------------


def test_batch_claiming_int32_max_records_is_refused_and_the_broker_restarts(broker):
    one = good_batch()
    bad = patched(one, count=2**31 - 1, last_offset_delta=2**31 - 2)
    assert len(bad) < 100  # the was 71 bytes
    assert_refused(broker, bad, INVALID_RECORD)
    with RawConnection(broker.bootstrap_servers) as conn:
        end = latest_offset(conn, TOPIC)
    broker.restart()
    with RawConnection(broker.bootstrap_servers) as conn:
        assert latest_offset(conn, TOPIC) == end
        assert produce(conn, TOPIC, 0, good_batch()).base_offset == end


def test_short_record_count_is_refused(broker):
    assert_refused(broker, patched(good_batch(3), count=2, last_offset_delta=1), INVALID_RECORD)


def test_record_count_beyond_the_records_is_refused(broker):
    assert_refused(broker, patched(good_batch(2), count=3, last_offset_delta=2), INVALID_RECORD)


def test_offset_deltas_not_running_from_zero_are_refused(broker):
    body = encode_record(0, 0, b"k", b"a") + encode_record(5, 0, b"k", b"b")
    bad = with_payload(good_batch(2), body, 0)
    assert_refused(broker, bad, INVALID_RECORD)


def test_record_whose_length_disagrees_with_its_fields_is_refused(broker):
    record = bytearray(encode_record(0, 0, b"k", b"value"))
    record[0] = encode_varint(len(record) - 2)[0]  # one byte shorter than its fields
    bad = with_payload(good_batch(), bytes(record) + b"\x00", 0)
    assert_refused(broker, bad, INVALID_RECORD)


def test_null_header_key_is_refused(broker):
    body = bytearray(b"\x00" + encode_varint(0) + encode_varint(0) + encode_varint(-1)
                     + encode_varint(-1) + encode_varint(1) + encode_varint(-1)
                     + encode_varint(-1))
    bad = with_payload(good_batch(), encode_varint(len(body)) + bytes(body), 0)
    assert_refused(broker, bad, INVALID_RECORD)


def test_max_timestamp_above_the_records_is_rewritten_not_refused(broker):
    """Kafka's LogValidator sets a CreateTime batch's maxTimestamp from its records
    (tests/test_produce_leader_validation.py reads the stored one back)."""
    out = bytearray(good_batch())
    struct.pack_into(">q", out, 35, now_ms() + 10)  # maxTimestamp
    struct.pack_into(">I", out, CRC_OFFSET, batch_crc(out, 0, len(out)))
    with RawConnection(broker.bootstrap_servers) as conn:
        assert produce(conn, TOPIC, 0, bytes(out)).error_code == 0


@pytest.mark.parametrize("codec", [5, 6, 7])
def test_nonexistent_codec_is_refused(broker, codec):
    assert_refused(broker, patched(good_batch(), attributes=codec), CORRUPT_MESSAGE)


@pytest.mark.parametrize("codec", [Compression.GZIP, Compression.SNAPPY, Compression.LZ4,
                                   Compression.ZSTD])
def test_garbage_compressed_payload_is_refused(broker, codec):
    bad = with_payload(good_batch(), b"\x82SNAPPY\x00 garbage, not compressed at all" * 3,
                       int(codec))
    assert_refused(broker, bad, CORRUPT_MESSAGE)


@pytest.mark.parametrize("codec", list(Compression))
def test_compressed_payload_with_trailing_records_is_refused(broker, codec):
    """The payload decompresses but holds one record more than the header counts."""
    real = build_batch([(b"k", b"v", [], now_ms())] * 2, compression=codec)
    assert_refused(broker, patched(real, count=1, last_offset_delta=0), INVALID_RECORD)


def test_timestamp_after_message_timestamp_after_max_ms_is_refused(broker):
    future = now_ms() + 2 * 3600 * 1000  # Kafka's default message.timestamp.after.max.ms: 1 h
    assert_refused(broker, build_batch([(b"k", b"v", [], future)]), INVALID_TIMESTAMP)


def test_timestamp_before_message_timestamp_before_max_ms_is_refused(broker):
    with RawConnection(broker.bootstrap_servers) as conn:
        created = conn.request(create_topics_request(
            "validation-old", configs={"message.timestamp.before.max.ms": "60000"}))
        assert created.topics[0].error_code == 0
    old = now_ms() - 3600 * 1000
    assert_refused(broker, build_batch([(b"k", b"v", [], old)]), INVALID_TIMESTAMP,
                   topic="validation-old")
    # The default (unbounded before) takes it.
    with RawConnection(broker.bootstrap_servers) as conn:
        assert produce(conn, TOPIC, 0, build_batch([(b"k", b"v", [], old)])).error_code == 0


def test_producer_claiming_log_append_time_is_refused(broker):
    assert_refused(broker, build_batch([(b"k", b"v", [], now_ms())], timestamp_type=1),
                   INVALID_TIMESTAMP)


def test_valid_batches_of_every_codec_are_accepted(broker):
    with RawConnection(broker.bootstrap_servers) as conn:
        for codec in Compression:
            batch = build_batch([(b"k%d" % i, b"v" * (i * 5), [("h", b"x"), ("n", None)],
                                  now_ms() + i) for i in range(300)], compression=codec)
            r = produce(conn, TOPIC, 0, batch)
            assert r.error_code == 0, (codec, r)
            got = fetch_all(conn, TOPIC, start=r.base_offset)[:300]
            assert [v for _o, _k, v, _h in got] == [b"v" * (i * 5) for i in range(300)]


# -- section 3: decompression bombs -------------------------------------------------------------


def bomb_payload(codec: Compression, inflated: int) -> bytes:
    """One record whose value is ``inflated`` zero bytes, compressed by streaming (the test
    never holds the inflated bytes)."""
    head = (b"\x00" + encode_varint(0) + encode_varint(0) + encode_varint(-1)
            + encode_varint(inflated))
    body_len = len(head) + inflated + 1
    prefix = encode_varint(body_len) + head
    module = {Compression.GZIP: cramjam.gzip, Compression.LZ4: cramjam.lz4,
              Compression.ZSTD: cramjam.zstd}[codec]
    # LZ4 in independent blocks: the only LZ4 frame Kafka (and so the broker) reads
    c = module.Compressor(block_linked=False) if codec == Compression.LZ4 \
        else module.Compressor()
    c.compress(prefix)
    chunk = bytes(1 << 20)
    for _ in range(inflated >> 20):
        c.compress(chunk)
    c.compress(b"\x00")
    return bytes(c.finish())


def bomb_batch(codec: Compression, inflated: int) -> bytes:
    return with_payload(good_batch(), bomb_payload(codec, inflated), int(codec))


@pytest.mark.parametrize("codec", [Compression.GZIP, Compression.LZ4, Compression.ZSTD])
def test_decompression_bomb_is_refused(broker, codec):
    batch = bomb_batch(codec, DEFAULT_INFLATE_LIMIT + (16 << 20))
    assert len(batch) < 1 << 20  # within max.message.bytes: only its insides are wrong
    assert_refused(broker, batch, CORRUPT_MESSAGE)


def test_snappy_length_claiming_gigabytes_is_refused(broker):
    """Raw snappy states its inflated length first: a tiny payload claiming 4 GiB."""
    payload = bytes([0xFF, 0xFF, 0xFF, 0xFF, 0x0F]) + b"\x00" * 64
    assert_refused(broker, with_payload(good_batch(), payload, int(Compression.SNAPPY)),
                   CORRUPT_MESSAGE)


def vm_hwm_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


def test_gigabyte_zstd_bomb_keeps_the_broker_rss_bounded(tmp_path):
    """A 1 GiB zstd bomb (a few dozen KB on the wire) is refused while the broker's peak RSS
    grows by at most the inflate limit plus slack; a ListOffsets by timestamp afterwards does
    not inflate anything either."""
    batch = bomb_batch(Compression.ZSTD, 1 << 30)
    assert len(batch) < 64 * 1024
    with BrokerProcess(tmp_path / "data") as b, RawConnection(b.bootstrap_servers) as conn:
        assert conn.request(create_topics_request(TOPIC)).topics[0].error_code == 0
        produce(conn, TOPIC, 0, good_batch())
        assert b.proc is not None
        before = vm_hwm_kib(b.proc.pid)
        assert produce(conn, TOPIC, 0, batch).error_code == CORRUPT_MESSAGE
        r = conn.request(list_offsets_request(TOPIC, 0, 1))
        assert r.topics[0].partitions[0].error_code == 0
        assert r.topics[0].partitions[0].offset == 0
        grown = vm_hwm_kib(b.proc.pid) - before
        assert grown < (DEFAULT_INFLATE_LIMIT >> 10) + 64 * 1024, f"peak RSS grew {grown} KiB"
        assert b.running


def test_our_consumer_refuses_a_fetched_bomb_without_inflating_it():
    """client/consumer/fetcher.py decodes fetched batches with the same bound: a 256 MiB zstd bomb (from a
    broker that let it in) is a CorruptMessageError, and this process's peak RSS barely moves."""
    from oncelog.client.consumer.fetcher import decode_records
    from oncelog.client.types import TopicPartition
    from oncelog.errors import CorruptMessageError

    batch = bomb_batch(Compression.ZSTD, 256 << 20)
    before = vm_hwm_kib(os.getpid())
    with pytest.raises(CorruptMessageError):
        decode_records(TopicPartition(TOPIC, 0), batch, 0, read_committed=False, aborted=None,
                       check_crcs=True)
    grown = vm_hwm_kib(os.getpid()) - before
    assert grown < (DEFAULT_INFLATE_LIMIT >> 10) + 64 * 1024, f"peak RSS grew {grown} KiB"


def test_timestamp_lookup_on_a_stored_bomb_is_bounded(tmp_path):
    """A bomb already on disk (replicated from a leader that let it in, or written by an older
    version): ListOffsets by timestamp reads it within the bound and reports it, instead of
    inflating it whole."""
    from oncelog.log import LogConfig, PartitionLog
    from oncelog.records import CorruptRecordError

    log = PartitionLog(tmp_path / "t-0", LogConfig(), 0)
    batch = bomb_batch(Compression.ZSTD, 256 << 20)
    assert log.append_as_follower(batch).last_offset == 0
    before = vm_hwm_kib(os.getpid())
    with pytest.raises(CorruptRecordError, match="limit"):
        log.offset_for_timestamp(1)
    grown = vm_hwm_kib(os.getpid()) - before
    assert grown < (DEFAULT_INFLATE_LIMIT >> 10) + 64 * 1024, f"peak RSS grew {grown} KiB"
