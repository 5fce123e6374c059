"""The group coordinator's RPCs: JoinGroup, SyncGroup, Heartbeat, LeaveGroup (Kafka's classic
group protocol), OffsetCommit, OffsetFetch, TxnOffsetCommit, DescribeGroups, ListGroups,
DeleteGroups. Each asks group/coordinator.py through server/group_service.py."""

from __future__ import annotations

from types import ModuleType
from typing import Any

from kio.schema.errors import ErrorCode

from ...group.coordinator import GroupState
from ...group.log_format import OffsetValue
from ...protocol import ApiKey, make, millis, response_module
from ...protocol.consumer_protocol import subscribed_topics
from ..clock import now_ms
from ..context import RequestContext
from ..ports import GroupApiPort
from ..topics import CONSUMER_OFFSETS
from ..txn_verification import offset_commit_error
from . import acl
from .util import error_code

NO_OFFSET = -1


def _group_denied(broker: GroupApiPort, ctx: RequestContext, group_id: str, op=acl.Op.READ) -> bool:
    return not acl.group(broker, ctx, op, group_id)


def _elsewhere(broker: GroupApiPort, group_id: str) -> ErrorCode | None:
    """Cluster mode: NOT_COORDINATOR when another broker coordinates the group."""
    return broker.group_coordinator.not_coordinator(group_id)


async def handle_join_group(broker: GroupApiPort, ctx: RequestContext, request: Any) -> Any:
    mod = response_module(ApiKey.JOIN_GROUP, ctx.version)
    refused = (ErrorCode.group_authorization_failed if _group_denied(broker, ctx, request.group_id)
               else _elsewhere(broker, request.group_id))
    if refused:
        return make(mod.JoinGroupResponse, throttle_time=0,
                    error_code=error_code(refused), generation_id=-1, protocol_type=None,
                    protocol_name=None if ctx.version >= 7 else "",  # nullable from v7
                    leader="", skip_assignment=False, member_id="", members=())
    session_ms = millis(request.session_timeout)
    rebalance_ms = millis(getattr(request, "rebalance_timeout", None))
    if rebalance_ms < 0:
        rebalance_ms = session_ms  # v0: the session timeout bounds the rebalance too
    resp = await broker.group_coordinator.join(
        request.group_id, request.member_id, getattr(request, "group_instance_id", None),
        request.protocol_type, [(p.name, bytes(p.metadata)) for p in request.protocols],
        # Kafka keeps the member's address as Java prints an InetAddress: "/127.0.0.1"
        session_ms, rebalance_ms, ctx.header.client_id or "", "/" + ctx.host,
        now_ms(), require_known_member_id=ctx.version >= 4)
    nullable = ctx.version >= 7
    return make(mod.JoinGroupResponse, throttle_time=0, error_code=error_code(resp.error),
                generation_id=resp.generation, protocol_type=resp.protocol_type,
                protocol_name=resp.protocol if resp.protocol or nullable else "",
                leader=resp.leader, skip_assignment=resp.skip_assignment, member_id=resp.member_id,
                members=tuple(make(mod.JoinGroupResponseMember, member_id=m, group_instance_id=i,
                                   metadata=meta) for m, i, meta in resp.members))


async def handle_sync_group(broker: GroupApiPort, ctx: RequestContext, request: Any) -> Any:
    mod = response_module(ApiKey.SYNC_GROUP, ctx.version)
    refused = (ErrorCode.group_authorization_failed if _group_denied(broker, ctx, request.group_id)
               else _elsewhere(broker, request.group_id))
    if refused:
        return make(mod.SyncGroupResponse, throttle_time=0,
                    error_code=error_code(refused), protocol_type=None,
                    protocol_name=None, assignment=b"")
    assignments = {a.member_id: bytes(a.assignment) for a in request.assignments} \
        if request.assignments else None
    resp = await broker.group_coordinator.sync(
        request.group_id, request.generation_id, request.member_id,
        getattr(request, "group_instance_id", None), assignments)
    return make(mod.SyncGroupResponse, throttle_time=0, error_code=error_code(resp.error),
                protocol_type=resp.protocol_type, protocol_name=resp.protocol,
                assignment=resp.assignment)


async def handle_heartbeat(broker: GroupApiPort, ctx: RequestContext, request: Any) -> Any:
    mod = response_module(ApiKey.HEARTBEAT, ctx.version)
    err = ErrorCode.group_authorization_failed if _group_denied(broker, ctx, request.group_id) else \
        _elsewhere(broker, request.group_id) or broker.group_coordinator.shard(
            request.group_id).heartbeat(request.group_id, request.generation_id, request.member_id,
            getattr(request, "group_instance_id", None), now_ms())
    return make(mod.HeartbeatResponse, throttle_time=0, error_code=error_code(err))


