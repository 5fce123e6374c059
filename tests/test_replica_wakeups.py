"""Who a leader's append and a moved high watermark wake (server/replication.py, the long polls
of server/handlers/fetch.py): a follower reads to the log end, so appends wake its fetch and a
moved high watermark does not; a consumer reads to the high watermark, so it wakes when that
moves (once the ISR has an acks=all write) and not for an append the ISR does not have yet; with
a lone ISR (a single node) that is every append. And acks=all through ``append_records``:
answered when the ISR has the batch, timed out when it never does."""

from __future__ import annotations

import asyncio

from kio.schema.errors import ErrorCode
from support.replica_views import TOPIC, HeldStore, append, view

from oncelog.records import build_batch
from oncelog.server.clock import now_ms
from oncelog.server.config import BrokerConfig
from oncelog.server.replication import AppendEntry, AppendError, AppendOrigin, ReplicaManager
from oncelog.server.topics import TopicManager


def leader(tmp_path, isr=(1, 2, 3)) -> tuple[ReplicaManager, object]:
    config = BrokerConfig({"node.id": "1"})
    rm = ReplicaManager(1, config, TopicManager(tmp_path, config, now_ms()), HeldStore())
    rm.apply(view(isr=isr))
    return rm, rm.leader_replica(TOPIC, 0)


def long_polls(r):
    loop = asyncio.get_running_loop()
    consumer, follower = loop.create_future(), loop.create_future()
    r.partition.waiters.add(consumer)
    r.partition.replica_waiters.add(follower)
    return consumer, follower


def test_an_append_wakes_followers_and_the_high_watermark_wakes_consumers(tmp_path):
    async def main() -> None:
        rm, r = leader(tmp_path)
        consumer, follower = long_polls(r)
        end = append(r, 10)
        rm.appended(r)
        assert follower.done()
        assert not consumer.done()  # nothing new below the high watermark
        _, follower = long_polls(r)
        rm.follower_fetched(r, 2, end)
        assert not consumer.done() and not follower.done()  # 3 does not have it yet
        rm.follower_fetched(r, 3, end)  # the ISR has it: the high watermark moves
        assert r.log.high_watermark == end
        assert consumer.done()
        assert not follower.done()  # nothing past its fetch offset
        rm.close()

    asyncio.run(main())


def test_with_a_lone_isr_an_append_wakes_both(tmp_path):
    async def main() -> None:
        rm, r = leader(tmp_path, isr=(1,))
        consumer, follower = long_polls(r)  # the follower: one out of the ISR, catching up
        end = append(r, 3)
        rm.appended(r)
        assert r.log.high_watermark == end
        assert consumer.done() and follower.done()
        rm.close()

    asyncio.run(main())


def write(data: bytes) -> AppendEntry:
    return AppendEntry(bytearray(data))


def test_acks_all_is_answered_when_the_isr_has_the_batch_and_times_out_otherwise(tmp_path):
    async def main() -> None:
        rm, r = leader(tmp_path)
        batch = build_batch([(None, b"v", [], 0)] * 4)
        pending = asyncio.ensure_future(rm.append_records({(TOPIC, 0): write(batch)},
                                                          origin=AppendOrigin.CLIENT,
                                                          required_acks=-1, timeout_ms=5000))
        await asyncio.sleep(0.05)
        assert not pending.done()
        end = r.log.log_end_offset
        rm.follower_fetched(r, 2, end)
        await asyncio.sleep(0.05)
        assert not pending.done()
        rm.follower_fetched(r, 3, end)
        result = (await asyncio.wait_for(pending, 5))[(TOPIC, 0)]
        assert result.last_offset + 1 == end
        assert not r.waiters
        # Never replicated: answered REQUEST_TIMED_OUT after the timeout, its waiter gone.
        result = (await rm.append_records({(TOPIC, 0): write(batch)}, origin=AppendOrigin.CLIENT,
                                          required_acks=-1,
                                          timeout_ms=100))[(TOPIC, 0)]
        assert isinstance(result, AppendError) and result.error_name == ErrorCode.request_timed_out
        assert not r.waiters
        rm.close()

    asyncio.run(main())
