"""The adapter for confluent-kafka (librdkafka): its transactional producer speaks transaction
version 1 (AddPartitionsToTxn before the sends; librdkafka implements no part of KIP-890 on the
client side), so the broker's KIP-890 part 1 verification guards its transactions."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaException,
    Producer,
    TopicPartition,
    libversion,
)
from confluent_kafka import KafkaError as CKafkaError

from .base import ClientAdapter, OpError, RebalanceLog, Record, Settings, decode_value
from .history import Key, key, split_key

# delivery errors that mean the record was certainly not written
_DEFINITE = {CKafkaError.MSG_SIZE_TOO_LARGE, CKafkaError.TOPIC_AUTHORIZATION_FAILED,
             CKafkaError.INVALID_REQUIRED_ACKS, CKafkaError.TOPIC_EXCEPTION}


def _tp(k: Key, offset: int | None = None) -> TopicPartition:
    topic, partition = split_key(k)
    return TopicPartition(topic, partition) if offset is None \
        else TopicPartition(topic, partition, offset)


def _keys(tps: Any) -> list[Key]:
    return sorted(key(tp.topic, tp.partition) for tp in tps)


def _error(exc: BaseException) -> Any:
    return exc.args[0] if exc.args and isinstance(exc.args[0], CKafkaError) else None


# Producers let go of (fenced, failed fatally, or replaced after an unknown commit): kept, never
# freed nor served again while the process lives; the process ends with os._exit (__main__).
# Serving the delivery reports of a fatally failed transactional producer (flush) raised
# "SystemError: <method 'append' of 'list' objects> returned a result with an exception set"
# in confluent-kafka's callback path, and freeing one with records still queued once killed
# the process ("double free or corruption").
_RETIRED: list[Any] = []


def _discard(producer: Any) -> None:
    if producer is not None:
        _RETIRED.append(producer)


class _Stuck(Exception):
    """A transactional call of librdkafka did not return long after its timeout."""


# librdkafka's transactional calls wait for the result of an internal operation without a
# bound of their own; rd_kafka_send_offsets_to_transaction was seen here blocked for good after
# a broker kill (confluentinc/librdkafka#5456: the coordinator request's timeout is never
# checked; #5511: a dead coordinator's broker thread is gone and nothing retries). Each call
# runs on a thread of its own; past its timeout and GRACE_S more, the producer is retired
# (still blocked) and a new one made.
GRACE_S = 5.0


def _bounded(call: Callable[[], Any], timeout: float, what: str) -> Any:
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["result"] = call()
        except BaseException as exc:  # noqa: BLE001 (handed to the caller's thread)
            box["error"] = exc

    thread = threading.Thread(target=run, name=what, daemon=True)
    thread.start()
    thread.join(timeout + GRACE_S)
    if thread.is_alive():
        raise _Stuck(f"{what} did not return in {timeout + GRACE_S:.0f} s (librdkafka)")
    if "error" in box:
        raise box["error"]
    return box.get("result")


class ConfluentAdapter(ClientAdapter):
    kind = "confluent"

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self.consumer: Any = None
        self.producer: Any = None
        self.txn: Any = None

    def _common(self) -> dict[str, Any]:
        return {"bootstrap.servers": self.s.bootstrap, "client.id": self.s.process,
                "socket.timeout.ms": max(10, self.s.request_timeout_ms),
                "reconnect.backoff.max.ms": 1000}

    # -- consumer ---------------------------------------------------------------------------

    def open_consumer(self, read_committed: bool = True) -> None:
        conf = self._common()
        conf.update({"group.id": self.s.group or f"{self.s.process}-no-group",
                     "isolation.level": "read_committed" if read_committed
                     else "read_uncommitted",
                     "enable.auto.commit": False, "auto.offset.reset": "earliest",
                     "enable.auto.offset.store": False, "fetch.wait.max.ms": 100,
                     "session.timeout.ms": self.s.session_timeout_ms,
                     "heartbeat.interval.ms": max(100, self.s.session_timeout_ms // 6)})
        self.consumer = Consumer(conf)

    def assign(self, keys: list[Key]) -> None:
        self.consumer.assign([_tp(k) for k in keys])

    def subscribe(self, topics: list[str], log: RebalanceLog) -> None:
        self.consumer.subscribe(
            topics, on_assign=lambda _c, tps: log("assigned", _keys(tps)),
            on_revoke=lambda _c, tps: log("revoked", _keys(tps)),
            on_lost=lambda _c, tps: log("lost", _keys(tps)))

    def poll(self, timeout: float) -> list[Record]:
        try:
            messages = self.consumer.consume(50, timeout)
        except KafkaException as exc:
            raise OpError(str(exc), definite=True) from exc
        out: list[Record] = []
        for m in messages:
            err = m.error()
            if err is not None:
                if err.code() == CKafkaError._PARTITION_EOF:
                    continue
                if out:  # what came before the error was read: keep it
                    break
                raise OpError(str(err), definite=True)
            out.append((key(m.topic(), m.partition()), m.offset(), decode_value(m.value())))
        return out

    def assignment(self) -> list[Key]:
        return _keys(self.consumer.assignment())

    def position(self, k: Key) -> int:
        try:
            offset = int(self.consumer.position([_tp(k)])[0].offset)
        except KafkaException as exc:
            raise OpError(str(exc), definite=True) from exc
        return max(offset, -1)  # -1: nothing fetched yet

    def seek(self, k: Key, offset: int) -> None:
        self._seek(_tp(k, offset))

    def _seek(self, tp: TopicPartition) -> None:
        deadline = time.monotonic() + self.s.op_timeout
        while True:  # a partition assigned a moment ago may not take a seek yet (_STATE)
            try:
                self.consumer.seek(tp)
                return
            except KafkaException as exc:
                if time.monotonic() > deadline:
                    raise OpError(str(exc), definite=True) from exc
                time.sleep(0.05)

    def seek_to_beginning(self, keys: list[Key]) -> None:
        for k in keys:
            self._seek(_tp(k, OFFSET_BEGINNING))

    def committed(self, keys: list[Key]) -> dict[Key, int | None]:
        try:
            got = self.consumer.committed([_tp(k) for k in keys], timeout=self.s.op_timeout)
        except KafkaException as exc:
            raise OpError(str(exc), definite=False) from exc
        return {key(tp.topic, tp.partition): (tp.offset if tp.offset >= 0 else None)
                for tp in got}

    def commit(self, offsets: dict[Key, int]) -> None:
        try:
            self.consumer.commit(offsets=[_tp(k, o) for k, o in offsets.items()],
                                 asynchronous=False)
        except KafkaException as exc:
            raise OpError(str(exc), definite=False) from exc

    def end_offsets(self, keys: list[Key]) -> dict[Key, int]:
        conf = self._common()
        conf.update({"group.id": f"{self.s.process}-ends", "isolation.level": "read_uncommitted"})
        c = Consumer(conf)
        try:
            return {k: c.get_watermark_offsets(_tp(k), timeout=self.s.op_timeout)[1]
                    for k in keys}
        except KafkaException as exc:
            raise OpError(str(exc), definite=False) from exc
        finally:
            c.close()

    # -- the idempotent producer ------------------------------------------------------------

    def _producer_config(self) -> dict[str, Any]:
        conf = self._common()
        conf.update({"enable.idempotence": True, "acks": "all", "linger.ms": 1,
                     "request.timeout.ms": self.s.request_timeout_ms,
                     "message.timeout.ms": self.s.request_timeout_ms * 2})
        return conf

    def send(self, k: Key, value: int) -> int:
        if self.producer is None:
            self.producer = Producer(self._producer_config())
        p = self.producer
        topic, partition = split_key(k)
        result: list[Any] = []
        try:
            p.produce(topic, str(value).encode(), partition=partition,
                      on_delivery=lambda err, msg: result.append((err, msg)))
            deadline = time.monotonic() + self.s.op_timeout
            while not result and time.monotonic() < deadline:
                p.poll(min(0.1, max(0.0, deadline - time.monotonic())))
        except BufferError as exc:  # its queue is full: not queued
            raise OpError(str(exc), definite=not result) from exc
        except KafkaException as exc:
            # poll raises the producer's fatal error (e.g. UNKNOWN_PRODUCER_ID for a batch
            # after one that timed out: "unable to retry without risking duplication")
            if (err := _error(exc)) is None or err.fatal():
                self._retire_producer()
            raise OpError(str(exc), definite=False) from exc
        if not result:
            raise OpError("no delivery report in time", definite=False)
        err, msg = result[0]
        if err is None:
            return int(msg.offset())
        if err.fatal():
            self._retire_producer()
        raise OpError(str(err), definite=err.code() in _DEFINITE)

    def _retire_producer(self) -> None:
        _discard(self.producer)
        self.producer = None  # a new one (a new producer id) for the next sends

    # -- the transactional producer ---------------------------------------------------------

    def txn_init(self) -> dict[str, Any]:
        assert self.s.transactional_id is not None, "--transactional-id"
        conf = self._producer_config()
        conf.update({"transactional.id": self.s.transactional_id,
                     "transaction.timeout.ms": self.s.transaction_timeout_ms})
        self.txn = Producer(conf)
        try:
            _bounded(lambda: self.txn.init_transactions(self.s.op_timeout), self.s.op_timeout,
                     "init_transactions")
        except (KafkaException, _Stuck) as exc:
            _discard(self.txn)
            self.txn = None
            raise OpError(str(exc), definite=False, reset=True) from exc
        return {"transaction_version": 1, "librdkafka": libversion()[0]}

    def _t(self) -> Any:
        if self.txn is None:
            raise OpError("no transactional producer (init_transactions failed)",
                          definite=True, reset=True)
        return self.txn

    def txn_begin(self) -> None:
        try:
            self._t().begin_transaction()
        except KafkaException as exc:
            raise OpError(str(exc), definite=True, reset=True) from exc

    def txn_send(self, k: Key, value: int) -> Any:
        topic, partition = split_key(k)
        handle: list[Any] = []
        try:
            self._t().produce(topic, str(value).encode(), partition=partition,
                              on_delivery=lambda err, msg: handle.append((err, msg)))
        except (KafkaException, BufferError) as exc:
            raise OpError(str(exc), definite=True, reset=isinstance(exc, KafkaException)) \
                from exc
        return handle

    def txn_send_offsets(self, offsets: dict[Key, int]) -> None:
        p = self._t()
        offered = [_tp(k, o) for k, o in offsets.items()]
        group = self.consumer.consumer_group_metadata()
        try:
            _bounded(lambda: p.send_offsets_to_transaction(offered, group, self.s.op_timeout),
                     self.s.op_timeout, "send_offsets_to_transaction")
        except _Stuck as exc:
            raise OpError(str(exc), definite=True, reset=True) from exc
        except KafkaException as exc:
            raise OpError(str(exc), definite=True) from exc

    def txn_flush(self, timeout: float) -> None:
        if self._t().flush(timeout) > 0:
            raise OpError("the transaction's sends were not all delivered in time",
                          definite=True)

    def txn_commit(self) -> None:
        p = self._t()
        deadline = time.monotonic() + self.s.op_timeout
        while True:
            left = max(0.1, deadline - time.monotonic())
            try:
                _bounded(lambda t=left: p.commit_transaction(t),  # type: ignore[misc]
                         left, "commit_transaction")
                p.poll(0)  # the delivery reports of its sends
                return
            except _Stuck as exc:
                raise OpError(str(exc), definite=False, reset=True) from exc
            except KafkaException as exc:
                err = _error(exc)
                if err is not None and err.retriable() and time.monotonic() < deadline:
                    continue  # librdkafka: call commit_transaction again
                if err is not None and err.txn_requires_abort():
                    try:
                        _bounded(lambda: p.abort_transaction(self.s.op_timeout),
                                 self.s.op_timeout, "abort_transaction")
                    except (KafkaException, _Stuck) as exc2:
                        # an earlier attempt's EndTxn(commit) may have been written
                        raise OpError(f"{exc}; abort: {exc2}", definite=False,
                                      reset=True) from exc2
                    raise OpError(str(exc), definite=True) from exc
                raise OpError(str(exc), definite=False, reset=True) from exc

    def txn_abort(self) -> None:
        p = self._t()
        try:
            _bounded(lambda: p.abort_transaction(self.s.op_timeout), self.s.op_timeout,
                     "abort_transaction")
        except (KafkaException, _Stuck) as exc:
            raise OpError(str(exc), definite=True, reset=True) from exc

    def txn_offset(self, handle: Any) -> int:
        if not handle:
            self._t().poll(0)
        if handle and handle[0][0] is None:
            return int(handle[0][1].offset())
        return -1

    def txn_reset(self) -> dict[str, Any]:
        _discard(self.txn)
        self.txn = None
        return self.txn_init()

    def close(self) -> None:
        if self.producer is not None:
            self.producer.flush(2)
        if self.consumer is not None:
            self.consumer.close()
