"""The consumer's side of a consumer group (Kafka's classic protocol; the Java
ConsumerCoordinator, aiokafka's group_coordinator.py).

Joining and rebalancing run inside ``Consumer.poll`` on the caller's thread, so the rebalance
callbacks run there too: FindCoordinator, JoinGroup (again with the member id the broker hands
out, KIP-394), the leader runs the assignor over every member's subscription, SyncGroup, then
the positions of the new partitions come from the group's committed offsets (OffsetFetch;
with require_stable for read_committed consumers, so that pending transactional offsets are
awaited, KIP-447) or auto.offset.reset.

Rebalances are eager (every partition revoked, after an auto commit, before the join) unless
every configured assignor is cooperative (cooperative-sticky, KIP-429): then the member keeps
its partitions through the join, reports them in its subscription, gives up only those the new
assignment takes away, and rejoins at once so that they reach their new owner.

A heartbeat thread with its own connection keeps the membership alive between polls and flags
a rebalance (REBALANCE_IN_PROGRESS) or a lost membership for the next ``poll``.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from ...errors import (
    CoordinatorLoadInProgressError,
    FatalError,
    IllegalGenerationError,
    KafkaError,
    MemberIdRequiredError,
    RebalanceInProgressError,
    UnknownMemberIdError,
    error_for_code,
)
from ...protocol import ApiKey
from .. import coordinator_request
from ..config import ClientConfig
from ..coordinator_request import (
    COORDINATOR_MOVED,
    KEY_TYPE_GROUP,
    Action,
    BrokerVersions,
    CoordinatorRequestHandler,
    Coordinators,
)
from ..errors import KafkaTimeoutError
from ..network import NetworkClient
from ..types import ConsumerGroupMetadata, TopicPartition
from .assignors import (
    ASSIGNORS,
    COOPERATIVE,
    Subscription,
    decode_assignment,
    decode_subscription,
    encode_assignment,
    encode_subscription,
)
from .subscription_state import SubscriptionState

log = logging.getLogger(__name__)

UNSTABLE_OFFSET_COMMIT = 88
_REJOIN = (RebalanceInProgressError, IllegalGenerationError, UnknownMemberIdError)
Callback = Callable[[list[TopicPartition]], None]


class CommitFailedError(FatalError):
    """The commit cannot succeed: the group rebalanced and this member's partitions may now
    belong to another (the Java client's CommitFailedException)."""


class GroupCoordinator:
    def __init__(self, config: ClientConfig, client_id: str, net: NetworkClient,
                 subs: SubscriptionState, on_partitions_changed: Callable[[], None]) -> None:
        self.config = config
        self.group_id: str = config.group_id
        self.instance_id: str | None = config.group_instance_id
        self.client_id = client_id
        self.net = net
        self.subs = subs
        self._changed = on_partitions_changed
        self.assignors: list[str] = config.partition_assignment_strategy
        self.cooperative = all(a in COOPERATIVE for a in self.assignors)
        self.topics: set[str] = set()
        self.pattern: re.Pattern[str] | None = None
        self.on_assign: Callback | None = None
        self.on_revoke: Callback | None = None
        self.on_lost: Callback | None = None
        self.member_id = ""
        self.generation = -1
        self._coordinators = Coordinators()
        self.rejoin_needed = True
        self.member_lost = False
        self.joining = False  # the heartbeat thread stays quiet while a join is under way
        self.next_auto_commit = 0.0
        # The leader's partition counts of the assignment it made (Kafka's assignmentSnapshot):
        # when the metadata shows other counts (partitions added), the leader rejoins.
        self._assigned_counts: dict[str, int] | None = None
        self._next_metadata_check = 0.0
        self._hb_stop = threading.Event()
        self._hb_thread: threading.Thread | None = None
        self._hb_net = NetworkClient(config, f"{client_id}-heartbeat")
        self._lock = threading.Lock()

    # -- subscription --------------------------------------------------------------------------

    def subscribe(self, topics: Iterable[str] | None, pattern: str | None,
                  on_assign: Callback | None, on_revoke: Callback | None,
                  on_lost: Callback | None) -> None:
        self.topics = set(topics or ())
        self.pattern = re.compile(pattern) if pattern else None
        self.on_assign, self.on_revoke, self.on_lost = on_assign, on_revoke, on_lost
        self.rejoin_needed = True

    def metadata(self) -> ConsumerGroupMetadata:
        return ConsumerGroupMetadata(self.group_id, self.generation, self.member_id,
                                     self.instance_id)

    def _subscribed_topics(self, deadline: float) -> list[str]:
        if self.pattern is None:
            return sorted(self.topics)
        cluster = self.net.update_metadata(None, deadline, allow_auto_topic_creation=False)
        return sorted(t for t in cluster.topics if self.pattern.fullmatch(t)
                      and not cluster.topics[t].is_internal)

    # -- coordinator ---------------------------------------------------------------------------

    @property
    def coordinator(self) -> int | None:
        """The group coordinator's node id while it is known (the heartbeat thread's target)."""
        node = self._coordinators.get(KEY_TYPE_GROUP, self.group_id)
        return node.node_id if node is not None else None

    def _do(self, handler: _GroupRequestHandler, deadline: float) -> Any:
        """Send to the coordinator through the one coordinator loop (coordinator_request.py):
        it is found again when it moved, and waited for while it loads."""
        handler.key = self.group_id
        return coordinator_request.do(self.net, self._coordinators, handler, deadline)

    def _coordinator_moved(self, code: int) -> bool:
        if code in COORDINATOR_MOVED:
            self._coordinators.forget(KEY_TYPE_GROUP, self.group_id)
        return code in COORDINATOR_MOVED

    # -- poll ----------------------------------------------------------------------------------

    def poll(self, deadline: float) -> None:
        """Join (or rejoin) if needed and auto-commit when due."""
        if self.member_lost:
            self.member_lost = False
            lost = self.subs.assigned()
            self._assign([])
            if lost and self.on_lost is not None:
                self.on_lost(lost)
            elif lost and self.on_revoke is not None:
                self.on_revoke(lost)
        if not self.rejoin_needed and self._assigned_counts is not None \
                and time.monotonic() >= self._next_metadata_check:
            self._check_partition_counts(deadline)
        if self.rejoin_needed:
            self._rebalance(deadline)
        if self.config.enable_auto_commit and time.monotonic() >= self.next_auto_commit:
            self._auto_commit(deadline)

    def _check_partition_counts(self, deadline: float) -> None:
        """Kafka's leader compares its assignment's metadata snapshot with the current one at
        every metadata refresh (metadata.max.age.ms): a topic that grew (CreatePartitions)
        makes it rejoin, so the new partitions are assigned."""
        counts = self._assigned_counts or {}
        self._next_metadata_check = time.monotonic() + self.config.metadata_max_age_ms / 1000
        try:
            cluster = self.net.update_metadata(sorted(counts), deadline,
                                               allow_auto_topic_creation=False)
        except (KafkaError, TimeoutError) as exc:
            log.debug("group %r: metadata refresh failed: %s", self.group_id, exc)
            return
        now = {t: len(ps) for t in counts if (ps := cluster.partitions_for(t))}
        if now != counts:
            log.info("group %r: partition counts changed %s -> %s: rejoining", self.group_id,
                     counts, now)
            self.rejoin_needed = True

    def _auto_commit(self, deadline: float) -> None:
        self.next_auto_commit = time.monotonic() + self.config.auto_commit_interval_ms / 1000
        offsets = self.positions()
        if offsets and self.generation >= 0:
            try:
                self.commit(offsets, deadline)
            except (KafkaError, TimeoutError) as exc:
                log.info("auto commit of group %r failed: %s", self.group_id, exc)

    def positions(self) -> dict[TopicPartition, int]:
        return {tp: p for tp in self.subs.assigned()
                if (p := self.subs.position(tp)) is not None}

    def _rebalance(self, deadline: float) -> None:
        owned = self.subs.assigned()
        if owned and not self.cooperative:
            self._revoke(owned, deadline)
            owned = []
        topics = self._subscribed_topics(deadline)
        subscription = encode_subscription(Subscription(tuple(topics),
                                                        owned_partitions=tuple(owned)))
        self.joining = True
        try:
            assignment = self._join_until_stable(topics, subscription, deadline)
        finally:
            self.joining = False
        revoked = [tp for tp in owned if tp not in set(assignment)]
        if revoked:  # cooperative: give these up, and rejoin so that they move on
            self._revoke(revoked, deadline)
            self.rejoin_needed = True
        added = [tp for tp in assignment if tp not in set(owned)]
        self._assign(assignment, keep=[tp for tp in owned if tp in set(assignment)])
        self._start_heartbeat()
        if self.on_assign is not None:
            self.on_assign(added)

    def _revoke(self, partitions: list[TopicPartition], deadline: float) -> None:
        if self.config.enable_auto_commit and self.generation >= 0:
            self._auto_commit(deadline)
        if self.on_revoke is not None:
            self.on_revoke(list(partitions))
        self._assign([tp for tp in self.subs.assigned() if tp not in set(partitions)],
                     keep=self.subs.assigned())

    def _join_until_stable(self, topics: list[str], subscription: bytes, deadline: float
                           ) -> list[TopicPartition]:
        while True:
            self.rejoin_needed = False
            try:
                assignment = self._join_and_sync(topics, subscription, deadline)
            except _REJOIN as exc:
                if isinstance(exc, UnknownMemberIdError):
                    self.member_id, self.generation = "", -1
                log.debug("group %r: rejoining after %s", self.group_id, exc)
                continue
            if self.rejoin_needed:
                continue  # the heartbeat saw another rebalance start meanwhile
            return assignment

    def _join_and_sync(self, topics: list[str], subscription: bytes, deadline: float
                       ) -> list[TopicPartition]:
        join_timeout = self.config.max_poll_interval_ms + 5000
        r = self._do(_JoinGroup(self, subscription, join_timeout), deadline + join_timeout / 1000)
        code = int(r.error_code)
        if code:
            raise error_for_code(code)(f"JoinGroup {self.group_id!r}")
        self.member_id, self.generation = r.member_id, int(r.generation_id)
        self._assigned_counts = None
        assignments: list[dict[str, Any]] = []
        if r.leader == r.member_id and not getattr(r, "skip_assignment", False):
            # KIP-814: a static leader that rejoined a stable group keeps the assignment.
            assignments = self._assign_as_leader(r.protocol_name, r.members, deadline)
        s = self._do(_GroupRequest(ApiKey.SYNC_GROUP, {
            "group_id": self.group_id, "generation_id": self.generation,
            "member_id": self.member_id, "group_instance_id": self.instance_id,
            "protocol_type": "consumer", "protocol_name": r.protocol_name,
            "assignments": assignments}, _answer, timeout_ms=join_timeout), deadline)
        code = int(s.error_code)
        if code:
            raise error_for_code(code)(f"SyncGroup {self.group_id!r}")
        return decode_assignment(bytes(s.assignment))

    def _assign_as_leader(self, protocol: str, members: Any, deadline: float
                          ) -> list[dict[str, Any]]:
        subscriptions = {m.member_id: decode_subscription(bytes(m.metadata)) for m in members}
        wanted = sorted({t for s in subscriptions.values() for t in s.topics})
        cluster = self.net.update_metadata(wanted, deadline, allow_auto_topic_creation=False)
        counts = {t: len(ps) for t in wanted if (ps := cluster.partitions_for(t))}
        self._assigned_counts = counts
        self._next_metadata_check = time.monotonic() + self.config.metadata_max_age_ms / 1000
        plan = ASSIGNORS[protocol](subscriptions, counts)
        log.info("group %r generation %d: %s assigns %s", self.group_id, self.generation,
                 protocol, {m: len(ps) for m, ps in plan.items()})
        return [{"member_id": m, "assignment": encode_assignment(ps)} for m, ps in plan.items()]

    def _assign(self, partitions: list[TopicPartition],
                keep: Iterable[TopicPartition] = ()) -> None:
        """Read ``partitions`` from now on; those in ``keep`` keep their positions, the others
        start at the group's committed offsets (or auto.offset.reset)."""
        kept = set(keep)
        self.subs.assign(list(partitions))
        self._changed()
        new = [tp for tp in partitions if tp not in kept]
        if not new:
            return
        committed = self.committed(new, time.monotonic() + 60)
        for tp in new:
            offset = committed.get(tp)
            if offset is not None:
                self.subs.seek(tp, offset)
            else:
                self.subs.request_reset(tp, self.subs.default_reset)

    # -- offsets -------------------------------------------------------------------------------

    def commit(self, offsets: dict[TopicPartition, int], deadline: float) -> None:
        by_topic: dict[str, list[dict[str, Any]]] = {}
        for tp, offset in offsets.items():
            by_topic.setdefault(tp.topic, []).append({
                "partition_index": tp.partition, "committed_offset": offset,
                "committed_leader_epoch": -1, "committed_metadata": ""})
        r = self._do(_GroupRequest(ApiKey.OFFSET_COMMIT, {
            "group_id": self.group_id, "generation_id_or_member_epoch": self.generation,
            "member_id": self.member_id, "group_instance_id": self.instance_id,
            "retention_time": -1,
            "topics": [{"name": t, "partitions": ps} for t, ps in by_topic.items()]},
            _commit_error), deadline)
        code = _commit_error(r)
        if code in (RebalanceInProgressError.code, IllegalGenerationError.code,
                    UnknownMemberIdError.code):
            self.rejoin_needed = True
            raise CommitFailedError(
                f"group {self.group_id!r} rebalanced: {error_for_code(code).__name__}")
        if code:
            raise error_for_code(code)(f"OffsetCommit {self.group_id!r}")

    def committed(self, partitions: list[TopicPartition], deadline: float
                  ) -> dict[TopicPartition, int | None]:
        by_topic: dict[str, list[int]] = {}
        for tp in partitions:
            by_topic.setdefault(tp.topic, []).append(tp.partition)
        topics = [{"name": t, "partition_indexes": ps} for t, ps in by_topic.items()]
        require_stable = self.config.isolation_level == "read_committed"
        r = self._do(_GroupRequest(ApiKey.OFFSET_FETCH, {
            "group_id": self.group_id, "topics": topics, "require_stable": require_stable,
            "groups": [{"group_id": self.group_id, "topics": topics}]}, _fetch_error,
            also_retry=(UNSTABLE_OFFSET_COMMIT,)), deadline)
        group = r.groups[0] if hasattr(r, "groups") else r
        code = _fetch_error(r)
        if code:
            raise error_for_code(code)(f"OffsetFetch {self.group_id!r}")
        return {TopicPartition(t.name, int(p.partition_index)):
                (int(p.committed_offset) if int(p.committed_offset) >= 0 else None)
                for t in group.topics for p in t.partitions}

    # -- heartbeats ----------------------------------------------------------------------------

    def _start_heartbeat(self) -> None:
        if self._hb_thread is None:
            self._hb_thread = threading.Thread(target=self._heartbeat_loop, daemon=True,
                                               name=f"oncelog-heartbeat-{self.client_id}")
            self._hb_thread.start()

    def _heartbeat_loop(self) -> None:
        interval = self.config.heartbeat_interval_ms / 1000
        while not self._hb_stop.wait(interval):
            found = self._coordinators.get(KEY_TYPE_GROUP, self.group_id)
            generation, member = self.generation, self.member_id
            if found is None or generation < 0 or self.rejoin_needed or self.joining:
                continue
            node = found.node_id
            self._hb_net.cluster = self.net.cluster  # addresses of the nodes
            self._hb_net.learn_address(node, found.host, found.port)
            try:
                r = self._hb_net.request(node, ApiKey.HEARTBEAT, {
                    "group_id": self.group_id, "generation_id": generation, "member_id": member,
                    "group_instance_id": self.instance_id},
                    timeout_ms=self.config.request_timeout_ms)
            except KafkaError as exc:
                log.debug("heartbeat of group %r failed: %s", self.group_id, exc)
                continue
            code = int(r.error_code)
            if self.joining or (generation, member) != (self.generation, self.member_id):
                continue  # an answer about a generation this member has already left
            if code == RebalanceInProgressError.code:
                self.rejoin_needed = True
            elif code in (IllegalGenerationError.code, UnknownMemberIdError.code):
                self.member_id, self.generation = ("", -1) if code == UnknownMemberIdError.code \
                    else (self.member_id, -1)
                self.member_lost = True
                self.rejoin_needed = True
            elif self._coordinator_moved(code):
                pass

    def close(self, deadline: float) -> None:
        """Stop heartbeating, auto-commit (if enabled) and leave the group, all by
        ``deadline``: a commit not done by then is given up with a warning."""
        self._hb_stop.set()
        if self._hb_thread is not None:
            self._hb_thread.join(max(0.0, min(5.0, deadline - time.monotonic())))
        try:
            if self.config.enable_auto_commit and self.generation >= 0:
                offsets = self.positions()
                if offsets:
                    try:
                        self.commit(offsets, deadline)
                    except (KafkaError, TimeoutError) as exc:
                        log.warning("closing the consumer of group %r: its final offset "
                                    "commit failed or did not finish within the close "
                                    "timeout: %s", self.group_id, exc)
            node = self.coordinator
            if self.member_id and node is not None:
                # One attempt: a member that cannot say goodbye is dropped by its session
                # timeout anyway.
                self.net.request(node, ApiKey.LEAVE_GROUP, {
                    "group_id": self.group_id, "member_id": self.member_id,
                    "members": [{"member_id": self.member_id,
                                 "group_instance_id": self.instance_id, "reason": None}]},
                    timeout_ms=max(1, int((deadline - time.monotonic()) * 1000)))
        except (KafkaError, TimeoutError) as exc:
            log.info("leaving group %r: %s", self.group_id, exc)
        finally:
            self._hb_net.close()


def _answer(response: Any) -> int:
    return int(response.error_code)


def _commit_error(response: Any) -> int:
    return next((int(p.error_code) for t in response.topics for p in t.partitions
                 if int(p.error_code)), 0)


def _fetch_error(response: Any) -> int:
    group = response.groups[0] if hasattr(response, "groups") else response
    code = int(getattr(group, "error_code", 0))
    return code or next((int(p.error_code) for t in group.topics for p in t.partitions
                         if int(p.error_code)), 0)


class _GroupRequestHandler(CoordinatorRequestHandler):
    key_type = KEY_TYPE_GROUP

    def timeout_error(self, last: BaseException | None) -> BaseException:
        return KafkaTimeoutError(f"group {self.key!r}: coordinator not ready in time"
                                 + (f" ({last})" if last else ""))


class _GroupRequest(_GroupRequestHandler):
    """A group request whose answer is the caller's to judge, except that the coordinator
    moving (NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE) or loading
    (COORDINATOR_LOAD_IN_PROGRESS), and the codes in ``also_retry``, are retried."""

    def __init__(self, api: ApiKey, values: dict[str, Any], error_of: Callable[[Any], int],
                 timeout_ms: int | None = None, also_retry: tuple[int, ...] = ()) -> None:
        self.api, self.values, self.error_of = api, values, error_of
        self.timeout_ms = timeout_ms
        self.also_retry = also_retry

    def create_request(self, broker: BrokerVersions) -> dict[str, Any]:
        return self.values

    def handle_response(self, response: Any) -> Action:
        code = self.error_of(response)
        if code in COORDINATOR_MOVED or code == CoordinatorLoadInProgressError.code \
                or code in self.also_retry:
            return self.retriable(code, f"{self.api.name} {self.key!r}")
        return Action.DONE


class _JoinGroup(_GroupRequestHandler):
    api = ApiKey.JOIN_GROUP

    def __init__(self, group: GroupCoordinator, subscription: bytes, timeout_ms: int) -> None:
        self.group, self.subscription, self.timeout_ms = group, subscription, timeout_ms

    def create_request(self, broker: BrokerVersions) -> dict[str, Any]:
        g = self.group
        return {"group_id": g.group_id, "session_timeout": g.config.session_timeout_ms,
                "rebalance_timeout": g.config.max_poll_interval_ms, "member_id": g.member_id,
                "group_instance_id": g.instance_id, "protocol_type": "consumer",
                "reason": None, "protocols": [{"name": a, "metadata": self.subscription}
                                              for a in g.assignors]}

    def handle_response(self, response: Any) -> Action:
        code = int(response.error_code)
        if code == MemberIdRequiredError.code:
            self.group.member_id = response.member_id  # KIP-394: join again with it
            return Action.RETRY_NOW
        if code in COORDINATOR_MOVED or code == CoordinatorLoadInProgressError.code:
            return self.retriable(code, f"JoinGroup {self.key!r}")
        return Action.DONE
