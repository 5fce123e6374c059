"""Shared pieces of the interop tests: a record set that exercises the v2 format (keys, null keys,
empty and null values, binary values, large values, duplicate and null-valued headers, explicit
timestamps), and for each third-party client a way to produce it and to read a whole topic back,
normalised so that any client's output compares with any other's.

Consumers never join a group: oncelog has no group coordinator yet, so each client is assigned
partitions by hand and commits nothing.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import time
import uuid
from dataclasses import dataclass

# Recent, so that retention (7 days by default, measured on record timestamps) keeps them.
BASE_TIMESTAMP = (int(time.time()) - 3600) * 1000
DEADLINE_S = 30.0

# Codecs each client handles with the packages the project already installs (kafka-python needs
# python-snappy, lz4 and zstandard for the other three; aiokafka uses cramjam, a dependency).
CODECS = {
    "confluent": ("none", "gzip", "snappy", "lz4", "zstd"),
    "aiokafka": ("none", "gzip", "snappy", "lz4", "zstd"),
    "kcat": ("none", "gzip", "snappy", "lz4", "zstd"),
}


def kafka_python_codecs() -> tuple[str, ...]:
    from kafka.codec import has_lz4, has_snappy, has_zstd

    extra = [c for c, ok in (("snappy", has_snappy()), ("lz4", has_lz4()), ("zstd", has_zstd()))
             if ok]
    return ("none", "gzip", *extra)


CODECS["kafka-python"] = kafka_python_codecs()


@dataclass(frozen=True)
class Rec:
    """A record as produced (partition/offset unknown) or as consumed."""

    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    timestamp: int | None = None  # None: not checked (kcat cannot set one)
    partition: int = -1
    offset: int = -1

    def content(self, with_timestamp: bool = True):
        return (self.key, self.value, self.headers, self.timestamp if with_timestamp else None)


def unique_topic(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def dataset(tag: str, n: int, *, text_only: bool = False, null_header_values: bool = True,
            start: int = 0) -> list[Rec]:
    """``n`` records, every one identifiable by its ``seq`` header and value.

    ``text_only`` keeps values printable ASCII (kcat prints records as JSON text).
    """
    out = []
    for i in range(start, start + n):
        key = None if i % 10 == 9 else b"key-%s-%05d" % (tag.encode(), i)
        if i % 10 == 3:
            value = b""
        elif i % 10 == 7:
            value = None  # a tombstone
        elif i % 10 == 5 and not text_only:
            value = bytes(range(256)) + b"%05d" % i
        elif i % 50 == 11:
            value = (b"large-%05d-" % i) * 1000  # ~11 kB: spans compression blocks
        else:
            value = b"value-%s-%05d" % (tag.encode(), i)
        headers: list[tuple[str, bytes | None]] = [("seq", b"%d" % i), ("tag", tag.encode())]
        if i % 4 == 0:
            headers.append(("seq", b"duplicate-key"))
        if i % 6 == 0:
            headers.append(("empty", b""))
        if i % 8 == 0 and null_header_values:
            headers.append(("null", None))
        if i % 12 == 0:
            headers.append(("ünïcode-ключ", "значение".encode()))
        out.append(Rec(key, value, tuple(headers), BASE_TIMESTAMP + 3 * i))
    return out


def check_consumed(produced: list[Rec], consumed: list[Rec], *, partitions: int,
                   with_timestamps: bool = True, offsets_known: bool = True) -> None:
    """Exactly the produced records, each once, at the offsets the producer was told, with
    contiguous offsets from 0 in every partition and per-partition production order kept."""
    by_pos = {(r.partition, r.offset): r for r in consumed}
    assert len(by_pos) == len(consumed), "a (partition, offset) was delivered twice"
    for p in range(partitions):
        offs = sorted(o for (pp, o) in by_pos if pp == p)
        assert offs == list(range(len(offs))), f"partition {p}: offsets not contiguous from 0"
    assert len(consumed) == len(produced), (len(consumed), len(produced))
    if offsets_known:
        for r in produced:
            got = by_pos.get((r.partition, r.offset))
            assert got is not None, f"nothing at {r.partition}/{r.offset}"
            assert got.content(with_timestamps) == r.content(with_timestamps), (r, got)
    else:
        want = sorted((r.content(with_timestamps) for r in produced), key=repr)
        have = sorted((r.content(with_timestamps) for r in consumed), key=repr)
        assert have == want
    # Per partition, records appear in the order they were produced.
    order = {r.content(with_timestamps): i for i, r in enumerate(produced)}
    for p in range(partitions):
        seq = [order[r.content(with_timestamps)] for r in
               sorted((r for r in consumed if r.partition == p), key=lambda r: r.offset)]
        assert seq == sorted(seq), f"partition {p}: order differs from production order"


def _headers(raw) -> tuple[tuple[str, bytes | None], ...]:
    return tuple((k, None if v is None else bytes(v)) for k, v in (raw or ()))


def _wait(cond, what: str, timeout: float = DEADLINE_S) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")


# -- confluent-kafka (librdkafka) -------------------------------------------------------------


def confluent_create_topic(bootstrap: str, topic: str, partitions: int,
                           config: dict[str, str] | None = None) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(topic, num_partitions=partitions,
                                            replication_factor=1, config=config or {})],
                                  operation_timeout=10)
    futures[topic].result(timeout=DEADLINE_S)


def confluent_produce(bootstrap: str, topic: str, records: list[Rec], partitions: int,
                      codec: str, **extra) -> list[Rec]:
    """Produce idempotently; returns the records with the partition/offset each was acked at."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                         "acks": "all", "compression.type": codec, "linger.ms": 5, **extra})
    acked: dict[int, Rec] = {}
    errors = []

    def on_delivery(err, msg, i):
        if err is not None:
            errors.append(err)
        else:
            acked[i] = Rec(msg.key(), msg.value(), _headers(msg.headers()),
                           msg.timestamp()[1], msg.partition(), msg.offset())

    for i, r in enumerate(records):
        producer.produce(topic, value=r.value, key=r.key, partition=i % partitions,
                         timestamp=r.timestamp or 0, headers=list(r.headers),
                         on_delivery=lambda err, msg, i=i: on_delivery(err, msg, i))
        producer.poll(0)
    assert producer.flush(DEADLINE_S) == 0, "undelivered records"
    assert not errors, errors[:3]
    out = []
    for i, r in enumerate(records):
        a = acked[i]
        # (delivery reports carry no headers)
        assert (a.key, a.value, a.timestamp) == (r.key, r.value, r.timestamp), (a, r)
        out.append(Rec(r.key, r.value, r.headers, r.timestamp, a.partition, a.offset))
    return out


