"""Our own synchronous Kafka-protocol client: Producer, Consumer, Admin.

Files, one responsibility each (the split of aiokafka and the Java client):

- config.py              configuration keys, defaults (the Java client's), validation
- connection.py          one broker connection: ApiVersions handshake, pipelined requests
- network.py             all connections of a client, bootstrap, metadata requests
- metadata.py            the cluster snapshot: brokers, topics, partition leaders
- messages.py            kio request objects for whatever version was negotiated
- partitioner.py         murmur2 for keyed records, sticky for unkeyed ones
- accumulator.py         producer batching per partition
- sender.py              the producer's network loop (background thread), idempotence
- producer.py            Producer
- subscription_state.py  consumer assignment and positions
- fetcher.py             Fetch and ListOffsets, record decoding, read_committed filtering
- consumer.py            Consumer
- admin.py               Admin
- scram_admin.py         Admin's SCRAM users (KIP-554): the password salted and hashed here
- admin_configs.py       its config calls: ConfigResource, AlterConfigOp, ConfigEntry
- admin_groups.py        its consumer-group calls: describe groups, their offsets, ListOffsets
- types.py               TopicPartition, RecordMetadata, ConsumerRecord, NewTopic, ...
- errors.py              client-side errors (timeouts); broker errors are oncelog.errors
"""

from .admin.admin import Admin
from .admin.admin_configs import AlterConfigOp, ConfigEntry, ConfigResource, ConfigSource, OpType
from .admin.scram_admin import (
    ScramCredentialInfo,
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
)
from .consumer.consumer import Consumer
from .errors import (
    IllegalStateError,
    KafkaTimeoutError,
    NoOffsetForPartitionError,
    TransactionError,
)
from .producer.partitioner import murmur2
from .producer.producer import Producer
from .producer.transaction_manager import PreparedTxnState
from .types import (
    ConsumerGroupDescription,
    ConsumerGroupListing,
    ConsumerGroupMetadata,
    ConsumerRecord,
    ListOffsetsResultInfo,
    MemberDescription,
    NewPartitions,
    NewTopic,
    OffsetAndTimestamp,
    PartitionInfo,
    ProducerState,
    RecordMetadata,
    TopicDescription,
    TopicPartition,
    TransactionDescription,
    TransactionListing,
)

__all__ = [
    "Admin",
    "AlterConfigOp",
    "ConfigEntry",
    "ConfigResource",
    "ConfigSource",
    "Consumer",
    "ConsumerGroupDescription",
    "ConsumerGroupListing",
    "ConsumerGroupMetadata",
    "ConsumerRecord",
    "IllegalStateError",
    "KafkaTimeoutError",
    "ListOffsetsResultInfo",
    "MemberDescription",
    "NewPartitions",
    "NewTopic",
    "NoOffsetForPartitionError",
    "OffsetAndTimestamp",
    "OpType",
    "PartitionInfo",
    "PreparedTxnState",
    "Producer",
    "ProducerState",
    "RecordMetadata",
    "ScramCredentialInfo",
    "TopicDescription",
    "TopicPartition",
    "TransactionDescription",
    "TransactionError",
    "TransactionListing",
    "UserScramCredentialDeletion",
    "UserScramCredentialUpsertion",
    "murmur2",
]
