"""The three roles of a workload client process, over any ClientAdapter.

- ``queue``: Jepsen's queue workload. A seeded mix of ``send`` (one value to a random key, by
  the idempotent producer, acks=all), ``poll`` (the consumer, read_committed; its offsets
  committed to the group afterwards) and ``txn`` (a transaction of sends to random keys and
  polls, the polled offsets sent to the transaction; committed, or aborted now and then: an
  aborted transaction is a ``fail``), with ``assign`` (a random subset of the keys, now and
  then another) or ``subscribe`` consumers.
- ``copier``: consume-transform-produce exactly once: poll the input keys, send each value to
  its output key, send the offsets to the transaction, commit: one ``txn`` op per transaction;
  after --duration it goes on until its input has been quiet for --idle-stop-s (caught up).
- ``drain``: every key from the beginning, read_committed, up to the high watermark asked
  before (read_uncommitted); its polls, then the ``drain_end`` meta line.

After a transaction that polled ends in anything but a commit, the consumer is rewound to the
last committed position of each key (the group's committed offset, or what this process last
read in an operation that completed, whichever is further): without that, the next
transaction would skip the records the aborted one read (what KAFKA-17582 asks of
applications). A transactional producer that is fenced or failed fatally, or whose
transaction's end is unknown, is closed and replaced by a new one with the same
transactional.id; the workload goes on.
"""

from __future__ import annotations

import argparse
import itertools
import random
import time
from typing import Any

from .base import ClientAdapter, OpError, Record
from .history import HistoryFile, Key, Op, split_key


def _reads(records: list[Record]) -> dict[Key, list[list[Any]]]:
    out: dict[Key, list[list[Any]]] = {}
    for k, offset, value in records:
        out.setdefault(k, []).append([offset, value])
    return out


def _next_offsets(records: list[Record]) -> dict[Key, int]:
    out: dict[Key, int] = {}
    for k, offset, _ in records:
        out[k] = max(out.get(k, 0), offset + 1)
    return out