def confluent_consume(bootstrap: str, topic: str, partitions: int) -> list[Rec]:
    from confluent_kafka import Consumer, TopicPartition

    # The Python wrapper insists on a group.id; no group request is sent (the broker does not
    # advertise FindCoordinator, so librdkafka never asks for a coordinator).
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique_topic("unused"),
                         "enable.auto.commit": False, "enable.partition.eof": True,
                         "auto.offset.reset": "error"})
    try:
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                for p in range(partitions)}
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        out: list[Rec] = []
        next_offset = {p: 0 for p in range(partitions)}
        deadline = time.monotonic() + DEADLINE_S
        while any(next_offset[p] < ends[p] for p in range(partitions)):
            assert time.monotonic() < deadline, f"consumed {len(out)}, ends {ends}"
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                assert msg.error().code() == -191, msg.error()  # _PARTITION_EOF
                continue
            out.append(Rec(msg.key(), msg.value(), _headers(msg.headers()), msg.timestamp()[1],
                           msg.partition(), msg.offset()))
            next_offset[msg.partition()] = msg.offset() + 1
        return out
    finally:
        consumer.close()


# -- kafka-python --------------------------------------------------------------------------------


def kafka_python_produce(bootstrap: str, topic: str, records: list[Rec], partitions: int,
                         codec: str) -> list[Rec]:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True, acks="all",
                             compression_type=None if codec == "none" else codec, linger_ms=5)
    try:
        futures = [producer.send(topic, value=r.value, key=r.key, partition=i % partitions,
                                 timestamp_ms=r.timestamp, headers=list(r.headers))
                   for i, r in enumerate(records)]
        producer.flush(timeout=DEADLINE_S)
        metas = [f.get(timeout=DEADLINE_S) for f in futures]
    finally:
        producer.close(timeout=10)
    return [Rec(r.key, r.value, r.headers, r.timestamp, m.partition, m.offset)
            for r, m in zip(records, metas)]


def kafka_python_consume(bootstrap: str, topic: str, partitions: int) -> list[Rec]:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None,
                             enable_auto_commit=False, auto_offset_reset="none")
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        consumer.seek_to_beginning()
        ends = consumer.end_offsets(tps)
        out: list[Rec] = []
        deadline = time.monotonic() + DEADLINE_S
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            assert time.monotonic() < deadline, f"consumed {len(out)}, ends {ends}"
            for msgs in consumer.poll(timeout_ms=500).values():
                out.extend(Rec(m.key, m.value, _headers(m.headers), m.timestamp, m.partition,
                               m.offset) for m in msgs)
        return out
    finally:
        consumer.close()


