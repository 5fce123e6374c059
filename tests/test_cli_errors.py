"""What the ``oncelog`` command says when something goes wrong, run as users run it against a
real broker: Kafka's error name and a sentence, never a traceback, a repr or one of our class
names; a command that waits shows its retries on stderr."""

from __future__ import annotations

import re
import subprocess
import threading
import time

import pytest
from support.cli import ONCELOG, help_text, oncelog

from oncelog.harness.broker_process import BrokerProcess

# What must never reach a user: Python's own words and our internals.
INTERNALS = re.compile(r"Traceback|File \"|invalid literal for int\(\)|\[Errno \d+\]|"
                       r"\b[A-Z][A-Za-z]+(Error|Exception)\b|[A-Z][A-Za-z]+\(\w+=|"
                       r"<[A-Za-z.]+ object at|\{'[a-z_]+': ")


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    # auto.create.topics.enable=false: produce to a missing topic waits for it (with retries)
    with BrokerProcess(tmp_path_factory.mktemp("cli-errors") / "data",
                       settings={"auto.create.topics.enable": "false"}) as b:
        yield b


@pytest.mark.slow  # ~25 runs of the command, ~0.3 s each
def test_bad_inputs_get_kafkas_error_names_and_no_python_internals(broker, tmp_path):
    bs = ["--bootstrap-server", broker.bootstrap_servers]
    oncelog("topics", "create", *bs, "--topic", "exists")
    (tmp_path / "bad.json").write_text("not json")
    (tmp_path / "odd.json").write_text('{"partitions": [{"topic": "exists", "partition": "x", '
                                       '"offset": 1}]}')
    # (arguments, exit status, what stderr must say)
    cases = [
        (["topics", "create", *bs, "--topic", "bad name"], 1, "INVALID_TOPIC_EXCEPTION"),
        (["topics", "create", *bs, "--topic", "exists"], 1, "TOPIC_ALREADY_EXISTS"),
        (["topics", "create", *bs, "--topic", "c", "--config", "cleanup.policy=shred"], 1,
         "INVALID_CONFIG"),
        (["topics", "create", *bs, "--topic", "c", "--partitions", "-3"], 1,
         "INVALID_PARTITIONS"),
        (["topics", "create", *bs, "--topic", "c", "--partitions", "many"], 2,
         "invalid int value: 'many'"),
        (["topics", "describe", *bs, "--topic", "nope"], 1,
         ("UNKNOWN_TOPIC_OR_PARTITION: describe topic 'nope': the topic or partition does not "
         "exist")),
        (["topics", "delete", *bs, "--topic", "nope"], 1, "UNKNOWN_TOPIC_OR_PARTITION"),
        (["topics", "add-partitions", *bs, "--topic", "exists", "--partitions", "3",
          "--replica-assignment", "a:b"], 2, "is not broker ids joined by ':'"),
        (["acls", "add", *bs, "--topic", "t", "--allow-principal", "User:bob", "--operation",
          "Read"], 1, "SECURITY_DISABLED: User:bob Allow Read on Topic 't' (Literal, host *)"),
        (["acls", "add", *bs, "--topic", "t", "--allow-principal", "User:bob", "--operation",
          "Reed"], 2, "unknown Operation 'Reed'"),
        (["transactions", "describe", *bs, "--transactional-id", "nobody"], 1,
         ("TRANSACTIONAL_ID_NOT_FOUND: transactional id 'nobody': the coordinator does not "
         "know this transactional id")),
        (["transactions", "describe-producers", *bs, "--topic", "nope", "--partition", "0"], 1,
         "UNKNOWN_TOPIC_OR_PARTITION"),
        (["delete-records", *bs, "--offset-json-file", str(tmp_path / "missing.json")], 2,
         "No such file or directory"),
        (["delete-records", *bs, "--offset-json-file", str(tmp_path / "bad.json")], 2,
         "not JSON (Expecting value at line 1 column 1)"),
        (["delete-records", *bs, "--offset-json-file", str(tmp_path / "odd.json")], 2,
         'not {"topic": "exists", "partition": "x", "offset": 1}'),
        (["configs", *bs, "--describe", "--entity-type", "brokers", "--entity-name", "abc"], 2,
         "must be a valid integer broker id, found: abc"),
        (["configs", *bs, "--alter", "--entity-type", "users", "--entity-name", "bob",
          "--add-config", "SCRAM-SHA-256=[iterations=1,password=p]"], 1,
         "UNACCEPTABLE_CREDENTIAL"),
        (["users", "add", "bob", *bs, "--password", "p", "--iterations", "1"], 1,
         "UNACCEPTABLE_CREDENTIAL"),
        (["consume", *bs, "--topic", "nope", "--timeout-ms", "100"], 1,
         "UNKNOWN_TOPIC_OR_PARTITION"),
        (["topics", "list", "--bootstrap-server", "localhost"], 1,
         "bad address 'localhost' (HOST:PORT)"),
        (["topics", "list", *bs, "--user", "admin", "--password", "pw"], 1,
         (f"ILLEGAL_SASL_STATE: the broker at {broker.bootstrap_servers} does not take SASL "
         "authentication (its listener is PLAINTEXT): leave out --user")),
        (["verify", "--bootstrap-server", "127.0.0.1:1", "--duration", "1"], 1,
         "connection refused to 127.0.0.1:1"),
        (["dump-log", str(tmp_path)], 2, "a directory, not a segment file"),
        (["broker", "--data-dir", str(tmp_path / "d"), "--port",
          broker.bootstrap_servers.rsplit(":", 1)[1]], 1,
         "cannot start: failed to bind to 127.0.0.1:"),
    ]
    for args, status, said in cases:
        proc = oncelog(*args, check=False)
        shown = f"oncelog {' '.join(args)} -> {proc.returncode}: {proc.stderr}"
        assert proc.returncode == status, shown
        assert said in proc.stderr, shown
        assert not INTERNALS.search(proc.stderr), shown


