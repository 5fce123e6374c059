"""``oncelog users add | delete | list`` against a real SASL broker: the user added logs in
with the mechanisms it was given and no other, its password from the flag, the environment or
stdin; a SASL broker reached without credentials says so at once."""

from __future__ import annotations

import json
import time

import pytest
from support.cli import oncelog
from support.security import USERS, sasl_config

from oncelog.harness.broker_process import BrokerProcess


@pytest.fixture(scope="module")
def sasl_broker(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cli-users")
    with BrokerProcess(tmp / "data", settings=sasl_config(tmp)) as b:
        yield b


def admin_flags(b):
    return ["--bootstrap-server", b.bootstrap_servers, "--user", "admin", "--admin-password",
            USERS["admin"]]


def logs_in(b, user: str, password: str, mechanism: str) -> bool:
    proc = oncelog("topics", "list", "--bootstrap-server", b.bootstrap_servers, "--user", user,
                   "--password", password, "--sasl-mechanism", mechanism, check=False)
    assert proc.returncode == 0 or "SASL_AUTHENTICATION_FAILED" in proc.stderr, proc.stderr
    return proc.returncode == 0


def users(b) -> dict[str, list]:
    return {u["user"]: u["mechanisms"] for u in json.loads(
        oncelog("users", "list", *admin_flags(b), "--output", "json").stdout)}


@pytest.mark.slow  # ~15 runs of the command, ~0.3 s each
def test_add_list_delete(sasl_broker):
    b = sasl_broker
    out = oncelog("users", "add", "carol", *admin_flags(b), "--password", "carol-pw").stdout
    assert out == "Added user carol (SCRAM-SHA-256, SCRAM-SHA-512).\n"
    assert logs_in(b, "carol", "carol-pw", "SCRAM-SHA-512")
    assert logs_in(b, "carol", "carol-pw", "SCRAM-SHA-256")
    # one mechanism, more iterations, the password on stdin
    oncelog("users", "add", "dave", *admin_flags(b), "--mechanism", "SCRAM-SHA-256",
            "--iterations", "8192", stdin="dave-pw\n")
    assert users(b)["dave"] == [{"mechanism": "SCRAM-SHA-256", "iterations": 8192}]
    assert logs_in(b, "dave", "dave-pw", "SCRAM-SHA-256")
    assert not logs_in(b, "dave", "dave-pw", "SCRAM-SHA-512")
    # the password from the environment
    oncelog("users", "add", "erin", *admin_flags(b),
            env={"ONCELOG_NEW_USER_PASSWORD": "erin-pw"})
    assert logs_in(b, "erin", "erin-pw", "SCRAM-SHA-512")
    table = oncelog("users", "list", *admin_flags(b)).stdout.splitlines()
    assert table[0].split() == ["User", "Mechanisms"]
    assert [line.split()[0] for line in table[1:]] == sorted(
        set(USERS) | {"carol", "dave", "erin"})
    dave = next(line for line in table if line.startswith("dave"))
    assert dave.split() == ["dave", "SCRAM-SHA-256(iterations=8192)"]
    assert len({len(line) for line in table}) == 1  # aligned
    # delete one mechanism, then the rest
    oncelog("users", "delete", "carol", *admin_flags(b), "--mechanism", "SCRAM-SHA-512")
    assert [m["mechanism"] for m in users(b)["carol"]] == ["SCRAM-SHA-256"]
    assert oncelog("users", "delete", "carol", *admin_flags(b)).stdout == \
        "Deleted user carol (SCRAM-SHA-256).\n"
    assert "carol" not in users(b)
    assert not logs_in(b, "carol", "carol-pw", "SCRAM-SHA-256")


def test_refusals_name_kafkas_errors(sasl_broker):
    b = sasl_broker
    gone = oncelog("users", "delete", "nobody", *admin_flags(b), check=False)
    assert gone.returncode == 1
    assert "RESOURCE_NOT_FOUND" in gone.stderr and "nobody" in gone.stderr
    weak = oncelog("users", "add", "frank", *admin_flags(b), "--password", "x",
                   "--iterations", "10", check=False)
    assert weak.returncode == 1 and "UNACCEPTABLE_CREDENTIAL" in weak.stderr
    no_password = oncelog("users", "add", "frank", *admin_flags(b), stdin="", check=False)
    assert no_password.returncode == 2 and "no password for frank" in no_password.stderr
    # alice is no super user: Alter on the cluster is refused
    alice = ["--bootstrap-server", b.bootstrap_servers, "--user", "alice", "--admin-password",
             USERS["alice"]]
    refused = oncelog("users", "add", "frank", *alice, "--password", "frank-pw", check=False)
    assert refused.returncode == 1 and "CLUSTER_AUTHORIZATION_FAILED" in refused.stderr
    for bad in (gone, weak, refused):
        assert "Error:" not in bad.stderr and "Traceback" not in bad.stderr


def test_a_sasl_broker_without_credentials_says_so_at_once(sasl_broker):
    b = sasl_broker
    for args in (["topics", "list"], ["users", "list"], ["transactions", "list"],
                 ["consume", "--topic", "t"]):
        started = time.monotonic()
        bad = oncelog(*args, "--bootstrap-server", b.bootstrap_servers, check=False)
        assert bad.returncode == 1, bad.stderr
        assert f"the broker at {b.bootstrap_servers} requires SASL authentication" in bad.stderr
        assert "give --user NAME" in bad.stderr
        assert time.monotonic() - started < 20  # not the client's 60 s of retries
    wrong = oncelog("topics", "list", "--bootstrap-server", b.bootstrap_servers, "--user",
                    "alice", "--password", "nope", check=False)
    assert wrong.returncode == 1
    assert "SASL_AUTHENTICATION_FAILED" in wrong.stderr and "user 'alice'" in wrong.stderr
