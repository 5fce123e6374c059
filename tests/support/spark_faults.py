"""Faults at the exactly-once sink's points (oncelog/spark/fault_points.py) in processes a test
starts, Spark's own included: ``env(...)`` gives the environment such a process is started with
(directly, or by Spark: the driver's environment or ``sc.environment``). It puts
tests/support/spark_fault_site (a ``sitecustomize``) first on PYTHONPATH, which every Python
process started with it loads at start; that adds a hook to the sink's points crashing
(``os._exit(137)``, no clean-up) or stalling the process at the points of the plan, and writing
each point it acts at to ``log`` first, so that a test can check the fault happened."""

from __future__ import annotations

import json
import os
from pathlib import Path

SITE = Path(__file__).parent / "spark_fault_site"
PLAN = "ONCELOG_TEST_SPARK_FAULTS"  # read by spark_fault_site/sitecustomize.py only


def plan(crash: str | None = None, slow: str | None = None, log: Path | None = None
         ) -> dict[str, str]:
    """The variables that give a process the plan: ``crash`` a comma list of points, ``slow``
    ``<point>:<seconds>``; ``log`` the file each point acted at is appended to."""
    stall = None
    if slow:
        point, seconds = slow.rsplit(":", 1)
        stall = [point, float(seconds)]
    value = json.dumps({"crash": crash.split(",") if crash else [], "slow": stall,
                        "log": str(log) if log else None})
    path = os.pathsep.join(p for p in (str(SITE), os.environ.get("PYTHONPATH")) if p)
    return {PLAN: value, "PYTHONPATH": path}


def env(crash: str | None = None, slow: str | None = None, log: Path | None = None,
        base: dict[str, str] | None = None) -> dict[str, str]:
    """``base`` (this process's environment) with the plan, or without any if none is given."""
    out = {k: v for k, v in (os.environ if base is None else base).items() if k != PLAN}
    if crash or slow:
        out.update(plan(crash, slow, log))
    return out


def acted(log: Path) -> list[str]:
    """The points the hook acted at, in order (of every process that wrote to ``log``)."""
    return log.read_text().split() if log.exists() else []
