"""oncelog: a Kafka-protocol streaming log with exactly-once semantics."""

import sys as _sys


def _import_kio_without_hypothesis() -> None:
    """kio (the protocol's data types) registers Hypothesis strategies for its types whenever
    Hypothesis is importable, which adds ~0.4 s to every process that imports oncelog where the
    test extra is installed: every Spark commit (PySpark starts a fresh Python worker for each),
    every CLI command. Nothing of ours uses those strategies: import kio with Hypothesis hidden.
    A process that imported Hypothesis first keeps kio's hooks."""
    if "kio" in _sys.modules or "hypothesis" in _sys.modules:
        return
    _sys.modules["hypothesis"] = None  # type: ignore[assignment]  # import raises ImportError
    try:
        import kio.static.primitive  # noqa: F401  (imports kio.static._phantom)
    finally:
        del _sys.modules["hypothesis"]


_import_kio_without_hypothesis()


from .client import (
    Admin,
    Consumer,
    ConsumerGroupMetadata,
    ConsumerRecord,
    NewPartitions,
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
    "NewPartitions",
    "NewTopic",
    "PreparedTxnState",
    "Producer",
    "RecordMetadata",
    "TopicPartition",
    "TransactionError",
]