def test_a_command_that_waits_shows_its_retries(broker):
    """produce to a topic that is not there yet (auto-creation off): the producer waits for
    it (max.block.ms), saying on stderr what it waits for; the topic created meanwhile, the
    record goes there."""
    bs = ["--bootstrap-server", broker.bootstrap_servers]
    proc = subprocess.Popen(ONCELOG + ["produce", *bs, "--topic", "later"], text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)
    reader.start()
    try:
        proc.stdin.write("hello\n")
        proc.stdin.flush()
        deadline = time.monotonic() + 30
        while not any("retrying METADATA" in line for line in lines):
            assert time.monotonic() < deadline and proc.poll() is None, lines
            time.sleep(0.1)
        oncelog("topics", "create", *bs, "--topic", "later")
        proc.stdin.close()
        assert proc.wait(30) == 0, lines
    finally:
        proc.kill()
        proc.wait()
    reader.join(5)
    first = next(line for line in lines if "retrying" in line)
    assert re.fullmatch(r"oncelog produce: retrying METADATA: UNKNOWN_TOPIC_OR_PARTITION "
                        r"\(attempt \d+, giving up in \d+ s\)\n", first), first
    assert "Produced 1 records to later." in "".join(lines)
    out = oncelog("consume", *bs, "--topic", "later", "--from-beginning", "--max-messages",
                  "1").stdout
    assert out == "hello\n"


def test_help_names_what_things_are():
    """User-visible help says what a command does, not which internal spec it came from."""
    for args in ([], ["demo"], ["users"], ["users", "add"], ["transactions", "find-hanging"],
                 ["topics", "describe"], ["verify"], ["cluster"]):
        out = help_text(*args)
        assert not re.search(r"[Ss]pec 0\d\d", out), (args, out)
    assert "the purchases pipeline" in help_text()
