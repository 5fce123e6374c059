"""Issue 31's Spark workload (oncelog.faults.spark_job) on a loopback 3-broker cluster: producers
(a transactional one and an idempotent one, processes of their own writing the queue history)
write unique integers to ``in`` while the Spark copy job (its own driver process, the
exactly-once ``oncelog`` sink) copies ``in`` to ``out`` partition by partition. A broker (the
group coordinator, which holds the sink's batch markers) is SIGKILLed while the job copies; the driver is SIGKILLed
in the middle of a micro-batch with its JVM and Python workers and started again from its
checkpoint while the broker comes back; then the Python workers of its tasks are SIGKILLed
(task-level crashes, which Spark retries). The final drain (read_committed, from the beginning)
must find every acknowledged input value in the input, and every committed input value in its
output partition exactly once, and nothing else there."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import uuid
from collections import Counter
from pathlib import Path

import pytest
from support.waiting import wait_until
from support.zookeeper import require_zookeeper

from oncelog.faults.spark_job import (
    WORKER_START_TIMEOUT,
    SparkCopyJob,
    create_topics,
    drain_argv,
    meta,
    produce_argv,
    read_history,
)
from oncelog.harness.local_cluster import LocalCluster
from oncelog.server.topics import CONSUMER_OFFSETS

PARTITIONS = 2
SETTINGS = {"transaction.two.phase.commit.enable": "true",
            "transaction.state.log.num.partitions": "3", "offsets.topic.num.partitions": "1",
            "zookeeper.session.timeout.ms": "2000", "replica.lag.time.max.ms": "2000",
            "transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000"}


def _group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


def _values(ops: list[dict], process_prefix: str) -> dict[str, Counter]:
    """Key -> values (with their counts) the drain read, from its poll ops."""
    seen: dict[str, Counter] = {}
    for op in ops:
        if op["type"] == "ok" and op["f"] == "poll" and op["process"].startswith(process_prefix):
            for _f, polled in op["value"]:
                for key, pairs in polled.items():
                    seen.setdefault(key, Counter()).update(v for _offset, v in pairs)
    return seen


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.cluster
def test_spark_copy_job_exactly_once_through_driver_and_broker_kills(
        zookeeper_server, tmp_path: Path) -> None:
    pytest.importorskip("pyspark")
    require_zookeeper()
    chroot = f"{zookeeper_server.connect_string}/spark-{uuid.uuid4().hex[:6]}"
    history = tmp_path / "history"
    history.mkdir()
    with LocalCluster(tmp_path / "cluster", 3, zookeeper=chroot, broker_settings=SETTINGS,
                      die_with_parent=True) as cluster:
        bootstrap = cluster.bootstrap_servers
        create_topics(bootstrap, "in", "out", PARTITIONS)
        job = SparkCopyJob(tmp_path / "job", bootstrap, "in", "out", PARTITIONS,
                           history_dir=history)
        producers: list[subprocess.Popen] = []
        try:
            job.start()
            for index, txn in ((1, True), (2, False)):
                producers.append(subprocess.Popen(
                    produce_argv(bootstrap, "in", PARTITIONS, index,
                                 str(history / f"history-oncelog-{index}.jsonl"), txn=txn,
                                 rate=10),
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))

            # The group coordinator dies while the job copies: it holds the sink's batch markers
            # (offsets committed in the sink's transactions; one __consumer_offsets partition).
            job.wait_batches(1)
            victim = cluster.leader_of(CONSUMER_OFFSETS, 0)
            cluster.kill(victim)
            job.wait_batches(3)
            # The driver dies with its JVM and Python workers in the middle of a micro-batch
            # (its records in the log, Spark's commit not written); it runs again from its
            # checkpoint while the broker comes back.
            job.wait_writing()
            job.kill()
            # the driver's group and the pyspark.daemons' groups of its Python workers
            assert len(job.killed_groups) > 1
            assert all(map(_group_gone, job.killed_groups)), "a process outlived the kill"
            job.restart()
            cluster.start_broker(victim)
            job.wait_batches(1)
            # Task-level crashes: the tasks' Python workers die; Spark retries the tasks.
            assert job.kill_task()
            job.wait_batches(3)

            for p in producers:
                p.send_signal(signal.SIGTERM)
            for p in producers:
                _out, err = p.communicate(timeout=60)
                assert p.returncode == 0, err[-3000:]
            copied = job.wait_caught_up(timeout=300)
            job.stop()
            assert job.run == 2 and job.batches >= 5
        finally:
            for p in producers:
                if p.poll() is None:
                    p.kill()
                    p.wait()
            job.stop()
        keys = [*meta("in", "out", PARTITIONS)["keys"]]
        drain = subprocess.run(drain_argv(bootstrap, keys, str(history / "history-drain-0.jsonl"),
                                          timeout=60),
                               capture_output=True, text=True, timeout=120, check=False)
        assert drain.returncode == 0, drain.stderr[-3000:]

    ops = read_history(sorted(history.glob("history-*.jsonl")))
    crashes = [op for op in ops if op["f"] == "crash"]
    assert [op["process"] for op in crashes] == ["spark-1"]
    end = next(op for op in ops if op["type"] == "meta" and op.get("f") == "drain_end")
    assert all(v["reached"] == v["end"] for v in end["value"].values()), end

    read = _values(ops, "drain-")
    acknowledged: dict[str, set] = {}
    failed: set = set()
    for op in ops:
        if op["process"].startswith("oncelog-") and op["type"] == "ok":
            for _f, key, (_offset, value) in op["value"]:
                acknowledged.setdefault(key, set()).add(value)
        elif op["process"].startswith("oncelog-") and op["type"] == "fail":
            failed |= {value for _f, _key, value in op["value"]}
    assert sum(map(len, acknowledged.values())) > 100
    for key, copy in meta("in", "out", PARTITIONS)["copies"].items():
        inputs = read.get(key, Counter())
        assert not acknowledged.get(key, set()) - set(inputs), f"acknowledged, lost: {key}"
        assert not failed & set(inputs), f"failed sends read in {key}"
        assert max(inputs.values()) == 1, f"duplicates in the input {key}"
        assert read.get(copy, Counter()) == inputs, (
            f"{copy} is not {key} exactly once: missing "
            f"{sorted(set(inputs) - set(read.get(copy, Counter())))[:10]}, extra or "
            f"duplicated {sorted((read.get(copy, Counter()) - inputs).elements())[:10]}")
        assert copied[key] <= len(inputs)
    # the history is in the design's format: each invoke has one completion of its process
    pending: dict[str, dict] = {}
    for op in ops:
        if op["type"] == "invoke":
            assert op["process"] not in pending
            pending[op["process"]] = op
        elif op["type"] in ("ok", "fail") or (op["type"] == "info" and op["f"] != "crash"):
            assert pending.pop(op["process"])["f"] == op["f"]
    assert not pending
    json.dumps(ops)  # JSON through and through


def test_a_driver_that_ends_by_itself_is_started_again_until_stopped(tmp_path: Path) -> None:
    """Supervision: a driver whose query fails because Spark could not start a Python worker
    in time (here a stand-in for the job's Python that announces its start, says so and exits
    with status 3 at once) is started again from the checkpoint
    after the restart delay, each end recorded as a ``crash`` with its exit status; after
    ``stop`` nothing starts it again. (A driver killed by ``kill`` is the fault injector's
    doing: not restarted, recorded without a status.)"""
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\necho started\n"
                      f"echo 'query failed: ... {WORKER_START_TIMEOUT}' >&2\nexit 3\n")
    python.chmod(0o755)
    job = SparkCopyJob(tmp_path / "job", "127.0.0.1:9", "in", "out", 2, python=str(python),
                       restart_delay=0.05)
    job.start()
    wait_until(lambda: len(job.failures) >= 3, 30, "three ends of the driver")
    job.stop()
    runs = job.run
    assert not job.running
    job.kill()  # nothing runs: nothing to record
    ops = read_history([tmp_path / "job" / "history-spark.jsonl"])
    assert [(op["type"], op["f"]) for op in ops] == [("info", "crash")] * len(job.failures)
    assert [op["value"] for op in ops][:3] == ["exit status 3"] * 3
    assert [op["process"] for op in ops][:3] == ["spark-1", "spark-2", "spark-3"]
    assert runs - len(job.failures) in (0, 1)  # stopped during a restart delay, or after one
    assert job.run == runs and "started again" in job.log_path.read_text()
