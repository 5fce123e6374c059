"""Inspecting and repairing transactions: Admin.list_transactions / describe_transactions /
describe_producers / abort_transaction and ``oncelog transactions ...``, including a hanging
transaction (data written with no coordinator behind it, so the LSO is stuck) that the abort
command finds by its start offset and ends, as Kafka's kafka-transactions.sh does; force-terminate
refuses an id that does not exist and works whatever the broker's transaction.max.timeout.ms."""

from __future__ import annotations

import json
import time

import pytest
from support.cli import broker, oncelog  # noqa: F401 (broker: a fixture)
from support.raw_wire import (
    RawConnection,
    idempotent_batch,
    init_producer_id_request,
    latest_offset,
    list_offsets_request,
    produce,
)
from support.waiting import wait_until

from oncelog import Admin, NewTopic, Producer, TopicPartition
from oncelog.errors import ProducerFencedError, TransactionalIdNotFoundError
from oncelog.harness.broker_process import BrokerProcess

pytestmark = pytest.mark.slow


def lso(conn, topic: str) -> int:
    r = conn.request(list_offsets_request(topic, 0, -1, isolation_level=1))
    return r.topics[0].partitions[0].offset


def test_admin_sees_an_open_transaction_then_its_end(broker):  # noqa: F811
    bs = broker.bootstrap_servers
    with Admin(bootstrap_servers=bs) as admin:
        admin.create_topics([NewTopic("tools-a", num_partitions=2)])
        with Producer(bootstrap_servers=bs, transactional_id="tools-1") as p:
            p.init_transactions()
            p.begin_transaction()
            p.send("tools-a", b"x", partition=1).result()
            listed = {t.transactional_id: t for t in admin.list_transactions()}
            assert listed["tools-1"].state == "Ongoing"
            assert [t.transactional_id for t in admin.list_transactions(states=["Ongoing"])] \
                == ["tools-1"]
            d = admin.describe_transactions(["tools-1"])["tools-1"]
            assert (d.state, d.partitions) == ("Ongoing", frozenset({TopicPartition("tools-a",
                                                                                   1)}))
            assert d.start_ms is not None and d.timeout_ms == 60_000
            (state,) = admin.describe_producers([TopicPartition("tools-a", 1)])[
                TopicPartition("tools-a", 1)]
            assert (state.producer_id, state.current_txn_start_offset) == (d.producer_id, 0)
            p.commit_transaction()
        # EndTxn is answered once PrepareCommit is logged; the markers and CompleteCommit
        # follow (as in Kafka), so the state moves on a moment after commit returns.
        d = wait_until(lambda: (t := admin.describe_transactions(["tools-1"])["tools-1"]).state
                       == "CompleteCommit" and t, 10, "CompleteCommit")
        # the completed transaction is described with the time it began, as Kafka does
        assert d.start_ms is not None and not d.partitions
        with pytest.raises(TransactionalIdNotFoundError):
            admin.describe_transactions(["nobody"])
    lines = oncelog("transactions", "list", "--bootstrap-server", bs).stdout.splitlines()
    assert cells(lines[0]) == ["TransactionalId", "Coordinator", "ProducerId",
                               "TransactionState"]  # Kafka's columns
    assert ["tools-1", "1", str(d.producer_id), "CompleteCommit"] in map(cells, lines[1:])
    assert len({len(line) for line in lines}) == 1  # aligned, as Kafka's prettyPrintTable
    lines = oncelog("transactions", "describe", "--transactional-id", "tools-1",
                    "--bootstrap-server", bs).stdout.splitlines()
    assert cells(lines[0]) == [
        "CoordinatorId", "TransactionalId", "ProducerId", "ProducerEpoch", "TransactionState",
        "TransactionTimeoutMs", "CurrentTransactionStartTimeMs", "TransactionDurationMs",
        "TopicPartitions"]
    row = cells(lines[1])
    assert row[:6] + row[8:] == ["1", "tools-1", str(d.producer_id), str(d.producer_epoch),
                                 "CompleteCommit", "60000", ""]
    assert row[6] == str(d.start_ms) and int(row[7]) >= 0  # its start, and how long ago
    (js,) = json.loads(oncelog("transactions", "describe", "--transactional-id", "tools-1",
                               "--bootstrap-server", bs, "--output", "json").stdout)
    assert (js["coordinator_id"], js["transaction_state"],
            js["current_transaction_start_time_ms"]) \
        == (1, "CompleteCommit", d.start_ms)
    js = json.loads(oncelog("transactions", "list", "--bootstrap-server", bs, "--output",
                            "json").stdout)
    assert {"transactional_id": "tools-1", "coordinator": 1, "producer_id": d.producer_id,
            "transaction_state": "CompleteCommit"} in js
    with Admin(bootstrap_servers=bs) as admin:
        assert admin.describe_transactions(["tools-1"])["tools-1"].coordinator_id == 1
        assert {t.coordinator_id for t in admin.list_transactions()} == {1}


