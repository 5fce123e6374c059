"""One ZooKeeper session, with deadlines (Kafka's ZooKeeperClient under its KafkaZkClient).

``ZooKeeperClient`` wraps one ``KazooClient``: the connection, the chroot of the connect string
(``127.0.0.1:2181/oncelog``, created if missing), retries with a deadline on connection loss,
many reads in one round trip, and the session's state changes. What the znodes mean is not its
business: that is ``KafkaZkClient`` (cluster/zk_client.py), built on it.

Its methods are synchronous and thread-safe; call them from worker threads
(``asyncio.to_thread``), never from the broker's event loop. ZooKeeper being away makes them
retry until ``op_timeout_s`` and then raise a ``kazoo.exceptions.KazooException``
(``RetryFailedError``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, Self

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import (
    ConnectionClosedError,
    ConnectionLoss,
    NoNodeError,
    OperationTimeoutError,
    SessionExpiredError,
)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.retry import KazooRetry, RetryFailedError

from .errors import ClusterConnectionError

__all__ = ["RETRYABLE", "ZooKeeperClient", "split_connect_string"]

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
            self._after_new_session()
        for listener in list(self._listeners):
            try:
                listener(str(state))
            except Exception:
                log.exception("session listener failed")

    def _after_new_session(self) -> None:
        """Called on kazoo's connection thread once a new session replaced an expired one
        (Kafka's afterInitializingSession): what was ephemeral must be created again. Must
        not block."""

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
            except RETRYABLE:
                if self._closed or time.monotonic() >= deadline:
                    raise
                time.sleep(0.05)

    def _children(self, path: str) -> list[str]:
        try:
            children: list[str] = self._r("get_children", self._p(path))
        except NoNodeError:
            return []
        return children

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
