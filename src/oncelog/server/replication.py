"""The replica manager (Kafka's ReplicaManager): the partitions this broker hosts, their
leadership, the one append path and the leader's reads.

``ReplicaManager`` follows the cluster view (server/metadata.py: the data directory on a single
node, which is a cluster of one; ZooKeeper's watches in a cluster) on the broker's event loop.
For every partition whose replicas include this broker it keeps a ``Partition``
(server/partition.py: its ISR, high watermark, leader epoch and the requests waiting on them)
and tells it the role the view gives it; the partitions it follows are fetched by the replica
fetchers (server/replica_fetcher.py). Leadership changes arrive as new views; a partition that
stops being leader fails its waiting acks=all requests with NOT_LEADER_OR_FOLLOWER.
``listeners`` hear of leadership gained and lost (the coordinators follow their partitions).

``append_records`` is Kafka's ``ReplicaManager.appendRecords``, the one append entry, by data:
records per partition (``AppendEntry``) and who appends them (``AppendOrigin``: produce's CLIENT
records, the coordinators' COORDINATOR records, the transaction markers' MARKER control
batches, built by the caller). It appends on the leader (the partition's leader epoch stamped
into the batches; min.insync.replicas checked first for acks=all, except for markers), moves
the high watermark, and with ``required_acks=-1`` completes when the ISR has the records -- at
once when the ISR is the leader alone. What follows from an append (pending transactional
offsets made visible by a marker) is the caller's, once it completed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from kio.schema.errors import ErrorCode

from ..log import AppendResult, LogAppendError, LogWriteError
from ..log.append_origin import AppendOrigin
from ..log.producer_state import VerificationGuard
from ..records import BatchHeader, CorruptRecordError, split_batches
from ..security.tls import inter_broker_ssl_context
from .clock import now_ms
from .interbroker import InterBrokerClient
from .interbroker_sasl import inter_broker_login
from .partition import Partition, ReplicationError, broker_ids
from .replica_fetcher import ReplicaFetcherManager
from .topics import INTERNAL_TOPICS

if TYPE_CHECKING:
    from ..cluster.model import LeaderAndIsr
    from .config import BrokerConfig
    from .topics import TopicManager

log = logging.getLogger("oncelog.replication")


TP = tuple[str, int]


class AppendError(Exception):
    """An append refused or failed; ``error_name`` is the Kafka error code (ErrorCode)."""

    def __init__(self, error_name: ErrorCode, message: str,
                 record_errors: tuple[tuple[int, str], ...] = ()) -> None:
        super().__init__(message)
        self.error_name = error_name
        self.record_errors = record_errors  # (batch index, message): KIP-467


@dataclass(slots=True)  # (not frozen: a frozen dataclass costs more to make, one per partition)
class AppendEntry:
    """One partition's share of an ``append_records``: its record set (one or more batches;
    a bytearray is rewritten in place) and the options its origin needs. Data, no callable."""

    records: bytes | bytearray | memoryview
    # split_batches(records), when the caller split them already (Produce validates them)
    batches: list[tuple[int, BatchHeader]] | None = None
    # KIP-890 (CLIENT, COORDINATOR): the guard of a successful check with the transaction
    # coordinator, and whether a batch opening a transaction needs one
    verification: VerificationGuard | None = None
    require_verification: bool = False
    new_client: bool = False  # Produce v12+ (transaction version 2)
    checked: dict[int, tuple[int, int]] | None = None  # check_compressed's findings (CLIENT)
    transaction_version: int = 0  # MARKER: the marker's WriteTxnMarkers v2 field


class IsrWriter(Protocol):
    """Where a leader's ISR changes go (Kafka's AlterPartitionManager): the metadata."""

    async def alter_partition(self, topic: str, index: int, state: LeaderAndIsr,
                              expected_version: int) -> int | None: ...


class ReplicaManager:
    """Built by the broker (server/broker.py) from what it uses: this node's id, the broker
    settings, the logs hosted here (``topics``, Kafka's LogManager) and where ISR changes go;
    the cluster view comes to ``apply`` (the metadata's view listener)."""

    def __init__(self, node_id: int, config: BrokerConfig, topics: TopicManager,
                 isr_writer: IsrWriter) -> None:
        self.node_id = node_id
        self.config = config
        self.topics = topics
        self.isr_writer = isr_writer
        cfg = config
        self.lag_ms = cfg.int("replica.lag.time.max.ms")
        self.view: Any = None  # the latest cluster view
        self.replicas: dict[TP, Partition] = {}
        # security.inter.broker.protocol (default the listener's): TLS between brokers too
        ssl_context = inter_broker_ssl_context(cfg)
        # SASL_PLAINTEXT/SASL_SSL between brokers: every connection logs in first
        login = inter_broker_login(cfg)
        self.client = InterBrokerClient(self.node_id, self._address_of, ssl_context, login)
        self.fetchers = ReplicaFetcherManager(
            self.node_id, self.replicas, address_of=self._address_of, client=self.client,
            ssl_context=ssl_context, login=login,
            fetch_wait_ms=cfg.int("replica.fetch.wait.max.ms"),
            fetch_max_bytes=cfg.int("replica.fetch.max.bytes"))
        self._tasks: set[asyncio.Task] = set()
        self._isr_task: asyncio.Task | None = None
        # (topic, index, is_leader, leader_epoch) on every change of role.
        self.listeners: list[Callable[[str, int, bool, int], None]] = []
        # For the summary line of the internal topics' partitions taken up in one view: what
        # their coordinator loaded ("3 groups"), by topic.
        self.load_details: dict[str, Callable[[], str]] = {}
        self._taken_up: dict[str, int] = {}
        self._internal_s = 0.0  # the time those took (their logs opened, coordinators loaded)

    # -- the cluster view ---------------------------------------------------------------------

    def _address_of(self, node_id: int) -> tuple[str, int] | None:
        b = self.view.brokers.get(node_id) if self.view is not None else None
        return None if b is None else (b.host, b.port)

    def start(self) -> None:
        self._isr_task = asyncio.get_running_loop().create_task(self._shrink_isr_forever())

    def close(self) -> None:
        if self._isr_task is not None:
            self._isr_task.cancel()
        for t in list(self._tasks):
            t.cancel()
        self.fetchers.close()
        for r in self.replicas.values():
            r.fail_waiters(ErrorCode.not_leader_or_follower)
        self.client.close()

    def apply(self, view) -> None:
        """A new cluster view: host what is assigned here, take up the roles it says. The
        internal topics' partitions taken up in one view (each start: 50 + 50 by default) are
        logged in one line, not one each (Kafka's per-partition lines are DEBUG here), with
        the time spent on them: their logs opened, their coordinators loaded."""
        self._taken_up = {}
        self._internal_s = 0.0
        self._apply(view)
        if self._taken_up:
            parts = []
            for i, (topic, n) in enumerate(sorted(self._taken_up.items())):
                describe = self.load_details.get(topic)
                detail = f" ({describe()})" if describe is not None else ""
                parts.append(f"{n} partition{'s' if n != 1 else ''} of {topic}{detail}"
                             if i == 0 else f"{n} of {topic}{detail}")
            log.info("loaded %s in %.2f s", " and ".join(parts), self._internal_s)

    def _apply(self, view) -> None:
        self.view = view
        now = now_ms()
        topics = self.topics
        wanted: set[TP] = set()
        for name, t in view.topics.items():
            hosted = {p for p, reps in t.partitions.items() if self.node_id in reps}
            if not hosted and topics.get(name) is None:
                continue
            started = time.monotonic()
            local = topics.host(name, t.topic_id, len(t.partitions), dict(t.configs), hosted,
                                now)
            if name in INTERNAL_TOPICS:
                self._internal_s += time.monotonic() - started
            for p in local.partitions:
                wanted.add((name, p.index))
        for name in [n for n in topics.topics if n not in view.topics]:
            for p in topics.topics[name].partitions:
                self._drop((name, p.index))
            topics.delete(name, force=True)
        for tp in [tp for tp in self.replicas if tp not in wanted]:
            self._drop(tp)
        for tp in sorted(wanted):
            partition = topics.partition(*tp)
            if partition is None:
                continue
            reps = tuple(view.topics[tp[0]].partitions[tp[1]])
            r = self.replicas.get(tp)
            if r is None or r.partition is not partition:
                r = self.replicas[tp] = Partition(partition, reps, self.node_id,
                                                  alter_partition=self._alter_partition,
                                                  spawn=self._spawn)
            r.replicas = reps
            found = view.states.get(tp)
            if found is None:
                continue  # the controller has not elected a leader yet
            state, version = found
            if state.leader == self.node_id:
                if not r.is_leader or r.leader_epoch != state.leader_epoch:
                    started = time.monotonic()
                    self._become_leader(r, state, version, now)
                    if tp[0] in INTERNAL_TOPICS:  # with its coordinator's load
                        self._internal_s += time.monotonic() - started
                else:
                    r.update_state(state, version)
            else:
                if r.is_leader or r.leader != state.leader \
                        or r.leader_epoch != state.leader_epoch:
                    started = time.monotonic()
                    self._become_follower(r, state, version)
                    if tp[0] in INTERNAL_TOPICS:
                        self._internal_s += time.monotonic() - started
                r.update_state(state, version)
        self.fetchers.sync()

    def _drop(self, tp: TP) -> None:
        r = self.replicas.pop(tp, None)
        if r is None:
            return
        was_leader = r.is_leader
        r.fail_waiters(ErrorCode.not_leader_or_follower)
        if was_leader:
            self._tell(r, False)

    async def _alter_partition(self, topic: str, index: int, state, expected: int
                               ) -> int | None:
        return await self.isr_writer.alter_partition(topic, index, state, expected)

    def _live(self):
        return self.view.brokers if self.view is not None else {}

    def _role_changed(self, r: Partition) -> int:
        """The level of a partition's leadership line: DEBUG for an internal topic's (counted
        for ``apply``'s summary line), INFO for the others."""
        topic = r.tp[0]
        if topic in INTERNAL_TOPICS:
            self._taken_up[topic] = self._taken_up.get(topic, 0) + 1
            return logging.DEBUG
        return logging.INFO

    def _become_leader(self, r: Partition, state, version: int, now: int) -> None:
        log.log(self._role_changed(r), "%s-%d: leader at epoch %d, ISR %s", *r.tp,
                state.leader_epoch, broker_ids(state.isr))
        r.make_leader(state, version, now)
        self._tell(r, True)

    def _become_follower(self, r: Partition, state, version: int) -> None:
        log.log(self._role_changed(r), "%s-%d: follower of %d at epoch %d", *r.tp,
                state.leader, state.leader_epoch)
        was_leader = r.is_leader
        r.make_follower(state)
        if was_leader:
            self._tell(r, False)

    def _tell(self, r: Partition, is_leader: bool) -> None:
        for listener in self.listeners:
            try:
                listener(r.partition.topic, r.partition.index, is_leader, r.leader_epoch)
            except Exception:
                log.exception("leadership listener failed for %s-%d", *r.tp)

    # -- the leader's side --------------------------------------------------------------------

    def leader_replica(self, topic: str, index: int, current_leader_epoch: int = -1
                       ) -> Partition:
        """The partition, if this broker leads it (at ``current_leader_epoch`` when the
        client says which epoch it knows); raises ReplicationError otherwise."""
        r = self.replicas.get((topic, index))
        if r is None:
            known = self.view is not None and topic in self.view.topics and \
                index in self.view.topics[topic].partitions
            if known:
                raise ReplicationError(ErrorCode.not_leader_or_follower,
                                       f"broker {self.node_id} is not a replica of "
                                       f"{topic}-{index}")
            raise ReplicationError(ErrorCode.unknown_topic_or_partition,
                                   f"{topic}-{index} does not exist")
        if not r.is_leader:
            raise ReplicationError(ErrorCode.not_leader_or_follower,
                                   f"broker {self.node_id} does not lead {topic}-{index} "
                                   f"(the leader is {r.leader})")
        if current_leader_epoch >= 0:
            if current_leader_epoch < r.leader_epoch:
                raise ReplicationError(ErrorCode.fenced_leader_epoch,
                                       f"leader epoch {current_leader_epoch} is old "
                                       f"({r.leader_epoch})")
            if current_leader_epoch > r.leader_epoch:
                raise ReplicationError(ErrorCode.unknown_leader_epoch,
                                       f"leader epoch {current_leader_epoch} is newer than "
                                       f"{r.leader_epoch}")
        return r

    def append_to_leader(self, tp: TP, entry: AppendEntry, *, origin: AppendOrigin,
                         required_acks: int, now: int | None = None) -> AppendResult:
        """The leader's half of ``append_records`` for one partition (Kafka's
        appendToLocalLog), in this turn of the event loop: this broker must lead it; for
        acks=all an append of any origin needs min.insync.replicas in the ISR (Kafka's
        Partition.appendRecordsToLeader: a marker refused NOT_ENOUGH_REPLICAS is sent again by
        its coordinator); the log appends at the leader epoch and the high watermark moves.
        Raises AppendError. (The coordinator runtime appends here, then waits for the ISR
        with ``replicated``.)"""
        return self._append_to_leader(tp, entry, origin, required_acks,
                                      now_ms() if now is None else now)[1]

    def _append_to_leader(self, tp: TP, entry: AppendEntry, origin: AppendOrigin,
                          required_acks: int, now: int) -> tuple[Partition, AppendResult]:
        """``append_to_leader``, which returns the partition too (``append_records`` waits
        on it)."""
        r = self.replicas.get(tp)
        try:
            if r is None or not r.is_leader:
                r = self.leader_replica(*tp)
            if required_acks == -1:
                r.check_enough_replicas()
        except ReplicationError as exc:
            raise AppendError(exc.error_name, str(exc)) from None
        records = entry.records  # a Produce request's record set: a view of its frame
        batches = entry.batches
        try:
            if batches is None:
                batches = split_batches(records)
            result = r.log.append(records, batches, now, origin=origin,
                                  verification=entry.verification,
                                  require_verification=entry.require_verification,
                                  new_client=entry.new_client, leader_epoch=r.leader_epoch,
                                  checked=entry.checked,
                                  transaction_version=entry.transaction_version)
        except CorruptRecordError as exc:
            raise AppendError(exc.error_name, str(exc)) from None
        except LogAppendError as exc:
            raise AppendError(exc.error_name, str(exc), exc.record_errors) from None
        except LogWriteError as exc:
            log.error("append to %s-%d failed: %s", *tp, exc)
            raise AppendError(ErrorCode.kafka_storage_error,
                              f"the log could not be written: {exc}") from None
        if not result.duplicate:
            r.appended()
        return r, result

    async def append_records(self, entries: dict[TP, AppendEntry], *, origin: AppendOrigin,
                             required_acks: int, timeout_ms: int
                             ) -> dict[TP, AppendResult | AppendError]:
        """Kafka's appendRecords, the one append path of produce (CLIENT), the coordinators
        (COORDINATOR) and the transaction markers (MARKER): every partition's append on the
        leader first (``append_to_leader``, in one turn of the event loop, nothing awaited in
        between), then, for acks=all, the wait until the ISR has each (the high watermark
        passed it) or ``timeout_ms`` ran out. Per partition: its AppendResult, or the
        AppendError that stopped it."""
        out: dict[TP, AppendResult | AppendError] = {}
        waits: dict[TP, tuple[Partition, asyncio.Future]] = {}
        errors: dict[TP, ErrorCode | None] = {}
        now = now_ms()
        for tp, entry in entries.items():
            try:
                r, result = self._append_to_leader(tp, entry, origin, required_acks, now)
            except AppendError as exc:
                out[tp] = exc
                continue
            out[tp] = result
            if required_acks == -1:
                end = result.last_offset + 1
                if r.log.high_watermark < end:
                    waits[tp] = (r, r.add_waiter(end))
                else:  # replicated already (an ISR of one): nothing to wait for
                    errors[tp] = r.isr_error()
        if waits:
            errors.update(await self._until_replicated(waits, timeout_ms))
        for tp, err in errors.items():
            if err is not None:
                out[tp] = AppendError(err, f"not replicated to the in-sync replicas: {err.name}")
        return out

    async def replicated(self, tp: TP, end_offset: int, timeout_ms: int) -> ErrorCode | None:
        """acks=all after ``append_to_leader``: wait until the partition's ISR has everything
        below ``end_offset``; None, or the error to answer with."""
        try:
            r = self.leader_replica(*tp)
        except ReplicationError as exc:
            return exc.error_name
        return await r.wait_replicated(end_offset, timeout_ms)

    def appended(self, r: Partition) -> None:
        """The leader appended to ``r`` (Partition.appended)."""
        r.appended()

    async def wait_replicated(self, r: Partition, end_offset: int, timeout_ms: int
                              ) -> ErrorCode | None:
        """acks=all: wait until ``r``'s high watermark reaches ``end_offset``."""
        return await r.wait_replicated(end_offset, timeout_ms)

    async def _until_replicated(self, waits: dict[TP, tuple[Partition, asyncio.Future]],
                                timeout_ms: int) -> dict[TP, ErrorCode | None]:
        """The answer for each waiter of ``append_records`` once the high watermark passed its
        batch (``_maybe_advance_hw`` completes it) or ``timeout_ms`` ran out: one timer for
        the request, no task per partition."""
        loop = asyncio.get_running_loop()

        def expire() -> None:
            for _r, fut in waits.values():
                if not fut.done():
                    fut.set_result(ErrorCode.request_timed_out)

        timer = loop.call_later(max(timeout_ms, 0) / 1000, expire)
        out: dict[TP, ErrorCode | None] = {}
        try:
            for tp, (r, fut) in waits.items():
                err = await fut
                out[tp] = r.isr_error() if err is None else err
        finally:
            timer.cancel()
            for r, fut in waits.values():
                if not fut.done() or fut.result() == ErrorCode.request_timed_out:
                    fut.cancel()  # (our caller was cancelled)
                    r.remove_waiter(fut)
        return out

    def follower_fetched(self, r: Partition, replica_id: int, fetch_offset: int,
                         log_start_offset: int = -1) -> None:
        """A follower's fetch (Partition.update_follower_fetch_state)."""
        r.update_follower_fetch_state(replica_id, fetch_offset, log_start_offset, self._live())

    # -- DeleteRecords (KIP-107) ---------------------------------------------------------------

    def low_watermark(self, r: Partition) -> int:
        return r.low_watermark(self._live())

    async def delete_records(self, topic: str, index: int, offset: int, timeout_ms: int
                             ) -> int:
        """Move the leader's log start offset to ``offset`` (-1: the high watermark; Kafka's
        deleteRecordsOnLeader) and wait until every live replica has followed (the low
        watermark, which is answered). ReplicationError: not the leader,
        OFFSET_OUT_OF_RANGE past the high watermark, POLICY_VIOLATION for a compacted-only
        topic, REQUEST_TIMED_OUT."""
        r = self.leader_replica(topic, index)
        plog = r.log
        topic_meta = self.topics.get(topic)
        policy = str((topic_meta.configs if topic_meta else {}).get("cleanup.policy")
                     or self.config.topic_defaults().get("cleanup.policy", "delete"))
        if "delete" not in policy.split(","):
            raise ReplicationError(ErrorCode.policy_violation, f"records of {topic}-{index} can not be "
                                   "deleted due to the configured policy")
        target = plog.high_watermark if offset == -1 else offset
        if target < 0 or target > plog.high_watermark:
            raise ReplicationError(ErrorCode.offset_out_of_range, f"offset {target} is not in "
                                   f"[0, high watermark {plog.high_watermark}]")
        if plog.increment_log_start_offset(target, now_ms()):
            log.info("%s-%d: log start offset %d (DeleteRecords)", topic, index, target)
            r.partition.notify_append()  # long polls answer the new log start sooner
        if self.low_watermark(r) < target:
            err = await r.wait_log_start(target, timeout_ms)
            if err is not None:
                raise ReplicationError(err, f"{topic}-{index}: replicas did not delete up to "
                                       f"offset {target}")
        return self.low_watermark(r)

    async def _shrink_isr_forever(self) -> None:
        while True:
            await asyncio.sleep(max(self.lag_ms / 2, 50) / 1000)
            now = now_ms()
            for r in list(self.replicas.values()):
                r.maybe_shrink_isr(now, self.lag_ms)

    def _spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- OffsetForLeaderEpoch (the leader answers followers) ----------------------------------

    def end_offset_for_epoch(self, topic: str, index: int, current_leader_epoch: int,
                             epoch: int) -> tuple[int, int]:
        r = self.leader_replica(topic, index, current_leader_epoch)
        return r.log.end_offset_for_epoch(epoch)
