"""The partition leader's half of KIP-890: before a transactional batch opens its producer's
transaction on a partition, ask the transaction coordinator.

- A client of the older protocol (Produce v11 and below, TxnOffsetCommit v4 and below) added
  the partition itself; the leader *verifies* (AddPartitionsToTxn v4+ with verifyOnly) that the
  transaction is ongoing with that producer id and epoch and holds the partition, and refuses the
  batch with INVALID_TXN_STATE otherwise -- a late batch of a transaction that already ended
  cannot open a hanging transaction. ``transaction.partition.verification.enable`` turns this off.
- A client of transaction version 2 (Produce v12+, TxnOffsetCommit v5) never adds partitions:
  the leader *adds* the partition for it (the same request without verifyOnly).

Requests waiting at the same moment go out as one AddPartitionsToTxn request, one entry per
transactional id. The answer is cached by the producer state itself: once the batch is written
the transaction is open on the partition (``current_txn_first_offset``) and later batches need
no question until a marker closes it. A marker written between the coordinator's answer and the
append drops the verification guard, and the append is refused (log/producer_state.py).

The request goes to the broker that leads the transactional id's partition of
``__transaction_state``; when that is this broker, the transaction coordinator here is asked in
process (server/txn_service.py ``add_partitions``, which the AddPartitionsToTxn handler calls
too).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from kio.schema.errors import ErrorCode

from ..protocol import ApiKey, make, request_module
from .topics import TRANSACTION_STATE, TopicError

log = logging.getLogger("oncelog.txn.verification")

# CONCURRENT_TRANSACTIONS answers retried in the broker (Kafka's
# add.partitions.to.txn.retry.backoff.ms is 20 ms).
CONCURRENT_RETRY_BACKOFF_S = 0.02
CONCURRENT_RETRY_MAX_S = 1.0
VERIFY_VERSION = 5  # AddPartitionsToTxn: v4 verifyOnly and batching, v5 TRANSACTION_ABORTABLE
TP = tuple[str, int]

# Coordinator errors a produce answer cannot carry as such: older clients treat several of them
# as fatal, so they become NOT_ENOUGH_REPLICAS (retriable everywhere), as Kafka does.
_RETRIABLE = {ErrorCode.concurrent_transactions, ErrorCode.coordinator_load_in_progress,
              ErrorCode.coordinator_not_available, ErrorCode.not_coordinator}


def produce_error(error: ErrorCode, new_client: bool) -> tuple[ErrorCode, str]:
    """The produce answer (error name, message) for a coordinator's verification error."""
    if error in _RETRIABLE:
        return ErrorCode.not_enough_replicas, (f"the transaction coordinator could not check the "
                                       f"transaction yet ({error.name}); retry")
    if error == ErrorCode.producer_fenced:
        return ErrorCode.invalid_producer_epoch, "the producer's epoch is fenced"
    if error == ErrorCode.invalid_txn_state:
        if new_client:
            return ErrorCode.transaction_abortable, ("the transaction cannot take this partition now; "
                                             "abort it")
        return error, "the transaction is not ongoing or does not hold this partition"
    return error, f"the transaction coordinator refused the batch: {error.name}"


def offset_commit_error(error: ErrorCode) -> ErrorCode:
    """The TxnOffsetCommit answer for a verification error (KIP-890: the retriable ones become
    COORDINATOR_NOT_AVAILABLE; INVALID_TXN_STATE and INVALID_PRODUCER_ID_MAPPING are fatal)."""
    if error in _RETRIABLE:
        return ErrorCode.coordinator_not_available
    if error == ErrorCode.producer_fenced:
        return ErrorCode.invalid_producer_epoch
    return error


@dataclass
class _Ask:
    transactional_id: str
    producer_id: int
    producer_epoch: int
    verify_only: bool
    partitions: list[TP]
    future: asyncio.Future = field(repr=False)


