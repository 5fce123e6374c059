"""``oncelog demo``: the purchases pipeline on Spark (each purchase -> one invoice and one
shipment), exactly once through a driver crash.

1. starts an embedded broker (two-phase commit enabled) and creates ``purchases``, ``invoices``
   and ``shipments``;
2. runs the Spark Structured Streaming job (oncelog.spark.purchases_job: each purchase -> one
   invoice + one shipment, written by the exactly-once ``oncelog`` sink) on ``local[2]`` in a
   driver process of its own;
3. generates purchases at a steady rate (our idempotent producer, in the background);
4. kills that driver mid-stream with SIGKILL (its whole process group: the Python driver, the
   JVM, the Python workers), possibly between a task's prepare and the driver's commit;
5. restarts it from its checkpoint; it runs until no purchase has come for a few seconds;
6. checks with a read_committed consumer that every purchase has exactly one invoice and one
   shipment, and that no transaction is left open; prints a table; exits 1 if not.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

TOPICS = ("purchases", "invoices", "shipments")


class _Driver:
    """One run of the job's driver, in its own process group, its progress echoed."""

    def __init__(self, run: int, bootstrap: str, checkpoint: Path, log: Path,
                 until_idle: float | None, max_offsets: int) -> None:
        self.run = run
        self.batches = 0
        self.purchases = 0
        self.started = threading.Event()
        cmd = [sys.executable, "-m", "oncelog.spark.purchases_job", "--bootstrap-server",
               bootstrap, "--checkpoint", str(checkpoint),
               "--max-offsets-per-trigger", str(max_offsets)]
        if until_idle is not None:
            cmd += ["--until-idle", str(until_idle)]
        env = dict(os.environ, PYSPARK_PYTHON=sys.executable)
        self._log = open(log, "ab")  # noqa: SIM115 - closed in wait()
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self._log, env=env,
                                     start_new_session=True, text=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            line = line.rstrip()
            if line == "started":
                self.started.set()
                continue
            if line.startswith("batch "):
                self.batches += 1
                self.purchases += int(line.split(":")[1].split()[0])
            print(f"     driver run {self.run}: {line}", flush=True)

    def kill(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)

    def wait(self, timeout: float | None = None) -> int:
        try:
            return self.proc.wait(timeout)
        finally:
            self._reader.join(5)
            self._log.close()


def _generate(bootstrap: str, count: int, rate: float, done: threading.Event,
              sent: list[int]) -> None:
    from oncelog import Producer
    from oncelog.examples.purchases import purchase

    with Producer(bootstrap_servers=bootstrap, linger_ms=5) as p:
        start = time.monotonic()
        for i in range(count):
            due = start + i / rate
            delay = due - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            p.send("purchases", purchase(i), key=f"customer-{i % 97}".encode())
            sent[0] = i + 1
        p.flush()
    done.set()


