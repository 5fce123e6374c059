"""One TCP connection to one broker: blocking socket, ApiVersions handshake, pipelining.

A connection is owned by a single thread (the producer's sender thread, or the caller's thread
for the consumer and admin); nothing here locks.

Requests are written whole with ``sendall``; several may be in flight at once. Kafka answers
the requests of one connection strictly in order, so each response must carry the correlation
id of the oldest request in flight: anything else means the stream is out of step and the
connection is closed (what the Java client does: "Correlation id for response does not match").

Every request ends in exactly one way, recorded on its ``InFlightRequest``: a response, or an
error (``NetworkError`` when the connection drops, ``RequestTimedOutError`` when the
broker does not answer within request.timeout.ms). Completed requests are handed back by
``receive()``/``take_completed()``, so callers handle failures on the same path as answers.
"""

from __future__ import annotations

import functools
import logging
import math
import select
import socket
import ssl
import struct
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import (
    KafkaError,
    NetworkError,
    RequestTimedOutError,
    SaslAuthenticationFailedError,
    UnsupportedVersionError,
    error_for_code,
    raise_for_code,
)
from ..primitives import encode_string
from ..protocol import ApiKey, ProtocolError, decode_response, request_class
from ..protocol.apis import SUPPORTED_VERSIONS
from ..protocol.framing import ClientFraming
from .errors import SslAuthenticationError
from .frame_reader import FrameReader
from .messages import build_request

log = logging.getLogger(__name__)

_CORRELATION_AND_ERROR = struct.Struct(">ih")
_UNSUPPORTED_VERSION = 35
_MAX_READS = 64  # reads of one receive() (a socket that never runs dry yields now and then)

# KIP-511: ApiVersions v3+ names the client; the broker checks it against this pattern
# [a-zA-Z0-9](?:[a-zA-Z0-9\-.]*[a-zA-Z0-9])?
CLIENT_SOFTWARE_NAME = "oncelog"



def _readable(sock, timeout: float) -> bool:
    """Whether ``sock`` has data (or EOF) within ``timeout`` seconds. poll, not select: select
    refuses descriptors past 1023, which a process with many files open reaches."""
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(max(0, math.ceil(timeout * 1000))))

def connect_failure(exc: OSError, timeout_s: float) -> str:
    """A TCP connect's failure in words: "connection refused", "no connection within 10 s",
    else the system's text ("Name or service not known", ...)."""
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, TimeoutError):
        return f"no connection within {timeout_s:g} s"
    return exc.strerror or str(exc)


def _software_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("oncelog")
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "0.0.0"


RequestValues = Mapping[str, Any] | Callable[[int], Mapping[str, Any] | bytes]
Decoder = Callable[[int, Any], tuple[int, Any]]

_REQUEST_HEAD = struct.Struct(">ihhi")


@functools.cache
def _flexible(api_key: int, version: int) -> bool:
    return bool(request_class(api_key, version).__flexible__)


def _request_head(api_key: int, version: int, correlation_id: int, client_id: str | None,
                  body_size: int) -> bytes:
    """Size prefix and request header (v1, or v2 with its empty tagged fields for a flexible
    version) of a request whose body is ``body_size`` bytes: what encode_request writes."""
    head = encode_string(client_id)
    if _flexible(api_key, version):
        head += b"\x00"
    return _REQUEST_HEAD.pack(8 + len(head) + body_size, api_key, version,
                              correlation_id) + head


def _pending(sock: socket.socket) -> int:
    """Bytes TLS has already decrypted and holds for us: the socket need not be readable
    for them, so they must be read before waiting on it."""
    return sock.pending() if isinstance(sock, ssl.SSLSocket) else 0


def _send_parts(sock: socket.socket, parts: list[bytes]) -> None:
    """Write ``parts`` in order without joining them (a Produce request's batches are most of
    its bytes): one sendmsg, then whatever it left with sendall. TLS has no sendmsg: the
    parts are joined (encryption copies them anyway)."""
    if isinstance(sock, ssl.SSLSocket):
        sock.sendall(b"".join(parts))
        return
    sent = sock.sendmsg(parts)
    for part in parts:
        if sent >= len(part):
            sent -= len(part)
            continue
        sock.sendall(memoryview(part)[sent:])
        sent = 0


