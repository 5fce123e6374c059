"""Cluster mode's ZooKeeper side (oncelog.cluster): the controller's decisions as plain
functions, and the ZooKeeper data model, watches and controller against a REAL ZooKeeper
(Debian's, started once for this module; skipped only when it is not installed).

Each test works under a chroot of its own. Sessions that must expire are short (2 s); "killed"
brokers are cut off from ZooKeeper by a TCP proxy, so their sessions expire on the server as a
crashed broker's would.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from types import MappingProxyType
from typing import Any

import pytest
from kazoo.exceptions import KazooException
from support.waiting import wait_until

from oncelog.cluster.controller import Controller, create_topic
from oncelog.cluster.election import (
    InvalidReplicationFactorError,
    assign_replicas,
    elect_leader,
    initial_state,
    new_partition_states,
    on_brokers_changed,
    partition_change,
)
from oncelog.cluster.errors import (
    BrokerIdInUseError,
    ClusterConnectionError,
    ControllerMovedError,
    TopicExistsError,
    UnknownTopicError,
)
from oncelog.cluster.metadata_view import MetadataView
from oncelog.cluster.model import BrokerInfo, ClusterView, LeaderAndIsr
from oncelog.cluster.zk_client import KafkaZkClient
from oncelog.cluster.zk_data import (
    BrokerIdZNode,
    ClusterIdZNode,
    ConfigEntityZNode,
    ConfigType,
    ControllerEpochZNode,
    ControllerZNode,
    DeleteTopicsTopicZNode,
    ProducerIdBlockZNode,
    TopicPartitionStateZNode,
    TopicPartitionsZNode,
    TopicPartitionZNode,
    TopicZNode,
)
from oncelog.cluster.zookeeper_client import split_connect_string
from oncelog.harness.zookeeper import (
    ZooKeeperNotFoundError,
    ZooKeeperServer,
    find_zookeeper,
    running_server,
    stop_server,
)

L = LeaderAndIsr


# ================================================================================================
# The controller's decisions (no ZooKeeper)
# ================================================================================================


def test_assign_replicas_as_kafka() -> None:
    # AdminUtils' own test: 5 brokers, 10 partitions, 3 replicas, fixed start index 0.
    got = assign_replicas(10, 3, [0, 1, 2, 3, 4], start_index=0, start_shift=0)
    assert got == {0: [0, 1, 2], 1: [1, 2, 3], 2: [2, 3, 4], 3: [3, 4, 0], 4: [4, 0, 1],
                   5: [0, 2, 3], 6: [1, 3, 4], 7: [2, 4, 0], 8: [3, 0, 1], 9: [4, 1, 2]}
    # Broker ids are sorted first; the partitions go on from start_partition.
    assert assign_replicas(2, 2, [30, 10, 20], 0, 0, start_partition=3) == {3: [10, 30],
                                                                           4: [20, 10]}


def test_assign_replicas_spreads_leaders_and_replicas_evenly() -> None:
    for n_brokers, n_parts, rf in [(3, 6, 3), (3, 30, 2), (5, 50, 3), (4, 8, 1)]:
        brokers = list(range(1, n_brokers + 1))
        got = assign_replicas(n_parts, rf, brokers)
        assert sorted(got) == list(range(n_parts))
        leaders = [reps[0] for reps in got.values()]
        assert {leaders.count(b) for b in brokers} == {n_parts // n_brokers}
        counts = [sum(b in reps for reps in got.values()) for b in brokers]
        assert set(counts) == {n_parts * rf // n_brokers}
        assert all(len(set(reps)) == rf for reps in got.values())


def test_assign_replicas_refuses_more_replicas_than_brokers() -> None:
    with pytest.raises(InvalidReplicationFactorError, match="larger than available brokers"):
        assign_replicas(3, 3, [1, 2])
    with pytest.raises(InvalidReplicationFactorError):
        assign_replicas(3, 0, [1, 2])
    with pytest.raises(ValueError):
        assign_replicas(0, 1, [1, 2])
    assert assign_replicas(2, 1, [7]) == {0: [7], 1: [7]}


def test_initial_state() -> None:
    assert initial_state([3, 1, 2], {1, 2, 3}, controller_epoch=4) == L(3, 0, (3, 1, 2), 4)
    assert initial_state([3, 1, 2], {1, 2}) == L(1, 0, (1, 2), 0)
    assert initial_state([3, 1], {2}) is None


def test_elect_leader_from_the_isr_in_assignment_order() -> None:
    state = L(1, 5, (1, 3, 2), 1)
    # Leader 1 died: 2 comes before 3 in the assignment; the ISR loses 1, keeps its order.
    assert elect_leader([1, 2, 3], state, {2, 3}, 2) == L(2, 6, (3, 2), 2)
    # 2 is alive but out of the ISR: never elected (no unclean election).
    assert elect_leader([1, 2, 3], L(1, 5, (1, 3), 1), {2, 3}, 2) == L(3, 6, (3,), 2)
    # Nobody alive in the ISR: offline, ISR kept (its members hold every committed record).
    assert elect_leader([1, 2, 3], L(1, 5, (1, 3), 1), {2}, 2) == L(-1, 6, (1, 3), 2)
    # Offline still: nothing to write.
    assert elect_leader([1, 2, 3], L(-1, 6, (1, 3), 2), {2}, 2) is None
    # An ISR member is back: it leads, the ISR is the live part of the last one.
    assert elect_leader([1, 2, 3], L(-1, 6, (1, 3), 2), {2, 3}, 3) == L(3, 7, (3,), 3)
    # The leader lives: no election.
    assert elect_leader([1, 2, 3], state, {1, 2}, 2) is None
    # Controller epoch: the state's when not given.
    assert elect_leader([1, 2], L(1, 0, (1, 2), 7), {2}) == L(2, 1, (2,), 7)


def test_on_brokers_changed() -> None:
    assignments = {"a": {0: [1, 2, 3], 1: [2, 3, 1], 2: [3, 1, 2]}, "b": {0: [1, 2]}}
    states = {("a", 0): L(1, 0, (1, 2, 3), 1), ("a", 1): L(2, 3, (2, 3, 1), 1),
              ("a", 2): L(3, 0, (3, 1), 1), ("b", 0): L(-1, 4, (1,), 1),
              ("gone", 0): L(1, 0, (1,), 1)}
    got = on_brokers_changed(assignments, states, {2, 3}, controller_epoch=2)
    assert got == {
        ("a", 0): L(2, 1, (2, 3), 2),     # leader died: next in the ISR
        ("a", 1): L(2, 4, (2, 3), 2),     # leader lives: 1 out of the ISR, new leader epoch
        ("a", 2): L(3, 1, (3,), 2),
        # ("b", 0): offline, its only ISR member still dead: unchanged
    }
    # 1 comes back: b-0 elects it; nothing else changes (1 must catch up to rejoin ISRs).
    after = {**states, **got}
    got = on_brokers_changed(assignments, after, {1, 2, 3}, controller_epoch=3)
    assert got == {("b", 0): L(1, 5, (1,), 3)}
    # Everybody dead: every partition offline, ISRs kept.
    got = on_brokers_changed(assignments, after, set(), controller_epoch=3)
    assert got == {("a", 0): L(-1, 2, (2, 3), 3), ("a", 1): L(-1, 5, (2, 3), 3),
                   ("a", 2): L(-1, 2, (3,), 3)}


def test_bounced_broker_is_handled_as_failed_and_back() -> None:
    # 2 re-registered (new broker epoch) before the controller saw it gone.
    assert partition_change([2, 1], L(2, 3, (2, 1), 1), {1, 2}, 2, bounced={2}) == \
        L(1, 4, (1,), 2)
    assert partition_change([1, 2], L(1, 3, (1, 2), 1), {1, 2}, 2, bounced={2}) == \
        L(1, 4, (1,), 2)
    # The only ISR member bounced: offline and back in one write, at a new leader epoch.
    assert partition_change([2, 1], L(2, 3, (2,), 1), {1, 2}, 2, bounced={2}) == \
        L(2, 5, (2,), 2)
    assert partition_change([1, 3], L(1, 3, (1, 3), 1), {1, 2, 3}, 2, bounced={2}) is None


def test_new_partition_states() -> None:
    assignments = {"a": {0: [1, 2], 1: [2, 1]}, "b": {0: [3]}}
    got = new_partition_states(assignments, {("a", 0)}, {1, 2}, 5)
    assert got == {("a", 1): L(2, 0, (2, 1), 5)}  # b-0: no live replica yet


def test_json_encodings_are_kafkas() -> None:
    assert json.loads(BrokerIdZNode.encode("h", 9092)) == {
        "version": 5, "host": "h", "port": 9092, "endpoints": ["PLAINTEXT://h:9092"],
        "listener_security_protocol_map": {"PLAINTEXT": "PLAINTEXT"}, "rack": None}
    # Kafka leaves host and port null and -1 without a PLAINTEXT listener
    ssl = BrokerIdZNode.encode("h", 9093, security_protocol="SSL")
    assert json.loads(ssl) == {
        "version": 5, "host": None, "port": -1, "endpoints": ["SSL://h:9093"],
        "listener_security_protocol_map": {"SSL": "SSL"}, "rack": None}
    assert (BrokerIdZNode.decode(1, ssl).host, BrokerIdZNode.decode(1, ssl).port) == ("h", 9093)
    assert TopicPartitionStateZNode.encode(L(1, 3, (1, 2, 3), 2)) == \
        b'{"version":1,"leader":1,"leader_epoch":3,"isr":[1,2,3],"controller_epoch":2}'
    assert TopicPartitionStateZNode.decode(
        TopicPartitionStateZNode.encode(L(-1, 0, (4,), 9))) == L(-1, 0, (4,), 9)
    assert json.loads(ProducerIdBlockZNode.encode(2, 1000, 1999)) == {
        "version": 1, "broker": 2, "block_start": 1000, "block_end": 1999}
    assert split_connect_string("a:1,b:2/x/y/") == ("a:1,b:2", "/x/y")
    assert split_connect_string("a:1") == ("a:1", "")


def test_every_znode_keeps_its_bytes_and_path() -> None:
    # What clusters already hold in ZooKeeper: the codec must read and write it unchanged.
    tid = uuid.UUID("12345678-1234-5678-1234-567812345678")
    assert TopicZNode.encode({1: [3, 2], 0: [1, 2]}, tid) == (
        b'{"version":2,"topic_id":"12345678-1234-5678-1234-567812345678",'
        b'"partitions":{"0":[1,2],"1":[3,2]}}')
    # Kafka's topic ids are URL-safe base64.
    assert TopicZNode.decode(b'{"version":2,"topic_id":"EjRWeBI0VngSNFZ4EjRWeA",'
                             b'"partitions":{"0":[1]}}') == (tid, {0: (1,)})
    assert ConfigEntityZNode.encode({"a": "1", "b": "x"}) == \
        b'{"version":1,"config":{"a":"1","b":"x"}}'
    assert ConfigEntityZNode.decode(None) == {}
    controller = json.loads(ControllerZNode.encode(7))
    assert controller["version"] == 1 and controller["brokerid"] == 7
    assert isinstance(controller["timestamp"], str) and ControllerZNode.decode(
        ControllerZNode.encode(7)) == 7
    assert ControllerEpochZNode.encode(12) == b"12" and ControllerEpochZNode.decode(b"12") == 12
    assert ClusterIdZNode.encode("abc") == b'{"version": "1", "id": "abc"}'
    assert ClusterIdZNode.decode(b'{"version": "1", "id": "abc"}') == "abc"
    # Kafka wrote the producer-id block's numbers as strings.
    assert ProducerIdBlockZNode.decode(
        b'{"version":1,"broker":"1","block_start":"0","block_end":"999"}') == (1, 0, 999)
    assert BrokerIdZNode.decode(3, b'{"version":5,"host":null,"port":-1,'
                                   b'"endpoints":["SASL://x:1"],"rack":null}', 9) == \
        BrokerInfo(3, "x", 1, None, 9, ("SASL://x:1",))
    assert [BrokerIdZNode.path(1), TopicZNode.path("t"),
            ConfigEntityZNode.path(ConfigType.TOPIC, "t"), TopicPartitionsZNode.path("t"),
            TopicPartitionZNode.path("t", 2), TopicPartitionStateZNode.path("t", 2),
            DeleteTopicsTopicZNode.path("t"), ControllerZNode.path(),
            ControllerEpochZNode.path(), ProducerIdBlockZNode.path(),
            ClusterIdZNode.path()] == [
        "/brokers/ids/1", "/brokers/topics/t", "/config/topics/t",
        "/brokers/topics/t/partitions", "/brokers/topics/t/partitions/2",
        "/brokers/topics/t/partitions/2/state", "/admin/delete_topics/t", "/controller",
        "/controller_epoch", "/latest_producer_id_block", "/cluster/id"]


def test_find_zookeeper_names_the_package_when_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    from oncelog.harness import zookeeper

    monkeypatch.delenv("ONCELOG_ZOOKEEPER_CLASSPATH", raising=False)
    monkeypatch.setattr(zookeeper, "DEBIAN_JAR", "/nonexistent/zookeeper.jar")
    with pytest.raises(ZooKeeperNotFoundError, match="apt-get install -y zookeeper"):
        find_zookeeper()
    monkeypatch.setenv("ONCELOG_ZOOKEEPER_CLASSPATH", "/opt/zk/a.jar:/opt/zk/b.jar")
    monkeypatch.setenv("JAVA_HOME", "/nonexistent")
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(ZooKeeperNotFoundError, match="no java"):
        find_zookeeper()


# ================================================================================================
# Against ZooKeeper
# ================================================================================================


@pytest.fixture
def zk_server(zookeeper_server: ZooKeeperServer) -> ZooKeeperServer:
    return zookeeper_server


@pytest.fixture
def connect(zk_server: ZooKeeperServer) -> str:
    return f"{zk_server.connect_string}/t-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def stores(connect: str) -> Iterator[Callable[..., KafkaZkClient]]:
    """A factory of KafkaZkClients (one ZooKeeper session each), all closed at the end."""
    opened: list[KafkaZkClient] = []

    def make(connect_string: str = connect, **kwargs: Any) -> KafkaZkClient:
        kwargs.setdefault("session_timeout_s", 4.0)
        kwargs.setdefault("op_timeout_s", 15.0)
        store = KafkaZkClient(connect_string, **kwargs)
        opened.append(store)
        return store

    yield make
    for store in opened:
        store.close()


@pytest.fixture
def controllers() -> Iterator[Callable[..., Controller]]:
    started: list[Controller] = []

    def make(store: KafkaZkClient, node_id: int, **kwargs: Any) -> Controller:
        kwargs.setdefault("resync_interval_s", 1.0)
        controller = Controller(store, node_id, **kwargs).start()
        started.append(controller)
        return controller

    yield make
    for controller in started:
        controller.stop()


class Blackhole:
    """A TCP proxy to ZooKeeper that can cut its clients off (their host vanished): their
    sessions then expire on the server while they cannot reach it."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.up = True
        self._closed = False
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._sock.settimeout(0.1)
        self.port = self._sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if not self.up:
                conn.close()
                continue
            try:
                upstream = socket.create_connection(self.target)
            except OSError:
                conn.close()
                continue
            with self._lock:
                self._conns += [conn, upstream]
            for a, b in ((conn, upstream), (upstream, conn)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()

    def cut(self) -> None:
        self.up = False
        with self._lock:
            conns, self._conns = self._conns, []
        for s in conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def restore(self) -> None:
        self.up = True

    def close(self) -> None:
        self._closed = True
        self.cut()
        self._sock.close()


def test_zookeeper_server_answers_and_stops_by_pid_file(zk_server: ZooKeeperServer,
                                                        tmp_path: Any) -> None:
    assert zk_server.four_letter_word("ruok") == "imok"
    assert running_server(zk_server.data_dir) == (zk_server.pid, zk_server.connect_string)
    # A server started "by another process": stopped through its pid file.
    other = ZooKeeperServer(tmp_path / "zk2", fsync=False, die_with_parent=True).start()
    pid = other.pid
    assert pid is not None and (tmp_path / "zk2" / "zookeeper.pid").read_text().strip() == str(pid)
    assert "clientPort=" in (tmp_path / "zk2" / "zoo.cfg").read_text()
    attached = ZooKeeperServer(tmp_path / "zk2")  # as `oncelog cluster down` would
    assert attached.pid == pid and attached.connect_string == other.connect_string
    assert attached.is_running()
    attached.stop(timeout=10)
    assert not attached.is_running()
    assert other._proc is not None and other._proc.wait(timeout=10) is not None
    other._proc = None
    assert running_server(tmp_path / "zk2") is None
    assert not stop_server(tmp_path / "zk2")
    assert (tmp_path / "zk2" / "zookeeper.log").stat().st_size > 0


def test_chroot_is_created_with_kafkas_paths(stores: Callable[..., KafkaZkClient],
                                             connect: str) -> None:
    store = stores()
    chroot = split_connect_string(connect)[1]
    raw = store.zk.client
    for path in ("/brokers/ids", "/brokers/topics", "/config/topics", "/admin/delete_topics",
                 "/latest_producer_id_block"):
        assert raw.exists(chroot + path) is not None, path
    assert store.zk.path("/controller") == chroot + "/controller"


def test_registration_is_ephemeral_and_exclusive(stores: Callable[..., KafkaZkClient]) -> None:
    a, b = stores(), stores()
    info = a.brokers.register(1, "127.0.0.1", 9092, rack="r1")
    assert info.epoch > 0
    data, stat = a.zk.get("/brokers/ids/1")
    assert json.loads(data) == {"version": 5, "host": "127.0.0.1", "port": 9092,
                                "endpoints": ["PLAINTEXT://127.0.0.1:9092"],
                                "listener_security_protocol_map": {"PLAINTEXT": "PLAINTEXT"},
                                "rack": "r1"}
    assert stat.ephemeralOwner == a.zk.session_id
    assert b.brokers.live()[1].rack == "r1" and b.brokers.live()[1].port == 9092
    with pytest.raises(BrokerIdInUseError, match="another live ZooKeeper session"):
        b.brokers.register(1, "127.0.0.1", 9093)
    # Registering again from the same session is fine (a retried create).
    assert a.brokers.register(1, "127.0.0.1", 9092, rack="r1").epoch == info.epoch
    b.brokers.register(2, "127.0.0.1", 9093)
    assert sorted(b.brokers.live()) == [1, 2]
    a.close()  # the session ends: the znode goes at once
    assert sorted(b.brokers.live()) == [2]
    # ...and the id is free again; waiting for a stale one works too.
    c = stores()
    assert c.brokers.register(1, "127.0.0.1", 9094, timeout_s=1.0).port == 9094


def test_only_the_owning_session_deletes_its_ephemeral_znode(
        stores: Callable[..., KafkaZkClient]) -> None:
    """ZooKeeperClient.delete_if_owned, what a broker's unregister and a controller's resign
    do: another session's registration or ``/controller`` stays."""
    a, b = stores(), stores()
    a.brokers.register(1, "127.0.0.1", 9092)
    b.brokers.register(2, "127.0.0.1", 9093)
    assert not b.zk.delete_if_owned("/brokers/ids/1")
    assert not a.zk.delete_if_owned("/brokers/ids/9")  # not there
    assert sorted(b.brokers.live()) == [1, 2]
    lease = b.election.campaign(2)
    assert lease is not None
    a.election.resign(lease)  # not a's: /controller stays b's
    assert a.election.controller_id() == 2
    b.brokers.unregister()
    assert sorted(a.brokers.live()) == [1]
    assert a.zk.delete_if_owned("/brokers/ids/1") and a.brokers.live() == {}
    b.election.resign(lease)
    assert a.election.controller_id() is None


def test_unreachable_zookeeper() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nobody listens there
    with pytest.raises(ClusterConnectionError, match="cannot reach ZooKeeper"):
        KafkaZkClient(f"127.0.0.1:{port}/x", connect_timeout_s=0.5)


def test_controller_election_and_failover(stores: Callable[..., KafkaZkClient]) -> None:
    a, b, c = stores(), stores(), stores()
    assert a.election.controller_id() is None and a.election.controller_epoch() is None
    assert a.election.elect(1) == 1
    data, _ = a.zk.get("/controller")
    parsed = json.loads(data)
    assert parsed["version"] == 1 and parsed["brokerid"] == 1 and parsed["timestamp"].isdigit()
    assert a.zk.get("/controller_epoch")[0] == b"1"
    assert b.election.elect(2) is None and c.election.elect(3) is None
    assert a.election.elect(1) == 1  # already ours: the same epoch
    assert c.election.controller_id() == 1
    a.close()
    assert wait_until(lambda: b.election.controller_id() is None, 5)
    # Two racing for it: exactly one wins, the epoch grows by one.
    results: dict[int, int | None] = {}
    threads = [threading.Thread(target=lambda s=s, i=i: results.__setitem__(
        i, s.election.elect(i))) for i, s in ((2, b), (3, c))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [i for i, e in results.items() if e is not None]
    assert len(winners) == 1 and results[winners[0]] == 2
    assert b.election.controller_id() == winners[0]


@pytest.mark.slow
def test_killed_broker_session_expires_controller_fails_over_and_it_registers_again(
        zk_server: ZooKeeperServer, connect: str, stores: Callable[..., KafkaZkClient],
        controllers: Callable[..., Controller]) -> None:
    proxy = Blackhole((zk_server.host, zk_server.port))
    try:
        chroot = split_connect_string(connect)[1]
        b = stores()  # (creates the chroot)
        a = stores(f"127.0.0.1:{proxy.port}{chroot}", session_timeout_s=2.0, op_timeout_s=1.0)
        lost: list[str] = []
        a.zk.add_session_listener(lost.append)
        a.brokers.register(1, "127.0.0.1", 9001)
        b.brokers.register(2, "127.0.0.1", 9002)
        view = MetadataView(a)
        assert sorted(view.start().brokers) == [1, 2]
        ca = controllers(a, 1)
        assert ca.wait_active(5)
        cb = controllers(b, 2)
        b.topics.create("t", {0: [1, 2]}, uuid.uuid4(), {})
        view.wait_for(lambda v: v.state("t", 0) == L(1, 0, (1, 2), 1), 5)
        old_epoch = view.view.brokers[1].epoch

        proxy.cut()  # broker 1's host is gone: no goodbye to ZooKeeper
        started = time.monotonic()
        # Calls give up after op_timeout_s (kazoo's would wait for the connection for ever).
        with pytest.raises(KazooException):
            a.brokers.live()
        wait_until(lambda: cb.active, 8, "broker 2 to take over as controller")
        assert time.monotonic() - started > 1.5  # the session timeout, not at once
        assert cb.epoch == 2
        wait_until(lambda: b.partition_states.get("t", 0) == (L(2, 1, (2,), 2), 1), 5,
                   "broker 2 to lead t-0")
        b.topics.create("meanwhile", {0: [2]}, uuid.uuid4(), {})

        proxy.restore()
        # Broker 1 comes back: its session expired, it registers again on a new one (a new
        # broker epoch), its controller knows it is not the controller any more, its watches
        # are set again and catch up.
        wait_until(lambda: 1 in b.brokers.live(), 10, "broker 1 to register again")
        assert "LOST" in lost
        assert b.brokers.live()[1].epoch > old_epoch
        wait_until(lambda: not ca.active, 5, "broker 1 to know it is not the controller")
        assert a.election.elect(1) is None and a.election.controller_id() == 2
        v = view.wait_for(lambda v: "meanwhile" in v.topics and v.controller_id == 2
                          and 1 in v.brokers and v.brokers[1].epoch > old_epoch, 5)
        assert v.states[("t", 0)] == (L(2, 1, (2,), 2), 1)  # no unclean election: 2 leads
        view.close()
    finally:
        proxy.close()


def test_producer_id_blocks_are_unique_under_races(stores: Callable[..., KafkaZkClient]) -> None:
    members = [stores() for _ in range(3)]
    got: list[tuple[int, int]] = []
    lock = threading.Lock()

    def allocate(store: KafkaZkClient, node_id: int) -> None:
        for _ in range(8):
            block = store.producer_ids.allocate(node_id, size=100)
            with lock:
                got.append(block)

    threads = [threading.Thread(target=allocate, args=(s, i))
               for i, s in enumerate(members, 1) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 72
    assert sorted(got) == [(i * 100, i * 100 + 99) for i in range(72)]
    data, _ = members[0].zk.get("/latest_producer_id_block")
    last = json.loads(data)
    assert last["version"] == 1 and (last["block_start"], last["block_end"]) == (7100, 7199)
    assert members[0].producer_ids.allocate(9) == (7200, 8199)


def test_partition_state_writes_are_conditional(stores: Callable[..., KafkaZkClient]) -> None:
    a, b = stores(), stores()
    a.topics.create("t", {0: [1, 2]}, uuid.uuid4(), {})
    assert a.partition_states.get("t", 0) is None
    assert a.partition_states.create("t", 0, L(1, 0, (1, 2), 1)) == 0
    assert a.partition_states.create("t", 0, L(2, 0, (2,), 1)) is None  # exists
    raw, _ = a.zk.get("/brokers/topics/t/partitions/0/state")
    assert json.loads(raw) == {"version": 1, "leader": 1, "leader_epoch": 0, "isr": [1, 2],
                               "controller_epoch": 1}
    # The leader shrinks the ISR; the controller, still at version 0, loses.
    assert a.partition_states.update("t", 0, L(1, 0, (1,), 1), 0) == 1
    assert b.partition_states.update("t", 0, L(2, 1, (2,), 1), 0) is None
    assert b.partition_states.get("t", 0) == (L(1, 0, (1,), 1), 1)
    assert b.partition_states.update("t", 0, L(2, 1, (2,), 1), 1) == 2
    assert a.partition_states.update("t", 9, L(1, 0, (1,), 1), 0) is None  # no such znode
    assert a.partition_states.get_many([("t", 0), ("t", 1)]) == {("t", 0): (L(2, 1, (2,), 1), 2)}
    # Fenced controller writes: a deposed controller's lease no longer works.
    lease_a = a.election.campaign(1)
    assert lease_a is not None and lease_a.epoch == 1
    assert a.partition_states.update("t", 0, L(1, 2, (1,), 1), 2, fence=lease_a) == 3
    a.election.resign(lease_a)
    lease_b = b.election.campaign(2)
    assert lease_b is not None and lease_b.epoch == 2
    assert not a.election.holds(lease_a) and b.election.holds(lease_b)
    with pytest.raises(ControllerMovedError):
        a.partition_states.update("t", 0, L(1, 3, (1,), 1), 3, fence=lease_a)
    with pytest.raises(ControllerMovedError):
        a.topics.delete_znodes("t", fence=lease_a)
    assert b.partition_states.update("t", 0, L(2, 3, (2,), 2), 3, fence=lease_b) == 4


def test_topics_creation_and_deletion_znodes(stores: Callable[..., KafkaZkClient]) -> None:
    store = stores()
    tid = uuid.uuid4()
    created = store.topics.create("orders", {0: [1, 2], 1: [2, 1]}, tid,
                                 {"cleanup.policy": "compact"})
    assert created.partitions == {0: (1, 2), 1: (2, 1)} and created.topic_id == tid
    raw, _ = store.zk.get("/brokers/topics/orders")
    assert json.loads(raw) == {"version": 2, "topic_id": str(tid),
                               "partitions": {"0": [1, 2], "1": [2, 1]}}
    raw, _ = store.zk.get("/config/topics/orders")
    assert json.loads(raw) == {"version": 1, "config": {"cleanup.policy": "compact"}}
    with pytest.raises(TopicExistsError):
        store.topics.create("orders", {0: [1]}, uuid.uuid4(), {})
    with pytest.raises(ValueError):
        store.topics.create("bad", {1: [1]}, uuid.uuid4(), {})
    got = store.topics.assignments()
    assert list(got) == ["orders"] and got["orders"] == created
    assert got["orders"].configs == {"cleanup.policy": "compact"}
    store.partition_states.create("orders", 1, L(2, 0, (2, 1), 1))
    with pytest.raises(UnknownTopicError):
        store.topics.request_deletion("nope")
    store.topics.request_deletion("orders")
    store.topics.request_deletion("orders")  # twice is fine
    assert store.topics.pending_deletions() == ["orders"]
    with pytest.raises(TopicExistsError, match="marked for deletion"):
        store.topics.create("orders", {0: [1]}, uuid.uuid4(), {})
    assert store.topics.delete_znodes("orders")
    assert store.topics.assignments() == {} and store.topics.pending_deletions() == []
    assert store.zk.exists("/config/topics/orders") is None
    assert not store.topics.delete_znodes("orders")
    # The name is free again.
    assert store.topics.create("orders", {0: [1]}, uuid.uuid4(), {}).partitions == {0: (1,)}


def test_metadata_view_follows_the_cluster(stores: Callable[..., KafkaZkClient]) -> None:
    a, b = stores(), stores()
    a.brokers.register(1, "h1", 1)
    a.topics.create("early", {0: [1]}, uuid.uuid4(), {"k": "v"})
    a.partition_states.create("early", 0, L(1, 0, (1,), 1))
    seen: list[ClusterView] = []
    view = MetadataView(b, on_change=seen.append)
    first = view.start()
    assert len(seen) == 1 and seen[0] is first  # one call for the whole initial picture
    assert list(first.brokers) == [1] and first.topics["early"].configs == {"k": "v"}
    assert first.states[("early", 0)] == (L(1, 0, (1,), 1), 0)
    assert first.leader("early", 0) == 1 and first.controller_id is None
    with pytest.raises(TypeError):
        first.topics["x"] = first.topics["early"]  # type: ignore[index]
    assert isinstance(first.states, MappingProxyType)

    b2 = stores()
    b2.brokers.register(2, "h2", 2)
    view.wait_for(lambda v: sorted(v.brokers) == [1, 2], 5)
    tid = uuid.uuid4()
    a.topics.create("later", {0: [1, 2], 1: [2, 1]}, tid, {})
    v = view.wait_for(lambda v: "later" in v.topics, 5)
    assert v.topics["later"].topic_id == tid and v.state("later", 0) is None
    a.partition_states.create("later", 1, L(2, 0, (2, 1), 1))
    view.wait_for(lambda v: v.state("later", 1) == L(2, 0, (2, 1), 1), 5)
    a.partition_states.update("later", 1, L(2, 0, (2,), 1), 0)
    v = view.wait_for(lambda v: v.states.get(("later", 1)) == (L(2, 0, (2,), 1), 1), 5)
    assert a.election.elect(1) == 1
    view.wait_for(lambda v: v.controller_id == 1, 5)
    a.configs.change_topic_configs("later", {"retention.ms": "1000"})
    view.wait_for(lambda v: v.topics["later"].configs == {"retention.ms": "1000"}, 5)
    b2.close()
    view.wait_for(lambda v: sorted(v.brokers) == [1], 5)
    a.topics.request_deletion("later")
    a.topics.delete_znodes("later")
    v = view.wait_for(lambda v: "later" not in v.topics, 5)
    assert not any(tp[0] == "later" for tp in v.states)
    # Same name again, new id: no state of the old topic leaks into it.
    a.topics.create("later", {0: [1]}, uuid.uuid4(), {})
    v = view.wait_for(lambda v: "later" in v.topics, 5)
    assert v.topics["later"].topic_id != tid and v.state("later", 1) is None
    seqs = [s.seq for s in seen]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    assert seen[-1] is view.view
    view.close()


def _cluster(stores: Callable[..., KafkaZkClient], n: int, **kwargs: Any
             ) -> dict[int, KafkaZkClient]:
    members = {}
    for i in range(1, n + 1):
        members[i] = stores(**kwargs)
        members[i].brokers.register(i, "127.0.0.1", 9000 + i)
    return members


def test_controller_elects_initial_leaders_and_reelects_on_broker_loss(
        stores: Callable[..., KafkaZkClient], controllers: Callable[..., Controller]) -> None:
    members = _cluster(stores, 3)
    running = {i: controllers(s, i) for i, s in members.items()}
    observer = stores()
    view = MetadataView(observer)
    view.start()
    wait_until(lambda: sum(c.active for c in running.values()) == 1, 5, "a controller")
    active = next(i for i, c in running.items() if c.active)
    epoch = running[active].epoch
    assert view.wait_for(lambda v: v.controller_id == active, 5)

    topic = create_topic(observer, "t", 3, 3)
    v = view.wait_for(lambda v: len([tp for tp in v.states if tp[0] == "t"]) == 3, 5)
    for p, replicas in topic.partitions.items():
        state = v.state("t", p)
        assert state == L(replicas[0], 0, replicas, epoch)  # first replica leads, full ISR
    assert sorted(v.state("t", p).leader for p in range(3)) == [1, 2, 3]  # type: ignore[union-attr]

    # A broker that is not the controller goes (its session ends with it).
    victim = next(i for i in members if i != active)
    running[victim].stop()
    members[victim].close()
    v = view.wait_for(lambda v: all(
        victim not in v.state("t", p).isr for p in range(3)), 5)  # type: ignore[union-attr]
    for p, replicas in topic.partitions.items():
        before = L(replicas[0], 0, replicas, epoch)
        state = v.state("t", p)
        assert state is not None and state.leader_epoch == 1 and state.controller_epoch == epoch
        assert state.isr == tuple(r for r in replicas if r != victim)
        if before.leader == victim:  # re-elected: the next replica of the ISR
            assert state.leader == next(r for r in replicas if r != victim)
        else:
            assert state.leader == before.leader

    # Now the controller's broker goes: another takes over at a new controller epoch and
    # re-elects what it led.
    running[active].stop()
    members[active].close()
    last = next(i for i in members if i not in (victim, active))
    wait_until(lambda: running[last].active, 10, "the failover")
    new_epoch = running[last].epoch
    assert new_epoch is not None and epoch is not None and new_epoch > epoch
    v = view.wait_for(lambda v: all(v.state("t", p) is not None and
                                    v.state("t", p).isr == (last,)  # type: ignore[union-attr]
                                    for p in range(3)), 5)
    for p in range(3):
        state = v.state("t", p)
        assert state is not None and state.leader == last
        assert state.leader_epoch == 2 and state.controller_epoch == new_epoch
    assert v.controller_id == last
    view.close()


def test_no_unclean_election(stores: Callable[..., KafkaZkClient],
                             controllers: Callable[..., Controller]) -> None:
    members = _cluster(stores, 3)
    controller_store = members[1]
    view = MetadataView(controller_store)  # started at once; the controller shares it
    controllers(controller_store, 1, view=view)
    controller_store.topics.create("solo", {0: [2, 3]}, uuid.uuid4(), {})
    view.wait_for(lambda v: v.state("solo", 0) is not None, 5)
    assert view.view.state("solo", 0) == L(2, 0, (2, 3), 1)
    members[3].close()
    view.wait_for(lambda v: v.state("solo", 0) == L(2, 1, (2,), 1), 5)
    members[2].close()  # the last ISR member: offline, ISR kept
    view.wait_for(lambda v: v.state("solo", 0) == L(-1, 2, (2,), 1), 5)
    # 3 returns: it is not in the ISR, it may have missed records: still offline.
    back3 = stores()
    back3.brokers.register(3, "127.0.0.1", 9003)
    view.wait_for(lambda v: 3 in v.brokers, 5)
    time.sleep(0.3)  # the controller had its chance to (wrongly) elect 3
    assert view.view.state("solo", 0) == L(-1, 2, (2,), 1)
    assert view.view.leader("solo", 0) is None
    # 2 returns: it leads again.
    back2 = stores()
    back2.brokers.register(2, "127.0.0.1", 9002)
    view.wait_for(lambda v: v.state("solo", 0) == L(2, 3, (2,), 1), 5)
    view.close()


def test_controller_handles_a_bounced_broker(stores: Callable[..., KafkaZkClient],
                                             controllers: Callable[..., Controller]) -> None:
    members = _cluster(stores, 2)
    controllers(members[1], 1)
    view = MetadataView(members[1])
    view.start()
    members[1].topics.create("b", {0: [2, 1], 1: [1, 2]}, uuid.uuid4(), {})
    view.wait_for(lambda v: v.state("b", 0) == L(2, 0, (2, 1), 1)
                  and v.state("b", 1) == L(1, 0, (1, 2), 1), 5)
    # Broker 2 restarts at once (whether or not the controller saw it gone).
    members[2].close()
    again = stores()
    again.brokers.register(2, "127.0.0.1", 9002)
    v = view.wait_for(lambda v: 2 in v.brokers and all(
        2 not in v.state("b", p).isr for p in (0, 1)), 5)  # type: ignore[union-attr]
    assert v.state("b", 0) == L(1, 1, (1,), 1) and v.state("b", 1) == L(1, 1, (1,), 1)
    view.close()


def test_controller_deletes_topics_and_waits_for_live_replicas(
        stores: Callable[..., KafkaZkClient], controllers: Callable[..., Controller]) -> None:
    members = _cluster(stores, 2)
    controllers(members[1], 1)
    controllers(members[2], 2)
    view = MetadataView(members[2])
    view.start()
    create_topic(members[2], "doomed", 2, 2)
    members[2].topics.create("later", {0: [5, 1]}, uuid.uuid4(), {})  # 5 is not there yet
    view.wait_for(lambda v: v.state("doomed", 0) is not None and v.state("doomed", 1)
                  is not None and v.state("later", 0) is not None, 5)
    members[1].topics.request_deletion("doomed")
    view.wait_for(lambda v: "doomed" not in v.topics, 5)
    assert members[1].topics.pending_deletions() == []
    assert members[1].zk.exists("/brokers/topics/doomed") is None
    assert members[1].zk.exists("/config/topics/doomed") is None
    # A partition with no live replica at creation gets its state once one registers.
    assert view.view.state("later", 0) == L(1, 0, (1,), view.view.state("later", 0).
                                            controller_epoch)  # type: ignore[union-attr]
    members[1].topics.create("waiting", {0: [5]}, uuid.uuid4(), {})
    view.wait_for(lambda v: "waiting" in v.topics, 5)
    assert view.view.state("waiting", 0) is None
    five = stores()
    five.brokers.register(5, "127.0.0.1", 9005)
    view.wait_for(lambda v: v.state("waiting", 0) is not None, 5)
    assert view.view.state("waiting", 0).isr == (5,)  # type: ignore[union-attr]
    view.close()


def test_controller_stop_resigns(stores: Callable[..., KafkaZkClient],
                                 controllers: Callable[..., Controller]) -> None:
    a, b = stores(), stores()
    first = controllers(a, 1)
    assert first.wait_active(5)
    second = controllers(b, 2)
    first.stop()
    assert second.wait_active(5)  # at once: no session timeout to wait out
    assert a.election.controller_id() == 2 and not first.active
