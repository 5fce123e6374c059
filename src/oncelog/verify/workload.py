"""The workload: transactional writers, then read_committed readers, all recorded in a History.

Writers (threads) loop: begin, send a few records (unique values ``writer:txn:i``) to several
partitions, then commit, or abort at random; every send's and every end's outcome goes into the
history. Three kinds of writer:

- ``oncelog``: our Producer (transaction version 2 when the broker offers it);
- ``confluent``: confluent-kafka's (librdkafka's) transactional producer;
- ``raw``: RawTxnWriter, a bare-wire client; ``raw-old`` forces the old protocol (no epoch bump
  per transaction), as an older client would speak it to any broker.

When the writers have stopped, each reader assigns itself every partition, seeks to the
beginning and reads with read_committed until its position reaches the high watermark (asked
with read_uncommitted) everywhere, or until ``read_timeout`` passes: a hanging transaction holds
the last stable offset back and the reader ends stuck.
"""

from __future__ import annotations

import logging
import os
import random
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..client import Consumer, KafkaTimeoutError, Producer, TopicPartition
from ..errors import FatalError, KafkaError
from .history import (
    History,
    PartitionEnd,
    Read,
    ReaderEnd,
    Seek,
    SendOutcome,
    Txn,
    TxnOutcome,
    Write,
)
from .raw_writer import RawTxnWriter

log = logging.getLogger("oncelog.verify.workload")

WRITER_KINDS = ("oncelog", "confluent", "raw", "raw-old")


@dataclass
class WorkloadConfig:
    topic: str = "verify"
    partitions: int = 3
    writers: list[str] = field(default_factory=lambda: ["oncelog", "oncelog"])
    readers: int = 2
    records_per_txn: int = 4
    abort_probability: float = 0.2
    request_timeout_ms: int = 1500  # short: a held request is given up, then arrives late
    transaction_timeout_ms: int = 10_000
    read_timeout: float = 20.0
    seed: int = 0
    run_id: str = "v"


