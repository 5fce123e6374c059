"""The replica manager: Kafka's ISR protocol for the partitions this broker hosts, and the one
append path.

``ReplicaManager`` follows the cluster view (server/metadata.py: the data directory on a single
node, which is a cluster of one; ZooKeeper's watches in a cluster) on the broker's event loop. For every partition whose replicas include this broker it keeps a
``Replica``: its role (leader or follower) at the partition's leader epoch, and

- as leader: each follower's log end offset (from its fetches), when it last caught up, the
  high watermark (the smallest log end offset of the ISR), the acks=all produce requests waiting
  for it, ISR shrink (a follower not caught up for ``replica.lag.time.max.ms``) and expansion (a
  follower that reached the high watermark), written through the metadata (the partition's
  state znode in ZooKeeper) on the condition of its version;
- as follower: a fetcher per leader broker that first truncates the log where it diverges from
  the leader's (OffsetForLeaderEpoch), then fetches from its log end offset, appends the leader's
  batches unchanged (log/log.py rebuilds producer state, transactions and the aborted-transaction
  index from them) and takes min(leader's high watermark, its own log end) as high watermark.

Leadership changes arrive as new views; a replica that stops being leader fails its waiting
acks=all requests with NOT_LEADER_OR_FOLLOWER. ``listeners`` hear of leadership gained and lost
(the coordinators follow their partitions).

``append_records`` is Kafka's ``ReplicaManager.appendRecords``: produce, the transaction markers,
the transaction log and the offsets topic all append through it. It appends on the leader (the
partition's leader epoch stamped into the batches), moves the high watermark, and with
``required_acks=-1`` completes when the ISR has the records -- at once when the ISR is the
leader alone.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kio.schema.errors import ErrorCode

from ..log import LogAppendError, LogWriteError
from ..protocol import ApiKey, ProtocolError, make, request_module
from ..security.tls import inter_broker_ssl_context
from . import replica_fetcher
from .clock import now_ms
from .interbroker import ChannelError, InterBrokerClient
from .interbroker_sasl import inter_broker_login
from .topics import INTERNAL_TOPICS, Partition

log = logging.getLogger("oncelog.replication")


def broker_ids(ids) -> str:
    """A list of broker ids as Kafka's logs print one: ``[1,2,3]`` (not a Python tuple)."""
    return "[" + ",".join(str(i) for i in ids) + "]"

EPOCH_VERSION = 4
BACKOFF_S = 0.2
TP = tuple[str, int]


@dataclass
class FollowerProgress:
    """The leader's view of one follower (Kafka's Replica state)."""

    leo: int = -1  # unknown until its first fetch at this leader epoch
    last_fetch_ms: int = 0
    leader_leo_at_last_fetch: int = 0
    last_caught_up_ms: int = 0
    log_start_offset: int = -1  # as its last fetch said (DeleteRecords' low watermark)


@dataclass
class Replica:
    partition: Partition
    replicas: tuple[int, ...]
    leader: int = -1
    leader_epoch: int = -1
    isr: tuple[int, ...] = ()
    controller_epoch: int = 0
    zk_version: int = -1
    is_leader: bool = False
    followers: dict[int, FollowerProgress] = field(default_factory=dict)
    waiters: list[tuple[int, asyncio.Future]] = field(default_factory=list)
    # DeleteRecords waiting for every live replica's log start to reach an offset.
    start_waiters: list[tuple[int, asyncio.Future]] = field(default_factory=list)
    needs_truncation: bool = False  # follower: ask the leader where our logs diverge first
    isr_change_in_flight: bool = False
    # The ISR being written to ZooKeeper. Until the write is confirmed the high watermark
    # counts its members too (Kafka's "maximal ISR"): once written, the controller may elect
    # a replica just added, which must then hold everything acknowledged.
    pending_isr: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        self.log = self.partition.log  # a partition keeps its log; read on every append

    @property
    def tp(self) -> TP:
        return (self.partition.topic, self.partition.index)


