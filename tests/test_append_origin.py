"""The one append entry by data and origin (server/replication.py ``append_records``, the
coordinators' ``PartitionWriter`` in server/coordinator_runtime.py, the markers of
server/txn_marker_writer.py through the WriteTxnMarkers handler) on real logs, with the
cluster view handed in as the ZooKeeper watch hands it and no broker started: what each origin
may write, min.insync.replicas before a coordinator's write or a marker, and the pending
transactional offsets a marker completes only once the ISR has it."""

from __future__ import annotations

import asyncio
import uuid
from types import SimpleNamespace

from kio.schema.errors import ErrorCode
from support.replica_views import HeldStore

from oncelog.cluster.model import BrokerInfo, ClusterView, LeaderAndIsr, TopicAssignment
from oncelog.records import build_batch
from oncelog.records.batch import CONTROL_COMMIT, build_control_batch
from oncelog.server.clock import now_ms
from oncelog.server.config import BrokerConfig
from oncelog.server.coordinator_runtime import ReplicaPartitionWriter
from oncelog.server.handlers.txn_markers import handle_write_txn_markers
from oncelog.server.replication import AppendEntry, AppendError, AppendOrigin, ReplicaManager
from oncelog.server.topics import CONSUMER_OFFSETS, TopicManager
from oncelog.server.txn_marker_writer import TxnMarkerWriter


def leader(tmp_path, topic: str, isr: tuple[int, ...], min_isr: int = 1,
           group_coordinator=None) -> tuple[ReplicaManager, SimpleNamespace]:
    """A replica manager of broker 1, leader of ``topic``-0 (replicas 1, 2, 3) with ``isr``."""
    config = BrokerConfig({"node.id": "1"})
    rm = ReplicaManager(1, config, TopicManager(tmp_path, config, now_ms()), HeldStore())
    broker = SimpleNamespace(replication=rm, txn_markers=TxnMarkerWriter(rm, group_coordinator),
                             allowed=lambda *_a: True)
    brokers = {n: BrokerInfo(n, "127.0.0.1", 9090 + n) for n in (1, 2, 3)}
    topics = {topic: TopicAssignment(topic, uuid.UUID(int=7), {0: (1, 2, 3)},
                                     {"min.insync.replicas": str(min_isr)})}
    rm.apply(ClusterView(seq=0, brokers=brokers, topics=topics,
                         states={(topic, 0): (LeaderAndIsr(1, 0, isr, 1), 0)},
                         controller_id=1))
    return rm, broker


def data(n: int = 2, **kw) -> bytearray:
    return bytearray(build_batch([(b"k%d" % i, b"v", [], 0) for i in range(n)], **kw))


def marker(producer_id: int, commit: bool = True) -> bytearray:
    return bytearray(build_control_batch(CONTROL_COMMIT if commit else 0,
                                         producer_id=producer_id, producer_epoch=0,
                                         coordinator_epoch=0, timestamp=0))


def test_a_client_may_not_append_a_control_batch_a_marker_is_one(tmp_path):
    async def main() -> None:
        rm, _ = leader(tmp_path, "t", isr=(1,))
        tp = ("t", 0)
        for origin in (AppendOrigin.CLIENT, AppendOrigin.COORDINATOR):
            out = await rm.append_records({tp: AppendEntry(marker(5))}, origin=origin,
                                          required_acks=1, timeout_ms=1000)
            assert isinstance(out[tp], AppendError) and out[tp].error_name == ErrorCode.invalid_record
        # ... and a marker is a control batch, nothing else.
        out = await rm.append_records({tp: AppendEntry(data())}, origin=AppendOrigin.MARKER,
                                      required_acks=1, timeout_ms=1000)
        assert isinstance(out[tp], AppendError) and out[tp].error_name == ErrorCode.invalid_record
        plog = rm.leader_replica(*tp).log
        assert plog.log_end_offset == 0
        out = await rm.append_records({tp: AppendEntry(marker(5))},
                                      origin=AppendOrigin.MARKER, required_acks=1,
                                      timeout_ms=1000)
        assert not isinstance(out[tp], AppendError) and plog.log_end_offset == 1
        rm.close()

    asyncio.run(main())


def test_coordinator_writes_and_markers_are_refused_below_min_insync_replicas(tmp_path):
    async def main() -> None:
        rm, _ = leader(tmp_path, CONSUMER_OFFSETS, isr=(1,), min_isr=2)
        writer = ReplicaPartitionWriter(rm, CONSUMER_OFFSETS, timeout_ms=1000)
        plog = rm.leader_replica(CONSUMER_OFFSETS, 0).log
        try:
            writer.append_unreplicated(0, data())
        except AppendError as exc:
            assert exc.error_name == ErrorCode.not_enough_replicas
        else:
            raise AssertionError("appended below min.insync.replicas")
        assert plog.log_end_offset == 0  # refused before the log was written
        # A transaction's marker too (Kafka's WriteTxnMarkers appends with acks=all, and the
        # leader checks min.insync.replicas whatever the origin): its coordinator sends it again.
        tp = (CONSUMER_OFFSETS, 0)
        out = await rm.append_records({tp: AppendEntry(marker(9))}, origin=AppendOrigin.MARKER,
                                      required_acks=-1, timeout_ms=1000)
        assert isinstance(out[tp], AppendError)
        assert out[tp].error_name == ErrorCode.not_enough_replicas
        assert plog.log_end_offset == 0
        rm.close()

    asyncio.run(main())


class Offsets:
    """The group coordinator's side a marker reaches: which producers' pending offsets were
    completed, and at what log end offset of the partition."""

    def __init__(self) -> None:
        self.completed: list[tuple[int, int, bool]] = []

    def complete_txn_offsets(self, index: int, producer_id: int, commit: bool) -> None:
        self.completed.append((index, producer_id, commit))


def test_pending_transactional_offsets_complete_once_the_isr_has_the_marker(tmp_path):
    async def main() -> None:
        offsets = Offsets()
        rm, broker = leader(tmp_path, CONSUMER_OFFSETS, isr=(1, 2, 3),
                            group_coordinator=offsets)
        r = rm.leader_replica(CONSUMER_OFFSETS, 0)
        # The producer's transactional offset commit, on the partition (replicated).
        writer = ReplicaPartitionWriter(rm, CONSUMER_OFFSETS, timeout_ms=5000)
        writer.append_unreplicated(0, data(producer_id=7, producer_epoch=0,
                                           is_transactional=True))
        committed = r.log.log_end_offset
        for f in (2, 3):
            rm.follower_fetched(r, f, committed)
        request = SimpleNamespace(markers=[SimpleNamespace(
            producer_id=7, producer_epoch=0, transaction_result=True, coordinator_epoch=0,
            transaction_version=0,
            topics=[SimpleNamespace(name=CONSUMER_OFFSETS, partition_indexes=[0])])])
        answer = asyncio.ensure_future(
            handle_write_txn_markers(broker, SimpleNamespace(version=1), request))
        await asyncio.sleep(0.05)
        end = r.log.log_end_offset
        # The marker is in the leader's log ...
        assert end == committed + 1 and r.log.high_watermark == committed
        assert not answer.done() and offsets.completed == []  # ... the offsets still pending
        rm.follower_fetched(r, 2, end)
        await asyncio.sleep(0.05)
        assert offsets.completed == []
        rm.follower_fetched(r, 3, end)  # the ISR has the marker
        response = await asyncio.wait_for(answer, 5)
        assert response.markers[0].topics[0].partitions[0].error_code == 0
        assert offsets.completed == [(0, 7, True)]
        rm.close()

    asyncio.run(main())
