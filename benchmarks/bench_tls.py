"""What TLS costs: the same produce and consume against a PLAINTEXT broker and an SSL broker,
alternating in each round, with our client and with confluent-kafka (librdkafka).

Prints per contender the median MB/s and the broker's CPU seconds per 100 MB (from /proc,
steadier than wall time on a shared machine), and TLS's figures as a ratio of plaintext's in
the same run. A plaintext consume sends record sets with sendfile (zero copy); over TLS they
are read and encrypted in chunks, which is most of the difference on the broker's side.

    .venv/bin/python benchmarks/bench_tls.py --mb 200 --rounds 3
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

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests")]  # oncelog, and the tests' support
from support.tls import make_certificates

from oncelog import Consumer, Producer, TopicPartition
from oncelog.harness.broker_process import BrokerProcess

VALUE_SIZE = 10_000


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def ours_round(bootstrap: str, security: dict, count: int) -> tuple[float, float]:
    topic = f"b-{uuid.uuid4().hex[:8]}"
    value = os.urandom(VALUE_SIZE)
    start = time.perf_counter()
    with Producer(bootstrap_servers=bootstrap, linger_ms=5, batch_size=1 << 20,
                  max_request_size=8 << 20, **security) as producer:
        for _ in range(count):
            producer.send(topic, value, partition=0)
        producer.flush()
    produced = time.perf_counter() - start
    start = time.perf_counter()
    with Consumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                  max_partition_fetch_bytes=50 << 20, fetch_max_bytes=50 << 20,
                  **security) as consumer:
        consumer.assign([TopicPartition(topic, 0)])
        got = 0
        while got < count:
            got += len(consumer.poll(1.0))
    return produced, time.perf_counter() - start


def confluent_round(bootstrap: str, security: dict, count: int) -> tuple[float, float]:
    import confluent_kafka

    topic = f"b-{uuid.uuid4().hex[:8]}"
    value = os.urandom(VALUE_SIZE)
    start = time.perf_counter()
    p = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "linger.ms": 5,
                                  "batch.size": 1 << 20, **security})
    for _ in range(count):
        while True:
            try:
                p.produce(topic, value, partition=0)
                break
            except BufferError:
                p.poll(0.01)
    p.flush()
    produced = time.perf_counter() - start
    start = time.perf_counter()
    c = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": topic,
                                  "fetch.max.bytes": 50 << 20, **security})
    c.assign([confluent_kafka.TopicPartition(topic, 0, 0)])
    got = 0
    while got < count:
        got += len(c.consume(10_000, 1.0))
    c.close()
    return produced, time.perf_counter() - start


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=int, default=200, help="megabytes per produce and consume")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    count = args.mb * 1_000_000 // VALUE_SIZE
    mb = count * VALUE_SIZE / 1e6
    with tempfile.TemporaryDirectory(prefix="bench-tls-") as tmp:
        certs = make_certificates(Path(tmp) / "certs")
        small = {"offsets.topic.num.partitions": "2", "transaction.state.log.num.partitions": "2"}
        brokers = {
            "PLAINTEXT": BrokerProcess(Path(tmp) / "plain", settings=small),
            "SSL": BrokerProcess(Path(tmp) / "ssl", settings={**certs.settings(), **small}),
        }
        clients = {
            "ours": (ours_round, {"PLAINTEXT": {},
                                  "SSL": {"security_protocol": "SSL", "ssl_cafile": certs.ca}}),
            "confluent": (confluent_round, {"PLAINTEXT": {},
                                            "SSL": {"security.protocol": "SSL",
                                                    "ssl.ca.location": certs.ca}}),
        }
        # (client, protocol, phase) -> MB/s and broker CPU seconds per 100 MB, per round
        rates: dict[tuple[str, str, str], list[float]] = {}
        cpus: dict[tuple[str, str, str], list[float]] = {}
        for b in brokers.values():
            b.start()
        try:
            for _round in range(args.rounds):
                for client, (run, security) in clients.items():
                    for protocol, broker in brokers.items():  # alternating contenders
                        assert broker.pid is not None
                        before = cpu_seconds(broker.pid)
                        produce_s, consume_s = run(broker.bootstrap_servers,
                                                   security[protocol], count)
                        spent = cpu_seconds(broker.pid) - before
                        for phase, seconds in (("produce", produce_s), ("consume", consume_s)):
                            rates.setdefault((client, protocol, phase), []).append(
                                mb / seconds)
                        cpus.setdefault((client, protocol, "both"), []).append(
                            spent / (2 * mb) * 100)
        finally:
            for b in brokers.values():
                b.stop()
    print(f"{mb:.0f} MB per phase, {VALUE_SIZE} B records, medians of {args.rounds} rounds")
    print(f"{'client':10} {'phase':8} {'PLAINTEXT MB/s':>15} {'SSL MB/s':>10} {'SSL/PLAIN':>10}")
    for client in clients:
        for phase in ("produce", "consume"):
            plain = statistics.median(rates[(client, "PLAINTEXT", phase)])
            tls = statistics.median(rates[(client, "SSL", phase)])
            print(f"{client:10} {phase:8} {plain:15.1f} {tls:10.1f} {tls / plain:10.2f}")
    print("broker CPU seconds per 100 MB (produce and consume together)")
    for client in clients:
        plain = statistics.median(cpus[(client, "PLAINTEXT", "both")])
        tls = statistics.median(cpus[(client, "SSL", "both")])
        print(f"{client:10} PLAINTEXT {plain:.2f}  SSL {tls:.2f}  SSL/PLAIN {tls / plain:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
