"""Jepsen's nemesis for a ``NetCluster``: the fault families as start / heal actions, a seeded
schedule of them, and the executor that runs it and records each fault's window.

    events = schedule(seed=7, faults=["partition", "kill", "clock"], duration=60.0)
    Nemesis(cluster, events, run_dir / "faults.jsonl").run(stop_event)   # blocks; heals all

Fault families (``FAULTS``; ``client-crash`` is the runner's, not the nemesis's):

==================  =========================================================================
partition           random halves of the brokers cut from each other (ZooKeeper nodes and
                    clients go with one half or the other at random)
isolate-leader      the leader of a partition (of ``keys``; resolved when the fault starts)
                    cut from every other host
isolate-controller  the controller (resolved at start) cut from every other host
zk-cut              a random non-empty set of brokers cut from every ZooKeeper node
one-way             a broker drops everything another broker sends (one direction only)
bridge              Jepsen's bridge: two halves that cannot talk, one broker that talks to both
loss                retransmission stalls (a lost segment) on the links into the brokers,
                    probability 5-30 % per chunk (link proxy)
delay               20-200 ms each way, jitter a quarter of that (link proxy)
pause               SIGSTOP a broker (a random one, or the leader of a key), SIGCONT at heal
pause-zk            SIGSTOP a ZooKeeper node, SIGCONT at heal
kill                SIGKILL a broker (a random one, or the leader of a key); restarted at heal
kill-zk             SIGKILL a ZooKeeper node; restarted at heal
clock               one broker's wall clock set off and jumped twice more during the window
                    (by 0.1-5 s or 30-300 s, ahead or behind); reset at heal
disk                one broker's data disk filled; freed at heal (a broker that stopped
                    itself is started again, as a supervisor would)
==================  =========================================================================

The schedule is a function of the seed alone (and of ``faults``, ``duration``, the topology and
timing options): the same seed gives the same kinds, times, durations and choices. Targets
that depend on the cluster's state (a leader, the controller) are resolved when the fault
starts and recorded in the window. Faults run one at a time (a fault, a gap, the next), or
with ``mixed=True`` in lanes that overlap (network, link, process, clock, disk: one thread
each in the executor).

Windows go to ``faults.jsonl`` as each fault heals, one JSON line each:
``{"fault": "partition", "start": ns, "end": ns, "targets": ["n1", "n3|n2"], "detail": "..."}``
(CLOCK_MONOTONIC ns, as the history's ``time``; for a partition each target is one group, its
hosts joined by ``|``). At the end (the schedule done, or ``stop_event`` set) the executor heals
every fault (``NetCluster.heal_all``) and waits until the cluster is healthy.

``run`` may be called from any thread (a runner's background thread, say): the processes a
heal restarts are started by the cluster's own spawner thread (``NetCluster._spawn``), so they
do not die with the thread that asked (brokers and ZooKeeper nodes get SIGKILL when the thread
that started them ends, PR_SET_PDEATHSIG).

``python -m oncelog.faults.nemesis --seed 7 --faults all --time 60`` prints a schedule
(``--mixed``: overlapping lanes).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .cluster import NetCluster

__all__ = ["FAULTS", "FaultEvent", "Nemesis", "Window", "cluster_options", "parse_faults",
           "schedule"]

FAULTS = ("partition", "isolate-leader", "isolate-controller", "zk-cut", "one-way", "bridge",
          "loss", "delay", "pause", "pause-zk", "kill", "kill-zk", "clock", "disk")
CLIENT_CRASH = "client-crash"  # the runner's: SIGKILL a client mid-transaction
# Faults of different lanes may overlap in a mixed schedule; within a lane one at a time (a
# lane's heal undoes its kind of fault only: heal_network, heal_link, ...).
LANES = {
    "network": ("partition", "isolate-leader", "isolate-controller", "zk-cut", "one-way",
                "bridge"),
    "link": ("loss", "delay"),
    "process": ("pause", "pause-zk", "kill", "kill-zk"),
    "clock": ("clock",),
    "disk": ("disk",),
}
LANE_OF = {f: lane for lane, fs in LANES.items() for f in fs}


def parse_faults(text: str) -> list[str]:
    """``--faults``'s comma list (``all``: every family, ``client-crash`` included) ->
    the nemesis's families (``client-crash`` left to the runner). ValueError on an unknown
    name."""
    names = [x.strip() for x in text.split(",") if x.strip()]
    out: list[str] = []
    for name in names:
        if name == "all":
            out += [f for f in FAULTS if f not in out]
        elif name in FAULTS:
            if name not in out:
                out.append(name)
        elif name != CLIENT_CRASH:
            raise ValueError(f"unknown fault {name!r} (faults: {', '.join(FAULTS)}, "
                             f"{CLIENT_CRASH}, all)")
    return out


def cluster_options(faults: Iterable[str]) -> dict[str, Any]:
    """The ``NetCluster`` options the faults need: ``link_proxy`` (loss, delay), ``clock``,
    ``disk_mb`` (disk)."""
    faults = set(faults)
    return {"link_proxy": bool(faults & {"loss", "delay"}), "clock": "clock" in faults,
            "disk_mb": 256 if "disk" in faults else None}


@dataclass(frozen=True)
class FaultEvent:
    """One scheduled fault: its family, when it starts (seconds from the run's start), how long
    it lasts, and the choices the seed made (``params``)."""

    fault: str
    start_s: float
    duration_s: float
    params: dict[str, Any] = field(default_factory=dict)
    lane: str = "main"  # a mixed schedule's lane (LANES); "main" when one at a time

    def to_json(self) -> dict[str, Any]:
        return {"fault": self.fault, "start_s": round(self.start_s, 3),
                "duration_s": round(self.duration_s, 3), "params": self.params,
                "lane": self.lane}


def _halves(rng: random.Random, names: list[Any]) -> tuple[list[Any], list[Any]]:
    shuffled = names[:]
    rng.shuffle(shuffled)
    cut = rng.randint(1, len(shuffled) - 1) if len(shuffled) > 1 else 1
    return sorted(shuffled[:cut]), sorted(shuffled[cut:])


def _clock_offset_ms(rng: random.Random) -> float:
    sign = rng.choice((-1, 1))
    if rng.random() < 0.5:
        return sign * round(rng.uniform(100, 5000))
    return sign * round(rng.uniform(30_000, 300_000))


def _params(fault: str, rng: random.Random, brokers: int, zookeepers: int,
            keys: Sequence[str]) -> dict[str, Any]:
    ids = list(range(1, brokers + 1))

    def broker_or_leader() -> dict[str, Any]:
        if keys and rng.random() < 0.5:
            return {"target": "leader", "key": rng.choice(list(keys))}
        return {"target": "broker", "broker": rng.choice(ids)}

    if fault == "partition":
        left, right = _halves(rng, [f"n{i}" for i in ids])
        for z in range(1, zookeepers + 1):  # ZooKeeper nodes go with one half or the other
            (left if rng.random() < 0.5 else right).append(f"zk{z}")
        return {"groups": [left, right]}
    if fault == "isolate-leader":
        return {"key": rng.choice(list(keys))} if keys else {}
    if fault == "zk-cut":
        k = rng.randint(1, brokers)
        return {"brokers": sorted(rng.sample(ids, k))}
    if fault == "one-way":
        src, dst = rng.sample(ids, 2) if brokers > 1 else (1, 1)
        return {"src": src, "dst": dst}
    if fault == "bridge":
        via = rng.choice(ids)
        left, right = _halves(rng, [i for i in ids if i != via]) if brokers > 2 else \
            ([i for i in ids if i != via][:1], [])
        return {"left": [int(x) for x in left], "right": [int(x) for x in right], "via": via}
    if fault == "loss":
        return {"loss": round(rng.uniform(0.05, 0.3), 3)}
    if fault == "delay":
        delay = round(rng.uniform(20, 200))
        return {"delay_ms": delay, "jitter_ms": delay // 4}
    if fault in ("pause", "kill"):
        return broker_or_leader()
    if fault in ("pause-zk", "kill-zk"):
        return {"zookeeper": rng.randint(1, zookeepers)}
    if fault == "clock":
        return {"broker": rng.choice(ids),
                "offsets_ms": [_clock_offset_ms(rng) for _ in range(3)]}
    if fault == "disk":
        return {"broker": rng.choice(ids)}
    return {}


def schedule(seed: int, faults: Sequence[str], duration: float, *, brokers: int = 3,
             zookeepers: int = 1, keys: Sequence[str] = (),
             fault_s: tuple[float, float] = (5.0, 15.0), gap_s: tuple[float, float] = (3.0, 8.0),
             first_s: float = 5.0, mixed: bool = False) -> list[FaultEvent]:
    """A seeded schedule of ``faults`` (family names, ``parse_faults``) for a run of
    ``duration`` seconds: the first fault at ``first_s``, each lasting ``fault_s`` (min, max)
    seconds, ``gap_s`` between the heal of one and the start of the next; the families drawn
    in turns (each family once per round, in a seeded order), so a short run still meets each
    one. Every fault ends by ``duration``. The same arguments give the same list.

    ``mixed``: faults of different lanes (``LANES``: network, link, process, clock, disk)
    overlap: each lane is such a sequence of its own (its own seeded draws), and the events of
    all lanes are merged by start time; a partition may then meet a paused broker and a
    skewed clock at once."""
    families = [f for f in faults if f != CLIENT_CRASH]
    unknown = [f for f in families if f not in FAULTS]
    if unknown:
        raise ValueError(f"unknown faults {unknown}")
    if brokers < 2 and any(f in families for f in ("partition", "one-way", "bridge")):
        raise ValueError("partitions need at least two brokers")
    if mixed:
        events = []
        for lane, members in LANES.items():
            mine = [f for f in families if f in members]
            if mine:
                events += _sequence(random.Random(f"{seed}:{lane}"), mine, duration, brokers,
                                    zookeepers, keys, fault_s, gap_s, first_s, lane)
        return sorted(events, key=lambda e: (e.start_s, e.lane))
    return _sequence(random.Random(seed), families, duration, brokers, zookeepers, keys,
                     fault_s, gap_s, first_s, "main")


def _sequence(rng: random.Random, families: list[str], duration: float, brokers: int,
              zookeepers: int, keys: Sequence[str], fault_s: tuple[float, float],
              gap_s: tuple[float, float], first_s: float, lane: str) -> list[FaultEvent]:
    events: list[FaultEvent] = []
    # the lanes of a mixed schedule start apart
    t = first_s if lane == "main" else first_s + round(rng.uniform(0, gap_s[1]), 3)
    round_: list[str] = []
    while families:
        if not round_:
            round_ = families[:]
            rng.shuffle(round_)
        fault = round_.pop(0)
        length = round(rng.uniform(*fault_s), 3)
        if t + length > duration:
            break
        events.append(FaultEvent(fault, round(t, 3), length,
                                 _params(fault, rng, brokers, zookeepers, keys), lane))
        t += length + rng.uniform(*gap_s)
    return events


@dataclass
class Window:
    """A fault as it ran: monotonic ns of its start and end, the hosts it hit."""

    fault: str
    start: int
    end: int | None
    targets: list[str]
    detail: str

    def to_json(self) -> dict[str, Any]:
        return {"fault": self.fault, "start": self.start, "end": self.end,
                "targets": self.targets, "detail": self.detail}


def _key(key: str) -> tuple[str, int]:
    topic, _, partition = key.rpartition(":")
    return topic, int(partition)


class Nemesis:
    """Runs ``events`` on ``cluster`` (times from when ``run`` is called), writes each fault's
    window to ``windows_path`` (JSON lines, appended) and heals everything at the end.
    ``observer(window)`` is called once each fault is in place (tests check it there);
    ``log(line)`` hears what happens. ``skipped``: the events that did not start, each with
    why (no leader to isolate, their lane ran late, ...)."""

    def __init__(self, cluster: NetCluster, events: Sequence[FaultEvent],
                 windows_path: str | Path, *, observer: Callable[[Window], None] | None = None,
                 log: Callable[[str], None] | None = None, heal_timeout: float = 180.0) -> None:
        self.cluster = cluster
        self.events = list(events)
        self.windows_path = Path(windows_path)
        self.observer = observer
        self.log = log or (lambda line: None)
        self.heal_timeout = heal_timeout
        self.windows: list[Window] = []
        self.skipped: list[tuple[FaultEvent, str]] = []
        self._lock = threading.Lock()

    # -- resolving targets ----------------------------------------------------------------

    def _leader(self, key: str | None) -> int:
        c = self.cluster
        if key is not None:
            topic, partition = _key(key)
            return c.wait_for_leader(topic, partition, timeout=10.0)
        return c.controller()

    def _any_key(self) -> str:
        """A partition of the cluster's topics when the schedule named none: the first
        partition of the first topic (internal ones last)."""
        with self.cluster._admin() as admin:
            topics = sorted(admin.list_topics(include_internal=True),
                            key=lambda t: (t.startswith("__"), t))
        if not topics:
            raise RuntimeError("no topic to find a leader in")
        return f"{topics[0]}:0"

    def _broker_target(self, p: dict[str, Any]) -> tuple[int, str]:
        if p.get("target") == "leader":
            n = self._leader(p["key"])
            return n, f"leader of {p['key']}"
        return int(p["broker"]), "random broker"

    # -- start / heal ---------------------------------------------------------------------

    def start(self, e: FaultEvent) -> tuple[list[str], str, Callable[[], None]]:
        """Put fault ``e`` in place: (targets, detail, heal)."""
        c = self.cluster
        p = e.params
        f = e.fault
        if f == "partition":
            groups = [list(g) for g in p["groups"]]
            c.partition(groups)
            return ["|".join(g) for g in groups], "random halves", c.heal_network
        if f in ("isolate-leader", "isolate-controller"):
            if f == "isolate-leader":
                key = p.get("key") or self._any_key()
                n, what = self._leader(key), f"leader of {key}"
            else:
                n = c.controller()
                if n < 0:
                    raise RuntimeError("no controller known")
                what = "controller"
            c.isolate(n)
            return [c.broker_host_name(n)], f"isolated the {what} (broker {n})", c.heal_network
        if f == "zk-cut":
            ids = [int(x) for x in p["brokers"]]
            c.zk_cut(ids)
            zks = "|".join(c.zk_host_name(i) for i in sorted(c.zookeepers))
            return (["|".join(c.broker_host_name(n) for n in ids), zks],
                    "brokers cut from ZooKeeper", c.heal_network)
        if f == "one-way":
            src, dst = int(p["src"]), int(p["dst"])
            c.one_way(src, dst)
            return ([c.broker_host_name(src), c.broker_host_name(dst)],
                    f"n{dst} drops what n{src} sends", c.heal_network)
        if f == "bridge":
            left, right, via = p["left"], p["right"], int(p["via"])
            c.bridge(left, right, via)
            return (["|".join(f"n{x}" for x in left), f"n{via}",
                     "|".join(f"n{x}" for x in right)], f"bridge through n{via}",
                    c.heal_network)
        if f == "loss":
            c.link(loss=float(p["loss"]))
            return ([c.broker_host_name(n) for n in c.brokers],
                    f"loss {p['loss']:.0%} per chunk (retransmission stalls)", c.heal_link)
        if f == "delay":
            c.link(delay_ms=float(p["delay_ms"]), jitter_ms=float(p["jitter_ms"]))
            return ([c.broker_host_name(n) for n in c.brokers],
                    f"delay {p['delay_ms']} ms +0-{p['jitter_ms']} ms each way", c.heal_link)
        if f == "pause":
            n, what = self._broker_target(p)
            c.pause(n)
            return [c.broker_host_name(n)], f"SIGSTOP {what} (broker {n})", \
                lambda: c.resume(n)
        if f == "kill":
            n, what = self._broker_target(p)
            c.kill(n)
            return [c.broker_host_name(n)], f"SIGKILL {what} (broker {n})", \
                lambda: self._restart(n)
        if f == "pause-zk":
            i = int(p["zookeeper"])
            c.pause_zk(i)
            return [c.zk_host_name(i)], "SIGSTOP", lambda: c.resume_zk(i)
        if f == "kill-zk":
            i = int(p["zookeeper"])
            c.kill_zk(i)
            return [c.zk_host_name(i)], "SIGKILL", lambda: c.start_zk(i, self.heal_timeout)
        if f == "clock":
            n = int(p["broker"])
            offsets = [float(x) for x in p["offsets_ms"]]
            c.clock_offset(n, offsets[0])
            return ([c.broker_host_name(n)],
                    "offsets " + ", ".join(f"{x / 1000:+g} s" for x in offsets),
                    lambda: c.clock_offset(n, 0))
        if f == "disk":
            n = int(p["broker"])
            written = c.fill_disk(n)

            def heal_disk() -> None:
                c.free_disk(n)
                b = c.brokers[n]
                # it stopped itself (not killed by the process lane: that one restarts it)
                if b.state == "running" and (b.process is None or not b.process.running):
                    self._restart(n)

            return [c.broker_host_name(n)], f"disk filled ({written} bytes)", heal_disk
        raise ValueError(f"unknown fault {f!r}")

    def _restart(self, n: int) -> None:
        b = self.cluster.brokers[n]
        if b.process is None or not b.process.running:
            self.cluster.start_broker(n, self.heal_timeout)

    def _steps(self, e: FaultEvent) -> list[tuple[float, Callable[[], None]]]:
        """Actions during the window (seconds after its start): the clock's jumps."""
        if e.fault != "clock":
            return []
        n = int(e.params["broker"])
        offsets = [float(x) for x in e.params["offsets_ms"]]
        return [(e.duration_s * i / len(offsets),
                 lambda ms=ms: self.cluster.clock_offset(n, ms))  # type: ignore[misc]
                for i, ms in enumerate(offsets) if i > 0]

    # -- running --------------------------------------------------------------------------

    def _record(self, w: Window) -> None:
        with self._lock:
            self.windows.append(w)
            self.windows_path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.windows_path, "a") as f:
                f.write(json.dumps(w.to_json()) + "\n")

    def run(self, stop_event: threading.Event | None = None) -> list[Window]:
        """Run the schedule until it ends or ``stop_event`` is set; heal everything; the
        windows."""
        stop = stop_event or threading.Event()
        t0 = time.monotonic()
        lanes: dict[str, list[FaultEvent]] = {}
        for e in self.events:
            lanes.setdefault(e.lane, []).append(e)

        def run_lane(events: list[FaultEvent]) -> None:
            for e in events:
                if stop.wait(max(0.0, t0 + e.start_s - time.monotonic())):
                    break
                late = time.monotonic() - (t0 + e.start_s)
                if late > 1.0:  # its lane ran late (a slow heal): every fault still runs
                    self.log(f"{e.fault}: starts {late:.1f} s late (its lane ran late)")
                self._run_one(e, stop)
                if stop.is_set():
                    break

        threads = [threading.Thread(target=run_lane, args=(events,), name=f"nemesis-{lane}",
                                    daemon=True)
                   for lane, events in lanes.items()]
        try:
            for t in threads:
                t.start()
            for t in threads:
                while t.is_alive():
                    t.join(0.2)
        except BaseException:
            stop.set()
            for t in threads:
                t.join()
            raise
        finally:
            self.log("healing everything")
            self.cluster.heal_all(self.heal_timeout)
        return self.windows

    def _run_one(self, e: FaultEvent, stop: threading.Event) -> None:
        start = time.monotonic_ns()
        try:
            targets, detail, heal = self.start(e)
        except Exception as exc:  # noqa: BLE001 (the cluster's state did not allow it: no leader...)
            self.skipped.append((e, repr(exc)))
            self.log(f"{e.fault}: not started: {exc!r}")
            return
        window = Window(e.fault, start, None, targets, detail)
        self.log(f"{e.fault} on {', '.join(targets)}: {detail}")
        try:
            if self.observer is not None:
                self.observer(window)
            began = time.monotonic()
            for at, action in self._steps(e):
                if stop.wait(max(0.0, began + at - time.monotonic())):
                    break
                with contextlib.suppress(Exception):
                    action()
            stop.wait(max(0.0, began + e.duration_s - time.monotonic()))
        finally:
            try:
                heal()
            except Exception as exc:  # noqa: BLE001 (heal_all at the end tries again)
                window.detail += f"; heal failed: {exc!r}"
                self.log(f"{e.fault}: heal failed: {exc!r}")
            window.end = time.monotonic_ns()
            self._record(window)
            self.log(f"{e.fault} healed")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m oncelog.faults.nemesis",
                                     description="Print the fault schedule a seed gives.")
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--faults", default="all", help="comma list, or all")
    parser.add_argument("--time", type=float, default=60.0, help="run length in seconds")
    parser.add_argument("--brokers", type=int, default=3)
    parser.add_argument("--zookeepers", type=int, default=1)
    parser.add_argument("--keys", default="", help="comma list of topic:partition")
    parser.add_argument("--mixed", action="store_true", help="lanes of faults that overlap")
    args = parser.parse_args(argv)
    try:
        faults = parse_faults(args.faults)
        events = schedule(args.seed, faults, args.time, brokers=args.brokers,
                          zookeepers=args.zookeepers,
                          keys=[k for k in args.keys.split(",") if k], mixed=args.mixed)
    except ValueError as exc:
        print(f"nemesis: {exc}", file=sys.stderr)
        return 2
    for e in events:
        print(json.dumps(e.to_json()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
