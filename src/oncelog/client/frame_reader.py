"""Size-prefixed frames read from a socket with ``recv_into``, a large frame straight into a
buffer of its own size (sans IO: the caller owns the socket).

protocol/framing.py's Framing takes the bytes a ``recv`` returned and copies each frame out of
them once (a join of the chunks). For a client that copy is the whole of a Fetch response: a
consumer reading 100 MB copies 100 MB more. Here a frame larger than the scratch buffer is
received in place: its first bytes are moved out of the scratch buffer (at most its size),
the rest lands where the frame lives, and the frame is handed over as a read-only memoryview
of it (kio's readers take read-only buffers; a Fetch response's record sets stay views of it).
Small frames (produce answers, metadata) are sliced out of the scratch buffer, a copy of their
own size, as before.

    reader = FrameReader()
    n = sock.recv_into(reader.buffer())
    for frame in reader.received(n): ...    # each frame without its size prefix
"""

from __future__ import annotations

import struct
from typing import Final

from ..protocol.framing import FrameSizeError

_SIZE = struct.Struct(">i")
SCRATCH_SIZE: Final = 1 << 16
# A larger size prefix does not reserve its whole frame up front (a lying one would allocate
# that much at once): its bytes are gathered as they come and joined once, as Framing does.
MAX_RESERVED: Final = 1 << 26
MIN_FRAME: Final = 4  # a response is at least its correlation id


class FrameReader:
    __slots__ = ("_end", "_filled", "_frame", "_parts", "_parts_left", "_scratch", "_start",
                 "max_frame_size")

    def __init__(self, max_frame_size: int = 0x7FFFFFFF) -> None:
        self.max_frame_size = max_frame_size
        self._scratch = bytearray(SCRATCH_SIZE)
        self._start = 0  # unread bytes of the scratch buffer: [_start, _end)
        self._end = 0
        self._frame: bytearray | None = None  # a large frame being received in place
        self._filled = 0
        self._parts: list[bytes] | None = None  # ... or gathered (past MAX_RESERVED)
        self._parts_left = 0

    def clear(self) -> None:
        """Forget a partial frame (the connection closed)."""
        self._start = self._end = 0
        self._frame = None
        self._parts = None

    def buffer(self) -> memoryview:
        """Where the next received bytes go."""
        if self._frame is not None:
            return memoryview(self._frame)[self._filled:]
        if self._parts is not None:
            return memoryview(self._scratch)[: min(SCRATCH_SIZE, self._parts_left)]
        if self._start:  # keep the unread bytes (a partial small frame) at the front
            unread = self._end - self._start
            self._scratch[:unread] = self._scratch[self._start : self._end]
            self._start, self._end = 0, unread
        return memoryview(self._scratch)[self._end :]

    def received(self, n: int) -> list[bytes | memoryview]:
        """The frames that the ``n`` bytes just put into ``buffer()`` completed. Raises
        FrameSizeError for a size prefix out of bounds (the connection is then done)."""
        if self._frame is not None:
            self._filled += n
            if self._filled < len(self._frame):
                return []
            frame, self._frame = self._frame, None
            return [memoryview(frame).toreadonly()]
        if self._parts is not None:
            self._parts.append(bytes(self._scratch[:n]))
            self._parts_left -= n
            if self._parts_left:
                return []
            parts, self._parts = self._parts, None
            return [b"".join(parts)]
        self._end += n
        frames: list[bytes | memoryview] = []
        scratch = self._scratch
        while self._end - self._start >= 4:
            (size,) = _SIZE.unpack_from(scratch, self._start)
            if size < MIN_FRAME or size > self.max_frame_size:
                raise FrameSizeError(size, MIN_FRAME, self.max_frame_size)
            body = self._start + 4
            if self._end - body >= size:
                frames.append(bytes(scratch[body : body + size]))
                self._start = body + size
                continue
            if 4 + size > SCRATCH_SIZE:  # will not fit: received where it will live
                have = self._end - body
                if size <= MAX_RESERVED:
                    self._frame = bytearray(size)
                    self._frame[:have] = memoryview(scratch)[body : self._end]
                    self._filled = have
                else:
                    self._parts = [bytes(scratch[body : self._end])]
                    self._parts_left = size - have
                self._start = self._end = 0
            break
        if self._start == self._end:
            self._start = self._end = 0
        return frames
