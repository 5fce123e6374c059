"""The purchases application: purchases in, invoices and shipments out, exactly once.

For every purchase consumed from ``purchases`` the app produces one invoice to ``invoices`` and
one shipment to ``shipments``, and commits the consumed offset in the same transaction
(consume-transform-produce, spec 000 "Data Flow"; KIP-447: the consumer's group metadata goes
with the offsets so that a zombie instance is fenced). Written twice, with the same loop: with
oncelog's client (``--client oncelog``) and with confluent-kafka's transactional API
(``--client confluent``).

    python -m oncelog.examples.purchases --bootstrap-server 127.0.0.1:9092 --client oncelog

Each invoice and shipment carries the purchase's id, so a read_committed reader can check that
every purchase produced exactly one of each. The app runs until it has been idle for
``--idle-exit`` seconds (or forever without it); it is meant to be killed and restarted.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

PURCHASES, INVOICES, SHIPMENTS = "purchases", "invoices", "shipments"
GROUP = "purchases-app"
TXN_TIMEOUT_S = 30  # for each transactional call of confluent-kafka's
HANG_GRACE_S = 5
COMMITTED_ENV = "ONCELOG_PURCHASES_COMMITTED"  # the count, carried over a restart


def _bounded(call: Callable[..., Any], *args: Any) -> Any:
    """Call a transactional method of confluent-kafka's (its timeout TXN_TIMEOUT_S); should it hang
    well past that, restart this process in place. librdkafka 2.10+ can wait for ever in
    send_offsets_to_transaction for a group coordinator that dropped out of the metadata
    while its broker was down (librdkafka issues 5456 and 5511, open): the call cannot be
    interrupted, but a new process is a new producer instance, which fences the hung one
    and aborts its transaction, so nothing is lost or doubled."""
    timer = threading.Timer(TXN_TIMEOUT_S + HANG_GRACE_S, _restart,
                            args=(getattr(call, "__name__", "a transactional call"),))
    timer.daemon = True
    timer.start()
    try:
        return call(*args, TXN_TIMEOUT_S)
    finally:
        timer.cancel()


def _restart(what: str) -> None:
    print(f"{what} hung past its timeout (librdkafka issue 5511); restarting the process",
          flush=True)
    os.execv(sys.executable, [sys.executable, "-m", "oncelog.examples.purchases",
                              *sys.argv[1:]])


def invoice_and_shipment(purchase: bytes | None) -> tuple[bytes, bytes]:
    if purchase is None:
        raise ValueError("a purchase record without a value")
    p = json.loads(purchase)
    invoice = {"purchase": p["id"], "user": p["user"], "total": p["quantity"] * p["price"]}
    shipment = {"purchase": p["id"], "user": p["user"], "address": "SomeStreet 12/18, Warsaw"}
    return json.dumps(invoice).encode(), json.dumps(shipment).encode()


def purchase(n: int) -> bytes:
    return json.dumps({"id": n, "user": f"user-{n % 97}", "quantity": 1 + n % 5,
                       "price": 10 + n % 13}).encode()


class Restart(Exception):
    """A transaction failed in a way the app recovers from: it was aborted; start over from
    the group's committed offsets with fresh clients."""


