"""Topics and partitions hosted by this broker, and their metadata on disk.

Each topic's metadata (id, partition count, config overrides) is one JSON file in
``<data-dir>/.topics/``, written atomically; each partition is a ``<topic>-<n>`` log directory.
Creation writes the metadata file last, deletion removes it first, so a crash in between leaves
either a whole topic or none (stray partition directories are removed at startup).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import shutil
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from kio.schema.errors import ErrorCode

from ..log import PartitionLog
from ..log.leader_epoch import CHECKPOINT_FILE, LeaderEpochCache
from ..log.loader import HIGH_WATERMARK_FILE
from ..log.preallocator import Preallocator
from ..log.segment import os_error_name
from ..spark_markers import MARKER_TOPIC
from .config import BrokerConfig, ConfigError, validate_topic_configs

log = logging.getLogger("oncelog.topics")

TOPIC_NAME_RE = re.compile(r"^[a-zA-Z0-9._-]+$")
# Kafka's internal topics: the coordinators' logs. Clients may read them but never write them.
CONSUMER_OFFSETS = "__consumer_offsets"
TRANSACTION_STATE = "__transaction_state"
INTERNAL_TOPICS = frozenset({CONSUMER_OFFSETS, TRANSACTION_STATE})
# Shown as internal (Metadata's is_internal, left out of listings) besides those: the Spark
# sink's markers (oncelog/spark_markers.py). Its client creates the topic and commits offsets
# for it, so it is not refused to clients as the coordinators' topics are.
SHOWN_INTERNAL = INTERNAL_TOPICS | {MARKER_TOPIC}
MAX_TOPIC_NAME_LENGTH = 249
META_DIR = ".topics"


def java_string_hash(s: str) -> int:
    """Java's String.hashCode (over UTF-16 code units), as a signed 32-bit int."""
    h = 0
    data = s.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def coordinator_partition(key: str, num_partitions: int) -> int:
    """The partition of ``__consumer_offsets`` / ``__transaction_state`` that owns a group id or
    transactional id: Kafka's ``Utils.abs(key.hashCode) % numPartitions`` (spec 000,
    "Transaction Coordinator"), so that the same id maps to the same partition as in Kafka."""
    h = java_string_hash(key)
    return (0 if h == -(1 << 31) else abs(h)) % num_partitions


def internal_topic_configs(name: str, configs: dict[str, str]) -> dict[str, str]:
    """An internal topic's configs as stored, with the compaction Kafka gives them: data dirs
    (and clusters) made before oncelog compacted logs stored ``cleanup.policy=delete`` for
    ``__consumer_offsets`` and ``__transaction_state``, which then grew for ever."""
    if name in INTERNAL_TOPICS and configs.get("cleanup.policy", "delete") == "delete":
        return {**configs, "cleanup.policy": "compact"}
    return configs


