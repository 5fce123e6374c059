#!/usr/bin/env bash
# Run the tests, installing what they need on first use.
#   bash scripts/test.sh                the whole suite (slow, Spark, cluster and Kafka tests
#                                       included), on three workers (pytest-xdist): CI; about
#                                       21 minutes here (1,638 tests)
#   bash scripts/test.sh --fast         the unit tier: every test not marked broker, slow,
#                                       spark, cluster or kafka. It starts no broker (a test
#                                       that does fails unless marked ``broker``: tests/conftest.py
#                                       marks them from their fixtures and source); run it after
#                                       every change (767 tests; 65 s on an idle 2-core
#                                       machine, 2 min on a busy one; 139 s of CPU, from 272 s;
#                                       the property sweeps run a sample here, whole in the
#                                       full suite: tests/support/tiers.py)
#   bash scripts/test.sh --integration  the quick integration tier: the tests marked broker that
#                                       are not slow, spark, cluster or kafka (an embedded broker
#                                       or a broker process each, no ZooKeeper, no JVM); run it
#                                       before pushing
#   --fast --integration                both tiers in one run (what --fast was before the broker
#                                       marker)
# Three workers on two cores: a third worker took a full run from 11 minutes to 8 here; the
# full run now keeps both cores about 90% busy (tests/conftest.py runs the JVMs it starts with
# C1 only for that reason).
# Any further arguments go to pytest.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
unit=""
integration=""
while [ $# -gt 0 ]; do
  case "$1" in
    --fast) unit=1; shift ;;
    --integration) integration=1; shift ;;
    *) break ;;
  esac
done
quick="not slow and not spark and not cluster and not kafka"
if [ -n "$unit" ] && [ -n "$integration" ]; then
  tier="$quick"
elif [ -n "$unit" ]; then
  tier="not broker and $quick"
elif [ -n "$integration" ]; then
  tier="broker and $quick"
else
  tier=""
fi
if [ -n "$tier" ]; then
  bash "$root/scripts/bootstrap.sh"
else
  bash "$root/scripts/bootstrap.sh" --with-kcat --with-postgres --with-zookeeper --with-node \
    --with-chromium --with-openssl --with-kafka --with-netns
fi
cd "$root"
.venv/bin/ruff check src
.venv/bin/mypy src/oncelog
if [ -n "$tier" ]; then
  exec .venv/bin/python -m pytest -q -n 3 -m "$tier" "$@"
fi
exec .venv/bin/python -m pytest -q -n 3 --dist worksteal "$@"
