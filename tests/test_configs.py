"""AlterConfigs, IncrementalAlterConfigs and DescribeConfigs against a broker process, through
confluent-kafka's AdminClient, our Admin and ``oncelog configs``: topic overrides and dynamic
broker configs are validated as Kafka does, described with their sources and synonyms, kept
across a restart, and taken up by the running logs (retention, compression, LogAppendTime,
timestamp bounds, max.message.bytes, segment.ms)."""

from __future__ import annotations

import itertools
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewTopic,
)
from support.cli import oncelog
from support.raw_wire import RawConnection
from support.waiting import wait_until

from oncelog import Admin
from oncelog.client.admin.admin_configs import AlterConfigOp, OpType
from oncelog.client.admin.admin_configs import ConfigResource as Resource
from oncelog.client.admin.admin_configs import ConfigSource as Source
from oncelog.errors import InvalidConfigError, InvalidRequestError, UnknownTopicOrPartitionError
from oncelog.harness.broker_process import BrokerProcess
from oncelog.protocol import ApiKey, make, request_module
from oncelog.records import iter_batches

pytestmark = pytest.mark.filterwarnings("ignore:alter_configs has been deprecated")

SETTINGS = {"log.retention.check.interval.ms": "200"}


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    with BrokerProcess(tmp_path_factory.mktemp("configs") / "data", settings=SETTINGS) as b:
        yield b


@pytest.fixture
def admin(broker):
    return AdminClient({"bootstrap.servers": broker.bootstrap_servers})


def new_topic(admin: AdminClient, **configs: str) -> str:
    name = f"t-{uuid.uuid4().hex[:8]}"
    admin.create_topics([NewTopic(name, 1, 1, config=configs)])[name].result()
    return name


def described(admin: AdminClient, resource: ConfigResource) -> dict:
    return admin.describe_configs([resource])[resource].result()


def alter_error(admin: AdminClient, resource: ConfigResource, incremental: bool = False):
    call = admin.incremental_alter_configs if incremental else admin.alter_configs
    with pytest.raises(KafkaException) as info:
        call([resource])[resource].result()
    return info.value.args[0]


