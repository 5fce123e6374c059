"""Is a broker there? A check the command-line tools make before they start a client: it fails
within seconds, naming the address and what happened, where a client would retry until its
timeouts (60 s by default) and then say only that a node was not reachable.

It opens a connection and sends one ApiVersions request (which any Kafka listener answers,
before authentication too), then reads what comes back, within ``PROBE_TIMEOUT_S``:

- connection refused, or no TCP connection within the timeout;
- nothing at all within the timeout: a silent listener;
- ``HTTP/1.x ...``: an HTTP server;
- a TLS record (an alert or handshake: 0x15 or 0x16, then 0x03), or a closed connection from a
  peer that then completes a TLS handshake: a TLS listener, which wants ``--security-protocol
  SSL``;
- anything else that is not a Kafka response frame carrying our correlation id.

With TLS (SSL, SASL_SSL) the check is a TLS handshake instead (certificates are not checked
here: the client does, and says so); a peer that closes the connection at our TLS hello is
most likely a PLAINTEXT listener.
"""

from __future__ import annotations

import socket
import ssl
import struct

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
# How long the check waits for a TCP connection, and then for the answer to ApiVersions. A
# broker answers ApiVersions in milliseconds; Kafka's own tools wait request.timeout.ms (30 s)
# and retry for default.api.timeout.ms (60 s), which leaves a user at a silent port for a
# minute: a one-shot command gives up after this.
PROBE_TIMEOUT_S = 5.0
CONNECT_TIMEOUT_S = PROBE_TIMEOUT_S
_CORRELATION_ID = 0x6F6C  # any: the answer must carry it back
_MAX_FRAME = 100 * 1024 * 1024


def _api_versions_v0() -> bytes:
    """ApiVersions v0 (no body), request header v1, client id "oncelog-cli": every Kafka
    broker since 0.10 answers it, on a SASL listener before authentication too."""
    client_id = b"oncelog-cli"
    body = struct.pack(">hhih", int(ApiKey.API_VERSIONS), 0, _CORRELATION_ID,
                       len(client_id)) + client_id
    return struct.pack(">i", len(body)) + body


def check_reachable(bootstrap_servers: str, without_credentials: bool = False,
                    tls: bool = False) -> None:
    """Fail within seconds, naming each address and what happened there, when no bootstrap
    server is a Kafka listener we can speak to (see the module's text). ``tls``: the client
    will speak TLS (SSL, SASL_SSL). ``without_credentials``: also fail, saying so, when the
    broker wants SASL (the client would retry a closed connection for 60 s). Once per process
    and list."""
    if bootstrap_servers in _REACHED:
        return
    failures = []
    for address in (a.strip() for a in bootstrap_servers.split(",") if a.strip()):
        host, _, port_text = address.rpartition(":")
        host = host.strip("[]") or "127.0.0.1"
        try:
            port = int(port_text)
        except ValueError:
            failures.append(f"bad address {address!r} (HOST:PORT)")
            continue
        cause = _probe_tls(address, host, port) if tls else _probe(address, host, port)
        if cause is not None:
            failures.append(cause)
            continue
        if without_credentials and not tls and _wants_sasl(host, port):
            raise SaslRequiredError(address)
        _REACHED.add(bootstrap_servers)
        return
    raise ConnectionError("; ".join(failures) or "no bootstrap server given")


def _connect(address: str, host: str, port: int) -> socket.socket | str:
    """A connected socket, or the sentence saying why not."""
    try:
        return socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S)
    except ConnectionRefusedError:
        return f"connection refused to {address}"
    except TimeoutError:
        return f"no TCP connection to {address} within {PROBE_TIMEOUT_S:g} s"
    except OSError as exc:
        return f"cannot connect to {address}: {exc.strerror or exc}"


