"""What the ``oncelog`` command says when something goes wrong: Kafka's error name and a
sentence, never a traceback, a repr or a Python class name; a SASL broker reached without
credentials named as such; retries shown on stderr while a command waits."""

from __future__ import annotations

import logging
import re
import sys

from ..client.retries import error_name
from ..errors import (
    IllegalSaslStateError,
    KafkaError,
    SaslAuthenticationFailedError,
)

# A sentence for the errors a command line meets most, where the message the client carries
# names only the call ("describe topic 'x'"). Kafka's own tools print its error classes'
# default messages; these say the same in our words.
_EXPLAINED = {
    "UNKNOWN_TOPIC_OR_PARTITION": "the topic or partition does not exist",
    "TOPIC_ALREADY_EXISTS": "a topic of that name exists already",
    "INVALID_TOPIC_EXCEPTION": "the topic name is not valid",
    "INVALID_PARTITIONS": "the partition count is not valid",
    "INVALID_REPLICATION_FACTOR": "the replication factor is not valid",
    "INVALID_CONFIG": "a config value is not valid",
    "TRANSACTIONAL_ID_NOT_FOUND": "the coordinator does not know this transactional id",
    "TOPIC_AUTHORIZATION_FAILED": "not authorized to access the topic",
    "GROUP_AUTHORIZATION_FAILED": "not authorized to access the group",
    "CLUSTER_AUTHORIZATION_FAILED": "not authorized for this cluster operation",
    "TRANSACTIONAL_ID_AUTHORIZATION_FAILED": "not authorized to use the transactional id",
    "SECURITY_DISABLED": "the broker has no authorizer (security is disabled)",
    "RESOURCE_NOT_FOUND": "no such resource",
    "UNACCEPTABLE_CREDENTIAL": "the credential is not acceptable",
    "GROUP_ID_NOT_FOUND": "the group does not exist",
    "NON_EMPTY_GROUP": "the group still has members",
    "POLICY_VIOLATION": "the request breaks the broker's policy",
    "INVALID_REQUEST": "the broker refused the request as invalid",
    "UNSUPPORTED_VERSION": "the broker does not support this request's version",
    "COORDINATOR_NOT_AVAILABLE": "the coordinator is not available",
    "NOT_COORDINATOR": "the broker asked is not the coordinator",
    "LEADER_NOT_AVAILABLE": "the partition has no leader right now",
    "OFFSET_OUT_OF_RANGE": "the offset is out of the partition's range",
}


_BOOTSTRAP_NODE = re.compile(r"\bnode -\d+(?: at |: )")


def describe(exc: BaseException, args=None) -> str:
    """One line for ``exc``: ``NAME: what happened`` (Kafka's error name when it has one)."""
    # The client numbers bootstrap servers -1, -2 ...: the address says it better.
    text = _BOOTSTRAP_NODE.sub("", str(exc))
    if isinstance(exc, IllegalSaslStateError) and getattr(args, "user", None):
        # Our broker answers a SaslHandshake on a PLAINTEXT listener so (Kafka's too).
        return (f"ILLEGAL_SASL_STATE: the broker at {args.bootstrap_server} does not take "
                "SASL authentication (its listener is PLAINTEXT): leave out --user")
    if isinstance(exc, KafkaError):
        if text == type(exc).__name__:
            text = ""
        name = error_name(exc) if exc.code >= 0 else ""
        hint = _hint(exc, args)
        if name:
            sentence = _EXPLAINED.get(name)
            if sentence and sentence not in text and (not text or _terse(text)):
                text = f"{text}: {sentence}" if text else sentence
            text = f"{name}: {text}" if text else name
        return (text or ("timed out" if isinstance(exc, TimeoutError) else "failed")) + hint
    return text or "failed"


def _terse(text: str) -> bool:
    """A message that names only the call ("describe topic 'x'", "transactional id 'y'",
    "topic 'x': metadata error"), not what went wrong."""
    return ":" not in text or len(text) < 60


def _hint(exc: KafkaError, args) -> str:
    if args is not None and getattr(args, "user", None) and \
            isinstance(exc, SaslAuthenticationFailedError):
        return f" (user {args.user!r}, --sasl-mechanism {args.sasl_mechanism})"
    return ""


def sasl_message(address: str) -> str:
    return (f"the broker at {address} requires SASL authentication (it closed the connection "
            "at the first request, as a SASL_PLAINTEXT listener does without credentials): "
            "give --user NAME with --password or $ONCELOG_PASSWORD (and --sasl-mechanism "
            "PLAIN or SCRAM-SHA-256 if not SCRAM-SHA-512)")


class _RetryPrinter(logging.Handler):
    """Prints the client's retry notes (``oncelog.client.retries``) on stderr, once per
    (call, error) every few seconds: a command that waits says what for, without a flood."""

    EVERY_S = 2.0

    def __init__(self, command: str) -> None:
        super().__init__(logging.INFO)
        self.command = command
        self._last: dict[tuple[str, str], float] = {}

    def emit(self, record: logging.LogRecord) -> None:
        key = (getattr(record, "api", ""), getattr(record, "error_name", ""))
        if record.created - self._last.get(key, float("-inf")) < self.EVERY_S:
            return
        self._last[key] = record.created
        print(f"oncelog {self.command}: {record.getMessage()}", file=sys.stderr, flush=True)


def show_retries(command: str) -> None:
    """From now on, print the client's retries on stderr."""
    log = logging.getLogger("oncelog.client.retries")
    log.setLevel(logging.INFO)
    log.propagate = False
    log.addHandler(_RetryPrinter(command))
