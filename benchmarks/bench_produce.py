"""Produce and consume throughput of a confluent-kafka client against oncelog and against
librdkafka's built-in mock cluster, alternating, in one run.

    .venv/bin/python benchmarks/bench_produce.py [--records 100000] [--size 1024] [--rounds 3]
        [--baseline CHECKOUT]
    .venv/bin/python benchmarks/bench_produce.py --sweep size|partitions [--mb 64] [--rounds 3]
        [--points 100,1000,...] [--plot PNG] [--json PATH] [--consumer-set KEY=VALUE]

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

Sweeps (``--sweep``): the same measurement at several points, each point with the same payload
(``--mb``, default 64 MB of values; records = MB / value size), every contender at every point
in every round (rounds outermost, contenders alternating their order), after one untimed
warm-up round each:

- ``--sweep size``: values of 100, 1,000, 10,000 and 100,000 bytes over ``--partitions``
  partitions (default 32: 8 topics x 4, the layout above);
- ``--sweep partitions``: 1, 4, 16, 64 and 256 partitions (the first n of topics of 4, the
  only layout the mock has: 1 is partition 0 of one topic, 256 are 64 topics x 4) of
  ``--size`` byte values.

Where the payload would put more than 4 MB in a partition (few partitions), a point runs in
passes: the payload in equal turns, each over topics of its own (created untimed), produced by
one producer, each consumed by a consumer made just before it; the figure is the point's
payload over the sum of the passes' times (so 1 partition measures bursts of ~4 MB, each with
its own final flush and first fetch). Each pass keeps the per-partition warm-up of a single run.
``--points`` replaces the default points. The run prints every round's figures, then per point
the median and min-max of the rounds and oncelog/mock; ``--json PATH`` writes every figure
(and the broker's CPU seconds per phase, the versions, the command), ``--plot PNG`` two panels
(produce, consume) of MB/s against the swept quantity, both axes logarithmic, one line per
contender at the median, whiskers from the slowest to the fastest round, each oncelog point
labelled with oncelog/mock; it needs matplotlib (``.venv/bin/pip install -e '.[bench]'``).
With the defaults each sweep takes about half a minute on a 2-core machine.

``--consumer-set KEY=VALUE`` gives every contender's consumer a librdkafka setting (none by
default). With 100 B values (640,000 records a point) the consumer fetches faster than Python
takes the records; once its local queue is full, librdkafka waits fetch.queue.backoff.ms (1 s)
before the next Fetch, and those waits were most of the point's time for both contenders
(against oncelog: 2.4 s with them, 0.6 s without). ``--consumer-set fetch.queue.backoff.ms=10``
removes them. The single measurement (100,000 records of 1 KiB) never waited so.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import math
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import confluent_kafka
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
from oncelog.harness.broker_process import BrokerProcess

PRODUCER_CONFIG = {"enable.idempotence": True, "acks": "all"}
CONSUMER_CONFIG: dict[str, str] = {}  # librdkafka's defaults unless --consumer-set
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
    cpu_start = process_cpu()
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
    CLIENT_CPU["produce"] += process_cpu() - cpu_start
    assert left == 0 and not failed, (left, failed[:3])
    return elapsed


def new_consumer(bootstrap: str) -> Consumer:
    # auto.offset.reset=error: a partition whose first records the broker dropped (the mock
    # keeps ~5 MB of each) fails the round instead of skipping to the end. (A watermark query
    # per partition afterwards waited behind the consumer's long-polling Fetch: 0.5 s each.)
    return Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4()}",
                     "enable.auto.commit": False, "auto.offset.reset": "error",
                     **CONSUMER_CONFIG})


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
        cpu_start = process_cpu()
        seconds += consume(consumer, partitions, records)
        CLIENT_CPU["consume"] += process_cpu() - cpu_start
        consumer.close()
    return seconds


# This process's CPU seconds in the timed parts of the last round: librdkafka's threads, and
# for the mock its broker thread too (the mock runs inside the client).
CLIENT_CPU = {"produce": 0.0, "consume": 0.0}


def process_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


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


SWEEPS = {"size": (100, 1000, 10_000, 100_000),  # value bytes
          "partitions": (1, 4, 16, 64, 256)}
RECORD_OVERHEAD = 70  # bytes a record adds in a batch, at most (for the mock's limit)


def sweep_point(sweep: str, x: int, args: argparse.Namespace) -> dict:
    """One point's layout: value size, partitions, and the passes (each over topics of its
    own) that keep every partition of the mock under MAX_PARTITION_BYTES."""
    size, partitions = (x, args.partitions) if sweep == "size" else (args.size, x)
    total = max(1, round(args.mb * 1e6 / size))
    passes = max(1, math.ceil(total * (size + RECORD_OVERHEAD)
                              / (partitions * MAX_PARTITION_BYTES)))
    records = math.ceil(total / passes)  # per pass
    return {sweep: x, "size": size, "partitions": partitions, "passes": passes,
            "records_per_pass": records, "mb": records * passes * size / 1e6}


def run_sweep(args: argparse.Namespace, settings: dict[str, str]) -> int:
    points = [sweep_point(args.sweep, x, args) for x in (args.points or SWEEPS[args.sweep])]
    names = ["oncelog"] + (["baseline"] if args.baseline else []) + ["mock"]
    for point in points:
        point.update({name: {"produce": [], "consume": []} | (
            {"broker_cpu_produce": [], "broker_cpu_consume": []} if name != "mock" else {})
            for name in names})
    fixed = (f"{args.partitions} partitions" if args.sweep == "size"
             else f"{args.size} B values")
    print(f"sweep {args.sweep}: {[p[args.sweep] for p in points]}, {fixed}, ~{args.mb:g} MB "
          f"per point, {args.rounds} rounds; producer {PRODUCER_CONFIG}; "
          f"oncelog settings {settings or 'default'}"
          + (f"; consumer {CONSUMER_CONFIG}" if CONSUMER_CONFIG else "")
          + (f"; baseline {args.baseline}" if args.baseline else ""), flush=True)
    started = time.perf_counter()
    with contextlib.ExitStack() as stack:
        brokers = start_brokers(stack, settings, args.baseline)
        # Not counted: a broker's first Fetch took 0.1-0.25 s (imports, first reads), which
        # the first point (a few MB over 1 partition) would carry alone.
        for name in names:
            run_round(name, brokers, MOCK_PARTITIONS, 1, 1000, os.urandom(1000),
                      {"produce": [], "consume": []})
        # Rounds outermost: a spell of load on the machine touches every point a little
        # rather than one point a lot.
        for r in range(args.rounds):
            for point in points:
                value = os.urandom(point["size"])
                for name in (names if r % 2 == 0 else names[::-1]):
                    cpu: dict[str, list[float]] = {"produce": [], "consume": []}
                    p_s, c_s = run_round(name, brokers, point["partitions"], point["passes"],
                                         point["records_per_pass"], value, cpu)
                    figures = point[name]
                    figures["produce"].append(round(point["mb"] / p_s, 1))
                    figures["consume"].append(round(point["mb"] / c_s, 1))
                    used = ""
                    if cpu["produce"]:
                        figures["broker_cpu_produce"].append(round(cpu["produce"][0], 2))
                        figures["broker_cpu_consume"].append(round(cpu["consume"][0], 2))
                        used = (f"   broker CPU {cpu['produce'][0]:5.2f} s + "
                                f"{cpu['consume'][0]:5.2f} s")
                    print(f"round {r + 1} {args.sweep} {point[args.sweep]:>6} {name:8s} "
                          f"produce {point['mb'] / p_s:7.1f} MB/s   consume "
                          f"{point['mb'] / c_s:7.1f} MB/s{used}", flush=True)
    seconds = time.perf_counter() - started
    print(f"\n{args.sweep:>10}  records  passes  phase    oncelog MB/s (min-max)      mock MB/s "
          "(min-max)   oncelog/mock")
    for point in points:
        for phase in ("produce", "consume"):
            ours, mock = point["oncelog"][phase], point["mock"][phase]
            base = point["baseline"][phase] if "baseline" in point else None
            print(f"{point[args.sweep]:>10}  {point['records_per_pass'] * point['passes']:7d}  "
                  f"{point['passes']:6d}  {phase:7s} {statistics.median(ours):7.1f} "
                  f"({min(ours):6.1f}-{max(ours):6.1f})   {statistics.median(mock):7.1f} "
                  f"({min(mock):6.1f}-{max(mock):6.1f})   "
                  f"{statistics.median(ours) / statistics.median(mock):5.2f}"
                  + (f"   baseline {statistics.median(base):7.1f}   oncelog/baseline "
                     f"{statistics.median(ours) / statistics.median(base):5.2f}"
                     if base is not None else ""))
    print(f"sweep took {seconds:.0f} s")
    report = {
        "benchmark": "benchmarks/bench_produce.py", "command": sys.argv[1:],
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": platform.node(), "cpus": os.cpu_count(), "commit": checkout_commit(),
        "confluent_kafka": importlib.metadata.version("confluent-kafka"),
        "librdkafka": confluent_kafka.libversion()[0],
        "producer": PRODUCER_CONFIG, "consumer": CONSUMER_CONFIG,
        "oncelog_settings": settings, "sweep": args.sweep,
        "mb_per_point": args.mb, "rounds": args.rounds, "seconds": round(seconds, 1),
        "unit": "payload MB (10^6 bytes of values) per second; broker CPU in seconds",
        "points": [point | {
            f"{name}_median": {phase: statistics.median(point[name][phase])
                               for phase in ("produce", "consume")} for name in names}
            for point in points]}
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1) + "\n")
        print(f"figures written to {args.json}")
    if args.plot is not None:
        plot_sweep(report, names, args.plot)
        print(f"plot written to {args.plot}")
    return 0


def checkout_commit() -> str:
    try:
        return subprocess.run(["git", "-C", str(Path(__file__).resolve().parent), "describe",
                               "--always", "--dirty"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


COLOURS = {"oncelog": "#d95f02", "baseline": "#999999", "mock": "#7570b3"}
Y_TICKS = (10, 20, 30, 50, 70, 100, 200, 300, 500, 700, 1000, 2000, 3000, 5000)  # MB/s


def plot_sweep(report: dict, names: list[str], path: Path) -> None:
    """Produce and consume MB/s against the swept quantity, one line per contender: the
    median of the rounds, whiskers from the slowest to the fastest round."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sweep, points = report["sweep"], report["points"]
    xs = [p[sweep] for p in points]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.8), dpi=100)
    for ax, phase in zip(axes, ("produce", "consume"), strict=True):
        for name in names:
            rounds = [p[name][phase] for p in points]
            medians = [statistics.median(r) for r in rounds]
            ax.errorbar(xs, medians, yerr=[[m - min(r) for m, r in zip(medians, rounds)],
                                           [max(r) - m for m, r in zip(medians, rounds)]],
                        marker="o", capsize=4, color=COLOURS[name],
                        label="librdkafka mock" if name == "mock" else name)
        for x, p in zip(xs, points, strict=True):
            ratio = (statistics.median(p["oncelog"][phase])
                     / statistics.median(p["mock"][phase]))
            ax.annotate(f"{ratio:.2f}", (x, statistics.median(p["oncelog"][phase])),
                        xytext=(6, -13), textcoords="offset points", ha="left",
                        fontsize=8, color=COLOURS["oncelog"])
        ax.set_xscale("log")
        # log MB/s too: a ratio is the same distance at 50 MB/s as at 1,000
        ax.set_yscale("log")
        ax.set_xticks(xs, [tick_label(sweep, p) for p in points])
        low, high = ax.get_ylim()
        ax.set_yticks([t for t in Y_TICKS if low <= t <= high], minor=False)
        ax.yaxis.set_major_formatter(matplotlib.ticker.StrMethodFormatter("{x:,.0f}"))
        ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        ax.set_xlabel("value size" if sweep == "size" else "partitions")
        ax.set_ylabel(f"{phase} MB/s (payload)")
        ax.set_title(phase)
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=8)
    first = points[0]
    fixed = (f"{first['partitions']} partitions" if sweep == "size"
             else f"{first['size']} B values")
    fig.suptitle(
        f"confluent-kafka {report['confluent_kafka']} (librdkafka {report['librdkafka']}), "
        f"idempotent, acks=all: oncelog broker beside librdkafka's mock; {fixed}, "
        f"{report['mb_per_point']:g} MB of values per point\n"
        f"median of {report['rounds']} rounds, whiskers min-max, labels oncelog/mock; "
        f"oncelog {report['commit']}, {report['host']} ({report['cpus']} CPUs), "
        f"{report['date'][:10]}"
        + "".join(f"; {who} {', '.join(f'{k}={v}' for k, v in config.items())}"
                  for who, config in (("consumer", report["consumer"]),
                                      ("oncelog", report["oncelog_settings"])) if config)
        + ("\npasses: the payload in turns, each over topics of its own, at most 4 MB per "
           "partition (the mock keeps ~5 MB of a partition); the figure is over all passes"
           if any(p["passes"] > 1 for p in points) else ""), fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def tick_label(sweep: str, point: dict) -> str:
    if sweep == "size":
        x = point["size"]
        label = f"{x / 1000:g} KB" if x >= 1000 else f"{x} B"
    else:
        label = str(point["partitions"])
    # passes: the mock keeps ~5 MB of a partition, so few partitions take the payload in turns
    return label + (f"\n{point['passes']} passes" if point["passes"] > 1 else "")


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
    ap.add_argument("--consumer-set", action="append", default=[], metavar="KEY=VALUE",
                    help="a librdkafka setting for every contender's consumer (repeatable)")
    ap.add_argument("--producer-set", action="append", default=[], metavar="KEY=VALUE",
                    help="a librdkafka setting for every contender's producer (repeatable), "
                    "say compression.type=zstd")
    ap.add_argument("--baseline", type=Path, default=None, metavar="CHECKOUT",
                    help="another oncelog checkout whose broker runs too, as 'baseline'")
    ap.add_argument("--sweep", choices=sorted(SWEEPS), default=None,
                    help="measure every point of a sweep (see above) instead of one layout")
    ap.add_argument("--points", type=lambda s: [int(x) for x in s.split(",")], default=None,
                    help="the sweep's points, comma-separated (default: "
                    + "; ".join(f"{k} {','.join(map(str, v))}" for k, v in SWEEPS.items())
                    + ")")
    ap.add_argument("--mb", type=float, default=64.0,
                    help="sweep: payload MB (10^6 bytes of values) per point and round")
    ap.add_argument("--partitions", type=int, default=32,
                    help="sweep size: partitions (default 32: 8 topics x 4)")
    ap.add_argument("--plot", type=Path, default=None, metavar="PNG",
                    help="sweep: plot the figures to this PNG (needs matplotlib)")
    ap.add_argument("--json", type=Path, default=None, metavar="PATH",
                    help="sweep: write every figure to this JSON file")
    args = ap.parse_args(argv)
    CONSUMER_CONFIG.update(s.split("=", 1) for s in args.consumer_set)
    PRODUCER_CONFIG.update(s.split("=", 1) for s in args.producer_set)
    if args.baseline is not None and not (args.baseline / "src" / "oncelog").is_dir():
        ap.error(f"{args.baseline} is not an oncelog checkout (no src/oncelog)")
    if args.sweep is None and (args.plot or args.json):
        ap.error("--plot and --json go with --sweep")
    if args.sweep is not None:
        if args.topics is not None:
            ap.error("--topics is for a single layout; a sweep sets its own (--partitions)")
        if args.plot is not None:
            try:
                import matplotlib  # noqa: F401
            except ImportError:
                ap.error("--plot needs matplotlib: .venv/bin/pip install -e '.[bench]'")
        return run_sweep(args, dict(s.split("=", 1) for s in args.set))
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
          + (f"; consumer {CONSUMER_CONFIG}" if CONSUMER_CONFIG else "")
          + (f"; baseline {args.baseline}" if args.baseline else ""))
    client_cpu: dict[str, dict[str, list[float]]] = {}  # client + broker CPU per round
    with contextlib.ExitStack() as stack:
        brokers = start_brokers(stack, settings, args.baseline)
        for r in range(args.rounds):
            # Every other round in the reverse order, so that no contender always runs right
            # after another's writes.
            for name in (names if r % 2 == 0 else names[::-1]):
                CLIENT_CPU.update(produce=0.0, consume=0.0)
                p_s, c_s = run_round(name, brokers, topics * MOCK_PARTITIONS, 1, args.records,
                                     value, cpu[name])
                results[name]["produce"].append(mb / p_s)
                results[name]["consume"].append(mb / c_s)
                used = (f"   broker CPU {cpu[name]['produce'][-1]:5.2f} s + "
                        f"{cpu[name]['consume'][-1]:5.2f} s" if name in brokers
                        else "   (the mock's CPU is the client's)")
                for phase in ("produce", "consume"):
                    client_cpu.setdefault(name, {}).setdefault(phase, []).append(
                        CLIENT_CPU[phase] + (cpu[name][phase][-1] if name in brokers else 0))
                used = (f"   client CPU {CLIENT_CPU['produce']:5.2f} s + "
                        f"{CLIENT_CPU['consume']:5.2f} s" + used)
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
    # What the two cores had to do per MB: client plus broker (the mock's broker is a thread
    # of the client process, so its client figure holds both).
    for phase in ("produce", "consume"):
        print(f"{phase:8s} client+broker CPU per MB, median: " + "   ".join(
            f"{name} {statistics.median(client_cpu[name][phase]) / mb * 1000:5.2f} ms"
            for name in names))
    return 0


if __name__ == "__main__":
    sys.exit(main())
