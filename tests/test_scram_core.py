"""KIP-554's credentials sans IO: Kafka's credential string, the broker's derivation from a
client's salted password (the same keys a password login derives), Kafka's checks of an
alteration, and Kafka's Sanitizer for the ZooKeeper path of a user name."""

from __future__ import annotations

import base64

import pytest
from kio.schema.errors import ErrorCode

from oncelog.cluster.zk_user_configs import desanitize, sanitize
from oncelog.security.sasl import ScramClient, ScramServer, scram_credential
from oncelog.security.scram import (
    CredentialFormatError,
    Deletion,
    Upsertion,
    credential_from_salted_password,
    credential_from_string,
    credential_to_string,
    plan_alteration,
    salted_password,
)

SHA256, SHA512 = 1, 2


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_a_salted_password_gives_the_keys_a_login_checks(mechanism):
    salt = b"0123456789abcdef"
    derived = credential_from_salted_password(
        mechanism, salt, salted_password(mechanism, "pw", salt, 8192), 8192)
    assert derived == scram_credential(mechanism, "pw", salt, 8192)
    server = ScramServer(mechanism, {"u": derived})
    client = ScramClient(mechanism, "u", "pw")
    token = client.first()
    while token is not None:
        token = client.step(server.step(token))
    assert server.done and server.username == "u"


def test_kafka_credential_string():
    c = scram_credential("SCRAM-SHA-256", "pw", b"salt-bytes", 4096)
    text = credential_to_string(c)
    b64 = base64.b64encode
    assert text == (f"salt={b64(c.salt).decode()},stored_key={b64(c.stored_key).decode()},"
                    f"server_key={b64(c.server_key).decode()},iterations=4096")
    assert credential_from_string(text) == c
    for bad in ("salt=AA==,iterations=4096", text + ",extra=1", text.replace("=4096", "=x")):
        with pytest.raises(CredentialFormatError):
            credential_from_string(bad)


def test_plan_alteration_as_kafka():
    current = {"alice": {"SCRAM-SHA-256": "kept", "SCRAM-SHA-512": "old"}}
    plan = plan_alteration(
        [Upsertion("alice", SHA512, 5000, b"s", b"p"), Upsertion("", SHA256, 5000, b"s", b"p"),
         Upsertion("bob", 9, 5000, b"s", b"p"), Upsertion("carol", SHA256, 4095, b"s", b"p"),
         Upsertion("dan", SHA256, 16385, b"s", b"p"), Upsertion("erin", SHA256, 4096, b"", b"p"),
         Upsertion("fay", SHA256, 4096, b"s", b"p")],
        [Deletion("fay", SHA256), Deletion("gus", SHA512), Deletion("hal", 0)],
        lambda user: current.get(user, {}))
    assert plan.errors == {
        "": (ErrorCode.unacceptable_credential, "Username must not be empty"),
        "bob": (ErrorCode.unsupported_sasl_mechanism, "Unknown SCRAM mechanism"),
        "carol": (ErrorCode.unacceptable_credential, "Too few iterations"),
        "dan": (ErrorCode.unacceptable_credential, "Too many iterations"),
        "erin": (ErrorCode.unacceptable_credential, "Empty salt or salted password"),
        "fay": (ErrorCode.duplicate_resource,
                "A user credential cannot be altered twice in the same request"),
        "gus": (ErrorCode.resource_not_found, "Attempt to delete a user credential that does not exist"),
        "hal": (ErrorCode.unsupported_sasl_mechanism, "Unknown SCRAM mechanism")}
    assert set(plan.changes) == {"alice"}
    assert plan.changes["alice"]["SCRAM-SHA-256"] == "kept"  # the other mechanism untouched
    assert credential_from_string(plan.changes["alice"]["SCRAM-SHA-512"]).iterations == 5000


def test_sanitized_user_names_as_kafkas_sanitizer():
    for name, znode in [("alice", "alice"), ("user@example.com", "user%40example.com"),
                        ("a b", "a%20b"), ("a*b", "a%2Ab"), ("a~b", "a%7Eb"),
                        ("CN=x,O=y/z", "CN%3Dx%2CO%3Dy%2Fz"), ("a.b-c_d", "a.b-c_d")]:
        assert sanitize(name) == znode
        assert desanitize(znode) == name
