"""The Spark exactly-once sink job as a fault workload (issue 31, workload ``spark``).

Producers write unique integers to an input topic; a Spark Structured Streaming job (PySpark,
local mode, a driver process of its own) copies the input topic to the output topic with the
exactly-once ``oncelog`` sink, partition N to partition N; the faults kill brokers, the network
and the job's driver (SIGKILL of its whole process group: the Python driver, Spark's JVM, its
Python workers), and the job, started again from its checkpoint, must leave every committed
input value in its output partition exactly once and nothing else there.

Three commands, each a process of its own (the fault runner prefixes them with
``ip netns exec NS`` to run them on a client host)::

    python -m oncelog.faults.spark_job produce --bootstrap-server B --topic in --partitions 2 \\
        --index 1 [--txn] [--time S | --ops N] [--rate R] [--history FILE]
    python -m oncelog.faults.spark_job job --bootstrap-server B --input in --output out \\
        --checkpoint DIR
    python -m oncelog.faults.spark_job drain --bootstrap-server B --keys in:0,in:1,out:0,out:1 \\
        [--process drain-0] [--history FILE]

``produce`` and ``drain`` write the queue history of the design (one JSON object per line,
flushed per line, ``time`` from ``time.monotonic_ns()``): ``produce`` a ``txn`` op per
transaction (``--txn``, our client's transactions) or a ``send`` op per record (idempotent
producer); ``drain`` an ``assign``, its ``poll`` ops (read_committed, from the beginning) and
the ``drain_end`` meta line. ``meta(...)`` is the history's first line (``copies``: input key ->
output key). ``SparkCopyJob`` drives the job's driver process for the runner.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import IO, Any

__all__ = ["WORKER_START_TIMEOUT", "SparkCopyJob", "SparkJobError", "create_topics", "drain_argv", "meta",
           "produce_argv", "read_history"]

# Spark's JVM: a small fixed heap, the C1 compiler only and the serial collector (the job's
# data is small; C2 and parallel GC threads would take CPU from the brokers under test).
QUICK_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
DRIVER_MEMORY = "512m"
# What Spark says when its driver-side Python worker (a Python data source's planner) did not
# connect back within its fixed 10 s (PythonWorkerFactory; not configurable in Spark 4.3): the
# host's load, before any of the data source's code ran.
WORKER_START_TIMEOUT = "Timed out while waiting for the Python worker to connect back"
VALUE_RANGE = 10**9  # a producer's values: index * VALUE_RANGE + counter


class SparkJobError(RuntimeError):
    """The job's driver died on its own, or did not get where it was asked to in time."""


# -- history -----------------------------------------------------------------------------------


def meta(input_topic: str, output_topic: str, partitions: int) -> dict[str, Any]:
    """The history's first line for this workload: every input key and output key, and which
    output key each input key is copied to (the same partition number)."""
    copies = {f"{input_topic}:{p}": f"{output_topic}:{p}" for p in range(partitions)}
    return {"type": "meta", "workload": "spark", "keys": [*copies, *copies.values()],
            "copies": copies}


class HistoryFile:
    """A client process's history: one JSON object per line, each flushed at once (a SIGKILL
    leaves every line written before it)."""

    def __init__(self, path: str | os.PathLike[str], process: str) -> None:
        self.process = process
        self._f: IO[str] = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
        self._lock = threading.Lock()

    def write(self, line: dict[str, Any]) -> None:
        with self._lock:
            self._f.write(json.dumps(line, separators=(",", ":")) + "\n")
            self._f.flush()

    def op(self, type_: str, f: str, value: Any, txn: bool = False, **extra: Any) -> None:
        line = {"type": type_, "f": f, "process": self.process, "time": time.monotonic_ns(),
                "value": value}
        if txn:
            line["txn"] = True
        line.update(extra)
        self.write(line)

    def close(self) -> None:
        self._f.close()


def read_history(paths: Iterable[str | os.PathLike[str]]) -> list[dict[str, Any]]:
    """The lines of the given history files, in time order (meta lines first)."""
    ops: list[dict[str, Any]] = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            ops += [json.loads(line) for line in f if line.strip()]
    return sorted(ops, key=lambda op: (op.get("type") != "meta" or op.get("f") is not None,
                                       op.get("time", 0)))


def _key(topic: str, partition: int) -> str:
    return f"{topic}:{partition}"


def _parse_key(key: str) -> tuple[str, int]:
    topic, _, partition = key.rpartition(":")
    return topic, int(partition)


def _decode(value: bytes | None) -> Any:
    """A record's value as the history shows it: the integer it holds (anything else, which
    this workload never writes, as text, so that a checker sees it as foreign)."""
    if value is None:
        return None
    text = value.decode(errors="replace")
    try:
        return int(text)
    except ValueError:
        return text


# -- commands for the runner --------------------------------------------------------------------


def _module_argv(python: str, command: str, args: Sequence[str]) -> list[str]:
    return [python, "-m", "oncelog.faults.spark_job", command, *args]


