"""Produce and consume throughput of a confluent-kafka client against oncelog and against
librdkafka's built-in mock cluster, alternating, in one run.

    .venv/bin/python benchmarks/bench_produce.py [--records 100000] [--size 1024] [--rounds 3]
        [--baseline CHECKOUT]

Producer: 1 KiB records, enable.idempotence=True, acks=all, librdkafka's defaults otherwise
(the mock run adds only test.mock.num.brokers=1), records spread round-robin over several topics of
4 partitions (the mock auto-creates topics with 4 partitions and ignores CreateTopics), enough
that each partition holds at most ~4 MB, because the mock keeps only ~5 MB of each partition's
log. Consumer: a confluent Consumer assigned every partition from offset 0, reading until it has
every record. Figures are payload megabytes (10^6 bytes
of values) per second; the summary gives the median of the rounds and the ratio oncelog/mock.
oncelog runs as a subprocess (`oncelog broker`, default settings unless --set) on a temporary
data directory. ``--baseline CHECKOUT`` adds a third contender to every round: the broker of
another oncelog checkout (say ``git worktree add /tmp/before <commit>``), run from that
checkout's ``src`` with this environment's packages, so that a change is measured against the
code before it in the same run, on the same machine load; it also prints each broker's CPU
seconds per phase (from /proc), the steadier figure on a shared machine.
"""

from __future__ import annotations

import argparse
import contextlib
import math
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

PRODUCER_CONFIG = {"enable.idempotence": True, "acks": "all"}
MAX_PARTITION_BYTES = 4 * 1000 * 1000  # the mock keeps ~5 MB of each partition's log
MOCK_PARTITIONS = 4  # the mock auto-creates topics with 4 partitions (it ignores CreateTopics)

Partitions = list[tuple[str, int]]


def produce(producer: Producer, partitions: Partitions, records: int, value: bytes) -> float:
    """Seconds to produce and have acknowledged ``records`` values, round-robin."""
    failed = []

    def on_delivery(err, _msg):
        if err is not None:
            failed.append(err)

    # Warm up (topic creation on the mock, metadata, producer id, connections): one record
    # per partition, not timed.
    for topic, p in partitions:
        producer.produce(topic, value=b"warm-up", partition=p, on_delivery=on_delivery)
    assert producer.flush(30) == 0 and not failed, failed[:3]
    n = len(partitions)
    start = time.perf_counter()
    for i in range(records):
        topic, p = partitions[i % n]
        while True:
            try:
                producer.produce(topic, value=value, partition=p, on_delivery=on_delivery)
                break
            except BufferError:  # queue full: let deliveries drain
                producer.poll(0.001)
        producer.poll(0)
    left = producer.flush(300)
    elapsed = time.perf_counter() - start
    assert left == 0 and not failed, (left, failed[:3])
    return elapsed


def consume(bootstrap: str, partitions: Partitions, records: int) -> float:
    """Seconds from assignment to the last of the ``records`` records after the warm-up ones;
    then checks that the broker still had each partition from offset 0 (the mock drops the
    oldest data past ~5 MB per partition)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4()}",
                         "enable.auto.commit": False})
    start = time.perf_counter()
    consumer.assign([TopicPartition(topic, p, 1) for topic, p in partitions])
    got = 0
    while got < records:
        assert time.perf_counter() < start + 300, f"consumed {got} of {records}"
        # Small batches: consume(n) waits for all n (or the timeout) once the queue runs dry.
        for msg in consumer.consume(min(1000, records - got), 1.0):
            if msg.error() is not None:
                raise RuntimeError(msg.error())
            got += 1
    elapsed = time.perf_counter() - start
    for topic, p in partitions:
        low, _ = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
        assert low == 0, "the broker dropped part of the log: use more partitions"
    consumer.close()
    return elapsed


def layout(topics: int) -> tuple[list[str], Partitions]:
    names = [f"bench-{uuid.uuid4().hex[:8]}" for _ in range(topics)]
    return names, [(t, p) for t in names for p in range(MOCK_PARTITIONS)]


def cpu_seconds(pid: int) -> float:
    """User + system CPU time the process has used (Linux /proc): the broker's own cost of a
    phase, which a shared machine's noise moves far less than a throughput figure."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def round_oncelog(broker: BrokerProcess, topics: int, records: int, value: bytes,
                  cpu: dict[str, list[float]]) -> tuple[float, float]:
    names, partitions = layout(topics)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    for f in admin.create_topics([NewTopic(t, MOCK_PARTITIONS, 1) for t in names]).values():
        f.result(30)
    producer = Producer({**PRODUCER_CONFIG, "bootstrap.servers": broker.bootstrap_servers})
    assert broker.pid is not None
    before = cpu_seconds(broker.pid)
    p_s = produce(producer, partitions, records, value)
    middle = cpu_seconds(broker.pid)
    del producer
    c_s = consume(broker.bootstrap_servers, partitions, records)
    cpu["produce"].append(middle - before)
    cpu["consume"].append(cpu_seconds(broker.pid) - middle)
    for f in admin.delete_topics(names).values():
        f.result(30)
    return p_s, c_s


