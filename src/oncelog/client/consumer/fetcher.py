"""Fetching and decoding records, and looking up offsets (aiokafka's fetcher, the Java Fetcher
and OffsetFetcher), on the consumer's thread.

Fetches are sessionless (session_id 0, epoch -1: a full fetch every time, KIP-227's "no
session"): an assigned-partition consumer has few partitions, and a full fetch cannot go out of
step with the broker's session cache. One Fetch is in flight per leader at a time; it may
outlive a ``poll`` call (long poll), and its answer is dropped for any partition whose position
moved meanwhile (``seek``).

A partition whose records are still being returned is fetched again, from where its buffered
records end, as long as no more than one fetch's worth waits behind them (librdkafka
prefetches so too). Leaving it out until its buffer is empty, as the Java client does, lets
the one Fetch in flight to its leader be a long poll on partitions that have nothing new: the
busy partition then waits fetch.max.wait.ms for its next records.

A partition's fetched records are decoded whole: batches below the fetch position are skipped
(a fetch may start mid-batch), control batches are skipped, and with read_committed the
batches of aborted transactions are skipped (spec 000, consumer side: the fetch response lists
each aborted transaction's producer id and first offset; a producer's batches from that offset
on are aborted until its ABORT marker). A trailing partial batch is ignored; the next fetch
starts where the complete ones ended.
"""

from __future__ import annotations

import functools
import heapq
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ...errors import (
    CorruptMessageError,
    KafkaError,
    OffsetOutOfRangeError,
    RetriableError,
    TopicAuthorizationFailedError,
    error_for_code,
)
from ...protocol import ApiKey
from ...protocol.fetch_reader import FetchedPartition, decode_fetch_response
from ...records import (
    CONTROL_ABORT,
    BatchHeader,
    CorruptRecordError,
    decode_batch,
    iter_batches,
    parse_control_record,
    validate_batch,
)
from ...records.batch import batch_payload
from ...records.columnar import RecordColumns
from ..config import ClientConfig
from ..connection import InFlightRequest
from ..errors import KafkaTimeoutError, NoOffsetForPartitionError
from ..network import NetworkClient
from ..types import ConsumerRecord, TopicPartition
from .subscription_state import EARLIEST, LATEST, SubscriptionState

log = logging.getLogger(__name__)

LIST_OFFSETS_EARLIEST = -2
LIST_OFFSETS_LATEST = -1
_OFFSET_OUT_OF_RANGE = OffsetOutOfRangeError.code
FETCH_BY_NAME_MAX_VERSION = 12  # v13+ names topics by id only


@dataclass
class CompletedFetch:
    """One partition's decoded fetch, waiting to be returned by ``poll`` (in pieces of
    max.poll.records) or ``poll_columns`` (whole)."""

    tp: TopicPartition
    fetch_offset: int
    columns: RecordColumns
    next_offset: int  # where the next fetch starts once these records are returned
    decode: Callable[[int], RecordColumns]  # the records from an offset on, decoded again
    index: int = 0
    _records: list[ConsumerRecord] | None = None

    @property
    def records(self) -> list[ConsumerRecord]:
        """The records as objects, made once from the columns (the compiled decode and
        then one object per record is faster than decoding record by record in Python)."""
        if self._records is None:
            self._records = consumer_records(self.columns)
        return self._records


def consumer_records(columns: RecordColumns) -> list[ConsumerRecord]:
    n = columns.count
    return list(map(ConsumerRecord, [columns.topic] * n, [columns.partition] * n,
                    columns.offsets().tolist(), columns.timestamps().tolist(),
                    columns.timestamp_types().tolist(), columns.keys(), columns.values(),
                    columns.headers()))


# A partition is fetched again while at most this many completed fetches wait to be returned.
PREFETCH = 1


@dataclass
class _OffsetRequest:
    partitions: dict[TopicPartition, int] = field(default_factory=dict)  # tp -> timestamp


