"""TLS contexts from Kafka's SSL settings (PEM only), for the broker's listener, its
connections to other brokers, the web console and our client.

Kafka's names: ``ssl.keystore.type=PEM`` with ``ssl.keystore.location`` (one PEM file holding
the certificate chain and the private key) or ``ssl.keystore.certificate.chain`` and
``ssl.keystore.key`` (the PEM text itself); ``ssl.key.password`` for an encrypted key;
``ssl.truststore.type=PEM`` with ``ssl.truststore.location`` or ``ssl.truststore.certificates``;
``ssl.client.auth=none|requested|required`` (mutual TLS); ``ssl.enabled.protocols``;
``ssl.endpoint.identification.algorithm`` (``https``: check the other broker's host name).

A setting that cannot be used (a missing file, a key that does not match its certificate, a
wrong password) raises ``TlsConfigError`` naming the setting, at startup. Settings are read
through ``config.get(name)`` (the broker's ``BrokerConfig``, or any mapping).
"""

from __future__ import annotations

import os
import ssl
import tempfile
from collections.abc import Callable
from typing import Any

__all__ = ["SECURITY_PROTOCOLS", "TLS_PROTOCOLS", "TlsConfigError", "check_broker_settings",
           "client_ssl_context", "inter_broker_ssl_context", "server_ssl_context", "uses_tls"]

SECURITY_PROTOCOLS = ("PLAINTEXT", "SASL_PLAINTEXT", "SSL", "SASL_SSL")
TLS_PROTOCOLS = frozenset({"SSL", "SASL_SSL"})
CLIENT_AUTH = {"none": ssl.CERT_NONE, "requested": ssl.CERT_OPTIONAL,
               "required": ssl.CERT_REQUIRED}
_VERSIONS = {"TLSv1.2": ssl.TLSVersion.TLSv1_2, "TLSv1.3": ssl.TLSVersion.TLSv1_3}


class TlsConfigError(ValueError):
    """An SSL setting that cannot be used; the message names it."""


def uses_tls(security_protocol: object) -> bool:
    return str(security_protocol).upper() in TLS_PROTOCOLS


def _setting(config: Any, name: str) -> str:
    value = config.get(name)
    return "" if value is None else str(value).strip()


# -- the broker --------------------------------------------------------------------------------


def server_ssl_context(config: Any) -> ssl.SSLContext | None:
    """The listener's context (None unless ``security.protocol`` is SSL or SASL_SSL): the
    keystore's certificate and key, the truststore for client certificates, and
    ``ssl.client.auth``."""
    if not uses_tls(_setting(config, "security.protocol")):
        return None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    _set_versions(ctx, config)
    if not _load_keystore(ctx, config):
        raise TlsConfigError("security.protocol=SSL/SASL_SSL needs the broker's certificate "
                             "and key: ssl.keystore.location (a PEM file with both), or "
                             "ssl.keystore.certificate.chain and ssl.keystore.key")
    client_auth = _setting(config, "ssl.client.auth").lower() or "none"
    if client_auth not in CLIENT_AUTH:
        raise TlsConfigError(f"ssl.client.auth must be none, requested or required, not "
                             f"{client_auth!r}")
    trusted = _load_truststore(ctx, config)
    if client_auth != "none" and not trusted:
        raise TlsConfigError(f"ssl.client.auth={client_auth} needs the certificates that sign "
                             "the clients': ssl.truststore.location or "
                             "ssl.truststore.certificates")
    ctx.verify_mode = CLIENT_AUTH[client_auth]
    return ctx


def inter_broker_ssl_context(config: Any) -> ssl.SSLContext | None:
    """What a broker connects to the others with (None without TLS): it trusts its own
    truststore (else the system's CAs) and shows its keystore's certificate, as a Kafka broker
    does, so that a listener with ``ssl.client.auth=required`` admits it."""
    protocol = _setting(config, "security.inter.broker.protocol") or \
        _setting(config, "security.protocol")
    if not uses_tls(protocol):
        return None
    algorithm = config.get("ssl.endpoint.identification.algorithm")  # Kafka's default: https
    check = str("https" if algorithm is None else algorithm).strip().lower() == "https"
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = check
    _set_versions(ctx, config)
    if not _load_truststore(ctx, config):
        ctx.load_default_certs()
    _load_keystore(ctx, config)
    return ctx


