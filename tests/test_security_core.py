"""The sans-IO security pieces: SASL PLAIN and SCRAM (RFC 7677's test vector), the users file,
and the authorizer's semantics (DENY wins, wildcards and prefixes, implied operations, super
users, allow.everyone.if.no.acl.found, durability)."""

from __future__ import annotations

import base64

import pytest

from oncelog.security.acls import (
    AclBinding,
    AclFilter,
    AclStoreError,
    Authorizer,
    Operation,
    PatternType,
    Permission,
    ResourceType,
)
from oncelog.security.sasl import (
    AuthenticationFailed,
    PlainServer,
    ScramClient,
    ScramServer,
    scram_credential,
)
from oncelog.security.users import UsersFileError, load_users

Op, R, P = Operation, ResourceType, Permission


def test_scram_sha_256_rfc7677_vector():
    # RFC 7677 section 3: user "user", password "pencil".
    salt = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
    creds = {"user": scram_credential("SCRAM-SHA-256", "pencil", salt, 4096)}
    server = ScramServer("SCRAM-SHA-256", creds)
    client = ScramClient("SCRAM-SHA-256", "user", "pencil", nonce="rOprNGfwEbeRWgbNEkqO")
    first = client.first()
    assert first == b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
    server_first = server.step(first)
    # Make the server's nonce the RFC's, so the proof matches the published one.
    server._nonce = "rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
    server._server_first = f"r={server._nonce},s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
    final = client.step(server._server_first.encode())
    assert final == (b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                     b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
    server_final = server.step(final)
    assert server_final == b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
    assert client.step(server_final) is None and client.done
    assert server.done and server.username == "user"
    assert server_first.startswith(b"r=rOprNGfwEbeRWgbNEkqO")


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_scram_wrong_password_and_unknown_user_fail_alike(mechanism):
    creds = {"alice": scram_credential(mechanism, "secret")}
    for user, password in (("alice", "nope"), ("mallory", "secret")):
        server, client = ScramServer(mechanism, creds), ScramClient(mechanism, user, password)
        challenge = server.step(client.first())  # an unknown user still gets a challenge
        with pytest.raises(AuthenticationFailed, match="Invalid username or password"):
            server.step(client.step(challenge))
        assert not server.done


@pytest.mark.parametrize("token", [b"", b"n,,", b"garbage", b"\xff\xfe", b"p=tls,,n=a,r=b",
                                   b"n,,n=a", b"n,,m=ext,n=a,r=b"])
def test_malformed_scram_messages_fail_cleanly(token):
    server = ScramServer("SCRAM-SHA-256", {})
    with pytest.raises(AuthenticationFailed):
        server.step(token)


def test_plain():
    ok = PlainServer({"bob": "pw"})
    ok.step(b"\0bob\0pw")
    assert ok.done and ok.username == "bob"
    for token in (b"\0bob\0bad", b"\0eve\0pw", b"bob\0pw", b"x\0bob\0pw", b"\0\0pw"):
        with pytest.raises(AuthenticationFailed):
            PlainServer({"bob": "pw"}).step(token)


def test_users_file(tmp_path):
    f = tmp_path / "users"
    f.write_text("# comment\nalice:a:b:c\n\nbob: spaced \n")
    assert load_users(f) == {"alice": "a:b:c", "bob": " spaced"}
    for text, error in (("alice\n", "name:password"), ("a:1\na:2\n", "twice"), ("", "no user"),
                        (":pw\n", "name:password")):
        f.write_text(text)
        with pytest.raises(UsersFileError, match=error):
            load_users(f)
    with pytest.raises(UsersFileError, match="cannot read"):
        load_users(tmp_path / "missing")


def allow(principal, rtype, name, op, pattern=PatternType.LITERAL, host="*"):
    return AclBinding(rtype, name, pattern, principal, host, op, P.ALLOW)


def test_authorizer_semantics(tmp_path):
    a = Authorizer(tmp_path, enabled=True, super_users=["User:admin"], allow_if_no_acl=False)
    alice = "User:alice"
    assert not a.authorize(alice, "h", Op.WRITE, R.TOPIC, "orders")  # no ACL: denied
    assert a.authorize("User:admin", "h", Op.WRITE, R.TOPIC, "orders")  # super user
    a.add([allow(alice, R.TOPIC, "ord", Op.WRITE, PatternType.PREFIXED),
           allow(alice, R.GROUP, "*", Op.READ),
           AclBinding(R.TOPIC, "orders-secret", PatternType.LITERAL, alice, "*", Op.ALL,
                      P.DENY)])
    assert a.authorize(alice, "h", Op.WRITE, R.TOPIC, "orders")
    assert a.authorize(alice, "h", Op.DESCRIBE, R.TOPIC, "orders")  # implied by Write
    assert not a.authorize(alice, "h", Op.READ, R.TOPIC, "orders")
    assert not a.authorize(alice, "h", Op.WRITE, R.TOPIC, "orders-secret")  # DENY wins
    assert a.authorize(alice, "h", Op.READ, R.GROUP, "any-group")  # wildcard name
    assert a.authorize(alice, "h", Op.IDEMPOTENT_WRITE, R.CLUSTER, "kafka-cluster")  # KIP-679
    assert not a.authorize("User:bob", "h", Op.IDEMPOTENT_WRITE, R.CLUSTER, "kafka-cluster")
    # Host-specific bindings.
    a.add([allow("User:bob", R.TOPIC, "t", Op.READ, host="10.0.0.1")])
    assert a.authorize("User:bob", "10.0.0.1", Op.READ, R.TOPIC, "t")
    assert not a.authorize("User:bob", "10.0.0.2", Op.READ, R.TOPIC, "t")
    # Durable: a new authorizer on the same directory has them; filters find and delete.
    b = Authorizer(tmp_path, enabled=True, allow_if_no_acl=False)
    assert len(b.bindings) == 4
    assert len(b.describe(AclFilter(principal=alice))) == 3
    assert len(b.describe(AclFilter(R.TOPIC, "orders", PatternType.MATCH))) == 1
    removed = b.delete([AclFilter(R.TOPIC, operation=Op.ALL)])
    assert len(removed[0]) == 1
    assert len(Authorizer(tmp_path, enabled=True).bindings) == 3
    # No binding at all for a resource: allow.everyone.if.no.acl.found decides.
    c = Authorizer(None, enabled=True, allow_if_no_acl=True)
    assert c.authorize(alice, "h", Op.WRITE, R.TOPIC, "x")
    assert Authorizer(None, enabled=False).authorize(alice, "h", Op.ALTER, R.CLUSTER, "c")


def test_a_damaged_acl_file_is_reported(tmp_path):
    (tmp_path / "acls.json").write_text("[{\"nope\": 1}]")
    with pytest.raises(AclStoreError, match="damaged"):
        Authorizer(tmp_path, enabled=True)
