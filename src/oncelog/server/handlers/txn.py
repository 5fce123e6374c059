"""The transaction coordinator's RPCs (spec 000, RPC summary): InitProducerId with a
transactional id, AddPartitionsToTxn, AddOffsetsToTxn, EndTxn, DescribeTransactions,
ListTransactions. Each asks the sans-IO coordinator (txn/coordinator.py), has
server/txn_service.py carry out the effects, and answers once the transaction log holds the
change (an EndTxn: once PrepareCommit / PrepareAbort is written; the markers follow).
"""

from __future__ import annotations

import datetime
from types import ModuleType
from typing import Any

from kio.schema.errors import ErrorCode

from ...protocol import ApiKey, make, millis, response_module
from ...txn.coordinator import Outcome
from ...txn.state import TransactionState
from ..clock import now_ms
from ..context import RequestContext
from ..ports import TxnApiPort
from ..topics import CONSUMER_OFFSETS
from . import acl
from .util import error_code

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


def _timestamp(ms: int) -> datetime.datetime:
    """DescribeTransactions' start time: -1 (as Kafka writes it) when no transaction has begun
    since InitProducerId. kio writes it (a moment before 1970); our client reads it as none
    (protocol/negative_times.py)."""
    return _EPOCH + datetime.timedelta(milliseconds=max(ms, -1))


async def handle_init_producer_id_transactional(broker: TxnApiPort, ctx: RequestContext,
                                                request: Any) -> Any:
    mod = response_module(ApiKey.INIT_PRODUCER_ID, ctx.version)
    enable_2pc = bool(getattr(request, "enable2_pc", False))
    keep_prepared = bool(getattr(request, "keep_prepared_txn", False))
    txn_id = request.transactional_id
    if not acl.transactional_id(broker, ctx, acl.Op.WRITE, txn_id) or (
            enable_2pc and not acl.transactional_id(broker, ctx, acl.Op.TWO_PHASE_COMMIT, txn_id)):
        # Spec 000: Write on the TransactionalId; KIP-939: and TwoPhaseCommit for enable2Pc.
        outcome = Outcome(ErrorCode.transactional_id_authorization_failed)
    elif (enable_2pc or keep_prepared) and broker.transaction_version < 2:
        outcome = Outcome(ErrorCode.unsupported_version)  # KIP-939 builds on transaction version 2
    else:  # (NOT_COORDINATOR when another broker coordinates this id)
        outcome = await broker.txn_coordinator.write(
            txn_id, "init-producer-id", lambda core: core.init_producer_id(
                txn_id, millis(request.transaction_timeout), now_ms(),
                producer_id=getattr(request, "producer_id", -1),
                producer_epoch=getattr(request, "producer_epoch", -1), version=ctx.version,
                enable_2pc=enable_2pc, keep_prepared_txn=keep_prepared))
    err = outcome.error
    ok = err is None
    return make(mod.InitProducerIdResponse, throttle_time=0, error_code=error_code(err),
                producer_id=outcome.producer_id if ok else -1,
                producer_epoch=outcome.producer_epoch if ok else -1,
                ongoing_txn_producer_id=outcome.ongoing_producer_id if ok else -1,
                ongoing_txn_producer_epoch=outcome.ongoing_producer_epoch if ok else -1)


def _topic_results(mod: ModuleType, errors: dict[tuple[str, int], ErrorCode | None]) -> tuple:
    by_topic: dict[str, list] = {}
    for (topic, p), err in errors.items():
        by_topic.setdefault(topic, []).append(make(
            mod.AddPartitionsToTxnPartitionResult, partition_index=p,
            partition_error_code=error_code(err)))
    return tuple(make(mod.AddPartitionsToTxnTopicResult, name=t, results_by_partition=tuple(ps))
                 for t, ps in by_topic.items())


