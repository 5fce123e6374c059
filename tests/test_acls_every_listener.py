"""ACLs on every listener once an authorizer is set (``authorizer.class.name``), as Kafka: a
PLAINTEXT client, and an SSL client without a certificate, is ``User:ANONYMOUS``; an SSL client
with one is its certificate's subject (RFC 2253, as Java's X500Principal prints it) mapped by
``ssl.principal.mapping.rules`` (KIP-371). Broker processes, certificates made by ``openssl``,
the ``oncelog acls`` command, confluent-kafka and our client."""

from __future__ import annotations

import socket
import subprocess
import uuid
from pathlib import Path

import pytest
from support.cli import oncelog
from support.tls import _signed, make_certificates

from oncelog import Admin, Consumer, Producer
from oncelog.errors import ClusterAuthorizationFailedError, TopicAuthorizationFailedError
from oncelog.harness.broker_process import BrokerProcess
from oncelog.security.ssl_principal import SslPrincipalMapper, subject_rfc2253
from oncelog.security.tls import client_ssl_context

confluent_kafka = pytest.importorskip("confluent_kafka")

AUTHORIZER = "kafka.security.authorizer.AclAuthorizer"
SMALL = {"transaction.state.log.num.partitions": "2", "offsets.topic.num.partitions": "2"}
CLIENT_EXT = "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n"


def topic_name() -> str:
    return f"t-{uuid.uuid4().hex[:8]}"


def der(pem_path: str | Path) -> bytes:
    return subprocess.run(["openssl", "x509", "-in", str(pem_path), "-outform", "DER"],
                          check=True, capture_output=True).stdout


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    certs = make_certificates(tmp_path_factory.mktemp("certs"))
    for name, subject in (("admin", "/O=acme/CN=Admin"),
                          ("alice", "/C=US/O=acme, inc/OU=eng/CN=Alice"),
                          ("bob", "/O=acme/OU=eng/CN=Bob")):
        _signed(name, subject, CLIENT_EXT, certs.dir)
    return certs


# -- the principal of a certificate ---------------------------------------------------------


def test_subject_is_printed_as_javas_x500principal(certs, tmp_path):
    """Most specific RDN first, no spaces, ``,=+<>#;"\\`` escaped, attributes without an
    RFC 2253 keyword (emailAddress) as their OID and the value's DER in hex."""
    assert subject_rfc2253(der(certs.dir / "alice.pem")) == "CN=Alice,OU=eng,O=acme\\, inc,C=US"
    assert subject_rfc2253(der(certs.client_cert)) == "CN=client,O=oncelog"
    _signed("odd", "/DC=com/DC=example/O=a;b=c/CN=x\\+y <z>/emailAddress=x@y.z", CLIENT_EXT,
            certs.dir)
    assert subject_rfc2253(der(certs.dir / "odd.pem")) == (
        "1.2.840.113549.1.9.1=#16057840792e7a,CN=x\\+y \\<z\\>,O=a\\;b\\=c,DC=example,DC=com")
    subprocess.run(["openssl", "req", "-new", "-x509", "-key", certs.client_key, "-out",
                    str(tmp_path / "multi.pem"), "-days", "1", "-multivalue-rdn", "-subj",
                    "/O=acme/CN=carol+UID=c1/L= spaced "], check=True, capture_output=True)
    assert subject_rfc2253(der(tmp_path / "multi.pem")) == \
        "L=\\ spaced\\ ,CN=carol+UID=c1,O=acme"


