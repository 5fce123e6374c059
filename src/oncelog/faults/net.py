"""Separate network hosts on one machine: Linux network namespaces joined by a bridge, and the
network faults Jepsen injects between them (partitions, one-way drops, a bridge node), done with
iptables (nf_tables) rules inside each host's namespace.

    with Network() as net:                      # takes a free subnet 198.18.N.0/24
        n1 = net.add_host("n1", 21)             # namespace ol{N}-n1, address 198.18.N.21
        proc = n1.popen(["python3", "-m", "http.server", "--bind", n1.address, "8000"])
        net.partition([["n1"], ["n2", "n3"]])   # n1 and {n2, n3} cannot reach each other
        net.heal()

Layout (one run; N in 1..250 is held with ``flock`` on ``/tmp/oncelog-netns/N.lock`` for the
run, so parallel test workers never share a subnet):

- ``ol{N}-hub``: a namespace holding the bridge ``br0``; every host's veth ends there.
- ``ol{N}-{host}``: one namespace per host, its end of the veth named ``eth0`` with the host's
  address ``198.18.N.X/24``, and ``lo`` up (a broker may listen on 127.0.0.1 in its own host).
- the control host: a veth ``ol{N}c`` from the ROOT namespace into the bridge, address
  ``198.18.N.1``: whoever runs this (a test, the runner) reaches every host from where it is,
  with no ``ip netns exec``. Partitions never cut the control host.

198.18.0.0/15 is RFC 2544's range for benchmarking networks: nothing real lives there, and
nothing here touches any namespace or interface but its own.

Faults are DROP rules in each host's INPUT chain (as Jepsen's ``iptables`` net does), set for a
host in one ``iptables-restore`` (atomic): a host drops what comes from the hosts it is cut
from. ``partition(groups)``: each host drops the hosts of the other groups (hosts in no group
are left alone); ``drop(src, dst)``: ``dst`` drops what ``src`` sends (one way: ``dst`` still
sends to ``src``, but its TCP connections to ``src`` stall since the answers are dropped);
``isolate(host)``: a group of one against all the others; ``bridge(a, b, via)``: Jepsen's
bridge, two halves that cannot talk to each other, and one node that talks to both; ``heal()``
clears every rule. Established connections are not reset: their packets are dropped, as on a
real network that fails.

``python -m oncelog.faults.net --cleanup`` removes what dead runs left behind: namespaces
``ol{N}-*`` and interfaces ``ol{N}c`` whose N's lock file no live process holds.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Self

__all__ = ["LOCK_DIR", "Host", "Network", "NetworkError", "cleanup", "missing_tools"]

LOCK_DIR = Path("/tmp/oncelog-netns")
CONTROL = "control"
_NAME = re.compile(r"^[a-z][a-z0-9]{0,9}$")
_NS = re.compile(r"^ol(\d+)-")


class NetworkError(RuntimeError):
    """A command that builds or changes the network failed."""


def missing_tools() -> str | None:
    """What this machine lacks to build networks (None when nothing): the ``ip`` and
    ``iptables`` commands and the right to make namespaces (root)."""
    for tool, package in (("ip", "iproute2"), ("iptables", "iptables"),
                          ("iptables-restore", "iptables")):
        if shutil.which(tool) is None:
            return f"no `{tool}` command (Debian's {package}: bash scripts/bootstrap.sh " \
                   "--with-netns)"
    if os.geteuid() != 0:
        return "network namespaces need root"
    return None


def _run(*argv: str, input: str | None = None, check: bool = True) -> str:
    proc = subprocess.run(argv, check=False, input=input, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise NetworkError(f"{' '.join(argv)}: exit {proc.returncode}: "
                           f"{(proc.stderr or proc.stdout).strip()}")
    return proc.stdout


@dataclass
class Host:
    """One host: a network namespace with one address on the bridge."""

    network: Network
    name: str
    index: int  # the last byte of the address
    blocked: set[str] = field(default_factory=set)  # addresses whose packets it drops

    @property
    def namespace(self) -> str:
        return f"ol{self.network.n}-{self.name}"

    @property
    def address(self) -> str:
        return f"{self.network.prefix}.{self.index}"

    def wrap(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside this host's namespace (``ip netns exec``)."""
        if self.name == CONTROL:
            return list(argv)
        return ["ip", "netns", "exec", self.namespace, *argv]

    def popen(self, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        """Start ``argv`` in this host (``subprocess.Popen``'s keyword arguments)."""
        return subprocess.Popen(self.wrap(argv), **kwargs)

    def run(self, argv: Sequence[str], check: bool = True) -> str:
        return _run(*self.wrap(argv), check=check)

    def _apply(self) -> None:
        """This host's INPUT chain as ``blocked`` says, in one iptables-restore."""
        if self.name == CONTROL:
            return
        rules = "".join(f"-A INPUT -s {addr}/32 -j DROP\n" for addr in sorted(self.blocked))
        _run("ip", "netns", "exec", self.namespace, "iptables-restore", "-w", "5",
             input=f"*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n"
                   f":OUTPUT ACCEPT [0:0]\n{rules}COMMIT\n")

    def __repr__(self) -> str:
        return f"Host({self.name}, {self.address})"


class Network:
    """A hub namespace with a bridge, the control host, and hosts added with ``add_host``.
    ``n``: the subnet's third byte (default: the first free one in 1..250)."""

    def __init__(self, n: int | None = None) -> None:
        why = missing_tools()
        if why is not None:
            raise NetworkError(why)
        self._lock: IO[bytes] | None = None
        self.n = self._take(n)
        self.hosts: dict[str, Host] = {}
        try:
            cleanup_n(self.n)  # a dead run's leftovers with this N
            self._build_hub()
        except BaseException:
            self.teardown()
            raise
        self.control = Host(self, CONTROL, 1)

    # -- the subnet's lock ------------------------------------------------------------------

    def _take(self, n: int | None) -> int:
        LOCK_DIR.mkdir(parents=True, exist_ok=True)
        for candidate in ([n] if n is not None else range(1, 251)):
            f = open(LOCK_DIR / f"{candidate}.lock", "ab")  # noqa: SIM115 (held for the run)
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                f.close()
                continue
            f.truncate(0)  # ours now: say whose
            f.write(f"{os.getpid()}\n".encode())
            f.flush()
            self._lock = f
            return candidate
        raise NetworkError(f"no free subnet 198.18.N.0/24 (locks in {LOCK_DIR} all held)")

    @property
    def prefix(self) -> str:
        return f"198.18.{self.n}"

    @property
    def hub(self) -> str:
        return f"ol{self.n}-hub"

    @property
    def control_interface(self) -> str:
        return f"ol{self.n}c"

    def _build_hub(self) -> None:
        hub = self.hub
        _run("ip", "netns", "add", hub)
        _run("ip", "-n", hub, "link", "set", "lo", "up")
        _run("ip", "-n", hub, "link", "add", "br0", "type", "bridge")
        _run("ip", "-n", hub, "link", "set", "br0", "up")
        ctl = self.control_interface
        _run("ip", "link", "add", ctl, "type", "veth", "peer", "name", "v-control",
             "netns", hub)
        _run("ip", "-n", hub, "link", "set", "v-control", "master", "br0", "up")
        _run("ip", "addr", "add", f"{self.prefix}.1/24", "dev", ctl)
        _run("ip", "link", "set", ctl, "up")

    # -- hosts ------------------------------------------------------------------------------

    def add_host(self, name: str, index: int | None = None) -> Host:
        """A new host ``name`` (lower-case letters and digits, up to 10) at
        ``198.18.N.index`` (default: the next free index from 2 on)."""
        if not _NAME.match(name) or name in ("hub", CONTROL):
            raise ValueError(f"bad host name {name!r} (a-z0-9, up to 10, not hub/control)")
        if name in self.hosts:
            raise ValueError(f"host {name} exists already")
        taken = {h.index for h in self.hosts.values()} | {1}
        if index is None:
            index = next(i for i in range(2, 255) if i not in taken)
        if not 2 <= index <= 254 or index in taken:
            raise ValueError(f"bad or taken address index {index}")
        host = Host(self, name, index)
        ns = host.namespace
        _run("ip", "netns", "add", ns)
        self.hosts[name] = host
        _run("ip", "-n", ns, "link", "set", "lo", "up")
        _run("ip", "-n", self.hub, "link", "add", f"v-{name}", "type", "veth", "peer", "name",
             "eth0", "netns", ns)
        _run("ip", "-n", self.hub, "link", "set", f"v-{name}", "master", "br0", "up")
        _run("ip", "-n", ns, "addr", "add", f"{host.address}/24", "dev", "eth0")
        _run("ip", "-n", ns, "link", "set", "eth0", "up")
        return host

    def host(self, name: str) -> Host:
        if name == CONTROL:
            return self.control
        try:
            return self.hosts[name]
        except KeyError:
            raise ValueError(f"no host {name!r} (hosts: {', '.join(self.hosts)})") from None

    def host_of(self, address: str) -> Host | None:
        """The host with this address (the control host's included)."""
        if address == self.control.address:
            return self.control
        return next((h for h in self.hosts.values() if h.address == address), None)

    # -- faults -----------------------------------------------------------------------------

    def _set(self, blocked: dict[str, set[str]]) -> None:
        """Each host drops what comes from ``blocked[host]`` (host names); the rest none."""
        for host in self.hosts.values():
            want = {self.host(x).address for x in blocked.get(host.name, set())}
            if want != host.blocked:
                host.blocked = want
                host._apply()

    def _current(self) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {}
        for host in self.hosts.values():
            names = set()
            for addr in host.blocked:
                other = self.host_of(addr)
                if other is not None:
                    names.add(other.name)
            out[host.name] = names
        return out

    def partition(self, groups: Iterable[Iterable[str]]) -> None:
        """Cut the groups of hosts from each other (on top of the faults already there):
        each host drops what hosts of the other groups send. Hosts in no group keep their
        links; the control host is never cut."""
        groups = [[self.host(x).name for x in g] for g in groups]
        blocked = self._current()
        for i, group in enumerate(groups):
            others = {x for j, g in enumerate(groups) if j != i for x in g}
            for name in group:
                blocked.setdefault(name, set()).update(others - {CONTROL})
        self._set(blocked)

    def drop(self, src: str, dst: str) -> None:
        """One way: ``dst`` drops every packet from ``src`` (``src`` still hears ``dst``)."""
        blocked = self._current()
        blocked.setdefault(self.host(dst).name, set()).add(self.host(src).name)
        self._set(blocked)

    def isolate(self, name: str) -> None:
        """Cut ``name`` from every other host (not from the control host)."""
        self.partition([[name], [h for h in self.hosts if h != name]])

    def bridge(self, left: Iterable[str], right: Iterable[str], via: str) -> None:
        """Jepsen's bridge: ``left`` and ``right`` cannot reach each other; ``via`` (in
        neither) reaches both."""
        left, right = list(left), list(right)
        if via in left or via in right:
            raise ValueError("the bridge node must be in neither half")
        self.partition([left, right])

    def heal(self) -> None:
        """Every host reaches every host again."""
        self._set({})

    def blocked(self) -> dict[str, list[str]]:
        """Host -> the hosts whose packets it drops (the faults in place)."""
        return {h: sorted(v) for h, v in self._current().items() if v}

    # -- teardown ---------------------------------------------------------------------------

    def teardown(self) -> None:
        """Delete every namespace of this network and the control veth; free the subnet.
        (Processes still running in a namespace keep it alive, unreachable: stop them
        first.)"""
        with contextlib.suppress(Exception):
            cleanup_n(self.n)
        self.hosts.clear()
        if self._lock is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._lock, fcntl.LOCK_UN)
            self._lock.close()
            self._lock = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.teardown()

    def __repr__(self) -> str:
        return f"Network({self.prefix}.0/24, hosts: {', '.join(self.hosts) or 'none'})"


