"""A single node's metadata (server/metadata_local.py, and the common half in
server/metadata.py) against an in-memory broker: the topics, the replica manager and the fetch
sessions are doubles that record what the metadata asks of them, so the elections, views,
ISR versions, producer id blocks and CreateTopics / CreatePartitions / DeleteTopics checks are
tested without a broker (tests/test_local_metadata.py runs the same paths in a real one)."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pytest
from kio.schema.errors import ErrorCode

from oncelog.cluster.model import LeaderAndIsr
from oncelog.server.config import BrokerConfig
from oncelog.server.metadata import ProducerIds
from oncelog.server.metadata_local import (
    LEGACY_EPOCH_FILE,
    PRODUCER_ID_BLOCK_FILE,
    LocalMetadata,
)
from oncelog.server.topics import CONSUMER_OFFSETS, TopicError

NODE = 7


@dataclass
class _Partition:
    index: int
    latest_epoch: int | None = None  # what the log's leader-epoch checkpoint recorded

    @property
    def log(self):
        return SimpleNamespace(leader_epoch_cache=SimpleNamespace(latest_epoch=self.latest_epoch))


@dataclass
class _Topic:
    partitions: list[_Partition]
    configs: dict[str, str] = field(default_factory=dict)
    internal: bool = False
    topic_id: uuid.UUID = field(default_factory=uuid.uuid4)


class _Topics:
    """The broker's topics (server/topics.py) as a dict: what the metadata creates, grows and
    deletes."""

    def __init__(self) -> None:
        self.topics: dict[str, _Topic] = {}

    def validate_new(self, name, num, configs):
        return {k: v for k, v in configs.items() if v is not None}

    def create(self, name, num, configs, now, internal=False):
        self.topics[name] = _Topic([_Partition(i) for i in range(num)], dict(configs), internal)
        return self.topics[name]

    def host(self, name, topic_id, count, configs, indexes, now):
        t = self.topics[name]
        t.partitions += [_Partition(i) for i in sorted(indexes) if i >= len(t.partitions)]

    def update_configs(self, name, configs):
        self.topics[name].configs = dict(configs)

    def delete(self, name):
        del self.topics[name]


class _Broker:
    """What LocalMetadata is given by the broker; ``views`` is every view the replica manager
    was given, ``removed`` every topic the fetch sessions were told to forget."""

    def __init__(self, data_dir: Path, **config: str) -> None:
        self.node_id = NODE
        self.data_dir = data_dir
        self.host, self.port = "127.0.0.1", 9092
        self.config = BrokerConfig(config)
        self.topics = _Topics()
        self.views: list = []
        self.removed: list[str] = []
        self.security = SimpleNamespace(open_credentials=lambda store: None)


def _metadata(broker: _Broker) -> LocalMetadata:
    """Wired as server/broker.py wires it."""
    metadata = LocalMetadata(broker.node_id, broker.config, broker.data_dir, broker.topics,
                             cluster_id="c", credentials=broker.security,
                             on_dynamic_configs=lambda default, own: None,
                             on_topic_deleted=broker.removed.append,
                             listener=(broker.host, broker.port))
    metadata.view_listeners.append(broker.views.append)
    return metadata


def _started(broker: _Broker) -> LocalMetadata:
    metadata = _metadata(broker)
    asyncio.run(metadata.start())
    return metadata


def _create(metadata: LocalMetadata, name: str, num: int = 1, rf: int = 1, configs=None,
            assignment=None, validate_only: bool = False):
    return asyncio.run(metadata.create_topic(name, num, rf, configs or {}, assignment,
                                             validate_only=validate_only, timeout_ms=0))


def test_a_start_elects_every_partition_above_the_epoch_its_log_recorded(tmp_path):
    broker = _Broker(tmp_path)
    broker.topics.topics["t"] = _Topic([_Partition(0, latest_epoch=4), _Partition(1)])
    m = _started(broker)
    assert broker.views == [m.view] and m.view.controller_id == NODE
    assert set(m.view.brokers) == {NODE}
    for p, above in ((0, 4), (1, -1)):
        state = m.view.state("t", p)
        assert (state.leader, state.isr) == (NODE, (NODE,))
        assert state.leader_epoch > above
    assert m.view.topics["t"].partitions == {0: (NODE,), 1: (NODE,)}


def test_the_legacy_coordinator_epoch_file_lifts_the_epochs_and_is_removed(tmp_path):
    (tmp_path / LEGACY_EPOCH_FILE).write_text("9\n")
    broker = _Broker(tmp_path)
    broker.topics.topics["t"] = _Topic([_Partition(0, latest_epoch=2)])
    m = _started(broker)
    assert m.view.state("t", 0).leader_epoch > 9
    assert not (tmp_path / LEGACY_EPOCH_FILE).exists()


def test_a_created_topic_is_led_by_this_broker_at_epoch_zero_and_published(tmp_path):
    broker = _Broker(tmp_path)
    m = _started(broker)
    created = _create(m, "orders", num=3, configs={"cleanup.policy": "compact"})
    assert (created.partition_count, created.replication_factor) == (3, 1)
    assert created.topic_id == broker.topics.topics["orders"].topic_id
    assert len(broker.views) == 2 and broker.views[-1] is m.view
    for p in range(3):
        assert m.view.state("orders", p) == LeaderAndIsr(NODE, 0, (NODE,), 0)
        assert m.leader_of("orders", p) == NODE
    assert dict(m.view.topics["orders"].configs) == {"cleanup.policy": "compact"}


def test_validate_only_creates_nothing(tmp_path):
    broker = _Broker(tmp_path)
    m = _started(broker)
    created = _create(m, "dry", num=2, validate_only=True)
    assert created.partition_count == 2
    assert "dry" not in broker.topics.topics and "dry" not in m.view.topics
    assert len(broker.views) == 1


@pytest.mark.parametrize("num, rf, assignment, error", [
    (1, 2, None, ErrorCode.invalid_replication_factor),  # one broker
    (0, 1, None, ErrorCode.invalid_partitions),
    (1, 0, None, ErrorCode.invalid_replication_factor),
    (2, -1, {0: [NODE], 1: [NODE]}, ErrorCode.invalid_request),  # a count and an assignment
    (-1, -1, {0: [NODE], 2: [NODE]}, ErrorCode.invalid_replica_assignment),  # not 0..n-1
    (-1, -1, {0: [NODE, NODE]}, ErrorCode.invalid_replica_assignment),  # a replica twice
    (-1, -1, {0: [NODE + 1]}, ErrorCode.invalid_replica_assignment),  # no such broker
])
def test_create_topics_checks(tmp_path, num, rf, assignment, error):
    m = _started(_Broker(tmp_path))
    with pytest.raises(TopicError) as e:
        _create(m, "t", num=num, rf=rf, assignment=assignment)
    assert e.value.error_name == error
    assert "t" not in m.view.topics


def test_the_broker_defaults_fill_in_a_count_and_factor_left_out(tmp_path):
    m = _started(_Broker(tmp_path, **{"num.partitions": "4"}))
    created = _create(m, "t", num=-1, rf=-1)
    assert (created.partition_count, created.replication_factor) == (4, 1)


def test_names_that_differ_only_by_dot_and_underscore_collide(tmp_path):
    m = _started(_Broker(tmp_path))
    _create(m, "a_b")
    with pytest.raises(TopicError) as e:
        _create(m, "a.b")
    assert e.value.error_name == ErrorCode.invalid_topic_exception
    _create(m, "ab")  # neither: no collision to look for


def test_an_isr_change_is_conditional_on_the_state_version(tmp_path):
    m = _started(_Broker(tmp_path))
    _create(m, "t")
    shrunk = LeaderAndIsr(NODE, 0, (NODE,), 0)
    assert asyncio.run(m.alter_partition("t", 0, shrunk, expected_version=0)) == 1
    assert asyncio.run(m.alter_partition("t", 0, shrunk, expected_version=0)) is None  # stale
    assert m.view.states[("t", 0)] == (shrunk, 1)
    assert asyncio.run(m.alter_partition("t", 9, shrunk, expected_version=0)) is None


def test_added_partitions_get_leaders_and_the_checks_of_create_partitions(tmp_path):
    broker = _Broker(tmp_path)
    m = _started(broker)
    _create(m, "t", num=2)
    asyncio.run(m.create_partitions("t", 3, None, validate_only=False, timeout_ms=0))
    assert m.view.state("t", 2) == LeaderAndIsr(NODE, 0, (NODE,), 0)
    assert len(broker.topics.topics["t"].partitions) == 3
    for count, assignment, error in ((3, None, ErrorCode.invalid_partitions),
                                     (2, None, ErrorCode.invalid_partitions),
                                     (5, [[NODE]], ErrorCode.invalid_replica_assignment),
                                     (4, [[NODE + 1]], ErrorCode.invalid_replica_assignment)):
        with pytest.raises(TopicError) as e:
            asyncio.run(m.create_partitions("t", count, assignment, validate_only=False,
                                            timeout_ms=0))
        assert e.value.error_name == error, (count, assignment)
    with pytest.raises(TopicError) as e:
        asyncio.run(m.create_partitions("nope", 2, None, validate_only=False, timeout_ms=0))
    assert e.value.error_name == ErrorCode.unknown_topic_or_partition


def test_a_deleted_topic_leaves_the_view_its_states_and_the_fetch_sessions(tmp_path):
    broker = _Broker(tmp_path)
    m = _started(broker)
    _create(m, "gone", num=2)
    _create(m, "kept")
    asyncio.run(m.delete_topic("gone", timeout_ms=0))
    assert "gone" not in m.view.topics and "gone" not in broker.topics.topics
    assert not [tp for tp in m.view.states if tp[0] == "gone"]
    assert m.view.state("kept", 0) is not None
    assert broker.removed == ["gone"]
    with pytest.raises(TopicError) as e:
        asyncio.run(m.delete_topic("gone", timeout_ms=0))
    assert e.value.error_name == ErrorCode.unknown_topic_or_partition


def test_the_coordinator_topic_is_created_on_first_lookup_with_the_broker_settings(tmp_path):
    broker = _Broker(tmp_path, **{"offsets.topic.num.partitions": "5",
                                  "offsets.topic.segment.bytes": "1048576"})
    m = _started(broker)
    assert m.internal_partition_count(CONSUMER_OFFSETS) is None
    assert m.coordinator_of(CONSUMER_OFFSETS, "group-a") == (None, NODE)
    topic = broker.topics.topics[CONSUMER_OFFSETS]
    assert topic.internal and len(topic.partitions) == 5
    assert topic.configs == {"segment.bytes": "1048576", "cleanup.policy": "compact"}
    # replication factor 3 by default, which a cluster of one meets with its one broker
    assert m.view.topics[CONSUMER_OFFSETS].replication_factor == 1
    assert m.request_internal_topic(CONSUMER_OFFSETS) is None  # there already
    with pytest.raises(TopicError) as e:
        asyncio.run(m.delete_topic(CONSUMER_OFFSETS, timeout_ms=0))
    assert e.value.error_name == ErrorCode.invalid_topic_exception
    with pytest.raises(TopicError) as e:
        asyncio.run(m.create_partitions(CONSUMER_OFFSETS, 6, None, validate_only=False,
                                        timeout_ms=0))
    assert e.value.error_name == ErrorCode.invalid_topic_exception


def test_advertised_listeners(tmp_path):
    m = _started(_Broker(tmp_path, **{"advertised.listeners": "PLAINTEXT://relay.example:19092,"
                                                              "PLAINTEXT://other:1"}))
    assert m.advertised() == ("relay.example", 19092)
    assert m.view.brokers[NODE].host == "relay.example"
    assert _metadata(_Broker(tmp_path)).advertised() == ("127.0.0.1", 9092)
    with pytest.raises(ValueError):
        _metadata(_Broker(tmp_path, **{"advertised.listeners": "relay"})).advertised()


def test_producer_id_blocks_are_recorded_before_use_and_never_handed_out_twice(tmp_path):
    ids = ProducerIds(_started(_Broker(tmp_path)), block_size=3)
    assert [ids.next_producer_id() for _ in range(4)] == [0, 1, 2, 3]  # a second block
    assert (tmp_path / PRODUCER_ID_BLOCK_FILE).read_text() == "6"
    # a restart: the rest of the block in use is skipped, nothing is reused
    again = ProducerIds(_started(_Broker(tmp_path)), block_size=3)
    assert again.next_producer_id() == 6


@pytest.mark.parametrize("content", ["six", "-3"])
def test_a_damaged_producer_id_block_file_is_refused(tmp_path, content):
    (tmp_path / PRODUCER_ID_BLOCK_FILE).write_text(content)
    m = _started(_Broker(tmp_path))
    with pytest.raises(RuntimeError):
        m.allocate_producer_id_block(10)
    assert (tmp_path / PRODUCER_ID_BLOCK_FILE).read_text() == content
