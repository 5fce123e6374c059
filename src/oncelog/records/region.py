"""Record bytes that stay in a segment file until they are sent.

A Fetch response's record sets are not read into memory whole: the broker hands the network a
``FileRegion`` (its own duplicate of the segment's descriptor, a position and a length), and
the network writes it in chunks as the client drains them. Memory per connection is then a
chunk, whatever the response's size and however slowly its reader reads (a dozen slow readers
held 55 MB each). The duplicate descriptor keeps the bytes readable even if retention deletes
the segment meanwhile.
"""

from __future__ import annotations

import os


class FileRegion:
    __slots__ = ("fd", "length", "position")

    def __init__(self, fd: int, position: int, length: int) -> None:
        self.fd = os.dup(fd)
        self.position = position
        self.length = length

    def __len__(self) -> int:
        return self.length

    def chunks(self, size: int):
        """The region's bytes, ``size`` at a time; OSError if the file no longer holds them."""
        done = 0
        while done < self.length:
            chunk = os.pread(self.fd, min(size, self.length - done), self.position + done)
            if not chunk:
                raise OSError(f"segment shorter than the region ({done} of {self.length})")
            done += len(chunk)
            yield chunk

    def read(self) -> bytes:
        return b"".join(self.chunks(1 << 22))

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __del__(self) -> None:  # a region dropped unsent (a response never written)
        self.close()
