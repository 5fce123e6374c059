"""The SCRAM users' ZooKeeper store (cluster/zk_user_configs.py) against a real ZooKeeper:
Kafka's znodes, changes on the condition of the entity's version, and the change notifications
another broker's store follows."""

from __future__ import annotations

import threading
import uuid

from support.waiting import wait_until

from oncelog.cluster.zk_client import KafkaZkClient
from oncelog.cluster.zk_user_configs import ZkScramStore


def test_two_brokers_stores(zookeeper_server):
    connect = f"{zookeeper_server.connect_string}/scram-store-{uuid.uuid4().hex[:8]}"
    with KafkaZkClient(connect) as zk1, KafkaZkClient(connect) as zk2:
        one, two = ZkScramStore(zk1.zk), ZkScramStore(zk2.zk)
        seen: list[tuple[str, dict]] = []
        lock = threading.Lock()

        def on_change(user, config):
            with lock:
                seen.append((user, config))

        two.watch(on_change)
        assert one.fetch("a/b c") == ({}, -1)
        assert one.change("a/b c", {"SCRAM-SHA-256": "x"}, -1)
        assert not one.change("a/b c", {"SCRAM-SHA-256": "y"}, -1)  # exists already
        config, version = two.fetch("a/b c")
        assert (config, version) == ({"SCRAM-SHA-256": "x"}, 0)
        assert two.change("a/b c", {"SCRAM-SHA-512": "z"}, 0)
        assert not one.change("a/b c", {}, 0)  # stale: the other broker wrote first
        assert one.load_all() == {"a/b c": {"SCRAM-SHA-512": "z"}}
        assert zk1.zk.exists("/config/users/a%2Fb%20c") is not None
        # The users file's seed: only for a user ZooKeeper never held.
        one.seed({"seeded": {"SCRAM-SHA-256": "s"}, "a/b c": {"SCRAM-SHA-256": "seed"}})
        two.seed({"seeded": {"SCRAM-SHA-256": "t"}})
        assert one.load_all() == {"a/b c": {"SCRAM-SHA-512": "z"},
                                  "seeded": {"SCRAM-SHA-256": "s"}}
        wait_until(lambda: len(seen) >= 3, 10, "three notifications followed")
        # Each notification reloads the user as ZooKeeper holds it when read.
        assert [u for u, _ in seen] == ["a/b c", "a/b c", "seeded"]
        assert seen[-1] == ("seeded", {"SCRAM-SHA-256": "s"})
