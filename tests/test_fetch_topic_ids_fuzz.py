"""Fetch v13-v17 requests that are well formed but arbitrary in what they ask (known and unknown
topic ids, any partition and offset, sessions opened, continued, mixed up and closed, forgotten
partitions, leader epochs, a follower's id) all get an answer from a real broker, never
UNKNOWN_SERVER_ERROR, and the broker keeps serving. The wire fuzzer (test_fuzz_wire.py) pushes
the same versions out of shape; this one stays in shape to reach the handler's every branch."""

from __future__ import annotations

import dataclasses
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.raw_wire import (
    BASE_TIMESTAMP,
    RawConnection,
    create_topics_request,
    fetch_by_id_request,
    produce,
)

from oncelog.protocol import ApiKey, make, request_module
from oncelog.records import build_batch
from oncelog.server.embedded import EmbeddedBroker

UNKNOWN_SERVER_ERROR = -1


@pytest.fixture(scope="module")
def target():
    with EmbeddedBroker() as b, RawConnection(b.bootstrap_servers) as conn:
        r = conn.request(create_topics_request("fuzzed", 3))
        tid = r.topics[0].topic_id
        for p in range(3):
            batch = build_batch([(None, b"x" * p, [], BASE_TIMESTAMP)])
            assert produce(conn, "fuzzed", p, batch).error_code == 0
        yield conn, tid


# The session the last "open" created and the epoch its next incremental fetch must carry.
LAST_SESSION = {"id": 0, "epoch": 0}

ids = st.sampled_from(["known", "unknown", "zero"])
partitions = st.dictionaries(st.integers(-2, 5), st.integers(-3, 3), max_size=4)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(version=st.integers(13, 17), which=ids, parts=partitions,
       session=st.sampled_from(["none", "open", "last", "bogus"]),
       epoch_step=st.integers(-1, 2), leader_epoch=st.integers(-1, 2),
       forget=st.booleans(), replica=st.integers(-1, 2))
def test_any_fetch_by_topic_id_is_answered(target, version, which, parts, session, epoch_step,
                                           leader_epoch, forget, replica):
    conn, tid = target
    topic_id = {"known": tid, "unknown": uuid.uuid4(), "zero": None}[which]
    session_id, epoch = {"none": (0, -1), "open": (0, 0), "bogus": (12345, 1),
                         "last": (LAST_SESSION["id"], LAST_SESSION["epoch"] + epoch_step)}[session]
    request = fetch_by_id_request(topic_id, parts, version=version, session_id=session_id,
                                  epoch=epoch, current_leader_epoch=leader_epoch,
                                  forgotten=[(topic_id, p) for p in parts] if forget else ())
    if replica >= 0:  # a follower's fetch: replica_id (v13-v14) or replica_state (v15+)
        mod = request_module(ApiKey.FETCH, version)
        request = dataclasses.replace(request, **(
            {"replica_state": make(mod.ReplicaState, replica_id=replica, replica_epoch=-1)}
            if version >= 15 else {"replica_id": replica}))
    response = conn.request(request)
    codes = [int(p.error_code) for t in response.responses for p in t.partitions]
    assert int(response.error_code) != UNKNOWN_SERVER_ERROR
    assert UNKNOWN_SERVER_ERROR not in codes, response
    if int(response.error_code) == 0 and response.session_id:
        if session == "open":
            LAST_SESSION.update(id=response.session_id, epoch=1)
        elif session == "last" and epoch > 0:
            LAST_SESSION["epoch"] = epoch + 1