# -- aiokafka ------------------------------------------------------------------------------------


async def _aiokafka_produce(bootstrap, topic, records, partitions, codec):
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True,
                                acks="all", linger_ms=5,
                                compression_type=None if codec == "none" else codec)
    await producer.start()
    try:
        futures = [await producer.send(topic, value=r.value, key=r.key, partition=i % partitions,
                                       timestamp_ms=r.timestamp, headers=list(r.headers))
                   for i, r in enumerate(records)]
        metas = await asyncio.wait_for(asyncio.gather(*futures), DEADLINE_S)
    finally:
        await producer.stop()
    return [Rec(r.key, r.value, r.headers, r.timestamp, m.partition, m.offset)
            for r, m in zip(records, metas)]


def aiokafka_produce(bootstrap: str, topic: str, records: list[Rec], partitions: int,
                     codec: str) -> list[Rec]:
    return asyncio.run(_aiokafka_produce(bootstrap, topic, records, partitions, codec))


async def _aiokafka_consume(bootstrap, topic, partitions):
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None,
                                enable_auto_commit=False, auto_offset_reset="none")
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        out: list[Rec] = []
        deadline = time.monotonic() + DEADLINE_S
        while any([await consumer.position(tp) < ends[tp] for tp in tps]):
            assert time.monotonic() < deadline, f"consumed {len(out)}, ends {ends}"
            batches = await consumer.getmany(*tps, timeout_ms=500)
            for msgs in batches.values():
                out.extend(Rec(m.key, m.value, _headers(m.headers), m.timestamp, m.partition,
                               m.offset) for m in msgs)
        return out
    finally:
        await consumer.stop()


def aiokafka_consume(bootstrap: str, topic: str, partitions: int) -> list[Rec]:
    return asyncio.run(_aiokafka_consume(bootstrap, topic, partitions))


# -- kcat (librdkafka's command-line client, Debian's build) ----------------------------------

KCAT = shutil.which("kcat") or shutil.which("kafkacat")


def kcat(bootstrap: str, *args: str, input: bytes | None = None) -> bytes:
    assert KCAT is not None
    proc = subprocess.run([KCAT, "-b", bootstrap, "-q", *args], input=input,
                          capture_output=True, timeout=DEADLINE_S, check=False)
    assert proc.returncode == 0, (args, proc.returncode, proc.stderr.decode(errors="replace"))
    return proc.stdout


def kcat_dataset(tag: str, n: int, start: int = 0) -> list[Rec]:
    """What one kcat invocation can produce: one fixed header set per run (``-H``), no
    timestamps, null keys and values written as empty lines parts (``-Z``)."""
    headers = (("seq-run", b"%d" % start), ("tag", tag.encode()), ("empty", b""))
    out = []
    for i in range(start, start + n):
        key = None if i % 10 == 9 else b"key-%s-%05d" % (tag.encode(), i)
        value = None if i % 10 == 7 else (
            (b"large-%05d-" % i) * 1000 if i % 50 == 11 else b"value-%s-%05d" % (tag.encode(), i))
        out.append(Rec(key, value, headers))
    return out


def kcat_produce(bootstrap: str, topic: str, records: list[Rec], partition: int,
                 codec: str) -> None:
    """One kcat run: records must share their headers; keys/values hold no tab or newline."""
    headers = records[0].headers
    assert all(r.headers == headers for r in records)
    lines = b"".join((r.key or b"") + b"\t" + (r.value or b"") + b"\n" for r in records)
    args = ["-P", "-t", topic, "-p", str(partition), "-K", "\t", "-Z", "-z", codec,
            "-X", "enable.idempotence=true", "-X", "acks=all", "-X", "linger.ms=5"]
    for k, v in headers:
        args += ["-H", f"{k}={v.decode()}"]
    kcat(bootstrap, *args, input=lines)


def kcat_consume(bootstrap: str, topic: str, partitions: int) -> list[Rec]:
    out = []
    for p in range(partitions):
        raw = kcat(bootstrap, "-C", "-t", topic, "-p", str(p), "-o", "beginning", "-e", "-J")
        for line in raw.splitlines():
            m = json.loads(line)
            h = m.get("headers") or []
            headers = tuple((h[i], None if h[i + 1] is None else h[i + 1].encode())
                            for i in range(0, len(h), 2))
            enc = (lambda s: None if s is None else s.encode())
            out.append(Rec(enc(m["key"]), enc(m["payload"]), headers, m["ts"], m["partition"],
                           m["offset"]))
    return out


CONSUMERS = {
    "confluent": confluent_consume,
    "kafka-python": kafka_python_consume,
    "aiokafka": aiokafka_consume,
    "kcat": kcat_consume,
}
