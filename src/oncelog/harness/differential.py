"""A differential test: the same request sequences sent to a real Apache Kafka and to oncelog,
their answers compared field by field.

    python -m oncelog.harness.differential --seed 1 --sequences 200 \\
        [--kafka HOST:PORT] [--oncelog HOST:PORT] [--slow] [--kip939] [--flows F,G]
        [--first N] [--print-steps] [--json report.json]

Without ``--kafka`` (``--oncelog``) the command starts a Kafka (an oncelog broker) of its own,
configured as below, and stops it at the end. The exit status is 0 when every answer matched.

A seeded generator builds each sequence from symbolic names (topics, transactional ids, groups);
each broker gets the same sequence under a run token of its own prefixing every name, so that a
shared Kafka (the test session's) starts every sequence from a clean state. The requests are
built with kio's classes at explicit API versions (``V`` below) and answered frames are decoded
by oncelog's own decoder, so reading Kafka's answers is itself a check of the decoder.

What legitimately differs is normalised before the comparison (``Normaliser``): producer ids,
and member ids become symbols in order of first appearance (so "the same id as before" still
compares), topic ids are compared as present or not, node ids, hosts, ports, cluster and
controller ids, throttle times and broker clocks (log-append times other than a record's own,
control batches' timestamps, transaction start times) are left out, and Kafka's free-text
error messages are dropped while error CODES are compared exactly. Fetched record sets are
decoded: every whole batch's offsets, producer, sequence, flags, records (key, value, headers,
timestamp) and control type are compared. Lists in an order of Kafka's hash maps are sorted.
The differences docs/kafka-compatibility.md keeps are recognised as such (``_deliberate``) and
counted apart; any other difference fails the run.

Kafka does some things in the background that oncelog does inline (metadata propagation after
CreateTopics/DeleteTopics, transaction markers after EndTxn); "settle" steps wait on a condition
on both brokers (polled with a deadline) and are not compared.

The brokers run alike (``KAFKA_SETTINGS`` is the harness Kafka's, and ``ONCELOG_SETTINGS``
matches it): num.partitions=1, auto.create.topics.enable=true, group.initial.rebalance.delay.ms=0,
and with ``--slow`` a 1 s transaction-timeout sweep (transaction.abort.timed.out.transaction
.cleanup.interval.ms) so that the timed-out transaction flow runs in seconds; with
``--kip939`` two-phase commit (and Kafka's unreleased API versions, for InitProducerId v6).
Steps at an API version the Kafka does not serve are not sent to either broker.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import enum
import itertools
import json
import random
import socket
import struct
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..protocol import (
    ApiKey,
    ProtocolError,
    decode_response,
    encode_request,
    make,
    millis,
    request_module,
)
from ..records import build_batch, decode_batch, iter_batches, parse_control_record
from ..records.batch import batch_crc

__all__ = ["FLOWS", "KAFKA_SETTINGS", "ONCELOG_SETTINGS", "Difference", "Normaliser", "Report", "S",
           "Side", "Step", "W", "compare_runs", "generate", "main", "run"]

# The API versions every request is sent at (both brokers support them; Kafka 4.x has dropped
# the oldest versions of several APIs).
V = {
    "produce": 9, "produce_tv2": 12, "fetch": 12, "list_offsets": 7, "metadata": 12,
    "create_topics": 7, "delete_topics": 6, "create_partitions": 3, "describe_configs": 4,
    "incremental_alter_configs": 1, "init_producer_id": 4, "init_producer_id_tv2": 5,
    "init_producer_id_2pc": 6, "add_partitions": 3, "add_offsets": 3, "end_txn": 4,
    "end_txn_tv2": 5, "txn_offset_commit": 3, "txn_offset_commit_tv2": 5, "find_coordinator": 4,
    "join_group": 5, "sync_group": 5, "heartbeat": 4, "leave_group": 5, "offset_commit": 8,
    "offset_fetch": 8, "describe_transactions": 0, "api_versions": 3,
}

KAFKA_SETTINGS = {"num.partitions": "1", "auto.create.topics.enable": "true",
                  "group.initial.rebalance.delay.ms": "0"}
ONCELOG_SETTINGS = dict(KAFKA_SETTINGS)
SLOW_SETTINGS = {"transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000"}
# --kip939: two-phase commit on both; Kafka 4.3 serves InitProducerId v6 only with its
# unreleased API versions enabled.
KIP939_KAFKA_SETTINGS = {"unstable.api.versions.enable": "true",
                         "transaction.two.phase.commit.enable": "true"}
KIP939_ONCELOG_SETTINGS = {"transaction.two.phase.commit.enable": "true"}

TXN_TIMEOUT_MS = 60_000
SESSION_TIMEOUT_MS = 10_000


# -- the wire ---------------------------------------------------------------------------------


class Closed(Exception):
    """The broker closed the connection instead of answering."""


class Wire:
    def __init__(self, bootstrap: str, timeout: float = 30.0) -> None:
        host, port = bootstrap.split(",")[0].rsplit(":", 1)
        self.address = (host, int(port))
        self.timeout = timeout
        self.sock: socket.socket | None = None
        self.correlation = itertools.count(1)

    def _connect(self) -> socket.socket:
        if self.sock is None:
            self.sock = socket.create_connection(self.address, timeout=self.timeout)
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return self.sock

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    def _recv(self, n: int) -> bytes:
        assert self.sock is not None
        out = bytearray()
        while len(out) < n:
            try:
                chunk = self.sock.recv(n - len(out))
            except (ConnectionResetError, BrokenPipeError):
                chunk = b""
            if not chunk:
                self.close()
                raise Closed()
            out += chunk
        return bytes(out)

    def send(self, request: Any) -> int:
        cid = next(self.correlation)
        try:
            self._connect().sendall(encode_request(cid, "differential", request))
        except (ConnectionResetError, BrokenPipeError) as exc:
            self.close()
            raise Closed() from exc
        return cid

    def request(self, request: Any) -> Any:
        cid = self.send(request)
        (size,) = struct.unpack(">i", self._recv(4))
        got, response = decode_response(type(request).__api_key__, type(request).__version__,
                                        self._recv(size))
        if got != cid:
            raise AssertionError(f"correlation id {got}, expected {cid}")
        return response


# -- steps and the generator --------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    """One operation on symbolic names; ``settle`` steps wait on a condition and are not
    compared."""

    op: str
    args: dict[str, Any] = field(default_factory=dict)
    settle: bool = False

    def describe(self) -> str:
        return f"{self.op}({', '.join(f'{k}={v!r}' for k, v in self.args.items())})"


def S(op: str, **args: Any) -> Step:
    return Step(op, args)


def W(op: str, **args: Any) -> Step:
    return Step(op, args, settle=True)


class Gen:
    """Builds the steps of one sequence, numbered ``n`` (names are unique per sequence)."""

    def __init__(self, rng: random.Random, n: int, slow: bool) -> None:
        self.rng = rng
        self.n = n
        self.slow = slow
        self.steps: list[Step] = []
        self._topics = itertools.count()

    def add(self, *steps: Step) -> None:
        self.steps.extend(steps)

    def topic(self, partitions: int = 1, configs: dict[str, str] | None = None) -> str:
        name = f"s{self.n}t{next(self._topics)}"
        self.add(S("create_topics", topics=[(name, partitions, 1, configs or {})]),
                 W("topic_ready", topic=name, partitions=partitions))
        return name

    def records(self, count: int | None = None) -> int:
        return count if count is not None else self.rng.randint(1, 4)

    # each flow adds the steps of one scenario --------------------------------------------

    def flow_admin(self) -> None:
        r = self.rng
        t = f"s{self.n}a"
        parts = r.randint(1, 3)
        configs = r.choice([{}, {"cleanup.policy": "compact"}, {"retention.ms": "3600000"},
                            {"max.message.bytes": "5000", "segment.bytes": "1048576"}])
        self.add(S("create_topics", topics=[(t, parts, 1, configs)], validate_only=True),
                 S("create_topics", topics=[(t, parts, 1, configs)]),
                 W("topic_ready", topic=t, partitions=parts),
                 S("create_topics", topics=[(t, 1, 1, {})]))
        bad = r.sample([
            ("@long", 1, 1, {}), ("!..", 1, 1, {}), ("!.", 1, 1, {}), ("!", 1, 1, {}),
            (f"s{self.n}x/y", 1, 1, {}), (f"s{self.n}bad", 0, 1, {}),
            (f"s{self.n}rf", 1, 3, {}), (f"s{self.n}cfg", 1, 1, {"cleanup.policy": "bogus"}),
            (f"s{self.n}unk", 1, 1, {"no.such.config": "1"}),
            (f"s{self.n}neg", 1, 1, {"retention.ms": "-5"}),
            (f"s{self.n}seg", 1, 1, {"segment.bytes": "10"}),
            (f"s{self.n}ms", 1, 1, {"min.insync.replicas": "2"}),
        ], 3)
        self.add(S("create_topics", topics=bad))
        if r.random() < 0.5:  # '.' and '_' collide in metric names: Kafka refuses the second
            self.add(S("create_topics", topics=[(f"s{self.n}c.d", 1, 1, {})]),
                     W("topic_ready", topic=f"s{self.n}c.d", partitions=1),
                     S("create_topics", topics=[(f"s{self.n}c_d", 1, 1, {})]))
        self.add(S("metadata", topics=[t, f"s{self.n}nope"], auto_create=False))
        keys = ["cleanup.policy", "retention.ms", "max.message.bytes", "segment.bytes",
                "min.insync.replicas", "message.timestamp.type", "compression.type"]
        self.add(S("describe_configs", topic=t, keys=r.sample(keys, 3)))
        alter: list[tuple[str, int, str | None]] = r.choice([
            [("retention.ms", 0, "7200000")], [("retention.ms", 1, None)],
            [("cleanup.policy", 2, "compact")], [("cleanup.policy", 3, "delete")],
            [("retention.ms", 0, "abc")], [("no.such.config", 0, "1")],
            [("max.message.bytes", 0, "2000"), ("segment.bytes", 1, None)],
        ])
        self.add(S("alter_configs", topic=t, ops=alter, validate_only=r.random() < 0.2),
                 S("describe_configs", topic=t, keys=[a[0] for a in alter]),
                 S("alter_configs", topic=f"s{self.n}nope", ops=[("retention.ms", 0, "1000")]))
        new = parts + r.randint(0, 2)
        validate_only = r.random() < 0.3
        self.add(S("create_partitions", topic=t, count=new, validate_only=validate_only))
        if new != parts and not validate_only:
            self.add(W("topic_ready", topic=t, partitions=new))
        self.add(S("create_partitions", topic=t, count=1),
                 S("create_partitions", topic=f"s{self.n}nope", count=2),
                 S("delete_topics", topics=[t, f"s{self.n}nope"]),
                 W("topic_gone", topic=t),
                 S("metadata", topics=[t], auto_create=False),
                 S("delete_topics", topics=[t]))

    def flow_autocreate(self) -> None:
        t = f"s{self.n}auto"
        self.add(S("metadata", topics=[t], auto_create=False))
        if self.rng.random() < 0.5:  # the request that creates it: the topic is not ready yet
            self.add(S("metadata", topics=[t], auto_create=True))
        if self.rng.random() < 0.3:
            self.add(S("metadata", topics=[f"s{self.n}in/valid"], auto_create=True))
        self.add(W("metadata_autocreate", topic=t),
                 S("metadata", topics=[t], auto_create=False),
                 S("produce", topic=f"s{self.n}never", partition=0, batch={"n": 1}, acks=-1))

    def flow_produce(self) -> None:
        r = self.rng
        t = self.topic(partitions=r.randint(1, 2), configs=r.choice(
            [{}, {"max.message.bytes": "3000"}]))
        for _ in range(r.randint(3, 8)):
            kind = r.choice(["good", "good", "good", "crc", "magic", "delta", "big", "unknown_p",
                             "acks0", "acks0_bad", "acks1", "count", "timestamp"])
            p = r.randint(0, 1) if kind != "unknown_p" else 7
            acks = {"acks0": 0, "acks0_bad": 0, "acks1": 1}.get(kind, -1)
            mutate = {"crc": "crc", "magic": "magic", "delta": "delta", "acks0_bad": "crc",
                      "count": "count", "timestamp": "timestamp"}.get(kind)
            batch = {"n": self.records(), "mutate": mutate,
                     "size": 6000 if kind == "big" else 0}
            self.add(S("produce", topic=t, partition=p, batch=batch, acks=acks))
        self.list_and_fetch(t, r.randint(0, 1))

    def list_and_fetch(self, t: str, p: int) -> None:
        r = self.rng
        self.add(S("list_offsets", topic=t, partition=p, timestamp=-2),
                 S("list_offsets", topic=t, partition=p, timestamp=-1),
                 S("list_offsets", topic=t, partition=p, timestamp=-1, isolation=1),
                 S("list_offsets", topic=t, partition=p, timestamp=-3),
                 S("list_offsets", topic=t, partition=p, timestamp=r.choice([0, 2, 5])))
        for _ in range(r.randint(1, 3)):
            self.add(S("fetch", topic=t, partition=p, offset=r.choice([0, 0, 1, 2, 3, 50, -1]),
                       isolation=r.randint(0, 1),
                       max_bytes=r.choice([1 << 20, 1 << 20, 100, 200])))

    def flow_idempotent(self) -> None:
        r = self.rng
        t = self.topic()
        pid = "p"
        n = self.records()
        self.add(S("init_pid", pid=pid, txn=None),
                 S("produce", topic=t, partition=0, acks=-1,
                   batch={"n": n, "pid": pid, "seq": 0}))
        seq = n
        for _ in range(r.randint(2, 6)):
            kind = r.choice(["next", "next", "next", "dup", "gap", "old_epoch", "new_epoch",
                             "unknown_pid", "neg_seq"])
            n = self.records()
            if kind == "next":
                self.add(S("produce", topic=t, partition=0, acks=-1,
                           batch={"n": n, "pid": pid, "seq": seq}))
                seq += n
            elif kind == "dup" and seq:
                self.add(S("produce", topic=t, partition=0, acks=-1,
                           batch={"n": n, "pid": pid, "seq": max(0, seq - n)}))
            elif kind == "gap":
                self.add(S("produce", topic=t, partition=0, acks=-1,
                           batch={"n": n, "pid": pid, "seq": seq + 3}))
            elif kind == "old_epoch":
                self.add(S("produce", topic=t, partition=0, acks=-1,
                           batch={"n": n, "pid": pid, "seq": seq, "epoch_delta": -1}))
            elif kind == "new_epoch":
                self.add(S("produce", topic=t, partition=0, acks=-1,
                           batch={"n": n, "pid": pid, "seq": r.choice([0, 5]),
                                  "epoch_delta": 1}))
            elif kind == "unknown_pid":  # at sequence 0: see docs/kafka-compatibility.md
                self.add(S("produce", topic=t, partition=0, acks=-1,
                           batch={"n": n, "pid": pid, "seq": 0, "pid_delta": 1000}))
            elif kind == "neg_seq":
                self.add(S("produce", topic=t, partition=0, acks=-1,
                           batch={"n": n, "pid": pid, "seq": -1}))
        self.list_and_fetch(t, 0)

    def flow_txn(self) -> None:
        """Transaction version 1: AddPartitionsToTxn v3, Produce v9, EndTxn v4."""
        r = self.rng
        t = self.topic(partitions=2)
        x = f"s{self.n}x"
        group = f"s{self.n}g"
        self.add(W("coordinator", key=x, key_type=1), S("find_coordinator", key=x, key_type=1),
                 S("init_pid", pid="a", txn=x))
        seqs = {0: 0, 1: 0}
        for round_ in range(r.randint(1, 3)):
            chosen = r.sample([0, 1], r.randint(1, 2))
            if r.random() < 0.2:  # produce before adding the partition
                self.add(S("produce", topic=t, partition=chosen[0], acks=-1, txn=x,
                           batch={"n": 1, "pid": "a", "seq": seqs[chosen[0]], "txn": True}))
            extra = [(f"s{self.n}nope", 0)] if r.random() < 0.15 else []
            self.add(S("add_partitions", pid="a", txn=x, partitions=[(t, p) for p in chosen]
                       + extra))
            if extra:
                self.add(S("add_partitions", pid="a", txn=x,
                           partitions=[(t, p) for p in chosen]))
            for p in chosen:
                n = self.records()
                self.add(S("produce", topic=t, partition=p, acks=-1, txn=x,
                           batch={"n": n, "pid": "a", "seq": seqs[p], "txn": True}))
                seqs[p] += n
            if r.random() < 0.4:
                self.add(W("coordinator", key=group, key_type=0),
                         S("add_offsets", pid="a", txn=x, group=group),
                         S("txn_offset_commit", pid="a", txn=x, group=group,
                           offsets=[(t, 0, r.randint(0, 5))]))
            twist = r.choice(["commit", "commit", "abort", "fence", "concurrent", "twice",
                              "wrong_epoch"])
            if twist == "fence":
                self.add(S("init_pid", pid="b", txn=x, until_ok=True),
                         W("txn_state", txn=x, states=["Empty", "CompleteAbort"]),
                         S("add_partitions", pid="a", txn=x, partitions=[(t, 0)]),
                         S("produce", topic=t, partition=0, acks=-1, txn=x,
                           batch={"n": 1, "pid": "a", "seq": seqs[0], "txn": True}),
                         S("end_txn", pid="a", txn=x, commit=True))
                self.settle_txn(x)
                self.fetch_both(t, 0)
                return
            if twist == "concurrent":
                self.add(S("init_pid", pid="a", txn=x, until_ok=True),
                         S("end_txn", pid="a", txn=x, commit=True))
                self.settle_txn(x)
                seqs = {0: 0, 1: 0}
                continue
            if twist == "wrong_epoch":
                self.add(S("end_txn", pid="a", txn=x, commit=True, epoch_delta=1))
            commit = twist != "abort"
            self.add(S("end_txn", pid="a", txn=x, commit=commit))
            self.settle_txn(x)
            if twist == "twice":
                self.add(S("end_txn", pid="a", txn=x, commit=commit),
                         S("end_txn", pid="a", txn=x, commit=not commit))
            self.add(S("describe_transactions", txn=x))
        self.fetch_both(t, r.randint(0, 1))
        self.add(W("coordinator", key=group, key_type=0),
                 S("offset_fetch", group=group, offsets=[(t, 0), (t, 1)], stable=True))

    def flow_txn_v2(self) -> None:
        """Transaction version 2 (KIP-890): implicit adds by Produce v12, EndTxn v5 bumps the
        epoch, TxnOffsetCommit v5; InitProducerId v6 (KIP-939) with and without 2PC."""
        r = self.rng
        t = self.topic(partitions=2)
        x = f"s{self.n}v"
        group = f"s{self.n}h"
        self.add(W("coordinator", key=x, key_type=1),
                 S("init_pid", pid="a", txn=x, version=V["init_producer_id_tv2"]))
        if r.random() < 0.5:
            self.add(S("init_pid", pid="a", txn=x, version=V["init_producer_id_2pc"],
                       enable2pc=r.random() < 0.5, keep_prepared=r.random() < 0.5))
        for _ in range(r.randint(1, 3)):
            seqs = {0: 0, 1: 0}
            for p in r.sample([0, 1], r.randint(1, 2)):
                n = self.records()
                self.add(S("produce", topic=t, partition=p, acks=-1, txn=x,
                           version=V["produce_tv2"],
                           batch={"n": n, "pid": "a", "seq": seqs[p], "txn": True}))
                seqs[p] += n
            if r.random() < 0.4:
                self.add(W("coordinator", key=group, key_type=0),
                         S("txn_offset_commit", pid="a", txn=x, group=group,
                           version=V["txn_offset_commit_tv2"],
                           offsets=[(t, r.randint(0, 1), r.randint(0, 9))]))
            twist = r.choice(["commit", "abort", "twice", "old_epoch", "concurrent", "fence",
                              "keep_prepared"])
            if twist == "keep_prepared":  # KIP-939: a restarted producer keeps the transaction
                self.add(S("init_pid", pid="b", txn=x, version=V["init_producer_id_2pc"],
                           enable2pc=True, keep_prepared=r.random() < 0.8, until_ok=True),
                         S("describe_transactions", txn=x),
                         S("end_txn", pid="b", txn=x, commit=r.random() < 0.5,
                           version=V["end_txn_tv2"]))
                self.settle_txn(x)
                self.add(S("describe_transactions", txn=x))
                break
            if twist == "fence":  # another producer takes the id over; the first one ends
                self.add(S("init_pid", pid="b", txn=x, version=V["init_producer_id_tv2"],
                           until_ok=True),
                         W("txn_state", txn=x, states=["Empty", "CompleteAbort"]),
                         S("end_txn", pid="a", txn=x, commit=r.random() < 0.5,
                           version=V["end_txn_tv2"]),
                         S("produce", topic=t, partition=0, acks=-1, txn=x,
                           version=V["produce_tv2"],
                           batch={"n": 1, "pid": "a", "seq": 0, "txn": True}),
                         S("describe_transactions", txn=x))
                break
            if twist == "concurrent":
                self.add(S("init_pid", pid="a", txn=x, version=V["init_producer_id_tv2"],
                           until_ok=True))
                self.settle_txn(x)
                continue
            commit = twist != "abort"
            self.add(S("end_txn", pid="a", txn=x, commit=commit, version=V["end_txn_tv2"]))
            self.settle_txn(x)
            if twist == "twice":
                self.add(S("end_txn", pid="a", txn=x, commit=commit, version=V["end_txn_tv2"],
                           epoch_delta=-1),
                         S("end_txn", pid="a", txn=x, commit=commit, version=V["end_txn_tv2"]))
                self.settle_txn(x)
            elif twist == "old_epoch":
                self.add(S("produce", topic=t, partition=0, acks=-1, txn=x,
                           version=V["produce_tv2"],
                           batch={"n": 1, "pid": "a", "seq": 0, "txn": True,
                                  "epoch_delta": -1}))
        self.add(S("describe_transactions", txn=x))
        self.fetch_both(t, r.randint(0, 1))
        self.add(W("coordinator", key=group, key_type=0),
                 S("offset_fetch", group=group, offsets=[(t, 0), (t, 1)], stable=True))

    def flow_open_txn(self) -> None:
        """Fetches of a partition with an open transaction, at both isolation levels."""
        r = self.rng
        t = self.topic()
        x = f"s{self.n}o"
        self.add(W("coordinator", key=x, key_type=1), S("init_pid", pid="a", txn=x),
                 S("produce", topic=t, partition=0, acks=-1, batch={"n": 2}),
                 S("add_partitions", pid="a", txn=x, partitions=[(t, 0)]),
                 S("produce", topic=t, partition=0, acks=-1, txn=x,
                   batch={"n": self.records(), "pid": "a", "seq": 0, "txn": True}),
                 S("produce", topic=t, partition=0, acks=-1, batch={"n": 1}))
        self.list_and_fetch(t, 0)
        self.add(S("end_txn", pid="a", txn=x, commit=r.random() < 0.5))
        self.settle_txn(x)
        self.fetch_both(t, 0)

    def flow_timeout(self) -> None:
        """A transaction the coordinator aborts when its timeout passes."""
        t = self.topic()
        x = f"s{self.n}z"
        self.add(W("coordinator", key=x, key_type=1),
                 S("init_pid", pid="a", txn=x, timeout_ms=1000),
                 S("add_partitions", pid="a", txn=x, partitions=[(t, 0)]),
                 S("produce", topic=t, partition=0, acks=-1, txn=x,
                   batch={"n": 2, "pid": "a", "seq": 0, "txn": True}),
                 W("txn_state", txn=x, states=["CompleteAbort", "Empty"]),
                 S("end_txn", pid="a", txn=x, commit=True),
                 S("produce", topic=t, partition=0, acks=-1, txn=x,
                   batch={"n": 1, "pid": "a", "seq": 2, "txn": True}),
                 S("describe_transactions", txn=x),
                 S("init_pid", pid="a", txn=x, version=self.rng.choice([4, 5])),  # KIP-360
                 S("describe_transactions", txn=x))
        self.fetch_both(t, 0)

    def flow_group(self) -> None:
        r = self.rng
        t = self.topic(partitions=2)
        g = f"s{self.n}g"
        ptype = r.choice(["consumer", "diff"])
        self.add(W("coordinator", key=g, key_type=0), S("find_coordinator", key=g, key_type=0))
        if r.random() < 0.3:  # a simple (standalone) commit before anyone joins
            self.add(S("offset_commit", group=g, member=None, generation=-1,
                       offsets=[(t, 0, 3)]))
        self.add(S("join_group", group=g, member="m", protocol_type=ptype, topics=[t]),
                 S("sync_group", group=g, member="m", protocol_type=ptype, topics=[t]))
        for _ in range(r.randint(2, 6)):
            kind = r.choice(["hb", "hb_bad_gen", "hb_unknown", "commit", "commit_bad_gen",
                             "commit_unknown", "commit_simple", "fetch", "rejoin", "sync_bad",
                             "commit_unknown_topic", "txn_commit"])
            if kind == "hb":
                self.add(S("heartbeat", group=g, member="m"))
            elif kind == "hb_bad_gen":
                self.add(S("heartbeat", group=g, member="m", gen_delta=r.choice([-1, 1])))
            elif kind == "hb_unknown":
                self.add(S("heartbeat", group=g, member="nobody"))
            elif kind == "commit":
                self.add(S("offset_commit", group=g, member="m",
                           offsets=[(t, r.randint(0, 1), r.randint(0, 100))]))
            elif kind == "commit_bad_gen":
                self.add(S("offset_commit", group=g, member="m", gen_delta=1,
                           offsets=[(t, 0, 7)]))
            elif kind == "commit_unknown":
                self.add(S("offset_commit", group=g, member="nobody", offsets=[(t, 0, 7)]))
            elif kind == "commit_simple":
                self.add(S("offset_commit", group=g, member=None, generation=-1,
                           offsets=[(t, 0, 9)]))
            elif kind == "commit_unknown_topic":
                self.add(S("offset_commit", group=g, member="m",
                           offsets=[(f"s{self.n}nope", 0, 1), (t, 5, 1)]))
            elif kind == "fetch":
                self.add(S("offset_fetch", group=g, offsets=[(t, 0), (t, 1)],
                           stable=r.random() < 0.5))
            elif kind == "rejoin":
                self.add(S("join_group", group=g, member="m", protocol_type=ptype, topics=[t]),
                         S("sync_group", group=g, member="m", protocol_type=ptype, topics=[t]))
            elif kind == "sync_bad":
                self.add(S("sync_group", group=g, member="m", protocol_type=ptype, topics=[t],
                           gen_delta=1))
            elif kind == "txn_commit":  # offsets committed in a transaction, for the member
                x = f"s{self.n}gx"
                self.add(W("coordinator", key=x, key_type=1), S("init_pid", pid="t", txn=x),
                         S("add_offsets", pid="t", txn=x, group=g),
                         S("txn_offset_commit", pid="t", txn=x, group=g, member="m",
                           gen_delta=r.choice([0, 0, 1]), offsets=[(t, 1, r.randint(0, 50))]),
                         S("end_txn", pid="t", txn=x, commit=r.random() < 0.7))
                self.settle_txn(x)
                self.add(S("offset_fetch", group=g, offsets=[(t, 1)], stable=True))
        self.add(S("leave_group", group=g, member="m"),
                 S("heartbeat", group=g, member="m"),
                 S("offset_commit", group=g, member="m", offsets=[(t, 0, 11)]),
                 S("offset_fetch", group=g, offsets=[(t, 0), (t, 1)], stable=False),
                 S("offset_fetch", group=f"s{self.n}nogroup", offsets=[(t, 0)], stable=False))

    # helpers --------------------------------------------------------------------------------

    def settle_txn(self, x: str) -> None:
        self.add(W("txn_state", txn=x,
                   states=["CompleteCommit", "CompleteAbort", "Empty", "Ongoing"]))

    def fetch_both(self, t: str, p: int) -> None:
        self.add(S("list_offsets", topic=t, partition=p, timestamp=-1),
                 S("list_offsets", topic=t, partition=p, timestamp=-1, isolation=1),
                 S("fetch", topic=t, partition=p, offset=0, isolation=0),
                 S("fetch", topic=t, partition=p, offset=0, isolation=1))


FLOWS = ["admin", "autocreate", "produce", "idempotent", "txn", "txn_v2", "open_txn", "group"]
SLOW_FLOWS = ["timeout"]


def generate(seed: int, sequences: int, *, slow: bool = False, first: int = 0,
             flows: list[str] | None = None) -> list[list[Step]]:
    """``sequences`` sequences of steps, a function of the seed alone; sequence ``i`` draws
    its flows (of ``flows``, default all) from a generator seeded by (seed, i), so a
    sequence can be replayed alone."""
    out = []
    if flows is None:
        flows = FLOWS + (SLOW_FLOWS if slow else [])
    for i in range(first, first + sequences):
        rng = random.Random(f"{seed}/{i}")
        gen = Gen(rng, i, slow)
        for name in rng.sample(flows, rng.randint(1, min(2, len(flows)))):
            getattr(gen, "flow_" + name)()
        out.append(gen.steps)
    return out


# -- normalising answers --------------------------------------------------------------------------

_DROP = {"throttle_time_ms", "throttle_time", "error_message", "documentation", "cluster_id", "host", "port",
         "brokers", "controller_id", "node_endpoints", "transaction_start_time_ms",
         "cluster_authorized_operations", "rack"}
# Deliberate differences (docs/kafka-compatibility.md, "Differential test").
KEPT_3X_TOPIC_CONFIGS = {"message.format.version", "message.downconversion.enable",
                         "message.timestamp.difference.max.ms"}
_NODE = {"node_id", "leader_id", "replica_nodes", "isr_nodes", "offline_replicas",
         "eligible_leader_replicas", "last_known_elr", "preferred_read_replica", "coordinator_id"}


class Normaliser:
    """Turns a decoded answer into plain data with what legitimately differs taken out; ids
    become symbols in order of first appearance (per broker), names lose the run's prefix."""

    def __init__(self, prefix: str, base_ms: int = 0) -> None:
        self.prefix = prefix
        self.base_ms = base_ms
        self.symbols: dict[tuple[str, Any], str] = {}

    def symbol(self, kind: str, value: Any) -> str:
        key = (kind, value)
        if key not in self.symbols:
            self.symbols[key] = f"{kind}{sum(1 for k in self.symbols if k[0] == kind)}"
        return self.symbols[key]

    def __call__(self, value: Any, name: str = "") -> Any:
        if name in _NODE:
            if isinstance(value, tuple):
                return ["node" if v >= 0 else v for v in value]
            return "node" if isinstance(value, int) and value >= 0 else value
        if name == "producer_id" and isinstance(value, int):
            return self.symbol("pid", value) if value >= 0 else value
        if name == "topic_id":  # a topic's id is random: whether there is one is compared
            return "0" if value is None or value == uuid.UUID(int=0) else "id"
        if name in ("member_id", "leader") and isinstance(value, str):
            return self.symbol("member", value) if value else ""
        if name in ("log_append_time_ms", "log_append_time") and value not in (-1, None):
            # a broker's clock, unless it is one of the run's own record timestamps
            ms = millis(value) if isinstance(value, _dt.datetime) else value
            return ms if self.base_ms <= ms < self.base_ms + 3_600_000 else "time"
        if name == "records" and isinstance(value, (bytes, bytearray, memoryview)):
            return self.records(bytes(value))
        if name == "configs" and isinstance(value, tuple):
            return self.configs(value)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return {f.name: self(getattr(value, f.name), f.name)
                    for f in dataclasses.fields(value) if f.name not in _DROP}
        if isinstance(value, (tuple, list)):
            return [self(v, name) for v in value]
        if isinstance(value, enum.Enum):
            return value.value
        if isinstance(value, str):
            return value.replace(self.prefix, "~")
        if isinstance(value, (bytes, bytearray)):
            return value.hex()
        if isinstance(value, _dt.timedelta):
            return int(value.total_seconds() * 1000)
        if isinstance(value, _dt.datetime):
            return "time"
        if isinstance(value, uuid.UUID):
            return str(value)
        return value

    def configs(self, entries: tuple[Any, ...]) -> list[Any]:
        """Config entries by name (their order means nothing), without the deliberate
        differences of docs/kafka-compatibility.md: the three Kafka 3.x topic configs that
        Kafka 4.0 removed and oncelog keeps, and min.insync.replicas' source (a cluster-wide
        default that Kafka's storage format writes)."""
        out = []
        for entry in entries:
            e = self(entry)
            if isinstance(e, dict) and e.get("name") in KEPT_3X_TOPIC_CONFIGS:
                continue
            if isinstance(e, dict) and e.get("name") == "min.insync.replicas" \
                    and e.get("config_source") in (3, 5):
                e["config_source"] = "default"
            out.append(e)
        return sorted(out, key=lambda e: e.get("name", "") if isinstance(e, dict) else "")

    def records(self, data: bytes) -> dict[str, Any]:
        batches = []
        for pos, h in iter_batches(data):
            _header, recs = decode_batch(data, pos)
            b: dict[str, Any] = {
                "base_offset": h.base_offset, "last_offset_delta": h.last_offset_delta,
                "partition_leader_epoch": h.partition_leader_epoch,
                "producer_id": self(h.producer_id, "producer_id"),
                "producer_epoch": h.producer_epoch, "base_sequence": h.base_sequence,
                "attributes": h.attributes}
            if h.attributes & 0x20:  # a control batch: its timestamp is the broker's clock
                b["control"] = [parse_control_record(rec) for rec in recs]
            else:
                b["max_timestamp"] = h.max_timestamp
                b["records"] = [(rec.offset, rec.timestamp, self(rec.key), self(rec.value),
                                 [(k, self(v)) for k, v in rec.headers]) for rec in recs]
            batches.append(b)
        # The bytes of a partial batch after the last whole one are not compared: Kafka cuts
        # at the size limit, oncelog sends whole batches only (docs/kafka-compatibility.md).
        return {"batches": batches}