async def handle_add_partitions_to_txn(broker: TxnApiPort, ctx: RequestContext, request: Any
                                          ) -> Any:
    mod = response_module(ApiKey.ADD_PARTITIONS_TO_TXN, ctx.version)
    errors: dict[tuple[str, int], ErrorCode | None]
    if ctx.version <= 3:
        wanted = [(t.name, p) for t in request.v3_and_below_topics for p in t.partitions]
        txn_id = request.v3_and_below_transactional_id
        denied = {tp for tp in wanted if not acl.topic(broker, ctx, acl.Op.WRITE, tp[0])}
        if not acl.transactional_id(broker, ctx, acl.Op.WRITE, txn_id):
            errors = {tp: ErrorCode.transactional_id_authorization_failed for tp in wanted}
        elif denied:  # as Kafka: the denied ones fail, the others are not attempted
            errors = {tp: ErrorCode.topic_authorization_failed if tp in denied
                      else ErrorCode.operation_not_attempted for tp in wanted}
        else:
            errors = await broker.txn_coordinator.add_partitions(
                txn_id, request.v3_and_below_producer_id, request.v3_and_below_producer_epoch,
                wanted, version=ctx.version, txn_version=min(broker.transaction_version, 1))
        return make(mod.AddPartitionsToTxnResponse, throttle_time=0,
                    results_by_topic_v3_and_below=_topic_results(mod, errors))
    # v4+: the partition leaders' request (KIP-890), batched by transactional id. verifyOnly:
    # an older client's transaction must be ongoing and hold the partition; otherwise the
    # leader adds the partition for a client of transaction version 2. Brokers only.
    if not acl.cluster(broker, ctx, acl.Op.CLUSTER_ACTION):
        return make(mod.AddPartitionsToTxnResponse, throttle_time=0,
                    error_code=ErrorCode.cluster_authorization_failed,
                    results_by_transaction=())
    results = []
    for txn in request.transactions:
        wanted = [(t.name, p) for t in txn.topics for p in t.partitions]
        errors = await broker.txn_coordinator.add_partitions(
            txn.transactional_id, txn.producer_id, txn.producer_epoch, wanted,
            version=ctx.version, verify_only=bool(txn.verify_only),
            txn_version=None if txn.verify_only else 2)
        results.append(make(mod.AddPartitionsToTxnResult, transactional_id=txn.transactional_id,
                            topic_results=_topic_results(mod, errors)))
    return make(mod.AddPartitionsToTxnResponse, throttle_time=0, error_code=0,
                results_by_transaction=tuple(results))


async def handle_add_offsets_to_txn(broker: TxnApiPort, ctx: RequestContext, request: Any) -> Any:
    mod = response_module(ApiKey.ADD_OFFSETS_TO_TXN, ctx.version)
    if not acl.transactional_id(broker, ctx, acl.Op.WRITE, request.transactional_id):
        return make(mod.AddOffsetsToTxnResponse, throttle_time=0,
                    error_code=ErrorCode.transactional_id_authorization_failed)
    if not acl.group(broker, ctx, acl.Op.READ, request.group_id):
        return make(mod.AddOffsetsToTxnResponse, throttle_time=0,
                    error_code=ErrorCode.group_authorization_failed)
    core, refused = broker.txn_coordinator.core_for(request.transactional_id)
    index = broker.group_coordinator.partition_index(request.group_id, create=True)
    if index is None:
        refused = refused or ErrorCode.coordinator_not_available
    if core is None or index is None or refused:
        return make(mod.AddOffsetsToTxnResponse, throttle_time=0,
                    error_code=error_code(refused))
    tp = (CONSUMER_OFFSETS, index)
    outcome = await broker.txn_coordinator.write(
        request.transactional_id, "add-offsets", lambda core: core.add_partitions(
            request.transactional_id, request.producer_id, request.producer_epoch, [tp],
            now_ms(), version=ctx.version, api="add_offsets",
            txn_version=min(broker.transaction_version, 1)))
    return make(mod.AddOffsetsToTxnResponse, throttle_time=0, error_code=error_code(outcome.error))


