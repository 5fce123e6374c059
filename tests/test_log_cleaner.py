"""The log cleaner on one partition's log, sans broker: random transactional histories cleaned
again and again (spec 000, "Compacting Transactional Data"), markers and tombstones that go
only in a pass after delete.retention.ms (KIP-534), the producer state that survives
(spec 000, "Discussion on PID Expiration for Compacted Topics"), crashes mid-swap, the
bounded offset map, and which logs the manager picks."""

from __future__ import annotations

import os
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode
from support.compaction import History, clean_now, latest_values, read_log
from support.logs import advance_high_watermark, open_log

from oncelog.log import LogAppendError, LogConfig, PartitionLog
from oncelog.log.cleaner_manager import CHECKPOINT_FILE, CleanerManager
from oncelog.log.log_cleaner import CLEANED_SUFFIX, SWAP_SUFFIX, clean, plan
from oncelog.log.offset_map import BYTES_PER_ENTRY, OffsetMap
from oncelog.records import build_batch, parse_header, split_batches

RETENTION = 500


def compacted(path, **overrides) -> PartitionLog:
    cfg = {"segment_bytes": 1500, "cleanup_policy": frozenset({"compact"}),
           "delete_retention_ms": RETENTION, "min_cleanable_dirty_ratio": 0.0}
    cfg.update(overrides)
    return open_log(path, LogConfig(**cfg))


# The appends below are a single node's leader's: its replica manager, the only in-sync
# replica, moves the high watermark to the log end after each.


def write(plog, records, now, pid=-1, seq=-1, transactional=False, epoch=0):
    data = bytearray(build_batch([(k, v, [], now) for k, v in records], producer_id=pid,
                                 producer_epoch=epoch if pid >= 0 else -1, base_sequence=seq,
                                 is_transactional=transactional))
    result = plog.append(data, split_batches(data), now)
    advance_high_watermark(plog)
    return result


def marker(plog, pid, commit, now):
    result = plog.append_marker(pid, 0, commit, 0, now)
    advance_high_watermark(plog)
    return result


def all_batches(plog):
    out = []
    for seg in plog.segments:
        out.extend(h for _pos, h in seg.iter_headers())
    return out


@pytest.mark.parametrize("seed", range(6))
def test_random_histories_cleaned_again_and_again_read_the_same(tmp_path, seed):
    rng = random.Random(seed)
    plog = compacted(tmp_path / "t-0")
    history = History(plog, rng)
    manager = CleanerManager()
    cleaned = 0
    for _round in range(25):
        for _ in range(rng.randrange(10, 60)):
            history.step()
        before_committed = read_log(plog, committed=True)
        before_all = read_log(plog, committed=False)
        if clean_now(manager, plog, history.now) is not None:
            cleaned += 1
        after_committed = read_log(plog, committed=True)
        after_all = read_log(plog, committed=False)
        assert latest_values(after_committed) == latest_values(before_committed)
        assert not {r.value for r in after_committed} & history.aborted_values
        assert len(after_all) <= len(before_all)
        assert sum(h.size for h in all_batches(plog)) <= sum(
            len(r.value or b"") for r in before_all) + 200 * len(before_all) + 10_000
    assert cleaned >= 5
    # All transactions ended, everything rolled, passes a delete retention apart: one record
    # per live key and no tombstone is left. (A marker goes a pass after the last of its
    # transaction's data, and a pass after its horizon: it can take a few.)
    history.close_all()
    expected = latest_values(read_log(plog, committed=True))
    plog.roll(history.now)
    for i in range(5):
        clean_now(manager, plog, history.now + i * (RETENTION + 1))
    records = read_log(plog, committed=True)
    assert latest_values(records) == expected
    assert len(records) == len(expected) and all(r.value is not None for r in records)
    assert not {r.value for r in read_log(plog, committed=False)} & history.aborted_values
    # A marker left has data of its transaction before it, or is its producer's last entry
    # (which fences zombies), or waits for a horizon still ahead.
    last_now = history.now + 4 * (RETENTION + 1)
    batches = all_batches(plog)
    has_data: dict[int, bool] = {}
    last_index = {h.producer_id: i for i, h in enumerate(batches) if h.producer_id >= 0}
    for i, h in enumerate(batches):
        if not h.is_transactional:
            continue
        if not h.is_control:
            has_data[h.producer_id] = True
            continue
        if h.records_count:
            assert has_data.get(h.producer_id) or last_index[h.producer_id] == i or (
                h.delete_horizon_ms is not None and h.delete_horizon_ms > last_now), h
        has_data[h.producer_id] = False
    # The producers carry on after a restart: from the snapshot, and rebuilt from the log.
    for unclean in (False, True):
        if unclean:
            plog.close_unclean()
            for snap in (tmp_path / "t-0").glob("*.snapshot"):
                snap.unlink()
        else:
            plog.close(history.now)
        plog = compacted(tmp_path / "t-0")
        history.plog = plog
        pid10 = history.seq[10]
        history._append(10, [(b"k0", b"after-restart", [], history.now)], False)
        assert history.seq[10] == pid10 + 1
        for pid in range(1, 5):
            if pid in history.seq:
                history._append(pid, [(b"k1", b"txn-after-restart", [], history.now)], True)
                marker(plog, pid, True, history.now)
        assert latest_values(read_log(plog, committed=True))[b"k1"] == b"txn-after-restart" \
            or not any(pid in history.seq for pid in range(1, 5))


