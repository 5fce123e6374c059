"""The exactly-once oncelog sink with real Spark: a copy job (oncelog.spark.copy_job, its own
driver process) crashes at each step of the commit protocol, runs again from its checkpoint, and
the output holds every input record exactly once, with no transaction left open."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

pytest.importorskip("pyspark")

from oncelog import Admin, Consumer, NewTopic, Producer, TopicPartition  # noqa: E402
from oncelog.server.embedded import EmbeddedBroker  # noqa: E402

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


def run_job(b, checkpoint, crash=None, until=N, timeout=180):
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable)
    env.pop("ONCELOG_SPARK_CRASH", None)
    if crash:
        env["ONCELOG_SPARK_CRASH"] = crash
    return subprocess.run([sys.executable, "-m", "oncelog.spark.copy_job", "--bootstrap-server",
                           b.bootstrap_servers, "--source", "in", "--sink", "out",
                           "--checkpoint", str(checkpoint), "--until", str(until),
                           "--max-offsets-per-trigger", "40"],
                          env=env, capture_output=True, text=True, timeout=timeout)


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


@pytest.mark.parametrize("crash", [None, "driver:before-complete", "driver:mid-complete",
                                   "driver:after-complete", "task:1:0:after-prepare"])
def test_every_record_exactly_once_whatever_crashes(broker, tmp_path, crash):
    first = run_job(broker, tmp_path / "ck", crash=crash)
    if crash is None:
        assert first.returncode == 0, first.stderr[-3000:]
    elif first.returncode != 0:
        # A crashed driver step fails the query: run it again from its checkpoint. (A crashed
        # task is retried by Spark as attempt 1, and the query finishes on its own.)
        again = run_job(broker, tmp_path / "ck", until=0)
        assert again.returncode == 0, again.stderr[-3000:]
    values, stable = output(broker)
    assert sorted(values) == sorted(f"v{i}".encode() for i in range(N))
    assert stable  # no transaction left open: read_committed reaches the high watermark
    with Admin(bootstrap_servers=broker.bootstrap_servers) as a:
        assert a.list_transactions(states=["Ongoing"]) == []
