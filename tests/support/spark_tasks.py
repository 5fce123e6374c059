"""Spark's part played with real processes (a speculative attempt cannot happen in local
mode): a broker for the sink, executor processes running one task attempt of the exactly-once
sink's writer, and what the sink left behind. Used by tests/test_spark_speculation.py and
tests/test_spark_driver_crash.py (both import pyspark first, or skip)."""

from __future__ import annotations

import base64
import pickle
import subprocess
import sys
import time

import pytest

from oncelog import Admin, Consumer, NewTopic, TopicPartition
from oncelog.server.embedded import EmbeddedBroker
from support import spark_faults

# An executor running one task attempt: unpickles the writer, sets the task context, writes.
ATTEMPT = r"""
import base64, pickle, sys
from pyspark import TaskContext
from pyspark.sql import Row
writer, partition, attempt, batch, rows = pickle.loads(base64.b64decode(sys.argv[1]))
tc = TaskContext._getOrCreate()
tc._partitionId, tc._attemptNumber, tc._stageId = partition, attempt, 0
tc._localProperties = {"streaming.sql.batchId": str(batch)}
message = writer.write(iter([Row(value=v) for v in rows]))
print(base64.b64encode(pickle.dumps(message)).decode())
"""


@pytest.fixture
def broker():
    with EmbeddedBroker(config={"transaction.two.phase.commit.enable": "true"}) as b:
        with Admin(bootstrap_servers=b.bootstrap_servers) as a:
            a.create_topics([NewTopic("out", 1)])
        yield b


def attempt(writer, n: int, batch: int, rows: list[bytes], slow: str | None = None,
            partition: int = 0, log=None):
    """An executor process running attempt ``n`` of the task; ``slow``: ``<point>:<seconds>``
    it stalls at (support/spark_faults.py), each stall written to ``log``."""
    env = spark_faults.env(slow=slow, log=log)
    task = base64.b64encode(pickle.dumps((writer, partition, n, batch, rows))).decode()
    return subprocess.Popen([sys.executable, "-c", ATTEMPT, task], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def result(proc, timeout=60):
    out, err = proc.communicate(timeout=timeout)
    if proc.returncode != 0:
        return None, err
    return pickle.loads(base64.b64decode(out.strip().splitlines()[-1])), err


def committed_output(b) -> list[bytes]:
    tp = TopicPartition("out", 0)
    with Consumer(bootstrap_servers=b.bootstrap_servers, isolation_level="read_committed") as c:
        c.assign([tp])
        c.seek(tp, 0)
        end = c.end_offsets([tp])[tp]
        values: list[bytes] = []
        deadline = time.monotonic() + 20
        while c.position(tp) < end and time.monotonic() < deadline:
            values += [r.value for r in c.poll(0.3)]
    return values


def open_transactions(b) -> list[str]:
    with Admin(bootstrap_servers=b.bootstrap_servers) as a:
        return [t.transactional_id for t in a.list_transactions(states=["Ongoing"])]


def wait_open(b, txn_id: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while txn_id not in open_transactions(b):
        assert time.monotonic() < deadline, f"{txn_id} never opened a transaction"
        time.sleep(0.1)


def writer_for(b, tmp_path):
    from oncelog.spark.sink import OncelogStreamWriter

    return OncelogStreamWriter({"kafka.bootstrap.servers": b.bootstrap_servers,
                                "topic": "out", "checkpointLocation": str(tmp_path / "ck")})
