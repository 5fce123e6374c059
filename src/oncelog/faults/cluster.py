"""A replicated oncelog cluster whose every node is a host of its own (``faults/net.py``), and the
faults Jepsen injects into it.

    with NetCluster(tmp_path, brokers=3, zookeepers=1) as cluster:
        producer = Producer(bootstrap_servers=cluster.bootstrap_servers, ...)  # from here
        c1 = cluster.client_host("c1")          # or a client process in a host of its own
        cluster.isolate(cluster.leader_of("t", 0))
        cluster.heal_all()                      # every fault undone; waits until healthy

Hosts (``198.18.N.X``): ZooKeeper nodes ``zk1..zk3`` at .11-.13 (one, or an ensemble of three:
``server.N`` lines and ``myid``), brokers ``n1..n5`` at .21-.25 (node id = the digit, port
9092), clients ``c1..`` at .101-; the runner itself (the control host, .1, in the root
namespace) reaches all of them and is never cut. Brokers are ``BrokerProcess``es launched
with ``ip netns exec`` (and the clock wrapper, ``faults/clock.py``); ZooKeeper nodes are
``ZooKeeperServer``s the same way. Everything ``LocalCluster`` does (waiting until every
broker is registered, kill / pause / resume / start_broker, describe / leader_of /
wait_for_isr) is inherited from it.

Options: ``link_proxy``: each broker listens on 127.0.0.1 of its host behind a
``faults/linkproxy.py`` proxy on the host's address (its advertised listener), for ``link``
(delay, loss); ``clock``: brokers run with a skewable wall clock (``clock_offset``);
``disk_mb``: each broker's data directory is a tmpfs of that size (``fill_disk``).

Faults (all undone by ``heal_all``):

- processes: ``kill(n)`` (SIGKILL; ``start_broker(n)`` restarts), ``pause(n)`` /
  ``resume(n)`` (SIGSTOP / SIGCONT), and the same for ZooKeeper: ``kill_zk(i)``,
  ``start_zk(i)``, ``pause_zk(i)``, ``resume_zk(i)``;
- network (iptables in each host): ``partition(groups)`` (host names or broker ids),
  ``isolate(node)``, ``zk_cut(brokers)`` (brokers cut from every ZooKeeper node, still
  reaching each other and the clients), ``one_way(src, dst)``, ``bridge(left, right, via)``,
  ``heal_network()``;
- links (``link_proxy``): ``link(delay_ms, jitter_ms, loss, sources=None, brokers=None)``,
  ``heal_link()``;
- clocks (``clock``): ``clock_offset(n, ms)``, ``reset_clocks()``;
- disks (``disk_mb``): ``fill_disk(n)``, ``free_disk(n)``.

Observers (from the control host, with our Admin client): ``leader_of(topic, partition)``,
``controller()``, ``coordinator_of(transactional_id)``, ``wait_healthy()``.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Self

from ..errors import KafkaError
from ..harness.broker_process import BrokerProcess
from ..harness.local_cluster import LocalBroker, LocalCluster, LocalClusterError
from ..harness.zookeeper import ZooKeeperServer, signal_group
from .clock import ClockControl, wrap_command
from .disk import DataDisk
from .linkproxy import LinkProxy, Rule
from .net import Host, Network

__all__ = ["BROKER_PORT", "DEFAULT_SETTINGS", "ZK_PORT", "NetCluster"]

BROKER_PORT = 9092
ZK_PORT = 2181
# Faults are detected in seconds, not Kafka's defaults of tens of seconds: a short run sees
# elections, expiries and recoveries many times over.
DEFAULT_SETTINGS = {
    "zookeeper.session.timeout.ms": "4000",
    "replica.lag.time.max.ms": "4000",
    "default.replication.factor": "3",
    "min.insync.replicas": "2",
    "offsets.topic.num.partitions": "3",
    "transaction.state.log.num.partitions": "3",
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000",
}


class NetCluster(LocalCluster):
    """ZooKeeper node(s) and ``brokers`` brokers, each in a host (namespace) of its own."""

    def __init__(self, data_dir: str | os.PathLike[str], brokers: int = 3, zookeepers: int = 1,
                 settings: Mapping[str, Any] | None = None, *, link_proxy: bool = False,
                 clock: bool = True, disk_mb: int | None = None,
                 startup_timeout: float = 120.0, seed: int | None = None,
                 progress: Callable[[str], None] | None = None) -> None:
        if not 1 <= brokers <= 5:
            raise ValueError(f"1 to 5 brokers, not {brokers}")
        if zookeepers not in (1, 3):
            raise ValueError(f"1 or 3 ZooKeeper nodes, not {zookeepers}")
        super().__init__(data_dir, brokers, None, 0, {**DEFAULT_SETTINGS, **(settings or {})},
                         die_with_parent=True, zookeeper_fsync=False,
                         startup_timeout=startup_timeout, progress=progress)
        self.n_zookeepers = zookeepers
        self.use_link_proxy = link_proxy
        self.use_clock = clock
        self.disk_mb = disk_mb
        self.seed = seed
        self.network: Network | None = None
        self.zk_hosts: dict[int, Host] = {}
        self.broker_hosts: dict[int, Host] = {}
        self.client_hosts: dict[str, Host] = {}
        self.zookeepers: dict[int, ZooKeeperServer] = {}
        self.zk_state: dict[int, str] = {}  # running, paused, stopped
        self.proxies: dict[int, LinkProxy] = {}
        self.clocks: dict[int, ClockControl] = {}
        self.disks: dict[int, DataDisk] = {}
        self._file_lock = threading.RLock()
        self._spawner: _Spawner | None = None

    # -- names --------------------------------------------------------------------------------

    def _net(self) -> Network:
        if self.network is None:
            raise LocalClusterError("the cluster is not started")
        return self.network

    @staticmethod
    def broker_host_name(n: int) -> str:
        return f"n{n}"

    @staticmethod
    def zk_host_name(i: int) -> str:
        return f"zk{i}"

    def host_name(self, node: int | str) -> str:
        """A broker id (``2``) or a host name (``"n2"``, ``"zk1"``, ``"c1"``) -> host name."""
        if isinstance(node, int):
            self._broker(node)
            return self.broker_host_name(node)
        self._net().host(node)
        return node

    def broker_id(self, host: str) -> int | None:
        """The broker id of a host name (None for ZooKeeper and client hosts)."""
        for n, h in self.broker_hosts.items():
            if h.name == host:
                return n
        return None

    def client_host(self, name: str) -> Host:
        """A client host (made on first use; addresses from .101 on)."""
        host = self.client_hosts.get(name)
        if host is None:
            index = 101 + len(self.client_hosts)
            host = self.client_hosts[name] = self._net().add_host(name, index)
        return host

    @property
    def zookeeper_connect(self) -> str:
        return self.connect_string

    def _spawn(self, start: Callable[[], Any]) -> Any:
        """Run ``start`` (a process launch) in the cluster's spawner thread: the processes die
        with that thread (setpriv's PR_SET_PDEATHSIG is the starting thread's), which lives
        until ``stop``, whatever thread (a nemesis lane's, a runner's) asked for the start."""
        if self._spawner is None or not self._spawner.is_alive():
            self._spawner = _Spawner()
            self._spawner.start()
        return self._spawner.call(start)

    # -- life cycle ---------------------------------------------------------------------------

    def start(self) -> Self:
        if self._started:
            return self
        self.data_dir.mkdir(parents=True, exist_ok=True)
        try:
            self.network = Network()
            for i in range(1, self.n_zookeepers + 1):
                self.zk_hosts[i] = self.network.add_host(self.zk_host_name(i), 10 + i)
            for n, b in self.brokers.items():
                host = self.broker_hosts[n] = self.network.add_host(self.broker_host_name(n),
                                                                    20 + n)
                b.host, b.port = host.address, BROKER_PORT
                if self.disk_mb:
                    self.disks[n] = DataDisk(b.data_dir, self.disk_mb).mount()
                if self.use_clock:
                    b.dir.mkdir(parents=True, exist_ok=True)
                    self.clocks[n] = ClockControl(b.dir / "clock-offset-ms")
                if self.use_link_proxy:
                    b.dir.mkdir(parents=True, exist_ok=True)
                    self.proxies[n] = LinkProxy(
                        host, BROKER_PORT, ("127.0.0.1", BROKER_PORT), b.dir / "link.sock",
                        b.dir / "linkproxy.log",
                        seed=None if self.seed is None else self.seed * 10 + n)
                    self._spawn(self.proxies[n].start)
            self.progress(f"network {self.network.prefix}.0/24: "
                          f"{', '.join(h for h in self.network.hosts)}")
        except BaseException:
            self.stop()
            raise
        return super().start()

    def _start_zookeeper(self, deadline: float) -> None:
        ensemble = ({i: h.address for i, h in self.zk_hosts.items()}
                    if self.n_zookeepers > 1 else None)
        for i, host in self.zk_hosts.items():
            self.zookeepers[i] = ZooKeeperServer(
                self.data_dir / f"zk{i}", ZK_PORT, host.address, fsync=False,
                die_with_parent=True, ensemble=ensemble, myid=i if ensemble else None,
                wrap=host.wrap)
        started = time.monotonic()
        for i, zk in self.zookeepers.items():
            self._spawn(lambda zk=zk: zk.start(wait=False))  # type: ignore[misc]
            self.zk_state[i] = "running"
        for zk in self.zookeepers.values():
            zk.wait_serving(max(1.0, deadline - time.monotonic()))
        self.zookeeper = self.zookeepers[1]
        self.connect_string = ",".join(f"{h.address}:{ZK_PORT}"
                                       for h in self.zk_hosts.values()) + self._chroot
        self.progress(f"ZooKeeper serving at {self.connect_string} "
                      f"({time.monotonic() - started:.1f} s)")

    def _launch(self, b: LocalBroker) -> None:
        n = b.node_id
        host = self.broker_hosts[n]
        settings = dict(self.broker_settings)
        listen_host = host.address
        if self.use_link_proxy:
            listen_host = "127.0.0.1"
            settings["advertised.listeners"] = f"PLAINTEXT://{host.address}:{BROKER_PORT}"
        clock = self.clocks.get(n)

        def wrap(argv: list[str]) -> list[str]:
            if clock is not None:
                argv = wrap_command(argv, clock.path)
            return host.wrap(argv)

        if b.process is None:
            b.process = BrokerProcess(
                b.data_dir, log_path=b.log_path, node_id=n, host=listen_host, env=self.env,
                new_session=True, die_with_parent=True, kill_at_exit=True, wrap=wrap)
        b.process.host = listen_host
        b.process.port = BROKER_PORT
        b.process.settings = settings
        b.process.zookeeper = self.connect_string
        b.dir.mkdir(parents=True, exist_ok=True)
        self._spawn(b.process.launch)
        b.pid = b.process.pid
        b.state = "running"

    def stop(self, timeout: float = 15.0) -> None:
        """Stop every broker, every ZooKeeper node and proxy; unmount the disks; delete the
        network."""
        try:
            for i in self.zookeepers:
                if self.zk_state.get(i) == "paused":
                    self.resume_zk(i)
            super().stop(timeout)
        finally:
            for zk in self.zookeepers.values():
                with contextlib.suppress(Exception):
                    zk.stop()
            for i in self.zookeepers:
                self.zk_state[i] = "stopped"
            for proxy in self.proxies.values():
                proxy.stop()
            for disk in self.disks.values():
                disk.unmount()
            if self.network is not None:
                self.network.teardown()
                self.network = None
            self.zk_hosts.clear()
            self.broker_hosts.clear()
            self.client_hosts.clear()
            if (self.data_dir / "cluster.json").exists():
                self._write_file()  # no network any more
            if self._spawner is not None:
                self._spawner.close()
                self._spawner = None

    def _write_file(self) -> None:
        """``cluster.json`` (LocalCluster's), with the network: the subnet, every host's
        namespace and address, the ZooKeeper nodes."""
        with self._file_lock:  # the nemesis's lanes are threads
            self._write_network_file()

    def _write_network_file(self) -> None:
        super()._write_file()
        if self.network is None:
            return
        import json

        path = self.data_dir / "cluster.json"
        info = json.loads(path.read_text())
        info["network"] = {
            "subnet": f"{self.network.prefix}.0/24", "control": self.network.control.address,
            "hosts": {h.name: {"namespace": h.namespace, "address": h.address}
                      for h in self.network.hosts.values()}}
        info["zookeepers"] = {str(i): {"address": f"{h.address}:{ZK_PORT}",
                                       "pid": self.zookeepers[i].pid if i in self.zookeepers
                                       else None, "state": self.zk_state.get(i, "stopped"),
                                       "dir": str(self.data_dir / f"zk{i}")}
                              for i, h in self.zk_hosts.items()}
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(info, indent=2) + "\n")
        tmp.replace(path)

    # -- process faults -----------------------------------------------------------------------

    def _zk(self, i: int) -> ZooKeeperServer:
        try:
            return self.zookeepers[i]
        except KeyError:
            raise ValueError(f"no ZooKeeper node {i} (nodes: {sorted(self.zookeepers)})") \
                from None

    def kill_zk(self, i: int) -> None:
        """SIGKILL ZooKeeper node ``i``."""
        self._zk(i).kill()
        self.zk_state[i] = "stopped"

    def start_zk(self, i: int, timeout: float = 60.0) -> None:
        """Start ZooKeeper node ``i`` again (same data); waits until it serves (a member of an
        ensemble serves once it has rejoined a quorum)."""
        zk = self._zk(i)
        self._spawn(lambda: zk.start(wait=False))
        self.zk_state[i] = "running"
        zk.wait_serving(timeout)

    def pause_zk(self, i: int) -> None:
        """SIGSTOP ZooKeeper node ``i``."""
        zk = self._zk(i)
        if zk.pid is None:
            raise LocalClusterError(f"ZooKeeper node {i} is not running")
        signal_group(zk.pid, signal.SIGSTOP)
        self.zk_state[i] = "paused"

    def resume_zk(self, i: int) -> None:
        zk = self._zk(i)
        if zk.pid is not None:
            signal_group(zk.pid, signal.SIGCONT)
        self.zk_state[i] = "running" if zk.is_running() else "stopped"

    # -- network faults -----------------------------------------------------------------------

    def partition(self, groups: Iterable[Iterable[int | str]]) -> None:
        """Cut the groups (broker ids or host names) from each other."""
        self._net().partition([[self.host_name(x) for x in g] for g in groups])

    def isolate(self, node: int | str) -> None:
        """Cut one host (a broker id or host name) from every other host (clients and
        ZooKeeper included; never from the control host)."""
        self._net().isolate(self.host_name(node))

    def zk_cut(self, brokers: Iterable[int] | None = None) -> None:
        """Cut ``brokers`` (default: all) from every ZooKeeper node; they still reach each
        other and the clients."""
        ids = list(brokers) if brokers is not None else list(self.brokers)
        self._net().partition([[self.broker_host_name(n) for n in ids],
                               [h.name for h in self.zk_hosts.values()]])

    def one_way(self, src: int | str, dst: int | str) -> None:
        """``dst`` drops everything ``src`` sends."""
        self._net().drop(self.host_name(src), self.host_name(dst))

    def bridge(self, left: Iterable[int | str], right: Iterable[int | str],
               via: int | str) -> None:
        """``left`` and ``right`` cannot reach each other; ``via`` reaches both."""
        self._net().bridge([self.host_name(x) for x in left],
                           [self.host_name(x) for x in right], self.host_name(via))

    def heal_network(self) -> None:
        self._net().heal()

    # -- link faults --------------------------------------------------------------------------

    def link(self, delay_ms: float = 0.0, jitter_ms: float = 0.0, loss: float = 0.0,
             sources: Iterable[int | str] | None = None,
             brokers: Iterable[int] | None = None) -> None:
        """Delay (and jitter) each way, and loss (retransmission stalls) on the links into
        ``brokers`` (default all) from ``sources`` (broker ids or host names; default every
        host). Needs ``link_proxy=True``."""
        if not self.use_link_proxy:
            raise LocalClusterError("link faults need NetCluster(..., link_proxy=True)")
        rule: Rule = {"delay_ms": delay_ms, "jitter_ms": jitter_ms, "loss": loss}
        net = self._net()
        if sources is None:
            rules = {"*": rule}
        else:
            rules = {net.host(self.host_name(s)).address: rule for s in sources}
        for n in (list(brokers) if brokers is not None else list(self.proxies)):
            self.proxies[n].set_rules({**self.proxies[n].rules, **rules})

    def heal_link(self) -> None:
        for proxy in self.proxies.values():
            proxy.heal()

    # -- clocks -------------------------------------------------------------------------------

    def clock_offset(self, n: int, ms: float) -> None:
        """Broker ``n``'s wall clock ``ms`` ahead of the real one (behind if negative), from
        now on: a jump. Needs ``clock=True``."""
        self._broker(n)
        if n not in self.clocks:
            raise LocalClusterError("clock faults need NetCluster(..., clock=True)")
        self.clocks[n].set_offset(ms)

    def reset_clocks(self) -> None:
        for c in self.clocks.values():
            c.reset()

    # -- disks --------------------------------------------------------------------------------

    def fill_disk(self, n: int) -> int:
        """Fill broker ``n``'s data disk; the bytes written. Needs ``disk_mb``."""
        self._broker(n)
        if n not in self.disks:
            raise LocalClusterError("disk faults need NetCluster(..., disk_mb=...)")
        return self.disks[n].fill()

    def free_disk(self, n: int) -> None:
        if n in self.disks:
            self.disks[n].free()

    # -- healing ------------------------------------------------------------------------------

    def heal_all(self, timeout: float = 120.0) -> None:
        """Undo every fault: the network, the links, the clocks, the disks; resume what is
        paused and start what is not running (a broker that stopped itself included: a
        supervisor would); then wait until the cluster is healthy."""
        self.heal_network()
        self.heal_link()
        self.reset_clocks()
        for n in self.disks:
            self.free_disk(n)
        for i, state in list(self.zk_state.items()):
            if state == "paused":
                self.resume_zk(i)
        for i, zk in self.zookeepers.items():
            if not zk.is_running():
                self._spawn(lambda zk=zk: zk.start(wait=False))  # type: ignore[misc]
                self.zk_state[i] = "running"
        for i, zk in self.zookeepers.items():
            zk.wait_serving(timeout)
        for n, b in self.brokers.items():
            if b.state == "paused":
                self.resume(n)
        for n, b in self.brokers.items():
            if b.process is None or not b.process.running:
                self.start_broker(n, timeout)
        for proxy in self.proxies.values():
            if not proxy.running:
                self._spawn(proxy.start)
        self.wait_healthy(timeout)

    # -- observers ----------------------------------------------------------------------------

    def _admin(self, timeout_s: float = 5.0) -> Any:
        from ..client.admin.admin import Admin

        ms = int(timeout_s * 1000)
        return Admin(bootstrap_servers=self.bootstrap_servers, request_timeout_ms=ms,
                     default_api_timeout_ms=ms, retry_backoff_ms=50, reconnect_backoff_ms=50,
                     reconnect_backoff_max_ms=200, **self.client_config)

    def controller(self) -> int:
        """The controller's node id, as a running broker sees it (-1: none known)."""
        with self._admin() as admin:
            return int(admin.describe_cluster().controller_id)

    def coordinator_of(self, transactional_id: str, timeout: float = 30.0) -> int:
        """The transaction coordinator of ``transactional_id`` (FindCoordinator, asked again
        while the answer is retriable: the transaction log being created, its leader
        moving)."""
        from ..errors import RetriableError, error_for_code
        from ..protocol import ApiKey

        deadline = time.monotonic() + timeout
        with self._admin() as admin:
            while True:
                r = admin._net.request_any(ApiKey.FIND_COORDINATOR, lambda version: {
                    "key_type": 1, "key": transactional_id,
                    "coordinator_keys": [transactional_id]}, min(deadline, time.monotonic() + 5))
                c = r.coordinators[0] if hasattr(r, "coordinators") else r
                if not int(c.error_code):
                    return int(c.node_id)
                error = error_for_code(int(c.error_code))(
                    f"FindCoordinator {transactional_id!r}: {c.error_message or ''}")
                if not isinstance(error, RetriableError) or time.monotonic() >= deadline:
                    raise error
                time.sleep(0.1)

    def wait_healthy(self, timeout: float = 120.0) -> None:
        """Until every broker is registered (each names all of them) and every partition of
        every topic (internal ones included) has a leader and its full ISR."""
        deadline = time.monotonic() + timeout
        running = [b for b in self.brokers.values() if b.process is not None]
        self._wait_registered(running, set(self.brokers), deadline)
        last = "nothing asked yet"
        while True:
            try:
                with self._admin() as admin:
                    topics = admin.list_topics(include_internal=True)
                    described = admin.describe_topics(topics) if topics else {}
                bad = [f"{t}-{p.partition} (leader {p.leader}, isr {sorted(p.isr)} of "
                       f"{sorted(p.replicas)})"
                       for t, d in described.items() for p in d.partitions
                       if p.leader < 0 or set(p.isr) != set(p.replicas)]
                if not bad:
                    return
                last = ", ".join(bad[:5])
            except (KafkaError, OSError) as exc:
                last = repr(exc)
            if time.monotonic() >= deadline:
                raise LocalClusterError(f"not healthy within {timeout:g} s: {last}")
            time.sleep(0.2)

    def __repr__(self) -> str:
        states = ", ".join(f"{n}:{b.state}" for n, b in self.brokers.items())
        zk = ", ".join(f"zk{i}:{s}" for i, s in self.zk_state.items())
        net = self.network.prefix + ".0/24" if self.network else "no network"
        return f"NetCluster({self.data_dir}, {net}, {states}, {zk})"


class _Spawner(threading.Thread):
    """A thread that runs what it is given (``call``), one at a time, until ``close``."""

    def __init__(self) -> None:
        super().__init__(name="netcluster-spawner", daemon=True)
        self._queue: queue.Queue[tuple[Callable[[], Any], queue.Queue[Any]] | None] = \
            queue.Queue()

    def run(self) -> None:
        while (item := self._queue.get()) is not None:
            fn, answer = item
            try:
                answer.put((True, fn()))
            except BaseException as exc:  # noqa: BLE001 (handed to the caller)
                answer.put((False, exc))

    def call(self, fn: Callable[[], Any]) -> Any:
        if threading.current_thread() is self:
            return fn()
        answer: queue.Queue[Any] = queue.Queue()
        self._queue.put((fn, answer))
        ok, value = answer.get()
        if not ok:
            raise value
        return value

    def close(self) -> None:
        self._queue.put(None)
        self.join(10.0)
