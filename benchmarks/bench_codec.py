"""Records per second of the compiled column codec (records/columnar.py) against the Python
record codec (records/batch.py), and of the client's bulk APIs built on it against the
record-by-record ones, on the same records: ``--records`` (300,000) values of ``--size``
(100) bytes, unkeyed.

    .venv/bin/python benchmarks/bench_codec.py [--records 300000] [--size 100] [--rounds 3]
        [--partitions 4] [--skip-client]

Codec: encoding the records sections of 16 KiB batches (Python: encode_record per record),
and decoding one fetch's worth of those batches (Python: fetcher.decode_records, one
ConsumerRecord per record; C: fetcher.decode_columns, then to_arrow; and decode_columns plus
ConsumerRecords made from the columns, which is what poll() now does).

Client, against an EmbeddedBroker in this process (so the broker's own CPU shares the
machine), records round robin over ``--partitions`` partitions: Producer.send per record then
flush, against Producer.send_batch; Consumer.poll against Consumer.poll_columns, each reading
the whole topic from offset 0.

Best of ``--rounds`` wall times (the machine is shared: the best is the least disturbed); the
ratios are bulk / per-record. No assertion: a benchmark, not a test.
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from oncelog import Admin, Consumer, NewTopic, Producer, TopicPartition
from oncelog.client.consumer.fetcher import consumer_records, decode_columns, decode_records
from oncelog.records.batch import HEADER_SIZE, encode_record, wrap_records
from oncelog.records.columnar import encode_sections
from oncelog.server.embedded import EmbeddedBroker

BATCH = 16384
TP = TopicPartition("bench", 0)


def best(rounds: int, run: Callable[[], object]) -> float:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def python_encode(values: list[bytes]) -> list[bytes]:
    out = []
    body = bytearray()
    i = 0
    for v in values:
        record = encode_record(i, 0, None, v, ())
        if i and len(body) + len(record) > BATCH - HEADER_SIZE:
            out.append(bytes(body))
            body = bytearray()
            i = 0
            record = encode_record(0, 0, None, v, ())
        body += record
        i += 1
    out.append(bytes(body))
    return out


def c_encode(values: list[bytes]) -> list:
    return encode_sections(values, default_timestamp=0, max_bytes=BATCH - HEADER_SIZE)[0]


def line(name: str, n: int, seconds: float, base: float | None = None) -> None:
    ratio = f"   x{base / seconds:6.1f}" if base else ""
    print(f"  {name:44s} {n / seconds:>12,.0f} records/s{ratio}")


def bench_codec(values: list[bytes], rounds: int) -> None:
    n = len(values)
    print(f"codec: {n:,} records of {len(values[0])} B, best of {rounds}")
    py = best(rounds, lambda: python_encode(values))
    line("encode, Python (encode_record)", n, py)
    line("encode, C (encode_sections)", n, best(rounds, lambda: c_encode(values)), py)
    sections = c_encode(values)
    log = bytearray()
    offset = 0
    for section, count, base_ts, max_ts in sections:
        log += wrap_records(section, count, base_ts, max_ts, base_offset=offset)
        offset += count
    data = bytes(log)
    kwargs = {"read_committed": False, "aborted": None, "check_crcs": True}
    py = best(rounds, lambda: decode_records(TP, data, 0, **kwargs))
    line("decode, Python (decode_records)", n, py)
    line("decode, C (decode_columns + to_arrow)", n,
         best(rounds, lambda: decode_columns(TP, data, 0, **kwargs)[0].to_arrow()), py)
    line("decode, C + ConsumerRecords (poll's path)", n,
         best(rounds, lambda: consumer_records(decode_columns(TP, data, 0, **kwargs)[0])), py)


def bench_client(values: list[bytes], rounds: int, partitions: int) -> None:
    n = len(values)
    print(f"client: {n:,} records of {len(values[0])} B, {partitions} partitions, "
          f"EmbeddedBroker in process, best of {rounds}")
    with EmbeddedBroker() as broker:
        bs = broker.bootstrap_servers
        topics: list[str] = []

        def new_topic() -> str:
            topic = f"bench-{uuid.uuid4().hex[:8]}"
            with Admin(bootstrap_servers=bs) as admin:
                admin.create_topics([NewTopic(topic, partitions, 1)])
            topics.append(topic)
            return topic

        # Round robin over the partitions, in both: the sticky partitioner would put all of
        # send_batch's (one call's) records in one partition, and a consumer reading one busy
        # partition among idle ones waits out fetch.max.wait.ms whenever it drains the busy
        # one while a fetch for the idle ones is in flight (as the Java consumer does).
        partition_of = [i % partitions for i in range(n)]

        def send() -> None:
            topic = new_topic()
            with Producer(bootstrap_servers=bs, linger_ms=5) as p:
                for v, part in zip(values, partition_of, strict=True):
                    p.send(topic, v, partition=part)
                p.flush(120)

        def send_batch() -> None:
            topic = new_topic()
            with Producer(bootstrap_servers=bs, linger_ms=5) as p:
                p.send_batch(topic, values, partition=partition_of).result(120)

        per_record = best(rounds, send)
        line("Producer.send + flush", n, per_record)
        line("Producer.send_batch", n, best(rounds, send_batch), per_record)

        topic = topics[-1]

        def read(bulk: bool) -> Callable[[], None]:
            def run() -> None:
                with Consumer(bootstrap_servers=bs, auto_offset_reset="earliest") as c:
                    c.assign([(topic, p) for p in range(partitions)])
                    got = 0
                    deadline = time.monotonic() + 120
                    while got < n and time.monotonic() < deadline:
                        if bulk:
                            got += sum(cols.count for cols in c.poll_columns(1.0).values())
                        else:
                            got += len(c.poll(1.0))
                    assert got == n, got
            return run

        per_record = best(rounds, read(False))
        line("Consumer.poll", n, per_record)
        line("Consumer.poll_columns", n, best(rounds, read(True)), per_record)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--skip-client", action="store_true")
    args = parser.parse_args()
    values = [(b"%010d" % i) * (args.size // 10) + b"x" * (args.size % 10)
              for i in range(args.records)]
    bench_codec(values, args.rounds)
    if not args.skip_client:
        bench_client(values, args.rounds, args.partitions)


if __name__ == "__main__":
    main()
