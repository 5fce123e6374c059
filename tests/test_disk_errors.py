"""A full disk and a process out of file descriptors (issue 16): a topic that cannot be created
leaves no file open and no directory behind, the error names the cause (ENOSPC, EMFILE) rather
than "[Errno 0] short write", FindCoordinator answers COORDINATOR_NOT_AVAILABLE, and once the
cause is gone the same requests succeed."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from support.raw_wire import RawConnection, create_topics_request, produce

from oncelog.harness.broker_process import BrokerProcess
from oncelog.protocol import ApiKey, make, request_module
from oncelog.records import build_batch

KAFKA_STORAGE_ERROR, COORDINATOR_NOT_AVAILABLE = 56, 15


@pytest.fixture
def small_disk(tmp_path):
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mount)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def open_files(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def fill(path: Path) -> None:
    with open(path, "wb") as f:
        try:
            while True:
                f.write(bytes(65536))
                f.flush()
        except OSError:
            pass


def find_coordinator(conn, group: str):
    mod = request_module(ApiKey.FIND_COORDINATOR, 3)
    return conn.request(make(mod.FindCoordinatorRequest, key=group, key_type=0))


def test_a_full_disk_is_named_and_leaves_nothing_open(small_disk):
    with BrokerProcess(small_disk / "data") as broker, \
            RawConnection(broker.bootstrap_servers) as conn:
        assert conn.request(create_topics_request("before")).topics[0].error_code == 0
        fill(small_disk / "filler")
        files = open_files(broker.proc.pid)
        result = conn.request(create_topics_request("wide", partitions=50)).topics[0]
        assert (result.error_code, "ENOSPC" in result.error_message) == (KAFKA_STORAGE_ERROR,
                                                                          True)
        assert open_files(broker.proc.pid) == files
        assert not list((small_disk / "data").glob("wide-*"))
        found = find_coordinator(conn, "g")  # __consumer_offsets cannot be created either
        assert (found.error_code, "ENOSPC" in found.error_message) == (
            COORDINATOR_NOT_AVAILABLE, True)
        assert open_files(broker.proc.pid) == files
        (small_disk / "filler").unlink()
        assert conn.request(create_topics_request("wide", partitions=50)).topics[0] \
            .error_code == 0
        assert find_coordinator(conn, "g").error_code == 0
        assert produce(conn, "wide", 7, build_batch([(None, b"v", [], 1)])).error_code == 0


def test_running_out_of_file_descriptors_is_named_and_leaves_nothing_open(tmp_path):
    with BrokerProcess(tmp_path / "data") as broker, \
            RawConnection(broker.bootstrap_servers) as conn:
        pid = broker.proc.pid
        assert conn.request(create_topics_request("first")).topics[0].error_code == 0
        files = open_files(pid)  # this connection accepted and the broker warmed up
        soft = subprocess.run(["prlimit", "--nofile", "--pid", str(pid), "--output=SOFT",
                               "--noheadings"], capture_output=True, text=True,
                              check=True).stdout.strip()
        subprocess.run(["prlimit", f"--nofile={files + 20}:", "--pid", str(pid)], check=True)
        result = conn.request(create_topics_request("many", partitions=100)).topics[0]
        assert (result.error_code, "EMFILE" in result.error_message) == (KAFKA_STORAGE_ERROR,
                                                                          True)
        assert open_files(pid) == files
        assert not list((tmp_path / "data").glob("many-*"))
        subprocess.run(["prlimit", f"--nofile={soft}:", "--pid", str(pid)], check=True)
        assert conn.request(create_topics_request("many", partitions=100)).topics[0] \
            .error_code == 0
