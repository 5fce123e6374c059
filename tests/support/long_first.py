"""Run the longest test modules first (a pytest plugin, loaded by tests/conftest.py).

pytest-xdist runs the collection in its order, and with ``--dist worksteal`` an idle worker
takes tests from the end of the other's queue: a test of a minute that starts in the last
minute of the run leaves the other worker idle for most of it. So the modules holding the
longest tests (from ``--durations`` on the 2-core CI machine) go to the front, in this
order; every other module keeps its place after them. Whole modules move, never single
tests, so that module-scoped fixtures (a Spark session, a broker) are still set up once.
"""

from __future__ import annotations

import pytest

# Longest first; the figures are seconds of the module's longest tests in a full run.
LONG_MODULES = (
    "test_demo.py",  # ~75: two Spark drivers, one SIGKILLed
    "test_spark_sink.py",  # ~65 + ~65: each a Spark driver process or two
    "test_cluster_faults.py",  # ~55: a 50 s fault schedule on a 3-broker cluster
    "test_fuzz_wire.py",  # ~37 + ~33 + ~32 + ~24 + ~18 + ~14
    "test_compaction_broker.py",  # ~36 + ~25 + ~9
    "test_cluster_coordinators.py",  # ~27 + ~22 + ~10
    "test_exactly_once_app.py",  # ~26 + ~26
    "test_compaction_cluster.py",  # ~24
    "test_disk.py",
    "test_spark_batch_write.py",  # ~15 to start its session, ~14 + ~11
    "test_spark_speculation.py",  # ~16 + ~10 + ~9 + ~9
    "test_error_response.py",  # ~17
    "test_verify_cli.py",  # ~15 + ~9
    "test_upgrade.py",
)
_RANK = {name: i for i, name in enumerate(LONG_MODULES)}


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # sort is stable: within a module, and among the other modules, the order stays.
    items.sort(key=lambda item: _RANK.get(item.path.name, len(_RANK)))
