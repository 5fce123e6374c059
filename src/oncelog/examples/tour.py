"""A tour of the client (the demo before the Spark one): start an embedded broker on a free port, produce purchases with our client
(idempotent), read them back with confluent-kafka (librdkafka), then run the purchases
exactly-once application on our client (purchases -> invoices + shipments, consume-transform-
produce in transactions with the consumed offsets), abort one stray transaction, and check with
a read_committed confluent-kafka consumer that each purchase has exactly one invoice and one
shipment, and that the aborted records are invisible.

    python -m oncelog.examples.tour --records 1000
"""

from __future__ import annotations

import argparse
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m oncelog.examples.tour", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=1000)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--compression", default="zstd",
                        choices=["none", "gzip", "snappy", "lz4", "zstd"])
    args = parser.parse_args(argv)

    from confluent_kafka import Consumer as CKConsumer
    from confluent_kafka import TopicPartition as CKTopicPartition

    from oncelog import Admin, NewTopic, Producer
    from oncelog.examples import purchases as app
    from oncelog.server.embedded import EmbeddedBroker

    topic = app.PURCHASES
    # No initial rebalance delay: the demo's group has one member and need not wait for more.
    with EmbeddedBroker(config={"group.initial.rebalance.delay.ms": "0"}) as broker:
        print(f"1. embedded broker listening on {broker.bootstrap_servers} "
              f"(data in {broker.data_dir})")
        with Admin(bootstrap_servers=broker.bootstrap_servers) as admin:
            admin.create_topics([NewTopic(t, num_partitions=args.partitions)
                                 for t in (topic, app.INVOICES, app.SHIPMENTS)])
            desc = admin.describe_topics([topic])[topic]
        print(f"2. created topics {topic!r}, {app.INVOICES!r}, {app.SHIPMENTS!r} with "
              f"{len(desc.partitions)} partitions each (our Admin)")

        start = time.perf_counter()
        with Producer(bootstrap_servers=broker.bootstrap_servers, linger_ms=5,
                      compression_type=args.compression) as producer:
            futures = [
                producer.send(topic, value=app.purchase(i), key=f"customer-{i % 7}",
                              headers=[("source", b"demo")])
                for i in range(args.records)
            ]
            producer.flush()
            metas = [f.result() for f in futures]
        elapsed = time.perf_counter() - start
        per_partition: dict[int, int] = {}
        for m in metas:
            per_partition[m.partition] = per_partition.get(m.partition, 0) + 1
        print(f"3. our idempotent producer ({args.compression}) sent {len(metas)} records in "
              f"{elapsed:.2f}s; per partition: {dict(sorted(per_partition.items()))}")

        consumer = CKConsumer({"bootstrap.servers": broker.bootstrap_servers,
                               "group.id": "demo", "enable.auto.commit": False})
        consumer.assign([CKTopicPartition(topic, p, 0) for p in per_partition])
        seen: dict[tuple[int | None, int | None], bytes | None] = {}
        deadline = time.monotonic() + 30
        while len(seen) < len(metas) and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None or msg.error():
                continue
            seen[(msg.partition(), msg.offset())] = msg.value()
        consumer.close()
        expected = {(m.partition, m.offset) for m in metas}
        ok = set(seen) == expected and len(set(seen.values())) == len(metas)
        print(f"4. confluent-kafka consumer read back {len(seen)} records; "
              f"every acknowledged offset present exactly once: {ok}")
        sample = sorted(seen.items())[:2]
        for (p, o), v in sample:
            print(f"     partition {p} offset {o}: {(v or b'').decode()}")

        # 5. spec 001's application, on our client: exactly once, in transactions.
        start = time.perf_counter()
        transactions: list[int] = []
        processed = app.run_oncelog(broker.bootstrap_servers, "demo-app", batch=200,
                                    idle_exit=1.0, session_timeout_ms=10_000,
                                    on_commit=transactions.append)
        print(f"5. the purchases app (our transactional producer + consumer group) processed "
              f"{processed} purchases in {len(transactions)} transactions, "
              f"{time.perf_counter() - start:.1f}s")
        with Producer(bootstrap_servers=broker.bootstrap_servers,
                      transactional_id="demo-stray") as stray:
            stray.init_transactions()
            stray.begin_transaction()
            stray.send(app.INVOICES, b'{"purchase": -1, "note": "never committed"}')
            stray.flush()
            stray.abort_transaction()
        print("6. a stray transaction wrote an invoice to 'invoices' and aborted")

        ok_app = True
        for out_topic in (app.INVOICES, app.SHIPMENTS):
            ids = _read_committed_ids(broker.bootstrap_servers, out_topic, args.partitions)
            exactly_once = sorted(ids) == list(range(args.records))
            ok_app = ok_app and exactly_once
            print(f"7. read_committed confluent-kafka consumer of {out_topic!r}: {len(ids)} "
                  f"records, each purchase exactly once and nothing aborted: {exactly_once}")
        return 0 if ok and ok_app else 1


def _read_committed_ids(bootstrap: str, topic: str, partitions: int) -> list[int]:
    import json

    from confluent_kafka import Consumer as CKConsumer
    from confluent_kafka import KafkaError
    from confluent_kafka import TopicPartition as CKTopicPartition

    consumer = CKConsumer({"bootstrap.servers": bootstrap, "group.id": "demo-check",
                           "isolation.level": "read_committed", "enable.auto.commit": False,
                           "enable.partition.eof": True})
    consumer.assign([CKTopicPartition(topic, p, 0) for p in range(partitions)])
    ids: list[int] = []
    eof: set[int] = set()
    deadline = time.monotonic() + 30
    while len(eof) < partitions and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is None:
            continue
        error = msg.error()
        if error is not None:
            if error.code() == KafkaError._PARTITION_EOF:
                eof.add(msg.partition() or 0)
            continue
        ids.append(json.loads(msg.value() or b"{}")["purchase"])
    consumer.close()
    return ids


if __name__ == "__main__":
    raise SystemExit(main())
