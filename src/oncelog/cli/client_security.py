"""The security settings of the commands that talk to a broker: ``--security-protocol``,
``--user``/``--password``/``--sasl-mechanism`` and ``--command-config FILE`` (a properties
file of client settings, as Kafka's tools take it), as our client's keyword arguments.

From the file: ``security.protocol``; ``sasl.mechanism`` with ``sasl.jaas.config`` (Kafka's
``...LoginModule required username="alice" password="secret";``) or librdkafka's
``sasl.username``/``sasl.password``; the TLS settings under Kafka's, librdkafka's or
kafka-python's names (``ssl.truststore.location``, ``ssl.keystore.location``,
``ssl.key.password``, ``ssl.endpoint.identification.algorithm``, ``ssl.ca.location`` ...).
Other settings are ignored with a warning, as Kafka's tools warn of configs they do not use.
The flags win over the file.
"""

from __future__ import annotations

import os
import sys

from ..client.config import is_alias
from ..security.sasl import jaas_options
from .properties import load_properties

_SSL_KEYS = {"ssl.cafile", "ssl.certfile", "ssl.keyfile", "ssl.password", "ssl.check.hostname"}
_SASL_USER = ("sasl.username", "sasl.plain.username")
_SASL_PASSWORD = ("sasl.password", "sasl.plain.password")


def security_settings(args) -> dict:
    """Keyword arguments for Producer/Consumer/Admin (none for a plain connection)."""
    props = load_properties(args.command_config) if getattr(args, "command_config", None) \
        else {}
    out: dict = {}
    username = password = None
    for key, value in props.items():
        if key == "security.protocol":
            out["security_protocol"] = value.strip().upper()
        elif key == "sasl.mechanism":
            out["sasl_mechanism"] = value.strip().upper()
        elif key == "sasl.jaas.config":
            options = jaas_options(value)
            username = options.get("username", username)
            password = options.get("password", password)
        elif key in _SASL_USER:
            username = value
        elif key in _SASL_PASSWORD:
            password = value
        elif key in _SSL_KEYS or is_alias(key):
            out[key.replace(".", "_")] = value
        else:
            print(f"oncelog: {args.command_config}: ignoring {key} (not a security setting "
                  "oncelog's client uses)", file=sys.stderr)
    protocol = getattr(args, "security_protocol", None) or out.get("security_protocol")
    if getattr(args, "user", None):
        username = args.user
        password = args.password if args.password is not None else \
            os.environ.get("ONCELOG_PASSWORD")
        if password is None:
            raise ValueError("--user needs --password (or $ONCELOG_PASSWORD)")
        if "sasl_mechanism" not in out or args.sasl_mechanism != "SCRAM-SHA-512":
            out["sasl_mechanism"] = args.sasl_mechanism  # the flag, or its default
    if username is not None:
        # credentials without a SASL protocol: SASL over what was asked (TLS or not)
        if protocol in (None, "PLAINTEXT"):
            protocol = "SASL_PLAINTEXT"
        elif protocol == "SSL":
            protocol = "SASL_SSL"
        out.update(sasl_plain_username=username, sasl_plain_password=password)
        out.setdefault("sasl_mechanism", "SCRAM-SHA-512")
    if protocol is not None:
        out["security_protocol"] = protocol
    return out