class _Writer:
    """One writer thread's loop; subclasses talk to one client library."""

    kind = ""

    def __init__(self, name: str, bootstrap: str, cfg: WorkloadConfig, history: History,
                 stop: threading.Event) -> None:
        self.name = name
        self.bootstrap = bootstrap
        self.cfg = cfg
        self.history = history
        self.stop = stop
        self.transactional_id = f"{cfg.run_id}-{name}"
        self.rng = random.Random(f"{cfg.seed}-{name}")
        self.txn = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.open()
            while not self.stop.is_set():
                self.one_transaction()
                self.txn += 1
        except BaseException as exc:
            log.exception("writer %s failed", self.name)
            self.error = exc
        finally:
            self.close()

    def one_transaction(self) -> None:
        n = self.txn
        planned = [(self.rng.randrange(self.cfg.partitions), f"{self.name}:{n}:{i}")
                   for i in range(self.cfg.records_per_txn)]
        commit = self.rng.random() >= self.cfg.abort_probability
        sends, outcome, detail = self.transaction(planned, commit)
        for (partition, value), send in zip(planned, sends, strict=True):
            self.history.add(Write(self.name, n, value, self.cfg.topic, partition, send,
                                   self.transactional_id))
        self.history.add(Txn(self.name, n, outcome, self.transactional_id, detail))

    def open(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def transaction(self, planned: list[tuple[int, str]], commit: bool
                    ) -> tuple[list[SendOutcome], TxnOutcome, str]:
        raise NotImplementedError


class OncelogWriter(_Writer):
    kind = "oncelog"
    producer: Producer | None = None

    def open(self) -> None:
        self.producer = Producer(
            bootstrap_servers=self.bootstrap, transactional_id=self.transactional_id,
            request_timeout_ms=self.cfg.request_timeout_ms, linger_ms=2,
            delivery_timeout_ms=self.cfg.request_timeout_ms * 2 + 2,
            transaction_timeout_ms=self.cfg.transaction_timeout_ms, max_block_ms=20_000)
        self.producer.init_transactions(30)

    def close(self) -> None:
        if self.producer is not None:
            self.producer.close(5)
            self.producer = None

    def _reopen(self) -> None:
        self.close()
        while not self.stop.is_set():
            try:
                self.open()
                return
            except KafkaError as exc:
                log.info("writer %s: init_transactions failed (%s); again", self.name, exc)
                self.close()
                time.sleep(0.2)

    def transaction(self, planned: list[tuple[int, str]], commit: bool
                    ) -> tuple[list[SendOutcome], TxnOutcome, str]:
        p = self.producer
        if p is None:
            self._reopen()
            return ["failed"] * len(planned), "aborted", "no producer"
        futures: list[Any] = []
        outcome: TxnOutcome
        detail = ""
        try:
            p.begin_transaction()
            for partition, value in planned:
                futures.append(p.send(self.cfg.topic, value.encode(), partition=partition))
            if commit:
                p.commit_transaction(30)
                outcome = "committed"
            else:
                p.abort_transaction(30)
                outcome = "aborted"
        except (FatalError, KafkaTimeoutError) as exc:
            # fenced, or the commit/abort did not answer: indeterminate for a commit
            outcome, detail = ("unknown" if commit else "aborted"), repr(exc)
            self._reopen()
        except KafkaError as exc:
            detail = repr(exc)
            try:
                p.abort_transaction(30)
                outcome = "aborted"
            except KafkaError as exc2:
                outcome, detail = "aborted", f"{detail}; abort: {exc2!r}"
                self._reopen()  # InitProducerId fences it: aborted for good
        sends = [_future_outcome(f) for f in futures]
        sends += ["failed"] * (len(planned) - len(sends))
        return sends, outcome, detail


def _future_outcome(future: Any) -> SendOutcome:
    if not future.done():
        return "unknown"
    exc = future.exception()
    if exc is None:
        return "ok"
    return "unknown" if isinstance(exc, KafkaTimeoutError | TimeoutError) else "failed"


class ConfluentWriter(_Writer):
    kind = "confluent"
    producer: Any = None

    def open(self) -> None:
        from confluent_kafka import Producer as CProducer

        conf: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap, "transactional.id": self.transactional_id,
            "request.timeout.ms": self.cfg.request_timeout_ms, "linger.ms": 2,
            "message.timeout.ms": self.cfg.request_timeout_ms * 2,
            "transaction.timeout.ms": self.cfg.transaction_timeout_ms,
            "metadata.recovery.strategy": "none"}
        # Diagnostics: ONCELOG_VERIFY_RDKAFKA_DEBUG=<contexts> logs librdkafka's debug output
        # (e.g. "eos,broker,protocol") to the "oncelog.verify.rdkafka" logger.
        debug = os.environ.get("ONCELOG_VERIFY_RDKAFKA_DEBUG")
        if debug:
            conf.update({"debug": debug,
                         "logger": logging.getLogger(f"oncelog.verify.rdkafka.{self.name}")})
        self.producer = CProducer(conf)
        self.producer.init_transactions(30)

    def close(self) -> None:
        if self.producer is not None:
            self.producer.flush(2)
            self.producer = None

    def transaction(self, planned: list[tuple[int, str]], commit: bool
                    ) -> tuple[list[SendOutcome], TxnOutcome, str]:
        from confluent_kafka import KafkaError as CKafkaError
        from confluent_kafka import KafkaException

        p = self.producer
        sends: list[SendOutcome] = ["unknown"] * len(planned)

        def delivered(i: int) -> Callable[[Any, Any], None]:
            def cb(err: Any, _msg: Any) -> None:
                if err is None:
                    sends[i] = "ok"
                elif err.code() in (CKafkaError._MSG_TIMED_OUT, CKafkaError._PURGE_INFLIGHT,
                                    CKafkaError._TIMED_OUT):
                    sends[i] = "unknown"
                else:
                    sends[i] = "failed"
            return cb

        outcome: TxnOutcome
        detail = ""
        try:
            p.begin_transaction()
            for i, (partition, value) in enumerate(planned):
                p.produce(self.cfg.topic, value.encode(), partition=partition,
                          on_delivery=delivered(i))
            if commit:
                for _attempt in range(5):
                    try:
                        p.commit_transaction(30)
                        break
                    except KafkaException as exc:
                        if not exc.args[0].retriable():
                            raise
                else:
                    raise TimeoutError("commit did not succeed after 5 attempts")
                outcome = "committed"
            else:
                p.abort_transaction(30)
                outcome = "aborted"
        except (KafkaException, TimeoutError) as exc:
            err = exc.args[0] if exc.args else None
            detail = repr(exc)
            if getattr(err, "txn_requires_abort", lambda: False)():
                outcome = "aborted"
                try:
                    p.abort_transaction(30)
                except KafkaException as exc2:
                    # An earlier attempt's EndTxn(commit) may have been written (the abort is
                    # then refused, INVALID_TXN_STATE, fatal in librdkafka): undecided.
                    detail = f"{detail}; abort: {exc2!r}"
                    if commit:
                        outcome = "unknown"
                    self._recreate()
            else:
                outcome = "unknown" if commit else "aborted"
                self._recreate()
        if self.producer is not None:
            self.producer.poll(0)
        return sends, outcome, detail

    def _recreate(self) -> None:
        self.producer = None
        while not self.stop.is_set():
            try:
                self.open()
                return
            except Exception as exc:  # noqa: BLE001 (librdkafka raises KafkaException)
                log.info("writer %s: init_transactions failed (%s); again", self.name, exc)
                time.sleep(0.2)


