"""DescribeLogDirs (KIP-113), which kafka-log-dirs and kafka-reassign-partitions --generate ask:
the broker's one log directory (its data directory), each hosted partition's size in bytes,
the directory's total and usable bytes (v4); all partitions when no topic is named, only the
hosted ones named otherwise. (Kafka's own tools against it: tests/test_kafka_tools_others.py.)"""

from __future__ import annotations

import os

from support.raw_wire import RawConnection, idempotent_batch, produce

from oncelog import Admin, NewTopic
from oncelog.protocol import ApiKey, make, request_module
from oncelog.server.embedded import EmbeddedBroker


def describe_log_dirs(conn: RawConnection, topics, version: int = 4):
    mod = request_module(ApiKey.DESCRIBE_LOG_DIRS, version)
    return conn.request(make(mod.DescribeLogDirsRequest, topics=None if topics is None else tuple(
        make(mod.DescribableLogDirTopic, topic=t, partitions=tuple(ps))
        for t, ps in topics.items())))


def test_the_data_directory_and_each_partitions_size(tmp_path):
    with EmbeddedBroker(tmp_path / "data") as b:
        with Admin(bootstrap_servers=b.bootstrap_servers) as admin:
            admin.create_topics([NewTopic("sized", 2), NewTopic("other", 1)])
        with RawConnection(b.bootstrap_servers) as conn:
            assert produce(conn, "sized", 1, idempotent_batch(-1, -1, -1, [b"x" * 100])) \
                .error_code == 0
            r = describe_log_dirs(conn, {"sized": [0, 1, 7], "nonesuch": [0]})
            assert int(r.error_code) == 0
            (result,) = r.results
            assert int(result.error_code) == 0
            assert result.log_dir == os.path.abspath(tmp_path / "data")
            assert result.total_bytes > 0 and 0 <= result.usable_bytes <= result.total_bytes
            (topic,) = result.topics  # partition 7 and the unknown topic are not hosted here
            sizes = {p.partition_index: p.partition_size for p in topic.partitions}
            assert topic.name == "sized" and sizes[0] == 0 and sizes[1] > 100
            assert all(p.offset_lag == 0 and not p.is_future_key for p in topic.partitions)
            everything = describe_log_dirs(conn, None, version=1)
            names = {t.name for t in everything.results[0].topics}
            assert {"sized", "other"} <= names
