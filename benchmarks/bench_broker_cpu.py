"""The broker's own CPU cost of a fixed produce and fetch workload, this checkout against
another (``--baseline CHECKOUT``, say ``git worktree add /tmp/before <commit>``), alternating
in one run.

    .venv/bin/python benchmarks/bench_broker_cpu.py --baseline /tmp/before [--rounds 5]
        [--requests 1000] [--partitions 16] [--records 16] [--size 1024]

Why a second produce benchmark: `bench_produce.py` drives the broker with librdkafka, whose
batching follows timing (linger, queue depth), so on a shared, noisy machine the number and size
of the requests the broker answers change from run to run, and its CPU with them. Here every
round sends byte-for-byte the same requests, pre-encoded before the clock starts: Produce v9
(idempotent, acks=all), each with one batch of ``--records`` records for each of
``--partitions`` partitions, a window of 5 requests in flight on one connection; then sessionless
Fetch v12 requests of every partition from offset 0 until each is read (1 MiB per partition, 4
partitions per request). The broker's user+system CPU seconds per phase (from /proc) is the
figure; it moves far less with the machine's load than wall time does. The summary prints the
median of the rounds and the ratio this/baseline (below 1.0: this checkout is cheaper).

``--callgrind`` runs each broker under ``valgrind --tool=callgrind`` instead (apt-get install
valgrind) and counts the instructions of each phase (``callgrind_control`` zeroes the counters
before the produce phase and dumps them after each): the same figure on every run, whatever else
the machine does, at about fifty times the time (use ``--requests 300``).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import deque
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from support.raw_wire import (
    BASE_TIMESTAMP,
    RawConnection,
    create_topics_request,
    init_producer_id_request,
)

from oncelog.harness.broker_process import BrokerProcess
from oncelog.protocol import ApiKey, decode_response, encode_request, make, request_module
from oncelog.records import build_batch, iter_batches

WINDOW = 5
FETCH_PARTITIONS_PER_REQUEST = 4
PARTITION_MAX_BYTES = 1 << 20


class CallgrindBroker(BrokerProcess):
    """A broker run under callgrind, its counters dumped per phase into ``out_prefix.<pid>.N``."""

    def __init__(self, *args, out_prefix: str, **kw) -> None:
        super().__init__(*args, **kw)
        self.out_prefix = out_prefix

    def command(self) -> list[str]:
        return ["valgrind", "--tool=callgrind", "--dump-instr=no",
                f"--callgrind-out-file={self.out_prefix}.%p", *super().command()]

    def control(self, *flags: str) -> None:
        subprocess.run(["callgrind_control", *flags, str(self.pid)], check=True,
                       capture_output=True)

    def instructions(self, part: int) -> int:
        text = Path(f"{self.out_prefix}.{self.pid}.{part}").read_text()
        return int(re.search(r"^summary: (\d+)", text, re.MULTILINE).group(1))


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def produce_frames(topic: str, pid: int, epoch: int, args) -> list[bytes]:
    mod = request_module(ApiKey.PRODUCE, 9)
    value = b"v" * args.size
    frames = []
    for r in range(args.requests):
        parts = []
        for p in range(args.partitions):
            batch = build_batch(
                [(b"key-%d" % i, value, (), BASE_TIMESTAMP + r) for i in range(args.records)],
                producer_id=pid, producer_epoch=epoch, base_sequence=r * args.records)
            parts.append(make(mod.PartitionProduceData, index=p, records=batch))
        td = make(mod.TopicProduceData, name=topic, partition_data=tuple(parts))
        request = make(mod.ProduceRequest, transactional_id=None, acks=-1, timeout=30_000,
                       topic_data=(td,))
        frames.append(encode_request(r + 1000, "bench", request))
    return frames


def pipelined(conn: RawConnection, frames: list[bytes]) -> list[bytes]:
    """Send every frame with at most WINDOW unanswered; return the response frames."""
    out: list[bytes] = []
    pending: deque[int] = deque()
    for frame in frames:
        if len(pending) >= WINDOW:
            out.append(_read(conn))
            pending.popleft()
        conn.send(frame)
        pending.append(1)
    while pending:
        out.append(_read(conn))
        pending.popleft()
    return out


def _read(conn: RawConnection) -> bytes:
    frame = conn.read_frame()
    if frame is None:
        raise ConnectionError("broker hung up")
    return frame


def fetch_all(conn: RawConnection, topic: str, args) -> int:
    """Fetch every partition from 0 to its end; return the records read."""
    mod = request_module(ApiKey.FETCH, 12)
    end = args.requests * args.records
    positions = {p: 0 for p in range(args.partitions)}
    records = 0
    cid = 50_000
    while positions:
        batch_parts = sorted(positions)[:FETCH_PARTITIONS_PER_REQUEST]
        parts = tuple(make(mod.FetchPartition, partition=p, current_leader_epoch=-1,
                           fetch_offset=positions[p], last_fetched_epoch=-1,
                           log_start_offset=-1, partition_max_bytes=PARTITION_MAX_BYTES)
                      for p in batch_parts)
        request = make(mod.FetchRequest, cluster_id=None, replica_id=-1, max_wait=0,
                       min_bytes=0, max_bytes=len(batch_parts) * PARTITION_MAX_BYTES,
                       isolation_level=0, session_id=0, session_epoch=-1,
                       topics=(make(mod.FetchTopic, topic=topic, partitions=parts),),
                       forgotten_topics_data=(), rack_id="")
        cid += 1
        conn.send(encode_request(cid, "bench", request))
        _, response = decode_response(ApiKey.FETCH, 12, _read(conn))
        for pr in response.responses[0].partitions:
            if pr.error_code:
                raise RuntimeError(f"fetch error {pr.error_code} on partition {pr.partition_index}")
            for _pos, header in iter_batches(pr.records or b""):
                positions[pr.partition_index] = header.base_offset + header.last_offset_delta + 1
                records += header.records_count
            if positions[pr.partition_index] >= end:
                del positions[pr.partition_index]
    return records


def one_round(name: str, env: dict | None, tmp: Path, args) -> tuple[float, float]:
    """(produce, fetch) figures of one broker: CPU seconds, or instructions (--callgrind)."""
    data = tmp / f"{name}-{time.monotonic_ns()}"
    if args.callgrind:
        broker: BrokerProcess = CallgrindBroker(data, env=env, out_prefix=str(tmp / name))
        broker.launch()
        broker.wait_listening(timeout=600)
    else:
        broker = BrokerProcess(data, env=env).start()
    try:
        with RawConnection(broker.bootstrap_servers, timeout=600) as conn:
            topic = "cpu-bench"
            response = conn.request(create_topics_request(topic, args.partitions))
            assert response.topics[0].error_code == 0, response
            init = conn.request(init_producer_id_request())
            frames = produce_frames(topic, init.producer_id, init.producer_epoch, args)
            time.sleep(3 if args.callgrind else 0.5)  # start-up work (preallocation) settles
            if isinstance(broker, CallgrindBroker):
                broker.control("-z")
            c0 = cpu_seconds(broker.pid)
            pipelined(conn, frames)
            c1 = cpu_seconds(broker.pid)
            if isinstance(broker, CallgrindBroker):
                broker.control("-d", "produce")
            got = fetch_all(conn, topic, args)
            c2 = cpu_seconds(broker.pid)
            assert got == args.requests * args.records * args.partitions, got
            if isinstance(broker, CallgrindBroker):
                broker.control("-d", "fetch")
                return broker.instructions(1), broker.instructions(2)
        return c1 - c0, c2 - c1
    finally:
        broker.kill()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", type=Path, required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--partitions", type=int, default=16)
    ap.add_argument("--records", type=int, default=16)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--callgrind", action="store_true",
                    help="count instructions under valgrind instead of CPU seconds")
    args = ap.parse_args(argv)
    if args.callgrind and not shutil.which("callgrind_control"):
        ap.error("--callgrind needs valgrind (apt-get install valgrind)")
    if not (args.baseline / "src" / "oncelog").is_dir():
        ap.error(f"{args.baseline} is not an oncelog checkout (no src/oncelog)")
    contenders = {"this": None,
                  "baseline": {"PYTHONPATH": str(args.baseline.resolve() / "src")}}
    mb = args.requests * args.partitions * args.records * args.size / 1e6
    print(f"{args.requests} produce requests x {args.partitions} partitions x {args.records} "
          f"records x {args.size} B = {mb:.0f} MB per round, {args.rounds} rounds; "
          f"baseline {args.baseline}")
    figures: dict[str, list[tuple[float, float]]] = {n: [] for n in contenders}
    with tempfile.TemporaryDirectory(prefix="bench-cpu-") as tmp:
        for r in range(1, args.rounds + 1):
            order = list(contenders) if r % 2 else list(reversed(contenders))
            for name in order:
                produce_cpu, fetch_cpu = one_round(name, contenders[name], Path(tmp), args)
                figures[name].append((produce_cpu, fetch_cpu))
                if args.callgrind:
                    print(f"round {r} {name:8} instructions produce {produce_cpu / 1e6:9.1f} M"
                          f"   fetch {fetch_cpu / 1e6:9.1f} M", flush=True)
                else:
                    print(f"round {r} {name:8} broker CPU produce {produce_cpu:6.2f} s   "
                          f"fetch {fetch_cpu:6.2f} s", flush=True)
    for phase, i in (("produce", 0), ("fetch", 1)):
        this = statistics.median(f[i] for f in figures["this"])
        base = statistics.median(f[i] for f in figures["baseline"])
        unit = "instructions" if args.callgrind else "CPU seconds"
        print(f"median {phase:7} {unit}: this {this:.4g}, baseline {base:.4g}, "
              f"this/baseline {this / base:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
