"""SCRAM credentials as Kafka keeps them (KIP-554), sans IO.

A server keeps of a password only Kafka's ``ScramCredential``: salt, stored key, server key and
iterations, written as Kafka's ``ScramCredentialUtils`` writes them
(``salt=<b64>,stored_key=<b64>,server_key=<b64>,iterations=<n>``) under the mechanism's name in
the user's config entity (``{"SCRAM-SHA-256": "salt=...", ...}``). An AlterUserScramCredentials
client never sends the password either: it sends the salt, the iterations and the salted
password (PBKDF2 of the password), from which the broker derives the keys.

``plan_alteration`` is Kafka's ZkAdminManager.alterUserScramCredentials as a pure function: the
per-user errors (empty name, unknown mechanism, iterations out of range, the same user and
mechanism twice, deleting what is not there) and the new configs of the users that pass.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from kio.schema.errors import ErrorCode

from .sasl import ScramCredential

# Kafka's org.apache.kafka.clients.admin.ScramMechanism: the wire's int8 codes.
MECHANISM_CODES = {"SCRAM-SHA-256": 1, "SCRAM-SHA-512": 2}
MECHANISM_NAMES = {code: name for name, code in MECHANISM_CODES.items()}
HASHES = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
# Kafka's InternalScramMechanism minimum (4096 for both) and the broker's maximum (16384).
MIN_ITERATIONS = {"SCRAM-SHA-256": 4096, "SCRAM-SHA-512": 4096}
MAX_ITERATIONS = 16384


class CredentialFormatError(ValueError):
    pass


def credential_to_string(c: ScramCredential) -> str:
    b64 = base64.b64encode
    return (f"salt={b64(c.salt).decode()},stored_key={b64(c.stored_key).decode()},"
            f"server_key={b64(c.server_key).decode()},iterations={c.iterations}")


def credential_from_string(text: str) -> ScramCredential:
    fields = dict(part.split("=", 1) for part in text.split(",") if "=" in part)
    if sorted(fields) != ["iterations", "salt", "server_key", "stored_key"]:
        # Kafka's credentialFromString: exactly these four
        raise CredentialFormatError(f"not a SCRAM credential: fields {sorted(fields)}")
    try:
        return ScramCredential(base64.b64decode(fields["salt"], validate=True),
                               int(fields["iterations"]),
                               base64.b64decode(fields["stored_key"], validate=True),
                               base64.b64decode(fields["server_key"], validate=True))
    except (KeyError, ValueError, binascii.Error) as exc:
        raise CredentialFormatError(f"not a SCRAM credential: {exc}") from None


def salted_password(mechanism: str, password: str, salt: bytes, iterations: int) -> bytes:
    """What a client sends in an upsertion (RFC 5802's SaltedPassword, Kafka's ScramFormatter)."""
    return hashlib.pbkdf2_hmac(HASHES[mechanism], password.encode(), salt, iterations)


def credential_from_salted_password(mechanism: str, salt: bytes, salted: bytes,
                                    iterations: int) -> ScramCredential:
    """The broker's half of an upsertion (Kafka's ScramFormatter.generateCredential)."""
    h = HASHES[mechanism]
    client_key = hmac.new(salted, b"Client Key", h).digest()
    return ScramCredential(salt, iterations, hashlib.new(h, client_key).digest(),
                           hmac.new(salted, b"Server Key", h).digest())


@dataclass(frozen=True)
class Upsertion:
    user: str
    mechanism: int  # the wire's code
    iterations: int
    salt: bytes
    salted_password: bytes


@dataclass(frozen=True)
class Deletion:
    user: str
    mechanism: int


@dataclass(frozen=True)
class AlterPlan:
    """Per user: (error name, message) for those refused, and the full new config (mechanism
    name -> credential string) of those to write."""

    errors: dict[str, tuple[ErrorCode, str]]
    changes: dict[str, dict[str, str]]


def plan_alteration(upsertions: Iterable[Upsertion], deletions: Iterable[Deletion],
                    fetch: Callable[[str], Mapping[str, str]]) -> AlterPlan:
    """Kafka's checks, in Kafka's order; ``fetch(user)`` is the user's current config."""
    ups, dels = list(upsertions), list(deletions)
    errors: dict[str, tuple[ErrorCode, str]] = {}
    for d in dels:
        if not d.user:
            errors[d.user] = (ErrorCode.unacceptable_credential, "Username must not be empty")
        elif d.mechanism not in MECHANISM_NAMES:
            errors[d.user] = (ErrorCode.unsupported_sasl_mechanism, "Unknown SCRAM mechanism")
    for u in ups:
        if not u.user:
            errors[u.user] = (ErrorCode.unacceptable_credential, "Username must not be empty")
        elif u.mechanism not in MECHANISM_NAMES:
            errors[u.user] = (ErrorCode.unsupported_sasl_mechanism, "Unknown SCRAM mechanism")
        elif u.iterations < MIN_ITERATIONS[MECHANISM_NAMES[u.mechanism]]:
            errors[u.user] = (ErrorCode.unacceptable_credential, "Too few iterations")
        elif u.iterations > MAX_ITERATIONS:
            errors[u.user] = (ErrorCode.unacceptable_credential, "Too many iterations")
        elif not u.salt or not u.salted_password:
            # Kafka derives keys from whatever it gets; an empty salt or salted password is
            # no credential at all.
            errors[u.user] = (ErrorCode.unacceptable_credential, "Empty salt or salted password")
    pairs = [(x.user, x.mechanism) for x in ups if x.user not in errors]
    pairs += [(x.user, x.mechanism) for x in dels if x.user not in errors]
    seen: set[tuple[str, int]] = set()
    for pair in pairs:
        if pair in seen:
            errors[pair[0]] = (ErrorCode.duplicate_resource,
                               "A user credential cannot be altered twice in the same request")
        seen.add(pair)
    users = list(dict.fromkeys(user for user, _ in pairs if user not in errors))
    configs = {user: dict(fetch(user)) for user in users}
    for d in dels:
        if d.user in configs and MECHANISM_NAMES[d.mechanism] not in configs[d.user]:
            errors[d.user] = (ErrorCode.resource_not_found,
                              "Attempt to delete a user credential that does not exist")
    changes: dict[str, dict[str, str]] = {}
    for user in users:
        if user in errors:
            continue
        config = configs[user]
        for d in dels:
            if d.user == user:
                config.pop(MECHANISM_NAMES[d.mechanism], None)
        for u in ups:
            if u.user == user:
                name = MECHANISM_NAMES[u.mechanism]
                config[name] = credential_to_string(credential_from_salted_password(
                    name, u.salt, u.salted_password, u.iterations))
        changes[user] = config
    return AlterPlan(errors, changes)


def scram_configs(config: Mapping[str, str]) -> dict[str, str]:
    """The SCRAM entries of a user's config entity (it may hold quotas too)."""
    return {k: v for k, v in config.items() if k in MECHANISM_CODES}
