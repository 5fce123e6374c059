"""``oncelog verify``: run the transactional workload through the fault proxy, check the history,
print the verdict, exit 1 if the checker found any anomaly (2 if the run itself failed)."""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from .args import key_value

FAULTS = ("delay", "reorder", "duplicate", "restart")
DEFAULT_FAULTS = "delay,reorder,duplicate"


def add_arguments(v: argparse.ArgumentParser) -> None:
    v.add_argument("--bootstrap-server", default=None, metavar="HOST:PORT",
                   help="a running broker to verify (default: start one in a temporary "
                   "directory)")
    v.add_argument("--cluster", action="store_true",
                   help="run against a 3-broker replicated cluster this command starts (Debian's "
                   "ZooKeeper), with broker faults: kill-leader, kill-coordinator, pause, cut "
                   "(default: all of them, one after another); writers of both clients, "
                   "oncelog and confluent, unless --clients names others")
    v.add_argument("--duration", type=float, default=10.0, metavar="S",
                   help="seconds of writing (default 10)")
    v.add_argument("--faults", default=DEFAULT_FAULTS,
                   help="comma-separated: delay, reorder, duplicate (the proxy), restart "
                   "(SIGKILL and restart the broker; only one it started); 'none' for none "
                   f"(default {DEFAULT_FAULTS})")
    v.add_argument("--fault-probability", type=float, default=0.1, metavar="P",
                   help="chance of each proxy fault per transactional request (default 0.1)")
    v.add_argument("--clients", default="oncelog",
                   help="writers, comma-separated: oncelog, confluent, raw (a bare-wire client, "
                   "transaction version 2 when offered), raw-old (the old protocol) "
                   "(default oncelog)")
    v.add_argument("--writers-per-client", type=int, default=2)
    v.add_argument("--readers", type=int, default=2, help="read_committed readers (default 2)")
    v.add_argument("--partitions", type=int, default=3)
    v.add_argument("--read-timeout", type=float, default=20.0, metavar="S",
                   help="a reader that has not reached the end after this long is stuck "
                   "(default 20)")
    v.add_argument("--seed", type=int, default=0, help="seeds the proxy and the writers")
    v.add_argument("--history", default=None, metavar="FILE",
                   help="save the history here (JSON lines)")
    v.add_argument("--check", default=None, metavar="FILE",
                   help="only check a saved history file, run nothing: this command's own "
                   "history, or a queue history (JSON lines as Jepsen's Kafka workload records "
                   "them) checked with Jepsen's Kafka checks")
    v.add_argument("--json", action="store_true", help="print the verdict as JSON")
    v.add_argument("--set", action="append", type=key_value, default=[], metavar="KEY=VALUE",
                   help="a setting of the broker this command starts, e.g. "
                   "transaction.version=1 (repeatable)")


def _print_verdict(verdict: Any, as_json: bool) -> None:
    if as_json:
        print(json.dumps(verdict.as_dict(), indent=2))
    else:
        print(verdict.table())


def _check_file(path: str, as_json: bool) -> int:
    """``--check FILE``: a queue history (Jepsen's Kafka checks, verify/jepsen.py) or a history
    of this command's own workload (verify/checker.py); 1 on anomalies, 2 if unreadable."""
    from ..verify.checker import check
    from ..verify.history import History
    from ..verify.jepsen import check_queue
    from ..verify.queue_history import is_queue_history
    from ..verify.queue_history import load as load_queue

    verdict: Any
    try:
        if is_queue_history(path):
            verdict = check_queue(load_queue(path))
        else:
            verdict = check(History.load(path))
    except (OSError, ValueError) as exc:
        print(f"oncelog verify: {exc}", file=sys.stderr)
        return 2
    _print_verdict(verdict, as_json)
    return 0 if verdict.ok else 1


