"""The controller thread (Kafka's ZooKeeper-mode KafkaController), carrying out the decisions of
cluster/election.py.

``Controller`` is the IO side: a thread per broker that campaigns for ``/controller`` (again
whenever it disappears), and while it is the controller keeps the partition states right from a
``MetadataView``: initial states for new partitions, elections and ISR shrinks when brokers
change, topic deletions. Every write is conditional on the state znode's version (re-read and
decided again on a conflict) and fenced by the controller epoch's zk version; the controller
epoch is stamped into every state it writes.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from kazoo.exceptions import KazooException

from .election import (
    assign_replicas,
    new_partition_states,
    on_brokers_changed,
    partition_change,
)
from .errors import ControllerMovedError
from .metadata_view import MetadataView
from .model import ClusterView, LeaderAndIsr, TopicAssignment
from .zk_client import KafkaZkClient
from .zk_election import ControllerLease

__all__ = ["Controller", "create_topic"]

log = logging.getLogger("oncelog.cluster.controller")

TP = tuple[str, int]


def create_topic(store: KafkaZkClient, name: str, num_partitions: int, replication_factor: int,
                 configs: Mapping[str, str] | None = None, topic_id: uuid.UUID | None = None,
                 brokers: Collection[int] | None = None) -> TopicAssignment:
    """Kafka's AdminZkClient.createTopic: assign the replicas over the live brokers (or
    ``brokers``) and write the topic; the controller elects the leaders. Blocking (ZooKeeper).
    InvalidReplicationFactorError, TopicExistsError."""
    ids = sorted(brokers) if brokers is not None else sorted(store.brokers.live())
    assignment = assign_replicas(num_partitions, replication_factor, ids)
    return store.topics.create(name, assignment, topic_id or uuid.uuid4(), dict(configs or {}))


# -- the controller thread ---------------------------------------------------------------------


class Controller:
    """Broker ``node_id``'s controller thread: campaigns for ``/controller`` and, while it holds
    it, keeps every partition's state right.

    ``view``: the broker's MetadataView, shared (else the controller follows the cluster with one
    of its own). ``resync_interval_s``: seconds between full passes when nothing happens (each
    change in the view or the deletion requests wakes it at once). The work is idempotent: a
    pass compares the view with what should be and writes the difference.
    """

    def __init__(self, store: KafkaZkClient, node_id: int, *, view: MetadataView | None = None,
                 resync_interval_s: float = 5.0, retry_backoff_s: float = 0.5) -> None:
        self.store = store
        self.node_id = node_id
        self.resync_interval_s = resync_interval_s
        self.retry_backoff_s = retry_backoff_s
        self._view = view
        self._own_view = view is None
        self._lease: ControllerLease | None = None
        self._wake = threading.Event()
        self._stopping = False
        self._session_lost = False
        self._active = threading.Condition()
        self._broker_epochs: dict[int, int] = {}
        self._thread: threading.Thread | None = None

    # -- public -------------------------------------------------------------------------------

    @property
    def active(self) -> bool:
        """Whether this broker is the controller (as far as it knows)."""
        return self._lease is not None

    @property
    def epoch(self) -> int | None:
        lease = self._lease
        return None if lease is None else lease.epoch

    def start(self) -> Controller:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, daemon=True,
                                            name=f"oncelog-controller-{self.node_id}")
            self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop; resign (delete ``/controller``) if this broker is the controller, so another
        takes over at once."""
        self._stopping = True
        self._wake.set()
        with self._active:
            self._active.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)

    def wait_active(self, timeout: float) -> bool:
        with self._active:
            return self._active.wait_for(lambda: self.active or self._stopping, timeout) \
                and self.active

    def poke(self) -> None:
        """Run a pass now (thread-safe)."""
        self._wake.set()

    # -- the thread ---------------------------------------------------------------------------

    def _on_view(self, view: ClusterView) -> None:
        self._wake.set()

    def _on_deletions(self, names: list[str]) -> Any:
        if self._stopping:
            return False
        if names:
            self._wake.set()
        return None

    def _on_session(self, state: str) -> None:
        if state == "LOST":
            self._session_lost = True
        self._wake.set()

    def _set_lease(self, lease: ControllerLease | None) -> None:
        with self._active:
            self._lease = lease
            self._active.notify_all()

    def _run(self) -> None:
        self.store.zk.add_session_listener(self._on_session)
        watches_set = False
        try:
            while not self._stopping:
                try:
                    if not watches_set:
                        self._setup()
                        watches_set = True
                    self._step()
                    timeout = self.resync_interval_s
                except ControllerMovedError as exc:
                    log.info("broker %d: no longer the controller (%s)", self.node_id, exc)
                    self._set_lease(None)
                    timeout = 0.0
                except KazooException as exc:
                    if self._stopping or self.store.closed:
                        break
                    log.warning("controller %d: ZooKeeper: %r; retrying", self.node_id, exc)
                    timeout = self.retry_backoff_s
                except Exception:
                    if self._stopping or self.store.closed:
                        break
                    log.exception("controller %d: pass failed; retrying", self.node_id)
                    timeout = self.retry_backoff_s
                if self._stopping:
                    break
                if timeout:
                    self._wake.wait(timeout)
                self._wake.clear()
        finally:
            self.store.zk.remove_session_listener(self._on_session)
            if self._view is not None:
                self._view.remove_listener(self._on_view)
                if self._own_view:
                    self._view.close()
            lease, self._lease = self._lease, None
            if lease is not None and not self.store.closed:
                try:
                    self.store.election.resign(lease)
                    log.info("broker %d resigned as controller", self.node_id)
                except KazooException as exc:
                    log.warning("controller %d: resigning failed: %r", self.node_id, exc)
            with self._active:
                self._active.notify_all()

    def _setup(self) -> None:
        if self._view is None:
            self._view = MetadataView(self.store, autostart=False)
        self._view.add_listener(self._on_view)
        self._view.start()  # (a no-op if the broker's view runs already)
        self.store.topics.watch_deletions(self._on_deletions)

    def _step(self) -> None:
        if self._session_lost:
            self._session_lost = False
            if self._lease is not None:
                log.info("broker %d: session expired, no longer the controller", self.node_id)
                self._set_lease(None)
        assert self._view is not None
        view = self._view.view
        lease = self._lease
        if lease is not None and view.controller_id != self.node_id \
                and not self.store.election.holds(lease):
            log.info("broker %d: no longer the controller", self.node_id)
            self._set_lease(None)
            lease = None
        if lease is None:
            if view.controller_id is not None and view.controller_id != self.node_id:
                return  # somebody else: wait for /controller to change
            lease = self.store.election.campaign(self.node_id)
            if lease is None:
                return
            self._broker_epochs = {}
            self._set_lease(lease)
            view = self._view.view
        self._reconcile(lease, view)

    def _reconcile(self, lease: ControllerLease, view: ClusterView) -> None:
        """One pass: deletions, initial states, elections and ISR shrinks."""
        store = self.store
        deleting = set(store.topics.pending_deletions())
        for name in sorted(deleting):
            store.topics.delete_znodes(name, fence=lease)
        live = set(view.brokers)
        bounced = {b for b, info in view.brokers.items()
                   if b in self._broker_epochs and self._broker_epochs[b] != info.epoch}
        assignments = {n: t.partitions for n, t in view.topics.items() if n not in deleting}
        states = {tp: s for tp, (s, _v) in view.states.items() if tp[0] in assignments}
        for tp, state in new_partition_states(assignments, states.keys(), live,
                                              lease.epoch).items():
            if store.partition_states.create(*tp, state, fence=lease) is not None:
                log.info("%s-%d: leader %d, ISR [%s] (new)", *tp, state.leader,
                         ",".join(map(str, state.isr)))
            # else: it exists (the view is behind); the next pass sees it
        changes = on_brokers_changed(assignments, states, live, lease.epoch, bounced)
        for tp, new in sorted(changes.items()):
            self._write(lease, tp, assignments[tp[0]][tp[1]], new, view.states[tp][1], live,
                        bounced)
        self._broker_epochs = {b: info.epoch for b, info in view.brokers.items()}

    def _write(self, lease: ControllerLease, tp: TP, replicas: Sequence[int], new: LeaderAndIsr,
               version: int, live: Collection[int], bounced: Collection[int]) -> None:
        for _ in range(20):
            got = self.store.partition_states.update(*tp, new, version, fence=lease)
            if got is not None:
                log.info("%s-%d: leader %d, leader epoch %d, ISR [%s]", *tp, new.leader,
                         new.leader_epoch, ",".join(map(str, new.isr)))
                return
            found = self.store.partition_states.get(*tp)  # conflict: decide again on what is there
            if found is None:
                return
            state, version = found
            again = partition_change(replicas, state, live, lease.epoch, bounced)
            if again is None:
                return
            new = again
        log.warning("%s-%d: gave up writing its state after repeated conflicts", *tp)