def test_a_marker_goes_only_in_a_pass_after_its_delete_horizon(tmp_path):
    plog = compacted(tmp_path / "t-0")
    manager = CleanerManager()
    t = 1_000_000
    write(plog, [(b"a", b"committed")], t, pid=1, seq=0, transactional=True)
    marker(plog, 1, True, t)  # offset 1
    write(plog, [(b"b", b"aborted")], t, pid=2, seq=0, transactional=True)
    marker(plog, 2, False, t)  # offset 3
    write(plog, [(b"a", b"newer")], t)  # the committed record's key is overwritten
    # Both producers write again later, so neither marker is its producer's last entry.
    write(plog, [(b"c", b"1")], t, pid=1, seq=1, transactional=True)
    marker(plog, 1, True, t)
    write(plog, [(b"c", b"2")], t, pid=2, seq=1, transactional=True)
    marker(plog, 2, True, t)
    plog.roll(t)
    write(plog, [(b"z", b"active")], t)
    clean_now(manager, plog, t)
    batches = all_batches(plog)
    # Their transactions' data goes in this pass (overwritten; aborted): the markers stay
    # as they are, the abort with its index entry.
    assert not any(h.base_offset in (0, 2) for h in batches)
    assert [h.delete_horizon_ms for h in batches if h.base_offset in (1, 3)] == [None, None]
    assert [a.last_offset for a in plog.aborted_transactions(0, 100)] == [3]
    # The next pass finds no data of theirs: they are stamped with a delete horizon.
    clean_now(manager, plog, t)
    first_markers = [h for h in all_batches(plog) if h.base_offset in (1, 3)]
    assert [h.delete_horizon_ms for h in first_markers] == [t + RETENTION] * 2
    assert plog.aborted_transactions(0, 100) == []  # nothing left for it to filter
    clean_now(manager, plog, t + RETENTION - 1)
    assert [h.base_offset for h in all_batches(plog) if h.is_control][:2] == [1, 3]
    clean_now(manager, plog, t + RETENTION)
    assert not any(h.base_offset in (1, 3) for h in all_batches(plog))
    assert latest_values(read_log(plog, committed=True)) == {b"a": b"newer", b"c": b"2",
                                                             b"z": b"active"}


def test_an_aborted_transaction_whose_marker_is_still_in_the_active_segment(tmp_path):
    plog = compacted(tmp_path / "t-0")
    manager = CleanerManager()
    t = 1_000_000
    write(plog, [(b"a", b"aborted")], t, pid=1, seq=0, transactional=True)
    write(plog, [(b"b", b"plain")], t)
    plog.roll(t)
    marker(plog, 1, False, t)
    clean_now(manager, plog, t)
    assert [r.value for r in read_log(plog, committed=True)] == [b"plain"]
    assert [r.value for r in read_log(plog, committed=False)] == [b"plain"]


def test_a_tombstone_goes_only_in_a_pass_after_delete_retention(tmp_path):
    plog = compacted(tmp_path / "t-0")
    manager = CleanerManager()
    t = 1_000_000
    write(plog, [(b"a", b"1"), (b"b", b"1")], t)
    write(plog, [(b"a", None)], t)
    plog.roll(t)
    write(plog, [(b"c", b"active")], t)
    clean_now(manager, plog, t)
    assert [(r.key, r.value) for r in read_log(plog, committed=False)] == [
        (b"b", b"1"), (b"a", None), (b"c", b"active")]
    tomb = next(h for h in all_batches(plog) if h.base_offset == 2)
    assert tomb.delete_horizon_ms == t + RETENTION
    clean_now(manager, plog, t + RETENTION - 1)
    assert len(read_log(plog, committed=False)) == 3
    clean_now(manager, plog, t + RETENTION)
    assert [(r.key, r.value) for r in read_log(plog, committed=False)] == [
        (b"b", b"1"), (b"c", b"active")]


