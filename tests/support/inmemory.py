"""An in-memory pair (h11's ConnectionPair idea): the client's TransactionManager, the state
machine the producer's sender drives, connected to the broker's sans-IO transaction
coordinator (oncelog.txn.coordinator) without sockets, threads or sleeps.

``InMemoryBroker`` is the broker's side: a ``TransactionCoordinator`` core whose effects are
carried out on the spot (the transaction log is a list; markers are "written" at once, or after
``marker_delay_s`` on the pair's clock, so that a client meets CONCURRENT_TRANSACTIONS), and
which answers request frames with response frames, encoded and decoded by the real protocol
code. ``TxnManagerPair`` is one client on it: ``pump`` plays the sender's part, taking each
request the manager wants sent, passing its bytes to the broker and the answer back, and moving
the clock over every backoff instead of sleeping. Several pairs may share one broker (a second
producer with the same transactional id fences the first).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

from oncelog.client.config import producer_config
from oncelog.client.coordinator_request import BrokerVersions, Send
from oncelog.client.messages import build, build_request
from oncelog.client.producer.transaction_manager import TransactionManager
from oncelog.protocol import (
    ApiKey,
    decode_request_body,
    decode_response,
    encode_request,
    encode_response,
    millis,
    parse_request_header,
    response_class,
)
from oncelog.protocol.apis import (
    SUPPORTED_VERSIONS,
    TRANSACTION_VERSION_FEATURE,
    supported_versions,
)
from oncelog.server.handlers.util import error_code
from oncelog.txn.coordinator import Effect, Pause, SendMarkers, TransactionCoordinator, WriteTxnLog

OFFSETS_TOPIC = "__consumer_offsets"
NODE_ID, HOST, PORT = 0, "in-memory", 9092


class InMemoryBroker:
    """One broker's transaction coordinator, sans IO, answering frames."""

    def __init__(self, *, transaction_version: int = 2, two_phase_commit: bool = False,
                 max_timeout_ms: int = 900_000, marker_delay_s: float = 0.0) -> None:
        self.now = 1000.0  # the clock every pair on this broker shares (seconds)
        self.transaction_version = transaction_version
        self.versions = BrokerVersions(supported_versions(transaction_version),
                                       {TRANSACTION_VERSION_FEATURE: transaction_version})
        self.core = TransactionCoordinator(
            allocate_producer_id=itertools.count(4000).__next__, max_timeout_ms=max_timeout_ms,
            expiration_ms=7 * 24 * 3600 * 1000, two_phase_commit_enabled=two_phase_commit)
        self.core.load([])
        self.marker_delay_s = marker_delay_s
        self.txn_log: list[WriteTxnLog] = []  # every record appended, in order
        self.markers: list[SendMarkers] = []  # every marker set written, in order
        self.txn_offsets: list[tuple[str, int, dict[tuple[str, int], int]]] = []
        self.exchanges: list[tuple[ApiKey, int, str | None]] = []  # (api, version, error)
        self._due: list[tuple[float, SendMarkers]] = []  # markers still being "written"
        self._correlation = itertools.count()

    @property
    def now_ms(self) -> int:
        return int(self.now * 1000)

    def advance(self, seconds: float) -> None:
        """Move the clock on; markers due by then are written."""
        self.now += seconds
        due = [m for at, m in self._due if at <= self.now]
        self._due = [(at, m) for at, m in self._due if at > self.now]
        for m in due:
            self._markers_written(m)

    # -- effects -------------------------------------------------------------------------------

    def _run(self, effects: list[Effect]) -> None:
        for e in effects:
            if isinstance(e, WriteTxnLog):
                self.txn_log.append(e)
                self._run(self.core.write_done(e.transactional_id, True))
            elif isinstance(e, SendMarkers):
                if self.marker_delay_s > 0:
                    self._due.append((self.now + self.marker_delay_s, e))
                else:
                    self._markers_written(e)
            else:  # a Pause comes only after a failed write, and no write fails here
                assert not isinstance(e, Pause), f"unexpected {e}"

    def _markers_written(self, e: SendMarkers) -> None:
        self.markers.append(e)
        self._run(self.core.markers_done(e.transactional_id, self.now_ms))

    def _outcome(self, outcome: Any) -> str | None:
        self._run(outcome.effects)  # also when refused: fencing aborts with CONCURRENT_...
        return outcome.error

    # -- the wire ------------------------------------------------------------------------------

    def handle(self, frame: bytes) -> bytes:
        """One request frame (size prefix included) in, its response frame out."""
        body = frame[4:]
        header = parse_request_header(body)
        request = decode_request_body(header, body)
        api, version = ApiKey(header.api_key), header.api_version
        answer: Callable[[Any, int], tuple[str | None, dict[str, Any]]] = getattr(
            self, f"_{api.name.lower()}")
        error, values = answer(request, version)
        self.exchanges.append((api, version, error))
        response = build(response_class(api, version), {"throttle_time": 0, **values})
        return encode_response(header.correlation_id, response)

    def _find_coordinator(self, r: Any, version: int) -> tuple[str | None, dict[str, Any]]:
        found = {"error_code": 0, "error_message": None, "node_id": NODE_ID, "host": HOST,
                 "port": PORT}
        keys = getattr(r, "coordinator_keys", None) or (r.key,)
        return None, {**found, "coordinators": [{"key": k, **found} for k in keys]}

    def _init_producer_id(self, r: Any, version: int) -> tuple[str | None, dict[str, Any]]:
        outcome = self.core.init_producer_id(
            r.transactional_id, millis(r.transaction_timeout), self.now_ms,
            producer_id=r.producer_id, producer_epoch=r.producer_epoch, version=version,
            enable_2pc=bool(getattr(r, "enable2_pc", False)),
            keep_prepared_txn=bool(getattr(r, "keep_prepared_txn", False)))
        err = self._outcome(outcome)
        ok = err is None
        return err, {"error_code": error_code(err),
                     "producer_id": outcome.producer_id if ok else -1,
                     "producer_epoch": outcome.producer_epoch if ok else -1,
                     "ongoing_txn_producer_id": outcome.ongoing_producer_id if ok else -1,
                     "ongoing_txn_producer_epoch": outcome.ongoing_producer_epoch if ok else -1}

    def _add_partitions_to_txn(self, r: Any, version: int) -> tuple[str | None, dict[str, Any]]:
        wanted = [(t.name, p) for t in r.v3_and_below_topics for p in t.partitions]
        err = self._outcome(self.core.add_partitions(
            r.v3_and_below_transactional_id, r.v3_and_below_producer_id,
            r.v3_and_below_producer_epoch, wanted, self.now_ms, version=version,
            txn_version=min(self.transaction_version, 1)))
        by_topic: dict[str, list[dict[str, Any]]] = {}
        for topic, p in wanted:
            by_topic.setdefault(topic, []).append({"partition_index": p,
                                                   "partition_error_code": error_code(err)})
        return err, {"results_by_topic_v3_and_below": [
            {"name": t, "results_by_partition": ps} for t, ps in by_topic.items()]}

    def _add_offsets_to_txn(self, r: Any, version: int) -> tuple[str | None, dict[str, Any]]:
        err = self._outcome(self.core.add_partitions(
            r.transactional_id, r.producer_id, r.producer_epoch, [(OFFSETS_TOPIC, 0)],
            self.now_ms, version=version, api="add_offsets",
            txn_version=min(self.transaction_version, 1)))
        return err, {"error_code": error_code(err)}

    def _txn_offset_commit(self, r: Any, version: int) -> tuple[str | None, dict[str, Any]]:
        err = None
        if version >= 5:  # KIP-890: the group coordinator adds the offsets partition itself
            err = self._outcome(self.core.add_partitions(
                r.transactional_id, r.producer_id, r.producer_epoch, [(OFFSETS_TOPIC, 0)],
                self.now_ms, version=version, txn_version=2))
        if err is None:
            self.txn_offsets.append((r.group_id, r.producer_id, {
                (t.name, p.partition_index): p.committed_offset
                for t in r.topics for p in t.partitions}))
        return err, {"topics": [{"name": t.name, "partitions": [
            {"partition_index": p.partition_index, "error_code": error_code(err)}
            for p in t.partitions]} for t in r.topics]}

    def _end_txn(self, r: Any, version: int) -> tuple[str | None, dict[str, Any]]:
        txn_version = 2 if version >= 5 else min(self.transaction_version, 1)
        outcome = self.core.end_txn(r.transactional_id, r.producer_id, r.producer_epoch,
                                    bool(r.committed), self.now_ms, version=version,
                                    txn_version=txn_version)
        err = self._outcome(outcome)
        ok = err is None
        return err, {"error_code": error_code(err),
                     "producer_id": outcome.producer_id if ok else -1,
                     "producer_epoch": outcome.producer_epoch if ok else -1}

    def produce(self, transactional_id: str, producer_id: int, producer_epoch: int,
                tp: tuple[str, int]) -> str | None:
        """What a partition leader does on a transaction version 2 client's first write to a
        partition (Produce v12, KIP-890): it adds the partition to the transaction."""
        return self._outcome(self.core.add_partitions(
            transactional_id, producer_id, producer_epoch, [tp], self.now_ms, version=5,
            txn_version=2))


