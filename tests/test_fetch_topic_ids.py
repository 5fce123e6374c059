"""Fetch v13-v17 and DeleteTopics v6 name topics by id (KIP-516), over the wire to a real
broker: records come back under the topic's id, an id no topic has is UNKNOWN_TOPIC_ID, an
incremental session keyed by id outlives its topic's deletion without ever serving the topic
re-created under the same name, and v16 says who leads now (KIP-951)."""

from __future__ import annotations

import uuid

import pytest
from support.raw_wire import (
    BASE_TIMESTAMP,
    RawConnection,
    create_topics_request,
    delete_topics_request,
    fetch_by_id_request,
    metadata_request,
    produce,
)

from oncelog.protocol import ApiKey, make, request_module
from oncelog.records import build_batch, decode_batch, iter_batches
from oncelog.server.embedded import EmbeddedBroker

UNKNOWN_TOPIC_ID = 100
FETCH_SESSION_TOPIC_ID_ERROR = 106
FENCED_LEADER_EPOCH = 74
INVALID_REQUEST = 42
UNKNOWN_TOPIC_OR_PARTITION = 3


@pytest.fixture
def conn(embedded_broker):
    with RawConnection(embedded_broker.bootstrap_servers) as c:
        yield c


def create(conn, name: str, partitions: int = 1) -> uuid.UUID:
    r = conn.request(create_topics_request(name, partitions))
    assert r.topics[0].error_code == 0, r
    return r.topics[0].topic_id


def put(conn, topic: str, partition: int, *values: bytes) -> None:
    batch = build_batch([(None, v, [], BASE_TIMESTAMP + i) for i, v in enumerate(values)])
    assert produce(conn, topic, partition, batch).error_code == 0


def values_of(pd) -> list[bytes]:
    data = pd.records or b""
    out = []
    for pos, _h in iter_batches(data):
        _, records = decode_batch(data, pos)
        out.extend(r.value for r in records)
    return out


def partitions_of(response) -> dict[tuple[uuid.UUID, int], object]:
    return {(t.topic_id, p.partition_index): p for t in response.responses for p in t.partitions}


@pytest.mark.parametrize("version", [13, 14, 15, 16, 17])
def test_fetch_by_topic_id_returns_the_records_under_the_id(conn, version):
    tid = create(conn, f"by-id-{version}", partitions=2)
    put(conn, f"by-id-{version}", 0, b"a", b"b")
    put(conn, f"by-id-{version}", 1, b"c")
    r = conn.request(fetch_by_id_request(tid, {0: 0, 1: 0}, version=version))
    assert r.error_code == 0
    got = partitions_of(r)
    assert set(got) == {(tid, 0), (tid, 1)}
    assert values_of(got[tid, 0]) == [b"a", b"b"] and got[tid, 0].high_watermark == 2
    assert values_of(got[tid, 1]) == [b"c"] and got[tid, 1].error_code == 0


@pytest.mark.parametrize("version", [13, 15, 17])
def test_an_unknown_topic_id_is_unknown_topic_id(conn, version):
    tid = create(conn, f"known-{version}")
    stranger = uuid.uuid4()
    r = conn.request(fetch_by_id_request(stranger, {0: 0, 3: 5}, version=version))
    got = partitions_of(r)
    assert {k: p.error_code for k, p in got.items()} == {
        (stranger, 0): UNKNOWN_TOPIC_ID, (stranger, 3): UNKNOWN_TOPIC_ID}
    assert all(p.high_watermark == -1 and not p.records for p in got.values())
    # The known topic in the same broker is unaffected.
    assert partitions_of(conn.request(fetch_by_id_request(tid, {0: 0}, version=version)))[
        tid, 0].error_code == 0


def test_a_session_by_id_survives_delete_and_recreate_without_serving_the_new_topic(conn):
    old = create(conn, "reborn")
    put(conn, "reborn", 0, b"old-1")
    r = conn.request(fetch_by_id_request(old, {0: 0}, epoch=0))  # opens a session
    session = r.session_id
    assert session > 0 and values_of(partitions_of(r)[old, 0]) == [b"old-1"]
    # Incremental, nothing new: the partition is left out.
    r = conn.request(fetch_by_id_request(old, {0: 1}, session_id=session, epoch=1))
    assert r.error_code == 0 and not r.responses
    # A request by name on a session by id (and the other way round) is refused.
    by_name = request_module(ApiKey.FETCH, 12)
    bad = conn.request(make(by_name.FetchRequest, replica_id=-1, max_wait=0, min_bytes=0,
                            max_bytes=1 << 20, isolation_level=0, session_id=session,
                            session_epoch=2, topics=(), forgotten_topics_data=(), rack_id=""))
    assert bad.error_code == FETCH_SESSION_TOPIC_ID_ERROR
    # Delete the topic by its id (DeleteTopics v6) and create it again: a new id.
    d = conn.request(delete_topics_request(topic_ids=[old]))
    assert [(x.topic_id, x.name, x.error_code) for x in d.responses] == [(old, "reborn", 0)]
    new = create(conn, "reborn")
    assert new != old
    put(conn, "reborn", 0, b"new-1", b"new-2")
    # The session still holds the old id's partition: UNKNOWN_TOPIC_ID, never the new records.
    r = conn.request(fetch_by_id_request(None, {}, session_id=session, epoch=2))
    got = partitions_of(r)
    assert list(got) == [(old, 0)] and got[old, 0].error_code == UNKNOWN_TOPIC_ID
    assert not got[old, 0].records
    # The client forgets the old id and adds the new one to the same session.
    r = conn.request(fetch_by_id_request(new, {0: 0}, session_id=session, epoch=3,
                                         forgotten=[(old, 0)]))
    got = partitions_of(r)
    assert list(got) == [(new, 0)] and values_of(got[new, 0]) == [b"new-1", b"new-2"]


