"""The cluster's state in ZooKeeper, laid out as Kafka's ZooKeeper mode did (docs/cluster.md).

``ClusterStore`` wraps one ``KazooClient`` (one ZooKeeper session: a broker's). Its methods are
synchronous and thread-safe; call them from worker threads (``asyncio.to_thread``), never from
the broker's event loop. ZooKeeper being away makes them retry until ``op_timeout_s`` and then
raise a ``kazoo.exceptions.KazooException`` (``RetryFailedError``). Writes that may race are
conditional on the znode version and say so in their result (None: somebody else wrote first;
re-read and decide again).

Paths (under the connect string's chroot, e.g. ``127.0.0.1:2181/oncelog``, created if missing):

- ``/brokers/ids/<id>`` (ephemeral): ``{"version":5,"host":h,"port":p,"endpoints":[...],"rack":r}``
- ``/controller`` (ephemeral): ``{"version":1,"brokerid":id,"timestamp":"ms"}``;
  ``/controller_epoch``: ``<n>``
- ``/brokers/topics/<topic>``: ``{"version":2,"topic_id":"<uuid>","partitions":{"0":[1,2,3]}}``
- ``/config/topics/<topic>``: ``{"version":1,"config":{...}}``
- ``/brokers/topics/<topic>/partitions/<p>/state``:
  ``{"version":1,"leader":1,"leader_epoch":3,"isr":[1,2,3],"controller_epoch":2}``
- ``/admin/delete_topics/<topic>``: a deletion request, carried out by the controller
- ``/latest_producer_id_block``: ``{"version":1,"broker":id,"block_start":s,"block_end":e}``

Watches (``watch_*``, ``MetadataView``) call their callbacks on kazoo's threads (its callback
worker, or a short-lived thread after a reconnection; the very first call happens in the thread
that sets the watch up). Callbacks must be quick and must not block on the event loop; to hand
something to asyncio use ``loop.call_soon_threadsafe``. A callback returning False stops its
watch. Watches survive disconnections and session expiry (they are set again, and called with
the current value, on reconnection).

The controller's writes are fenced as Kafka's were: a ``ControllerLease`` (from ``campaign``)
carries the zk version of ``/controller_epoch`` after the election, and each fenced write is a
ZooKeeper transaction that checks that version first (``ControllerMovedError`` when another
controller was elected since).
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Self

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import (
    BadVersionError,
    ConnectionClosedError,
    ConnectionLoss,
    KazooException,
    NodeExistsError,
    NoNodeError,
    OperationTimeoutError,
    RolledBackError,
    SessionExpiredError,
)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.recipe.watchers import ChildrenWatch, DataWatch
from kazoo.retry import KazooRetry, RetryFailedError

__all__ = [
    "NO_LEADER",
    "BrokerIdInUseError",
    "BrokerInfo",
    "ClusterConnectionError",
    "ClusterError",
    "ClusterStore",
    "ClusterView",
    "ControllerLease",
    "ControllerMovedError",
    "LeaderAndIsr",
    "MetadataView",
    "TopicAssignment",
    "TopicExistsError",
    "UnknownTopicError",
    "split_connect_string",
]

log = logging.getLogger("oncelog.cluster.zk")

NO_LEADER = -1
NULL_TOPIC_ID = uuid.UUID(int=0)
MAX_PRODUCER_ID = 2**63 - 1

# Kafka's ZooKeeper paths.
BROKER_IDS = "/brokers/ids"
TOPICS = "/brokers/topics"
CONFIG_TOPICS = "/config/topics"
DELETE_TOPICS = "/admin/delete_topics"
CONTROLLER = "/controller"
CONTROLLER_EPOCH = "/controller_epoch"
PRODUCER_ID_BLOCK = "/latest_producer_id_block"
PERSISTENT_PATHS = (BROKER_IDS, TOPICS, CONFIG_TOPICS, DELETE_TOPICS, PRODUCER_ID_BLOCK)

_RETRYABLE = (ConnectionLoss, OperationTimeoutError, SessionExpiredError)


def broker_path(node_id: int) -> str:
    return f"{BROKER_IDS}/{node_id}"


def topic_path(topic: str) -> str:
    return f"{TOPICS}/{topic}"


def topic_config_path(topic: str) -> str:
    return f"{CONFIG_TOPICS}/{topic}"


def partitions_path(topic: str) -> str:
    return f"{TOPICS}/{topic}/partitions"


def partition_path(topic: str, partition: int) -> str:
    return f"{TOPICS}/{topic}/partitions/{partition}"


def partition_state_path(topic: str, partition: int) -> str:
    return f"{TOPICS}/{topic}/partitions/{partition}/state"


def delete_topic_path(topic: str) -> str:
    return f"{DELETE_TOPICS}/{topic}"


# -- errors ------------------------------------------------------------------------------------


class ClusterError(Exception):
    """A cluster-level refusal (not ZooKeeper being away: that is a KazooException)."""


class ClusterConnectionError(ClusterError):
    """ZooKeeper could not be reached when connecting."""


class BrokerIdInUseError(ClusterError):
    """Another live ZooKeeper session holds ``/brokers/ids/<id>``."""


class TopicExistsError(ClusterError):
    """The topic exists (or is being deleted)."""


class UnknownTopicError(ClusterError):
    """No such topic."""


class ControllerMovedError(ClusterError):
    """A fenced controller write failed: another controller was elected since."""


# -- values ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BrokerInfo:
    """A live broker (``/brokers/ids/<id>``). ``epoch`` is the registration znode's czxid:
    Kafka's broker epoch, new with every registration (a broker that restarted quickly has a
    new one)."""

    node_id: int
    host: str
    port: int
    rack: str | None = None
    epoch: int = -1
    endpoints: tuple[str, ...] = ()


@dataclass(frozen=True)
class LeaderAndIsr:
    """A partition's state znode. ``leader`` is NO_LEADER (-1) while the partition is offline."""

    leader: int
    leader_epoch: int
    isr: tuple[int, ...]
    controller_epoch: int

    def __post_init__(self) -> None:
        if not isinstance(self.isr, tuple):
            object.__setattr__(self, "isr", tuple(self.isr))

    @property
    def has_leader(self) -> bool:
        return self.leader >= 0