class Role:
    def __init__(self, adapter: ClientAdapter, args: argparse.Namespace,
                 history: HistoryFile) -> None:
        self.a = adapter
        self.args = args
        self.h = history
        self.rng = random.Random(f"{args.seed}-{args.process}")
        # until the client is ready (init_transactions may be retried that long); then
        # ``ready`` moves it to --duration seconds from then
        self.deadline = time.monotonic() + max(30.0, args.duration)
        self.values = itertools.count(args.index * 10**9)
        self.safe: dict[Key, int] = {}  # per key: the next offset after the last ok op's reads
        self.rebalances: list[list[Any]] = []
        self.stopped = False

    def run(self) -> None:
        raise NotImplementedError

    def ready(self) -> None:
        if not self.stopped:
            self.deadline = time.monotonic() + self.args.duration

    def stop(self) -> None:
        """Start no other operation (SIGTERM)."""
        self.stopped = True
        self.deadline = 0.0

    # -- pieces shared by the roles --------------------------------------------------------

    def client_meta(self, fields: dict[str, Any] | None = None) -> None:
        self.h.meta("client", kind=self.a.kind, role=self.args.role,
                    transactional_id=self.args.transactional_id, group=self.args.group,
                    poll_mode=self.args.poll_mode, **(fields or {}))

    def init_txn(self, reset: bool = False) -> None:
        """init_transactions (again, with a new producer, when ``reset``), until it works or
        the run is over; each success writes a client meta line with what it negotiated."""
        while True:
            try:
                fields = self.a.txn_reset() if reset else self.a.txn_init()
            except OpError as exc:
                if time.monotonic() > self.deadline:
                    return
                self.h.meta("client", error=f"init_transactions: {exc}")
                reset = True
                time.sleep(0.2)
                continue
            self.client_meta({**fields, "init": "reset" if reset else "first"})
            return

    def on_rebalance(self, event: str, keys: list[Key]) -> None:
        self.rebalances.append([event, keys])
        if event in ("revoked", "lost"):
            for k in keys:
                self.safe.pop(k, None)

    def _extra(self) -> dict[str, Any]:
        """Fields for the completion of the op during which the group rebalanced."""
        if not self.rebalances:
            return {}
        extra = {"rebalance": self.rebalances}
        self.rebalances = []
        return extra

    def rewind(self) -> dict[str, int | str]:
        """Back to the last committed positions (see the module's docstring); where each key
        went ("beginning" when nothing was committed or read)."""
        keys = self.a.assignment()
        committed: dict[Key, int | None] = {}
        if self.args.group is not None and keys:
            try:
                committed = self.a.committed(keys)
            except OpError:
                committed = {}
        went: dict[str, int | str] = {}
        for k in keys:
            known = [o for o in (committed.get(k), self.safe.get(k)) if o is not None]
            try:
                if known:
                    self.a.seek(k, max(known))
                    went[k] = max(known)
                else:
                    self.a.seek_to_beginning([k])
                    went[k] = "beginning"
            except OpError as exc:
                went[k] = f"seek failed: {exc}"
        return went

    def abort_quietly(self) -> None:
        try:
            self.a.txn_abort()
        except OpError as exc:
            if exc.reset:
                self.init_txn(reset=True)

    def transaction(self, op: Op, micro: list[list[Any]], abort: bool,
                    polled: list[Record] | None = None) -> None:
        """Run the micro-ops ``micro`` (["send", key, value] / ["poll"]) in a transaction and
        complete ``op``. ``polled``: records a copier polled before the transaction began (its
        first micro-op is their ["poll"])."""
        done: list[list[Any]] = []
        handles: list[tuple[int, Any]] = []
        read: list[Record] = list(polled or [])
        if polled is not None:
            done.append(["poll", _reads(polled)])
        error: OpError | None = None
        try:
            self.a.txn_begin()
            for m in micro[len(done):]:
                if m[0] == "send":
                    handles.append((len(done), self.a.txn_send(m[1], m[2])))
                    done.append(["send", m[1], [-1, m[2]]])
                else:
                    records = self.a.poll(self.args.poll_ms / 1000)
                    read += records
                    done.append(["poll", _reads(records)])
            if read and self.args.group is not None:
                self.a.txn_send_offsets(_next_offsets(read))
            if self.args.txn_hold_ms:
                # the sends written, the transaction held open: the window in which the
                # client-crash fault kills the process
                self.a.txn_flush(self.args.op_timeout)
                time.sleep(self.args.txn_hold_ms / 1000)
        except OpError as exc:
            error = exc
        # the micro-ops not run: sends with offset -1, polls without a result
        value = done + [["send", m[1], [-1, m[2]]] if m[0] == "send" else list(m)
                        for m in micro[len(done):]]
        if error is not None or abort:
            if error is not None and error.reset:
                self.init_txn(reset=True)
            else:
                self.abort_quietly()
            went = self.rewind() if read else {}
            op.fail(value, str(error) if error else "aborted by the workload",
                    **({"rewound": went} if went else {}), **self._extra())
            return
        try:
            self.a.txn_commit()
        except OpError as exc:
            if exc.reset:
                self.init_txn(reset=True)
            went = self.rewind() if read else {}
            op.complete("fail" if exc.definite else "info", value, str(exc),
                        **({"rewound": went} if went else {}), **self._extra())
            return
        for i, handle in handles:
            done[i][2][0] = self.a.txn_offset(handle)
        self.safe.update(_next_offsets(read))
        op.ok(done, **self._extra())

    def poll_op(self) -> None:
        op = self.h.invoke("poll", [["poll"]])
        try:
            records = self.a.poll(self.args.poll_ms / 1000)
        except OpError as exc:
            op.fail([["poll"]], str(exc), **self._extra())
            return
        extra = self._extra()
        offsets = _next_offsets(records)
        if offsets and self.args.group is not None:
            try:
                self.a.commit(offsets)
            except OpError as exc:
                extra["commit_error"] = str(exc)
        self.safe.update(offsets)
        op.ok([["poll", _reads(records)]], **extra)

    def send_op(self, k: Key) -> None:
        value = next(self.values)
        op = self.h.invoke("send", [["send", k, value]])
        try:
            offset = self.a.send(k, value)
        except OpError as exc:
            op.complete("fail" if exc.definite else "info", [["send", k, [-1, value]]],
                        str(exc))
            return
        op.ok([["send", k, [offset, value]]])

    def start_consuming(self, keys: list[Key]) -> None:
        if self.args.poll_mode == "subscribe":
            topics = sorted({split_key(k)[0] for k in keys})
            op = self.h.invoke("subscribe", topics)
            self.a.subscribe(topics, self.on_rebalance)
            op.ok(topics)
        else:
            self.assign_op(keys)

    def assign_op(self, keys: list[Key]) -> None:
        op = self.h.invoke("assign", keys)
        self.a.assign(keys)
        self.safe = {}
        went = self.rewind()  # the group's committed offsets, or the beginning
        op.ok(keys, positions=went)