class ReplicationError(Exception):
    def __init__(self, error_name: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.error_name = error_name


class AppendError(Exception):
    """An append refused or failed; ``error_name`` is the Kafka error code (ErrorCode)."""

    def __init__(self, error_name: ErrorCode, message: str,
                 record_errors: tuple[tuple[int, str], ...] = ()) -> None:
        super().__init__(message)
        self.error_name = error_name
        self.record_errors = record_errors  # (batch index, message): KIP-467


# What an append writes, given the partition's log and the leader epoch to stamp: a
# PartitionLog.append or append_marker call (their AppendResult).
Write = Callable[[Any, int], Any]


class ReplicaManager:
    def __init__(self, broker) -> None:
        self.broker = broker
        self.node_id: int = broker.node_id
        cfg = broker.config
        self.lag_ms = cfg.int("replica.lag.time.max.ms")
        self.fetch_wait_ms = cfg.int("replica.fetch.wait.max.ms")
        self.fetch_max_bytes = cfg.int("replica.fetch.max.bytes")
        self.view: Any = None  # the latest cluster view
        self.replicas: dict[TP, Replica] = {}
        # security.inter.broker.protocol (default the listener's): TLS between brokers too
        self.ssl_context = inter_broker_ssl_context(cfg)
        # SASL_PLAINTEXT/SASL_SSL between brokers: every connection logs in first
        self.login = inter_broker_login(cfg)
        self.client = InterBrokerClient(self.node_id, self._address_of, self.ssl_context,
                                        self.login)
        self._fetchers: dict[int, asyncio.Task] = {}
        # leader -> the fetcher's connection to it and the address it was opened to
        self._fetch_connections: dict[int, tuple[replica_fetcher.FetcherConnection,
                                                 tuple[str, int]]] = {}
        self._correlation_id = 0
        self._wake_fetchers: dict[int, asyncio.Event] = {}
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
        for t in list(self._fetchers.values()) + list(self._tasks):
            t.cancel()
        for r in self.replicas.values():
            self._fail_waiters(r, ErrorCode.not_leader_or_follower)
        for leader in list(self._fetch_connections):
            self._close_fetch_connection(leader)
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
        topics = self.broker.topics
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
                r = self.replicas[tp] = Replica(partition, reps)
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
                    r.isr, r.zk_version = tuple(state.isr), version
                    r.controller_epoch = state.controller_epoch
                    self._maybe_advance_hw(r)
            else:
                if r.is_leader or r.leader != state.leader \
                        or r.leader_epoch != state.leader_epoch:
                    started = time.monotonic()
                    self._become_follower(r, state, version)
                    if tp[0] in INTERNAL_TOPICS:
                        self._internal_s += time.monotonic() - started
                r.isr, r.zk_version = tuple(state.isr), version
                r.controller_epoch = state.controller_epoch
        self._sync_fetchers()

    def _drop(self, tp: TP) -> None:
        r = self.replicas.pop(tp, None)
        if r is None:
            return
        was_leader = r.is_leader
        self._fail_waiters(r, ErrorCode.not_leader_or_follower)
        if was_leader:
            self._tell(r, False)

    def _role_changed(self, r: Replica) -> int:
        """The level of a partition's leadership line: DEBUG for an internal topic's (counted
        for ``apply``'s summary line), INFO for the others."""
        topic = r.tp[0]
        if topic in INTERNAL_TOPICS:
            self._taken_up[topic] = self._taken_up.get(topic, 0) + 1
            return logging.DEBUG
        return logging.INFO

    def _become_leader(self, r: Replica, state, version: int, now: int) -> None:
        log.log(self._role_changed(r), "%s-%d: leader at epoch %d, ISR %s", *r.tp,
                state.leader_epoch, broker_ids(state.isr))
        r.is_leader = True
        r.leader, r.leader_epoch = state.leader, state.leader_epoch
        r.isr, r.zk_version, r.controller_epoch = tuple(state.isr), version, \
            state.controller_epoch
        r.needs_truncation = False
        r.followers = {f: FollowerProgress(last_caught_up_ms=now)
                       for f in r.replicas if f != self.node_id}
        # Kafka's makeLeader: the new epoch starts at our log end, so OffsetForLeaderEpoch
        # answers followers of the old epoch correctly before anything is appended.
        r.log.leader_epoch_cache.assign(state.leader_epoch, r.log.log_end_offset)
        self._maybe_advance_hw(r)
        self._tell(r, True)

    def _become_follower(self, r: Replica, state, version: int) -> None:
        log.log(self._role_changed(r), "%s-%d: follower of %d at epoch %d", *r.tp,
                state.leader, state.leader_epoch)
        was_leader = r.is_leader
        r.is_leader = False
        r.leader, r.leader_epoch = state.leader, state.leader_epoch
        r.followers = {}
        r.needs_truncation = True
        self._fail_waiters(r, ErrorCode.not_leader_or_follower)
        if was_leader:
            self._tell(r, False)

    def _tell(self, r: Replica, is_leader: bool) -> None:
        for listener in self.listeners:
            try:
                listener(r.partition.topic, r.partition.index, is_leader, r.leader_epoch)
            except Exception:
                log.exception("leadership listener failed for %s-%d", *r.tp)

    # -- the leader's side --------------------------------------------------------------------

    def leader_replica(self, topic: str, index: int, current_leader_epoch: int = -1
                       ) -> Replica:
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

    def check_enough_replicas(self, r: Replica) -> None:
        """acks=all: refuse before appending when the ISR is below min.insync.replicas."""
        need = r.log.config.min_insync_replicas
        if len(r.isr) < need:
            raise ReplicationError(ErrorCode.not_enough_replicas,
                                   f"{len(r.isr)} in-sync replicas of {r.partition.topic}-"
                                   f"{r.partition.index}, min.insync.replicas is {need}")

    def append_local(self, topic: str, index: int, write: Write, *, required_acks: int,
                     check_min_isr: bool = True) -> tuple[Replica, Any]:
        """Kafka's appendToLocalLog for one partition: this broker must lead it (and, for
        acks=all, have min.insync.replicas in the ISR unless ``check_min_isr`` is off: the
        transaction markers, which must land wherever the data did); ``write`` appends at
        the leader epoch. (replica, AppendResult); raises AppendError."""
        try:
            r = self.leader_replica(topic, index)
            if required_acks == -1 and check_min_isr:
                self.check_enough_replicas(r)
        except ReplicationError as exc:
            raise AppendError(exc.error_name, str(exc)) from None
        try:
            result = write(r.log, r.leader_epoch)
        except LogAppendError as exc:
            raise AppendError(exc.error_name, str(exc), exc.record_errors) from None
        except LogWriteError as exc:
            log.error("append to %s-%d failed: %s", topic, index, exc)
            raise AppendError(ErrorCode.kafka_storage_error,
                              f"the log could not be written: {exc}") from None
        if not getattr(result, "duplicate", False):
            self.appended(r)
        return r, result

    async def append_records(self, writes: dict[TP, Write], *, required_acks: int,
                             timeout_ms: int, check_min_isr: bool = True) -> dict[TP, Any]:
        """Kafka's appendRecords: every partition's write on the leader first (in one turn of
        the event loop, nothing awaited in between), then, for acks=all, the wait until the
        ISR has each (the high watermark passed it) or ``timeout_ms`` ran out. Per partition:
        its AppendResult, or the AppendError that stopped it."""
        out: dict[TP, Any] = {}
        waits: dict[TP, tuple[Replica, asyncio.Future]] = {}
        errors: dict[TP, ErrorCode | None] = {}
        for tp, write in writes.items():
            try:
                r, result = self.append_local(tp[0], tp[1], write,
                                              required_acks=required_acks,
                                              check_min_isr=check_min_isr)
            except AppendError as exc:
                out[tp] = exc
                continue
            out[tp] = result
            if required_acks == -1:
                end = result.last_offset + 1
                if r.log.high_watermark < end:
                    fut = asyncio.get_running_loop().create_future()
                    r.waiters.append((end, fut))
                    waits[tp] = (r, fut)
                else:  # replicated already (an ISR of one): nothing to wait for
                    errors[tp] = self._isr_error(r)
        if waits:
            errors.update(await self._until_replicated(waits, timeout_ms))
        for tp, err in errors.items():
            if err is not None:
                out[tp] = AppendError(err, f"not replicated to the in-sync replicas: {err.name}")
        return out

    async def append(self, topic: str, index: int, write: Write, *, required_acks: int = -1,
                     timeout_ms: int = 30_000) -> Any:
        """One partition's append_records: its AppendResult; raises AppendError."""
        result = (await self.append_records({(topic, index): write},
                                            required_acks=required_acks,
                                            timeout_ms=timeout_ms))[(topic, index)]
        if isinstance(result, AppendError):
            raise result
        return result

    def appended(self, r: Replica) -> None:
        """The leader appended: followers' long polls wake up (they read to the log end);
        consumers' when the high watermark moved: at once with a lone ISR, and always for a
        log of one replica, whose end is its high watermark."""
        if not self._maybe_advance_hw(r) and not r.log.replicated:
            r.partition.notify_high_watermark()
        r.partition.notify_log_end()

    async def wait_replicated(self, r: Replica, end_offset: int, timeout_ms: int
                              ) -> ErrorCode | None:
        """acks=all: wait until the high watermark reaches ``end_offset`` (the offset after
        the batch); None, or the error to answer with."""
        if r.log.high_watermark < end_offset:
            fut = asyncio.get_running_loop().create_future()
            r.waiters.append((end_offset, fut))
            try:
                err = await asyncio.wait_for(fut, max(timeout_ms, 0) / 1000)
            except TimeoutError:
                return ErrorCode.request_timed_out
            finally:
                r.waiters = [(o, f) for o, f in r.waiters if f is not fut]
            if err is not None:
                return err
        return self._isr_error(r)

    async def _until_replicated(self, waits: dict[TP, tuple[Replica, asyncio.Future]],
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
                out[tp] = self._isr_error(r) if err is None else err
        finally:
            timer.cancel()
            for r, fut in waits.values():
                if not fut.done() or fut.result() == ErrorCode.request_timed_out:
                    fut.cancel()  # (our caller was cancelled)
                    r.waiters = [(o, f) for o, f in r.waiters if f is not fut]
        return out

    def _isr_error(self, r: Replica) -> ErrorCode | None:
        """After an acks=all write reached the high watermark: the ISR may have shrunk below
        min.insync.replicas meanwhile (Kafka's NOT_ENOUGH_REPLICAS_AFTER_APPEND)."""
        if len(r.isr) < r.log.config.min_insync_replicas:
            return ErrorCode.not_enough_replicas_after_append
        return None

    def _fail_waiters(self, r: Replica, error: ErrorCode) -> None:
        for _offset, fut in r.waiters + r.start_waiters:
            if not fut.done():
                fut.set_result(error)
        r.waiters, r.start_waiters = [], []

    def _maybe_advance_hw(self, r: Replica) -> bool:
        """Move the high watermark to what every ISR member has; True if it moved (and
        long polls were woken)."""
        if not r.is_leader:
            return False
        plog = r.log
        new_hw = plog.log_end_offset
        for f in (*r.isr, *r.pending_isr) if r.pending_isr else r.isr:
            if f != self.node_id:
                progress = r.followers.get(f)
                new_hw = min(new_hw, progress.leo if progress is not None else -1)
        if new_hw <= plog.high_watermark:
            return False
        plog.update_high_watermark(new_hw)
        r.partition.notify_high_watermark()  # consumers long-polling for it
        if r.waiters:
            hw = plog.high_watermark
            still = []
            for offset, fut in r.waiters:
                if offset <= hw:
                    if not fut.done():
                        fut.set_result(None)
                else:
                    still.append((offset, fut))
            r.waiters = still
        return True

    def follower_fetched(self, r: Replica, replica_id: int, fetch_offset: int,
                         log_start_offset: int = -1) -> None:
        """A follower's fetch: its log end offset is ``fetch_offset``, its log start
        ``log_start_offset`` (Kafka's updateFollowerFetchState). May expand the ISR, move the
        high watermark and the low watermark."""
        progress = r.followers.get(replica_id)
        if progress is None:
            return
        if log_start_offset != progress.log_start_offset:
            progress.log_start_offset = log_start_offset
            self._maybe_complete_delete_records(r)
        now = now_ms()
        leo = r.log.log_end_offset
        if fetch_offset >= leo:
            progress.last_caught_up_ms = max(progress.last_caught_up_ms, now)
        elif fetch_offset >= progress.leader_leo_at_last_fetch:
            progress.last_caught_up_ms = max(progress.last_caught_up_ms,
                                             progress.last_fetch_ms)
        progress.leo = fetch_offset
        progress.last_fetch_ms = now
        progress.leader_leo_at_last_fetch = leo
        if replica_id not in r.isr and self._caught_up_for_isr(r, fetch_offset):
            self._change_isr(r, tuple(x for x in r.replicas
                                      if x in r.isr or x == replica_id))
        self._maybe_advance_hw(r)

    # -- DeleteRecords (KIP-107) ---------------------------------------------------------------

    def low_watermark(self, r: Replica) -> int:
        """Kafka's lowWatermarkIfLeader: the lowest log start offset of the replicas on live
        brokers (the leader's own included), as their fetches said."""
        low = r.log.log_start_offset
        live = self.view.brokers if self.view is not None else {}
        for f, progress in r.followers.items():
            if f in live:
                low = min(low, progress.log_start_offset)
        return low

    async def delete_records(self, topic: str, index: int, offset: int, timeout_ms: int
                             ) -> int:
        """Move the leader's log start offset to ``offset`` (-1: the high watermark; Kafka's
        deleteRecordsOnLeader) and wait until every live replica has followed (the low
        watermark, which is answered). ReplicationError: not the leader,
        OFFSET_OUT_OF_RANGE past the high watermark, POLICY_VIOLATION for a compacted-only
        topic, REQUEST_TIMED_OUT."""
        r = self.leader_replica(topic, index)
        plog = r.log
        topic_meta = self.broker.topics.get(topic)
        policy = str((topic_meta.configs if topic_meta else {}).get("cleanup.policy")
                     or self.broker.config.topic_defaults().get("cleanup.policy", "delete"))
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
            fut = asyncio.get_running_loop().create_future()
            r.start_waiters.append((target, fut))
            try:
                err = await asyncio.wait_for(fut, max(timeout_ms, 0) / 1000)
            except TimeoutError:
                err = ErrorCode.request_timed_out
            finally:
                r.start_waiters = [(o, f) for o, f in r.start_waiters if f is not fut]
            if err is not None:
                raise ReplicationError(err, f"{topic}-{index}: replicas did not delete up to "
                                       f"offset {target}")
        return self.low_watermark(r)

    def _maybe_complete_delete_records(self, r: Replica) -> None:
        if not r.start_waiters:
            return
        low = self.low_watermark(r)
        for offset, fut in r.start_waiters:
            if offset <= low and not fut.done():
                fut.set_result(None)

    def _caught_up_for_isr(self, r: Replica, fetch_offset: int) -> bool:
        # Kafka: at the high watermark, and past the start of the current leader epoch (so the
        # follower has truncated to this leader's log).
        start = r.log.leader_epoch_cache.start_offset_of(r.leader_epoch)
        return fetch_offset >= r.log.high_watermark and (start is None or fetch_offset >= start)

    async def _shrink_isr_forever(self) -> None:
        while True:
            await asyncio.sleep(max(self.lag_ms / 2, 50) / 1000)
            now = now_ms()
            for r in list(self.replicas.values()):
                if not r.is_leader or r.isr_change_in_flight:
                    continue
                lagging = {f for f in r.isr if f != self.node_id
                           and (p := r.followers.get(f)) is not None
                           and now - p.last_caught_up_ms > self.lag_ms}
                if lagging:
                    log.info("%s-%d: replicas %s out of sync (not caught up for %d ms)",
                             *r.tp, broker_ids(sorted(lagging)), self.lag_ms)
                    self._change_isr(r, tuple(x for x in r.isr if x not in lagging))

    def _change_isr(self, r: Replica, isr: tuple[int, ...]) -> None:
        """Write the new ISR through the metadata (Kafka's AlterPartition; the partition's
        state znode, on the condition of its version); it comes back as a new view."""
        if r.isr_change_in_flight or isr == r.isr or not isr:
            return
        r.isr_change_in_flight = True
        r.pending_isr = isr
        from ..cluster.model import LeaderAndIsr

        state = LeaderAndIsr(self.node_id, r.leader_epoch, isr, r.controller_epoch)
        topic, index = r.tp
        expected = r.zk_version

        async def write() -> None:
            try:
                version = await self.broker.metadata.alter_partition(topic, index, state,
                                                                     expected)
            except Exception as exc:  # noqa: BLE001 - ZooKeeper away: next time, again
                log.warning("%s-%d: ISR change to %s failed: %s", topic, index,
                            broker_ids(isr), str(exc) or type(exc).__name__)
                version = None
            finally:
                r.isr_change_in_flight = False
                r.pending_isr = ()
            if version is None:
                return  # conflict: the controller or a newer view wins; the watch tells us
            if r.is_leader and r.leader_epoch == state.leader_epoch and r.zk_version == expected:
                log.info("%s-%d: ISR %s -> %s", topic, index, broker_ids(r.isr),
                         broker_ids(isr))
                r.isr, r.zk_version = isr, version
                self._maybe_advance_hw(r)

        self._spawn(write())

    def _spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- the follower's side ------------------------------------------------------------------

    def _sync_fetchers(self) -> None:
        leaders = {r.leader for r in self.replicas.values()
                   if not r.is_leader and r.leader >= 0 and r.leader != self.node_id}
        for leader in list(self._fetchers):
            if leader not in leaders:
                self._fetchers.pop(leader).cancel()
                self._wake_fetchers.pop(leader, None)
                self._close_fetch_connection(leader)
        for leader in leaders:
            task = self._fetchers.get(leader)
            if task is None or task.done():
                self._wake_fetchers[leader] = asyncio.Event()
                self._fetchers[leader] = asyncio.get_running_loop().create_task(
                    self._fetch_from(leader))
            else:
                self._wake_fetchers[leader].set()

    def _following(self, leader: int) -> list[Replica]:
        return [r for r in self.replicas.values()
                if not r.is_leader and r.leader == leader]

    async def _fetch_from(self, leader: int) -> None:
        while True:
            try:
                replicas = self._following(leader)
                if not replicas:
                    return
                todo = [r for r in replicas if r.needs_truncation]
                if todo:
                    await self._truncate(leader, todo)
                ready = [r for r in replicas if not r.needs_truncation]
                if ready:
                    await self._fetch(leader, ready)
                else:
                    await asyncio.sleep(BACKOFF_S)
            except asyncio.CancelledError:
                raise
            except ChannelError as exc:
                log.debug("fetching from broker %d: %s", leader, exc)
                await self._backoff(leader)
            except Exception:
                log.exception("replica fetcher for broker %d failed; retrying", leader)
                await self._backoff(leader)

    async def _backoff(self, leader: int) -> None:
        event = self._wake_fetchers.get(leader)
        if event is None:
            await asyncio.sleep(BACKOFF_S)
            return
        event.clear()
        try:
            await asyncio.wait_for(event.wait(), BACKOFF_S)
        except TimeoutError:
            pass

    async def _truncate(self, leader: int, replicas: list[Replica]) -> None:
        """Kafka's truncation by leader epoch: ask the leader for the end offset of our latest
        epoch, cut our log there (or at our own end of the epoch the leader answers with)."""
        mod = request_module(ApiKey.OFFSET_FOR_LEADER_EPOCH, EPOCH_VERSION)
        by_topic: dict[str, list] = {}
        asked: dict[TP, tuple[Replica, int]] = {}
        for r in replicas:
            latest = r.log.leader_epoch_cache.latest_epoch
            epoch = -1 if latest is None else latest
            asked[r.tp] = (r, r.leader_epoch)
            by_topic.setdefault(r.partition.topic, []).append(make(
                mod.OffsetForLeaderPartition, partition=r.partition.index,
                current_leader_epoch=r.leader_epoch, leader_epoch=epoch))
        request = make(mod.OffsetForLeaderEpochRequest, replica_id=self.node_id,
                       topics=tuple(make(mod.OffsetForLeaderTopic, topic=t, partitions=tuple(ps))
                                    for t, ps in by_topic.items()))
        response = await self.client.request(leader, request, purpose="replication")
        for t in response.topics:
            for p in t.partitions:
                found = asked.get((t.topic, p.partition))
                if found is None:
                    continue
                r, epoch_asked = found
                if r.is_leader or r.leader_epoch != epoch_asked:
                    continue  # the view moved on meanwhile
                if p.error_code:
                    log.debug("%s-%d: OffsetForLeaderEpoch: %s", t.topic, p.partition,
                              p.error_code.name)
                    continue
                plog = r.log
                if p.end_offset < 0:
                    # The leader knows no such epoch: keep what is known to be replicated.
                    target = min(plog.high_watermark, plog.log_end_offset)
                else:
                    target = min(p.end_offset, plog.log_end_offset)
                    latest = plog.leader_epoch_cache.latest_epoch
                    if latest is not None and p.leader_epoch < latest:
                        # Our later epochs are unknown to the leader: cut at our own end of
                        # the epoch it answered with as well.
                        _e, own_end = plog.end_offset_for_epoch(p.leader_epoch)
                        if own_end >= 0:
                            target = min(target, own_end)
                if target < plog.log_end_offset:
                    log.info("%s-%d: truncating %d -> %d (leader %d, epoch %d)", *r.tp,
                             plog.log_end_offset, target, leader, r.leader_epoch)
                    plog.truncate_to(target)
                r.needs_truncation = False

    async def _fetch_connection(self, leader: int) -> replica_fetcher.FetcherConnection:
        """The fetcher's own connection to ``leader`` (replica_fetcher.py), opened on first use
        and again after it broke or the leader moved."""
        address = self._address_of(leader)
        if address is None:
            raise ChannelError(f"broker {leader} is not registered")
        found = self._fetch_connections.get(leader)
        if found is not None:
            conn, where = found
            if where == address and not conn.lost and conn.transport is not None \
                    and not conn.transport.is_closing():
                return conn
            conn.close()
            del self._fetch_connections[leader]
        conn = await replica_fetcher.connect(*address, ssl_context=self.ssl_context,
                                             login=self.login, node_id=leader,
                                             client_id=f"broker-{self.node_id}-fetcher")
        self._fetch_connections[leader] = (conn, address)
        return conn

    def _close_fetch_connection(self, leader: int) -> None:
        found = self._fetch_connections.pop(leader, None)
        if found is not None:
            found[0].close()

    async def _fetch(self, leader: int, replicas: list[Replica]) -> None:
        by_topic: dict[str, list[replica_fetcher.FetchPartition]] = {}
        asked: dict[TP, tuple[Replica, int]] = {}
        for r in replicas:
            plog = r.log
            asked[r.tp] = (r, r.leader_epoch)
            by_topic.setdefault(r.partition.topic, []).append(replica_fetcher.FetchPartition(
                r.partition.index, r.leader_epoch, plog.log_end_offset, plog.log_start_offset,
                self.fetch_max_bytes))
        self._correlation_id = correlation_id = (self._correlation_id + 1) & 0x7FFFFFFF
        request = replica_fetcher.encode_fetch_request(
            correlation_id, f"broker-{self.node_id}-fetcher", self.node_id, self.fetch_wait_ms,
            1, self.fetch_max_bytes * 4, list(by_topic.items()))
        started = time.monotonic()
        conn = await self._fetch_connection(leader)
        try:
            frame = await conn.request(request, self.fetch_wait_ms / 1000 + 30)
            answered, error_code, partitions = replica_fetcher.parse_fetch_response(frame)
            if answered != correlation_id:
                raise ChannelError(f"broker {leader} answered correlation id {answered}, not "
                                   f"{correlation_id}")
        except ChannelError:
            self._close_fetch_connection(leader)
            raise
        except ProtocolError as exc:
            self._close_fetch_connection(leader)
            raise ChannelError(f"broker {leader}: {exc}") from None
        if error_code:
            log.info("fetch from broker %d: %s", leader, ErrorCode(error_code).name)
            await self._backoff(leader)
            return
        errors = 0
        for p in partitions:
            fr = self.replicas.get((p.topic, p.partition))
            # Kafka's fetcher: only for a partition still fetched as the request did (same
            # replica, still following this leader at the epoch asked, not to be truncated).
            if fr is None or asked.get(fr.tp) != (fr, fr.leader_epoch) or fr.is_leader \
                    or fr.leader != leader or fr.needs_truncation:
                continue
            r = fr
            if p.error_code:
                errors += 1
                if p.error_code == ErrorCode.offset_out_of_range:
                    self._out_of_range(r, p.log_start_offset)
                log.debug("%s-%d: fetch from %d: %s", *r.tp, leader,
                          ErrorCode(p.error_code).name)
                continue
            plog = r.log
            if p.records:
                plog.append_as_follower(p.records)
            plog.update_high_watermark(min(p.high_watermark, plog.log_end_offset))
            # Kafka's follower: the leader's log start offset, as its answer says.
            if p.log_start_offset > plog.log_start_offset:
                plog.increment_log_start_offset(
                    min(p.log_start_offset, plog.high_watermark), now_ms())
        del frame, partitions  # the connection's buffer is reused for the next response
        if errors and time.monotonic() - started < BACKOFF_S:
            await self._backoff(leader)

    def _out_of_range(self, r: Replica, leader_log_start: int) -> None:
        """Kafka's handleOutOfRangeError: a follower whose log ends below the leader's log
        start (the leader deleted records it had not fetched yet) starts again, empty, at
        the leader's log start; otherwise its log ends past the leader's: truncate by epoch."""
        plog = r.log
        if 0 <= leader_log_start and plog.log_end_offset < leader_log_start:
            log.info("%s-%d: log end %d below the leader's log start %d: starting there",
                     *r.tp, plog.log_end_offset, leader_log_start)
            plog.truncate_fully_and_start_at(leader_log_start, now_ms())
        else:
            r.needs_truncation = True

    # -- OffsetForLeaderEpoch (the leader answers followers) ----------------------------------

    def end_offset_for_epoch(self, topic: str, index: int, current_leader_epoch: int,
                             epoch: int) -> tuple[int, int]:
        r = self.leader_replica(topic, index, current_leader_epoch)
        return r.log.end_offset_for_epoch(epoch)