def test_mapping_rules_follow_kafkas_ssl_principal_mapper():
    """Kafka's SslPrincipalMapperTest cases."""
    for good in ("DEFAULT", "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/",
                 "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L, DEFAULT",
                 "RULE:^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),ST=(.*?),C=(.*?)$/$1@$2/",
                 "RULE:^.*[Cc][Nn]=([a-zA-Z0-9.]*).*$/$1/L",
                 "RULE:^cn=(.?),ou=(.?),dc=(.?),dc=(.?)$/$1@$2/U",
                 "RULE:^CN=([^,ADEFLTU,]+)(,.*|$)/$1/", "RULE:^CN=([^,DEFAULT,]+)(,.*|$)/$1/"):
        SslPrincipalMapper(good)
    for bad in ("default", "DEFAUL", "DEFAULT/L", "DEFAULT/U",
                "RULE:CN=(.*?),OU=ServiceUsers.*/$1", "rule:^CN=(.*?),OU=ServiceUsers.*$/$1/",
                "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L/U", "RULE:^CN=(.*?),OU=ServiceUsers.*$/L",
                "RULE:^CN=(.*?),OU=ServiceUsers.*$/U", "RULE:^CN=(.*?),OU=ServiceUsers.*$/LU"):
        with pytest.raises(ValueError):
            SslPrincipalMapper(bad)
    mapper = SslPrincipalMapper(
        "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L, "
        "RULE:^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),ST=(.*?),C=(.*?)$/$1@$2/L, "
        "RULE:^cn=(.*?),ou=(.*?),dc=(.*?),dc=(.*?)$/$1@$2/U, "
        "RULE:^.*[Cc][Nn]=([a-zA-Z0-9.]*).*$/$1/U, DEFAULT")
    assert mapper.name("CN=Duke,OU=ServiceUsers,O=Org,C=US") == "duke"
    assert mapper.name("CN=Duke,OU=SME,O=mycp,L=Fulton,ST=MD,C=US") == "duke@sme"
    assert mapper.name("cn=duke,ou=sme,dc=mycp,dc=com") == "DUKE@SME"
    assert mapper.name("cN=duke,OU=JavaSoft,O=Sun Microsystems") == "DUKE"
    assert mapper.name("OU=JavaSoft,O=Sun Microsystems,C=US") == \
        "OU=JavaSoft,O=Sun Microsystems,C=US"
    for expected, rules in (
            ("[]", ""), ("[DEFAULT]", "DEFAULT"), ("[RULE:/]", "RULE://"),
            ("[RULE:/.*/L]", "RULE:/.*/L"), ("[RULE:/, DEFAULT]", "  RULE:// ,  DEFAULT  "),
            ("[RULE:  /     /U, DEFAULT]", "  RULE:  /     /U   ,DEFAULT  "),
            ("[RULE:([A-Z]*)/$1/U, RULE:([a-z]+)/$1, DEFAULT]",
             "  RULE:([A-Z]*)/$1/U   ,RULE:([a-z]+)/$1/,   DEFAULT  "),
            ("[]", ",   , , ,      , , ,   "), ("[RULE:/, DEFAULT]", ",,RULE://,,,DEFAULT,,"),
            (("[RULE:,RULE:,/,RULE:,\\//U, RULE:,/RULE:,, RULE:,RULE:,/L,RULE:,/L, RULE:, "
              "DEFAULT, /DEFAULT, DEFAULT]"),
             ("RULE:,RULE:,/,RULE:,\\//U,RULE:,/RULE:,/,RULE:,RULE:,/L,RULE:,/L,RULE:, DEFAULT, "
              "/DEFAULT/,DEFAULT"))):
        assert str(SslPrincipalMapper(rules)) == expected
    comma = SslPrincipalMapper("RULE:^CN=((\\\\, *|\\w)+)(,.*|$)/$1/,DEFAULT")
    assert comma.name("CN=Tkac\\, Adam,OU=ITZ,DC=geodis,DC=cz") == "Tkac\\, Adam"
    # a back reference past the groups is literal text (Kafka's escapeLiteralBackReferences)
    assert SslPrincipalMapper("RULE:^CN=(.*?),.*$/$1@$2/").name("CN=a,O=b") == "a@$2"


# -- PLAINTEXT ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def plaintext_broker(tmp_path_factory):
    settings = {"authorizer.class.name": AUTHORIZER, "allow.everyone.if.no.acl.found": "true",
                **SMALL}
    with BrokerProcess(tmp_path_factory.mktemp("plain") / "data", settings=settings) as b:
        yield b


def test_plaintext_clients_are_anonymous_and_acls_apply(plaintext_broker):
    bootstrap = plaintext_broker.bootstrap_servers
    topic = topic_name()
    oncelog("topics", "create", "--bootstrap-server", bootstrap, "--topic", topic)
    # Someone else's ACL on the topic: no longer "no ACL found", so ANONYMOUS is refused.
    oncelog("acls", "add", "--bootstrap-server", bootstrap, "--allow-principal", "User:alice",
            "--operation", "Write", "--topic", topic)
    p = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    errors: list = []
    p.produce(topic, b"refused", on_delivery=lambda err, msg: errors.append(err))
    p.flush(30)
    assert [e.code() for e in errors] == [confluent_kafka.KafkaError.TOPIC_AUTHORIZATION_FAILED]
    with Producer(bootstrap_servers=bootstrap, retries=0) as ours, \
            pytest.raises(TopicAuthorizationFailedError):
        ours.send(topic, b"refused").result(30)

    oncelog("acls", "add", "--bootstrap-server", bootstrap, "--allow-principal",
            "User:ANONYMOUS", "--operation", "Write", "--operation", "Read", "--topic", topic)
    errors.clear()
    p = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "acks": "all"})  # no cache
    p.produce(topic, b"allowed", on_delivery=lambda err, msg: errors.append(err))
    p.flush(30)
    assert errors == [None]
    with Producer(bootstrap_servers=bootstrap) as ours:
        assert ours.send(topic, b"ours").result(30).offset == 1
    listed = oncelog("acls", "list", "--bootstrap-server", bootstrap, "--topic", topic).stdout
    assert "User:ANONYMOUS" in listed and "User:alice" in listed


def test_without_an_authorizer_nothing_changes(tmp_path):
    """No authorizer.class.name and no SASL: ACL requests refused, everything allowed."""
    with BrokerProcess(tmp_path / "data", settings=SMALL) as b:
        refused = oncelog("acls", "add", "--bootstrap-server", b.bootstrap_servers,
                          "--allow-principal", "User:alice", "--operation", "Write",
                          "--topic", "t", check=False)
        assert refused.returncode != 0 and "authorizer" in (refused.stdout + refused.stderr)


