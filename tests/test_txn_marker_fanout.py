"""Where the transaction coordinator (server/txn_service.py) sends a transaction's markers, with
no broker: built from its ports as server/broker.py builds it, it writes the markers of the
partitions this broker leads through the replica side's marker writer, in process, and sends
WriteTxnMarkers v2 to the other partitions' leaders; a partition that could not take its marker
yet is sent again, one whose topic is gone needs none."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from kio.schema.errors import ErrorCode

from oncelog.protocol import ApiKey, make, response_module
from oncelog.server.config import BrokerConfig
from oncelog.server.txn_service import TxnService
from oncelog.txn.coordinator import SendMarkers

NODE = 1
LEADERS = {("a", 0): 1, ("a", 1): 2, ("b", 0): 1}


class Metadata:
    def __init__(self) -> None:
        self.view = SimpleNamespace(topics={"a": None, "b": None})

    def leader_of(self, topic: str, index: int) -> int | None:
        return LEADERS.get((topic, index))

    def internal_partition_count(self, name: str) -> int | None:
        return 1

    def request_internal_topic(self, name: str) -> ErrorCode | None:
        return None


class Markers:
    """The marker writer: ``("b", 0)`` is refused once (NOT_ENOUGH_REPLICAS), then taken."""

    def __init__(self) -> None:
        self.calls: list[tuple[list, dict]] = []

    async def write(self, partitions, **marker) -> dict:
        self.calls.append((list(partitions), marker))
        refused = len(self.calls) == 1
        return {tp: ErrorCode.not_enough_replicas if tp == ("b", 0) and refused else None
                for tp in partitions}


class Client:
    def __init__(self) -> None:
        self.sent: list[tuple[int, object, str]] = []

    async def request(self, node_id: int, request, timeout_s: float = 30.0,
                      purpose: str = "control"):
        self.sent.append((node_id, request, purpose))
        mod = response_module(ApiKey.WRITE_TXN_MARKERS, 2)
        return make(mod.WriteTxnMarkersResponse, markers=tuple(
            make(mod.WritableTxnMarkerResult, producer_id=m.producer_id, topics=tuple(
                make(mod.WritableTxnMarkerTopicResult, name=t.name, partitions=tuple(
                    make(mod.WritableTxnMarkerPartitionResult, partition_index=p, error_code=0)
                    for p in t.partition_indexes))
                for t in m.topics))
            for m in request.markers))


def test_markers_of_partitions_led_here_go_to_the_marker_writer_the_others_over_the_wire():
    async def main() -> None:
        markers, client = Markers(), Client()
        service = TxnService(NODE, BrokerConfig({"node.id": str(NODE)}), writer=None,
                             leadership=SimpleNamespace(listeners=[]), partitions=None,
                             metadata=Metadata(), allocate_producer_id=lambda: 0,
                             markers=markers, client=client)
        gone = ("deleted", 0)  # its topic is not in the view: no marker owed
        await asyncio.wait_for(service._send_markers(SendMarkers(
            "tx", producer_id=7, producer_epoch=3, commit=True,
            partitions=frozenset({*LEADERS, gone}), coordinator_epoch=5,
            transaction_version=2)), 10)
        # here: both partitions at once, then again the one refused
        assert [sorted(p) for p, _ in markers.calls] == [[("a", 0), ("b", 0)], [("b", 0)]]
        assert markers.calls[0][1] == {"producer_id": 7, "producer_epoch": 3, "commit": True,
                                       "coordinator_epoch": 5, "transaction_version": 2}
        # broker 2: one request, taken at once
        [(node, request, purpose)] = client.sent
        assert (node, purpose) == (2, "markers")
        [m] = request.markers
        assert (m.producer_id, m.producer_epoch, m.transaction_result, m.coordinator_epoch,
                m.transaction_version) == (7, 3, True, 5, 2)
        assert [(t.name, tuple(t.partition_indexes)) for t in m.topics] == [("a", (1,))]

    asyncio.run(main())