def readable_batches(tp: TopicPartition, data: bytes | memoryview | None, fetch_offset: int, *,
                     read_committed: bool, aborted: list[tuple[int, int]] | None,
                     check_crcs: bool) -> tuple[list[tuple[int, BatchHeader]], int]:
    """(position, header) of each batch of one partition's fetch data whose records a
    consumer reads: not wholly below ``fetch_offset``, not a control batch, and with
    read_committed not of an aborted transaction; and the offset after the last complete
    batch (``fetch_offset`` if there was none).

    ``aborted``: (first offset, producer id) of each aborted transaction the broker listed.
    """
    out: list[tuple[int, BatchHeader]] = []
    next_offset = fetch_offset
    if not data:
        return out, next_offset
    heap = sorted(aborted or [])
    aborted_pids: set[int] = set()
    for pos, header in iter_batches(data):
        if header.next_offset <= fetch_offset:
            continue
        next_offset = header.next_offset
        if read_committed:
            while heap and heap[0][0] <= header.last_offset:
                aborted_pids.add(heapq.heappop(heap)[1])
            if header.is_control:
                if header.producer_id in aborted_pids:
                    try:
                        _, control = decode_batch(data, pos, verify_crc=check_crcs)
                        if control and parse_control_record(control[0])[0] == CONTROL_ABORT:
                            aborted_pids.discard(header.producer_id)
                    except CorruptRecordError as exc:
                        raise CorruptMessageError(f"{tp.topic}-{tp.partition}: {exc}") from exc
                continue
            if header.is_transactional and header.producer_id in aborted_pids:
                continue
        if header.is_control:
            continue
        out.append((pos, header))
    return out, next_offset


def decode_records(tp: TopicPartition, data: bytes | memoryview | None, fetch_offset: int, *,
                   read_committed: bool, aborted: list[tuple[int, int]] | None,
                   check_crcs: bool) -> tuple[list[ConsumerRecord], int]:
    """Records at or after ``fetch_offset`` in one partition's fetch data (those of
    ``readable_batches``), one object each, and the offset after the last complete batch."""
    batches, next_offset = readable_batches(tp, data, fetch_offset,
                                            read_committed=read_committed, aborted=aborted,
                                            check_crcs=check_crcs)
    out: list[ConsumerRecord] = []
    for pos, header in batches:
        try:
            _, records = decode_batch(data, pos, verify_crc=check_crcs)
        except CorruptRecordError as exc:
            raise CorruptMessageError(
                f"{tp.topic}-{tp.partition}: batch at offset {header.base_offset}: {exc}"
            ) from exc
        ts_type = header.timestamp_type
        for r in records:
            if r.offset >= fetch_offset:
                out.append(ConsumerRecord(tp.topic, tp.partition, r.offset, r.timestamp, ts_type,
                                          r.key, r.value, r.headers))
    return out, next_offset


def decode_columns(tp: TopicPartition, data: bytes | memoryview | None, fetch_offset: int, *,
                   read_committed: bool, aborted: list[tuple[int, int]] | None,
                   check_crcs: bool) -> tuple[RecordColumns, int]:
    """``decode_records`` in bulk: the same records, decoded by the compiled codec into one
    RecordColumns (records/columnar.py) instead of an object each."""
    batches, next_offset = readable_batches(tp, data, fetch_offset,
                                            read_committed=read_committed, aborted=aborted,
                                            check_crcs=check_crcs)
    columns = RecordColumns(tp.topic, tp.partition)
    for pos, header in batches:
        try:
            if check_crcs:  # a stored batch, which a log cleaner may have rebuilt
                validate_batch(data, pos, cleaned=True)
            lat = header.max_timestamp if header.timestamp_type else None
            columns.append_records(batch_payload(data, pos, header), header.records_count,
                                   header.base_offset, header.base_timestamp,
                                   log_append_time=lat, timestamp_type=header.timestamp_type,
                                   min_offset=fetch_offset)
        except CorruptRecordError as exc:
            raise CorruptMessageError(
                f"{tp.topic}-{tp.partition}: batch at offset {header.base_offset}: {exc}"
            ) from exc
    return columns, next_offset