def test_an_emptied_batch_keeps_the_producers_last_sequence(tmp_path):
    plog = compacted(tmp_path / "t-0")
    manager = CleanerManager()
    t = 1_000_000
    write(plog, [(b"a", b"1"), (b"a", b"2"), (b"b", b"1")], t, pid=7, seq=0)
    write(plog, [(b"a", b"3"), (b"b", b"2")], t)
    plog.roll(t)
    write(plog, [(b"c", b"1")], t)
    clean_now(manager, plog, t)
    first = all_batches(plog)[0]
    assert (first.records_count, first.base_sequence, first.last_sequence,
            first.producer_id) == (0, 0, 2, 7)
    plog.close_unclean()
    for snap in (tmp_path / "t-0").glob("*.snapshot"):
        snap.unlink()
    plog = compacted(tmp_path / "t-0")
    with pytest.raises(LogAppendError) as err:
        write(plog, [(b"d", b"gap")], t, pid=7, seq=5)
    assert err.value.error_name == ErrorCode.out_of_order_sequence_number
    assert write(plog, [(b"a", b"x"), (b"a", b"y"), (b"b", b"z")], t, pid=7, seq=0).duplicate
    write(plog, [(b"d", b"next")], t, pid=7, seq=3)


def test_a_crash_mid_swap_loses_nothing(tmp_path):
    for stage in ("cleaned", "swap", "swap-old-deleted"):
        d = tmp_path / stage
        plog = compacted(d)
        t = 1_000_000
        for i in range(60):
            write(plog, [(f"k{i % 7}".encode(), f"v{i}".encode())], t)
        write(plog, [(b"active", b"1")], t)
        expected = latest_values(read_log(plog, committed=True))
        manager = CleanerManager()
        p = plan(manager.log_to_clean("t-0", plog, t), t)
        result = clean(p, OffsetMap(1 << 20))
        p.close()
        g = result.groups[0]
        if stage != "cleaned":
            g.new.change_suffix(SWAP_SUFFIX)
        if stage == "swap-old-deleted":
            g.old[0].log_path.unlink()
        assert list(d.glob("*" + (CLEANED_SUFFIX if stage == "cleaned" else SWAP_SUFFIX)))
        for grp in result.groups:
            grp.new.close()
        plog.close_unclean()
        plog = compacted(d)
        advance_high_watermark(plog)  # the replica manager, taking the lead again
        assert latest_values(read_log(plog, committed=True)) == expected, stage
        assert not list(d.glob("*.cleaned")) and not list(d.glob("*.swap"))
        plog.close(t)


def test_a_log_that_changed_meanwhile_is_not_swapped(tmp_path):
    plog = compacted(tmp_path / "t-0")
    t = 1_000_000
    for i in range(40):
        write(plog, [(b"k", f"v{i}".encode())], t)
    manager = CleanerManager()
    p = plan(manager.log_to_clean("t-0", plog, t), t)
    result = clean(p, OffsetMap(1 << 20))
    p.close()
    plog.truncate_to(5)
    from oncelog.log.log_cleaner import swap

    assert not swap(result)
    assert not list((tmp_path / "t-0").glob("*.cleaned"))
    assert [r.value for r in read_log(plog, committed=True)] == [f"v{i}".encode()
                                                                  for i in range(5)]


def test_a_small_offset_map_cleans_in_several_passes(tmp_path):
    plog = compacted(tmp_path / "t-0")
    t = 1_000_000
    rng = random.Random(3)
    for i in range(400):
        write(plog, [(f"k{rng.randrange(60)}".encode(), f"v{i}".encode())], t)
    write(plog, [(b"active", b"1")], t)
    expected = latest_values(read_log(plog, committed=True))
    manager = CleanerManager()
    memory = BYTES_PER_ENTRY * 25  # room for 22 keys
    ends = []
    for _ in range(12):
        clean_now(manager, plog, t, memory)
        ends.append(manager.state(plog).first_dirty_offset)
        assert latest_values(read_log(plog, committed=True)) == expected
    assert ends[0] < ends[-1]
    assert int((tmp_path / "t-0" / CHECKPOINT_FILE).read_text()) == ends[-1]
    assert len(read_log(plog, committed=False)) < 200