def _set_versions(ctx: ssl.SSLContext, config: Any) -> None:
    text = _setting(config, "ssl.enabled.protocols") or "TLSv1.2,TLSv1.3"
    names = [v.strip() for v in text.split(",") if v.strip()]
    bad = [v for v in names if v not in _VERSIONS]
    if bad or not names:
        raise TlsConfigError(f"ssl.enabled.protocols: {', '.join(bad) or 'none given'}; "
                             f"known: {', '.join(_VERSIONS)}")
    chosen = sorted(_VERSIONS[v] for v in names)
    ctx.minimum_version, ctx.maximum_version = chosen[0], chosen[-1]


def _check_type(config: Any, name: str) -> None:
    kind = (_setting(config, name) or "PEM").upper()
    if kind != "PEM":
        raise TlsConfigError(f"{name}={kind}: oncelog reads PEM only (convert a JKS or PKCS12 "
                             "store with keytool and openssl, then set it to PEM)")


def _load_keystore(ctx: ssl.SSLContext, config: Any) -> bool:
    """The certificate chain and key, if any setting gives them."""
    _check_type(config, "ssl.keystore.type")
    location = _setting(config, "ssl.keystore.location")
    chain = _setting(config, "ssl.keystore.certificate.chain")
    key = _setting(config, "ssl.keystore.key")
    password = _setting(config, "ssl.key.password")
    if location and (chain or key):
        raise TlsConfigError("give ssl.keystore.location or ssl.keystore.certificate.chain "
                             "with ssl.keystore.key, not both")
    if location:
        _load_chain(ctx, "ssl.keystore.location", location, None, password)
        return True
    if chain or key:
        if not (chain and key):
            raise TlsConfigError("ssl.keystore.certificate.chain and ssl.keystore.key go "
                                 "together")
        with tempfile.TemporaryDirectory(prefix="oncelog-tls-") as tmp:  # mode 0700
            cert_path = os.path.join(tmp, "chain.pem")
            key_path = os.path.join(tmp, "key.pem")
            for path, text in ((cert_path, chain), (key_path, key)):
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "w") as f:
                    f.write(_pem_text(text))
            _load_chain(ctx, "ssl.keystore.certificate.chain/ssl.keystore.key", cert_path,
                        key_path, password, shown="the settings' PEM text")
        return True
    return False


def _pem_text(text: str) -> str:
    """PEM in a properties file is often written on one line (Kafka accepts that too): put
    the line breaks back around the BEGIN/END markers."""
    if "\n" in text.strip():
        return text.strip() + "\n"
    out = text.replace("-----BEGIN", "\n-----BEGIN").replace("-----END", "\n-----END")
    out = out.replace("----- ", "-----\n")
    return "\n".join(line.strip() for line in out.splitlines() if line.strip()) + "\n"


def _load_chain(ctx: ssl.SSLContext, setting: str, certfile: str, keyfile: str | None,
                password: str, shown: str | None = None) -> None:
    """Load a chain and its key; ``shown``: what to call them in an error (default the
    file's name)."""
    # A callable, never None: with None OpenSSL would prompt for an encrypted key's password
    # on the terminal instead of failing.
    secret: Callable[[], bytes] = lambda: password.encode()
    where = shown or certfile
    try:
        ctx.load_cert_chain(certfile, keyfile, password=secret)
    except FileNotFoundError as exc:
        raise TlsConfigError(f"{setting}: no such file: {exc.filename or certfile}") from None
    except ssl.SSLError as exc:
        raise TlsConfigError(f"{setting}: cannot load the certificate chain and private key "
                             f"from {where}: {_why(exc, keyfile or certfile)}") from None
    except OSError as exc:
        raise TlsConfigError(f"{setting}: cannot read {where}: "
                             f"{exc.strerror or exc}") from None