def _namespaces() -> list[str]:
    out = _run("ip", "netns", "list", check=False)
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def cleanup_n(n: int) -> list[str]:
    """Delete the namespaces ``ol{n}-*`` and the interface ``ol{n}c``; what was deleted."""
    gone = []
    for ns in _namespaces():
        m = _NS.match(ns)
        if m and int(m.group(1)) == n:
            _run("ip", "netns", "del", ns, check=False)
            gone.append(ns)
    ctl = f"ol{n}c"
    if Path(f"/sys/class/net/{ctl}").exists():
        _run("ip", "link", "del", ctl, check=False)
        gone.append(ctl)
    return gone


def _held(n: int) -> bool:
    path = LOCK_DIR / f"{n}.lock"
    if not path.exists():
        return False
    with open(path, "rb") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(f, fcntl.LOCK_UN)
        return False


def cleanup() -> list[str]:
    """Remove the leftovers of dead runs: namespaces ``ol{N}-*`` and interfaces ``ol{N}c``
    whose N no live run holds. What was removed."""
    ns_ids = {int(m.group(1)) for ns in _namespaces() if (m := _NS.match(ns))}
    with contextlib.suppress(FileNotFoundError):
        for iface in os.listdir("/sys/class/net"):
            m = re.match(r"^ol(\d+)c$", iface)
            if m:
                ns_ids.add(int(m.group(1)))
    gone: list[str] = []
    for n in sorted(ns_ids):
        if not _held(n):
            gone += cleanup_n(n)
    return gone


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m oncelog.faults.net",
        description="The fault-injection network's housekeeping.")
    parser.add_argument("--cleanup", action="store_true",
                        help="delete namespaces ol{N}-* and interfaces ol{N}c left by dead runs")
    args = parser.parse_args(argv)
    if not args.cleanup:
        parser.print_help()
        return 2
    try:
        gone = cleanup()
    except NetworkError as exc:
        print(f"cleanup: {exc}", file=sys.stderr)
        return 1
    print(f"removed: {', '.join(gone)}" if gone else "nothing to remove")
    return 0


if __name__ == "__main__":
    sys.exit(main())