class Queue(Role):
    def run(self) -> None:
        keys = list(self.args.keys)
        txn_ratio = self.args.txn_ratio
        self.a.open_consumer()
        if txn_ratio > 0:
            self.init_txn()
        else:
            self.client_meta()
        self.start_consuming(self._subset(keys))
        if self.args.poll_mode == "subscribe":
            # ready once the group gave this member its partitions (its polls until then
            # are operations too), or after --op-timeout
            joined = time.monotonic() + self.args.op_timeout
            while not self.a.assignment() and time.monotonic() < min(joined, self.deadline):
                self.poll_op()
        self.ready()
        for n in itertools.count(1):
            if time.monotonic() >= self.deadline:
                break
            if self.args.poll_mode == "assign" and n % self.args.reassign_every == 0:
                self.assign_op(self._subset(keys))
                continue
            if self.rng.random() < txn_ratio:
                micro: list[list[Any]] = []
                for _ in range(self.rng.randint(1, self.args.max_txn_ops)):
                    if self.rng.random() < 0.6:
                        micro.append(["send", self.rng.choice(keys), next(self.values)])
                    else:
                        micro.append(["poll"])
                abort = self.rng.random() < self.args.abort_ratio
                op = self.h.invoke("txn", micro, txn=True)
                self.transaction(op, micro, abort)
            elif self.rng.random() < 0.5:
                self.send_op(self.rng.choice(keys))
            else:
                self.poll_op()

    def _subset(self, keys: list[Key]) -> list[Key]:
        if self.args.poll_mode == "subscribe":
            return keys
        return sorted(self.rng.sample(keys, self.rng.randint(1, len(keys))))


class Copier(Role):
    def run(self) -> None:
        inputs, outputs = list(self.args.input), list(self.args.output)
        if len(inputs) != len(outputs):
            raise SystemExit("--input and --output name as many keys (in:0 is copied to the "
                             "first output key, ...)")
        copies = dict(zip(inputs, outputs, strict=True))
        self.a.open_consumer()
        self.init_txn()
        self.start_consuming(inputs)
        self.ready()
        last_read = time.monotonic()
        # after --duration, on until nothing came for --idle-stop-s (caught up)
        while time.monotonic() < self.deadline \
                or (not self.stopped and time.monotonic() - last_read < self.args.idle_stop_s):
            started = time.monotonic_ns()
            try:
                records = self.a.poll(self.args.poll_ms / 1000)
            except OpError:
                continue  # nothing read, nothing to copy
            if not records:
                continue
            last_read = time.monotonic()
            micro: list[list[Any]] = [["poll"]]
            micro += [["send", copies[k], value] for k, _offset, value in records]
            abort = self.rng.random() < self.args.abort_ratio
            op = self.h.invoke("txn", micro, txn=True, at=started)
            self.transaction(op, micro, abort, polled=records)


class Drain(Role):
    def run(self) -> None:
        keys = list(self.args.keys)
        deadline = time.monotonic() + self.args.timeout
        self.client_meta()
        ends: dict[Key, int] | None = None
        while ends is None:
            try:
                ends = self.a.end_offsets(keys)
            except OpError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        self.a.open_consumer()
        op = self.h.invoke("assign", keys)
        self.a.assign(keys)
        self.a.seek_to_beginning(keys)
        op.ok(keys)
        reached = dict.fromkeys(keys, 0)
        while time.monotonic() < deadline \
                and any(reached[k] < ends[k] for k in keys):
            started = time.monotonic_ns()
            try:
                records = self.a.poll(0.2)
            except OpError:
                records = []
            if records:
                self.h.invoke("poll", [["poll"]], at=started).ok([["poll", _reads(records)]])
            for k, offset in _next_offsets(records).items():
                reached[k] = max(reached[k], offset)
            for k in keys:
                if reached[k] < ends[k]:
                    try:
                        reached[k] = max(reached[k], self.a.position(k))
                    except OpError:
                        pass
        self.h.meta("drain_end", {k: {"reached": reached[k], "end": ends[k]} for k in keys})


ROLES: dict[str, type[Role]] = {"queue": Queue, "copier": Copier, "drain": Drain}
