"""The group coordinator, sans IO (group/): the classic protocol's state machine, committed
and pending transactional offsets (KIP-447), and the __consumer_offsets record format; every
case driven with explicit times, no sockets, no sleeps."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from oncelog.group.coordinator import (
    GroupCoordinator,
    GroupState,
    RespondJoin,
    RespondSync,
    WriteRecords,
)
from oncelog.group.log_format import (
    GroupKey,
    GroupLogFormatError,
    GroupValue,
    MemberValue,
    OffsetKey,
    OffsetValue,
    decode_group,
    decode_key,
    decode_offset,
    encode_group,
    encode_key,
    encode_offset,
)

T0 = 1_000_000
PROTOCOLS = [("range", b"sub")]
G = GroupState


def coordinator(delay=0):
    return GroupCoordinator(min_session_timeout_ms=1000, max_session_timeout_ms=60_000,
                            initial_rebalance_delay_ms=delay)


def join(c, member="", now=T0, group="g", instance=None, protocols=PROTOCOLS, session=10_000,
         known=True):
    return c.join(group, member, instance, "consumer", protocols, session, 30_000, "client",
                  "host", now, require_known_member_id=known)


def joins(effects):
    return {e.member_id: e.response for e in effects if isinstance(e, RespondJoin)}


def test_first_member_must_come_back_with_its_id_then_leads_alone():
    c = coordinator()
    member, response, _ = join(c)
    assert response.error == ErrorCode.member_id_required and member
    member2, response, effects = join(c, member)
    assert member2 == member and response is None  # held until the rebalance completes
    done = joins(effects)[member]
    assert (done.error, done.generation, done.leader, done.protocol) == (None, 1, member,
                                                                         "range")
    assert [m for m, _, _ in done.members] == [member]
    assert c.groups["g"].state == G.COMPLETING_REBALANCE
    response, effects = c.sync("g", 1, member, None, {member: b"assignment"}, T0)
    writes = [e for e in effects if isinstance(e, WriteRecords)]
    syncs = [e for e in effects if isinstance(e, RespondSync)]
    assert response is None and syncs[0].response.assignment == b"assignment"
    assert isinstance(writes[0].records[0][0], GroupKey)
    assert c.groups["g"].state == G.STABLE


def _stable_pair(c):
    a, _, _ = join(c, known=False)
    c.sync("g", 1, a, None, {a: b"a-all"}, T0)
    b, response, _ = join(c, known=False, now=T0 + 1)  # a second member: a rebalance
    assert response is None and c.groups["g"].state == G.PREPARING_REBALANCE
    assert c.heartbeat("g", 1, a, None, T0 + 2) == ErrorCode.rebalance_in_progress
    _, response, effects = join(c, a, now=T0 + 3)  # a rejoins: everyone is in
    done = joins(effects)
    assert set(done) == {a, b} and done[a].generation == 2
    leader = done[a].leader
    assert len(done[leader].members) == 2
    follower = b if leader == a else a
    assert c.sync("g", 2, follower, None, None, T0 + 4) == (None, [])  # waits for the leader
    _, effects = c.sync("g", 2, leader, None, {a: b"a-half", b: b"b-half"}, T0 + 4)
    assigned = {e.member_id: e.response.assignment for e in effects
                if isinstance(e, RespondSync)}
    assert assigned == {a: b"a-half", b: b"b-half"}
    return a, b


def test_a_second_member_triggers_a_rebalance_and_both_get_assignments():
    c = coordinator()
    _stable_pair(c)
    assert c.groups["g"].state == G.STABLE and c.groups["g"].generation == 2


def test_heartbeat_and_sync_errors():
    c = coordinator()
    a, b = _stable_pair(c)
    assert c.heartbeat("g", 2, a, None, T0 + 5) is None
    assert c.heartbeat("g", 1, a, None, T0 + 5) == ErrorCode.illegal_generation
    assert c.heartbeat("g", 2, "nobody", None, T0 + 5) == ErrorCode.unknown_member_id
    assert c.heartbeat("nogroup", 2, a, None, T0 + 5) == ErrorCode.unknown_member_id
    assert c.sync("g", 1, a, None, None, T0 + 5)[0].error == ErrorCode.illegal_generation
    assert c.sync("g", 2, a, None, None, T0 + 5)[0].assignment == b"a-half"  # Stable: at once


def test_a_member_whose_session_expires_is_removed_and_the_group_rebalances():
    c = coordinator()
    a, b = _stable_pair(c)
    c.heartbeat("g", 2, a, None, T0 + 9_000)
    effects = c.tick(T0 + 10_010)  # b's last heartbeat was at T0 + 4
    assert b not in c.groups["g"].members and c.groups["g"].state == G.PREPARING_REBALANCE
    assert joins(effects)[b].error == ErrorCode.unknown_member_id  # a held join of b's is answered
    _, response, effects = join(c, a, now=T0 + 10_020)
    assert joins(effects)[a].generation == 3 and joins(effects)[a].leader == a


def test_leave_group_rebalances_and_the_last_leaving_empties_it():
    c = coordinator()
    a, b = _stable_pair(c)
    errors, _ = c.leave("g", [(b, None), ("ghost", None)], T0 + 10)
    assert errors == [None, ErrorCode.unknown_member_id]
    assert c.groups["g"].state == G.PREPARING_REBALANCE
    errors, effects = c.leave("g", [(a, None)], T0 + 11)
    assert errors == [None] and c.groups["g"].state == G.EMPTY
    assert any(isinstance(e, WriteRecords) for e in effects)  # the empty group is written


def test_initial_rebalance_delay_waits_for_more_members():
    c = coordinator(delay=3000)
    a, response, effects = join(c, known=False)
    assert response is None and not joins(effects)
    b, response, effects = join(c, known=False, now=T0 + 1000)
    assert not joins(effects)
    done = joins(c.tick(T0 + 3999))
    assert not done
    done = joins(c.tick(T0 + 4000))  # 3 s after the last new member
    assert set(done) == {a, b} and done[a].generation == 1


def test_session_timeout_bounds_and_protocol_checks():
    c = coordinator()
    assert join(c, session=500)[1].error == ErrorCode.invalid_session_timeout
    assert join(c, session=60_001)[1].error == ErrorCode.invalid_session_timeout
    assert join(c, group="")[1].error == ErrorCode.invalid_group_id
    a, _, _ = join(c, known=False)
    assert join(c, known=False, protocols=[("other", b"")])[1].error == \
        ErrorCode.inconsistent_group_protocol
    assert join(c, "unknown-id")[1].error == ErrorCode.unknown_member_id
    assert a in c.groups["g"].members


def test_a_restarted_static_member_takes_its_place_without_a_rebalance():
    c = coordinator()
    a, _, _ = join(c, known=False, instance="i-1")
    c.sync("g", 1, a, "i-1", {a: b"mine"}, T0)
    b, _, _ = join(c, known=False, instance="i-2", now=T0 + 1)
    _, _, effects = join(c, a, instance="i-1", now=T0 + 2)
    leader = joins(effects)[a].leader
    c.sync("g", 2, leader, None, {a: b"a-part", b: b"b-part"}, T0 + 3)
    follower, follower_instance = (b, "i-2") if leader == a else (a, "i-1")
    # the follower's process restarts: same instance id, a new member id, no rebalance
    new, response, effects = join(c, known=False, instance=follower_instance, now=T0 + 5)
    assert new != follower and response is not None
    assert (response.error, response.generation, response.leader) == (None, 2, leader)
    assert c.groups["g"].state == G.STABLE
    assert c.sync("g", 2, new, follower_instance, None, T0 + 6)[0].assignment == \
        c.groups["g"].members[new].assignment != b""
    assert c.heartbeat("g", 2, follower, follower_instance, T0 + 7) == ErrorCode.fenced_instance_id
    # a leader's restart does not rebalance either (Kafka's updateStaticMemberAndRebalance):
    # it gets the members back with skip_assignment (KIP-814) and its current assignment
    leader_instance = "i-1" if leader == a else "i-2"
    assignment = c.groups["g"].members[leader].assignment
    new_leader, response, effects = join(c, known=False, instance=leader_instance, now=T0 + 8)
    assert (response.error, response.generation, response.leader, response.skip_assignment) \
        == (None, 2, new_leader, True)
    assert {m for m, _, _ in response.members} == set(c.groups["g"].members)
    assert c.groups["g"].state == G.STABLE
    assert any(isinstance(e, WriteRecords) for e in effects)  # the new member id is stored
    assert c.sync("g", 2, new_leader, leader_instance, {}, T0 + 9)[0].assignment == assignment
    assert c.heartbeat("g", 2, leader, leader_instance, T0 + 10) == ErrorCode.fenced_instance_id


def test_a_static_member_rejoining_with_another_protocol_rebalances():
    """Only a change of the group's selected protocol makes a static member's restart
    rebalance the group."""
    c = coordinator()
    a, _, _ = join(c, known=False, instance="i-1")
    b, _, _ = join(c, known=False, instance="i-2", now=T0 + 1)
    _, _, effects = join(c, a, instance="i-1", now=T0 + 2)
    leader = joins(effects)[a].leader
    c.sync("g", 2, leader, None, {a: b"a-part", b: b"b-part"}, T0 + 3)
    assert c.groups["g"].protocol == "range"
    # both members now prefer roundrobin (the other one already, the leader after its
    # restart): the group's protocol would change, so the restart rebalances
    both = [("roundrobin", b"sub"), ("range", b"sub")]
    other = b if leader == a else a
    c.groups["g"].members[other].protocols = both
    leader_instance = "i-1" if leader == a else "i-2"
    _, response, _ = join(c, known=False, instance=leader_instance, protocols=both, now=T0 + 5)
    assert response is None and c.groups["g"].state == G.PREPARING_REBALANCE


def test_offset_commits_are_validated_against_the_generation():
    c = coordinator()
    a, b = _stable_pair(c)
    assert c.validate_commit("g", 2, a, None, transactional=False) is None
    assert c.validate_commit("g", 1, a, None, transactional=False) == ErrorCode.illegal_generation
    assert c.validate_commit("g", 2, "x", None, transactional=False) == ErrorCode.unknown_member_id
    assert c.validate_commit("g", -1, "", None, transactional=False) == ErrorCode.unknown_member_id
    assert c.validate_commit("solo", -1, "", None, transactional=False) is None  # simple
    # KIP-447: a zombie's TxnOffsetCommit with an old generation is fenced...
    assert c.validate_commit("g", 1, a, None, transactional=True) == ErrorCode.illegal_generation
    # ...an old client sending no group metadata is not.
    assert c.validate_commit("g", -1, "", None, transactional=True) is None


def test_pending_transactional_offsets_until_the_marker():
    c = coordinator()
    tp = ("in", 0)
    c.apply_offsets("g", {tp: OffsetValue(3)})
    c.add_pending_txn_offsets("g", 77, {tp: OffsetValue(10)})
    assert c.fetch_offsets("g", [tp], require_stable=True) == [(tp, None,
                                                                ErrorCode.unstable_offset_commit)]
    assert c.fetch_offsets("g", [tp], require_stable=False)[0][1].offset == 3
    c.complete_txn_offsets(["g"], 77, commit=False)
    assert c.fetch_offsets("g", [tp], require_stable=True)[0][1].offset == 3
    c.add_pending_txn_offsets("g", 77, {tp: OffsetValue(12)})
    c.complete_txn_offsets(["g"], 77, commit=True)
    assert c.fetch_offsets("g", None, require_stable=True)[0][1].offset == 12


def test_replay_of_transactional_offsets():
    c = coordinator()
    key = OffsetKey("g", "in", 0)
    c.load_offset(key, OffsetValue(5), None)
    c.load_offset(key, OffsetValue(9), producer_id=4)
    assert c.groups["g"].offsets[("in", 0)].offset == 5
    c.complete_txn_offsets(["g"], 4, commit=True)
    assert c.groups["g"].offsets[("in", 0)].offset == 9


def test_delete_group():
    c = coordinator()
    _stable_pair(c)
    assert c.delete_group("g", T0)[0] == ErrorCode.non_empty_group
    assert c.delete_group("nope", T0)[0] == ErrorCode.group_id_not_found
    c.apply_offsets("solo", {("t", 0): OffsetValue(1)})
    err, effects = c.delete_group("solo", T0)
    assert err is None and "solo" not in c.groups
    assert {v for _, v in effects[0].records} == {None}  # tombstones


@given(st.text(max_size=30), st.text(max_size=30), st.integers(0, 2**31 - 1),
       st.integers(-1, 2**62), st.integers(-1, 2**31 - 1), st.text(max_size=30))
def test_record_round_trips(group, topic, partition, offset, epoch, metadata):
    for key in (OffsetKey(group, topic, partition), GroupKey(group)):
        assert decode_key(encode_key(key)) == key
    value = OffsetValue(offset, epoch, metadata, 123)
    assert decode_offset(encode_offset(value)) == value
    g = GroupValue("consumer", 3, "range", "m1", 5, (
        MemberValue("m1", None, "c", "h", 1000, 2000, b"s", b"a"),
        MemberValue("m2", "i", "c", "h", 1000, 2000, b"", b"")))
    assert decode_group(encode_group(g)) == g


def test_damaged_records_are_reported():
    with pytest.raises(GroupLogFormatError):
        decode_key(b"\x00\x09\x00\x01g")
    with pytest.raises(GroupLogFormatError):
        decode_offset(encode_offset(OffsetValue(1))[:-2])


def test_offset_delete_follows_the_group_state():
    """OffsetDelete (KIP-496) sans IO: an Empty group loses committed and pending transactional
    offsets of the partitions (tombstones written); a live consumer group keeps those of
    subscribed topics; a live group of another protocol type refuses; no group: not found."""
    c = coordinator()
    value = OffsetValue(5, -1, "", T0)
    c.apply_offsets("e", {("t", 0): value, ("t", 1): value})
    c.add_pending_txn_offsets("e", 9, {("t", 0): value})
    err, per, effects = c.delete_offsets("e", [("t", 0), ("u", 0)], lambda _: ())
    assert (err, per) == (None, {("t", 0): None, ("u", 0): None})
    (write,) = effects
    assert write.records == ((OffsetKey("e", "t", 0), None),)
    assert c.fetch_offsets("e", None, False) == [(("t", 1), value, None)]
    c.complete_txn_offsets(["e"], 9, commit=True)  # the pending one went too
    assert c.fetch_offsets("e", [("t", 0)], False) == [(("t", 0), None, None)]
    _stable_pair(c)  # group "g", protocol type consumer, members subscribed to "t"
    c.apply_offsets("g", {("t", 0): value, ("x", 0): value})
    err, per, effects = c.delete_offsets("g", [("t", 0), ("x", 0)], lambda meta: ("t",))
    assert (err, per) == (None, {("t", 0): ErrorCode.group_subscribed_to_topic, ("x", 0): None})
    c.groups["g"].protocol_type = "connect"
    assert c.delete_offsets("g", [("x", 0)], lambda meta: ())[0] == ErrorCode.non_empty_group
    assert c.delete_offsets("nobody", [("t", 0)], lambda meta: ())[0] == ErrorCode.group_id_not_found
