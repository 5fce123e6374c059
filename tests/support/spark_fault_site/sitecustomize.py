"""Loaded at start by every Python process started with this directory on its PYTHONPATH
(tests/support/spark_faults.py): adds the plan's hook to the sink's fault points when the
process imports them. (Not before: Spark gives the Python workers it starts a few seconds to
connect back, which importing pyspark and oncelog here would eat into.)"""

import json
import os
import sys

_plan = os.environ.get("ONCELOG_TEST_SPARK_FAULTS")
_MODULE = "oncelog.spark.fault_points"


def _hook(point):
    stall = _plan["slow"] is not None and _plan["slow"][0] == point
    if point not in _plan["crash"] and not stall:
        return
    if _plan["log"]:
        with open(_plan["log"], "a") as f:
            f.write(point + "\n")
    if point in _plan["crash"]:
        os._exit(137)
    import time

    time.sleep(_plan["slow"][1])


class _AddHookOnImport:
    """A meta path finder that lets the others find the fault points' module, and adds the hook
    to it once it has run."""

    def find_spec(self, name, path, target=None):
        if name != _MODULE:
            return None
        sys.meta_path.remove(self)
        for finder in sys.meta_path:
            spec = getattr(finder, "find_spec", lambda *a: None)(name, path, target)
            if spec is not None:
                break
        else:
            return None
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            module.add_hook(_hook)

        spec.loader.exec_module = exec_module
        return spec


if _plan:
    _plan = json.loads(_plan)
    _plan["crash"] = frozenset(_plan["crash"])
    sys.meta_path.insert(0, _AddHookOnImport())
