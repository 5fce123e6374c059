"""The `oncelog` command, run as users run it, against a real broker process."""

from __future__ import annotations

from support.cli import broker, oncelog  # noqa: F401 (broker: a fixture)


def test_help_everywhere():
    for args in ([], ["broker"], ["topics"], ["topics", "create"], ["topics", "list"],
                 ["topics", "describe"], ["topics", "delete"], ["produce"], ["consume"],
                 ["dump-log"], ["transactions"], ["transactions", "list"],
                 ["transactions", "describe"], ["transactions", "describe-producers"],
                 ["transactions", "abort"]):
        out = oncelog(*args, "--help").stdout
        assert "usage: oncelog" in out


def test_version_and_the_bootstrap_server_from_the_environment(broker):  # noqa: F811
    import importlib.metadata

    assert oncelog("--version").stdout.strip() == \
        f"oncelog {importlib.metadata.version('oncelog')}"
    env = {"ONCELOG_BOOTSTRAP_SERVER": broker.bootstrap_servers}
    oncelog("topics", "create", "--topic", "from-env", env=env)
    assert "from-env" in oncelog("topics", "list", env=env).stdout.split()
    # --bootstrap-server still wins over the environment
    bad = {"ONCELOG_BOOTSTRAP_SERVER": "127.0.0.1:1"}
    assert "from-env" in oncelog("topics", "list", "--bootstrap-server",
                                 broker.bootstrap_servers, env=bad).stdout.split()


def test_a_partition_the_topic_lacks_is_an_error_for_consume_as_for_produce(broker):  # noqa: F811
    bs = ["--bootstrap-server", broker.bootstrap_servers]
    oncelog("topics", "create", *bs, "--topic", "two", "--partitions", "2")
    produce = oncelog("produce", *bs, "--topic", "two", "--partition", "5", stdin="x\n",
                      check=False)
    consume = oncelog("consume", *bs, "--topic", "two", "--partition", "5", "--timeout-ms",
                      "500", check=False)
    for bad in (produce, consume):
        assert bad.returncode == 1, bad.stderr
        assert "partition 5 of topic 'two' does not exist (it has 2)" in bad.stderr


def test_an_unknown_transaction_state_is_refused():
    bad = oncelog("transactions", "list", "--bootstrap-server", "127.0.0.1:1", "--state",
                  "Ongoin", check=False)
    assert bad.returncode == 2
    assert "invalid choice: 'Ongoin'" in bad.stderr and "'Ongoing'" in bad.stderr


def test_topics_produce_consume_round_trip(broker):  # noqa: F811 (the fixture)
    bs = ["--bootstrap-server", broker.bootstrap_servers]
    oncelog("topics", "create", *bs, "--topic", "orders", "--partitions", "2",
            "--config", "retention.ms=3600000")
    assert "orders" in oncelog("topics", "list", *bs).stdout.split()
    desc = oncelog("topics", "describe", *bs, "--topic", "orders").stdout
    assert "PartitionCount: 2" in desc and "retention.ms=3600000" in desc
    produced = oncelog("produce", *bs, "--topic", "orders", "--partition", "1",
                       "--key-separator", ":", "--compression-type", "lz4",
                       stdin="k1:first\nk2:second:with:colons\nk3:third\n")
    assert "Produced 3 records" in produced.stderr
    out = oncelog("consume", *bs, "--topic", "orders", "--from-beginning", "--max-messages",
                  "3", "--print-partition", "--print-offset", "--print-key").stdout.splitlines()
    # Kafka's DefaultMessageFormatter
    assert out == ["Partition:1\tOffset:0\tk1\tfirst",
                   "Partition:1\tOffset:1\tk2\tsecond:with:colons",
                   "Partition:1\tOffset:2\tk3\tthird"]
    # A line without the separator stops the producer, as Kafka's console producer does:
    # the lines before it are sent, the rest are not.
    refused = oncelog("produce", *bs, "--topic", "orders", "--partition", "0",
                      "--key-separator", ":", stdin="a:1\nnot keyed\nb:2\n", check=False)
    assert refused.returncode == 1
    assert "No key separator found on line number 2: 'not keyed'" in refused.stderr
    assert "Produced 1 records" in refused.stderr
    out = oncelog("consume", *bs, "--topic", "orders", "--partition", "0", "--from-beginning",
                  "--timeout-ms", "1500", "--print-key").stdout.splitlines()
    assert out == ["a\t1"]
    # starting from the end sees nothing old
    out = oncelog("consume", *bs, "--topic", "orders", "--timeout-ms", "500").stdout
    assert out == ""
    oncelog("topics", "delete", *bs, "--topic", "orders")
    assert "orders" not in oncelog("topics", "list", *bs).stdout.split()


