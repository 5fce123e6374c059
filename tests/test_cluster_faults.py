"""The guarantees under broker faults, checked with the history checker (oncelog verify's):
a 3-broker cluster (replication factor 3, min.insync.replicas 2), transactional writers (ours
and confluent-kafka's) and read_committed readers, while partition leaders and the transaction
coordinator are SIGKILLed, a leader is paused with SIGSTOP past its ZooKeeper session, and a
leader is cut off the network. After each fault heals: no acknowledged write lost, no
duplicate, no aborted read, no torn transaction, and every writer commits again."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.zookeeper import require_zookeeper

from oncelog.verify.cluster import run_cluster

pytestmark = [pytest.mark.slow, pytest.mark.cluster]


@pytest.fixture(autouse=True)
def _zookeeper_installed() -> None:
    require_zookeeper()


def check_run(tmp_path: Path, faults: list[str], duration: float) -> None:
    lines: list[str] = []
    run = run_cluster(tmp_path / "cluster", faults, duration=duration, progress=lines.append)
    report = "\n".join(lines) + "\n" + run.verdict.table()
    assert not run.errors, report
    assert run.verdict.ok, report
    assert not run.stalled, report
    assert len([f for f in run.faults if "broker" in f]) >= 2 * len(faults), report
    assert run.verdict.stats["committed"] > 0, report


def test_exactly_once_under_broker_kills_a_pause_and_a_cut(tmp_path: Path) -> None:
    check_run(tmp_path, ["kill-leader", "kill-coordinator", "pause", "cut"], 50.0)
