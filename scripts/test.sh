#!/usr/bin/env bash
# Run the tests, installing what they need on first use.
#   bash scripts/test.sh          the whole suite (slow, Spark, cluster and Kafka tests included),
#                                 on three workers (pytest-xdist): CI; about 20 minutes here
#                                 (1,568 tests)
#   bash scripts/test.sh --fast   the fast tier: everything not marked slow, spark, cluster or
#                                 kafka, on three workers, in about two minutes
# Three workers on two cores: a third worker took a full run from 11 minutes to 8 here; the
# full run now keeps both cores about 90% busy (tests/conftest.py runs the JVMs it starts with
# C1 only for that reason).
# Any further arguments go to pytest.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
fast=""
if [ "${1:-}" = "--fast" ]; then
  fast=1
  shift
fi
if [ -n "$fast" ]; then
  bash "$root/scripts/bootstrap.sh"
else
  bash "$root/scripts/bootstrap.sh" --with-kcat --with-postgres --with-zookeeper --with-node \
    --with-chromium --with-openssl --with-kafka --with-netns
fi
cd "$root"
.venv/bin/ruff check src
.venv/bin/mypy src/oncelog
if [ -n "$fast" ]; then
  exec .venv/bin/python -m pytest -q -n 3 -m "not slow and not spark and not cluster and not kafka" "$@"
fi
exec .venv/bin/python -m pytest -q -n 3 --dist worksteal "$@"
