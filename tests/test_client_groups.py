"""Consumer groups with real clients against real brokers: our Consumer's subscribe, rebalance
callbacks, commit / committed; one group mixing our consumer with confluent-kafka's and
kafka-python's (Kafka's ConsumerProtocol and the range assignor on all sides); a member killed
with SIGKILL is replaced after its session timeout; committed offsets survive a broker restart.
Also the assignors' invariants, as properties."""

from __future__ import annotations

import os
import signal
import struct
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from confluent_kafka import Consumer as ConfluentConsumer
from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException
from confluent_kafka import TopicPartition as ConfluentTopicPartition
from confluent_kafka.admin import AdminClient
from hypothesis import given
from hypothesis import strategies as st
from kafka import KafkaConsumer
from support.raw_wire import RawConnection

from oncelog import Admin, Consumer, NewTopic, Producer, TopicPartition
from oncelog.client.consumer.assignors import (
    ASSIGNORS,
    Subscription,
    decode_assignment,
    decode_subscription,
    encode_assignment,
    encode_subscription,
)
from oncelog.harness.broker_process import BrokerProcess
from oncelog.protocol import ApiKey, ProtocolError, make, request_module

SETTINGS = {"group.initial.rebalance.delay.ms": "0", "group.min.session.timeout.ms": "1000",
            "offsets.topic.num.partitions": "3"}
DEADLINE_S = 30


# -- assignors ----------------------------------------------------------------------------


@given(st.dictionaries(st.text(min_size=1, max_size=5), st.sets(st.sampled_from("abc")),
                       min_size=1, max_size=6),
       st.dictionaries(st.sampled_from("abc"), st.integers(1, 12), min_size=1))
@pytest.mark.parametrize("name", sorted(ASSIGNORS))
def test_every_subscribed_partition_goes_to_exactly_one_subscriber(name, subs, counts):
    subscriptions = {m: Subscription(tuple(sorted(t))) for m, t in subs.items()}
    plan = ASSIGNORS[name](subscriptions, counts)
    given_out = [tp for ps in plan.values() for tp in ps]
    assert len(given_out) == len(set(given_out))
    wanted = {(t, p) for t, n in counts.items() for p in range(n)
              if any(t in s.topics for s in subscriptions.values())}
    assert set(given_out) == wanted
    for m, ps in plan.items():
        assert all(tp.topic in subscriptions[m].topics for tp in ps)
    if all(s.topics == tuple("abc") for s in subscriptions.values()):
        sizes = [len(ps) for ps in plan.values()]
        if name == "roundrobin":
            assert max(sizes) - min(sizes) <= 1  # balanced overall
        else:
            for t in counts:  # balanced per topic
                per = [sum(tp.topic == t for tp in ps) for ps in plan.values()]
                assert max(per) - min(per) <= 1


def test_protocol_encoding_round_trips():
    sub = Subscription(("a", "b"), b"user")
    assert decode_subscription(encode_subscription(sub)) == sub
    tps = [TopicPartition("a", 2), TopicPartition("a", 0), TopicPartition("b", 1)]
    assert decode_assignment(encode_assignment(tps)) == sorted(tps)
    assert decode_assignment(b"") == []


def _string(s: str) -> bytes:
    return struct.pack(">h", len(s)) + s.encode()


