"""A single node is a cluster of one (server/metadata_local.py): leadership, leader epochs,
the ISR and the high watermark on the same code path a replicated cluster takes, in the fast
tier (an embedded broker, no ZooKeeper)."""

from __future__ import annotations

from support.raw_wire import (
    RawConnection,
    create_topics_request,
    metadata_request,
    produce_request,
)

from oncelog.protocol import ApiKey, make, request_module
from oncelog.records import build_batch
from oncelog.server.embedded import EmbeddedBroker
from oncelog.server.topics import TRANSACTION_STATE

NOT_ENOUGH_REPLICAS = 19
INVALID_REPLICATION_FACTOR = 38


def _partition(conn: RawConnection, topic: str):
    (t,) = conn.request(metadata_request([topic])).topics
    assert t.error_code == 0, t
    return t.partitions[0]


def _produce(conn: RawConnection, topic: str, acks: int):
    response = conn.request(produce_request(topic, 0, build_batch([(None, b"v", [], 0)]),
                                            acks=acks))
    return response.responses[0].partition_responses[0]


def test_a_start_elects_the_broker_again_at_a_higher_leader_epoch(tmp_path):
    epochs = []
    for _ in range(3):
        with EmbeddedBroker(data_dir=tmp_path) as b, \
                RawConnection(b.bootstrap_servers) as conn:
            if not epochs:
                assert conn.request(create_topics_request("t")).topics[0].error_code == 0
            p = _partition(conn, "t")
            node = b.broker.node_id
            assert (p.leader_id, tuple(p.replica_nodes), tuple(p.isr_nodes)) == \
                (node, (node,), (node,))
            epochs.append(p.leader_epoch)
            # The leader stamps its epoch into what it appends.
            assert _produce(conn, "t", acks=-1).error_code == 0
            plog = b.broker.topics.partition("t", 0).log
            assert plog.leader_epoch_cache.latest_epoch == p.leader_epoch
    assert epochs[0] == 0 and epochs[0] < epochs[1] < epochs[2]


def test_the_high_watermark_follows_the_lone_isr_and_min_insync_replicas_counts(tmp_path):
    with EmbeddedBroker(data_dir=tmp_path) as b, RawConnection(b.bootstrap_servers) as conn:
        assert conn.request(create_topics_request(
            "strict", configs={"min.insync.replicas": "2"})).topics[0].error_code == 0
        assert conn.request(create_topics_request("t")).topics[0].error_code == 0
        for acks in (1, -1):
            r = _produce(conn, "t", acks=acks)
            assert r.error_code == 0
            plog = b.broker.topics.partition("t", 0).log
            assert plog.high_watermark == plog.log_end_offset == r.base_offset + 1
        # One broker can never make two in-sync replicas: acks=all is refused before the
        # append, acks=1 is taken.
        assert _produce(conn, "strict", acks=-1).error_code == NOT_ENOUGH_REPLICAS
        assert _produce(conn, "strict", acks=1).error_code == 0
        mod = request_module(ApiKey.CREATE_TOPICS, 7)
        two = make(mod.CreateTopicsRequest, timeout=30_000, validate_only=False, topics=(make(
            mod.CreatableTopic, name="two", num_partitions=1, replication_factor=2,
            assignments=(), configs=()),))
        (result,) = conn.request(two).topics
        assert result.error_code == INVALID_REPLICATION_FACTOR
        assert "only 1 broker(s) are registered" in result.error_message


def test_the_transaction_coordinators_follow_their_partitions_leadership(tmp_path):
    config = {"transaction.state.log.num.partitions": "4"}
    for run in range(2):
        with EmbeddedBroker(data_dir=tmp_path, config=config) as b:
            service = b.broker.txn_coordinator
            if run == 0:
                assert b.call(service.core_for, "app")[0] is not None  # creates the topic
            shards = service.runtime.shards
            assert sorted(shards) == [0, 1, 2, 3]
            for index, core in shards.items():
                r = b.broker.replication.leader_replica(TRANSACTION_STATE, index)
                # The coordinator's epoch is the partition's leader epoch.
                assert core.coordinator_epoch == r.leader_epoch
                assert (run == 0) == (r.leader_epoch == 0)
