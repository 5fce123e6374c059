"""Who is looking at the console, and what they may see.

With SASL on (``security.protocol`` SASL_*), the console asks for the same credentials as the
broker's listeners, through HTTP Basic authentication (RFC 7617): a password is accepted when
the users file has it (PLAIN's check) or when it derives the user's stored SCRAM key (the
SCRAM users added with AlterUserScramCredentials, KIP-554), so a user logs in to the console as
to the broker. The derivation (PBKDF2, thousands of rounds) runs on a worker thread, and a
failed attempt is answered after ``connection.failed.authentication.delay.ms``, as a failed
SASL exchange is.

What an authenticated user sees follows the ACLs as Kafka's describe calls do: topics, groups
and transactional ids the principal may Describe. Without SASL the console, like the
listener, serves everyone.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hmac
import logging
from dataclasses import dataclass

from ...security.acls import Operation, ResourceType
from ...security.sasl import scram_credential

log = logging.getLogger("oncelog.console")

MAX_CREDENTIAL_CHARS = 1024


@dataclass(frozen=True)
class Viewer:
    """The request's principal (``User:ANONYMOUS`` without SASL) and its address."""

    principal: str
    host: str
    authorizer: object

    def may_see(self, resource_type: ResourceType, name: str) -> bool:
        return self.authorizer.authorize(  # type: ignore[attr-defined]
            self.principal, self.host, Operation.DESCRIBE, resource_type, name)


def parse_basic(header: str | None) -> tuple[str, str] | None:
    """(user, password) of an ``Authorization: Basic ...`` header, None when absent or bad."""
    if not header or len(header) > MAX_CREDENTIAL_CHARS:
        return None
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(token.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None
    user, sep, password = decoded.partition(":")
    return (user, password) if sep and user else None


def _password_matches(security, user: str, password: str) -> bool:
    """Blocking: the users file's password, else any of the user's SCRAM credentials."""
    known = security.passwords.get(user)
    if known is not None and hmac.compare_digest(known.encode(), password.encode()):
        return True
    for mechanism, users in list(security.scram.items()):
        cred = users.get(user)
        if cred is None:
            continue
        derived = scram_credential(mechanism, password, cred.salt, cred.iterations)
        if hmac.compare_digest(derived.stored_key, cred.stored_key):
            return True
    return False


async def authenticate(broker, header: str | None, host: str) -> Viewer | None:
    """The viewer, or None when SASL is on and the credentials are missing or wrong."""
    security = broker.security
    if not security.sasl_enabled:
        return Viewer("User:ANONYMOUS", host, security.authorizer)
    credentials = parse_basic(header)
    if credentials is not None:
        user, password = credentials
        if await asyncio.to_thread(_password_matches, security, user, password):
            return Viewer(f"User:{user}", host, security.authorizer)
        log.warning("failed console login of user %r from %s", user, host)
        await asyncio.sleep(security.failed_delay_ms / 1000)
    return None
