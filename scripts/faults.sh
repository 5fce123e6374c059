#!/usr/bin/env bash
# Fault runs as Jepsen makes them: a replicated oncelog cluster whose brokers, ZooKeeper nodes and
# clients each run in a network namespace of their own, partitioned, paused, clock-skewed, killed
# and starved of disk under an exactly-once workload; the history is checked with Jepsen's Kafka
# checks and a report (history, anomalies with the ops that show them, fault windows, a plot) is
# written. The last line printed is "anomalies: N, faults: F, operations: O".
#
#   bash scripts/faults.sh --workload queue --faults partition,kill --time 60 --seed 7
#   bash scripts/faults.sh --help          every option (workloads, faults, topology, clients)
#   bash scripts/faults.sh --cleanup       remove the namespaces of runs that died
#
# Needs root (network namespaces, iptables, tmpfs); installs what it needs on first use
# (Debian's iproute2, iptables and ZooKeeper; Apache Kafka's Java client for the Java
# clients).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ "$(id -u)" != 0 ]; then
  echo "faults.sh: needs root (network namespaces, iptables, tmpfs mounts)" >&2
  exit 2
fi
with=(--with-zookeeper --with-netns)
for arg in "$@"; do
  case "$arg" in
    *java*) with+=(--with-kafka) ;;
  esac
done
bash "$root/scripts/bootstrap.sh" "${with[@]}" >&2
cd "$root"
if [ "${1:-}" = "--cleanup" ]; then
  exec .venv/bin/python -m oncelog.faults.net --cleanup
fi
exec .venv/bin/python -m oncelog.faults.run "$@"