async def handle_leave_group(broker: GroupApiPort, ctx: RequestContext, request: Any) -> Any:
    mod = response_module(ApiKey.LEAVE_GROUP, ctx.version)
    if ctx.version < 3:
        members: list[tuple[str, str | None]] = [(request.member_id, None)]
    else:
        members = [(m.member_id, m.group_instance_id) for m in request.members]
    # Kafka: Read on the group (GROUP_AUTHORIZATION_FAILED), or any user could evict another
    # user's (static) members.
    refused = (ErrorCode.group_authorization_failed if _group_denied(broker, ctx, request.group_id)
               else _elsewhere(broker, request.group_id))
    if refused:
        if ctx.version < 3:
            return make(mod.LeaveGroupResponse, throttle_time=0, error_code=error_code(refused))
        return make(mod.LeaveGroupResponse, throttle_time=0, error_code=error_code(refused),
                    members=())
    refused, errors = await broker.group_coordinator.leave(request.group_id, members)
    if refused:
        if ctx.version < 3:
            return make(mod.LeaveGroupResponse, throttle_time=0, error_code=error_code(refused))
        return make(mod.LeaveGroupResponse, throttle_time=0, error_code=error_code(refused),
                    members=())
    if ctx.version < 3:
        return make(mod.LeaveGroupResponse, throttle_time=0, error_code=error_code(errors[0]))
    return make(mod.LeaveGroupResponse, throttle_time=0, error_code=0, members=tuple(
        make(mod.MemberResponse, member_id=m, group_instance_id=i, error_code=error_code(e))
        for (m, i), e in zip(members, errors, strict=True)))


def _offsets(topics, now: int) -> dict[tuple[str, int], OffsetValue]:
    return {(t.name, p.partition_index): OffsetValue(
        p.committed_offset, getattr(p, "committed_leader_epoch", -1),
        p.committed_metadata or "", now) for t in topics for p in t.partitions}


def _per_partition(mod: ModuleType, topic_cls: str, part_cls: str, topics, err,
                   unknown: frozenset[tuple[str, int]] = frozenset()):
    """Every partition answered ``err``, but those in ``unknown``:
    UNKNOWN_TOPIC_OR_PARTITION."""
    return tuple(make(getattr(mod, topic_cls), name=t.name, partitions=tuple(
        make(getattr(mod, part_cls), partition_index=p.partition_index, error_code=error_code(
            ErrorCode.unknown_topic_or_partition if (t.name, p.partition_index) in unknown else err))
        for p in t.partitions)) for t in topics)


def _unknown_partitions(broker: GroupApiPort, topics) -> frozenset[tuple[str, int]]:
    """The partitions an offset commit names that do not exist: Kafka answers them
    UNKNOWN_TOPIC_OR_PARTITION and commits the others (KafkaApis.handleOffsetCommitRequest)."""
    known = broker.metadata.view.topics
    return frozenset((t.name, p.partition_index) for t in topics for p in t.partitions
                     if t.name not in known
                     or p.partition_index not in known[t.name].partitions)


def _known_offsets(broker: GroupApiPort, topics) -> tuple[frozenset[tuple[str, int]],
                                          dict[tuple[str, int], OffsetValue]]:
    """(the partitions that do not exist, the offsets of the others)."""
    unknown = _unknown_partitions(broker, topics)
    return unknown, {tp: v for tp, v in _offsets(topics, now_ms()).items() if tp not in unknown}


async def handle_offset_commit(broker: GroupApiPort, ctx: RequestContext, request: Any) -> Any:
    mod = response_module(ApiKey.OFFSET_COMMIT, ctx.version)
    names = ("OffsetCommitResponseTopic", "OffsetCommitResponsePartition")
    err = _offsets_denied(broker, ctx, request) or _elsewhere(broker, request.group_id)
    if err is not None:
        return make(mod.OffsetCommitResponse, throttle_time=0,
                    topics=_per_partition(mod, *names, request.topics, err))
    unknown, offsets = _known_offsets(broker, request.topics)
    if offsets:  # nothing to commit: the group is not asked (as Kafka)
        err = await broker.group_coordinator.commit(
            request.group_id, request.generation_id_or_member_epoch, request.member_id,
            getattr(request, "group_instance_id", None), offsets)
    return make(mod.OffsetCommitResponse, throttle_time=0,
                topics=_per_partition(mod, *names, request.topics, err, unknown))


