"""The controller's decisions (Kafka's ZooKeeper-mode controller), as plain functions with no IO:

- ``assign_replicas``: AdminUtils.assignReplicasToBrokers, rack-unaware: partition p's first
  replica is broker ``(p + start_index) % n`` of the sorted broker list (leaders spread evenly),
  the others follow at a shift that grows by one every n partitions.
- ``initial_state``: a new partition's leader is its first live replica; the ISR is its live
  replicas, in assignment order; leader epoch 0.
- ``elect_leader``: OfflinePartitionLeaderElectionStrategy without unclean election: the first
  replica in assignment order that is alive and in the ISR; leader epoch + 1; ISR = old ISR
  minus the dead. With no live ISR member the partition goes offline (leader -1) and keeps its
  ISR: the last members known to have every committed record, one of which must come back.
- ``on_brokers_changed`` / ``partition_change``: what the controller writes when brokers come and
  go (onBrokerFailure/onBrokerStartup): elections for partitions whose leader died or which are
  offline and can elect again, and dead brokers out of the ISR where the leader lives. As
  Kafka's ZooKeeper-mode controller (ReplicaStateMachine's removal of an offline replica from
  the ISR goes through LeaderAndIsr.newLeaderAndIsr), that ISR shrink bumps the leader epoch too:
  every state the controller writes has a new leader epoch; ISR changes the leader itself writes
  keep it. A broker that re-registered (new broker epoch) before the controller saw it gone is
  handled as gone and back ("bounced").

The controller thread that carries them out is cluster/controller.py; a single node runs the
same decisions in process (server/metadata_local.py), without ZooKeeper.
"""

from __future__ import annotations

import random
from collections.abc import Collection, Iterable, Mapping, Sequence

from .errors import ClusterError
from .model import NO_LEADER, LeaderAndIsr

__all__ = [
    "InvalidReplicationFactorError",
    "assign_replicas",
    "elect_leader",
    "initial_state",
    "new_partition_states",
    "on_brokers_changed",
    "partition_change",
]

TP = tuple[str, int]


class InvalidReplicationFactorError(ClusterError, ValueError):
    """More replicas asked for than there are brokers."""


def assign_replicas(num_partitions: int, replication_factor: int, broker_ids: Iterable[int],
                    start_index: int | None = None, start_shift: int | None = None, *,
                    start_partition: int = 0, rng: random.Random | None = None
                    ) -> dict[int, list[int]]:
    """Kafka's rack-unaware replica assignment (AdminUtils.assignReplicasToBrokers).

    Brokers are taken in id order. ``start_index`` (the broker of partition 0's first replica)
    and ``start_shift`` (the first distance to the second replica, minus one) are random when
    not given, as Kafka's; ``start_partition`` numbers the partitions from there (adding
    partitions to a topic)."""
    brokers = sorted(set(broker_ids))
    n = len(brokers)
    if num_partitions <= 0:
        raise ValueError(f"number of partitions must be larger than 0, not {num_partitions}")
    if replication_factor <= 0:
        raise InvalidReplicationFactorError(
            f"replication factor must be larger than 0, not {replication_factor}")
    if replication_factor > n:
        raise InvalidReplicationFactorError(
            f"replication factor: {replication_factor} larger than available brokers: {n}")
    rng = rng or random.Random()
    index = start_index if start_index is not None else rng.randrange(n)
    shift = start_shift if start_shift is not None else rng.randrange(n)
    out: dict[int, list[int]] = {}
    partition = max(0, start_partition)
    for _ in range(num_partitions):
        if partition > 0 and partition % n == 0:
            shift += 1
        first = (partition + index) % n
        replicas = [brokers[first]]
        for j in range(replication_factor - 1):
            replicas.append(brokers[(first + 1 + (shift + j) % (n - 1)) % n])
        out[partition] = replicas
        partition += 1
    return out


def initial_state(assignment: Sequence[int], live: Collection[int],
                  controller_epoch: int = 0) -> LeaderAndIsr | None:
    """A new partition's first state: leader the first live replica, ISR the live replicas in
    assignment order, leader epoch 0. None when no replica is alive (the partition stays
    without a state until one is)."""
    alive = tuple(r for r in assignment if r in live)
    if not alive:
        return None
    return LeaderAndIsr(alive[0], 0, alive, controller_epoch)