# -- running a sequence on one broker ------------------------------------------------------------


class SettleTimeout(Exception):
    pass


def _key(txn: str | None, pid: str) -> str:
    """A producer's key in a sequence: its symbol under its transactional id (two flows of a
    sequence may both name theirs "a")."""
    return f"{txn}/{pid}"


@dataclass
class Producer:
    producer_id: int
    epoch: int


class Side:
    """One broker's run of the sequences: its connection, its ids, its normaliser."""

    def __init__(self, label: str, bootstrap: str, prefix: str, base_ms: int,
                 settle_timeout: float = 30.0) -> None:
        self.label = label
        self.wire = Wire(bootstrap)
        self.prefix = prefix
        self.base_ms = base_ms
        self.norm = Normaliser(prefix, base_ms)
        self.producers: dict[str, Producer] = {}
        self.members: dict[tuple[str, str], str] = {}
        self.generations: dict[str, int] = {}
        self.settle_timeout = settle_timeout
        self.requests = 0

    def close(self) -> None:
        self.wire.close()

    def name(self, sym: str | None) -> str | None:
        if sym is None:
            return None
        if sym.startswith("!"):
            return sym[1:]
        if sym == "@long":
            return (self.prefix + "long").ljust(250, "x")
        return self.prefix + sym

    def call(self, request: Any) -> Any:
        self.requests += 1
        return self.wire.request(request)

    def answer(self, request: Any) -> Any:
        """The normalised answer, or "closed" when the broker hung up instead."""
        try:
            return self.norm(self.call(request))
        except Closed:
            return "closed"

    def api_versions(self) -> dict[int, int]:
        """{api key: the highest version this broker serves}."""
        mod = request_module(ApiKey.API_VERSIONS, V["api_versions"])
        answer = self.call(make(mod.ApiVersionsRequest, client_software_name="differential",
                                client_software_version="1"))
        return {int(k.api_key): int(k.max_version) for k in answer.api_keys}

    def step(self, step: Step) -> Any:
        """Run one step; a broker hanging up is an answer ("closed"), and so is a settle
        condition never reached or an answer that cannot be read (the error's name)."""
        try:
            return self.run_step(step)
        except Closed:
            return "closed"
        except (SettleTimeout, ProtocolError, OSError) as exc:
            self.wire.close()
            return f"{type(exc).__name__}: {exc}".replace(self.prefix, "~")

    def run_step(self, step: Step) -> Any:
        handler: Callable[..., Any] = getattr(self, "op_" + step.op)
        return handler(**step.args)

    def wait(self, what: str, check: Callable[[], bool]) -> None:
        deadline = time.monotonic() + self.settle_timeout
        delay = 0.01
        while not check():
            if time.monotonic() > deadline:
                raise SettleTimeout(f"{what} not reached in "
                                    f"{self.settle_timeout}s")
            time.sleep(delay)
            delay = min(0.2, delay * 2)

    # admin ---------------------------------------------------------------------------------

    def op_create_topics(self, topics, validate_only=False):
        mod = request_module(ApiKey.CREATE_TOPICS, V["create_topics"])
        return self.answer(make(mod.CreateTopicsRequest, timeout=30_000,
                                validate_only=validate_only, topics=tuple(
            make(mod.CreatableTopic, name=self.name(n), num_partitions=p, replication_factor=rf,
                 assignments=(), configs=tuple(make(mod.CreatableTopicConfig, name=k, value=v)
                                               for k, v in c.items()))
            for n, p, rf, c in topics)))

    def _metadata(self, topics, auto_create):
        mod = request_module(ApiKey.METADATA, V["metadata"])
        return self.call(make(mod.MetadataRequest, allow_auto_topic_creation=auto_create,
                              include_cluster_authorized_operations=False,
                              include_topic_authorized_operations=False,
                              topics=tuple(make(mod.MetadataRequestTopic, name=self.name(t),
                                                topic_id=None) for t in topics)))

    def op_metadata(self, topics, auto_create=False):
        try:
            return self.norm(self._metadata(topics, auto_create))
        except Closed:
            return "closed"

    def op_topic_ready(self, topic, partitions):
        """Wait until the metadata shows every partition with a leader, and the leader
        answers for each (Kafka's metadata cache can show a leader before its replica manager
        leads: NOT_LEADER_OR_FOLLOWER meanwhile)."""
        mod = request_module(ApiKey.LIST_OFFSETS, V["list_offsets"])

        def ready() -> bool:
            t = self._metadata([topic], False).topics[0]
            if not (t.error_code == 0 and len(t.partitions) == partitions
                    and all(p.error_code == 0 and p.leader_id >= 0 for p in t.partitions)):
                return False
            answer = self.call(make(mod.ListOffsetsRequest, replica_id=-1, isolation_level=0,
                                    topics=(make(mod.ListOffsetsTopic, name=self.name(topic),
                                                 partitions=tuple(make(
                                                     mod.ListOffsetsPartition, partition_index=i,
                                                     current_leader_epoch=-1, timestamp=-1)
                                                     for i in range(partitions))),)))
            return all(p.error_code == 0 for p in answer.topics[0].partitions)
        self.wait(f"topic {topic} with {partitions} partitions", ready)

    def op_topic_gone(self, topic):
        self.wait(f"topic {topic} deleted",
                  lambda: self._metadata([topic], False).topics[0].error_code == 3)

    def op_metadata_autocreate(self, topic):
        self.wait(f"topic {topic} auto-created", lambda: all(
            t.error_code == 0 and t.partitions and all(p.leader_id >= 0 for p in t.partitions)
            for t in self._metadata([topic], True).topics))

    def op_delete_topics(self, topics):
        mod = request_module(ApiKey.DELETE_TOPICS, V["delete_topics"])
        return self.by_name("responses", self.answer(make(mod.DeleteTopicsRequest, timeout=30_000, topics=tuple(
            make(mod.DeleteTopicState, name=self.name(t), topic_id=None) for t in topics))))

    @staticmethod
    def by_name(key: str, answer: Any) -> Any:
        """The answer with its list ``key`` sorted by name: Kafka's controller answers for the
        topics in an order of its own (docs/kafka-compatibility.md)."""
        if isinstance(answer, dict) and isinstance(answer.get(key), list):
            answer[key] = sorted(answer[key], key=lambda e: str(e.get("name")))
        return answer

    def op_create_partitions(self, topic, count, validate_only=False):
        mod = request_module(ApiKey.CREATE_PARTITIONS, V["create_partitions"])
        return self.answer(make(mod.CreatePartitionsRequest, timeout=30_000,
                                validate_only=validate_only, topics=(
            make(mod.CreatePartitionsTopic, name=self.name(topic), count=count,
                 assignments=None),)))

    def op_describe_configs(self, topic, keys):
        mod = request_module(ApiKey.DESCRIBE_CONFIGS, V["describe_configs"])
        return self.answer(make(mod.DescribeConfigsRequest, include_synonyms=False,
                                include_documentation=False, resources=(
            make(mod.DescribeConfigsResource, resource_type=2, resource_name=self.name(topic),
                 configuration_keys=tuple(keys)),)))

    def op_alter_configs(self, topic, ops, validate_only=False):
        mod = request_module(ApiKey.INCREMENTAL_ALTER_CONFIGS, V["incremental_alter_configs"])
        return self.answer(make(mod.IncrementalAlterConfigsRequest, validate_only=validate_only,
                                resources=(make(
            mod.AlterConfigsResource, resource_type=2, resource_name=self.name(topic),
            configs=tuple(make(mod.AlterableConfig, name=k, config_operation=op, value=v)
                          for k, op, v in ops)),)))

    # produce and fetch ---------------------------------------------------------------------

    def batch(self, n, pid=None, seq=-1, txn=False, epoch_delta=0, pid_delta=0, mutate=None,
              size=0):
        producer_id, epoch = -1, -1
        if pid is not None:
            producer_id, epoch = self._producer(pid, epoch_delta)
            producer_id += pid_delta
        self.batches = getattr(self, "batches", 0) + 1
        records = [(f"k{i}".encode(), (f"v{self.batches}-{i}-".encode() * 8)[:40]
                    + b"x" * size, [("h", f"{i}".encode())], self.base_ms + 1000 * i)
                   for i in range(n)]
        data = bytearray(build_batch(records, producer_id=producer_id, producer_epoch=epoch,
                                     base_sequence=seq, is_transactional=txn))
        if mutate == "crc":
            data[-1] ^= 0xFF
            return bytes(data)
        if mutate == "magic":
            data[16] = 1
            return bytes(data)
        if mutate == "delta":
            struct.pack_into(">i", data, 23, n + 2)
        elif mutate == "count":
            struct.pack_into(">i", data, 57, n + 1)
        elif mutate == "timestamp":
            struct.pack_into(">q", data, 27, self.base_ms - 30 * 86_400_000 * 12)
        if mutate:
            struct.pack_into(">I", data, 17, batch_crc(data, 0, len(data)))
        return bytes(data)

    def op_produce(self, topic, partition, batch, acks=-1, txn=None, version=None):
        mod = request_module(ApiKey.PRODUCE, version or V["produce"])
        if batch.get("pid") is not None:
            batch = {**batch, "pid": _key(txn, batch["pid"])}
        request = make(mod.ProduceRequest, transactional_id=self.name(txn), acks=acks,
                       timeout=30_000, topic_data=(make(
            mod.TopicProduceData, name=self.name(topic), partition_data=(
                make(mod.PartitionProduceData, index=partition, records=self.batch(**batch)),)),))
        if acks != 0:
            return self.answer(request)
        # acks=0: no answer; Kafka closes the connection when the produce failed. A request
        # behind it on the same connection tells the two apart.
        try:
            self.requests += 1
            self.wire.send(request)
            mod = request_module(ApiKey.API_VERSIONS, V["api_versions"])
            self.call(make(mod.ApiVersionsRequest, client_software_name="differential",
                           client_software_version="1"))
            return "open"
        except Closed:
            return "closed"

    def op_list_offsets(self, topic, partition, timestamp, isolation=0):
        mod = request_module(ApiKey.LIST_OFFSETS, V["list_offsets"])
        p = make(mod.ListOffsetsPartition, partition_index=partition, current_leader_epoch=-1,
                 timestamp=timestamp if timestamp < 0 else self.base_ms + 1000 * timestamp)
        return self.answer(make(mod.ListOffsetsRequest, replica_id=-1,
                                isolation_level=isolation, topics=(
            make(mod.ListOffsetsTopic, name=self.name(topic), partitions=(p,)),)))

    def op_fetch(self, topic, partition, offset, isolation=0, max_bytes=1 << 20):
        mod = request_module(ApiKey.FETCH, V["fetch"])
        p = make(mod.FetchPartition, partition=partition, current_leader_epoch=-1,
                 fetch_offset=offset, last_fetched_epoch=-1, log_start_offset=-1,
                 partition_max_bytes=max_bytes)
        return self.answer(make(mod.FetchRequest, cluster_id=None, replica_id=-1, max_wait=0,
                                min_bytes=0, max_bytes=max_bytes, isolation_level=isolation,
                                session_id=0, session_epoch=-1, rack_id="",
                                forgotten_topics_data=(), topics=(
            make(mod.FetchTopic, topic=self.name(topic), partitions=(p,)),)))

    # producers and transactions ------------------------------------------------------------

    def op_init_pid(self, pid, txn, version=None, timeout_ms=TXN_TIMEOUT_MS, until_ok=False,
                    enable2pc=False, keep_prepared=False) -> Any:
        version = version or V["init_producer_id"]
        pid = _key(txn, pid)
        mod = request_module(ApiKey.INIT_PRODUCER_ID, version)
        extra: dict[str, Any] = {}
        if version >= 3:
            current = self.producers.get(pid)
            extra = {"producer_id": current.producer_id if current else -1,
                     "producer_epoch": current.epoch if current else -1}
        if version >= 6:
            extra.update(enable2_pc=enable2pc, keep_prepared_txn=keep_prepared)
        request = make(mod.InitProducerIdRequest, transactional_id=self.name(txn),
                       transaction_timeout=timeout_ms, **extra)
        answers = []
        deadline = time.monotonic() + self.settle_timeout
        while True:
            response = self.call(request)
            if response.error_code in (14, 15, 16) and time.monotonic() < deadline:
                time.sleep(0.05)  # the coordinator still loading: retried, as clients do
                continue
            answers.append(self.norm(response))
            if response.error_code == 0:
                self.producers[pid] = Producer(response.producer_id, response.producer_epoch)
            # CONCURRENT_TRANSACTIONS (51) while the coordinator aborts the open transaction
            if not until_ok or response.error_code != 51 or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        if until_ok:  # how many retries the abort took is timing: the first and the last
            return [answers[0], answers[-1]]
        return answers[0]

    def _producer(self, pid, epoch_delta=0):
        p = self.producers.get(pid)
        return (p.producer_id, p.epoch + epoch_delta) if p else (-1, -1)

    def op_add_partitions(self, pid, txn, partitions, epoch_delta=0) -> Any:
        mod = request_module(ApiKey.ADD_PARTITIONS_TO_TXN, V["add_partitions"])
        producer_id, epoch = self._producer(_key(txn, pid), epoch_delta)
        by_topic: dict[str, list[int]] = {}
        for t, p in partitions:
            by_topic.setdefault(t, []).append(p)
        answer = self.answer(make(
            mod.AddPartitionsToTxnRequest, v3_and_below_transactional_id=self.name(txn),
            v3_and_below_producer_id=producer_id, v3_and_below_producer_epoch=epoch,
            v3_and_below_topics=tuple(make(mod.AddPartitionsToTxnTopic, name=self.name(t),
                                           partitions=tuple(ps))
                                      for t, ps in by_topic.items())))
        # Kafka answers in the order of its hash maps: compared by topic name and partition
        if isinstance(answer, dict):
            for t in answer["results_by_topic_v3_and_below"]:
                t["results_by_partition"].sort(key=lambda p: p["partition_index"])
        return self.by_name("results_by_topic_v3_and_below", answer)

    def op_add_offsets(self, pid, txn, group):
        mod = request_module(ApiKey.ADD_OFFSETS_TO_TXN, V["add_offsets"])
        producer_id, epoch = self._producer(_key(txn, pid))
        return self.answer(make(mod.AddOffsetsToTxnRequest, transactional_id=self.name(txn),
                                producer_id=producer_id, producer_epoch=epoch,
                                group_id=self.name(group)))

    def op_end_txn(self, pid, txn, commit, version=None, epoch_delta=0):
        version = version or V["end_txn"]
        mod = request_module(ApiKey.END_TXN, version)
        pid = _key(txn, pid)
        producer_id, epoch = self._producer(pid, epoch_delta)
        try:
            response = self.call(make(mod.EndTxnRequest, transactional_id=self.name(txn),
                                      producer_id=producer_id, producer_epoch=epoch,
                                      committed=commit))
        except Closed:
            return "closed"
        if version >= 5 and response.error_code == 0:  # the epoch bumped by the coordinator
            self.producers[pid] = Producer(response.producer_id, response.producer_epoch)
        return self.norm(response)

    def op_txn_offset_commit(self, pid, txn, group, offsets, version=None, member=None,
                             gen_delta=0) -> Any:
        """TxnOffsetCommit; with ``member``, for that member of the group at its generation
        (+ ``gen_delta``), as a consumer's sendOffsetsToTransaction(groupMetadata) does."""
        mod = request_module(ApiKey.TXN_OFFSET_COMMIT, version or V["txn_offset_commit"])
        producer_id, epoch = self._producer(_key(txn, pid))
        generation, member_id = -1, ""
        if member is not None:
            generation = self.generations.get(group, -1) + gen_delta
            member_id = self._member(group, member)
        by_topic: dict[str, list[tuple[int, int]]] = {}
        for t, p, o in offsets:
            by_topic.setdefault(t, []).append((p, o))
        return self.answer(make(
            mod.TxnOffsetCommitRequest, transactional_id=self.name(txn),
            group_id=self.name(group), producer_id=producer_id, producer_epoch=epoch,
            generation_id=generation, member_id=member_id, group_instance_id=None, topics=tuple(
                make(mod.TxnOffsetCommitRequestTopic, name=self.name(t), partitions=tuple(
                    make(mod.TxnOffsetCommitRequestPartition, partition_index=p,
                         committed_offset=o, committed_leader_epoch=-1, committed_metadata="")
                    for p, o in ps)) for t, ps in by_topic.items())))

    def _describe_txn(self, txn) -> dict[str, Any]:
        """DescribeTransactions, its one state as plain data (Kafka's -1 start time of a
        transactional id with no transaction begun reads as 0: protocol/negative_times.py)."""
        mod = request_module(ApiKey.DESCRIBE_TRANSACTIONS, V["describe_transactions"])
        (state,) = self.call(make(mod.DescribeTransactionsRequest,
                                  transactional_ids=(self.name(txn),))).transaction_states
        error = int(state.error_code)
        return {"error_code": error, "transactional_id": self.norm(state.transactional_id),
                "transaction_state": state.transaction_state,
                "transaction_timeout_ms": millis(state.transaction_timeout),
                # whether it has one (both keep a completed transaction's; none when Empty)
                "started": millis(state.transaction_start_time) > 0,
                "producer_id": self.norm(int(state.producer_id), "producer_id")
                if error == 0 else None,
                "producer_epoch": int(state.producer_epoch),
                "partitions": sorted((self.norm(t.topic), int(p)) for t in state.topics
                                     for p in t.partitions)}

    def op_describe_transactions(self, txn):
        return self._describe_txn(txn)

    def op_txn_state(self, txn, states):
        self.wait(f"transaction {txn} in {states}",
                  lambda: self._describe_txn(txn)["transaction_state"] in states)

    def _find_coordinator(self, key, key_type):
        mod = request_module(ApiKey.FIND_COORDINATOR, V["find_coordinator"])
        return self.call(make(mod.FindCoordinatorRequest, key_type=key_type,
                              coordinator_keys=(self.name(key),)))

    def op_find_coordinator(self, key, key_type):
        return self.norm(self._find_coordinator(key, key_type))

    def op_coordinator(self, key, key_type):
        """Wait until the coordinator answers for ``key``: found, and loaded (Kafka loads a
        coordinator's partition in the background: NOT_COORDINATOR or
        COORDINATOR_LOAD_IN_PROGRESS meanwhile)."""
        def loaded() -> bool:
            if self._find_coordinator(key, key_type).coordinators[0].error_code != 0:
                return False
            if key_type == 1:
                return self._describe_txn(key)["error_code"] not in (14, 15, 16)
            mod = request_module(ApiKey.OFFSET_FETCH, V["offset_fetch"])
            answer = self.call(make(mod.OffsetFetchRequest, require_stable=False, groups=(
                make(mod.OffsetFetchRequestGroup, group_id=self.name(key), topics=None),)))
            return answer.groups[0].error_code not in (14, 15, 16)
        self.wait(f"a coordinator for {key}", loaded)

    # groups --------------------------------------------------------------------------------

    @staticmethod
    def subscription(topics: list[str]) -> bytes:
        out = struct.pack(">hi", 0, len(topics))
        for t in topics:
            raw = t.encode()
            out += struct.pack(">h", len(raw)) + raw
        return out + struct.pack(">i", -1)

    def op_join_group(self, group, member, protocol_type, topics):
        mod = request_module(ApiKey.JOIN_GROUP, V["join_group"])
        names = [self.name(t) for t in topics]

        def join(member_id: str) -> Any:
            return self.call(make(
                mod.JoinGroupRequest, group_id=self.name(group), session_timeout=SESSION_TIMEOUT_MS,
                rebalance_timeout=SESSION_TIMEOUT_MS, member_id=member_id, group_instance_id=None,
                protocol_type=protocol_type, protocols=(make(
                    mod.JoinGroupRequestProtocol, name="range",
                    metadata=self.subscription(names)),)))
        answers = []
        response = join(self.members.get((group, member), ""))
        answers.append(self.norm(response))
        if response.error_code == 79:  # MEMBER_ID_REQUIRED: join again with the id given
            response = join(response.member_id)
            answers.append(self.norm(response))
        if response.error_code == 0:
            self.members[(group, member)] = response.member_id
            self.generations[group] = response.generation_id
        return answers

    def _member(self, group, member):
        return self.members.get((group, member), "unknown-member")

    def op_sync_group(self, group, member, protocol_type, topics, gen_delta=0):
        mod = request_module(ApiKey.SYNC_GROUP, V["sync_group"])
        member_id = self._member(group, member)
        # the ConsumerProtocol assignment v0: every partition of the topics to the one member
        assignment = struct.pack(">hi", 0, len(topics))
        for t in topics:
            raw = self.name(t).encode()
            assignment += struct.pack(">h", len(raw)) + raw + struct.pack(">iii", 2, 0, 1)
        assignment += struct.pack(">i", -1)
        return self.answer(make(
            mod.SyncGroupRequest, group_id=self.name(group),
            generation_id=self.generations.get(group, -1) + gen_delta, member_id=member_id,
            group_instance_id=None, protocol_type=protocol_type, protocol_name="range",
            assignments=(make(mod.SyncGroupRequestAssignment, member_id=member_id,
                              assignment=assignment),)))

    def op_heartbeat(self, group, member, gen_delta=0):
        mod = request_module(ApiKey.HEARTBEAT, V["heartbeat"])
        return self.answer(make(mod.HeartbeatRequest, group_id=self.name(group),
                                generation_id=self.generations.get(group, -1) + gen_delta,
                                member_id=self._member(group, member), group_instance_id=None))

    def op_leave_group(self, group, member):
        mod = request_module(ApiKey.LEAVE_GROUP, V["leave_group"])
        return self.answer(make(mod.LeaveGroupRequest, group_id=self.name(group), members=(
            make(mod.MemberIdentity, member_id=self._member(group, member),
                 group_instance_id=None, reason=None),)))

    def op_offset_commit(self, group, member, offsets, generation=None, gen_delta=0
                         ) -> Any:
        mod = request_module(ApiKey.OFFSET_COMMIT, V["offset_commit"])
        if generation is None:
            generation = self.generations.get(group, -1) + gen_delta
        by_topic: dict[str, list[tuple[int, int]]] = {}
        for t, p, o in offsets:
            by_topic.setdefault(t, []).append((p, o))
        return self.answer(make(
            mod.OffsetCommitRequest, group_id=self.name(group),
            generation_id_or_member_epoch=generation,
            member_id="" if member is None else self._member(group, member),
            group_instance_id=None, topics=tuple(
                make(mod.OffsetCommitRequestTopic, name=self.name(t), partitions=tuple(
                    make(mod.OffsetCommitRequestPartition, partition_index=p, committed_offset=o,
                         committed_leader_epoch=-1, committed_metadata="m")
                    for p, o in ps)) for t, ps in by_topic.items())))

    def op_offset_fetch(self, group, offsets, stable=False) -> Any:
        mod = request_module(ApiKey.OFFSET_FETCH, V["offset_fetch"])
        by_topic: dict[str, list[int]] = {}
        for t, p in offsets:
            by_topic.setdefault(t, []).append(p)
        return self.answer(make(mod.OffsetFetchRequest, require_stable=stable, groups=(
            make(mod.OffsetFetchRequestGroup, group_id=self.name(group), topics=tuple(
                make(mod.OffsetFetchRequestTopics, name=self.name(t), partition_indexes=tuple(ps))
                for t, ps in by_topic.items())),)))


