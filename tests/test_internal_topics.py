"""Internal topics and FindCoordinator: the coordinators' logs are created on first use, placed
by Kafka's hash of the key, readable by clients but never writable or deletable by them."""

from __future__ import annotations

import pytest
from support.raw_wire import RawConnection, create_topics_request, metadata_request, produce

from oncelog.protocol import ApiKey, make, request_module
from oncelog.records import build_batch
from oncelog.server.topics import coordinator_partition, java_string_hash


@pytest.fixture
def broker(embedded_broker):
    return embedded_broker


def _find_coordinator(conn, key: str, key_type: int, version: int):
    mod = request_module(ApiKey.FIND_COORDINATOR, version)
    if version >= 4:
        return conn.request(make(mod.FindCoordinatorRequest, key_type=key_type,
                                 coordinator_keys=(key,)))
    return conn.request(make(mod.FindCoordinatorRequest, key=key, key_type=key_type))


def test_java_string_hash_matches_java():
    # Values from Java's "...".hashCode().
    assert java_string_hash("") == 0
    assert java_string_hash("a") == 97
    assert java_string_hash("hello") == 99162322
    assert java_string_hash("polygenelubricants") == -(1 << 31)
    assert java_string_hash("é☃") == 233 * 31 + 0x2603
    assert coordinator_partition("polygenelubricants", 50) == 0
    assert coordinator_partition("my-group", 50) == abs(java_string_hash("my-group")) % 50


@pytest.mark.parametrize("version", [0, 1, 3, 4])
@pytest.mark.parametrize("key_type,topic", [(0, "__consumer_offsets"),
                                            (1, "__transaction_state")])
def test_find_coordinator_creates_the_internal_topic(broker, version, key_type, topic):
    if version == 0 and key_type == 1:
        pytest.skip("v0 has no key type")
    host, port = broker.bootstrap_servers.split(":")
    with RawConnection(broker.bootstrap_servers) as conn:
        r = _find_coordinator(conn, "some-key", key_type, version)
        found = r.coordinators[0] if version >= 4 else r
        assert (found.error_code, found.node_id, found.host, found.port) == (0, 1, host,
                                                                              int(port))
        meta = conn.request(metadata_request([topic]))
        (t,) = meta.topics
        assert t.error_code == 0 and t.is_internal and len(t.partitions) == 50


def test_empty_group_id_is_refused(broker):
    with RawConnection(broker.bootstrap_servers) as conn:
        r = _find_coordinator(conn, "", 0, 3)
        assert r.error_code == 24  # INVALID_GROUP_ID


def test_clients_cannot_create_write_or_delete_internal_topics(broker):
    with RawConnection(broker.bootstrap_servers) as conn:
        _find_coordinator(conn, "g", 0, 3)
        created = conn.request(create_topics_request("__transaction_state", 3))
        assert created.topics[0].error_code == 42  # INVALID_REQUEST
        r = produce(conn, "__consumer_offsets", 0, build_batch([(None, b"x", [], 1)]))
        assert r.error_code == 17  # INVALID_TOPIC_EXCEPTION
        mod = request_module(ApiKey.DELETE_TOPICS, 5)
        deleted = conn.request(make(mod.DeleteTopicsRequest, topic_names=("__consumer_offsets",),
                                    timeout=30_000))
        assert deleted.responses[0].error_code == 17
