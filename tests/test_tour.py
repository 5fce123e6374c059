"""The client tour (the demo before the Spark one) runs to the end and passes its checks."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def test_the_tour_passes_its_own_checks():
    proc = subprocess.run([sys.executable, "-m", "oncelog.examples.tour", "--records", "300"],
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert any(line.startswith("4.") and line.endswith("exactly once: True") for line in lines)
    checks = [line for line in lines if line.startswith("7.")]
    assert len(checks) == 2 and all(line.endswith("nothing aborted: True") for line in checks)
    assert any("processed 300 purchases" in line for line in lines)
