"""Kafka Streams (Apache Kafka's own, 4.x) with processing.guarantee=exactly_once_v2 against an
oncelog broker, and against a real Kafka as the reference.

The application (tests/java/streams/StreamsCount.java, compiled here with javac against Kafka's
jars) counts its input's records by their value: a key other than the input's, so Streams
repartitions through an internal topic (and purges it with DeleteRecords), into a persistent
RocksDB store backed by a compacted changelog topic it creates itself (CreateTopics with
configs), and writes every update of a count to the output topic, in transactions (KIP-447).
Against oncelog it is SIGKILLed twice mid-run: restarted once on its state directory, once on an
empty one (so it restores the store from the changelog). Read with read_committed, the output is
exactly once: each key's counts are 1, 2, ..., n with none missing or repeated (caching is off, so
each input record makes one update), and the last is the number of input records with that value.
Each kill lands while a transaction holds output records, so the broker has aborted some (there is
more in the topic than read_committed reads). Then: the internal topics have the configs Streams
gave them, the repartition topic's start offsets have moved (DeleteRecords), `kafka-transactions
list` shows the application's transactional ids, and `kafka-streams-application-reset` resets it.

The same application and input against the session's Apache Kafka (no kills) give the same
output and the same checks. A longer run (ONCELOG_STREAMS_LONG=1) has two instances, one of them
SIGSTOPped past its session timeout (a zombie, fenced when it resumes).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

import pytest
from support.interop import unique_topic

from oncelog import Admin, Consumer, NewTopic, Producer, TopicPartition
from oncelog.client.admin.admin_configs import ConfigResource, ConfigSource
from oncelog.harness.broker_process import BrokerProcess

JAVA_DIR = Path(__file__).with_name("java") / "streams"
RECORDS = 900          # input records
KEYS = 6               # distinct values counted
PARTITIONS = 2         # of the input, output (and so repartition and changelog) topics
DELAY_MS = 5           # per record in the application: a run takes seconds, so a kill lands mid-run
DEADLINE_S = 60.0

SETTINGS = {"transaction.state.log.num.partitions": "3", "offsets.topic.num.partitions": "3",
            "group.initial.rebalance.delay.ms": "0", "group.min.session.timeout.ms": "1000"}


@pytest.fixture(scope="module")
def streams_classpath(kafka_jars: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    out = tmp_path_factory.mktemp("streams-classes")
    subprocess.run(["javac", "-d", str(out), "-cp", kafka_jars,
                    str(JAVA_DIR / "StreamsCount.java")], check=True, capture_output=True)
    return f"{kafka_jars}:{out}"


@pytest.fixture(scope="module")
def oncelog_broker(tmp_path_factory: pytest.TempPathFactory):
    with BrokerProcess(tmp_path_factory.mktemp("streams-broker") / "data",
                       settings=SETTINGS) as broker:
        yield broker


class StreamsApp:
    """One run of StreamsCount: a JVM of its own, its stdout read by a thread (the state lines
    it prints), its log kept in ``log``."""

    def __init__(self, classpath: str, bootstrap: str, app_id: str, input_topic: str,
                 output_topic: str, state_dir: Path, log: Path, delay_ms: int,
                 configs: dict[str, str] | None = None) -> None:
        self.log = log
        self.states: list[str] = []
        self._changed = threading.Condition()
        with open(log, "ab") as err:
            self.proc = subprocess.Popen(
                ["java", "-Xmx256m", "-Xms256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
                 f"-Dlog4j2.configurationFile={JAVA_DIR / 'log4j2.properties'}",
                 f"-Dstreams.log.level={os.environ.get('STREAMS_LOG_LEVEL', 'WARN')}",
                 "-cp", classpath, "StreamsCount", bootstrap, app_id, input_topic,
                 output_topic, str(state_dir), str(delay_ms),
                 *(f"{k}={v}" for k, v in (configs or {}).items())],
                stdout=subprocess.PIPE, stderr=err)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._changed:
                self.states.append(line.decode().strip())
                self._changed.notify_all()
        with self._changed:
            self.states.append("EXIT")
            self._changed.notify_all()

    def wait_running(self, timeout: float = DEADLINE_S) -> None:
        with self._changed:
            ok = self._changed.wait_for(
                lambda: "STATE RUNNING" in self.states or "EXIT" in self.states
                or "STATE ERROR" in self.states, timeout)
        assert ok and "STATE RUNNING" in self.states, (self.states, self.log.read_text()[-4000:])

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)
        self._reader.join(30)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()
        self._reader.join(30)

    def failed(self) -> bool:
        return any(s.startswith(("UNCAUGHT", "STATE ERROR")) for s in self.states)


def _input(n: int = RECORDS, keys: int = KEYS) -> list[tuple[bytes, bytes]]:
    return [(f"order-{i}".encode(), f"k{(i * 7 + i // keys) % keys}".encode()) for i in range(n)]


def _setup(bootstrap: str, input_topic: str, output_topic: str) -> Counter:
    with Admin(bootstrap_servers=bootstrap) as admin:
        admin.create_topics([NewTopic(input_topic, PARTITIONS, 1),
                             NewTopic(output_topic, PARTITIONS, 1)])
    records = _input()
    with Producer(bootstrap_servers=bootstrap, enable_idempotence=True) as producer:
        for key, value in records:
            producer.send(input_topic, value=value, key=key)
        producer.flush()
    return Counter(v.decode() for _, v in records)


def _read_committed(bootstrap: str, topic: str, isolation: str = "read_committed"
                    ) -> list[tuple[str, int]]:
    """Every committed (key, count) of the output, each partition in its order (or every one,
    aborted or committed, with ``isolation="read_uncommitted"``)."""
    with Consumer(bootstrap_servers=bootstrap, isolation_level=isolation) as c:
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        c.assign(tps)
        c.seek_to_beginning(*tps)
        ends = c.end_offsets(tps)
        out: list[tuple[str, int]] = []
        deadline = time.monotonic() + 30
        while any(c.position(tp) < ends[tp] for tp in tps):
            assert time.monotonic() < deadline, (out, ends)
            out.extend((r.key.decode(), int(r.value)) for r in c.poll(timeout=0.5)
                       if r.key is not None and r.value is not None)
        return out


def _wait_output(bootstrap: str, topic: str, at_least: int, app: StreamsApp) -> int:
    """Reads the output with read_committed (one consumer, so each poll is cheap) until it has
    ``at_least`` records; their number. Fails if the application stops or fails first."""
    with Consumer(bootstrap_servers=bootstrap, isolation_level="read_committed") as c:
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        c.assign(tps)
        c.seek_to_beginning(*tps)
        n = 0
        deadline = time.monotonic() + DEADLINE_S
        while n < at_least:
            assert not app.failed() and app.proc.poll() is None, (app.states,
                                                                  app.log.read_text()[-4000:])
            assert time.monotonic() < deadline, (n, at_least, app.log.read_text()[-4000:])
            n += len(c.poll(timeout=0.1))
        return n


def _kill_mid_transaction(bootstrap: str, topic: str, app: StreamsApp) -> None:
    """SIGKILLs the application while a transaction of its holds output records (a partition's
    last stable offset below its high watermark), so that the broker has to abort them."""
    with Consumer(bootstrap_servers=bootstrap) as uncommitted, \
            Consumer(bootstrap_servers=bootstrap, isolation_level="read_committed") as committed:
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        deadline = time.monotonic() + DEADLINE_S
        while True:
            assert app.proc.poll() is None and time.monotonic() < deadline, \
                "no open transaction seen while the application ran"
            high = uncommitted.end_offsets(tps)
            stable = committed.end_offsets(tps)
            if any(stable[tp] < high[tp] for tp in tps):
                app.kill()
                return


def _counts_by_key(output: list[tuple[str, int]]) -> dict[str, list[int]]:
    by_key: dict[str, list[int]] = defaultdict(list)
    for key, count in output:
        by_key[key].append(count)
    return dict(by_key)


def _check_exactly_once(output: list[tuple[str, int]], expected: Counter) -> None:
    by_key = _counts_by_key(output)
    assert sorted(by_key) == sorted(expected)
    for key, counts in by_key.items():
        # one update per input record, none lost, none repeated, in order
        assert counts == list(range(1, expected[key] + 1)), (key, counts)


# The configs Streams gives the internal topics it creates (InternalTopicManager): a broker must
# keep them all, as Kafka does, for Streams to find its topics as it made them on a restart.
CHANGELOG_CONFIGS = {"cleanup.policy": "compact", "message.timestamp.type": "CreateTime"}
REPARTITION_CONFIGS = {"cleanup.policy": "delete", "message.timestamp.type": "CreateTime",
                       "retention.ms": "-1", "segment.bytes": "52428800"}


def _check_internal_topics(bootstrap: str, app_id: str) -> None:
    """Streams created its internal topics with their configs (CreateTopics: the changelog
    compacted) and purged the repartition topic (DeleteRecords: its log start offsets moved
    past 0)."""
    changelog = ConfigResource.topic(f"{app_id}-counts-changelog")
    repartition = ConfigResource.topic(f"{app_id}-by-value-repartition")
    with Admin(bootstrap_servers=bootstrap) as admin:
        configs = admin.describe_configs([changelog, repartition])
    overrides = {r.name: {e.name: e.value for e in entries.values()
                          if e.source == ConfigSource.DYNAMIC_TOPIC_CONFIG}
                 for r, entries in configs.items()}
    assert overrides == {changelog.name: CHANGELOG_CONFIGS,
                         repartition.name: REPARTITION_CONFIGS}
    with Consumer(bootstrap_servers=bootstrap) as c:
        tps = [TopicPartition(repartition.name, p) for p in range(PARTITIONS)]
        deadline = time.monotonic() + DEADLINE_S
        while not all(start > 0 for start in c.beginning_offsets(tps).values()):
            assert time.monotonic() < deadline, c.beginning_offsets(tps)
            time.sleep(0.1)


def _transactional_ids(bootstrap: str, kafka_tools, app_id: str) -> dict[str, str]:
    """The application's transactional ids and their states, as ``kafka-transactions list``
    prints them (ListTransactions to every broker)."""
    out = kafka_tools.run("kafka-transactions", "--bootstrap-server", bootstrap, "list").check()
    header, *rows = (line.split() for line in out.stdout.splitlines() if line.strip())
    assert header == ["TransactionalId", "Coordinator", "ProducerId", "TransactionState"]
    return {row[0]: row[3] for row in rows if row[0].startswith(f"{app_id}-")}


def _check_reset(bootstrap: str, kafka_tools, app_id: str, input_topic: str) -> None:
    """kafka-streams-application-reset on the stopped application (its member left the group):
    the group's input offsets back to the start, its internal topics deleted."""
    changelog, repartition = f"{app_id}-counts-changelog", f"{app_id}-by-value-repartition"
    with Admin(bootstrap_servers=bootstrap) as admin:
        assert {changelog, repartition} <= set(admin.list_topics())
        committed = admin.list_consumer_group_offsets(app_id)
        assert sum(o or 0 for tp, o in committed.items() if tp.topic == input_topic) == RECORDS
        out = kafka_tools.run("kafka-streams-application-reset", "--bootstrap-server", bootstrap,
                              "--application-id", app_id, "--input-topics", input_topic)
        assert out.returncode == 0, (out.stdout, out.stderr)
        assert "Done." in out.stdout, out.stdout
        committed = admin.list_consumer_group_offsets(app_id)
        assert {o for tp, o in committed.items() if tp.topic == input_topic} == {0}
        assert not {changelog, repartition} & set(admin.list_topics())


