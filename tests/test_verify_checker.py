"""The history checker on hand-made histories: a clean one passes, each anomaly is found, and a
history survives a round trip through its JSON-lines file."""

from __future__ import annotations

import pytest

from oncelog.verify.checker import ANOMALIES, check
from oncelog.verify.history import History, PartitionEnd, Read, ReaderEnd, Seek, Txn, Write

T = "events"


def clean_history() -> list:
    """w1: txn 0 commits a, b (partitions 0 and 1); txn 1 aborts c; txn 2 commits d with an
    indeterminate end but all visible. One reader reads everything committed."""
    return [
        Write("w1", 0, "a", T, 0, "ok"), Write("w1", 0, "b", T, 1, "ok"),
        Txn("w1", 0, "committed"),
        Write("w1", 1, "c", T, 0, "ok"), Txn("w1", 1, "aborted"),
        Write("w1", 2, "d", T, 1, "unknown"), Write("w1", 2, "e", T, 1, "failed"),
        Txn("w1", 2, "unknown"),
        Write("w1", 3, "f", T, 0, "unknown"), Txn("w1", 3, "unknown"),  # all or nothing: none
        Seek("r1", T, 0, 0), Seek("r1", T, 1, 0),
        Read("r1", T, 0, 0, "a"), Read("r1", T, 1, 0, "b"), Read("r1", T, 1, 3, "d"),
        ReaderEnd("r1", (PartitionEnd(T, 0, 6, 6), PartitionEnd(T, 1, 5, 5))),
    ]


def counts(ops) -> dict[str, int]:
    return {k: v for k, v in check(ops).counts.items() if v}


def test_a_clean_history_passes():
    verdict = check(clean_history())
    assert verdict.ok, verdict.table()
    assert verdict.stats["committed"] == 1 and verdict.stats["aborted"] == 1
    assert verdict.stats["indeterminate"] == 2 and verdict.stats["reads"] == 3
    assert "OK, no anomalies" in verdict.table()


def test_lost_write():
    ops = [op for op in clean_history() if not (isinstance(op, Read) and op.value == "b")]
    # b missing: a lost write, and txn 0 is torn (a read, b not)
    assert counts(ops) == {"lost_write": 1, "torn_transaction": 1}
    assert "'b'" in check(ops).examples["lost_write"][0]


def test_a_lost_write_of_a_partition_nobody_read_is_not_judged():
    ops = [*clean_history()[:3], Write("w1", 4, "z", "other", 0, "ok"), Txn("w1", 4, "committed"),
           *clean_history()[3:]]
    assert counts(ops) == {}


def test_duplicate_at_two_offsets():
    ops = [*clean_history()[:-1], Read("r1", T, 0, 7, "a"), clean_history()[-1]]
    assert counts(ops) == {"duplicate": 1}


def test_duplicate_across_readers():
    ops = [*clean_history(), Read("r2", T, 1, 9, "b"),
           ReaderEnd("r2", (PartitionEnd(T, 1, 10, 10),))]
    assert counts(ops) == {"duplicate": 1}


@pytest.mark.parametrize("extra, why", [
    ([Read("r1", T, 0, 4, "c")], "aborted"),                        # aborted transaction
    ([Read("r1", T, 1, 4, "e")], "failed"),                         # failed send
    ([Write("w1", 9, "g", T, 0, "ok"), Read("r1", T, 0, 5, "g")], "never ended"),
    ([Read("r1", T, 0, 5, "ghost")], "no writer"),
])
def test_aborted_read(extra, why):
    ops = [*clean_history()[:-1], *extra, clean_history()[-1]]
    verdict = check(ops)
    assert counts(ops) == {"aborted_read": 1}
    assert why in verdict.examples["aborted_read"][0]


def test_torn_indeterminate_transaction():
    ops = [*clean_history()[:4], Write("w1", 5, "x", T, 0, "ok"), Write("w1", 5, "y", T, 1, "ok"),
           Txn("w1", 5, "unknown"), *clean_history()[4:-1], Read("r1", T, 0, 2, "x"),
           clean_history()[-1]]
    # indeterminate: x without y is torn, but nothing counts as lost
    assert counts(ops) == {"torn_transaction": 1}


def test_non_monotonic_offsets():
    ops = [*clean_history()[:-1], Read("r1", T, 0, 0, "a"), clean_history()[-1]]
    # a re-read at the same offset without a seek (not a duplicate: same position)
    assert counts(ops) == {"non_monotonic": 1}


def test_offsets_may_go_back_after_a_seek():
    ops = [*clean_history()[:-1], Seek("r1", T, 0, 0), Read("r1", T, 0, 0, "a"),
           clean_history()[-1]]
    assert counts(ops) == {}


def test_stuck_reader():
    ops = [*clean_history()[:-1],
           ReaderEnd("r1", (PartitionEnd(T, 0, 3, 6), PartitionEnd(T, 1, 5, 5)))]
    verdict = check(ops)
    assert counts(ops) == {"stuck_read": 1}
    assert "offset 3" in verdict.examples["stuck_read"][0]


def test_every_anomaly_has_a_row_in_the_table():
    table = check(clean_history()).table()
    for a in ANOMALIES:
        assert a in table


def test_history_file_round_trip(tmp_path):
    path = tmp_path / "h.jsonl"
    History(clean_history()).save(path)
    loaded = History.load(path)
    assert loaded.ops == clean_history()
    text = path.read_text().splitlines()
    assert text[0].startswith('{"type": "write"')
    assert '"complete": true' in text[-1]


def test_history_stream(tmp_path):
    path = tmp_path / "h.jsonl"
    h = History(clean_history()[:2])
    with open(path, "w") as f:
        h.stream_to(f)
        for op in clean_history()[2:]:
            h.add(op)
        h.stream_to(None)
    assert History.load(path).ops == clean_history()


def test_a_bad_history_file_names_its_line(tmp_path):
    path = tmp_path / "h.jsonl"
    path.write_text('{"type": "write", "writer": "w", "txn": 0, "value": "a", "topic": "t", '
                    '"partition": 0, "send": "ok"}\n{"type": "txn", "writer": "w", "txn": 0, '
                    '"outcome": "maybe"}\n')
    with pytest.raises(ValueError, match=r"h.jsonl:2: .*maybe"):
        History.load(path)
