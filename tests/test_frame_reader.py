"""The client's FrameReader (client/frame_reader.py): frames of any size, received in any
pieces, come out whole and in order; a size prefix out of bounds is refused."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.tiers import sample_and_sweep

from oncelog.client import frame_reader
from oncelog.client.frame_reader import SCRATCH_SIZE, FrameReader
from oncelog.protocol.framing import FrameSizeError


def feed(reader: FrameReader, stream: bytes, pieces: list[int]) -> list[bytes]:
    """``stream`` given to the reader as a socket would: at most ``pieces[i]`` bytes a read,
    never more than the buffer it offers."""
    out: list[bytes] = []
    pos = i = 0
    while pos < len(stream):
        buffer = reader.buffer()
        assert len(buffer) > 0
        n = min(len(buffer), len(stream) - pos, pieces[i % len(pieces)])
        i += 1
        buffer[:n] = stream[pos : pos + n]
        pos += n
        for frame in reader.received(n):
            assert isinstance(frame, (bytes, memoryview))
            if isinstance(frame, memoryview):
                assert frame.readonly  # kio's readers take read-only buffers only
            out.append(bytes(frame))
    return out


sizes = st.one_of(st.integers(4, 300), st.integers(SCRATCH_SIZE - 10, SCRATCH_SIZE + 10),
                  st.integers(3 * SCRATCH_SIZE, 5 * SCRATCH_SIZE))


@pytest.mark.parametrize("examples", sample_and_sweep(15, 60))
def test_frames_come_out_whole_in_order(examples):
    """The sweep: 60 streams; the unit tier's sample: 15, others each run."""

    @settings(max_examples=examples, deadline=None)
    @given(st.lists(sizes, min_size=1, max_size=8),
           st.lists(st.one_of(st.integers(1, 10), st.integers(1000, 200_000)), min_size=1,
                    max_size=5),
           st.booleans())
    def check(frame_sizes, pieces, gathered):
        frames = [bytes([i % 251]) * size for i, size in enumerate(frame_sizes)]
        stream = b"".join(struct.pack(">i", len(f)) + f for f in frames)
        reader = FrameReader()
        if gathered:  # frames past MAX_RESERVED are gathered in pieces and joined
            old = frame_reader.MAX_RESERVED
            frame_reader.MAX_RESERVED = SCRATCH_SIZE * 2
            try:
                assert feed(reader, stream, pieces) == frames
            finally:
                frame_reader.MAX_RESERVED = old
        else:
            assert feed(reader, stream, pieces) == frames

    check()


@pytest.mark.parametrize("size", [-1, 0, 3, 1001])
def test_a_size_out_of_bounds_is_refused(size):
    reader = FrameReader(max_frame_size=1000)
    with pytest.raises(FrameSizeError):
        feed(reader, struct.pack(">i", size) + b"x" * 10, [100])


def test_clear_forgets_a_partial_frame():
    reader = FrameReader()
    feed(reader, struct.pack(">i", 3 * SCRATCH_SIZE) + b"x" * 100, [100_000])
    reader.clear()
    assert feed(reader, struct.pack(">i", 5) + b"hello", [3]) == [b"hello"]
