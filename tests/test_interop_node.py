"""A Node.js client that fetches only by topic id: @platformatic/kafka 1.x produces and consumes
with a group through Fetch v17 (KIP-516). Before Fetch v13+ was offered it fell back to a v12
that names the topic by its id, and every fetch was UNKNOWN_TOPIC_OR_PARTITION (issue 18).

Needs Node.js and tests/node's packages (``scripts/bootstrap.sh --with-node``, which
``scripts/test.sh`` passes); skipped without them."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from oncelog.protocol import ApiKey
from oncelog.server.embedded import EmbeddedBroker

NODE_DIR = Path(__file__).resolve().parent / "node"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("node") is None
                       or not (NODE_DIR / "node_modules" / "@platformatic" / "kafka").is_dir(),
                       reason="Node.js or tests/node's packages missing "
                              "(bash scripts/bootstrap.sh --with-node)"),
]


def test_platformatic_kafka_consumes_through_fetch_by_topic_id():
    count = 40
    with EmbeddedBroker() as b:
        proc = subprocess.run(
            ["node", "platformatic_fetch.mjs", b.bootstrap_servers, "node-by-id", str(count)],
            cwd=NODE_DIR, capture_output=True, text=True, timeout=120, check=False)
        fetches = {v: n for (k, v), n in b.broker.request_counts.items() if k == ApiKey.FETCH}
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    consumed = json.loads(proc.stdout.strip().splitlines()[-1])["consumed"]
    assert sorted(consumed) == sorted(f"v{i}" for i in range(count))
    # Each partition in order (the script sends even values to partition 0, odd to 1).
    for parity in (0, 1):
        mine = [int(v[1:]) for v in consumed if int(v[1:]) % 2 == parity]
        assert mine == sorted(mine)
    assert fetches and set(fetches) == {17}, fetches
