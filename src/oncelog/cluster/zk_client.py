"""The cluster's state in ZooKeeper: Kafka's KafkaZkClient, the operations on the znodes.

``KafkaZkClient`` is one broker's ZooKeeper session (a ``ZooKeeperClient``,
cluster/zookeeper_client.py) and what the cluster does with it: register brokers, elect the
controller, create and delete topics, read and write partition states on the condition of their
zk versions, hand out producer-id blocks, and watch all of it. The znodes it reads and writes,
and their encodings, are cluster/zk_data.py's (docs/cluster.md has the layout).

Its methods are synchronous and thread-safe; call them from worker threads
(``asyncio.to_thread``), never from the broker's event loop. ZooKeeper being away makes them
retry until ``op_timeout_s`` and then raise a ``kazoo.exceptions.KazooException``
(``RetryFailedError``). Writes that may race are conditional on the znode version and say so in
their result (None: somebody else wrote first; re-read and decide again).

Watches (``watch_*``, cluster/metadata_view.py's ``MetadataView``) call their callbacks on
kazoo's threads (its callback worker, or a short-lived thread after a reconnection; the very
first call happens in the thread that sets the watch up). Callbacks must be quick and must not
block on the event loop; to hand something to asyncio use ``loop.call_soon_threadsafe``. A
callback returning False stops its watch. Watches survive disconnections and session expiry
(they are set again, and called with the current value, on reconnection).

The controller's writes are fenced as Kafka's were: a ``ControllerLease`` (from ``campaign``)
carries the zk version of ``/controller_epoch`` after the election, and each fenced write is a
ZooKeeper transaction that checks that version first (``ControllerMovedError`` when another
controller was elected since).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kazoo.client import KazooState
from kazoo.exceptions import (
    BadVersionError,
    KazooException,
    NodeExistsError,
    NoNodeError,
    RolledBackError,
)
from kazoo.recipe.watchers import ChildrenWatch, DataWatch

from .errors import (
    BrokerIdInUseError,
    ClusterError,
    ControllerMovedError,
    TopicExistsError,
    UnknownTopicError,
)
from .model import BrokerInfo, LeaderAndIsr, TopicAssignment
from .zk_configs import ZkConfigStore
from .zk_data import (
    PERSISTENT_ZK_PATHS,
    BrokerIdsZNode,
    BrokerIdZNode,
    ClusterIdZNode,
    ConfigEntityZNode,
    ConfigType,
    ControllerEpochZNode,
    ControllerZNode,
    DeleteTopicsTopicZNode,
    DeleteTopicsZNode,
    ProducerIdBlockZNode,
    TopicPartitionStateZNode,
    TopicPartitionsZNode,
    TopicPartitionZNode,
    TopicsZNode,
    TopicZNode,
)
from .zookeeper_client import RETRYABLE

__all__ = ["ControllerLease", "KafkaZkClient"]

# The ZooKeeper side keeps the one logger name it always had (operators filter on it).
log = logging.getLogger("oncelog.cluster.zk")

MAX_PRODUCER_ID = 2**63 - 1


@dataclass(frozen=True)
class ControllerLease:
    """What ``campaign`` won: the controller epoch and the zk version of ``/controller_epoch``
    that fences this controller's writes."""

    node_id: int
    epoch: int
    epoch_zk_version: int


def _check_topic_name(name: str) -> None:
    if not name or name in (".", "..") or "/" in name or len(name) > 249:
        raise ValueError(f"illegal topic name {name!r}")


def _failed(results: Sequence[Any]) -> list[Exception]:
    return [r for r in results if isinstance(r, Exception)]