class RawWriter(_Writer):
    kind = "raw"
    protocol = "auto"
    writer: RawTxnWriter | None = None

    def open(self) -> None:
        self.writer = RawTxnWriter(self.bootstrap, self.transactional_id, self.protocol,
                                   request_timeout=self.cfg.request_timeout_ms / 1000,
                                   transaction_timeout_ms=self.cfg.transaction_timeout_ms)
        self.writer.init()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()

    def transaction(self, planned: list[tuple[int, str]], commit: bool
                    ) -> tuple[list[SendOutcome], TxnOutcome, str]:
        w = self.writer
        assert w is not None
        w.begin()
        sends: list[SendOutcome] = []
        for partition, value in planned:
            # after a failed send, the rest of the transaction is not sent
            sends.append("failed" if w.failed else w.send(self.cfg.topic, partition, [value]))
        return sends, w.end(commit), ""


class RawOldWriter(RawWriter):
    kind = "raw-old"
    protocol = "old"


WRITERS: dict[str, type[_Writer]] = {"oncelog": OncelogWriter, "confluent": ConfluentWriter,
                                     "raw": RawWriter, "raw-old": RawOldWriter}


def run_writers(bootstrap: str, cfg: WorkloadConfig, history: History, duration: float,
                progress: Callable[[str], None] | None = None,
                during: Callable[[float], None] | None = None) -> list[BaseException]:
    """Run the writers for ``duration`` seconds; ``during(elapsed)`` is called about every 0.5 s
    (faults such as a broker restart hook in there). Returns the writers' unexpected errors."""
    stop = threading.Event()
    writers = [WRITERS[kind](f"{kind}-{i}", bootstrap, cfg, history, stop)
               for i, kind in enumerate(cfg.writers)]
    threads = [threading.Thread(target=w.run, name=f"writer-{w.name}", daemon=True)
               for w in writers]
    for t in threads:
        t.start()
    started = time.monotonic()
    last_report = started
    watch = _StallWatch(writers, progress)
    while (elapsed := time.monotonic() - started) < duration:
        time.sleep(min(0.5, max(0.0, duration - elapsed)))
        if during is not None:
            during(time.monotonic() - started)
        if progress is not None and time.monotonic() - last_report >= 2:
            last_report = time.monotonic()
            done = sum(1 for op in history.ops if isinstance(op, Txn))
            progress(f"  {time.monotonic() - started:5.1f}s: {done} transactions ended")
        watch.check(time.monotonic() - started)
    stop.set()
    for t in threads:
        t.join(90)
    return [w.error for w in writers if w.error is not None]


