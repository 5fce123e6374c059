"""A transactional writer on the bare wire, speaking either transaction protocol.

Real clients (ours, librdkafka) bump their epoch after a lost batch (KIP-360), which fences a
late copy of it on its own. To show what the broker itself allows, this writer behaves as an
older client does:

- ``old`` (transaction version 0/1): InitProducerId once, AddPartitionsToTxn v3 before a
  partition's first batch, Produce v9, EndTxn v3; the epoch stays the same for every
  transaction. A batch that gets no answer within ``request_timeout`` is given up (its
  connection closed, the transaction aborted) and its sequence numbers are used again by the
  next batch to that partition, as a client that adjusts the sequences of failed batches does.
- ``tv2`` (KIP-890 transaction version 2): Produce v12 without AddPartitionsToTxn, EndTxn v5
  whose answer carries the next transaction's epoch; sequences restart at 0.
- ``auto``: ``tv2`` when the broker finalizes transaction.version 2, else ``old``.

Every batch holds the same number of records (one per value given to ``send``).
"""

from __future__ import annotations

import itertools
import socket
import struct
import time
from typing import Any

from ..protocol import ApiKey, decode_response, encode_request, make, request_module
from ..records import build_batch
from .history import SendOutcome, TxnOutcome

_SIZE = struct.Struct(">i")
CONCURRENT_TRANSACTIONS, COORDINATOR_LOAD_IN_PROGRESS = 51, 14
NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE = 16, 15
_BUSY = {CONCURRENT_TRANSACTIONS, COORDINATOR_LOAD_IN_PROGRESS, NOT_COORDINATOR,
         COORDINATOR_NOT_AVAILABLE}
# Produce refusals that wrote nothing and that a Kafka producer retries: the partition's
# leader moving (3 UNKNOWN_TOPIC_OR_PARTITION, 6 NOT_LEADER_OR_FOLLOWER), too few replicas
# before the append (19), KIP-890's verification of the partition at a busy or loading
# coordinator (51, 14, 15, 16).
_SEND_RETRIABLE = _BUSY | {3, 6, 19}


class RawWriterError(Exception):
    pass


class _Conn:
    """One blocking connection; a request without an answer in time closes it."""

    def __init__(self, address: tuple[str, int], client_id: str) -> None:
        self.address = address
        self.client_id = client_id
        self.sock: socket.socket | None = None
        self._cid = itertools.count(1)

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    def _recv(self, n: int, deadline: float) -> bytes:
        assert self.sock is not None
        out = bytearray()
        while len(out) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            self.sock.settimeout(left)
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                raise ConnectionError("connection closed")
            out += chunk
        return bytes(out)

    def request(self, request: Any, timeout: float) -> Any:
        """The response, or raise TimeoutError / OSError (the connection is closed then)."""
        deadline = time.monotonic() + timeout
        try:
            if self.sock is None:
                self.sock = socket.create_connection(self.address, timeout=timeout)
                self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            cid = next(self._cid)
            self.sock.sendall(encode_request(cid, self.client_id, request))
            (size,) = _SIZE.unpack(self._recv(4, deadline))
            frame = self._recv(size, deadline)
        except (TimeoutError, OSError):
            self.close()
            raise
        cls: Any = type(request)
        got, response = decode_response(cls.__api_key__, cls.__version__, frame)
        if got != cid:
            self.close()
            raise RawWriterError(f"correlation id {got}, expected {cid}")
        return response


def _req(api: int, version: int, name: str, **fields: Any) -> Any:
    return make(getattr(request_module(api, version), name), **fields)


