"""Is a broker there? A check the command-line tools make before they start a client: it fails
at once, naming the address and what happened (connection refused, no answer, a SASL listener
reached without credentials), where a client would retry until its timeouts and then say only
that a node was not reachable."""

from __future__ import annotations

import socket

from ..errors import KafkaError, NetworkError
from ..protocol import ApiKey
from .connection import BrokerConnection
from .metadata import metadata_request


class SaslRequiredError(ConnectionError):
    """The broker at ``address`` answered ApiVersions, then closed the connection at the first
    other request: its listener wants SASL authentication first (Kafka's does the same)."""

    def __init__(self, address: str) -> None:
        super().__init__(f"the broker at {address} requires SASL authentication")
        self.address = address


_REACHED: set[str] = set()
CONNECT_TIMEOUT_S = 5.0


def check_reachable(bootstrap_servers: str, without_credentials: bool = False) -> None:
    """Fail at once, naming the address and what happened, when no bootstrap server takes a
    TCP connection (the clients would retry until their timeouts, then say only that a node
    was not reachable). ``without_credentials``: also fail, saying so, when the broker wants
    SASL (the client would retry a closed connection for 60 s). Once per process and list."""
    if bootstrap_servers in _REACHED:
        return
    failures = []
    for address in (a.strip() for a in bootstrap_servers.split(",") if a.strip()):
        host, _, port = address.rpartition(":")
        try:
            with socket.create_connection((host.strip("[]") or "127.0.0.1", int(port)),
                                          timeout=CONNECT_TIMEOUT_S):
                pass
        except ValueError:
            failures.append(f"bad address {address!r} (HOST:PORT)")
        except ConnectionRefusedError:
            failures.append(f"connection refused to {address}")
        except TimeoutError:
            failures.append(f"no answer from {address} within {CONNECT_TIMEOUT_S:g} s")
        except OSError as exc:
            failures.append(f"cannot connect to {address}: {exc.strerror or exc}")
        else:
            if without_credentials and _wants_sasl(host.strip("[]") or "127.0.0.1", int(port)):
                raise SaslRequiredError(address)
            _REACHED.add(bootstrap_servers)
            return
    raise ConnectionError("; ".join(failures) or "no bootstrap server given")


def _wants_sasl(host: str, port: int) -> bool:
    """True when the broker answers ApiVersions (allowed before authentication) but closes
    the connection at a Metadata request: a SASL listener reached without credentials. Any
    other failure is left to the client to report."""
    timeout_ms = int(CONNECT_TIMEOUT_S * 1000)
    conn = BrokerConnection(-1, host, port, client_id="oncelog-cli",
                            request_timeout_ms=timeout_ms, connect_timeout_ms=timeout_ms)
    try:
        try:
            conn.connect()  # ApiVersions
        except KafkaError:
            return False  # not a Kafka listener we can speak to in plaintext: not our call
        try:
            conn.request(ApiKey.METADATA, metadata_request([], allow_auto_topic_creation=False),
                         timeout_ms=timeout_ms)
        except NetworkError:  # the connection dropped (a timeout is another class)
            return True
        except KafkaError:
            return False
        return False
    finally:
        conn.close()