class KafkaZkClient(ZkConfigStore):
    """One broker's ZooKeeper session and the cluster's data model on it.

    ``session_timeout_s`` (seconds) is how long ZooKeeper keeps this broker's ephemeral znodes
    (registration, controllership) after it stops hearing from it. ``op_timeout_s`` bounds each
    method's retries while ZooKeeper is unreachable.
    """

    def __init__(self, connect: str, *, session_timeout_s: float = 6.0,
                 connect_timeout_s: float = 15.0, op_timeout_s: float = 30.0) -> None:
        self._registration: tuple[int, bytes] | None = None
        self._register_lock = threading.Lock()
        self._pid_lock = threading.Lock()
        super().__init__(connect, session_timeout_s=session_timeout_s,
                         connect_timeout_s=connect_timeout_s, op_timeout_s=op_timeout_s)
        try:
            for path in PERSISTENT_ZK_PATHS:
                self._r("ensure_path", self._p(path))
        except BaseException:
            self.close()
            raise

    def cluster_id(self, proposed: str) -> str:
        """The cluster's id (``/cluster/id``, as Kafka): the first broker's proposal wins."""
        path = self._p(ClusterIdZNode.path())
        try:
            self._r("create", path, ClusterIdZNode.encode(proposed), makepath=True)
        except NodeExistsError:
            pass
        data, _stat = self._r("get", path)
        return ClusterIdZNode.decode(data)

    def _set_conditional(self, path: str, data: bytes, version: int,
                         fence: ControllerLease | None = None) -> int | None:
        """set_data on the condition of ``version`` (and of the controller fence): the new
        version, or None on a conflict (or if the znode is gone). A write whose answer was lost
        with the connection is checked once the connection is back."""
        full = self._p(path)
        while True:
            try:
                if fence is None:
                    stat = self._once("set", full, data, version)
                    return int(stat.version)
                tx = self._client.transaction()
                tx.check(self._p(ControllerEpochZNode.path()), fence.epoch_zk_version)
                tx.set_data(full, data, version)
                results = self._commit(tx)
                if not _failed(results):
                    return int(results[1].version)
                self._raise_if_fenced(results[0], fence)
                return None
            except (BadVersionError, NoNodeError):
                return None
            except RETRYABLE:
                if self._closed:
                    raise
                try:
                    current, stat = self._r("get", full)
                except NoNodeError:
                    return None
                if stat.version == version:
                    continue  # not applied: again
                if stat.version == version + 1 and current == data:
                    return int(stat.version)  # ours, its answer lost
                return None

    def _raise_if_fenced(self, check_result: Any, fence: ControllerLease) -> None:
        if isinstance(check_result, Exception) and not isinstance(check_result, RolledBackError):
            raise ControllerMovedError(
                f"controller epoch {fence.epoch} of broker {fence.node_id} is over: another "
                "controller was elected")

    def _after_new_session(self) -> None:
        # The registration was ephemeral: it went with the expired session.
        if self._registration is not None:
            self._client.handler.spawn(self._reregister)

    # -- brokers ------------------------------------------------------------------------------

    def register_broker(self, node_id: int, host: str, port: int, rack: str | None = None,
                        *, timeout_s: float = 0.0, security_protocol: str = "PLAINTEXT"
                        ) -> BrokerInfo:
        """Register this broker (ephemeral ``/brokers/ids/<id>``); it is registered again by
        itself after a session expiry. BrokerIdInUseError if another live session holds the id
        (after waiting up to ``timeout_s`` seconds for it to go: a broker restarted right after a
        crash waits out its old session)."""
        data = BrokerIdZNode.encode(host, port, rack, security_protocol)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                info = self._create_registration(node_id, data)
                break
            except BrokerIdInUseError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.1)
        self._registration = (node_id, data)
        return info

    def _create_registration(self, node_id: int, data: bytes) -> BrokerInfo:
        path = self._p(BrokerIdZNode.path(node_id))
        with self._register_lock:
            while True:
                try:
                    self._r("create", path, data, ephemeral=True)
                except NodeExistsError:
                    pass
                try:
                    current, stat = self._r("get", path)
                except NoNodeError:
                    continue  # went away meanwhile: create again
                if stat.ephemeralOwner != self._client._session_id:
                    raise BrokerIdInUseError(
                        f"broker id {node_id} is registered by another live ZooKeeper session "
                        f"(0x{stat.ephemeralOwner:x}): another broker with this node.id runs, "
                        "or one stopped without closing its session and it has not expired "
                        "yet (up to its session timeout)")
                if current != data:
                    self._r("set", path, data)
                return BrokerIdZNode.decode(node_id, data, int(stat.czxid))

    def _reregister(self) -> None:
        registration = self._registration
        if registration is None:
            return
        node_id, data = registration
        deadline = time.monotonic() + max(10.0, 2 * self.session_timeout_s)
        while not self._closed and self._registration is registration:
            try:
                self._create_registration(node_id, data)
                log.info("broker %d registered again after its session expired", node_id)
                return
            except BrokerIdInUseError as exc:
                if time.monotonic() >= deadline:
                    log.error("cannot register broker %d again: %s", node_id, exc)
                    return
            except KazooException as exc:
                if self._closed:
                    return
                log.warning("registering broker %d again failed (%r); retrying", node_id, exc)
            time.sleep(0.2)

    def unregister_broker(self) -> None:
        """Remove this broker's registration (a clean shutdown; closing does it too)."""
        registration, self._registration = self._registration, None
        if registration is None:
            return
        path = self._p(BrokerIdZNode.path(registration[0]))
        try:
            stat = self._r("exists", path)
            if stat is not None and stat.ephemeralOwner == self._client._session_id:
                self._r("delete", path, stat.version)
        except (NoNodeError, BadVersionError):
            pass

    def live_brokers(self) -> dict[int, BrokerInfo]:
        ids = sorted(int(c) for c in self._children(BrokerIdsZNode.path()))
        found = self._get_many([self._p(BrokerIdZNode.path(i)) for i in ids])
        return {i: BrokerIdZNode.decode(i, got[0], int(got[1].czxid))
                for i, got in zip(ids, found, strict=True) if got is not None}

    # -- the controller -----------------------------------------------------------------------

    def campaign(self, node_id: int) -> ControllerLease | None:
        """Try to become the controller: create the ephemeral ``/controller`` and bump
        ``/controller_epoch`` in one transaction, conditional on the epoch's version (Kafka's
        registerControllerAndIncrementControllerEpoch). None when another broker is the
        controller."""
        data = ControllerZNode.encode(node_id)
        epoch_path = self._p(ControllerEpochZNode.path())
        for _ in range(20):
            try:
                raw, stat = self._r("get", epoch_path)
            except NoNodeError:
                try:
                    self._r("create", epoch_path, ControllerEpochZNode.encode(0))
                except NodeExistsError:
                    pass
                continue
            epoch, version = ControllerEpochZNode.decode(raw), int(stat.version)
            if self._r("exists", self._p(ControllerZNode.path())) is not None:
                return self._own_lease(node_id)
            tx = self._client.transaction()
            tx.create(self._p(ControllerZNode.path()), data, ephemeral=True)
            tx.set_data(epoch_path, ControllerEpochZNode.encode(epoch + 1), version)
            try:
                results = self._commit(tx)
            except RETRYABLE:
                if self._closed:
                    raise
                lease = self._own_lease(node_id)
                if lease is not None:
                    return lease
                continue
            if not _failed(results):
                log.info("broker %d is the controller, epoch %d", node_id, epoch + 1)
                return ControllerLease(node_id, epoch + 1, version + 1)
            if isinstance(results[0], NodeExistsError):
                return self._own_lease(node_id)
            # the epoch moved (another broker won and maybe went already): look again
        return None

    def _own_lease(self, node_id: int) -> ControllerLease | None:
        """The lease if ``/controller`` is ours (this session, this node id)."""
        try:
            data, stat = self._r("get", self._p(ControllerZNode.path()))
            raw, estat = self._r("get", self._p(ControllerEpochZNode.path()))
        except NoNodeError:
            return None
        if (stat.ephemeralOwner != self._client._session_id
                or ControllerZNode.decode(data) != node_id):
            return None
        return ControllerLease(node_id, ControllerEpochZNode.decode(raw), int(estat.version))

    def elect_controller(self, node_id: int) -> int | None:
        """``campaign`` returning the controller epoch won, or None."""
        lease = self.campaign(node_id)
        return None if lease is None else lease.epoch

    def controller_id(self) -> int | None:
        try:
            data, _stat = self._r("get", self._p(ControllerZNode.path()))
        except NoNodeError:
            return None
        return ControllerZNode.decode(data)

    def controller_epoch(self) -> tuple[int, int] | None:
        """(controller epoch, zk version of ``/controller_epoch``), None before any election."""
        try:
            raw, stat = self._r("get", self._p(ControllerEpochZNode.path()))
        except NoNodeError:
            return None
        return ControllerEpochZNode.decode(raw), int(stat.version)

    def is_controller(self, lease: ControllerLease) -> bool:
        """Whether ``lease`` still holds: /controller is this session's and the epoch the
        same."""
        own = self._own_lease(lease.node_id)
        return own is not None and own.epoch_zk_version == lease.epoch_zk_version

    def resign_controller(self, lease: ControllerLease) -> None:
        """Delete ``/controller`` if it is still ours (another broker takes over at once)."""
        path = self._p(ControllerZNode.path())
        try:
            stat = self._r("exists", path)
            if stat is not None and stat.ephemeralOwner == self._client._session_id:
                self._r("delete", path, stat.version)
        except (NoNodeError, BadVersionError):
            pass

    # -- topics -------------------------------------------------------------------------------

    def create_topic(self, name: str, assignment: Mapping[int, Sequence[int]],
                     topic_id: uuid.UUID | None = None,
                     configs: Mapping[str, str] | None = None) -> TopicAssignment:
        """Create ``/config/topics/<name>`` and ``/brokers/topics/<name>`` at once (the
        controller then elects the leaders). TopicExistsError if the topic exists or is being
        deleted."""
        _check_topic_name(name)
        if not assignment or sorted(assignment) != list(range(len(assignment))):
            raise ValueError(f"partitions must be numbered 0..n-1, not {sorted(assignment)}")
        for p, reps in assignment.items():
            if not reps or len(set(reps)) != len(reps):
                raise ValueError(f"partition {p}: bad replica list {list(reps)}")
        topic_id = topic_id or uuid.uuid4()
        configs = dict(configs or {})
        if self._r("exists", self._p(DeleteTopicsTopicZNode.path(name))) is not None:
            raise TopicExistsError(f"topic {name!r} is marked for deletion")
        data = TopicZNode.encode(assignment, topic_id)
        config_path = self._p(ConfigEntityZNode.path(ConfigType.TOPIC, name))
        for _ in range(10):
            config_stat = self._r("exists", config_path)
            tx = self._client.transaction()
            if config_stat is None:
                tx.create(config_path, ConfigEntityZNode.encode(configs))
            else:  # left over (Kafka writes configs first): ours now
                tx.set_data(config_path, ConfigEntityZNode.encode(configs), config_stat.version)
            tx.create(self._p(TopicZNode.path(name)), data)
            tx.create(self._p(TopicPartitionsZNode.path(name)), b"")
            try:
                results = self._commit(tx)
            except RETRYABLE:
                if self._closed:
                    raise
                found = self._get_many([self._p(TopicZNode.path(name))])[0]
                if found is not None and found[0] == data:
                    break  # ours, its answer lost
                if found is not None:
                    raise TopicExistsError(f"topic {name!r} already exists") from None
                continue
            failures = _failed(results)
            if not failures:
                break
            if isinstance(results[1], NodeExistsError):
                raise TopicExistsError(f"topic {name!r} already exists")
            # the config znode changed under us: again
        else:
            raise ClusterError(f"could not create topic {name!r}: too much contention")
        return TopicAssignment(name, topic_id, {p: tuple(r) for p, r in assignment.items()},
                               configs)

    def add_partitions(self, name: str, added: Mapping[int, Sequence[int]]) -> None:
        """Add partitions to a topic's assignment (``/brokers/topics/<name>``, Kafka's
        setTopicAssignment after AdminZkClient.addPartitions); the controller then elects
        their leaders. The write is conditional on the znode's version, and ``added`` must
        continue the partitions there (ClusterError when they changed meanwhile).
        UnknownTopicError."""
        path = TopicZNode.path(name)
        found = self._get_many([self._p(path)])[0]
        decoded = TopicZNode.decode(found[0]) if found is not None else None
        if found is None or decoded is None:
            raise UnknownTopicError(f"topic {name!r} does not exist")
        topic_id, partitions = decoded
        if sorted(added) != list(range(len(partitions), len(partitions) + len(added))):
            raise ClusterError(f"topic {name!r} has {len(partitions)} partitions now, not the "
                               f"{min(added)} the new ones were planned after")
        assignment = {**partitions, **{p: tuple(r) for p, r in added.items()}}
        if self._set_conditional(path, TopicZNode.encode(assignment, topic_id),
                                 int(found[1].version)) is None:
            raise ClusterError(f"topic {name!r} changed while partitions were added")

    def topic(self, name: str) -> TopicAssignment | None:
        topic, config = self._get_many([self._p(TopicZNode.path(name)),
                                        self._p(ConfigEntityZNode.path(ConfigType.TOPIC, name))])
        decoded = TopicZNode.decode(topic[0]) if topic is not None else None
        if decoded is None:
            return None
        return TopicAssignment(name, decoded[0], decoded[1],
                               ConfigEntityZNode.decode(config[0]) if config is not None else {})

    def topic_names(self) -> list[str]:
        return sorted(self._children(TopicsZNode.path()))

    def topic_assignments(self) -> dict[str, TopicAssignment]:
        names = self.topic_names()
        paths = []
        for n in names:
            paths += [self._p(TopicZNode.path(n)),
                      self._p(ConfigEntityZNode.path(ConfigType.TOPIC, n))]
        found = self._get_many(paths)
        out = {}
        for i, n in enumerate(names):
            topic, config = found[2 * i], found[2 * i + 1]
            decoded = TopicZNode.decode(topic[0]) if topic is not None else None
            if decoded is not None:
                configs = ConfigEntityZNode.decode(config[0]) if config is not None else {}
                out[n] = TopicAssignment(n, decoded[0], decoded[1], configs)
        return out

    def set_topic_configs(self, name: str, configs: Mapping[str, str]) -> None:
        """Replace a topic's configs (brokers see them through their watches)."""
        path = self._p(ConfigEntityZNode.path(ConfigType.TOPIC, name))
        if self._r("exists", self._p(TopicZNode.path(name))) is None:
            raise UnknownTopicError(f"topic {name!r} does not exist")
        try:
            self._r("set", path, ConfigEntityZNode.encode(configs))
        except NoNodeError:
            self._r("create", path, ConfigEntityZNode.encode(configs))

    def request_topic_deletion(self, name: str) -> None:
        """Ask the controller to delete a topic (``/admin/delete_topics/<name>``).
        UnknownTopicError if there is no such topic; asking twice is fine."""
        _check_topic_name(name)
        if self._r("exists", self._p(TopicZNode.path(name))) is None:
            raise UnknownTopicError(f"topic {name!r} does not exist")
        try:
            self._r("create", self._p(DeleteTopicsTopicZNode.path(name)), b"")
        except NodeExistsError:
            pass

    def pending_deletions(self) -> list[str]:
        return sorted(self._children(DeleteTopicsZNode.path()))

    def delete_topic_znodes(self, name: str, *, fence: ControllerLease | None = None) -> bool:
        """The controller's part of a deletion: remove the topic's znodes (partition states,
        assignment, configs) and its deletion request in one transaction (the brokers see the
        topic vanish at once and delete their logs). False if there was nothing left."""
        for _ in range(20):
            tree = self._subtree(TopicZNode.path(name))
            doomed = list(reversed(tree))  # children before parents
            for extra in (ConfigEntityZNode.path(ConfigType.TOPIC, name),
                          DeleteTopicsTopicZNode.path(name)):
                if self._r("exists", self._p(extra)) is not None:
                    doomed.append(extra)
            if not doomed:
                return False
            tx = self._client.transaction()
            if fence is not None:
                tx.check(self._p(ControllerEpochZNode.path()), fence.epoch_zk_version)
            for path in doomed:
                tx.delete(self._p(path))
            try:
                results = self._commit(tx)
            except RETRYABLE:
                if self._closed:
                    raise
                continue  # look again: whatever is left goes
            if not _failed(results):
                log.info("topic %s deleted", name)
                return True
            if fence is not None:
                self._raise_if_fenced(results[0], fence)
            # NotEmpty / NoNode: the tree changed meanwhile; again
        raise ClusterError(f"could not delete the znodes of topic {name!r}")

    def _subtree(self, path: str) -> list[str]:
        """``path`` and everything under it, parents first ([] if it does not exist)."""
        try:
            children = self._r("get_children", self._p(path))
        except NoNodeError:
            return []
        out = [path]
        for child in sorted(children):
            out += self._subtree(f"{path}/{child}")
        return out

    # -- partition states ---------------------------------------------------------------------

    def partition_state(self, topic: str, partition: int) -> tuple[LeaderAndIsr, int] | None:
        """(state, zk version), or None while the partition has no state znode."""
        try:
            data, stat = self._r("get", self._p(TopicPartitionStateZNode.path(topic, partition)))
        except NoNodeError:
            return None
        state = TopicPartitionStateZNode.decode(data)
        return None if state is None else (state, int(stat.version))

    def partition_states(self, partitions: Iterable[tuple[str, int]]
                         ) -> dict[tuple[str, int], tuple[LeaderAndIsr, int]]:
        """``partition_state`` of many partitions in one round trip (those with a state)."""
        tps = list(partitions)
        found = self._get_many([self._p(TopicPartitionStateZNode.path(t, p)) for t, p in tps])
        out = {}
        for tp, got in zip(tps, found, strict=True):
            state = TopicPartitionStateZNode.decode(got[0]) if got is not None else None
            if state is not None and got is not None:
                out[tp] = (state, int(got[1].version))
        return out

    def create_partition_state(self, topic: str, partition: int, state: LeaderAndIsr, *,
                               fence: ControllerLease | None = None) -> int | None:
        """Create the state znode (version 0); None if it exists already (or the topic is
        gone)."""
        if self._r("exists", self._p(TopicZNode.path(topic))) is None:
            return None
        for parent in (TopicPartitionsZNode.path(topic),
                       TopicPartitionZNode.path(topic, partition)):
            try:
                self._r("create", self._p(parent), b"")
            except NodeExistsError:
                pass
            except NoNodeError:
                return None  # the topic went meanwhile
        path = self._p(TopicPartitionStateZNode.path(topic, partition))
        data = TopicPartitionStateZNode.encode(state)
        while True:
            try:
                if fence is None:
                    self._once("create", path, data)
                else:
                    tx = self._client.transaction()
                    tx.check(self._p(ControllerEpochZNode.path()), fence.epoch_zk_version)
                    tx.create(path, data)
                    results = self._commit(tx)
                    if _failed(results):
                        self._raise_if_fenced(results[0], fence)
                        return None
                return 0
            except (NodeExistsError, NoNodeError):
                return None
            except RETRYABLE:
                if self._closed:
                    raise
                try:
                    current, stat = self._r("get", path)
                except NoNodeError:
                    continue  # not created: again
                return 0 if stat.version == 0 and current == data else None

    def update_partition_state(self, topic: str, partition: int, state: LeaderAndIsr,
                               expected_version: int, *, fence: ControllerLease | None = None
                               ) -> int | None:
        """Write the state on the condition that the znode is still at ``expected_version``:
        the new version, or None on a conflict (re-read: the controller or the leader wrote
        meanwhile). ``fence``: the controller's writes (ControllerMovedError when deposed)."""
        return self._set_conditional(TopicPartitionStateZNode.path(topic, partition),
                                     TopicPartitionStateZNode.encode(state), expected_version,
                                     fence)

    # -- producer ids -------------------------------------------------------------------------

    def allocate_producer_id_block(self, node_id: int, size: int = 1000) -> tuple[int, int]:
        """The next ``size`` producer ids for broker ``node_id``: (start, end inclusive), never
        handed to anybody else (Kafka's ZkProducerIdManager: a conditional set loop on
        ``/latest_producer_id_block``)."""
        if size <= 0:
            raise ValueError("size must be positive")
        path = ProducerIdBlockZNode.path()
        with self._pid_lock:
            while True:
                try:
                    data, stat = self._r("get", self._p(path))
                except NoNodeError:
                    try:
                        self._r("create", self._p(path), b"")
                    except NodeExistsError:
                        pass
                    continue
                current = ProducerIdBlockZNode.decode(data)
                start = 0 if current is None else current[2] + 1
                end = start + size - 1
                if end > MAX_PRODUCER_ID:
                    raise ClusterError("producer ids are exhausted")
                version = self._set_conditional(
                    path, ProducerIdBlockZNode.encode(node_id, start, end), int(stat.version))
                if version is not None:
                    return start, end

    # -- watches ------------------------------------------------------------------------------

    def watch_brokers(self, callback: Callable[[dict[int, BrokerInfo]], Any]) -> None:
        """``callback(live_brokers)`` now, on every registration change, and after each
        reconnection (a broker may have registered again with the same id meanwhile). Calls are
        serialized, each with data read after the previous call.

        Every read comes after a watch on ``/brokers/ids`` is armed (a one-shot children watch,
        armed again on each event and each reconnection, then the registrations read), so no
        change after a read can go unseen. (kazoo's ChildrenWatch re-arms on a thread of its
        own after a reconnection and calls back only when the ids differ from those it saw
        before the connection went: a broker whose session expired and that registered again
        between a read and that re-arming, under the same id, stayed out of the view for good,
        and a controller deciding from it kept its partitions offline.)"""
        lock = threading.Lock()
        stopped = False
        path = self._p(BrokerIdsZNode.path())

        def on_event(event: Any) -> None:
            # kazoo's callback thread. NONE: the connection went; on_session arms again.
            if not stopped and event is not None and event.type != "NONE":
                arm_and_read()

        def arm_and_read() -> None:
            nonlocal stopped
            with lock:
                while not stopped:  # as kazoo's own watches: until ZooKeeper answers
                    if self._closed:
                        stopped = True
                        break
                    try:
                        self._r("get_children", path, watch=on_event)
                        brokers = self.live_brokers()
                    except KazooException as exc:
                        log.warning("reading the live brokers failed: %r; retrying", exc)
                        time.sleep(0.2)
                        continue
                    if _call_quietly(callback, brokers) is False:
                        stopped = True
                    break

        def on_session(state: str) -> None:
            if stopped:
                self.remove_session_listener(on_session)
            elif state == KazooState.CONNECTED:
                threading.Thread(target=arm_and_read, daemon=True,
                                 name="oncelog-zk-brokers-refresh").start()

        self.add_session_listener(on_session)
        arm_and_read()

    def _watch_children(self, path: str, callback: Callable[[list[str]], Any]) -> ChildrenWatch:
        """``callback(sorted children of path)`` now and on every change, until closed."""
        def on_children(children: list[str]) -> Any:
            if self._closed:
                return False
            return _call_quietly(callback, sorted(children))
        return ChildrenWatch(self._client, self._p(path), on_children)

    def watch_topics(self, callback: Callable[[list[str]], Any]) -> ChildrenWatch:
        """``callback(sorted topic names)`` now and whenever topics come or go."""
        return self._watch_children(TopicsZNode.path(), callback)

    def watch_deletions(self, callback: Callable[[list[str]], Any]) -> ChildrenWatch:
        """``callback(sorted topics to delete)`` on every change of ``/admin/delete_topics``."""
        return self._watch_children(DeleteTopicsZNode.path(), callback)

    def watch_controller(self, callback: Callable[[int | None], Any]) -> DataWatch:
        """``callback(controller id or None)`` on every change of ``/controller``."""
        def on_data(data: bytes | None, stat: Any, event: Any = None) -> Any:
            if self._closed:
                return False
            try:
                controller = ControllerZNode.decode(data)
            except (ValueError, KeyError):
                controller = None
            return _call_quietly(callback, controller)
        return DataWatch(self._client, self._p(ControllerZNode.path()), on_data)

    def watch_topic(self, name: str,
                    callback: Callable[[uuid.UUID | None, dict[int, tuple[int, ...]] | None],
                                       Any]) -> DataWatch:
        """``callback(topic_id, partitions)`` on every change of ``/brokers/topics/<name>``
        ``(None, None)`` when it does not exist."""
        def on_data(data: bytes | None, stat: Any, event: Any = None) -> Any:
            if self._closed:
                return False
            decoded = TopicZNode.decode(data)
            if decoded is None:
                return _call_quietly(callback, None, None)
            return _call_quietly(callback, decoded[0], decoded[1])
        return DataWatch(self._client, self._p(TopicZNode.path(name)), on_data)

    def watch_topic_configs(self, name: str,
                            callback: Callable[[dict[str, str] | None], Any]) -> DataWatch:
        """``callback(configs)`` on every change of ``/config/topics/<name>`` (None when it
        does not exist)."""
        def on_data(data: bytes | None, stat: Any, event: Any = None) -> Any:
            if self._closed:
                return False
            return _call_quietly(callback, None if stat is None else ConfigEntityZNode.decode(data))
        return DataWatch(self._client, self._p(ConfigEntityZNode.path(ConfigType.TOPIC, name)),
                         on_data)

    def watch_partition_state(self, topic: str, partition: int,
                              callback: Callable[[LeaderAndIsr | None, int | None], Any]
                              ) -> DataWatch:
        """``callback(state, zk_version)`` now and on every change of the partition's state
        znode (``(None, None)`` while it does not exist)."""
        def on_data(data: bytes | None, stat: Any, event: Any = None) -> Any:
            if self._closed:
                return False
            state = TopicPartitionStateZNode.decode(data) if stat is not None else None
            return _call_quietly(callback, state, None if state is None else int(stat.version))
        return DataWatch(self._client, self._p(TopicPartitionStateZNode.path(topic, partition)),
                         on_data)


def _call_quietly(callback: Callable[..., Any], *args: Any) -> Any:
    # Never let an exception reach kazoo's watch machinery: DataWatch calls a callback that
    # raised TypeError a second time, with fewer arguments.
    try:
        return callback(*args)
    except Exception:
        log.exception("cluster watch callback %r failed", callback)
        return None