def _why(exc: ssl.SSLError, keyfile: str) -> str:
    """OpenSSL's reason in words (Python often says only "PEM lib")."""
    reason = str(exc.reason or exc)
    if "KEY_VALUES_MISMATCH" in reason:
        return "the private key does not belong to the certificate"
    try:
        with open(keyfile, encoding="ascii", errors="replace") as f:
            encrypted = "ENCRYPTED" in f.read()
    except OSError:
        encrypted = False
    if encrypted:
        return "the private key is encrypted and ssl.key.password does not open it"
    if reason in ("PEM lib", "NO_START_LINE") or "PEM" in reason:
        return "no PEM certificate and private key there"
    return reason


def _load_truststore(ctx: ssl.SSLContext, config: Any) -> bool:
    _check_type(config, "ssl.truststore.type")
    location = _setting(config, "ssl.truststore.location")
    certificates = _setting(config, "ssl.truststore.certificates")
    if location and certificates:
        raise TlsConfigError("give ssl.truststore.location or ssl.truststore.certificates, "
                             "not both")
    try:
        if location:
            ctx.load_verify_locations(cafile=location)
        elif certificates:
            ctx.load_verify_locations(cadata=_pem_text(certificates))
        else:
            return False
    except FileNotFoundError:
        raise TlsConfigError(f"ssl.truststore.location: no such file: {location}") from None
    except (ssl.SSLError, OSError) as exc:
        setting = "ssl.truststore.location" if location else "ssl.truststore.certificates"
        raise TlsConfigError(f"{setting}: no usable PEM certificates: "
                             f"{getattr(exc, 'reason', None) or exc}") from None
    return True


# -- clients -----------------------------------------------------------------------------------


def client_ssl_context(*, cafile: str | None = None, cadata: str | None = None,
                       certfile: str | None = None, keyfile: str | None = None,
                       password: str | None = None, check_hostname: bool = True
                       ) -> ssl.SSLContext:
    """A client's context under kafka-python's names (``ssl_cafile``, ``ssl_certfile``,
    ``ssl_keyfile``, ``ssl_password``, ``ssl_check_hostname``): the broker's certificate is
    always verified (against ``cafile``/``cadata``, else the system's CAs); ``certfile`` (with
    ``keyfile`` unless it holds the key too) is shown for mutual TLS."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = check_hostname
    try:
        if cafile or cadata:
            ctx.load_verify_locations(cafile=cafile or None,
                                      cadata=_pem_text(cadata) if cadata else None)
        else:
            ctx.load_default_certs()
    except FileNotFoundError:
        raise TlsConfigError(f"ssl_cafile: no such file: {cafile}") from None
    except (ssl.SSLError, OSError) as exc:
        raise TlsConfigError(f"ssl_cafile: no usable PEM certificates: "
                             f"{getattr(exc, 'reason', None) or exc}") from None
    if certfile:
        _load_chain(ctx, "ssl_certfile", certfile, keyfile or None, password or "")
    elif keyfile:
        raise TlsConfigError("ssl_keyfile needs ssl_certfile")
    return ctx


def check_broker_settings(config: Any) -> None:
    """At startup, before the broker opens its data: every TLS setting usable (both
    contexts built once), and an inter-broker protocol the one listener can serve."""
    listener = _setting(config, "security.protocol") or "PLAINTEXT"
    inter = _setting(config, "security.inter.broker.protocol")
    if inter and uses_tls(inter) != uses_tls(listener):
        raise TlsConfigError(f"security.inter.broker.protocol={inter} cannot reach this "
                             f"broker's {listener} listener (a broker has one listener; leave "
                             "the setting empty to use the listener's protocol)")
    server_ssl_context(config)
    inter_broker_ssl_context(config)
