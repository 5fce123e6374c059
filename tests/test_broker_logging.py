"""The broker's log as an operator reads it (issue 29): the internal topics' partitions loaded
at a start are one summary line, not one per partition; a client hanging up in the middle of a
fetch is no WARNING; topic, config and ACL changes are logged with who asked; no Python reprs
(``ISR (1,)``, ``frozenset(``, ``<Enum.``); ``--log-file``, ``--log-format json`` and
``--log-config`` (Python's dictConfig / fileConfig) put it where and how the operator wants."""

from __future__ import annotations

import json
import re
import socket
import struct
import uuid
from pathlib import Path

import pytest
from support.raw_wire import RawConnection, create_topics_request, fetch_request, produce
from support.security import creds, sasl_config
from support.waiting import wait_until

from oncelog import Admin, NewTopic, Producer
from oncelog.client.admin.admin_configs import AlterConfigOp, ConfigResource
from oncelog.harness.broker_process import BrokerProcess
from oncelog.protocol import ApiKey, encode_request, make, request_module
from oncelog.records import build_batch
from oncelog.security.acls import (
    AclBinding,
    AclFilter,
    Operation,
    PatternType,
    Permission,
    ResourceType,
)

# What a Python repr looks like in a message: a tuple ("(1,)", "(1, 2)"), a set or frozenset,
# an enum member ("<Permission.ALLOW: 3>"), a dataclass ("AclBinding(").
REPRS = re.compile(r"\(\d+,\)|\(\d+(, \d+)+\)|frozenset\(|\bset\(|\{\d+(, \d+)*\}"
                   r"|<\w+\.\w+: [^>]*>|\w+Binding\(|\(\('")


class LoggingBroker(BrokerProcess):
    """A broker process started with extra command-line flags."""

    def __init__(self, *args, flags: list[str], **kw) -> None:
        super().__init__(*args, **kw)
        self.flags = flags

    def command(self) -> list[str]:
        return [*super().command(), *self.flags]


def starts(log_path: Path) -> list[list[str]]:
    """The broker's stderr, one list of lines per start (the harness marks each)."""
    out: list[list[str]] = []
    for line in log_path.read_text(errors="replace").splitlines():
        if line.startswith("--- start #"):
            out.append([])
        elif out:
            out[-1].append(line)
    return out


def find_coordinator(conn: RawConnection, key: str, key_type: int) -> int:
    mod = request_module(ApiKey.FIND_COORDINATOR, 3)
    return conn.request(make(mod.FindCoordinatorRequest, key=key, key_type=key_type)).error_code


def assert_no_reprs(lines: list[str]) -> None:
    bad = [line for line in lines if REPRS.search(line)]
    assert not bad, bad


def test_the_internal_topics_are_one_line_per_start(tmp_path):
    with BrokerProcess(tmp_path / "data") as broker:
        with RawConnection(broker.bootstrap_servers) as conn:
            # The first FindCoordinators create __consumer_offsets and __transaction_state.
            wait_until(lambda: find_coordinator(conn, "g", 0) == 0, 30, "a group coordinator")
            wait_until(lambda: find_coordinator(conn, "t", 1) == 0, 30, "a txn coordinator")
        broker.restart()
        broker.restart()
    runs = starts(broker.log_path)
    assert len(runs) == 3
    internal = re.compile(r"(__consumer_offsets|__transaction_state)-\d+")
    for lines in runs[1:]:
        summaries = [line for line in lines if " loaded " in line]
        assert len(summaries) == 1, lines
        assert re.search(r"INFO oncelog\.replication: loaded 50 partitions of __consumer_offsets "
                         r"\(0 groups\) and 50 of __transaction_state \(0 transactional ids\) "
                         r"in \d+\.\d\d s$", summaries[0]), summaries[0]
        assert not [line for line in lines if internal.search(line)], lines
    assert_no_reprs([line for lines in runs for line in lines])


