"""Test certificates, made with the ``openssl`` command at test time (P-256 keys: fast).

    certs = make_certificates(tmp_path)
    certs.ca             the CA's certificate (a truststore; ssl.ca.location; ssl_cafile)
    certs.server_pem     the broker's chain and key in one PEM file (ssl.keystore.location),
                         for 127.0.0.1 and localhost (subjectAltName), also a client
                         certificate (a broker shows it to the others)
    certs.server_cert, certs.server_key   the same apart
    certs.server_key_encrypted            its key encrypted with KEY_PASSWORD
    certs.client_cert, certs.client_key   a client's (CN=client,O=oncelog) for mutual TLS
    certs.client_pem     both in one file
    certs.rogue_ca       a CA that signed nothing the broker trusts
    certs.rogue_client_pem   a client's chain and key signed by it
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

KEY_PASSWORD = "key-secret"


@dataclass(frozen=True)
class Certificates:
    dir: Path

    def __getattr__(self, name: str) -> str:
        files = {"ca": "ca.pem", "rogue_ca": "rogue-ca.pem", "server_pem": "server-all.pem",
                 "server_cert": "server.pem", "server_key": "server.key",
                 "server_key_encrypted": "server-encrypted.key", "client_cert": "client.pem",
                 "client_key": "client.key", "client_pem": "client-all.pem",
                 "rogue_client_pem": "rogue-client-all.pem"}
        if name not in files:
            raise AttributeError(name)
        return str(self.dir / files[name])

    def settings(self, *, client_auth: str = "none", protocol: str = "SSL") -> dict[str, str]:
        """Broker settings (Kafka's names) for a listener with these certificates."""
        return {"security.protocol": protocol, "ssl.keystore.type": "PEM",
                "ssl.keystore.location": self.server_pem, "ssl.truststore.type": "PEM",
                "ssl.truststore.location": self.ca, "ssl.client.auth": client_auth}


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _key(name: str, cwd: Path) -> None:
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256",
             "-out", name, cwd=cwd)


def _ca(name: str, cwd: Path) -> None:
    _key(f"{name}.key", cwd)
    _openssl("req", "-x509", "-new", "-key", f"{name}.key", "-out", f"{name}.pem", "-days",
             "3", "-subj", f"/O=oncelog/CN={name}", cwd=cwd)


def _signed(name: str, subject: str, extensions: str, cwd: Path, ca: str = "ca") -> None:
    _key(f"{name}.key", cwd)
    _openssl("req", "-new", "-key", f"{name}.key", "-out", f"{name}.csr", "-subj", subject,
             cwd=cwd)
    (cwd / f"{name}.ext").write_text(extensions)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
             "-CAcreateserial", "-out", f"{name}.pem", "-days", "3", "-extfile",
             f"{name}.ext", cwd=cwd)
    (cwd / f"{name}-all.pem").write_text((cwd / f"{name}.pem").read_text()
                                         + (cwd / f"{name}.key").read_text())


def make_certificates(directory: Path) -> Certificates:
    if shutil.which("openssl") is None:
        if os.environ.get("CI"):
            pytest.fail("the openssl command is not installed, and CI must run the TLS tests "
                        "(scripts/test.sh installs it: bootstrap.sh --with-openssl)")
        pytest.skip("the openssl command is not installed (bootstrap.sh --with-openssl)")
    directory.mkdir(parents=True, exist_ok=True)
    _ca("ca", directory)
    _ca("rogue-ca", directory)
    _signed("server", "/O=oncelog/CN=broker",
            "basicConstraints=CA:FALSE\nsubjectAltName=IP:127.0.0.1,DNS:localhost\n"
            "extendedKeyUsage=serverAuth,clientAuth\n", directory)
    _signed("client", "/O=oncelog/CN=client",
            "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n", directory)
    _signed("rogue-client", "/O=elsewhere/CN=client",
            "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n", directory, ca="rogue-ca")
    _openssl("pkey", "-in", "server.key", "-aes256", "-passout", f"pass:{KEY_PASSWORD}",
             "-out", "server-encrypted.key", cwd=directory)
    return Certificates(directory)