def run(args: argparse.Namespace) -> int:
    if args.check:
        return _check_file(args.check, args.json)

    if args.cluster:
        return _run_cluster(args)
    faults = [f.strip() for f in args.faults.split(",") if f.strip() and f.strip() != "none"]
    unknown = [f for f in faults if f not in FAULTS]
    if unknown:
        print(f"oncelog verify: unknown fault(s) {', '.join(unknown)} (known: "
              f"{', '.join(FAULTS)})", file=sys.stderr)
        return 2
    if "restart" in faults and args.bootstrap_server:
        print("oncelog verify: the restart fault needs a broker this command starts (drop "
              "--bootstrap-server)", file=sys.stderr)
        return 2
    if args.set and args.bootstrap_server:
        print("oncelog verify: --set applies to a broker this command starts", file=sys.stderr)
        return 2
    from ..verify.workload import WRITER_KINDS

    clients = [c.strip() for c in args.clients.split(",") if c.strip()]
    bad = [c for c in clients if c not in WRITER_KINDS]
    if bad or not clients:
        print(f"oncelog verify: unknown client(s) {', '.join(bad) or '(none)'} (known: "
              f"{', '.join(WRITER_KINDS)})", file=sys.stderr)
        return 2
    if args.bootstrap_server:
        from ..client.reachable import check_reachable

        try:  # at once, naming the address (the workload's clients would wait out timeouts)
            check_reachable(args.bootstrap_server, without_credentials=True)
        except ConnectionError as exc:
            print(f"oncelog verify: {exc}", file=sys.stderr)
            return 1
    return _run_workload(args, faults, clients)


def _run_cluster(args: argparse.Namespace) -> int:
    from ..verify.cluster import CLUSTER_FAULTS, run_cluster

    if args.bootstrap_server or args.set:
        print("oncelog verify: --cluster starts a cluster of its own (no --bootstrap-server, "
              "--set)", file=sys.stderr)
        return 2
    if args.faults == DEFAULT_FAULTS:
        faults = list(CLUSTER_FAULTS)
    else:
        faults = [f.strip() for f in args.faults.split(",")
                  if f.strip() and f.strip() != "none"]
    unknown = [f for f in faults if f not in CLUSTER_FAULTS]
    # Both clients unless told otherwise (--clients' default is ours alone).
    clients_arg = "oncelog,confluent" if args.clients == "oncelog" else args.clients
    clients = tuple(c.strip() for c in clients_arg.split(",") if c.strip())
    bad = [c for c in clients if c not in ("oncelog", "confluent")]
    if unknown or bad or not clients:
        print(f"oncelog verify --cluster: faults are {', '.join(CLUSTER_FAULTS)}; clients "
              "oncelog, confluent", file=sys.stderr)
        return 2
    duration = max(args.duration, 10.0 * len(faults) + 10)
    print(f"oncelog verify --cluster: {len(clients) * args.writers_per_client} writers "
          f"({', '.join(clients)}), {args.readers} readers, {duration:g} s, faults: "
          f"{', '.join(faults) or 'none'}")
    tmp = Path(tempfile.mkdtemp(prefix="oncelog-verify-cluster-"))
    try:
        run = run_cluster(tmp, faults, duration=duration, clients=clients,
                          writers_per_client=args.writers_per_client, readers=args.readers,
                          partitions=args.partitions, seed=args.seed, progress=print)
    except Exception as exc:  # noqa: BLE001 (the run failed; say why)
        print(f"oncelog verify: the run failed: {exc!r}", file=sys.stderr)
        return 2
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if args.history:
        run.history.save(args.history)
    _print_verdict(run.verdict, args.json)
    for error in run.errors:
        print(f"oncelog verify: a writer failed: {error!r}", file=sys.stderr)
    for w in run.stalled:
        print(f"oncelog verify: {w} made no progress after the faults healed", file=sys.stderr)
    if run.errors:
        return 2
    return 0 if run.ok else 1


