"""offsets.retention.minutes (KIP-211) in the group coordinator, sans IO: a group without
members loses offsets older than the retention (from when it became Empty, or from each
commit for a group that never had members), pending transactional offsets stay, an Empty group
left without offsets is removed; the tombstones written replay to the same state."""

from __future__ import annotations

from oncelog.group.coordinator import GroupCoordinator, GroupState, WriteRecords
from oncelog.group.log_format import GroupKey, OffsetKey, OffsetValue

T0 = 1_000_000
RETENTION = 60_000


def coordinator():
    return GroupCoordinator(min_session_timeout_ms=1000, max_session_timeout_ms=60_000,
                            initial_rebalance_delay_ms=0)


def tombstones(effects):
    return [(key, value) for e in effects if isinstance(e, WriteRecords)
            for key, value in e.records]


def test_offsets_alone_expire_retention_after_their_commit_and_the_group_goes():
    c = coordinator()
    c.apply_offsets("simple", {("t", 0): OffsetValue(5, commit_timestamp=T0),
                               ("t", 1): OffsetValue(7, commit_timestamp=T0 + 10_000)})
    assert c.expire_offsets(T0 + RETENTION - 1, RETENTION) == []
    first = tombstones(c.expire_offsets(T0 + RETENTION, RETENTION))
    assert first == [(OffsetKey("simple", "t", 0), None)]  # the younger one stays
    assert c.fetch_offsets("simple", None, False) == [(("t", 1), OffsetValue(
        7, commit_timestamp=T0 + 10_000), None)]
    second = tombstones(c.expire_offsets(T0 + 10_000 + RETENTION, RETENTION))
    assert second == [(OffsetKey("simple", "t", 1), None), (GroupKey("simple"), None)]
    assert "simple" not in c.groups

    # The tombstones, in the order written, replay to the same state (a coordinator loading
    # the partition after a restart).
    d = coordinator()
    d.load_offset(OffsetKey("simple", "t", 0), OffsetValue(5, commit_timestamp=T0), None)
    d.load_offset(OffsetKey("simple", "t", 1), OffsetValue(7, commit_timestamp=T0), None)
    for key, value in first + second:
        if isinstance(key, OffsetKey):
            d.load_offset(key, value, None)
        else:
            d.load_group(key, value, T0)
    assert "simple" not in d.groups


def test_a_group_that_had_members_keeps_its_offsets_until_retention_after_it_became_empty():
    c = coordinator()
    member, _, _ = c.join("g", "", None, "consumer", [("range", b"")], 10_000, 30_000,
                          "client", "host", T0, require_known_member_id=False)
    c.tick(T0)
    c.apply_offsets("g", {("t", 0): OffsetValue(3, commit_timestamp=T0)})
    assert c.groups["g"].members
    # With members, nothing expires, however old.
    assert c.expire_offsets(T0 + 10 * RETENTION, RETENTION) == []
    left = T0 + 5 * RETENTION
    c.leave("g", [(member, None)], left)
    assert c.groups["g"].state == GroupState.EMPTY
    assert c.expire_offsets(left + RETENTION - 1, RETENTION) == []
    written = tombstones(c.expire_offsets(left + RETENTION, RETENTION))
    assert written == [(OffsetKey("g", "t", 0), None), (GroupKey("g"), None)]
    assert "g" not in c.groups


def test_offsets_pending_in_a_transaction_stay_and_keep_the_group():
    c = coordinator()
    c.apply_offsets("txn", {("t", 0): OffsetValue(1, commit_timestamp=T0)})
    c.add_pending_txn_offsets("txn", 42, {("t", 0): OffsetValue(2, commit_timestamp=T0)})
    c.add_pending_txn_offsets("txn", 42, {("t", 1): OffsetValue(9, commit_timestamp=T0)})
    assert c.expire_offsets(T0 + RETENTION, RETENTION) == []
    c.complete_txn_offsets(["txn"], 42, commit=False)
    written = tombstones(c.expire_offsets(T0 + RETENTION, RETENTION))
    assert written == [(OffsetKey("txn", "t", 0), None), (GroupKey("txn"), None)]
