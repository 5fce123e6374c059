"""A read_committed batch read of the ``oncelog`` source that stops at a last stable offset
below the high watermark says so on the driver: a WARNING naming the partition, the
transactional id whose open transaction holds it and how long that has been open. Driven
through the data source's reader (what Spark calls on the driver to plan a batch read) against
a broker with a transaction left open."""

from __future__ import annotations

import logging

import pytest

pytest.importorskip("pyspark")

from oncelog import Admin, NewTopic, Producer
from oncelog.server.embedded import EmbeddedBroker
from oncelog.spark.source import OncelogDataSource, TopicPartitionRange

HOLDER = "order-writer-7"


@pytest.fixture(scope="module")
def broker():
    with EmbeddedBroker(config={"transaction.state.log.num.partitions": "2"}) as b:
        bs = b.bootstrap_servers
        with Admin(bootstrap_servers=bs) as a:
            a.create_topics([NewTopic("held", 2), NewTopic("free", 1)])
        with Producer(bootstrap_servers=bs) as p:
            for i in range(5):
                p.send("held", value=f"a{i}", partition=0)
                p.send("held", value=f"a{i}", partition=1)
                p.send("free", value=f"f{i}", partition=0)
        txn = Producer(bootstrap_servers=bs, transactional_id=HOLDER)
        txn.init_transactions()
        txn.begin_transaction()
        txn.send("held", value="open", partition=1)
        txn.flush()
        with Producer(bootstrap_servers=bs) as p:
            for i in range(3):
                p.send("held", value=f"b{i}", partition=1)
        yield b
        txn.close()


def plan(b, **options: str) -> list[TopicPartitionRange]:
    source = OncelogDataSource({"kafka.bootstrap.servers": b.bootstrap_servers, **options})
    return list(source.reader(source.schema()).partitions())


def warnings_of(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "oncelog.spark" and r.levelno == logging.WARNING]


def test_a_read_held_at_the_lso_names_the_open_transaction(broker, caplog):
    caplog.set_level(logging.INFO, logger="oncelog.spark")
    ranges = plan(broker, subscribe="held")
    assert {(r.partition, r.end) for r in ranges} == {(0, 5), (1, 5)}  # held-1's LSO is 5
    [warning] = warnings_of(caplog)
    assert warning.startswith(
        "held-1: this read_committed batch read ends at the last stable offset 5, below the "
        "high watermark 9: the open transaction of transactional id 'order-writer-7' "
        "(producer id ")
    assert ", state Ongoing, open for " in warning
    assert "the 4 offsets after it are left out until that transaction commits or aborts" \
        in warning


def test_no_warning_where_nothing_is_held_or_the_read_does_not_stop_there(broker, caplog):
    caplog.set_level(logging.INFO, logger="oncelog.spark")
    plan(broker, subscribe="free")
    plan(broker, subscribe="held", endingOffsets='{"held": {"0": -1, "1": 3}}')
    ranges = plan(broker, subscribe="held", **{"kafka.isolation.level": "read_uncommitted"})
    assert {(r.partition, r.end) for r in ranges} == {(0, 5), (1, 9)}
    assert warnings_of(caplog) == []
