"""``python -m oncelog.faults.run`` (``bash scripts/faults.sh``): one fault run, as Jepsen makes it.

1. A replicated cluster on network hosts of its own (faults/cluster.py ``NetCluster``: every
   ZooKeeper node, every broker and every client in a network namespace of its own, on one
   bridge); the workload's topics with replication factor 3 and min.insync.replicas 2.
2. The workload's clients, each a process on a client host writing its own history file
   (faults/clients): ``queue`` (Jepsen's queue workload: sends, polls and transactions mixed, by
   every client kind asked: our client with transaction version 2, confluent-kafka with version 1
   and KIP-890's verification, Kafka's Java client), ``copier`` (producers feed an input topic,
   copiers copy it exactly once: consume, transform, produce with the offsets in the
   transaction), ``spark`` (producers feed an input topic, the Spark exactly-once sink job copies
   it: faults/spark_job.py).
3. The nemesis (faults/nemesis.py) injects the faults asked for on a seeded schedule (the same
   seed gives the same schedule), the runner itself crashes clients (``client-crash``: SIGKILL
   mid-operation, a new process takes its transactional id); at the end every fault is healed and
   the clients go on for ``--recover`` seconds: the cluster must recover with no operator action.
4. Drains read every key to its end (read_committed), the per-process histories are merged into
   ``history.jsonl``, Jepsen's Kafka checks run over it (verify/jepsen.py), and the report is
   written (faults/report.py: report.md, plot.png, verdict.json, faults.jsonl).

The last line printed is ``anomalies: N, faults: F, operations: O``; the exit status is 0 with
no anomaly, 1 with some, 2 when the run itself failed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

WORKLOADS = ("queue", "copier", "spark")
CLIENT_KINDS = ("oncelog", "confluent", "java")
QUEUE_TOPIC = "queue"
INPUT_TOPIC = "in"
OUTPUT_TOPIC = "out"
_SOURCE_ROOT = str(Path(__file__).resolve().parents[2])
CLIENT_BOUND_S = 1200.0
# How long one client operation may take at most: the clients' --op-timeout (10 s by default)
# and the grace after which a library call that never returns is abandoned and its producer
# replaced (librdkafka's transactional calls, confluentinc/librdkafka#5456).
OP_BOUND_S = 10.0 + 5.0


def _history_ops(history: Path | None) -> Iterator[tuple[str, int]]:
    """The ``(type, time)`` of each operation line of a client's history file, in file order:
    ``invoke``, ``ok``, ``fail``, ``info`` (or any other type a line has), ``time`` in
    monotonic ns. A file not there (yet) has none; a line cut short by a client still writing
    it, or not an operation, is skipped."""
    with contextlib.suppress(OSError), open(history or os.devnull) as f:
        for line in f:
            try:
                op = json.loads(line)
                if isinstance(op, dict):
                    yield str(op.get("type")), int(op.get("time", 0))
            except (ValueError, TypeError):
                continue


def _ok_after(history: Path | None, healed_ns: int) -> bool:
    """True when an operation of the history ended ok after ``healed_ns``."""
    return any(kind == "ok" and at > healed_ns for kind, at in _history_ops(history))


def _crossed_heal(history: Path | None, healed_ns: int) -> bool:
    """True when a client had an operation in flight when the faults were healed (invoked before
    ``healed_ns``, ended after it or not yet) and no operation has ended ok after ``healed_ns``."""
    invoked: int | None = None
    crossed = False
    for kind, at in _history_ops(history):
        if kind == "ok" and at > healed_ns:
            return False
        if kind == "invoke":
            invoked = at
        elif kind in ("ok", "fail", "info") and invoked is not None:
            crossed = crossed or (invoked <= healed_ns < at)
            invoked = None
    return crossed or (invoked is not None and invoked <= healed_ns)


@dataclass
class RunConfig:
    out: Path
    workload: str = "queue"
    faults: list[str] = field(default_factory=lambda: ["partition", "kill"])
    time: float = 60.0  # seconds of faults
    recover: float = 10.0  # seconds the clients go on after every fault healed
    seed: int = 0
    brokers: int = 3
    zookeepers: int = 1
    clients: list[str] = field(default_factory=lambda: ["oncelog", "confluent"])
    per_kind: int = 1  # client processes of each kind
    partitions: int = 4
    interval: float = 8.0  # mean seconds between two client crashes
    fault_s: tuple[float, float] = (5.0, 15.0)  # how long each fault lasts (min, max)
    gap_s: tuple[float, float] = (3.0, 8.0)  # from one fault's heal to the next one's start
    mixed: bool = False  # faults of different lanes (network, link, process, ...) overlap
    settings: dict[str, str] = field(default_factory=dict)
    drain_timeout: float = 60.0

    def describe(self) -> dict[str, Any]:
        return {"workload": self.workload, "faults": ",".join(self.faults),
                "time": self.time, "recover": self.recover, "seed": self.seed,
                "brokers": self.brokers, "zookeepers": self.zookeepers,
                "clients": ",".join(self.clients), "per_kind": self.per_kind,
                "partitions": self.partitions, "interval": self.interval,
                "fault_seconds": f"{self.fault_s[0]:g}:{self.fault_s[1]:g}",
                "gap_seconds": f"{self.gap_s[0]:g}:{self.gap_s[1]:g}",
                "mixed": self.mixed,
                "settings": ",".join(f"{k}={v}" for k, v in self.settings.items()) or "-"}


@dataclass
class RunResult:
    out: Path
    verdict: Any
    ops: list[dict[str, Any]]
    windows: list[dict[str, Any]]
    unrecovered: list[str]
    report: Path

    @property
    def anomalies(self) -> int:
        return int(self.verdict.anomaly_count) + len(self.unrecovered)

    def summary(self) -> str:
        operations = sum(1 for op in self.ops if op.get("type") == "invoke")
        return (f"anomalies: {self.anomalies}, faults: {len(self.windows)}, "
                f"operations: {operations}")


def _log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


@dataclass
class Slot:
    """One client's place in the run: its kind, host, transactional id, and the processes that
    played it (a crashed one is replaced by a new process under a new name)."""

    kind: str
    number: int
    role: str
    host: Any
    options: dict[str, Any]
    generation: int = 0
    proc: subprocess.Popen[bytes] | None = None
    process: str = ""
    history: Path | None = None

    @property
    def transactional_id(self) -> str:
        return f"{self.kind}-{self.role}-{self.number}"


class FaultRun:
    """One run (see the module's docstring); ``run()`` returns a RunResult."""

    def __init__(self, config: RunConfig) -> None:
        self.config = config
        self.out = Path(config.out)
        self.rng = random.Random(config.seed)
        self.slots: list[Slot] = []
        self._copied_all = False  # the copiers' group copied every input partition at the end
        self.cluster: Any = None
        self.windows_path = self.out / "faults.jsonl"
        self.spark_job: Any = None
        self.java_classes = Path(os.environ.get(
            "ONCELOG_FAULTS_JAVA_CLASSES",
            Path.home() / ".cache" / "oncelog" / "faults-java"))

    # -- topics and keys ----------------------------------------------------------------------

    def keys(self, topic: str) -> list[str]:
        return [f"{topic}:{p}" for p in range(self.config.partitions)]

    def topics(self) -> list[str]:
        return [QUEUE_TOPIC] if self.config.workload == "queue" else [INPUT_TOPIC, OUTPUT_TOPIC]

    def meta(self) -> dict[str, Any]:
        meta: dict[str, Any] = {"type": "meta", "workload": self.config.workload,
                                "keys": [k for t in self.topics() for k in self.keys(t)]}
        if self.config.workload != "queue":
            meta["copies"] = dict(zip(self.keys(INPUT_TOPIC), self.keys(OUTPUT_TOPIC),
                                      strict=True))
        meta["run"] = self.config.describe()
        return meta

    def create_topics(self) -> None:
        from ..client import Admin, NewTopic

        rf = min(3, self.config.brokers)
        with Admin(bootstrap_servers=self.cluster.bootstrap_servers,
                   request_timeout_ms=10_000) as admin:
            admin.create_topics([NewTopic(t, self.config.partitions, rf,
                                          {"min.insync.replicas": str(min(2, rf))})
                                 for t in self.topics()])
        for t in self.topics():
            for p in range(self.config.partitions):
                self.cluster.wait_for_isr(t, p, rf, timeout=60)

    # -- clients ------------------------------------------------------------------------------

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_SOURCE_ROOT, env.get("PYTHONPATH"))
                                            if p)
        env["PYTHONUNBUFFERED"] = "1"
        return env

    def _plan_slots(self) -> None:
        c = self.config
        # The clients run until the runner ends them (SIGTERM: each stops after its current
        # operation), --recover seconds after every fault is healed; this is only a bound.
        duration = c.time + c.recover + CLIENT_BOUND_S
        n = 0
        for kind in c.clients:
            for _ in range(c.per_kind):
                n += 1
                if c.workload == "queue":
                    role = "queue"
                    options: dict[str, Any] = {
                        "keys": self.keys(QUEUE_TOPIC), "duration": duration,
                        "poll_mode": "assign" if n % 2 else "subscribe",
                        "txn_ratio": 0.6}
                elif c.workload == "copier":
                    role = "copier"
                    options = {"input": self.keys(INPUT_TOPIC),
                               "output": self.keys(OUTPUT_TOPIC), "duration": duration,
                               "poll_mode": "subscribe", "group": "copier-group"}
                else:
                    continue
                self.slots.append(Slot(kind, n, role, self.cluster.client_host(f"c{n}"),
                                       options))
        if c.workload in ("copier", "spark"):  # the producers that feed the input topic
            for kind in c.clients:
                n += 1
                self.slots.append(Slot(kind, n, "queue", self.cluster.client_host(f"c{n}"), {
                    "keys": self.keys(INPUT_TOPIC), "duration": duration,
                    "poll_mode": "assign", "txn_ratio": 0.5}))

    def _argv(self, slot: Slot) -> list[str]:
        from .clients import command, java_command

        index = slot.generation * 100 + slot.number
        slot.process = f"{slot.kind}-{index}"
        slot.history = self.out / "histories" / f"history-{slot.process}.jsonl"
        options = dict(slot.options)
        options.update(seed=self.config.seed * 1000 + index, index=index,
                       transactional_id=slot.transactional_id)
        if slot.kind == "java":
            return java_command(slot.role, classes=self.java_classes, process=slot.process,
                                bootstrap=self.cluster.bootstrap_servers,
                                history=slot.history, **options)
        return command(slot.kind, slot.role, process=slot.process,
                       bootstrap=self.cluster.bootstrap_servers, history=slot.history,
                       **options)

    def _start(self, slot: Slot, death_signal: bool = True) -> None:
        argv = self._argv(slot)
        if not death_signal and argv[:1] == ["setpriv"]:
            argv = argv[argv.index("--") + 1:]
        with open(self.out / "logs" / f"{slot.process}.log", "ab") as log:
            slot.proc = slot.host.popen(argv, stdin=subprocess.DEVNULL, stdout=log,
                                        stderr=subprocess.STDOUT, env=self._env())

    def crash_client(self) -> dict[str, Any] | None:
        """SIGKILL one running client (mid-operation, most likely mid-transaction) and start a
        new process in its place: same host, same transactional id, a new name. In the spark
        workload, every other crash is the Spark job's instead: its driver (with Spark's JVM
        and Python workers) killed and started again from its checkpoint, or one of its
        tasks' Python workers killed (Spark retries the task)."""
        job = self.spark_job
        if job is not None and self.rng.random() < 0.5:
            start = time.monotonic_ns()
            if self.rng.random() < 0.5:
                dead = job.process
                job.restart()
                detail = f"SIGKILL the Spark driver ({dead}); restarted from its checkpoint"
            else:
                killed = job.kill_task()
                dead = "spark-task"
                detail = f"SIGKILL the Python workers of the job's tasks (pids {killed})"
            return {"fault": "client-crash", "start": start, "end": time.monotonic_ns(),
                    "targets": [dead], "detail": detail}
        running = [s for s in self.slots if s.proc is not None and s.proc.poll() is None]
        if not running:
            return None
        slot = self.rng.choice(running)
        start = time.monotonic_ns()
        assert slot.proc is not None
        with contextlib.suppress(ProcessLookupError):
            slot.proc.kill()  # ip netns exec and setpriv exec: this pid is the client's
        slot.proc.wait(timeout=30)
        dead = slot.process
        self._crash_line(slot)
        slot.generation += 1
        self._start(slot, death_signal=False)
        return {"fault": "client-crash", "start": start, "end": time.monotonic_ns(),
                "targets": [dead], "detail": f"SIGKILL {dead}; {slot.process} takes "
                f"transactional.id {slot.transactional_id}"}

    def _crash_line(self, slot: Slot) -> None:
        assert slot.history is not None
        with open(slot.history, "a") as f:
            f.write(json.dumps({"type": "info", "f": "crash", "process": slot.process,
                                "time": time.monotonic_ns()}) + "\n")

    # -- the run ------------------------------------------------------------------------------

    def _client_crash_times(self) -> list[float]:
        """Seconds from the start at which a client is crashed: drawn from the seed alone."""
        if "client-crash" not in self.config.faults:
            return []
        rng = random.Random(f"client-crash/{self.config.seed}")
        times: list[float] = []
        t = 0.0
        while True:
            t += max(2.0, rng.expovariate(1.0 / self.config.interval))
            if t >= self.config.time - 1.0:
                return times
            times.append(t)

    def _cluster_faults(self) -> list[str]:
        return [f for f in self.config.faults if f != "client-crash"]

    def run(self) -> RunResult:
        from ..verify.jepsen import check_queue, excerpt
        from ..verify.queue_history import merge, save
        from .cluster import NetCluster
        from .nemesis import Nemesis, cluster_options, schedule

        c = self.config
        for sub in ("histories", "logs"):
            (self.out / sub).mkdir(parents=True, exist_ok=True)
        (self.out / "histories" / "meta.jsonl").write_text(json.dumps(self.meta()) + "\n")
        keys = [k for t in self.topics() for k in self.keys(t)]
        plan = schedule(c.seed, self._cluster_faults(), c.time, brokers=c.brokers,
                        zookeepers=c.zookeepers, keys=keys, fault_s=c.fault_s, gap_s=c.gap_s,
                        first_s=min(5.0, c.gap_s[1]), mixed=c.mixed)
        options = cluster_options(self._cluster_faults())
        _log(f"starting {c.brokers} brokers and {c.zookeepers} ZooKeeper node(s), each on a "
             f"host of its own ({', '.join(k for k, v in options.items() if v) or 'no extras'})")
        unrecovered: list[str] = []
        settings = dict(c.settings)
        if c.workload == "spark":  # the exactly-once sink's transactions (KIP-939)
            settings.setdefault("transaction.two.phase.commit.enable", "true")
        with NetCluster(self.out / "cluster", brokers=c.brokers, zookeepers=c.zookeepers,
                        settings=settings, seed=c.seed, **options) as cluster:
            self.cluster = cluster
            self.create_topics()
            self._plan_slots()
            if c.workload == "spark":  # first: the JVM takes a while
                self._start_spark()
            for slot in self.slots:
                self._start(slot)
            _log(f"{len(self.slots)} clients running; {len(plan)} faults planned over "
                 f"{c.time:.0f} s")
            # Client crashes come from a thread of their own; the clients it restarts are
            # started without the death signal (PR_SET_PDEATHSIG would kill them when that
            # thread ends; the runner ends them itself).
            stop = threading.Event()
            nemesis = Nemesis(cluster, plan, self.windows_path, log=_log)
            started = time.monotonic()
            crasher = threading.Thread(target=self._crash_clients, args=(started, stop),
                                       name="client-crash", daemon=True)
            crasher.start()
            try:  # every scheduled fault runs, if late (a slow heal) then late
                nemesis.run(stop)
            finally:
                stop.set()
                crasher.join(timeout=120)
            _log("every fault healed (the nemesis healed all and waited until the cluster was "
                 "healthy)")
            healed = time.monotonic_ns()
            time.sleep(c.recover)
            self._await_calls_across_heal(healed)
            self._end_clients()
            unrecovered = self._unrecovered(healed)
            if self.spark_job is not None:
                unrecovered += self._finish_spark()
            self._drain()
        ops = merge(sorted((self.out / "histories").glob("*.jsonl")))
        save(self.out / "history.jsonl", ops)
        verdict = check_queue(ops)
        windows = self._windows()
        dicts = [op.to_dict() for op in ops]
        result = RunResult(self.out, verdict, dicts, windows, unrecovered, self.out / "report.md")
        from .report import write_report

        write_report(self.out, verdict=verdict, ops=ops, windows=windows,
                     run=self.config.describe(), excerpt=excerpt, summary=result.summary(),
                     unrecovered=unrecovered, supervised=self._supervised())
        return result

    def _crash_clients(self, started: float, stop: threading.Event) -> None:
        for at in self._client_crash_times():
            if stop.wait(max(0.0, started + at - time.monotonic())):
                return
            window = self.crash_client()
            if window is not None:
                _log(f"client-crash: {window['detail']}")
                with open(self.windows_path, "a") as f:  # beside the nemesis's windows
                    f.write(json.dumps(window) + "\n")

    def _start_spark(self) -> None:
        from .spark_job import SparkCopyJob

        host = self.cluster.client_host("spark")
        self.spark_job = SparkCopyJob(self.out / "spark", self.cluster.bootstrap_servers,
                                      INPUT_TOPIC, OUTPUT_TOPIC, self.config.partitions,
                                      wrap=host.wrap, history_dir=self.out / "histories",
                                      env=self._env(), supervise=True,
                                      on_restart=lambda r: _log(
                                          f"supervisor: restarted the Spark driver: "
                                          f"{r['reason']}"))
        self.spark_job.start()
        if not self.spark_job.started.wait(180):
            raise RuntimeError("the Spark job did not start in 180 s:\n"
                               + self.spark_job.log_tail())

    def _supervised(self) -> list[dict[str, Any]]:
        """The Spark driver's restarts by its supervisor (SparkCopyJob(supervise=True)), for
        the report: when (monotonic ns), which run, why."""
        return list(self.spark_job.restarts) if self.spark_job is not None else []

    def _finish_spark(self) -> list[str]:
        """Wait until the job copied every committed input, then stop it; a job that does not
        catch up did not recover."""
        from .spark_job import SparkJobError

        job = self.spark_job
        assert job is not None
        try:
            job.wait_caught_up(timeout=180)
            return []
        except SparkJobError as exc:
            return [f"the Spark job did not catch up after the faults were healed: {exc}"]
        finally:
            job.stop()

    def _end_clients(self) -> None:
        """SIGTERM every client (it stops after its current operation); one still running a
        minute later is killed (its open operation stays indeterminate). The copiers go last,
        once they have copied what the producers wrote (or stopped making progress)."""
        producers = [s for s in self.slots if s.role != "copier"]
        copiers = [s for s in self.slots if s.role == "copier"]
        self._terminate(producers)
        if copiers:
            self._copied_all = self._wait_copied()
            self._terminate(copiers)

    def _wait_copied(self, quiet_s: float = 10.0, limit_s: float = 120.0) -> bool:
        """Until the copiers' group has committed every input partition up to its last stable
        offset (the last record's offset + 1, or its transaction marker's), or its committed
        offsets stopped moving for ``quiet_s``."""
        from ..client import Admin, TopicPartition

        tps = [TopicPartition(INPUT_TOPIC, p) for p in range(self.config.partitions)]
        last: dict[Any, Any] = {}
        moved = time.monotonic()
        deadline = moved + limit_s
        with Admin(bootstrap_servers=self.cluster.bootstrap_servers,
                   request_timeout_ms=5000) as admin:
            while time.monotonic() < deadline:
                try:
                    ends = admin.list_offsets(dict.fromkeys(tps, -1), "read_committed")
                    committed = admin.list_consumer_group_offsets("copier-group", tps)
                except Exception as exc:  # noqa: BLE001 (a broker still settling: ask again)
                    _log(f"copiers: {exc!r}")
                    time.sleep(1)
                    continue
                if all((committed.get(tp) or 0) >= ends[tp].offset - 1 for tp in tps):
                    _log("copiers: every input partition copied")
                    return True
                if committed != last:
                    last, moved = committed, time.monotonic()
                elif time.monotonic() - moved > quiet_s:
                    _log(f"copiers: no progress for {quiet_s:g} s (committed {committed}, "
                         f"input ends {ends})")
                    return False
                time.sleep(0.5)
        return False

    def _terminate(self, slots: list[Slot]) -> None:
        for slot in slots:
            if slot.proc is not None and slot.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    slot.proc.terminate()
        limit = time.monotonic() + 60
        for slot in slots:
            assert slot.proc is not None
            try:
                slot.proc.wait(timeout=max(1.0, limit - time.monotonic()))
            except subprocess.TimeoutExpired:
                _log(f"{slot.process} did not end in time: killed")
                slot.proc.kill()
                slot.proc.wait(timeout=30)

    def _await_calls_across_heal(self, healed_ns: int) -> None:
        """A client that was inside an operation when the faults were healed gets that
        operation's own bound, then --recover seconds, before it counts as not recovered: a call
        stuck behind a fault ends by its own timeout, not by the heal."""
        deadline = healed_ns + int((OP_BOUND_S + self.config.recover) * 1e9)
        while time.monotonic_ns() < deadline:
            if not any(_crossed_heal(slot.history, healed_ns) for slot in self.slots):
                return
            time.sleep(0.5)

    def _unrecovered(self, healed_ns: int) -> list[str]:
        """The client slots that completed no operation after every fault was healed: the
        cluster did not recover for them without an operator."""
        stalled = []
        for slot in self.slots:
            assert slot.history is not None
            if slot.role == "copier" and self._copied_all:
                # The group copied everything the producers wrote (they wrote past the heal,
                # each checked here): it recovered, and a member the last rebalance left
                # without a partition had nothing to copy.
                continue
            if not _ok_after(slot.history, healed_ns):
                stalled.append(f"{slot.process} (transactional.id {slot.transactional_id}) "
                               "completed no operation after the faults were healed")
        return stalled

    def _drain(self) -> None:
        from .clients import command

        keys = [k for t in self.topics() for k in self.keys(t)]
        history = self.out / "histories" / "history-drain-1.jsonl"
        host = self.cluster.client_host("drain")
        argv = command("oncelog", "drain", process="drain-1",
                       bootstrap=self.cluster.bootstrap_servers, history=history, keys=keys,
                       timeout=self.config.drain_timeout)
        with open(self.out / "logs" / "drain-1.log", "ab") as log:
            proc = host.popen(argv, stdin=subprocess.DEVNULL, stdout=log,
                              stderr=subprocess.STDOUT, env=self._env())
        proc.wait(timeout=self.config.drain_timeout + 60)

    def _windows(self) -> list[dict[str, Any]]:
        windows: list[dict[str, Any]] = []
        with contextlib.suppress(OSError), open(self.windows_path) as f:
            windows += [json.loads(line) for line in f if line.strip()]
        return sorted(windows, key=lambda w: int(w["start"]))