# -- comparing --------------------------------------------------------------------------------------


def diff(a: Any, b: Any, path: str = "") -> Iterator[tuple[str, Any, Any]]:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in list(a) + [k for k in b if k not in a]:
            if k not in a or k not in b:
                yield f"{path}.{k}", a.get(k, "<absent>"), b.get(k, "<absent>")
            else:
                yield from diff(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            yield from diff(x, y, f"{path}[{i}]")
    elif a != b:
        yield path or ".", a, b


def _short(value: Any, limit: int = 400) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} chars)"


@dataclass
class Difference:
    sequence: int
    step: int
    request: str
    fields: list[tuple[str, Any, Any]]

    def __str__(self) -> str:
        lines = [f"sequence {self.sequence} step {self.step}: {self.request}"]
        lines += [f"    {p}: kafka={_short(k)} oncelog={_short(o)}" for p, k, o in self.fields]
        return "\n".join(lines)


@dataclass
class Report:
    sequences: int = 0
    steps: int = 0
    compared: int = 0
    requests: dict[str, int] = field(default_factory=dict)
    differences: list[Difference] = field(default_factory=list)
    ops: dict[str, int] = field(default_factory=dict)
    skipped: dict[str, int] = field(default_factory=dict)
    deliberate: dict[str, int] = field(default_factory=dict)

    def summary(self) -> str:
        reqs = ", ".join(f"{k} {v}" for k, v in self.requests.items())
        skipped = "".join(f", {n} steps skipped ({why})" for why, n in self.skipped.items())
        skipped += "".join(f", {n} answers differ as documented ({why})"
                           for why, n in self.deliberate.items())
        return (f"{self.sequences} sequences, {self.steps} steps, {self.compared} answers "
                f"compared ({reqs} requests){skipped}, {len(self.differences)} differences")


