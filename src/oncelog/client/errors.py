"""Errors the client raises on its own, with no broker error code behind them.

They subclass the groups of ``oncelog.errors`` so that ``except RetriableError`` and
``except KafkaError`` catch them too. Broker errors are the classes of ``oncelog.errors``.
"""

from __future__ import annotations

from ..errors import AbortableError, KafkaError, RetriableError


class KafkaTimeoutError(RetriableError, TimeoutError):
    """An operation did not finish in time (the Java client's TimeoutException): a record
    not acknowledged within delivery.timeout.ms, metadata not available within max.block.ms,
    an admin or offset lookup not answered within default.api.timeout.ms. Also a builtin
    ``TimeoutError``."""


class SslAuthenticationError(KafkaError):
    """The TLS handshake with a broker failed: its certificate is not trusted or does not
    name it, or it refused ours (the Java client's SslAuthenticationException). Not retried:
    the settings must change."""


class NoOffsetForPartitionError(KafkaError):
    """A consumer partition has no position and auto.offset.reset is "none" (Java's
    NoOffsetForPartitionException): call ``seek`` first."""


class SerializationError(KafkaError):
    """A key or value serializer (Producer) or deserializer (Consumer) raised (Kafka's
    SerializationException); the original exception is its ``__cause__``."""


class TransactionError(AbortableError):
    """The transaction cannot commit; abort it (and start a new one)."""


class IllegalStateError(KafkaError):
    """A transactional API called in a state that does not allow it (the Java client's
    IllegalStateException)."""