@dataclass(frozen=True, eq=True)
class TopicAssignment:
    """A topic: its replica assignment (partition -> replicas, the first one preferred), its id
    and its configs (``/config/topics/<topic>``). Immutable (read-only mappings)."""

    name: str
    topic_id: uuid.UUID
    partitions: Mapping[int, tuple[int, ...]]
    configs: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "partitions", MappingProxyType(
            {int(p): tuple(int(r) for r in reps) for p, reps in sorted(self.partitions.items())}))
        object.__setattr__(self, "configs", MappingProxyType(
            {str(k): str(v) for k, v in self.configs.items()}))

    def __hash__(self) -> int:
        return hash((self.name, self.topic_id))

    @property
    def num_partitions(self) -> int:
        return len(self.partitions)

    @property
    def replication_factor(self) -> int:
        return len(self.partitions[0]) if self.partitions else 0


@dataclass(frozen=True)
class ControllerLease:
    """What ``campaign`` won: the controller epoch and the zk version of ``/controller_epoch``
    that fences this controller's writes."""

    node_id: int
    epoch: int
    epoch_zk_version: int


# -- JSON (Kafka's encodings, compact) ---------------------------------------------------------


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def _loads(data: bytes | None) -> Any:
    if not data:
        return None
    return json.loads(data)


def encode_broker(host: str, port: int, rack: str | None = None) -> bytes:
    return _dumps({"version": 5, "host": host, "port": port,
                   "endpoints": [f"PLAINTEXT://{host}:{port}"], "rack": rack})


def decode_broker(node_id: int, data: bytes, epoch: int = -1) -> BrokerInfo:
    d = _loads(data) or {}
    endpoints = tuple(d.get("endpoints") or ())
    host: Any = d.get("host")
    port: Any = d.get("port")
    if (host is None or port in (None, -1)) and endpoints:
        # Kafka leaves host/port -1 without a PLAINTEXT listener: take the first endpoint.
        address = endpoints[0].split("://", 1)[-1]
        host, _, port_s = address.rpartition(":")
        port = int(port_s)
    return BrokerInfo(node_id, str(host), int(port), d.get("rack"), epoch, endpoints)


def encode_controller(node_id: int) -> bytes:
    return _dumps({"version": 1, "brokerid": node_id,
                   "timestamp": str(int(time.time() * 1000))})


def decode_controller(data: bytes | None) -> int | None:
    d = _loads(data)
    return None if d is None else int(d["brokerid"])


def encode_topic(partitions: Mapping[int, Sequence[int]], topic_id: uuid.UUID) -> bytes:
    return _dumps({"version": 2, "topic_id": str(topic_id),
                   "partitions": {str(p): [int(r) for r in reps]
                                  for p, reps in sorted(partitions.items())}})


