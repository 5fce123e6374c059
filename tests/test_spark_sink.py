"""The exactly-once oncelog sink with real Spark: a copy job (oncelog.spark.copy_job, its own
driver process) crashes at each step of the commit protocol, runs again from its checkpoint, and
the output holds every input record exactly once, with no transaction left open. (The whole
driver process group SIGKILLed mid-stream: tests/test_demo.py; speculative attempts:
tests/test_spark_speculation.py.)"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

pytest.importorskip("pyspark")

from support import spark_faults

from oncelog import Admin, Consumer, NewTopic, Producer, TopicPartition
from oncelog.server.embedded import EmbeddedBroker

pytestmark = [pytest.mark.slow, pytest.mark.spark]
N = 120


@pytest.fixture
def broker():
    with EmbeddedBroker(config={"transaction.two.phase.commit.enable": "true"}) as b:
        with Admin(bootstrap_servers=b.bootstrap_servers) as a:
            a.create_topics([NewTopic("in", 2), NewTopic("out", 2)])
        with Producer(bootstrap_servers=b.bootstrap_servers) as p:
            for i in range(N):
                p.send("in", f"v{i}".encode(), key=f"k{i}".encode(), partition=i % 2)
        yield b


def run_job(b, checkpoint, crash=None, until=N, timeout=180, log=None):
    """The copy job; ``crash``: the points its processes (driver, Spark's Python workers) die
    at (support/spark_faults.py), each written to ``log``."""
    env = spark_faults.env(crash=crash, log=log,
                           base=dict(os.environ, PYSPARK_PYTHON=sys.executable))
    return subprocess.run([sys.executable, "-m", "oncelog.spark.copy_job", "--bootstrap-server",
                           b.bootstrap_servers, "--source", "in", "--sink", "out",
                           "--checkpoint", str(checkpoint), "--until", str(until),
                           "--max-offsets-per-trigger", "40"],
                          check=False, env=env, capture_output=True, text=True,
                          timeout=timeout)


def output(b):
    c = Consumer(bootstrap_servers=b.bootstrap_servers, isolation_level="read_committed",
                 auto_offset_reset="earliest")
    try:
        tps = [TopicPartition("out", 0), TopicPartition("out", 1)]
        c.assign(tps)
        values = []
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            values += [r.value for r in c.poll(0.3)]
            if all(c.position(tp) >= e for tp, e in c.end_offsets(tps).items()) and \
                    len(values) >= N:
                break
        hw = Consumer(bootstrap_servers=b.bootstrap_servers).end_offsets(tps)
        lso = c.end_offsets(tps)
        return values, hw == lso
    finally:
        c.close()


def check_exactly_once(b):
    values, stable = output(b)
    assert sorted(values) == sorted(f"v{i}".encode() for i in range(N))
    assert stable  # no transaction left open: read_committed reaches the high watermark
    with Admin(bootstrap_servers=b.bootstrap_servers) as a:
        assert a.list_transactions(states=["Ongoing"]) == []


def test_the_driver_dies_in_the_middle_of_its_commit_and_the_query_resumes(broker, tmp_path):
    """The real driver dies after completing one of a batch's prepared transactions (its
    decision written, the others still prepared); the job, run again, resumes from the
    checkpoint and finishes. Every step of the commit, with Spark's part played by
    processes: test_spark_driver_crash.py."""
    run = run_job(broker, tmp_path / "ck", crash="driver:mid-complete", log=tmp_path / "faults")
    assert run.returncode != 0, f"the crash point was never reached: {run.stdout}"
    # (Spark may run the commit again after the first crash: the point is reached again.)
    assert set(spark_faults.acted(tmp_path / "faults")) == {"driver:mid-complete"}
    last = run_job(broker, tmp_path / "ck", until=0)
    assert last.returncode == 0, last.stderr[-3000:]
    check_exactly_once(broker)


def test_failed_task_attempts_are_retried_exactly_once(broker, tmp_path):
    """Tasks die at each of their steps (before writing, after writing before preparing, after
    preparing; partition 1 twice): Spark retries them as new attempts, whose transactions the
    driver commits; the dead attempts' ones are aborted."""
    crash = "task:0:0:start,task:1:0:before-prepare,task:1:1:after-prepare,task:0:1:after-prepare"
    run = run_job(broker, tmp_path / "ck", crash=crash, log=tmp_path / "faults")
    assert run.returncode == 0, run.stderr[-3000:]
    # Every micro-batch's tasks reach the same points (partition:attempt:step): each was hit.
    assert set(spark_faults.acted(tmp_path / "faults")) == set(crash.split(","))
    check_exactly_once(broker)
