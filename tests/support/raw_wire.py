"""A bare Kafka wire connection for tests that must send exactly the bytes they mean to.

No client library in the way: requests are kio entities framed by oncelog.protocol, or raw bytes
(for the malformed-input tests). Every read has a deadline; nothing here sleeps.

    with RawConnection(broker.bootstrap_servers) as conn:
        response = conn.request(make(request_module(ApiKey.METADATA, 12).MetadataRequest, ...))
"""

from __future__ import annotations

import dataclasses
import itertools
import socket
import struct
import time
from typing import Self

from oncelog.protocol import (
    ApiKey,
    decode_response,
    encode_request,
    make,
    request_module,
)
from oncelog.records import build_batch, decode_batch, iter_batches

_SIZE = struct.Struct(">i")
ACKS_ALL = -1


class RawConnection:
    def __init__(self, bootstrap: str, timeout: float = 10.0, client_id: str = "raw-wire") -> None:
        host, port = bootstrap.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.timeout = timeout
        self.client_id = client_id
        self._correlation = itertools.count(1)

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- raw bytes ----------------------------------------------------------------------------

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _recv_exactly(self, n: int) -> bytes | None:
        out = bytearray()
        deadline = time.monotonic() + self.timeout
        while len(out) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no complete frame within {self.timeout}s")
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(n - len(out))
            except ConnectionResetError:
                return None
            if not chunk:
                return None
            out += chunk
        return bytes(out)

    def read_frame(self) -> bytes | None:
        """One response frame (size prefix stripped), or None if the broker hung up."""
        head = self._recv_exactly(4)
        if head is None:
            return None
        (size,) = _SIZE.unpack(head)
        body = self._recv_exactly(size)
        if body is None:
            raise ConnectionError("broker hung up in the middle of a response")
        return body

    def closed_by_broker(self) -> bool:
        """True once the broker closes the connection (EOF or reset) within the timeout;
        False if it sends a frame instead."""
        return self.read_frame() is None

    # -- requests -----------------------------------------------------------------------------

    def next_correlation_id(self) -> int:
        return next(self._correlation)

    def request(self, request, correlation_id: int | None = None):
        """Send one kio request and return the decoded response (raises if the broker hung up)."""
        cid = self.next_correlation_id() if correlation_id is None else correlation_id
        self.send(encode_request(cid, self.client_id, request))
        frame = self.read_frame()
        if frame is None:
            raise ConnectionError(f"broker closed the connection instead of answering "
                                  f"{type(request).__name__}")
        got, response = decode_response(type(request).__api_key__, type(request).__version__,
                                        frame)
        assert got == cid, f"correlation id {got}, expected {cid}"
        return response


# -- request builders (the versions librdkafka uses today) ------------------------------------


def metadata_request(topics: list[str] | None, version: int = 12,
                     allow_auto_topic_creation: bool = False):
    mod = request_module(ApiKey.METADATA, version)
    return make(mod.MetadataRequest,
                topics=None if topics is None else tuple(
                    make(mod.MetadataRequestTopic, name=t, topic_id=None) for t in topics),
                allow_auto_topic_creation=allow_auto_topic_creation,
                include_cluster_authorized_operations=False,
                include_topic_authorized_operations=False)


def create_topics_request(name: str, partitions: int = 1, configs: dict[str, str] | None = None,
                          version: int = 7):
    mod = request_module(ApiKey.CREATE_TOPICS, version)
    topic = make(mod.CreatableTopic, name=name, num_partitions=partitions, replication_factor=1,
                 assignments=(), configs=tuple(make(mod.CreatableTopicConfig, name=k, value=v)
                                               for k, v in (configs or {}).items()))
    return make(mod.CreateTopicsRequest, topics=(topic,), timeout=30_000, validate_only=False)


def init_producer_id_request(version: int = 4):
    mod = request_module(ApiKey.INIT_PRODUCER_ID, version)
    return make(mod.InitProducerIdRequest, transactional_id=None, transaction_timeout=60_000,
                producer_id=-1, producer_epoch=-1)


def produce_request(topic: str, partition: int, records: bytes, acks: int = ACKS_ALL,
                    version: int = 9):
    mod = request_module(ApiKey.PRODUCE, version)
    pd = make(mod.PartitionProduceData, index=partition, records=records)
    td = make(mod.TopicProduceData, name=topic, partition_data=(pd,))
    return make(mod.ProduceRequest, transactional_id=None, acks=acks, timeout=30_000,
                topic_data=(td,))


def list_offsets_request(topic: str, partition: int, timestamp: int, version: int = 7,
                         isolation_level: int = 0):
    mod = request_module(ApiKey.LIST_OFFSETS, version)
    p = make(mod.ListOffsetsPartition, partition_index=partition, current_leader_epoch=-1,
             timestamp=timestamp)
    return make(mod.ListOffsetsRequest, replica_id=-1, isolation_level=isolation_level,
                topics=(make(mod.ListOffsetsTopic, name=topic, partitions=(p,)),))


def fetch_request(topic: str, partition: int, offset: int, max_bytes: int = 1 << 24,
                  version: int = 12, isolation_level: int = 0):
    """A sessionless fetch that does not wait (max_wait 0); isolation level 1 is
    read_committed."""
    mod = request_module(ApiKey.FETCH, version)
    p = make(mod.FetchPartition, partition=partition, current_leader_epoch=-1,
             fetch_offset=offset, last_fetched_epoch=-1, log_start_offset=-1,
             partition_max_bytes=max_bytes)
    return make(mod.FetchRequest, cluster_id=None, replica_id=-1, max_wait=0, min_bytes=0,
                max_bytes=max_bytes, isolation_level=isolation_level, session_id=0,
                session_epoch=-1,
                topics=(make(mod.FetchTopic, topic=topic, partitions=(p,)),),
                forgotten_topics_data=(), rack_id="")