def produce_argv(bootstrap: str, topic: str, partitions: int, index: int, history: str,
                 *, txn: bool = False, process: str | None = None,
                 transactional_id: str | None = None, seconds: float | None = None,
                 ops: int | None = None, rate: float = 50.0, seed: int | None = None,
                 python: str = sys.executable) -> list[str]:
    """The argv of a producer process (``produce``). ``index`` picks its values (index * 10**9
    + counter: disjoint between processes) and its default name ``oncelog-{index}``; a process
    that replaces a crashed one takes a new index (and name) and, with ``txn``, the same
    ``transactional_id``."""
    args = ["--bootstrap-server", bootstrap, "--topic", topic, "--partitions", str(partitions),
            "--index", str(index), "--history", str(history), "--rate", str(rate)]
    if txn:
        args.append("--txn")
    if process is not None:
        args += ["--process", process]
    if transactional_id is not None:
        args += ["--transactional-id", transactional_id]
    if seconds is not None:
        args += ["--time", str(seconds)]
    if ops is not None:
        args += ["--ops", str(ops)]
    if seed is not None:
        args += ["--seed", str(seed)]
    return _module_argv(python, "produce", args)


def drain_argv(bootstrap: str, keys: Sequence[str], history: str, process: str = "drain-0",
               timeout: float = 60.0, python: str = sys.executable) -> list[str]:
    """The argv of the final drain (``drain``): every key read from the beginning,
    read_committed, into ``history`` as ``process``."""
    return _module_argv(python, "drain", [
        "--bootstrap-server", bootstrap, "--keys", ",".join(keys), "--history", str(history),
        "--process", process, "--timeout", str(timeout)])


def create_topics(bootstrap: str, input_topic: str, output_topic: str, partitions: int,
                  replication_factor: int = 3, min_insync_replicas: int = 2) -> None:
    """The input and output topics, each with ``replication_factor`` replicas and
    ``min_insync_replicas``. (The sink's batch markers are group offsets, kept by the group
    coordinator; the sink creates the topic they are committed for itself.)"""
    from ..client import Admin, NewTopic
    from ..errors import TopicAlreadyExistsError

    config = {"min.insync.replicas": str(min_insync_replicas)}
    with Admin(bootstrap_servers=bootstrap) as admin:
        for name in (input_topic, output_topic):
            with contextlib.suppress(TopicAlreadyExistsError):
                admin.create_topics([NewTopic(name, partitions,
                                              replication_factor=replication_factor,
                                              config=config)])


# -- the producer process -----------------------------------------------------------------------


class _Stop:
    """Set by SIGTERM / SIGINT: the process ends after the operation under way."""

    def __init__(self) -> None:
        self.event = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self.event.set())

    def __bool__(self) -> bool:
        return self.event.is_set()


def _producer_config(args: argparse.Namespace) -> dict[str, Any]:
    config: dict[str, Any] = {
        "bootstrap.servers": args.bootstrap_server, "acks": "all", "linger.ms": 1,
        "request.timeout.ms": args.request_timeout_ms, "max.block.ms": 10_000,
        "delivery.timeout.ms": 30_000, "retry.backoff.ms": 100,
        "reconnect.backoff.ms": 50, "reconnect.backoff.max.ms": 500}
    if args.txn:
        config["transactional.id"] = args.transactional_id or f"spark-producer-{args.index}"
        config["transaction.timeout.ms"] = args.transaction_timeout_ms
    else:
        config["enable.idempotence"] = True
    return config


def _produce(args: argparse.Namespace) -> int:
    from ..client import Producer

    stop = _Stop()
    process = args.process or f"oncelog-{args.index}"
    history = HistoryFile(args.history or f"history-{process}.jsonl", process)
    rng = random.Random(args.seed if args.seed is not None else args.index)
    counter = 0
    counts = {"ok": 0, "fail": 0, "info": 0}
    deadline = None if args.time is None else time.monotonic() + args.time
    producer: Any = None

    def fresh_producer() -> Any:
        """A producer, its transactions registered (retried while the cluster cannot: a new
        InitProducerId with the same transactional.id also fences and aborts what the last
        one left open)."""
        while not stop and (deadline is None or time.monotonic() < deadline):
            p = Producer(_producer_config(args))
            if not args.txn:
                return p
            try:
                p.init_transactions(timeout=args.request_timeout_ms / 1000 * 3)
                return p
            except Exception as exc:  # noqa: BLE001 - any failure: try again with a new one
                print(f"init_transactions: {type(exc).__name__}: {exc}", file=sys.stderr,
                      flush=True)
                with contextlib.suppress(Exception):
                    p.close(timeout=1)
                time.sleep(0.5)
        return None

    def done(n: int) -> bool:
        return bool(stop) or (args.ops is not None and n >= args.ops) or \
            (deadline is not None and time.monotonic() >= deadline)

    op_count = 0
    next_at = time.monotonic()
    try:
        while not done(op_count):
            if producer is None:
                producer = fresh_producer()
                if producer is None:
                    break
            size = rng.randint(1, args.max_txn_size) if args.txn else 1
            sends = []
            for _ in range(size):
                sends.append((rng.randrange(args.partitions),
                              args.index * VALUE_RANGE + counter))
                counter += 1
            invoke = [["send", _key(args.topic, p), v] for p, v in sends]
            f = "txn" if args.txn else "send"
            history.op("invoke", f, invoke, txn=args.txn)
            outcome, value = _one_op(producer, args, sends)
            history.op(outcome, f, value if outcome == "ok" else invoke, txn=args.txn)
            counts[outcome] += 1
            op_count += 1
            if outcome != "ok" and args.txn:
                # A transaction in an unknown state: start over with a new producer (its
                # InitProducerId aborts what this one left open).
                with contextlib.suppress(Exception):
                    producer.close(timeout=1)
                producer = None
            next_at = max(next_at + 1 / args.rate, time.monotonic() - 1)
            delay = next_at - time.monotonic()
            if delay > 0:
                stop.event.wait(delay)
    finally:
        if producer is not None:
            with contextlib.suppress(Exception):
                producer.close(timeout=5)
        history.close()
    print(f"{process}: ok {counts['ok']}, fail {counts['fail']}, info {counts['info']}",
          flush=True)
    return 0