def test_the_cleanable_range_ends_at_the_lso_the_active_segment_and_the_lag(tmp_path):
    plog = compacted(tmp_path / "t-0", min_compaction_lag_ms=10_000)
    manager = CleanerManager()
    t = 1_000_000
    for i in range(30):
        write(plog, [(b"k", b"x" * 40 + str(i).encode())], t)  # several segments
    write(plog, [(b"open", b"txn")], t, pid=1, seq=0, transactional=True)
    for i in range(30):
        write(plog, [(b"k", b"y" * 40 + str(i).encode())], t)
    bases = [s.base_offset for s in plog.segments]
    lso = plog.last_stable_offset
    assert lso == 30 and len(bases) > 3
    _dirty, first_uncleanable, _now = manager.cleanable_offsets(plog, t + 20_000)
    assert first_uncleanable == max(b for b in bases if b <= lso)
    _dirty, young, _now = manager.cleanable_offsets(plog, t + 5_000)
    assert young == plog.log_start_offset  # every segment is younger than the lag
    marker(plog, 1, True, t)
    _dirty, first_uncleanable, _now = manager.cleanable_offsets(plog, t + 20_000)
    assert first_uncleanable == plog.active_segment.base_offset


def test_the_manager_picks_the_filthiest_log_over_its_ratio(tmp_path):
    manager = CleanerManager()
    t = 1_000_000
    logs = []
    for name, n in (("few", 30), ("many", 60)):
        plog = compacted(tmp_path / name, min_cleanable_dirty_ratio=0.5)
        for i in range(n):
            write(plog, [(b"k", b"x" * 40 + str(i).encode())], t)
        logs.append((name, plog))
    plain = open_log(tmp_path / "plain", segment_bytes=500)
    for i in range(60):
        write(plain, [(b"k", b"x" * 40)], t)
    logs.append(("plain", plain))
    chosen = manager.grab_filthiest(logs, t)
    assert chosen is not None and chosen.cleanable_ratio == 1.0
    again = manager.grab_filthiest(logs, t)
    assert again is not None and again.name != chosen.name  # the first is in progress
    assert manager.grab_filthiest(logs, t) is None  # never the delete-only log
    manager.done_cleaning(chosen.log, chosen.first_uncleanable_offset, 2**63 - 1)
    manager.done_cleaning(again.log, None, 2**63 - 1)
    assert manager.grab_filthiest(logs, t).name == again.name
    # max.compaction.lag.ms: a log under its ratio is cleaned once its dirt is old enough.
    lagging = compacted(tmp_path / "lag", min_cleanable_dirty_ratio=0.99,
                        max_compaction_lag_ms=60_000)
    for i in range(30):
        write(lagging, [(f"k{i}".encode(), b"x" * 40)], t)
    manager.done_cleaning(lagging, 10, 2**63 - 1)
    assert manager.grab_filthiest([("lag", lagging)], t + 1_000) is None
    assert manager.grab_filthiest([("lag", lagging)], t + 61_000).name == "lag"


def test_retention_deletes_segments_only_with_the_delete_policy(tmp_path):
    t = 1_000_000
    for policy, deletes in (("compact", False), ("compact,delete", True), ("delete", True)):
        plog = compacted(tmp_path / policy.replace(",", "_"),
                         cleanup_policy=frozenset(policy.split(",")), retention_ms=1000)
        for i in range(40):
            write(plog, [(b"k", b"x" * 40 + str(i).encode())], t)
        assert bool(plog.apply_retention(t + 5000)) == deletes, policy


def test_a_compacted_topic_refuses_records_without_a_key(tmp_path):
    plog = compacted(tmp_path / "t-0")
    with pytest.raises(LogAppendError) as err:
        write(plog, [(None, b"no key")], 1_000)
    assert err.value.error_name == ErrorCode.invalid_record


def test_a_cleaned_log_reopens_with_its_indexes(tmp_path):
    plog = compacted(tmp_path / "t-0", index_interval_bytes=100)
    t = 1_000_000
    for i in range(200):
        write(plog, [(f"k{i % 13}".encode(), f"value-{i}".encode() * 3)], t + i)
    manager = CleanerManager()
    clean_now(manager, plog, t + 500)
    expected = read_log(plog, committed=False)
    for seg in plog.segments[:-1]:
        assert os.path.getsize(seg.index_path) > 0 or seg.size == 0
    plog.close(t + 500)
    plog = compacted(tmp_path / "t-0", index_interval_bytes=100)
    assert [(r.offset, r.value) for r in read_log(plog, committed=False)] == [
        (r.offset, r.value) for r in expected]
    for r in expected:
        assert plog.read(r.offset, 1, None)  # every kept offset is found through the index


