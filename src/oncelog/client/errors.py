"""Errors the client raises on its own, with no broker error code behind them.

They subclass the groups of ``oncelog.errors`` so that ``except RetriableError`` and
``except KafkaError`` catch them too. Broker errors are the classes of ``oncelog.errors``.
"""

from __future__ import annotations

from ..errors import KafkaError, RetriableError


class KafkaTimeoutError(RetriableError, TimeoutError):
    """An operation did not finish in time (the Java client's TimeoutException): a record
    not acknowledged within delivery.timeout.ms, metadata not available within max.block.ms,
    an admin or offset lookup not answered within default.api.timeout.ms. Also a builtin
    ``TimeoutError``."""


class NoOffsetForPartitionError(KafkaError):
    """A consumer partition has no position and auto.offset.reset is "none" (Java's
    NoOffsetForPartitionException): call ``seek`` first."""
