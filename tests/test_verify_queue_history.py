"""The queue history format (verify/queue_history.py): reading with line-numbered errors,
merging the files of several processes, completing killed processes' ops, saving."""

from __future__ import annotations

import json

import pytest

from oncelog.verify.jepsen import check_queue
from oncelog.verify.queue_history import (
    HistoryError,
    drain_end,
    history_meta,
    is_queue_history,
    load,
    merge,
    pairs,
    save,
)


def write(path, *lines):
    path.write_text("".join((ln if isinstance(ln, str) else json.dumps(ln)) + "\n"
                            for ln in lines))
    return path


def inv(p, t, f="txn", value=None, txn=True):
    return {"type": "invoke", "f": f, "process": p, "time": t, "txn": txn,
            "value": value if value is not None else [["send", "q:0", t]]}


def done(p, t, kind="ok", f="txn", value=None, txn=True):
    return {"type": kind, "f": f, "process": p, "time": t, "txn": txn,
            "value": value if value is not None else [["send", "q:0", [t, t]]]}


META = {"type": "meta", "workload": "copier", "keys": ["in:0", "out:0"],
        "copies": {"in:0": "out:0"}}


def test_load_reads_a_history_and_numbers_it(tmp_path):
    path = write(tmp_path / "h.jsonl", META, inv("a", 1), done("a", 2), "",
                 {"type": "meta", "f": "drain_end", "value": {"q:0": {"reached": 3, "end": 3}}})
    ops = load(path)
    assert [op.index for op in ops] == [0, 1, 2, 3]
    assert history_meta(ops).copies == {"in:0": "out:0"}
    end = drain_end(ops)
    assert end is not None and end.value["q:0"]["reached"] == 3
    assert is_queue_history(path)


@pytest.mark.parametrize("line, message", [
    ("{not json", "not JSON"),
    ('["a list"]', "expected a JSON object"),
    ({"type": "done"}, "type: one of"),
    ({"type": "invoke", "f": "read", "process": "a", "time": 1, "value": []}, "f: one of"),
    ({"type": "invoke", "f": "send", "process": "a", "time": "1", "value": []}, "time"),
    ({"type": "invoke", "f": "send", "time": 1, "value": []}, "process"),
    (inv("a", 1, value=[["send", "q:0", [1, 2]]]), "an invoked send's value is an integer"),
    (inv("a", 1, value=[["append", "q:0", 1]]), "micro-op 0"),
    (inv("a", 1, value=[["send", 7, 1]]), "a key is a string"),
    (inv("a", 1, value=[["poll", {}]]), "a poll is"),
    ({"type": "info", "f": "crash", "process": "a", "time": 1, "txn": "yes"}, "txn"),
    ({"type": "meta", "f": "drain_end", "value": {"q:0": {"reached": 1}}}, "reached and end"),
    ({"type": "meta", "copies": ["in:0"]}, "copies"),
])
def test_a_malformed_line_is_refused_with_its_number(tmp_path, line, message):
    path = write(tmp_path / "h.jsonl", inv("a", 1), done("a", 2), line)
    with pytest.raises(HistoryError) as exc:
        load(path)
    assert "h.jsonl:3: " in str(exc.value) and message in str(exc.value)


def test_a_bad_completion_is_refused(tmp_path):
    path = write(tmp_path / "h.jsonl", inv("a", 1), done("a", 2, value=[["send", "q:0", 5]],
                                                       kind="ok") | {"value": [["poll", 3]]})
    with pytest.raises(HistoryError, match=r"h.jsonl:2: micro-op 0: a poll is"):
        load(path)


def test_sequence_errors(tmp_path):
    path = write(tmp_path / "a.jsonl", inv("a", 1), inv("a", 2))
    with pytest.raises(HistoryError, match=r"a.jsonl:2: a invokes txn while its txn of line 1"):
        load(path)
    path = write(tmp_path / "b.jsonl", done("a", 2))
    with pytest.raises(HistoryError, match=r"b.jsonl:1: ok txn of a completes nothing"):
        load(path)
    path = write(tmp_path / "c.jsonl", inv("a", 1), done("a", 2, f="poll",
                                                         value=[["poll", {}]]))
    with pytest.raises(HistoryError, match=r"c.jsonl:2: ok poll of a completes a txn"):
        load(path)


def test_merge_by_time_completes_killed_processes(tmp_path):
    a = write(tmp_path / "history-a.jsonl", META, inv("a", 10), done("a", 40), inv("a", 50))
    b = write(tmp_path / "history-b.jsonl", META, inv("b", 20), done("b", 30),
              inv("b", 60), {"type": "info", "f": "crash", "process": "b", "time": 70})
    drain = write(tmp_path / "history-drain-1.jsonl",
                  inv("drain-1", 80, f="poll", value=[["poll"]], txn=False),
                  done("drain-1", 90, f="poll", txn=False,
                       value=[["poll", {"q:0": [[30, 30], [40, 40]]}]]),
                  {"type": "meta", "f": "drain_end", "value": {"q:0": {"reached": 61,
                                                                        "end": 61}}})
    ops = merge([a, b, drain])
    assert [op.index for op in ops] == list(range(len(ops)))
    rows = [(op.type, op.f, op.process, op.time) for op in ops]
    assert rows == [
        ("meta", None, None, None),
        ("invoke", "txn", "a", 10), ("invoke", "txn", "b", 20), ("ok", "txn", "b", 30),
        ("ok", "txn", "a", 40), ("invoke", "txn", "a", 50), ("invoke", "txn", "b", 60),
        ("info", "txn", "b", 70),  # b's op ended by its crash
        ("info", "crash", "b", 70),
        ("invoke", "poll", "drain-1", 80), ("ok", "poll", "drain-1", 90),
        ("meta", "drain_end", None, None),  # no time: after the line before it in its file
        ("info", "txn", "a", 90),  # a was killed mid-op: indeterminate, at the end
    ]
    assert ops[7].value == [["send", "q:0", 60]] and ops[7].error
    assert [(i.index, c.index if c else None) for i, c in pairs(ops)] == [
        (1, 4), (2, 3), (5, 12), (6, 7), (9, 10)]
    assert pairs(ops[:6])[2] == (ops[5], None)
    out = tmp_path / "history.jsonl"
    save(out, ops)
    again = load(out)
    assert [op.to_dict() for op in again] == [op.to_dict() for op in ops]
    # the merged history checks clean: a's and b's last sends are indeterminate, not lost
    v = check_queue(again)
    assert v.ok and not v.anomalies, v.table()


def test_merge_refuses_two_different_workloads(tmp_path):
    a = write(tmp_path / "a.jsonl", META)
    b = write(tmp_path / "b.jsonl", META | {"workload": "spark"})
    with pytest.raises(HistoryError, match="b.jsonl:1: a workload meta line that differs"):
        merge([a, b])


def test_the_older_format_is_not_taken_for_a_queue_history(tmp_path):
    old = write(tmp_path / "old.jsonl", {"type": "write", "writer": "w", "txn": 0, "value": "x",
                                         "topic": "t", "partition": 0, "send": "ok"})
    assert not is_queue_history(old)