@dataclass(eq=False)
class InFlightRequest:
    correlation_id: int
    api_key: int
    api_version: int
    node_id: int
    sent_at: float
    deadline: float
    expect_response: bool = True
    context: Any = None
    response: Any = None
    error: KafkaError | None = None
    done: bool = False
    # (version, frame) -> (correlation id, response): how the response is read, when not by
    # kio (protocol.decode_response); the Fetch response's: fetch_response.py
    decoder: Decoder | None = None

    def result(self) -> Any:
        """The response, or raise the error the request ended with."""
        if self.error is not None:
            raise self.error
        return self.response


class BrokerConnection:
    def __init__(self, node_id: int, host: str, port: int, *, client_id: str | None,
                 request_timeout_ms: int, connect_timeout_ms: int,
                 sasl: tuple[str, str, str] | None = None,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        self.node_id = node_id
        self.sasl = sasl  # (mechanism, username, password) for SASL_PLAINTEXT and SASL_SSL
        self.ssl_context = ssl_context  # SSL and SASL_SSL
        self.host = host
        self.port = port
        self.client_id = client_id
        self.request_timeout = request_timeout_ms / 1000
        self.connect_timeout = connect_timeout_ms / 1000
        self.api_versions: dict[int, tuple[int, int]] = {}
        self.features: dict[str, int] = {}
        self._sock: socket.socket | None = None
        # The bytes received and the requests awaiting a response, matched in order.
        self._framing: ClientFraming[InFlightRequest] = ClientFraming(client_id)
        self._reader = FrameReader()  # the frames received (the requests: _framing)
        self._completed: list[InFlightRequest] = []

    def __repr__(self) -> str:
        return f"<BrokerConnection node={self.node_id} {self.host}:{self.port}>"

    # --- lifecycle --------------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        return self._sock is not None

    def connect(self) -> None:
        """Open the socket and negotiate versions. Raises NetworkError on failure."""
        if self._sock is not None:
            return
        try:
            sock = socket.create_connection((self.host, self.port), timeout=self.connect_timeout)
        except OSError as exc:
            raise NetworkError(
                f"cannot connect to node {self.node_id} at {self.host}:{self.port}: "
                f"{connect_failure(exc, self.connect_timeout)}") from exc
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.ssl_context is not None:
            sock = self._tls_handshake(sock)
        # Writes block at most this long; reads only happen once select says data is there.
        sock.settimeout(self.request_timeout)
        self._sock = sock
        self._reader.clear()
        try:
            self._negotiate_api_versions()
            if self.sasl is not None:
                self._authenticate(*self.sasl)
        except BaseException:
            self.close()
            self._completed.clear()  # only the handshake request can be there
            raise

    def _tls_handshake(self, sock: socket.socket) -> ssl.SSLSocket:
        """The TLS handshake, within the connection setup timeout. A broker whose certificate
        we do not trust (or that refuses ours) is SslAuthenticationError: retrying cannot
        help; a connection dropped during the handshake is a network error, as any other."""
        assert self.ssl_context is not None
        try:
            return self.ssl_context.wrap_socket(sock, server_hostname=self.host)
        except OSError as exc:
            sock.close()
            raise self._tls_error(exc) from None

    def _tls_error(self, exc: OSError) -> KafkaError:
        where = f"node {self.node_id} at {self.host}:{self.port}"
        if isinstance(exc, TimeoutError):
            return NetworkError(f"TLS handshake with {where} did not finish within "
                                         f"{self.connect_timeout * 1000:.0f} ms")
        if not isinstance(exc, ssl.SSLError) or \
                isinstance(exc, ssl.SSLEOFError | ssl.SSLZeroReturnError):
            return NetworkError(f"TLS handshake with {where} failed: the connection "
                                         f"closed ({exc}); is it a TLS listener?")
        if isinstance(exc, ssl.SSLCertVerificationError):
            reason = f"certificate verify failed: {exc.verify_message} (the CA that signed " \
                "the broker's certificate goes in ssl_cafile / ssl.truststore.location)"
        else:
            reason = exc.reason or str(exc)
        return SslAuthenticationError(f"TLS handshake with {where} failed: {reason}")

    def close(self, error: KafkaError | None = None) -> None:
        """Close the socket; every request still in flight ends with ``error``."""
        if self._sock is not None:
            try:
                self._sock.close()
            except OSError:
                pass
            self._sock = None
        self._reader.clear()
        in_flight = self._framing.clear()
        if in_flight:
            error = error or NetworkError(
                f"connection to node {self.node_id} at {self.host}:{self.port} closed")
            for req in in_flight:
                req.error = error
                req.done = True
                self._completed.append(req)

    def fileno(self) -> int:
        if self._sock is None:
            raise NetworkError(f"node {self.node_id}: not connected")
        return self._sock.fileno()

    @property
    def in_flight_count(self) -> int:
        return len(self._framing.in_flight)

    # --- versions ---------------------------------------------------------------------------

    def _negotiate_api_versions(self) -> None:
        """ApiVersions first, at our highest version; fall back as the broker tells us.

        A broker that does not know our ApiVersions version answers UNSUPPORTED_VERSION in the
        v0 layout and, when it can, lists its own range; we retry at the highest version both
        support, else at v0 (KIP-511).
        """
        version = SUPPORTED_VERSIONS[ApiKey.API_VERSIONS][1]
        for _attempt in range(3):
            values = {"client_software_name": CLIENT_SOFTWARE_NAME,
                      "client_software_version": _software_version()}
            req = self._write(ApiKey.API_VERSIONS, version, build_request(
                ApiKey.API_VERSIONS, version, values), expect_response=True, context=None)
            frame = self._read_frame_blocking(req)
            if len(frame) >= 6:
                _corr, error_code = _CORRELATION_AND_ERROR.unpack_from(frame, 0)
            else:
                error_code = 0
            if error_code == _UNSUPPORTED_VERSION and version > 0:
                version = self._fallback_version(version, frame)
                log.debug("node %s: ApiVersions falling back to v%d", self.node_id, version)
                continue
            _, response = decode_response(ApiKey.API_VERSIONS, version, frame)
            raise_for_code(int(response.error_code), f"ApiVersions v{version}")
            self.api_versions = {int(k.api_key): (int(k.min_version), int(k.max_version))
                                 for k in response.api_keys}
            # KIP-584 finalized feature levels (v3+), e.g. KIP-890's transaction.version.
            self.features = {f.name: int(f.max_version_level)
                             for f in getattr(response, "finalized_features", ())}
            return
        raise UnsupportedVersionError(f"node {self.node_id}: no common ApiVersions version")

    def _blocking(self, api_key: int, values: dict) -> Any:
        version = self.version_for(api_key)
        req = self._write(api_key, version, build_request(api_key, version, values),
                          expect_response=True, context=None)
        frame = self._read_frame_blocking(req)
        return decode_response(api_key, version, frame)[1]

    def _authenticate(self, mechanism: str, username: str, password: str) -> None:
        """SASL (KIP-43, KIP-152): SaslHandshake v1, then SaslAuthenticate until done. Raises
        SaslAuthenticationFailedError (or the handshake's error) with the broker's reason."""
        from ..security.sasl import AuthenticationFailed, client_for

        response = self._blocking(ApiKey.SASL_HANDSHAKE, {"mechanism": mechanism})
        if int(response.error_code):
            raise error_for_code(int(response.error_code))(
                f"node {self.node_id}: SASL mechanism {mechanism} refused; the broker offers "
                f"{', '.join(response.mechanisms) or 'none'}")
        client = client_for(mechanism, username, password)
        token: bytes | None = client.first()
        while token is not None:
            response = self._blocking(ApiKey.SASL_AUTHENTICATE, {"auth_bytes": token})
            if int(response.error_code):
                raise error_for_code(int(response.error_code))(
                    f"node {self.node_id}: {response.error_message or 'authentication failed'}")
            try:
                token = client.step(bytes(response.auth_bytes))
            except AuthenticationFailed as exc:
                raise SaslAuthenticationFailedError(f"node {self.node_id}: {exc}") from None

    @staticmethod
    def _fallback_version(sent: int, frame: bytes | memoryview) -> int:
        """The ApiVersions version to retry with after UNSUPPORTED_VERSION to v``sent``.

        Kafka answers in the v0 layout and lists its ApiVersions range; take the highest version
        below ``sent`` it supports. Some brokers (librdkafka's mock cluster) write a body that
        is not valid v0; then v0, which every broker understands.
        """
        try:
            _, response = decode_response(ApiKey.API_VERSIONS, 0, frame)
        except ProtocolError:
            return 0
        theirs = {int(k.api_key): int(k.max_version) for k in response.api_keys}
        return max(0, min(sent - 1, theirs.get(ApiKey.API_VERSIONS, 0)))

    def version_for(self, api_key: int, max_version: int | None = None) -> int:
        """The highest version both we (protocol.apis) and the broker support (and at most
        ``max_version``)."""
        ours = SUPPORTED_VERSIONS.get(api_key)
        if ours is not None and max_version is not None:
            ours = (ours[0], min(ours[1], max_version))
        theirs = self.api_versions.get(int(api_key))
        if ours is None or theirs is None:
            raise UnsupportedVersionError(
                f"node {self.node_id} does not support API {ApiKey(api_key).name}")
        low, high = max(ours[0], theirs[0]), min(ours[1], theirs[1])
        if low > high:
            raise UnsupportedVersionError(
                f"node {self.node_id} supports {ApiKey(api_key).name} v{theirs[0]}-{theirs[1]}, "
                f"we need v{ours[0]}-{ours[1]}")
        return high

    # --- requests ---------------------------------------------------------------------------

    def send(self, api_key: int, values: RequestValues, *, expect_response: bool = True,
             context: Any = None, timeout_ms: int | None = None,
             max_version: int | None = None, decoder: Decoder | None = None
             ) -> InFlightRequest:
        """Write a request; its outcome arrives later through ``receive``/``take_completed``.

        ``values`` describes the request body independently of the version (see messages.py),
        or is a function of the negotiated version when the body's shape depends on it.
        Raises UnsupportedVersionError if the broker has no usable version of the API (nothing
        is sent then); every other failure ends the request instead of raising.
        """
        if self._sock is None:
            raise NetworkError(f"node {self.node_id}: not connected")
        version = self.version_for(api_key, max_version)
        body = values(version) if callable(values) else values
        # bytes: a body the caller wrote itself (the Produce request: produce_request.py)
        request = body if isinstance(body, bytes) else build_request(api_key, version, body)
        return self._write(api_key, version, request, expect_response, context, timeout_ms,
                           decoder)

    def _write(self, api_key: int, version: int, request: Any, expect_response: bool,
               context: Any, timeout_ms: int | None = None,
               decoder: Decoder | None = None) -> InFlightRequest:
        assert self._sock is not None
        correlation_id = self._framing.new_correlation_id()
        now = time.monotonic()
        timeout = self.request_timeout if timeout_ms is None else timeout_ms / 1000
        req = InFlightRequest(correlation_id, int(api_key), version, self.node_id, now,
                              now + timeout, expect_response, context, decoder=decoder)
        try:
            if isinstance(request, bytes):
                if expect_response:
                    self._framing.expect(correlation_id, req)
                _send_parts(self._sock, [_request_head(
                    int(api_key), version, correlation_id, self.client_id, len(request)),
                    request])
            else:
                self._sock.sendall(self._framing.send(correlation_id, request, req,
                                                      expect_response=expect_response))
        except OSError as exc:
            if not expect_response:
                self._framing.expect(correlation_id, req)  # so that close() ends it too
            self.close(NetworkError(
                f"node {self.node_id}: send failed: {exc}"))
            return req
        if not expect_response:
            req.done = True
            self._completed.append(req)
        return req

    def receive(self) -> list[InFlightRequest]:
        """Read what the socket has (call when it is readable) and return finished requests."""
        i = 0
        while True:  # what the socket has, without blocking
            sock = self._sock
            if sock is None:
                break
            # The caller's select said readable for the first read only. (A socket with a
            # timeout waits for data before a read, whatever its flags: ask first.) What
            # TLS holds decrypted is read whatever the count: nothing would wake us for it.
            pending = _pending(sock)
            if i and not pending and (i >= _MAX_READS or not _readable(sock, 0)):
                break
            i += 1
            buffer = self._reader.buffer()
            try:
                n = sock.recv_into(buffer)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as exc:
                self.close(NetworkError(f"node {self.node_id}: receive failed: {exc}"))
                break
            if not n:
                self.close(NetworkError(
                    f"node {self.node_id} at {self.host}:{self.port} closed the connection"))
                break
            try:
                frames = self._reader.received(n)
            except ProtocolError as exc:  # a size prefix out of bounds
                self.close(NetworkError(f"node {self.node_id}: {exc}"))
                break
            for frame in frames:
                self._handle_frame(frame)
            if n < len(buffer) and not _pending(sock):
                break  # nothing more there now
        return self.take_completed()

    def take_completed(self) -> list[InFlightRequest]:
        done, self._completed = self._completed, []
        return done

    def _handle_frame(self, frame: bytes | memoryview) -> None:
        if self._sock is None:
            return  # closed by an earlier frame of the same read
        try:
            req = self._framing.match(frame)
        except ProtocolError as exc:  # a mismatched correlation id
            self.close(NetworkError(f"node {self.node_id}: {exc}"))
            return
        try:
            if req.decoder is not None:
                _, response = req.decoder(req.api_version, frame)
            else:
                _, response = decode_response(req.api_key, req.api_version, frame)
        except ProtocolError as exc:
            req.error = NetworkError(f"node {self.node_id}: {exc}")
            req.done = True
            self._completed.append(req)
            self.close(req.error)
            return
        req.response = response
        req.done = True
        self._completed.append(req)

    def expire(self, now: float) -> None:
        """Close the connection if its oldest request is past its deadline.

        Requests on a connection finish in order, so one late answer holds back every later
        one; the Java client likewise drops the whole connection.
        """
        in_flight = self._framing.in_flight
        if in_flight and in_flight[0][1].deadline <= now:
            req = in_flight[0][1]
            self.close(RequestTimedOutError(
                f"node {self.node_id}: no response to {ApiKey(req.api_key).name} within "
                f"{(req.deadline - req.sent_at) * 1000:.0f} ms"))

    def next_deadline(self) -> float | None:
        in_flight = self._framing.in_flight
        return in_flight[0][1].deadline if in_flight else None

    # --- synchronous use --------------------------------------------------------------------

    def wait(self, req: InFlightRequest) -> Any:
        """Block until ``req`` is finished; return its response or raise its error."""
        while not req.done:
            if self._sock is None:
                self.close()
                break
            deadline = self.next_deadline()
            timeout = max(0.0, deadline - time.monotonic()) if deadline is not None else 0.0
            readable = _readable(self._sock, timeout)
            if readable:
                self.receive()
            else:
                self.expire(time.monotonic())
        self._completed = [r for r in self._completed if r is not req]
        return req.result()

    def request(self, api_key: int, values: RequestValues, timeout_ms: int | None = None) -> Any:
        """Send one request and wait for its response (other requests may be in flight)."""
        self.connect()
        return self.wait(self.send(api_key, values, timeout_ms=timeout_ms))

    def _read_frame_blocking(self, req: InFlightRequest) -> bytes | memoryview:
        """During the handshake: read exactly one frame, nothing else is in flight."""
        if req.done:  # the write failed, and closed the connection
            raise req.error or NetworkError(f"node {self.node_id}: send failed")
        if self._sock is None:
            raise NetworkError(f"node {self.node_id}: connection closed")
        deadline = req.deadline
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RequestTimedOutError(f"node {self.node_id}: no ApiVersions response")
            self._sock.settimeout(remaining)
            try:
                n = self._sock.recv_into(self._reader.buffer())
            except TimeoutError:
                raise RequestTimedOutError(
                    f"node {self.node_id}: no ApiVersions response") from None
            except ssl.SSLError as exc:  # TLS 1.3: the broker refuses our certificate now
                raise self._tls_error(exc) from None
            except OSError as exc:
                raise NetworkError(f"node {self.node_id}: {exc}") from exc
            finally:
                if self._sock is not None:
                    self._sock.settimeout(self.request_timeout)
            if not n:
                # A TLS listener closes a plaintext connection without a word, and a listener
                # with ssl.client.auth=required one without a certificate it trusts (TLS 1.3:
                # after the handshake, which succeeded on our side)
                hint = " (does the broker require a client certificate? ssl_certfile, " \
                    "ssl_keyfile)" if self.ssl_context is not None else \
                    " (if it is a TLS listener: security.protocol SSL or SASL_SSL)"
                raise NetworkError(
                    f"node {self.node_id} closed the connection during ApiVersions{hint}")
            try:
                frames = self._reader.received(n)
                if frames:  # the response to ``req``, the only request in flight
                    self._framing.match(frames[0])
                    return frames[0]
            except ProtocolError as exc:
                raise NetworkError(f"node {self.node_id}: {exc}") from None
