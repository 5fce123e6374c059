"""The driver of a query with the exactly-once sink dies at each step of its commit (after
writing its decision, after completing one prepared transaction, after completing all), and the
query restarts from its checkpoint: Spark runs the batch again, the new driver-side writer rolls
the dead driver's decision forward before any task runs, the replayed tasks find their batch
committed and write nothing. Spark's part is played with real processes, as in
test_spark_speculation.py: the tasks are executor processes, the dying driver a process that
exits at once (os._exit(137), no cleanup) at the crash point (support/spark_faults.py). The same crashes with the real
Spark driver: test_spark_sink.py."""

from __future__ import annotations

import base64
import pickle
import subprocess
import sys

import pytest

pytest.importorskip("pyspark")

from support import spark_faults
from support.spark_tasks import (  # noqa: F401 (broker: a fixture)
    attempt,
    broker,
    committed_output,
    open_transactions,
    result,
)

from oncelog.spark.sink import OncelogStreamWriter

pytestmark = [pytest.mark.slow, pytest.mark.spark]

# The driver's commit of one micro-batch, in a process of its own (it may die).
DRIVER = r"""
import base64, pickle, sys
from oncelog.spark.sink import OncelogStreamWriter
options, messages, batch = pickle.loads(base64.b64decode(sys.argv[1]))
OncelogStreamWriter(options).commit(messages, batch)
"""


def run_tasks(writer, batch: int, rows: dict[int, list[bytes]]) -> list:
    procs = {p: attempt(writer, 0, batch, rows[p], partition=p) for p in rows}
    messages = []
    for p, proc in procs.items():
        message, err = result(proc)
        assert message is not None, f"task {p} of batch {batch} failed: {err}"
        messages.append(message)
    return messages


def test_the_driver_dies_at_every_step_of_its_commit_and_the_restarted_query_resumes(
        broker, tmp_path):  # noqa: F811 (the fixture)
    options = {"kafka.bootstrap.servers": broker.bootstrap_servers, "topic": "out",
               "checkpointLocation": str(tmp_path / "ck")}
    expected: list[bytes] = []
    for batch, crash in enumerate(["driver:before-complete", "driver:mid-complete",
                                   "driver:after-complete"]):
        writer = OncelogStreamWriter(options)  # the query starts
        rows = {p: [f"{batch}-{p}-{i}".encode() for i in range(10)] for p in (0, 1)}
        messages = run_tasks(writer, batch, rows)
        assert all(m.state and not m.skipped for m in messages)
        env = spark_faults.env(crash=crash)
        payload = base64.b64encode(pickle.dumps((options, messages, batch))).decode()
        driver = subprocess.run([sys.executable, "-c", DRIVER, payload], env=env, check=False,
                                capture_output=True, text=True, timeout=60)
        assert driver.returncode == 137, f"{crash} was never reached: {driver.stderr}"
        # Restart from the checkpoint: the batch was not in Spark's commit log, so it runs
        # again, after the new writer has rolled the dead driver's decision forward.
        writer = OncelogStreamWriter(options)
        replay = run_tasks(writer, batch, rows)
        assert all(m.skipped and not m.state for m in replay), (crash, replay)
        OncelogStreamWriter(options).commit(replay, batch)  # PySpark commits with a new writer
        expected += rows[0] + rows[1]
        assert sorted(committed_output(broker)) == sorted(expected), crash
        assert open_transactions(broker) == [], crash
        assert not list((tmp_path / "ck" / "oncelog-sink").glob("*.json")), crash


def test_batch_markers_live_on_a_real_partition_and_old_markers_still_count(broker, tmp_path):  # noqa: F811
    """The markers are offsets of a partition that exists (the driver creates the marker topic,
    as Kafka refuses offsets of partitions that do not exist), one group per Spark partition;
    a query checkpointed by an earlier version, whose markers are offsets of group ``prefix``,
    replays none of its committed batches."""
    from oncelog import Consumer, TopicPartition
    from oncelog.spark.sink import MARKER_TOPIC

    options = {"kafka.bootstrap.servers": broker.bootstrap_servers, "topic": "out",
               "checkpointLocation": str(tmp_path / "ck"), "transactionalIdPrefix": "q"}
    writer = OncelogStreamWriter(options)
    done, err = result(attempt(writer, 0, 0, [b"a"]))
    assert done is not None and not done.skipped, err
    OncelogStreamWriter(options).commit([done], 0)
    marker = TopicPartition(MARKER_TOPIC, 0)
    with Consumer(bootstrap_servers=broker.bootstrap_servers, group_id="q-batches-0") as c:
        assert c.committed([marker])[marker] == 1
    # An earlier version's query "old": batch 1 committed, marked for partition 0 in group old.
    with Consumer(bootstrap_servers=broker.bootstrap_servers, group_id="old") as c:
        c.commit({marker: 2})
    old = OncelogStreamWriter({**options, "transactionalIdPrefix": "old",
                               "checkpointLocation": str(tmp_path / "old")})
    replay, err = result(attempt(old, 0, 1, [b"again"]))
    assert replay is not None and replay.skipped, err
    fresh, err = result(attempt(old, 0, 2, [b"b"]))
    assert fresh is not None and not fresh.skipped, err
    OncelogStreamWriter({**options, "transactionalIdPrefix": "old",
                         "checkpointLocation": str(tmp_path / "old")}).commit([fresh], 2)
    assert committed_output(broker) == [b"a", b"b"]
    assert open_transactions(broker) == []
