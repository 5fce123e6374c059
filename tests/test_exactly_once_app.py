"""The exactly-once application of spec 001 (purchases -> invoices + shipments, consume-transform-
produce with a consumer group; src/oncelog/examples/purchases.py) run as a real process with
confluent-kafka's client and with ours, SIGKILLed several times while it copies tens of
thousands of records, the broker SIGKILLed once too: read_committed, every purchase has exactly
one invoice and exactly one shipment, none missing, none twice."""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import time
from collections import Counter

import pytest
from confluent_kafka import Producer as ConfluentProducer
from confluent_kafka.admin import AdminClient, NewTopic
from test_interop_transactions import read_ours

from oncelog.examples.purchases import INVOICES, PURCHASES, SHIPMENTS, purchase
from oncelog.harness.broker_process import BrokerProcess

pytestmark = pytest.mark.slow

PURCHASE_COUNT = 20_000
PARTITIONS = 3
SETTINGS = {"transaction.state.log.num.partitions": "5", "offsets.topic.num.partitions": "5",
            "group.initial.rebalance.delay.ms": "0", "group.min.session.timeout.ms": "1000"}


class App:
    """The purchases app as a child process; ``committed`` is the last count it reported."""

    def __init__(self, bootstrap: str, client: str) -> None:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "oncelog.examples.purchases", "--bootstrap-server",
             bootstrap, "--client", client, "--batch", "500", "--idle-exit", "8",
             "--session-timeout-ms", "3000"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
        self.committed = 0
        self.lines: list[str] = []
        self._sel = selectors.DefaultSelector()
        assert self.proc.stdout is not None
        os.set_blocking(self.proc.stdout.fileno(), False)
        self._sel.register(self.proc.stdout, selectors.EVENT_READ)
        self._buf = b""

    def _pump(self, timeout: float) -> bool:
        """Read what the app printed; False once its output has ended."""
        assert self.proc.stdout is not None
        if not self._sel.select(timeout):
            return True
        chunk = self.proc.stdout.read()
        if not chunk:
            return False
        self._buf += chunk
        *lines, self._buf = self._buf.split(b"\n")
        for raw in lines:
            line = raw.decode(errors="replace")
            self.lines.append(line)
            if line.startswith("committed "):
                self.committed = int(line.split()[1])
        return True

    def wait_committed_more_than(self, n: int, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while self.committed <= n:
            assert time.monotonic() < deadline, "\n".join(self.lines[-30:])
            assert self._pump(0.2), "app exited:\n" + "\n".join(self.lines[-30:])

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self._close()

    def wait_done(self, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while self._pump(0.2):
            assert time.monotonic() < deadline, "\n".join(self.lines[-30:])
        assert self.proc.wait(30) == 0, "\n".join(self.lines[-30:])
        self._close()

    def _close(self) -> None:
        self._sel.close()
        assert self.proc.stdout is not None
        self.proc.stdout.close()


def _seed(bootstrap: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.create_topics([NewTopic(t, PARTITIONS, 1)
                                  for t in (PURCHASES, INVOICES, SHIPMENTS)]).values():
        f.result(30)
    p = ConfluentProducer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                           "linger.ms": 20})
    for n in range(PURCHASE_COUNT):
        while True:
            try:
                p.produce(PURCHASES, purchase(n), key=str(n).encode())
                break
            except BufferError:
                p.poll(0.01)
    assert p.flush(60) == 0


def _purchase_ids(bootstrap: str, topic: str) -> Counter:
    return Counter(json.loads(v)["purchase"] for v in read_ours(bootstrap, topic, PARTITIONS))


@pytest.mark.parametrize("client", ["confluent", "oncelog"])
def test_app_killed_repeatedly_and_broker_killed_once_processes_each_purchase_once(tmp_path,
                                                                                  client):
    with BrokerProcess(tmp_path / "data", settings=SETTINGS) as broker:
        bootstrap = broker.bootstrap_servers
        _seed(bootstrap)
        app_kills = broker_kills = 0
        progress = 0
        for round_ in range(4):
            app = App(bootstrap, client)
            app.wait_committed_more_than(1000)
            progress += app.committed
            if round_ == 2:  # the broker dies under the running app, which must ride it out
                broker.kill()
                broker.start()
                broker_kills += 1
                app.wait_committed_more_than(app.committed + 500)
            app.kill()
            app_kills += 1
        app = App(bootstrap, client)
        app.wait_done()
        assert (app_kills, broker_kills) == (4, 1)
        assert progress < PURCHASE_COUNT  # the kills really landed mid-stream
        expected = Counter(range(PURCHASE_COUNT))
        for topic in (INVOICES, SHIPMENTS):
            got = _purchase_ids(bootstrap, topic)
            missing = expected - got
            twice = {k: c for k, c in got.items() if c > 1}
            assert not missing and not twice, (topic, len(missing), list(twice.items())[:5])


def test_the_app_restarts_itself_when_a_confluent_call_hangs_past_its_timeout():
    """librdkafka can hang in send_offsets_to_transaction past its timeout (its issues 5456 and
    5511); the app then replaces its process with a fresh one, with the same arguments (and
    environment, which carries its count of committed purchases)."""
    script = ("import sys, time; sys.argv = ['purchases', '--help']; "
              "from oncelog.examples import purchases as app; "
              "app.TXN_TIMEOUT_S = app.HANG_GRACE_S = 0.1; "
              "app._bounded(lambda *a: time.sleep(30))")
    env = dict(os.environ, ONCELOG_PURCHASES_COMMITTED="7")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=20, env=env, check=False)
    assert out.returncode == 0, out.stderr
    assert "<lambda> hung past its timeout" in out.stdout
    assert "usage:" in out.stdout and "--transactional-id" in out.stdout  # the app, again