def parser() -> argparse.ArgumentParser:
    from .nemesis import FAULTS

    every = [*FAULTS, "client-crash"]
    p = argparse.ArgumentParser(
        prog="bash scripts/faults.sh",
        description="One fault run as Jepsen makes it: a replicated oncelog cluster on network "
        "hosts of its own, faults on a seeded schedule, an exactly-once workload, Jepsen's "
        "Kafka checks over the history, a report. The last line is 'anomalies: N, faults: F, "
        "operations: O'; exit 0 with no anomaly, 1 with some, 2 if the run failed.")
    p.add_argument("--workload", choices=WORKLOADS, default="queue",
                   help="queue: Jepsen's queue workload (sends, polls, transactions); copier: "
                   "consume-transform-produce exactly once; spark: the Spark exactly-once sink "
                   "job (default queue)")
    p.add_argument("--faults", default="partition,kill,pause,client-crash",
                   help="comma list of: " + ", ".join(every) + "; 'all' for every one, "
                   "'none' for none (default partition,kill,pause,client-crash)")
    p.add_argument("--time", type=float, default=60.0, metavar="SECONDS",
                   help="seconds of faults (default 60); the clients go on --recover seconds "
                   "more after every fault is healed")
    p.add_argument("--recover", type=float, default=10.0, metavar="SECONDS")
    p.add_argument("--seed", type=int, default=0,
                   help="the same seed gives the same fault schedule (default 0)")
    p.add_argument("--interval", type=float, default=8.0, metavar="SECONDS",
                   help="client-crash: mean time between two crashes (default 8); the other "
                   "faults come one after another, 5-15 s each with 3-8 s between them, the "
                   "families in turns in a seeded order")
    p.add_argument("--fault-seconds", type=_span, default=(5.0, 15.0), metavar="MIN:MAX",
                   help="how long each fault lasts, drawn between MIN and MAX (default 5:15)")
    p.add_argument("--gap-seconds", type=_span, default=(3.0, 8.0), metavar="MIN:MAX",
                   help="from one fault's heal to the next fault (default 3:8)")
    p.add_argument("--mixed", action="store_true",
                   help="faults of different kinds at once: the network, link, process, clock "
                   "and disk faults each follow a schedule of their own, overlapping (default: "
                   "one fault at a time, client crashes on top)")
    p.add_argument("--brokers", type=int, default=3, help="1 to 5 (default 3)")
    p.add_argument("--zookeepers", type=int, choices=(1, 3), default=1,
                   help="ZooKeeper nodes: 1, or an ensemble of 3 (default 1)")
    p.add_argument("--partitions", type=int, default=4)
    p.add_argument("--clients", default="oncelog,confluent",
                   help="client kinds, comma list of oncelog (transaction version 2), "
                   "confluent (version 1, KIP-890 verification), java (Kafka's Java client) "
                   "(default oncelog,confluent)")
    p.add_argument("--per-kind", type=int, default=1, help="client processes of each kind")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a broker setting (repeatable)")
    p.add_argument("--out", default=None,
                   help="the run's directory (default: faults-runs/<workload>-<seed>-<time>)")
    return p


