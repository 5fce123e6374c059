"""The group coordinator, sans IO: Kafka's classic group protocol (JoinGroup, SyncGroup,
Heartbeat, LeaveGroup), committed offsets, and transactional offsets that stay pending until the
transaction's marker reaches the offsets partition (spec 000, "Consumer Coordinator"; KIP-447:
pending offsets make OffsetFetch with require_stable unstable, and the group's generation,
member id and instance id fence a zombie's TxnOffsetCommit).

Requests and ``tick`` take the current time and return responses plus effects:
``RespondJoin`` / ``RespondSync`` answer a member whose JoinGroup or SyncGroup was held until the
rebalance completed, ``WriteRecords`` appends records to the group's ``__consumer_offsets``
partition (its changes apply once the service reports the write). server/group_service.py
carries them out.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from kio.schema.errors import ErrorCode

from ..records.batch import Record
from .log_format import (
    GroupKey,
    GroupLogFormatError,
    GroupValue,
    MemberValue,
    OffsetKey,
    OffsetValue,
    decode_group,
    decode_key,
    decode_offset,
)

log = logging.getLogger("oncelog.group")

TP = tuple[str, int]


class GroupState(enum.Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


G = GroupState
VALID_PREVIOUS: dict[GroupState, frozenset[GroupState]] = {
    G.EMPTY: frozenset({G.PREPARING_REBALANCE, G.EMPTY}),
    G.PREPARING_REBALANCE: frozenset({G.STABLE, G.COMPLETING_REBALANCE, G.EMPTY}),
    G.COMPLETING_REBALANCE: frozenset({G.PREPARING_REBALANCE}),
    G.STABLE: frozenset({G.COMPLETING_REBALANCE}),
    G.DEAD: frozenset({G.STABLE, G.PREPARING_REBALANCE, G.COMPLETING_REBALANCE, G.EMPTY,
                       G.DEAD}),
}


class IllegalGroupTransitionError(Exception):
    pass


@dataclass
class Member:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocols: list[tuple[str, bytes]]
    last_heartbeat_ms: int
    assignment: bytes = b""
    awaiting_join: bool = False
    awaiting_sync: bool = False

    def metadata(self, protocol: str | None) -> bytes:
        return next((m for name, m in self.protocols if name == protocol), b"")


@dataclass
class Group:
    group_id: str
    state: GroupState = G.EMPTY
    protocol_type: str | None = None
    protocol: str | None = None
    generation: int = 0
    leader: str | None = None
    members: dict[str, Member] = field(default_factory=dict)
    static_members: dict[str, str] = field(default_factory=dict)  # instance id -> member id
    pending_members: set[str] = field(default_factory=set)  # told MEMBER_ID_REQUIRED
    rebalance_deadline_ms: int = 0
    initial_delay_until_ms: int = 0
    state_timestamp_ms: int = -1
    offsets: dict[TP, OffsetValue] = field(default_factory=dict)
    pending_txn_offsets: dict[int, dict[TP, OffsetValue]] = field(default_factory=dict)

    def transition_to(self, state: GroupState, now_ms: int) -> None:
        if self.state not in VALID_PREVIOUS[state]:
            raise IllegalGroupTransitionError(
                f"group {self.group_id!r}: {self.state.value} -> {state.value}")
        self.state = state
        self.state_timestamp_ms = now_ms

    def has_pending_offsets(self, tp: TP) -> bool:
        return any(tp in p for p in self.pending_txn_offsets.values())


@dataclass(frozen=True)
class JoinResponse:
    error: ErrorCode | None
    member_id: str = ""
    generation: int = -1
    protocol_type: str | None = None
    protocol: str | None = None
    leader: str = ""
    members: tuple[tuple[str, str | None, bytes], ...] = ()  # for the leader only
    # KIP-814: the leader gets the members but must not assign anew (a static leader's
    # restart in a stable group keeps the current assignment).
    skip_assignment: bool = False


@dataclass(frozen=True)
class SyncResponse:
    error: ErrorCode | None
    protocol_type: str | None = None
    protocol: str | None = None
    assignment: bytes = b""


@dataclass(frozen=True)
class RespondJoin:
    group_id: str
    member_id: str
    response: JoinResponse


@dataclass(frozen=True)
class RespondSync:
    group_id: str
    member_id: str
    response: SyncResponse


@dataclass(frozen=True)
class WriteRecords:
    group_id: str
    records: tuple[tuple[OffsetKey | GroupKey, OffsetValue | GroupValue | None], ...]


Effect = RespondJoin | RespondSync | WriteRecords


class GroupCoordinator:
    """The groups of one ``__consumer_offsets`` partition (a shard of the coordinator
    runtime: server/coordinator_runtime.py), or of all of them in a test."""

    def __init__(self, *, min_session_timeout_ms: int, max_session_timeout_ms: int,
                 initial_rebalance_delay_ms: int, max_group_size: int = 2**31 - 1,
                 clock: Callable[[], int] | None = None) -> None:
        self.min_session_timeout_ms = min_session_timeout_ms
        self.max_session_timeout_ms = max_session_timeout_ms
        self.initial_rebalance_delay_ms = initial_rebalance_delay_ms
        self.max_group_size = max_group_size
        # The time a replayed member's session starts from (``replay``).
        self.clock = clock or (lambda: 0)
        self.groups: dict[str, Group] = {}

    # -- loading ------------------------------------------------------------------------------

    def replay(self, offset: int, producer_id: int | None, record: Record) -> None:
        """One record of the partition, in log order (the runtime's replay); a record that
        cannot be read is skipped."""
        try:
            key = decode_key(record.key or b"")
            if isinstance(key, OffsetKey):
                self.load_offset(key, None if record.value is None
                                 else decode_offset(record.value), producer_id)
            else:
                self.load_group(key, None if record.value is None
                                else decode_group(record.value), self.clock())
        except GroupLogFormatError as exc:
            log.error("skipping a bad __consumer_offsets record at offset %d: %s", offset, exc)

    def replay_end_transaction(self, producer_id: int, committed: bool) -> None:
        """The producer's marker on this partition: its pending offsets here complete."""
        self.complete_txn_offsets(list(self.groups), producer_id, committed)

    def load_offset(self, key: OffsetKey, value: OffsetValue | None,
                    producer_id: int | None) -> None:
        """Replay one offset record; ``producer_id`` when it came in a transactional batch."""
        group = self.groups.setdefault(key.group, Group(key.group))
        tp = (key.topic, key.partition)
        if producer_id is not None:
            if value is not None:
                group.pending_txn_offsets.setdefault(producer_id, {})[tp] = value
        elif value is None:
            group.offsets.pop(tp, None)
        else:
            group.offsets[tp] = value

    def load_group(self, key: GroupKey, value: GroupValue | None, now_ms: int) -> None:
        if value is None:
            self.groups.pop(key.group, None)
            return
        group = self.groups.setdefault(key.group, Group(key.group))
        group.protocol_type = value.protocol_type or None
        group.protocol, group.leader = value.protocol, value.leader
        group.generation = value.generation
        group.members = {}
        group.static_members = {}
        for m in value.members:
            group.members[m.member_id] = Member(
                m.member_id, m.group_instance_id, m.client_id, m.client_host,
                m.session_timeout_ms, m.rebalance_timeout_ms,
                [(value.protocol or "", m.subscription)], now_ms, m.assignment)
            if m.group_instance_id:
                group.static_members[m.group_instance_id] = m.member_id
        # Restored members get a session timeout from now to heartbeat again (as Kafka).
        group.state = G.STABLE if group.members else G.EMPTY
        group.state_timestamp_ms = value.current_state_timestamp

    # -- JoinGroup ----------------------------------------------------------------------------

    def join(self, group_id: str, member_id: str, group_instance_id: str | None,
             protocol_type: str, protocols: list[tuple[str, bytes]], session_timeout_ms: int,
             rebalance_timeout_ms: int, client_id: str, client_host: str, now_ms: int, *,
             require_known_member_id: bool) -> tuple[str, JoinResponse | None, list[Effect]]:
        """Returns (member id, the answer now or None if it is held, effects)."""
        def fail(error: ErrorCode) -> tuple[str, JoinResponse, list[Effect]]:
            return member_id, JoinResponse(error, member_id), []

        if not group_id:
            return fail(ErrorCode.invalid_group_id)
        if not self.min_session_timeout_ms <= session_timeout_ms <= self.max_session_timeout_ms:
            return fail(ErrorCode.invalid_session_timeout)
        if not protocol_type or not protocols:
            return fail(ErrorCode.inconsistent_group_protocol)
        group = self.groups.get(group_id)
        if group is None:
            if member_id:
                return fail(ErrorCode.unknown_member_id)
            group = self.groups[group_id] = Group(group_id)
        if group.state == G.DEAD:
            return fail(ErrorCode.coordinator_not_available)
        if group.members and (group.protocol_type != protocol_type or
                              not self._common_protocols(group, protocols)):
            return fail(ErrorCode.inconsistent_group_protocol)
        effects: list[Effect] = []
        replaced = False  # a static member restarted and took its old place
        if not member_id:
            known = group.static_members.get(group_instance_id) if group_instance_id else None
            new_id = f"{group_instance_id or client_id or 'member'}-{uuid.uuid4()}"
            if known is not None:
                # A static member restarted: it takes its old place (and fences the old id).
                old = group.members.pop(known)
                old.member_id = new_id
                group.members[new_id] = old
                group.static_members[group_instance_id] = new_id  # type: ignore[index]
                if group.leader == known:
                    group.leader = new_id
                effects += self._fence_pending(group, known, ErrorCode.fenced_instance_id)
                replaced = True
            elif require_known_member_id and not group_instance_id:
                group.pending_members.add(new_id)  # KIP-394: come back with this id
                return new_id, JoinResponse(ErrorCode.member_id_required, new_id), []
            member_id = new_id
        elif member_id not in group.members and member_id not in group.pending_members:
            return fail(ErrorCode.unknown_member_id)
        elif group_instance_id and group.static_members.get(group_instance_id,
                                                             member_id) != member_id:
            return fail(ErrorCode.fenced_instance_id)
        if member_id not in group.members and len(group.members) >= self.max_group_size:
            return fail(ErrorCode.group_max_size_reached)
        group.pending_members.discard(member_id)
        member = group.members.get(member_id)
        is_new = member is None
        changed = is_new or member.protocols != protocols  # type: ignore[union-attr]
        if member is None:
            member = Member(member_id, group_instance_id, client_id, client_host,
                            session_timeout_ms, rebalance_timeout_ms, protocols, now_ms)
            group.members[member_id] = member
            if group_instance_id:
                group.static_members[group_instance_id] = member_id
        member.protocols = protocols
        member.session_timeout_ms = session_timeout_ms
        member.rebalance_timeout_ms = rebalance_timeout_ms
        member.last_heartbeat_ms = now_ms
        group.protocol_type = protocol_type
        if replaced and group.state == G.STABLE and self._select_protocol(group) == group.protocol:
            # Kafka's updateStaticMemberAndRebalance: the restarted static member (leader or
            # not) takes its place without a rebalance unless the group's protocol would change;
            # the new member id is stored; the leader gets the members back with
            # skip_assignment, and SyncGroup hands everyone the current assignment.
            effects.append(self._group_record(group))
            response = self._join_response(group, member_id)
            if member_id == group.leader:
                response = dataclasses.replace(response, skip_assignment=True)
            return member_id, response, effects
        if group.state == G.STABLE and not changed and member_id != group.leader:
            # Nothing to rebalance for: answer with the current generation at once.
            return member_id, self._join_response(group, member_id), effects
        member.awaiting_join = True
        if group.state == G.EMPTY:
            self._prepare_rebalance(group, now_ms, initial=True)
        elif group.state == G.PREPARING_REBALANCE:
            if is_new and group.initial_delay_until_ms > now_ms:
                group.initial_delay_until_ms = min(now_ms + self.initial_rebalance_delay_ms,
                                                   group.rebalance_deadline_ms)
        else:
            effects += self._prepare_rebalance(group, now_ms)
        effects += self._maybe_complete_join(group, now_ms)
        return member_id, None, effects

    def _common_protocols(self, group: Group, protocols: list[tuple[str, bytes]]) -> set[str]:
        names = {n for n, _ in protocols}
        for m in group.members.values():
            names &= {n for n, _ in m.protocols}
        return names

    def _prepare_rebalance(self, group: Group, now_ms: int, initial: bool = False
                           ) -> list[Effect]:
        effects: list[Effect] = []
        if group.state == G.COMPLETING_REBALANCE:
            for m in group.members.values():  # their SyncGroup belongs to a dead generation
                if m.awaiting_sync:
                    m.awaiting_sync = False
                    effects.append(RespondSync(group.group_id, m.member_id,
                                               SyncResponse(ErrorCode.rebalance_in_progress)))
        group.transition_to(G.PREPARING_REBALANCE, now_ms)
        timeout = max((m.rebalance_timeout_ms for m in group.members.values()), default=0)
        group.rebalance_deadline_ms = now_ms + timeout
        group.initial_delay_until_ms = (
            min(now_ms + self.initial_rebalance_delay_ms, group.rebalance_deadline_ms)
            if initial else 0)
        return effects

    def _maybe_complete_join(self, group: Group, now_ms: int) -> list[Effect]:
        if group.state != G.PREPARING_REBALANCE:
            return []
        everyone = all(m.awaiting_join for m in group.members.values())
        if now_ms < group.initial_delay_until_ms and now_ms < group.rebalance_deadline_ms:
            return []
        if not everyone and now_ms < group.rebalance_deadline_ms:
            return []
        effects: list[Effect] = []
        for m in [m for m in group.members.values() if not m.awaiting_join]:
            self._remove(group, m.member_id)  # did not rejoin in time
        group.generation += 1
        if not group.members:
            group.transition_to(G.EMPTY, now_ms)
            group.protocol = group.leader = None
            effects.append(self._group_record(group))
            return effects
        group.protocol = self._select_protocol(group)
        if group.leader not in group.members:
            group.leader = next(iter(group.members))
        group.transition_to(G.COMPLETING_REBALANCE, now_ms)
        for m in group.members.values():
            m.awaiting_join = False
            m.last_heartbeat_ms = now_ms
            effects.append(RespondJoin(group.group_id, m.member_id,
                                       self._join_response(group, m.member_id)))
        return effects

    def _select_protocol(self, group: Group) -> str:
        candidates = set.intersection(*({n for n, _ in m.protocols}
                                        for m in group.members.values()))
        votes = Counter(next(n for n, _ in m.protocols if n in candidates)
                        for m in group.members.values())
        best = max(votes.values())
        leader = group.members.get(group.leader or "") or next(iter(group.members.values()))
        return next(n for n, _ in leader.protocols if votes.get(n) == best)

    def _join_response(self, group: Group, member_id: str) -> JoinResponse:
        members: tuple[tuple[str, str | None, bytes], ...] = ()
        if member_id == group.leader:
            members = tuple((m.member_id, m.group_instance_id, m.metadata(group.protocol))
                            for m in group.members.values())
        return JoinResponse(None, member_id, group.generation, group.protocol_type,
                            group.protocol, group.leader or "", members)

    def _remove(self, group: Group, member_id: str) -> Member | None:
        m = group.members.pop(member_id, None)
        if m is not None and m.group_instance_id:
            group.static_members.pop(m.group_instance_id, None)
        if group.leader == member_id:
            group.leader = None
        return m

    def _fence_pending(self, group: Group, member_id: str,
                       error: ErrorCode = ErrorCode.unknown_member_id) -> list[Effect]:
        """Answer a removed member's held JoinGroup / SyncGroup, if any."""
        return [RespondJoin(group.group_id, member_id, JoinResponse(error, member_id)),
                RespondSync(group.group_id, member_id, SyncResponse(error))]

    # -- SyncGroup ----------------------------------------------------------------------------

    def sync(self, group_id: str, generation: int, member_id: str,
             group_instance_id: str | None, assignments: dict[str, bytes] | None,
             now_ms: int) -> tuple[SyncResponse | None, list[Effect]]:
        group = self.groups.get(group_id)
        error = self._check_member(group, member_id, group_instance_id, generation)
        if error:
            return SyncResponse(error), []
        assert group is not None
        member = group.members[member_id]
        member.last_heartbeat_ms = now_ms
        if group.state == G.PREPARING_REBALANCE:
            return SyncResponse(ErrorCode.rebalance_in_progress), []
        if group.state == G.STABLE:
            return SyncResponse(None, group.protocol_type, group.protocol, member.assignment), []
        # CompletingRebalance: wait for the leader's assignment.
        member.awaiting_sync = True
        if member_id != group.leader or assignments is None:
            return None, []
        for m in group.members.values():
            m.assignment = assignments.get(m.member_id, b"")
        group.transition_to(G.STABLE, now_ms)
        effects: list[Effect] = [self._group_record(group)]
        for m in group.members.values():
            if m.awaiting_sync:
                m.awaiting_sync = False
                effects.append(RespondSync(group_id, m.member_id, SyncResponse(
                    None, group.protocol_type, group.protocol, m.assignment)))
        return None, effects

    def _check_member(self, group: Group | None, member_id: str, group_instance_id: str | None,
                      generation: int) -> ErrorCode | None:
        if group is None or group.state == G.DEAD:
            return ErrorCode.unknown_member_id if member_id else ErrorCode.group_id_not_found
        if group_instance_id and group.static_members.get(group_instance_id) not in (
                None, member_id):
            return ErrorCode.fenced_instance_id
        if member_id not in group.members:
            return ErrorCode.unknown_member_id
        if generation != group.generation:
            return ErrorCode.illegal_generation
        return None

    # -- Heartbeat, LeaveGroup, session expiry ------------------------------------------------

    def heartbeat(self, group_id: str, generation: int, member_id: str,
                  group_instance_id: str | None, now_ms: int) -> ErrorCode | None:
        group = self.groups.get(group_id)
        if group is not None and group.state == G.PREPARING_REBALANCE and \
                member_id in group.members:
            group.members[member_id].last_heartbeat_ms = now_ms
            return ErrorCode.rebalance_in_progress
        error = self._check_member(group, member_id, group_instance_id, generation)
        if error:
            return error
        assert group is not None
        group.members[member_id].last_heartbeat_ms = now_ms
        return None

    def leave(self, group_id: str, members: list[tuple[str, str | None]], now_ms: int
              ) -> tuple[list[ErrorCode | None], list[Effect]]:
        """Per leaving member: its error (or None); and the effects."""
        group = self.groups.get(group_id)
        errors: list[ErrorCode | None] = []
        effects: list[Effect] = []
        removed = False
        for member_id, instance_id in members:
            if group is None:
                errors.append(ErrorCode.unknown_member_id)
                continue
            if instance_id:
                current = group.static_members.get(instance_id)
                if current is None:
                    errors.append(ErrorCode.unknown_member_id)
                    continue
                if member_id and member_id != current:
                    errors.append(ErrorCode.fenced_instance_id)
                    continue
                member_id = current
            if member_id not in group.members:
                errors.append(ErrorCode.unknown_member_id)
                continue
            self._remove(group, member_id)
            effects += self._fence_pending(group, member_id)
            errors.append(None)
            removed = True
        if removed and group is not None:
            effects += self._rebalance_after_removal(group, now_ms)
        return errors, effects

    def _rebalance_after_removal(self, group: Group, now_ms: int) -> list[Effect]:
        effects: list[Effect] = []
        if group.state in (G.STABLE, G.COMPLETING_REBALANCE):
            effects += self._prepare_rebalance(group, now_ms)
        effects += self._maybe_complete_join(group, now_ms)
        return effects

    def tick(self, now_ms: int) -> list[Effect]:
        """Expire members whose session ran out; finish rebalances that are due."""
        effects: list[Effect] = []
        for group in list(self.groups.values()):
            expired = [m.member_id for m in group.members.values()
                       if not m.awaiting_join
                       and now_ms - m.last_heartbeat_ms > m.session_timeout_ms]
            for member_id in expired:
                self._remove(group, member_id)
                effects += self._fence_pending(group, member_id)
            if expired:
                effects += self._rebalance_after_removal(group, now_ms)
            else:
                effects += self._maybe_complete_join(group, now_ms)
        return effects

    def _group_record(self, group: Group) -> WriteRecords:
        value = GroupValue(group.protocol_type or "", group.generation, group.protocol,
                           group.leader, group.state_timestamp_ms, tuple(
                               MemberValue(m.member_id, m.group_instance_id, m.client_id,
                                           m.client_host, m.rebalance_timeout_ms,
                                           m.session_timeout_ms, m.metadata(group.protocol),
                                           m.assignment)
                               for m in group.members.values()))
        return WriteRecords(group.group_id, ((GroupKey(group.group_id), value),))

    # -- offsets ------------------------------------------------------------------------------

    def validate_commit(self, group_id: str, generation: int, member_id: str,
                        group_instance_id: str | None, transactional: bool) -> ErrorCode | None:
        """OffsetCommit / TxnOffsetCommit: may this member commit for this group now?
        A commit without group metadata (generation -1, no member id: a "simple" consumer, or
        an old transactional client) is accepted for a group with no members."""
        if not group_id:
            return ErrorCode.invalid_group_id
        group = self.groups.get(group_id)
        simple = generation < 0 and not member_id
        if group is None or not group.members:
            if simple or transactional and not member_id:
                return None
            return ErrorCode.unknown_member_id if member_id else None
        if simple and transactional:
            return None  # KIP-447's fencing needs the metadata; older clients send none
        error = self._check_member(group, member_id, group_instance_id, generation)
        if error:
            return error
        if group.state == G.COMPLETING_REBALANCE and not transactional:
            return ErrorCode.rebalance_in_progress
        return None

    def commit_records(self, group_id: str, offsets: dict[TP, OffsetValue]) -> WriteRecords:
        return WriteRecords(group_id, tuple((OffsetKey(group_id, t, p), v)
                                            for (t, p), v in offsets.items()))

    def apply_offsets(self, group_id: str, offsets: dict[TP, OffsetValue]) -> None:
        """A (non-transactional) commit is written: the offsets are committed."""
        self.groups.setdefault(group_id, Group(group_id)).offsets.update(offsets)

    def add_pending_txn_offsets(self, group_id: str, producer_id: int,
                                offsets: dict[TP, OffsetValue]) -> None:
        """A TxnOffsetCommit is written: its offsets wait for the transaction's marker."""
        group = self.groups.setdefault(group_id, Group(group_id))
        group.pending_txn_offsets.setdefault(producer_id, {}).update(offsets)

    def complete_txn_offsets(self, group_ids: Iterable[str], producer_id: int,
                             commit: bool) -> None:
        """The producer's COMMIT (the offsets become the committed ones) or ABORT (dropped)
        marker reached the offsets partition of these groups."""
        for group_id in group_ids:
            group = self.groups.get(group_id)
            if group is None:
                continue
            pending = group.pending_txn_offsets.pop(producer_id, None)
            if pending and commit:
                group.offsets.update(pending)

    def fetch_offsets(self, group_id: str, partitions: list[TP] | None, require_stable: bool
                      ) -> list[tuple[TP, OffsetValue | None, ErrorCode | None]]:
        group = self.groups.get(group_id)
        if partitions is None:
            partitions = sorted(group.offsets) if group else []
        out: list[tuple[TP, OffsetValue | None, ErrorCode | None]] = []
        for tp in partitions:
            if group is not None and require_stable and group.has_pending_offsets(tp):
                out.append((tp, None, ErrorCode.unstable_offset_commit))
            else:
                out.append((tp, group.offsets.get(tp) if group else None, None))
        return out

    # -- admin --------------------------------------------------------------------------------

    def delete_offsets(self, group_id: str, partitions: list[TP],
                       subscribed_topics: Callable[[bytes], Iterable[str]]
                       ) -> tuple[ErrorCode | None, dict[TP, ErrorCode | None], list[Effect]]:
        """OffsetDelete (KIP-496), as Kafka's classic groups: an Empty group loses the offsets
        of these partitions; a consumer group with members keeps those of topics a member is
        subscribed to (GROUP_SUBSCRIBED_TO_TOPIC: ``subscribed_topics`` reads a member's
        metadata) and loses the others; any other group with members: NON_EMPTY_GROUP. Pending
        transactional offsets of the partitions go too. (group error, per partition error,
        effects: the tombstones)."""
        group = self.groups.get(group_id)
        if group is None or group.state == G.DEAD:
            return ErrorCode.group_id_not_found, {}, []
        subscribed: set[str] = set()
        if group.state != G.EMPTY:
            if group.protocol_type != "consumer":
                return ErrorCode.non_empty_group, {}, []
            for m in group.members.values():
                subscribed.update(subscribed_topics(m.metadata(group.protocol)))
        errors: dict[TP, ErrorCode | None] = {}
        gone: list[TP] = []
        for tp in partitions:
            if tp[0] in subscribed:
                errors[tp] = ErrorCode.group_subscribed_to_topic
                continue
            errors[tp] = None
            for pending in group.pending_txn_offsets.values():
                pending.pop(tp, None)
            if group.offsets.pop(tp, None) is not None:
                gone.append(tp)
        if not gone:
            return None, errors, []
        return None, errors, [WriteRecords(group_id, tuple(
            (OffsetKey(group_id, t, p), None) for t, p in gone))]

    def expire_offsets(self, now_ms: int, retention_ms: int) -> list[Effect]:
        """``offsets.retention.minutes`` (KIP-211), as Kafka's classic groups: a group without
        members loses the offsets older than the retention, counted from when it became Empty
        (a group that had members) or from each offset's commit (one that never had any:
        offsets alone, as a simple consumer or a transactional producer commits them); offsets
        pending in a transaction stay. An Empty group left with no offsets is removed (Dead,
        its tombstone written), as Kafka's cleanupGroupMetadata. (Kafka also expires, in a
        Stable consumer group, the offsets of topics no member subscribes to: not done here.)"""
        effects: list[Effect] = []
        for group in list(self.groups.values()):
            if group.state != G.EMPTY or group.members:
                continue
            since_empty = group.state_timestamp_ms \
                if group.protocol_type and group.state_timestamp_ms >= 0 else None
            gone = [tp for tp, v in group.offsets.items() if not group.has_pending_offsets(tp)
                    and now_ms - (v.commit_timestamp if since_empty is None else since_empty)
                    >= retention_ms]
            records: list = [(OffsetKey(group.group_id, t, p), None) for t, p in gone]
            for tp in gone:
                del group.offsets[tp]
            if not group.offsets and not group.pending_txn_offsets:
                records.append((GroupKey(group.group_id), None))
                group.transition_to(G.DEAD, now_ms)
                del self.groups[group.group_id]
            if gone:
                effects.append(WriteRecords(group.group_id, tuple(records)))
        return effects

    def delete_group(self, group_id: str, now_ms: int
                     ) -> tuple[ErrorCode | None, list[Effect]]:
        group = self.groups.get(group_id)
        if group is None or (group.state == G.EMPTY and not group.offsets
                             and not group.generation):
            return ErrorCode.group_id_not_found, []
        if group.members:
            return ErrorCode.non_empty_group, []
        records: list = [(OffsetKey(group_id, t, p), None) for t, p in group.offsets]
        records.append((GroupKey(group_id), None))
        group.transition_to(G.DEAD, now_ms)
        del self.groups[group_id]
        return None, [WriteRecords(group_id, tuple(records))]
