"""Requests from this broker to other brokers of the cluster, on the broker's event loop.

One ``BrokerChannel`` per remote node: a TCP connection opened on first use, requests pipelined
on it and matched to their responses by correlation id (a broker answers a connection's
requests in order). A broken connection fails every request in flight with
``ChannelError``; the next request reconnects. ``InterBrokerClient`` keeps the channels, follows
the cluster view for addresses, and is what replication, the transaction coordinator's markers
and partition verification use. Between SASL brokers a new connection logs in first
(server/interbroker_sasl.py): requests issued meanwhile wait for it.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable
from typing import Any

from ..protocol import ProtocolError, decode_response
from ..protocol.framing import ClientFraming, FrameSizeError

log = logging.getLogger("oncelog.interbroker")

MAX_RESPONSE_BYTES = 256 << 20

# What a request in flight waits with: its API key and version (to decode the response) and
# the future its caller awaits.
_Pending = tuple[int, int, asyncio.Future]


class ChannelError(ConnectionError):
    """The request may or may not have reached the other broker: its connection failed."""


class _ChannelProtocol(asyncio.Protocol):
    """One TCP connection of a channel: bytes in go to the channel's framing; writes wait
    while the transport's buffer is full."""

    def __init__(self, channel: BrokerChannel) -> None:
        self.channel = channel
        self.transport: asyncio.Transport | None = None
        self.lost = False
        self.can_write = asyncio.Event()
        self.can_write.set()

    def connection_made(self, transport) -> None:  # type: ignore[override]
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.channel._received(self, data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.can_write.set()
        self.channel._lost(self, exc)

    def pause_writing(self) -> None:
        self.can_write.clear()

    def resume_writing(self) -> None:
        self.can_write.set()

    async def drain(self) -> None:
        """Wait until the transport takes more bytes (what StreamWriter.drain does)."""
        if not self.can_write.is_set():
            await self.can_write.wait()
        if self.lost:
            raise ConnectionResetError("connection lost")


class BrokerChannel:
    def __init__(self, node_id: int, host: str, port: int, client_id: str,
                 connect_timeout_s: float = 5.0, ssl_context: ssl.SSLContext | None = None,
                 login: Any = None) -> None:
        self.node_id = node_id
        self.ssl_context = ssl_context  # TLS to the other broker's SSL/SASL_SSL listener
        # SASL between brokers: an interbroker_sasl.InterBrokerLogin (None: no SASL)
        self.login = login
        self.host = host
        self.port = port
        self.client_id = client_id
        self.connect_timeout_s = connect_timeout_s
        self._protocol: _ChannelProtocol | None = None
        self._connecting: asyncio.Lock = asyncio.Lock()
        # A broker answers frames of at least a correlation id and at most MAX_RESPONSE_BYTES.
        self._framing: ClientFraming[_Pending] = ClientFraming(
            client_id, first_correlation_id=1, max_frame_size=MAX_RESPONSE_BYTES)
        self.closed = False

    async def _connect(self) -> None:
        async with self._connecting:
            if self._protocol is not None:
                return
            if self.login is not None:
                self.login.check(self.node_id)  # a login refused a moment ago: not again yet
            loop = asyncio.get_running_loop()
            try:
                _, protocol = await asyncio.wait_for(
                    loop.create_connection(lambda: _ChannelProtocol(self), self.host,
                                           self.port, ssl=self.ssl_context,
                                           server_hostname=self.host if self.ssl_context
                                           else None),
                    self.connect_timeout_s)
            except (TimeoutError, OSError) as exc:
                raise ChannelError(f"cannot connect to broker {self.node_id} at "
                                   f"{self.host}:{self.port}: {exc!r}") from None
            if protocol.lost:
                # Closed before it was ours (a peer or relay that accepts and hangs up at once):
                # its connection_lost found no channel to fail, so keeping it would wedge us.
                raise ChannelError(f"connection to broker {self.node_id} at "
                                   f"{self.host}:{self.port} closed at once")
            self._protocol = protocol
            if self.login is not None:
                # Before any request waiting on this lock: the other broker closes a
                # connection whose first requests are not the SASL ones.
                try:
                    await self.login.authenticate(self.node_id, self._login_call)
                except ChannelError as exc:
                    self._drop(exc)
                    raise

    async def _login_call(self, request: Any) -> Any:
        protocol = self._protocol
        if protocol is None or protocol.transport is None or protocol.lost:
            raise ChannelError(f"connection to broker {self.node_id} lost while logging in")
        return await self._send(protocol, request, self.connect_timeout_s)

    async def request(self, request: Any, timeout_s: float = 30.0) -> Any:
        """Send one request (a kio request entity) and return the decoded response."""
        if self.closed:
            raise ChannelError(f"channel to broker {self.node_id} is closed")
        await self._connect()
        protocol = self._protocol
        if protocol is None or protocol.transport is None or protocol.lost \
                or protocol.transport.is_closing():
            if protocol is not None:
                self._drop(ChannelError(f"connection to broker {self.node_id} lost"))
            raise ChannelError(f"connection to broker {self.node_id} lost")
        return await self._send(protocol, request, timeout_s)

    async def _send(self, protocol: _ChannelProtocol, request: Any, timeout_s: float) -> Any:
        cls: Any = type(request)
        assert protocol.transport is not None
        fut = asyncio.get_running_loop().create_future()
        correlation = self._framing.new_correlation_id()
        # In flight until its response (or the connection's end), even if nobody waits for
        # it any more: responses come in request order, and this one's will come.
        data = self._framing.send(correlation, request, (cls.__api_key__, cls.__version__, fut))
        try:
            protocol.transport.write(data)
            await protocol.drain()
            return await asyncio.wait_for(asyncio.shield(fut), timeout_s)
        except TimeoutError:
            # The answer may still come; a connection whose request timed out is suspect.
            self._drop(ChannelError(f"broker {self.node_id} did not answer within "
                                    f"{timeout_s:.1f} s"))
            raise ChannelError(f"broker {self.node_id} did not answer within "
                               f"{timeout_s:.1f} s") from None
        except (OSError, ConnectionError, RuntimeError) as exc:
            # RuntimeError: uvloop's write to a transport that closed under us.
            self._drop(ChannelError(f"connection to broker {self.node_id} failed: {exc!r}"))
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                return fut.result()
            raise ChannelError(f"connection to broker {self.node_id} failed: {exc!r}") from None
        finally:
            if not fut.done():
                fut.cancel()  # nobody waits (the caller was cancelled): its response is skipped

    def _received(self, protocol: _ChannelProtocol, data: bytes) -> None:
        if protocol is not self._protocol:
            return  # a connection already dropped
        framing = self._framing
        framing.receive_data(data)
        while True:
            try:
                event = framing.next_event()
            except FrameSizeError as exc:
                self._drop(ChannelError(f"broker {self.node_id} sent a frame of {exc.size} "
                                        "bytes"))
                return
            except ProtocolError as exc:  # a response out of step with the requests
                self._drop(ChannelError(f"broker {self.node_id}: {exc}"))
                return
            if not isinstance(event, tuple):  # NEED_DATA
                return
            (api_key, version, fut), frame = event
            if fut.done():
                continue  # a request that timed out
            try:
                _, response = decode_response(api_key, version, frame)
            except ProtocolError as exc:
                fut.set_exception(ChannelError(str(exc)))
                continue
            fut.set_result(response)

    def _lost(self, protocol: _ChannelProtocol, exc: Exception | None) -> None:
        if protocol is self._protocol:
            self._drop(ChannelError(f"connection to broker {self.node_id} closed: {exc!r}"))

    def _drop(self, error: ChannelError) -> None:
        protocol, self._protocol = self._protocol, None
        if protocol is not None and protocol.transport is not None:
            protocol.transport.close()
        for _api, _version, fut in self._framing.clear():
            if not fut.done():
                fut.set_exception(error)
                fut.exception()  # retrieved: no "never retrieved" warning if nobody waits

    def close(self) -> None:
        self.closed = True
        self._drop(ChannelError(f"channel to broker {self.node_id} closed"))


class InterBrokerClient:
    """Channels to the other brokers, addressed by node id through ``address_of``. A broker
    answers one connection's requests in order, so each purpose has its own connection: the
    replica fetcher's long polls must never queue behind (or ahead of) a request that waits
    for replication, such as a transaction-log write the coordinator makes for a partition
    verification."""

    def __init__(self, node_id: int, address_of: Callable[[int], tuple[str, int] | None],
                 ssl_context: ssl.SSLContext | None = None, login: Any = None) -> None:
        self.node_id = node_id
        self.address_of = address_of
        self.ssl_context = ssl_context
        self.login = login  # interbroker_sasl.InterBrokerLogin between SASL brokers
        self._channels: dict[tuple[int, str], BrokerChannel] = {}

    def channel(self, node_id: int, purpose: str = "control") -> BrokerChannel:
        address = self.address_of(node_id)
        if address is None:
            raise ChannelError(f"broker {node_id} is not registered")
        ch = self._channels.get((node_id, purpose))
        if ch is not None and (ch.host, ch.port) != address:
            ch.close()  # the broker came back elsewhere
            ch = None
        if ch is None or ch.closed:
            ch = BrokerChannel(node_id, address[0], address[1],
                               f"broker-{self.node_id}-{purpose}",
                               ssl_context=self.ssl_context, login=self.login)
            self._channels[(node_id, purpose)] = ch
        return ch

    async def request(self, node_id: int, request: Any, timeout_s: float = 30.0,
                      purpose: str = "control") -> Any:
        return await self.channel(node_id, purpose).request(request, timeout_s)

    def close(self) -> None:
        for ch in self._channels.values():
            ch.close()
        self._channels.clear()
