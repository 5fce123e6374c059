"""Fault-injection tests need network namespaces (iproute2, iptables, root): skipped, saying
why, where they are missing; failed under CI, where `bash scripts/bootstrap.sh --with-netns`
installs them."""

from __future__ import annotations

import os

import pytest


def require_netns() -> None:
    from oncelog.faults.net import missing_tools

    why = missing_tools()
    if why is None:
        return
    if os.environ.get("CI"):
        pytest.fail(f"network namespaces are needed in CI: {why}")
    pytest.skip(why)
