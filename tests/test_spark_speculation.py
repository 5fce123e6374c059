"""Speculative execution against the exactly-once sink.

Spark launches a speculative copy of a task only on another host than the running attempt
(TaskSetManager never puts two attempts of a task on one host), so no local-mode job can produce
one (checked: local[3] with spark.speculation and a 25 s straggler ran no second attempt). These
tests therefore play Spark's part with real processes: the driver-side writer is created here
and pickled to two executor processes, attempts 0 and 1 of the same task of the same
micro-batch, each with the TaskContext Spark would give it; attempt 1 wins, the driver commits
its commit message alone, and the straggler goes on. Whatever it does, the batch must be in the
output exactly once and nothing of the sink may stay open."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("pyspark")

from support import spark_faults
from support.spark_tasks import (  # noqa: F401 (broker: a fixture)
    attempt,
    broker,
    committed_output,
    open_transactions,
    result,
    wait_open,
    writer_for,
)

pytestmark = [pytest.mark.slow, pytest.mark.spark]

@pytest.mark.parametrize("straggler_point", ["before-prepare", "after-prepare"])
def test_a_straggler_whose_transaction_is_open_at_the_commit_is_aborted(
        broker, tmp_path, straggler_point):  # noqa: F811 (the fixture)
    """The straggler has written (and maybe prepared) when the driver commits the winner: the
    driver aborts it with the other leftovers; the straggler fails, its rows never appear."""
    writer = writer_for(broker, tmp_path)
    rows = [f"r{i}".encode() for i in range(50)]
    straggler = attempt(writer, 0, 0, rows, slow=f"task:0:0:{straggler_point}:8",
                        log=tmp_path / "faults")
    wait_open(broker, f"{writer.opts.prefix}-0-0")
    winner, err = result(attempt(writer, 1, 0, rows))
    assert winner is not None and not winner.skipped and winner.state, err
    writer_for(broker, tmp_path).commit([winner], 0)  # PySpark commits with a new writer
    lost, _ = result(straggler)
    assert lost is None  # fenced: its prepare (or nothing after it) failed
    assert spark_faults.acted(tmp_path / "faults") == [f"task:0:0:{straggler_point}"]
    assert committed_output(broker) == rows
    assert open_transactions(broker) == []


def test_a_straggler_that_opens_its_transaction_after_the_commit_aborts_itself(
        broker, tmp_path):  # noqa: F811 (the fixture)
    """The straggler passed its replay check before the commit and opens its transaction only
    after the driver has cleaned up: after preparing it sees the batch committed for its
    partition and aborts its own transaction."""
    writer = writer_for(broker, tmp_path)
    rows = [f"r{i}".encode() for i in range(50)]
    straggler = attempt(writer, 0, 0, rows, slow="task:0:0:begin:8", log=tmp_path / "faults")
    winner, err = result(attempt(writer, 1, 0, rows))
    assert winner is not None and winner.state, err
    writer_for(broker, tmp_path).commit([winner], 0)
    assert open_transactions(broker) == []
    late, err = result(straggler)
    assert late is not None and late.skipped and not late.state, err
    assert spark_faults.acted(tmp_path / "faults") == ["task:0:0:begin"]
    assert committed_output(broker) == rows
    assert open_transactions(broker) == []


def test_the_next_micro_batch_is_not_held_up_by_a_straggler_of_the_last(
        broker, tmp_path):  # noqa: F811 (the fixture)
    """Batch 1 runs while batch 0's straggler still holds a prepared transaction: batch 1's
    commit aborts it; both batches appear once, in order."""
    writer = writer_for(broker, tmp_path)
    first = [f"a{i}".encode() for i in range(20)]
    second = [f"b{i}".encode() for i in range(20)]
    straggler = attempt(writer, 0, 0, first, slow="task:0:0:after-prepare:15",
                        log=tmp_path / "faults")
    wait_open(broker, f"{writer.opts.prefix}-0-0")
    winner, _ = result(attempt(writer, 1, 0, first))
    # The driver is slow to commit batch 0 here: the straggler prepares in the meantime...
    time.sleep(1)
    writer_for(broker, tmp_path).commit([winner], 0)
    nxt, err = result(attempt(writer, 0, 1, second))  # batch 1, attempt 0 of the same task
    assert nxt is not None and nxt.state, err
    writer_for(broker, tmp_path).commit([nxt], 1)
    assert committed_output(broker) == first + second
    result(straggler)
    assert open_transactions(broker) == []
    assert spark_faults.acted(tmp_path / "faults") == ["task:0:0:after-prepare"]
