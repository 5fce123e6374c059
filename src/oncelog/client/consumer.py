"""The Consumer users import: manual assignment, positions, ``poll``.

    consumer = Consumer(bootstrap_servers=addr, auto_offset_reset="earliest")
    consumer.assign([TopicPartition("events", 0)])
    for record in consumer.poll(timeout=1.0):
        ...

Everything runs on the caller's thread; one consumer must not be used by two threads at once
(as in the Java client). Group membership (``subscribe``, committed offsets) comes with the group
coordinator.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterable, Mapping
from typing import Any, Self

from .config import consumer_config
from .fetcher import LIST_OFFSETS_EARLIEST, LIST_OFFSETS_LATEST, Fetcher
from .network import NetworkClient
from .subscription_state import EARLIEST, LATEST, SubscriptionState
from .types import ConsumerRecord, TopicPartition

_client_ids = itertools.count(1)


class Consumer:
    """Read records from assigned partitions.

    Configuration: Kafka's consumer config names, as a dict and/or keyword arguments with
    underscores (``auto_offset_reset="earliest"``, ``isolation_level="read_committed"``).
    """

    def __init__(self, config: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        self.config = consumer_config(config, kwargs)
        self.client_id = self.config.client_id or f"oncelog-consumer-{next(_client_ids)}"
        self._net = NetworkClient(self.config, self.client_id)
        self._subs = SubscriptionState(self.config.auto_offset_reset)
        self._fetcher = Fetcher(self.config, self._net, self._subs)
        self._closed = False

    # --- assignment -------------------------------------------------------------------------

    def subscribe(self, topics: Iterable[str], *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError(
            "subscribe() needs consumer group membership, which comes with the group "
            "coordinator (a later issue); use assign([TopicPartition(topic, partition)]) now")

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Read exactly these partitions (replacing any earlier assignment)."""
        self._check_open()
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
        return set(self._subs.assigned())

    def unsubscribe(self) -> None:
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
            self._fetcher.reset_positions(self._deadline(timeout))
        position = self._subs.position(tp)
        assert position is not None
        return position

    def beginning_offsets(self, partitions: Iterable[TopicPartition],
                          timeout: float | None = None) -> dict[TopicPartition, int]:
        tps = [TopicPartition(*tp) for tp in partitions]
        return self._fetcher.list_offsets(dict.fromkeys(tps, LIST_OFFSETS_EARLIEST),
                                          self._deadline(timeout))

    def end_offsets(self, partitions: Iterable[TopicPartition],
                    timeout: float | None = None) -> dict[TopicPartition, int]:
        """High watermarks (last stable offsets with read_committed)."""
        tps = [TopicPartition(*tp) for tp in partitions]
        return self._fetcher.list_offsets(dict.fromkeys(tps, LIST_OFFSETS_LATEST),
                                          self._deadline(timeout))

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
        self._check_open()
        if not self._subs.assigned():
            raise RuntimeError("poll(): no partitions assigned (call assign() first)")
        deadline = time.monotonic() + max(0.0, timeout)
        fetcher = self._fetcher
        while True:
            fetcher.raise_errors()
            if fetcher.metadata_stale:
                try:
                    fetcher.update_metadata({tp.topic for tp in self._subs.assigned()},
                                            max(deadline, time.monotonic() + 0.001))
                except TimeoutError:
                    pass  # retried at the next turn; poll itself never times out
            if self._subs.needing_position():
                try:
                    fetcher.reset_positions(max(deadline, time.monotonic() + 0.001))
                except TimeoutError:
                    pass
            records = fetcher.fetched_records(self.config.max_poll_records)
            if records:
                fetcher.send_fetches()  # the next fetch is under way while these are processed
                return records
            fetcher.send_fetches()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return []
            for req in self._net.poll(remaining):
                fetcher.handle(req)

    # --- lifecycle --------------------------------------------------------------------------

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._fetcher.close()
        self._net.close()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the consumer is closed")

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