def _deliberate(step: Step, kafka: Any, oncelog: Any) -> str | None:
    """The name of the deliberate difference (docs/kafka-compatibility.md, "Differential
    test") these answers show, exactly as documented; None for any other difference."""
    if step.op == "metadata" and step.args.get("auto_create") and isinstance(kafka, dict) \
            and isinstance(oncelog, dict):
        # Kafka creates the topic in the background and answers UNKNOWN_TOPIC_OR_PARTITION
        # meanwhile; oncelog creates it within the request and answers it ready.
        k_topics, o_topics = kafka["topics"], oncelog["topics"]
        if len(k_topics) == len(o_topics) and all(
                (k["error_code"], k["partitions"]) == (3, []) and o["error_code"] == 0
                and o["partitions"] and k["name"] == o["name"]
                for k, o in zip(k_topics, o_topics, strict=True)):
            return "auto-created topic ready at once"
    if step.args.get("until_ok") and isinstance(kafka, list) and isinstance(oncelog, list):
        kafka, oncelog = kafka[-1], oncelog[-1]  # the answer the retries ended with
    if step.op == "init_pid" and step.args.get("keep_prepared") and isinstance(kafka, dict) \
            and isinstance(oncelog, dict) and kafka["error_code"] == 35 \
            and oncelog["error_code"] == 0:
        # Kafka 4.3 has InitProducerId v6 unreleased and answers keepPreparedTxn with
        # UNSUPPORTED_VERSION; oncelog implements KIP-939's keepPreparedTxn. The brokers'
        # states part here: the rest of the sequence is not compared.
        return DIVERGED + "keepPreparedTxn (KIP-939) not in Kafka 4.3"
    return None


