"""``oncelog broker --config FILE``: a server.properties file read as Java reads properties,
``--set`` and the flags over it, Kafka's ``listeners`` / ``log.dirs`` / ``broker.id``, and a
real broker started from such a file (an SSL listener on a port it picks)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from support.cli import oncelog
from support.tls import make_certificates

from oncelog import Admin
from oncelog.cli.broker_command import broker_settings
from oncelog.cli.main import build_parser
from oncelog.cli.properties import PropertiesError, load_properties, parse_properties
from oncelog.client.admin.admin_configs import ConfigResource
from oncelog.harness.broker_process import BrokerProcess

# -- the file format ------------------------------------------------------------------------------


def test_properties_are_read_as_java_reads_them() -> None:
    text = (
        "# a comment\n"
        "   ! another, indented\n"
        "\n"
        "plain=value\n"
        "colon: spaced value  \n"
        "blank   separated\n"
        "  indented.key = x\n"
        "empty=\n"
        "bare\n"
        "long=one, \\\n"
        "      two, \\\n"
        "      three\n"
        "escaped\\=key\\:x = a\\tb\\nc\\\\d\\u00e9\n"
        "trailing.backslashes=even\\\\\n"
        "after=1\n"
        "dup=first\n"
        "dup=second\n"
        "continued.comment=a\\\n"
        "# not a comment: part of the value\n"
    )
    assert parse_properties(text) == {
        "plain": "value", "colon": "spaced value  ", "blank": "separated",
        "indented.key": "x", "empty": "", "bare": "", "long": "one, two, three",
        "escaped=key:x": "a\tb\nc\\d\u00e9", "trailing.backslashes": "even\\", "after": "1",
        "dup": "second", "continued.comment": "a# not a comment: part of the value"}


def test_a_bad_unicode_escape_names_the_line(tmp_path: Path) -> None:
    f = tmp_path / "server.properties"
    f.write_text("a=1\nb=\\u12\n")
    with pytest.raises(PropertiesError, match=r"server.properties: line 2: malformed \\uXXXX"):
        load_properties(f)
    with pytest.raises(PropertiesError, match="cannot read"):
        load_properties(tmp_path / "missing.properties")


# -- precedence and Kafka's names -----------------------------------------------------------------


def settings_of(*argv: str) -> tuple[str, str, int, dict[str, str]]:
    return broker_settings(build_parser().parse_args(["broker", *argv]))


def test_set_and_flags_override_the_file(tmp_path: Path) -> None:
    f = tmp_path / "server.properties"
    f.write_text("log.dirs=/var/lib/x\nbroker.id=7\nlisteners=SSL://:9093\n"
                 "log.segment.bytes=1000\nnum.partitions=3\n")
    data_dir, host, port, settings = settings_of("--config", str(f))
    assert (data_dir, host, port) == ("/var/lib/x", "127.0.0.1", 9093)
    assert settings == {"node.id": "7", "security.protocol": "SSL",
                        "log.segment.bytes": "1000", "num.partitions": "3"}
    data_dir, host, port, settings = settings_of(
        "--config", str(f), "--set", "num.partitions=5", "--set",
        "listeners=SASL_SSL://0.0.0.0:9094", "--port", "9999", "--node-id", "2",
        "--data-dir", "/elsewhere")
    assert (data_dir, host, port) == ("/elsewhere", "0.0.0.0", 9999)
    assert settings["num.partitions"] == "5" and settings["node.id"] == "2"
    assert settings["security.protocol"] == "SASL_SSL"
    _, _, _, settings = settings_of("--config", str(f), "--security-protocol", "PLAINTEXT")
    assert settings["security.protocol"] == "PLAINTEXT"


def test_listener_names_map_to_protocols(tmp_path: Path) -> None:
    f = tmp_path / "server.properties"
    f.write_text("log.dir=/d\nlisteners=CLIENTS://[::1]:9095\n"
                 "listener.security.protocol.map=CLIENTS:SASL_SSL,OTHER:PLAINTEXT\n")
    assert settings_of("--config", str(f)) == ("/d", "::1", 9095,
                                                {"security.protocol": "SASL_SSL"})


@pytest.mark.parametrize(("content", "message"), [
    ("log.dirs=/a,/b\n", "an oncelog broker has one data directory"),
    ("listeners=PLAINTEXT://:9092,SSL://:9093\nlog.dirs=/a\n", "has one listener"),
    ("listeners=CLIENT://:9092\nlog.dirs=/a\n", "listener CLIENT has no security protocol"),
    ("listeners=:9092\nlog.dirs=/a\n", "expected NAME://HOST:PORT"),
    ("num.partitions=3\n", "--data-dir is needed"),
])
def test_what_cannot_be_used_is_refused(tmp_path: Path, content: str, message: str) -> None:
    f = tmp_path / "server.properties"
    f.write_text(content)
    with pytest.raises(ValueError, match=message):
        settings_of("--config", str(f))


def test_an_unknown_setting_in_the_file_stops_the_broker(tmp_path: Path) -> None:
    f = tmp_path / "server.properties"
    f.write_text(f"log.dirs={tmp_path / 'data'}\nno.such.setting=1\n")
    out = oncelog("broker", "--config", str(f), "--port", "0", check=False)
    assert out.returncode == 2
    assert "unknown broker setting 'no.such.setting'" in out.stderr


# -- a broker started from a file -----------------------------------------------------------------


class FileBroker(BrokerProcess):
    """``oncelog broker --config FILE`` and nothing else on the command line."""

    def __init__(self, config_file: Path, data_dir: Path) -> None:
        super().__init__(data_dir)
        self.config_file = config_file

    def command(self) -> list[str]:
        return [sys.executable, "-m", "oncelog.cli.main", "broker", "--config",
                str(self.config_file)]


def test_a_broker_runs_from_a_server_properties_file(tmp_path: Path) -> None:
    certs = make_certificates(tmp_path / "certs")
    data = tmp_path / "data"
    f = tmp_path / "server.properties"
    f.write_text(
        "# as Kafka's config/server.properties, PEM stores (KIP-651)\n"
        "listeners=SSL://127.0.0.1:0\n"
        f"log.dirs={data}\n"
        "num.partitions=3\n"
        "ssl.keystore.type=PEM\n"
        f"ssl.keystore.location={certs.server_pem}\n"
        "ssl.truststore.type: PEM\n"
        f"ssl.truststore.location {certs.ca}\n"
        "offsets.topic.num.partitions=2\n")
    with FileBroker(f, data) as b, Admin(bootstrap_servers=b.bootstrap_servers,
                                         security_protocol="SSL",
                                         ssl_cafile=certs.ca) as admin:
        assert admin.describe_cluster().nodes
        entries = admin.describe_configs([ConfigResource.broker(1)])[ConfigResource.broker(1)]
        assert entries["num.partitions"].value == "3"
        assert entries["security.protocol"].value == "SSL"
