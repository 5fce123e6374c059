"""Producer-id blocks in ZooKeeper (Kafka's ZkProducerIdManager): ``/latest_producer_id_block``
holds the last block handed out, advanced with a conditional set, so that no two brokers ever
hand out the same producer id.

``ProducerIdBlocks`` is given the broker's ZooKeeper connection (cluster/zookeeper_client.py);
it blocks (ZooKeeper): call it from worker threads.
"""

from __future__ import annotations

import threading

from kazoo.exceptions import NodeExistsError, NoNodeError

from .errors import ClusterError
from .zk_data import ProducerIdBlockZNode
from .zookeeper_client import ZooKeeperClient

__all__ = ["MAX_PRODUCER_ID", "ProducerIdBlocks"]

MAX_PRODUCER_ID = 2**63 - 1


class ProducerIdBlocks:
    def __init__(self, zk: ZooKeeperClient) -> None:
        self.zk = zk
        self._lock = threading.Lock()

    def allocate(self, node_id: int, size: int = 1000) -> tuple[int, int]:
        """The next ``size`` producer ids for broker ``node_id``: (start, end inclusive), never
        handed to anybody else (a conditional set loop on ``/latest_producer_id_block``)."""
        if size <= 0:
            raise ValueError("size must be positive")
        path = ProducerIdBlockZNode.path()
        with self._lock:
            while True:
                try:
                    data, stat = self.zk.get(path)
                except NoNodeError:
                    try:
                        self.zk.create(path, b"")
                    except NodeExistsError:
                        pass
                    continue
                current = ProducerIdBlockZNode.decode(data)
                start = 0 if current is None else current[2] + 1
                end = start + size - 1
                if end > MAX_PRODUCER_ID:
                    raise ClusterError("producer ids are exhausted")
                version = self.zk.set_conditional(
                    path, ProducerIdBlockZNode.encode(node_id, start, end), int(stat.version))
                if version is not None:
                    return start, end
