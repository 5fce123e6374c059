"""What transactions cost: confluent-kafka's producer writing 1 KiB records to oncelog with
transactions committed every 100 ms, over the same producer idempotent without transactions;
and a read_committed consumer over a read_uncommitted one reading the same transactional data.
Alternating rounds in one run against one broker process.

    .venv/bin/python benchmarks/bench_transactions.py [--records 100000] [--rounds 3]

Figures are payload megabytes (10^6 bytes of values) per second; the summary gives the median of
the rounds and the ratios transactional/idempotent and read_committed/read_uncommitted (targets:
>= 0.97, Kafka's published overhead for 100 ms transactions being 3%).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
from oncelog.harness.broker_process import BrokerProcess

PARTITIONS = 4
COMMIT_INTERVAL_S = 0.1


def produce(bootstrap: str, topic: str, records: int, value: bytes, transactional: bool
            ) -> tuple[float, int]:
    """Seconds to produce (and, if transactional, commit) ``records`` values; and the number
    of transactions."""
    config = {"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all"}
    if transactional:
        config["transactional.id"] = f"bench-{uuid.uuid4().hex[:8]}"
    producer = Producer(config)
    failed = []

    def on_delivery(err, _msg):
        if err is not None:
            failed.append(err)

    if transactional:
        producer.init_transactions(30)
        producer.begin_transaction()
    for p in range(PARTITIONS):  # warm-up: metadata, connections, partitions in the txn
        producer.produce(topic, value=b"warm-up", partition=p, on_delivery=on_delivery)
    if transactional:
        producer.commit_transaction(30)
    assert producer.flush(30) == 0 and not failed
    transactions = 0
    start = time.perf_counter()
    if transactional:
        producer.begin_transaction()
    next_commit = start + COMMIT_INTERVAL_S
    for i in range(records):
        while True:
            try:
                producer.produce(topic, value=value, partition=i % PARTITIONS,
                                 on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.001)
        producer.poll(0)
        if transactional and (i & 63) == 0 and time.perf_counter() >= next_commit:
            producer.commit_transaction(60)
            transactions += 1
            producer.begin_transaction()
            next_commit = time.perf_counter() + COMMIT_INTERVAL_S
    if transactional:
        producer.commit_transaction(60)
        transactions += 1
    assert producer.flush(60) == 0 and not failed, failed[:3]
    return time.perf_counter() - start, transactions


def consume(bootstrap: str, topic: str, records: int, isolation: str) -> float:
    """Seconds to read the ``records`` records after the warm-up ones."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4()}",
                         "enable.auto.commit": False, "isolation.level": isolation})
    start = time.perf_counter()
    consumer.assign([TopicPartition(topic, p, 1) for p in range(PARTITIONS)])
    got = 0
    while got < records:
        assert time.perf_counter() < start + 300, f"consumed {got} of {records}"
        for msg in consumer.consume(min(1000, records - got), 1.0):
            if msg.error() is None:
                got += 1
    elapsed = time.perf_counter() - start
    consumer.close()
    return elapsed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    value = os.urandom(args.size)
    mb = args.records * args.size / 1e6
    figures: dict[str, list[float]] = {k: [] for k in ("idempotent", "transactional",
                                                      "read_uncommitted", "read_committed")}
    print(f"{args.records} records x {args.size} B = {mb:.0f} MB per round, {PARTITIONS} "
          f"partitions, {args.rounds} rounds, commit every {COMMIT_INTERVAL_S * 1000:.0f} ms")
    with tempfile.TemporaryDirectory(prefix="oncelog-bench-") as tmp, \
            BrokerProcess(Path(tmp) / "data") as broker:
        bootstrap = broker.bootstrap_servers
        admin = AdminClient({"bootstrap.servers": bootstrap})
        for r in range(args.rounds):
            for mode in ("idempotent", "transactional"):
                topic = f"bench-{mode}-{uuid.uuid4().hex[:8]}"
                admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(30)
                seconds, txns = produce(bootstrap, topic, args.records, value,
                                        mode == "transactional")
                figures[mode].append(mb / seconds)
                line = f"round {r + 1} produce {mode:14s} {mb / seconds:7.1f} MB/s"
                if mode == "transactional":
                    line += f" ({txns} transactions)"
                    order = ("read_uncommitted", "read_committed")
                    for isolation in order if r % 2 == 0 else order[::-1]:  # no warm-cache bias
                        s = consume(bootstrap, topic, args.records, isolation)
                        figures[isolation].append(mb / s)
                        line += f"   consume {isolation} {mb / s:7.1f} MB/s"
                print(line, flush=True)
                admin.delete_topics([topic])[topic].result(30)
    print()
    for label, ours, ref in (("produce", "transactional", "idempotent"),
                             ("consume", "read_committed", "read_uncommitted")):
        a, b = statistics.median(figures[ours]), statistics.median(figures[ref])
        print(f"{label} median: {ours} {a:7.1f} MB/s   {ref} {b:7.1f} MB/s   "
              f"{ours}/{ref} {a / b:5.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
