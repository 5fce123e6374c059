"""The ``oncelog`` command run as users run it, and a broker process (one per test module) for
it: tests/test_cli.py and tests/test_transaction_tools.py."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from oncelog.harness.broker_process import BrokerProcess

ONCELOG = [sys.executable, "-m", "oncelog.cli.main"]


def oncelog(*args: str, stdin: str | None = None, check: bool = True,
            env: dict[str, str] | None = None):
    proc = subprocess.run(ONCELOG + list(args), input=stdin, capture_output=True, text=True,
                          timeout=60, check=False,  # checked below, with the output
                          env={**os.environ, **env} if env is not None else None)
    if check and proc.returncode != 0:
        raise AssertionError(f"oncelog {' '.join(args)} failed ({proc.returncode}):\n"
                             f"{proc.stdout}\n{proc.stderr}")
    return proc


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    with BrokerProcess(tmp_path_factory.mktemp("cli") / "data") as b:
        yield b


@pytest.fixture(scope="module")
def groups_broker(tmp_path_factory):
    """A broker process whose groups rebalance at once (no initial rebalance delay): for
    tests where a command joins a group (tests/test_cli_groups.py, test_cli_consume.py)."""
    with BrokerProcess(tmp_path_factory.mktemp("cli") / "data",
                       settings={"group.initial.rebalance.delay.ms": "0"}) as b:
        yield b
