"""The differential test against a real Kafka (oncelog.harness.differential), short run: fixed
seeds, the same request sequences sent to the session's Apache Kafka and to an oncelog broker
configured alike, every answer compared field by field. The long run is a command:

    python -m oncelog.harness.differential --seed N --sequences M [--kafka HOST:PORT]

The tests without Kafka check the harness itself: that it is seeded, and that it does find
a difference when the two brokers differ."""

from __future__ import annotations

import time
import uuid

import pytest

from oncelog import Admin
from oncelog.harness.broker_process import BrokerProcess
from oncelog.harness.differential import (
    ONCELOG_SETTINGS,
    S,
    Side,
    W,
    compare_runs,
    generate,
)
from oncelog.server.embedded import EmbeddedBroker

# (seed, sequences): 30 sequences in all, every flow drawn at least once
SHORT_RUN = [(11, 15), (12, 15)]


@pytest.fixture(scope="module")
def oncelog_broker(tmp_path_factory):
    broker = BrokerProcess(tmp_path_factory.mktemp("differential") / "data",
                           settings=ONCELOG_SETTINGS)
    broker.start()
    yield broker.bootstrap_servers
    broker.stop()


@pytest.mark.parametrize(("seed", "sequences"), SHORT_RUN)
def test_oncelog_answers_as_kafka(apache_kafka, oncelog_broker, seed, sequences):
    steps = generate(seed, sequences)
    report = compare_runs(steps, apache_kafka, oncelog_broker)
    print(report.summary())
    assert report.sequences == sequences
    assert not report.differences, "\n".join(map(str, report.differences))
    # the run compared what it was built to: every kind of request answered on both sides
    assert report.compared > 20 * sequences
    assert {"create_topics", "produce", "fetch", "list_offsets", "init_pid", "end_txn",
            "join_group", "offset_commit", "offset_fetch"} <= set(report.ops)


def test_the_short_run_draws_every_flow():
    drawn: set[str] = set()
    for seed, sequences in SHORT_RUN:
        for steps in generate(seed, sequences):
            drawn |= {s.op for s in steps}
            drawn |= {f"{s.op} v{s.args['version']}" for s in steps if "version" in s.args}
            drawn |= {f"produce {s.args['batch'].get('mutate')}" for s in steps
                      if s.op == "produce"}
    # a step of each flow (admin, autocreate, produce, idempotent, txn, txn_v2, open_txn,
    # group), and each kind of bad batch
    assert {"create_partitions", "alter_configs", "describe_configs", "delete_topics",
            "metadata_autocreate", "produce crc", "produce magic", "produce delta",
            "init_pid", "add_partitions", "produce v12", "end_txn v5", "add_offsets",
            "txn_offset_commit", "describe_transactions", "heartbeat", "sync_group",
            "leave_group"} <= drawn, sorted(drawn)


def test_sequences_are_a_function_of_the_seed():
    assert generate(7, 5) == generate(7, 5)
    assert generate(7, 5) != generate(8, 5)
    # a sequence replays alone (--first N --sequences 1) as it ran within the whole run
    assert generate(7, 1, first=3)[0] == generate(7, 5)[3]


def test_a_broker_that_answers_otherwise_is_caught():
    """Two oncelog brokers whose auto-created topics differ (num.partitions 1 and 3): the
    comparison names the fields that differ, and nothing else."""
    steps = [s for s in generate(1, 40, flows=["autocreate"])]
    with EmbeddedBroker(config={**ONCELOG_SETTINGS}) as one, \
            EmbeddedBroker(config={**ONCELOG_SETTINGS, "num.partitions": "3"}) as three:
        report = compare_runs(steps[:3], one.bootstrap_servers, three.bootstrap_servers)
    assert report.differences
    paths = {p for d in report.differences for p, _a, _b in d.fields}
    assert paths == {".topics[0].partitions"}, paths
    assert all(d.request.startswith("metadata(") for d in report.differences)


def test_admin_describes_a_transactional_id_with_no_open_transaction_on_kafka(apache_kafka):
    """Kafka answers -1 as the start time of a transaction not open, which oncelog's decoder
    refused (the differential test found it): oncelog's admin client describes the id."""
    side = Side("kafka", apache_kafka, f"dx{uuid.uuid4().hex[:8]}-",
                (int(time.time()) - 3600) * 1000)
    try:
        side.step(W("coordinator", key="x", key_type=1))
        assert side.step(S("init_pid", pid="a", txn="x"))["error_code"] == 0
    finally:
        side.close()
    with Admin(bootstrap_servers=apache_kafka) as admin:
        d = admin.describe_transactions([side.name("x")])[side.name("x")]
    assert (d.state, d.producer_epoch, d.start_ms, d.partitions) == ("Empty", 0, None,
                                                                      frozenset())
