#!/usr/bin/env bash
# The demo (oncelog demo): spec 001's pipeline on Spark, exactly once through a driver SIGKILL.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/bootstrap.sh"
cd "$root"
exec .venv/bin/oncelog demo "$@"