def _read_committed(bootstrap: str, partitions: int) -> dict[str, Counter]:
    """Purchase id -> how many times, per output topic, as a read_committed reader sees it
    (read to the last stable offset)."""
    from oncelog import Consumer, TopicPartition

    counts = {t: Counter() for t in TOPICS[1:]}  # type: dict[str, Counter]
    tps = [TopicPartition(t, p) for t in TOPICS[1:] for p in range(partitions)]
    with Consumer(bootstrap_servers=bootstrap, isolation_level="read_committed",
                  auto_offset_reset="earliest") as c:
        c.assign(tps)
        end = c.end_offsets(tps)
        deadline = time.monotonic() + 60
        while any(c.position(tp) < end[tp] for tp in tps) and time.monotonic() < deadline:
            for r in c.poll(0.5):
                counts[r.topic][json.loads(r.value or b"{}")["purchase"]] += 1
    return counts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="oncelog demo", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--purchases", type=int, default=3000, help="how many (default 3000)")
    ap.add_argument("--rate", type=float, default=60.0,
                    help="purchases per second (default 60)")
    ap.add_argument("--partitions", type=int, default=3)
    ap.add_argument("--kill-after", type=int, default=4, metavar="BATCHES",
                    help="SIGKILL the driver once it has committed this many micro-batches "
                    "(default 4), at a random moment of the next one")
    ap.add_argument("--max-offsets-per-trigger", type=int, default=300)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--work-dir", default=None,
                    help="keep the checkpoint and driver logs here (default: a temporary dir)")
    args = ap.parse_args(argv)
    rng = random.Random(args.seed)
    if not shutil.which("java") and not os.environ.get("JAVA_HOME"):
        print("oncelog demo: Spark needs Java 17 (no java on PATH, JAVA_HOME unset)",
              file=sys.stderr)
        return 2
    try:
        import pyspark  # noqa: F401
    except ImportError:
        print("oncelog demo: PySpark is not installed: pip install -e '.[spark]' (or run "
              "bash scripts/demo.sh, which installs it)", file=sys.stderr)
        return 2

    from oncelog import Admin, NewTopic
    from oncelog.server.embedded import EmbeddedBroker

    work = Path(args.work_dir or tempfile.mkdtemp(prefix="oncelog-demo-"))
    work.mkdir(parents=True, exist_ok=True)
    checkpoint, log = work / "checkpoint", work / "driver.log"
    t0 = time.monotonic()
    with EmbeddedBroker(config={"transaction.two.phase.commit.enable": "true"}) as broker:
        bootstrap = broker.bootstrap_servers
        with Admin(bootstrap_servers=bootstrap) as admin:
            admin.create_topics([NewTopic(t, args.partitions) for t in TOPICS])
        print(f"1. embedded broker on {bootstrap}; topics {', '.join(TOPICS)} "
              f"({args.partitions} partitions each); work dir {work}", flush=True)

        print("2. starting the Spark job (local[2]; Spark's start-up takes a while)", flush=True)
        restarts = 0
        driver = _Driver(1, bootstrap, checkpoint, log, None, args.max_offsets_per_trigger)
        deadline = time.monotonic() + 600
        while not driver.started.is_set() and driver.proc.poll() is None \
                and time.monotonic() < deadline:
            time.sleep(0.1)

        done, sent = threading.Event(), [0]
        gen = threading.Thread(target=_generate, daemon=True,
                               args=(bootstrap, args.purchases, args.rate, done, sent))
        gen.start()
        print(f"3. the job is up; generating {args.purchases} purchases at {args.rate:g}/s "
              "(our idempotent producer)", flush=True)
        while driver.batches < args.kill_after and driver.proc.poll() is None \
                and time.monotonic() < deadline:
            time.sleep(0.1)
        if driver.proc.poll() is not None:
            print(f"the driver exited early ({driver.proc.returncode}); see {log}")
            return 2
        time.sleep(rng.uniform(0.0, 1.5))  # somewhere inside the next micro-batch
        driver.kill()
        driver.wait()
        with Admin(bootstrap_servers=bootstrap) as admin:
            left = [t for t in admin.list_transactions(states=["Ongoing"])
                    if t.transactional_id.startswith("oncelog-spark-")]
        print(f"4. SIGKILLed the driver's process group after {driver.batches} micro-batches "
              f"({driver.purchases} purchases; {sent[0]} generated so far); it left "
              f"{len(left)} transaction(s) open", flush=True)

        print("5. restarting the job from its checkpoint", flush=True)
        finished = False
        run = 1
        while not finished and time.monotonic() < deadline:
            restarts += 1
            run += 1
            driver = _Driver(run, bootstrap, checkpoint, log, 5.0, args.max_offsets_per_trigger)
            # It stops after 5 s without input: only once the generator is done can that mean
            # the end.
            while driver.proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.2)
            if driver.proc.poll() is None:
                driver.kill()
            code = driver.wait()
            finished = code == 0 and done.is_set()
            if code != 0:
                print(f"     driver run {run} failed (exit {code}; see {log}): restarting",
                      flush=True)

        counts = _read_committed(bootstrap, args.partitions)
        with Admin(bootstrap_servers=bootstrap) as admin:
            open_txns = [t.transactional_id for t in admin.list_transactions(states=["Ongoing"])]
        expected = set(range(args.purchases))
        rows = []
        ok = finished and not open_txns
        for topic in TOPICS[1:]:
            c = counts[topic]
            duplicates = sum(n - 1 for n in c.values() if n > 1)
            missing = len(expected - set(c))
            extra = len(set(c) - expected)
            ok = ok and duplicates == 0 and missing == 0 and extra == 0
            rows.append((topic, sum(c.values()), duplicates, missing))
        print(f"6. read_committed check ({time.monotonic() - t0:.0f} s in all):\n")
        print(f"   {'purchases':>10} {'invoices':>9} {'shipments':>10} {'duplicates':>11} "
              f"{'missing':>8} {'restarts':>9} {'open txns':>10}")
        print(f"   {args.purchases:>10} {rows[0][1]:>9} {rows[1][1]:>10} "
              f"{rows[0][2] + rows[1][2]:>11} {rows[0][3] + rows[1][3]:>8} {restarts:>9} "
              f"{len(open_txns):>10}\n")
        print("   exactly once: " + ("yes" if ok else "NO"), flush=True)
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
