"""One broker per data directory: an exclusive ``flock`` on ``<data dir>/.lock``, held for the
broker's life.

Kafka's LogManager locks every log directory the same way (``FileLock`` on ``.lock``,
``FileChannel.tryLock``) and refuses to start when another process holds it. Two brokers on one
directory would serve the same segments and overwrite each other's snapshots and checkpoints.
The lock belongs to the open file, so the kernel drops it when the holder exits, however it
exits (a SIGKILL included): a stale ``.lock`` file never blocks the next broker. The holder
writes its pid (and, once bound, its address) into the file so that the broker it refuses can
name it.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

LOCK_FILE = ".lock"


class DataDirInUseError(OSError):
    """Another broker (process or thread) holds the data directory's lock."""


class DataDirLock:
    """The data directory's lock, taken when constructed; ``release`` (or process exit) frees
    it. Raises DataDirInUseError, naming the holder, when another broker has it."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.path = data_dir / LOCK_FILE
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            # flock, not lockf: its lock belongs to the open file description, so a second
            # broker in the same process (an embedded one) is refused too.
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _describe_holder(os.pread(fd, 4096, 0))
            os.close(fd)
            raise DataDirInUseError(
                f"data directory {data_dir} is in use by another broker ({holder})") from None
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        self._lines = [f"pid={os.getpid()}"]
        self._write()

    def record_address(self, host: str, port: int) -> None:
        """Add the address the holder listens on, once it is bound."""
        self._lines = [self._lines[0], f"address={host}:{port}"]
        self._write()

    def _write(self) -> None:
        if self._fd < 0:
            return
        data = "".join(line + "\n" for line in self._lines).encode()
        try:
            os.ftruncate(self._fd, 0)
            os.pwrite(self._fd, data, 0)
        except OSError:
            pass  # the holder's name is a courtesy; the lock itself is what protects

    def release(self) -> None:
        if self._fd < 0:
            return
        fd, self._fd = self._fd, -1
        try:
            os.ftruncate(fd, 0)  # nobody holds it: nobody to name
        except OSError:
            pass
        os.close(fd)  # closing the only descriptor drops the flock


def _describe_holder(raw: bytes) -> str:
    fields = dict(line.partition("=")[::2] for line in raw.decode(errors="replace").splitlines())
    parts = [f"pid {fields['pid']}" if fields.get("pid") else "pid unknown"]
    if fields.get("address"):
        parts.append(f"listening on {fields['address']}")
    return ", ".join(parts)