def test_topic_configs_altered_and_described_with_their_source(admin):
    topic = new_topic(admin)
    r = ConfigResource("topic", topic, set_config={"retention.ms": "3600000",
                                                   "cleanup.policy": "compact,delete"})
    admin.alter_configs([r])[r].result()
    got = described(admin, ConfigResource("topic", topic))
    assert (got["retention.ms"].value, got["retention.ms"].source) == \
        ("3600000", ConfigSource.DYNAMIC_TOPIC_CONFIG.value)
    assert got["cleanup.policy"].value == "compact,delete"
    assert (got["segment.ms"].value, got["segment.ms"].source) == \
        ("604800000", ConfigSource.DEFAULT_CONFIG.value)
    # Kafka's whole topic list is there, compaction's and tiered storage's included.
    assert {"min.cleanable.dirty.ratio", "compression.zstd.level", "local.retention.ms",
            "message.downconversion.enable", "follower.replication.throttled.replicas"} <= set(got)

    # Incremental: SUBTRACT from and APPEND to a list, SET one, DELETE one (back to default).
    r = ConfigResource("topic", topic, incremental_configs=[
        ConfigEntry("cleanup.policy", "compact", incremental_operation=AlterConfigOpType.SUBTRACT),
        ConfigEntry("segment.ms", "60000", incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("retention.ms", None, incremental_operation=AlterConfigOpType.DELETE)])
    admin.incremental_alter_configs([r])[r].result()
    got = described(admin, ConfigResource("topic", topic))
    assert got["cleanup.policy"].value == "delete" and got["segment.ms"].value == "60000"
    assert got["retention.ms"].source == ConfigSource.DEFAULT_CONFIG.value
    r = ConfigResource("topic", topic, incremental_configs=[ConfigEntry(
        "cleanup.policy", "compact", incremental_operation=AlterConfigOpType.APPEND)])
    admin.incremental_alter_configs([r])[r].result()
    assert described(admin, ConfigResource("topic", topic))["cleanup.policy"].value == \
        "delete,compact"

    # validate_only checks and changes nothing.
    r = ConfigResource("topic", topic, set_config={"retention.ms": "5"})
    admin.alter_configs([r], validate_only=True)[r].result()
    assert described(admin, ConfigResource("topic", topic))["retention.ms"].source == \
        ConfigSource.DEFAULT_CONFIG.value


def test_bad_changes_are_refused_as_kafka_refuses_them(admin, broker):
    topic = new_topic(admin)
    err = alter_error(admin, ConfigResource("topic", topic, set_config={"retention.ms": "soon"}))
    assert err.code() == KafkaError.INVALID_CONFIG
    assert err.str() == ("Invalid value soon for configuration retention.ms: "
                         "Not a number of type LONG")
    for bad in ({"no.such.config": "1"}, {"compression.type": "brotli"},
                {"message.timestamp.type": "WallClock"}, {"min.insync.replicas": "0"},
                {"min.cleanable.dirty.ratio": "1.5"}, {"cleanup.policy": "compact,shred"},
                {"remote.storage.enable": "true"}, {"compression.lz4.level": "18"},
                {"min.compaction.lag.ms": "10", "max.compaction.lag.ms": "5"}):
        err = alter_error(admin, ConfigResource("topic", topic, set_config=bad))
        assert err.code() == KafkaError.INVALID_CONFIG, bad
    err = alter_error(admin, ConfigResource("topic", topic, incremental_configs=[ConfigEntry(
        "retention.ms", "5", incremental_operation=AlterConfigOpType.APPEND)]), incremental=True)
    assert (err.code(), err.str()) == (
        KafkaError.INVALID_CONFIG,
        "Config value append is not allowed for config key: retention.ms")
    err = alter_error(admin, ConfigResource("topic", "never-created",
                                            set_config={"retention.ms": "5"}))
    assert err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART
    # Read-only broker settings and another broker's id: INVALID_REQUEST (KAFKA-13609).
    err = alter_error(admin, ConfigResource("broker", "1", set_config={"node.id": "7"}))
    assert (err.code(), err.str()) == (KafkaError.INVALID_REQUEST,
                                       "Cannot update these configs dynamically: [node.id]")
    err = alter_error(admin, ConfigResource("broker", "1", set_config={
        "log.retention.ms": "later"}))
    assert err.code() == KafkaError.INVALID_REQUEST
    # What librdkafka's admin tests (0081) set on a broker: accepted, as by Kafka.
    r = ConfigResource("broker", "1", incremental_configs=[
        ConfigEntry("sasl.kerberos.min.time.before.relogin", "58000",
                    incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("background.threads", "9", incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("log.cleanup.policy", "compact",
                    incremental_operation=AlterConfigOpType.APPEND)])
    admin.incremental_alter_configs([r])[r].result()
    got = described(admin, ConfigResource("broker", "1"))
    assert (got["background.threads"].value, got["log.cleanup.policy"].value) == \
        ("9", "delete,compact")
    r = ConfigResource("broker", "1", set_config={})
    admin.alter_configs([r])[r].result()
    err = alter_error(admin, ConfigResource("group", "g", set_config={"x": "1"}))
    assert err.code() == KafkaError.INVALID_REQUEST
    with Admin(bootstrap_servers=broker.bootstrap_servers) as ours:
        with pytest.raises(InvalidRequestError, match="Unexpected broker id, expected 1"):
            ours.alter_configs({Resource.broker_default(): {"log.retention.ms": "1"},
                                Resource.broker(2): {"log.retention.ms": "1"}})
        with pytest.raises(InvalidConfigError, match="Unknown topic config name: retention"):
            ours.incremental_alter_configs({Resource.topic(topic): [
                AlterConfigOp("retention", "1")]})
        with pytest.raises(UnknownTopicOrPartitionError):
            ours.describe_configs([Resource.topic("never-created")])


def test_dynamic_broker_configs_layer_over_the_static_ones(broker, admin):
    topic = new_topic(admin)
    with Admin(bootstrap_servers=broker.bootstrap_servers) as ours:
        ours.incremental_alter_configs({Resource.broker_default(): [
            AlterConfigOp("log.retention.ms", "7200000"),
            AlterConfigOp("log.cleanup.policy", "compact", OpType.APPEND)]})
        node = ours.describe_configs([Resource.broker(1)], include_synonyms=True)[
            Resource.broker(1)]
        assert (node["log.retention.ms"].value, node["log.retention.ms"].source) == \
            ("7200000", Source.DYNAMIC_DEFAULT_BROKER_CONFIG)
        assert node["log.cleanup.policy"].value == "delete,compact"
        assert not node["log.retention.ms"].read_only and node["node.id"].read_only
        assert node["log.retention.check.interval.ms"].source == Source.STATIC_BROKER_CONFIG

        ours.alter_configs({Resource.broker(1): {"log.retention.ms": "10800000"}})
        node = ours.describe_configs([Resource.broker(1), Resource.broker_default()],
                                     include_synonyms=True)
        entry = node[Resource.broker(1)]["log.retention.ms"]
        assert (entry.value, entry.source) == ("10800000", Source.DYNAMIC_BROKER_CONFIG)
        assert [(s.value, s.source) for s in entry.synonyms] == [
            ("10800000", Source.DYNAMIC_BROKER_CONFIG),
            ("7200000", Source.DYNAMIC_DEFAULT_BROKER_CONFIG),
            ("604800000", Source.DEFAULT_CONFIG)]
        # The default resource shows the cluster-wide layer alone.
        assert set(node[Resource.broker_default()]) == {"log.retention.ms",
                                                        "log.cleanup.policy"}
        # A topic without an override takes the broker's value, and says where it is from.
        got = ours.describe_configs([Resource.topic(topic)], include_synonyms=True)[
            Resource.topic(topic)]["retention.ms"]
        assert (got.value, got.source) == ("10800000", Source.DYNAMIC_BROKER_CONFIG)
        assert got.synonyms[0].name == "log.retention.ms"
        ours.alter_configs({Resource.broker(1): {}, Resource.broker_default(): {}})
        node = ours.describe_configs([Resource.broker(1)])[Resource.broker(1)]
        assert node["log.retention.ms"].source == Source.DEFAULT_CONFIG


def test_configs_survive_a_restart(tmp_path):
    with BrokerProcess(tmp_path / "data") as b:
        admin = AdminClient({"bootstrap.servers": b.bootstrap_servers})
        topic = new_topic(admin, **{"retention.ms": "123456"})
        r = ConfigResource("topic", topic, set_config={"retention.ms": "654321",
                                                       "compression.type": "zstd"})
        admin.alter_configs([r])[r].result()
        with Admin(bootstrap_servers=b.bootstrap_servers) as ours:
            ours.alter_configs({Resource.broker_default(): {"log.segment.bytes": "2000000"},
                                Resource.broker(1): {"message.max.bytes": "300000"}})
        b.restart()
        admin = AdminClient({"bootstrap.servers": b.bootstrap_servers})
        got = described(admin, ConfigResource("topic", topic))
        assert (got["retention.ms"].value, got["compression.type"].value,
                got["segment.bytes"].value, got["max.message.bytes"].value) == \
            ("654321", "zstd", "2000000", "300000")
        assert got["segment.bytes"].source == ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value


def _produce(broker, topic: str, values, flush_each: bool = False, **config) -> list:
    """Produce ``values`` (or (value, timestamp) pairs); the delivery errors. ``flush_each``:
    one batch per record."""
    errors: list = []
    p = Producer({"bootstrap.servers": broker.bootstrap_servers, "linger.ms": 5, **config})
    for v in values:
        kwargs = {}
        if isinstance(v, tuple):
            v, kwargs = v[0], {"timestamp": v[1]}
        p.produce(topic, v, on_delivery=lambda e, m: errors.append(e) if e else None, **kwargs)
        if flush_each:
            p.flush(30)
    assert p.flush(30) == 0
    return errors


def _consume(broker, topic: str, n: int) -> list:
    c = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": uuid.uuid4().hex,
                  "auto.offset.reset": "earliest", "enable.auto.commit": False})
    c.assign([TopicPartition(topic, 0, 0)])
    out = []
    deadline = time.monotonic() + 30
    while len(out) < n and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is not None and not m.error():
            out.append(m)
    c.close()
    return out


def _batches(broker, topic: str) -> list:
    out = []
    for path in sorted(Path(broker.data_dir, f"{topic}-0").glob("*.log")):
        out += [h for _pos, h in iter_batches(path.read_bytes())]
    return out


def test_compression_type_recompresses_what_producers_send(broker, admin):
    topic = new_topic(admin)
    r = ConfigResource("topic", topic, set_config={"compression.type": "lz4"})
    admin.alter_configs([r])[r].result()
    values = [b"value-%04d" % i * 20 for i in range(200)]
    assert _produce(broker, topic, values[:100], **{"compression.type": "none",
                                                   "enable.idempotence": True}) == []
    assert _produce(broker, topic, values[100:], **{"compression.type": "gzip"}) == []
    assert [m.value() for m in _consume(broker, topic, 200)] == values
    batches = _batches(broker, topic)
    assert {h.attributes & 0x07 for h in batches} == {3}  # lz4, whatever was sent
    assert sum(h.records_count for h in batches) == 200
    # The idempotent producer's batches kept their sequences: consecutive, from 0.
    seqs = [(h.base_sequence, h.records_count) for h in batches if h.producer_id >= 0]
    assert seqs[0][0] == 0 and all(a + n == b for (a, n), (b, _) in itertools.pairwise(seqs))
    # "uncompressed" stores them plain; "producer" as sent.
    r = ConfigResource("topic", topic, set_config={"compression.type": "uncompressed"})
    admin.alter_configs([r])[r].result()
    # (librdkafka sends a batch uncompressed when its codec would not make it smaller.)
    assert _produce(broker, topic, [b"plain" * 100], **{"compression.type": "snappy"}) == []
    assert _batches(broker, topic)[-1].attributes & 0x07 == 0
    r = ConfigResource("topic", topic, set_config={})
    admin.alter_configs([r])[r].result()
    assert _produce(broker, topic, [b"snappy" * 100], **{"compression.type": "snappy"}) == []
    assert _batches(broker, topic)[-1].attributes & 0x07 == 2
    assert [m.value() for m in _consume(broker, topic, 202)][-2:] == [b"plain" * 100,
                                                                      b"snappy" * 100]


def test_log_append_time_and_timestamp_bounds_apply_at_once(broker, admin):
    topic = new_topic(admin)
    hour_ago = int(time.time() * 1000) - 3_600_000
    r = ConfigResource("topic", topic, set_config={"message.timestamp.before.max.ms": "60000"})
    admin.alter_configs([r])[r].result()
    errors = _produce(broker, topic, [(b"old", hour_ago)])
    assert [e.code() for e in errors] == [KafkaError.INVALID_TIMESTAMP]
    r = ConfigResource("topic", topic, set_config={"message.timestamp.type": "LogAppendTime"})
    admin.alter_configs([r])[r].result()
    before = int(time.time() * 1000)
    assert _produce(broker, topic, [(b"stamped", hour_ago)]) == []
    (m,) = _consume(broker, topic, 1)
    kind, ts = m.timestamp()
    assert m.value() == b"stamped" and kind == 2 and ts >= before  # TIMESTAMP_LOG_APPEND_TIME
    assert _batches(broker, topic)[-1].attributes & 0x08


def test_lowered_retention_deletes_old_segments_and_max_message_bytes_refuses(broker, admin):
    topic = new_topic(admin, **{"segment.bytes": "1000"})
    hour_ago = int(time.time() * 1000) - 3_600_000
    assert _produce(broker, topic, [(b"x" * 300, hour_ago + i) for i in range(20)],
                    flush_each=True) == []
    assert len(list(Path(broker.data_dir, f"{topic}-0").glob("*.log"))) > 3
    c = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": "g"})
    assert c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10) == (0, 20)
    r = ConfigResource("topic", topic, set_config={"segment.bytes": "1000",
                                                   "retention.ms": "60000",
                                                   "max.message.bytes": "200"})
    admin.alter_configs([r])[r].result()
    # Retention (every 200 ms here) deletes every segment but the active one.
    wait_until(lambda: c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[0] >= 18,
               20, "retention to delete the old segments")
    c.close()
    errors = _produce(broker, topic, [b"y" * 300])
    assert [e.code() for e in errors] == [KafkaError.MSG_SIZE_TOO_LARGE]


