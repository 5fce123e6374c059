"""A local cluster: a ZooKeeper and N broker processes on this machine (tests, benchmarks,
``oncelog cluster up`` / ``down``).

``LocalCluster(data_dir, brokers=3)`` starts (``start()`` or ``with``) a ZooKeeper server in
``data_dir/zookeeper`` (unless given the connect string of one that runs) and brokers 1..N as
``oncelog broker --node-id N --zookeeper ZK/oncelog ...`` (``BrokerProcess``, the one broker
launcher), each in a session of its own with its output in ``data_dir/broker-N/broker.log`` and
its logs in ``data_dir/broker-N/data``; it waits until every broker names all of them
(registered in ZooKeeper) in its answer to the Admin client's ``describe_cluster``, and records
the pids, ports and connect string in ``data_dir/cluster.json``. Then it is a fault injector:
``kill`` (SIGKILL), ``pause`` / ``resume`` (SIGSTOP / SIGCONT), ``stop_broker`` (SIGTERM),
``start_broker`` (same port, same data directory), with ``relays`` ``cut`` / ``heal`` (a broker
off the clients and the other brokers), with ``zookeeper_relays`` ``cut_zookeeper`` /
``heal_zookeeper`` (a broker off ZooKeeper only; its session expires) and ``isolate`` /
``reconnect`` (both), and an observer through the Admin client: ``leader_of``, ``wait_for_isr``.

``cluster_down(data_dir)`` stops a cluster another process started (``cluster.json``): the
brokers gracefully (SIGTERM, SIGKILL after a timeout), then the ZooKeeper if it started one.

Layout of ``data_dir``::

    cluster.json          connect string, bootstrap servers, each broker's pid, port, dirs
    zookeeper/            the ZooKeeper server (harness/zookeeper.py), unless an external one
    broker-N/broker.log   broker N's output (appended to across restarts)
    broker-N/data/        broker N's data directory
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

from ..errors import KafkaError
from .broker_process import BrokerProcess, BrokerProcessError
from .relay import Relay
from .zookeeper import (
    ZooKeeperServer,
    running_server,
    runs_with,
    signal_group,
    stop_server,
    wait_gone,
)

__all__ = ["CLUSTER_FILE", "DEFAULT_CHROOT", "LocalBroker", "LocalCluster", "LocalClusterError",
           "LocalClusterTimeout", "cluster_down", "read_cluster_file"]

CLUSTER_FILE = "cluster.json"
DEFAULT_CHROOT = "/oncelog"
ZOOKEEPER_DIR = "zookeeper"


class LocalClusterError(RuntimeError):
    """A broker (or the ZooKeeper) did not start or stop as asked."""


class LocalClusterTimeout(LocalClusterError):
    """The cluster did not come up within its startup timeout: ``missing`` are the brokers
    not registered yet (all registered: some broker did not see them all yet)."""

    def __init__(self, message: str, missing: list[int], timeout: float) -> None:
        super().__init__(message)
        self.missing = missing
        self.timeout = timeout


@dataclass
class LocalBroker:
    node_id: int
    host: str
    port: int
    dir: Path  # data_dir/broker-N: broker.log and data/
    process: BrokerProcess | None = None  # from the first start on
    pid: int | None = None
    state: str = "stopped"  # running, paused, stopped

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def data_dir(self) -> Path:
        return self.dir / "data"

    @property
    def log_path(self) -> Path:
        return self.dir / "broker.log"

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def _free_port(host: str, taken: set[int]) -> int:
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            port = int(sock.getsockname()[1])
        if port not in taken:
            return port


def _port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _is_our_broker(pid: int, data_dir: str) -> bool:
    """Whether ``pid`` is the broker process run on ``data_dir`` (not one that reused its pid)."""
    return runs_with(pid, b"broker", os.fsencode(data_dir))


def _stop_pids(pids: list[int], timeout: float) -> None:
    """SIGTERM (and SIGCONT, for paused ones) to the brokers of a cluster another process
    started, then SIGKILL to what is left."""
    for pid in pids:
        signal_group(pid, signal.SIGTERM)
        signal_group(pid, signal.SIGCONT)
    left = wait_gone(pids, timeout)
    for pid in left:
        signal_group(pid, signal.SIGKILL)
    left = wait_gone(left, 5.0)
    if left:
        raise LocalClusterError(f"broker processes {left} survived SIGKILL")


def _stop_processes(processes: list[BrokerProcess], timeout: float) -> None:
    """SIGTERM to all (side by side: each shuts down while the others do), then SIGKILL to
    those still running after ``timeout``."""
    for p in processes:
        p.terminate()
    deadline = time.monotonic() + timeout
    left = [p for p in processes if p.wait(max(0.0, deadline - time.monotonic())) is None]
    survivors = []
    for p in left:
        try:
            p.kill(5.0)
        except BrokerProcessError:
            survivors.append(p.pid)
    if survivors:
        raise LocalClusterError(f"broker processes {survivors} survived SIGKILL")


def _tls_client_config(settings: Mapping[str, str]) -> dict[str, Any]:
    """An SSL or SASL cluster's settings for our client, from the brokers' own: their
    truststore as the CA and, for mutual TLS, their keystore's certificate (a broker's
    certificate is a client certificate too: the brokers show it to each other); with SASL,
    the brokers' own login (their JAAS setting, a super user's: docs/cluster.md)."""
    from ..security.sasl import jaas_options
    from ..server.interbroker_sasl import SASL_PROTOCOLS, jaas_config_key

    protocol = settings.get("security.protocol", "").upper()
    if protocol in SASL_PROTOCOLS:
        mechanism = settings.get("sasl.mechanism.inter.broker.protocol", "PLAIN").upper()
        options = jaas_options(settings.get(jaas_config_key(protocol, mechanism), ""))
        if "username" not in options or "password" not in options:
            return {}
        sasl = {"security_protocol": protocol, "sasl_mechanism": mechanism,
                "sasl_plain_username": options["username"],
                "sasl_plain_password": options["password"]}
        if protocol == "SASL_PLAINTEXT":
            return sasl
        return {**_tls_client_config({**settings, "security.protocol": "SSL"}), **sasl}
    if protocol != "SSL":
        return {}
    out: dict[str, Any] = {"security_protocol": "SSL"}
    if settings.get("ssl.truststore.location"):
        out["ssl_cafile"] = settings["ssl.truststore.location"]
    if settings.get("ssl.client.auth", "none") != "none" and \
            settings.get("ssl.keystore.location"):
        out["ssl_certfile"] = settings["ssl.keystore.location"]
        out["ssl_password"] = settings.get("ssl.key.password") or None
    return out


def read_cluster_file(data_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """``data_dir/cluster.json`` (FileNotFoundError when there is no cluster there)."""
    loaded: dict[str, Any] = json.loads((Path(data_dir) / CLUSTER_FILE).read_text())
    return loaded


class LocalCluster:
    """A ZooKeeper and ``brokers`` broker processes (node ids 1..N) on this machine.

    ``zookeeper``: the connect string of a running ZooKeeper (``host:port[/chroot]``; without
    a chroot, ``chroot`` is used) instead of starting one. ``base_port``: broker N listens on
    ``base_port + N - 1``; 0 picks free ports (each broker keeps its port across restarts).
    ``broker_settings``: ``--set`` settings for every broker (Kafka's names). ``detach``: the
    processes outlive this one (``oncelog cluster up``); otherwise with ``die_with_parent``
    (Linux, util-linux's setpriv) they get SIGKILL when the thread that started them ends,
    so a killed test run leaves nothing behind. ``zookeeper_fsync=False``: no fsync per
    ZooKeeper transaction (tests).
    """

    def __init__(self, data_dir: str | os.PathLike[str], brokers: int = 3,
                 zookeeper: str | None = None, base_port: int = 0,
                 broker_settings: Mapping[str, Any] | None = None, *,
                 host: str = "127.0.0.1", chroot: str = DEFAULT_CHROOT,
                 die_with_parent: bool = False, zookeeper_fsync: bool = True,
                 startup_timeout: float = 60.0, relays: bool = False,
                 zookeeper_relays: bool = False,
                 env: Mapping[str, str] | None = None,
                 client_config: Mapping[str, Any] | None = None,
                 progress: Callable[[str], None] | None = None) -> None:
        if brokers < 1:
            raise ValueError(f"a cluster needs at least one broker, not {brokers}")
        self.data_dir = Path(data_dir).resolve()
        self.host = host
        self.broker_settings = {k: str(v) for k, v in (broker_settings or {}).items()}
        self.die_with_parent = die_with_parent
        self.env = dict(env or {})  # added to each broker's environment (BrokerProcess's env)
        # what our Admin client needs besides the address (a TLS listener's security_protocol,
        # ssl_cafile ...), to see whether the brokers are up and to describe topics
        self.client_config = dict(client_config) if client_config is not None \
            else _tls_client_config(self.broker_settings)
        self.startup_timeout = startup_timeout
        # told a line at each step of a start ("2 of 3 brokers registered"): oncelog cluster up
        self.progress = progress or (lambda line: None)
        self.zookeeper_fsync = zookeeper_fsync
        self._external_zookeeper = zookeeper
        self._chroot = "/" + chroot.strip("/") if chroot.strip("/") else ""
        self.zookeeper: ZooKeeperServer | None = None
        self.connect_string = ""  # the brokers' zookeeper.connect (with the chroot)
        self.base_port = base_port
        self.brokers: dict[int, LocalBroker] = {
            n: LocalBroker(n, host, base_port + n - 1 if base_port else 0,
                           self.data_dir / f"broker-{n}")
            for n in range(1, brokers + 1)}
        self._started = False
        # relays: each broker is reached (by clients and by the other brokers) only through a
        # TCP relay of its own (advertised.listeners), which ``cut`` and ``heal`` control.
        self.use_relays = relays
        self.relays: dict[int, Relay] = {}
        # zookeeper_relays: each broker reaches ZooKeeper only through a relay of its own
        # (its zookeeper.connect), which ``cut_zookeeper`` and ``heal_zookeeper`` control.
        self.use_zookeeper_relays = zookeeper_relays
        self.zookeeper_relays: dict[int, Relay] = {}

    # -- addresses ----------------------------------------------------------------------------

    @property
    def bootstrap_servers(self) -> str:
        """``host:port,...`` of every broker (running or not; its relay's, with relays)."""
        if self.use_relays:
            return ",".join(self._relay(b).address for b in self.brokers.values())
        return ",".join(b.address for b in self.brokers.values())

    def _relay(self, b: LocalBroker) -> Relay:
        relay = self.relays.get(b.node_id)
        if relay is None:
            relay = self.relays[b.node_id] = Relay(b.host, 0, b.host, b.port).start()
        return relay

    def cut(self, n: int) -> None:
        """Cut broker ``n`` off the network (relays only): every connection to it dropped,
        new ones refused; its ZooKeeper session is untouched."""
        self._relay(self._broker(n)).cut()

    def heal(self, n: int) -> None:
        self._relay(self._broker(n)).heal()

    def _zookeeper_connect(self, b: LocalBroker) -> str:
        """Broker ``b``'s zookeeper.connect: through its ZooKeeper relay, with relays."""
        if not self.use_zookeeper_relays:
            return self.connect_string
        hosts, slash, chroot = self.connect_string.partition("/")
        if "," in hosts:
            raise LocalClusterError("ZooKeeper relays need a single ZooKeeper server")
        relay = self.zookeeper_relays.get(b.node_id)
        if relay is None:
            zk_host, zk_port = hosts.rsplit(":", 1)
            relay = self.zookeeper_relays[b.node_id] = Relay(
                b.host, 0, zk_host, int(zk_port)).start()
        return relay.address + slash + chroot

    def cut_zookeeper(self, n: int) -> None:
        """Cut broker ``n`` off ZooKeeper (``zookeeper_relays`` only): its connection dropped,
        new ones refused; its session expires after zookeeper.session.timeout.ms. Clients and
        the other brokers still reach it."""
        if n not in self.zookeeper_relays:
            raise LocalClusterError("cut_zookeeper needs zookeeper_relays=True")
        self.zookeeper_relays[n].cut()

    def heal_zookeeper(self, n: int) -> None:
        if n in self.zookeeper_relays:
            self.zookeeper_relays[n].heal()

    def isolate(self, n: int) -> None:
        """Cut broker ``n`` off the other brokers, the clients (its relay) and ZooKeeper."""
        self.cut(n)
        self.cut_zookeeper(n)

    def reconnect(self, n: int) -> None:
        """Undo ``isolate``."""
        self.heal_zookeeper(n)
        self.heal(n)

    @property
    def addresses(self) -> dict[int, str]:
        """Node id -> ``host:port``."""
        return {n: b.address for n, b in self.brokers.items()}

    def running(self) -> list[int]:
        """Node ids of the brokers that run and are not paused."""
        return [n for n, b in self.brokers.items() if b.state == "running"]

    # -- life cycle ---------------------------------------------------------------------------

    def start(self) -> Self:
        """Start the ZooKeeper (unless external) and every broker; wait until all are
        registered and answer. On failure everything started is stopped again."""
        if self._started:
            return self
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._check_not_running()  # before anything is touched
        self._started = True
        # One budget for all of it, the ZooKeeper's start included (a busy machine starts a
        # JVM and three Python processes slowly: the part that is slow varies).
        deadline = time.monotonic() + self.startup_timeout
        try:
            self._start_zookeeper(deadline)
            previous = self._previous_ports() if self.base_port == 0 else {}
            taken: set[int] = set()
            for b in self.brokers.values():
                if b.port == 0:
                    port = previous.get(b.node_id)
                    b.port = port if port and port not in taken and \
                        _port_free(self.host, port) else _free_port(self.host, taken)
                taken.add(b.port)
            for b in self.brokers.values():
                self._launch(b)
            self._write_file()
            for b in self.brokers.values():
                self._wait_listening(b, deadline, first_start=True)
            self._wait_registered(list(self.brokers.values()), set(self.brokers), deadline)
            self._write_file()
        except BaseException:
            self.stop()
            raise
        return self

    def _check_not_running(self) -> None:
        """LocalClusterError if a cluster started in ``data_dir`` still runs (a broker, or its
        ZooKeeper)."""
        alive: list[str] = []
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError, AttributeError):
            info = read_cluster_file(self.data_dir)
            alive += [f"broker {n}" for n, b in info["brokers"].items()
                      if b.get("pid") and _is_our_broker(int(b["pid"]), b["data_dir"])]
        if self._external_zookeeper is None:
            found = running_server(self.data_dir / ZOOKEEPER_DIR)
            if found is not None:
                alive.append(f"ZooKeeper (pid {found[0]})")
        if alive:
            raise LocalClusterError(
                f"a cluster in {self.data_dir} still runs ({', '.join(alive)}): stop it first "
                f"(oncelog cluster down --data-dir {self.data_dir})")

    def _previous_ports(self) -> dict[int, int]:
        """The ports of an earlier run in ``data_dir``: the same bootstrap servers again."""
        try:
            info = read_cluster_file(self.data_dir)
            return {int(n): int(b["port"]) for n, b in info["brokers"].items()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return {}

    def _start_zookeeper(self, deadline: float) -> None:
        if self._external_zookeeper is None:
            self.zookeeper = ZooKeeperServer(self.data_dir / ZOOKEEPER_DIR, host=self.host,
                                             fsync=self.zookeeper_fsync,
                                             die_with_parent=self.die_with_parent)
            started = time.monotonic()
            self.zookeeper.start(timeout=max(1.0, deadline - started))
            self.connect_string = self.zookeeper.connect_string + self._chroot
            self.progress(f"ZooKeeper serving at {self.zookeeper.connect_string} "
                          f"({time.monotonic() - started:.1f} s)")
        else:
            hosts, _slash, chroot = self._external_zookeeper.partition("/")
            self.connect_string = (self._external_zookeeper if chroot.strip("/")
                                   else hosts + self._chroot)

    def _launch(self, b: LocalBroker) -> None:
        """Spawn broker ``b`` (``_wait_ready`` waits for it)."""
        settings = dict(self.broker_settings)
        if self.use_relays:
            settings["advertised.listeners"] = f"PLAINTEXT://{self._relay(b).address}"
        if b.process is None:
            # A session of its own: signals go to its process group. Unless it dies with this
            # process, it outlives it (``oncelog cluster up``): not killed at exit either.
            b.process = BrokerProcess(
                b.data_dir, log_path=b.log_path, node_id=b.node_id, host=b.host, env=self.env,
                new_session=True, die_with_parent=self.die_with_parent,
                kill_at_exit=self.die_with_parent)
        b.process.port = b.port
        b.process.settings = settings
        b.process.zookeeper = self._zookeeper_connect(b)
        b.dir.mkdir(parents=True, exist_ok=True)
        b.process.launch()
        b.pid = b.process.pid
        b.state = "running"

    def _wait_ready(self, b: LocalBroker, expect: set[int], deadline: float,
                    first_start: bool = False) -> None:
        """Until broker ``b`` answers Metadata naming itself and the ``expect``ed brokers."""
        self._wait_listening(b, deadline, first_start)
        self._wait_registered([b], expect | {b.node_id}, deadline)

    def _wait_listening(self, b: LocalBroker, deadline: float, first_start: bool) -> None:
        """Until broker ``b`` says it listens. A broker that lost the race for its (free) port
        at the first start gets another."""
        assert b.process is not None
        while True:
            try:
                b.process.wait_listening(max(0.0, deadline - time.monotonic()))
                break
            except BrokerProcessError as exc:
                tail = b.tail()
                if first_start and self.base_port == 0 and "Address already in use" in tail \
                        and time.monotonic() < deadline:
                    b.port = _free_port(self.host, {x.port for x in self.brokers.values()})
                    self._launch(b)
                    self._write_file()
                    continue
                self._reap(b)
                if "did not listen within" in str(exc):
                    # none is known to be registered yet: the wait for that comes after this
                    missing = sorted(self.brokers) if first_start else [b.node_id]
                    raise LocalClusterTimeout(
                        f"not up within the startup timeout ({self.startup_timeout:g} s): "
                        f"broker{'s' if len(missing) > 1 else ''} "
                        f"{', '.join(map(str, missing))} not registered (0 of {len(missing)} "
                        f"registered; broker {b.node_id} not even listening yet); the end of "
                        f"{b.log_path}:\n{b.tail()}", missing, self.startup_timeout) from None
                raise LocalClusterError(f"broker {b.node_id} did not start: {exc}") from None
        self.progress(f"broker {b.node_id} listening on {b.address}")

    def _wait_registered(self, waiting: list[LocalBroker], expect: set[int],
                         deadline: float) -> None:
        """Until each of ``waiting`` answers DescribeCluster naming every ``expect``ed broker
        (registered in ZooKeeper, and in its view of the cluster). Tells the progress as
        brokers register ("2 of 3 brokers registered").

        Each broker is asked through one Admin client kept across attempts, with a request
        timeout of several seconds: a broker on a busy machine may take more than a second to
        answer, and a client made anew per attempt with a 1 s timeout (as before) then gave up
        on every answer, paid a new connection and handshake each time, and could run out the
        whole startup timeout with brokers that were up."""
        from ..client.admin.admin import Admin

        admins: dict[int, Admin] = {}
        registered: set[int] = set()
        told = -1
        ready: set[int] = set()
        try:
            while True:
                for b in waiting:
                    if b.node_id in ready:
                        continue
                    assert b.process is not None and b.process.proc is not None
                    rc = b.process.proc.poll()
                    if rc is not None:
                        self._reap(b)
                        raise LocalClusterError(
                            f"broker {b.node_id} exited with code {rc}; the end of "
                            f"{b.log_path}:\n{b.tail()}")
                    seen = self._registered_seen_by(b, admins, deadline)
                    if seen is None:
                        continue
                    registered |= seen & expect
                    if expect <= seen:
                        ready.add(b.node_id)
                if len(registered) != told:
                    told = len(registered)
                    self.progress(f"{told} of {len(expect)} brokers registered"
                                  + (f" ({', '.join(map(str, sorted(registered)))})"
                                     if 0 < told < len(expect) else ""))
                if len(ready) == len(waiting):
                    return
                if time.monotonic() >= deadline:
                    missing = sorted(expect - registered)
                    late = [b for b in waiting if b.node_id not in ready]
                    b = next((x for x in late if x.node_id in missing), late[0])
                    what = (f"broker{'s' if len(missing) > 1 else ''} "
                            f"{', '.join(map(str, missing))} not registered "
                            f"({len(registered)} of {len(expect)} registered)") if missing \
                        else (f"every broker registered, but broker{'s' if len(late) > 1 else ''}"
                              f" {', '.join(str(x.node_id) for x in late)} did not see them all")
                    raise LocalClusterTimeout(
                        f"not up within the startup timeout ({self.startup_timeout:g} s): "
                        f"{what}; the end of {b.log_path}:\n{b.tail()}",
                        missing or [x.node_id for x in late], self.startup_timeout)
                time.sleep(0.1)
        finally:
            for admin in admins.values():
                with contextlib.suppress(Exception):
                    admin.close()

    def _registered_seen_by(self, b: LocalBroker, admins: dict[int, Any],
                            deadline: float) -> set[int] | None:
        """The brokers ``b`` names in its DescribeCluster answer; None when it did not answer
        (its client is dropped then, and made again at the next attempt)."""
        from ..client.admin.admin import Admin

        admin = admins.get(b.node_id)
        try:
            if admin is None:
                # several seconds per request, never past the deadline by much
                wait_ms = int(min(10.0, max(1.0, deadline - time.monotonic())) * 1000)
                admin = admins[b.node_id] = Admin(
                    bootstrap_servers=b.address, request_timeout_ms=wait_ms,
                    default_api_timeout_ms=wait_ms, retry_backoff_ms=50,
                    reconnect_backoff_ms=50, reconnect_backoff_max_ms=200,
                    **self.client_config)
            return set(admin.describe_cluster().nodes)
        except (KafkaError, OSError):  # not answering yet
            dropped = admins.pop(b.node_id, None)
            if dropped is not None:
                with contextlib.suppress(Exception):
                    dropped.close()
            return None

    def _write_file(self) -> None:
        info = {
            "zookeeper": self.connect_string,
            "zookeeper_dir": (str(self.zookeeper.data_dir) if self.zookeeper is not None
                              else None),
            "bootstrap_servers": self.bootstrap_servers,
            "settings": self.broker_settings,
            "brokers": {str(n): {"node_id": n, "host": b.host, "port": b.port,
                                 "address": b.address, "pid": b.pid, "state": b.state,
                                 "data_dir": str(b.data_dir), "log": str(b.log_path)}
                        for n, b in self.brokers.items()},
        }
        path = self.data_dir / CLUSTER_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(info, indent=2) + "\n")
        tmp.replace(path)

    def stop(self, timeout: float = 15.0) -> None:
        """Stop every broker (SIGTERM, SIGKILL after ``timeout``), then the ZooKeeper."""
        try:
            _stop_processes([b.process for b in self.brokers.values()
                             if b.process is not None and b.process.running], timeout)
        finally:
            for b in self.brokers.values():
                self._reap(b)
            if self.zookeeper is not None:
                self.zookeeper.stop()
            for relay in [*self.relays.values(), *self.zookeeper_relays.values()]:
                relay.stop()
            self.relays.clear()
            self.zookeeper_relays.clear()
            self._started = False
            if (self.data_dir / CLUSTER_FILE).exists():
                self._write_file()

    def _reap(self, b: LocalBroker) -> None:
        if b.process is not None and b.process.proc is not None:
            b.process.wait(5.0)
        b.pid = None
        b.state = "stopped"

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- faults -------------------------------------------------------------------------------

    def _broker(self, n: int) -> LocalBroker:
        try:
            return self.brokers[n]
        except KeyError:
            raise ValueError(f"no broker {n} (brokers are {sorted(self.brokers)})") from None

    def _running(self, n: int) -> BrokerProcess:
        b = self._broker(n)
        if b.process is None or not b.process.running:
            raise LocalClusterError(f"broker {n} is not running")
        return b.process

    def kill(self, n: int) -> None:
        """SIGKILL broker ``n`` (a crash: its ZooKeeper session lingers until it expires)."""
        self._running(n).kill()
        self._reap(self.brokers[n])
        self._write_file()

    def pause(self, n: int) -> None:
        """SIGSTOP broker ``n``: it neither answers nor heartbeats ZooKeeper until resumed."""
        self._running(n).pause()
        self.brokers[n].state = "paused"
        self._write_file()

    def resume(self, n: int) -> None:
        """SIGCONT a paused broker."""
        self._running(n).resume()
        self.brokers[n].state = "running"
        self._write_file()

    def stop_broker(self, n: int, timeout: float = 15.0) -> None:
        """SIGTERM broker ``n`` (a clean shutdown; SIGKILL after ``timeout``)."""
        b = self._broker(n)
        if b.process is not None and b.process.running:
            _stop_processes([b.process], timeout)
        self._reap(b)
        self._write_file()

    def start_broker(self, n: int, timeout: float | None = None) -> None:
        """Start broker ``n`` again (same port, same data directory) and wait until it is
        registered and answers. A broker restarted right after a crash may first have to wait
        out its old ZooKeeper session."""
        b = self._broker(n)
        if b.process is not None and b.process.running:
            raise LocalClusterError(f"broker {n} is running already")
        self._reap(b)
        self._launch(b)
        self._write_file()
        deadline = time.monotonic() + (self.startup_timeout if timeout is None else timeout)
        self._wait_ready(b, set(), deadline)

    # -- observing ----------------------------------------------------------------------------

    def describe(self, topic: str) -> dict[int, Any]:
        """Partition index -> PartitionInfo (leader, replicas, isr), as a running broker
        answers it (the Admin client's describe_topics)."""
        from ..client.admin.admin import Admin

        last: Exception | None = None
        for n in self.running() or list(self.brokers):
            try:
                with Admin(bootstrap_servers=self.brokers[n].address, request_timeout_ms=2000,
                           default_api_timeout_ms=3000, retry_backoff_ms=50,
                           **self.client_config) as admin:
                    described = admin.describe_topics([topic])[topic]
                return {p.partition: p for p in described.partitions}
            except (KafkaError, OSError) as exc:  # that broker is away: ask another
                last = exc
        raise LocalClusterError(f"no running broker described {topic!r}: {last!r}")

    def leader_of(self, topic: str, partition: int) -> int:
        """The partition's leader (node id; -1 while it has none)."""
        return int(self.describe(topic)[partition].leader)

    def wait_for_isr(self, topic: str, partition: int, size: int, timeout: float = 30.0
                     ) -> Any:
        """Until the partition has a leader and exactly ``size`` in-sync replicas; its
        PartitionInfo (LocalClusterError after ``timeout`` seconds)."""
        deadline = time.monotonic() + timeout
        last: Any = None
        while True:
            with contextlib.suppress(LocalClusterError):
                last = self.describe(topic).get(partition)
                if last is not None and last.leader >= 0 and len(last.isr) == size:
                    return last
            if time.monotonic() >= deadline:
                raise LocalClusterError(f"{topic}-{partition}: no ISR of {size} within "
                                        f"{timeout:g} s (last seen: {last})")
            time.sleep(0.1)

    def wait_for_leader(self, topic: str, partition: int, *, not_on: int | None = None,
                        timeout: float = 30.0) -> int:
        """Until the partition has a leader (other than ``not_on``); its node id."""
        deadline = time.monotonic() + timeout
        leader = -1
        while True:
            with contextlib.suppress(LocalClusterError):
                leader = self.leader_of(topic, partition)
                if leader >= 0 and leader != not_on:
                    return leader
            if time.monotonic() >= deadline:
                raise LocalClusterError(f"{topic}-{partition}: no leader (other than "
                                        f"{not_on}) within {timeout:g} s (last: {leader})")
            time.sleep(0.05)

    def __repr__(self) -> str:
        states = ", ".join(f"{n}:{b.state}" for n, b in self.brokers.items())
        return f"LocalCluster({self.data_dir}, {self.connect_string or 'not started'}, {states})"


def cluster_down(data_dir: str | os.PathLike[str], timeout: float = 15.0) -> dict[str, Any]:
    """Stop the cluster another process started in ``data_dir`` (``cluster.json``): its
    brokers (SIGTERM, SIGKILL after ``timeout``), then its ZooKeeper if it started one. What was
    stopped: ``{"brokers": [node ids], "zookeeper": bool}``. FileNotFoundError when there is no
    cluster.json."""
    data_dir = Path(data_dir).resolve()
    info = read_cluster_file(data_dir)
    stopped: list[int] = []
    pids: list[int] = []
    for n, b in sorted(info.get("brokers", {}).items(), key=lambda kv: int(kv[0])):
        pid = b.get("pid")
        if pid and _is_our_broker(int(pid), b["data_dir"]):
            pids.append(int(pid))
            stopped.append(int(n))
    _stop_pids(pids, timeout)
    zookeeper = False
    zk_dir = info.get("zookeeper_dir")
    if zk_dir:
        zookeeper = stop_server(zk_dir, timeout)
    for b in info.get("brokers", {}).values():
        b["pid"], b["state"] = None, "stopped"
    path = data_dir / CLUSTER_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(info, indent=2) + "\n")
    tmp.replace(path)
    return {"brokers": stopped, "zookeeper": zookeeper}


# -- ``oncelog cluster up`` / ``down`` ----------------------------------------------------------


def _key_value(text: str) -> tuple[str, str]:
    import argparse

    if "=" not in text:
        raise argparse.ArgumentTypeError(f"expected key=value, got {text!r}")
    key, value = text.split("=", 1)
    return key.strip(), value.strip()


# ``cluster up``'s default --timeout, for all of it (ZooKeeper's JVM included): three brokers
# came up in 12-14 s on a 2-core machine whose load average was 18; the 60 s it was before
# ran out under a full test suite. A timeout that runs out is named in the error.
UP_TIMEOUT_S = 180.0


def add_arguments(parser: Any) -> None:
    """The ``cluster`` subcommands (``up``, ``down``) on an argparse parser."""
    sub = parser.add_subparsers(dest="cluster_command", required=True, metavar="ACTION")
    up = sub.add_parser("up", help="start a local cluster (ZooKeeper and brokers) in the "
                        "background", description="Start a ZooKeeper (unless --zookeeper) and "
                        "N brokers in the background, wait until all are registered, print "
                        "their addresses and exit; `oncelog cluster down` stops them.")
    up.add_argument("--brokers", type=int, default=3, help="number of brokers (default 3)")
    up.add_argument("--data-dir", required=True,
                    help="directory for the brokers, the ZooKeeper and cluster.json")
    up.add_argument("--zookeeper", default=None, metavar="HOST:PORT[/CHROOT]",
                    help=f"use this running ZooKeeper (default: start one; chroot "
                    f"{DEFAULT_CHROOT} unless given)")
    up.add_argument("--host", default="127.0.0.1", help="address the brokers listen on")
    up.add_argument("--base-port", type=int, default=0,
                    help="broker N listens on BASE_PORT+N-1 (default: free ports, the same "
                    "ones again when the data dir was used before)")
    up.add_argument("--set", action="append", type=_key_value, default=[], metavar="KEY=VALUE",
                    help="a setting for every broker, e.g. zookeeper.session.timeout.ms=3000 "
                    "(repeatable)")
    up.add_argument("--timeout", type=float, default=UP_TIMEOUT_S,
                    help="seconds to wait for the whole cluster (ZooKeeper included) to come "
                    f"up (default {UP_TIMEOUT_S:g}; a machine busy with other work needs "
                    "more)")
    down = sub.add_parser("down", help="stop a cluster started by `oncelog cluster up`",
                          description="Stop the brokers (SIGTERM, SIGKILL after --timeout) and "
                          "the ZooKeeper of the cluster in --data-dir.")
    down.add_argument("--data-dir", required=True)
    down.add_argument("--timeout", type=float, default=15.0,
                      help="seconds before SIGKILL (default 15)")


def run_command(args: Any) -> int:
    """``oncelog cluster up`` / ``down``."""
    from .zookeeper import ZooKeeperError, ZooKeeperNotFoundError

    if args.cluster_command == "down":
        try:
            stopped = cluster_down(args.data_dir, args.timeout)
        except FileNotFoundError:
            print(f"oncelog cluster down: no cluster in {args.data_dir} (no {CLUSTER_FILE})",
                  file=sys.stderr)
            return 1
        except (LocalClusterError, ZooKeeperError) as exc:
            print(f"oncelog cluster down: {exc}", file=sys.stderr)
            return 1
        brokers = ", ".join(map(str, stopped["brokers"])) or "none running"
        print(f"stopped brokers: {brokers}"
              + ("; stopped ZooKeeper" if stopped["zookeeper"] else ""))
        return 0
    try:
        cluster = LocalCluster(args.data_dir, args.brokers, args.zookeeper, args.base_port,
                               dict(args.set), host=args.host, startup_timeout=args.timeout,
                               progress=lambda line: print(f"oncelog cluster up: {line}",
                                                           file=sys.stderr, flush=True))
        cluster.start()
    except LocalClusterTimeout as exc:
        first, _, rest = str(exc).partition("\n")
        print(f"oncelog cluster up: {first}\nraise --timeout (now {args.timeout:g} s) if this "
              f"machine is busy, or see the broker's log{':' if rest else ''}\n{rest}".rstrip(),
              file=sys.stderr)
        return 1
    except ZooKeeperError as exc:
        text = str(exc)
        if "no answer within" in text:
            text += f"\n(raise --timeout, now {args.timeout:g} s, if this machine is busy)"
        print(f"oncelog cluster up: {text}", file=sys.stderr)
        return 1
    except (ValueError, LocalClusterError, ZooKeeperNotFoundError, OSError) as exc:
        # an OSError in words (no errno number), naming the path it is about
        text = f"{exc.strerror}: {exc.filename}" if isinstance(exc, OSError) and \
            exc.strerror and exc.filename else str(exc)
        print(f"oncelog cluster up: {text}", file=sys.stderr)
        return 1
    # The processes run in sessions of their own: they outlive this command.
    print(f"zookeeper: {cluster.connect_string}")
    for n, b in cluster.brokers.items():
        print(f"broker {n}: {b.address} (pid {b.pid}, log {b.log_path})")
    print(f"bootstrap servers: {cluster.bootstrap_servers}")
    print(f"stop with: oncelog cluster down --data-dir {cluster.data_dir}")
    return 0
