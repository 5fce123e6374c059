"""Produce and consume throughput of a confluent-kafka client against oncelog and against
librdkafka's built-in mock cluster, alternating, in one run.

    .venv/bin/python benchmarks/bench_produce.py [--records 100000] [--size 1024] [--rounds 3]
        [--baseline CHECKOUT]

Producer: 1 KiB records, enable.idempotence=True, acks=all, librdkafka's defaults otherwise
(the mock run adds only test.mock.num.brokers=1), records spread round-robin over several topics of
4 partitions (the mock auto-creates topics with 4 partitions; its CreateTopics never answers:
AdminClient.create_topics times out with librdkafka 2.16.0), enough
that each partition holds at most ~4 MB, because the mock keeps only ~5 MB of each partition's
log. Consumer: a confluent Consumer assigned every partition from offset 1 (after one untimed
warm-up record per partition), reading until it has every record, with auto.offset.reset=error:
a partition whose first records the broker dropped fails the run. Figures are payload megabytes
(10^6 bytes of values) per second; the summary gives the median of the rounds and the ratio
oncelog/mock.
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

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
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


def new_consumer(bootstrap: str) -> Consumer:
    # auto.offset.reset=error: a partition whose first records the broker dropped (the mock
    # keeps ~5 MB of each) fails the round instead of skipping to the end. (A watermark query
    # per partition afterwards waited behind the consumer's long-polling Fetch: 0.5 s each.)
    return Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4()}",
                     "enable.auto.commit": False, "auto.offset.reset": "error"})


def consume(consumer: Consumer, partitions: Partitions, records: int) -> float:
    """Seconds from assignment to the last of the ``records`` records after the warm-up ones."""
    start = time.perf_counter()
    consumer.assign([TopicPartition(topic, p, 1) for topic, p in partitions])
    got = 0
    while got < records:
        assert time.perf_counter() < start + 300, f"consumed {got} of {records}"
        # Small batches: consume(n) waits for all n (or the timeout) once the queue runs dry.
        for msg in consumer.consume(min(1000, records - got), 1.0):
            error = msg.error()
            if error is not None:
                if error.code() == KafkaError._AUTO_OFFSET_RESET:
                    raise RuntimeError(f"the broker dropped part of the log ({error}): "
                                       "use more partitions")
                raise RuntimeError(error)
            got += 1
    return time.perf_counter() - start


def consume_passes(bootstrap: str, layouts: list[Partitions], records: int) -> float:
    """Seconds to consume every pass, each by a consumer of its own made just before it, as
    for a single pass: one consumer reused would start each pass behind its last Fetch of the
    pass before, which the broker holds fetch.wait.max.ms (500 ms); and a consumer made early
    and left idle took ~1 s after assign() to send its first Fetch."""
    seconds = 0.0
    for partitions in layouts:
        consumer = new_consumer(bootstrap)
        seconds += consume(consumer, partitions, records)
        consumer.close()
    return seconds


def layout(partitions: int) -> Partitions:
    """The first ``partitions`` partitions of fresh topics of MOCK_PARTITIONS partitions (1 is
    partition 0 of one topic, 256 are 64 topics x 4), the only layout the mock can have."""
    names = [f"bench-{uuid.uuid4().hex[:8]}"
             for _ in range(math.ceil(partitions / MOCK_PARTITIONS))]
    return [(t, p) for t in names for p in range(MOCK_PARTITIONS)][:partitions]


def cpu_seconds(pid: int) -> float:
    """User + system CPU time the process has used (Linux /proc): the broker's own cost of a
    phase, which a shared machine's noise moves far less than a throughput figure."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def round_oncelog(broker: BrokerProcess, partitions: int, passes: int, records: int,
                  value: bytes, cpu: dict[str, list[float]]) -> tuple[float, float]:
    """Produce then consume seconds of ``passes`` passes of ``records`` records, each pass
    over ``partitions`` partitions of topics of its own (one pass unless a sweep needs more
    to keep the mock's partitions under its limit); the broker's CPU seconds go to ``cpu``."""
    layouts = [layout(partitions) for _ in range(passes)]
    names = list(dict.fromkeys(t for partitions_ in layouts for t, _p in partitions_))
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    for f in admin.create_topics([NewTopic(t, MOCK_PARTITIONS, 1) for t in names]).values():
        f.result(30)
    producer = Producer({**PRODUCER_CONFIG, "bootstrap.servers": broker.bootstrap_servers})
    assert broker.pid is not None
    before = cpu_seconds(broker.pid)
    p_s = sum(produce(producer, partitions_, records, value) for partitions_ in layouts)
    middle = cpu_seconds(broker.pid)
    del producer
    c_s = consume_passes(broker.bootstrap_servers, layouts, records)
    cpu["produce"].append(middle - before)
    cpu["consume"].append(cpu_seconds(broker.pid) - middle)
    for f in admin.delete_topics(names).values():
        f.result(30)
    return p_s, c_s


def round_mock(partitions: int, passes: int, records: int, value: bytes) -> tuple[float, float]:
    layouts = [layout(partitions) for _ in range(passes)]
    # The producer owns the mock cluster: it must live until the consumer is done.
    producer = Producer({**PRODUCER_CONFIG, "bootstrap.servers": "unused",
                         "test.mock.num.brokers": 1})
    (mock_broker,) = producer.list_topics(timeout=10).brokers.values()
    p_s = sum(produce(producer, partitions_, records, value) for partitions_ in layouts)
    c_s = consume_passes(f"{mock_broker.host}:{mock_broker.port}", layouts, records)
    del producer
    return p_s, c_s


def start_brokers(stack: contextlib.ExitStack, settings: dict[str, str],
                  baseline: Path | None) -> dict[str, BrokerProcess]:
    """oncelog's broker (and the baseline checkout's) on a temporary data directory."""
    tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="oncelog-bench-")))
    brokers = {"oncelog": stack.enter_context(BrokerProcess(tmp / "data", settings=settings))}
    if baseline is not None:
        brokers["baseline"] = stack.enter_context(BrokerProcess(
            tmp / "baseline", settings=settings,
            env={"PYTHONPATH": str(baseline.resolve() / "src")}))
    return brokers


def run_round(name: str, brokers: dict[str, BrokerProcess], partitions: int, passes: int,
              records: int, value: bytes, cpu: dict[str, list[float]]) -> tuple[float, float]:
    # Each contender starts with no dirty pages of the one before (the kernel throttles a
    # writer while a previous phase's data is written back).
    os.sync()
    if name in brokers:
        return round_oncelog(brokers[name], partitions, passes, records, value, cpu)
    return round_mock(partitions, passes, records, value)


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
        brokers = start_brokers(stack, settings, args.baseline)
        for r in range(args.rounds):
            # Every other round in the reverse order, so that no contender always runs right
            # after another's writes.
            for name in (names if r % 2 == 0 else names[::-1]):
                p_s, c_s = run_round(name, brokers, topics * MOCK_PARTITIONS, 1, args.records,
                                     value, cpu[name])
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
