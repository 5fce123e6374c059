"""Kafka's own kafka-acls on a SASL broker: oncelog (SASL/PLAIN users, an authorizer,
super.users=User:admin) beside a real Kafka with a SASL_PLAINTEXT listener and its
StandardAuthorizer. The same --add/--list/--remove commands (topics, groups, transactional ids,
the cluster, --producer/--consumer, prefixed patterns, allow and deny) give the same listing on
both, and the ACLs take effect: a denied user's kafka-console-producer is refused with
TOPIC_AUTHORIZATION_FAILED on both, an allowed one writes."""

from __future__ import annotations

import re

import pytest
from support.interop import unique_topic
from support.security import USERS, sasl_config

from oncelog.harness.apache_kafka import ApacheKafka, kafka_sh
from oncelog.harness.broker_process import BrokerProcess

pytestmark = pytest.mark.slow

JAAS = "org.apache.kafka.common.security.plain.PlainLoginModule required"


@pytest.fixture(scope="module")
def kafka_sasl(tmp_path_factory, kafka_jars):
    kafka = ApacheKafka(tmp_path_factory.mktemp("kafka-sasl"), heap="384M")
    node = kafka.nodes[0]
    users = " ".join(f'user_{u}="{p}"' for u, p in USERS.items())
    kafka.settings.update({
        "listeners": f"SASL_PLAINTEXT://127.0.0.1:{node.port},"
                     f"CONTROLLER://127.0.0.1:{node.controller_port}",
        "advertised.listeners": f"SASL_PLAINTEXT://127.0.0.1:{node.port}",
        "inter.broker.listener.name": "SASL_PLAINTEXT",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT",
        "sasl.enabled.mechanisms": "PLAIN",
        "sasl.mechanism.inter.broker.protocol": "PLAIN",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config":
            f'{JAAS} username="admin" password="{USERS["admin"]}" {users};',
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        # the controller listener stays PLAINTEXT: its principal is ANONYMOUS
        "super.users": "User:admin;User:ANONYMOUS",
    })
    with kafka:
        yield kafka.bootstrap_servers


@pytest.fixture(scope="module")
def oncelog_sasl(tmp_path_factory):
    d = tmp_path_factory.mktemp("oncelog-sasl")
    settings = {**sasl_config(d), "authorizer.class.name":
                "org.apache.kafka.metadata.authorizer.StandardAuthorizer"}
    with BrokerProcess(d / "data", settings=settings, die_with_parent=True) as broker:
        yield broker.bootstrap_servers


@pytest.fixture(scope="module")
def configs(tmp_path_factory):
    """--command-config / --producer.config files, one per user."""
    d = tmp_path_factory.mktemp("sasl-clients")
    out = {}
    for user, password in USERS.items():
        path = d / f"{user}.properties"
        path.write_text("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\n"
                        f'sasl.jaas.config={JAAS} username="{user}" password="{password}";\n')
        out[user] = str(path)
    return out


@pytest.fixture
def both(kafka_sasl, oncelog_sasl):
    return {"kafka": kafka_sasl, "oncelog": oncelog_sasl}


def acls(kafka_tools, bs: str, config: str, *args: str):
    return kafka_tools.run("kafka-acls", "--bootstrap-server", bs, "--command-config", config,
                           *args)


def listing(text: str, names: dict[str, str]) -> dict[str, list[str]]:
    """kafka-acls --list output: {resource pattern: sorted ACL lines}, our names replaced by
    their roles, only the resources named in ``names``."""
    for real, role in names.items():
        text = text.replace(real, role)
    out: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        m = re.match(r"Current ACLs for resource `(.*)`:", line)
        if m:
            current = m.group(1)
            out.setdefault(current, [])
        elif line.strip() and current is not None:
            out[current].append(line.strip())
    return {k: sorted(v) for k, v in out.items()
            if any(role in k for role in names.values()) or "kafka-cluster" in k}


