"""Our Producer and Consumer beside confluent-kafka's (librdkafka), against the same oncelog
broker, with the same records, alternating in one run.

    .venv/bin/python benchmarks/bench_client.py [--records 100000] [--size 1024] [--rounds 3]
        [--sizes 100,1000,10000,100000] [--plot docs/perf_client.png]

The layout and records of benchmarks/bench_produce.py: values of --size random bytes (one value
repeated), enable.idempotence=True and acks=all (our Producer's defaults), every client's
defaults otherwise, records spread round-robin over several topics of 4 partitions (enough that
a partition holds at most ~4 MB, as there). One broker (``oncelog broker`` as a subprocess, on
a temporary data directory) serves every contender.

Produce contenders, each writing its own topics:
  confluent   confluent_kafka.Producer: produce() per record, poll(0) after each, flush()
  send_batch  our Producer.send_batch: the bulk path (records encoded column-wise in C), one
              call per topic for each --chunk records of it, the partitions as a column
  send        our Producer.send, one call per record
Consume contenders, each reading the topics the confluent producer wrote in that round (the
same records, in the same batches), assigned every partition from the first record on:
  confluent     confluent_kafka.Consumer.consume(1000, 1.0) (as bench_produce.py)
  poll_columns  our Consumer.poll_columns: each partition's records decoded in bulk
  poll          our Consumer.poll: one ConsumerRecord per record

Figures are payload megabytes (10^6 bytes of values) per second from the first record to the
last acknowledged (produce) or received (consume) one; the client's CPU seconds (this process:
every thread, librdkafka's included) and the broker's (/proc) for each phase, the steadier
figures on a shared machine. The contenders run in one order in even rounds and in the reverse
order in odd ones. The summary gives medians and the ratios ours/confluent.

``--sizes`` sweeps value sizes (bytes), each with the --records x --size volume of data per
round (so 100 B values are ten times as many records as 1,000 B ones); ``--plot PATH`` draws
produce and consume MB/s against value size, our client beside confluent-kafka (matplotlib:
``.venv/bin/pip install -e '.[bench]'``), and writes the figures as JSON beside it
(PATH with the suffix .json).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import sys
import tempfile
import time
import uuid
from array import array
from collections.abc import Callable
from pathlib import Path

import confluent_kafka
from confluent_kafka.admin import AdminClient, NewTopic

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_produce  # confluent's produce loop and the CPU readers, shared

from oncelog import Consumer, Producer, TopicPartition
from oncelog.harness.broker_process import BrokerProcess

PRODUCER_CONFIG = {"enable.idempotence": True, "acks": "all"}
OURS: dict[str, str] = {}  # --ours: settings of our Producer beyond its defaults
MAX_PARTITION_BYTES = 4 * 1000 * 1000  # bench_produce.py's layout (a limit of the mock there)
PARTITIONS = 4
PRODUCERS = ("confluent", "send_batch", "send")
CONSUMERS = ("confluent", "poll_columns", "poll")
TIMEOUT = 600.0

Partitions = list[tuple[str, int]]


# This process's CPU (all threads) and another's, as bench_produce.py reads them.
client_cpu = bench_produce.process_cpu
process_cpu = bench_produce.cpu_seconds


# --- producers: each warms up (one record per partition, untimed), then returns the seconds
# --- from the first record to the last acknowledged one --------------------------------------


def produce_confluent(bootstrap: str, partitions: Partitions, records: int, value: bytes,
                      chunk: int) -> float:
    producer = confluent_kafka.Producer({**PRODUCER_CONFIG, "bootstrap.servers": bootstrap})
    return bench_produce.produce(producer, partitions, records, value)  # its loop, as there


def _our_producer(bootstrap: str, partitions: Partitions) -> Producer:
    producer = Producer(OURS, bootstrap_servers=bootstrap)
    warm = [producer.send(topic, b"warm-up", partition=p) for topic, p in partitions]
    producer.flush(30)
    for f in warm:
        f.result(0)
    return producer


def produce_send_batch(bootstrap: str, partitions: Partitions, records: int, value: bytes,
                       chunk: int) -> float:
    """Round-robin as the others: topic by topic, ``chunk`` rows of a topic per call, row j of
    a call to partition j % 4 (the partitions column is made once, outside the clock)."""
    producer = _our_producer(bootstrap, partitions)
    topics = list(dict.fromkeys(t for t, _ in partitions))
    per_topic = -(-records // len(topics))
    values = [value] * chunk
    column = array("i", [j % PARTITIONS for j in range(chunk)])
    futures = []
    sent = 0
    start = time.perf_counter()
    for offset in range(0, per_topic, chunk):
        for topic in topics:
            m = min(chunk, per_topic - offset, records - sent)
            if m <= 0:
                break
            futures.append(producer.send_batch(
                topic, values if m == chunk else values[:m],
                partition=column if m == chunk else column[:m]))
            sent += m
    producer.flush(TIMEOUT)
    elapsed = time.perf_counter() - start
    for f in futures:
        f.result(0)
    producer.close()
    return elapsed


def produce_send(bootstrap: str, partitions: Partitions, records: int, value: bytes,
                 chunk: int) -> float:
    producer = _our_producer(bootstrap, partitions)
    n = len(partitions)
    send = producer.send
    futures = []
    start = time.perf_counter()
    for i in range(records):
        topic, p = partitions[i % n]
        futures.append(send(topic, value, partition=p))
    producer.flush(TIMEOUT)
    elapsed = time.perf_counter() - start
    for f in futures:
        f.result(0)
    producer.close()
    return elapsed


# --- consumers: from offset 1 (after the warm-up record) until ``records`` are in -------------


def consume_confluent(bootstrap: str, partitions: Partitions, records: int) -> float:
    consumer = confluent_kafka.Consumer({"bootstrap.servers": bootstrap,
                                         "group.id": f"bench-{uuid.uuid4()}",
                                         "enable.auto.commit": False})
    start = time.perf_counter()
    consumer.assign([confluent_kafka.TopicPartition(t, p, 1) for t, p in partitions])
    got = 0
    while got < records:
        assert time.perf_counter() < start + TIMEOUT, f"consumed {got} of {records}"
        # Small batches: consume(n) waits for all n (or the timeout) once the queue runs dry.
        for msg in consumer.consume(min(1000, records - got), 1.0):
            if msg.error() is not None:
                raise RuntimeError(msg.error())
            got += 1
    elapsed = time.perf_counter() - start
    consumer.close()
    return elapsed


def _consume_ours(bootstrap: str, partitions: Partitions, records: int,
                  take: Callable[[Consumer], int]) -> float:
    consumer = Consumer(bootstrap_servers=bootstrap)
    start = time.perf_counter()
    tps = [TopicPartition(t, p) for t, p in partitions]
    consumer.assign(tps)
    for tp in tps:
        consumer.seek(tp, 1)
    got = 0
    while got < records:
        assert time.perf_counter() < start + TIMEOUT, f"consumed {got} of {records}"
        got += take(consumer)
    elapsed = time.perf_counter() - start
    assert got == records, (got, records)
    consumer.close()
    return elapsed


def consume_poll_columns(bootstrap: str, partitions: Partitions, records: int) -> float:
    return _consume_ours(bootstrap, partitions, records,
                         lambda c: sum(cols.count for cols in c.poll_columns(1.0).values()))


def consume_poll(bootstrap: str, partitions: Partitions, records: int) -> float:
    return _consume_ours(bootstrap, partitions, records, lambda c: len(c.poll(1.0)))


PRODUCE = {"confluent": produce_confluent, "send_batch": produce_send_batch,
           "send": produce_send}
CONSUME = {"confluent": consume_confluent, "poll_columns": consume_poll_columns,
           "poll": consume_poll}


# --- one run ---------------------------------------------------------------------------------

Figures = dict[str, dict[str, list[float]]]  # contender -> {"mb_s", "client_cpu", "broker_cpu"}


def _empty(names: tuple[str, ...]) -> Figures:
    return {n: {"mb_s": [], "client_cpu": [], "broker_cpu": []} for n in names}


def _record(figures: Figures, name: str, mb: float, seconds: float, client: float,
            broker: float) -> str:
    figures[name]["mb_s"].append(mb / seconds)
    figures[name]["client_cpu"].append(client)
    figures[name]["broker_cpu"].append(broker)
    return (f"{name:12s} {mb / seconds:7.1f} MB/s   client CPU {client:6.2f} s   "
            f"broker CPU {broker:6.2f} s")


def run_round(broker: BrokerProcess, r: int, size: int, records: int, topics: int,
              chunk: int, producers: tuple[str, ...], consumers: tuple[str, ...],
              produced: Figures, consumed: Figures) -> None:
    bootstrap = broker.bootstrap_servers
    assert broker.pid is not None
    value = os.urandom(size)
    mb = records * size / 1e6
    admin = AdminClient({"bootstrap.servers": bootstrap})
    written: dict[str, Partitions] = {}
    try:
        for name in (producers if r % 2 == 0 else producers[::-1]):
            names = [f"bench-{name}-{uuid.uuid4().hex[:8]}" for _ in range(topics)]
            for f in admin.create_topics([NewTopic(t, PARTITIONS, 1) for t in names]).values():
                f.result(30)
            written[name] = [(t, p) for t in names for p in range(PARTITIONS)]
            os.sync()  # no contender pays for the write-back of another's data
            client, brk = client_cpu(), process_cpu(broker.pid)
            seconds = PRODUCE[name](bootstrap, written[name], records, value, chunk)
            line = _record(produced, name, mb, seconds, client_cpu() - client,
                           process_cpu(broker.pid) - brk)
            print(f"round {r + 1} {size:6d} B produce {line}", flush=True)
        source = written.get("confluent") or next(iter(written.values()))
        for name in (consumers if r % 2 == 0 else consumers[::-1]):
            client, brk = client_cpu(), process_cpu(broker.pid)
            seconds = CONSUME[name](bootstrap, source, records)
            line = _record(consumed, name, mb, seconds, client_cpu() - client,
                           process_cpu(broker.pid) - brk)
            print(f"round {r + 1} {size:6d} B consume {line}", flush=True)
    finally:
        all_topics = sorted({t for parts in written.values() for t, _ in parts})
        if all_topics:
            for f in admin.delete_topics(all_topics).values():
                f.result(30)


def summary(size: int, phase: str, figures: Figures) -> list[str]:
    lines = []
    ref = figures.get("confluent")
    ref_mb = statistics.median(ref["mb_s"]) if ref and ref["mb_s"] else None
    ref_cpu = statistics.median(ref["client_cpu"]) if ref and ref["client_cpu"] else None
    for name, f in figures.items():
        if not f["mb_s"]:
            continue
        mb_s = statistics.median(f["mb_s"])
        cpu = statistics.median(f["client_cpu"])
        line = (f"{size:6d} B {phase} median {name:12s} {mb_s:7.1f} MB/s   client CPU "
                f"{cpu:6.2f} s   broker CPU {statistics.median(f['broker_cpu']):6.2f} s")
        if ref_mb and name != "confluent":
            assert ref_cpu is not None
            line += f"   ours/confluent {mb_s / ref_mb:5.2f} (client CPU x{cpu / ref_cpu:.1f})"
        lines.append(line)
    return lines


def plot(results: dict[int, dict[str, Figures]], path: Path, title: str) -> str:
    try:
        import matplotlib
    except ImportError:
        return ("matplotlib is missing: no plot (.venv/bin/pip install -e '.[bench]')")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted(results)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5), sharey=True)
    styles = {"confluent": ("confluent-kafka", "tab:gray", "s", "-"),
              "send_batch": ("oncelog send_batch (bulk)", "tab:blue", "o", "-"),
              "send": ("oncelog send (per record)", "tab:blue", "o", ":"),
              "poll_columns": ("oncelog poll_columns (bulk)", "tab:orange", "o", "-"),
              "poll": ("oncelog poll (per record)", "tab:orange", "o", ":")}
    for ax, phase in zip(axes, ("produce", "consume"), strict=True):
        names = list(dict.fromkeys(n for s in sizes for n in results[s][phase]))
        for name in names:
            xs = [s for s in sizes if results[s][phase].get(name, {}).get("mb_s")]
            runs = [results[s][phase][name]["mb_s"] for s in xs]
            med = [statistics.median(v) for v in runs]
            err = [[m - min(v) for m, v in zip(med, runs, strict=True)],
                   [max(v) - m for m, v in zip(med, runs, strict=True)]]
            label, color, marker, line = styles.get(name, (name, None, "o", "-"))
            ax.errorbar(xs, med, yerr=err, label=label, color=color, marker=marker,
                        linestyle=line, capsize=3)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("value size (bytes)")
        ax.set_title(phase)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_ylabel("MB/s (values; median of the rounds, bars min-max)")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return f"plot written to {path}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--size", type=int, default=1024, help="value size in bytes")
    ap.add_argument("--sizes", default=None,
                    help="comma-separated value sizes to sweep (each with the data volume of "
                    "--records x --size), instead of --size")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--topics", type=int, default=None,
                    help=f"topics of {PARTITIONS} partitions (default: enough for at most "
                    "~4 MB per partition)")
    ap.add_argument("--chunk", type=int, default=10_000,
                    help="records of a topic per send_batch call")
    ap.add_argument("--producers", default=",".join(PRODUCERS),
                    help=f"produce contenders, of {','.join(PRODUCERS)}")
    ap.add_argument("--consumers", default=",".join(CONSUMERS),
                    help=f"consume contenders, of {','.join(CONSUMERS)}")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a broker setting (repeatable)")
    ap.add_argument("--ours", action="append", default=[], metavar="KEY=VALUE",
                    help="a setting of our Producer (repeatable), e.g. batch.size=1000000 "
                    "(librdkafka's default; ours is Kafka's, 16384)")
    ap.add_argument("--plot", type=Path, default=None, metavar="PATH",
                    help="PNG of MB/s against value size (and PATH.json with the figures)")
    args = ap.parse_args(argv)
    producers = tuple(n for n in args.producers.split(",") if n)
    consumers = tuple(n for n in args.consumers.split(",") if n)
    for n in producers:
        if n not in PRODUCE:
            ap.error(f"unknown producer {n!r}")
    for n in consumers:
        if n not in CONSUME:
            ap.error(f"unknown consumer {n!r}")
    if not producers:
        ap.error("at least one producer (the consumers read what it wrote)")
    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else [args.size]
    volume = args.records * args.size
    settings = dict(s.split("=", 1) for s in args.set)
    OURS.update(s.split("=", 1) for s in args.ours)
    results: dict[int, dict[str, Figures]] = {}
    header = (f"{args.rounds} rounds; producer {PRODUCER_CONFIG}; send_batch {args.chunk} "
              f"records a call; our producer {OURS or 'default'}; broker settings "
              f"{settings or 'default'}; "
              f"confluent-kafka {confluent_kafka.__version__} "
              f"(librdkafka {confluent_kafka.libversion()[0]})")
    print(header)
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="oncelog-bench-")))
        broker = stack.enter_context(BrokerProcess(tmp / "data", settings=settings))
        for size in sizes:
            records = args.records if len(sizes) == 1 else max(1, round(volume / size))
            topics = args.topics or max(1, math.ceil(records * (size + 70)
                                                     / MAX_PARTITION_BYTES / PARTITIONS))
            print(f"{records} records x {size} B = {records * size / 1e6:.0f} MB per round over "
                  f"{topics} topics x {PARTITIONS} partitions", flush=True)
            produced, consumed = _empty(producers), _empty(consumers)
            results[size] = {"produce": produced, "consume": consumed,
                             "records": records, "topics": topics}  # type: ignore[dict-item]
            for r in range(args.rounds):
                run_round(broker, r, size, records, topics, args.chunk, producers, consumers,
                          produced, consumed)
    print()
    for size in sizes:
        for phase in ("produce", "consume"):
            for line in summary(size, phase, results[size][phase]):
                print(line)
    if args.plot is not None:
        data = {"command": "benchmarks/bench_client.py " + " ".join(
                    sys.argv[1:] if argv is None else argv),
                "header": header, "sizes": {str(s): results[s] for s in sizes}}
        json_path = args.plot.with_suffix(".json")
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(data, indent=1) + "\n")
        print(f"figures written to {json_path}")
        print(plot(results, args.plot, f"oncelog's client beside confluent-kafka, one oncelog "
                   f"broker, idempotent acks=all, {volume / 1e6:.0f} MB per point"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
