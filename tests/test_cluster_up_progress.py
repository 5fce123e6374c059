"""``oncelog cluster up`` says how far it got: a line per step on stderr ("broker 2 listening
on ...", "2 of 3 brokers registered"), and, when the cluster is not up within --timeout, which
brokers are missing and that --timeout can be raised. Against a ZooKeeper of the session (the
zookeeper_server fixture: a cluster test)."""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from oncelog.harness.local_cluster import cluster_down, read_cluster_file

pytest.importorskip("kazoo")  # the brokers need it
pytestmark = pytest.mark.cluster

CLI = [sys.executable, "-m", "oncelog.cli.main", "cluster"]


def _up(zookeeper_server, data_dir: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    chroot = f"/up-{uuid.uuid4().hex[:8]}"
    return subprocess.run(
        [*CLI, "up", "--brokers", "3", "--data-dir", str(data_dir),
         "--zookeeper", zookeeper_server.connect_string + chroot, *extra],
        check=False, capture_output=True, text=True, timeout=300)


def test_cluster_up_prints_its_progress(zookeeper_server, tmp_path: Path) -> None:
    data_dir = tmp_path / "progress"
    try:
        up = _up(zookeeper_server, data_dir)
        assert up.returncode == 0, up.stderr
        lines = up.stderr.splitlines()
        info = read_cluster_file(data_dir)
        for n, b in info["brokers"].items():
            assert f"oncelog cluster up: broker {n} listening on {b['address']}" in lines
        counts = [int(m[1]) for m in (re.fullmatch(
            r"oncelog cluster up: (\d) of 3 brokers registered(?: \([\d, ]+\))?", line)
            for line in lines) if m]
        # told as they register, each count once, ending with all of them
        assert counts == sorted(set(counts)) and counts[-1] == 3, lines
        assert "bootstrap servers: " + info["bootstrap_servers"] in up.stdout
    finally:
        with contextlib.suppress(FileNotFoundError):
            cluster_down(data_dir, timeout=10)


def test_a_cluster_not_up_in_time_names_the_missing_brokers_and_the_timeout(
        zookeeper_server, tmp_path: Path) -> None:
    data_dir = tmp_path / "too-short"
    try:
        up = _up(zookeeper_server, data_dir, "--timeout", "0.5")
        assert up.returncode == 1
        first = up.stderr.splitlines()[0]
        assert first.startswith("oncelog cluster up: not up within the startup timeout "
                                "(0.5 s): brokers 1, 2, 3 not registered"), up.stderr
        assert "raise --timeout (now 0.5 s) if this machine is busy" in up.stderr
        assert "Traceback" not in up.stderr
        # nothing left running: the brokers it started were stopped again
        info = read_cluster_file(data_dir)
        assert all(b["pid"] is None or b["state"] != "running"
                   for b in info["brokers"].values()), info
    finally:
        with contextlib.suppress(FileNotFoundError):
            cluster_down(data_dir, timeout=10)
