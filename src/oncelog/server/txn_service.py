"""The transaction coordinator's IO: carries out what txn/coordinator.py decides.

- ``WriteTxnLog``: append the transactional id's record to its partition of
  ``__transaction_state`` (Kafka's ``abs(hash) % transaction.state.log.num.partitions``);
- ``SendMarkers``: a WriteTxnMarkers request per transaction, through the same handler a
  remote coordinator's request reaches (server/handlers/txn_markers.py), retried for the
  partitions that could not take it yet, until every marker is written; then the transaction
  completes.

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
from ..txn.coordinator import Effect, SendMarkers, TransactionCoordinator, WriteTxnLog
from ..txn.log_format import (
    TxnLogFormatError,
    decode_key,
    decode_value,
    encode_key,
    encode_value,
)
from ..txn.state import TransactionMetadata
from .clock import now_ms
from .topics import TRANSACTION_STATE, coordinator_partition

log = logging.getLogger("oncelog.txn")

EPOCH_FILE = "txn-coordinator-epoch"
MARKER_RETRY_S = 0.1
# Marker errors after which retrying cannot help, and the partition is done: the topic is
# gone, or a newer producer epoch or coordinator already ended the transaction there.
_FINAL_MARKER_ERRORS = {"unknown_topic_or_partition", "invalid_producer_epoch",
                        "transaction_coordinator_fenced"}


class TxnService:
    def __init__(self, broker) -> None:
        self.broker = broker
        cfg = broker.config
        self.num_partitions = cfg.int("transaction.state.log.num.partitions")
        self.core = TransactionCoordinator(
            allocate_producer_id=broker.producer_ids.next_producer_id,
            max_timeout_ms=cfg.int("transaction.max.timeout.ms"),
            expiration_ms=cfg.int("transactional.id.expiration.ms"),
            coordinator_epoch=self._bump_coordinator_epoch(Path(broker.data_dir)),
            two_phase_commit_enabled=cfg.flag("transaction.two.phase.commit.enable"))
        # KIP-915/KIP-890: flexible records (with the previous/next producer ids) from
        # transaction.version 1 on; Kafka's original version 0 below.
        self.log_value_version = 1 if cfg.int("transaction.version") >= 1 else 0
        self.abort_interval_ms = cfg.int(
            "transaction.abort.timed.out.transaction.cleanup.interval.ms")
        self.expire_interval_ms = cfg.int(
            "transaction.remove.expired.transaction.cleanup.interval.ms")
        self._tasks: set[asyncio.Task] = set()
        self._timer: asyncio.Task | None = None
        self._recovery: list[Effect] = []

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
            for h, records in p.log.iter_records():
                if h.is_control:
                    continue
                for r in records:
                    try:
                        txn_id = decode_key(r.key or b"")
                        yield txn_id, (None if r.value is None
                                       else decode_value(txn_id, r.value))
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
            self._spawn(self.core.abort_timed_out(now))
            if now - last_expire >= self.expire_interval_ms:
                last_expire = now
                self._spawn(self.core.expire(now))

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        for t in self._tasks:
            t.cancel()

    # -- carrying effects out -----------------------------------------------------------------

    def execute(self, effects: list[Effect]) -> bool:
        """Carry out a request's effects: its log write now (False if it failed: the change
        is dropped and the client should retry), what follows in the background."""
        ok = True
        for e in effects:
            if isinstance(e, WriteTxnLog):
                ok = self._append(e)
                self._spawn(self.core.write_done(e.transactional_id, ok))
                if not ok:
                    return False
            else:
                self._spawn([e])
        return ok

    def _spawn(self, effects: list[Effect]) -> None:
        if not effects:
            return
        task = asyncio.get_running_loop().create_task(self._drive(effects))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _drive(self, effects: list[Effect]) -> None:
        queue = list(effects)
        while queue:
            e = queue.pop(0)
            if isinstance(e, WriteTxnLog):
                ok = self._append(e)
                queue.extend(self.core.write_done(e.transactional_id, ok))
            else:
                await self._send_markers(e)
                queue.extend(self.core.markers_done(e.transactional_id, now_ms()))

    def _append(self, e: WriteTxnLog) -> bool:
        topic = self.broker.topics.ensure_internal(TRANSACTION_STATE, now_ms())
        index = coordinator_partition(e.transactional_id, topic.partition_count)
        now = now_ms()
        value = None if e.metadata is None else encode_value(e.metadata, self.log_value_version)
        data = bytearray(build_batch([(encode_key(e.transactional_id), value, (), now)]))
        try:
            topic.partitions[index].log.append(data, split_batches(data), now)
        except (LogAppendError, LogWriteError) as exc:
            log.error("transaction log write for %r failed: %s", e.transactional_id, exc)
            return False
        return True

    async def _send_markers(self, e: SendMarkers) -> None:
        """spec 000 step 5.2: WriteTxnMarkers to the partition leaders (this broker), retried
        until every partition has its marker."""
        from .broker import RequestContext  # the broker imports this module
        from .handlers.txn_markers import handle_write_txn_markers

        left = set(e.partitions)
        mod = request_module(ApiKey.WRITE_TXN_MARKERS, 1)
        ctx = RequestContext(RequestHeader(ApiKey.WRITE_TXN_MARKERS, 1, 0, "txn-coordinator", 0),
                             "txn-coordinator")
        while left:
            by_topic: dict[str, list[int]] = {}
            for t, p in sorted(left):
                by_topic.setdefault(t, []).append(p)
            request = make(mod.WriteTxnMarkersRequest, markers=(make(
                mod.WritableTxnMarker, producer_id=e.producer_id,
                producer_epoch=e.producer_epoch, transaction_result=e.commit,
                coordinator_epoch=e.coordinator_epoch,
                topics=tuple(make(mod.WritableTxnMarkerTopic, name=t, partition_indexes=tuple(ps))
                             for t, ps in by_topic.items())),))
            response = await handle_write_txn_markers(self.broker, ctx, request)
            for t in response.markers[0].topics:
                for p in t.partitions:
                    name = p.error_code.name if p.error_code else None
                    if name is None or name in _FINAL_MARKER_ERRORS:
                        if name is not None:
                            log.warning("marker for %r on %s-%d: %s (not retried)",
                                        e.transactional_id, t.name, p.partition_index, name)
                        left.discard((t.name, p.partition_index))
            if left:
                await asyncio.sleep(MARKER_RETRY_S)

    # -- metrics ------------------------------------------------------------------------------

    def metric_samples(self):
        from .metrics import Sample

        yield Sample("oncelog_active_transactional_ids",
                     "transactional ids the transaction coordinator holds",
                     len(self.core.transactions))
        # KIP-939: kafka.server:type=transaction-coordinator-metrics,
        # name=active-transaction-open-time-max
        yield Sample("oncelog_active_transaction_open_time_max_ms",
                     "how long the oldest open transaction has been open (ms)",
                     self.core.longest_open_ms(now_ms()))