def _span(text: str) -> tuple[float, float]:
    low, sep, high = text.partition(":")
    try:
        span = (float(low), float(high if sep else low))
    except ValueError:
        raise argparse.ArgumentTypeError(f"MIN:MAX seconds, not {text!r}") from None
    if not 0 < span[0] <= span[1]:
        raise argparse.ArgumentTypeError(f"0 < MIN <= MAX, not {text!r}")
    return span


def parse_faults(text: str) -> list[str]:
    """``--faults``: the nemesis's families and ``client-crash`` (``all``: every one)."""
    from . import nemesis

    if text.strip() in ("", "none"):
        return []
    families = nemesis.parse_faults(text)
    names = [x.strip() for x in text.split(",")]
    if "all" in names or nemesis.CLIENT_CRASH in names:
        families.append(nemesis.CLIENT_CRASH)
    return families


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        faults = parse_faults(args.faults)
        kinds = [k.strip() for k in args.clients.split(",") if k.strip()]
        unknown = [k for k in kinds if k not in CLIENT_KINDS]
        if unknown or not kinds:
            raise ValueError(f"clients are {', '.join(CLIENT_KINDS)}, not {args.clients!r}")
        settings = {}
        for item in args.set:
            key, sep, value = item.partition("=")
            if not sep:
                raise ValueError(f"--set wants KEY=VALUE, not {item!r}")
            settings[key] = value
    except ValueError as exc:
        print(f"faults: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out or Path("faults-runs") /
               f"{args.workload}-{args.seed}-{time.strftime('%Y%m%dT%H%M%S')}")
    config = RunConfig(out=out, workload=args.workload, faults=faults, time=args.time,
                       recover=args.recover, seed=args.seed, brokers=args.brokers,
                       zookeepers=args.zookeepers, clients=kinds, per_kind=args.per_kind,
                       partitions=args.partitions, interval=args.interval, settings=settings,
                       fault_s=args.fault_seconds, gap_s=args.gap_seconds, mixed=args.mixed)
    try:
        result = FaultRun(config).run()
    except Exception as exc:  # noqa: BLE001 (the run itself failed: say what, keep what was written)
        import traceback

        traceback.print_exc()
        print(f"faults: the run failed: {exc} (what it wrote is in {out})", file=sys.stderr)
        return 2
    print(result.verdict.table())
    for line in result.unrecovered:
        print(f"unrecovered: {line}")
    print(f"report: {result.report}")
    print(result.summary())
    return 0 if result.anomalies == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