def test_segment_ms_rolls_the_active_segment(broker, admin):
    topic = new_topic(admin)
    now = int(time.time() * 1000)
    assert _produce(broker, topic, [(b"a", now - 10_000)]) == []
    r = ConfigResource("topic", topic, set_config={"segment.ms": "1000"})
    admin.alter_configs([r])[r].result()
    assert _produce(broker, topic, [(b"b", now)]) == []  # 10 s after the first: a new segment
    assert len(list(Path(broker.data_dir, f"{topic}-0").glob("*.log"))) == 2


def test_cli_alters_and_describes_like_kafka_configs(broker, admin):
    topic = new_topic(admin)
    bs = ["--bootstrap-server", broker.bootstrap_servers]
    out = oncelog("configs", *bs, "--entity-type", "topics", "--entity-name", topic, "--alter",
                  "--add-config", "retention.ms=86400000,cleanup.policy=[compact,delete]")
    assert out.stdout.strip() == f"Completed updating config for topic {topic}."
    out = oncelog("configs", *bs, "--entity-type", "topics", "--entity-name", topic,
                  "--describe").stdout.splitlines()
    assert out[0] == f"Dynamic configs for topic {topic} are:"
    assert out[1].startswith("  cleanup.policy=compact,delete sensitive=false synonyms="
                             "{DYNAMIC_TOPIC_CONFIG:cleanup.policy=compact,delete, ")
    assert out[2].startswith("  retention.ms=86400000 ") and len(out) == 3
    oncelog("configs", *bs, "--topic", topic, "--alter", "--delete-config", "retention.ms")
    out = oncelog("configs", *bs, "--topic", topic, "--describe").stdout
    assert "retention.ms" not in out
    out = oncelog("configs", *bs, "--entity-type", "brokers", "--entity-default", "--alter",
                  "--add-config", "log.retention.bytes=1000000000")
    assert out.stdout.strip() == \
        "Completed updating default config for brokers in the cluster."
    out = oncelog("configs", *bs, "--broker", "1", "--describe", "--all").stdout
    assert "  log.retention.bytes=1000000000 sensitive=false synonyms={" \
           "DYNAMIC_DEFAULT_BROKER_CONFIG:log.retention.bytes=1000000000, " \
           "DEFAULT_CONFIG:log.retention.bytes=-1}" in out
    out = oncelog("configs", *bs, "--entity-type", "brokers", "--describe").stdout
    assert "Dynamic configs for broker 1 are:\nDefault configs for brokers in the cluster " \
           "are:\n  log.retention.bytes=1000000000 " in out
    oncelog("configs", *bs, "--broker-defaults", "--alter", "--delete-config",
            "log.retention.bytes")
    unset = oncelog("configs", *bs, "--broker-defaults", "--alter", "--delete-config",
                    "log.retention.bytes", check=False)
    assert unset.returncode == 2 and "Invalid config(s): log.retention.bytes" in unset.stderr
    bad = oncelog("configs", *bs, "--broker", "1", "--alter", "--add-config", "node.id=2",
                  check=False)
    assert bad.returncode == 1 and "Cannot update these configs dynamically" in bad.stderr


def test_connection_limits_change_while_the_broker_runs(broker):
    md = request_module(ApiKey.METADATA, 12)
    request = make(md.MetadataRequest, topics=(), allow_auto_topic_creation=False,
                   include_topic_authorized_operations=False)

    def new_connection_answered() -> bool:
        try:
            with RawConnection(broker.bootstrap_servers, timeout=5) as conn:
                return conn.request(request).brokers[0].node_id == 1
        except (OSError, EOFError, ConnectionError):
            return False

    with Admin(bootstrap_servers=broker.bootstrap_servers) as ours:
        ours.describe_configs([Resource.broker(1)])  # connected: keeps its connection
        try:
            ours.alter_configs({Resource.broker(1): {"max.connections.per.ip": "1"}})
            assert not new_connection_answered()  # closed at once: the IP has one already
        finally:
            ours.alter_configs({Resource.broker(1): {}})
        assert new_connection_answered()