def parse_topic_id(text: str | None) -> uuid.UUID:
    """Ours (the canonical hex form) or Kafka's (URL-safe base64 of the 16 bytes)."""
    if not text:
        return NULL_TOPIC_ID
    try:
        return uuid.UUID(text)
    except ValueError:
        try:
            return uuid.UUID(bytes=base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
        except (ValueError, binascii.Error):
            return NULL_TOPIC_ID


def decode_topic(data: bytes | None) -> tuple[uuid.UUID, dict[int, tuple[int, ...]]] | None:
    d = _loads(data)
    if d is None:
        return None
    parts = {int(p): tuple(int(r) for r in reps) for p, reps in (d.get("partitions") or {}).items()}
    return parse_topic_id(d.get("topic_id")), parts


def encode_config(configs: Mapping[str, str]) -> bytes:
    return _dumps({"version": 1, "config": {str(k): str(v) for k, v in configs.items()}})


def decode_config(data: bytes | None) -> dict[str, str]:
    d = _loads(data)
    return {} if d is None else {str(k): str(v) for k, v in (d.get("config") or {}).items()}


def encode_state(state: LeaderAndIsr) -> bytes:
    return _dumps({"version": 1, "leader": state.leader, "leader_epoch": state.leader_epoch,
                   "isr": list(state.isr), "controller_epoch": state.controller_epoch})


def decode_state(data: bytes | None) -> LeaderAndIsr | None:
    d = _loads(data)
    if d is None:
        return None
    return LeaderAndIsr(int(d["leader"]), int(d["leader_epoch"]),
                        tuple(int(r) for r in d["isr"]), int(d["controller_epoch"]))


def encode_producer_id_block(node_id: int, start: int, end: int) -> bytes:
    return _dumps({"version": 1, "broker": node_id, "block_start": start, "block_end": end})


def decode_producer_id_block(data: bytes | None) -> tuple[int, int, int] | None:
    """(broker, start, end inclusive), or None while no block was handed out. Kafka wrote the
    numbers as strings: both are read."""
    d = _loads(data)
    if d is None:
        return None
    return int(d["broker"]), int(d["block_start"]), int(d["block_end"])


def split_connect_string(connect: str) -> tuple[str, str]:
    """``"h1:p1,h2:p2/chroot/x"`` -> ``("h1:p1,h2:p2", "/chroot/x")`` (chroot "" if none)."""
    hosts, slash, chroot = connect.partition("/")
    chroot = ("/" + chroot.strip("/")) if slash and chroot.strip("/") else ""
    if not hosts:
        raise ValueError(f"no ZooKeeper host in {connect!r}")
    return hosts, chroot


def _check_topic_name(name: str) -> None:
    if not name or name in (".", "..") or "/" in name or len(name) > 249:
        raise ValueError(f"illegal topic name {name!r}")


def _failed(results: Sequence[Any]) -> list[Exception]:
    return [r for r in results if isinstance(r, Exception)]


# -- the store ---------------------------------------------------------------------------------


class ClusterStore:
    """One broker's ZooKeeper session and the cluster's data model on it.

    ``session_timeout_s`` (seconds) is how long ZooKeeper keeps this broker's ephemeral znodes
    (registration, controllership) after it stops hearing from it. ``op_timeout_s`` bounds each
    method's retries while ZooKeeper is unreachable.
    """

    def __init__(self, connect: str, *, session_timeout_s: float = 6.0,
                 connect_timeout_s: float = 15.0, op_timeout_s: float = 30.0) -> None:
        hosts, self.chroot = split_connect_string(connect)
        self.connect_string = connect
        self.session_timeout_s = session_timeout_s
        self.op_timeout_s = op_timeout_s
        self._closed = False
        self._session_lost = False
        self._registration: tuple[int, bytes] | None = None
        self._register_lock = threading.Lock()
        self._pid_lock = threading.Lock()
        self._listeners: list[Callable[[str], Any]] = []
        self._client = KazooClient(
            hosts=hosts, timeout=session_timeout_s,
            connection_retry=KazooRetry(max_tries=-1, delay=0.05, backoff=2, max_delay=1.0),
            command_retry=KazooRetry(max_tries=-1, delay=0.05, backoff=2, max_delay=1.0))
        self._client.add_listener(self._on_state)
        try:
            self._client.start(timeout=connect_timeout_s)
        except KazooTimeoutError as exc:  # kazoo stopped the client already
            self._closed = True
            raise ClusterConnectionError(
                f"cannot reach ZooKeeper at {hosts} within {connect_timeout_s:g} s") from exc
        try:
            if self.chroot:
                self._r("ensure_path", self.chroot)
            for path in PERSISTENT_PATHS:
                self._r("ensure_path", self._p(path))
        except BaseException:
            self.close()
            raise

    # -- plumbing -----------------------------------------------------------------------------

    @property
    def client(self) -> KazooClient:
        """The kazoo client (tests, tools). Paths on it are not chrooted: see ``path``."""
        return self._client

    def cluster_id(self, proposed: str) -> str:
        """The cluster's id (``/cluster/id``, as Kafka): the first broker's proposal wins."""
        path = self._p("/cluster/id")
        try:
            self._r("create", path, json.dumps({"version": "1", "id": proposed}).encode(),
                    makepath=True)
        except NodeExistsError:
            pass
        data, _stat = self._r("get", path)
        return str(json.loads(data)["id"])

    def path(self, path: str) -> str:
        """A cluster path (``/brokers/ids``) as the raw kazoo client sees it (chroot prefixed)."""
        return self._p(path)

    def _p(self, path: str) -> str:
        return self.chroot + path

    def _r(self, op: str, *args: Any, **kwargs: Any) -> Any:
        """``client.<op>(...)``, retried on connection loss until ``op_timeout_s``. (kazoo's own
        blocking calls wait for a reconnection for ever: every call here has a deadline.)"""
        deadline = time.monotonic() + self.op_timeout_s
        delay = 0.05
        while True:
            try:
                return self._once(op, *args, deadline=deadline, **kwargs)
            except ConnectionClosedError:
                raise
            except _RETRYABLE:
                if self._closed:
                    raise
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RetryFailedError(
                        f"ZooKeeper did not answer within {self.op_timeout_s:g} s") from None
                time.sleep(min(delay, left))
                delay = min(delay * 2, 1.0)

    def _once(self, op: str, *args: Any, deadline: float | None = None, **kwargs: Any) -> Any:
        """One ``client.<op>_async(...)``, waited for until ``deadline`` (RetryFailedError
        then: the request may still be carried out once the connection is back)."""
        if self._closed:
            raise ConnectionClosedError("the cluster store is closed")
        result = getattr(self._client, op + "_async")(*args, **kwargs)
        return self._wait(result, deadline)

    def _commit(self, tx: Any) -> list[Any]:
        results: list[Any] = self._wait(tx.commit_async(), None)
        return results

    def _wait(self, result: Any, deadline: float | None) -> Any:
        if deadline is None:
            deadline = time.monotonic() + self.op_timeout_s
        try:
            return result.get(timeout=max(0.0, deadline - time.monotonic()))
        except KazooTimeoutError:
            raise RetryFailedError(
                f"ZooKeeper did not answer within {self.op_timeout_s:g} s") from None

    @property
    def session_id(self) -> int | None:
        cid = self._client.client_id
        return None if cid is None else int(cid[0])

    @property
    def connected(self) -> bool:
        return bool(self._client.connected)

    @property
    def closed(self) -> bool:
        return self._closed

    def add_session_listener(self, listener: Callable[[str], Any]) -> None:
        """``listener(state)`` on every connection state change: "CONNECTED", "SUSPENDED"
        (disconnected, the session may live on) or "LOST" (the session expired: ephemeral
        znodes are gone). Called on kazoo's connection thread: must not block."""
        self._listeners.append(listener)

    def remove_session_listener(self, listener: Callable[[str], Any]) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)

    def _on_state(self, state: str) -> None:
        if self._closed:
            return
        if state == KazooState.LOST:
            self._session_lost = True
            log.warning("ZooKeeper session lost (expired)")
        elif state == KazooState.SUSPENDED:
            log.info("ZooKeeper connection suspended")
        elif state == KazooState.CONNECTED and self._session_lost:
            self._session_lost = False
            log.info("new ZooKeeper session 0x%x", self._client._session_id or 0)
            if self._registration is not None:
                self._client.handler.spawn(self._reregister)
        for listener in list(self._listeners):
            try:
                listener(str(state))
            except Exception:
                log.exception("session listener failed")

    def _get_many(self, paths: Sequence[str]) -> list[tuple[bytes, Any] | None]:
        """get() of many znodes in one round trip; None for those that do not exist."""
        deadline = time.monotonic() + self.op_timeout_s
        while True:
            pending = [self._client.get_async(p) for p in paths]
            out: list[tuple[bytes, Any] | None] = []
            try:
                for a in pending:
                    try:
                        out.append(self._wait(a, deadline))
                    except NoNodeError:
                        out.append(None)
                return out
            except ConnectionClosedError:
                raise
            except _RETRYABLE:
                if self._closed or time.monotonic() >= deadline:
                    raise
                time.sleep(0.05)

    def _children(self, path: str) -> list[str]:
        try:
            children: list[str] = self._r("get_children", self._p(path))
        except NoNodeError:
            return []
        return children

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
                tx.check(self._p(CONTROLLER_EPOCH), fence.epoch_zk_version)
                tx.set_data(full, data, version)
                results = self._commit(tx)
                if not _failed(results):
                    return int(results[1].version)
                self._raise_if_fenced(results[0], fence)
                return None
            except (BadVersionError, NoNodeError):
                return None
            except _RETRYABLE:
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

    def close(self) -> None:
        """End the session: this broker's ephemeral znodes go at once, watches stop."""
        if self._closed:
            return
        self._closed = True
        try:
            self._client.stop()
        finally:
            self._client.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- brokers ------------------------------------------------------------------------------

    def register_broker(self, node_id: int, host: str, port: int, rack: str | None = None,
                        *, timeout_s: float = 0.0) -> BrokerInfo:
        """Register this broker (ephemeral ``/brokers/ids/<id>``); it is registered again by
        itself after a session expiry. BrokerIdInUseError if another live session holds the id
        (after waiting up to ``timeout_s`` seconds for it to go: a broker restarted right after a
        crash waits out its old session)."""
        data = encode_broker(host, port, rack)
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
        path = self._p(broker_path(node_id))
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
                return decode_broker(node_id, data, int(stat.czxid))

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
        path = self._p(broker_path(registration[0]))
        try:
            stat = self._r("exists", path)
            if stat is not None and stat.ephemeralOwner == self._client._session_id:
                self._r("delete", path, stat.version)
        except (NoNodeError, BadVersionError):
            pass

    def live_brokers(self) -> dict[int, BrokerInfo]:
        ids = sorted(int(c) for c in self._children(BROKER_IDS))
        found = self._get_many([self._p(broker_path(i)) for i in ids])
        return {i: decode_broker(i, got[0], int(got[1].czxid))
                for i, got in zip(ids, found, strict=True) if got is not None}

    # -- the controller -----------------------------------------------------------------------

    def campaign(self, node_id: int) -> ControllerLease | None:
        """Try to become the controller: create the ephemeral ``/controller`` and bump
        ``/controller_epoch`` in one transaction, conditional on the epoch's version (Kafka's
        registerControllerAndIncrementControllerEpoch). None when another broker is the
        controller."""
        data = encode_controller(node_id)
        epoch_path = self._p(CONTROLLER_EPOCH)
        for _ in range(20):
            try:
                raw, stat = self._r("get", epoch_path)
            except NoNodeError:
                try:
                    self._r("create", epoch_path, b"0")
                except NodeExistsError:
                    pass
                continue
            epoch, version = int(raw or b"0"), int(stat.version)
            if self._r("exists", self._p(CONTROLLER)) is not None:
                return self._own_lease(node_id)
            tx = self._client.transaction()
            tx.create(self._p(CONTROLLER), data, ephemeral=True)
            tx.set_data(epoch_path, str(epoch + 1).encode(), version)
            try:
                results = self._commit(tx)
            except _RETRYABLE:
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
            data, stat = self._r("get", self._p(CONTROLLER))
            raw, estat = self._r("get", self._p(CONTROLLER_EPOCH))
        except NoNodeError:
            return None
        if stat.ephemeralOwner != self._client._session_id or decode_controller(data) != node_id:
            return None
        return ControllerLease(node_id, int(raw or b"0"), int(estat.version))

    def elect_controller(self, node_id: int) -> int | None:
        """``campaign`` returning the controller epoch won, or None."""
        lease = self.campaign(node_id)
        return None if lease is None else lease.epoch

    def controller_id(self) -> int | None:
        try:
            data, _stat = self._r("get", self._p(CONTROLLER))
        except NoNodeError:
            return None
        return decode_controller(data)

    def controller_epoch(self) -> tuple[int, int] | None:
        """(controller epoch, zk version of ``/controller_epoch``), None before any election."""
        try:
            raw, stat = self._r("get", self._p(CONTROLLER_EPOCH))
        except NoNodeError:
            return None
        return int(raw or b"0"), int(stat.version)

    def is_controller(self, lease: ControllerLease) -> bool:
        """Whether ``lease`` still holds: /controller is this session's and the epoch the
        same."""
        own = self._own_lease(lease.node_id)
        return own is not None and own.epoch_zk_version == lease.epoch_zk_version

    def resign_controller(self, lease: ControllerLease) -> None:
        """Delete ``/controller`` if it is still ours (another broker takes over at once)."""
        path = self._p(CONTROLLER)
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
        if self._r("exists", self._p(delete_topic_path(name))) is not None:
            raise TopicExistsError(f"topic {name!r} is marked for deletion")
        data = encode_topic(assignment, topic_id)
        for _ in range(10):
            config_stat = self._r("exists", self._p(topic_config_path(name)))
            tx = self._client.transaction()
            if config_stat is None:
                tx.create(self._p(topic_config_path(name)), encode_config(configs))
            else:  # left over (Kafka writes configs first): ours now
                tx.set_data(self._p(topic_config_path(name)), encode_config(configs),
                            config_stat.version)
            tx.create(self._p(topic_path(name)), data)
            tx.create(self._p(partitions_path(name)), b"")
            try:
                results = self._commit(tx)
            except _RETRYABLE:
                if self._closed:
                    raise
                found = self._get_many([self._p(topic_path(name))])[0]
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

    def topic(self, name: str) -> TopicAssignment | None:
        topic, config = self._get_many([self._p(topic_path(name)),
                                        self._p(topic_config_path(name))])
        decoded = decode_topic(topic[0]) if topic is not None else None
        if decoded is None:
            return None
        return TopicAssignment(name, decoded[0], decoded[1],
                               decode_config(config[0]) if config is not None else {})

    def topic_names(self) -> list[str]:
        return sorted(self._children(TOPICS))

    def topic_assignments(self) -> dict[str, TopicAssignment]:
        names = self.topic_names()
        paths = []
        for n in names:
            paths += [self._p(topic_path(n)), self._p(topic_config_path(n))]
        found = self._get_many(paths)
        out = {}
        for i, n in enumerate(names):
            topic, config = found[2 * i], found[2 * i + 1]
            decoded = decode_topic(topic[0]) if topic is not None else None
            if decoded is not None:
                out[n] = TopicAssignment(n, decoded[0], decoded[1],
                                         decode_config(config[0]) if config is not None else {})
        return out

    def set_topic_configs(self, name: str, configs: Mapping[str, str]) -> None:
        """Replace a topic's configs (brokers see them through their watches)."""
        path = self._p(topic_config_path(name))
        if self._r("exists", self._p(topic_path(name))) is None:
            raise UnknownTopicError(f"topic {name!r} does not exist")
        try:
            self._r("set", path, encode_config(configs))
        except NoNodeError:
            self._r("create", path, encode_config(configs))

    def request_topic_deletion(self, name: str) -> None:
        """Ask the controller to delete a topic (``/admin/delete_topics/<name>``).
        UnknownTopicError if there is no such topic; asking twice is fine."""
        _check_topic_name(name)
        if self._r("exists", self._p(topic_path(name))) is None:
            raise UnknownTopicError(f"topic {name!r} does not exist")
        try:
            self._r("create", self._p(delete_topic_path(name)), b"")
        except NodeExistsError:
            pass

    def pending_deletions(self) -> list[str]:
        return sorted(self._children(DELETE_TOPICS))

    def delete_topic_znodes(self, name: str, *, fence: ControllerLease | None = None) -> bool:
        """The controller's part of a deletion: remove the topic's znodes (partition states,
        assignment, configs) and its deletion request in one transaction (the brokers see the
        topic vanish at once and delete their logs). False if there was nothing left."""
        for _ in range(20):
            tree = self._subtree(topic_path(name))
            doomed = list(reversed(tree))  # children before parents
            for extra in (topic_config_path(name), delete_topic_path(name)):
                if self._r("exists", self._p(extra)) is not None:
                    doomed.append(extra)
            if not doomed:
                return False
            tx = self._client.transaction()
            if fence is not None:
                tx.check(self._p(CONTROLLER_EPOCH), fence.epoch_zk_version)
            for path in doomed:
                tx.delete(self._p(path))
            try:
                results = self._commit(tx)
            except _RETRYABLE:
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
            data, stat = self._r("get", self._p(partition_state_path(topic,
                                                                                partition)))
        except NoNodeError:
            return None
        state = decode_state(data)
        return None if state is None else (state, int(stat.version))

    def partition_states(self, partitions: Iterable[tuple[str, int]]
                         ) -> dict[tuple[str, int], tuple[LeaderAndIsr, int]]:
        """``partition_state`` of many partitions in one round trip (those with a state)."""
        tps = list(partitions)
        found = self._get_many([self._p(partition_state_path(t, p)) for t, p in tps])
        out = {}
        for tp, got in zip(tps, found, strict=True):
            state = decode_state(got[0]) if got is not None else None
            if state is not None and got is not None:
                out[tp] = (state, int(got[1].version))
        return out

    def create_partition_state(self, topic: str, partition: int, state: LeaderAndIsr, *,
                               fence: ControllerLease | None = None) -> int | None:
        """Create the state znode (version 0); None if it exists already (or the topic is
        gone)."""
        if self._r("exists", self._p(topic_path(topic))) is None:
            return None
        for parent in (partitions_path(topic), partition_path(topic, partition)):
            try:
                self._r("create", self._p(parent), b"")
            except NodeExistsError:
                pass
            except NoNodeError:
                return None  # the topic went meanwhile
        path = self._p(partition_state_path(topic, partition))
        data = encode_state(state)
        while True:
            try:
                if fence is None:
                    self._once("create", path, data)
                else:
                    tx = self._client.transaction()
                    tx.check(self._p(CONTROLLER_EPOCH), fence.epoch_zk_version)
                    tx.create(path, data)
                    results = self._commit(tx)
                    if _failed(results):
                        self._raise_if_fenced(results[0], fence)
                        return None
                return 0
            except (NodeExistsError, NoNodeError):
                return None
            except _RETRYABLE:
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
        return self._set_conditional(partition_state_path(topic, partition), encode_state(state),
                                     expected_version, fence)

    # -- producer ids -------------------------------------------------------------------------

    def allocate_producer_id_block(self, node_id: int, size: int = 1000) -> tuple[int, int]:
        """The next ``size`` producer ids for broker ``node_id``: (start, end inclusive), never
        handed to anybody else (Kafka's ZkProducerIdManager: a conditional set loop on
        ``/latest_producer_id_block``)."""
        if size <= 0:
            raise ValueError("size must be positive")
        path = PRODUCER_ID_BLOCK
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
                current = decode_producer_id_block(data)
                start = 0 if current is None else current[2] + 1
                end = start + size - 1
                if end > MAX_PRODUCER_ID:
                    raise ClusterError("producer ids are exhausted")
                version = self._set_conditional(path, encode_producer_id_block(node_id, start, end),
                                                int(stat.version))
                if version is not None:
                    return start, end

    # -- watches ------------------------------------------------------------------------------

    def watch_brokers(self, callback: Callable[[dict[int, BrokerInfo]], Any]) -> ChildrenWatch:
        """``callback(live_brokers)`` now, on every registration change, and after each
        reconnection (a broker may have registered again with the same id meanwhile: kazoo's
        children watch would not tell). Calls are serialized, each with data read after the
        previous call."""
        lock = threading.Lock()
        stopped = False

        def refresh() -> Any:
            nonlocal stopped
            with lock:
                while not stopped:  # as kazoo's own watches: until ZooKeeper answers
                    if self._closed:
                        stopped = True
                        break
                    try:
                        brokers = self.live_brokers()
                    except KazooException as exc:
                        log.warning("reading the live brokers failed: %r; retrying", exc)
                        time.sleep(0.2)
                        continue
                    if _call_quietly(callback, brokers) is False:
                        stopped = True
                    break
                return False if stopped else None

        def on_children(children: list[str]) -> Any:
            return refresh()

        def on_session(state: str) -> None:
            if stopped:
                self.remove_session_listener(on_session)
            elif state == KazooState.CONNECTED:
                threading.Thread(target=refresh, daemon=True,
                                 name="oncelog-zk-brokers-refresh").start()

        self.add_session_listener(on_session)
        return ChildrenWatch(self._client, self._p(BROKER_IDS), on_children)

    def watch_topics(self, callback: Callable[[list[str]], Any]) -> ChildrenWatch:
        """``callback(sorted topic names)`` now and whenever topics come or go."""
        def on_children(children: list[str]) -> Any:
            if self._closed:
                return False
            return _call_quietly(callback, sorted(children))
        return ChildrenWatch(self._client, self._p(TOPICS), on_children)

    def watch_deletions(self, callback: Callable[[list[str]], Any]) -> ChildrenWatch:
        """``callback(sorted topics to delete)`` on every change of ``/admin/delete_topics``."""
        def on_children(children: list[str]) -> Any:
            if self._closed:
                return False
            return _call_quietly(callback, sorted(children))
        return ChildrenWatch(self._client, self._p(DELETE_TOPICS), on_children)

    def watch_controller(self, callback: Callable[[int | None], Any]) -> DataWatch:
        """``callback(controller id or None)`` on every change of ``/controller``."""
        def on_data(data: bytes | None, stat: Any, event: Any = None) -> Any:
            if self._closed:
                return False
            try:
                controller = decode_controller(data)
            except (ValueError, KeyError):
                controller = None
            return _call_quietly(callback, controller)
        return DataWatch(self._client, self._p(CONTROLLER), on_data)

    def watch_topic(self, name: str,
                    callback: Callable[[uuid.UUID | None, dict[int, tuple[int, ...]] | None],
                                       Any]) -> DataWatch:
        """``callback(topic_id, partitions)`` on every change of ``/brokers/topics/<name>``
        ``(None, None)`` when it does not exist."""
        def on_data(data: bytes | None, stat: Any, event: Any = None) -> Any:
            if self._closed:
                return False
            decoded = decode_topic(data)
            if decoded is None:
                return _call_quietly(callback, None, None)
            return _call_quietly(callback, decoded[0], decoded[1])
        return DataWatch(self._client, self._p(topic_path(name)), on_data)

    def watch_topic_configs(self, name: str,
                            callback: Callable[[dict[str, str] | None], Any]) -> DataWatch:
        """``callback(configs)`` on every change of ``/config/topics/<name>`` (None when it
        does not exist)."""
        def on_data(data: bytes | None, stat: Any, event: Any = None) -> Any:
            if self._closed:
                return False
            return _call_quietly(callback, None if stat is None else decode_config(data))
        return DataWatch(self._client, self._p(topic_config_path(name)), on_data)

    def watch_partition_state(self, topic: str, partition: int,
                              callback: Callable[[LeaderAndIsr | None, int | None], Any]
                              ) -> DataWatch:
        """``callback(state, zk_version)`` now and on every change of the partition's state
        znode (``(None, None)`` while it does not exist)."""
        def on_data(data: bytes | None, stat: Any, event: Any = None) -> Any:
            if self._closed:
                return False
            state = decode_state(data) if stat is not None else None
            return _call_quietly(callback, state, None if state is None else int(stat.version))
        return DataWatch(self._client, self._p(partition_state_path(topic, partition)), on_data)