DIVERGED = "sequence left at: "


_OP_API = {"produce": ApiKey.PRODUCE, "init_pid": ApiKey.INIT_PRODUCER_ID,
           "end_txn": ApiKey.END_TXN, "txn_offset_commit": ApiKey.TXN_OFFSET_COMMIT}


def _unsupported(step: Step, versions: dict[int, int]) -> str | None:
    """Why ``step`` cannot go to this Kafka (a version it does not serve), or None."""
    api = _OP_API.get(step.op)
    version = step.args.get("version")
    if api is None or version is None or version <= versions.get(api, -1):
        return None
    return f"{api.name} v{version}: Kafka serves up to v{versions.get(api, -1)}"


def compare_runs(sequences: list[list[Step]], kafka: str, oncelog: str, *, first: int = 0,
                 log: Callable[[str], None] | None = None) -> Report:
    """Run every sequence on both brokers, step by step, and compare the answers."""
    token = uuid.uuid4().hex[:8]
    base_ms = (int(time.time()) - 3600) * 1000
    report = Report()
    sides = [Side("kafka", kafka, f"d{token}-", base_ms),
             Side("oncelog", oncelog, f"d{token}-", base_ms)]
    kafka_versions = sides[0].api_versions()
    try:
        for i, steps in enumerate(sequences, start=first):
            for side in sides:  # a sequence starts with fresh ids and connections
                side.norm.symbols.clear()
                side.producers.clear()
                side.members.clear()
                side.generations.clear()
                side.wire.close()
            report.sequences += 1
            for n, step in enumerate(steps):
                unsupported = _unsupported(step, kafka_versions)
                if unsupported:  # a version this Kafka does not serve: not sent at all
                    report.skipped[unsupported] = report.skipped.get(unsupported, 0) + 1
                    continue
                report.steps += 1
                answers = [side.step(step) for side in sides]
                if step.settle and answers[0] is None and answers[1] is None:
                    continue
                report.compared += 1
                report.ops[step.op] = report.ops.get(step.op, 0) + 1
                fields = list(diff(answers[0], answers[1]))
                known = fields and _deliberate(step, *answers)
                if known:  # a difference docs/kafka-compatibility.md keeps, as it says
                    report.deliberate[known] = report.deliberate.get(known, 0) + 1
                    if known.startswith(DIVERGED):
                        break
                    continue
                if fields:
                    d = Difference(i, n, step.describe(), fields)
                    report.differences.append(d)
                    if log:
                        log(str(d))
    finally:
        for side in sides:
            report.requests[side.label] = side.requests
            side.close()
    return report


