"""Orders written to a database and to the ``order-events`` topic atomically (KIP-939's dual-write
recipe through ``oncelog.dualwrite``).

Each transaction takes the next ``--batch`` order ids, sends one event per order, prepares the
oncelog transaction, and inserts the orders with the partition and offset of their event (the
database reflects the produced records, step 5 of the recipe); then the writer saves the
prepared state, commits the database and commits the log. At start the writer recovers: a
transaction a crash left open is committed if the database holds it, aborted otherwise. The
next order id is the database's (``max(id) + 1``), so a restarted run carries on where the
committed data ends::

    python -m oncelog.examples.dual_write --bootstrap-server 127.0.0.1:9092 --db orders.db --count 100
    python -m oncelog.examples.dual_write --postgres 'dbname=shop' --count 100

``--crash-at STEP`` SIGKILLs the process right after STEP of its ``--crash-in``-th transaction
(or of the recovery, for the ``recovery_*`` steps): ``db_begin``, ``log_begin``, ``sent``,
``prepared``, ``db_written``, ``state_saved``, ``db_committed``, ``log_committed``. The tests
use it to check that the database and the topic agree after every possible crash.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from typing import Any

from oncelog.dualwrite import DualWriter, PostgresStore, SQLiteStore, Store

TOPIC = "order-events"
STEPS = ("db_begin", "log_begin", "sent", "prepared", "db_written", "state_saved",
         "db_committed", "log_committed")
RECOVERY_STEPS = ("recovery_initialized", "recovery_state_loaded", "recovery_completed")
ORDERS_TABLE = ("CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, customer TEXT NOT "
                "NULL, amount INTEGER NOT NULL, event_partition INTEGER NOT NULL, "
                "event_offset BIGINT NOT NULL)")


def order(n: int) -> dict[str, Any]:
    return {"id": n, "customer": f"customer-{n % 7}", "amount": 10 + n % 90}


class Crasher:
    """Kill this process (SIGKILL: no cleanup, no flush) right after ``step`` of transaction
    number ``in_transaction`` of this run, or of the recovery."""

    def __init__(self, step: str | None, in_transaction: int) -> None:
        self.step = step
        self.in_transaction = in_transaction
        self.transaction = 0  # the transaction in progress, counted from 1

    def __call__(self, step: str) -> None:
        if step != self.step:
            return
        if step in RECOVERY_STEPS or self.transaction == self.in_transaction:
            print(f"crash at {step} (transaction {self.transaction})", file=sys.stderr,
                  flush=True)
            os.kill(os.getpid(), signal.SIGKILL)


def ensure_topic(bootstrap: str, topic: str, partitions: int) -> None:
    from oncelog import Admin, NewTopic
    from oncelog.errors import TopicAlreadyExistsError

    with Admin(bootstrap_servers=bootstrap) as admin:
        try:
            admin.create_topics([NewTopic(topic, num_partitions=partitions)])
        except TopicAlreadyExistsError:
            pass


def run(writer: DualWriter, topic: str, count: int, batch: int, crasher: Crasher) -> int:
    """Write orders until ``count`` are in the database; returns how many this run wrote."""
    store = writer.store
    ph = "?" if isinstance(store, SQLiteStore) else "%s"
    writer.recover()
    (next_id,) = store.db.execute("SELECT COALESCE(MAX(id) + 1, 0) FROM orders").fetchone()
    written = 0
    while next_id < count:
        ids = range(next_id, min(next_id + batch, count))
        crasher.transaction += 1
        with writer.transaction() as tx:
            futures = [tx.send(topic, json.dumps(order(i)).encode(), key=str(i).encode())
                       for i in ids]
            crasher("sent")
            tx.prepare()  # every event is written: their offsets are known
            for i, future in zip(ids, futures, strict=True):
                md = future.result()
                o = order(i)
                tx.db.execute(f"INSERT INTO orders (id, customer, amount, event_partition, "
                              f"event_offset) VALUES ({ph}, {ph}, {ph}, {ph}, {ph})",
                              (i, o["customer"], o["amount"], md.partition, md.offset))
            crasher("db_written")
        next_id = ids[-1] + 1
        written += len(ids)
    return written


def open_store(args: argparse.Namespace) -> Store:
    store: SQLiteStore | PostgresStore
    if args.postgres:
        store = PostgresStore(args.postgres)
    else:
        store = SQLiteStore(args.db)
    store.db.execute(ORDERS_TABLE)
    return store


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bootstrap-server", default="127.0.0.1:9092")
    where = ap.add_mutually_exclusive_group()
    where.add_argument("--db", default="orders.db", help="SQLite file (default orders.db)")
    where.add_argument("--postgres", metavar="DSN", help="PostgreSQL instead (psycopg DSN)")
    ap.add_argument("--count", type=int, default=100, help="orders in all (default 100)")
    ap.add_argument("--batch", type=int, default=3, help="orders per transaction (default 3)")
    ap.add_argument("--topic", default=TOPIC, help=f"default {TOPIC}")
    ap.add_argument("--partitions", type=int, default=2,
                    help="partitions of the topic if it is created (default 2)")
    ap.add_argument("--transactional-id", default="orders-writer-1")
    ap.add_argument("--crash-at", choices=STEPS + RECOVERY_STEPS,
                    help="SIGKILL this process right after this step")
    ap.add_argument("--crash-in", type=int, default=2, metavar="N",
                    help="... of this run's N-th transaction (default 2)")
    args = ap.parse_args(argv)
    if args.batch < 1 or args.count < 0:
        ap.error("--batch must be at least 1 and --count not negative")

    ensure_topic(args.bootstrap_server, args.topic, args.partitions)
    crasher = Crasher(args.crash_at, args.crash_in)
    writer = DualWriter(open_store(args), bootstrap_servers=args.bootstrap_server,
                        transactional_id=args.transactional_id, linger_ms=0, on_step=crasher)
    with writer:
        written = run(writer, args.topic, args.count, args.batch, crasher)
    print(f"wrote {written} orders ({args.count} in all)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
