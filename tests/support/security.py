"""SASL users, a broker's settings for them, ACL grants and a raw SASL login: the wire security
tests (tests/test_security_wire.py, tests/test_authorization.py)."""

from __future__ import annotations

from oncelog import Admin
from oncelog.protocol import ApiKey, make, request_module
from oncelog.security.acls import AclBinding, Operation, PatternType, Permission, ResourceType
from support.raw_wire import RawConnection

USERS = {"admin": "admin-secret", "alice": "alice-pw", "bob": "bob-pw", "mallory": "mallory-pw"}
Op, R = Operation, ResourceType


def sasl_config(tmp_path):
    users = tmp_path / "users"
    users.write_text("".join(f"{u}:{p}\n" for u, p in USERS.items()))
    return {"security.protocol": "SASL_PLAINTEXT", "sasl.users.file": str(users),
            "super.users": "User:admin", "transaction.state.log.num.partitions": "2",
            "offsets.topic.num.partitions": "2",
            "transaction.two.phase.commit.enable": "true"}


def creds(user, mechanism="SCRAM-SHA-256"):
    return {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": mechanism,
            "sasl_plain_username": user, "sasl_plain_password": USERS[user]}


def grant(b, *bindings):
    with Admin(bootstrap_servers=b.bootstrap_servers, **creds("admin")) as admin:
        admin.create_acls(bindings)


def allow(principal, rtype, name, op):
    return AclBinding(rtype, name, PatternType.LITERAL, principal, "*", op, Permission.ALLOW)


def raw_login(b, user, mechanism_version=1) -> RawConnection:
    """A raw connection authenticated with SASL/PLAIN (SaslHandshake v1 + SaslAuthenticate)."""
    conn = RawConnection(b.bootstrap_servers)
    r = conn.request(make(request_module(ApiKey.SASL_HANDSHAKE, 1).SaslHandshakeRequest,
                          mechanism="PLAIN"))
    assert r.error_code == 0 and "SCRAM-SHA-512" in r.mechanisms
    r = conn.request(make(request_module(ApiKey.SASL_AUTHENTICATE, 2).SaslAuthenticateRequest,
                          auth_bytes=f"\0{user}\0{USERS[user]}".encode()))
    assert r.error_code == 0, r
    return conn