def _probe(address: str, host: str, port: int) -> str | None:
    """None when a Kafka broker answers ApiVersions at ``address``; else what is there."""
    sock = _connect(address, host, port)
    if isinstance(sock, str):
        return sock
    data = b""
    closed = False
    with sock:
        try:
            sock.sendall(_api_versions_v0())
            sock.settimeout(PROBE_TIMEOUT_S / 2)
            try:
                data = sock.recv(64)
                closed = data == b""
            except TimeoutError:
                # An HTTP server waits for the end of its request line, which our request
                # lacks: end it (a Kafka broker would see the start of a bad request, after
                # answering ours) and wait the rest of the time.
                sock.sendall(b"\r\n\r\n")
            while not closed and len(data) < 8 and _classify(address, data) is None:
                chunk = sock.recv(8 - len(data) if data else 64)
                if not chunk:
                    closed = True
                    break
                data += chunk
                if _classify(address, data) is not None:
                    break
        except TimeoutError:
            if not data:
                return (f"no answer from {address} in {PROBE_TIMEOUT_S:g} s (a silent "
                        "listener: is it a Kafka broker?)")
        except OSError:  # reset: a TLS listener drops a plaintext hello so
            closed = True
    cause = _classify(address, data)
    if cause is not None or len(data) >= 8:
        return cause  # None: a Kafka response frame
    if not data and closed and _speaks_tls(host, port):
        return _TLS_HINT.format(address=address)
    if not data:
        return f"{address} closed the connection without answering a Kafka request"
    return f"no Kafka response from {address} (it sent {data[:16]!r})"


_TLS_HINT = "the peer at {address} speaks TLS: use --security-protocol SSL (or SASL_SSL)"


def _classify(address: str, data: bytes) -> str | None:
    """What the first bytes of an answer say: None while they may be a Kafka response."""
    if data[:1] == b"<" or (data and b"HTTP/".startswith(data[:5])):
        if len(data) < 5 and data[:1] != b"<":
            return None  # more to come
        # HTTP/1.x's status line, or an HTTP/0.9-style page (Python's http.server answers
        # a request line it cannot parse so): a Kafka frame's size would be over 1 GB
        line = data.split(b"\n")[0].strip()[:40].decode("latin-1")
        return f"no Kafka response from {address}: is it an HTTP server? (it answered {line!r})"
    if len(data) >= 2 and data[0] in (0x15, 0x16) and data[1] == 0x03:
        return _TLS_HINT.format(address=address)
    if len(data) >= 8:
        size, correlation_id = struct.unpack_from(">ii", data)
        if not 4 <= size <= _MAX_FRAME or correlation_id != _CORRELATION_ID:
            return f"no Kafka response from {address} (it sent {data[:16]!r})"
    return None


def _unverified_context() -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # whether it speaks TLS, not whom we trust: the client's
    return ctx


def _handshake(host: str, port: int) -> BaseException | None:
    """A TLS handshake with the peer (certificates unchecked): None when it completes."""
    try:
        with socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S) as raw, \
                _unverified_context().wrap_socket(raw, server_hostname=host):
            return None
    except (OSError, ssl.SSLError) as exc:
        return exc


def _peer_alert(exc: BaseException) -> bool:
    """The handshake failed on a TLS alert the peer sent (e.g. it wants a client
    certificate): the peer speaks TLS."""
    reason = getattr(exc, "reason", None) or ""
    return isinstance(exc, ssl.SSLError) and "ALERT" in reason.upper()


def _speaks_tls(host: str, port: int) -> bool:
    exc = _handshake(host, port)
    return exc is None or _peer_alert(exc)


def _probe_tls(address: str, host: str, port: int) -> str | None:
    """None when a TLS handshake completes at ``address``; else why not."""
    sock = _connect(address, host, port)
    if isinstance(sock, str):
        return sock
    sock.close()
    exc = _handshake(host, port)
    if exc is None or _peer_alert(exc):
        return None  # the client checks the certificates and says what it finds
    if isinstance(exc, TimeoutError):
        return (f"no TLS answer from {address} in {PROBE_TIMEOUT_S:g} s (a silent listener: "
                "is it a Kafka broker?)")
    if isinstance(exc, ssl.SSLEOFError | ssl.SSLZeroReturnError | ConnectionError):
        return (f"{address} closed the connection at our TLS hello: is it a PLAINTEXT "
                "listener? (then leave out --security-protocol SSL)")
    reason = getattr(exc, "reason", None) or str(exc)
    return (f"no TLS answer from {address} ({reason}): is it a PLAINTEXT listener or an "
            "HTTP server?")


def _wants_sasl(host: str, port: int) -> bool:
    """True when the broker answers ApiVersions (allowed before authentication) but closes
    the connection at a Metadata request: a SASL listener reached without credentials. Any
    other failure is left to the client to report."""
    timeout_ms = int(PROBE_TIMEOUT_S * 1000)
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