def test_an_active_producers_emptied_batch_keeps_its_marker_until_it_expires(tmp_path):
    # The transaction's data is overwritten: its batch stays as an empty header (the
    # producer's last sequence), and so does its marker (a batch of its transaction is still
    # there), so that the producer state rebuilt from the log has the transaction closed.
    plog = compacted(tmp_path / "t-0")
    manager = CleanerManager()
    t = 1_000_000
    write(plog, [(b"a", b"txn")], t, pid=3, seq=0, transactional=True)
    marker(plog, 3, True, t)
    write(plog, [(b"a", b"plain")], t)
    plog.roll(t)
    write(plog, [(b"b", b"active")], t)
    for i in range(4):
        clean_now(manager, plog, t + i * (RETENTION + 1))
    kept = [h for h in all_batches(plog) if h.producer_id == 3]
    assert [(h.is_control, h.records_count) for h in kept] == [(False, 0), (True, 1)]
    plog.close_unclean()
    for snap in (tmp_path / "t-0").glob("*.snapshot"):
        snap.unlink()
    plog = compacted(tmp_path / "t-0")
    advance_high_watermark(plog)  # the replica manager, taking the lead again
    assert plog.last_stable_offset == plog.log_end_offset  # no transaction open again
    assert plog.producer_state.producers[3].last_seq == 0
    # Once the producer has expired, both go.
    plog.producer_state.expire(t + 10**9, 1)
    plog.roll(t)
    for i in range(4):
        clean_now(manager, plog, t + (4 + i) * (RETENTION + 1))
    assert not [h for h in all_batches(plog) if h.producer_id == 3]
    assert latest_values(read_log(plog, committed=True)) == {b"a": b"plain", b"b": b"active"}


@given(st.lists(st.tuples(st.binary(max_size=8), st.one_of(st.none(), st.binary(max_size=20)),
                          st.integers(0, 10_000)), min_size=1, max_size=12),
       st.data(), st.sampled_from([0, 1, 2, 4]), st.booleans(), st.booleans())
@settings(max_examples=150, deadline=None)
def test_a_rebuilt_batch_keeps_its_offsets_producer_fields_and_kept_records(
        records, data, codec, log_append, horizon):
    from oncelog.records.batch import (
        ATTR_DELETE_HORIZON,
        TIMESTAMP_LOG_APPEND_TIME,
        decode_batch,
        empty_batch,
        rebuild_batch,
        validate_batch,
    )

    ts = 1_700_000_000_000
    raw = build_batch([(k, v, [("h", b"x")], ts + d) for k, v, d in records], base_offset=500,
                      compression=codec, producer_id=9, producer_epoch=3, base_sequence=70,
                      is_transactional=True, partition_leader_epoch=4,
                      timestamp_type=TIMESTAMP_LOG_APPEND_TIME if log_append else 0)
    h, decoded = decode_batch(raw, 0)
    keep = data.draw(st.lists(st.sampled_from(range(len(decoded))), min_size=1, unique=True))
    kept = [decoded[i] for i in sorted(keep)]
    base_ts = ts + 99_999 if horizon else kept[0].timestamp
    attrs = h.attributes | (ATTR_DELETE_HORIZON if horizon else 0)
    out = rebuild_batch(h, kept, base_ts, attrs)
    nh, again = decode_batch(out, 0)
    assert validate_batch(out, 0, cleaned=True) == nh
    assert (nh.base_offset, nh.last_offset, nh.last_sequence, nh.producer_id, nh.producer_epoch,
            nh.partition_leader_epoch, nh.compression, nh.is_transactional) == (
        h.base_offset, h.last_offset, h.last_sequence, 9, 3, 4, h.compression, True)
    assert nh.delete_horizon_ms == (base_ts if horizon else None)
    assert [(r.offset, r.key, r.value, r.headers) for r in again] == [
        (r.offset, r.key, r.value, r.headers) for r in kept]
    if not log_append:
        assert [r.timestamp for r in again] == [r.timestamp for r in kept]
        assert nh.max_timestamp == max(r.timestamp for r in kept)
    empty = parse_header(empty_batch(h), 0)
    assert validate_batch(empty_batch(h), 0, cleaned=True) == empty
    assert (empty.records_count, empty.last_offset, empty.last_sequence, empty.producer_id) == (
        0, h.last_offset, h.last_sequence, 9)