def run_oncelog(bootstrap: str, transactional_id: str, batch: int, idle_exit: float | None,
                session_timeout_ms: int, on_commit: Callable[[int], None]) -> int:
    """Process purchases until idle; returns how many (``on_commit`` hears each transaction's
    count)."""
    from oncelog import Consumer, Producer, TopicPartition
    from oncelog.errors import FatalError, KafkaError

    producer = Producer(bootstrap_servers=bootstrap, transactional_id=transactional_id,
                        linger_ms=5)
    consumer = Consumer(bootstrap_servers=bootstrap, group_id=GROUP,
                        isolation_level="read_committed", enable_auto_commit=False,
                        auto_offset_reset="earliest", max_poll_records=batch,
                        session_timeout_ms=session_timeout_ms,
                        heartbeat_interval_ms=session_timeout_ms // 3)
    total = 0
    try:
        producer.init_transactions()
        consumer.subscribe([PURCHASES])
        idle_since = time.monotonic()
        while idle_exit is None or time.monotonic() - idle_since < idle_exit:
            records = consumer.poll(timeout=0.5)
            if not records:
                continue
            idle_since = time.monotonic()
            producer.begin_transaction()
            try:
                offsets: dict[Any, int] = {}
                for r in records:
                    invoice, shipment = invoice_and_shipment(r.value)
                    producer.send(INVOICES, invoice, key=r.key)
                    producer.send(SHIPMENTS, shipment, key=r.key)
                    offsets[TopicPartition(r.topic, r.partition)] = r.offset + 1
                producer.send_offsets_to_transaction(offsets, consumer.group_metadata())
                producer.commit_transaction()
            except FatalError:
                raise
            except KafkaError as exc:
                producer.abort_transaction()
                raise Restart(exc) from exc
            total += len(records)
            on_commit(len(records))
    finally:
        consumer.close()
        producer.close()
    return total


def run_confluent(bootstrap: str, transactional_id: str, batch: int, idle_exit: float | None,
                  session_timeout_ms: int, on_commit: Callable[[int], None]) -> int:
    from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

    # librdkafka >= 2.10 "re-bootstraps" (KIP-899) as soon as every broker is down, which on a
    # single-broker cluster is any broker restart, and then can stall for minutes on the old
    # broker handle that queued messages still reference; plain reconnection rides it out.
    common = {"bootstrap.servers": bootstrap, "metadata.recovery.strategy": "none"}
    producer = Producer({**common, "transactional.id": transactional_id, "linger.ms": 5})
    consumer = Consumer({**common, "group.id": GROUP,
                         "isolation.level": "read_committed", "enable.auto.commit": False,
                         "auto.offset.reset": "earliest",
                         "session.timeout.ms": session_timeout_ms,
                         "heartbeat.interval.ms": session_timeout_ms // 3})
    total = 0
    try:
        _bounded(producer.init_transactions)
        consumer.subscribe([PURCHASES])
        idle_since = time.monotonic()
        while idle_exit is None or time.monotonic() - idle_since < idle_exit:
            msgs = [m for m in consumer.consume(batch, 0.5) if m.error() is None]
            if not msgs:
                continue
            idle_since = time.monotonic()
            producer.begin_transaction()
            try:
                offsets: dict[tuple[Any, Any], int] = {}
                for m in msgs:
                    invoice, shipment = invoice_and_shipment(m.value())
                    producer.produce(INVOICES, invoice, key=m.key())
                    producer.produce(SHIPMENTS, shipment, key=m.key())
                    offsets[(m.topic(), m.partition())] = (m.offset() or 0) + 1
                _bounded(producer.send_offsets_to_transaction,
                         [TopicPartition(t, p, o) for (t, p), o in offsets.items()],
                         consumer.consumer_group_metadata())
                _bounded(producer.commit_transaction)
            except KafkaException as exc:
                if not exc.args[0].txn_requires_abort():
                    raise
                _bounded(producer.abort_transaction)
                raise Restart(exc) from exc
            total += len(msgs)
            on_commit(len(msgs))
    finally:
        consumer.close()
    return total


RUNNERS = {"oncelog": run_oncelog, "confluent": run_confluent}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bootstrap-server", default="127.0.0.1:9092")
    ap.add_argument("--client", choices=sorted(RUNNERS), default="oncelog")
    ap.add_argument("--transactional-id", default="purchases-app-1")
    ap.add_argument("--batch", type=int, default=100, help="purchases per transaction")
    ap.add_argument("--session-timeout-ms", type=int, default=45_000,
                    help="the consumer's session timeout: how long a dead instance keeps its "
                    "partitions")
    ap.add_argument("--idle-exit", type=float, default=None,
                    help="stop after this many idle seconds (default: run forever)")
    args = ap.parse_args(argv)

    committed = [int(os.environ.get(COMMITTED_ENV, "0"))]

    def report(n: int) -> None:  # after each committed transaction of n purchases
        committed[0] += n
        os.environ[COMMITTED_ENV] = str(committed[0])  # kept if the process restarts itself
        print(f"committed {committed[0]}", flush=True)

    while True:
        try:
            RUNNERS[args.client](args.bootstrap_server, args.transactional_id, args.batch,
                                 args.idle_exit, args.session_timeout_ms, report)
            break
        except Restart as exc:
            print(f"transaction aborted ({exc}); restarting from the committed offsets",
                  flush=True)
    print(f"done: {committed[0]} purchases processed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
