"""Cluster tests need Debian's ZooKeeper (and Java): skipped, saying why, where it is missing."""

from __future__ import annotations

import pytest


def require_zookeeper() -> None:
    """Skip the test, saying why, on a machine without Debian's ZooKeeper (and Java)."""
    from oncelog.harness.zookeeper import ZooKeeperNotFoundError, find_zookeeper

    try:
        find_zookeeper()
    except ZooKeeperNotFoundError as exc:
        pytest.skip(str(exc))
