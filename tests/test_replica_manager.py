"""The leader's side of the replica manager (server/replication.py) on real logs, with the
cluster view handed in as the ZooKeeper watch hands it, and a ZooKeeper store whose conditional
write of the partition state can be held (the moment that cannot be arranged with a real one):
the high watermark while an ISR change is being written."""

from __future__ import annotations

import asyncio

from support.replica_views import TOPIC, HeldStore, append, view

from oncelog.server.clock import now_ms
from oncelog.server.config import BrokerConfig
from oncelog.server.replication import ReplicaManager
from oncelog.server.topics import TopicManager


def test_the_high_watermark_counts_a_replica_while_it_is_being_added_to_the_isr(tmp_path):
    async def main() -> None:
        config = BrokerConfig({"node.id": "1"})
        store = HeldStore()
        rm = ReplicaManager(1, config, TopicManager(tmp_path, config, now_ms()), store)
        rm.apply(view(isr=(1, 2)))  # broker 1 leads, 3 is out of the ISR
        r = rm.leader_replica(TOPIC, 0)
        end = append(r, 10)
        rm.appended(r)
        rm.follower_fetched(r, 2, end)
        assert r.log.high_watermark == end
        # 3 reaches the high watermark: it is being added (the ZooKeeper write is held) ...
        rm.follower_fetched(r, 3, end)
        await asyncio.sleep(0.05)
        assert store.written and store.written[-1].isr == (1, 2, 3)
        # ... and a write it does not have yet is not acknowledged meanwhile: once the new ISR
        # is in ZooKeeper the controller may elect 3, which must hold everything acknowledged.
        later = append(r, 5)
        rm.appended(r)
        rm.follower_fetched(r, 2, later)
        assert r.log.high_watermark == end
        waiting = asyncio.ensure_future(rm.wait_replicated(r, later, 5000))
        await asyncio.sleep(0.05)
        assert not waiting.done()
        store.release.set()
        await asyncio.sleep(0.2)
        assert r.isr == (1, 2, 3) and not waiting.done()
        rm.follower_fetched(r, 3, later)  # 3 has it: acknowledged
        assert await asyncio.wait_for(waiting, 5) is None
        assert r.log.high_watermark == later
        rm.close()

    asyncio.run(main())
