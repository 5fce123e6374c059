"""The fault runner's recovery window: a client inside an operation when the faults are healed
(a library call stuck behind a fault, ended by its own timeout) is given that operation's bound
before it may count as not recovered; a client idle or working normally at the heal is not."""

from __future__ import annotations

import json
from pathlib import Path

from oncelog.faults.run import _crossed_heal, _history_ops, _ok_after

HEAL = 1_000


def history(tmp_path: Path, *ops: tuple[str, int]) -> Path:
    path = tmp_path / "history.jsonl"
    path.write_text("".join(json.dumps({"type": kind, "f": "txn", "process": "c", "time": at})
                            + "\n" for kind, at in ops))
    return path


def test_a_call_still_in_flight_since_before_the_heal_is_waited_for(tmp_path: Path) -> None:
    assert _crossed_heal(history(tmp_path, ("invoke", 10), ("ok", 20), ("invoke", 900)), HEAL)


def test_a_call_that_failed_after_the_heal_is_waited_for_until_an_ok(tmp_path: Path) -> None:
    path = history(tmp_path, ("invoke", 900), ("meta", 1500), ("fail", 1600))
    assert _crossed_heal(path, HEAL)
    assert _crossed_heal(history(tmp_path, ("invoke", 900), ("fail", 1600), ("invoke", 1700)),
                         HEAL)
    assert not _crossed_heal(history(tmp_path, ("invoke", 900), ("fail", 1600), ("invoke", 1700),
                                     ("ok", 1800)), HEAL)


def test_clients_not_inside_a_call_at_the_heal_are_not_waited_for(tmp_path: Path) -> None:
    assert not _crossed_heal(history(tmp_path, ("invoke", 10), ("ok", 20)), HEAL)
    assert not _crossed_heal(history(tmp_path, ("invoke", 10), ("ok", 20), ("invoke", 1100)),
                             HEAL)
    assert not _crossed_heal(history(tmp_path, ("invoke", 900), ("ok", 1100)), HEAL)
    assert not _crossed_heal(tmp_path / "missing.jsonl", HEAL)


def test_both_checks_read_the_history_alike(tmp_path: Path) -> None:
    """One reader of the history for the wait (``_crossed_heal``) and for the verdict
    (``_ok_after``, which ``_unrecovered`` asks per client): a line cut short by a client
    still writing it, and a line that is no operation, are skipped by both."""
    path = history(tmp_path, ("invoke", 900), ("ok", 1100))
    with open(path, "a") as f:
        f.write('[1, 2]\n{"type": "ok", "time": "soon"}\n{"type": "invoke", "ti')
    assert list(_history_ops(path)) == [("invoke", 900), ("ok", 1100)]
    assert _ok_after(path, HEAL) and not _crossed_heal(path, HEAL)
    assert not _ok_after(path, 1100)
    assert not _ok_after(tmp_path / "missing.jsonl", HEAL)
    assert list(_history_ops(None)) == []