def test_protocol_decoding_reads_every_version_and_refuses_malformed_bytes():
    # v0 as kafka-python writes it: topics, then empty user data.
    v0 = struct.pack(">hi", 0, 1) + _string("a") + struct.pack(">i", 0)
    assert decode_subscription(v0) == Subscription(("a",), b"")
    # v3 (owned partitions, generation id, rack), and a v9 of the future read as v3.
    tail = (struct.pack(">i", 1) + _string("a") + struct.pack(">ii", 1, 4)
            + struct.pack(">i", 7) + _string("rack-1"))
    body = struct.pack(">i", 1) + _string("a") + struct.pack(">i", -1) + tail
    for version in (3, 9):
        assert decode_subscription(struct.pack(">h", version) + body) == Subscription(
            ("a",), None, (TopicPartition("a", 4),))
    # an assignment v1 from another client, with user data
    a = struct.pack(">hi", 1, 1) + _string("t") + struct.pack(">iii", 2, 0, 5) \
        + struct.pack(">i", 2) + b"ud"
    assert decode_assignment(a) == [TopicPartition("t", 0), TopicPartition("t", 5)]
    # lengths that claim more than is there, a negative version, no version at all
    for bad in (struct.pack(">hi", 0, 1_000_000) + _string("a"),
                struct.pack(">hi", 0, 1) + struct.pack(">h", 500) + b"a",
                struct.pack(">hi", -1, 0), b"\x00"):
        with pytest.raises(ProtocolError):
            decode_subscription(bad)
    with pytest.raises(ProtocolError):
        decode_assignment(struct.pack(">hi", 0, 3) + _string("t"))


# -- against a broker -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    with BrokerProcess(tmp_path_factory.mktemp("groups") / "data", settings=SETTINGS) as b:
        yield b


def make_topic(bootstrap: str, name: str, partitions: int, records: int = 0) -> None:
    with Admin(bootstrap_servers=bootstrap) as admin:
        admin.create_topics([NewTopic(name, num_partitions=partitions)])
    if records:
        with Producer(bootstrap_servers=bootstrap) as p:
            for i in range(records):
                p.send(name, b"%d" % i, partition=i % partitions)


def ours(bootstrap: str, group: str, **kw) -> Consumer:
    return Consumer(bootstrap_servers=bootstrap, group_id=group, auto_offset_reset="earliest",
                    session_timeout_ms=3000, heartbeat_interval_ms=500, **kw)


def poll_until(consumers, done, what="condition"):
    deadline = time.monotonic() + DEADLINE_S
    while not done():
        assert time.monotonic() < deadline, what
        for c in consumers:
            c.poll(0.1)


class Member(threading.Thread):
    """One of our consumers on its own thread, polling until stopped (a Consumer, as in the
    Java client, is used by one thread; its JoinGroup waits for the other members)."""

    def __init__(self, bootstrap: str, group: str, topic: str, **config) -> None:
        super().__init__(daemon=True)
        self.events: list[tuple[str, list[TopicPartition]]] = []
        self.consumer = ours(bootstrap, group, **config)
        self.consumer.subscribe([topic], on_assign=lambda ps: self.events.append(
            ("assign", sorted(ps))), on_revoke=lambda ps: self.events.append(
            ("revoke", sorted(ps))))
        self.assignment: set[TopicPartition] = set()
        self.stop = threading.Event()
        self.start()

    def run(self) -> None:
        while not self.stop.is_set():
            self.consumer.poll(0.1)
            self.assignment = self.consumer.assignment()
        self.consumer.close()

    def close(self) -> None:
        self.stop.set()
        self.join(30)


def wait_for(done, what):
    deadline = time.monotonic() + DEADLINE_S
    while not done():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)  # the members poll on their own threads


def test_two_consumers_split_the_partitions_and_one_takes_over(broker):
    bs = broker.bootstrap_servers
    make_topic(bs, "split", 4)
    a = Member(bs, "split-g", "split")
    b = Member(bs, "split-g", "split")
    wait_for(lambda: len(a.assignment) == 2 and len(b.assignment) == 2, "an even split")
    assert a.assignment | b.assignment == {TopicPartition("split", p) for p in range(4)}
    b.close()  # LeaveGroup: a gets everything
    wait_for(lambda: len(a.assignment) == 4, "a takes over")
    kinds = [k for k, _ in a.events]
    assert kinds[0] == "assign" and "revoke" in kinds and kinds[-1] == "assign"
    assert a.events[-1][1] == sorted(TopicPartition("split", p) for p in range(4))
    a.close()