def test_streams_exactly_once_v2_killed_twice_counts_each_record_once(
        oncelog_broker, streams_classpath, kafka_tools, tmp_path):
    bootstrap = oncelog_broker.bootstrap_servers
    app_id, input_topic, output_topic = (unique_topic("count"), unique_topic("orders"),
                                         unique_topic("counts"))
    expected = _setup(bootstrap, input_topic, output_topic)
    state_dir, log = tmp_path / "state", tmp_path / "streams.log"

    def start() -> StreamsApp:
        app = StreamsApp(streams_classpath, bootstrap, app_id, input_topic, output_topic,
                         state_dir, log, DELAY_MS)
        app.wait_running()
        return app

    # 1: killed a quarter of the way through
    app = start()
    try:
        done = _wait_output(bootstrap, output_topic, RECORDS // 4, app)
        _kill_mid_transaction(bootstrap, output_topic, app)
    finally:
        app.kill()
    assert done < RECORDS, "the first run was to be killed mid-run"
    # 2: restarted on its state directory, killed half way through
    app = start()
    try:
        done = _wait_output(bootstrap, output_topic, RECORDS // 2, app)
        _kill_mid_transaction(bootstrap, output_topic, app)
    finally:
        app.kill()
    assert done < RECORDS, "the second run was to be killed mid-run"
    # 3: restarted on an empty state directory: the store comes back from the changelog
    shutil.rmtree(state_dir)
    app = start()
    try:
        _wait_output(bootstrap, output_topic, RECORDS, app)
        _check_internal_topics(bootstrap, app_id)
    finally:
        app.stop()
    output = _read_committed(bootstrap, output_topic)
    _check_exactly_once(output, expected)
    # the kills left transactions open with output in them, which were aborted: there is more
    # in the topic than read_committed reads
    assert len(_read_committed(bootstrap, output_topic, "read_uncommitted")) > len(output)
    # its transactional ids (KIP-447: one per stream thread and process id; a new process id
    # on the empty state directory)
    ids = _transactional_ids(bootstrap, kafka_tools, app_id)
    assert len(ids) == 2, ids
    assert set(ids.values()) <= {"CompleteCommit", "CompleteAbort", "Empty"}, ids
    _check_reset(bootstrap, kafka_tools, app_id, input_topic)


def test_streams_exactly_once_v2_against_apache_kafka_gives_the_same_output(
        apache_kafka, streams_classpath, kafka_tools, tmp_path):
    app_id, input_topic, output_topic = (unique_topic("count"), unique_topic("orders"),
                                         unique_topic("counts"))
    expected = _setup(apache_kafka, input_topic, output_topic)
    app = StreamsApp(streams_classpath, apache_kafka, app_id, input_topic, output_topic,
                     tmp_path / "state", tmp_path / "streams.log", 0)
    try:
        app.wait_running()
        _wait_output(apache_kafka, output_topic, RECORDS, app)
        _check_internal_topics(apache_kafka, app_id)
    finally:
        app.stop()
    output = _read_committed(apache_kafka, output_topic)
    _check_exactly_once(output, expected)
    ids = _transactional_ids(apache_kafka, kafka_tools, app_id)
    assert len(ids) == 1, ids
    assert set(ids.values()) <= {"CompleteCommit", "CompleteAbort", "Empty"}, ids
    _check_reset(apache_kafka, kafka_tools, app_id, input_topic)


@pytest.mark.skipif(not os.environ.get("ONCELOG_STREAMS_LONG"),
                    reason="a long run (about a minute): ONCELOG_STREAMS_LONG=1 pytest "
                           "tests/test_kafka_streams.py -k zombie")
def test_streams_two_instances_one_stopped_as_a_zombie_counts_each_record_once(
        oncelog_broker, streams_classpath, tmp_path):
    """Two instances share the tasks (a rebalance of two static members); one is SIGSTOPped
    past its session timeout, the other takes its tasks over (restoring their stores from the
    changelog), and the stopped one, resumed, is fenced (its open transaction aborted by the
    coordinator's timeout: its epoch is bumped) and rejoins: the output is exactly once."""
    bootstrap = oncelog_broker.bootstrap_servers
    app_id, input_topic, output_topic = (unique_topic("count"), unique_topic("orders"),
                                         unique_topic("counts"))
    expected = _setup(bootstrap, input_topic, output_topic)
    apps = {name: StreamsApp(streams_classpath, bootstrap, app_id, input_topic, output_topic,
                             tmp_path / f"state-{name}", tmp_path / f"streams-{name}.log",
                             DELAY_MS, {"consumer.group.instance.id": f"{app_id}-{name}"})
            for name in ("a", "b")}
    zombie, survivor = apps["a"], apps["b"]
    try:
        for app in apps.values():
            app.wait_running()
        _wait_output(bootstrap, output_topic, RECORDS // 6, survivor)
        zombie.proc.send_signal(signal.SIGSTOP)
        # the survivor counts everything while the zombie is stopped: it took the zombie's
        # tasks over
        _wait_output(bootstrap, output_topic, RECORDS, survivor)
        zombie.proc.send_signal(signal.SIGCONT)
        with zombie._changed:  # the zombie rejoins: it goes through a rebalance again
            assert zombie._changed.wait_for(lambda: zombie.states.count("STATE RUNNING") >= 3,
                                            DEADLINE_S), zombie.states
    finally:
        for app in apps.values():
            app.proc.send_signal(signal.SIGCONT)
            app.stop()
    assert "fenced" in zombie.log.read_text()
    _check_exactly_once(_read_committed(bootstrap, output_topic), expected)
