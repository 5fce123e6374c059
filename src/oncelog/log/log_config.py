"""A partition log's settings (Kafka's LogConfig): the topic-level configs that change what the
log does, parsed, with Kafka's defaults (server/topic_configs.py fills them from a topic's
overrides over the broker's defaults). A running log's config is replaced as a whole when a
topic or broker config changes."""

from __future__ import annotations

from dataclasses import dataclass

MAX_LONG = 2**63 - 1


@dataclass
class LogConfig:
    """Per-topic log settings, Kafka's names in snake_case (topic-level keys)."""

    segment_bytes: int = 1 << 30
    segment_ms: int = 7 * 24 * 3600 * 1000
    retention_ms: int = 7 * 24 * 3600 * 1000  # -1: keep forever
    retention_bytes: int = -1
    index_interval_bytes: int = 4096
    flush_messages: int = MAX_LONG  # 1 = fsync before acknowledging
    message_timestamp_type: str = "CreateTime"
    max_message_bytes: int = 1048588
    # acks=all needs this many in-sync replicas (read by the replica manager on every append,
    # hence here, parsed, as in Kafka's LogConfig).
    min_insync_replicas: int = 1
    # KIP-937: a CreateTime record's timestamp must lie in [now - before, now + after].
    message_timestamp_before_max_ms: int = MAX_LONG
    message_timestamp_after_max_ms: int = 3_600_000
    producer_id_expiration_ms: int = 24 * 3600 * 1000
    producer_snapshot_interval_ms: int = 30_000
    # How far ahead of a busy segment's end to preallocate page cache (0: never). The amount
    # follows the append size (16 appends' worth), so idle partitions preallocate nothing.
    preallocate_ahead_bytes: int = 0  # off, as Kafka's log.preallocate (see server/config.py)
    # Kafka's segment.jitter.ms: each new segment rolls up to this much earlier (at random),
    # so that many partitions created together do not all roll at once.
    segment_jitter_ms: int = 0
    flush_ms: int = MAX_LONG  # fsync when the last flush is older than this
    # Kafka's compression.type: "producer" keeps each batch as sent; a codec (or
    # "uncompressed") recompresses batches that use another one (log/validator.py).
    compression_type: str = "producer"
    compression_gzip_level: int = -1
    compression_lz4_level: int = 9
    compression_zstd_level: int = 3
    # -- compaction (log/cleaner.py): "compact" keeps the latest record per key ---------------
    cleanup_policy: frozenset[str] = frozenset({"delete"})
    delete_retention_ms: int = 24 * 3600 * 1000  # tombstones and markers, after their pass
    min_cleanable_dirty_ratio: float = 0.5
    min_compaction_lag_ms: int = 0
    max_compaction_lag_ms: int = MAX_LONG
    # -- end of compaction ----------------------------------------------------------------------

    @property
    def compact(self) -> bool:
        return "compact" in self.cleanup_policy
