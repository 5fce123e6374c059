"""The requests that name topics by id (KIP-516) under ACLs, as Kafka's KafkaApis: an id is no
secret, the name of a topic one may not describe is. Fetch v13+ needs Read on the topic the id
resolves to, Metadata v12 and DeleteTopics v6 Describe before they say its name."""

from __future__ import annotations

import uuid

import pytest
from support.raw_wire import (
    create_topics_request,
    delete_topics_request,
    fetch_by_id_request,
    metadata_request,
)
from support.security import Op, R, allow, grant, raw_login, sasl_config

from oncelog.protocol import ApiKey, make, request_module
from oncelog.server.embedded import EmbeddedBroker

TOPIC_AUTHORIZATION_FAILED = 29
UNKNOWN_TOPIC_ID = 100


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("authz-ids")
    with EmbeddedBroker(data_dir=tmp / "data", config=sasl_config(tmp)) as b:
        yield b


def create(b, name: str) -> uuid.UUID:
    with raw_login(b, "admin") as admin:
        r = admin.request(create_topics_request(name))
        assert r.topics[0].error_code == 0, r
        return r.topics[0].topic_id


def metadata_by_id(conn, *ids):
    mod = request_module(ApiKey.METADATA, 12)
    return conn.request(make(mod.MetadataRequest, allow_auto_topic_creation=False,
                             include_topic_authorized_operations=False, topics=tuple(
                                 make(mod.MetadataRequestTopic, topic_id=i, name=None)
                                 for i in ids))).topics


def test_fetch_by_id_needs_read_on_the_topic(broker):
    tid = create(broker, "ids-fetch")
    stranger = uuid.uuid4()
    with raw_login(broker, "bob") as bob:
        for asked, error in ((tid, TOPIC_AUTHORIZATION_FAILED), (stranger, UNKNOWN_TOPIC_ID)):
            r = bob.request(fetch_by_id_request(asked, {0: 0}))
            [(got_id, pd)] = [(t.topic_id, p) for t in r.responses for p in t.partitions]
            assert (got_id, pd.error_code, pd.records or b"") == (asked, error, b"")
    grant(broker, allow("User:alice", R.TOPIC, "ids-fetch", Op.READ))
    with raw_login(broker, "alice") as alice:
        r = alice.request(fetch_by_id_request(tid, {0: 0}))
        assert r.responses[0].partitions[0].error_code == 0


def test_metadata_by_id_hides_the_name_without_describe(broker):
    tid = create(broker, "ids-metadata")
    stranger = uuid.uuid4()
    with raw_login(broker, "bob") as bob:
        got = [(t.name, t.topic_id, t.error_code) for t in metadata_by_id(bob, tid, stranger)]
    assert got == [(None, tid, TOPIC_AUTHORIZATION_FAILED), (None, stranger, UNKNOWN_TOPIC_ID)]
    grant(broker, allow("User:alice", R.TOPIC, "ids-metadata", Op.DESCRIBE))
    with raw_login(broker, "alice") as alice:
        [t] = metadata_by_id(alice, tid)
    assert (t.name, t.topic_id, t.error_code, len(t.partitions)) == ("ids-metadata", tid, 0, 1)


def test_delete_by_id_needs_describe_to_name_and_delete_to_delete(broker):
    tid = create(broker, "ids-delete")
    with raw_login(broker, "bob") as bob:
        [res] = bob.request(delete_topics_request(topic_ids=[tid])).responses
    assert (res.name, res.topic_id, res.error_code) == (None, tid, TOPIC_AUTHORIZATION_FAILED)
    grant(broker, allow("User:alice", R.TOPIC, "ids-delete", Op.DESCRIBE))
    with raw_login(broker, "alice") as alice:
        [res] = alice.request(delete_topics_request(topic_ids=[tid])).responses
        assert (res.name, res.error_code) == ("ids-delete", TOPIC_AUTHORIZATION_FAILED)
    grant(broker, allow("User:alice", R.TOPIC, "ids-delete", Op.DELETE))
    with raw_login(broker, "alice") as alice:
        [res] = alice.request(delete_topics_request(topic_ids=[tid])).responses
        assert (res.name, res.error_code) == ("ids-delete", 0)
    with raw_login(broker, "admin") as admin:
        assert admin.request(metadata_request(["ids-delete"])).topics[0].error_code != 0