def cells(line: str) -> list[str]:
    """A row of Kafka's table: padded cells, each followed by a tab."""
    return [c.strip() for c in line.split("\t")][:-1]


def test_a_hanging_transaction_is_found_and_aborted_by_its_start_offset(broker):  # noqa: F811
    bs = broker.bootstrap_servers
    with Admin(bootstrap_servers=bs) as admin:
        admin.create_topics([NewTopic("tools-h", num_partitions=1)])
    with RawConnection(bs) as conn:
        produce(conn, "tools-h", 0, idempotent_batch(conn.request(
            init_producer_id_request()).producer_id, 0, 0, [b"before"]))
        pid = conn.request(init_producer_id_request()).producer_id
        # Transactional data the coordinator never heard of: nothing will ever end it.
        produce(conn, "tools-h", 0, idempotent_batch(pid, 0, 0, [b"h1", b"h2"],
                                                     is_transactional=True))
        assert (lso(conn, "tools-h"), latest_offset(conn, "tools-h")) == (1, 3)
        out = oncelog("transactions", "describe-producers", "--topic", "tools-h",
                      "--partition", "0", "--bootstrap-server", bs).stdout
        rows = [line.split("\t") for line in out.splitlines()[1:]]
        assert [pid, 0, 1] in [[int(r[0]), int(r[1]), int(r[5])] for r in rows]
        bad = oncelog("transactions", "abort", "--topic", "tools-h", "--partition", "0",
                      "--start-offset", "2", "--bootstrap-server", bs, check=False)
        assert bad.returncode == 1 and "no open transaction starts at offset 2" in bad.stderr
        out = oncelog("transactions", "abort", "--topic", "tools-h", "--partition", "0",
                      "--start-offset", "1", "--bootstrap-server", bs).stdout
        assert f"producer {pid}" in out
        assert lso(conn, "tools-h") == latest_offset(conn, "tools-h") == 4


def test_find_hanging_lists_the_transaction_no_coordinator_will_end(broker):  # noqa: F811
    """As kafka-transactions.sh find-hanging: an open transaction whose producer id no
    coordinator knows is hanging; one its coordinator holds (Ongoing, this partition) is not;
    neither is one younger than --max-transaction-timeout."""
    bs = broker.bootstrap_servers
    with Admin(bootstrap_servers=bs) as admin:
        admin.create_topics([NewTopic("tools-fh", num_partitions=2)])
    find = ["transactions", "find-hanging", "--bootstrap-server", bs]
    with Producer(bootstrap_servers=bs, transactional_id="tools-fh1") as p, \
            RawConnection(bs) as conn:
        p.init_transactions()
        p.begin_transaction()
        p.send("tools-fh", b"live", partition=0).result()  # Ongoing: its coordinator ends it
        pid = conn.request(init_producer_id_request()).producer_id
        # written 20 minutes ago (its records' timestamps: the producer's LastTimestamp)
        twenty_minutes_ago = int(time.time() * 1000) - 20 * 60_000
        produce(conn, "tools-fh", 1, idempotent_batch(pid, 0, 0, [b"h"], is_transactional=True,
                                                      timestamp=twenty_minutes_ago))
        # with a 0-minute limit the live transaction is a candidate too, but its coordinator
        # holds it
        for scope in (["--topic", "tools-fh"], ["--topic", "tools-fh", "--partition", "1"],
                      ["--broker-id", "1"]):
            lines = oncelog(*find, *scope, "--max-transaction-timeout", "0").stdout.splitlines()
            assert cells(lines[0]) == ["Topic", "Partition", "ProducerId", "ProducerEpoch",
                                       "CoordinatorEpoch", "StartOffset", "LastTimestamp",
                                       "Duration(min)"]
            rows = [cells(line) for line in lines[1:]]
            assert [r[:6] for r in rows] == [["tools-fh", "1", str(pid), "0", "-1", "0"]], rows
            assert rows[0][6:] == [str(twenty_minutes_ago), "20"]
        (js,) = json.loads(oncelog(*find, "--topic", "tools-fh", "--output", "json").stdout)
        assert js == {"topic": "tools-fh", "partition": 1, "producer_id": pid, "producer_epoch": 0,
                      "coordinator_epoch": -1, "start_offset": 0,
                      "last_timestamp": twenty_minutes_ago, "duration_min": 20}
        # the default limit (15 minutes) finds it; 30 minutes: not old enough to be suspect
        assert len(oncelog(*find, "--topic", "tools-fh").stdout.splitlines()) == 2
        assert oncelog(*find, "--topic", "tools-fh", "--max-transaction-timeout",
                       "30").stdout.splitlines()[1:] == []
        p.abort_transaction()
    bad = oncelog(*find, check=False)
    assert bad.returncode == 1 and "requires either --topic or --broker-id" in bad.stderr
    bad = oncelog(*find, "--broker-id", "1", "--partition", "0", check=False)
    assert bad.returncode == 1 and "--partition argument requires --topic" in bad.stderr


