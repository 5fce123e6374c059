"""The Consumer users import: manual assignment or group subscription, positions, ``poll``,
committed offsets.

    consumer = Consumer(bootstrap_servers=addr, group_id="billing", auto_offset_reset="earliest")
    consumer.subscribe(["events"])
    for record in consumer:          # or: for record in consumer.poll(timeout=1.0)
        ...

Everything but the group heartbeats runs on the caller's thread; one consumer must not be used
by two threads at once (as in the Java client). Group membership: group_coordinator.py.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Self, TypeVar

from ...records.columnar import RecordColumns
from .. import serde
from ..config import consumer_config
from ..network import NetworkClient
from ..types import ConsumerGroupMetadata, ConsumerRecord, OffsetAndTimestamp, TopicPartition
from .fetcher import LIST_OFFSETS_EARLIEST, LIST_OFFSETS_LATEST, Fetcher
from .group_coordinator import Callback, GroupCoordinator
from .subscription_state import EARLIEST, LATEST, SubscriptionState

log = logging.getLogger(__name__)

_client_ids = itertools.count(1)
# Java's KafkaConsumer.close() default (DEFAULT_CLOSE_TIMEOUT_MS): the final auto commit and
# the LeaveGroup get this long in all.
DEFAULT_CLOSE_TIMEOUT = 30.0
_Taken = TypeVar("_Taken", list[ConsumerRecord], dict[TopicPartition, RecordColumns])


class Consumer:
    """Read records from assigned partitions.

    Configuration: Kafka's consumer config names, as a dict and/or keyword arguments with
    underscores (``auto_offset_reset="earliest"``, ``isolation_level="read_committed"``).
    """

    def __init__(self, config: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        config, (self._key_deserializer, self._value_deserializer) = serde.take(
            config, kwargs, ("key_deserializer", "value_deserializer"))
        self.config = consumer_config(config, kwargs)
        self.client_id = self.config.client_id or f"oncelog-consumer-{next(_client_ids)}"
        self._net = NetworkClient(self.config, self.client_id)
        self._subs = SubscriptionState(self.config.auto_offset_reset)
        self._fetcher = Fetcher(self.config, self._net, self._subs)
        self._group: GroupCoordinator | None = None
        if self.config.group_id is not None:
            self._group = GroupCoordinator(self.config, self.client_id, self._net, self._subs,
                                           self._partitions_changed)
        self._subscribed = False
        self._closed = False

    def _partitions_changed(self) -> None:
        for tp in list(self._fetcher_partitions()):
            self._fetcher.discard(tp)
        self._fetcher.metadata_stale = True

    def _fetcher_partitions(self) -> list[TopicPartition]:
        return self._subs.assigned()

    # --- assignment -------------------------------------------------------------------------

    def subscribe(self, topics: Iterable[str] | None = None, *, pattern: str | None = None,
                  on_assign: Callback | None = None, on_revoke: Callback | None = None,
                  on_lost: Callback | None = None) -> None:
        """Join the consumer group (``group_id``) and read the partitions it assigns to this
        member, re-assigned whenever members come and go. ``pattern``: a regular expression
        of topic names instead. The callbacks get lists of TopicPartitions and run inside
        ``poll``: ``on_revoke`` before partitions are taken away (commit there), ``on_assign``
        after new ones arrive, ``on_lost`` when the membership was lost (another member may
        already have them)."""
        self._check_open()
        if self._group is None:
            raise ValueError("subscribe() needs a group_id")
        if isinstance(topics, str):
            topics = [topics]
        if not topics and not pattern:
            raise ValueError("subscribe() needs topics or a pattern")
        self._group.subscribe(topics, pattern, on_assign, on_revoke, on_lost)
        self._subscribed = True

    def group_metadata(self) -> ConsumerGroupMetadata:
        """What ``Producer.send_offsets_to_transaction`` needs to fence zombies (KIP-447)."""
        if self._group is None:
            raise ValueError("group_metadata() needs a group_id")
        return self._group.metadata()

    def commit(self, offsets: Mapping[TopicPartition, int] | None = None,
               asynchronous: bool = False, timeout: float | None = None) -> None:
        """Commit offsets (the NEXT offset to read per partition; default: the current
        positions) for the group. Raises CommitFailedError if the group rebalanced meanwhile.
        ``asynchronous`` is accepted for confluent-kafka's signature; the commit is done when
        this returns either way."""
        self._check_open()
        if self._group is None:
            raise ValueError("commit() needs a group_id")
        chosen = {TopicPartition(*tp): int(o) for tp, o in offsets.items()} if offsets \
            else self._group.positions()
        if chosen:
            self._group.commit(chosen, self._deadline(timeout))

    def committed(self, partitions: Iterable[TopicPartition], timeout: float | None = None
                  ) -> dict[TopicPartition, int | None]:
        """The group's committed offsets (None where nothing is committed)."""
        self._check_open()
        if self._group is None:
            raise ValueError("committed() needs a group_id")
        return self._group.committed([TopicPartition(*tp) for tp in partitions],
                                     self._deadline(timeout))

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Read exactly these partitions (replacing any earlier assignment)."""
        self._check_open()
        if self._subscribed:
            raise ValueError("assign() and subscribe() cannot be mixed: unsubscribe() first")
        tps = []
        for tp in partitions:
            if not isinstance(tp, tuple) or len(tp) != 2:
                raise TypeError(f"assign() takes TopicPartitions, got {tp!r}")
            tps.append(TopicPartition(*tp))
        if len(set(tps)) != len(tps):
            raise ValueError("assign(): duplicate partitions")
        self._subs.assign(tps)
        self._fetcher.metadata_stale = True

    def assignment(self) -> set[TopicPartition]:
        """The partitions this consumer reads now (assigned, or given by its group)."""
        return set(self._subs.assigned())

    def unsubscribe(self) -> None:
        """Leave the group and drop the assignment; subscribe() or assign() may follow."""
        if self._subscribed and self._group is not None:
            self._group.close(self._deadline(None))
            self._group = GroupCoordinator(self.config, self.client_id, self._net, self._subs,
                                           self._partitions_changed)
        self._subscribed = False
        self._subs.assign([])

    # --- positions --------------------------------------------------------------------------

    def seek(self, partition: TopicPartition, offset: int) -> None:
        """Read ``partition`` from ``offset`` on at the next ``poll``."""
        if not isinstance(offset, int) or offset < 0:
            raise ValueError(f"seek offset must be a non-negative int, got {offset!r}")
        self._subs.seek(TopicPartition(*partition), offset)
        self._fetcher.discard(TopicPartition(*partition))

    def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        """Go to the log start offset of ``partitions`` (all assigned ones if none given)."""
        self._seek_to(EARLIEST, partitions)

    def seek_to_end(self, *partitions: TopicPartition) -> None:
        """Go to the end: the high watermark, or the last stable offset with read_committed.

        Evaluated lazily, at the next ``poll`` or ``position`` call (as in the Java client).
        """
        self._seek_to(LATEST, partitions)

    def _init_from_committed(self, deadline: float) -> None:
        """Assigned partitions without a position (none given, no seek_to_* asked) start at
        the group's committed offsets when there is a group_id, as Kafka's consumer does for
        assign() too; auto.offset.reset only where nothing is committed. (A copier restarted
        with assign() goes on where its transactions left off instead of copying again.)"""
        if self._group is None:
            return
        fresh = [tp for tp in self._subs.needing_position()
                 if self._subs.state(tp).reset_strategy is None]
        if not fresh:
            return
        for tp, offset in self._group.committed(fresh, deadline).items():
            state = self._subs.state(tp)
            if offset is not None and state.position is None and state.reset_strategy is None:
                self._subs.seek(tp, offset)
                self._fetcher.discard(tp)

    def seek_to_committed(self, *partitions: TopicPartition, timeout: float | None = None
                          ) -> dict[TopicPartition, int | None]:
        """Go back to the group's committed offsets of ``partitions`` (all assigned ones if none
        given); where nothing is committed, to what auto.offset.reset picks. Returns the
        committed offsets (None: none).

        The rewind a consume-transform-produce loop needs after ``abort_transaction``
        (KAFKA-17582): an abort drops the transaction's offsets, but not the consumer's
        positions, which are past the records it consumed in it; polling on would skip them.
        Kafka's clients leave this to the application (its exactly-once example resets to
        the committed offsets after an abort); this is that reset. With read_committed the
        offsets are asked for with require_stable, so the answer waits for the aborted
        transaction's offsets to be dropped."""
        self._check_open()
        if self._group is None:
            raise ValueError("seek_to_committed() needs a group_id")
        tps = [TopicPartition(*tp) for tp in partitions] or self._subs.assigned()
        committed = self._group.committed(tps, self._deadline(timeout))
        for tp in tps:
            offset = committed.get(tp)
            if offset is not None:
                self._subs.seek(tp, offset)
            else:
                self._subs.request_reset(tp, self._subs.default_reset)
            self._fetcher.discard(tp)
        return committed

    def pause(self, *partitions: TopicPartition) -> None:
        """Stop fetching ``partitions`` (assigned ones) until ``resume``: ``poll`` returns no
        records of theirs, buffered ones included, and their positions stay where they are
        (Kafka's KafkaConsumer.pause; kafka-python's and confluent-kafka's take them the same
        way, confluent's as one list). A rebalance keeps the pause of partitions that stay
        assigned."""
        for tp in self._partition_args("pause", partitions):
            self._subs.pause(tp)

    def resume(self, *partitions: TopicPartition) -> None:
        """Fetch paused ``partitions`` again, from their positions."""
        for tp in self._partition_args("resume", partitions):
            self._subs.resume(tp)
        self._net.wakeup()

    def paused(self) -> set[TopicPartition]:
        """The partitions paused now (Kafka's KafkaConsumer.paused)."""
        return set(self._subs.paused())

    def _partition_args(self, what: str, partitions: tuple[Any, ...]) -> list[TopicPartition]:
        if len(partitions) == 1 and isinstance(partitions[0], list | set | frozenset):
            partitions = tuple(partitions[0])  # confluent-kafka's pause([tp, ...])
        tps = []
        for tp in partitions:
            if not isinstance(tp, tuple) or len(tp) != 2:
                raise TypeError(f"{what}() takes TopicPartitions, got {tp!r}")
            tp = TopicPartition(*tp)
            if not self._subs.is_assigned(tp):
                raise ValueError(f"{what}(): partition {tp.topic}-{tp.partition} is not "
                                 "assigned to this consumer")
            tps.append(tp)
        return tps

    def _seek_to(self, strategy: str, partitions: tuple[TopicPartition, ...]) -> None:
        tps = [TopicPartition(*tp) for tp in partitions] or self._subs.assigned()
        for tp in tps:
            self._subs.request_reset(tp, strategy)
            self._fetcher.discard(tp)

    def position(self, partition: TopicPartition, timeout: float | None = None) -> int:
        """The offset of the next record ``poll`` will return for ``partition``.

        Looks the offset up (ListOffsets) if it is not known yet; raises KafkaTimeoutError
        after ``timeout`` seconds (default.api.timeout.ms by default).
        """
        self._check_open()
        tp = TopicPartition(*partition)
        if self._subs.position(tp) is None:
            deadline = self._deadline(timeout)
            self._init_from_committed(deadline)
            self._fetcher.reset_positions(deadline)
        position = self._subs.position(tp)
        assert position is not None
        return position

    def current_lag(self, partition: TopicPartition) -> int | None:
        """Records between the position and the end the last fetch saw: the last stable offset
        for read_committed (an open transaction holds it back), else the high watermark. None
        until a fetch of the partition has answered (the Java client's currentLag)."""
        self._check_open()
        state = self._subs.state(TopicPartition(*partition))
        end = state.last_stable_offset if self._fetcher.read_committed else state.high_watermark
        if end < 0 or state.position is None:
            return None
        return max(0, end - state.position)

    def beginning_offsets(self, partitions: Iterable[TopicPartition],
                          timeout: float | None = None) -> dict[TopicPartition, int]:
        """The log start offset of each partition (the first offset still in the log)."""
        tps = [TopicPartition(*tp) for tp in partitions]
        return self._fetcher.list_offsets(dict.fromkeys(tps, LIST_OFFSETS_EARLIEST),
                                          self._deadline(timeout))

    def end_offsets(self, partitions: Iterable[TopicPartition],
                    timeout: float | None = None) -> dict[TopicPartition, int]:
        """High watermarks (last stable offsets with read_committed)."""
        tps = [TopicPartition(*tp) for tp in partitions]
        return self._fetcher.list_offsets(dict.fromkeys(tps, LIST_OFFSETS_LATEST),
                                          self._deadline(timeout))

    def offsets_for_times(self, timestamps: Mapping[TopicPartition, int],
                          timeout: float | None = None
                          ) -> dict[TopicPartition, OffsetAndTimestamp | None]:
        """Kafka's offsetsForTimes: per partition, the first offset whose record's timestamp is
        at or after the given one (ms), or None when no record is (ListOffsets by timestamp,
        with this consumer's isolation level)."""
        from ..admin import admin_groups

        wanted = {TopicPartition(*tp): int(ts) for tp, ts in timestamps.items()}
        for tp, ts in wanted.items():
            if ts < 0:  # -1 and -2 would ask for the latest and the earliest offsets
                raise ValueError(f"the target time for partition {tp.topic}-{tp.partition} is "
                                 f"{ts}: it cannot be negative")
        if not wanted:
            return {}
        deadline = self._deadline(timeout)
        found = admin_groups.list_offsets(
            self._net, lambda topics: self._net.update_metadata(
                topics, deadline, allow_auto_topic_creation=False),
            wanted, self._fetcher.read_committed, deadline)
        return {tp: None if r.offset < 0 else OffsetAndTimestamp(r.offset, r.timestamp)
                for tp, r in found.items()}

    def list_topics(self, timeout: float | None = None) -> list[str]:
        """Names of the cluster's topics, sorted, internal ones left out (as our
        ``Admin.list_topics`` and kafka-python's ``KafkaAdminClient.list_topics``); a
        Metadata request for all topics, answered within ``timeout`` seconds
        (default.api.timeout.ms) or KafkaTimeoutError."""
        self._check_open()
        cluster = self._net.update_metadata(None, self._deadline(timeout),
                                            allow_auto_topic_creation=False)
        return sorted(name for name, meta in cluster.topics.items()
                      if not meta.error_code and not meta.is_internal)

    def topics(self) -> set[str]:
        """kafka-python's ``KafkaConsumer.topics()``: the topic names, as a set."""
        return set(self.list_topics())

    def _deadline(self, timeout: float | None) -> float:
        if timeout is None:
            timeout = self.config.default_api_timeout_ms / 1000
        return time.monotonic() + timeout

    # --- polling ----------------------------------------------------------------------------

    def poll(self, timeout: float = 1.0) -> list[ConsumerRecord]:
        """Records from the assigned partitions, waiting up to ``timeout`` seconds for some.

        Returns as soon as any records are there (at most max.poll.records), or an empty list
        when the time is up. Raises OffsetOutOfRangeError if auto.offset.reset is none and a
        position fell out of the log, and the broker's error class for non-retriable errors.
        """
        max_records = self.config.max_poll_records
        records = self._poll(timeout, lambda: self._fetcher.fetched_records(max_records), [])
        if records and (self._key_deserializer is not None
                        or self._value_deserializer is not None):
            return [self._deserialized(r) for r in records]
        return records

    def _deserialized(self, r: ConsumerRecord) -> ConsumerRecord:
        return r._replace(
            key=serde.apply(self._key_deserializer, r.topic, r.key, "key_deserializer",
                            "deserialize"),
            value=serde.apply(self._value_deserializer, r.topic, r.value, "value_deserializer",
                              "deserialize"))

    def poll_columns(self, timeout: float = 1.0) -> dict[TopicPartition, RecordColumns]:
        """``poll`` in bulk: the records decoded column-wise (records/columnar.py), per
        partition, without one object per record. Each RecordColumns has ``topic``,
        ``partition``, ``count``, ``to_arrow()`` (offset, timestamp, timestamp_type, key,
        value, headers: pyarrow arrays sharing its memory) and Python views (``offsets()``,
        ``keys()``, ...).

        As ``poll``: positions advance past what is returned; control batches are skipped;
        read_committed leaves out aborted transactions' records; compressed batches are
        decompressed; CRCs are checked (check.crcs); the same errors. Unlike ``poll``, every
        buffered record is returned (max.poll.records, a bound on per-record work, does not
        apply): a fetch's worth per partition, up to max.partition.fetch.bytes of batches.
        """
        return self._poll(timeout, self._fetcher.fetched_columns, {})

    def _poll(self, timeout: float, take: Callable[[], _Taken], nothing: _Taken) -> _Taken:
        self._check_open()
        if not self._subs.assigned() and not self._subscribed:
            raise RuntimeError("poll(): no partitions assigned (call assign() or subscribe())")
        deadline = time.monotonic() + max(0.0, timeout)
        fetcher = self._fetcher
        while True:
            if self._subscribed and self._group is not None:
                self._group.poll(max(deadline, time.monotonic() + 30))
                if not self._subs.assigned():
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return nothing
                    self._net.sleep(min(remaining, 0.1))
                    continue
            fetcher.raise_errors()
            # metadata.max.age.ms: asked again now and then even without an error (as Kafka's
            # consumer): a deposed leader that still answers as leader is left that way
            if fetcher.metadata_stale or time.monotonic() - self._net.last_metadata_at \
                    >= self.config.metadata_max_age_ms / 1000:
                try:
                    fetcher.update_metadata({tp.topic for tp in self._subs.assigned()},
                                            max(deadline, time.monotonic() + 0.001))
                except TimeoutError:
                    pass  # retried at the next turn; poll itself never times out
            if self._subs.needing_position():
                try:
                    self._init_from_committed(max(deadline, time.monotonic() + 0.001))
                    fetcher.reset_positions(max(deadline, time.monotonic() + 0.001))
                except TimeoutError:
                    pass
            taken = take()
            if taken:
                fetcher.send_fetches()  # the next fetch is under way while these are processed
                return taken
            fetcher.send_fetches()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return nothing
            for req in self._net.poll(remaining):
                fetcher.handle(req)

    def __iter__(self) -> Iterator[ConsumerRecord]:
        """``for record in consumer``: the records ``poll`` returns, one at a time.

        The loop waits for records as long as it takes, or, with ``consumer_timeout_ms`` set
        (>= 0), ends once that long has passed without a record (as kafka-python's consumer).
        Positions, auto-commits and group callbacks behave as with ``poll``: the next records
        are fetched once the ones returned before have been iterated over.
        """
        quiet_ms = self.config.consumer_timeout_ms
        while True:
            if quiet_ms < 0:
                records = self.poll(1.0)
            else:
                records = self.poll(quiet_ms / 1000)
                if not records:
                    return
            yield from records

    # --- lifecycle --------------------------------------------------------------------------

    def close(self, timeout: float | None = None) -> None:
        """Leave the group (auto-committing first if enable.auto.commit) and close the
        connections. A closed consumer cannot be used again.

        The commit and the LeaveGroup get ``timeout`` seconds in all (default 30, Java's
        ``close()``): a commit not done by then (the broker is gone) is given up with a
        warning in the log, and close returns."""
        if self._closed:
            return
        self._closed = True
        if self._group is not None and self._subscribed:
            bound = DEFAULT_CLOSE_TIMEOUT if timeout is None else max(0.0, timeout)
            self._group.close(time.monotonic() + bound)
        self._fetcher.close()
        self._net.close()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the consumer is closed")

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
