"""A full disk on one broker: its data directory on a tmpfs of its own (a small one, ``size_mb``),
filled by a file of zeros written until ENOSPC (``fill``) and freed by deleting that file
(``free``).

What the broker does with a full disk (tests/test_disk_errors.py, tests/test_faults_net.py):
a write that meets ENOSPC fails that request with KAFKA_STORAGE_ERROR naming the cause (a
Produce to a partition it leads, CreateTopics; FindCoordinator answers
COORDINATOR_NOT_AVAILABLE when an internal topic cannot be made) and leaves nothing half
written open; the broker keeps running, and once space is free again the same requests
succeed with no operator action. A follower whose fetched records cannot be appended falls
behind and leaves the ISR until it can. Kafka instead takes the log directory offline on an
IOException and stops the broker when its last log directory fails (an operator restarts it);
oncelog keeps the broker up. Should a broker still exit on a full disk, the nemesis's heal
starts it again (``NetCluster.heal_all`` starts every broker that is not running, as a
supervisor would), so a run needs no operator either way.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path

__all__ = ["DataDisk", "DiskError"]

FILLER = ".oncelog-fault-filler"


class DiskError(RuntimeError):
    pass


class DataDisk:
    """A tmpfs of ``size_mb`` MiB mounted on ``path`` (made if missing) by ``mount()``."""

    def __init__(self, path: str | os.PathLike[str], size_mb: int) -> None:
        self.path = Path(path)
        self.size_mb = size_mb
        self.mounted = False

    @property
    def filler(self) -> Path:
        return self.path / FILLER

    def mount(self) -> DataDisk:
        if self.mounted:
            return self
        self.path.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={self.size_mb}m",
                               "tmpfs", str(self.path)],
                              capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise DiskError(f"cannot mount a tmpfs on {self.path}: {done.stderr.strip()}")
        self.mounted = True
        return self

    def fill(self) -> int:
        """Write zeros until the disk is full; the bytes written."""
        written = 0
        fd = os.open(self.filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            for size in (1 << 20, 1 << 12, 1):  # big writes, then what still fits
                chunk = bytes(size)
                with contextlib.suppress(OSError):
                    while True:
                        n = os.write(fd, chunk)
                        if n <= 0:
                            break
                        written += n
        finally:
            os.close(fd)
        return written

    @property
    def full(self) -> bool:
        return self.filler.exists()

    def free(self) -> None:
        self.filler.unlink(missing_ok=True)

    def free_bytes(self) -> int:
        st = os.statvfs(self.path)
        return st.f_bavail * st.f_frsize

    def unmount(self) -> None:
        if self.mounted:
            subprocess.run(["umount", "-l", str(self.path)], capture_output=True, check=False)
            self.mounted = False
