"""Short fault runs, one per family group, through the command (``python -m oncelog.faults.run``,
what ``bash scripts/faults.sh`` runs): a 3-broker cluster, ZooKeeper and the clients each in a
network namespace of their own, the faults on a seeded schedule, Jepsen's Kafka checks over the
history, the report. Each must end with no anomaly, every fault injected and healed, and the
clients recovered; long runs are the command (docs/faults.md)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support.netns import require_netns

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

SUMMARY = re.compile(r"^anomalies: (\d+), faults: (\d+), operations: (\d+)$")
ROOT = Path(__file__).resolve().parents[1]


def run_faults(out: Path, *args: str, timeout: float = 420) -> tuple[int, int, str]:
    require_netns()
    argv = [sys.executable, "-m", "oncelog.faults.run", "--out", str(out),
            "--fault-seconds", "3:5", "--gap-seconds", "1:2", "--recover", "6", *args]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          check=False)
    lines = proc.stdout.strip().splitlines()
    assert lines, proc.stderr[-3000:]
    m = SUMMARY.match(lines[-1])
    assert m, proc.stdout[-3000:] + proc.stderr[-3000:]
    anomalies, faults, operations = (int(g) for g in m.groups())
    report = (out / "report.md").read_text()
    assert proc.returncode == 0 and anomalies == 0, report[:6000]
    assert operations > 50, report[:3000]
    assert (out / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert report.rstrip().splitlines()[-1] == lines[-1]
    return faults, operations, report


def windows(out: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in (out / "faults.jsonl").read_text().splitlines()]


def test_network_faults_queue_workload(tmp_path: Path) -> None:
    """Random halves, an isolated leader, an isolated controller, brokers cut from ZooKeeper,
    one-way drops and a bridge, under Jepsen's queue workload of our client (transaction
    version 2) and confluent-kafka (version 1)."""
    families = ["partition", "isolate-leader", "isolate-controller", "zk-cut", "one-way",
                "bridge"]
    faults, _, report = run_faults(tmp_path, "--workload", "queue", "--seed", "11",
                                   "--faults", ",".join(families), "--time", "40")
    seen = {w["fault"] for w in windows(tmp_path)}
    assert seen == set(families), seen
    assert faults == len(windows(tmp_path))
    assert all(w["end"] is not None for w in windows(tmp_path))
    for name in families:
        assert f"| {name} |" in report


def test_process_faults_and_client_crashes(tmp_path: Path) -> None:
    """Pauses and kills of brokers and of ZooKeeper, and clients SIGKILLed mid-transaction
    (their replacements take the same transactional id)."""
    families = ["pause", "pause-zk", "kill", "kill-zk"]
    faults, _, _ = run_faults(tmp_path, "--workload", "queue", "--seed", "12", "--faults",
                              ",".join([*families, "client-crash"]), "--time", "30",
                              "--interval", "6")
    seen = {str(w["fault"]) for w in windows(tmp_path)}
    assert seen == {*families, "client-crash"}, seen  # the client crashes come on top
    assert faults == len(windows(tmp_path))
    ops = [json.loads(line) for line in (tmp_path / "history.jsonl").read_text().splitlines()]
    assert any(op.get("f") == "crash" for op in ops)


def test_link_clock_and_disk_faults(tmp_path: Path) -> None:
    """Packet loss and delay through the link proxies, clock skew and jumps per broker, a
    full disk on one broker."""
    families = ["loss", "delay", "clock", "disk"]
    run_faults(tmp_path, "--workload", "queue", "--seed", "13", "--faults",
               ",".join(families), "--time", "28")
    assert {w["fault"] for w in windows(tmp_path)} == set(families)


def test_copier_with_the_java_client(tmp_path: Path, kafka_jars: str) -> None:
    """The exactly-once copier (consume, transform, produce with the offsets in the
    transaction) of our client, confluent-kafka and Kafka's Java client in one group, fed by
    producers of each, through partitions, kills and client crashes: every input value copied
    exactly once."""
    run_faults(tmp_path, "--workload", "copier", "--seed", "14",
               "--clients", "oncelog,confluent,java", "--faults", "partition,kill,client-crash",
               "--time", "25")
    verdict = json.loads((tmp_path / "verdict.json").read_text())
    assert verdict["counts"]["lost-copy"] == verdict["counts"]["duplicate-copy"] == 0
    copied = [line for line in (tmp_path / "history.jsonl").read_text().splitlines()
              if '"out:' in line and '"ok"' in line]
    assert copied, "the copiers copied nothing"


@pytest.mark.spark
def test_spark_sink_job(tmp_path: Path) -> None:
    """The Spark exactly-once sink job copying what producers write, through broker kills and
    partitions, its driver and its tasks killed."""
    run_faults(tmp_path, "--workload", "spark", "--seed", "15", "--clients", "oncelog",
               "--faults", "kill,partition,client-crash", "--time", "30", "--interval", "8",
               timeout=600)
    drained_outputs = [line for line in (tmp_path / "history.jsonl").read_text().splitlines()
                       if '"drain-1"' in line and '"out:' in line and '"ok"' in line]
    assert drained_outputs, "the final drain read nothing the job copied"


def test_bad_arguments_are_refused(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "oncelog.faults.run", "--faults",
                           "partition,meteor", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=60, cwd=ROOT, check=False)
    assert proc.returncode == 2
    assert "meteor" in proc.stderr
