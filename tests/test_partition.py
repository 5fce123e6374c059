"""Kafka's Partition (server/partition.py) on its own, no replica manager and no broker: a
real log hosted as the broker hosts one, the metadata's conditional write of the ISR a double.
The ISR shrinks when a follower stops catching up, and the high watermark counts a member being
removed until the write is confirmed; losing leadership answers the acks=all waiters."""

from __future__ import annotations

import asyncio
import uuid

from kio.schema.errors import ErrorCode

from oncelog.cluster.model import LeaderAndIsr
from oncelog.records import build_batch, split_batches
from oncelog.server.clock import now_ms
from oncelog.server.config import BrokerConfig
from oncelog.server.partition import Partition
from oncelog.server.topics import TopicManager


class Alter:
    """The metadata's alter_partition: records each write, answered once ``release`` is set."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.written: list[LeaderAndIsr] = []

    async def __call__(self, topic, index, state, expected):
        self.written.append(state)
        await asyncio.wait_for(self.release.wait(), 5)
        return expected + 1


def leader(tmp_path, alter: Alter, isr=(1, 2, 3)) -> Partition:
    config = BrokerConfig({"node.id": "1"})
    topics = TopicManager(tmp_path, config, now_ms())
    local = topics.host("t", uuid.UUID(int=7), 1, {}, {0}, now_ms()).partitions[0]
    loop = asyncio.get_running_loop()
    p = Partition(local, (1, 2, 3), 1, alter_partition=alter,
                  spawn=lambda coro: loop.create_task(coro))
    p.make_leader(LeaderAndIsr(1, 4, isr, 1), 0, now_ms() - 10_000)  # 10 s ago
    return p


def append(p: Partition, n: int) -> int:
    data = bytearray(build_batch([(None, b"v", [], 0)] * n))
    result = p.log.append(data, split_batches(data), 0, leader_epoch=p.leader_epoch)
    p.appended()
    return result.last_offset + 1


def test_a_follower_that_stops_catching_up_leaves_the_isr(tmp_path):
    async def main() -> None:
        alter = Alter()
        p = leader(tmp_path, alter)
        end = append(p, 5)
        p.update_follower_fetch_state(2, end, 0, live={1, 2, 3})
        assert p.log.high_watermark == 0  # 3 has nothing yet
        # 2 keeps fetching, 3 does not: past the lag 3 is taken out of the ISR.
        p.maybe_shrink_isr(now_ms(), 5_000)
        await asyncio.sleep(0)
        assert [s.isr for s in alter.written] == [(1, 2)]
        # Until ZooKeeper has the new ISR the leaving member still counts (maximal ISR).
        assert p.isr == (1, 2, 3) and p.log.high_watermark == 0
        alter.release.set()
        await asyncio.sleep(0.05)
        assert p.isr == (1, 2) and p.zk_version == 1
        assert p.log.high_watermark == end  # what 1 and 2 have
    asyncio.run(main())


def test_losing_leadership_answers_the_acks_all_waiters(tmp_path):
    async def main() -> None:
        p = leader(tmp_path, Alter())
        end = append(p, 2)
        waiting = asyncio.ensure_future(p.wait_replicated(end, 5_000))
        await asyncio.sleep(0)
        assert not waiting.done() and p.waiters
        p.make_follower(LeaderAndIsr(2, 5, (2, 3), 1))
        assert await asyncio.wait_for(waiting, 5) == ErrorCode.not_leader_or_follower
        assert not p.waiters and not p.is_leader and p.needs_truncation
    asyncio.run(main())
