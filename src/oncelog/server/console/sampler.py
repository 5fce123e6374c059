"""The high watermark and last stable offset of each partition over the last minutes.

A read_committed consumer stops at the last stable offset (spec 000, "Last Stable Offset
Tracking"): a transaction left open holds it while the high watermark climbs. One reading of
both offsets is no proof of that (a transaction in flight holds the LSO for a moment too); their
history is. The sampler reads them on the broker's loop every ``interval_s`` and keeps, per
partition, a bounded ring of ``(time, HW, LSO)``. A reading equal to the previous one is not
stored (an idle partition costs one ring entry, not one a second); the chart extends the last
point to the time of the last reading.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from dataclasses import dataclass, field

log = logging.getLogger("oncelog.console")

INTERVAL_S = 1.0
WINDOW_S = 300.0  # what the charts show: the last five minutes
MAX_POINTS = 600  # per partition: two per second over the window at most

TP = tuple[str, int]


@dataclass
class History:
    points: deque[tuple[float, int, int]] = field(
        default_factory=lambda: deque(maxlen=MAX_POINTS))
    last_seen: float = 0.0  # when the latest reading was taken (equal readings are not kept)


class OffsetSampler:
    def __init__(self, broker, interval_s: float = INTERVAL_S, window_s: float = WINDOW_S,
                 clock=time.time) -> None:
        self.broker = broker
        self.interval_s = interval_s
        self.window_s = window_s
        self.clock = clock
        self.histories: dict[TP, History] = {}
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self.sample()
        self._task = asyncio.get_running_loop().create_task(self._run())

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                self.sample()
            except Exception:  # a bug here must not stop the charts for good
                log.exception("sampling the partitions' offsets failed")

    def sample(self) -> None:
        """One reading of every hosted partition's HW and LSO (internal topics left out: their
        offsets say nothing to an operator)."""
        now = self.clock()
        horizon = now - self.window_s
        seen = set()
        for p in self.broker.topics.all_partitions():
            if p.topic.startswith("__"):
                continue
            tp = (p.topic, p.index)
            seen.add(tp)
            h = self.histories.get(tp)
            if h is None:
                h = self.histories[tp] = History()
            plog = p.log
            hw, lso = plog.high_watermark, plog.last_stable_offset
            pts = h.points
            if not pts or pts[-1][1:] != (hw, lso):
                if pts and h.last_seen > pts[-1][0]:
                    # the end of a flat stretch, so the line steps where the change happened
                    pts.append((h.last_seen, *pts[-1][1:]))
                pts.append((now, hw, lso))
            h.last_seen = now
            while len(pts) > 1 and pts[1][0] < horizon:
                pts.popleft()  # the one before the window stays: where the line enters it
        for tp in [tp for tp in self.histories if tp not in seen]:
            del self.histories[tp]  # deleted, or no longer hosted here

    def history(self, topic: str, partition: int) -> tuple[list[tuple[float, int, int]], float]:
        """The readings in the window (and the one just before it) and the last reading's
        time."""
        h = self.histories.get((topic, partition))
        if h is None:
            return [], 0.0
        return list(h.points), h.last_seen