# -- SSL ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ssl_broker(certs, tmp_path_factory):
    settings = {**certs.settings(client_auth="requested"), **SMALL,
                "authorizer.class.name": AUTHORIZER, "super.users": "User:admin",
                "ssl.principal.mapping.rules": "RULE:^CN=(.*?),.*$/$1/L,DEFAULT"}
    with BrokerProcess(tmp_path_factory.mktemp("ssl") / "data", settings=settings) as b:
        yield b


def client_config(certs, name: str | None) -> dict:
    config = {"security_protocol": "SSL", "ssl_cafile": certs.ca}
    if name is not None:
        config["ssl_certfile"] = str(certs.dir / f"{name}-all.pem")
    return config


def properties(certs, tmp_path: Path, name: str) -> str:
    path = tmp_path / f"{name}.properties"
    path.write_text(f"security.protocol=SSL\nssl.truststore.location={certs.ca}\n"
                    f"ssl.keystore.location={certs.dir / f'{name}-all.pem'}\n")
    return str(path)


def test_ssl_clients_are_their_certificates_principal(ssl_broker, certs, tmp_path):
    bootstrap = ssl_broker.bootstrap_servers
    topic = topic_name()
    admin_config = properties(certs, tmp_path, "admin")
    # User:admin (CN=Admin mapped to lower case) is a super user: it may create and grant.
    oncelog("topics", "create", "--bootstrap-server", bootstrap, "--command-config",
            admin_config, "--topic", topic)
    for op in ("Write", "Read", "Describe"):
        oncelog("acls", "add", "--bootstrap-server", bootstrap, "--command-config",
                admin_config, "--allow-principal", "User:alice", "--operation", op,
                "--topic", topic)
    oncelog("acls", "add", "--bootstrap-server", bootstrap, "--command-config", admin_config,
            "--allow-principal", "User:alice", "--operation", "Read", "--group", topic)

    with Producer(bootstrap_servers=bootstrap, **client_config(certs, "alice")) as alice:
        alice.send(topic, b"from alice").result(30)
    with Consumer(bootstrap_servers=bootstrap, group_id=topic,
                  auto_offset_reset="earliest", **client_config(certs, "alice")) as c:
        c.subscribe([topic])
        got: list = []
        for _ in range(60):
            got += [r.value for r in c.poll(500)]
            if got:
                break
    assert got == [b"from alice"]

    for refused in ("bob", None):  # bob's certificate; no certificate: User:ANONYMOUS
        with Producer(bootstrap_servers=bootstrap, retries=0,
                      **client_config(certs, refused)) as p, \
                pytest.raises(TopicAuthorizationFailedError):
            p.send(topic, b"refused").result(30)
    # librdkafka with bob's certificate, too
    p = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "security.protocol": "SSL",
                                  "ssl.ca.location": certs.ca,
                                  "ssl.certificate.location": str(certs.dir / "bob.pem"),
                                  "ssl.key.location": str(certs.dir / "bob.key")})
    errors: list = []
    p.produce(topic, b"refused", on_delivery=lambda err, msg: errors.append(err))
    p.flush(30)
    assert [e.code() for e in errors] == [confluent_kafka.KafkaError.TOPIC_AUTHORIZATION_FAILED]

    listed = oncelog("acls", "list", "--bootstrap-server", bootstrap, "--command-config",
                     admin_config, "--topic", topic).stdout
    assert "User:alice" in listed
    with Admin(bootstrap_servers=bootstrap, **client_config(certs, "alice")) as alice_admin, \
            pytest.raises(ClusterAuthorizationFailedError):  # not a super user
        alice_admin.describe_acls()
    with Admin(bootstrap_servers=bootstrap, **client_config(certs, "admin")) as admin:
        principals = {b.principal for b in admin.describe_acls()}
    assert "User:alice" in principals


def test_a_certificate_no_rule_maps_is_refused(certs, tmp_path):
    """Kafka fails the authentication of a client whose subject no rule maps."""
    settings = {**certs.settings(client_auth="required"), **SMALL,
                "authorizer.class.name": AUTHORIZER, "super.users": "User:admin",
                "ssl.principal.mapping.rules": "RULE:^CN=([^,]*),O=acme$/$1/L"}
    with BrokerProcess(tmp_path / "data", settings=settings) as b:
        with Admin(bootstrap_servers=b.bootstrap_servers, **client_config(certs, "admin")) as a:
            a.list_topics()
        ctx = client_ssl_context(cafile=certs.ca, certfile=str(certs.dir / "bob-all.pem"))
        with socket.create_connection((b.host, b.port), timeout=10) as raw, \
                ctx.wrap_socket(raw, server_hostname="localhost") as tls:
            assert tls.recv(1) == b""  # closed by the broker after the handshake
        assert "no ssl.principal.mapping.rules rule applies" in b.log_path.read_text()
