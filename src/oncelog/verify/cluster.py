"""``oncelog verify --cluster``: the transactional workload against a replicated cluster while
brokers fail (spec 001 failure scenarios 5-7), checked by the history checker.

A local cluster of three brokers (harness/local_cluster.py) with a topic of replication factor 3 and
min.insync.replicas 2; transactional writers (ours, confluent-kafka's) write while, one after
another, the faults strike:

- ``kill-leader``: SIGKILL the leader of partition 0, start it again 3 s later;
- ``kill-coordinator``: SIGKILL the transaction coordinator of the first writer's transactional
  id (the leader of its ``__transaction_state`` partition), start it again 3 s later;
- ``pause``: SIGSTOP the leader of partition 1 past its ZooKeeper session (it loses its
  partitions), then SIGCONT (it comes back as a follower and truncates);
- ``cut``: cut the leader of partition 2 off the network (its relay drops every connection: no
  client and no follower reaches it; its ZooKeeper session lives on) for 4 s.

After the last fault has healed every writer must commit again ("every client makes progress
again"); then read_committed readers read everything, and the checker looks for lost
acknowledged writes, duplicates, aborted reads and torn transactions.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .checker import Verdict, check
from .history import History, Txn
from .workload import WorkloadConfig, run_readers, run_writers

CLUSTER_FAULTS = ("kill-leader", "kill-coordinator", "pause", "cut")
SESSION_TIMEOUT_MS = 2000
SETTINGS = {"zookeeper.session.timeout.ms": str(SESSION_TIMEOUT_MS),
            "replica.lag.time.max.ms": "2000",
            "transaction.state.log.num.partitions": "3", "offsets.topic.num.partitions": "1",
            "transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000"}
RESTART_AFTER_S = 3.0
CUT_FOR_S = 4.0


@dataclass
class ClusterRun:
    verdict: Verdict
    history: History
    errors: list[BaseException]
    faults: list[str] = field(default_factory=list)  # what was done, when
    stalled: list[str] = field(default_factory=list)  # writers that never committed again

    @property
    def ok(self) -> bool:
        return self.verdict.ok and not self.errors and not self.stalled


def _committed(history: History) -> Counter:
    return Counter(op.writer for op in history.ops
                   if isinstance(op, Txn) and op.outcome == "committed")


def run_cluster(data_dir: Path, faults: list[str], *, duration: float = 30.0,
                clients: tuple[str, ...] = ("oncelog", "confluent"), writers_per_client: int = 1,
                readers: int = 2, partitions: int = 3, seed: int = 0,
                progress: Callable[[str], None] = lambda _line: None) -> ClusterRun:
    from ..client import Admin, NewTopic
    from ..harness.local_cluster import LocalCluster
    from ..server.topics import TRANSACTION_STATE, coordinator_partition

    unknown = [f for f in faults if f not in CLUSTER_FAULTS]
    if unknown:
        raise ValueError(f"unknown cluster fault(s) {', '.join(unknown)} (known: "
                         f"{', '.join(CLUSTER_FAULTS)})")
    cfg = WorkloadConfig(topic="verify", partitions=partitions,
                         writers=[c for c in clients for _ in range(writers_per_client)],
                         readers=readers, seed=seed, request_timeout_ms=5000,
                         transaction_timeout_ms=15_000, read_timeout=60.0,
                         run_id=f"verify-{uuid.uuid4().hex[:6]}")
    history = History()
    done: list[str] = []
    cluster = LocalCluster(data_dir, 3, broker_settings=SETTINGS, die_with_parent=True,
                           zookeeper_fsync=False, relays="cut" in faults)
    with cluster:
        bootstrap = cluster.bootstrap_servers
        progress(f"cluster of 3 brokers at {bootstrap}")
        with Admin(bootstrap_servers=bootstrap) as admin:
            admin.create_topics([NewTopic(cfg.topic, partitions, replication_factor=3,
                                          config={"min.insync.replicas": "2"})])
        for p in range(partitions):
            cluster.wait_for_isr(cfg.topic, p, 3, 60)
        first_txn_id = f"{cfg.run_id}-{cfg.writers[0]}-0"
        # Faults in the first part of the run: the rest shows every writer committing again.
        plan = [(duration * (i + 1) / (len(faults) + 3), f) for i, f in enumerate(faults)]
        heals: list[tuple[float, str, Callable[[], None]]] = []
        healed_at: list[Counter] = []

        def log(elapsed: float, what: str) -> None:
            line = f"{elapsed:5.1f}s: {what}"
            done.append(line)
            progress("  " + line)

        def strike(elapsed: float, fault: str) -> None:
            if fault == "kill-leader":
                victim = cluster.leader_of(cfg.topic, 0)
                cluster.kill(victim)
                heals.append((elapsed + RESTART_AFTER_S, f"start broker {victim} again",
                              lambda: cluster.start_broker(victim)))
            elif fault == "kill-coordinator":
                victim = cluster.leader_of(TRANSACTION_STATE,
                                           coordinator_partition(first_txn_id, 3))
                cluster.kill(victim)
                heals.append((elapsed + RESTART_AFTER_S, f"start broker {victim} again",
                              lambda: cluster.start_broker(victim)))
            elif fault == "pause":
                victim = cluster.leader_of(cfg.topic, 1 % partitions)
                cluster.pause(victim)
                heals.append((elapsed + SESSION_TIMEOUT_MS / 1000 + 2, f"SIGCONT broker {victim}",
                              lambda: cluster.resume(victim)))
            else:
                victim = cluster.leader_of(cfg.topic, 2 % partitions)
                cluster.cut(victim)
                heals.append((elapsed + CUT_FOR_S, f"reconnect broker {victim}",
                              lambda: cluster.heal(victim)))
            log(elapsed, f"{fault}: broker {victim}")

        def during(elapsed: float) -> None:
            for when, what, action in list(heals):
                if elapsed >= when:
                    heals.remove((when, what, action))
                    action()
                    log(elapsed, what)
                    if not heals and not plan:
                        healed_at.append(_committed(history))
            if plan and elapsed >= plan[0][0] and not heals:
                strike(elapsed, plan.pop(0)[1])

        errors = run_writers(bootstrap, cfg, history, duration, progress=progress,
                             during=during)
        for _when, what, action in heals:  # the run ended first: heal now
            action()
            done.append(f"at the end: {what}")
        stalled = []
        if healed_at:
            end = _committed(history)
            stalled = [w for w in {f"{k}-{i}" for i, k in enumerate(cfg.writers)}
                       if end[w] <= healed_at[0][w]]
        elif faults:
            stalled = ["(the faults did not all heal before the writers stopped)"]
        for p in range(partitions):
            cluster.wait_for_isr(cfg.topic, p, 3, 60)
        started = time.monotonic()
        run_readers(bootstrap, cfg, history)
        progress(f"read in {time.monotonic() - started:.1f} s")
    return ClusterRun(check(history), history, errors, done, stalled)
