"""The Produce request the producer writes by hand (client/producer/produce_request.py) is byte for byte
what kio writes for the same request, in every version the client sends."""

from __future__ import annotations

import pytest

from oncelog.client.connection import _request_head
from oncelog.client.messages import build_request
from oncelog.client.producer.produce_request import MAX_VERSION, MIN_VERSION, produce_body
from oncelog.protocol import ApiKey, encode_request
from oncelog.protocol.apis import SUPPORTED_VERSIONS
from oncelog.records.batch import build_batch


def _kio_frame(version, correlation_id, client_id, transactional_id, acks, timeout, topics):
    values = {"transactional_id": transactional_id, "acks": acks, "timeout": timeout,
              "topic_data": [{"name": name, "partition_data": [
                  {"index": index, "records": records} for index, records in parts]}
                  for name, parts in topics]}
    return encode_request(correlation_id, client_id,
                          build_request(ApiKey.PRODUCE, version, values))


def _ours(version, correlation_id, client_id, transactional_id, acks, timeout, topics):
    body = produce_body(version, transactional_id, acks, timeout, topics)
    return _request_head(ApiKey.PRODUCE, version, correlation_id, client_id, len(body)) + body


def test_the_hand_written_versions_are_the_ones_the_client_sends():
    assert SUPPORTED_VERSIONS[ApiKey.PRODUCE] == (MIN_VERSION, MAX_VERSION)


@pytest.mark.parametrize("version", range(MIN_VERSION, MAX_VERSION + 1))
@pytest.mark.parametrize("transactional_id", [None, "txn-\u00e9t\u00e9"])
def test_produce_request_matches_kio(version, transactional_id):
    small = build_batch([(b"k", b"v", [], 1000)], producer_id=7, base_sequence=3)
    # 200 bytes of key: a record whose lengths need two-byte varints, and a batch over 127
    # bytes (a two-byte compact length in the flexible versions)
    large = build_batch([(b"x" * 200, b"y" * 5000, [("h", b"1")], 2000)] * 3)
    topics = [("topic-a", [(0, small), (3, large)]),
              ("t" * 130, [(2, large)]),
              ("\u00fcber", [(1, small)])]
    for client_id in (None, "oncelog-producer-1"):
        for acks in (-1, 0, 1):
            args = (version, 12345, client_id, transactional_id, acks, 30000, topics)
            assert _ours(*args) == _kio_frame(*args)


def test_an_empty_produce_request_matches_kio():
    for version in (MIN_VERSION, MAX_VERSION):
        args = (version, 0, "c", None, -1, 1, [])
        assert _ours(*args) == _kio_frame(*args)


def test_versions_outside_the_hand_written_range_are_refused():
    with pytest.raises(ValueError):
        produce_body(MAX_VERSION + 1, None, -1, 1, [])
