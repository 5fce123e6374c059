"""oncelog: a Kafka-protocol streaming log with exactly-once semantics."""

from .client import (
    Admin,
    Consumer,
    ConsumerRecord,
    NewTopic,
    Producer,
    RecordMetadata,
    TopicPartition,
)

__all__ = [
    "Admin",
    "Consumer",
    "ConsumerRecord",
    "NewTopic",
    "Producer",
    "RecordMetadata",
    "TopicPartition",
]