def _call_quietly(callback: Callable[..., Any], *args: Any) -> Any:
    # Never let an exception reach kazoo's watch machinery: DataWatch calls a callback that
    # raised TypeError a second time, with fewer arguments.
    try:
        return callback(*args)
    except Exception:
        log.exception("cluster watch callback %r failed", callback)
        return None


# -- the metadata view -------------------------------------------------------------------------

TP = tuple[str, int]


@dataclass(frozen=True)
class ClusterView:
    """An immutable snapshot of the cluster, safe to read from any thread.

    ``brokers``: the live brokers; ``topics``: every topic (assignment, id, configs);
    ``states``: (topic, partition) -> (LeaderAndIsr, zk version) for the partitions that have a
    state znode; ``controller_id``: the controller (None during an election); ``seq`` grows with
    every change.
    """

    seq: int
    brokers: Mapping[int, BrokerInfo]
    topics: Mapping[str, TopicAssignment]
    states: Mapping[TP, tuple[LeaderAndIsr, int]]
    controller_id: int | None

    def state(self, topic: str, partition: int) -> LeaderAndIsr | None:
        found = self.states.get((topic, partition))
        return None if found is None else found[0]

    def leader(self, topic: str, partition: int) -> int | None:
        """The partition's leader if it has one that is alive, else None."""
        state = self.state(topic, partition)
        if state is None or state.leader < 0 or state.leader not in self.brokers:
            return None
        return state.leader

    def partitions_led_by(self, node_id: int) -> list[TP]:
        return sorted(tp for tp, (s, _v) in self.states.items() if s.leader == node_id)


EMPTY_VIEW = ClusterView(0, MappingProxyType({}), MappingProxyType({}), MappingProxyType({}),
                         None)


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

    def __init__(self, store: ClusterStore,
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
            self.store.watch_controller(self._on_controller)
            self.store.watch_brokers(self._on_brokers)
            self.store.watch_topics(self._on_topics)
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

        self.store.watch_topic_configs(record.name, on_configs)
        self.store.watch_topic(record.name, on_topic)

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

        self.store.watch_partition_state(record.name, partition, on_state)