async def _verify_offsets(broker: GroupApiPort, request: Any, new_client: bool):
    """KIP-890: the group's ``__consumer_offsets`` partition joins the transaction through the
    coordinator (TxnOffsetCommit v5), or is verified to be in it (older clients).
    Returns (error, guard, whether the append must carry the verification)."""
    verifier = broker.txn_verifier
    if not verifier.applies(new_client):
        return None, None, False
    partition = broker.group_coordinator.offsets_partition(request.group_id)
    state = partition.log.producer_state
    pid, epoch = request.producer_id, request.producer_epoch
    if not state.needs_verification(pid, epoch):
        return None, None, True
    guards = [state.start_verification(pid, epoch)]

    def renew() -> None:  # see handlers/produce.py
        guards[0] = state.start_verification(pid, epoch)

    answers = await verifier.check(request.transactional_id, pid, epoch,
                                   [(CONSUMER_OFFSETS, partition.index)], add=new_client,
                                   renew=renew)
    guard = guards[0]
    err = next(iter(answers.values()), None)
    return (offset_commit_error(err) if err else None), guard, True


def _offsets_denied(broker: GroupApiPort, ctx: RequestContext, request: Any
                    ) -> ErrorCode | None:
    """Committing offsets needs Read on the group and on each topic (spec 000)."""
    if _group_denied(broker, ctx, request.group_id):
        return ErrorCode.group_authorization_failed
    if any(not acl.topic(broker, ctx, acl.Op.READ, t.name) for t in request.topics):
        return ErrorCode.topic_authorization_failed
    return None


async def handle_txn_offset_commit(broker: GroupApiPort, ctx: RequestContext, request: Any) -> Any:
    mod = response_module(ApiKey.TXN_OFFSET_COMMIT, ctx.version)
    # Kafka's order: Write on the transactional id, then Read on the group and the topics.
    err = ErrorCode.transactional_id_authorization_failed if not acl.transactional_id(
        broker, ctx, acl.Op.WRITE, request.transactional_id) else _offsets_denied(
        broker, ctx, request)
    guard, verify = None, False
    if err is None:
        err = _elsewhere(broker, request.group_id)
    unknown: frozenset[tuple[str, int]] = frozenset()
    offsets: dict[tuple[str, int], OffsetValue] = {}
    if err is None:
        unknown, offsets = _known_offsets(broker, request.topics)
    if err is None and offsets:  # nothing to commit: the transaction is not touched
        err, guard, verify = await _verify_offsets(broker, request, ctx.version >= 5)
        if err is None:
            err = await broker.group_coordinator.txn_commit(
                request.group_id, request.producer_id, request.producer_epoch,
                getattr(request, "generation_id", -1), getattr(request, "member_id", ""),
                getattr(request, "group_instance_id", None), offsets,
                verification=guard, require_verification=verify)
    if err == ErrorCode.invalid_producer_epoch and ctx.version >= 3:
        err = ErrorCode.producer_fenced  # KIP-588
    return make(mod.TxnOffsetCommitResponse, throttle_time=0, topics=_per_partition(
        mod, "TxnOffsetCommitResponseTopic", "TxnOffsetCommitResponsePartition", request.topics,
        err, unknown))


def _fetch_group(broker: GroupApiPort, ctx: RequestContext, mod: ModuleType,
                 names: tuple[str, str, str], group_id: str, topics: Any,
                 require_stable: bool) -> tuple:
    topic_cls, part_cls = names[0], names[1]
    wanted = None if topics is None else [(t.name, p) for t in topics for p in t.partition_indexes]
    found = broker.group_coordinator.shard(group_id).fetch_offsets(group_id, wanted,
                                                                   require_stable)
    described = acl.topics_checker(broker, ctx, acl.Op.DESCRIBE)
    by_topic: dict[str, list] = {}
    for (topic, p), value, err in found:
        # Kafka: offsets of a topic the caller may not Describe are not shown; named
        # partitions are answered TOPIC_AUTHORIZATION_FAILED, an all-topics fetch omits them.
        if not described(topic):
            if wanted is None:
                continue
            value, err = None, ErrorCode.topic_authorization_failed
        by_topic.setdefault(topic, []).append(make(
            getattr(mod, part_cls), partition_index=p,
            committed_offset=value.offset if value else NO_OFFSET,
            committed_leader_epoch=value.leader_epoch if value else -1,
            metadata=value.metadata if value else "", error_code=error_code(err)))
    return tuple(make(getattr(mod, topic_cls), name=t, partitions=tuple(ps))
                 for t, ps in by_topic.items())


