"""Small helpers shared by the handlers."""

from __future__ import annotations

from kio.schema.errors import ErrorCode


def error_code(name: str | None) -> ErrorCode:
    """Kafka error code from its snake_case name (as raised by the log and topic layers)."""
    if name is None:
        return ErrorCode.none
    return ErrorCode[name]