def _run_workload(args: argparse.Namespace, faults: list[str], clients: list[str]) -> int:
    from ..client import Admin, NewTopic
    from ..harness.broker_process import BrokerProcess, BrokerProcessError
    from ..verify.checker import check
    from ..verify.history import History
    from ..verify.proxy import FaultProxy, Faults
    from ..verify.workload import WorkloadConfig, run_readers, run_writers

    tmp: Path | None = None
    child: BrokerProcess | None = None
    history = History()
    sink = open(args.history, "w") if args.history else None  # noqa: SIM115 (closed below)
    if sink is not None:
        history.stream_to(sink)
    try:
        if args.bootstrap_server:
            bootstrap = args.bootstrap_server
            topic = f"verify-{uuid.uuid4().hex[:8]}"
        else:
            tmp = Path(tempfile.mkdtemp(prefix="oncelog-verify-"))
            settings = {"transaction.state.log.num.partitions": "5",
                        "offsets.topic.num.partitions": "5",
                        "transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000",
                        **dict(args.set)}
            child = BrokerProcess(tmp / "data", settings=settings).start()
            bootstrap = child.bootstrap_servers
            topic = "verify"
            print(f"oncelog verify: started a broker at {bootstrap} ({tmp})"
                  + (f" with {' '.join(f'{k}={v}' for k, v in args.set)}" if args.set else ""))
        with Admin(bootstrap_servers=bootstrap) as admin:
            admin.create_topics([NewTopic(topic, num_partitions=args.partitions)])
        proxy_faults = Faults.parse([f for f in faults if f != "restart"],
                                    args.fault_probability, hold_ms=(200, 3000))
        cfg = WorkloadConfig(topic=topic, partitions=args.partitions,
                             writers=[c for c in clients for _ in range(args.writers_per_client)],
                             readers=args.readers, seed=args.seed,
                             read_timeout=args.read_timeout,
                             run_id=f"verify-{uuid.uuid4().hex[:6]}")
        print(f"oncelog verify: {len(cfg.writers)} writers ({', '.join(clients)}), "
              f"{cfg.readers} readers, topic {topic} ({cfg.partitions} partitions), "
              f"{args.duration:g} s, faults: {', '.join(faults) or 'none'}, seed {args.seed}")
        restarts: list[float] = []
        if "restart" in faults:
            restarts = [args.duration * f for f in (0.35, 0.7)]

        def during(elapsed: float) -> None:
            if restarts and elapsed >= restarts[0] and child is not None:
                restarts.pop(0)
                print(f"  {elapsed:5.1f}s: SIGKILL the broker and start it again")
                child.kill()
                child.start()

        with FaultProxy(bootstrap, faults=proxy_faults, seed=args.seed) as proxy:
            errors = run_writers(proxy.bootstrap_servers, cfg, history, args.duration,
                                 progress=print, during=during)
            proxy.set_faults(Faults())
            released = proxy.release_held()
            try:
                proxy.wait_idle(30)
            except TimeoutError:
                print("  the proxy still had requests in flight after 30 s")
            stats = dict(sorted(proxy.stats.items()))
        print(f"oncelog verify: writers done ({released} held requests released at the end); "
              f"proxy: {', '.join(f'{k} {v}' for k, v in stats.items())}")
        for exc in errors:
            print(f"oncelog verify: a writer failed: {exc!r}", file=sys.stderr)
        print(f"oncelog verify: reading with {cfg.readers} read_committed readers")
        started = time.monotonic()
        run_readers(bootstrap, cfg, history)
        print(f"oncelog verify: read in {time.monotonic() - started:.1f} s")
    except Exception as exc:  # noqa: BLE001 (the run failed; say why)
        print(f"oncelog verify: the run failed: {exc!r}", file=sys.stderr)
        return 2
    finally:
        if sink is not None:
            history.stream_to(None)
            sink.close()
        if child is not None and child.running:
            with contextlib.suppress(BrokerProcessError):  # it hung on SIGTERM: killed then
                child.stop()
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    verdict = check(history)
    _print_verdict(verdict, args.json)
    if args.history:
        print(f"oncelog verify: history saved to {args.history}")
    if errors:
        return 2
    return 0 if verdict.ok else 1
