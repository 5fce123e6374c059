"""ListGroups v5 (KIP-848's types filter, with v4's states filter of KIP-518): every group of
ours is a classic one; both filters case-insensitive, as Kafka's. Through confluent-kafka's
AdminClient, our Admin and the wire."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient
from support.raw_wire import RawConnection

from oncelog import Admin, NewTopic
from oncelog.protocol import ApiKey, make, request_module
from oncelog.server.embedded import EmbeddedBroker

try:
    from confluent_kafka import ConsumerGroupState, ConsumerGroupType
except ImportError:  # older confluent-kafka
    from confluent_kafka.admin import ConsumerGroupState, ConsumerGroupType  # type: ignore


@pytest.fixture(scope="module")
def groups(tmp_path_factory):
    """A Stable group with a member ("live") and an Empty one with offsets only ("offsets")."""
    with EmbeddedBroker(data_dir=tmp_path_factory.mktemp("groups") / "data", config={
            "group.initial.rebalance.delay.ms": "0", "offsets.topic.num.partitions": "2"}) as b:
        with Admin(bootstrap_servers=b.bootstrap_servers) as admin:
            admin.create_topics([NewTopic("lg", num_partitions=1)])
        conf = {"bootstrap.servers": b.bootstrap_servers, "enable.auto.commit": False}
        offsets = Consumer(dict(conf, **{"group.id": "offsets"}))
        offsets.commit(offsets=[TopicPartition("lg", 0, 0)], asynchronous=False)
        offsets.close()
        live = Consumer(dict(conf, **{"group.id": "live", "session.timeout.ms": 6000}))
        live.subscribe(["lg"])
        deadline = time.monotonic() + 30
        while not live.assignment() and time.monotonic() < deadline:
            live.poll(0.2)
        assert live.assignment()
        try:
            yield b
        finally:
            live.close()


def test_confluent_admin_filters_by_type_and_state(groups):
    admin = AdminClient({"bootstrap.servers": groups.bootstrap_servers})
    result = admin.list_consumer_groups(types={ConsumerGroupType.CLASSIC}).result()
    listed = {g.group_id: (g.state, g.type, g.is_simple_consumer_group) for g in result.valid}
    assert listed == {
        "live": (ConsumerGroupState.STABLE, ConsumerGroupType.CLASSIC, False),
        "offsets": (ConsumerGroupState.EMPTY, ConsumerGroupType.CLASSIC, True)}
    assert admin.list_consumer_groups(types={ConsumerGroupType.CONSUMER}).result().valid == []
    stable = admin.list_consumer_groups(states={ConsumerGroupState.STABLE},
                                        types={ConsumerGroupType.CLASSIC}).result().valid
    assert [g.group_id for g in stable] == ["live"]


def test_our_admin_lists_consumer_groups(groups):
    with Admin(bootstrap_servers=groups.bootstrap_servers) as admin:
        everything = admin.list_consumer_groups()
        assert [(g.group_id, g.state, g.type, g.is_simple_consumer_group)
                for g in everything] == [("live", "Stable", "classic", False),
                                         ("offsets", "Empty", "classic", True)]
        assert [g.group_id for g in admin.list_consumer_groups(states=["empty"])] == ["offsets"]
        assert admin.list_consumer_groups(types=["consumer"]) == []
        assert len(admin.list_consumer_groups(types=["Classic"], states=["Stable", "Empty"])) \
            == 2


def test_list_groups_v5_on_the_wire(groups):
    mod = request_module(ApiKey.LIST_GROUPS, 5)
    with RawConnection(groups.bootstrap_servers) as conn:
        r = conn.request(make(mod.ListGroupsRequest, states_filter=(), types_filter=()))
        assert {(g.group_id, g.group_state, g.group_type) for g in r.groups} == {
            ("live", "Stable", "classic"), ("offsets", "Empty", "classic")}
        r = conn.request(make(mod.ListGroupsRequest, states_filter=(),
                              types_filter=("share", "no-such-type")))
        assert r.error_code == 0 and r.groups == ()


def test_the_cli_lists_with_kafkas_columns(groups):
    def run(*args):
        out = subprocess.run([sys.executable, "-m", "oncelog.cli.main", "consumer-groups",
                              "--bootstrap-server", groups.bootstrap_servers, "--list", *args],
                             capture_output=True, text=True, timeout=60, check=False)
        assert out.returncode == 0, out.stderr
        return [line.split() for line in out.stdout.splitlines()]

    assert run() == [["live"], ["offsets"]]
    assert run("--state", "stable") == [["GROUP", "STATE"], ["live", "Stable"]]
    assert run("--type", "classic", "--state") == [
        ["GROUP", "TYPE", "STATE"], ["live", "classic", "Stable"],
        ["offsets", "classic", "Empty"]]
    assert run("--type", "consumer") == [["GROUP", "TYPE"]]
