"""The ``oncelog`` command run as users run it, and a broker process (one per test module) for
it: tests/test_cli.py and tests/test_transaction_tools.py."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from unittest import mock

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


def help_text(*args: str) -> str:
    """What ``oncelog ARGS --help`` prints, from the command's ``main`` in this process: all
    ``python -m oncelog.cli.main`` runs (``sys.exit(main())``), without an interpreter's start
    for each (80 columns, as a pipe gets)."""
    from oncelog.cli.main import main

    out = io.StringIO()
    with mock.patch.dict(os.environ, {"COLUMNS": "80"}), contextlib.redirect_stdout(out), \
            pytest.raises(SystemExit) as exited:
        main([*args, "--help"])
    assert exited.value.code == 0, (args, out.getvalue())
    return out.getvalue()


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
