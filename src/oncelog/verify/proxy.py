"""A fault-injecting Kafka proxy: clients connect to it as if it were the broker.

    with FaultProxy("127.0.0.1:9092", faults=Faults.parse("delay,reorder,duplicate")) as proxy:
        producer = Producer(bootstrap_servers=proxy.bootstrap_servers)

Each client connection gets an upstream connection of its own. The proxy reads whole Kafka
frames, parses the request header (API key, version, correlation id) and keeps, per upstream
connection, the queue of responses it expects: the broker answers one connection's requests in
order, so the head of that queue tells which request a response belongs to, and the proxy
checks its correlation id.

Faults, per request of the chosen API keys (Produce and the transaction APIs by default):

- ``delay``: the request (and, as on any TCP stream, everything after it on its connection)
  reaches the broker N ms late.
- ``reorder`` (hold): the request is held, and its connection with it, while other connections
  go on; it is released later (a timer, or ``release_held``), possibly after the client gave up
  on it and closed the connection: the upstream connection stays open until every held request
  has reached the broker, as a packet stuck in the network would. Its response then goes nowhere.
- ``duplicate``: the request goes through, and the same bytes are sent again N ms later; the
  second response is swallowed (the client never sees it).
- ``copy_next`` / ``replay_copies`` (targeted tests, KAFKA-17754): the next requests of the
  given API keys go through, and a copy of each is kept until ``replay_copies`` sends it, on a
  connection of its own (so nothing queues behind it), whenever the test chooses: a duplicate
  that lands after the client went on. Its response goes to the test, not the client.

Metadata, FindCoordinator and DescribeCluster responses are rewritten so that every broker
address is the proxy's: clients (ours, librdkafka) keep talking through the proxy.

Choices come from ``random.Random(seed)``, drawn on the proxy's event loop in the order
requests arrive, so a run with the same seed and the same request order makes the same choices.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Self

from ..loop_thread import LoopThread
from ..protocol import (
    ApiKey,
    ProtocolError,
    decode_request_body,
    decode_response,
    encode_response,
    parse_request_header,
)
from ..protocol.framing import ClientFraming, CorrelationError, Framing

log = logging.getLogger("oncelog.verify.proxy")

_READ_SIZE = 1 << 16

TRANSACTIONAL_APIS = frozenset({ApiKey.PRODUCE, ApiKey.ADD_PARTITIONS_TO_TXN,
                                ApiKey.ADD_OFFSETS_TO_TXN, ApiKey.END_TXN,
                                ApiKey.TXN_OFFSET_COMMIT})
_REWRITTEN = frozenset({ApiKey.METADATA, ApiKey.FIND_COORDINATOR, ApiKey.DESCRIBE_CLUSTER})
FAULT_KINDS = ("delay", "reorder", "duplicate")


@dataclass
class Faults:
    """Probabilities per request (of ``api_keys``) and the ranges of the times involved."""

    delay: float = 0.0
    delay_ms: tuple[int, int] = (50, 400)
    reorder: float = 0.0
    hold_ms: tuple[int, int] = (200, 1500)
    duplicate: float = 0.0
    duplicate_after_ms: tuple[int, int] = (0, 300)
    api_keys: frozenset[int] = TRANSACTIONAL_APIS

    @classmethod
    def parse(cls, names: str | list[str], probability: float = 0.1, **kw: Any) -> Faults:
        """``"delay,reorder,duplicate"`` -> each with ``probability``; unknown names raise."""
        items = names.split(",") if isinstance(names, str) else list(names)
        chosen = {n.strip() for n in items if n.strip()}
        for name in chosen - set(FAULT_KINDS):
            raise ValueError(f"unknown proxy fault {name!r} (known: {', '.join(FAULT_KINDS)})")
        faults = cls(**kw)
        faults.delay = probability if "delay" in chosen else 0.0
        faults.reorder = probability if "reorder" in chosen else 0.0
        faults.duplicate = probability if "duplicate" in chosen else 0.0
        return faults

    @property
    def any(self) -> bool:
        return bool(self.delay or self.reorder or self.duplicate)


@dataclass(eq=False)
class _Item:
    frame: bytes
    api_key: int
    version: int
    correlation_id: int
    expects_response: bool
    swallow: bool = False
    delay: float = 0.0
    gate: asyncio.Future | None = None


@dataclass(eq=False)
class _Link:
    id: int
    client_writer: asyncio.StreamWriter
    up_reader: asyncio.StreamReader
    up_writer: asyncio.StreamWriter
    outbox: asyncio.Queue = field(default_factory=asyncio.Queue)
    # The upstream connection's framing: the _Items sent, awaiting their responses in order.
    upstream: ClientFraming[_Item] = field(default_factory=lambda: ClientFraming(None))
    queued: int = 0  # items in the outbox or being sent
    client_gone: bool = False
    closed: bool = False
    tasks: list[asyncio.Task] = field(default_factory=list)


@dataclass(eq=False)
class Held:
    link: int
    api_key: int
    correlation_id: int
    since: float
    gate: asyncio.Future


def _open_gate(gate: asyncio.Future) -> None:
    if not gate.done():
        gate.set_result(None)


class FaultProxy:
    def __init__(self, upstream: str, host: str = "127.0.0.1", port: int = 0,
                 faults: Faults | None = None, seed: int = 0) -> None:
        up_host, up_port = upstream.rsplit(":", 1)
        self.upstream = (up_host, int(up_port))
        self.host = host
        self.port = port
        self.faults = faults or Faults()
        self.rng = random.Random(seed)
        self.stats: Counter[str] = Counter()
        self.held: list[Held] = []
        self._hold_next: list[tuple[frozenset[int], int]] = []  # (api keys, count) to hold
        self._copy_next: list[tuple[frozenset[int], int]] = []  # (api keys, count) to copy
        self.copies: list[tuple[int, int, bytes]] = []  # (api key, version, frame) kept
        self._links: dict[int, _Link] = {}
        self._next_link = 0
        self._server: asyncio.Server | None = None
        self._loop_thread = LoopThread("oncelog-proxy")

    @property
    def bootstrap_servers(self) -> str:
        return f"{self.host}:{self.port}"

    # -- lifecycle (the proxy runs on an event loop of its own, in a thread) -------------------

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        return self._loop_thread.loop

    def start(self) -> Self:
        self._server = self._loop_thread.start(
            asyncio.start_server(self._accept, self.host, self.port))
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def stop(self) -> None:
        self._loop_thread.stop(self._shutdown(), timeout=10)

    async def _shutdown(self) -> None:
        assert self._server is not None
        self._server.close()
        for h in self.held:
            if not h.gate.done():
                h.gate.set_result(None)
        for link in list(self._links.values()):
            self._close(link)
        await asyncio.sleep(0)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _call(self, fn: Any, *args: Any) -> Any:
        return self._loop_thread.call(fn, *args, timeout=10)

    # -- control (from any thread) ------------------------------------------------------------

    def set_faults(self, faults: Faults) -> None:
        def apply() -> None:
            self.faults = faults
        self._call(apply)

    def hold_next(self, api_keys: int | set[int] | frozenset[int], count: int = 1) -> None:
        """Hold the next ``count`` requests of these API keys until ``release_held``."""
        keys = frozenset({api_keys} if isinstance(api_keys, int) else api_keys)
        self._call(self._hold_next.append, (keys, count))

    def copy_next(self, api_keys: int | set[int] | frozenset[int], count: int = 1) -> None:
        """Let the next ``count`` requests of these API keys through and keep a copy of each
        for ``replay_copies``."""
        keys = frozenset({api_keys} if isinstance(api_keys, int) else api_keys)
        self._call(self._copy_next.append, (keys, count))

    def copied_count(self) -> int:
        return self._call(lambda: len(self.copies))

    def replay_copies(self, timeout: float = 10.0) -> list[Any]:
        """Send every kept copy again, each on a new connection to the broker, in the order
        they were copied; returns the broker's decoded responses."""
        async def replay() -> list[Any]:
            out = []
            copies, self.copies = self.copies, []
            for api_key, version, frame in copies:
                reader, writer = await asyncio.open_connection(*self.upstream)
                try:
                    writer.write(frame)
                    await writer.drain()
                    size = int.from_bytes(await reader.readexactly(4), "big", signed=True)
                    body = await reader.readexactly(size)
                    out.append(decode_response(api_key, version, body)[1])
                finally:
                    writer.close()
                self.stats["replayed"] += 1
            return out

        assert self.loop is not None
        return asyncio.run_coroutine_threadsafe(
            asyncio.wait_for(replay(), timeout), self.loop).result(timeout + 1)

    def stop_holding(self) -> None:
        """Forget what ``hold_next`` still had to hold (held requests stay held)."""
        self._call(self._hold_next.clear)

    def held_count(self) -> int:
        return self._call(lambda: sum(1 for h in self.held if not h.gate.done()))

    def wait_held(self, count: int = 1, timeout: float = 10.0) -> None:
        """Wait until at least ``count`` requests are being held."""
        deadline = time.monotonic() + timeout
        while self.held_count() < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"fewer than {count} requests held after {timeout}s")
            time.sleep(0.01)

    def release_held(self, shuffle: bool = False) -> int:
        """Let every held request go on (in the order held, or shuffled by the seeded RNG)."""
        def release() -> int:
            waiting = [h for h in self.held if not h.gate.done()]
            if shuffle:
                self.rng.shuffle(waiting)
            for h in waiting:
                h.gate.set_result(None)
            self.stats["released"] += len(waiting)
            return len(waiting)
        return self._call(release)

    def wait_idle(self, timeout: float = 10.0) -> None:
        """Wait until nothing is queued, held or awaiting a response on any connection."""
        deadline = time.monotonic() + timeout
        while self._call(lambda: any(link.queued or link.upstream.in_flight
                                     for link in self._links.values())):
            if time.monotonic() > deadline:
                raise TimeoutError(f"proxy still busy after {timeout}s")
            time.sleep(0.01)

    def close_connections(self) -> None:
        """Drop every connection (as a broker restart does); clients reconnect."""
        def close_all() -> None:
            for link in list(self._links.values()):
                self._close(link)
        self._call(close_all)

    # -- the connections ------------------------------------------------------------------------

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError as exc:
            log.info("proxy: upstream %s:%d unreachable: %s", *self.upstream, exc)
            writer.close()
            return
        self._next_link += 1
        link = _Link(self._next_link, writer, up_reader, up_writer)
        self._links[link.id] = link
        self.stats["connections"] += 1
        link.tasks = [asyncio.ensure_future(self._from_client(link, reader)),
                      asyncio.ensure_future(self._to_upstream(link)),
                      asyncio.ensure_future(self._from_upstream(link))]

    def _close(self, link: _Link) -> None:
        if link.closed:
            return
        link.closed = True
        self._links.pop(link.id, None)
        for w in (link.client_writer, link.up_writer):
            with contextlib.suppress(Exception):
                w.close()
        current = asyncio.current_task()
        for t in link.tasks:
            if t is not current:
                t.cancel()

    def _maybe_finish(self, link: _Link) -> None:
        """A client that left: its upstream connection closes once nothing is pending on it."""
        if link.client_gone and not link.queued and not link.upstream.in_flight:
            self._close(link)

    async def _from_client(self, link: _Link, reader: asyncio.StreamReader) -> None:
        requests = Framing()
        try:
            while data := await reader.read(_READ_SIZE):
                requests.receive_data(data)
                while isinstance(body := requests.next_event(), bytes):
                    self._on_request(link, Framing.send(body), body)
        except (ConnectionError, OSError):
            pass
        except ProtocolError as exc:
            log.warning("proxy: unparsable request on link %d: %s", link.id, exc)
        link.client_gone = True
        self._maybe_finish(link)

    def _on_request(self, link: _Link, frame: bytes, body: bytes) -> None:
        header = parse_request_header(body)
        expects = True
        if header.api_key == ApiKey.PRODUCE:
            try:
                expects = decode_request_body(header, body).acks != 0
            except ProtocolError:
                pass
        item = _Item(frame, header.api_key, header.api_version, header.correlation_id, expects)
        self.stats["requests"] += 1
        self._choose_fault(link, item)
        link.queued += 1
        link.outbox.put_nowait(item)

    def _choose_fault(self, link: _Link, item: _Item) -> None:
        for i, (keys, count) in enumerate(self._copy_next):
            if item.api_key in keys:
                self.copies.append((item.api_key, item.version, item.frame))
                if count > 1:
                    self._copy_next[i] = (keys, count - 1)
                else:
                    del self._copy_next[i]
                return
        for i, (keys, count) in enumerate(self._hold_next):
            if item.api_key in keys:
                self._hold(link, item, None)
                if count > 1:
                    self._hold_next[i] = (keys, count - 1)
                else:
                    del self._hold_next[i]
                return
        f = self.faults
        if item.api_key not in f.api_keys or not f.any:
            return
        r = self.rng.random()
        if r < f.delay:
            item.delay = self.rng.uniform(*f.delay_ms) / 1000
            self.stats["delayed"] += 1
        elif r < f.delay + f.reorder:
            self._hold(link, item, self.rng.uniform(*f.hold_ms) / 1000)
        elif r < f.delay + f.reorder + f.duplicate:
            after = self.rng.uniform(*f.duplicate_after_ms) / 1000
            if not item.expects_response:
                return
            self.stats["duplicated"] += 1
            link.queued += 1  # pending already: wait_idle waits for it too
            assert self.loop is not None
            self.loop.call_later(after, self._send_duplicate, link, item)

    def _hold(self, link: _Link, item: _Item, release_after: float | None) -> None:
        assert self.loop is not None
        gate = self.loop.create_future()
        item.gate = gate
        self.held.append(Held(link.id, item.api_key, item.correlation_id, time.monotonic(), gate))
        self.stats["held"] += 1
        if release_after is not None:
            self.loop.call_later(release_after, _open_gate, gate)

    def _send_duplicate(self, link: _Link, original: _Item) -> None:
        if link.closed:
            return
        dup = dataclasses.replace(original, swallow=True, delay=0.0, gate=None)
        link.outbox.put_nowait(dup)

    async def _to_upstream(self, link: _Link) -> None:
        try:
            while True:
                item: _Item = await link.outbox.get()
                if item.delay:
                    await asyncio.sleep(item.delay)
                if item.gate is not None:
                    await item.gate
                if item.expects_response:
                    link.upstream.expect(item.correlation_id, item)
                link.up_writer.write(item.frame)
                await link.up_writer.drain()
                link.queued -= 1
                self.stats["duplicates_sent" if item.swallow else "forwarded"] += 1
                self._maybe_finish(link)
        except (ConnectionError, OSError):
            self._close(link)

    async def _from_upstream(self, link: _Link) -> None:
        upstream = link.upstream
        try:
            while data := await link.up_reader.read(_READ_SIZE):
                upstream.receive_data(data)
                while isinstance(event := upstream.next_event(), tuple):
                    item, body = event
                    if item.swallow:
                        self.stats["swallowed"] += 1
                    elif not link.client_gone:
                        frame = None
                        if item.api_key in _REWRITTEN:
                            frame = self._rewrite(item, body)
                        link.client_writer.write(frame or Framing.send(body))
                        await link.client_writer.drain()
                    else:
                        self.stats["answers_to_gone_clients"] += 1
                    self._maybe_finish(link)
        except CorrelationError as exc:
            if exc.expected is None:
                log.error("proxy: link %d: a response nobody asked for", link.id)
            else:
                log.error("proxy: link %d: response correlation id %d, expected %d",
                          link.id, exc.received, exc.expected)
            self.stats["unmatched"] += 1
        except ProtocolError as exc:  # a frame too short to hold a correlation id
            log.error("proxy: link %d: %s", link.id, exc)
            self.stats["unmatched"] += 1
        except (ConnectionError, OSError):
            pass
        self._close(link)

    # -- response rewriting ---------------------------------------------------------------------

    def _rewrite(self, item: _Item, body: bytes) -> bytes | None:
        try:
            cid, response = decode_response(item.api_key, item.version, body)
        except ProtocolError as exc:
            log.warning("proxy: cannot rewrite %s v%d: %s", item.api_key, item.version, exc)
            return None
        addr = {"host": self.host, "port": self.port}
        if item.api_key in (ApiKey.METADATA, ApiKey.DESCRIBE_CLUSTER):
            response = dataclasses.replace(response, brokers=tuple(
                dataclasses.replace(b, **addr) for b in response.brokers))
        elif item.api_key == ApiKey.FIND_COORDINATOR:
            if hasattr(response, "coordinators"):
                response = dataclasses.replace(response, coordinators=tuple(
                    dataclasses.replace(c, **addr) if c.port >= 0 else c
                    for c in response.coordinators))
            elif response.port >= 0:
                response = dataclasses.replace(response, **addr)
        self.stats["rewritten"] += 1
        return encode_response(cid, response)
