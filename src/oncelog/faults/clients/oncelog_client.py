"""The adapter for our own client (oncelog.client): transaction version 2 when the broker
offers it (KIP-890 part 2), as our Producer decides at init_transactions."""

from __future__ import annotations

from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from ...client import Consumer, Producer, TopicPartition
from ...client.errors import TransactionError
from ...errors import (
    AbortableError,
    FatalError,
    InvalidRequiredAcksError,
    InvalidTopicError,
    KafkaError,
    MessageTooLargeError,
    RecordListTooLargeError,
    TopicAuthorizationFailedError,
)
from .base import ClientAdapter, OpError, RebalanceLog, Record, Settings, decode_value
from .history import Key, key, split_key

# a send refused with one of these was certainly not written
_DEFINITE_SEND_ERRORS = (MessageTooLargeError, RecordListTooLargeError, InvalidTopicError,
                         TopicAuthorizationFailedError, InvalidRequiredAcksError)


def _tp(k: Key) -> TopicPartition:
    return TopicPartition(*split_key(k))


def _keys(tps: Any) -> list[Key]:
    return sorted(key(tp.topic, tp.partition) for tp in tps)


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


class OncelogAdapter(ClientAdapter):
    kind = "oncelog"

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self.consumer: Consumer | None = None
        self.producer: Producer | None = None
        self.txn: Producer | None = None

    def _common(self) -> dict[str, Any]:
        return {"bootstrap_servers": self.s.bootstrap,
                "request_timeout_ms": self.s.request_timeout_ms,
                "client_id": f"{self.s.process}"}

    # -- consumer ---------------------------------------------------------------------------

    def open_consumer(self, read_committed: bool = True) -> None:
        config = self._common()
        config.update(isolation_level="read_committed" if read_committed else "read_uncommitted",
                      enable_auto_commit=False, auto_offset_reset="earliest",
                      fetch_max_wait_ms=100, max_poll_records=50,
                      default_api_timeout_ms=int(self.s.op_timeout * 1000))
        if self.s.group is not None:
            config.update(group_id=self.s.group, session_timeout_ms=self.s.session_timeout_ms,
                          heartbeat_interval_ms=max(100, self.s.session_timeout_ms // 6))
        self.consumer = Consumer(**config)

    def _c(self) -> Consumer:
        assert self.consumer is not None, "open_consumer first"
        return self.consumer

    def assign(self, keys: list[Key]) -> None:
        self._c().assign([_tp(k) for k in keys])

    def subscribe(self, topics: list[str], log: RebalanceLog) -> None:
        self._c().subscribe(topics, on_assign=lambda tps: log("assigned", _keys(tps)),
                            on_revoke=lambda tps: log("revoked", _keys(tps)),
                            on_lost=lambda tps: log("lost", _keys(tps)))

    def poll(self, timeout: float) -> list[Record]:
        try:
            records = self._c().poll(timeout)
        except KafkaError as exc:
            raise OpError(_describe(exc), definite=True) from exc
        return [(key(r.topic, r.partition), r.offset, decode_value(r.value)) for r in records]

    def assignment(self) -> list[Key]:
        return _keys(self._c().assignment())

    def position(self, k: Key) -> int:
        try:
            return self._c().position(_tp(k), self.s.op_timeout)
        except (KafkaError, TimeoutError) as exc:
            raise OpError(_describe(exc), definite=True) from exc

    def seek(self, k: Key, offset: int) -> None:
        self._c().seek(_tp(k), offset)

    def seek_to_beginning(self, keys: list[Key]) -> None:
        if keys:
            self._c().seek_to_beginning(*[_tp(k) for k in keys])

    def committed(self, keys: list[Key]) -> dict[Key, int | None]:
        try:
            got = self._c().committed([_tp(k) for k in keys], self.s.op_timeout)
        except (KafkaError, TimeoutError) as exc:
            raise OpError(_describe(exc), definite=False) from exc
        return {key(tp.topic, tp.partition): o for tp, o in got.items()}

    def commit(self, offsets: dict[Key, int]) -> None:
        try:
            self._c().commit({_tp(k): o for k, o in offsets.items()},
                             timeout=self.s.op_timeout)
        except (KafkaError, TimeoutError) as exc:
            raise OpError(_describe(exc), definite=False) from exc

    def end_offsets(self, keys: list[Key]) -> dict[Key, int]:
        config = self._common()
        config.update(isolation_level="read_uncommitted",
                      default_api_timeout_ms=int(self.s.op_timeout * 1000))
        try:
            with Consumer(**config) as c:
                ends = c.end_offsets([_tp(k) for k in keys], self.s.op_timeout)
        except (KafkaError, TimeoutError) as exc:
            raise OpError(_describe(exc), definite=False) from exc
        return {key(tp.topic, tp.partition): o for tp, o in ends.items()}

    # -- the idempotent producer ------------------------------------------------------------

    def _producer_config(self) -> dict[str, Any]:
        config = self._common()
        config.update(acks="all", enable_idempotence=True, linger_ms=1,
                      delivery_timeout_ms=self.s.request_timeout_ms * 2 + 1,
                      max_block_ms=int(self.s.op_timeout * 1000))
        return config

    def send(self, k: Key, value: int) -> int:
        if self.producer is None:
            self.producer = Producer(**self._producer_config())
        topic, partition = split_key(k)
        future = self.producer.send(topic, str(value).encode(), partition=partition)
        try:
            return future.result(self.s.op_timeout).offset
        except FutureTimeout as exc:
            raise OpError("no answer in time", definite=False) from exc
        except _DEFINITE_SEND_ERRORS as exc:
            raise OpError(_describe(exc), definite=True) from exc
        except KafkaError as exc:
            if isinstance(exc, FatalError):  # a new producer id for the next sends
                self.producer.close(0)
                self.producer = None
            raise OpError(_describe(exc), definite=False) from exc

    # -- the transactional producer ---------------------------------------------------------

    def txn_init(self) -> dict[str, Any]:
        assert self.s.transactional_id is not None, "--transactional-id"
        config = self._producer_config()
        config.update(transactional_id=self.s.transactional_id,
                      transaction_timeout_ms=self.s.transaction_timeout_ms)
        self.txn = Producer(**config)
        try:
            self.txn.init_transactions(self.s.op_timeout)
        except (KafkaError, TimeoutError) as exc:
            self.txn.close(0)
            self.txn = None
            raise OpError(_describe(exc), definite=False, reset=True) from exc
        manager = self.txn._txn
        assert manager is not None
        return {"transaction_version": 2 if manager.transaction_v2 else 1,
                "producer_id": manager.producer_id, "producer_epoch": manager.producer_epoch}

    def _t(self) -> Producer:
        if self.txn is None:
            raise OpError("no transactional producer (init_transactions failed)",
                          definite=True, reset=True)
        return self.txn

    def txn_begin(self) -> None:
        try:
            self._t().begin_transaction()
        except KafkaError as exc:
            raise OpError(_describe(exc), definite=True, reset=True) from exc

    def txn_send(self, k: Key, value: int) -> Future:
        topic, partition = split_key(k)
        try:
            return self._t().send(topic, str(value).encode(), partition=partition)
        except KafkaError as exc:  # the producer's state refuses sends (fenced, fatal)
            raise OpError(_describe(exc), definite=True, reset=True) from exc

    def txn_send_offsets(self, offsets: dict[Key, int]) -> None:
        try:
            self._t().send_offsets_to_transaction({_tp(k): o for k, o in offsets.items()},
                                                  self._c().group_metadata(),
                                                  self.s.op_timeout)
        except (KafkaError, TimeoutError) as exc:
            # never committed: the workload aborts (or a new producer fences it)
            raise OpError(_describe(exc), definite=True) from exc

    def txn_flush(self, timeout: float) -> None:
        try:
            self._t().flush(timeout)
        except (KafkaError, TimeoutError) as exc:
            raise OpError(_describe(exc), definite=True) from exc

    def txn_commit(self) -> None:
        try:
            self._t().commit_transaction(self.s.op_timeout)
        except (TransactionError, AbortableError) as exc:
            # a record or the offsets were refused before EndTxn: abort, and it is certain
            try:
                self._t().abort_transaction(self.s.op_timeout)
            except (KafkaError, TimeoutError) as exc2:
                raise OpError(f"{_describe(exc)}; abort: {_describe(exc2)}", definite=False,
                              reset=True) from exc2
            raise OpError(_describe(exc), definite=True) from exc
        except (KafkaError, TimeoutError) as exc:
            # fenced, fatal, or EndTxn unanswered: it may have committed
            raise OpError(_describe(exc), definite=False, reset=True) from exc

    def txn_abort(self) -> None:
        try:
            self._t().abort_transaction(self.s.op_timeout)
        except (KafkaError, TimeoutError) as exc:
            raise OpError(_describe(exc), definite=True, reset=True) from exc

    def txn_offset(self, handle: Any) -> int:
        assert isinstance(handle, Future)
        try:
            return handle.result(0).offset
        except (KafkaError, FutureTimeout):
            return -1

    def txn_reset(self) -> dict[str, Any]:
        if self.txn is not None:
            self.txn.close(0)
            self.txn = None
        return self.txn_init()

    def close(self) -> None:
        for p in (self.producer, self.txn):
            if p is not None:
                p.close(2)
        if self.consumer is not None:
            self.consumer.close(2)
