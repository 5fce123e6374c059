"""The Admin client's SCRAM users (KIP-554): Kafka's ``describeUserScramCredentials`` and
``alterUserScramCredentials``. The password never leaves the client: it is salted and hashed
here (PBKDF2 with a random salt and the iterations asked for), and the broker derives its keys
from the salted password."""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ...errors import KafkaError, error_for_code
from ...protocol import ApiKey
from ...security.scram import MAX_ITERATIONS, MECHANISM_CODES, MECHANISM_NAMES, salted_password

DEFAULT_ITERATIONS = 4096  # Kafka's kafka-configs default


@dataclass(frozen=True)
class ScramCredentialInfo:
    mechanism: str  # "SCRAM-SHA-256" or "SCRAM-SHA-512"
    iterations: int


@dataclass(frozen=True)
class UserScramCredentialUpsertion:
    """Add or replace ``user``'s credential of ``mechanism``. ``salt``: random if not given."""

    user: str
    mechanism: str
    password: str
    iterations: int = DEFAULT_ITERATIONS
    salt: bytes | None = None


@dataclass(frozen=True)
class UserScramCredentialDeletion:
    user: str
    mechanism: str


def _code(mechanism: str) -> int:
    try:
        return MECHANISM_CODES[mechanism]
    except KeyError:
        raise ValueError(f"unknown SCRAM mechanism {mechanism!r}; one of "
                         + ", ".join(MECHANISM_CODES)) from None


def describe_request(users: Iterable[str] | None) -> dict[str, Any]:
    return {"users": None if users is None else [{"name": u} for u in users]}


def describe_result(r: Any) -> dict[str, list[ScramCredentialInfo]]:
    """Raises the request's error, else the first user's (ResourceNotFoundError for a user
    without credentials)."""
    if int(r.error_code):
        raise error_for_code(int(r.error_code))(r.error_message or
                                                "DescribeUserScramCredentials")
    out: dict[str, list[ScramCredentialInfo]] = {}
    for result in r.results:
        if int(result.error_code):
            raise error_for_code(int(result.error_code))(
                f"user {result.user!r}: {result.error_message or ''}")
        out[result.user] = [ScramCredentialInfo(MECHANISM_NAMES.get(int(c.mechanism),
                                                                    "UNKNOWN"), int(c.iterations))
                            for c in result.credential_infos]
    return out


def alter_request(alterations: Iterable[UserScramCredentialUpsertion |
                                        UserScramCredentialDeletion]) -> dict[str, Any]:
    upsertions, deletions = [], []
    for a in alterations:
        if isinstance(a, UserScramCredentialDeletion):
            deletions.append({"name": a.user, "mechanism": _code(a.mechanism)})
            continue
        code = _code(a.mechanism)
        salt = a.salt if a.salt is not None else os.urandom(32)
        # Out of range, the broker refuses the credential (UNACCEPTABLE_CREDENTIAL) whatever
        # it is: no need to hash a billion times first.
        rounds = a.iterations if 1 <= a.iterations <= MAX_ITERATIONS else 1
        upsertions.append({"name": a.user, "mechanism": code, "iterations": a.iterations,
                           "salt": salt, "salted_password": salted_password(
                               a.mechanism, a.password, salt, rounds)})
    return {"upsertions": upsertions, "deletions": deletions}


def alter_result(r: Any) -> dict[str, KafkaError | None]:
    return {result.user: (error_for_code(int(result.error_code))(
        f"user {result.user!r}: {result.error_message or ''}")
        if int(result.error_code) else None) for result in r.results}


def describe(net: Any, users: Iterable[str] | None, deadline: float
             ) -> dict[str, list[ScramCredentialInfo]]:
    return describe_result(net.request_any(ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS,
                                           describe_request(users), deadline))


def alter(net: Any, alterations: Iterable[UserScramCredentialUpsertion |
                                          UserScramCredentialDeletion], deadline: float
          ) -> dict[str, KafkaError | None]:
    return alter_result(net.request_any(ApiKey.ALTER_USER_SCRAM_CREDENTIALS,
                                        alter_request(alterations), deadline))
