"""The transaction coordinator's IO: carries out what txn/coordinator.py decides.

Each ``__transaction_state`` partition this broker leads has a coordinator core of its own,
loaded by the coordinator runtime (server/coordinator_runtime.py) when the broker becomes the
partition's leader: the partition is replayed and PrepareCommit / PrepareAbort left by the
previous coordinator are rolled forward (spec 000, "Transaction Coordinator Startup"). The
core's coordinator epoch is the partition's leader epoch, so markers of an earlier coordinator
(an earlier leader, or an earlier run of a single node) are fenced.

Every request that may write, and every timer and follow-up, runs as a write operation of the
runtime (``CoordinatorRuntime.schedule_write``): the core decides (an ``Outcome``: the answer
and its effects), its ``WriteTxnLog`` records are appended to the transactional id's partition
(Kafka's ``abs(hash) % transaction.state.log.num.partitions``), acks=all, and the answer goes
once the ISR has them; the core then hears how the write went (``write_done``) and what follows
runs in the partition's tasks:
- ``SendMarkers``: a WriteTxnMarkers request per transaction and partition leader (in process
  when this broker leads the partition: the replica side's marker writer,
  server/txn_marker_writer.py, which the WriteTxnMarkers handler uses too), retried for the
  partitions that could not take it yet, until every marker is written; then the transaction
  completes.

A timer aborts transactions past their timeout and expires idle transactional ids.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from kio.schema.errors import ErrorCode

from ..protocol import ApiKey, make, request_module
from ..txn.coordinator import (
    Effect,
    Outcome,
    Pause,
    SendMarkers,
    TransactionCoordinator,
    WriteTxnLog,
)
from ..txn.log_format import (
    encode_key,
    encode_value,
)
from ..txn.state import TransactionMetadata
from .clock import now_ms
from .coordinator_runtime import (
    CoordinatorResult,
    CoordinatorRuntime,
    CoordinatorWriteError,
    InternalTopicMetadata,
    LeadershipSource,
    PartitionLookup,
    PartitionWriter,
)
from .topics import CONSUMER_OFFSETS, INTERNAL_TOPICS, TRANSACTION_STATE

if TYPE_CHECKING:
    from .config import BrokerConfig
    from .ports import TxnMarkersPort

log = logging.getLogger("oncelog.txn")
request_log = logging.getLogger("oncelog.txn.requests")
TP = tuple[str, int]
# One record of __transaction_state: a transactional id's metadata (None: a tombstone).
TxnRecord = tuple[str, TransactionMetadata | None]
TxnResult = CoordinatorResult[TxnRecord, Outcome]

MARKER_RETRY_S = 0.1
# Marker errors after which retrying cannot help, and the partition is done: the topic is
# gone, or a newer producer epoch or coordinator already ended the transaction there. Every
# other is sent again (as Kafka's TransactionMarkerRequestCompletionHandler), NOT_ENOUGH_REPLICAS
# of a partition below its min.insync.replicas too: the transaction stays PrepareCommit /
# PrepareAbort until that partition's ISR is back and takes its marker.
_FINAL_MARKER_ERRORS = {ErrorCode.unknown_topic_or_partition, ErrorCode.invalid_producer_epoch,
                        ErrorCode.transaction_coordinator_fenced}


def _error(code: int) -> ErrorCode | None:
    return None if code == ErrorCode.none else ErrorCode(code)


class TxnMetadata(InternalTopicMetadata, Protocol):
    """What the coordinator asks of the cluster's metadata (server/metadata.py): its topics
    and their partitions' leaders (where markers go)."""

    @property
    def view(self) -> Any: ...  # the latest ClusterView

    def leader_of(self, topic: str, index: int) -> int | None: ...


class BrokerClient(Protocol):
    """Requests to another broker (server/interbroker.py's InterBrokerClient)."""

    async def request(self, node_id: int, request: Any, timeout_s: float = 30.0,
                      purpose: str = "control") -> Any: ...


