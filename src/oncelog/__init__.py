"""oncelog: a Kafka-protocol streaming log with exactly-once semantics."""

from .client import (
    Admin,
    Consumer,
    ConsumerGroupMetadata,
    ConsumerRecord,
    NewTopic,
    PreparedTxnState,
    Producer,
    RecordMetadata,
    TopicPartition,
    TransactionError,
)

__all__ = [
    "Admin",
    "Consumer",
    "ConsumerGroupMetadata",
    "ConsumerRecord",
    "NewTopic",
    "PreparedTxnState",
    "Producer",
    "RecordMetadata",
    "TopicPartition",
    "TransactionError",
]
