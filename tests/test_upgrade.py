"""A data directory written by oncelog before a single node became a cluster of one keeps
working: the broker of that time (the source of commit ``BEFORE``, run from a ``git archive``
of it) writes committed and aborted transactions, idempotent records and group offsets, then
today's broker opens the same directory.

What the old layout stored and the upgrade carries over: the transaction coordinator's epoch
file (the new leader epochs start above it, so the old coordinator's markers stay fenced, and
the file goes), logs without a high watermark or leader epoch checkpoint (the batches' leader
epoch fields are the producers', not a leader's: they are not trusted), the producer id block.
"""

from __future__ import annotations

import shutil
import subprocess
import tarfile
import uuid
from io import BytesIO
from pathlib import Path

import confluent_kafka
import confluent_kafka.admin
import pytest

from oncelog.harness.broker_process import BrokerProcess

pytestmark = pytest.mark.slow

# The last commit whose single node was not a cluster of one (issue 17).
BEFORE = "9507f15"
ROOT = Path(__file__).resolve().parent.parent
TOPIC = "upgraded"
# _read joins a group (subscribe) on every call: without this each join waited out the
# default 3 s initial rebalance delay, which nothing here is about (both brokers, the old
# one included, take the setting).
GROUP_SETTINGS = {"group.initial.rebalance.delay.ms": "0"}


@pytest.fixture(scope="module")
def old_source(tmp_path_factory) -> Path:
    """The old broker's source tree, with today's build of the C record walk (its source did
    not change)."""
    try:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", BEFORE, "src"],
                                 check=True, capture_output=True, timeout=60).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"commit {BEFORE} is not in this checkout's history: {exc}")
    dest = tmp_path_factory.mktemp("before")
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(dest, filter="data")
    for built in (ROOT / "src" / "oncelog" / "records").glob("_recordwalk*.so"):
        shutil.copy(built, dest / "src" / "oncelog" / "records" / built.name)
    return dest / "src"


def _transactional(bootstrap: str, txn_id: str) -> confluent_kafka.Producer:
    p = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "transactional.id": txn_id,
                                  "linger.ms": 0})
    p.init_transactions(30)
    return p


def _read(bootstrap: str, group: str | None = None, commit: bool = False) -> list[bytes]:
    config = {"bootstrap.servers": bootstrap, "group.id": group or f"reader-{uuid.uuid4()}",
              "isolation.level": "read_committed", "auto.offset.reset": "earliest",
              "enable.auto.commit": False, "enable.partition.eof": True}
    c = confluent_kafka.Consumer(config)
    c.subscribe([TOPIC])
    values, eof = [], False
    try:
        for _ in range(300):
            m = c.poll(0.2)
            if m is None:
                if eof:
                    break
                continue
            if m.error():
                eof = m.error().code() == confluent_kafka.KafkaError._PARTITION_EOF
                continue
            values.append(m.value())
        if commit:
            c.commit(asynchronous=False)
    finally:
        c.close()
    return values


def test_a_single_node_data_directory_of_the_earlier_layout_keeps_working(tmp_path,
                                                                           old_source):
    data = tmp_path / "data"
    with BrokerProcess(data, env={"PYTHONPATH": str(old_source)},
                       settings=GROUP_SETTINGS) as old:
        admin = confluent_kafka.admin.AdminClient({"bootstrap.servers": old.bootstrap_servers})
        admin.create_topics([confluent_kafka.admin.NewTopic(TOPIC, 1, 1)])[TOPIC].result(30)
        p = _transactional(old.bootstrap_servers, "upgrade-app")
        p.begin_transaction()
        p.produce(TOPIC, b"committed-1")
        p.commit_transaction(30)
        p.begin_transaction()
        p.produce(TOPIC, b"aborted")
        p.flush(30)
        p.abort_transaction(30)
        plain = confluent_kafka.Producer({"bootstrap.servers": old.bootstrap_servers,
                                          "enable.idempotence": True})
        plain.produce(TOPIC, b"idempotent")
        plain.flush(30)
        assert _read(old.bootstrap_servers, "upgrade-group", commit=True) == [
            b"committed-1", b"idempotent"]
        assert old.stop() == 0
    old_epoch = int((data / "txn-coordinator-epoch").read_text())
    old_block = int((data / "producer-id-block").read_text())
    assert not (data / f"{TOPIC}-0" / "leader-epoch-checkpoint").exists()

    with BrokerProcess(data, settings=GROUP_SETTINGS) as new:
        # Everything written is there, the aborted transaction still hidden.
        assert _read(new.bootstrap_servers) == [b"committed-1", b"idempotent"]
        # The group's committed offset survived: nothing new for it.
        assert _read(new.bootstrap_servers, "upgrade-group") == []
        # The transactional id goes on (its epoch bumped, its transactions committed); the
        # new coordinator's epoch is the partition's leader epoch, above the old file's.
        p = _transactional(new.bootstrap_servers, "upgrade-app")
        p.begin_transaction()
        p.produce(TOPIC, b"committed-2")
        p.commit_transaction(30)
        assert _read(new.bootstrap_servers) == [b"committed-1", b"idempotent", b"committed-2"]
        plain = confluent_kafka.Producer({"bootstrap.servers": new.bootstrap_servers,
                                          "enable.idempotence": True})
        plain.produce(TOPIC, b"idempotent-2")
        plain.flush(30)
        assert _read(new.bootstrap_servers)[-1] == b"idempotent-2"
        assert new.stop() == 0
    assert not (data / "txn-coordinator-epoch").exists()
    assert int((data / "producer-id-block").read_text()) > old_block  # no id handed out twice
    epochs = [d for d in data.glob("__transaction_state-*")]
    assert epochs
    for d in epochs:
        lines = (d / "leader-epoch-checkpoint").read_text().split()
        assert int(lines[-2]) > old_epoch  # the latest epoch, above the old coordinator's
    # A start raises the leader epoch again.
    before = (data / f"{TOPIC}-0" / "leader-epoch-checkpoint").read_text().split()
    with BrokerProcess(data, settings=GROUP_SETTINGS) as again:
        assert _read(again.bootstrap_servers)[-1] == b"idempotent-2"
    after = (data / f"{TOPIC}-0" / "leader-epoch-checkpoint").read_text().split()
    assert int(after[-2]) > int(before[-2])
