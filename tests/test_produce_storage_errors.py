"""A Produce whose append must roll a segment while the broker is out of file descriptors
(EMFILE; issue 29): every partition the request named is answered, with the retriable
KAFKA_STORAGE_ERROR (56) where the roll failed, as CreateTopics answers; the partition's log is
left as it was, and once descriptors are free the same records are appended and read back with
nothing lost, duplicated or out of order."""

from __future__ import annotations

import subprocess

from confluent_kafka import Producer as CKProducer
from support.raw_wire import RawConnection, create_topics_request, fetch_all
from test_disk_errors import open_files

from oncelog.harness.broker_process import BrokerProcess
from oncelog.protocol import ApiKey, make, request_module
from oncelog.records import build_batch
from oncelog.server.embedded import EmbeddedBroker

KAFKA_STORAGE_ERROR, UNKNOWN_SERVER_ERROR = 56, -1


def produce_many(conn, parts: dict[tuple[str, int], bytes], version: int = 9):
    mod = request_module(ApiKey.PRODUCE, version)
    by_topic: dict[str, list] = {}
    for (topic, index), records in parts.items():
        by_topic.setdefault(topic, []).append(make(mod.PartitionProduceData, index=index,
                                                   records=records))
    request = make(mod.ProduceRequest, transactional_id=None, acks=-1, timeout=30_000,
                   topic_data=tuple(make(mod.TopicProduceData, name=t, partition_data=tuple(ps))
                                    for t, ps in by_topic.items()))
    response = conn.request(request)
    return {(t.name, p.index): p for t in response.responses for p in t.partition_responses}


def batch(tag: str, n: int = 4) -> bytes:
    return build_batch([(None, f"{tag}-{i}".encode() + bytes(300), [], 1) for i in range(n)])


def prlimit(pid: int, soft: str) -> None:
    subprocess.run(["prlimit", f"--nofile={soft}:", "--pid", str(pid)], check=True)


def test_a_produce_that_cannot_roll_for_want_of_descriptors_names_every_partition(tmp_path):
    with BrokerProcess(tmp_path / "data") as broker, \
            RawConnection(broker.bootstrap_servers) as conn:
        pid = broker.proc.pid
        for name in ("small", "other"):
            created = conn.request(create_topics_request(
                name, partitions=2, configs={"segment.bytes": "2048"})).topics[0]
            assert created.error_code == 0, created
        tps = [("small", 0), ("small", 1), ("other", 0), ("other", 1)]
        first = produce_many(conn, {tp: batch(f"a{tp}") for tp in tps})
        assert {tp: p.error_code for tp, p in first.items()} == dict.fromkeys(tps, 0)
        soft = subprocess.run(["prlimit", "--nofile", "--pid", str(pid), "--output=SOFT",
                               "--noheadings"], capture_output=True, text=True,
                              check=True).stdout.strip()
        segments = {tp: len(list((tmp_path / "data").glob(f"{tp[0]}-{tp[1]}/*.log")))
                    for tp in tps}
        # Not one descriptor to spare: each partition's next batch (1.2 kB on 1.2 kB, over
        # segment.bytes 2048) needs a new segment, whose files cannot be opened.
        prlimit(pid, str(open_files(pid)))
        try:
            failed = produce_many(conn, {tp: batch(f"b{tp}") for tp in tps})
        finally:
            prlimit(pid, soft)
        assert {tp: p.error_code for tp, p in failed.items()} == \
            dict.fromkeys(tps, KAFKA_STORAGE_ERROR)
        assert all("EMFILE" in (p.error_message or "") for p in failed.values()), failed
        assert segments == {tp: len(list((tmp_path / "data").glob(f"{tp[0]}-{tp[1]}/*.log")))
                            for tp in tps}
        # The retry, descriptors free again: appended where the failed attempt would have been.
        again = produce_many(conn, {tp: batch(f"b{tp}") for tp in tps})
        assert {tp: (p.error_code, p.base_offset) for tp, p in again.items()} == \
            dict.fromkeys(tps, (0, 4))
        for tp in tps:
            got = [(o, v.rstrip(b"\0")) for o, _k, v, _h in fetch_all(conn, *tp)]
            assert got == [(i, f"a{tp}-{i}".encode()) for i in range(4)] + \
                [(4 + i, f"b{tp}-{i}".encode()) for i in range(4)]


def test_a_produce_handler_that_fails_unexpectedly_names_every_partition():
    """The last resort (Kafka's handleError): a Produce that fails for a reason no handler
    foresaw is answered UNKNOWN_SERVER_ERROR for each partition it named, not with an empty
    response (which librdkafka fails as a bad message)."""
    with EmbeddedBroker() as embedded:
        broker = embedded.server.broker

        async def broken(broker, ctx, request):
            raise RuntimeError("a bug in the Produce handler")

        broker.handlers = {**broker.handlers, ApiKey.PRODUCE: broken}
        with RawConnection(embedded.bootstrap_servers) as conn:
            answered = produce_many(conn, {("a", 0): batch("x"), ("a", 2): batch("y"),
                                           ("b", 1): batch("z")})
            assert {tp: p.error_code for tp, p in answered.items()} == {
                ("a", 0): UNKNOWN_SERVER_ERROR, ("a", 2): UNKNOWN_SERVER_ERROR,
                ("b", 1): UNKNOWN_SERVER_ERROR}


def test_librdkafka_retries_a_storage_error_and_delivers_once_descriptors_are_free(tmp_path):
    """The client's side: librdkafka takes KAFKA_STORAGE_ERROR as retriable, so the records
    of a produce that could not roll wait and go once the broker has descriptors again,
    each exactly once and in order (an idempotent producer)."""
    with BrokerProcess(tmp_path / "data") as broker, \
            RawConnection(broker.bootstrap_servers) as conn:
        pid = broker.proc.pid
        created = conn.request(create_topics_request(
            "rd", partitions=1, configs={"segment.bytes": "2048"})).topics[0]
        assert created.error_code == 0, created
        delivered: list = []
        errors: list = []

        def on_delivery(err, msg) -> None:
            (errors if err is not None else delivered).append(err or msg.offset())

        p = CKProducer({"bootstrap.servers": broker.bootstrap_servers, "linger.ms": 0,
                        "enable.idempotence": True, "retry.backoff.ms": 50,
                        "delivery.timeout.ms": 120_000})
        p.produce("rd", b"x" * 1500, partition=0, on_delivery=on_delivery)
        assert p.flush(30) == 0 and delivered == [0]
        soft = subprocess.run(["prlimit", "--nofile", "--pid", str(pid), "--output=SOFT",
                               "--noheadings"], capture_output=True, text=True,
                              check=True).stdout.strip()
        prlimit(pid, str(open_files(pid)))
        try:
            for i in range(3):  # the first must roll (1.5 kB on 1.5 kB, segment.bytes 2048)
                p.produce("rd", b"%d" % i + b"y" * 1500, partition=0, on_delivery=on_delivery)
            # Still undelivered after a while: refused as retriable and retried, not failed.
            assert p.flush(3) > 0
            assert errors == [] and delivered == [0]
        finally:
            prlimit(pid, soft)
        assert p.flush(60) == 0
        assert errors == [] and delivered == [0, 1, 2, 3]
        got = [v[:1] for _o, _k, v, _h in fetch_all(conn, "rd", 0)]
        assert got == [b"x", b"0", b"1", b"2"]