class TxnService:
    """Built by the broker (server/broker.py) from what it uses: this node's id, the broker
    settings, the ``__transaction_state`` partitions' writer, leadership news and logs, the
    cluster's metadata, the producer id allocator, and where markers go: this broker's
    marker writer for the partitions it leads, ``client`` for the others'."""

    def __init__(self, node_id: int, config: BrokerConfig, *, writer: PartitionWriter,
                 leadership: LeadershipSource, partitions: PartitionLookup,
                 metadata: TxnMetadata, allocate_producer_id: Callable[[], int],
                 markers: TxnMarkersPort, client: BrokerClient) -> None:
        self.node_id = node_id
        self.config = config
        self.metadata = metadata
        self.allocate_producer_id = allocate_producer_id
        self.markers = markers
        self.client = client
        cfg = config
        # KIP-915/KIP-890: flexible records (with the previous/next producer ids) from
        # transaction.version 1 on; Kafka's original version 0 below.
        self.log_value_version = 1 if cfg.int("transaction.version") >= 1 else 0
        self.abort_interval_ms = cfg.int(
            "transaction.abort.timed.out.transaction.cleanup.interval.ms")
        self.expire_interval_ms = cfg.int(
            "transaction.remove.expired.transaction.cleanup.interval.ms")
        self.runtime: CoordinatorRuntime[TransactionCoordinator, TxnRecord] = \
            CoordinatorRuntime(
                TRANSACTION_STATE, writer=writer, leadership=leadership, partitions=partitions,
                metadata=metadata, new_shard=self._new_shard, serializer=self._serialize,
                on_loaded=self._loaded)
        self._last_expire = 0

    def load_summary(self) -> str:
        """What the loaded partitions hold (the replica manager's summary line)."""
        return (f"{sum(len(core.transactions) for core in self.all_cores())} transactional ids"
                + self.runtime.loading_note())

    def _new_core(self, coordinator_epoch: int) -> TransactionCoordinator:
        cfg = self.config
        return TransactionCoordinator(
            allocate_producer_id=self.allocate_producer_id,
            max_timeout_ms=cfg.int("transaction.max.timeout.ms"),
            expiration_ms=cfg.int("transactional.id.expiration.ms"),
            coordinator_epoch=coordinator_epoch,
            two_phase_commit_enabled=cfg.flag("transaction.two.phase.commit.enable"),
            transaction_version=cfg.int("transaction.version"))

    def core_for(self, transactional_id: str) -> tuple[TransactionCoordinator | None,
                                                       ErrorCode | None]:
        """The coordinator of this transactional id here, or the error to answer with
        (NOT_COORDINATOR unless this broker leads its partition, COORDINATOR_LOAD_IN_PROGRESS
        while the partition is being loaded)."""
        return self.runtime.shard_for(transactional_id)

    def all_cores(self) -> list[TransactionCoordinator]:
        """The loaded cores (of the partitions this broker leads)."""
        return list(self.runtime.shards.values())

    def loading(self) -> bool:
        """A partition this broker leads is still being loaded."""
        return self.runtime.loading()

    def _new_shard(self, _index: int, epoch: int) -> TransactionCoordinator:
        """This broker became the leader of the partition, so the coordinator of its
        transactional ids: a core the runtime replays the partition into."""
        return self._new_core(epoch)

    def _serialize(self, record: TxnRecord) -> tuple[bytes, bytes | None]:
        txn_id, metadata = record
        return encode_key(txn_id), (None if metadata is None
                                    else encode_value(metadata, self.log_value_version))

    def _loaded(self, index: int, core: TransactionCoordinator) -> None:
        """The partition is replayed: roll forward what the previous coordinator left
        prepared."""
        recovery = core.loaded_effects()
        epoch = core.coordinator_epoch
        # One summary line for all the partitions loaded (replication.py); a partition with
        # transactions to complete is worth its own.
        log.log(logging.INFO if recovery else logging.DEBUG,
                "transaction coordinator for %s-%d at epoch %d: %d transactional ids (%d to "
                "roll forward)", TRANSACTION_STATE, index, epoch, len(core.transactions),
                len(recovery))
        self._follow(index, core, recovery)

    def start(self) -> None:
        self._last_expire = now_ms()
        self.runtime.every(self.abort_interval_ms / 1000, self._tick)

    def _tick(self) -> None:
        now = now_ms()
        expire = now - self._last_expire >= self.expire_interval_ms
        if expire:
            self._last_expire = now
        for index, core in self.runtime.shards.items():
            if not core.transactions:
                continue
            self._background(index, "abort-timed-out-transactions",
                             lambda c: c.abort_timed_out(now))
            if expire:
                self._background(index, "expire-transactional-ids", lambda c: c.expire(now))

    def close(self) -> None:
        self.runtime.close()

    # -- what the requests ask (handlers/txn.py, and KIP-890's partition leaders here) --------

    async def write(self, transactional_id: str, name: str,
                    decide: Callable[[TransactionCoordinator], Outcome]) -> Outcome:
        """``decide`` on the core of the transactional id's partition, as a write of the
        runtime: its outcome once its record is on the ISR, or the error to answer with
        (NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS when the core is not ACTIVE here;
        COORDINATOR_NOT_AVAILABLE when its record could not be written: the change is dropped
        and the client retries)."""
        index = self.runtime.partition_of(transactional_id, create=True)
        decided: list[Outcome] = []

        def op(core: TransactionCoordinator) -> TxnResult:
            assert index is not None
            decided.append(decide(core))
            return self._result(index, core, decided[0])

        try:
            outcome = await self.runtime.schedule_write(index, name, op)
        except CoordinatorWriteError as exc:
            if not decided:
                return Outcome(exc.error)  # the core is not here (or not loaded yet)
            outcome = decided[0]
            request_log.debug("%r: the transaction log write failed: %s", transactional_id,
                              exc.error.name)
            # A fencing abort is answered CONCURRENT_TRANSACTIONS whatever its write did.
            outcome = dataclasses.replace(
                outcome, error=outcome.error or ErrorCode.coordinator_not_available)
        if outcome.error is not None and request_log.isEnabledFor(logging.DEBUG):
            core = self.runtime.active(index) if index is not None else None
            txn = core.transactions.get(transactional_id) if core is not None else None
            request_log.debug("%r: %s (state %s)", transactional_id, outcome.error.name,
                              txn and txn.state.name)
        return outcome

    def _unknown(self, wanted: list[TP]) -> set[TP]:
        topics = self.metadata.view.topics  # the cluster's topics, hosted here or not
        return {tp for tp in wanted if tp[0] not in topics or tp[0] in INTERNAL_TOPICS
                or tp[1] not in topics[tp[0]].partitions}

    async def add_partitions(self, transactional_id: str, producer_id: int,
                             producer_epoch: int, wanted: list[TP], *, version: int,
                             verify_only: bool = False, txn_version: int | None = None
                             ) -> dict[TP, ErrorCode | None]:
        """One transaction's partitions, added (or, ``verify_only``, checked): the error of
        each. AddPartitionsToTxn asks it (handlers/txn.py), and a partition leader here
        (server/txn_verification.py) when this broker coordinates the transactional id."""
        core, refused = self.core_for(transactional_id)
        if core is None:
            return {tp: refused for tp in wanted}
        if verify_only:
            return core.verify_partitions(transactional_id, producer_id, producer_epoch, wanted,
                                          version=version)
        unknown = self._unknown([tp for tp in wanted if tp[0] != CONSUMER_OFFSETS])
        if unknown:
            # None is added: the unknown ones fail, the others were not attempted (as Kafka).
            return {tp: ErrorCode.unknown_topic_or_partition if tp in unknown
                    else ErrorCode.operation_not_attempted for tp in wanted}
        outcome = await self.write(transactional_id, "add-partitions", lambda c: c.add_partitions(
            transactional_id, producer_id, producer_epoch, wanted, now_ms(), version=version,
            txn_version=txn_version))
        return {tp: outcome.error for tp in wanted}

    # -- carrying effects out -----------------------------------------------------------------

    def _result(self, index: int, core: TransactionCoordinator, outcome: Outcome) -> TxnResult:
        """An outcome as a write's result: its ``WriteTxnLog`` records; once written (or not),
        the core hears it (``write_done``) and what follows (markers, a retried completion)
        runs in the partition's tasks, as do the outcome's other effects."""
        writes = [e for e in outcome.effects if isinstance(e, WriteTxnLog)]
        rest: list[Effect] = [e for e in outcome.effects if not isinstance(e, WriteTxnLog)]

        def done(error: ErrorCode | None) -> None:
            for e in writes:
                if error is not None:
                    log.warning("transaction log write for %r failed: %s", e.transactional_id,
                                error.name)
                self._follow(index, core, core.write_done(e.transactional_id, error is None))
            self._follow(index, core, rest)

        return CoordinatorResult(outcome, [(e.transactional_id, e.metadata) for e in writes],
                                 on_done=done)

    def _follow(self, index: int, core: TransactionCoordinator, effects: list[Effect]) -> None:
        if effects:
            self.runtime.spawn(index, self._drive(index, core, effects))

    async def _drive(self, index: int, core: TransactionCoordinator,
                     effects: list[Effect]) -> None:
        for e in effects:
            if isinstance(e, WriteTxnLog):  # staged by the core already (a retry)
                def staged(_core: TransactionCoordinator, e: Effect = e) -> list[Effect]:
                    return [e]

                self._background(index, "write-txn-log", staged)
            elif isinstance(e, Pause):
                await asyncio.sleep(e.ms / 1000)
            else:
                await self._send_markers(e)

                def complete(core: TransactionCoordinator,
                             txn_id: str = e.transactional_id) -> list[Effect]:
                    return core.markers_done(txn_id, now_ms())

                self._background(index, "complete-transaction", complete)

    def _background(self, index: int, name: str,
                    decide: Callable[[TransactionCoordinator], list[Effect]]) -> None:
        """A write of the core's effects nobody answers (a timer's, a follow-up's)."""
        self.runtime.write_in_background(
            index, name, lambda core: self._result(index, core, Outcome(effects=decide(core))))

    async def _send_markers(self, e: SendMarkers) -> None:
        """spec 000 step 5.2: WriteTxnMarkers to each partition's leader (this broker's marker
        writer when that is this broker), retried until every partition has its
        marker; a partition without a leader is waited for (spec 000, "Discussion on
        Unavailable Partitions"), one whose topic is gone needs none."""
        metadata = self.metadata
        mod = request_module(ApiKey.WRITE_TXN_MARKERS, 2)

        async def send(node: int, tps: list[tuple[str, int]]
                       ) -> dict[tuple[str, int], ErrorCode | None] | None:
            if node == self.node_id:  # the partitions this broker leads, in process
                try:
                    return await self.markers.write(
                        sorted(tps), producer_id=e.producer_id, producer_epoch=e.producer_epoch,
                        commit=e.commit, coordinator_epoch=e.coordinator_epoch,
                        transaction_version=e.transaction_version)
                except Exception:  # a bug must not leave the transaction prepared for ever
                    log.exception("markers for %r here failed; again", e.transactional_id)
                    return None
            by_topic: dict[str, list[int]] = {}
            for t, p in sorted(tps):
                by_topic.setdefault(t, []).append(p)
            request = make(mod.WriteTxnMarkersRequest, markers=(make(
                mod.WritableTxnMarker, producer_id=e.producer_id,
                producer_epoch=e.producer_epoch, transaction_result=e.commit,
                coordinator_epoch=e.coordinator_epoch,
                transaction_version=e.transaction_version,
                topics=tuple(make(mod.WritableTxnMarkerTopic, name=t,
                                  partition_indexes=tuple(ps))
                             for t, ps in by_topic.items())),))
            try:
                response = await self.client.request(node, request, 30.0, purpose="markers")
                return {(t.name, p.partition_index): _error(p.error_code)
                        for t in response.markers[0].topics for p in t.partitions}
            except ConnectionError as exc:
                log.info("markers for %r to broker %d: %s", e.transactional_id, node, exc)
            except Exception:  # a bug must not leave the transaction prepared for ever
                log.exception("markers for %r to broker %d failed; again", e.transactional_id,
                              node)
            return None

        left = set(e.partitions)
        while left:
            by_node: dict[int, list[tuple[str, int]]] = {}
            for tp in list(left):
                if metadata.view is not None and tp[0] not in metadata.view.topics:
                    left.discard(tp)  # deleted: nothing to mark
                    continue
                leader = metadata.leader_of(*tp)
                if leader is not None:
                    by_node.setdefault(leader, []).append(tp)
            responses = await asyncio.gather(*(send(n, tps) for n, tps in by_node.items()))
            for errors in responses:
                for (topic, index), code in (errors or {}).items():
                    if code is None or code in _FINAL_MARKER_ERRORS:
                        if code is not None:
                            log.warning("marker for %r on %s-%d: %s (not retried)",
                                        e.transactional_id, topic, index, code.name)
                        left.discard((topic, index))
                    else:
                        log.debug("marker for %r on %s-%d: %s (again)", e.transactional_id,
                                  topic, index, code.name)
            if left:
                log.debug("markers for %r: waiting for %s", e.transactional_id,
                          ", ".join(f"{t}-{p}" for t, p in sorted(left)))
                await asyncio.sleep(MARKER_RETRY_S)

    # -- metrics ------------------------------------------------------------------------------

    def metric_samples(self):
        from .metrics import Sample

        yield Sample("oncelog_active_transactional_ids",
                     "transactional ids the transaction coordinator holds",
                     sum(len(c.transactions) for c in self.all_cores()))
        # KIP-939: kafka.server:type=transaction-coordinator-metrics,
        # name=active-transaction-open-time-max
        yield Sample("oncelog_active_transaction_open_time_max_seconds",
                     "how long the oldest open transaction has been open",
                     max((c.longest_open_ms(now_ms()) for c in self.all_cores()),
                         default=0) / 1000)
