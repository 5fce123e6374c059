"""A broker's picture of a ZooKeeper cluster, kept current by watches (``MetadataView``).

It follows the znodes through the watches of ``KafkaZkClient``'s parts (cluster/zk_client.py:
brokers, election, topics, configs, partition states) and hands out immutable ``ClusterView``
snapshots (cluster/model.py), the same values a single node's metadata builds without
ZooKeeper. It imports no kazoo itself: it only calls the parts' ``watch*`` methods.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from .model import EMPTY_VIEW, TP, BrokerInfo, ClusterView, LeaderAndIsr, TopicAssignment

if TYPE_CHECKING:
    from .zk_client import KafkaZkClient

__all__ = ["MetadataView"]

# The ZooKeeper side keeps the one logger name it always had (operators filter on it).
log = logging.getLogger("oncelog.cluster.zk")


class _TopicRecord:
    """The view's watches of one topic (a new record if the topic is created again)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.alive = True
        self.topic_id: uuid.UUID | None = None
        self.partitions: dict[int, tuple[int, ...]] | None = None
        self.configs: dict[str, str] = {}
        self.watched: set[int] = set()
        self.states: dict[int, tuple[LeaderAndIsr, int]] = {}
        self.cached: TopicAssignment | None = None

    def assignment(self) -> TopicAssignment | None:
        if self.partitions is None or self.topic_id is None:
            return None
        if self.cached is None:
            self.cached = TopicAssignment(self.name, self.topic_id, self.partitions, self.configs)
        return self.cached


