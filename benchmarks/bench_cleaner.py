"""The log cleaner's throughput and memory: one compacted partition cleaned whole, against a
plain copy of the same segments in the same run (the floor any rewrite pays for its I/O).

    .venv/bin/python benchmarks/bench_cleaner.py [--mb 64] [--keys 10000] [--records 10]
                                                 [--value-bytes 100] [--segment-mb 8]
                                                 [--rounds 3]

A partition of ``--mb`` MB is written: batches of ``--records`` records whose keys are drawn
from ``--keys`` keys, a third of them in transactions (one in four aborted), a tombstone now
and then. Each round copies it aside and cleans the copy (offset map, cleaned segments,
swap: log/log_cleaner.py ``clean_log``); the reference copies the same segment files in 4 MB
reads and writes, fsynced as the cleaner's are. Figures: the fastest round of each, in MB of
log read per second, their ratio, and the peak of Python allocations of one more round of
each under tracemalloc (the offset map is bounded by log.cleaner.dedupe.buffer.size; the
rest is a chunk of the log at a time).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
from oncelog.log import LogConfig, PartitionLog
from oncelog.log.cleaner_manager import CleanerManager
from oncelog.log.log_cleaner import clean_log
from oncelog.records import build_batch, split_batches

TIMESTAMP = 1_700_000_000_000
MEMORY = 128 << 20  # Kafka's log.cleaner.dedupe.buffer.size


def config(segment_mb: int) -> LogConfig:
    return LogConfig(segment_bytes=segment_mb << 20, preallocate_ahead_bytes=0,
                     cleanup_policy=frozenset({"compact"}), min_cleanable_dirty_ratio=0.0)


def write(directory: Path, args: argparse.Namespace) -> int:
    rng = random.Random(1)
    log = PartitionLog(directory, config(args.segment_mb), 0)
    n = 0
    seqs: dict[int, int] = {}
    while log.size_bytes < args.mb << 20:
        records = []
        for _ in range(args.records):
            key = f"key-{rng.randrange(args.keys)}".encode()
            value = None if rng.random() < 0.02 else os.urandom(args.value_bytes // 2).hex()
            records.append((key, value.encode() if value else None, [], TIMESTAMP + n))
        pid = rng.randrange(1, 4) if rng.random() < 0.33 else -1
        seq = seqs.get(pid, 0)
        data = bytearray(build_batch(records, producer_id=pid, producer_epoch=0 if pid > 0 else -1,
                                     base_sequence=seq if pid > 0 else -1,
                                     is_transactional=pid > 0))
        log.append(data, split_batches(data), TIMESTAMP + n)
        if pid > 0:
            seqs[pid] = seq + len(records)
            log.append_marker(pid, 0, rng.random() < 0.75, 0, TIMESTAMP + n)
        n += 1
    log.roll(TIMESTAMP + n)
    log.close(TIMESTAMP + n)
    return n


def copy_segments(src: Path, dst: Path) -> int:
    """The reference: every .log file read in 4 MB chunks and written to a new file, fsynced."""
    dst.mkdir()
    total = 0
    for path in sorted(src.glob("*.log")):
        fin = os.open(path, os.O_RDONLY)
        fout = os.open(dst / path.name, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            while chunk := os.read(fin, 4 << 20):
                os.write(fout, chunk)
                total += len(chunk)
            os.fsync(fout)
        finally:
            os.close(fin)
            os.close(fout)
    return total


def clean(directory: Path, segment_mb: int) -> tuple[int, int]:
    log = PartitionLog(directory, config(segment_mb), 0)
    manager = CleanerManager()
    ltc = manager.log_to_clean("bench-0", log, TIMESTAMP)
    manager.state(log).in_progress = True
    result = clean_log(manager, ltc, TIMESTAMP, MEMORY)
    assert result is not None
    log.close(TIMESTAMP)
    return result.stats.bytes_read, result.stats.bytes_written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, default=64)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--records", type=int, default=10)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--segment-mb", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="oncelog-bench-cleaner-") as tmp:
        source = Path(tmp) / "source-0"
        batches = write(source, args)
        best_copy = best_clean = float("inf")
        read = written = 0
        for i in range(args.rounds):
            start = time.perf_counter()
            copied = copy_segments(source, Path(tmp) / f"copy-{i}")
            best_copy = min(best_copy, time.perf_counter() - start)
            shutil.rmtree(Path(tmp) / f"copy-{i}")
            work = Path(tmp) / f"clean-{i}"
            shutil.copytree(source, work)
            start = time.perf_counter()
            read, written = clean(work, args.segment_mb)
            best_clean = min(best_clean, time.perf_counter() - start)
            shutil.rmtree(work)
        tracemalloc.start()
        copy_segments(source, Path(tmp) / "copy-mem")
        copy_peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.reset_peak()
        shutil.copytree(source, Path(tmp) / "clean-mem")
        tracemalloc.reset_peak()
        clean(Path(tmp) / "clean-mem", args.segment_mb)
        clean_peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    mb = copied / (1 << 20)
    copy_rate = mb / best_copy
    clean_rate = read / (1 << 20) / best_clean
    print(f"{mb:.0f} MB, {batches} batches of {args.records} records over {args.keys} keys; "
          f"cleaned to {written / (1 << 20):.1f} MB")
    print(f"plain copy : {copy_rate:8.1f} MB/s   peak Python memory {copy_peak / 1e6:6.1f} MB")
    print(f"cleaner    : {clean_rate:8.1f} MB/s   peak Python memory {clean_peak / 1e6:6.1f} MB")
    print(f"cleaner / copy: {clean_rate / copy_rate:.3f} of the throughput, "
          f"{clean_peak / max(copy_peak, 1):.1f}x the memory", flush=True)


if __name__ == "__main__":
    main()