class TxnManagerPair:
    """A TransactionManager on an ``InMemoryBroker``; ``pump`` is its sender."""

    def __init__(self, broker: InMemoryBroker, transactional_id: str = "pair-txn",
                 **config: Any) -> None:
        self.broker = broker
        self.producer: tuple[int, int] = (-1, -1)  # what the sender was told to stamp
        self.transaction_v2 = False
        self.manager = TransactionManager(
            producer_config({"bootstrap.servers": f"{HOST}:{PORT}",
                             "transactional.id": transactional_id}, config),
            set_producer=self._set_producer, flush=lambda _timeout: None,
            set_transaction_v2=self._set_transaction_v2)

    def _set_producer(self, producer_id: int, producer_epoch: int) -> None:
        self.producer = (producer_id, producer_epoch)

    def _set_transaction_v2(self, on: bool) -> None:
        self.transaction_v2 = on

    def deadline(self, seconds: float = 30.0) -> float:
        return self.broker.now + seconds

    def pump(self, max_steps: int = 10_000) -> None:
        """Carry requests and responses until the manager has nothing due; the clock moves
        over each wait instead of sleeping."""
        for _ in range(max_steps):
            step = self.manager.next_request(self.broker.now)
            if step is None:
                return
            if isinstance(step, float):
                self.broker.advance(step)
                continue
            self._exchange(step)
        raise AssertionError("the pair did not settle")

    def _exchange(self, step: Send) -> None:
        values = self.manager.request_values(step, self.broker.versions)
        if values is None:
            return  # the handler failed the call
        version = _version_for(step.api, step.max_version, self.broker.versions)
        body = values(version) if callable(values) else values
        correlation_id = next(self.broker._correlation)
        frame = encode_request(correlation_id, "pair", build_request(step.api, version, body))
        answer = self.broker.handle(frame)
        got, response = decode_response(step.api, version, answer[4:])
        assert got == correlation_id
        self.manager.on_response(step, response, self.broker.now)

    def run(self, pending: Any) -> Any:
        """Pump until ``pending`` (what a sans-IO call of the manager returned) is over; its
        result, or raise its error."""
        self.pump()
        if pending is None:
            return None
        assert pending.future.done(), "the request is still open"
        return pending.future.result(0)


def _version_for(api: int, max_version: int | None, broker: BrokerVersions) -> int:
    """As BrokerConnection.version_for: the highest version both sides have."""
    ours_lo, ours_hi = SUPPORTED_VERSIONS[api]
    theirs_lo, theirs_hi = broker.api_versions[api]
    high = min(ours_hi, theirs_hi, max_version if max_version is not None else ours_hi)
    assert high >= max(ours_lo, theirs_lo)
    return high