class MetadataView:
    """A broker's picture of the cluster, kept current by ZooKeeper watches: live brokers,
    topics (assignment, id, configs), every partition's LeaderAndIsr and zk version, and the
    controller.

    The watches are set up by ``start()`` (by the constructor itself unless ``autostart`` is
    False): it blocks until the whole current picture is loaded, then calls the listeners once.
    After each change the listeners (``on_change`` and ``add_listener``) are called with the new
    immutable ``ClusterView``, one at a time and in order, on a kazoo thread (or the thread
    calling ``start``); they must be quick and must not wait on the view (the broker hands the
    view to its event loop with ``loop.call_soon_threadsafe``). ``view`` is the latest snapshot
    (EMPTY_VIEW, seq 0, before the start).
    """

    def __init__(self, store: KafkaZkClient,
                 on_change: Callable[[ClusterView], Any] | None = None, *,
                 autostart: bool = True) -> None:
        self.store = store
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._listeners: list[Callable[[ClusterView], Any]] = []
        if on_change is not None:
            self._listeners.append(on_change)
        self._brokers: dict[int, BrokerInfo] = {}
        self._topics: dict[str, _TopicRecord] = {}
        self._controller: int | None = None
        self._seq = 0
        self._view = EMPTY_VIEW
        self._started = False
        self._holding = False  # while starting: one notification at the end
        self._closed = False
        if autostart:
            self.start()

    @property
    def view(self) -> ClusterView:
        return self._view

    def add_listener(self, listener: Callable[[ClusterView], Any]) -> None:
        with self._lock:
            if listener not in self._listeners:
                self._listeners.append(listener)

    def remove_listener(self, listener: Callable[[ClusterView], Any]) -> None:
        with self._lock:
            if listener in self._listeners:
                self._listeners.remove(listener)

    def start(self) -> ClusterView:
        """Set the watches up; returns once the whole current picture is loaded (and the
        listeners were called with it)."""
        with self._lock:
            if self._started:
                return self._view
            self._started = True
            self._holding = True
        try:
            self.store.election.watch(self._on_controller)
            self.store.brokers.watch(self._on_brokers)
            self.store.topics.watch_names(self._on_topics)
        finally:
            with self._lock:
                self._holding = False
                self._changed()
        return self._view

    def close(self) -> None:
        """Stop following (each watch stops the next time it fires)."""
        with self._lock:
            self._closed = True
            self._listeners.clear()
            self._cond.notify_all()

    def wait_for(self, predicate: Callable[[ClusterView], bool], timeout: float
                 ) -> ClusterView:
        """Block until ``predicate(view)`` holds; TimeoutError (with the last view) if it does
        not within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while not predicate(self._view):
                left = deadline - time.monotonic()
                if left <= 0 or self._closed:
                    raise TimeoutError(f"cluster view never matched; last: {self._view}")
                self._cond.wait(left)
            return self._view

    # -- watch callbacks (kazoo threads) ------------------------------------------------------

    def _changed(self) -> None:
        # With the lock held: a new snapshot, and the listeners in order.
        if self._holding or self._closed:
            return
        self._seq += 1
        topics: dict[str, TopicAssignment] = {}
        states: dict[TP, tuple[LeaderAndIsr, int]] = {}
        for name, record in sorted(self._topics.items()):
            assignment = record.assignment()
            if assignment is None:
                continue
            topics[name] = assignment
            for p, found in sorted(record.states.items()):
                if p in assignment.partitions:
                    states[(name, p)] = found
        self._view = ClusterView(self._seq, MappingProxyType(dict(self._brokers)),
                                 MappingProxyType(topics), MappingProxyType(states),
                                 self._controller)
        self._cond.notify_all()
        for listener in list(self._listeners):
            try:
                listener(self._view)
            except Exception:
                log.exception("cluster view listener %r failed", listener)

    def _on_controller(self, controller: int | None) -> Any:
        with self._lock:
            if self._closed:
                return False
            if controller != self._controller:
                self._controller = controller
                self._changed()
        return None

    def _on_brokers(self, brokers: dict[int, BrokerInfo]) -> Any:
        with self._lock:
            if self._closed:
                return False
            if brokers != self._brokers:
                self._brokers = dict(brokers)
                self._changed()
        return None

    def _on_topics(self, names: list[str]) -> Any:
        new: list[_TopicRecord] = []
        with self._lock:
            if self._closed:
                return False
            for name in names:
                if name not in self._topics:
                    record = self._topics[name] = _TopicRecord(name)
                    new.append(record)
            gone = [n for n in self._topics if n not in names]
            for name in gone:
                self._topics.pop(name).alive = False
            if gone:
                self._changed()
        # The watches outside the lock: their first call reads ZooKeeper in this thread.
        for record in new:
            self._watch_topic(record)
        return None

    def _watch_topic(self, record: _TopicRecord) -> None:
        def on_topic(topic_id: uuid.UUID | None,
                     partitions: dict[int, tuple[int, ...]] | None) -> Any:
            added: list[int] = []
            with self._lock:
                if self._closed or not record.alive:
                    return False
                if partitions is None or topic_id is None:  # deleted
                    record.alive = False
                    if self._topics.get(record.name) is record:
                        del self._topics[record.name]
                        self._changed()
                    return False
                if topic_id != record.topic_id and record.topic_id is not None:
                    record.states.clear()  # created again under the same name
                record.topic_id, record.partitions, record.cached = topic_id, partitions, None
                added = [p for p in sorted(partitions) if p not in record.watched]
                record.watched.update(added)
                self._changed()
            for p in added:
                self._watch_partition(record, p)
            return None

        def on_configs(configs: dict[str, str] | None) -> Any:
            with self._lock:
                if self._closed or not record.alive:
                    return False
                configs = configs or {}
                if configs != record.configs:
                    record.configs, record.cached = configs, None
                    if record.partitions is not None:
                        self._changed()
            return None

        self.store.configs.watch_topic(record.name, on_configs)
        self.store.topics.watch(record.name, on_topic)

    def _watch_partition(self, record: _TopicRecord, partition: int) -> None:
        def on_state(state: LeaderAndIsr | None, version: int | None) -> Any:
            with self._lock:
                if self._closed or not record.alive:
                    return False
                if state is None or version is None:
                    if record.states.pop(partition, None) is not None:
                        self._changed()
                elif record.states.get(partition) != (state, version):
                    record.states[partition] = (state, version)
                    self._changed()
            return None

        self.store.partition_states.watch(record.name, partition, on_state)