# -- the command ------------------------------------------------------------------------------------


def run(seed: int, sequences: int, kafka: str | None = None, oncelog: str | None = None, *,
        slow: bool = False, first: int = 0, flows: list[str] | None = None,
        kip939: bool = False, work_dir: str | Path | None = None,
        log: Callable[[str], None] | None = None) -> Report:
    """Generate and compare; brokers not given are started here (and stopped at the end)."""
    from contextlib import ExitStack

    from .apache_kafka import ApacheKafka
    from .broker_process import BrokerProcess

    with ExitStack() as stack:
        work = Path(work_dir) if work_dir else Path(stack.enter_context(
            tempfile.TemporaryDirectory(prefix="oncelog-differential-")))
        extra = SLOW_SETTINGS if slow else {}
        if kafka is None:
            k = stack.enter_context(ApacheKafka(work / "kafka", settings={
                **KAFKA_SETTINGS, **extra, **(KIP939_KAFKA_SETTINGS if kip939 else {})}))
            kafka = k.bootstrap_servers
        if oncelog is None:
            b = BrokerProcess(work / "oncelog", settings={
                **ONCELOG_SETTINGS, **extra, **(KIP939_ONCELOG_SETTINGS if kip939 else {})})
            b.start()
            stack.callback(b.stop)
            oncelog = b.bootstrap_servers
        return compare_runs(generate(seed, sequences, slow=slow, first=first, flows=flows),
                            kafka, oncelog, first=first, log=log)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m oncelog.harness.differential",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--sequences", type=int, default=100)
    parser.add_argument("--first", type=int, default=0,
                        help="number of the first sequence (to replay one: --first N "
                             "--sequences 1)")
    parser.add_argument("--kafka", help="a running Kafka's bootstrap address")
    parser.add_argument("--oncelog", help="a running oncelog broker's bootstrap address")
    parser.add_argument("--slow", action="store_true",
                        help="add the flows that wait on timers (transaction timeouts)")
    parser.add_argument("--kip939", action="store_true",
                        help="brokers started here run with two-phase commit (KIP-939), "
                             "Kafka with its unreleased API versions (InitProducerId v6)")
    parser.add_argument("--flows", help="comma-separated flows to draw from (default all: "
                        + ", ".join(FLOWS + SLOW_FLOWS) + ")")
    parser.add_argument("--print-steps", action="store_true",
                        help="print the generated steps and exit")
    parser.add_argument("--json", help="write the report here")
    args = parser.parse_args(argv)
    flows = args.flows.split(",") if args.flows else None
    if args.print_steps:
        for i, steps in enumerate(generate(args.seed, args.sequences, slow=args.slow,
                                           first=args.first, flows=flows), start=args.first):
            print(f"sequence {i}:")
            for step in steps:
                print(("  ~ " if step.settle else "    ") + step.describe())
        return 0
    report = run(args.seed, args.sequences, args.kafka, args.oncelog, slow=args.slow,
                 first=args.first, flows=flows, kip939=args.kip939,
                 log=lambda s: print(s, flush=True))
    print(report.summary())
    if args.json:
        Path(args.json).write_text(json.dumps(dataclasses.asdict(report), indent=1,
                                              default=str))
    return 0 if not report.differences else 1


if __name__ == "__main__":
    sys.exit(main())
