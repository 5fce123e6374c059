"""Issue 31's NetCluster and nemesis on real namespaces and processes: a 3-broker cluster with
one ZooKeeper node, each in a host of its own; every fault family of the nemesis started (and
seen in place while it lasts), healed, its window recorded, and the cluster recovering with no
operator action: a produce and a read back of what was produced afterwards. One cluster for the
module; the families run one after the other on it (an ensemble of three ZooKeeper nodes
first, in a cluster of its own, before that one starts)."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import time

import pytest
from support.netns import require_netns
from support.zookeeper import require_zookeeper

from oncelog.client import Consumer, Producer, TopicPartition
from oncelog.client.admin.admin import NewTopic
from oncelog.faults.cluster import NetCluster
from oncelog.faults.nemesis import FAULTS, Nemesis, Window, cluster_options, parse_faults, schedule

pytestmark = pytest.mark.cluster

TOPIC = "q"
DEADLINE_S = 60.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    require_netns()
    require_zookeeper()
    options = cluster_options(FAULTS)
    options["disk_mb"] = 32
    c = NetCluster(tmp_path_factory.mktemp("netcluster"), brokers=3, zookeepers=1, seed=1,
                   **options)
    try:
        c.start()
        with c._admin() as admin:
            admin.create_topics([NewTopic(TOPIC, 1, 3)])
        c.wait_for_isr(TOPIC, 0, 3, DEADLINE_S)
        yield c
    finally:
        c.stop()


def produce_and_read_back(cluster: NetCluster, tag: str, n: int = 5) -> None:
    """Produce ``n`` records (acks=all, idempotent) and read exactly them back."""
    producer = Producer(bootstrap_servers=cluster.bootstrap_servers, acks="all",
                        enable_idempotence=True, linger_ms=2, request_timeout_ms=5000,
                        delivery_timeout_ms=int(DEADLINE_S * 1000), retry_backoff_ms=50,
                        retry_backoff_max_ms=200)
    try:
        values = [f"{tag}-{i}".encode() for i in range(n)]
        offsets = [f.result(DEADLINE_S).offset
                   for f in [producer.send(TOPIC, v) for v in values]]
    finally:
        producer.close()
    assert offsets == list(range(offsets[0], offsets[0] + n))
    consumer = Consumer(bootstrap_servers=cluster.bootstrap_servers,
                        isolation_level="read_committed")
    try:
        tp = TopicPartition(TOPIC, 0)
        consumer.assign([tp])
        consumer.seek(tp, offsets[0])
        got: list[bytes] = []
        deadline = time.monotonic() + DEADLINE_S
        while len(got) < n:
            assert time.monotonic() < deadline, f"read {got} of {values}"
            got += [r.value for r in consumer.poll(0.2)]
        assert got[:n] == values
    finally:
        consumer.close()


def test_a_zookeeper_ensemble_of_three_keeps_serving_without_its_leader(tmp_path):
    require_netns()
    require_zookeeper()
    with NetCluster(tmp_path / "ensemble", brokers=1, zookeepers=3, clock=False) as c:
        assert c.connect_string == ",".join(
            f"198.18.{c.network.n}.{10 + i}:2181" for i in (1, 2, 3)) + "/oncelog"
        modes = {i: zk.four_letter_word("srvr").split("Mode: ")[1].split()[0]
                 for i, zk in c.zookeepers.items()}
        assert sorted(modes.values()) == ["follower", "follower", "leader"]
        leader = next(i for i, m in modes.items() if m == "leader")
        c.kill_zk(leader)  # two of three: still a quorum
        with c._admin() as admin:  # a topic is made in ZooKeeper
            admin.create_topics([NewTopic(TOPIC, 1, 1, {"min.insync.replicas": "1"})])
        c.wait_for_isr(TOPIC, 0, 1, DEADLINE_S)
        produce_and_read_back(c, "ensemble")
        c.heal_all()
        assert c.zk_state == {1: "running", 2: "running", 3: "running"}
        assert c.zookeepers[leader].four_letter_word("srvr").startswith("Zookeeper version")


def test_the_cluster_runs_each_node_in_a_host_of_its_own(cluster):
    assert cluster.bootstrap_servers == ",".join(
        f"198.18.{cluster.network.n}.{20 + n}:9092" for n in (1, 2, 3))
    assert cluster.connect_string == f"198.18.{cluster.network.n}.11:2181/oncelog"
    for n, b in cluster.brokers.items():  # the broker process lives in its host's namespace
        ns = subprocess.run(["ip", "netns", "identify", str(b.pid)], capture_output=True,
                            text=True, check=True).stdout.strip()
        assert ns == f"ol{cluster.network.n}-n{n}"
    assert cluster.controller() in (1, 2, 3)
    assert cluster.coordinator_of("some-transactional-id") in (1, 2, 3)
    # a client in a host of its own reaches the brokers
    c1 = cluster.client_host("c1")
    out = c1.run([sys.executable, "-c", (
        "from oncelog.client import Producer\n"
        f"p = Producer(bootstrap_servers={cluster.bootstrap_servers!r}, acks='all')\n"
        f"print(p.send({TOPIC!r}, b'from-c1').result(30).offset)\n"
        "p.close()")])
    assert int(out.strip()) >= 0
    produce_and_read_back(cluster, "before")


def expect_in_place(cluster: NetCluster, w: Window) -> None:
    """The fault of window ``w`` is really in place."""
    n = int(w.targets[0][1:]) if w.targets[0][:1] == "n" and w.targets[0][1:].isdigit() else None
    blocked = cluster.network.blocked()
    f = w.fault
    if f == "partition":
        left, right = (g.split("|") for g in w.targets)
        assert all(set(blocked[x]) >= set(right) for x in left)
    elif f in ("isolate-leader", "isolate-controller"):
        assert set(blocked[w.targets[0]]) == set(cluster.network.hosts) - {w.targets[0]}
    elif f == "zk-cut":
        assert all(set(blocked[x]) == {"zk1"} for x in w.targets[0].split("|"))
    elif f == "one-way":
        assert blocked == {w.targets[1]: [w.targets[0]]}
    elif f == "bridge":
        left, via, right = w.targets
        assert blocked[left] == [right] and blocked[right] == [left] and via not in blocked
    elif f in ("loss", "delay"):
        assert all(p.rules.get("*") for p in cluster.proxies.values())
    elif f == "pause":
        assert cluster.brokers[n].state == "paused"
    elif f == "kill":
        assert not cluster.brokers[n].process.running
    elif f == "pause-zk":
        assert cluster.zk_state[1] == "paused"
    elif f == "kill-zk":
        assert not cluster.zookeepers[1].is_running()
    elif f == "clock":
        assert cluster.clocks[n].offset_ms != 0
    elif f == "disk":
        assert cluster.disks[n].free_bytes() == 0
    else:
        raise AssertionError(f"no check for {f}")


@pytest.mark.parametrize("fault", FAULTS)
def test_each_fault_is_in_place_then_healed_and_the_cluster_recovers(cluster, tmp_path, fault):
    events = schedule(31, [fault], 60.0, keys=[f"{TOPIC}:0"], fault_s=(1.0, 1.0),
                      first_s=0.0)[:1]
    seen: list[Window] = []

    def observe(w: Window) -> None:
        expect_in_place(cluster, w)
        seen.append(w)

    lines: list[str] = []
    windows = Nemesis(cluster, events, tmp_path / "faults.jsonl", observer=observe,
                      log=lines.append).run()
    assert len(seen) == 1, lines
    (w,) = windows
    recorded = [json.loads(x) for x in (tmp_path / "faults.jsonl").read_text().splitlines()]
    assert recorded == [w.to_json()]
    assert recorded[0]["fault"] == fault and recorded[0]["start"] < recorded[0]["end"]
    # healed: nothing blocked, no link rule, clocks right, disks free, every process up
    assert cluster.network.blocked() == {}
    assert not any(p.rules for p in cluster.proxies.values())
    assert all(c.offset_ms == 0 for c in cluster.clocks.values())
    assert all(not d.full for d in cluster.disks.values())
    assert all(b.state == "running" and b.process.running for b in cluster.brokers.values())
    assert cluster.zk_state == {1: "running"}
    produce_and_read_back(cluster, fault)


def test_a_mixed_schedule_overlaps_faults_of_different_lanes(cluster, tmp_path):
    events = schedule(8, ["partition", "pause", "clock", "delay"], 2.5, keys=[f"{TOPIC}:0"],
                      fault_s=(1.5, 1.5), gap_s=(0.5, 0.5), first_s=0.0, mixed=True)
    assert sorted(e.lane for e in events) == ["clock", "link", "network", "process"]
    windows = Nemesis(cluster, events, tmp_path / "faults.jsonl").run()
    assert sorted(w.fault for w in windows) == ["clock", "delay", "partition", "pause"]
    # they overlapped: the last to start began before the first to end ended
    assert max(w.start for w in windows) < min(w.end for w in windows)
    assert cluster.network.blocked() == {}
    produce_and_read_back(cluster, "mixed")


def test_the_same_seed_gives_the_same_schedule():
    faults = parse_faults("all,client-crash")
    assert faults == list(FAULTS)
    a = schedule(5, faults, 300.0, keys=["q:0", "q:1"])
    assert a == schedule(5, faults, 300.0, keys=["q:0", "q:1"])
    assert a != schedule(6, faults, 300.0, keys=["q:0", "q:1"])
    assert {e.fault for e in a} == set(FAULTS)  # a round of every family first
    assert all(e.start_s + e.duration_s <= 300.0 for e in a)
    assert all(x.start_s + x.duration_s < y.start_s for x, y in itertools.pairwise(a))
    mixed = schedule(5, faults, 300.0, keys=["q:0"], mixed=True)
    assert mixed == schedule(5, faults, 300.0, keys=["q:0"], mixed=True)
    for lane in {e.lane for e in mixed}:  # one at a time within a lane
        mine = [e for e in mixed if e.lane == lane]
        assert all(x.start_s + x.duration_s < y.start_s for x, y in itertools.pairwise(mine))
    assert {e.fault for e in mixed} == set(FAULTS)
    with pytest.raises(ValueError, match="unknown fault"):
        parse_faults("partition,flood")
    out = subprocess.run([sys.executable, "-m", "oncelog.faults.nemesis", "--seed", "5",
                          "--faults", "all", "--time", "300", "--keys", "q:0,q:1"],
                         capture_output=True, text=True, check=True).stdout
    assert [json.loads(x) for x in out.splitlines()] == [e.to_json() for e in a]


