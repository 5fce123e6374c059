"""The Spark workload's driver under a supervisor (issue 31; SparkCopyJob(supervise=True), what
the fault runner uses).

Spark's PythonWorkerFactory gives the Python worker of a streaming source (the driver's
``python_streaming_source_runner``) a fixed 10 s to connect back; on a loaded host the query
then fails where it plans (MicroBatchExecution.logicalPlan, "Caused by:
java.net.SocketTimeoutException: Timed out while waiting for the Python worker to connect
back") before any of the data source's code runs, and the driver exits. A supervisor restarts
such a driver from its checkpoint, as ``spark-submit --supervise`` does, and the copy goes on;
a driver that fails for any other reason is left dead (its failure is the finding). Broker
faults (a cut, a kill) the query rides out itself, without a restart."""

from __future__ import annotations

import os
import sys
import time
import uuid
from pathlib import Path

import pytest
from support.zookeeper import require_zookeeper

pytest.importorskip("pyspark")

from oncelog import Producer
from oncelog.faults.report import write_report
from oncelog.faults.spark_job import (
    WORKER_START_TIMEOUT,
    SparkCopyJob,
    SparkJobError,
    create_topics,
)
from oncelog.harness.local_cluster import LocalCluster
from oncelog.verify.jepsen import check_queue

pytestmark = [pytest.mark.slow, pytest.mark.spark, pytest.mark.cluster]

SETTINGS = {"transaction.two.phase.commit.enable": "true",
            "transaction.state.log.num.partitions": "1", "offsets.topic.num.partitions": "1",
            "transaction.state.log.replication.factor": "1",
            "offsets.topic.replication.factor": "1", "transaction.state.log.min.isr": "1"}


def _slow_python(tmp_path: Path) -> Path:
    """A Python for Spark's workers whose first streaming source runner starts 12 s late, as
    on a host too loaded to start one within Spark's 10 s."""
    script = tmp_path / "slow-python"
    marker = tmp_path / "slowed-once"
    script.write_text(
        "#!/bin/sh\n"
        f'if [ "$2" = pyspark.sql.streaming.python_streaming_source_runner ] && '
        f"[ ! -e {marker} ]; then touch {marker}; sleep 12; fi\n"
        f'exec {sys.executable} "$@"\n')
    script.chmod(0o755)
    return script


def _produce(bootstrap: str, values: range) -> None:
    with Producer(bootstrap_servers=bootstrap) as p:
        for n in values:
            p.send("in", str(n).encode(), partition=0)
        p.flush()


@pytest.mark.filterwarnings("ignore:No artists with labels:UserWarning")  # an empty plot
def test_a_driver_whose_python_worker_starts_too_late_is_restarted_and_copies(
        zookeeper_server, tmp_path: Path) -> None:
    require_zookeeper()
    chroot = f"{zookeeper_server.connect_string}/supervise-{uuid.uuid4().hex[:6]}"
    with LocalCluster(tmp_path / "cluster", 1, zookeeper=chroot, broker_settings=SETTINGS,
                      relays=True, die_with_parent=True) as cluster:
        bootstrap = cluster.bootstrap_servers
        create_topics(bootstrap, "in", "out", 1, replication_factor=1, min_insync_replicas=1)
        _produce(bootstrap, range(20))
        restarts: list[dict] = []
        job = SparkCopyJob(tmp_path / "job", bootstrap, "in", "out", 1,
                           env={**os.environ, "PYSPARK_PYTHON": str(_slow_python(tmp_path))},
                           supervise=True, on_restart=restarts.append)
        try:
            job.start()
            assert job.wait_caught_up(timeout=300) == {"in:0": 20}
            assert job.run == 2
            # Broker faults are the data source's to ride out, with no restart: the broker
            # cut off for a few seconds (the planner's offset look-ups retry), then killed and
            # started again.
            cluster.cut(1)
            time.sleep(3)  # the partition's length
            cluster.heal(1)
            cluster.kill(1)
            cluster.start_broker(1)
            _produce(bootstrap, range(20, 40))
            assert job.wait_caught_up(timeout=300) == {"in:0": 40}
        finally:
            job.stop()
    assert job.run == 2 and len(job.restarts) == 1 and restarts == job.restarts
    reason = job.restarts[0]["reason"]
    assert reason.startswith("run 1: query failed:") and WORKER_START_TIMEOUT in reason
    assert "MicroBatchExecution.logicalPlan" in reason
    first = (tmp_path / "job" / "driver.log").read_text().split("--- run 2: ")[0]
    assert "Caused by: java.net.SocketTimeoutException" in first
    # The fault runner's report lists the restart with its reason.
    (tmp_path / "report").mkdir()
    report = write_report(tmp_path / "report", verdict=check_queue([]), ops=[], windows=[],
                          run={"workload": "spark"}, excerpt=None, summary="anomalies: 0",
                          supervised=job.restarts).read_text()
    assert "## Spark driver restarted by its supervisor" in report
    assert f": {reason}\n" in report


def test_a_driver_that_fails_for_another_reason_is_not_restarted(tmp_path: Path) -> None:
    """Only Spark's Python worker start timeout is restarted: a query that failed otherwise
    (here a driver that reports a failure of its own and exits 1) stays failed."""
    driver = tmp_path / "failing-driver"
    driver.write_text("#!/bin/sh\necho started\n"
                      "echo 'query failed: [PYTHON_STREAMING_DATA_SOURCE_RUNTIME_ERROR] "
                      "latestOffset: KafkaTimeoutError' >&2\nexit 1\n")
    driver.chmod(0o755)
    job = SparkCopyJob(tmp_path / "job", "127.0.0.1:9", "in", "out", 1, python=str(driver),
                       supervise=True)
    try:
        job.start()
        with pytest.raises(SparkJobError, match="the driver exited"):
            job.wait_batches(1, timeout=60)
    finally:
        job.stop()
    assert job.run == 1 and job.restarts == []