def _close_mid_fetch(bootstrap: str, topic: str) -> None:
    """Ask for the whole partition, read a little of the answer, then hang up with a reset
    (SO_LINGER 0), as a client killed in the middle of a fetch does."""
    host, port = bootstrap.rsplit(":", 1)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 32 * 1024)  # before connect: a small
    sock.settimeout(10)                                            # window, so the send stalls
    sock.connect((host, int(port)))
    sock.sendall(encode_request(1, "mid-fetch", fetch_request(topic, 0, 0, max_bytes=1 << 26)))
    got = b""
    while len(got) < 64 * 1024:
        chunk = sock.recv(64 * 1024)
        assert chunk, "the broker closed the connection"
        got += chunk
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def test_a_client_closing_mid_fetch_is_debug_not_a_warning(tmp_path):
    # DEBUG for the network logger, so that the test sees the broker notice the hang-ups.
    with BrokerProcess(tmp_path / "data", env={"ONCELOG_LOG_LEVEL": "oncelog.network=DEBUG"}
                       ) as broker, RawConnection(broker.bootstrap_servers) as conn:
        assert conn.request(create_topics_request("big")).topics[0].error_code == 0
        value = bytes(900 * 1024)
        for i in range(12):  # 10.8 MB, more than the socket buffers on both sides hold
            assert produce(conn, "big", 0, build_batch([(None, value, [], i)])).error_code == 0
        for _ in range(5):
            _close_mid_fetch(broker.bootstrap_servers, "big")
        wait_until(lambda: broker.log_path.read_text().count(
            "a fetched record set could not be sent") >= 5, 30, "the broker to notice")
    lines = starts(broker.log_path)[0]
    closes = [line for line in lines if "could not be sent" in line]
    assert closes and all(" DEBUG oncelog.network: " in line for line in closes), closes
    assert not [line for line in lines if " WARNING " in line], lines


def test_changes_are_logged_with_who_asked_as_json_in_a_file(tmp_path):
    log_file = tmp_path / "broker.json.log"
    with LoggingBroker(tmp_path / "data", settings=sasl_config(tmp_path),
                       flags=["--log-file", str(log_file), "--log-format", "json"]) as broker:
        admin_creds = creds("admin")
        with Admin(bootstrap_servers=broker.bootstrap_servers, **admin_creds) as admin:
            admin.create_topics([NewTopic("audited", num_partitions=1,
                                          config={"retention.ms": "3600000"})])
            admin.create_partitions({"audited": 3})
            admin.incremental_alter_configs(
                {ConfigResource.topic("audited"): [AlterConfigOp("retention.ms", "7200000")]})
            binding = AclBinding(ResourceType.TOPIC, "audited", PatternType.LITERAL,
                                 "User:alice", "*", Operation.READ, Permission.ALLOW)
            admin.create_acls([binding])
            admin.delete_acls([AclFilter(ResourceType.TOPIC, "audited", PatternType.LITERAL,
                                         "User:alice", None, Operation.READ, Permission.ALLOW)])
            admin.delete_topics(["audited"])
        with Producer(bootstrap_servers=broker.bootstrap_servers, transactional_id="tx",
                      **admin_creds) as p:
            admin_topic = f"t-{uuid.uuid4().hex[:6]}"
            with Admin(bootstrap_servers=broker.bootstrap_servers, **admin_creds) as admin:
                admin.create_topics([NewTopic(admin_topic, num_partitions=2)])
            p.init_transactions()
            for commit in (True, False):
                p.begin_transaction()
                for i in range(4):
                    p.send(admin_topic, b"v%d" % i, partition=i % 2)
                p.commit_transaction() if commit else p.abort_transaction()
    records = [json.loads(line) for line in log_file.read_text().splitlines()]
    assert records and all(set(r) >= {"time", "level", "logger", "message"} for r in records)
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", r["time"])
               for r in records)
    by = "by User:admin from 127.0.0.1:"
    changes = [r["message"] for r in records if r["logger"] == "oncelog.broker.admin"
               and r["level"] == "INFO"]
    expected = [
        "topic audited created (1 partition, replication factor 1, retention.ms=3600000) " + by,
        "topic audited: partitions increased to 3 " + by,
        "configs of topic audited changed (retention.ms=7200000) " + by,
        "ACL added: User:alice Allow Read on Topic 'audited' (Literal, host *), " + by,
        "ACL deleted: User:alice Allow Read on Topic 'audited' (Literal, host *), " + by,
        "topic audited deleted " + by,
        f"topic {admin_topic} created (2 partitions, replication factor 1) " + by,
    ]
    assert len(changes) == len(expected), changes
    for message, start in zip(changes, expected, strict=True):
        assert message.startswith(start), (message, start)
    # Nothing went to stderr but the banner's companions (the harness's own lines).
    stderr = starts(broker.log_path)[0]
    assert not [line for line in stderr if " INFO " in line or " WARNING " in line], stderr
    assert_no_reprs([r["message"] for r in records])


