"""A real Apache Kafka for the tests that compare oncelog with it (``kafka`` marker).

One single-node Kafka (KRaft) serves the whole test session, shared by the xdist workers: the
first worker that needs it starts it under a lock, the others read its address, and the
controller process stops it at the end of the session (conftest's ``pytest_sessionfinish``).
Tests share it, so each uses topics, groups and transactional ids of its own
(``support.interop.unique_topic``).

Kafka is installed by ``scripts/kafka.sh`` from Maven Central on first use. Where Java or Maven
is missing the tests skip, saying why, except in CI, where they fail: CI installs both.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from oncelog.harness.apache_kafka import ApacheKafka, kafka_available

SHARED_DIR_ENV = "ONCELOG_TEST_KAFKA_DIR"


def require_kafka() -> None:
    """Skip (fail in CI) where Apache Kafka cannot be had."""
    why = kafka_available()
    if why is None:
        return
    if os.environ.get("CI"):
        pytest.fail(f"Apache Kafka is needed in CI: {why}")
    pytest.skip(f"Apache Kafka: {why}")


def shared_dir() -> Path:
    """The session's Kafka directory; the controller process sets it before workers start."""
    d = os.environ.get(SHARED_DIR_ENV)
    if not d:
        d = tempfile.mkdtemp(prefix="oncelog-kafka-")
        os.environ[SHARED_DIR_ENV] = d
    return Path(d)


def shared_kafka_bootstrap() -> str:
    """The bootstrap address of the session's Kafka, starting it if no worker has yet."""
    require_kafka()
    d = shared_dir()
    d.mkdir(parents=True, exist_ok=True)
    address = d / "bootstrap"
    with open(d / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if address.exists():
            return address.read_text()
        # not die_with_parent: the worker that starts it may finish before the others
        kafka = ApacheKafka(d / "kafka", die_with_parent=False,
                            settings={"auto.create.topics.enable": "true"})
        kafka.start()
        pids = " ".join(str(p) for p in kafka.pids())
        (d / "pids").write_text(pids)
        # If the session dies without its sessionfinish (killed, Ctrl-C twice), a watcher
        # stops Kafka: the controller is this worker's parent under xdist, else this process.
        controller = os.getppid() if os.environ.get("PYTEST_XDIST_WORKER") else os.getpid()
        watch = (f"while kill -0 {controller} 2>/dev/null; do sleep 2; done; "
                 f"kill -9 {pids} 2>/dev/null; rm -rf '{d}'")
        subprocess.Popen(["bash", "-c", watch],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True)
        address.write_text(kafka.bootstrap_servers)
        return kafka.bootstrap_servers


def stop_shared_kafka() -> None:
    """The controller's end of session: stop the session's Kafka, remove its directory."""
    d = os.environ.get(SHARED_DIR_ENV)
    if not d or not Path(d).exists():
        return
    pids_file = Path(d) / "pids"
    pids = [int(p) for p in pids_file.read_text().split()] if pids_file.exists() else []
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 20
    for pid in pids:
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        else:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    shutil.rmtree(d, ignore_errors=True)
