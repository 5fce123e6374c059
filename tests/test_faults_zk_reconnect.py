"""A broker that registers again while another broker's ZooKeeper connection comes back must
reach that broker's view (issue 31's fault runs: after pause-zk and kill-zk, a partition stayed
offline for good, leader -1 with both ISR members alive and registered, because the controller's
view of the live brokers had missed their registrations).

kazoo's ChildrenWatch re-arms its watch on a thread of its own after a reconnection and calls
back only when the ids differ from those it saw before the connection went; the view's read of
the registrations on reconnection raced with that re-arming. The test holds the re-arming back
(as a busy machine's scheduling did in the runs) while a broker registers again under its id.
"""

from __future__ import annotations

import threading
import uuid
from typing import Any

from kazoo.client import KazooState
from kazoo.recipe.watchers import ChildrenWatch
from support.waiting import wait_until

from oncelog.cluster.zk_client import KafkaZkClient
from oncelog.harness.relay import Relay


def test_registration_during_reconnection_reaches_the_view(zookeeper_server: Any,
                                                           monkeypatch: Any) -> None:
    chroot = f"/t-{uuid.uuid4().hex[:10]}"
    zk_host, zk_port = zookeeper_server.connect_string.rsplit(":", 1)
    gate = threading.Event()
    original = ChildrenWatch._session_watcher

    def late(self: ChildrenWatch, state: str) -> None:
        if state == KazooState.CONNECTED:
            threading.Thread(target=lambda: (gate.wait(30), original(self, state)),
                             daemon=True).start()
        else:
            original(self, state)

    monkeypatch.setattr(ChildrenWatch, "_session_watcher", late)
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
