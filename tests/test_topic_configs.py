"""Topic configs without a broker: Kafka's list and validation (server/topic_configs.py),
IncrementalAlterConfigs' list operations, dynamic broker configs' rules, and the log applying
compression.type (Kafka's LogValidator: recompression keeps producer id, epoch, sequence and
records; a new CRC), LogAppendTime, segment.jitter.ms and flush.ms."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from kio.schema.errors import ErrorCode
from support.logs import advance_high_watermark, open_log

from oncelog.log import LogAppendError, LogConfig
from oncelog.records import build_batch, decode_batch, iter_batches, split_batches, validate_batch
from oncelog.records.compression import Compression
from oncelog.server.config import BrokerConfig, ConfigError, validate_topic_configs
from oncelog.server.dynamic_config import check_dynamic
from oncelog.server.handlers.configs import RESOURCE_BROKER, RESOURCE_TOPIC, Refused, apply_ops

# Kafka 3.9's TopicConfig / LogConfig names, every one.
KAFKA_TOPIC_CONFIGS = {
    "cleanup.policy", "compression.type", "compression.gzip.level", "compression.lz4.level",
    "compression.zstd.level", "delete.retention.ms", "file.delete.delay.ms", "flush.messages",
    "flush.ms", "follower.replication.throttled.replicas", "index.interval.bytes",
    "leader.replication.throttled.replicas", "local.retention.bytes", "local.retention.ms",
    "max.compaction.lag.ms", "max.message.bytes", "message.downconversion.enable",
    "message.format.version", "message.timestamp.after.max.ms",
    "message.timestamp.before.max.ms", "message.timestamp.difference.max.ms",
    "message.timestamp.type", "min.cleanable.dirty.ratio", "min.compaction.lag.ms",
    "min.insync.replicas", "preallocate", "remote.log.copy.disable",
    "remote.log.delete.on.disable", "remote.storage.enable", "retention.bytes", "retention.ms",
    "segment.bytes", "segment.index.bytes", "segment.jitter.ms", "segment.ms",
    "unclean.leader.election.enable",
}


def test_every_kafka_topic_config_is_known_with_a_default():
    defaults = BrokerConfig().topic_defaults()
    assert set(defaults) == KAFKA_TOPIC_CONFIGS
    validate_topic_configs(defaults, defaults)  # the defaults themselves are valid


@pytest.mark.parametrize(("key", "good", "bad"), [
    ("cleanup.policy", ["compact", "delete", "compact,delete", "[delete, compact]", ""],
     ["shred", "compact;delete"]),
    ("compression.type", ["uncompressed", "zstd", "lz4", "snappy", "gzip", "producer"],
     ["none", "LZ4", "brotli"]),
    ("compression.gzip.level", ["-1", "1", "9"], ["0", "10"]),
    ("compression.lz4.level", ["1", "17"], ["0", "18"]),
    ("compression.zstd.level", ["-131072", "22"], ["23", "-131073"]),
    ("message.timestamp.type", ["CreateTime", "LogAppendTime"], ["createtime", "Now"]),
    ("message.timestamp.before.max.ms", ["0", str(2**63 - 1)], ["-1", str(2**63)]),
    ("segment.ms", ["1"], ["0", "1.5", "1e3"]),
    ("segment.bytes", ["14", str(2**31 - 1)], ["13", str(2**31)]),
    ("segment.index.bytes", ["4"], ["3"]),
    ("retention.ms", ["-1", "0"], ["-2"]),
    ("retention.bytes", ["-5", "0"], ["x"]),
    ("min.cleanable.dirty.ratio", ["0", "0.5", "1"], ["1.01", "-0.1", "nan"]),
    ("unclean.leader.election.enable", ["true", "FALSE"], ["yes", "1"]),
    ("preallocate", ["true"], ["maybe"]),
    ("min.insync.replicas", ["1"], ["0"]),
    ("max.compaction.lag.ms", ["1"], ["0"]),
    ("local.retention.ms", ["-2", "1000"], ["-3"]),
    ("leader.replication.throttled.replicas", ["*", "0:1,1:2", ""], ["0-1", "*,0:1"]),
    ("message.format.version", ["3.0-IV1", "2.8", "0.10.0", "0.10.0.0"], ["three", "1.2.3.4"]),
    ("remote.storage.enable", ["false"], ["true"]),
    ("remote.log.copy.disable", ["false"], ["true"]),
])
def test_values_are_checked_as_kafka_checks_them(key, good, bad):
    for value in good:
        validate_topic_configs({key: value})
    for value in bad:
        with pytest.raises(ConfigError):
            validate_topic_configs({key: value})


def test_messages_and_cross_checks_are_kafkas():
    with pytest.raises(ConfigError, match="^Unknown topic config name: retention$"):
        validate_topic_configs({"retention": "1"})
    with pytest.raises(ConfigError, match="^Invalid value 0 for configuration segment.ms: "
                                          "Value must be at least 1$"):
        validate_topic_configs({"segment.ms": "0"})
    defaults = BrokerConfig().topic_defaults()
    with pytest.raises(ConfigError, match=r"min.compaction.lag.ms \(7\) > max.compaction.lag.ms"):
        validate_topic_configs({"min.compaction.lag.ms": "7", "max.compaction.lag.ms": "6"},
                               defaults)
    # Lists are stored without brackets or blanks.
    assert validate_topic_configs({"cleanup.policy": "[compact, delete]"}) == \
        {"cleanup.policy": "compact,delete"}


def _op(name, value, op):
    return SimpleNamespace(name=name, value=value, config_operation=op)


def test_incremental_operations_on_lists_start_from_the_default():
    assert apply_ops(RESOURCE_TOPIC, {}, [_op("cleanup.policy", "compact", 2)]) == \
        {"cleanup.policy": "delete,compact"}
    assert apply_ops(RESOURCE_TOPIC, {"cleanup.policy": "compact,delete"},
                     [_op("cleanup.policy", "delete", 3), _op("cleanup.policy", "compact", 2)]) \
        == {"cleanup.policy": "compact"}
    assert apply_ops(RESOURCE_TOPIC, {"retention.ms": "1"},
                     [_op("retention.ms", None, 1), _op("segment.ms", "9", 0)]) == \
        {"segment.ms": "9"}
    assert apply_ops(RESOURCE_BROKER, {}, [_op("log.cleanup.policy", "compact", 2)]) == \
        {"log.cleanup.policy": "delete,compact"}
    for ops in ([_op("retention.ms", "1", 2)], [_op("no.such", "1", 3)],
                [_op("retention.ms", "1", 7)]):
        with pytest.raises(Refused):
            apply_ops(RESOURCE_TOPIC, {}, ops)


def test_only_kafkas_dynamic_broker_configs_may_change():
    config = BrokerConfig()
    assert check_dynamic(config, {"log.retention.ms": "5", "min.insync.replicas": "2",
                                  "log.cleanup.policy": "[compact,delete]",
                                  "producer.id.expiration.ms": "1000"})["log.cleanup.policy"] \
        == "compact,delete"
    with pytest.raises(ConfigError, match=r"^Cannot update these configs dynamically: "
                                          r"\[log.message.format.version, node.id\]$"):
        check_dynamic(config, {"node.id": "2", "log.message.format.version": "3.0"})
    with pytest.raises(ConfigError, match="Unknown broker configs"):
        check_dynamic(config, {"log.retention": "5"})
    with pytest.raises(ConfigError, match="Invalid value x for configuration log.roll.ms"):
        check_dynamic(config, {"log.roll.ms": "x"})
    # Kafka's settings with nothing to act on here are kept as Kafka checks them.
    assert check_dynamic(config, {"sasl.kerberos.min.time.before.relogin": "58000",
                                  "background.threads": "9"}) == {
        "sasl.kerberos.min.time.before.relogin": "58000", "background.threads": "9"}
    with pytest.raises(ConfigError, match="at default cluster level, broker id must be "
                                          r"specified: \[sasl.kerberos.kinit.cmd\]"):
        check_dynamic(config, {"sasl.kerberos.kinit.cmd": "kinit"}, per_broker=False)
    with pytest.raises(ConfigError, match="background.threads=21, value should not be "
                                          "greater than double the current value 10"):
        check_dynamic(config, {"background.threads": "21"})
    config.set_dynamic({"log.retention.ms": "5", "log.segment.bytes": "2000"},
                       {"log.retention.ms": "6"})
    cfg = config.log_config({"segment.bytes": "3000"})
    assert (cfg.retention_ms, cfg.segment_bytes) == (6, 3000)
    assert config.log_config({}).segment_bytes == 2000
    # A stored value that does not parse (another tool wrote it) leaves the broker's default.
    assert config.log_config({"retention.ms": "soon"}).retention_ms == 6


def _append(log, codec=Compression.NONE, values=(b"v" * 200,) * 20, ts=1_000, seq=0,
            now=1_000):
    data = bytearray(build_batch([(b"k", v, [("h", b"1")], ts + i) for i, v in enumerate(values)],
                                 compression=codec, producer_id=7, producer_epoch=2,
                                 base_sequence=seq))
    result = log.append(data, split_batches(data), now)
    advance_high_watermark(log)  # a single node's replica manager
    return result


def _stored(log):
    data = log.read(0, 1 << 20)
    return [(h, decode_batch(data, pos)[1]) for pos, h in iter_batches(data)]


def test_compression_type_rebuilds_batches_keeping_producer_fields(tmp_path):
    log = open_log(tmp_path / "t-0", LogConfig(compression_type="zstd"))
    _append(log, Compression.GZIP)
    assert _append(log, Compression.NONE, seq=20).base_offset == 20
    assert _append(log, Compression.ZSTD, seq=40).base_offset == 40
    # A retried batch, recompressed, is still the same batch: a duplicate, answered as before.
    assert _append(log, Compression.LZ4, seq=40).duplicate
    stored = _stored(log)
    assert [h.attributes & 7 for h, _ in stored] == [Compression.ZSTD] * 3
    data = log.read(0, 1 << 20)
    for pos, _h in iter_batches(data):
        validate_batch(data, pos)  # CRC
    for (h, records), first in zip(stored, (0, 20, 40), strict=True):
        assert (h.producer_id, h.producer_epoch, h.base_sequence, h.base_offset) == \
            (7, 2, first, first)
        assert [(r.offset, r.timestamp, r.key, r.headers) for r in records] == \
            [(first + i, 1_000 + i, b"k", [("h", b"1")]) for i in range(20)]
    log.config.compression_type = "uncompressed"
    _append(log, Compression.SNAPPY, seq=60)
    assert _stored(log)[-1][0].attributes & 7 == Compression.NONE


def test_a_batch_too_large_once_recompressed_is_refused(tmp_path):
    log = open_log(tmp_path / "t-0",
                   LogConfig(compression_type="uncompressed", max_message_bytes=2000))
    with pytest.raises(LogAppendError) as info:
        _append(log, Compression.GZIP)  # 4 KB of records, gzipped to far less
    assert info.value.error_name == ErrorCode.message_too_large
    assert log.log_end_offset == 0


def test_log_append_time_stamps_recompressed_batches_too(tmp_path):
    log = open_log(tmp_path / "t-0", LogConfig(compression_type="lz4",
                                               message_timestamp_type="LogAppendTime"))
    result = _append(log, Compression.NONE, now=50_000)
    assert result.log_append_time == 50_000
    (h, records), = _stored(log)
    assert h.attributes & 0x08 and h.max_timestamp == 50_000 and h.attributes & 7 == 3
    assert {r.timestamp for r in records} == {50_000}


def test_segment_jitter_rolls_earlier_and_flush_ms_flushes(tmp_path):
    log = open_log(tmp_path / "t-0", LogConfig(segment_ms=1_000, segment_jitter_ms=999,
                                               flush_ms=10))
    _append(log, now=100)
    log.roll(100)  # a new segment draws its jitter
    jitters = {log._roll_jitter_ms}
    for i in range(10):
        _append(log, seq=20 * (i + 1), ts=200 + i, now=200 + i)
        log.roll(200 + i)
        jitters.add(log._roll_jitter_ms)
    assert all(0 <= j < 999 for j in jitters) and len(jitters) > 1
    log = open_log(tmp_path / "u-0", LogConfig(flush_ms=10))
    _append(log, now=5)
    log.maintain(5)
    assert log.unflushed_messages == 20
    log.maintain(10)  # flush.ms passed since the last flush
    assert log.unflushed_messages == 0
