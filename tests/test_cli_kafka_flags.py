"""The flags a Kafka user types on their first hour, through ``oncelog`` run as a command
against one broker process (shared by the module): kafka-topics.sh's and kafka-acls.sh's
action flags, --if-exists / --if-not-exists / --exclude-internal, describe's health filters,
the console tools' --producer-property / --producer.config / --consumer-property /
--consumer.config, --offset earliest|latest|N|-N|s@MS, --from-timestamp, kcat's -J, and a
usage error naming the subcommand."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime

import pytest
from support.cli import groups_broker, oncelog  # noqa: F401 (groups_broker: a fixture)

from oncelog import Admin, Producer, TopicPartition


@pytest.fixture(scope="module")
def bs(groups_broker):  # noqa: F811
    return ["--bootstrap-server", groups_broker.bootstrap_servers]


def _internal_topic_exists(bootstrap: str, topic: str) -> None:
    """A committed offset (of an existing topic's partition 0): the broker creates
    __consumer_offsets and writes a record there."""
    from oncelog import Consumer

    with Consumer(bootstrap_servers=bootstrap, group_id="makes-offsets-topic") as c:
        c.assign([TopicPartition(topic, 0)])
        c.commit({TopicPartition(topic, 0): 0})


@pytest.mark.slow  # 10 to 25 runs of the command, ~0.3 s each
def test_topics_action_flags_if_exists_if_not_exists_and_exclude_internal(bs):
    created = oncelog("topics", "--create", *bs, "--topic", "kt-list", "--partitions", "2")
    assert created.stdout == "Created topic kt-list.\n"
    again = oncelog("topics", "--create", *bs, "--topic", "kt-list", check=False)
    assert again.returncode == 1 and "TOPIC_ALREADY_EXISTS" in again.stderr
    quiet = oncelog("topics", "--create", *bs, "--topic", "kt-list", "--if-not-exists")
    assert quiet.stdout == "" and quiet.stderr == ""

    _internal_topic_exists(bs[1], "kt-list")
    listed = oncelog("topics", "--list", *bs).stdout.split()
    assert "kt-list" in listed and "__consumer_offsets" in listed  # Kafka's: included
    assert listed == sorted(listed)
    public = oncelog("topics", "--list", *bs, "--exclude-internal").stdout.split()
    assert "kt-list" in public and "__consumer_offsets" not in public
    described = oncelog("topics", "--describe", *bs, "--exclude-internal").stdout
    assert "Topic: kt-list\t" in described and "__consumer_offsets" not in described
    assert "Topic: __consumer_offsets\t" in oncelog("topics", "--describe", *bs).stdout

    for action, extra in (("--delete", []), ("--alter", ["--partitions", "3"]),
                          ("--describe", [])):
        missing = oncelog("topics", action, *bs, "--topic", "kt-none", *extra, check=False)
        assert missing.returncode == 1 and "UNKNOWN_TOPIC_OR_PARTITION" in missing.stderr, \
            (action, missing.stderr)
        skipped = oncelog("topics", action, *bs, "--topic", "kt-none", *extra, "--if-exists")
        assert (skipped.returncode, skipped.stdout, skipped.stderr) == (0, "", ""), action
    # an existing topic is still altered, described and deleted with --if-exists
    assert oncelog("topics", "--alter", *bs, "--topic", "kt-list", "--partitions", "3",
                   "--if-exists").stdout == "Topic kt-list now has 3 partitions.\n"
    assert "PartitionCount: 3" in oncelog("topics", "--describe", *bs, "--topic", "kt-list",
                                          "--if-exists").stdout
    oncelog("topics", "--delete", *bs, "--topic", "kt-list", "--if-exists")
    assert "kt-list" not in oncelog("topics", "--list", *bs).stdout.split()


def test_describe_health_filters_show_only_the_partitions_asked_for(bs):
    oncelog("topics", "create", *bs, "--topic", "kt-min1", "--partitions", "2",
            "--config", "min.insync.replicas=1")
    oncelog("topics", "create", *bs, "--topic", "kt-min2", "--config",
            "min.insync.replicas=2")
    topics = ["--topic", "kt-min1", "--topic", "kt-min2"]
    # one broker: every ISR is 1, every leader live
    at_min = oncelog("topics", "--describe", *bs, *topics, "--at-min-isr-partitions").stdout
    assert at_min.splitlines() == [
        "\tTopic: kt-min1\tPartition: 0\tLeader: 1\tReplicas: 1\tIsr: 1",
        "\tTopic: kt-min1\tPartition: 1\tLeader: 1\tReplicas: 1\tIsr: 1"]
    under_min = oncelog("topics", "--describe", *bs, *topics,
                        "--under-min-isr-partitions").stdout
    assert under_min.splitlines() == [
        "\tTopic: kt-min2\tPartition: 0\tLeader: 1\tReplicas: 1\tIsr: 1"]
    for healthy in ("--under-replicated-partitions", "--unavailable-partitions"):
        assert oncelog("topics", "--describe", *bs, *topics, healthy).stdout == ""
    overrides = oncelog("topics", "--describe", *bs, "--topics-with-overrides").stdout
    lines = overrides.splitlines()
    assert any(line.startswith("Topic: kt-min1\t") for line in lines)
    assert all(line.startswith("Topic: ") for line in lines)  # no partition lines
    oncelog("topics", "create", *bs, "--topic", "kt-plain")
    assert "kt-plain" not in overrides and "kt-plain" not in oncelog(
        "topics", "--describe", *bs, "--topics-with-overrides").stdout
    js = json.loads(oncelog("topics", "describe", *bs, *topics, "--under-min-isr-partitions",
                            "--output", "json").stdout)
    assert [(t["topic"], [p["partition"] for p in t["partitions"]]) for t in js] == [
        ("kt-min2", [0])]


def test_acls_take_kafka_acls_action_flags(bs):
    # No authorizer on this broker: each action reaches it (and is refused there), which a
    # flag not read as the action would not (argparse would stop with a usage error, exit 2)
    listed = oncelog("acls", "--list", *bs, check=False)
    assert listed.returncode == 1 and "SECURITY_DISABLED" in listed.stderr
    for flag, extra in (("--add", []), ("--remove", ["--force"])):
        out = oncelog("acls", flag, *bs, "--allow-principal", "User:al", "--operation", "Read",
                      "--topic", "t", *extra, check=False)
        assert out.returncode == 1 and "SECURITY_DISABLED" in out.stderr, out


def test_a_usage_error_prints_the_subcommands_usage(bs):
    out = oncelog("topics", "create", *bs, "--topic", "x", "--bogus", check=False)
    assert out.returncode == 2
    assert out.stderr.startswith("usage: oncelog topics create ")
    assert out.stderr.rstrip().endswith(
        "oncelog topics create: error: unrecognized arguments: --bogus")
    flagged = oncelog("topics", "--create", *bs, "--topic", "x", "--bogus", check=False)
    assert flagged.returncode == 2 and flagged.stderr.startswith("usage: oncelog topics create ")
    two = oncelog("topics", "--create", "--delete", *bs, "--topic", "x", check=False)
    assert two.returncode == 2 and two.stderr.startswith("usage: oncelog topics ")
    assert "exactly one action" in two.stderr
    consume = oncelog("consume", *bs, "--topic", "x", "--offset", "soon", check=False)
    assert consume.returncode == 2 and consume.stderr.startswith("usage: oncelog consume ")
    assert "The provided offset value 'soon' is incorrect" in consume.stderr
    # flags refused together: Kafka's printUsageAndThrow, before any connection
    together = oncelog("consume", "--bootstrap-server", "127.0.0.1:1", "--topic", "x",
                       "--group", "g", "--partition", "0", check=False)
    assert together.returncode == 2 and together.stderr.startswith("usage: oncelog consume ")
    assert together.stderr.rstrip().endswith(
        "error: Options group and partition cannot be specified together.")
    filters = oncelog("topics", "--describe", *bs, "--topics-with-overrides",
                      "--unavailable-partitions", check=False)
    assert filters.returncode == 2 and filters.stderr.startswith("usage: oncelog topics describe")
    groups = oncelog("groups", "--describe", *bs, "--group", "g", "--nope", check=False)
    assert groups.returncode == 2 and groups.stderr.startswith("usage: oncelog groups describe ")


# --- produce and consume -------------------------------------------------------------------


def test_producer_properties_and_config_file_reach_the_producer(bs, tmp_path):
    oncelog("topics", "create", *bs, "--topic", "kt-prod")
    config = tmp_path / "producer.properties"
    config.write_text("# as Kafka's tools read it\nmax.request.size=64\nlinger.ms=1\n")
    line = "x" * 200 + "\n"
    too_big = oncelog("produce", *bs, "--topic", "kt-prod", "--producer.config", str(config),
                      stdin=line, check=False)
    assert too_big.returncode == 1 and "MESSAGE_TOO_LARGE" in too_big.stderr, too_big.stderr
    too_big = oncelog("produce", *bs, "--topic", "kt-prod", "--producer-property",
                      "max.request.size=64", stdin=line, check=False)
    assert too_big.returncode == 1 and "MESSAGE_TOO_LARGE" in too_big.stderr, too_big.stderr
    # --producer-property wins over the file
    oncelog("produce", *bs, "--topic", "kt-prod", "--producer.config", str(config),
            "--producer-property", "max.request.size=1048576", stdin=line)
    unknown = oncelog("produce", *bs, "--topic", "kt-prod", "--producer-property",
                      "linger.msec=5", stdin=line, check=False)
    assert unknown.returncode == 2 and "unknown producer config 'linger.msec'" in unknown.stderr


def test_consumer_properties_and_config_file_reach_the_consumer(bs, tmp_path, groups_broker):  # noqa: F811
    boot = groups_broker.bootstrap_servers
    oncelog("topics", "create", *bs, "--topic", "kt-cons")
    with Producer(bootstrap_servers=boot) as p:
        p.send("kt-cons", b"committed", partition=0).result()
    with Producer(bootstrap_servers=boot, transactional_id="kt-open") as tp:
        tp.init_transactions()
        tp.begin_transaction()
        tp.send("kt-cons", b"open", partition=0).result()
        read = ["consume", *bs, "--topic", "kt-cons", "--from-beginning", "--timeout-ms", "1500"]
        committed = oncelog(*read, "--consumer-property", "isolation.level=read_committed")
        assert committed.stdout == "committed\n"
        # the flag, given, wins over the property
        assert oncelog(*read, "--consumer-property", "isolation.level=read_committed",
                       "--isolation-level", "read_uncommitted").stdout == "committed\nopen\n"
        tp.abort_transaction()
    config = tmp_path / "consumer.properties"
    config.write_text("group.id=kt-from-file\n")
    oncelog("consume", *bs, "--topic", "kt-cons", "--consumer.config", str(config),
            "--from-beginning", "--max-messages", "1")
    with Admin(bootstrap_servers=boot) as admin:
        offsets = admin.list_consumer_group_offsets("kt-from-file")
    assert offsets == {TopicPartition("kt-cons", 0): 1}  # the group the file named committed
    clash = oncelog("consume", *bs, "--topic", "kt-cons", "--consumer.config", str(config),
                    "--group", "other", check=False)
    assert clash.returncode == 2
    assert "Detected group ids: 'kt-from-file', 'other'" in clash.stderr
    reset = oncelog("consume", *bs, "--topic", "kt-cons", "--from-beginning",
                    "--consumer-property", "auto.offset.reset=latest", check=False)
    assert reset.returncode == 2 and "Can't simultaneously specify --from-beginning" in \
        reset.stderr


@pytest.mark.slow  # 10 to 25 runs of the command, ~0.3 s each
def test_offset_last_n_timestamp_and_kcat_json(bs, groups_broker):  # noqa: F811
    oncelog("topics", "create", *bs, "--topic", "kt-off", "--partitions", "2")
    # recent timestamps: records older than retention.ms would be deleted
    t0 = (int(time.time()) - 60) * 1000
    with Producer(bootstrap_servers=groups_broker.bootstrap_servers) as p:
        for value, ts in ((b"a", t0), (b"b", t0), (b"c", t0 + 1000), (b"d", t0 + 1000),
                          (b"e", t0 + 2000)):
            p.send("kt-off", value, partition=0, timestamp_ms=ts)
        p.send("kt-off", b"z", key=b"k", partition=1, timestamp_ms=t0 + 3000,
               headers=[("h", b"1"), ("n", None)]).result()
    iso = datetime.fromtimestamp(t0 / 1000 + 1, UTC).strftime("%Y-%m-%dT%H:%M:%S")

    def read(*flags: str, expect: int = 0) -> list[str]:
        """The first ``expect`` records the consumer prints (where it started decides which
        they are), or what it prints in 3 s of nothing when none is expected."""
        return oncelog("consume", *bs, "--topic", "kt-off", *flags, "--timeout-ms", "3000",
                       *(["--max-messages", str(expect)] if expect else [])
                       ).stdout.splitlines()

    assert read("--partition", "0", "--offset", "earliest", expect=5) == \
        ["a", "b", "c", "d", "e"]
    assert read("--partition", "0", "--offset", "3", expect=2) == ["d", "e"]
    assert read("--partition", "0", "--offset", "latest") == []
    # kcat's -o -2: the last two records of each partition (p1 has one)
    assert sorted(read("--offset", "-2", expect=3)) == ["d", "e", "z"]
    assert read("--partition", "0", "--offset", f"s@{t0 + 1000}", expect=3) == \
        ["c", "d", "e"]
    assert read("--partition", "0", "--from-timestamp", iso, expect=3) == ["c", "d", "e"]
    assert read("--partition", "0", "--from-timestamp", str(t0 + 1500), expect=1) == ["e"]
    # after every record: the end
    assert read("--partition", "0", "--from-timestamp", str(t0 + 9000)) == []
    (line,) = read("--partition", "1", "--offset", "earliest", "-J", expect=1)
    assert json.loads(line) == {"topic": "kt-off", "partition": 1, "offset": 0,
                                "tstype": "create", "ts": t0 + 3000, "broker": 1,
                                "headers": ["h", "1", "n", None], "key": "k", "payload": "z"}
    plain = json.loads(read("--partition", "0", "--offset", "4", "--json", expect=1)[0])
    assert "headers" not in plain and plain["key"] is None and plain["payload"] == "e"
    both = oncelog("consume", *bs, "--topic", "kt-off", "--offset", "1", "--from-timestamp",
                   "5", check=False)
    assert both.returncode == 2 and "cannot be specified together" in both.stderr


def test_include_never_matches_internal_topics_and_takes_exclude_internal(bs, groups_broker):  # noqa: F811
    oncelog("topics", "create", *bs, "--topic", "kt-inc")
    with Producer(bootstrap_servers=groups_broker.bootstrap_servers) as p:
        p.send("kt-inc", b"mine").result()
    _internal_topic_exists(bs[1], "kt-inc")  # and a record in it
    pattern = ["--include", "kt-inc|__consumer_offsets", "--from-beginning",
               "--timeout-ms", "3000"]
    # as Kafka's consumer with exclude.internal.topics=true (its default): with the flag of
    # Kafka's older console consumer or without it
    for flag in (["--exclude-internal"], []):
        assert oncelog("consume", *bs, *pattern, *flag).stdout == "mine\n"
    alone = oncelog("consume", *bs, "--topic", "kt-inc", "--exclude-internal", check=False)
    assert alone.returncode == 2 and "--exclude-internal goes with --include" in alone.stderr


# --- groups reset-offsets ------------------------------------------------------------------


@pytest.mark.slow  # 10 to 25 runs of the command, ~0.3 s each
def test_reset_offsets_by_duration_export_and_from_file(bs, groups_broker, tmp_path):  # noqa: F811
    boot = groups_broker.bootstrap_servers
    oncelog("topics", "create", *bs, "--topic", "kt-reset", "--partitions", "2")
    now = int(time.time() * 1000)
    with Producer(bootstrap_servers=boot) as p:
        for partition in (0, 1):
            for ts in (now - 7_200_000, now - 7_200_000, now - 600_000, now - 600_000):
                p.send("kt-reset", b"r", partition=partition, timestamp_ms=ts)
    tps = [TopicPartition("kt-reset", 0), TopicPartition("kt-reset", 1)]
    with Admin(bootstrap_servers=boot) as admin:
        for group in ("kt-g1", "kt-g2"):
            admin.alter_consumer_group_offsets(group, dict.fromkeys(tps, 4))
    reset = ["groups", "--reset-offsets", *bs, "--topic", "kt-reset"]
    # an hour ago: after the two old records of each partition
    plan = oncelog(*reset, "--group", "kt-g1", "--by-duration", "PT1H", "--export").stdout
    assert plan.splitlines() == ["kt-reset,0,2", "kt-reset,1,2"]
    three_hours = oncelog(*reset, "--group", "kt-g1", "--by-duration", "PT3H", "--export")
    assert three_hours.stdout.splitlines() == ["kt-reset,0,0", "kt-reset,1,0"]
    both = oncelog(*reset, "--group", "kt-g1", "--group", "kt-g2", "--to-offset", "1",
                   "--export").stdout
    assert sorted(both.splitlines()) == ["kt-g1,kt-reset,0,1", "kt-g1,kt-reset,1,1",
                                         "kt-g2,kt-reset,0,1", "kt-g2,kt-reset,1,1"]
    bad = oncelog(*reset, "--group", "kt-g1", "--by-duration", "1 hour", check=False)
    assert bad.returncode == 2 and "ISO-8601 duration" in bad.stderr

    csv = tmp_path / "plan.csv"
    csv.write_text("kt-reset,0,3\nkt-reset,1,1\n")
    with Admin(bootstrap_servers=boot) as admin:
        assert admin.list_consumer_group_offsets("kt-g1") == dict.fromkeys(tps, 4)  # a dry run
        oncelog("groups", "--reset-offsets", *bs, "--group", "kt-g1", "--from-file", str(csv),
                "--execute")
        assert admin.list_consumer_group_offsets("kt-g1") == {tps[0]: 3, tps[1]: 1}
        csv.write_text(both)  # what --export wrote for two groups, read back
        oncelog("groups", "--reset-offsets", *bs, "--group", "kt-g1", "--group", "kt-g2",
                "--from-file", str(csv), "--execute")
        for group in ("kt-g1", "kt-g2"):
            assert admin.list_consumer_group_offsets(group) == dict.fromkeys(tps, 1)
    wrong = oncelog("groups", "--reset-offsets", *bs, "--group", "kt-g1", "--from-file",
                    str(csv), check=False)  # four columns for one group
    assert wrong.returncode == 2 and "expected topic,partition,offset" in wrong.stderr


# --- cluster info --------------------------------------------------------------------------


def test_cluster_info_names_the_cluster_its_brokers_features_and_api_versions(bs, groups_broker):  # noqa: F811
    from oncelog.protocol.apis import SUPPORTED_VERSIONS, ApiKey

    with Admin(bootstrap_servers=groups_broker.bootstrap_servers) as admin:
        cluster_id = admin.describe_cluster().cluster_id
    host, port = groups_broker.bootstrap_servers.rsplit(":", 1)
    info = json.loads(oncelog("cluster", "info", *bs, "--output", "json").stdout)
    assert info["cluster_id"] == cluster_id and cluster_id
    assert info["controller_id"] == 1
    assert [{k: b[k] for k in ("id", "host", "port", "rack")} for b in info["brokers"]] == [
        {"id": 1, "host": host, "port": int(port), "rack": None}]
    # KIP-890's transaction.version: the broker finalizes its level (2 by default)
    assert info["finalized_features"] == {
        "transaction.version": {"min_version_level": 2, "max_version_level": 2}}
    assert info["supported_features"]["transaction.version"]["max_version"] == 2
    versions = {v["name"]: v for v in info["brokers"][0]["api_versions"]}
    produce = versions["Produce"]
    assert produce["api_key"] == 0 and produce["usable"] == \
        f"usable: {min(SUPPORTED_VERSIONS[ApiKey.PRODUCE][1], produce['max_version'])}"
    assert "ApiVersions" in versions and "InitProducerId" in versions
    text = oncelog("cluster", "info", *bs).stdout.splitlines()
    assert text[:4] == [f"Cluster ID: {cluster_id}", "Controller: 1", "Brokers:",
                        f"\tid: 1\t{host}:{port}\track: null"]
    assert f"{host}:{port} (id: 1 rack: null) -> (" in text
    assert (f"\tProduce(0): {produce['min_version']} to {produce['max_version']} "
            f"[{produce['usable']}],") in text
