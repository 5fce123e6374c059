"""One ZooKeeper session, with deadlines (Kafka's ZooKeeperClient under its KafkaZkClient).

``ZooKeeperClient`` wraps one ``KazooClient``: the connection, the chroot of the connect string
(``127.0.0.1:2181/oncelog``, created if missing), retries with a deadline on connection loss,
many reads in one round trip, transactions (with an optional fence checked first), conditional
writes that survive a lost answer, watches, and the session's state changes. Every path its
methods take is a cluster path (``/brokers/ids``): the chroot is prefixed here and nowhere else.
What the znodes mean is not its business: that is the parts ``KafkaZkClient``
(cluster/zk_client.py) composes, each given this connection.

Its methods are synchronous and thread-safe; call them from worker threads
(``asyncio.to_thread``), never from the broker's event loop. ZooKeeper being away makes them
retry until ``op_timeout_s`` and then raise a ``kazoo.exceptions.KazooException``
(``RetryFailedError``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol, Self

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import (
    BadVersionError,
    ConnectionClosedError,
    ConnectionLoss,
    KazooException,
    NoNodeError,
    OperationTimeoutError,
    RolledBackError,
    SessionExpiredError,
)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.states import ZnodeStat
from kazoo.recipe.watchers import DataWatch
from kazoo.retry import KazooRetry, RetryFailedError

from .errors import ClusterConnectionError

__all__ = ["RETRYABLE", "Fence", "Transaction", "ZooKeeperClient", "call_quietly", "failures",
           "split_connect_string"]

# The ZooKeeper side keeps the one logger name it always had (operators filter on it).
log = logging.getLogger("oncelog.cluster.zk")

# What a retry may cure: the connection (or the session) went, the request may not have been
# carried out.
RETRYABLE = (ConnectionLoss, OperationTimeoutError, SessionExpiredError)


def split_connect_string(connect: str) -> tuple[str, str]:
    """``"h1:p1,h2:p2/chroot/x"`` -> ``("h1:p1,h2:p2", "/chroot/x")`` (chroot "" if none)."""
    hosts, slash, chroot = connect.partition("/")
    chroot = ("/" + chroot.strip("/")) if slash and chroot.strip("/") else ""
    if not hosts:
        raise ValueError(f"no ZooKeeper host in {connect!r}")
    return hosts, chroot


def failures(results: Sequence[Any]) -> list[Exception]:
    """The failed operations of a committed transaction."""
    return [r for r in results if isinstance(r, Exception)]


def call_quietly(callback: Callable[..., Any], *args: Any) -> Any:
    """``callback(*args)`` from a watch: never lets an exception reach kazoo's watch machinery
    (DataWatch calls a callback that raised TypeError a second time, with fewer arguments)."""
    try:
        return callback(*args)
    except Exception:
        log.exception("cluster watch callback %r failed", callback)
        return None


class Fence(Protocol):
    """A write's precondition, checked first in the write's transaction: the znode at
    ``fence_path`` is still at zk version ``fence_version`` (the controller's lease,
    cluster/zk_election.py). ``fenced_error()`` is raised when it is not."""

    @property
    def fence_path(self) -> str: ...

    @property
    def fence_version(self) -> int: ...

    def fenced_error(self) -> Exception: ...


class Transaction:
    """Operations carried out together or not at all (ZooKeeper's multi), on cluster paths.
    Built by ``ZooKeeperClient.transaction``, carried out by its ``commit``."""

    def __init__(self, request: Any, chroot: str, fence: Fence | None) -> None:
        self.request = request  # kazoo's TransactionRequest (raw paths)
        self.chroot = chroot
        self.fence = fence
        if fence is not None:
            request.check(chroot + fence.fence_path, fence.fence_version)

    def check(self, path: str, version: int) -> None:
        self.request.check(self.chroot + path, version)

    def create(self, path: str, data: bytes = b"", *, ephemeral: bool = False) -> None:
        self.request.create(self.chroot + path, data, ephemeral=ephemeral)

    def set_data(self, path: str, data: bytes, version: int = -1) -> None:
        self.request.set_data(self.chroot + path, data, version)

    def delete(self, path: str, version: int = -1) -> None:
        self.request.delete(self.chroot + path, version)


class ZooKeeperClient:
    """One ZooKeeper session under the connect string's chroot.

    ``session_timeout_s`` (seconds) is how long ZooKeeper keeps this session's ephemeral znodes
    after it stops hearing from it. ``op_timeout_s`` bounds each method's retries while
    ZooKeeper is unreachable.
    """

    def __init__(self, connect: str, *, session_timeout_s: float = 6.0,
                 connect_timeout_s: float = 15.0, op_timeout_s: float = 30.0) -> None:
        hosts, self.chroot = split_connect_string(connect)
        self.connect_string = connect
        self.session_timeout_s = session_timeout_s
        self.op_timeout_s = op_timeout_s
        self._closed = False
        self._session_lost = False
        self._listeners: list[Callable[[str], Any]] = []
        self._new_session_handlers: list[Callable[[], Any]] = []
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
                self._call("ensure_path", self.chroot)
        except BaseException:
            self.close()
            raise

    @property
    def client(self) -> KazooClient:
        """The kazoo client (tests, tools). Paths on it are not chrooted: see ``path``."""
        return self._client

    def path(self, path: str) -> str:
        """A cluster path (``/brokers/ids``) as the raw kazoo client sees it (chroot prefixed)."""
        return self._p(path)

    def _p(self, path: str) -> str:
        return self.chroot + path

    # -- the session --------------------------------------------------------------------------

    @property
    def session_id(self) -> int | None:
        cid = self._client.client_id
        return None if cid is None else int(cid[0])

    def owns(self, stat: ZnodeStat) -> bool:
        """Whether an ephemeral znode (its stat) belongs to this session (the latest one,
        even while disconnected)."""
        return bool(stat.ephemeralOwner == self._client._session_id)

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

    def add_new_session_handler(self, handler: Callable[[], Any]) -> None:
        """``handler()`` once a new session replaced an expired one (Kafka's
        afterInitializingSession: what was ephemeral must be created again), on a kazoo
        worker thread of its own (it may block)."""
        self._new_session_handlers.append(handler)

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
            for handler in list(self._new_session_handlers):
                self._client.handler.spawn(handler)
        for listener in list(self._listeners):
            try:
                listener(str(state))
            except Exception:
                log.exception("session listener failed")

    # -- requests -----------------------------------------------------------------------------

    def _call(self, op: str, *args: Any, **kwargs: Any) -> Any:
        """``client.<op>(...)``, retried on connection loss until ``op_timeout_s``. (kazoo's own
        blocking calls wait for a reconnection for ever: every call here has a deadline.)"""
        deadline = time.monotonic() + self.op_timeout_s
        delay = 0.05
        while True:
            try:
                return self._once(op, *args, deadline=deadline, **kwargs)
            except ConnectionClosedError:
                raise
            except RETRYABLE:
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
            raise ConnectionClosedError("the ZooKeeper client is closed")
        result = getattr(self._client, op + "_async")(*args, **kwargs)
        return self._wait(result, deadline)

    def _wait(self, result: Any, deadline: float | None) -> Any:
        if deadline is None:
            deadline = time.monotonic() + self.op_timeout_s
        try:
            return result.get(timeout=max(0.0, deadline - time.monotonic()))
        except KazooTimeoutError:
            raise RetryFailedError(
                f"ZooKeeper did not answer within {self.op_timeout_s:g} s") from None

    def get(self, path: str, *, watch: Callable[[Any], Any] | None = None
            ) -> tuple[bytes, ZnodeStat]:
        """(data, stat); NoNodeError. ``watch(event)``: a one-shot data watch."""
        found: tuple[bytes, ZnodeStat] = self._call("get", self._p(path), watch=watch)
        return found

    def get_children(self, path: str, *, watch: Callable[[Any], Any] | None = None
                     ) -> list[str]:
        """The children's names; NoNodeError. ``watch(event)``: a one-shot children watch."""
        children: list[str] = self._call("get_children", self._p(path), watch=watch)
        return children

    def children(self, path: str) -> list[str]:
        """The children's names ([] when ``path`` does not exist)."""
        try:
            return self.get_children(path)
        except NoNodeError:
            return []

    def exists(self, path: str) -> ZnodeStat | None:
        stat: ZnodeStat | None = self._call("exists", self._p(path))
        return stat

    def create(self, path: str, data: bytes = b"", *, ephemeral: bool = False,
               sequence: bool = False, makepath: bool = False, retry: bool = True) -> str:
        """Create a znode (NodeExistsError, NoNodeError); its path as created. ``retry=False``:
        one attempt, which a lost connection leaves undecided (a RETRYABLE error)."""
        kwargs = {"ephemeral": ephemeral, "sequence": sequence, "makepath": makepath}
        if retry:
            return str(self._call("create", self._p(path), data, **kwargs))
        return str(self._once("create", self._p(path), data, **kwargs))

    def set(self, path: str, data: bytes, version: int = -1, *, retry: bool = True
            ) -> ZnodeStat:
        """set_data on the condition of ``version`` (-1: any); BadVersionError, NoNodeError.
        ``retry=False``: one attempt, as ``create``'s."""
        stat: ZnodeStat = (self._call if retry else self._once)("set", self._p(path), data,
                                                                version)
        return stat

    def delete(self, path: str, version: int = -1) -> None:
        self._call("delete", self._p(path), version)

    def delete_if_owned(self, path: str) -> bool:
        """Delete the ephemeral znode ``path`` if this session owns it, on the condition of
        the version read (a znode another session created meanwhile, or one changed since,
        stays); whether it was deleted. A broker's registration and ``/controller`` are left
        this way: a successor's must not be taken with them."""
        try:
            stat = self.exists(path)
            if stat is None or not self.owns(stat):
                return False
            self.delete(path, stat.version)
            return True
        except (NoNodeError, BadVersionError):
            return False

    def ensure_path(self, path: str) -> None:
        self._call("ensure_path", self._p(path))

    def get_many(self, paths: Sequence[str]) -> list[tuple[bytes, ZnodeStat] | None]:
        """get() of many znodes in one round trip; None for those that do not exist."""
        deadline = time.monotonic() + self.op_timeout_s
        while True:
            pending = [self._client.get_async(self._p(p)) for p in paths]
            out: list[tuple[bytes, ZnodeStat] | None] = []
            try:
                for a in pending:
                    try:
                        out.append(self._wait(a, deadline))
                    except NoNodeError:
                        out.append(None)
                return out
            except ConnectionClosedError:
                raise
            except RETRYABLE:
                if self._closed or time.monotonic() >= deadline:
                    raise
                time.sleep(0.05)

    def transaction(self, fence: Fence | None = None) -> Transaction:
        """A transaction to fill and ``commit``; ``fence``: checked before its operations."""
        return Transaction(self._client.transaction(), self.chroot, fence)

    def commit(self, tx: Transaction) -> list[Any]:
        """Carry ``tx`` out: one result per operation (an exception for those that failed, all
        of them when one did: ``failures``). The fence's error when its check failed. A lost
        connection raises a RETRYABLE error: the transaction may or may not have happened."""
        results: list[Any] = self._wait(tx.request.commit_async(), None)
        if tx.fence is not None and failures(results):
            check = results[0]
            if isinstance(check, Exception) and not isinstance(check, RolledBackError):
                raise tx.fence.fenced_error()
        return results

    def set_conditional(self, path: str, data: bytes, version: int,
                        fence: Fence | None = None) -> int | None:
        """set_data on the condition of ``version`` (and of ``fence``): the new version, or
        None on a conflict (or if the znode is gone). A write whose answer was lost with the
        connection is checked once the connection is back."""
        while True:
            try:
                if fence is None:
                    return int(self.set(path, data, version, retry=False).version)
                tx = self.transaction(fence)
                tx.set_data(path, data, version)
                results = self.commit(tx)
                return None if failures(results) else int(results[-1].version)
            except (BadVersionError, NoNodeError):
                return None
            except RETRYABLE:
                if self._closed:
                    raise
                try:
                    current, stat = self.get(path)
                except NoNodeError:
                    return None
                if stat.version == version:
                    continue  # not applied: again
                if stat.version == version + 1 and current == data:
                    return int(stat.version)  # ours, its answer lost
                return None

    # -- watches ------------------------------------------------------------------------------

    def watch_data(self, path: str, callback: Callable[[bytes | None, ZnodeStat | None], Any]
                   ) -> None:
        """``callback(data, stat)`` now, on every change of the znode and after reconnections
        when it changed meanwhile (``(None, None)`` while it does not exist), on kazoo's threads;
        returning False stops it, as does closing (kazoo's DataWatch: it sets its watch again on
        reconnection and compares the znode's mzxid)."""
        def on_data(data: bytes | None, stat: ZnodeStat | None, event: Any = None) -> Any:
            if self._closed:
                return False
            return call_quietly(callback, data, stat)
        DataWatch(self._client, self._p(path), on_data)

    def watch_children(self, path: str, callback: Callable[[Any], Any], *,
                       read: Callable[[list[str]], Any] = sorted) -> None:
        """``callback(read(children))`` now, on every change of ``path``'s children, and after
        each reconnection (the children may have changed meanwhile and changed back). Calls are
        serialized, each with data read after the previous call; returning False stops it, as
        does closing. ``read`` may read ZooKeeper further (it is retried with the children).

        Every read comes after a one-shot children watch is armed (armed again on each event
        and on each reconnection, then the children read), so no change after a read can go
        unseen. (kazoo's ChildrenWatch re-arms on a thread of its own after a reconnection and
        calls back only when the children differ from those it saw before the connection went:
        a broker registered again under its id, or a topic deleted and created again, between
        another read and that re-arming stayed out of the view for good.)"""
        lock = threading.Lock()
        stopped = False

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
                        value = read(self.get_children(path, watch=on_event))
                    except KazooException as exc:
                        log.warning("reading the children of %s failed: %r; retrying", path,
                                    exc)
                        time.sleep(0.2)
                        continue
                    if call_quietly(callback, value) is False:
                        stopped = True
                    break

        def on_session(state: str) -> None:
            if stopped:
                self.remove_session_listener(on_session)
            elif state == KazooState.CONNECTED:
                threading.Thread(target=arm_and_read, daemon=True,
                                 name=f"oncelog-zk-watch-{path}").start()

        self.add_session_listener(on_session)
        arm_and_read()

    def close(self) -> None:
        """End the session: its ephemeral znodes go at once, watches stop."""
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