@pytest.mark.parametrize("form", ["json", "ini"])
def test_log_config_takes_pythons_logging_configuration(tmp_path, form):
    target = tmp_path / "configured.log"
    if form == "json":
        config = tmp_path / "logging.json"
        config.write_text(json.dumps({
            "version": 1,
            "formatters": {"f": {"format": "CONFIGURED %(levelname)s %(name)s %(message)s"}},
            "handlers": {"h": {"class": "logging.FileHandler", "filename": str(target),
                               "formatter": "f"}},
            "root": {"level": "INFO", "handlers": ["h"]}}))
    else:
        config = tmp_path / "logging.ini"
        config.write_text(
            "[loggers]\nkeys=root\n\n[handlers]\nkeys=h\n\n[formatters]\nkeys=f\n\n"
            "[logger_root]\nlevel=INFO\nhandlers=h\n\n"
            f"[handler_h]\nclass=FileHandler\nformatter=f\nargs=({str(target)!r},)\n\n"
            "[formatter_f]\nformat=CONFIGURED %(levelname)s %(name)s %(message)s\n")
    with LoggingBroker(tmp_path / "data", flags=["--log-config", str(config)]) as broker, \
            RawConnection(broker.bootstrap_servers) as conn:
        assert conn.request(create_topics_request("configured")).topics[0].error_code == 0
    lines = target.read_text().splitlines()
    assert any(line.startswith("CONFIGURED INFO oncelog.broker.admin topic configured created")
               for line in lines), lines


def test_a_log_config_that_cannot_be_used_is_named(tmp_path):
    bad = tmp_path / "logging.json"
    bad.write_text('{"version": 1, "handlers": {"h": {"class": "no.such.Handler"}}}')
    broker = LoggingBroker(tmp_path / "data", flags=["--log-config", str(bad)])
    broker.launch()
    assert broker.proc is not None
    assert broker.proc.wait(30) == 2
    assert f"oncelog broker: --log-config {bad}: " in broker.log_path.read_text()


def test_no_reprs_in_a_clusters_logs_through_failover_and_transactions(zookeeper_server,
                                                                      tmp_path):
    """Three brokers on ZooKeeper: a topic of three replicas, a transaction, a follower stopped
    (the controller takes it out of the ISR) and started again (the leader takes it back in),
    the leader stopped (a new leader):
    every line the brokers logged is free of Python reprs, and ISRs read as Kafka's do."""
    pytest.importorskip("kazoo")
    from oncelog.harness.local_cluster import LocalCluster

    cluster = LocalCluster(tmp_path / "cluster", 3,
                           zookeeper=f"{zookeeper_server.connect_string}/logs-"
                                     f"{uuid.uuid4().hex[:8]}",
                           broker_settings={"replica.lag.time.max.ms": 2000,
                                            "zookeeper.session.timeout.ms": 4000,
                                            "offsets.topic.num.partitions": 3,
                                            "transaction.state.log.num.partitions": 3},
                           die_with_parent=True)
    cluster.start()
    try:
        with Admin(bootstrap_servers=cluster.bootstrap_servers) as admin:
            admin.create_topics([NewTopic("replicated", 1, replication_factor=3)])
        cluster.wait_for_isr("replicated", 0, 3)
        with Producer(bootstrap_servers=cluster.bootstrap_servers, transactional_id="cl",
                      acks="all") as p:
            p.init_transactions()
            p.begin_transaction()
            p.send("replicated", b"a", partition=0)
            p.commit_transaction()
        leader = cluster.leader_of("replicated", 0)
        follower = next(n for n in (1, 2, 3) if n != leader)
        cluster.stop_broker(follower)
        cluster.wait_for_isr("replicated", 0, 2)
        cluster.start_broker(follower)
        cluster.wait_for_isr("replicated", 0, 3)
        cluster.stop_broker(leader)
        cluster.wait_for_leader("replicated", 0, not_on=leader)
    finally:
        cluster.stop()
    lines = [line for b in cluster.brokers.values()
             for line in b.log_path.read_text(errors="replace").splitlines()]
    assert_no_reprs(lines)
    isr_lines = [line for line in lines if " ISR " in line]
    assert any(re.search(r"ISR \[\d,\d\] -> \[\d,\d,\d\]$", line) for line in isr_lines), \
        isr_lines  # the follower back in sync
    assert all(re.search(r"ISR \[\d(,\d)*\]", line) for line in isr_lines), isr_lines
