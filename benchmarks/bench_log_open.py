"""Opening a partition's log after a clean shutdown: what loading (and checking) the sealed
segments' offset and time indexes costs at broker startup.

    .venv/bin/python benchmarks/bench_log_open.py [--mb 256] [--batch-bytes 1000 16000]
                                                  [--segment-mb 64] [--rounds 5]

For each batch size, one partition of ``--mb`` MB of single-record batches (``--batch-bytes``
of value each, one index entry per ``index.interval.bytes`` = 4096 of log, Kafka's default) is
written and closed cleanly, then opened ``--rounds`` times; the figure is the fastest open, and
that time per GB of log. The last segment is validated in full at every open (it may hold
unflushed data); the sealed ones only have their indexes loaded and checked.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
from oncelog.log import LogConfig, PartitionLog
from oncelog.records import build_batch, split_batches

TIMESTAMP = 1_700_000_000_000


def write(directory: Path, mb: int, value_bytes: int, config: LogConfig) -> tuple[int, int]:
    log = PartitionLog(directory, config, 0)
    written = n = 0
    while written < mb << 20:
        data = bytearray(build_batch([(None, b"x" * value_bytes, [], TIMESTAMP + n)]))
        log.append(data, split_batches(data), 0)
        written += len(data)
        n += 1
    segments = len(log.segments)
    log.close(0)
    return n, segments


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, default=256)
    parser.add_argument("--batch-bytes", type=int, nargs="+", default=[1000, 16000])
    parser.add_argument("--segment-mb", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    config = LogConfig(segment_bytes=args.segment_mb << 20, preallocate_ahead_bytes=0)
    with tempfile.TemporaryDirectory(prefix="oncelog-bench-open-") as tmp:
        for value_bytes in args.batch_bytes:
            directory = Path(tmp) / f"t-{value_bytes}"
            batches, segments = write(directory, args.mb, value_bytes, config)
            best = float("inf")
            for _ in range(args.rounds):
                (directory / ".clean-shutdown").touch()
                start = time.perf_counter()
                log = PartitionLog(directory, config, 0)
                best = min(best, time.perf_counter() - start)
                log.close(0)
            print(f"{args.mb} MB in {segments} segments, {batches} batches of "
                  f"{value_bytes} B values: open {best * 1000:.1f} ms "
                  f"({best * 1000 * 1024 / args.mb:.0f} ms per GB)", flush=True)


if __name__ == "__main__":
    main()