def test_commit_and_committed_survive_a_consumer_and_a_broker_restart(tmp_path):
    with BrokerProcess(tmp_path / "data", settings=SETTINGS) as b:
        bs = b.bootstrap_servers
        make_topic(bs, "commits", 2, records=20)
        c = ours(bs, "commit-g", enable_auto_commit=False)
        c.subscribe(["commits"])
        got = []
        # the condition polls (and keeps what it reads): poll_until polls no consumer itself,
        # which would drop the records it read
        poll_until([], lambda: len(got) >= 20 or bool(got.extend(c.poll(0.2))), "20 records")
        c.commit({TopicPartition("commits", 0): 4, TopicPartition("commits", 1): 7})
        c.close()
        b.restart()
        c = ours(bs, "commit-g", enable_auto_commit=False)
        assert c.committed([TopicPartition("commits", 0), TopicPartition("commits", 1)]) == {
            TopicPartition("commits", 0): 4, TopicPartition("commits", 1): 7}
        c.subscribe(["commits"])
        resumed = []
        poll_until([], lambda: len(resumed) >= 9 or bool(resumed.extend(c.poll(0.2))),
                   "the rest")
        assert sorted((r.partition, r.offset) for r in resumed) == \
            [(0, o) for o in range(4, 10)] + [(1, o) for o in range(7, 10)]
        c.close()


def test_one_group_mixes_our_confluent_and_kafka_python_consumers(broker):
    bs = broker.bootstrap_servers
    make_topic(bs, "mixed", 6, records=60)
    group = "mixed-g"
    assigned: dict[str, set[int]] = {"confluent": set(), "kafka-python": set()}
    stop = threading.Event()

    def run_confluent() -> None:
        c = ConfluentConsumer({"bootstrap.servers": bs, "group.id": group,
                               "auto.offset.reset": "earliest",
                               "partition.assignment.strategy": "range",
                               "session.timeout.ms": 6000})
        c.subscribe(["mixed"])
        while not stop.is_set():
            c.poll(0.2)
            assigned["confluent"] = {tp.partition for tp in c.assignment()}
        c.close()

    def run_kafka_python() -> None:
        from kafka.coordinator.assignors.range import RangePartitionAssignor

        c = KafkaConsumer("mixed", bootstrap_servers=bs, group_id=group,
                          auto_offset_reset="earliest", session_timeout_ms=6000,
                          heartbeat_interval_ms=1000,
                          partition_assignment_strategy=[RangePartitionAssignor])
        while not stop.is_set():
            c.poll(timeout_ms=200)
            assigned["kafka-python"] = {tp.partition for tp in c.assignment()}
        c.close()

    threads = [threading.Thread(target=run_confluent), threading.Thread(target=run_kafka_python)]
    for t in threads:
        t.start()
    c = ours(bs, group, partition_assignment_strategy="range")
    c.subscribe(["mixed"])
    try:
        deadline = time.monotonic() + DEADLINE_S * 2
        while True:
            c.poll(0.2)
            mine = {tp.partition for tp in c.assignment()}
            parts = [mine, assigned["confluent"], assigned["kafka-python"]]
            if all(len(p) == 2 for p in parts) and set().union(*parts) == set(range(6)):
                break  # range: two each, disjoint, covering all six
            assert time.monotonic() < deadline, parts
    finally:
        stop.set()
        for t in threads:
            t.join(30)
        c.close()


_MEMBER = textwrap.dedent("""
    import sys, time
    from oncelog import Consumer
    c = Consumer(bootstrap_servers=sys.argv[1], group_id="kill-g", session_timeout_ms=2000,
                 heartbeat_interval_ms=300, auto_offset_reset="earliest")
    c.subscribe(["killed"])
    while True:
        c.poll(0.2)
        if c.assignment():
            print("assigned", len(c.assignment()), flush=True)
""")