async def handle_offset_fetch(broker: GroupApiPort, ctx: RequestContext, request: Any) -> Any:
    mod = response_module(ApiKey.OFFSET_FETCH, ctx.version)
    require_stable = bool(getattr(request, "require_stable", False))
    denied = ErrorCode.group_authorization_failed
    if ctx.version >= 8:
        groups = tuple(
            make(mod.OffsetFetchResponseGroup, group_id=g.group_id, error_code=denied, topics=())
            if _group_denied(broker, ctx, g.group_id, acl.Op.DESCRIBE) else
            make(mod.OffsetFetchResponseGroup, group_id=g.group_id,
                 error_code=error_code(_elsewhere(broker, g.group_id)), topics=())
            if _elsewhere(broker, g.group_id) else
            make(mod.OffsetFetchResponseGroup, group_id=g.group_id, error_code=0,
                 topics=_fetch_group(broker, ctx, mod, ("OffsetFetchResponseTopics",
                                                   "OffsetFetchResponsePartitions", ""),
                                     g.group_id, g.topics, require_stable))
            for g in request.groups)
        return make(mod.OffsetFetchResponse, throttle_time=0, groups=groups)
    if _group_denied(broker, ctx, request.group_id, acl.Op.DESCRIBE):
        return make(mod.OffsetFetchResponse, throttle_time=0, topics=(), error_code=denied)
    refused = _elsewhere(broker, request.group_id)
    if refused:
        return make(mod.OffsetFetchResponse, throttle_time=0, topics=(),
                    error_code=error_code(refused))
    topics = _fetch_group(broker, ctx, mod, ("OffsetFetchResponseTopic",
                                        "OffsetFetchResponsePartition", ""),
                          request.group_id, request.topics, require_stable)
    return make(mod.OffsetFetchResponse, throttle_time=0, topics=topics, error_code=0)


async def handle_describe_groups(broker: GroupApiPort, ctx: RequestContext, request: Any) -> Any:
    mod = response_module(ApiKey.DESCRIBE_GROUPS, ctx.version)
    out = []

    def ops(group_id: str) -> int:  # KIP-430 (v3+): of the groups answered without error
        if not getattr(request, "include_authorized_operations", False):
            return acl.OPERATIONS_OMITTED
        return acl.authorized_operations(broker, ctx, acl.R.GROUP, group_id)

    for group_id in request.groups:
        g = broker.group_coordinator.group(group_id)
        if _group_denied(broker, ctx, group_id, acl.Op.DESCRIBE):
            out.append(make(mod.DescribedGroup, error_code=ErrorCode.group_authorization_failed,
                            group_id=group_id, group_state="", protocol_type="",
                            protocol_data="", members=(), authorized_operations=-2**31))
            continue
        refused = _elsewhere(broker, group_id)
        if refused:
            out.append(make(mod.DescribedGroup, error_code=error_code(refused),
                            group_id=group_id, group_state="", protocol_type="",
                            protocol_data="", members=(), authorized_operations=-2**31))
            continue
        if g is None:
            # v6 (KIP-1043): an unknown group is GROUP_ID_NOT_FOUND, as Kafka answers (the
            # admin client then raises GroupIdNotFoundException); before v6 a Dead group.
            extra = {"error_code": ErrorCode.group_id_not_found,
                     "error_message": f"Group {group_id} not found."} \
                if ctx.version >= 6 else {"error_code": 0}
            out.append(make(mod.DescribedGroup, group_id=group_id,
                            group_state=GroupState.DEAD.value, protocol_type="",
                            protocol_data="", members=(), **extra,
                            authorized_operations=ops(group_id) if ctx.version < 6
                            else acl.OPERATIONS_OMITTED))
            continue
        members = tuple(make(mod.DescribedGroupMember, member_id=m.member_id,
                             group_instance_id=m.group_instance_id, client_id=m.client_id,
                             client_host=m.client_host, member_metadata=m.metadata(g.protocol),
                             member_assignment=m.assignment) for m in g.members.values())
        out.append(make(mod.DescribedGroup, error_code=0, group_id=group_id,
                        group_state=g.state.value, protocol_type=g.protocol_type or "",
                        protocol_data=g.protocol or "", members=members,
                        authorized_operations=ops(group_id)))
    return make(mod.DescribeGroupsResponse, throttle_time=0, groups=tuple(out))


