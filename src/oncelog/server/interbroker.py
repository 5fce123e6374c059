"""Requests from this broker to other brokers of the cluster, on the broker's event loop.

One ``BrokerChannel`` per remote node: a TCP connection opened on first use, requests pipelined
on it and matched to their responses by correlation id (a broker answers a connection's
requests in order). A broken connection fails every request in flight with
``ChannelError``; the next request reconnects. ``InterBrokerClient`` keeps the channels, follows
the cluster view for addresses, and is what replication, the transaction coordinator's markers
and partition verification use.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import struct
from collections.abc import Callable
from typing import Any

from ..protocol import ProtocolError, decode_response, encode_request

log = logging.getLogger("oncelog.interbroker")

_SIZE = struct.Struct(">i")
MAX_RESPONSE_BYTES = 256 << 20


class ChannelError(ConnectionError):
    """The request may or may not have reached the other broker: its connection failed."""


class BrokerChannel:
    def __init__(self, node_id: int, host: str, port: int, client_id: str,
                 connect_timeout_s: float = 5.0) -> None:
        self.node_id = node_id
        self.host = host
        self.port = port
        self.client_id = client_id
        self.connect_timeout_s = connect_timeout_s
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._connecting: asyncio.Lock = asyncio.Lock()
        self._pending: dict[int, tuple[int, int, asyncio.Future]] = {}
        self._correlation = itertools.count(1)
        self._read_task: asyncio.Task | None = None
        self.closed = False

    async def _connect(self) -> None:
        async with self._connecting:
            if self._writer is not None:
                return
            try:
                self._reader, self._writer = await asyncio.wait_for(
                    asyncio.open_connection(self.host, self.port), self.connect_timeout_s)
            except (TimeoutError, OSError) as exc:
                raise ChannelError(f"cannot connect to broker {self.node_id} at "
                                   f"{self.host}:{self.port}: {exc!r}") from None
            self._read_task = asyncio.get_running_loop().create_task(self._read_loop())

    async def request(self, request: Any, timeout_s: float = 30.0) -> Any:
        """Send one request (a kio request entity) and return the decoded response."""
        if self.closed:
            raise ChannelError(f"channel to broker {self.node_id} is closed")
        await self._connect()
        cls: Any = type(request)
        correlation = next(self._correlation)
        fut = asyncio.get_running_loop().create_future()
        self._pending[correlation] = (cls.__api_key__, cls.__version__, fut)
        writer = self._writer
        if writer is None:
            self._pending.pop(correlation, None)
            raise ChannelError(f"connection to broker {self.node_id} lost")
        try:
            writer.write(encode_request(correlation, self.client_id, request))
            await writer.drain()
            return await asyncio.wait_for(asyncio.shield(fut), timeout_s)
        except TimeoutError:
            # The answer may still come; a connection whose request timed out is suspect.
            self._drop(ChannelError(f"broker {self.node_id} did not answer within "
                                    f"{timeout_s:.1f} s"))
            raise ChannelError(f"broker {self.node_id} did not answer within "
                               f"{timeout_s:.1f} s") from None
        except (OSError, ConnectionError) as exc:
            self._drop(ChannelError(f"connection to broker {self.node_id} failed: {exc!r}"))
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                return fut.result()
            raise ChannelError(f"connection to broker {self.node_id} failed: {exc!r}") from None
        finally:
            self._pending.pop(correlation, None)

    async def _read_loop(self) -> None:
        reader = self._reader
        assert reader is not None
        try:
            while True:
                head = await reader.readexactly(4)
                (size,) = _SIZE.unpack(head)
                if size < 4 or size > MAX_RESPONSE_BYTES:
                    raise ChannelError(f"broker {self.node_id} sent a frame of {size} bytes")
                frame = await reader.readexactly(size)
                (correlation,) = _SIZE.unpack_from(frame, 0)
                entry = self._pending.get(correlation)
                if entry is None:
                    continue  # a request that timed out
                api_key, version, fut = entry
                try:
                    _, response = decode_response(api_key, version, frame)
                except ProtocolError as exc:
                    if not fut.done():
                        fut.set_exception(ChannelError(str(exc)))
                    continue
                if not fut.done():
                    fut.set_result(response)
        except (asyncio.IncompleteReadError, OSError, ChannelError) as exc:
            self._drop(exc if isinstance(exc, ChannelError) else
                       ChannelError(f"connection to broker {self.node_id} closed: {exc!r}"))
        except asyncio.CancelledError:
            pass

    def _drop(self, error: ChannelError) -> None:
        writer, self._writer, self._reader = self._writer, None, None
        if writer is not None:
            writer.close()
        task, self._read_task = self._read_task, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()
        for _api, _version, fut in list(self._pending.values()):
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

    def __init__(self, node_id: int, address_of: Callable[[int], tuple[str, int] | None]
                 ) -> None:
        self.node_id = node_id
        self.address_of = address_of
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
                               f"broker-{self.node_id}-{purpose}")
            self._channels[(node_id, purpose)] = ch
        return ch

    async def request(self, node_id: int, request: Any, timeout_s: float = 30.0,
                      purpose: str = "control") -> Any:
        return await self.channel(node_id, purpose).request(request, timeout_s)

    def close(self) -> None:
        for ch in self._channels.values():
            ch.close()
        self._channels.clear()