def elect_leader(assignment: Sequence[int], state: LeaderAndIsr, live: Collection[int],
                 controller_epoch: int | None = None) -> LeaderAndIsr | None:
    """Leader election for a partition whose leader is gone (dead, or -1), without unclean
    election: the first replica in assignment order that is alive and in the ISR becomes leader
    at leader epoch + 1, with ISR = old ISR minus the dead (in ISR order).

    With no live ISR member: leader -1 (epoch + 1), the ISR kept as it was (its members are the
    last known to hold every committed record; the partition comes back when one of them
    does). None when there is nothing to change: the leader is alive, or the partition is
    offline already and still cannot elect."""
    epoch = state.controller_epoch if controller_epoch is None else controller_epoch
    if state.leader >= 0 and state.leader in live:
        return None
    isr = set(state.isr)
    leader = next((r for r in assignment if r in live and r in isr), None)
    if leader is None:
        if state.leader == NO_LEADER:
            return None
        return LeaderAndIsr(NO_LEADER, state.leader_epoch + 1, state.isr, epoch)
    new_isr = tuple(r for r in state.isr if r in live)
    return LeaderAndIsr(leader, state.leader_epoch + 1, new_isr, epoch)


def _change(assignment: Sequence[int], state: LeaderAndIsr, live: Collection[int],
            controller_epoch: int) -> LeaderAndIsr | None:
    if state.leader < 0 or state.leader not in live:
        return elect_leader(assignment, state, live, controller_epoch)
    if all(r in live for r in state.isr):
        return None
    # The leader lives: the dead out of the ISR (Kafka: OfflineReplica, a new leader epoch).
    return LeaderAndIsr(state.leader, state.leader_epoch + 1,
                        tuple(r for r in state.isr if r in live), controller_epoch)


def partition_change(assignment: Sequence[int], state: LeaderAndIsr, live: Collection[int],
                     controller_epoch: int, bounced: Collection[int] = ()
                     ) -> LeaderAndIsr | None:
    """The state the controller writes for one partition given the live brokers, or None when
    it stays. ``bounced``: live brokers that re-registered since the controller last looked,
    handled as failed (out of the ISR, leadership lost) and then back."""
    current = state
    involved = [b for b in bounced if b in state.isr or b == state.leader]
    if involved:
        live_now = set(live) - set(bounced)
        step = _change(assignment, current, live_now, controller_epoch)
        if step is not None:
            current = step
    step = _change(assignment, current, live, controller_epoch)
    if step is not None:
        current = step
    return None if current == state else current


def on_brokers_changed(assignments: Mapping[str, Mapping[int, Sequence[int]]],
                       states: Mapping[TP, LeaderAndIsr], live: Collection[int],
                       controller_epoch: int, bounced: Collection[int] = ()
                       ) -> dict[TP, LeaderAndIsr]:
    """Every partition state to write after the set of live brokers changed: elections where
    the leader died (or the partition is offline and an ISR member is back), dead brokers out
    of the ISR of partitions whose leader lives. Partitions without a state are left to
    ``new_partition_states``."""
    live = set(live)
    out: dict[TP, LeaderAndIsr] = {}
    for (topic, p), state in states.items():
        replicas = assignments.get(topic, {}).get(p)
        if replicas is None:
            continue
        new = partition_change(replicas, state, live, controller_epoch, bounced)
        if new is not None:
            out[(topic, p)] = new
    return out


def new_partition_states(assignments: Mapping[str, Mapping[int, Sequence[int]]],
                         existing: Collection[TP], live: Collection[int],
                         controller_epoch: int) -> dict[TP, LeaderAndIsr]:
    """Initial states of the partitions that have none yet (and have a live replica)."""
    live = set(live)
    out = {}
    for topic, partitions in assignments.items():
        for p, replicas in partitions.items():
            if (topic, p) in existing:
                continue
            state = initial_state(replicas, live, controller_epoch)
            if state is not None:
                out[(topic, p)] = state
    return out
