"""What a handler is given besides the broker: the request's context and its connection's
security state, and the exception that closes a connection.

A module of its own so that the services and handlers the broker imports can name these
without importing the broker (which would make an import cycle).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..protocol import RequestHeader


class CloseConnection(Exception):
    """The request cannot be answered; Kafka's answer is to close the connection."""


@dataclass
class Session:
    """One connection's security state: who it is once SASL says so."""

    principal: str = "User:ANONYMOUS"
    authenticated: bool = True
    mechanism: str | None = None
    sasl: object | None = None  # the SASL server mechanism under way
    raw_tokens: bool = False  # SaslHandshake v0: the next frames are bare SASL tokens
    close_after_response: bool = False


@dataclass(frozen=True)
class RequestContext:
    header: RequestHeader
    client_address: str
    # None: a request built in process, not read from a connection: always allowed.
    session: Session | None = None

    @property
    def version(self) -> int:
        return self.header.api_version

    @property
    def host(self) -> str:
        return self.client_address.rsplit(":", 1)[0]
