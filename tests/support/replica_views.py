"""A replica manager's cluster view as the ZooKeeper watch hands it (one topic, three brokers,
broker 1 leading), a metadata store whose conditional write of the partition state can be held,
and appends on the leader (tests/test_replica_manager.py, tests/test_replica_wakeups.py)."""

from __future__ import annotations

import asyncio
import uuid

from oncelog.cluster.model import BrokerInfo, ClusterView, LeaderAndIsr, TopicAssignment
from oncelog.records import build_batch, split_batches

TOPIC = "t"


class HeldStore:
    """The metadata's alter_partition (the state znode's conditional write in ZooKeeper),
    answered only once ``release`` is set."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.written: list[LeaderAndIsr] = []

    async def alter_partition(self, topic, partition, state, expected_version):
        self.written.append(state)
        await asyncio.wait_for(self.release.wait(), 10)
        return expected_version + 1


def view(isr: tuple[int, ...], version: int = 0) -> ClusterView:
    brokers = {n: BrokerInfo(n, "127.0.0.1", 9090 + n) for n in (1, 2, 3)}
    topics = {TOPIC: TopicAssignment(TOPIC, uuid.UUID(int=7), {0: (1, 2, 3)},
                                     {"min.insync.replicas": "1"})}
    return ClusterView(seq=version, brokers=brokers, topics=topics,
                       states={(TOPIC, 0): (LeaderAndIsr(1, 0, isr, 1), version)},
                       controller_id=1)


def append(replica, n: int) -> int:
    data = bytearray(build_batch([(None, b"v", [], 0)] * n))
    result = replica.log.append(data, split_batches(data), 0, leader_epoch=replica.leader_epoch)
    return result.last_offset + 1
