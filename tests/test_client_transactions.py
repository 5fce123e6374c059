"""Our Producer's transactions against a real broker: init, commit, abort; read_committed
consumers (ours and confluent-kafka's) see only committed records; a second instance with the
same transactional id fences the first (spec 001 scenarios 2 and 3); send() outside a
transaction is refused; send_offsets_to_transaction commits a group's offsets atomically; a
record that fails in send() fails its transaction (it must abort, it cannot commit without it)."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer as ConfluentConsumer
from confluent_kafka import TopicPartition as ConfluentTP
from support.transactions import read_committed

from oncelog import Admin, Consumer, ConsumerGroupMetadata, NewTopic, Producer, TopicPartition
from oncelog.client import IllegalStateError, TransactionError
from oncelog.errors import ProducerFencedError
from oncelog.server.embedded import EmbeddedBroker

TOPIC = "txn-client"


@pytest.fixture
def bootstrap(embedded_broker):
    bs = embedded_broker.bootstrap_servers
    with Admin(bootstrap_servers=bs) as admin:
        admin.create_topics([NewTopic(TOPIC, num_partitions=2)])
    return bs


def test_commit_and_abort(bootstrap):
    with Producer(bootstrap_servers=bootstrap, transactional_id="t-commit") as p:
        p.init_transactions()
        for n, commit in enumerate((True, False, True)):
            p.begin_transaction()
            futures = [p.send(TOPIC, b"%d-%d" % (n, i), partition=i % 2) for i in range(10)]
            if commit:
                p.commit_transaction()
                assert all(f.result().offset >= 0 for f in futures)
            else:
                p.abort_transaction()
    expected = sorted(b"%d-%d" % (n, i) for n in (0, 2) for i in range(10))
    assert sorted(read_committed(bootstrap, TOPIC)) == expected
    c = ConfluentConsumer({"bootstrap.servers": bootstrap, "group.id": "x",
                           "isolation.level": "read_committed", "enable.partition.eof": True})
    try:
        c.assign([ConfluentTP(TOPIC, p, 0) for p in range(2)])
        got, eof = [], set()
        while len(eof) < 2:
            m = c.poll(5)
            assert m is not None
            if m.error():
                eof.add(m.partition())
            else:
                got.append(m.value())
        assert sorted(got) == expected
    finally:
        c.close()


def test_send_outside_a_transaction_is_refused(bootstrap):
    with Producer(bootstrap_servers=bootstrap, transactional_id="t-outside") as p:
        with pytest.raises(IllegalStateError):
            p.begin_transaction()  # before init_transactions
        p.init_transactions()
        with pytest.raises(IllegalStateError):
            p.send(TOPIC, b"x")
        with pytest.raises(IllegalStateError):
            p.commit_transaction()


def test_a_new_instance_fences_the_old_one(bootstrap):
    zombie = Producer(bootstrap_servers=bootstrap, transactional_id="t-fence")
    zombie.init_transactions()
    zombie.begin_transaction()
    zombie.send(TOPIC, b"zombie", partition=0).result()
    with Producer(bootstrap_servers=bootstrap, transactional_id="t-fence") as successor:
        successor.init_transactions()  # aborts the zombie's transaction
        successor.begin_transaction()
        successor.send(TOPIC, b"successor", partition=0)
        successor.commit_transaction()
    with pytest.raises(ProducerFencedError):
        zombie.commit_transaction()
    with pytest.raises(ProducerFencedError):  # fatal: every later call too
        zombie.begin_transaction()
    zombie.close()
    assert sorted(read_committed(bootstrap, TOPIC)) == [b"successor"]


def test_send_offsets_to_transaction_commits_the_groups_offsets(bootstrap):
    group = ConsumerGroupMetadata("copier")
    tp = TopicPartition(TOPIC, 0)
    with Producer(bootstrap_servers=bootstrap, transactional_id="t-offsets") as p:
        p.init_transactions()
        for commit, offset in ((True, 5), (False, 9)):
            p.begin_transaction()
            p.send(TOPIC, b"out-%d" % offset, partition=1)
            p.send_offsets_to_transaction({tp: offset}, group)
            (p.commit_transaction if commit else p.abort_transaction)()
    c = ConfluentConsumer({"bootstrap.servers": bootstrap, "group.id": "copier"})
    try:
        (got,) = c.committed([ConfluentTP(TOPIC, 0)], timeout=10)
        assert got.offset == 5  # the aborted transaction's 9 never became visible
    finally:
        c.close()
    assert sorted(read_committed(bootstrap, TOPIC)) == [b"out-5"]


def test_a_downstream_consumer_that_dies_before_committing_reads_again(bootstrap):
    """spec 001, failure scenario 4: transactions protect what is inside the log; a
    read_committed consumer that acts on records and dies before committing its offsets reads
    them again (at least once), so its side effects need their own idempotence."""
    with Producer(bootstrap_servers=bootstrap, transactional_id="t-downstream") as p:
        p.init_transactions()
        p.begin_transaction()
        for i in range(3):
            p.send(TOPIC, b"invoice-%d" % i, partition=0)
        p.commit_transaction()

    def consume_once(commit: bool) -> list[bytes]:
        c = Consumer(bootstrap_servers=bootstrap, group_id="mailer", enable_auto_commit=False,
                     isolation_level="read_committed", auto_offset_reset="earliest",
                     session_timeout_ms=6000)
        c.subscribe([TOPIC])
        got: list[bytes] = []
        deadline = time.monotonic() + 20
        while len(got) < 3:
            assert time.monotonic() < deadline
            got.extend(r.value for r in c.poll(0.5))
        if commit:
            c.commit()
        c.close()
        return got

    first = consume_once(commit=False)  # "sent the e-mails", died before committing
    again = consume_once(commit=True)
    assert first == again == [b"invoice-0", b"invoice-1", b"invoice-2"]
    with Consumer(bootstrap_servers=bootstrap, group_id="mailer") as c:
        assert c.committed([TopicPartition(TOPIC, 0)]) == {TopicPartition(TOPIC, 0): 4}


# A send that fails before the sender has the record: (what is sent, what the error says).
FAILED_SENDS = {
    "unknown-partition": ({"topic": TOPIC, "value": b"lost", "partition": 7},
                          "partition 7 of topic 'txn-client' does not exist"),
    "too-large": ({"topic": TOPIC, "value": b"x" * 2000, "partition": 0}, "max.request.size"),
    "invalid-topic": ({"topic": "no spaces allowed", "value": b"lost"},
                      "topic .no spaces allowed."),
    "not-bytes": ({"topic": TOPIC, "value": 12345, "partition": 0},
                  "value must be bytes or str"),
}


@pytest.mark.parametrize("case", sorted(FAILED_SENDS))
def test_a_record_that_fails_in_send_fails_its_transaction(bootstrap, case):
    """As the Java client (KafkaProducer.doSend -> maybeTransitionToErrorState): the failed
    record, whether send() raised or returned a failed future, leaves the transaction
    abortable: later sends and commit raise, abort recovers, and the next transaction
    commits. Before, the transaction committed without the record."""
    send, why = FAILED_SENDS[case]
    with Producer(bootstrap_servers=bootstrap, transactional_id=f"t-failed-{case}",
                  max_request_size=1000) as p:
        p.init_transactions()
        p.begin_transaction()
        p.send(TOPIC, b"before", partition=1)
        try:
            failed = p.send(**send)
        except TypeError as exc:  # not bytes: raised, as the Java client's serializer does
            assert case == "not-bytes" and why in str(exc)
        else:
            with pytest.raises(Exception, match=why):
                failed.result(timeout=10)
        with pytest.raises(TransactionError, match=why):
            p.send(TOPIC, b"after", partition=1)
        with pytest.raises(TransactionError, match=why):
            p.commit_transaction()
        p.abort_transaction()
        p.begin_transaction()
        p.send(TOPIC, b"next", partition=0)
        p.commit_transaction()
    assert sorted(read_committed(bootstrap, TOPIC)) == [b"next"]


def test_a_metadata_timeout_in_send_fails_its_transaction():
    """A topic that never appears (no auto-creation): send() gives up after max.block.ms and
    the transaction cannot commit. Only the send is bounded by the short max.block.ms: the
    first init_transactions creates __transaction_state (50 partitions, half a second on an
    idle machine), which the calls given their own timeout wait for."""
    with EmbeddedBroker(config={"auto.create.topics.enable": "false"}) as b:
        bs = b.bootstrap_servers
        with Admin(bootstrap_servers=bs) as admin:
            admin.create_topics([NewTopic(TOPIC, num_partitions=2)])
        with Producer(bootstrap_servers=bs, transactional_id="t-no-topic",
                      max_block_ms=500) as p:
            p.init_transactions(timeout=60)
            p.begin_transaction()
            p.send(TOPIC, b"before", partition=0)
            with pytest.raises(Exception, match="not present in metadata"):
                p.send("never-created", b"lost").result(timeout=10)
            with pytest.raises(TransactionError, match="never-created"):
                p.commit_transaction(timeout=60)
            p.abort_transaction(timeout=60)
        assert sorted(read_committed(bs, TOPIC)) == []
