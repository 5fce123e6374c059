"""The broker's memory under the floods a careless or hostile client can send, with the limits
on (default settings): the peak resident-set growth of a broker process during each flood.

    .venv/bin/python benchmarks/bench_floods.py [--baseline CHECKOUT] [--only NAME ...]

Floods (each on a broker of its own, started fresh, so that one flood's peak is not another's):

- ``pipelined``: 2 connections, each parks a long-poll Fetch (20 s, on an empty partition) and
  pipelines 15 frames of 90 MB behind it, until the broker takes nothing for 4 s. Kafka reads no further than the
  request in flight (it mutes the channel); a broker that reads on holds 1.4 GB a connection.
- ``slow-readers``: 12 connections ask for a 48 MB partition (max bytes 55 MiB) and read
  nothing (a 64 KiB receive buffer). A broker that builds each response in memory holds a copy
  of each.
- ``pre-auth``: a SASL broker; 4 connections that have not logged in send 100 MB frames
  (``sasl.server.max.receive.size`` is 512 KiB).

``--baseline CHECKOUT`` runs every flood against another oncelog checkout's broker too (from
that checkout's ``src`` with this environment's packages; say ``git worktree add /tmp/before
<commit>``), so that the figures before and after a change come from one run. The broker's
VmRSS is sampled every 10 ms from /proc; figures are MiB above its resident size just before the
flood. After each flood the broker must answer an ApiVersions request on a new connection.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import socket
import struct
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Self

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests")]  # oncelog, and the tests' support
from support.floods import MIB, api_versions, fill_partition, push, rss, slow_readers
from support.raw_wire import RawConnection, create_topics_request, fetch_request

from oncelog.harness.broker_process import BrokerProcess
from oncelog.protocol import encode_request


class PeakSampler:
    """The largest VmRSS of a process, sampled every 10 ms on a thread while it runs."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = rss(pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.01):
            with contextlib.suppress(FileNotFoundError, RuntimeError):
                self.peak = max(self.peak, rss(self.pid))

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def answers(broker: BrokerProcess) -> bool:
    with RawConnection(broker.bootstrap_servers) as conn:
        conn.send(api_versions())
        return conn.read_frame() is not None


# -- the floods: each takes a started broker and returns a note on what happened -------------


def flood_pipelined(broker: BrokerProcess) -> str:
    with RawConnection(broker.bootstrap_servers) as conn:
        assert conn.request(create_topics_request("quiet")).topics[0].error_code == 0
    poll = dataclasses.replace(fetch_request("quiet", 0, 0), min_bytes=1,
                               max_wait=datetime.timedelta(seconds=20))
    frame = struct.pack(">i", 90 * 1000 * 1000) + bytes(90 * 1000 * 1000)
    socks = [socket.create_connection((broker.host, broker.port)) for _ in range(2)]
    try:
        for i, sock in enumerate(socks):
            sock.sendall(encode_request(i, "long-poll", poll))
        with ThreadPoolExecutor(len(socks)) as pool:
            taken = sum(pool.map(lambda s: push(s, frame, 4.0, times=15), socks))
    finally:
        for sock in socks:
            sock.close()
    return f"the broker took {taken / MIB:.0f} MiB of 2 x 1287 MiB sent"


def setup_slow_readers(broker: BrokerProcess) -> None:
    fill_partition(broker, "big", 48)


def flood_slow_readers(broker: BrokerProcess) -> str:
    readers = slow_readers(broker, "big", 12, max_bytes=55 * MIB)
    try:
        time.sleep(3.0)  # the broker reads the log and starts sending; the readers do not read
        answered = answers(broker)
    finally:
        for sock in readers:
            sock.close()
    return "others answered meanwhile" if answered else "NO ANSWER to others meanwhile"


def flood_pre_auth(broker: BrokerProcess) -> str:
    frame = struct.pack(">i", 100 * MIB) + bytes(100 * MIB)
    socks = [socket.create_connection((broker.host, broker.port)) for _ in range(4)]
    try:
        with ThreadPoolExecutor(len(socks)) as pool:
            taken = sum(pool.map(lambda s: push(s, frame, 4.0), socks))
    finally:
        for sock in socks:
            sock.close()
    return f"the broker took {taken / MIB:.0f} MiB of 4 x 100 MiB sent"


@dataclasses.dataclass
class Flood:
    name: str
    run: Callable[[BrokerProcess], str]
    setup: Callable[[BrokerProcess], None] | None = None
    sasl: bool = False


FLOODS = [Flood("pipelined", flood_pipelined),
          Flood("slow-readers", flood_slow_readers, setup=setup_slow_readers),
          Flood("pre-auth", flood_pre_auth, sasl=True)]


def measure(flood: Flood, tmp: Path, label: str, env: dict[str, str]) -> tuple[float, str]:
    settings = {}
    if flood.sasl:
        users = tmp / "users"
        users.write_text("admin:admin-secret\n")
        settings = {"security.protocol": "SASL_PLAINTEXT", "sasl.users.file": str(users)}
    data = tmp / f"{label}-{flood.name}"
    with BrokerProcess(data, settings=settings, env=env) as broker:
        assert broker.proc is not None
        if flood.setup is not None:
            flood.setup(broker)
        time.sleep(0.5)
        before = rss(broker.proc.pid)
        with PeakSampler(broker.proc.pid) as sampler:
            note = flood.run(broker)
            time.sleep(0.5)
        if not answers(broker):
            note += "; BROKER DID NOT ANSWER AFTERWARDS"
    return (sampler.peak - before) / MIB, note


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", type=Path, default=None, metavar="CHECKOUT",
                    help="another oncelog checkout whose broker gets the same floods")
    ap.add_argument("--only", nargs="+", choices=[f.name for f in FLOODS], default=None)
    args = ap.parse_args(argv)
    if args.baseline is not None and not (args.baseline / "src" / "oncelog").is_dir():
        ap.error(f"{args.baseline} is not an oncelog checkout (no src/oncelog)")
    contenders = {"oncelog": {}}
    if args.baseline is not None:
        contenders["baseline"] = {"PYTHONPATH": str(args.baseline.resolve() / "src")}
    floods = [f for f in FLOODS if args.only is None or f.name in args.only]
    print("peak broker RSS growth during each flood (MiB above the RSS just before it)")
    with tempfile.TemporaryDirectory(prefix="oncelog-floods-") as tmp:
        for flood in floods:
            for label, env in contenders.items():
                grown, note = measure(flood, Path(tmp), label, env)
                print(f"{flood.name:13s} {label:9s} peak +{grown:7.0f} MiB   ({note})",
                      flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