class _StallWatch:
    """Diagnostics: when a writer has ended no transaction for ``STALL_S`` seconds (longer than
    a transaction may take with the verify timeouts), the stacks of every thread of this
    process (the writer's and its client's) go to the progress lines, once per stall."""

    STALL_S = 12.0

    def __init__(self, writers: list[_Writer], progress: Callable[[str], None] | None) -> None:
        self.writers = writers
        self.progress = progress
        self.seen = {w.name: (w.txn, 0.0) for w in writers}
        self.reported: set[str] = set()

    def check(self, elapsed: float) -> None:
        for w in self.writers:
            txn, since = self.seen[w.name]
            if w.txn != txn:
                self.seen[w.name] = (w.txn, elapsed)
                self.reported.discard(w.name)
            elif elapsed - since >= self.STALL_S and w.name not in self.reported:
                self.reported.add(w.name)
                self.report(w, elapsed - since)

    def report(self, writer: _Writer, stalled_for: float) -> None:
        lines = [(f"writer {writer.name}: no transaction ended for {stalled_for:.0f} s "
                  f"(in transaction {writer.txn}); the threads' stacks:")]
        names = {t.ident: t.name for t in threading.enumerate()}
        for ident, frame in sys._current_frames().items():
            lines.append(f"  thread {names.get(ident, ident)}:")
            lines += ["    " + line.rstrip() for entry in traceback.format_stack(frame)
                      for line in entry.splitlines()]
        text = "\n".join(lines)
        log.warning("%s", text)
        if self.progress is not None:
            self.progress(text)


def read_all(bootstrap: str, cfg: WorkloadConfig, history: History, name: str) -> ReaderEnd:
    """One read_committed reader over every partition, from the beginning to the high
    watermark (or until ``cfg.read_timeout``); its reads go into ``history``."""
    tps = [TopicPartition(cfg.topic, p) for p in range(cfg.partitions)]
    with Consumer(bootstrap_servers=bootstrap, isolation_level="read_uncommitted") as c:
        ends = c.end_offsets(tps, timeout=30)
    with Consumer(bootstrap_servers=bootstrap, isolation_level="read_committed",
                  auto_offset_reset="earliest", fetch_max_wait_ms=100) as c:
        c.assign(tps)
        c.seek_to_beginning()
        for tp in tps:
            history.add(Seek(name, tp.topic, tp.partition, 0))
        deadline = time.monotonic() + cfg.read_timeout
        positions = dict.fromkeys(tps, 0)
        while time.monotonic() < deadline:
            for r in c.poll(0.2):
                history.add(Read(name, r.topic, r.partition, r.offset,
                                 (r.value or b"").decode(errors="replace")))
            positions = {tp: c.position(tp) for tp in tps}
            if all(positions[tp] >= ends[tp] for tp in tps):
                break
    end = ReaderEnd(name, tuple(PartitionEnd(tp.topic, tp.partition, positions[tp], ends[tp])
                                for tp in tps))
    history.add(end)
    return end


def run_readers(bootstrap: str, cfg: WorkloadConfig, history: History) -> None:
    """``cfg.readers`` readers at once (threads)."""
    threads = [threading.Thread(target=read_all, args=(bootstrap, cfg, history, f"reader-{i}"),
                                daemon=True) for i in range(cfg.readers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(cfg.read_timeout + 60)