def _one_op(producer: Any, args: argparse.Namespace,
            sends: list[tuple[int, int]]) -> tuple[str, Any]:
    """One op: its outcome (ok / fail / info) and, when ok, its completed micro-ops."""
    timeout = args.request_timeout_ms / 1000 * 3
    if not args.txn:
        (partition, value), = sends
        try:
            md = producer.send(args.topic, str(value).encode(), partition=partition).result(
                timeout=35)
        except Exception as exc:  # noqa: BLE001 - written or not: unknown
            print(f"send: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            return "info", None
        return "ok", [["send", _key(args.topic, partition), [md.offset, value]]]
    futures = []
    try:
        producer.begin_transaction()
        for partition, value in sends:
            futures.append(producer.send(args.topic, str(value).encode(), partition=partition))
    except Exception as exc:  # noqa: BLE001
        # No EndTxn(commit) was sent: the transaction can only abort.
        print(f"send in a transaction: {type(exc).__name__}: {exc}", file=sys.stderr,
              flush=True)
        with contextlib.suppress(Exception):
            producer.abort_transaction(timeout=timeout)
        return "fail", None
    try:
        producer.commit_transaction(timeout=timeout)
    except Exception as exc:  # noqa: BLE001 - the commit may have happened
        print(f"commit: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return "info", None
    done = []
    for (partition, value), fut in zip(sends, futures, strict=True):
        offset = -1
        with contextlib.suppress(Exception):
            offset = fut.result(timeout=0).offset
        done.append(["send", _key(args.topic, partition), [offset, value]])
    return "ok", done


# -- the drain ----------------------------------------------------------------------------------


def _drain(args: argparse.Namespace) -> int:
    from ..client import Consumer, TopicPartition

    keys = [k for k in args.keys.split(",") if k]
    tps = [TopicPartition(*_parse_key(k)) for k in keys]
    history = HistoryFile(args.history or f"history-{args.process}.jsonl", args.process)
    settings: dict[str, Any] = {"bootstrap.servers": args.bootstrap_server,
                                "enable.auto.commit": False, "auto.offset.reset": "earliest",
                                "request.timeout.ms": 10_000}
    deadline = time.monotonic() + args.timeout
    reached: dict[str, int] = {}
    ends: dict[str, int] = {}
    try:
        with Consumer({**settings, "isolation.level": "read_committed"}) as c, \
                Consumer({**settings, "isolation.level": "read_uncommitted"}) as hw_reader:
            history.op("invoke", "assign", keys)
            c.assign(tps)
            for tp in tps:
                c.seek(tp, 0)
            history.op("ok", "assign", keys)
            while True:
                stable = _retrying(lambda: c.end_offsets(tps, timeout=10), deadline)
                high = _retrying(lambda: hw_reader.end_offsets(tps, timeout=10), deadline)
                behind = [tp for tp in tps if c.position(tp) < stable[tp]]
                if not behind:
                    if stable == high or time.monotonic() >= deadline:
                        break
                    time.sleep(0.2)  # an open transaction holds the last stable offset back
                    continue
                if time.monotonic() >= deadline:
                    break
                while any(c.position(tp) < stable[tp] for tp in tps) and \
                        time.monotonic() < deadline:
                    start = time.monotonic_ns()
                    try:
                        records = c.poll(0.5)
                    except Exception as exc:  # noqa: BLE001 - a broker restarting: poll again
                        print(f"drain poll: {type(exc).__name__}: {exc}", file=sys.stderr,
                              flush=True)
                        time.sleep(0.2)
                        continue
                    if not records:
                        continue
                    polled: dict[str, list[list[Any]]] = {}
                    for r in records:
                        polled.setdefault(_key(r.topic, r.partition), []).append(
                            [r.offset, _decode(r.value)])
                    history.write({"type": "invoke", "f": "poll", "process": args.process,
                                   "time": start, "value": [["poll"]]})
                    history.op("ok", "poll", [["poll", polled]])
            for k, tp in zip(keys, tps, strict=True):
                reached[k] = c.position(tp)
                ends[k] = high[tp]
    finally:
        history.write({"type": "meta", "f": "drain_end", "process": args.process,
                       "time": time.monotonic_ns(),
                       "value": {k: {"reached": reached.get(k, -1), "end": ends.get(k, -1)}
                                 for k in keys}})
        history.close()
    short = {k: (reached[k], ends[k]) for k in keys if reached[k] < ends[k]}
    if short:
        print(f"drain: not read to the end (reached, high watermark): {short}",
              file=sys.stderr, flush=True)
        return 1
    return 0


def _retrying(call: Callable[[], Any], deadline: float) -> Any:
    """``call()``, again after failures (a broker restarting) until ``deadline``."""
    while True:
        try:
            return call()
        except Exception:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.3)


# -- the Spark job (the driver process) ---------------------------------------------------------


def _job(args: argparse.Namespace) -> int:
    began = time.monotonic()
    stop = _Stop()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from .. import spark as oncelog_spark

    spark = (SparkSession.builder.master(args.master).appName("oncelog-faults-spark")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.driver.memory", args.driver_memory).getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    oncelog_spark.register(spark)
    try:
        df = (spark.readStream.format("oncelog")
              .option("kafka.bootstrap.servers", args.bootstrap_server)
              .option("subscribe", args.input).option("startingOffsets", "earliest")
              .option("maxOffsetsPerTrigger", str(args.max_offsets_per_trigger)).load())
        # Partition N to partition N (the history's copies map says so), key and value as read.
        rows = df.select("key", "value", "partition").writeStream
        if args.sink == "exactly-once":
            writer = rows.format("oncelog").option("kafka.bootstrap.servers",
                                                   args.bootstrap_server).option("topic",
                                                                                 args.output)
        else:
            writer = rows.foreachBatch(_at_least_once(args.bootstrap_server, args.output))
        q = (writer.option("checkpointLocation", args.checkpoint)
             .trigger(processingTime=f"{args.trigger_ms} milliseconds").start())
        print(f"started ({time.monotonic() - began:.1f} s)", flush=True)
        seen: set[int] = set()
        quiet_since = time.monotonic()
        while q.isActive and not stop:
            for p in q.recentProgress:
                if p["batchId"] not in seen:
                    seen.add(p["batchId"])
                    quiet_since = time.monotonic()
                    print(f"batch {p['batchId']}: {p['numInputRows']} rows "
                          f"({time.monotonic() - began:.1f} s)", flush=True)
            if time.monotonic() - quiet_since > 15:  # what a slow micro-batch is doing
                quiet_since = time.monotonic()
                print(f"status: {json.dumps(q.status)} ({time.monotonic() - began:.1f} s)",
                      flush=True)
            stop.event.wait(0.1)
        failed = q.exception()
        if failed is not None:
            print(f"query failed: {failed}", file=sys.stderr, flush=True)
            return 1
        # Asked to stop: between micro-batches, so that no prepared transaction of the sink is
        # left undecided (one never times out; only the next run of the job would settle it).
        idle_by = time.monotonic() + args.stop_timeout
        while q.isActive and q.status["isTriggerActive"] and time.monotonic() < idle_by:
            time.sleep(0.02)
        q.stop()
        print("stopped", flush=True)
    finally:
        spark.stop()
    return 0


def _at_least_once(bootstrap: str, topic: str) -> Callable[[Any, int], None]:
    """foreachBatch function of ``--sink at-least-once``: each task sends its rows with a plain
    idempotent producer of our client, as Spark's own Kafka sink does; a micro-batch replayed
    after a crash is written again (duplicates: what the checks must find)."""

    def write_partition(rows: Iterable[Any]) -> None:
        from ..client import Producer

        with Producer({"bootstrap.servers": bootstrap, "linger.ms": 5}) as p:
            for r in rows:
                p.send(topic, r.value, key=r.key, partition=r.partition)
            p.flush()

    def write_batch(df: Any, batch_id: int) -> None:
        df.foreachPartition(write_partition)

    return write_batch


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _processes() -> dict[int, tuple[int, int, bytes]]:
    """Every process: pid -> (parent pid, process group, command line), from /proc."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # state, ppid, pgrp, ...
        found[int(entry)] = (int(fields[1]), int(fields[2]), cmdline)
    return found


def _descendants(root: int, table: dict[int, tuple[int, int, bytes]]) -> list[int]:
    children: dict[int, list[int]] = {}
    for pid, (ppid, _pgrp, _cmd) in table.items():
        children.setdefault(ppid, []).append(pid)
    out, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _tree_groups(root: int, table: dict[int, tuple[int, int, bytes]]) -> set[int]:
    """The process groups of group ``root`` and of every process descended from its members
    (the members too: a JVM whose driver died already has another parent now)."""
    tops = {root} | {pid for pid, (_ppid, pgrp, _cmd) in table.items() if pgrp == root}
    return {root} | {table[pid][1] for top in tops for pid in _descendants(top, table)}


def kill_tree(root: int) -> set[int]:
    """SIGKILL process ``root`` (a group leader: the driver, started in a session of its own),
    its group and every process descended from it, together with their process groups. Spark's
    JVM runs in the driver's group, but each ``pyspark.daemon`` that forks Python workers makes
    a group of its own (setpgid): those groups are found under the JVM and killed too. The
    driver's group is stopped first (SIGSTOP), so that its JVM starts no new daemon while the
    tree is read. Returns the process groups killed."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(root, signal.SIGSTOP)
    groups = _tree_groups(root, _processes())
    for pgid in groups:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
    return groups


class SparkCopyJob:
    """The copy job's driver process for a fault runner: started with ``wrap(argv)`` (the
    runner's ``ip netns exec NS`` prefix: Spark's local mode needs only the host's loopback) in
    a session of its own.

    The job reads ``input_topic`` (read_committed) and writes ``output_topic`` partition by
    partition through the exactly-once sink (``sink="at-least-once"``: plain producers in
    ``foreachBatch``, a control that duplicates on replays), checkpointing in
    ``work_dir/checkpoint``; its output goes to ``work_dir/driver.log``.

    ``start()``; ``kill()`` (SIGKILL the driver, Spark's JVM and the Python workers: a client
    crash) and ``restart()`` (kill, start from the checkpoint); ``kill_task()`` (SIGKILL the
    tasks' Python workers: Spark retries the tasks); ``wait_batches(n)``, ``wait_writing()``
    (a micro-batch in flight: the moment to kill), ``wait_caught_up(timeout)`` (the output
    holds every committed input); ``stop()``. With ``supervise`` (the default) a driver that
    ends by itself because Spark could not start a Python worker in time
    (``WORKER_START_TIMEOUT``: the host's load, not the job nor the cluster) is started again
    from its checkpoint after ``restart_delay`` seconds, as ``spark-submit --supervise``
    restarts a failed driver, at most ``max_restarts`` times: ``restarts`` lists them
    (``time``: monotonic ns, ``run``, ``reason``) and ``on_restart`` is told each. Any other
    end of its own stays an end (a failure of the job under faults, which the run must
    show). Every own end is in ``failures``. Each kill and each end is a ``crash`` line (process
    ``spark-<run>``) in ``history_dir/history-spark.jsonl``. ``batches`` counts the
    micro-batches with input rows the driver reported, over all runs; ``run`` is the number of
    the current (last) start.
    """

    def __init__(self, work_dir: str | os.PathLike[str], bootstrap: str, input_topic: str,
                 output_topic: str, partitions: int,
                 wrap: Callable[[list[str]], list[str]] = lambda argv: argv, *,
                 history_dir: str | os.PathLike[str] | None = None,
                 max_offsets_per_trigger: int = 2000, trigger_ms: int = 300,
                 master: str = "local[2,4]", driver_memory: str = DRIVER_MEMORY,
                 sink: str = "exactly-once", supervise: bool = True,
                 restart_delay: float = 2.0, python: str = sys.executable,
                 env: dict[str, str] | None = None, max_restarts: int = 5,
                 on_restart: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.work_dir = Path(work_dir)
        self.bootstrap = bootstrap
        self.input_topic = input_topic
        self.output_topic = output_topic
        self.partitions = partitions
        self.wrap = wrap
        self.history_dir = Path(history_dir) if history_dir is not None else self.work_dir
        self.max_offsets_per_trigger = max_offsets_per_trigger
        self.trigger_ms = trigger_ms
        self.master = master
        self.driver_memory = driver_memory
        if sink not in ("exactly-once", "at-least-once"):
            raise ValueError(f"sink must be exactly-once or at-least-once, not {sink!r}")
        self.sink = sink
        self.supervise = supervise
        self.restart_delay = restart_delay
        self.python = python
        self.env = dict(os.environ if env is None else env)
        self.env.setdefault("SPARK_SUBMIT_OPTS", QUICK_JVM)
        self.env.setdefault("PYSPARK_PYTHON", python)
        # Local mode talks over loopback only (py4j, the Python workers, the block manager):
        # bind there, whatever the client host's other addresses are (its namespace needs lo
        # up).
        self.env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        self.env["PYTHONUNBUFFERED"] = "1"
        self.checkpoint = self.work_dir / "checkpoint"
        self.log_path = self.work_dir / "driver.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.run = 0
        self.batches = 0  # micro-batches with rows, all runs
        self.run_batches = 0  # micro-batches with rows, this run
        self.reported = 0  # micro-batches reported, all runs
        self.started = threading.Event()
        self._reader: threading.Thread | None = None
        self.killed_groups: set[int] = set()  # the process groups of the last kill or stop
        self.failures: list[str] = []  # the driver's own exits
        self.max_restarts = max_restarts
        self.on_restart = on_restart
        self.restarts: list[dict[str, Any]] = []  # the supervised restarts
        self._cond = threading.Condition()
        self._lock = threading.Lock()
        self._wanted = False  # the driver should run (between start and kill / stop)

    # -- the command --------------------------------------------------------------------------

    def argv(self) -> list[str]:
        """The driver's command (before ``wrap``)."""
        return _module_argv(self.python, "job", [
            "--bootstrap-server", self.bootstrap, "--input", self.input_topic,
            "--output", self.output_topic, "--checkpoint", str(self.checkpoint),
            "--max-offsets-per-trigger", str(self.max_offsets_per_trigger),
            "--trigger-ms", str(self.trigger_ms), "--master", self.master,
            "--driver-memory", self.driver_memory, "--sink", self.sink])

    @property
    def process(self) -> str:
        """The current run's process name in the history."""
        return f"spark-{self.run}"

    def meta(self) -> dict[str, Any]:
        return meta(self.input_topic, self.output_topic, self.partitions)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    # -- life cycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Start the driver (from the checkpoint, if there is one)."""
        with self._lock:
            if self.running:
                raise SparkJobError("the job's driver runs already")
            self._wanted = True
            self._launch()

    def _launch(self) -> None:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.history_dir.mkdir(parents=True, exist_ok=True)
        self.run += 1
        self.run_batches = 0
        self.started.clear()
        with open(self.log_path, "ab") as log:
            log.write(f"--- run {self.run}: {' '.join(self.wrap(self.argv()))}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(self.wrap(self.argv()), stdout=subprocess.PIPE,
                                         stderr=log, stdin=subprocess.DEVNULL, env=self.env,
                                         start_new_session=True)
        self._reader = threading.Thread(target=self._read, args=(self.proc,),
                                        name=f"spark-job-{self.run}", daemon=True)
        self._reader.start()

    def _read(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        with open(self.log_path, "ab") as log:
            for raw in proc.stdout:
                log.write(raw)
                log.flush()
                line = raw.decode(errors="replace").strip()
                with self._cond:
                    if line.startswith("started"):
                        self.started.set()
                    elif line.startswith("batch "):
                        self.reported += 1
                        if ": 0 rows" not in line:
                            self.batches += 1
                            self.run_batches += 1
                    self._cond.notify_all()
        proc.wait()
        with self._cond:
            self._cond.notify_all()
        if self.supervise:
            self._supervise(proc)

    def _supervise(self, proc: subprocess.Popen[bytes]) -> None:
        """The driver ended by itself: recorded as a ``crash`` with its exit status; started
        again from its checkpoint after ``restart_delay`` if it ended for a reason a supervisor
        restarts (``restartable_exit``), as spark-submit --supervise would."""
        with self._lock:
            if not self._wanted or proc is not self.proc:
                return  # killed or stopped: not its own end
            failure = f"exit status {proc.returncode}"
            self.failures.append(f"{self.process}: {failure}")
            self._record_crash(failure)
            reason = self.restartable_exit(proc)
            if reason is None or len(self.restarts) >= self.max_restarts:
                self._wanted = False  # an end: nothing starts it again
                return
            restart = {"time": time.monotonic_ns(), "run": self.run, "reason": reason}
            self.restarts.append(restart)
        time.sleep(self.restart_delay)
        with self._lock:
            if not (self._wanted and proc is self.proc):
                return
            with open(self.log_path, "ab") as log:
                log.write(f"--- the driver ended by itself ({failure}): started again\n"
                          .encode())
            self._launch()
        if self.on_restart is not None:
            self.on_restart(restart)

    def run_log(self) -> str:
        """The driver log of the current run."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return text[text.rfind(f"--- run {self.run}: "):]

    def restartable_exit(self, proc: subprocess.Popen[bytes] | None = None) -> str | None:
        """Why the current run's driver exited, if a supervisor restarts it for that: Spark
        gave up on starting a Python worker (``WORKER_START_TIMEOUT``). None otherwise."""
        proc = proc or self.proc
        if proc is None or proc.poll() in (None, 0):
            return None
        text = self.run_log()
        if WORKER_START_TIMEOUT not in text:
            return None
        failed = next((line for line in text.splitlines() if line.startswith("query failed:")),
                      "the driver exited")
        where = " while planning (MicroBatchExecution.logicalPlan)" \
            if "MicroBatchExecution.logicalPlan" in text else ""
        return (f"run {self.run}: {failed.strip()} (exit status {proc.poll()}): Spark "
                f"timed out starting a Python worker{where}: {WORKER_START_TIMEOUT}")

    def _record_crash(self, detail: str | None) -> None:
        history = HistoryFile(self.history_dir / "history-spark.jsonl", self.process)
        try:
            history.op("info", "crash", detail)
        finally:
            history.close()

    def kill(self) -> None:
        """SIGKILL the driver, Spark's JVM and every Python process they started (the
        ``pyspark.daemon``s and their workers, in process groups of their own: ``kill_tree``),
        mid-whatever they do: a client crash. Recorded as a ``crash`` of the run's process.
        Returns when all of them are gone."""
        with self._lock:
            self._wanted = False
            proc = self.proc
            if proc is None:
                return
            if proc.poll() is None:
                self._record_crash(None)
        self._reap(proc, kill_tree(proc.pid))

    def kill_task(self) -> list[int]:
        """SIGKILL the Python workers that run the job's tasks (the children of the
        ``pyspark.daemon`` of ``pyspark.worker``; Spark reuses them from task to task), not the
        driver nor its planning workers: a task-level crash, which Spark retries as a new task
        attempt (local[2,4]: up to 4 attempts per task). Returns the pids killed (none before
        the first task)."""
        if not self.running:
            return []
        assert self.proc is not None
        table = _processes()
        killed = []
        for pid in _descendants(self.proc.pid, table):
            parent = table.get(table[pid][0])
            if parent is not None and parent[2].split(b"\0")[1:4] == \
                    [b"-m", b"pyspark.daemon", b"pyspark.worker"]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
        return killed

    def restart(self) -> None:
        """Start the driver again from the checkpoint (killing it first if it runs)."""
        self.kill()
        self.start()

    def stop(self, timeout: float = 60.0) -> None:
        """Stop the job: SIGTERM (the query stops, Spark shuts down), SIGKILL to whatever of
        the group is left after ``timeout``."""
        with self._lock:
            self._wanted = False
            proc = self.proc
        if proc is None:
            return
        pgid = proc.pid
        before: set[int] = set()
        if proc.poll() is None:
            before = _tree_groups(pgid, _processes())
            with contextlib.suppress(ProcessLookupError):
                os.kill(pgid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout)
        groups = kill_tree(pgid)
        # Python workers' groups seen before the driver ended (those whose JVM is gone have
        # another parent now), if still Spark's
        table = _processes()
        for group in before - groups:
            if any(pgrp == group and b"pyspark" in cmd for _ppid, pgrp, cmd in table.values()):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(group, signal.SIGKILL)
                groups.add(group)
        self._reap(proc, groups)

    def _reap(self, proc: subprocess.Popen[bytes], groups: set[int]) -> None:
        """Wait for the driver, then until every killed group is gone."""
        proc.wait()
        reader = self._reader
        if reader is not None and reader is not threading.current_thread():
            reader.join(10)
        deadline = time.monotonic() + 10
        while any(map(_group_alive, groups)) and time.monotonic() < deadline:
            time.sleep(0.05)
        self.killed_groups = groups

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    # -- waiting ------------------------------------------------------------------------------

    def wait_batches(self, n: int, timeout: float = 300.0) -> None:
        """Until this run of the driver has reported ``n`` micro-batches with input rows."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self.run_batches < n:
                if self._down() and self.run_batches < n:
                    raise SparkJobError(f"the driver exited ({self._exit()}):\n{self.log_tail()}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise SparkJobError(f"{self.run_batches} of {n} micro-batches in "
                                        f"{timeout:g} s:\n{self.log_tail()}")
                self._cond.wait(min(left, 0.5))

    def wait_writing(self, timeout: float = 300.0) -> None:
        """Until a micro-batch is being written: the output's high watermark (read_uncommitted)
        has grown since the last micro-batch the driver reported, so this one's records (in
        open transactions, with the exactly-once sink) or its commit markers are in the log
        and Spark has not recorded the batch as done. A kill then lands mid-batch: the replay
        must not write its rows a second time."""
        from ..client import Consumer, TopicPartition

        deadline = time.monotonic() + timeout
        tps = [TopicPartition(self.output_topic, p) for p in range(self.partitions)]
        base: tuple[int, int] | None = None
        with Consumer({"bootstrap.servers": self.bootstrap,
                       "isolation.level": "read_uncommitted"}) as c:
            while True:
                if self._down():
                    raise SparkJobError(f"the driver exited ({self._exit()}):\n"
                                        f"{self.log_tail()}")
                if time.monotonic() >= deadline:
                    raise SparkJobError(f"no micro-batch was written within {timeout:g} s:\n"
                                        f"{self.log_tail()}")
                reported = self.reported
                with contextlib.suppress(Exception):  # a broker restarting: ask again
                    high = sum(c.end_offsets(tps, timeout=5).values())
                    if reported != self.reported:
                        continue
                    if base is None or base[0] != reported:
                        base = (reported, high)
                    elif high > base[1]:
                        return
                time.sleep(0.01)

    def _down(self) -> bool:
        """The driver does not run and nothing will start it again."""
        return not self.running and not (self.supervise and self._wanted)

    def _exit(self) -> str:
        rc = self.proc.poll() if self.proc is not None else None
        return "not started" if self.proc is None else f"exit status {rc}"

    def wait_caught_up(self, timeout: float = 120.0) -> dict[str, int]:
        """Until the output holds every input value committed when called (read_committed
        reads of both topics, partition N's in output partition N); the driver must keep
        running meanwhile. Returns input key -> values copied. SparkJobError on timeout or
        when the driver died, naming how many are missing."""
        from ..client import Consumer, TopicPartition

        deadline = time.monotonic() + timeout
        settings = {"bootstrap.servers": self.bootstrap, "isolation.level": "read_committed",
                    "enable.auto.commit": False, "auto.offset.reset": "earliest"}
        want: dict[int, set[Any]] = {p: set() for p in range(self.partitions)}
        with Consumer(settings) as c:
            tps = [TopicPartition(self.input_topic, p) for p in range(self.partitions)]
            c.assign(tps)
            for tp in tps:
                c.seek(tp, 0)
            end = _retrying(lambda: c.end_offsets(tps, timeout=10), deadline)
            while any(c.position(tp) < end[tp] for tp in tps):
                if time.monotonic() >= deadline:
                    raise SparkJobError("the input could not be read to its end in time")
                for r in c.poll(0.5):
                    if r.offset < end[TopicPartition(r.topic, r.partition)]:
                        want[r.partition].add(_decode(r.value))
        missing = {p: set(v) for p, v in want.items()}
        with Consumer(settings) as c:
            tps = [TopicPartition(self.output_topic, p) for p in range(self.partitions)]
            c.assign(tps)
            for tp in tps:
                c.seek(tp, 0)
            while any(missing.values()):
                if self._down():
                    raise SparkJobError(f"the driver exited ({self._exit()}) with "
                                        f"{sum(map(len, missing.values()))} input values not "
                                        f"copied:\n{self.log_tail()}")
                if time.monotonic() >= deadline:
                    raise SparkJobError(
                        f"{sum(map(len, missing.values()))} of "
                        f"{sum(map(len, want.values()))} committed input values not in the "
                        f"output after {timeout:g} s:\n{self.log_tail()}")
                with contextlib.suppress(Exception):  # a broker restarting: poll again
                    for r in c.poll(0.5):
                        missing[r.partition].discard(_decode(r.value))
        return {_key(self.input_topic, p): len(v) for p, v in want.items()}


# -- command line -------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m oncelog.faults.spark_job",
                                 description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)

    p = sub.add_parser("produce", help="write unique integers to the input topic, with history")
    p.add_argument("--bootstrap-server", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--partitions", type=int, required=True)
    p.add_argument("--index", type=int, required=True,
                   help="values index * 10**9 + counter; name oncelog-INDEX")
    p.add_argument("--process", help="the process name in the history")
    p.add_argument("--history", help="the history file (default history-PROCESS.jsonl)")
    p.add_argument("--txn", action="store_true", help="transactions (default: idempotent sends)")
    p.add_argument("--transactional-id", help="default spark-producer-INDEX")
    p.add_argument("--max-txn-size", type=int, default=4, help="sends per transaction, at most")
    p.add_argument("--time", type=float, help="stop after this many seconds")
    p.add_argument("--ops", type=int, help="stop after this many operations")
    p.add_argument("--rate", type=float, default=50.0, help="operations per second, at most")
    p.add_argument("--seed", type=int)
    p.add_argument("--request-timeout-ms", type=int, default=5000)
    p.add_argument("--transaction-timeout-ms", type=int, default=10_000)

    d = sub.add_parser("drain", help="read keys from the beginning (read_committed) into history")
    d.add_argument("--bootstrap-server", required=True)
    d.add_argument("--keys", required=True, help="topic:partition,...")
    d.add_argument("--process", default="drain-0")
    d.add_argument("--history", help="the history file (default history-PROCESS.jsonl)")
    d.add_argument("--timeout", type=float, default=60.0)

    j = sub.add_parser("job", help="the Spark copy job's driver")
    j.add_argument("--bootstrap-server", required=True)
    j.add_argument("--input", required=True)
    j.add_argument("--output", required=True)
    j.add_argument("--checkpoint", required=True)
    j.add_argument("--max-offsets-per-trigger", type=int, default=2000)
    j.add_argument("--trigger-ms", type=int, default=300)
    j.add_argument("--master", default="local[2,4]", help="local[threads,maxFailures]")
    j.add_argument("--driver-memory", default=DRIVER_MEMORY)
    j.add_argument("--sink", choices=["exactly-once", "at-least-once"], default="exactly-once",
                   help="at-least-once: plain producers in foreachBatch, as Spark's Kafka sink "
                   "writes (a control: replays duplicate)")
    j.add_argument("--stop-timeout", type=float, default=30.0,
                   help="on SIGTERM, wait this long for the micro-batch under way to end")

    args = ap.parse_args(argv)
    if args.command == "produce":
        return _produce(args)
    if args.command == "drain":
        return _drain(args)
    return _job(args)


if __name__ == "__main__":
    sys.exit(main())
