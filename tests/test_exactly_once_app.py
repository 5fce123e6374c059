"""The exactly-once application of spec 001 (purchases -> invoices + shipments, consume-transform-
produce with a consumer group; src/oncelog/examples/purchases.py) run as a real process with
confluent-kafka's client and with ours, SIGKILLed several times while it copies tens of
thousands of records, the broker SIGKILLed once too: read_committed, every purchase has exactly
one invoice and exactly one shipment, none missing, none twice."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter

import pytest
from confluent_kafka import Producer as ConfluentProducer
from confluent_kafka.admin import AdminClient, NewTopic
from support.purchases_app import App
from support.transactions import read_committed

from oncelog.examples.purchases import INVOICES, PURCHASES, SHIPMENTS, purchase
from oncelog.harness.broker_process import BrokerProcess

pytestmark = pytest.mark.slow

PURCHASE_COUNT = 20_000
PARTITIONS = 3
SETTINGS = {"transaction.state.log.num.partitions": "5", "offsets.topic.num.partitions": "5",
            "group.initial.rebalance.delay.ms": "0", "group.min.session.timeout.ms": "1000"}


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
    return Counter(json.loads(v)["purchase"]
                   for v in read_committed(bootstrap, topic, PARTITIONS))


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
