"""``oncelog topics describe`` against a real broker: Kafka's kafka-topics.sh --describe lines
(topic id, only the configs that are not defaults) and ``--offsets`` (log start, high watermark,
last stable offset, open transactions), in text and JSON."""

from __future__ import annotations

import base64
import json

import pytest
from support.cli import broker, oncelog  # noqa: F401 (broker: a fixture)

from oncelog import Admin, Producer


@pytest.mark.slow  # ~15 runs of the command, ~0.3 s each
def test_describe_prints_the_topic_id_and_only_overridden_configs(broker):  # noqa: F811
    bs = ["--bootstrap-server", broker.bootstrap_servers]
    oncelog("topics", "create", *bs, "--topic", "described", "--partitions", "2",
            "--config", "retention.ms=3600000", "--config", "cleanup.policy=compact")
    oncelog("topics", "create", *bs, "--topic", "plain")
    with Admin(bootstrap_servers=broker.bootstrap_servers) as admin:
        topic_id = admin.describe_topics(["described"])["described"].topic_id
    kafka_id = base64.urlsafe_b64encode(topic_id.bytes).decode().rstrip("=")
    lines = oncelog("topics", "describe", *bs, "--topic", "described").stdout.splitlines()
    assert lines == [
        (f"Topic: described\tTopicId: {kafka_id}\tPartitionCount: 2\tReplicationFactor: 1\t"
         "Configs: cleanup.policy=compact,retention.ms=3600000"),
        "\tTopic: described\tPartition: 0\tLeader: 1\tReplicas: 1\tIsr: 1",
        "\tTopic: described\tPartition: 1\tLeader: 1\tReplicas: 1\tIsr: 1",
    ]
    plain = oncelog("topics", "describe", *bs, "--topic", "plain").stdout.splitlines()[0]
    assert plain.endswith("\tReplicationFactor: 1\tConfigs: ")  # every config a default
    js = json.loads(oncelog("topics", "describe", *bs, "--topic", "described", "--output",
                            "json").stdout)
    assert js[0]["topic_id"] == kafka_id and js[0]["configs"] == {
        "cleanup.policy": "compact", "retention.ms": "3600000"}
    assert js[0]["partitions"][1] == {"partition": 1, "leader": 1, "replicas": [1], "isr": [1]}
    missing = oncelog("topics", "describe", *bs, "--topic", "nope", check=False)
    assert missing.returncode == 1
    assert "UNKNOWN_TOPIC_OR_PARTITION" in missing.stderr and "does not exist" in missing.stderr


def test_offsets_show_the_open_transaction_that_holds_the_lso(broker):  # noqa: F811
    bs = ["--bootstrap-server", broker.bootstrap_servers]
    oncelog("topics", "create", *bs, "--topic", "held", "--partitions", "2")
    oncelog("produce", *bs, "--topic", "held", "--partition", "0", stdin="a\nb\n")
    oncelog("delete-records", *bs, "--topic", "held", "--partition", "0", "--offset", "1")
    with Producer(bootstrap_servers=broker.bootstrap_servers, transactional_id="holder") as p:
        p.init_transactions()
        p.begin_transaction()
        p.send("held", b"open", partition=0).result()
        p.send("held", b"open", partition=0).result()
        with Admin(bootstrap_servers=broker.bootstrap_servers) as admin:
            pid = admin.describe_transactions(["holder"])["holder"].producer_id
        out = oncelog("topics", "describe", *bs, "--topic", "held", "--offsets").stdout
        lines = out.splitlines()
        assert [c.strip() for c in lines[0].split("\t")][:-1] == [
            "Topic", "Partition", "LogStartOffset", "HighWatermark", "LastStableOffset",
            "OpenTransactions", "OldestTxnProducerId", "OldestTxnStartOffset"]
        rows = [[c.strip() for c in line.split("\t")][:-1] for line in lines[1:]]
        assert rows == [["held", "0", "1", "4", "2", "1", str(pid), "2"],
                        ["held", "1", "0", "0", "0", "0", "-", "-"]]
        # aligned: every line's columns start at the same places
        assert len({len(line) for line in lines}) == 1
        js = json.loads(oncelog("topics", "describe", *bs, "--topic", "held", "--offsets",
                                "--output", "json").stdout)
        assert js[0] == {"Topic": "held", "Partition": 0, "LogStartOffset": 1,
                         "HighWatermark": 4, "LastStableOffset": 2, "OpenTransactions": 1,
                         "OldestTxnProducerId": pid, "OldestTxnStartOffset": 2}
        print(out)  # the table, for the record (pytest -s)
        p.commit_transaction()
    out = oncelog("topics", "describe", *bs, "--topic", "held", "--offsets").stdout
    row = [c.strip() for c in out.splitlines()[1].split("\t")][:-1]
    assert row == ["held", "0", "1", "5", "5", "0", "-", "-"]  # the commit marker: 4
