"""Producer id allocation: unique ids, never handed out twice, across restarts.

Ids are taken from blocks; the end of the current block is written (and fsynced) to
``<data-dir>/producer-id-block`` before any id of that block is handed out. After a crash the
broker starts from the recorded end, skipping whatever was left of the block: ids may be
wasted, never reused.
"""

from __future__ import annotations

import os
from pathlib import Path

BLOCK_SIZE = 1000
FILE_NAME = "producer-id-block"


class ProducerIdManager:
    def __init__(self, data_dir: Path, block_size: int = BLOCK_SIZE) -> None:
        self.path = Path(data_dir) / FILE_NAME
        self.block_size = block_size
        self.next_id = self._read_block_end()
        self.block_end = self.next_id  # nothing of a block is ours until it is recorded

    def _read_block_end(self) -> int:
        try:
            text = self.path.read_text().strip()
        except FileNotFoundError:
            return 0
        try:
            value = int(text)
        except ValueError:
            raise RuntimeError(f"{self.path} is damaged ({text!r}); refusing to reuse ids") from None
        if value < 0:
            raise RuntimeError(f"{self.path} holds a negative block end {value}")
        return value

    def _reserve_block(self) -> None:
        end = self.next_id + self.block_size
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "w") as f:
            f.write(str(end))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        dir_fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        self.block_end = end

    def next_producer_id(self) -> int:
        if self.next_id >= self.block_end:
            self._reserve_block()
        pid = self.next_id
        self.next_id += 1
        return pid


class ClusterProducerIds:
    """Cluster mode: blocks of ids reserved in ZooKeeper (``/latest_producer_id_block``, spec
    000's suggestion), so that no two brokers ever hand out the same id. A block is taken when
    the last one is used up; ids left in a block when the broker stops are never used."""

    def __init__(self, broker, block_size: int = BLOCK_SIZE) -> None:
        self.broker = broker
        self.block_size = block_size
        self.next_id = 0
        self.block_end = 0  # exclusive

    def next_producer_id(self) -> int:
        if self.next_id >= self.block_end:
            store = self.broker.cluster.store
            start, end = store.allocate_producer_id_block(self.broker.node_id, self.block_size)
            self.next_id, self.block_end = start, end + 1
        pid = self.next_id
        self.next_id += 1
        return pid