def round_mock(topics: int, records: int, value: bytes) -> tuple[float, float]:
    _names, partitions = layout(topics)
    # The producer owns the mock cluster: it must live until the consumer is done.
    producer = Producer({**PRODUCER_CONFIG, "bootstrap.servers": "unused",
                         "test.mock.num.brokers": 1})
    (mock_broker,) = producer.list_topics(timeout=10).brokers.values()
    p_s = produce(producer, partitions, records, value)
    c_s = consume(f"{mock_broker.host}:{mock_broker.port}", partitions, records)
    del producer
    return p_s, c_s


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--size", type=int, default=1024, help="value size in bytes")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--topics", type=int, default=None,
                    help=f"topics of {MOCK_PARTITIONS} partitions (default: enough for at most "
                    "~4 MB per partition)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a broker setting for oncelog (repeatable)")
    ap.add_argument("--baseline", type=Path, default=None, metavar="CHECKOUT",
                    help="another oncelog checkout whose broker runs too, as 'baseline'")
    args = ap.parse_args(argv)
    if args.baseline is not None and not (args.baseline / "src" / "oncelog").is_dir():
        ap.error(f"{args.baseline} is not an oncelog checkout (no src/oncelog)")
    value = os.urandom(args.size)
    mb = args.records * args.size / 1e6
    topics = args.topics or max(1, math.ceil(args.records * (args.size + 70)
                                             / MAX_PARTITION_BYTES / MOCK_PARTITIONS))
    settings = dict(s.split("=", 1) for s in args.set)
    names = ["oncelog"] + (["baseline"] if args.baseline else []) + ["mock"]
    results: dict[str, dict[str, list[float]]] = {
        name: {"produce": [], "consume": []} for name in names}
    cpu: dict[str, dict[str, list[float]]] = {
        name: {"produce": [], "consume": []} for name in names}
    print(f"{args.records} records x {args.size} B = {mb:.0f} MB per round over {topics} "
          f"topics x {MOCK_PARTITIONS} partitions, {args.rounds} rounds; "
          f"producer {PRODUCER_CONFIG}; "
          f"oncelog settings {settings or 'default'}"
          + (f"; baseline {args.baseline}" if args.baseline else ""))
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="oncelog-bench-")))
        brokers = {"oncelog": stack.enter_context(
            BrokerProcess(tmp / "data", settings=settings))}
        if args.baseline is not None:
            brokers["baseline"] = stack.enter_context(BrokerProcess(
                tmp / "baseline", settings=settings,
                env={"PYTHONPATH": str(args.baseline.resolve() / "src")}))
        for r in range(args.rounds):
            # Every other round in the reverse order, so that no contender always runs right
            # after another's writes; and each starts with no dirty pages of the one before
            # (the kernel throttles a writer while a previous phase's data is written back).
            for name in (names if r % 2 == 0 else names[::-1]):
                os.sync()
                if name in brokers:
                    p_s, c_s = round_oncelog(brokers[name], topics, args.records, value,
                                             cpu[name])
                else:
                    p_s, c_s = round_mock(topics, args.records, value)
                results[name]["produce"].append(mb / p_s)
                results[name]["consume"].append(mb / c_s)
                used = (f"   broker CPU {cpu[name]['produce'][-1]:5.2f} s + "
                        f"{cpu[name]['consume'][-1]:5.2f} s" if name in brokers else "")
                print(f"round {r + 1} {name:8s} produce {mb / p_s:7.1f} MB/s "
                      f"({args.records / p_s:8.0f} rec/s)   consume {mb / c_s:7.1f} MB/s "
                      f"({args.records / c_s:8.0f} rec/s){used}", flush=True)
    print()
    for phase in ("produce", "consume"):
        ours = statistics.median(results["oncelog"][phase])
        mock = statistics.median(results["mock"][phase])
        line = (f"{phase:8s} median: oncelog {ours:7.1f} MB/s   mock {mock:7.1f} MB/s   "
                f"oncelog/mock {ours / mock:5.2f}")
        if args.baseline is not None:
            base = statistics.median(results["baseline"][phase])
            line += (f"   baseline {base:7.1f} MB/s   baseline/mock {base / mock:5.2f}   "
                     f"oncelog/baseline {ours / base:5.2f}")
        print(line)
    if args.baseline is not None:
        for phase in ("produce", "consume"):
            ours = statistics.median(cpu["oncelog"][phase])
            base = statistics.median(cpu["baseline"][phase])
            print(f"{phase:8s} broker CPU median: oncelog {ours:6.2f} s   baseline {base:6.2f} s"
                  f"   oncelog/baseline {ours / base:5.2f} (lower is better)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
