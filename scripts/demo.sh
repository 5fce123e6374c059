#!/usr/bin/env bash
# The demo: an embedded broker, our producer, confluent-kafka's consumer.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/bootstrap.sh"
cd "$root"
exec .venv/bin/python -m oncelog.demo "$@"