def test_a_session_by_name_refuses_requests_by_id(conn):
    tid = create(conn, "named")
    opened = conn.request(_session_by_name("named"))
    assert opened.session_id > 0
    r = conn.request(fetch_by_id_request(tid, {0: 0}, session_id=opened.session_id, epoch=1))
    assert r.error_code == FETCH_SESSION_TOPIC_ID_ERROR and not r.responses


def _session_by_name(topic: str):
    mod = request_module(ApiKey.FETCH, 12)
    p = make(mod.FetchPartition, partition=0, current_leader_epoch=-1, fetch_offset=0,
             last_fetched_epoch=-1, log_start_offset=-1, partition_max_bytes=1 << 20)
    return make(mod.FetchRequest, replica_id=-1, max_wait=0, min_bytes=0, max_bytes=1 << 20,
                isolation_level=0, session_id=0, session_epoch=0,
                topics=(make(mod.FetchTopic, topic=topic, partitions=(p,)),),
                forgotten_topics_data=(), rack_id="")


def test_fetch_v16_names_the_current_leader_of_a_fenced_epoch(tmp_path):
    """KIP-951: a client fetching at an older leader epoch learns the leader, its epoch and
    its endpoint in the same answer (the epoch of a single node rises at every start)."""
    with EmbeddedBroker(data_dir=tmp_path) as b, RawConnection(b.bootstrap_servers) as c:
        tid = create(c, "fenced")
    with EmbeddedBroker(data_dir=tmp_path) as b, RawConnection(b.bootstrap_servers) as c:
        epoch = c.request(metadata_request(["fenced"])).topics[0].partitions[0].leader_epoch
        assert epoch >= 1
        r = c.request(fetch_by_id_request(tid, {0: 0}, version=16,
                                          current_leader_epoch=epoch - 1))
        pd = partitions_of(r)[tid, 0]
        assert pd.error_code == FENCED_LEADER_EPOCH
        node = b.broker.node_id
        assert (pd.current_leader.leader_id, pd.current_leader.leader_epoch) == (node, epoch)
        assert [(n.node_id, n.host, n.port) for n in r.node_endpoints] == [
            (node, "127.0.0.1", b.port)]
        # v15 has no such fields; the error alone.
        r = c.request(fetch_by_id_request(tid, {0: 0}, version=15,
                                          current_leader_epoch=epoch - 1))
        assert partitions_of(r)[tid, 0].error_code == FENCED_LEADER_EPOCH


def test_delete_topics_v6_by_id_and_by_name(conn):
    a = create(conn, "del-a")
    b = create(conn, "del-b")
    stranger = uuid.uuid4()
    r = conn.request(delete_topics_request(names=["del-b", "del-none"],
                                           topic_ids=[a, stranger]))
    got = {(x.name, x.topic_id): x.error_code for x in r.responses}
    # a topic deleted by name is answered with its id too, as Kafka does
    assert got == {("del-b", b): 0,
                   ("del-none", None): UNKNOWN_TOPIC_OR_PARTITION,
                   ("del-a", a): 0, (None, stranger): UNKNOWN_TOPIC_ID}
    assert not [t for t in conn.request(metadata_request(None)).topics
                if t.name in ("del-a", "del-b")]
    # A topic named both ways is an invalid request, and nothing is deleted.
    c = create(conn, "del-c")
    mod = request_module(ApiKey.DELETE_TOPICS, 6)
    r = conn.request(make(mod.DeleteTopicsRequest, timeout=30_000, topics=(
        make(mod.DeleteTopicState, name="del-c", topic_id=c),)))
    assert [x.error_code for x in r.responses] == [INVALID_REQUEST]
    assert conn.request(metadata_request(["del-c"])).topics[0].topic_id == c


def test_metadata_v12_looks_topics_up_by_id(conn):
    tid = create(conn, "looked-up", partitions=3)
    stranger = uuid.uuid4()
    mod = request_module(ApiKey.METADATA, 12)
    r = conn.request(make(mod.MetadataRequest, allow_auto_topic_creation=False,
                          include_topic_authorized_operations=False, topics=(
                              make(mod.MetadataRequestTopic, topic_id=tid, name=None),
                              make(mod.MetadataRequestTopic, topic_id=stranger, name=None))))
    by_name = {t.name: t for t in r.topics}
    assert by_name["looked-up"].topic_id == tid and len(by_name["looked-up"].partitions) == 3
    assert (by_name[None].error_code, by_name[None].topic_id) == (UNKNOWN_TOPIC_ID, stranger)
