"""Delay and loss on the links into one host, in user space (this kernel has no ``netem``
qdisc): a TCP proxy in the host's namespace, listening on the host's address (the broker's
advertised listener) and forwarding to the broker, which listens on 127.0.0.1 of the same
namespace.

    python -m oncelog.faults.linkproxy --listen 198.18.7.21:9092 --target 127.0.0.1:9092 \\
        --control /run/dir/n1.link.sock

Every byte to and from the broker passes through it, and it knows where a connection comes
from (the peer's address: the source host), so a rule per source host applies to both
directions of that host's connections: each chunk read is held ``delay_ms`` (plus a uniform
``0..jitter_ms``) before it is written on, in order (a chunk never overtakes the one before
it, as TCP's bytes would not). Loss: the proxy speaks TCP on both sides, so a lost segment is
what TCP makes of it, a retransmission stall: with probability ``loss`` per chunk, that
direction of the connection stalls 200-1000 ms (a retransmission timeout's range) before the
chunk goes on. Rules change at run time, for open connections too, through a unix socket
(a file system path: reachable from any namespace): one JSON line
``{"rules": {"198.18.7.22": {"delay_ms": 50, "jitter_ms": 10, "loss": 0.05}, "*": {...}}}``
(``*``: any other source), answered ``{"ok": true}``; ``{"rules": {}}`` heals.

``LinkProxy`` starts one in a ``Host`` and sets its rules.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import selectors
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .net import Host

__all__ = ["LinkProxy", "LinkProxyError", "Rule"]

STALL_MS = (200.0, 1000.0)
_READY = b"linkproxy listening on "


class LinkProxyError(RuntimeError):
    pass


Rule = dict[str, float]  # delay_ms, jitter_ms, loss


class _Proxy:
    def __init__(self, target: tuple[str, int], seed: int | None) -> None:
        self.target = target
        self.rules: dict[str, Rule] = {}
        self.random = random.Random(seed)

    def rule(self, source: str) -> Rule | None:
        return self.rules.get(source) or self.rules.get("*")

    def hold_s(self, source: str) -> float:
        """How long the next chunk from or to ``source`` is held (0: not at all)."""
        rule = self.rule(source)
        if not rule:
            return 0.0
        ms = float(rule.get("delay_ms", 0.0))
        jitter = float(rule.get("jitter_ms", 0.0))
        if jitter > 0:
            ms += self.random.uniform(0.0, jitter)
        loss = float(rule.get("loss", 0.0))
        if loss > 0 and self.random.random() < loss:
            ms += self.random.uniform(*STALL_MS)
        return ms / 1000.0

    async def pump(self, source: str, reader: asyncio.StreamReader,
                   writer: asyncio.StreamWriter) -> None:
        """Copy ``reader`` to ``writer``, each chunk held as the rules say (in order)."""
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
        loop = asyncio.get_running_loop()
        held = [0]  # chunks queued and not written yet

        async def send() -> None:
            while True:
                due, chunk = await queue.get()
                if not chunk:
                    break
                wait = due - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                writer.write(chunk)
                held[0] -= 1
                await writer.drain()
            with contextlib.suppress(OSError):
                if writer.can_write_eof():
                    writer.write_eof()

        sender = asyncio.create_task(send())
        last_due = 0.0
        try:
            while True:
                chunk = await reader.read(65536)
                hold = self.hold_s(source) if chunk else 0.0
                if chunk and hold == 0.0 and held[0] == 0:
                    writer.write(chunk)  # nothing held before it: straight on
                    await writer.drain()
                    continue
                last_due = max(last_due, loop.time() + hold)
                if chunk:
                    held[0] += 1
                queue.put_nowait((last_due, chunk))
                if not chunk:
                    break
                if queue.qsize() > 64:  # back pressure: do not read far ahead of the writes
                    while queue.qsize() > 16 and not sender.done():
                        await asyncio.sleep(0.005)
            await sender
        finally:
            sender.cancel()

    async def connection(self, reader: asyncio.StreamReader,
                         writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        source = peer[0] if peer else "?"
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        try:
            a = asyncio.create_task(self.pump(source, reader, up_writer))
            b = asyncio.create_task(self.pump(source, up_reader, writer))
            done, pending = await asyncio.wait({a, b}, return_when=asyncio.FIRST_EXCEPTION)
            if any(t.exception() for t in done if not t.cancelled()):
                for t in pending:
                    t.cancel()
            else:
                await asyncio.gather(*pending, return_exceptions=True)
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            for w in (writer, up_writer):
                with contextlib.suppress(Exception):
                    w.close()

    async def control(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while line := await reader.readline():
                try:
                    request = json.loads(line)
                    if "rules" in request:
                        self.rules = {str(k): {kk: float(vv) for kk, vv in v.items()}
                                      for k, v in dict(request["rules"]).items()}
                    answer: dict[str, Any] = {"ok": True, "rules": self.rules}
                except (ValueError, TypeError, AttributeError) as exc:
                    answer = {"ok": False, "error": str(exc)}
                writer.write(json.dumps(answer).encode() + b"\n")
                await writer.drain()
        finally:
            writer.close()


async def _serve(listen: tuple[str, int], target: tuple[str, int], control: str,
                 seed: int | None) -> None:
    proxy = _Proxy(target, seed)
    server = await asyncio.start_server(proxy.connection, *listen, reuse_address=True)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(control)
    ctl = await asyncio.start_unix_server(proxy.control, control)
    host, port = server.sockets[0].getsockname()[:2]
    sys.stdout.buffer.write(_READY + f"{host}:{port}\n".encode())
    sys.stdout.flush()
    async with server, ctl:
        await asyncio.gather(server.serve_forever(), ctl.serve_forever())


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m oncelog.faults.linkproxy",
                                     description="A TCP proxy that delays and stalls.")
    parser.add_argument("--listen", required=True, type=_address, metavar="HOST:PORT")
    parser.add_argument("--target", required=True, type=_address, metavar="HOST:PORT")
    parser.add_argument("--control", required=True, help="the control unix socket's path")
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(args.listen, args.target, args.control, args.seed))
    return 0


class LinkProxy:
    """One proxy process in ``host``: ``listen`` (its address there) to ``target``."""

    def __init__(self, host: Host, listen_port: int, target: tuple[str, int],
                 control_path: str | os.PathLike[str], log_path: str | os.PathLike[str],
                 seed: int | None = None) -> None:
        self.host = host
        self.listen = (host.address, listen_port)
        self.target = target
        self.control_path = Path(control_path)
        self.log_path = Path(log_path)
        self.seed = seed
        self.proc: subprocess.Popen[bytes] | None = None
        self.rules: dict[str, Rule] = {}

    @property
    def address(self) -> str:
        return f"{self.listen[0]}:{self.listen[1]}"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, timeout: float = 20.0) -> LinkProxy:
        if self.running:
            return self
        argv = [sys.executable, "-m", "oncelog.faults.linkproxy", "--listen", self.address,
                "--target", f"{self.target[0]}:{self.target[1]}",
                "--control", str(self.control_path)]
        if self.seed is not None:
            argv += ["--seed", str(self.seed)]
        setpriv = shutil.which("setpriv")
        if setpriv:  # SIGKILL when the thread that started it ends (its process killed)
            argv = [setpriv, "--pdeathsig", "KILL", "--", *argv]
        env = dict(os.environ)
        src = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
        with open(self.log_path, "ab") as log:
            self.proc = self.host.popen(argv, stdout=subprocess.PIPE, stderr=log,
                                        stdin=subprocess.DEVNULL, env=env,
                                        start_new_session=True)
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None:
                    self.stop()
                    raise LinkProxyError(f"link proxy on {self.address} did not start "
                                         f"(see {self.log_path})")
                if sel.select(left):
                    line = self.proc.stdout.readline()
                    if line.startswith(_READY):
                        break
        self.proc.stdout.close()
        if self.rules:
            self.set_rules(self.rules)
        return self

    def set_rules(self, rules: dict[str, Rule]) -> None:
        """Source address (or ``*``) -> ``{"delay_ms", "jitter_ms", "loss"}``; {} heals."""
        self.rules = {k: dict(v) for k, v in rules.items()}
        if not self.running:
            return
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(10.0)
            s.connect(str(self.control_path))
            s.sendall(json.dumps({"rules": self.rules}).encode() + b"\n")
            answer = b""
            while not answer.endswith(b"\n"):
                chunk = s.recv(65536)
                if not chunk:
                    break
                answer += chunk
        if not json.loads(answer or b"{}").get("ok"):
            raise LinkProxyError(f"link proxy {self.address} refused the rules: {answer!r}")

    def heal(self) -> None:
        self.set_rules({})

    def stop(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            self.proc.wait()
            self.proc = None


if __name__ == "__main__":
    sys.exit(main())