def test_clear_errors(broker):  # noqa: F811 (the fixture)
    bs = ["--bootstrap-server", broker.bootstrap_servers]
    bad = oncelog("topics", "create", *bs, "--topic", "bad name", check=False)
    assert bad.returncode == 1 and "INVALID_TOPIC_EXCEPTION" in bad.stderr
    oncelog("topics", "create", *bs, "--topic", "twice")
    again = oncelog("topics", "create", *bs, "--topic", "twice", check=False)
    assert again.returncode == 1 and "TOPIC_ALREADY_EXISTS" in again.stderr
    conf = oncelog("topics", "create", *bs, "--topic", "c", "--config", "cleanup.policy=shred",
                   check=False)
    assert conf.returncode == 1 and "INVALID_CONFIG" in conf.stderr
    missing = oncelog("dump-log", "/nonexistent/0.log", check=False)
    assert missing.returncode == 2 and "no such file" in missing.stderr
    bad_setting = oncelog("broker", "--data-dir", str(broker.data_dir) + "-x", "--set",
                          "no.such.setting=1", check=False)
    assert bad_setting.returncode == 2 and "unknown broker setting" in bad_setting.stderr


def test_dump_log_prints_one_line_per_batch(broker):  # noqa: F811 (the fixture)
    bs = ["--bootstrap-server", broker.bootstrap_servers]
    oncelog("topics", "create", *bs, "--topic", "dumped")
    oncelog("produce", *bs, "--topic", "dumped", stdin="alpha\nbeta\n")
    oncelog("produce", *bs, "--topic", "dumped", "--compression-type", "gzip", stdin="gamma\n")
    seg = broker.data_dir / "dumped-0" / "00000000000000000000.log"
    out = oncelog("dump-log", str(seg), "--print-data").stdout.splitlines()
    batches = [line for line in out if line.startswith("baseOffset")]
    assert len(batches) == 2
    for field in ("baseOffset: 0", "lastOffset: 1", "count: 2", "baseSequence: 0",
                  "lastSequence: 1", "producerId:", "producerEpoch: 0",
                  "isTransactional: false", "isControl: false", "position: 0", "CreateTime:",
                  "size:", "magic: 2", "compresscodec: none", "crc:", "isvalid: true"):
        assert field in batches[0], field
    assert "compresscodec: gzip" in batches[1]
    payloads = [line for line in out if line.startswith("| offset")]
    assert [p.rsplit("payload: ", 1)[1] for p in payloads] == ["alpha", "beta", "gamma"]


def test_dump_log_reports_a_corrupt_batch(tmp_path):
    from oncelog.records import build_batch

    good = build_batch([(None, b"ok", [], 1)])
    bad = bytearray(build_batch([(None, b"no", [], 1)], base_offset=1))
    bad[-1] ^= 1
    seg = tmp_path / "00000000000000000000.log"
    seg.write_bytes(good + bytes(bad) + b"\x00" * 7)
    out = oncelog("dump-log", str(seg), check=False)
    assert out.returncode == 1
    lines = out.stdout.splitlines()
    assert lines[1] == "Log starting offset: 0"
    assert "isvalid: true" in lines[2] and "isvalid: false" in lines[3]
    assert lines[4].startswith("Found 7 invalid bytes at the end of 00000000000000000000.log")
    assert "trailing bytes" in lines[4]


def test_an_unreachable_broker_fails_at_once_naming_the_address():
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for args in (["topics", "list"], ["consume", "--topic", "t"],
                 ["transactions", "list"]):
        bad = oncelog(*args, "--bootstrap-server", f"127.0.0.1:{port}", check=False)
        assert bad.returncode == 1, bad.stderr
        assert f"connection refused to 127.0.0.1:{port}" in bad.stderr
    produce = oncelog("produce", "--topic", "t", "--bootstrap-server", f"127.0.0.1:{port}",
                      stdin="x\n", check=False)
    assert produce.returncode == 1 and "connection refused" in produce.stderr
    assert "does not exist" not in produce.stderr  # not a topic said missing
