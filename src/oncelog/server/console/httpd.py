"""The broker's HTTP/1.1 server, on the broker's event loop: the console's pages
(``console.port``) and the metrics page ``/metrics`` (``metrics.port``, and the console's port).

One server whatever the ports: both listeners share its authentication, its TLS and its limits.
Small on purpose: GET and HEAD, one request per connection (``Connection: close``), the
request head bounded (``MAX_REQUEST_HEAD`` bytes, ``MAX_HEADERS`` lines, read within
``READ_TIMEOUT_S`` in all, however slowly it trickles in), at most ``MAX_PER_ADDRESS``
connections from one address (or the broker's ``max.connections.per.ip``, if lower: the next
ones from it are hung up on at once, so that one client cannot take the slots of the others)
and ``MAX_CONNECTIONS`` in all (the next ones are answered 503, and past twice that hung up
on). Connections are counted at accept: over HTTPS, before their TLS handshake, which must
end within ``READ_TIMEOUT_S``. Whatever a client sends, it gets a status (400, 401, 404, 405,
431, 503) or a closed connection; the broker's own work goes on.
A page that fails to render is a 500 and a logged traceback, nothing more. With an
``ssl.SSLContext`` (the broker's SSL or SASL_SSL listener's) both ports are served over HTTPS.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from http import HTTPStatus
from urllib.parse import parse_qs, unquote, urlsplit

from .. import metrics
from .auth import authenticate
from .layout import esc, page
from .pages import brokers_page, groups_page, topic_page, topics_page, transactions_page
from .sampler import OffsetSampler

log = logging.getLogger("oncelog.console")

MAX_REQUEST_HEAD = 8192
MAX_HEADERS = 64
READ_TIMEOUT_S = 10.0
MAX_CONNECTIONS = 32
MAX_PER_ADDRESS = 8  # a browser opens 6 at most to one site; Prometheus scrapes with one
LINGER_BYTES = 1 << 20  # after answering, unread input drained (for two seconds at most)

SECURITY_HEADERS = (
    # no script at all, styles only inline, nothing framed: the pages show untrusted strings
    ("Content-Security-Policy",
     "default-src 'none'; style-src 'unsafe-inline'; frame-ancestors 'none'"),
    ("X-Content-Type-Options", "nosniff"),
    ("Cache-Control", "no-store"),
)


async def _linger(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                  seconds: float = 2.0) -> None:
    """Half-close, then read what the client still sends (a body, the rest of an oversized
    head) for a moment before closing: closing a socket with unread input resets the
    connection, and the client may lose the answer written just before."""
    if not writer.can_write_eof():
        return  # TLS: close_notify ends the answer
    writer.write_eof()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    left = LINGER_BYTES
    while left > 0 and (timeout := deadline - loop.time()) > 0:
        chunk = await asyncio.wait_for(reader.read(min(left, 65536)), timeout)
        if not chunk:
            return
        left -= len(chunk)


class BadRequest(Exception):
    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status


def parse_head(head: bytes) -> tuple[str, str, dict[str, str]]:
    """(method, target, headers with lower-case names) of a request head."""
    try:
        text = head.decode("latin-1")
    except UnicodeDecodeError:  # pragma: no cover - latin-1 decodes every byte
        raise BadRequest(HTTPStatus.BAD_REQUEST, "undecodable request") from None
    lines = text.split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise BadRequest(HTTPStatus.BAD_REQUEST, "not an HTTP/1.x request line")
    method, target, _version = parts
    headers: dict[str, str] = {}
    fields = [line for line in lines[1:] if line]
    if len(fields) > MAX_HEADERS:
        raise BadRequest(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "too many header fields")
    for line in fields:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise BadRequest(HTTPStatus.BAD_REQUEST, "malformed header field")
        headers[name.lower()] = value.strip()
    return method, target, headers


class ConsoleServer:
    """The broker's HTTP server: ``start`` a console listener (the pages and /metrics),
    ``start_metrics`` a metrics listener (/metrics alone); both count against one set of
    limits."""

    def __init__(self, broker, ssl_context: ssl.SSLContext | None = None) -> None:
        self.broker = broker
        self.ssl_context = ssl_context
        self.sampler = OffsetSampler(broker)
        self.connections = 0
        self.per_address: dict[str, int] = {}
        self.port: int | None = None  # the console's
        self.metrics_port: int | None = None
        self._listeners: list[socket.socket] = []
        self._acceptors: list[asyncio.Task] = []
        self._tasks: set[asyncio.Task] = set()

    @property
    def scheme(self) -> str:
        return "https" if self.ssl_context is not None else "http"

    async def _listen(self, host: str, port: int, pages: bool) -> int:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        listener = socket.create_server((host, port), family=family, backlog=128)
        listener.setblocking(False)
        self._listeners.append(listener)
        self._acceptors.append(
            asyncio.get_running_loop().create_task(self._accept(listener, pages)))
        return listener.getsockname()[1]

    async def start(self, host: str, port: int) -> int:
        """Serve the console's pages and /metrics on ``host:port``."""
        self.port = await self._listen(host, port, pages=True)
        self.sampler.start()
        return self.port

    async def start_metrics(self, host: str, port: int) -> int:
        """Serve /metrics alone on ``host:port``."""
        self.metrics_port = await self._listen(host, port, pages=False)
        return self.metrics_port

    def close(self) -> None:
        self.sampler.close()
        for acceptor in self._acceptors:
            acceptor.cancel()
        for listener in self._listeners:
            listener.close()
        for task in list(self._tasks):
            task.cancel()

    @property
    def max_per_address(self) -> int:
        return min(MAX_PER_ADDRESS, self.broker.config.int("max.connections.per.ip"))

    async def _accept(self, listener: socket.socket, pages: bool) -> None:
        """Accept, count the connection in (the limits above) and, over HTTPS, hand it to its
        TLS handshake: counted before the handshake, one over a limit is closed at once."""
        loop = asyncio.get_running_loop()
        while True:
            try:
                sock, address = await loop.sock_accept(listener)
            except OSError as exc:  # out of descriptors, say
                log.warning("console: accepting a connection failed: %s", exc)
                await asyncio.sleep(0.1)
                continue
            ip = address[0]
            if self.connections >= 2 * MAX_CONNECTIONS or \
                    self.per_address.get(ip, 0) >= self.max_per_address:
                sock.close()  # a flood, or this address has its share: hung up on at once
                continue
            self.connections += 1
            self.per_address[ip] = self.per_address.get(ip, 0) + 1
            task = loop.create_task(self._connect(sock, ip, pages))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _connect(self, sock: socket.socket, ip: str, pages: bool) -> None:
        try:
            reader = asyncio.StreamReader(limit=MAX_REQUEST_HEAD)
            done = asyncio.get_running_loop().create_future()

            async def serve(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
                try:
                    await self._serve(r, w, ip, pages)
                finally:
                    if not done.done():  # cancelled when the console closes
                        done.set_result(None)

            await asyncio.get_running_loop().connect_accepted_socket(
                lambda: asyncio.StreamReaderProtocol(reader, serve), sock, ssl=self.ssl_context,
                ssl_handshake_timeout=READ_TIMEOUT_S if self.ssl_context is not None else None)
            await done
        except (OSError, TimeoutError, ssl.SSLError, asyncio.CancelledError):
            sock.close()  # its TLS handshake failed or timed out, or the console is closing
        finally:
            self.connections -= 1
            if self.per_address[ip] > 1:
                self.per_address[ip] -= 1
            else:
                del self.per_address[ip]

    # -- one request --------------------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     address: str, pages: bool = True) -> None:
        try:
            if self.connections > MAX_CONNECTIONS:
                # told so, briefly: its request read (or not) within a second, then a 503
                with contextlib.suppress(TimeoutError, asyncio.LimitOverrunError, ValueError):
                    await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 1.0)
                await self._respond(writer, HTTPStatus.SERVICE_UNAVAILABLE, "busy",
                                    "too many console connections; try again")
                await _linger(reader, writer, 1.0)
                return
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), READ_TIMEOUT_S)
            except (asyncio.LimitOverrunError, ValueError):
                await self._respond(writer, HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE,
                                    "request too large",
                                    f"the request head is over {MAX_REQUEST_HEAD} bytes")
                await _linger(reader, writer)
                return
            await self._answer(writer, head, address, pages)
            await _linger(reader, writer)
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            pass  # gone, silent or not speaking HTTP: nothing to answer
        except Exception:
            log.exception("console request failed")
        finally:
            writer.close()

    async def _answer(self, writer: asyncio.StreamWriter, head: bytes, host: str,
                      pages: bool = True) -> None:
        try:
            method, target, headers = parse_head(head)
        except BadRequest as exc:
            await self._respond(writer, exc.status, "bad request", str(exc))
            return
        if method not in ("GET", "HEAD"):
            await self._respond(writer, HTTPStatus.METHOD_NOT_ALLOWED, "method not allowed",
                                "read only: GET and HEAD",
                                extra=(("Allow", "GET, HEAD"),))
            return
        body_wanted = method == "GET"  # HEAD: the same status and fields, no body
        try:
            url = urlsplit(target)
            path = unquote(url.path, errors="strict")
            query = parse_qs(url.query, max_num_fields=16)
        except (ValueError, UnicodeDecodeError):
            await self._respond(writer, HTTPStatus.BAD_REQUEST, "bad request",
                                "malformed request target", body_wanted=body_wanted)
            return
        if not target.startswith("/"):
            await self._respond(writer, HTTPStatus.BAD_REQUEST, "bad request",
                                "the request target must be a path",
                                body_wanted=body_wanted)
            return
        viewer = await authenticate(self.broker, headers.get("authorization"), host)
        if viewer is None:
            await self._respond(writer, HTTPStatus.UNAUTHORIZED, "authentication required",
                                "log in with a user of the broker (SASL PLAIN or SCRAM)",
                                extra=(("WWW-Authenticate",
                                        'Basic realm="oncelog", charset="UTF-8"'),),
                                body_wanted=body_wanted)
            return
        if path == "/metrics":
            await self._metrics(writer, viewer, headers.get("accept", ""), body_wanted)
            return
        if not pages:
            await self._respond(writer, HTTPStatus.NOT_FOUND, "not found",
                                "this port serves /metrics", body_wanted=body_wanted)
            return
        if path == "/":
            await self._respond(writer, HTTPStatus.SEE_OTHER, "see other", "/topics",
                                extra=(("Location", "/topics"),), body_wanted=body_wanted)
            return

        def flag(key: str) -> bool:
            return query.get(key, [""])[0] in ("1", "true", "yes")

        try:
            rendered = self._render(path, viewer, flag)
        except Exception:
            log.exception("console page %s failed", path)
            await self._respond(writer, HTTPStatus.INTERNAL_SERVER_ERROR, "error",
                                "the page failed to render; the broker's log has the details",
                                body_wanted=body_wanted)
            return
        if rendered is None:
            await self._respond(writer, HTTPStatus.NOT_FOUND, "not found",
                                f"nothing at {path}", body_wanted=body_wanted)
            return
        title, body, active = rendered
        await self._send(writer, HTTPStatus.OK, page(title, body, active=active,
                                                     identity=self._identity()),
                         body_wanted=body_wanted)

    async def _metrics(self, writer, viewer, accept: str, body_wanted: bool) -> None:
        """The metrics page as the viewer may see it (metrics.py's ``visible``; without SASL,
        as the Kafka listener, everyone may see everything)."""
        if not self.broker.security.sasl_enabled:
            viewer = None
        try:
            ctype, body = metrics.page(self.broker, viewer,
                                       metrics.wants_openmetrics(accept))
        except Exception:
            log.exception("the metrics page failed")
            await self._respond(writer, HTTPStatus.INTERNAL_SERVER_ERROR, "error",
                                "the page failed to render; the broker's log has the details",
                                body_wanted=body_wanted)
            return
        await self._write(writer, HTTPStatus.OK, body, ctype, body_wanted=body_wanted)

    def _render(self, path: str, viewer, flag) -> tuple[str, str, str] | None:
        broker = self.broker
        if path == "/topics":
            return (*topics_page(broker, self.sampler, viewer, flag("internal")), "Topics")
        if path.startswith("/topics/"):
            got = topic_page(broker, self.sampler, viewer, path[len("/topics/"):])
            return None if got is None else (*got, "Topics")
        if path == "/transactions":
            return (*transactions_page(broker, viewer, flag("all")), "Transactions")
        if path == "/groups":
            return (*groups_page(broker, viewer), "Groups")
        if path == "/brokers":
            return (*brokers_page(broker, viewer, flag("internal")), "Brokers")
        return None

    def _identity(self) -> str:
        b = self.broker
        return f"broker {b.node_id} at {b.host}:{b.port}, cluster {b.cluster_id}"

    # -- responses ----------------------------------------------------------------------------

    async def _respond(self, writer, status: HTTPStatus, title: str, message: str, *,
                       extra: tuple[tuple[str, str], ...] = (), body_wanted: bool = True
                       ) -> None:
        document = page(title, f"<p>{esc(message)}</p>", active="", identity="",
                        refresh=False)  # no broker identity: a 401 is shown to anyone
        await self._send(writer, status, document, extra=extra, body_wanted=body_wanted)

    async def _send(self, writer, status: HTTPStatus, document: str, *,
                    extra: tuple[tuple[str, str], ...] = (), body_wanted: bool = True) -> None:
        await self._write(writer, status, document.encode("utf-8"), "text/html; charset=utf-8",
                          extra=extra, body_wanted=body_wanted)

    async def _write(self, writer, status: HTTPStatus, body: bytes, ctype: str, *,
                     extra: tuple[tuple[str, str], ...] = (), body_wanted: bool = True) -> None:
        fields = [("Content-Type", ctype),
                  ("Content-Length", str(len(body))), ("Connection", "close"),
                  *SECURITY_HEADERS, *extra]
        head = f"HTTP/1.1 {status.value} {status.phrase}\r\n" + "".join(
            f"{k}: {v}\r\n" for k, v in fields) + "\r\n"
        writer.write(head.encode("latin-1") + (body if body_wanted else b""))
        await writer.drain()


async def start_console_server(broker, host: str, port: int,
                               ssl_context: ssl.SSLContext | None = None) -> ConsoleServer:
    """Serve the console on ``host:port`` (0: a free port; ``.port`` says which)."""
    server = ConsoleServer(broker, ssl_context)
    await server.start(host, port)
    return server


async def start_http_server(broker, host: str, console_port: int, metrics_port: int,
                            ssl_context: ssl.SSLContext | None = None) -> ConsoleServer | None:
    """The broker's one HTTP server, listening on the console's port and on the metrics port
    (each: -1 off, 0 a free port); None when both are off."""
    if console_port < 0 and metrics_port < 0:
        return None
    server = ConsoleServer(broker, ssl_context)
    if console_port >= 0:
        await server.start(host, console_port)
    if metrics_port >= 0:
        await server.start_metrics(host, metrics_port)
    return server
