"""Page-cache preallocation for busy segments, on a thread of its own.

On the machines oncelog runs on here, the first write to a page of the page cache costs far
more than writing into one that exists (the hypervisor backs guest memory lazily): a 1 MiB
append to fresh pages takes milliseconds, an overwrite tenths of one. So, like Kafka's
``log.preallocate`` (which sizes new segments up front), a busy segment's file is extended
with zeros ahead of its write position, off the request path; appends then overwrite pages
that already exist. The zeros are never part of the log: reads stop at the segment's logical
size, a rolled or closed segment is trimmed, and crash recovery cuts a zero tail like any torn
one.

Off by default (``log.preallocate.ahead.bytes=0``, like Kafka's ``log.preallocate=false``):
measured against librdkafka on two cores (docs/performance.md), the broker spent twice the
system CPU per megabyte with it, and that CPU was the client's.
"""

from __future__ import annotations

import queue
import threading

from .segment import LogSegment


class Preallocator:
    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[tuple[LogSegment, int] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="oncelog-preallocator",
                                        daemon=True)
        self._thread.start()

    def request(self, segment: LogSegment, target: int) -> None:
        if segment.prealloc_pending:
            return
        segment.prealloc_pending = True
        self._queue.put((segment, target))

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            segment, target = item
            segment.preallocate_to(target)

    def stop(self) -> None:
        self._queue.put(None)
        self._thread.join()