def fetch_by_id_request(topic_id, partitions: dict[int, int], version: int = 17,
                        session_id: int = 0, epoch: int = -1, forgotten=(),
                        max_bytes: int = 1 << 24, current_leader_epoch: int = -1):
    """Fetch v13+ (KIP-516): one topic named by its id, ``partitions`` {index: fetch offset},
    ``forgotten`` (topic id, partition) pairs; does not wait (max_wait 0)."""
    mod = request_module(ApiKey.FETCH, version)
    parts = tuple(make(mod.FetchPartition, partition=p, current_leader_epoch=current_leader_epoch,
                       fetch_offset=offset, last_fetched_epoch=-1, log_start_offset=-1,
                       partition_max_bytes=max_bytes) for p, offset in partitions.items())
    by_id: dict = {}
    for tid, p in forgotten:
        by_id.setdefault(tid, []).append(p)
    return make(mod.FetchRequest, cluster_id=None, replica_id=-1, max_wait=0, min_bytes=0,
                max_bytes=max_bytes, isolation_level=0, session_id=session_id,
                session_epoch=epoch,
                topics=(make(mod.FetchTopic, topic_id=topic_id, partitions=parts),)
                if partitions else (),
                forgotten_topics_data=tuple(make(mod.ForgottenTopic, topic_id=t,
                                                 partitions=tuple(ps))
                                            for t, ps in by_id.items()),
                rack_id="")


def delete_topics_request(names=(), topic_ids=(), version: int = 6):
    """DeleteTopics; v6 names topics by name or by id (KIP-516), older versions by name."""
    mod = request_module(ApiKey.DELETE_TOPICS, version)
    if version < 6:
        return make(mod.DeleteTopicsRequest, topic_names=tuple(names), timeout=30_000)
    return make(mod.DeleteTopicsRequest, timeout=30_000, topics=tuple(
        [make(mod.DeleteTopicState, name=n, topic_id=None) for n in names]
        + [make(mod.DeleteTopicState, name=None, topic_id=i) for i in topic_ids]))


def write_txn_markers_request(producer_id: int, producer_epoch: int, commit: bool,
                              partitions: list[tuple[str, int]], coordinator_epoch: int = 0):
    mod = request_module(ApiKey.WRITE_TXN_MARKERS, 1)
    by_topic: dict[str, list[int]] = {}
    for t, p in partitions:
        by_topic.setdefault(t, []).append(p)
    topics = tuple(make(mod.WritableTxnMarkerTopic, name=t, partition_indexes=tuple(ps))
                   for t, ps in by_topic.items())
    marker = make(mod.WritableTxnMarker, producer_id=producer_id, producer_epoch=producer_epoch,
                  transaction_result=commit, topics=topics, coordinator_epoch=coordinator_epoch)
    return make(mod.WriteTxnMarkersRequest, markers=(marker,))


# -- conveniences over a connection --------------------------------------------------------------


def produce(conn: RawConnection, topic: str, partition: int, batch: bytes):
    """Produce one record set; returns the partition's response (error_code, base_offset...)."""
    response = conn.request(produce_request(topic, partition, batch))
    return response.responses[0].partition_responses[0]


# Recent, so that retention (7 days by default, measured on record timestamps) keeps them.
BASE_TIMESTAMP = (int(time.time()) - 3600) * 1000


def idempotent_batch(pid: int, epoch: int, seq: int, values: list[bytes],
                     timestamp: int = BASE_TIMESTAMP, **kw) -> bytes:
    return build_batch([(b"k-" + v, v, [("h", b"1")], timestamp + i) for i, v in enumerate(values)],
                       producer_id=pid, producer_epoch=epoch, base_sequence=seq, **kw)


def latest_offset(conn: RawConnection, topic: str, partition: int = 0) -> int:
    response = conn.request(list_offsets_request(topic, partition, -1))
    p = response.topics[0].partitions[0]
    assert p.error_code == 0, p
    return p.offset


def fetch_all(conn: RawConnection, topic: str, partition: int = 0, start: int = 0):
    """Every record from ``start`` to the high watermark: [(offset, key, value, headers)]."""
    out = []
    offset = start
    while True:
        response = conn.request(fetch_request(topic, partition, offset))
        pd = response.responses[0].partitions[0]
        assert pd.error_code == 0, pd
        data = pd.records or b""
        for pos, _h in iter_batches(data):
            _, records = decode_batch(data, pos)
            out.extend((r.offset, r.key, r.value, r.headers) for r in records
                       if r.offset >= offset)
        if out and out[-1][0] + 1 > offset:
            offset = out[-1][0] + 1
        if offset >= pd.high_watermark:
            return out
        if not data:
            raise AssertionError(f"fetch at {offset} returned nothing below the high watermark "
                                 f"{pd.high_watermark}")


def error_codes(entity) -> list[int]:
    """Every error code of a decoded response (kio entity), nested ones included."""
    found = []
    for f in dataclasses.fields(entity):
        value = getattr(entity, f.name)
        if f.metadata.get("kafka_type") == "error_code":
            found.append(int(value))
        elif isinstance(value, tuple):
            for item in value:
                if dataclasses.is_dataclass(item):
                    found += error_codes(item)
        elif dataclasses.is_dataclass(value):
            found += error_codes(value)
    return found