def test_acls_added_listed_and_removed_as_on_kafka(both, kafka_tools, configs):
    admin = configs["admin"]
    base = unique_topic("acl")
    names = {f"{base}-topic": "TOPIC", f"{base}-group": "GROUP", f"{base}-tx": "TXN",
             f"{base}-pfx": "PREFIX", f"{base}-prod": "PRODTOPIC", f"{base}-ptx": "PRODTXN",
             f"{base}-cgrp": "CONSGROUP"}
    adds = [
        ["--allow-principal", "User:alice", "--operation", "Read", "--operation", "Write",
         "--topic", f"{base}-topic"],
        ["--deny-principal", "User:bob", "--operation", "Write", "--topic", f"{base}-topic"],
        ["--allow-principal", "User:alice", "--operation", "Read", "--group", f"{base}-group"],
        ["--allow-principal", "User:alice", "--operation", "Write", "--transactional-id",
         f"{base}-tx"],
        ["--allow-principal", "User:alice", "--operation", "Describe", "--cluster"],
        ["--allow-principal", "User:alice", "--allow-host", "127.0.0.1", "--operation", "Read",
         "--topic", f"{base}-pfx", "--resource-pattern-type", "prefixed"],
        ["--producer", "--allow-principal", "User:bob", "--topic", f"{base}-prod",
         "--transactional-id", f"{base}-ptx"],
        ["--consumer", "--allow-principal", "User:bob", "--topic", f"{base}-prod",
         "--group", f"{base}-cgrp"],
    ]
    seen: dict[str, dict] = {}
    for name, bs in both.items():
        s = seen[name] = {}
        s["adds"] = []
        for args in adds:
            r = acls(kafka_tools, bs, admin, "--add", *args).check()
            s["adds"].append(listing(r.stdout, names))
        s["all"] = listing(acls(kafka_tools, bs, admin, "--list").check().stdout, names)
        s["topic"] = listing(acls(kafka_tools, bs, admin, "--list", "--topic",
                                  f"{base}-topic").check().stdout, names)
        s["bob"] = listing(acls(kafka_tools, bs, admin, "--list", "--principal",
                                "User:bob").check().stdout, names)
        s["prefixed"] = listing(acls(kafka_tools, bs, admin, "--list", "--topic", f"{base}-pfx",
                                     "--resource-pattern-type", "prefixed").check().stdout,
                                names)
        s["match"] = listing(acls(kafka_tools, bs, admin, "--list", "--topic",
                                  f"{base}-pfx-x", "--resource-pattern-type", "match"
                                  ).check().stdout, names)
        # --remove (--force: no question asked) of one operation, then of the cluster's
        acls(kafka_tools, bs, admin, "--remove", "--force", "--allow-principal", "User:alice",
             "--operation", "Write", "--topic", f"{base}-topic").check()
        acls(kafka_tools, bs, admin, "--remove", "--force", "--allow-principal", "User:alice",
             "--operation", "Describe", "--cluster").check()
        s["after"] = listing(acls(kafka_tools, bs, admin, "--list").check().stdout, names)
        # not a super user: refused, as Kafka refuses it
        r = acls(kafka_tools, bs, configs["alice"], "--list")
        s["refused"] = ("ClusterAuthorizationException" in r.stdout + r.stderr)
        # DescribeLogDirs needs Describe on the cluster (KIP-113), which alice no longer has
        r = kafka_tools.run("kafka-log-dirs", "--bootstrap-server", bs, "--command-config",
                            configs["alice"], "--describe")
        s["log-dirs refused"] = (r.returncode, "ClusterAuthorizationException" in
                                 r.stdout + r.stderr)
    for key in ("adds", "all", "topic", "bob", "prefixed", "match", "after", "refused",
                "log-dirs refused"):
        assert seen["oncelog"][key] == seen["kafka"][key], key
    k = seen["kafka"]
    assert "(principal=User:bob, host=*, operation=WRITE, permissionType=DENY)" in \
        k["topic"]["ResourcePattern(resourceType=TOPIC, name=TOPIC, patternType=LITERAL)"]
    assert "ResourcePattern(resourceType=CLUSTER, name=kafka-cluster, patternType=LITERAL)" \
        in k["all"]
    assert any("PREFIXED" in r for r in k["match"]) and k["refused"] is True
    assert k["log-dirs refused"] == (1, True)
    assert "ResourcePattern(resourceType=CLUSTER, name=kafka-cluster, patternType=LITERAL)" \
        not in k["after"]


def test_acls_take_effect_on_the_console_producer(both, kafka_tools, configs):
    topic = unique_topic("acl-effect")
    for name, bs in both.items():
        kafka_tools.run("kafka-topics", "--bootstrap-server", bs, "--command-config",
                        configs["admin"], "--create", "--topic", topic).check()
        for args in (["--allow-principal", "User:alice", "--operation", "Write",
                      "--operation", "Describe"],
                     ["--deny-principal", "User:bob", "--operation", "Write"],
                     ["--allow-principal", "User:bob", "--operation", "Describe"]):
            acls(kafka_tools, bs, configs["admin"], "--add", *args, "--topic", topic).check()
        ok = kafka_tools.run("kafka-console-producer", "--bootstrap-server", bs, "--topic",
                             topic, "--command-config", configs["alice"], input="a1\na2\n")
        assert ok.returncode == 0 and "Exception" not in ok.stderr, (name, ok)
        # in a JVM of its own: the producer's error is logged (log4j to the JVM's stderr)
        denied = kafka_sh("kafka-console-producer", "--bootstrap-server", bs, "--topic", topic,
                          "--command-config", configs["bob"], input=b"b1\n", timeout=120)
        # refused on the topic (Produce), or first on its producer id (InitProducerId: the
        # idempotent producer's IdempotentWrite, which KIP-679 grants with Write on any topic,
        # and bob has none): which comes first is a race in Kafka's client, on both brokers
        err = denied.stderr.decode()
        assert (f"TopicAuthorizationException: Not authorized to access topics: [{topic}]" in err
                or "ClusterAuthorizationException: Cluster authorization failed" in err), \
            (name, denied)
        read = kafka_tools.run("kafka-console-consumer", "--bootstrap-server", bs, "--topic",
                               topic, "--command-config", configs["admin"],
                               "--from-beginning", "--max-messages", "2").check()
        assert sorted(read.stdout.split()) == ["a1", "a2"], name