class RawTxnWriter:
    def __init__(self, bootstrap: str, transactional_id: str, protocol: str = "auto",
                 request_timeout: float = 1.0, coordinator_timeout: float = 10.0,
                 transaction_timeout_ms: int = 60_000, send_retry_s: float = 0.0) -> None:
        if protocol not in ("auto", "old", "tv2"):
            raise ValueError(f"protocol must be auto, old or tv2, not {protocol!r}")
        host, port = bootstrap.rsplit(":", 1)
        address = (host, int(port))
        self.transactional_id = transactional_id
        self.requested_protocol = protocol
        self.protocol = protocol
        self.request_timeout = request_timeout
        self.coordinator_timeout = coordinator_timeout
        self.transaction_timeout_ms = transaction_timeout_ms
        # How long a send retries a refusal in _SEND_RETRIABLE (0: the first answer is the
        # outcome, as the fault workloads record it).
        self.send_retry_s = send_retry_s
        self.last_error = 0  # the error code of the last refused send
        self.coord = _Conn(address, f"{transactional_id}-coordinator")
        self.data = _Conn(address, f"{transactional_id}-data")
        self.producer_id = -1
        self.epoch = -1
        self.sequences: dict[tuple[str, int], int] = {}
        self.partitions: set[tuple[str, int]] = set()
        self.failed = False  # a send of this transaction failed or was given up

    def close(self) -> None:
        self.coord.close()
        self.data.close()

    # -- coordinator ----------------------------------------------------------------------------

    def _coordinator_call(self, request: Any) -> Any:
        """Retry while the coordinator is busy (CONCURRENT_TRANSACTIONS ...) or unreachable."""
        deadline = time.monotonic() + self.coordinator_timeout
        while True:
            try:
                response = self.coord.request(request, self.request_timeout)
            except (TimeoutError, OSError) as exc:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{type(request).__name__}: {exc}") from exc
                time.sleep(0.05)
                continue
            code = _error_code(response)
            if code in _BUSY and time.monotonic() < deadline:
                time.sleep(0.02)
                continue
            return response

    def init(self) -> None:
        if self.requested_protocol == "auto":
            self.protocol = "tv2" if self._broker_offers_tv2() else "old"
        response = self._coordinator_call(_req(
            ApiKey.INIT_PRODUCER_ID, 4, "InitProducerIdRequest",
            transactional_id=self.transactional_id,
            transaction_timeout=self.transaction_timeout_ms, producer_id=-1, producer_epoch=-1))
        if response.error_code:
            raise RawWriterError(f"InitProducerId: error {int(response.error_code)}")
        self.producer_id, self.epoch = int(response.producer_id), int(response.producer_epoch)
        self.sequences.clear()

    def _broker_offers_tv2(self) -> bool:
        response = self._coordinator_call(_req(ApiKey.API_VERSIONS, 3, "ApiVersionsRequest",
                                               client_software_name="oncelog-verify",
                                               client_software_version="1"))
        versions = {int(k.api_key): int(k.max_version) for k in response.api_keys}
        features = {f.name: int(f.max_version_level)
                    for f in getattr(response, "finalized_features", ())}
        return (features.get("transaction.version", 0) >= 2
                and versions.get(ApiKey.PRODUCE, 0) >= 12 and versions.get(ApiKey.END_TXN, 0) >= 5)

    def begin(self) -> None:
        self.partitions = set()
        self.failed = False

    def add_partition(self, topic: str, partition: int) -> bool:
        """AddPartitionsToTxn now (old protocol; ``send`` does it before a partition's first
        batch anyway); False if the coordinator refused."""
        return self._add_partition((topic, partition))

    def _add_partition(self, tp: tuple[str, int]) -> bool:
        if self.protocol == "tv2" or tp in self.partitions:
            return True
        mod = request_module(ApiKey.ADD_PARTITIONS_TO_TXN, 3)
        response = self._coordinator_call(make(
            mod.AddPartitionsToTxnRequest,
            v3_and_below_transactional_id=self.transactional_id,
            v3_and_below_producer_id=self.producer_id,
            v3_and_below_producer_epoch=self.epoch,
            v3_and_below_topics=(make(mod.AddPartitionsToTxnTopic, name=tp[0],
                                      partitions=(tp[1],)),)))
        if _error_code(response):
            return False
        self.partitions.add(tp)
        return True

    def _restart(self) -> None:
        """After an EndTxn without a clear answer: InitProducerId again (it fences and ends
        whatever the coordinator still has open for this transactional id)."""
        try:
            self.init()
        except (TimeoutError, RawWriterError):
            pass  # the next transaction's requests fail, and it aborts

    # -- data -----------------------------------------------------------------------------------

    def send(self, topic: str, partition: int, values: list[str]) -> SendOutcome:
        """One transactional batch of ``values``: ok, failed (the broker refused it) or unknown
        (no answer in time: it may still arrive)."""
        tp = (topic, partition)
        try:
            if not self._add_partition(tp):
                self.failed = True
                return "failed"
        except TimeoutError:
            self.failed = True
            return "unknown"
        seq = self.sequences.get(tp, 0)
        now = int(time.time() * 1000)
        batch = build_batch([(None, v.encode(), [], now) for v in values],
                            producer_id=self.producer_id, producer_epoch=self.epoch,
                            base_sequence=seq, is_transactional=True)
        version = 12 if self.protocol == "tv2" else 9
        mod = request_module(ApiKey.PRODUCE, version)
        request = make(mod.ProduceRequest, transactional_id=self.transactional_id, acks=-1,
                       timeout=int(self.request_timeout * 1000), topic_data=(make(
                           mod.TopicProduceData, name=topic, partition_data=(make(
                               mod.PartitionProduceData, index=partition, records=batch),)),))
        deadline = time.monotonic() + self.send_retry_s
        while True:
            try:
                response = self.data.request(request, self.request_timeout)
            except (TimeoutError, OSError):
                # Given up: the sequence numbers are used again by the next batch (old protocol).
                self.failed = True
                return "unknown"
            code = int(response.responses[0].partition_responses[0].error_code)
            if code in _SEND_RETRIABLE and time.monotonic() < deadline:
                time.sleep(0.05)
                continue
            break
        if code:
            self.last_error = code
            self.failed = True
            return "failed"
        self.sequences[tp] = seq + len(values)
        return "ok"

    def end(self, commit: bool) -> TxnOutcome:
        """Commit (aborts instead if a send failed) or abort; ``unknown`` when the EndTxn got
        no clear answer."""
        commit = commit and not self.failed
        if self.protocol == "old" and not self.partitions:
            return "aborted" if not commit else "committed"
        version = 5 if self.protocol == "tv2" else 3
        try:
            response = self._coordinator_call(_req(
                ApiKey.END_TXN, version, "EndTxnRequest", transactional_id=self.transactional_id,
                producer_id=self.producer_id, producer_epoch=self.epoch, committed=commit))
        except TimeoutError:
            self._restart()
            return "unknown"
        code = int(response.error_code)
        if code:
            self._restart()
            # An abort that failed still aborts: only a commit makes the coordinator commit.
            return "unknown" if commit else "aborted"
        if self.protocol == "tv2":
            self.producer_id = int(response.producer_id)
            self.epoch = int(response.producer_epoch)
            self.sequences.clear()
        return "committed" if commit else "aborted"


def _error_code(response: Any) -> int:
    """The first error of a coordinator response (0: none)."""
    code = getattr(response, "error_code", None)
    if code is not None and int(code):
        return int(code)
    for t in getattr(response, "results_by_topic_v3_and_below", ()):
        for p in t.results_by_partition:
            if int(p.partition_error_code):
                return int(p.partition_error_code)
    return 0
