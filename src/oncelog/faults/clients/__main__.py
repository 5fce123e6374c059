"""``python -m oncelog.faults.clients``: one workload client process (see __init__.py)."""

from __future__ import annotations

import argparse
import logging
import os
import re
import signal
import sys
import threading
import time

from .base import ClientAdapter, Settings
from .history import HistoryFile


def _keys(text: str) -> list[str]:
    keys = [k.strip() for k in text.split(",") if k.strip()]
    for k in keys:
        if not re.fullmatch(r".+:\d+", k):
            raise argparse.ArgumentTypeError(f"a key is topic:partition, not {k!r}")
    return keys


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m oncelog.faults.clients",
        description="A workload client process: Jepsen's queue workload, the exactly-once "
                    "copier, or the final drain; its operations go to its own history file.")
    p.add_argument("--kind", choices=("oncelog", "confluent", "java"), required=True,
                   help="the client library (java: QueueClient.java, the same flags)")
    p.add_argument("--role", choices=("queue", "copier", "drain"), required=True)
    p.add_argument("--process", required=True, help="this process's name in the history")
    p.add_argument("--index", type=int, default=None,
                   help="values sent are INDEX * 10**9 + a counter (default: the number the "
                        "process name ends with)")
    p.add_argument("--bootstrap", required=True, help="HOST:PORT,...")
    p.add_argument("--history", required=True, help="the history file (appended to)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--duration", type=float, default=10.0,
                   help="seconds of operations (queue, copier), from when the client is "
                        "ready (its transactional producer initialized; with subscribe, a "
                        "queue client's first partitions assigned)")
    p.add_argument("--idle-stop-s", type=float, default=2.0,
                   help="copier: after --duration, stop once nothing was read this long")
    p.add_argument("--timeout", type=float, default=30.0,
                   help="drain: give up after this many seconds (a stuck read)")
    p.add_argument("--keys", type=_keys, default=[], help="topic:partition,... (queue, drain)")
    p.add_argument("--input", type=_keys, default=[], help="copier: the keys it reads")
    p.add_argument("--output", type=_keys, default=[],
                   help="copier: the keys it writes, in the order of --input")
    p.add_argument("--txn-ratio", type=float, default=0.5,
                   help="queue: the share of operations that are transactions")
    p.add_argument("--abort-ratio", type=float, default=0.1,
                   help="the share of transactions the workload aborts")
    p.add_argument("--max-txn-ops", type=int, default=4,
                   help="queue: at most this many sends and polls per transaction")
    p.add_argument("--poll-mode", choices=("assign", "subscribe"), default="assign",
                   help="assign: the queue client reads a random subset of the keys, another "
                        "every --reassign-every operations; a copier reads all its --input "
                        "keys (give copiers with assign disjoint keys). subscribe: the "
                        "group shares the topics out")
    p.add_argument("--reassign-every", type=int, default=25,
                   help="queue with assign: another random set of keys every N operations")
    p.add_argument("--transactional-id", default=None,
                   help="default: the process name (a restarted client keeps its id)")
    p.add_argument("--group", default=None,
                   help="the consumer group (default: 'copier-group' for copiers, the "
                        "transactional id for queue clients with assign, 'queue-group' with "
                        "subscribe; the drain has none)")
    p.add_argument("--poll-ms", type=int, default=100, help="each poll waits this long")
    p.add_argument("--request-timeout-ms", type=int, default=2000)
    p.add_argument("--transaction-timeout-ms", type=int, default=10000)
    p.add_argument("--session-timeout-ms", type=int, default=6000)
    p.add_argument("--op-timeout", type=float, default=10.0,
                   help="seconds an operation may take; then it is given up (info)")
    p.add_argument("--txn-hold-ms", type=int, default=0,
                   help="hold each transaction open this long after its sends are written "
                        "(the window of the client-crash fault)")
    return p


def option_names() -> set[str]:
    return {s for a in parser()._actions for s in a.option_strings}


def resolve(args: argparse.Namespace) -> argparse.Namespace:
    """Defaults that depend on other flags."""
    if args.index is None:
        m = re.search(r"(\d+)$", args.process)
        if m is None:
            raise SystemExit("--index: the process name does not end with a number")
        args.index = int(m.group(1))
    if args.transactional_id is None:
        args.transactional_id = args.process
    if args.group is None and args.role != "drain":
        # stable across restarts (a restarted client has another name, the same
        # transactional.id): a copier's group is its input's progress
        args.group = args.transactional_id if args.role == "queue" \
            and args.poll_mode == "assign" else f"{args.role}-group"
    if args.role in ("queue", "drain") and not args.keys:
        raise SystemExit(f"--keys: the {args.role} role needs keys")
    if args.role == "copier" and not args.input:
        raise SystemExit("--input/--output: the copier needs keys")
    return args


def main(argv: list[str] | None = None) -> int:
    args = resolve(parser().parse_args(argv))
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if args.kind == "java":
        raise SystemExit("--kind java: run QueueClient.java (java_command)")
    from .workload import ROLES

    settings = Settings.from_args(args)
    if args.kind == "oncelog":
        from .oncelog_client import OncelogAdapter

        adapter: ClientAdapter = OncelogAdapter(settings)
    else:
        from .confluent_client import ConfluentAdapter

        adapter = ConfluentAdapter(settings)
    history = HistoryFile(args.history, args.process)
    role = ROLES[args.role](adapter, args, history)
    # SIGTERM: no new operation; the one under way finishes (its completion is written). A
    # process still there --op-timeout + 10 s later (a library call that does not return)
    # ends anyway, its operation left open as a crash leaves it. Taken by a thread of its own
    # (sigwait; blocked in every other thread, which inherit the mask), so that a main thread
    # stuck in a library's C code does not keep it from being seen.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})

    def terminate() -> None:
        signal.sigwait({signal.SIGTERM})
        role.stop()
        time.sleep(args.op_timeout + 10)
        os._exit(143)

    threading.Thread(target=terminate, name="sigterm", daemon=True).start()
    try:
        role.run()
    finally:
        role.a.close()
        history.close()
    if args.kind == "confluent":
        # no destructors for the producers confluent_client.py retired (see _RETIRED there)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
