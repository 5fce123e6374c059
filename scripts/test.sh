#!/usr/bin/env bash
# Run the whole test suite (slow tests included), installing what it needs on first use.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/bootstrap.sh" --with-kcat --with-postgres --with-zookeeper
cd "$root"
.venv/bin/ruff check src
.venv/bin/mypy src/oncelog
exec .venv/bin/python -m pytest -q "$@"
