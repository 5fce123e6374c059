"""Helpers of the tests that run Kafka's tools against oncelog and against a real Kafka side by
side (tests/test_kafka_tools_transactions.py, ..._acls.py, ..._others.py): transactions of every
state set up the same way on both, and the tools' tables read into rows."""

from __future__ import annotations

import dataclasses
import time

import confluent_kafka

from oncelog.protocol import ApiKey, make, request_module
from oncelog.records import build_batch
from support.raw_wire import RawConnection, produce_request


def table(text: str) -> list[dict[str, str]]:
    """A table as kafka-transactions prints it (a header line, then rows; tab-separated cells
    padded with spaces) as a list of {column: value}."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return []
    header = [c.strip() for c in lines[0].split("\t") if c.strip()]
    rows = []
    for line in lines[1:]:
        cells = [c.strip() for c in line.split("\t")][:len(header)]
        rows.append(dict(zip(header, cells, strict=True)))
    return rows


def columns(text: str) -> list[str]:
    lines = [line for line in text.splitlines() if line.strip()]
    return [c.strip() for c in lines[0].split("\t") if c.strip()] if lines else []


def transactional_producer(bootstrap: str, transactional_id: str,
                           **conf: object) -> confluent_kafka.Producer:
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap,
                                         "transactional.id": transactional_id,
                                         "linger.ms": 0, **conf})
    producer.init_transactions(30)
    return producer


def write_in_transaction(producer: confluent_kafka.Producer, topic: str, values: list[bytes],
                         end: str | None) -> None:
    """Begin a transaction, write ``values`` to partition 0 and commit, abort or (``end`` None)
    leave it open."""
    producer.begin_transaction()
    for v in values:
        producer.produce(topic, v, partition=0)
    assert producer.flush(30) == 0
    if end == "commit":
        producer.commit_transaction(30)
    elif end == "abort":
        producer.abort_transaction(30)


def init_idempotent_producer_id(conn: RawConnection) -> tuple[int, int]:
    mod = request_module(ApiKey.INIT_PRODUCER_ID, 4)
    r = conn.request(make(mod.InitProducerIdRequest, transactional_id=None,
                          transaction_timeout=60_000, producer_id=-1, producer_epoch=-1))
    assert r.error_code == 0, r
    return r.producer_id, r.producer_epoch


def hanging_write(bootstrap: str, topic: str, partition: int, age_ms: int,
                  transactional_id: str) -> tuple[int, int]:
    """A transactional batch that no transaction coordinator knows of: the producer id of an
    idempotent producer (InitProducerId without a transactional id), written with the
    transactional flag under ``transactional_id`` to a broker that does not verify partitions
    (``transaction.partition.verification.enable=false``), its timestamp ``age_ms`` in the past.
    This is what a hanging transaction is (KIP-664): open on the partition, unknown to any
    coordinator. Returns (producer id, epoch)."""
    with RawConnection(bootstrap) as conn:
        pid, epoch = init_idempotent_producer_id(conn)
        ts = int(time.time() * 1000) - age_ms
        batch = build_batch([(b"k", b"hanging", [], ts)], producer_id=pid, producer_epoch=epoch,
                            base_sequence=0, is_transactional=True)
        request = dataclasses.replace(produce_request(topic, partition, batch, version=9),
                                      transactional_id=transactional_id)
        r = conn.request(request)
        part = r.responses[0].partition_responses[0]
        assert part.error_code == 0, part
    return pid, epoch


