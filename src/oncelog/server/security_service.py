"""The broker's security: SASL authentication per connection and the ACL authorizer.

``security.protocol=SASL_PLAINTEXT`` or ``SASL_SSL`` (``oncelog broker --security-protocol
SASL_PLAINTEXT --users FILE``): a connection may send ApiVersions, SaslHandshake and SaslAuthenticate, and
nothing else until it has authenticated (Kafka closes the connection; so do we). SaslHandshake
v1 is followed by SaslAuthenticate requests; v0 by bare SASL tokens in size-prefixed frames (the
pre-KIP-152 way, still used by some clients). A failed authentication is answered
SASL_AUTHENTICATION_FAILED with the reason, then the connection is closed.

The authorizer (KIP-11 ACLs) is on with SASL, or on any listener with
``authorizer.class.name`` set, as Kafka: there a PLAINTEXT or SSL client without a
certificate is ``User:ANONYMOUS`` and an SSL client with one is its certificate's subject,
mapped by ``ssl.principal.mapping.rules`` (security/ssl_principal.py).
"""

from __future__ import annotations

import asyncio
import logging
import struct
from pathlib import Path

from kio.schema.errors import ErrorCode

from ..protocol import ApiKey
from ..security.acls import Authorizer
from ..security.credential_store import ScramCredentials, ScramStore
from ..security.sasl import AuthenticationFailed, server_for
from ..security.ssl_principal import (
    CertificateError,
    NoMatchingRule,
    SslPrincipalMapper,
    subject_rfc2253,
)
from ..security.users import load_users
from .context import CloseConnection

log = logging.getLogger("oncelog.security")

PRE_AUTHENTICATION = {ApiKey.API_VERSIONS, ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE}
_SIZE = struct.Struct(">i")


class Security:
    def __init__(self, config, data_dir: Path) -> None:
        protocol = str(config.get("security.protocol"))
        self.sasl_enabled = protocol in ("SASL_PLAINTEXT", "SASL_SSL")
        self.mechanisms = [m for m in str(config.get("sasl.enabled.mechanisms")).split(",") if m]
        self.failed_delay_ms = config.int("connection.failed.authentication.delay.ms")
        self.passwords: dict[str, str] = {}
        self.successful_authentications = 0  # Kafka's successful-authentication-total
        self.failed_authentications = 0  # and failed-authentication-total (metrics page)
        # The SCRAM users (KIP-554), loaded from the metadata's store when the broker joins
        # its cluster (before it serves anything), seeded from the users file.
        self.credentials = ScramCredentials()
        self.scram = self.credentials.by_mechanism
        if self.sasl_enabled:
            users_file = str(config.get("sasl.users.file"))
            if not users_file:
                raise ValueError(f"security.protocol={protocol} needs a users file "
                                 "(--users FILE, or sasl.users.file)")
            self.passwords = load_users(users_file)
        allow = config.get("allow.everyone.if.no.acl.found")
        super_users = [u.strip() for u in str(config.get("super.users")).split(";") if u.strip()]
        authorizer_on = self.sasl_enabled or bool(str(config.get("authorizer.class.name") or ""))
        # An SSL listener's clients are named by their certificates (SASL_SSL: by SASL).
        self.principal_from_certificate = protocol == "SSL"
        self.principal_mapper = SslPrincipalMapper(
            str(config.get("ssl.principal.mapping.rules") or "DEFAULT"))
        self.authorizer = Authorizer(data_dir, enabled=authorizer_on,
                                     super_users=super_users,
                                     allow_if_no_acl=(not authorizer_on) if allow is None
                                     else bool(allow))

    def open_credentials(self, store: ScramStore) -> None:
        """Blocking (ZooKeeper): load the SCRAM users, seeding the users file's."""
        self.credentials.open(store, self.passwords)

    def certificate_principal(self, der: bytes | None) -> str:
        """The principal of an SSL listener's client: ``User:ANONYMOUS`` without a certificate,
        else its subject (RFC 2253, as Java's X500Principal prints it) through
        ``ssl.principal.mapping.rules``. Raises ValueError (the connection is refused, as Kafka
        fails its authentication) when no rule applies or the subject cannot be read."""
        if not der:
            return "User:ANONYMOUS"
        try:
            return "User:" + self.principal_mapper.name(subject_rfc2253(der))
        except (NoMatchingRule, CertificateError) as exc:
            raise ValueError(str(exc)) from None

    # -- the SASL exchange --------------------------------------------------------------------

    def handshake(self, session, mechanism: str, version: int) -> ErrorCode | None:
        """SaslHandshake: the error name, or None (the mechanism's exchange may start)."""
        if not self.sasl_enabled or session.authenticated:
            session.close_after_response = True
            return ErrorCode.illegal_sasl_state
        if mechanism not in self.mechanisms:
            session.close_after_response = True
            return ErrorCode.unsupported_sasl_mechanism
        session.mechanism = mechanism
        session.sasl = server_for(mechanism, self.passwords, self.scram)
        session.raw_tokens = version == 0
        return None

    async def authenticate(self, session, token: bytes, peer: str
                           ) -> tuple[ErrorCode | None, str | None, bytes]:
        """SaslAuthenticate: (error name, message, the server's next token). A failure is
        logged with the user name and the peer, and answered only after
        ``connection.failed.authentication.delay.ms`` (Kafka's defence against guessing; the
        wait holds this connection alone)."""
        server = session.sasl
        if server is None or session.authenticated:
            session.close_after_response = True
            return ErrorCode.illegal_sasl_state, "SaslAuthenticate before SaslHandshake", b""
        try:
            answer = server.step(token)
        except AuthenticationFailed as exc:
            self.failed_authentications += 1
            session.close_after_response = True
            session.sasl = None
            log.warning("failed authentication of user %r from %s with %s: %s",
                        getattr(server, "attempted", None), peer, session.mechanism, exc)
            await asyncio.sleep(self.failed_delay_ms / 1000)
            return ErrorCode.sasl_authentication_failed, str(exc), b""
        if server.done:
            self.successful_authentications += 1
            session.authenticated = True
            session.principal = f"User:{server.username}"
            session.sasl = None
            session.raw_tokens = False
        return None, None, answer

    async def raw_token(self, session, frame: bytes, peer: str) -> list[bytes] | None:
        """SaslHandshake v0: a bare token in, a bare token out (or the connection closes)."""
        error, message, answer = await self.authenticate(session, frame, peer)
        if error is not None:

            raise CloseConnection(f"SASL authentication failed: {message}")
        return [_SIZE.pack(len(answer)), answer]
