"""Retry progress: one INFO record on the ``oncelog.client.retries`` logger each time a client
call waits to ask again (a retriable answer such as LEADER_NOT_AVAILABLE or
COORDINATOR_LOAD_IN_PROGRESS, or a broker not answering), as Kafka's clients log a warning per
failed metadata fetch. Silent unless someone listens: the ``oncelog`` command prints them on
stderr, so that a command that waits says what it waits for."""

from __future__ import annotations

import logging

from kio.schema.errors import ErrorCode

from ..errors import KafkaError

log = logging.getLogger("oncelog.client.retries")


def error_name(error: BaseException | None) -> str:
    """Kafka's name of ``error``'s code (LEADER_NOT_AVAILABLE), else its message."""
    if isinstance(error, KafkaError) and error.code >= 0:
        try:
            return ErrorCode(error.code).name.upper()
        except ValueError:
            pass
    return str(error) if error is not None else "no answer"


def note(api: str, error: BaseException | None, attempt: int, remaining_s: float) -> None:
    """A call of ``api`` (METADATA, DESCRIBE_TRANSACTIONS ...) failed with ``error`` and will
    be tried again (``attempt`` is the coming one) until ``remaining_s`` have passed."""
    if log.isEnabledFor(logging.INFO):
        name = error_name(error)
        log.info("retrying %s: %s (attempt %d, giving up in %.0f s)", api, name, attempt,
                 max(0.0, remaining_s), extra={"api": api, "error_name": name})
