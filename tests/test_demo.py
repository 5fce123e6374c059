"""The README's first command, ``oncelog demo``: spec 001's Spark pipeline, its driver SIGKILLed
mid-stream and restarted from its checkpoint; every purchase ends up with exactly one invoice
and one shipment, and no transaction is left open."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

pytest.importorskip("pyspark")

pytestmark = [pytest.mark.slow, pytest.mark.spark]


def test_the_demo_survives_a_driver_sigkill_exactly_once(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "oncelog.cli.main", "demo", "--purchases",
                           "1500", "--kill-after", "3", "--work-dir", str(tmp_path)],
                          check=False, capture_output=True, text=True, timeout=420,
                          cwd=tmp_path)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr + (tmp_path / "driver.log").read_text()[-3000:]
    killed = re.search(r"4\. SIGKILLed the driver's process group after (\d+) micro-batches", out)
    assert killed and int(killed.group(1)) >= 3, out
    assert "driver run 2: batch" in out  # the restarted driver did the rest
    table = out.splitlines()[out.splitlines().index("   exactly once: yes") - 2].split()
    assert table == ["1500", "1500", "1500", "0", "0", "1", "0"]
