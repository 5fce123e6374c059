"""A sweep sampled in the unit tier, whole in the full suite.

A property test whose strength is its breadth (every API and version, thousands of fuzzed
inputs) costs the unit tier (``scripts/test.sh --fast``) most of its time. Such a test takes its
example count as a parameter: ``sample`` examples in the unit tier, new ones each run
(hypothesis draws from a fresh random seed every run, and prints what to reproduce a failure
with), and ``sweep`` examples, the test's whole breadth, in a ``slow`` twin that the full suite
runs (``bash scripts/test.sh``, or ``pytest -m slow -k sweep tests/test_x.py`` for one file)::

    @pytest.mark.parametrize("examples", sample_and_sweep(40, 1200))
    def test_x(examples):
        @settings(max_examples=examples, deadline=None)
        @given(...)
        def check(...): ...
        check()
"""

from __future__ import annotations

import pytest
from _pytest.mark import ParameterSet


def sample_and_sweep(sample: int, sweep: int) -> list[ParameterSet]:
    """The ``examples`` parameter of such a test: ``sample`` (id ``sample``), in the unit tier,
    and ``sweep`` (id ``sweep``, marked ``slow``), in the full suite."""
    assert 0 < sample < sweep
    return [pytest.param(sample, id="sample"),
            pytest.param(sweep, id="sweep", marks=pytest.mark.slow)]