class CoordinatorLookup(Protocol):
    def coordinator_of(self, name: str, key: str) -> tuple[ErrorCode | None, int]: ...


class LocalCoordinator(Protocol):
    async def add_partitions(self, transactional_id: str, producer_id: int,
                             producer_epoch: int, wanted: list[TP], *, version: int,
                             verify_only: bool = False, txn_version: int | None = None
                             ) -> dict[TP, ErrorCode | None]: ...


class RequestSender(Protocol):
    async def request(self, node_id: int, request: Any, timeout_s: float = 30.0,
                      purpose: str = "control") -> Any: ...


class TxnVerifier:
    def __init__(self, *, enabled: bool, node_id: int, metadata: CoordinatorLookup,
                 coordinator: LocalCoordinator, client: RequestSender) -> None:
        """``metadata``: where each transactional id's coordinator is; ``coordinator``: this
        broker's transaction coordinator; ``client``: requests to the other brokers."""
        self.enabled = enabled  # transaction.partition.verification.enable
        self._node_id = node_id
        self._metadata = metadata
        self._coordinator = coordinator
        self._client = client
        self._waiting: list[_Ask] = []
        self._tasks: set[asyncio.Task] = set()
        # Metrics (KIP-890): VerificationTimeMs and VerificationFailureRate.
        self.count = 0
        self.total_ms = 0.0
        self.max_ms = 0.0
        self.failures = 0

    def applies(self, new_client: bool) -> bool:
        """Whether a transactional write of this kind of client goes through the coordinator:
        always for transaction version 2 (the partition must be added), for older clients
        when verification is on."""
        return new_client or self.enabled

    async def check(self, transactional_id: str, producer_id: int, producer_epoch: int,
                    partitions: list[TP], *, add: bool,
                    renew: Callable[[], None] | None = None) -> dict[TP, ErrorCode | None]:
        """Verify (``add`` False) or add the partitions; the coordinator's error of each.
        CONCURRENT_TRANSACTIONS (the coordinator is still writing another change of the same
        transaction, e.g. the partition another leader added a moment ago) is retried here
        for a short while, as Kafka's AddPartitionsToTxnManager does, instead of sending the
        client into its retry backoff."""
        started = time.monotonic()
        loop = asyncio.get_running_loop()
        backoff = CONCURRENT_RETRY_BACKOFF_S
        while True:
            ask = _Ask(transactional_id, producer_id, producer_epoch, not add,
                       list(partitions), loop.create_future())
            if not self._waiting:
                loop.call_soon(self._send)
            self._waiting.append(ask)
            try:
                result: dict[TP, ErrorCode | None] = await ask.future
            except Exception as exc:  # noqa: BLE001 - a coordinator bug must not kill the produce
                log.error("transaction verification for %r failed: %s", transactional_id, exc)
                result = {tp: ErrorCode.coordinator_not_available for tp in partitions}
            if ErrorCode.concurrent_transactions not in result.values() or \
                    time.monotonic() - started + backoff > CONCURRENT_RETRY_MAX_S:
                break
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 0.1)
            if renew is not None:
                renew()
        elapsed = (time.monotonic() - started) * 1000
        self.count += 1
        self.total_ms += elapsed
        self.max_ms = max(self.max_ms, elapsed)
        if any(result.values()):
            self.failures += 1
        return result

    def _send(self) -> None:
        waiting, self._waiting = self._waiting, []
        # To the broker that leads the transactional id's partition of __transaction_state
        # (None: this broker, in process).
        by_node: dict[int | None, list[_Ask]] = {}
        for ask in waiting:
            try:
                err, found = self._metadata.coordinator_of(TRANSACTION_STATE,
                                                                ask.transactional_id)
            except TopicError:
                err, found = ErrorCode.coordinator_not_available, -1
            if err is not None:
                if not ask.future.done():
                    ask.future.set_result({tp: err for tp in ask.partitions})
                continue
            node = None if found == self._node_id else found
            by_node.setdefault(node, []).append(ask)
        for node, asks in by_node.items():
            # One request entry per transactional id (the request's map key); a second ask for
            # the same id in this round goes out in a request of its own.
            rounds: list[dict[str, _Ask]] = []
            for ask in asks:
                for r in rounds:
                    if ask.transactional_id not in r:
                        r[ask.transactional_id] = ask
                        break
                else:
                    rounds.append({ask.transactional_id: ask})
            for r in rounds:
                task = asyncio.get_running_loop().create_task(self._ask(list(r.values()), node))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

    async def _ask(self, asks: list[_Ask], node: int | None = None) -> None:
        """One round of asks: to this broker's transaction coordinator in process (``node``
        None), else as one AddPartitionsToTxn request to the coordinator's broker."""
        try:
            if node is None:
                answers = [await self._coordinator.add_partitions(
                    a.transactional_id, a.producer_id, a.producer_epoch, a.partitions,
                    version=VERIFY_VERSION, verify_only=a.verify_only,
                    txn_version=None if a.verify_only else 2) for a in asks]
            else:
                response = await self._client.request(
                    node, self._request(asks), 30.0)
                answers = [self._answered(response, a) for a in asks]
        except Exception as exc:  # noqa: BLE001 - handed to the waiting requests
            for a in asks:
                if not a.future.done():
                    a.future.set_exception(exc)
            return
        for a, found in zip(asks, answers, strict=True):
            result = {tp: found.get(tp, ErrorCode.coordinator_not_available) for tp in a.partitions}
            if not a.future.done():
                a.future.set_result(result)

    @staticmethod
    def _request(asks: list[_Ask]) -> Any:
        """AddPartitionsToTxn v5 (verifyOnly per transaction), one entry per ask."""
        mod = request_module(ApiKey.ADD_PARTITIONS_TO_TXN, VERIFY_VERSION)
        transactions = []
        for a in asks:
            by_topic: dict[str, list[int]] = {}
            for t, p in a.partitions:
                by_topic.setdefault(t, []).append(p)
            transactions.append(make(
                mod.AddPartitionsToTxnTransaction, transactional_id=a.transactional_id,
                producer_id=a.producer_id, producer_epoch=a.producer_epoch,
                verify_only=a.verify_only,
                topics=tuple(make(mod.AddPartitionsToTxnTopic, name=t, partitions=tuple(ps))
                             for t, ps in by_topic.items())))
        return make(mod.AddPartitionsToTxnRequest, transactions=tuple(transactions))

    @staticmethod
    def _answered(response: Any, ask: _Ask) -> dict[TP, ErrorCode | None]:
        """The coordinator's error of each partition of one ask, from its response."""
        found: dict[TP, ErrorCode | None] = {}
        r = next((r for r in response.results_by_transaction
                  if r.transactional_id == ask.transactional_id), None)
        for t in (r.topic_results if r else ()):
            for p in t.results_by_partition:
                code = p.partition_error_code
                found[(t.name, p.partition_index)] = code if code else None
        return found

    def close(self) -> None:
        for t in self._tasks:
            t.cancel()

    def metric_samples(self):
        from .metrics import COUNTER, Sample, summary

        yield Sample("oncelog_txn_verification_total",
                     "transaction verifications and implicit partition adds (KIP-890)",
                     self.count, type=COUNTER)
        yield from summary("oncelog_txn_verification_time_seconds",
                           "VerificationTimeMs: time spent verifying",
                           self.total_ms / 1000, self.count)
        yield Sample("oncelog_txn_verification_time_max_seconds",
                     "VerificationTimeMs: the longest verification", self.max_ms / 1000)
        yield Sample("oncelog_txn_verification_failures_total",
                     "VerificationFailureRate: verifications that failed (a counter; its rate "
                     "is the failure rate)", self.failures, type=COUNTER)