class Fetcher:
    def __init__(self, config: ClientConfig, network: NetworkClient,
                 subscriptions: SubscriptionState) -> None:
        self.config = config
        self.net = network
        self.subs = subscriptions
        self.read_committed = config.isolation_level == "read_committed"
        self._in_flight: dict[int, InFlightRequest] = {}
        # Completed fetches in the order they came (the Java client's FetchBuffer): a
        # partition's are in offset order, each starting where the one before ends, the first
        # at its position; how many each partition has, and the offset after its last one.
        self._completed: deque[CompletedFetch] = deque()
        self._buffered: dict[TopicPartition, int] = {}
        self._buffered_end: dict[TopicPartition, int] = {}
        self._errors: list[KafkaError] = []
        self.metadata_stale = True
        self._metadata_next = 0.0  # no refresh before this (retry.backoff.ms after the last)

    # --- fetching ---------------------------------------------------------------------------

    def _fetch_offset(self, tp: TopicPartition) -> int | None:
        """Where ``tp``'s next fetch starts: after its buffered records, else its position."""
        end = self._buffered_end.get(tp)
        return end if end is not None else self.subs.position(tp)

    def _caught_up(self, tp: TopicPartition) -> bool:
        """Whether the last fetch said ``tp`` had nothing past where its next fetch starts."""
        state = self.subs.state(tp)
        end = state.last_stable_offset if self.read_committed else state.high_watermark
        offset = self._fetch_offset(tp)
        return end >= 0 and offset is not None and offset >= end

    def send_fetches(self) -> None:
        by_node: dict[int, list[TopicPartition]] = {}
        held: set[int] = set()  # leaders of partitions left out for their buffered records
        cluster = self.net.cluster
        for tp in self.subs.fetchable():
            leader = cluster.leader_for(tp)
            if leader is None:
                self.metadata_stale = True
                continue
            if leader in self._in_flight:
                continue
            if self._buffered.get(tp, 0) > PREFETCH:
                held.add(leader)  # enough buffered already
                continue
            by_node.setdefault(leader, []).append(tp)
        for node, tps in by_node.items():
            if node in held and all(self._caught_up(tp) for tp in tps):
                # A Fetch of partitions with nothing new would be a long poll, and hold up
                # the next fetch of the one left out (its buffer runs dry meanwhile): ask
                # when that one is fetched again.
                continue
            positions = {tp: self._fetch_offset(tp) for tp in tps}
            topics: dict[str, list[dict[str, Any]]] = {}
            for tp, offset in positions.items():
                topics.setdefault(tp.topic, []).append({
                    # KIP-320: a broker that is not (or no longer) the leader at this epoch
                    # refuses (FENCED_LEADER_EPOCH / UNKNOWN_LEADER_EPOCH: metadata again)
                    "partition": tp.partition,
                    "current_leader_epoch": cluster.leader_epoch(tp),
                    "fetch_offset": offset, "last_fetched_epoch": -1, "log_start_offset": -1,
                    "partition_max_bytes": self.config.max_partition_fetch_bytes})
            # Fetch v13+ names topics by id (KIP-516), as the Java client does when the
            # metadata gave every topic one: a topic deleted and re-created under the same
            # name is then answered UNKNOWN_TOPIC_ID instead of being read in its place.
            ids = {t: cluster.topic_id(t) for t in topics}
            by_id = all(ids.values())
            try:
                req = self.net.send(node, ApiKey.FETCH, self._fetch_values(topics, ids),
                                    context=(positions, {i: t for t, i in ids.items()}),
                                    timeout_ms=self.config.request_timeout_ms
                                    + self.config.fetch_max_wait_ms,
                                    max_version=None if by_id else FETCH_BY_NAME_MAX_VERSION,
                                    decoder=decode_fetch_response)
            except KafkaError as exc:
                if not isinstance(exc, RetriableError):
                    raise
                req = None
            if req is None:
                self.metadata_stale = True
            else:
                self._in_flight[node] = req

    def _fetch_values(self, topics: dict[str, list[dict[str, Any]]],
                      ids: dict[str, Any]) -> Any:
        def values(version: int) -> dict[str, Any]:
            if version > FETCH_BY_NAME_MAX_VERSION:
                listed = [{"topic_id": ids[t], "partitions": p} for t, p in topics.items()]
            else:
                listed = [{"topic": t, "partitions": p} for t, p in topics.items()]
            return {
                "replica_id": -1, "cluster_id": None,
                "max_wait": self.config.fetch_max_wait_ms,
                "min_bytes": self.config.fetch_min_bytes,
                "max_bytes": self.config.fetch_max_bytes,
                "isolation_level": 1 if self.read_committed else 0,
                "session_id": 0, "session_epoch": -1,  # sessionless full fetch
                "topics": listed, "forgotten_topics_data": [], "rack_id": "",
            }

        return values

    def handle(self, req: InFlightRequest) -> bool:
        """Take a finished Fetch; False if ``req`` is not one of ours."""
        if self._in_flight.get(req.node_id) is not req:
            return False
        del self._in_flight[req.node_id]
        if req.error is not None:
            log.info("fetch from node %d failed: %s", req.node_id, req.error)
            self.metadata_stale = True
            return True
        response = req.response
        positions: dict[TopicPartition, int]
        positions, names = req.context
        top_error = response.error_code
        if top_error:
            log.info("fetch from node %d: %s", req.node_id, error_for_code(top_error).__name__)
            return True
        for topic in response.responses:
            name = topic.topic or names.get(topic.topic_id)
            if name is None:
                continue  # an id we did not ask for
            for p in topic.partitions:
                tp = TopicPartition(name, int(p.partition_index))
                fetch_offset = positions.get(tp)
                if fetch_offset is None or not self.subs.is_assigned(tp) \
                        or self._fetch_offset(tp) != fetch_offset:
                    continue  # unassigned or moved (seek) since the request went out
                self._handle_partition(tp, fetch_offset, p)
        return True

    def _handle_partition(self, tp: TopicPartition, fetch_offset: int,
                          p: FetchedPartition) -> None:
        code = int(p.error_code)
        state = self.subs.state(tp)
        if code == 0:
            state.high_watermark = int(p.high_watermark)
            state.last_stable_offset = p.last_stable_offset
            aborted = p.aborted_transactions if self.read_committed else None
            decode = functools.partial(decode_columns, tp, p.records,
                                       read_committed=self.read_committed, aborted=aborted,
                                       check_crcs=self.config.check_crcs)
            columns, next_offset = decode(fetch_offset)
            if columns.count or next_offset > fetch_offset:
                self._completed.append(CompletedFetch(
                    tp, fetch_offset, columns, next_offset,
                    lambda offset: decode(offset)[0]))
                self._buffered[tp] = self._buffered.get(tp, 0) + 1
                self._buffered_end[tp] = next_offset
        elif code == _OFFSET_OUT_OF_RANGE:
            if self.subs.default_reset == "none":
                self._errors.append(OffsetOutOfRangeError(
                    f"{tp.topic}-{tp.partition}: fetch offset {fetch_offset} is out of range "
                    "and auto.offset.reset is none"))
            else:
                log.info("%s-%d: offset %d out of range, resetting to %s", tp.topic,
                         tp.partition, fetch_offset, self.subs.default_reset)
                self.subs.request_reset(tp, self.subs.default_reset)
                self.discard(tp)
        else:
            error = error_for_code(code)
            if issubclass(error, RetriableError):
                self.metadata_stale = True
            else:
                self._errors.append(error(f"fetch {tp.topic}-{tp.partition}"))

    def raise_errors(self) -> None:
        if self._errors:
            error = self._errors.pop(0)
            self._errors.clear()
            raise error

    def has_records(self) -> bool:
        return bool(self._completed)

    def _returned(self, fetch: CompletedFetch) -> None:
        """``fetch`` (first of its partition's) is all returned: its partition moves on."""
        tp = fetch.tp
        left = self._buffered[tp] - 1
        if left:
            self._buffered[tp] = left
        else:
            del self._buffered[tp]
            del self._buffered_end[tp]
        self.subs.seek(tp, fetch.next_offset)

    def _readable(self, tp: TopicPartition) -> bool:
        if self.subs.is_assigned(tp) and self.subs.position(tp) is not None:
            return True
        self.discard(tp)  # unassigned, or waiting for a new position
        return False

    def fetched_records(self, max_records: int) -> list[ConsumerRecord]:
        """Up to ``max_records`` buffered records, oldest fetch first, advancing positions
        past them."""
        out: list[ConsumerRecord] = []
        paused: list[CompletedFetch] = []  # kept, in order, for when they are resumed
        while self._completed and len(out) < max_records:
            fetch = self._completed[0]
            if not self._readable(fetch.tp):
                continue  # (its fetches are gone)
            if self.subs.is_paused(fetch.tp):
                paused.append(self._completed.popleft())
                continue
            take = fetch.records[fetch.index : fetch.index + max_records - len(out)]
            fetch.index += len(take)
            out.extend(take)
            if fetch.index >= len(fetch.records):
                self._completed.popleft()
                self._returned(fetch)
            elif take:
                self.subs.seek(fetch.tp, take[-1].offset + 1)
        if paused:
            self._completed.extendleft(reversed(paused))
        return out

    def fetched_columns(self) -> dict[TopicPartition, RecordColumns]:
        """The first buffered fetch of each partition, advancing positions past it
        (partitions whose fetch held no record for the consumer advance too, but are left
        out). A partition's next fetch, prefetched, waits for the next call: joining the
        two would copy the records."""
        out: dict[TopicPartition, RecordColumns] = {}
        taken: set[TopicPartition] = set()
        kept: deque[CompletedFetch] = deque()
        for fetch in self._completed:
            tp = fetch.tp
            if tp in taken or not self._readable(tp) or self.subs.is_paused(tp):
                if tp in self._buffered:
                    kept.append(fetch)
                continue
            taken.add(tp)
            # poll() took some already: the rest, decoded again (mixing the two is rare)
            position = self.subs.position(tp)
            assert position is not None
            columns = fetch.columns if fetch.index == 0 else fetch.decode(position)
            if columns.count:
                out[tp] = columns
            self._returned(fetch)
        self._completed = kept
        return out

    def discard(self, tp: TopicPartition) -> None:
        """Drop buffered records of ``tp`` (after a seek)."""
        if self._buffered.pop(tp, None) is not None:
            del self._buffered_end[tp]
            self._completed = deque(f for f in self._completed if f.tp != tp)

    def close(self) -> None:
        self._in_flight.clear()
        self._completed.clear()
        self._buffered.clear()
        self._buffered_end.clear()

    # --- offsets ----------------------------------------------------------------------------

    def list_offsets(self, timestamps: dict[TopicPartition, int], deadline: float
                     ) -> dict[TopicPartition, int]:
        """ListOffsets for each partition (timestamp -2 earliest, -1 latest), retrying
        retriable errors until ``deadline``. With read_committed, "latest" is the last stable
        offset (isolation_level 1)."""
        result: dict[TopicPartition, int] = {}
        remaining = dict(timestamps)
        attempt = 0
        last_error: KafkaError | None = None
        while remaining:
            if time.monotonic() >= deadline:
                raise KafkaTimeoutError(
                    f"ListOffsets for {sorted(remaining)} did not complete in time"
                    + (f" (last error: {last_error})" if last_error else "")
                    + self.net.connection_error_note())
            if self.metadata_stale or any(self.net.cluster.leader_for(tp) is None
                                          for tp in remaining):
                self.update_metadata({tp.topic for tp in remaining} | self._topics(), deadline)
            by_node: dict[int, dict[TopicPartition, int]] = {}
            for tp, ts in remaining.items():
                leader = self.net.cluster.leader_for(tp)
                if leader is not None:
                    by_node.setdefault(leader, {})[tp] = ts
            for node, parts in by_node.items():
                try:
                    response = self.net.request(node, ApiKey.LIST_OFFSETS,
                                                self._list_offsets_values(parts))
                except RetriableError as exc:
                    last_error = exc
                    self.metadata_stale = True
                    continue
                for t in response.topics:
                    for p in t.partitions:
                        tp = TopicPartition(t.name, int(p.partition_index))
                        if tp not in remaining:
                            continue
                        code = int(p.error_code)
                        if code == 0:
                            offset = int(p.offset)
                            result[tp] = offset
                            del remaining[tp]
                            continue
                        error = error_for_code(code)
                        if not issubclass(error, RetriableError):
                            raise error(f"ListOffsets {tp.topic}-{tp.partition}")
                        last_error = error(f"ListOffsets {tp.topic}-{tp.partition}")
                        self.metadata_stale = True
            if remaining:
                attempt += 1
                delay = self.net.retry_backoff.backoff(attempt - 1)
                self.net.sleep(max(0.0, min(delay, deadline - time.monotonic())))
        return result

    def _list_offsets_values(self, parts: dict[TopicPartition, int]) -> dict[str, Any]:
        topics: dict[str, list[dict[str, int]]] = {}
        for tp, ts in parts.items():
            topics.setdefault(tp.topic, []).append(
                {"partition_index": tp.partition, "current_leader_epoch": -1, "timestamp": ts})
        return {"replica_id": -1, "isolation_level": 1 if self.read_committed else 0,
                "topics": [{"name": t, "partitions": p} for t, p in topics.items()]}

    def reset_positions(self, deadline: float) -> None:
        """Resolve every partition waiting for a position (assign, seek_to_*, out of range)."""
        needing = self.subs.needing_position()
        if not needing:
            return
        timestamps = {}
        for tp in needing:
            strategy = self.subs.state(tp).reset_strategy or self.subs.default_reset
            if strategy == EARLIEST:
                timestamps[tp] = LIST_OFFSETS_EARLIEST
            elif strategy == LATEST:
                timestamps[tp] = LIST_OFFSETS_LATEST
            else:
                raise NoOffsetForPartitionError(f"{tp.topic}-{tp.partition} has no position and "
                               "auto.offset.reset is none: seek() first")
        offsets = self.list_offsets(timestamps, deadline)
        for tp, offset in offsets.items():
            state = self.subs.state(tp)
            if state.position is None:  # nobody seeked meanwhile
                self.subs.seek(tp, offset)
                self.discard(tp)

    # --- metadata ---------------------------------------------------------------------------

    def _topics(self) -> set[str]:
        return {tp.topic for tp in self.subs.assigned()}

    def update_metadata(self, topics: set[str], deadline: float) -> None:
        # Asked again while the topic does not exist or has no leader: not more often than
        # every retry.backoff.ms (jittered, as every wait: backoff.py).
        wait = self._metadata_next - time.monotonic()
        if wait > 0:
            self.net.sleep(min(wait, max(0.0, deadline - time.monotonic())))
            if time.monotonic() < self._metadata_next:
                return
        # A consumer reading by assignment should not create topics by asking about them.
        self.net.update_metadata(sorted(topics), deadline, allow_auto_topic_creation=False)
        self._metadata_next = time.monotonic() + self.net.retry_backoff.backoff(0)
        self.metadata_stale = False
        for topic in sorted(topics):
            code = self.net.cluster.topic_error(topic)
            if code == TopicAuthorizationFailedError.code:
                # Not allowed to describe (so to read) it: tell the caller, as Kafka's poll does.
                raise TopicAuthorizationFailedError(f"not authorized to read topic {topic!r}")
