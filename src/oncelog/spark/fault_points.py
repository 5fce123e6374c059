"""The named points of the exactly-once sink's commit protocol (docs/spark.md) at which a test
can act on the process that reaches them: a fault-injection seam, as Kafka's tests use hooks in
the code under test rather than switches read from the environment.

The sink calls ``reached(point)`` at each point; nothing happens unless something in the same
process added a hook (``add_hook``). Spark runs the sink in processes of its own (its Python
workers, the driver's commit in a worker too), so a test reaches them with code those processes
load at start (tests/support/spark_faults.py puts a ``sitecustomize`` on their PYTHONPATH).

Points: ``driver:before-complete`` (the decision written, nothing completed),
``driver:mid-complete`` (one prepared transaction completed), ``driver:after-complete``, and
``task:<partition>:<attempt>:<step>`` with step ``start``, ``begin``, ``before-prepare``,
``after-prepare``.
"""

from __future__ import annotations

from collections.abc import Callable

Hook = Callable[[str], None]

_HOOKS: list[Hook] = []


def add_hook(hook: Hook) -> None:
    """Call ``hook(point)`` at every point this process reaches (it may stall or kill it)."""
    _HOOKS.append(hook)


def remove_hook(hook: Hook) -> None:
    _HOOKS.remove(hook)


def reached(point: str) -> None:
    for hook in tuple(_HOOKS):
        hook(point)
