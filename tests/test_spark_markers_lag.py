"""The Spark sink's markers as operators see them, without Spark: offsets committed (as the
sink commits them, batch id + 1) for ``__oncelog_spark_batches``, a topic nothing is written
to. The topic is internal in Metadata and left out of ``oncelog topics list --exclude-internal``; its offsets have
no lag in ``oncelog groups describe``, the console's Groups page and the lag metric (they
showed -5), while an ordinary group's lag is still shown. (tests/test_spark_bookkeeping.py does
the same through a real Spark query.)"""

from __future__ import annotations

import json
import re
import urllib.request

import pytest
from support.cli import oncelog

from oncelog import Admin, Consumer, NewTopic, Producer, TopicPartition
from oncelog.server.embedded import EmbeddedBroker
from oncelog.spark_markers import MARKER_TOPIC

MARKER_GROUP = "oncelog-spark-0123456789abcdef-batches-0"


@pytest.fixture(scope="module")
def broker():
    with EmbeddedBroker(config={"console.port": "0", "metrics.port": "0",
                                "offsets.topic.num.partitions": "2"}) as b:
        bs = b.bootstrap_servers
        with Admin(bootstrap_servers=bs) as a:
            a.create_topics([NewTopic(MARKER_TOPIC, 1), NewTopic("orders", 1)])
        with Producer(bootstrap_servers=bs) as p:
            for i in range(3):
                p.send("orders", value=f"o{i}")
        with Consumer(bootstrap_servers=bs, group_id=MARKER_GROUP,
                      enable_auto_commit=False) as c:
            c.commit({TopicPartition(MARKER_TOPIC, 0): 5})  # micro-batch 4 written
        with Consumer(bootstrap_servers=bs, group_id="readers", enable_auto_commit=False) as c:
            c.commit({TopicPartition("orders", 0): 1})
        yield b


def test_the_marker_topic_is_internal_and_left_out_of_listings(broker):
    bs = broker.bootstrap_servers
    with Admin(bootstrap_servers=bs) as a:
        assert a.describe_topics([MARKER_TOPIC])[MARKER_TOPIC].internal
        assert not a.describe_topics(["orders"])["orders"].internal
        assert MARKER_TOPIC not in a.list_topics()
        assert MARKER_TOPIC in a.list_topics(include_internal=True)
    # as kafka-topics --list: internal topics are listed, and left out by --exclude-internal
    listed = oncelog("topics", "list", "--bootstrap-server", bs).stdout.split()
    assert "orders" in listed and MARKER_TOPIC in listed and "__consumer_offsets" in listed
    listed = oncelog("topics", "list", "--exclude-internal", "--bootstrap-server", bs).stdout.split()
    assert "orders" in listed and MARKER_TOPIC not in listed


def test_marker_offsets_have_no_lag_in_the_cli_console_and_metrics(broker):
    bs = broker.bootstrap_servers
    rows = json.loads(oncelog("groups", "describe", "--bootstrap-server", bs, "--all-groups",
                              "--output", "json").stdout)
    by_group = {r["group"]: r for r in rows}
    assert by_group[MARKER_GROUP]["current_offset"] == 5
    assert by_group[MARKER_GROUP]["log_end_offset"] == 0
    assert by_group[MARKER_GROUP]["lag"] is None
    assert by_group["readers"]["lag"] == 2
    table = oncelog("groups", "describe", "--bootstrap-server", bs, "--group",
                    MARKER_GROUP).stdout
    assert not re.search(r"\s-\d", table), table

    with urllib.request.urlopen(f"http://127.0.0.1:{broker.server.console.port}/groups",
                                timeout=10) as r:
        body = r.read().decode()
    assert f'data-group="{MARKER_GROUP}"' in body
    assert not re.search(r'data-lag="-\d', body) and "total lag -" not in body

    with urllib.request.urlopen(f"http://127.0.0.1:{broker.server.metrics_port}/metrics",
                                timeout=10) as r:
        text = r.read().decode()
    lags = re.findall(r'^oncelog_consumer_group_lag\{group="([^"]*)".*\} (-?\d+)$', text,
                      re.MULTILINE)
    assert ("readers", "2") in lags
    assert [g for g, _ in lags if g == MARKER_GROUP] == []
