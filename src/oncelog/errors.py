"""Exceptions named after Kafka's error codes, grouped as retriable, abortable and fatal.

One class per code in kio's ``ErrorCode`` table (which mirrors Kafka's ``Errors`` enum), named
in CamelCase with an ``Error`` suffix: ``OUT_OF_ORDER_SEQUENCE_NUMBER`` becomes
``OutOfOrderSequenceNumberError``. Catch by group:

- ``RetriableError``: the request may succeed if retried (the client retries these itself).
- ``AbortableError``: the current transaction must be aborted, the producer stays usable.
- ``FatalError``: the producer (or consumer) cannot continue; close it and create a new one.
- ``KafkaError`` (base of all three) for everything else: a non-retriable request failure.

``error_for_code(code)`` returns the class; ``raise_for_code(code, message)`` raises it.
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode


class KafkaError(Exception):
    """Base of every error the broker can answer with. ``code`` is Kafka's numeric code."""

    code: int = -1
    retriable: bool = False

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or type(self).__name__)


class RetriableError(KafkaError):
    retriable = True


class AbortableError(KafkaError):
    """The ongoing transaction must be aborted; the producer itself can go on."""


class FatalError(KafkaError):
    """The client instance cannot recover from this error."""


# Codes the Java producer treats as fatal (fenced, unauthorized, unsupported) or abortable.
_FATAL = {
    "invalid_producer_epoch",
    "producer_fenced",
    "transactional_id_authorization_failed",
    "cluster_authorization_failed",
    "unsupported_version",
    "unsupported_for_message_format",
    "invalid_producer_id_mapping",
    "invalid_txn_state",
    "fenced_instance_id",
    "unknown_producer_id",
}
_ABORTABLE = {
    "transaction_abortable",
    "topic_authorization_failed",
    "group_authorization_failed",
}


def _class_name(code_name: str) -> str:
    return "".join(part.capitalize() for part in code_name.split("_")) + "Error"


_BY_CODE: dict[int, type[KafkaError]] = {}


def _make_classes() -> None:
    module_globals = globals()
    for member in ErrorCode:
        if member.name == "none":
            continue
        if member.name in _FATAL:
            base: type[KafkaError] = FatalError
        elif member.name in _ABORTABLE:
            base = AbortableError
        elif member.retriable:
            base = RetriableError
        else:
            base = KafkaError
        name = _class_name(member.name)
        cls = type(name, (base,), {"code": int(member), "__module__": __name__,
                                   "__doc__": f"Kafka error {member.name.upper()} ({int(member)})."})
        module_globals[name] = cls
        _BY_CODE[int(member)] = cls


_make_classes()


class UnknownError(KafkaError):
    """An error code this client does not know."""


def error_for_code(code: int) -> type[KafkaError]:
    return _BY_CODE.get(int(code), UnknownError)


def raise_for_code(code: int, message: str | None = None) -> None:
    """Raise the exception for ``code`` unless it is 0 (NONE)."""
    if code:
        raise error_for_code(code)(message)

