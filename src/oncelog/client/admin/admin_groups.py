"""Consumer groups in the Admin client: Kafka's Admin.describeConsumerGroups (DescribeGroups,
one request per coordinator after one batched FindCoordinator), listConsumerGroupOffsets
(OffsetFetch) and listOffsets (ListOffsets, one request per partition leader). The three are
what kafka-consumer-groups.sh --describe joins into its lag table (cli/group_commands.py)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from ...errors import KafkaError, RetriableError, error_for_code
from ...protocol import ApiKey, ProtocolError
from ...protocol.consumer_protocol import read_assignment
from ...security.acls import operations_from_bit_field
from ..coordinator_request import COORDINATOR_MOVED, KEY_TYPE_GROUP
from ..errors import KafkaTimeoutError
from ..metadata import BrokerNode
from ..types import (
    ConsumerGroupDescription,
    ListOffsetsResultInfo,
    MemberDescription,
    TopicPartition,
)

if TYPE_CHECKING:
    from ..network import NetworkClient

# The protocol type of groups of Kafka's ConsumerProtocol; "" is a group that only commits
# offsets (assign() and commit, never joined), which Kafka also describes as a consumer group.
CONSUMER_PROTOCOL_TYPE = "consumer"


def describe_consumer_groups(net: NetworkClient, group_ids: Iterable[str],
                             include_authorized_operations: bool, deadline: float
                             ) -> dict[str, ConsumerGroupDescription]:
    """As Kafka's DescribeConsumerGroupsHandler: the groups' coordinators found with one
    FindCoordinator (v4 takes many keys), one DescribeGroups to each coordinator for all of
    its groups. A group whose coordinator moved (NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE)
    is found again; one still loading (COORDINATOR_LOAD_IN_PROGRESS) is asked again after a
    backoff. Once every group is answered, the first group's error (in the order asked) is
    raised: GroupAuthorizationFailedError, or ValueError for a group of another protocol
    (Kafka's IllegalArgumentException). A group nobody knows is answered Dead, no members."""
    wanted = list(dict.fromkeys(group_ids))
    pending = set(wanted)
    coordinators: dict[str, BrokerNode] = {}
    described: dict[str, ConsumerGroupDescription] = {}
    errors: dict[str, Exception] = {}
    last: BaseException | None = None
    attempt = 0
    while pending:
        if time.monotonic() >= deadline:
            raise KafkaTimeoutError(f"describing groups {sorted(pending)} did not complete in "
                                    "time" + (f": {last}" if last else ""))
        unmapped = [g for g in wanted if g in pending and g not in coordinators]
        if unmapped:
            last = _find_coordinators(net, unmapped, coordinators, errors, pending,
                                      deadline) or last
        by_node: dict[BrokerNode, list[str]] = {}
        for g in wanted:
            if g in pending and g in coordinators:
                by_node.setdefault(coordinators[g], []).append(g)
        for node, groups in by_node.items():
            net.learn_address(node.node_id, node.host, node.port)
            try:
                r = net.request(node.node_id, ApiKey.DESCRIBE_GROUPS, {
                    "groups": groups,
                    "include_authorized_operations": include_authorized_operations},
                    timeout_ms=_remaining_ms(net, deadline),
                    # v5: a group nobody knows is Dead (v6 answers GROUP_ID_NOT_FOUND, KIP-1043)
                    max_version=5)
            except RetriableError as exc:  # the coordinator's broker may be gone
                last = exc
                for g in groups:
                    coordinators.pop(g, None)
                continue
            for d in r.groups:
                g = d.group_id
                if g not in pending:
                    continue  # an answer for a group not asked, or answered twice
                code = int(d.error_code)
                if code and issubclass(error_for_code(code), RetriableError):
                    last = error_for_code(code)(f"describing group {g!r}")
                    if code in COORDINATOR_MOVED:
                        coordinators.pop(g, None)
                    continue
                pending.discard(g)
                if code:
                    errors[g] = error_for_code(code)(f"describing group {g!r}")
                elif d.protocol_type not in (CONSUMER_PROTOCOL_TYPE, ""):
                    errors[g] = ValueError(f"group {g!r} is not a consumer group "
                                           f"(protocol type {d.protocol_type!r})")
                else:
                    try:
                        described[g] = _description(d, node)
                    except ProtocolError as exc:  # Kafka fails the group (SchemaException)
                        errors[g] = exc
        if pending:
            attempt += 1
            net.sleep(max(0.0, min(net.retry_backoff.backoff(attempt - 1),
                                   deadline - time.monotonic())))
    for g in wanted:
        if g in errors:
            raise errors[g]
    return {g: described[g] for g in wanted}


def _find_coordinators(net: NetworkClient, groups: list[str],
                       coordinators: dict[str, BrokerNode], errors: dict[str, Exception],
                       pending: set[str], deadline: float) -> KafkaError | None:
    """One FindCoordinator for ``groups`` (before v4, for the first only: the others wait for
    the next round). Fills ``coordinators``; a final error (GROUP_AUTHORIZATION_FAILED) ends
    the group; returns the last retriable error (COORDINATOR_NOT_AVAILABLE) or None."""
    r = net.request_any(ApiKey.FIND_COORDINATOR, lambda version: {
        "key_type": KEY_TYPE_GROUP, "key": groups[0], "coordinator_keys": groups}, deadline)
    answers = ([(c.key, c) for c in r.coordinators] if hasattr(r, "coordinators")
               else [(groups[0], r)])
    last = None
    for g, c in answers:
        if g not in pending:
            continue
        code = int(c.error_code)
        if not code:
            coordinators[g] = BrokerNode(int(c.node_id), c.host, int(c.port))
            continue
        error = error_for_code(code)(f"FindCoordinator {g!r}: {c.error_message or ''}")
        if isinstance(error, RetriableError):
            last = error
        else:
            errors[g] = error
            pending.discard(g)
    return last


def _description(d: Any, coordinator: BrokerNode) -> ConsumerGroupDescription:
    members = tuple(
        MemberDescription(m.member_id, m.group_instance_id, m.client_id, m.client_host,
                          _assignment(bytes(m.member_assignment)))
        for m in d.members)
    return ConsumerGroupDescription(
        group_id=d.group_id, is_simple_consumer_group=not d.protocol_type,
        members=members, partition_assignor=d.protocol_data, state=d.group_state,
        coordinator=coordinator,
        authorized_operations=operations_from_bit_field(int(d.authorized_operations)))


def _assignment(data: bytes) -> frozenset[TopicPartition]:
    """A member's ConsumerProtocol assignment; none while it has none (rebalancing)."""
    if not data:
        return frozenset()
    return frozenset(TopicPartition(t.topic, int(p))
                     for t in read_assignment(data).assigned_partitions for p in t.partitions)


def list_consumer_group_offsets(
        to_coordinator: Callable[..., Any], group_id: str,
        partitions: Iterable[TopicPartition] | None, deadline: float
) -> dict[TopicPartition, int | None]:
    """OffsetFetch from the group's coordinator: the committed offset of each partition named
    (None where there is none), or of every partition the group committed (``partitions``
    None). Raises the group's error (GroupAuthorizationFailedError ...) and a partition's
    (TopicAuthorizationFailedError, UnknownTopicOrPartitionError) as Kafka's admin does."""
    topics = None
    if partitions is not None:
        by_topic: dict[str, list[int]] = {}
        for tp in partitions:
            by_topic.setdefault(tp.topic, []).append(tp.partition)
        topics = [{"name": t, "partition_indexes": ps} for t, ps in by_topic.items()]
    what = f"offsets of group {group_id!r}"
    r = to_coordinator(KEY_TYPE_GROUP, group_id, ApiKey.OFFSET_FETCH, {
        "group_id": group_id, "topics": topics, "require_stable": False,
        "groups": [{"group_id": group_id, "topics": topics}]}, deadline, _group_error, what)
    group = r.groups[0] if hasattr(r, "groups") else r
    code = _group_error(r)
    if code:
        raise error_for_code(code)(what)
    out: dict[TopicPartition, int | None] = {}
    for t in group.topics:
        for p in t.partitions:
            if int(p.error_code):
                raise error_for_code(int(p.error_code))(f"{what}: {t.name}-{p.partition_index}")
            offset = int(p.committed_offset)
            out[TopicPartition(t.name, int(p.partition_index))] = offset if offset >= 0 else None
    return out


def _group_error(response: Any) -> int:
    group = response.groups[0] if hasattr(response, "groups") else response
    return int(getattr(group, "error_code", 0))


def list_offsets(net: NetworkClient, metadata: Callable[[list[str]], Any],
                 specs: Mapping[TopicPartition, int], read_committed: bool, deadline: float
                 ) -> dict[TopicPartition, ListOffsetsResultInfo]:
    """ListOffsets to each partition's leader (Kafka's Admin.listOffsets): a spec is -1 (the
    latest offset: the high watermark, or with ``read_committed`` the last stable offset), -2
    (the earliest), -3 (the record with the largest timestamp) or a timestamp (the first
    record at or after it; offset -1 when none is). Retriable answers (a leader that moved)
    are asked again after fresh metadata until ``deadline``; others are raised."""
    wanted = {TopicPartition(*tp): int(s) for tp, s in specs.items()}
    out: dict[TopicPartition, ListOffsetsResultInfo] = {}
    last: BaseException | None = None
    attempt = 0
    while wanted:
        if time.monotonic() >= deadline:
            raise KafkaTimeoutError(f"ListOffsets for {sorted(wanted)} did not complete in "
                                    "time" + (f": {last}" if last else ""))
        cluster = metadata(sorted({tp.topic for tp in wanted}))
        by_leader: dict[int, dict[TopicPartition, int]] = {}
        for tp, spec in wanted.items():
            meta = cluster.topics.get(tp.topic)
            if meta is not None and meta.error_code and not issubclass(
                    error_for_code(meta.error_code), RetriableError):
                raise error_for_code(meta.error_code)(f"ListOffsets {tp.topic}")
            if meta is not None and not meta.error_code and tp.partition not in meta.partitions:
                raise error_for_code(3)(f"ListOffsets {tp.topic}-{tp.partition}")
            leader = cluster.leader_for(tp)
            if leader is not None and leader >= 0:
                by_leader.setdefault(leader, {})[tp] = spec
        retry = dict(wanted)
        for leader, parts in by_leader.items():
            topics: dict[str, list[dict[str, int]]] = {}
            for tp, spec in parts.items():
                topics.setdefault(tp.topic, []).append(
                    {"partition_index": tp.partition, "current_leader_epoch": -1,
                     "timestamp": spec})
            try:
                r = net.request(leader, ApiKey.LIST_OFFSETS, {
                    "replica_id": -1, "isolation_level": 1 if read_committed else 0,
                    "topics": [{"name": t, "partitions": ps} for t, ps in topics.items()]},
                    timeout_ms=_remaining_ms(net, deadline))
            except RetriableError as exc:
                last = exc
                continue
            for t in r.topics:
                for p in t.partitions:
                    tp = TopicPartition(t.name, int(p.partition_index))
                    if tp not in retry:
                        continue
                    code = int(p.error_code)
                    if code and issubclass(error_for_code(code), RetriableError):
                        last = error_for_code(code)(f"ListOffsets {tp.topic}-{tp.partition}")
                        continue
                    if code:
                        raise error_for_code(code)(f"ListOffsets {tp.topic}-{tp.partition}")
                    out[tp] = ListOffsetsResultInfo(int(p.offset), int(p.timestamp),
                                                    int(getattr(p, "leader_epoch", -1)))
                    del retry[tp]
        wanted = retry
        if wanted:
            attempt += 1
            net.sleep(max(0.0, min(net.retry_backoff.backoff(attempt - 1),
                                   deadline - time.monotonic())))
    return out


def _remaining_ms(net: NetworkClient, deadline: float) -> int:
    return max(1, min(int((deadline - time.monotonic()) * 1000), net.config.request_timeout_ms))


def alter_consumer_group_offsets(to_coordinator: Callable[..., Any], group_id: str,
                                 offsets: Mapping[TopicPartition, int], deadline: float
                                 ) -> None:
    """Kafka's Admin.alterConsumerGroupOffsets: an OffsetCommit to the group's coordinator
    without membership (generation -1, no member id), which the coordinator accepts only
    while the group has no members. Raises the first partition's error, as Kafka's
    ``all()``: UnknownMemberIdError for a group with active members, GroupAuthorizationFailed,
    TopicAuthorizationFailed, UnknownTopicOrPartition ..."""
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for tp, offset in offsets.items():
        tp = TopicPartition(*tp)
        by_topic.setdefault(tp.topic, []).append({
            "partition_index": tp.partition, "committed_offset": int(offset),
            "committed_leader_epoch": -1, "committed_metadata": ""})
    if not by_topic:
        return
    what = f"altering offsets of group {group_id!r}"
    r = to_coordinator(KEY_TYPE_GROUP, group_id, ApiKey.OFFSET_COMMIT, {
        "group_id": group_id, "generation_id_or_member_epoch": -1, "member_id": "",
        "group_instance_id": None, "retention_time": -1,
        "topics": [{"name": t, "partitions": ps} for t, ps in by_topic.items()]},
        deadline, _commit_error, what)
    for t in r.topics:
        for p in t.partitions:
            if int(p.error_code):
                raise error_for_code(int(p.error_code))(
                    f"{what}: {t.name}-{p.partition_index}")


def _commit_error(response: Any) -> int:
    return next((int(p.error_code) for t in response.topics for p in t.partitions
                 if int(p.error_code)), 0)


def delete_consumer_groups(to_coordinator: Callable[..., Any], group_ids: Iterable[str],
                           deadline: float) -> dict[str, KafkaError | None]:
    """Kafka's Admin.deleteConsumerGroups (DeleteGroups to each group's coordinator): per
    group None (deleted with its committed offsets) or the error that kept it:
    NonEmptyGroupError while it has members, GroupIdNotFoundError for a group nobody knows,
    GroupAuthorizationFailedError."""
    out: dict[str, KafkaError | None] = {}
    for group_id in dict.fromkeys(group_ids):
        what = f"deleting group {group_id!r}"
        r = to_coordinator(KEY_TYPE_GROUP, group_id, ApiKey.DELETE_GROUPS,
                           {"groups_names": [group_id]}, deadline, _delete_error, what)
        code = _delete_error(r)
        out[group_id] = error_for_code(code)(what) if code else None
    return out


def _delete_error(response: Any) -> int:
    return next((int(g.error_code) for g in response.results), 0)