def test_force_terminate_of_an_unknown_id_fails_and_creates_nothing(broker):  # noqa: F811
    """Before, it printed success and registered the id (a typo made a new transactional id)."""
    bs = broker.bootstrap_servers
    bad = oncelog("transactions", "force-terminate", "--transactional-id", "nobody-here",
                  "--bootstrap-server", bs, check=False)
    assert bad.returncode == 1, bad.stdout
    assert "transactional id 'nobody-here' does not exist" in bad.stderr
    with Admin(bootstrap_servers=bs) as admin:
        with pytest.raises(TransactionalIdNotFoundError):
            admin.force_terminate_transaction("nobody-here")
        with pytest.raises(TransactionalIdNotFoundError):
            admin.describe_transactions(["nobody-here"])  # still not created
        assert "nobody-here" not in {t.transactional_id for t in admin.list_transactions()}


def test_force_terminate_works_below_the_clients_default_transaction_timeout(tmp_path):
    """A broker whose transaction.max.timeout.ms (1 s) is below the admin client's defaults:
    the fencing InitProducerId asks for a transaction timeout every broker accepts (before:
    InvalidTransactionTimeoutError). A prepared two-phase transaction (which never times out)
    is aborted and its producer fenced."""
    settings = {"transaction.max.timeout.ms": "1000",
                "transaction.two.phase.commit.enable": "true"}
    with BrokerProcess(tmp_path / "data", settings=settings) as b:
        bs = b.bootstrap_servers
        with Admin(bootstrap_servers=bs) as admin:
            admin.create_topics([NewTopic("tools-f", num_partitions=1)])
        p = Producer(bootstrap_servers=bs, transactional_id="tools-f1",
                     transaction_two_phase_commit_enable=True, linger_ms=0)
        try:
            p.init_transactions(10)
            p.begin_transaction()
            p.send("tools-f", b"stuck", partition=0)
            p.prepare_transaction(10)
            with RawConnection(bs) as conn:
                assert (lso(conn, "tools-f"), latest_offset(conn, "tools-f")) == (0, 1)
            out = oncelog("transactions", "force-terminate", "--transactional-id", "tools-f1",
                          "--bootstrap-server", bs).stdout
            assert "Terminated the transaction of 'tools-f1'" in out
            with Admin(bootstrap_servers=bs) as admin:
                d = admin.describe_transactions(["tools-f1"])["tools-f1"]
                assert d.state == "Empty" and not d.partitions  # aborted, a new epoch
            with RawConnection(bs) as conn:  # the abort marker is written: LSO = HW
                assert lso(conn, "tools-f") == latest_offset(conn, "tools-f") == 2
            with pytest.raises(ProducerFencedError):
                p.commit_transaction(10)
        finally:
            p.close()
