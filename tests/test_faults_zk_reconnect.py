"""A broker that registers again while another broker's ZooKeeper connection comes back must
reach that broker's view (issue 31's fault runs: after pause-zk and kill-zk, a partition stayed
offline for good, leader -1 with both ISR members alive and registered, because the controller's
view of the live brokers had missed their registrations).

kazoo's ChildrenWatch re-arms its watch on a thread of its own after a reconnection and calls
back only when the ids differ from those it saw before the connection went; the view's read of
the registrations on reconnection raced with that re-arming. The tests hold the re-arming back
(as a busy machine's scheduling did in the runs) while a broker registers again under its id,
or while a topic is created again under its name.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kazoo.client import KazooState
from kazoo.recipe.watchers import ChildrenWatch
from support.waiting import wait_until

from oncelog.cluster.metadata_view import MetadataView
from oncelog.cluster.zk_client import KafkaZkClient
from oncelog.harness.relay import Relay


@pytest.fixture
def gate(monkeypatch: Any) -> Iterator[threading.Event]:
    """kazoo's ChildrenWatch re-arms after a reconnection only once the gate is set."""
    gate = threading.Event()
    original = ChildrenWatch._session_watcher

    def late(self: ChildrenWatch, state: str) -> None:
        if state == KazooState.CONNECTED:
            threading.Thread(target=lambda: (gate.wait(30), original(self, state)),
                             daemon=True).start()
        else:
            original(self, state)

    monkeypatch.setattr(ChildrenWatch, "_session_watcher", late)
    yield gate
    gate.set()


def test_registration_during_reconnection_reaches_the_view(zookeeper_server: Any,
                                                           gate: threading.Event) -> None:
    chroot = f"/t-{uuid.uuid4().hex[:10]}"
    zk_host, zk_port = zookeeper_server.connect_string.rsplit(":", 1)
    opened: list[KafkaZkClient] = []
    seen: list[dict[int, Any]] = []
    try:
        with Relay("127.0.0.1", 0, zk_host, int(zk_port)) as relay:
            direct = f"{zookeeper_server.connect_string}{chroot}"
            watcher = KafkaZkClient(f"{relay.address}{chroot}", session_timeout_s=30.0)
            opened.append(watcher)
            broker = KafkaZkClient(direct, session_timeout_s=4.0)
            opened.append(broker)
            first = broker.brokers.register(2, "127.0.0.1", 9092)
            watcher.brokers.watch(lambda brokers: seen.append(dict(brokers)))
            wait_until(lambda: seen and seen[-1].get(2) == first, 10, "broker 2 seen")

            relay.cut()  # the watcher's connection goes; its session lives on
            wait_until(lambda: not watcher.zk.connected, 10, "the watcher disconnected")
            broker.close()  # broker 2's session ends meanwhile: its registration goes
            relay.heal()
            wait_until(lambda: watcher.zk.connected and seen[-1] == {}, 20,
                       "the watcher back, broker 2 gone from its view")

            again = KafkaZkClient(direct, session_timeout_s=4.0)  # broker 2 back, same id
            opened.append(again)
            second = again.brokers.register(2, "127.0.0.1", 9092)
            gate.set()
            wait_until(lambda: seen[-1].get(2) == second, 10,
                       f"broker 2's new registration in the view (last: {seen[-1]})")
    finally:
        gate.set()
        for store in opened:
            store.close()


def test_topic_created_again_during_reconnection_reaches_the_view(zookeeper_server: Any,
                                                                  gate: threading.Event) -> None:
    # The view's record of a topic goes when its znode's watch sees it deleted; the topic
    # created again under its name must come back through the watch on /brokers/topics.
    chroot = f"/t-{uuid.uuid4().hex[:10]}"
    zk_host, zk_port = zookeeper_server.connect_string.rsplit(":", 1)
    opened: list[KafkaZkClient] = []
    try:
        with Relay("127.0.0.1", 0, zk_host, int(zk_port)) as relay:
            admin = KafkaZkClient(f"{zookeeper_server.connect_string}{chroot}")
            opened.append(admin)
            watcher = KafkaZkClient(f"{relay.address}{chroot}", session_timeout_s=30.0)
            opened.append(watcher)
            first = admin.topics.create("t", {0: [1]})
            view = MetadataView(watcher)
            view.wait_for(lambda v: "t" in v.topics
                          and v.topics["t"].topic_id == first.topic_id, 10)

            relay.cut()  # the watcher's connection goes; its session lives on
            wait_until(lambda: not watcher.zk.connected, 10, "the watcher disconnected")
            assert admin.topics.delete_znodes("t")
            relay.heal()
            view.wait_for(lambda v: "t" not in v.topics, 20)
            wait_until(lambda: watcher.zk.connected, 20, "the watcher back")

            second = admin.topics.create("t", {0: [1]})  # the same name, a new topic
            gate.set()
            view.wait_for(lambda v: "t" in v.topics
                          and v.topics["t"].topic_id == second.topic_id, 10)
            view.close()
    finally:
        for store in opened:
            store.close()