async def handle_end_txn(broker: TxnApiPort, ctx: RequestContext, request: Any) -> Any:
    mod = response_module(ApiKey.END_TXN, ctx.version)
    # EndTxn v5+ is a client of transaction version 2 (the broker offers it only at level 2);
    # an older one is recorded as version 1 once the broker writes flexible records (KIP-890).
    txn_version = 2 if ctx.version >= 5 else min(broker.transaction_version, 1)
    if not acl.transactional_id(broker, ctx, acl.Op.WRITE, request.transactional_id):
        return make(mod.EndTxnResponse, throttle_time=0,
                    error_code=ErrorCode.transactional_id_authorization_failed,
                    producer_id=-1, producer_epoch=-1)
    outcome = await broker.txn_coordinator.write(
        request.transactional_id, "end-txn", lambda core: core.end_txn(
            request.transactional_id, request.producer_id, request.producer_epoch,
            bool(request.committed), now_ms(), version=ctx.version, txn_version=txn_version))
    err = outcome.error
    ok = err is None
    return make(mod.EndTxnResponse, throttle_time=0, error_code=error_code(err),
                producer_id=outcome.producer_id if ok else -1,
                producer_epoch=outcome.producer_epoch if ok else -1)


async def handle_describe_transactions(broker: TxnApiPort, ctx: RequestContext, request: Any
                                          ) -> Any:
    mod = response_module(ApiKey.DESCRIBE_TRANSACTIONS, ctx.version)
    states = []
    for txn_id in request.transactional_ids:
        allowed = acl.transactional_id(broker, ctx, acl.Op.DESCRIBE, txn_id)
        core, refused = broker.txn_coordinator.core_for(txn_id)
        m = core.describe(txn_id) if core is not None and core.loaded and allowed else None
        err = None if m is not None else (
            ErrorCode.transactional_id_authorization_failed if not allowed else
            refused if core is None else
            ErrorCode.transactional_id_not_found if core.loaded else ErrorCode.coordinator_load_in_progress)
        by_topic: dict[str, list[int]] = {}
        for t, p in sorted(m.partitions if m else ()):
            by_topic.setdefault(t, []).append(p)
        states.append(make(
            mod.TransactionState, error_code=error_code(err), transactional_id=txn_id,
            transaction_state=m.state.display if m else "",
            transaction_timeout=m.txn_timeout_ms if m else 0,
            transaction_start_time=_timestamp(m.txn_start_ms if m else -1),
            producer_id=m.producer_id if m else -1, producer_epoch=m.producer_epoch if m else -1,
            topics=tuple(make(mod.TopicData, topic=t, partitions=tuple(ps))
                         for t, ps in by_topic.items())))
    return make(mod.DescribeTransactionsResponse, throttle_time=0,
                transaction_states=tuple(states))


async def handle_list_transactions(broker: TxnApiPort, ctx: RequestContext, request: Any) -> Any:
    mod = response_module(ApiKey.LIST_TRANSACTIONS, ctx.version)
    cores = broker.txn_coordinator.all_cores()
    states, unknown = set(), []
    for name in request.state_filters:
        state = TransactionState.from_display(name)
        if state is None:
            unknown.append(name)
        else:
            states.add(state)
    if request.state_filters and not states:
        found = []  # only unknown states asked for: none matches
    else:
        found = [m for core in cores
                 for m in core.list(states or None, set(request.producer_id_filters) or None,
                                    getattr(request, "duration_filter", -1), now_ms())]
    return make(mod.ListTransactionsResponse, throttle_time=0,
                error_code=error_code(None if not broker.txn_coordinator.loading()
                                      else ErrorCode.coordinator_load_in_progress),
                unknown_state_filters=tuple(unknown),
                transaction_states=tuple(make(mod.TransactionState,
                                              transactional_id=m.transactional_id,
                                              producer_id=m.producer_id,
                                              transaction_state=m.state.display)
                                         for m in found
                                         if acl.transactional_id(broker, ctx, acl.Op.DESCRIBE,
                                                                 m.transactional_id)))
