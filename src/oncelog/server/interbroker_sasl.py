"""A broker's login to the other brokers of a SASL cluster (Kafka's inter-broker SASL).

A broker whose inter-broker protocol (``security.inter.broker.protocol``, by default its
listener's ``security.protocol``) is SASL_PLAINTEXT or SASL_SSL is closed by the others at any
request but ApiVersions, SaslHandshake and SaslAuthenticate until it has authenticated. So every
connection it opens to another broker (the control channels of server/interbroker.py, the
replica fetcher's of server/replica_fetcher.py) first sends SaslHandshake v1 and
SaslAuthenticate with the mechanism ``sasl.mechanism.inter.broker.protocol`` and the
credentials of Kafka's per-listener JAAS setting,
``listener.name.<listener>.<mechanism>.sasl.jaas.config`` (the listener's name is its
protocol's, lowercased, as Kafka's default listener names are). The SASL exchange itself is
security/sasl.py's client, the one our client uses.

A failed login is logged once per broker (until a login to it succeeds) and remembered for
``LOGIN_RETRY_S``: requests meanwhile fail at once with the same ChannelError instead of
reconnecting every time (a wrong password must not become a hot reconnect loop).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from ..protocol import ApiKey, make, request_class
from ..security.sasl import (
    LOGIN_MODULES,
    AuthenticationFailed,
    client_for,
    jaas_login_module,
    jaas_options,
)
from .config import ConfigError
from .interbroker import ChannelError

log = logging.getLogger("oncelog.interbroker")

# Kafka's reconnect.backoff.max.ms: how long a failed login keeps a broker's new connections
# from trying again.
LOGIN_RETRY_S = 1.0
SASL_PROTOCOLS = ("SASL_PLAINTEXT", "SASL_SSL")

# A request (a kio entity) -> its decoded response, on the connection being logged in.
Call = Callable[[Any], Awaitable[Any]]


def jaas_config_key(protocol: str, mechanism: str) -> str:
    return f"listener.name.{protocol.lower()}.{mechanism.lower()}.sasl.jaas.config"


@dataclass
class InterBrokerLogin:
    """The mechanism and credentials a broker logs in to the others with, and the failed
    logins it remembers (node id -> (when, error))."""

    mechanism: str
    username: str
    password: str = field(repr=False)  # never in a log line
    setting: str = ""  # the JAAS setting they come from (for the log)
    _failed: dict[int, tuple[float, ChannelError]] = field(default_factory=dict)

    def check(self, node_id: int) -> None:
        """Raise the last login failure to ``node_id`` while it is recent."""
        found = self._failed.get(node_id)
        if found is not None and time.monotonic() - found[0] < LOGIN_RETRY_S:
            raise found[1]

    async def authenticate(self, node_id: int, call: Call) -> None:
        """SaslHandshake v1 then SaslAuthenticate (KIP-43, KIP-152) on a new connection to
        ``node_id``; ChannelError (logged once) when the other broker refuses."""
        try:
            await self._exchange(node_id, call)
        except ChannelError as exc:
            if node_id not in self._failed:
                log.error("%s (user %r of this broker's %s); retrying every %.0f s", exc,
                          self.username, self.setting, LOGIN_RETRY_S)
            self._failed[node_id] = (time.monotonic(), exc)
            raise
        if self._failed.pop(node_id, None) is not None:
            log.info("logged in to broker %d as %r again", node_id, self.username)

    async def _exchange(self, node_id: int, call: Call) -> None:
        response = await call(_request(ApiKey.SASL_HANDSHAKE, mechanism=self.mechanism))
        if int(response.error_code):
            raise ChannelError(f"SASL login to broker {node_id} failed: it does not enable "
                               f"{self.mechanism} (it offers {', '.join(response.mechanisms)}"
                               "); see sasl.mechanism.inter.broker.protocol")
        client = client_for(self.mechanism, self.username, self.password)
        token: bytes | None = client.first()
        while token is not None:
            response = await call(_request(ApiKey.SASL_AUTHENTICATE, auth_bytes=token))
            if int(response.error_code):
                raise ChannelError(f"SASL login to broker {node_id} failed: "
                                   f"{response.error_message or 'authentication failed'}")
            try:
                token = client.step(bytes(response.auth_bytes))
            except AuthenticationFailed as exc:
                raise ChannelError(f"SASL login to broker {node_id} failed: {exc}") from None


def _request(api_key: int, **values: Any) -> Any:
    # SaslHandshake v1 and SaslAuthenticate v2 (KIP-152), as our client sends them
    version = 2 if api_key == ApiKey.SASL_AUTHENTICATE else 1
    return make(request_class(api_key, version), **values)


def inter_broker_login(config: Any) -> InterBrokerLogin | None:
    """What this broker logs in to the others with: None when its inter-broker protocol has
    no SASL or it is a single node. A SASL broker of a cluster without its credentials is a
    ConfigError naming the setting (Kafka refuses to start so too): its followers could never
    fetch."""
    protocol = str(config.get("security.inter.broker.protocol") or
                   config.get("security.protocol")).upper()
    if protocol not in SASL_PROTOCOLS or not config.get("zookeeper.connect"):
        return None
    mechanism = str(config.get("sasl.mechanism.inter.broker.protocol")).strip().upper()
    enabled = str(config.get("sasl.enabled.mechanisms")).split(",")
    if mechanism not in enabled:
        raise ConfigError(f"sasl.mechanism.inter.broker.protocol {mechanism} must be one of "
                          f"sasl.enabled.mechanisms ({', '.join(enabled)})")
    key = jaas_config_key(protocol, mechanism)
    text = str(config.values.get(key, "")).strip()
    example = (f'{LOGIN_MODULES[mechanism]} required username="broker" '
               'password="broker-secret";')
    if not text:
        raise ConfigError(f"a {protocol} broker of a cluster logs in to the other brokers with "
                          f"{mechanism} (sasl.mechanism.inter.broker.protocol): set {key}="
                          f"'{example}' (a user of sasl.users.file, listed in super.users)")
    module = jaas_login_module(text)
    if module != LOGIN_MODULES[mechanism]:
        raise ConfigError(f"{key}: {mechanism} needs {LOGIN_MODULES[mechanism]}, not "
                          f"{module!r}")
    options = jaas_options(text)
    if not options.get("username") or "password" not in options:
        raise ConfigError(f"{key}: no username=\"...\" password=\"...\" in it; e.g. {example}")
    return InterBrokerLogin(mechanism, options["username"], options["password"], key)
