"""SIGKILL the broker in the middle of an idempotent producer's stream, restart it on the same
data directory and port, and let the same producer instance finish: every acknowledged record is
in the log exactly once, at the offset its acknowledgement named, and the retries of requests
that were cut off (some written before the kill, some not) add no duplicates (spec 000,
"PID-Sequence Management")."""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest
from confluent_kafka import Producer
from support.interop import confluent_consume, confluent_create_topic

from oncelog.harness.broker_process import BrokerProcess

pytestmark = pytest.mark.slow

TOPIC = "crash"
PARTITIONS = 3
RECORDS = 40_000
RATE = 10_000  # records/s: the stream lasts ~4 s, so the kills land in its middle
KILL_AT = (0.25, 0.5, 0.75)  # fractions of the stream acknowledged when the broker is killed
# The stream runs at most this far past a kill's milestone until the kill is done, so every kill
# lands mid-stream with records in flight, however slowly a loaded machine restarts the broker.
AHEAD = 2_000


class Stream:
    """The producer side: paced, numbered records and what was acknowledged where."""

    def __init__(self, bootstrap: str) -> None:
        self.producer = Producer({
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 1,
            "message.timeout.ms": 120_000,  # outlives any restart
            "retry.backoff.ms": 20,
            "retry.backoff.max.ms": 200,
            "reconnect.backoff.ms": 10,
            "reconnect.backoff.max.ms": 100,
        })
        self.acked: dict[int, tuple[int, int]] = {}  # record number -> (partition, offset)
        self.failed: list[tuple[int, str]] = []
        self.milestones = [(int(RECORDS * f), threading.Event()) for f in KILL_AT]
        self.killed = [threading.Event() for _ in KILL_AT]
        self.aborted = False

    def abort(self) -> None:
        """The producing thread failed: release the killer thread."""
        self.aborted = True
        for _count, event in self.milestones:
            event.set()
        for event in self.killed:
            event.set()

    def _on_delivery(self, err, msg) -> None:
        n = int(msg.value())
        if err is not None:
            self.failed.append((n, str(err)))
            return
        assert n not in self.acked, f"record {n} acknowledged twice"
        self.acked[n] = (msg.partition(), msg.offset())
        for count, event in self.milestones:
            if len(self.acked) >= count:
                event.set()

    def run(self) -> None:
        start = time.monotonic()
        holds = {count + AHEAD: killed for (count, _), killed in zip(self.milestones, self.killed,
                                                                      strict=True)}
        for n in range(RECORDS):
            if n in holds:
                waited = time.monotonic() + 120
                while not holds[n].is_set():  # the kill of that milestone is not done yet
                    assert time.monotonic() < waited, "the kill did not come"
                    self.producer.poll(0.05)
                start = time.monotonic() - n / RATE  # then on at the same pace
            due = start + n / RATE
            while (left := due - time.monotonic()) > 0:
                self.producer.poll(left)  # serves delivery reports while pacing
            self.producer.produce(TOPIC, value=b"%08d" % n, key=b"%d" % n,
                                  on_delivery=self._on_delivery)
            self.producer.poll(0)
        left = self.producer.flush(150)
        assert left == 0, f"{left} records still undelivered"


def _killer(broker: BrokerProcess, stream: Stream, kills: list, errors: list) -> None:
    try:
        for (_count, event), killed in zip(stream.milestones, stream.killed, strict=True):
            assert event.wait(120), "the stream stalled before the kill"
            if stream.aborted:
                return
            acked_then = len(stream.acked)
            broker.kill()
            broker.start()
            kills.append(acked_then)
            killed.set()
    except Exception as exc:  # noqa: BLE001 (re-raised by the test thread)
        errors.append(exc)


@pytest.mark.parametrize("settings", [
    {},
    {"log.flush.interval.messages": "1"},
], ids=["page-cache", "fsync-before-ack"])
def test_sigkill_mid_stream_loses_no_acked_record_and_duplicates_none(tmp_path, settings):
    # Small segments: the stream rolls several, so recovery spans segments and snapshots.
    settings = {"log.segment.bytes": str(128 * 1024), **settings}
    with BrokerProcess(tmp_path / "data", settings=settings) as broker:
        confluent_create_topic(broker.bootstrap_servers, TOPIC, PARTITIONS)
        stream = Stream(broker.bootstrap_servers)
        kills: list[int] = []
        errors: list[BaseException] = []
        killer = threading.Thread(target=_killer, args=(broker, stream, kills, errors))
        killer.start()
        try:
            stream.run()
        except BaseException:
            stream.abort()
            raise
        finally:
            killer.join(120)
        assert not errors, errors
        assert len(kills) == len(KILL_AT)
        assert all(k < RECORDS for k in kills), f"a kill came after the stream ended: {kills}"
        assert not stream.failed, f"{len(stream.failed)} deliveries failed: {stream.failed[:5]}"
        assert len(stream.acked) == RECORDS

        consumed = confluent_consume(broker.bootstrap_servers, TOPIC, PARTITIONS)
        twice = sorted(n for n, c in Counter(int(r.value) for r in consumed).items() if c > 1)
        assert not twice, f"{len(twice)} records are in the log twice, e.g. {twice[:10]}"
        assert len(consumed) == RECORDS, f"{RECORDS - len(consumed)} acknowledged records lost"
        at = {(r.partition, r.offset): int(r.value) for r in consumed}
        wrong = [(n, pos, at.get(pos)) for n, pos in stream.acked.items() if at.get(pos) != n]
        assert not wrong, f"acknowledged at an offset holding something else: {wrong[:10]}"
        for p in range(PARTITIONS):
            in_log = [int(r.value) for r in sorted(consumed, key=lambda r: r.offset)
                      if r.partition == p]
            assert in_log == sorted(in_log), f"partition {p}: order differs from production"
        segments = sorted((broker.data_dir / f"{TOPIC}-0").glob("*.log"))
        assert len(segments) > 1, "expected the stream to roll segments"
