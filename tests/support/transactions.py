"""Reading what is committed, as a read_committed consumer of ours sees it."""

from __future__ import annotations

import time

from oncelog import Consumer, TopicPartition


def read_committed(bootstrap: str, topic: str, partitions: int = 2,
                   timeout: float = 30.0) -> list[bytes]:
    """The values of every committed record of ``topic`` (to each partition's last stable
    offset), partition by partition as polled; AssertionError after ``timeout`` seconds."""
    with Consumer(bootstrap_servers=bootstrap, isolation_level="read_committed") as c:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        c.assign(tps)
        c.seek_to_beginning(*tps)
        ends = c.end_offsets(tps)
        out: list[bytes] = []
        deadline = time.monotonic() + timeout
        while any(c.position(tp) < ends[tp] for tp in tps):
            assert time.monotonic() < deadline, (out, ends)
            out.extend(r.value for r in c.poll(timeout=0.5))
        return out
