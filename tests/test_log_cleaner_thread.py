"""The background cleaner (log/log_cleaner.py's LogCleaner) against a log that an asyncio loop
keeps appending to: cleanings are planned and swapped on the loop, done on the cleaner's
thread, and what a consumer reads stays the latest value per key throughout."""

from __future__ import annotations

import asyncio
import random
import time

from support.compaction import latest_values, read_log
from support.logs import advance_high_watermark, open_log

from oncelog.log import LogConfig
from oncelog.log.log_cleaner import LogCleaner
from oncelog.records import build_batch, split_batches


def test_the_background_cleaner_cleans_while_the_loop_appends(tmp_path):
    cfg = LogConfig(segment_bytes=2000, cleanup_policy=frozenset({"compact"}),
                    min_cleanable_dirty_ratio=0.1, delete_retention_ms=0)
    plog = open_log(tmp_path / "t-0", cfg)
    rng = random.Random(11)
    model: dict[bytes, bytes] = {}
    t = 1_000_000

    async def run() -> LogCleaner:
        cleaner = LogCleaner(lambda: [("t-0", plog)], memory_bytes=1 << 20, backoff_ms=5,
                             clock=lambda: t)
        cleaner.start(asyncio.get_running_loop())
        try:
            deadline = time.monotonic() + 60
            i = 0
            while cleaner.cleanings < 5 or i < 3000:
                assert time.monotonic() < deadline, f"{cleaner.cleanings} cleanings"
                key = f"k{rng.randrange(50)}".encode()
                value = f"v{i}".encode() * 5
                data = bytearray(build_batch([(key, value, [], t)]))
                plog.append(data, split_batches(data), t)
                advance_high_watermark(plog)  # a single node's replica manager
                model[key] = value
                i += 1
                if i % 50 == 0:
                    assert latest_values(read_log(plog, committed=True)) == model
                    await asyncio.sleep(0.001)  # the cleaner's plans and swaps run here
        finally:
            cleaner.stop()
        return cleaner

    cleaner = asyncio.run(run())
    assert latest_values(read_log(plog, committed=True)) == model
    assert cleaner.stats.bytes_written < cleaner.stats.bytes_read
    assert not list((tmp_path / "t-0").glob("*.cleaned"))
    assert len(read_log(plog, committed=False)) < 3000