def test_a_member_killed_with_sigkill_is_replaced_after_its_session_timeout(broker):
    bs = broker.bootstrap_servers
    make_topic(bs, "killed", 4)
    child = subprocess.Popen([sys.executable, "-c", _MEMBER, bs], stdout=subprocess.PIPE,
                             env=dict(os.environ, PYTHONUNBUFFERED="1"))
    try:
        assert child.stdout is not None
        assert child.stdout.readline().startswith(b"assigned")
        c = ours(bs, "kill-g")
        c.subscribe(["killed"])
        poll_until([c], lambda: len(c.assignment()) == 2, "half each")
        child.send_signal(signal.SIGKILL)
        child.wait()
        start = time.monotonic()
        poll_until([c], lambda: len(c.assignment()) == 4, "the survivor takes all")
        assert time.monotonic() - start < 15  # the 2 s session timeout, not a 5 min default
        c.close()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def _sticky_round(subs, counts):
    return ASSIGNORS["cooperative-sticky"](subs, counts)


@given(st.lists(st.text(min_size=1, max_size=4), min_size=1, max_size=6, unique=True),
       st.integers(1, 30), st.data())
def test_cooperative_sticky_keeps_what_it_can_and_moves_in_two_rounds(members, n, data):
    """Round 1 from some prior ownership: nothing is given while another still owns it;
    round 2 (after the revocations) completes a balanced assignment; partitions that a member
    kept across both rounds were never taken away."""
    counts = {"t": n}
    tps = [TopicPartition("t", p) for p in range(n)]
    prior = {m: [] for m in members}
    for tp in tps:
        prior[data.draw(st.sampled_from(members))].append(tp)
    subs = {m: Subscription(("t",), owned_partitions=tuple(ps)) for m, ps in prior.items()}
    first = _sticky_round(subs, counts)
    for m, ps in first.items():
        others = {tp for o, qs in prior.items() if o != m for tp in qs}
        assert not set(ps) & others
    # each member now owns what it kept (revoking the rest), and the group rebalances again
    owned = {m: [tp for tp in prior[m] if tp in first[m]] + [tp for tp in first[m]
                                                              if tp not in prior[m]]
             for m in members}
    second = _sticky_round({m: Subscription(("t",), owned_partitions=tuple(ps))
                            for m, ps in owned.items()}, counts)
    given_out = [tp for ps in second.values() for tp in ps]
    assert sorted(given_out) == tps
    sizes = [len(ps) for ps in second.values()]
    assert max(sizes) - min(sizes) <= 1
    for m in members:  # sticky: a member keeps its partitions up to its fair share
        assert len(set(owned[m]) & set(second[m])) >= min(len(owned[m]), n // len(members))


def test_subscription_v1_carries_owned_partitions():
    sub = Subscription(("a",), None, (TopicPartition("a", 3), TopicPartition("a", 1)))
    back = decode_subscription(encode_subscription(sub))
    assert back.topics == ("a",) and sorted(back.owned_partitions) == sorted(sub.owned_partitions)


def test_a_cooperative_member_keeps_its_partitions_while_another_joins(broker):
    bs = broker.bootstrap_servers
    make_topic(bs, "coop", 4)
    a = Member(bs, "coop-g", "coop", partition_assignment_strategy="cooperative-sticky")
    wait_for(lambda: len(a.assignment) == 4, "a has all four")
    b = Member(bs, "coop-g", "coop", partition_assignment_strategy="cooperative-sticky")
    wait_for(lambda: len(a.assignment) == 2 and len(b.assignment) == 2, "two each")
    revoked = [ps for kind, ps in a.events if kind == "revoke"]
    assert [len(ps) for ps in revoked] == [2], a.events  # only what moved, not all four
    assert a.events[0] == ("assign", sorted(TopicPartition("coop", p) for p in range(4)))
    b.close()
    wait_for(lambda: len(a.assignment) == 4, "a takes back the rest")
    a.close()


def test_static_members_of_librdkafka_restart_without_a_rebalance(broker):
    """KIP-345 with librdkafka, as its static-membership test does: each of two static
    members (the leader among them) is closed (no LeaveGroup: static) and started again with
    the same group.instance.id within its session. It gets its old partitions back and the
    other member is never revoked (before, the leader's return rebalanced the whole group)."""
    bs = broker.bootstrap_servers
    make_topic(bs, "static-restart", 4)
    revoked: dict[str, int] = {"i-1": 0, "i-2": 0}

    def start(instance: str) -> ConfluentConsumer:
        c = ConfluentConsumer({"bootstrap.servers": bs, "group.id": "static-restart",
                               "group.instance.id": instance, "session.timeout.ms": 10_000,
                               "partition.assignment.strategy": "range",
                               "auto.offset.reset": "earliest"})

        def on_revoke(_consumer, _partitions) -> None:
            revoked[instance] += 1
        c.subscribe(["static-restart"], on_revoke=on_revoke)
        return c

    def owned(c: ConfluentConsumer) -> set[int]:
        return {tp.partition for tp in c.assignment()}

    consumers = {"i-1": start("i-1"), "i-2": start("i-2")}
    deadline = time.monotonic() + DEADLINE_S
    while not (owned(consumers["i-1"]) and owned(consumers["i-2"])
               and owned(consumers["i-1"]) | owned(consumers["i-2"]) == {0, 1, 2, 3}):
        assert time.monotonic() < deadline, "the group never settled"
        for c in consumers.values():
            c.poll(0.1)
    before = {i: owned(c) for i, c in consumers.items()}
    for restarting, other in (("i-1", "i-2"), ("i-2", "i-1")):
        settled = revoked[other]  # (closing a consumer revokes its own partitions)
        consumers[restarting].close()  # a static member sends no LeaveGroup
        consumers[restarting] = start(restarting)
        deadline = time.monotonic() + DEADLINE_S
        while owned(consumers[restarting]) != before[restarting]:
            assert time.monotonic() < deadline, \
                f"{restarting} got {owned(consumers[restarting])}, had {before[restarting]}"
            for c in consumers.values():
                c.poll(0.1)
        for _ in range(10):  # a rebalance, if one started, would revoke the other member
            consumers[other].poll(0.1)
        assert revoked[other] == settled, f"{other} was revoked: a rebalance"
        assert owned(consumers[other]) == before[other]
    for c in consumers.values():
        c.close()
def test_offsets_for_a_missing_topic_or_partition_are_refused_and_the_others_committed(broker):
    """Kafka's OffsetCommit answers a partition that does not exist UNKNOWN_TOPIC_OR_PARTITION
    and commits the others (before, oncelog stored offsets for topics that never existed);
    AlterConsumerGroupOffsets, which is an OffsetCommit, fails for it too."""
    bs = broker.bootstrap_servers
    make_topic(bs, "committed-here", 2)
    mod = request_module(ApiKey.OFFSET_COMMIT, 8)

    def topic(name, *partitions):
        return make(mod.OffsetCommitRequestTopic, name=name, partitions=tuple(
            make(mod.OffsetCommitRequestPartition, partition_index=p, committed_offset=5,
                 committed_leader_epoch=-1, committed_metadata="") for p in partitions))

    with RawConnection(bs) as conn:
        r = conn.request(make(mod.OffsetCommitRequest, group_id="offsets-missing",
                              generation_id_or_member_epoch=-1, member_id="",
                              group_instance_id=None, topics=(
                                  topic("committed-here", 0, 1, 7), topic("never-created", 0))))
        codes = {(t.name, p.partition_index): int(p.error_code)
                 for t in r.topics for p in t.partitions}
        assert codes == {("committed-here", 0): 0, ("committed-here", 1): 0,
                         ("committed-here", 7): 3, ("never-created", 0): 3}
        only_missing = conn.request(make(mod.OffsetCommitRequest, group_id="offsets-missing-2",
                                         generation_id_or_member_epoch=-1, member_id="",
                                         group_instance_id=None,
                                         topics=(topic("never-created", 0),)))
        assert [int(p.error_code) for p in only_missing.topics[0].partitions] == [3]
        # The group holds offsets of the existing partitions only (all of its offsets asked).
        fetch = request_module(ApiKey.OFFSET_FETCH, 7)
        stored = conn.request(make(fetch.OffsetFetchRequest, group_id="offsets-missing",
                                   topics=None, require_stable=False))
        assert {(t.name, p.partition_index): p.committed_offset for t in stored.topics
                for p in t.partitions} == {("committed-here", 0): 5, ("committed-here", 1): 5}
    confluent = AdminClient({"bootstrap.servers": bs})
    (future,) = confluent.alter_consumer_group_offsets([ConsumerGroupTopicPartitions(
        "offsets-missing-3", [ConfluentTopicPartition("never-created", 0, 9)])]).values()
    try:
        result = future.result(30)
        errors = [str(tp.error) for tp in result.topic_partitions]
    except KafkaException as exc:
        errors = [str(exc)]
    assert len(errors) == 1 and "UNKNOWN_TOPIC_OR_PART" in errors[0], errors


def test_offset_delete_forgets_offsets_except_of_topics_a_member_consumes(broker):
    """OffsetDelete (KIP-496) through our Admin, a librdkafka consumer in the group: an empty
    group loses the named offsets; a live consumer group keeps those of topics it is
    subscribed to (GROUP_SUBSCRIBED_TO_TOPIC); an unknown group is GROUP_ID_NOT_FOUND."""
    from oncelog.errors import (
        GroupIdNotFoundError,
        GroupSubscribedToTopicError,
        UnknownTopicOrPartitionError,
    )

    bs = broker.bootstrap_servers
    make_topic(bs, "od", 2)
    make_topic(bs, "od-other", 1)
    tp0, tp1, other = TopicPartition("od", 0), TopicPartition("od", 1), TopicPartition("od-other", 0)
    with Consumer(bootstrap_servers=bs, group_id="od-empty") as c:
        c.commit({tp0: 3, tp1: 4})
    with Admin(bootstrap_servers=bs) as admin:
        result = admin.delete_consumer_group_offsets(
            "od-empty", [tp0, TopicPartition("never-created", 0)])
        assert result[tp0] is None
        assert isinstance(result[TopicPartition("never-created", 0)],
                          UnknownTopicOrPartitionError)
        with Consumer(bootstrap_servers=bs, group_id="od-empty") as c:
            assert c.committed([tp0, tp1]) == {tp0: None, tp1: 4}
        with pytest.raises(GroupIdNotFoundError):
            admin.delete_consumer_group_offsets("od-nobody", [tp0])
    # a live group (librdkafka) subscribed to "od", with an offset of "od-other" as well
    live = ConfluentConsumer({"bootstrap.servers": bs, "group.id": "od-live",
                              "auto.offset.reset": "earliest", "enable.auto.commit": False})
    live.subscribe(["od"])
    deadline = time.monotonic() + DEADLINE_S
    while not live.assignment():
        assert time.monotonic() < deadline, "never assigned"
        live.poll(0.1)
    live.commit(offsets=[ConfluentTopicPartition("od", 0, 7),
                         ConfluentTopicPartition("od-other", 0, 2)], asynchronous=False)
    try:
        with Admin(bootstrap_servers=bs) as admin:
            result = admin.delete_consumer_group_offsets("od-live", [tp0, other])
        assert isinstance(result[tp0], GroupSubscribedToTopicError) and result[other] is None
        fetched = {tp.topic: tp.offset for tp in live.committed(
            [ConfluentTopicPartition("od", 0), ConfluentTopicPartition("od-other", 0)], 10)}
        assert fetched == {"od": 7, "od-other": -1001}  # OFFSET_INVALID: deleted
    finally:
        live.close()