# KIP-848's group types; every group of ours is a classic one (the classic group protocol).
CLASSIC_GROUP_TYPE = "classic"


async def handle_list_groups(broker: GroupApiPort, ctx: RequestContext, request: Any) -> Any:
    """ListGroups: v4 filters by state (KIP-518), v5 by type too (KIP-848); both filters are
    case-insensitive, as Kafka's, and a type Kafka does not know matches no group. While a
    partition of ``__consumer_offsets`` led here is still being loaded the groups of the loaded
    ones are listed with COORDINATOR_LOAD_IN_PROGRESS (Kafka's handleListGroups)."""
    mod = response_module(ApiKey.LIST_GROUPS, ctx.version)
    states = {s.strip().lower() for s in getattr(request, "states_filter", ())}
    types = {t.strip().lower() for t in getattr(request, "types_filter", ())}
    everything = acl.cluster(broker, ctx, acl.Op.DESCRIBE)  # Kafka: Describe on the cluster
    groups = tuple(make(mod.ListedGroup, group_id=g.group_id, protocol_type=g.protocol_type or "",
                        group_state=g.state.value, group_type=CLASSIC_GROUP_TYPE)
                   for g in broker.group_coordinator.groups().values()
                   if (not states or g.state.value.lower() in states)
                   and (not types or CLASSIC_GROUP_TYPE in types)
                   and (everything or not _group_denied(broker, ctx, g.group_id,
                                                          acl.Op.DESCRIBE)))
    loading = broker.group_coordinator.loading()
    return make(mod.ListGroupsResponse, throttle_time=0, groups=groups, error_code=error_code(
        ErrorCode.coordinator_load_in_progress if loading else None))


async def handle_delete_groups(broker: GroupApiPort, ctx: RequestContext, request: Any) -> Any:
    mod = response_module(ApiKey.DELETE_GROUPS, ctx.version)
    results = []
    for group_id in request.groups_names:
        if _group_denied(broker, ctx, group_id, acl.Op.DELETE):
            results.append(make(mod.DeletableGroupResult, group_id=group_id,
                                error_code=ErrorCode.group_authorization_failed))
            continue
        refused = _elsewhere(broker, group_id)
        if refused:
            results.append(make(mod.DeletableGroupResult, group_id=group_id,
                                error_code=error_code(refused)))
            continue
        err = await broker.group_coordinator.delete_group(group_id)
        results.append(make(mod.DeletableGroupResult, group_id=group_id,
                            error_code=error_code(err)))
    return make(mod.DeleteGroupsResponse, throttle_time=0, results=tuple(results))


async def handle_offset_delete(broker: GroupApiPort, ctx: RequestContext, request: Any) -> Any:
    """OffsetDelete (KIP-496): Delete on the group, Read on each topic; a partition that does not
    exist: UNKNOWN_TOPIC_OR_PARTITION; the rest as the group coordinator decides."""
    mod = response_module(ApiKey.OFFSET_DELETE, ctx.version)
    group_id = request.group_id
    refused = (ErrorCode.group_authorization_failed
               if _group_denied(broker, ctx, group_id, acl.Op.DELETE)
               else _elsewhere(broker, group_id))
    errors: dict[tuple[str, int], ErrorCode | None] = {}
    if refused is None:
        readable = acl.topics_checker(broker, ctx, acl.Op.READ)
        unknown = _unknown_partitions(broker, request.topics)
        wanted: list[tuple[str, int]] = []
        for t in request.topics:
            for p in t.partitions:
                tp = (t.name, p.partition_index)
                if not readable(t.name):
                    errors[tp] = ErrorCode.topic_authorization_failed
                elif tp in unknown:
                    errors[tp] = ErrorCode.unknown_topic_or_partition
                else:
                    wanted.append(tp)
        refused, decided = await broker.group_coordinator.delete_offsets(
            group_id, wanted, subscribed_topics)
        errors.update(decided)
    if refused is not None:
        return make(mod.OffsetDeleteResponse, error_code=error_code(refused), throttle_time=0,
                    topics=())
    return make(mod.OffsetDeleteResponse, error_code=error_code(None), throttle_time=0,
                topics=tuple(make(mod.OffsetDeleteResponseTopic, name=t.name, partitions=tuple(
                    make(mod.OffsetDeleteResponsePartition, partition_index=p.partition_index,
                         error_code=error_code(errors.get((t.name, p.partition_index))))
                    for p in t.partitions)) for t in request.topics))