class TopicError(Exception):
    """A topic operation refused; ``error_name`` is the Kafka error code (ErrorCode)."""

    def __init__(self, error_name: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.error_name = error_name


def check_topic_name(name: str | None) -> None:
    if not name:
        raise TopicError(ErrorCode.invalid_topic_exception, "topic name is empty")
    if name in (".", ".."):
        raise TopicError(ErrorCode.invalid_topic_exception, f"topic name cannot be {name!r}")
    if len(name) > MAX_TOPIC_NAME_LENGTH:
        raise TopicError(ErrorCode.invalid_topic_exception,
                         f"topic name is longer than {MAX_TOPIC_NAME_LENGTH} characters")
    if not TOPIC_NAME_RE.match(name):
        raise TopicError(ErrorCode.invalid_topic_exception,
                         f"topic name {name!r} may contain only ASCII letters, digits, '.', '_' "
                         "and '-'")


@dataclass
class Partition:
    topic: str
    index: int
    log: PartitionLog
    # Futures of long-polling fetches, woken when this partition gets new data: consumers'
    # (which read to the high watermark) and followers' (which read to the log end).
    waiters: set[asyncio.Future] = field(default_factory=set)
    replica_waiters: set[asyncio.Future] = field(default_factory=set)

    def notify_append(self) -> None:
        """Wake every long poll (new data, a new log start, the partition gone)."""
        self.notify_high_watermark()
        self.notify_log_end()

    def notify_high_watermark(self) -> None:
        """Wake the consumers' long polls: what they may read grew. A follower reads to the
        log end, so this moves nothing for it (Kafka's delayed follower fetch waits for bytes
        past its fetch offset, not for the high watermark)."""
        for fut in self.waiters:
            if not fut.done():
                fut.set_result(None)
        self.waiters.clear()

    def notify_log_end(self) -> None:
        """Wake the followers' long polls: the log end moved."""
        for fut in self.replica_waiters:
            if not fut.done():
                fut.set_result(None)
        self.replica_waiters.clear()


@dataclass
class Topic:
    name: str
    topic_id: uuid.UUID
    configs: dict[str, str]
    # The partitions this broker hosts: those whose replicas include this broker (all of them
    # on a cluster of one; ``partition_count`` is the topic's size).
    partitions: list[Partition]
    partition_count: int = -1

    def __post_init__(self) -> None:
        if self.partition_count < 0:
            self.partition_count = len(self.partitions)

    @property
    def is_internal(self) -> bool:
        return self.name in INTERNAL_TOPICS

    def hosted(self, index: int) -> Partition | None:
        parts = self.partitions
        if 0 <= index < len(parts) and parts[index].index == index:
            return parts[index]  # every partition hosted here (a cluster of one): no search
        for p in parts:
            if p.index == index:
                return p
        return None


class TopicManager:
    def __init__(self, data_dir: Path, config: BrokerConfig, now_ms: int,
                 preallocator: Preallocator | None = None) -> None:
        # Every log is a replica (a single node is a cluster of one): it keeps a high watermark
        # of its own and a leader epoch cache (log/log.py), and a topic's local metadata
        # records which of its partitions this broker hosts.
        self.data_dir = Path(data_dir)
        self.config = config
        self.preallocator = preallocator
        self.meta_dir = self.data_dir / META_DIR
        self.meta_dir.mkdir(parents=True, exist_ok=True)
        self.topics: dict[str, Topic] = {}
        self.by_id: dict[uuid.UUID, Topic] = {}
        self._load(now_ms)

    def _load(self, now_ms: int) -> None:
        for path in sorted(self.meta_dir.glob("*.json")):
            meta = json.loads(path.read_text())
            name = meta["name"]
            configs = internal_topic_configs(name, meta.get("configs", {}))
            log_config = self.config.log_config(configs)
            hosted = meta.get("hosted", range(meta["partitions"]))
            parts = [
                Partition(name, i, self._open_log(name, i, log_config, now_ms))
                for i in hosted
            ]
            topic = Topic(name, uuid.UUID(meta["id"]), configs, parts, meta["partitions"])
            self.topics[name] = topic
            self.by_id[topic.topic_id] = topic
        for path in self.meta_dir.glob("*.tmp"):
            path.unlink(missing_ok=True)
        # Partition directories with no topic: a creation or deletion cut short by a crash.
        for path in self.data_dir.iterdir():
            topic_name, sep, idx = path.name.rpartition("-")
            if path.is_dir() and sep and idx.isdigit() and path.name != META_DIR:
                owner = self.topics.get(topic_name)
                if owner is None or owner.hosted(int(idx)) is None:
                    shutil.rmtree(path, ignore_errors=True)

    def _open_log(self, name: str, index: int, log_config, now_ms: int) -> PartitionLog:
        directory = self.data_dir / f"{name}-{index}"
        if directory.is_dir() and not (directory / HIGH_WATERMARK_FILE).exists() \
                and not (directory / CHECKPOINT_FILE).exists():
            # A log written before a single node was a cluster of one: its batches carry the
            # leader epochs the producers sent (-1, or anything), not a leader's. An empty
            # checkpoint keeps the log from rebuilding its epochs out of them.
            LeaderEpochCache(directory / CHECKPOINT_FILE).flush()
        return PartitionLog(directory, log_config, now_ms, self.preallocator)

    def get(self, name: str) -> Topic | None:
        return self.topics.get(name)

    def partition(self, topic: str, index: int) -> Partition | None:
        """The partition if this broker hosts it (is one of its replicas)."""
        t = self.topics.get(topic)
        return None if t is None else t.hosted(index)

    def all_partitions(self):
        for t in self.topics.values():
            yield from t.partitions

    def validate_new(self, name: str, num_partitions: int, configs: dict[str, str | None],
                     internal: bool = False) -> dict[str, str]:
        check_topic_name(name)
        if name in INTERNAL_TOPICS and not internal:
            raise TopicError(ErrorCode.invalid_request,
                             f"{name!r} is an internal topic: the broker creates it")
        if name in self.topics:
            raise TopicError(ErrorCode.topic_already_exists, f"Topic '{name}' already exists.")
        if num_partitions < 1:
            raise TopicError(ErrorCode.invalid_partitions, f"number of partitions must be >= 1, "
                             f"got {num_partitions}")
        if num_partitions > 10000:
            raise TopicError(ErrorCode.invalid_partitions, "more than 10000 partitions")
        try:
            return validate_topic_configs(configs, self.config.topic_defaults())
        except ConfigError as exc:
            raise TopicError(ErrorCode.invalid_config, str(exc)) from None

    def create(self, name: str, num_partitions: int, configs: dict[str, str | None],
               now_ms: int, internal: bool = False) -> Topic:
        clean = self.validate_new(name, num_partitions, configs, internal)
        topic_id = uuid.uuid4()
        log_config = self.config.log_config(clean)
        parts: list[Partition] = []
        try:
            for i in range(num_partitions):
                parts.append(Partition(name, i, self._open_log(name, i, log_config, now_ms)))
            self._write_meta({"name": name, "id": str(topic_id), "partitions": num_partitions,
                              "configs": clean})
        except OSError as exc:
            # Undo the half-made topic: every file it opened closed, its directories gone, so
            # a full disk or a process out of descriptors leaves nothing behind to leak.
            for p in parts:
                p.log.delete()
            shutil.rmtree(self.data_dir / f"{name}-{len(parts)}", ignore_errors=True)
            log.error("creating topic %r failed: %s", name, os_error_name(exc))
            raise TopicError(ErrorCode.kafka_storage_error,
                             f"cannot create topic {name!r}: {os_error_name(exc)}") from None
        topic = Topic(name, topic_id, clean, parts)
        self.topics[name] = topic
        self.by_id[topic_id] = topic
        return topic

    def host(self, name: str, topic_id: uuid.UUID, partition_count: int,
             configs: dict[str, str], hosted: set[int], now_ms: int) -> Topic:
        """Make the local copy of a topic of the cluster (from the metadata view) host
        exactly ``hosted`` of its partitions, opening logs for new replicas and deleting those
        no longer assigned here. A local topic of the same name but another id (deleted and
        created again while this broker was away) is replaced."""
        topic = self.topics.get(name)
        if topic is not None and topic.topic_id != topic_id:
            self.delete(name, force=True)
            topic = None
        configs = internal_topic_configs(name, configs)
        if topic is not None and topic.configs != configs:
            self.update_configs(name, configs)  # AlterConfigs on some broker of the cluster
        have = {p.index for p in topic.partitions} if topic is not None else set()
        if topic is not None and have == hosted and topic.partition_count == partition_count:
            return topic
        log_config = self.config.log_config(configs)
        parts = [p for p in (topic.partitions if topic else []) if p.index in hosted]
        for p in (topic.partitions if topic else []):
            if p.index not in hosted:
                p.notify_append()
                p.log.delete()
        for i in sorted(hosted - have):
            parts.append(Partition(name, i, self._open_log(name, i, log_config, now_ms)))
        parts.sort(key=lambda p: p.index)
        self._write_meta({"name": name, "id": str(topic_id), "partitions": partition_count,
                          "configs": configs, "hosted": sorted(hosted)})
        new = Topic(name, topic_id, dict(configs), parts, partition_count)
        self.topics[name] = new
        self.by_id[topic_id] = new
        return new

    def update_configs(self, name: str, configs: dict[str, str]) -> None:
        """A topic's new config overrides (AlterConfigs): stored, and taken up at once by its
        logs (retention, segment size and age, max.message.bytes, compression ...)."""
        topic = self.topics[name]
        topic.configs = dict(configs)
        self._write_meta({"name": name, "id": str(topic.topic_id),
                          "partitions": topic.partition_count, "configs": topic.configs,
                          "hosted": [p.index for p in topic.partitions]})
        self.reconfigure(name)

    def reconfigure(self, name: str | None = None) -> None:
        """Give the logs of a topic (of every topic: the broker's dynamic configs changed)
        the LogConfig their settings now make."""
        for topic in [self.topics[name]] if name is not None else list(self.topics.values()):
            log_config = self.config.log_config(topic.configs)
            for p in topic.partitions:
                p.log.config = log_config

    def _write_meta(self, meta: dict) -> None:
        path = self.meta_dir / f"{meta['name']}.json"
        tmp = self.meta_dir / f"{meta['name']}.json.tmp"
        with open(tmp, "w") as f:
            json.dump(meta, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    def delete(self, name: str, force: bool = False) -> None:
        """Delete a topic and its logs (``force``: internal ones too: the metadata
        decides)."""
        topic = self.topics.get(name)
        if topic is None:
            raise TopicError(ErrorCode.unknown_topic_or_partition, f"topic {name!r} does not exist")
        if topic.is_internal and not force:
            raise TopicError(ErrorCode.invalid_topic_exception, f"internal topic {name!r} cannot be deleted")
        (self.meta_dir / f"{name}.json").unlink(missing_ok=True)
        del self.topics[name]
        self.by_id.pop(topic.topic_id, None)
        for p in topic.partitions:
            p.notify_append()  # wake fetchers so they see the topic is gone
            p.log.delete()

    def close(self, now_ms: int) -> None:
        for p in self.all_partitions():
            p.log.close(now_ms)
