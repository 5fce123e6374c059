"""The transaction coordinator's IO: carries out what txn/coordinator.py decides.

- ``WriteTxnLog``: append the transactional id's record to its partition of
  ``__transaction_state`` (Kafka's ``abs(hash) % transaction.state.log.num.partitions``);
- ``SendMarkers``: a WriteTxnMarkers request per transaction and partition leader (on a single
  node, or for partitions this broker leads, in process through the same handler a remote
  coordinator's request reaches: server/handlers/txn_markers.py), retried for the partitions
  that could not take it yet, until every marker is written; then the transaction completes.

At startup the coordinator epoch is bumped (persisted in the data directory, so markers from
this incarnation outrank those of any earlier one) and the transaction log is replayed;
PrepareCommit / PrepareAbort left by the previous run are rolled forward. A timer aborts
transactions past their timeout and expires idle transactional ids.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Iterator
from pathlib import Path

from ..log import LogAppendError, LogWriteError
from ..protocol import ApiKey, RequestHeader, make, request_module
from ..records import build_batch, split_batches
from ..txn.coordinator import Effect, Pause, SendMarkers, TransactionCoordinator, WriteTxnLog
from ..txn.log_format import (
    TxnLogFormatError,
    decode_key,
    decode_value,
    encode_key,
    encode_value,
)
from ..txn.state import TransactionMetadata
from .clock import now_ms
from .replication import ReplicationError
from .topics import TRANSACTION_STATE, coordinator_partition

log = logging.getLogger("oncelog.txn")

EPOCH_FILE = "txn-coordinator-epoch"
MARKER_RETRY_S = 0.1
LOG_WRITE_TIMEOUT_MS = 30_000
# Marker errors after which retrying cannot help, and the partition is done: the topic is
# gone, or a newer producer epoch or coordinator already ended the transaction there.
_FINAL_MARKER_ERRORS = {"unknown_topic_or_partition", "invalid_producer_epoch",
                        "transaction_coordinator_fenced"}


class TxnService:
    def __init__(self, broker) -> None:
        self.broker = broker
        cfg = broker.config
        self.num_partitions = cfg.int("transaction.state.log.num.partitions")
        # A single node coordinates every transactional id, with an epoch of its own bumped at
        # every start. In cluster mode each __transaction_state partition this broker leads has
        # a coordinator of its own (``cores``), whose epoch is the partition's leader epoch.
        self.core = self._new_core(0 if broker.cluster is not None else
                                   self._bump_coordinator_epoch(Path(broker.data_dir)))
        self.cores: dict[int, TransactionCoordinator] = {}
        # KIP-915/KIP-890: flexible records (with the previous/next producer ids) from
        # transaction.version 1 on; Kafka's original version 0 below.
        self.log_value_version = 1 if cfg.int("transaction.version") >= 1 else 0
        self.abort_interval_ms = cfg.int(
            "transaction.abort.timed.out.transaction.cleanup.interval.ms")
        self.expire_interval_ms = cfg.int(
            "transaction.remove.expired.transaction.cleanup.interval.ms")
        self._tasks: set[asyncio.Task] = set()
        self._core_tasks: dict[int, set[asyncio.Task]] = {}
        self._timer: asyncio.Task | None = None
        self._recovery: list[Effect] = []

    def _new_core(self, coordinator_epoch: int) -> TransactionCoordinator:
        cfg = self.broker.config
        return TransactionCoordinator(
            allocate_producer_id=self.broker.producer_ids.next_producer_id,
            max_timeout_ms=cfg.int("transaction.max.timeout.ms"),
            expiration_ms=cfg.int("transactional.id.expiration.ms"),
            coordinator_epoch=coordinator_epoch,
            two_phase_commit_enabled=cfg.flag("transaction.two.phase.commit.enable"))

    def core_for(self, transactional_id: str) -> tuple[TransactionCoordinator | None,
                                                       str | None]:
        """The coordinator of this transactional id here, or the error to answer with
        (cluster mode: NOT_COORDINATOR unless this broker leads its partition)."""
        if self.broker.cluster is None:
            return self.core, None
        n = self.broker.cluster.internal_partition_count(TRANSACTION_STATE)
        core = self.cores.get(coordinator_partition(transactional_id, n)) if n else None
        return (core, None) if core is not None else (None, "not_coordinator")

    def all_cores(self) -> list[TransactionCoordinator]:
        return list(self.cores.values()) if self.broker.cluster is not None else [self.core]

    def on_leadership(self, topic: str, index: int, is_leader: bool, epoch: int) -> None:
        """Cluster mode: a broker that becomes leader of a __transaction_state partition
        becomes the coordinator of its transactional ids: it replays the partition and rolls
        forward what the previous coordinator left prepared (spec 000, "Transaction
        Coordinator Startup"); one that stops leading it stops coordinating them."""
        if topic != TRANSACTION_STATE:
            return
        old = self.cores.pop(index, None)
        if old is not None:
            for task in self._core_tasks.pop(id(old), set()):
                task.cancel()
        if not is_leader:
            return
        partition = self.broker.topics.partition(TRANSACTION_STATE, index)
        if partition is None:
            return
        core = self._new_core(epoch)
        recovery = core.load(self._partition_records(partition))
        self.cores[index] = core
        log.info("transaction coordinator for %s-%d at epoch %d: %d transactional ids (%d to "
                 "roll forward)", TRANSACTION_STATE, index, epoch, len(core.transactions),
                 len(recovery))
        self._spawn(recovery, core)

    @staticmethod
    def _bump_coordinator_epoch(data_dir: Path) -> int:
        path = data_dir / EPOCH_FILE
        try:
            epoch = int(path.read_text().strip()) + 1
        except (FileNotFoundError, ValueError):
            epoch = 0
        tmp = path.with_suffix(".tmp")
        tmp.write_text(str(epoch))
        os.replace(tmp, path)
        return epoch

    # -- startup ------------------------------------------------------------------------------

    def _records(self) -> Iterator[tuple[str, TransactionMetadata | None]]:
        topic = self.broker.topics.get(TRANSACTION_STATE)
        if topic is None:
            return
        for p in topic.partitions:
            yield from self._partition_records(p)

    @staticmethod
    def _partition_records(p) -> Iterator[tuple[str, TransactionMetadata | None]]:
        for h, records in p.log.iter_records():
            if h.is_control:
                continue
            for r in records:
                try:
                    txn_id = decode_key(r.key or b"")
                    yield txn_id, (None if r.value is None else decode_value(txn_id, r.value))
                except TxnLogFormatError as exc:
                    log.error("skipping a bad record at %s-%d offset %d: %s",
                              TRANSACTION_STATE, p.index, r.offset, exc)

    def load(self) -> None:
        """Replay the transaction log (before the broker takes requests); what it left
        unfinished is resumed once ``start`` runs on the event loop."""
        self._recovery = self.core.load(self._records())
        log.info("transaction coordinator epoch %d loaded %d transactional ids (%d to roll "
                 "forward)", self.core.coordinator_epoch, len(self.core.transactions),
                 len(self._recovery))

    def start(self) -> None:
        self._spawn(self._recovery)
        self._recovery = []
        self._timer = asyncio.get_running_loop().create_task(self._timers())

    async def _timers(self) -> None:
        last_expire = now_ms()
        while True:
            await asyncio.sleep(self.abort_interval_ms / 1000)
            now = now_ms()
            expire = now - last_expire >= self.expire_interval_ms
            if expire:
                last_expire = now
            for core in self.all_cores():
                self._spawn(core.abort_timed_out(now), core)
                if expire:
                    self._spawn(core.expire(now), core)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        for t in self._tasks:
            t.cancel()

    # -- carrying effects out -----------------------------------------------------------------

    async def execute(self, effects: list[Effect],
                      core: TransactionCoordinator | None = None) -> bool:
        """Carry out a request's effects: its log write now (False if it failed: the change
        is dropped and the client should retry), what follows in the background.

        The work runs in a task of its own, shielded from the request: a client that
        disconnects cancels its request, and a transaction log write cancelled while it waits
        for the ISR would leave its transaction's pending transition set for ever (every later
        request answered CONCURRENT_TRANSACTIONS, the transaction never timed out: a hanging
        transaction). The write finishes and ``write_done`` runs whatever the client does."""
        core = core or self.core
        task = asyncio.get_running_loop().create_task(self._execute(effects, core))
        self._track(task, core)  # cancelled only with its coordinator (leadership lost)
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.cancelled():  # the coordinator went away: nothing was decided
                return False
            raise

    async def _execute(self, effects: list[Effect], core: TransactionCoordinator) -> bool:
        ok = True
        for e in effects:
            if isinstance(e, WriteTxnLog):
                ok = await self._append(e)
                self._spawn(core.write_done(e.transactional_id, ok), core)
                if not ok:
                    return False
            else:
                self._spawn([e], core)
        return ok

    def _spawn(self, effects: list[Effect], core: TransactionCoordinator | None = None) -> None:
        if not effects:
            return
        core = core or self.core
        self._track(asyncio.get_running_loop().create_task(self._drive(effects, core)), core)

    def _track(self, task: asyncio.Task, core: TransactionCoordinator) -> None:
        self._tasks.add(task)
        mine = self._core_tasks.setdefault(id(core), set())
        mine.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(mine.discard)

    async def _drive(self, effects: list[Effect], core: TransactionCoordinator) -> None:
        queue = list(effects)
        while queue:
            e = queue.pop(0)
            if isinstance(e, WriteTxnLog):
                ok = await self._append(e)
                queue.extend(core.write_done(e.transactional_id, ok))
            elif isinstance(e, Pause):
                await asyncio.sleep(e.ms / 1000)
            else:
                await self._send_markers(e)
                queue.extend(core.markers_done(e.transactional_id, now_ms()))

    async def _append(self, e: WriteTxnLog) -> bool:
        """The record on the transactional id's partition of the transaction log; in cluster
        mode on the partition's whole ISR (at least transaction.state.log.min.isr)."""
        now = now_ms()
        value = None if e.metadata is None else encode_value(e.metadata, self.log_value_version)
        data = bytearray(build_batch([(encode_key(e.transactional_id), value, (), now)]))
        replication = self.broker.replication
        if replication is None:
            topic = self.broker.topics.ensure_internal(TRANSACTION_STATE, now)
            index = coordinator_partition(e.transactional_id, topic.partition_count)
            try:
                topic.partitions[index].log.append(data, split_batches(data), now)
            except (LogAppendError, LogWriteError) as exc:
                log.error("transaction log write for %r failed: %s", e.transactional_id, exc)
                return False
            return True
        topic = self.broker.topics.get(TRANSACTION_STATE)
        if topic is None:
            return False
        index = coordinator_partition(e.transactional_id, topic.partition_count)
        try:
            r = replication.leader_replica(TRANSACTION_STATE, index)
            replication.check_enough_replicas(r)
            result = r.log.append(data, split_batches(data), now, leader_epoch=r.leader_epoch)
        except (ReplicationError, LogAppendError, LogWriteError) as exc:
            log.warning("transaction log write for %r failed: %s", e.transactional_id, exc)
            return False
        replication.appended(r)
        err = await replication.wait_replicated(r, result.last_offset + 1, LOG_WRITE_TIMEOUT_MS)
        if err is not None:
            log.warning("transaction log write for %r not replicated: %s", e.transactional_id,
                        err)
            return False
        return True

    async def _send_markers(self, e: SendMarkers) -> None:
        """spec 000 step 5.2: WriteTxnMarkers to each partition's leader (in process when that
        is this broker: always so on a single node), retried until every partition has its
        marker; a partition without a leader is waited for (spec 000, "Discussion on
        Unavailable Partitions"), one whose topic is gone needs none."""
        from .broker import RequestContext  # the broker imports this module
        from .handlers.txn_markers import handle_write_txn_markers

        cluster = self.broker.cluster
        mod = request_module(ApiKey.WRITE_TXN_MARKERS, 1)
        ctx = RequestContext(RequestHeader(ApiKey.WRITE_TXN_MARKERS, 1, 0, "txn-coordinator", 0),
                             "txn-coordinator")

        async def send(node: int, tps: list[tuple[str, int]]):
            by_topic: dict[str, list[int]] = {}
            for t, p in sorted(tps):
                by_topic.setdefault(t, []).append(p)
            request = make(mod.WriteTxnMarkersRequest, markers=(make(
                mod.WritableTxnMarker, producer_id=e.producer_id,
                producer_epoch=e.producer_epoch, transaction_result=e.commit,
                coordinator_epoch=e.coordinator_epoch,
                topics=tuple(make(mod.WritableTxnMarkerTopic, name=t,
                                  partition_indexes=tuple(ps))
                             for t, ps in by_topic.items())),))
            try:
                if node == self.broker.node_id:
                    return await handle_write_txn_markers(self.broker, ctx, request)
                return await self.broker.replication.client.request(node, request, 30.0,
                                                                    purpose="markers")
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
                if cluster is None:
                    leader: int | None = self.broker.node_id
                elif cluster.view is not None and tp[0] not in cluster.view.topics:
                    left.discard(tp)  # deleted: nothing to mark
                    continue
                else:
                    leader = cluster.leader_of(*tp)
                if leader is not None:
                    by_node.setdefault(leader, []).append(tp)
            responses = await asyncio.gather(*(send(n, tps) for n, tps in by_node.items()))
            for response in responses:
                if response is None:
                    continue
                for t in response.markers[0].topics:
                    for p in t.partitions:
                        name = p.error_code.name if p.error_code else None
                        if name is None or name in _FINAL_MARKER_ERRORS:
                            if name is not None:
                                log.warning("marker for %r on %s-%d: %s (not retried)",
                                            e.transactional_id, t.name, p.partition_index, name)
                            left.discard((t.name, p.partition_index))
                        else:
                            log.debug("marker for %r on %s-%d: %s (again)", e.transactional_id,
                                      t.name, p.partition_index, name)
            if left:
                log.debug("markers for %r: waiting for %s", e.transactional_id, sorted(left))
                await asyncio.sleep(MARKER_RETRY_S)

    # -- metrics ------------------------------------------------------------------------------

    def metric_samples(self):
        from .metrics import Sample

        yield Sample("oncelog_active_transactional_ids",
                     "transactional ids the transaction coordinator holds",
                     sum(len(c.transactions) for c in self.all_cores()))
        # KIP-939: kafka.server:type=transaction-coordinator-metrics,
        # name=active-transaction-open-time-max
        yield Sample("oncelog_active_transaction_open_time_max_ms",
                     "how long the oldest open transaction has been open (ms)",
                     max((c.longest_open_ms(now_ms()) for c in self.all_cores()), default=0))
