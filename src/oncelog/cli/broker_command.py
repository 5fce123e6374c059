"""``oncelog broker``: its flags, and its settings from a ``server.properties`` file.

Precedence, lowest first: the file (``--config FILE``), then ``--set KEY=VALUE``, then the
flags that name one setting (``--port``, ``--security-protocol``, ``--node-id`` ...). A few
of Kafka's names are read here rather than by the broker's settings: ``listeners`` (one
listener: ``SSL://host:9093``; its name is a security protocol or is mapped to one by
``listener.security.protocol.map``), ``log.dirs``/``log.dir`` (one directory: the data
directory, when ``--data-dir`` is not given) and ``broker.id`` (``node.id``).
"""

from __future__ import annotations

import argparse
import errno
import os
import sys
from pathlib import Path

from .args import key_value
from .properties import PropertiesError, load_properties

PROTOCOLS = ["PLAINTEXT", "SASL_PLAINTEXT", "SSL", "SASL_SSL"]
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 9092


def add_arguments(b: argparse.ArgumentParser) -> None:
    b.add_argument("--config", default=None, metavar="FILE",
                   help="a server.properties file of broker settings under Kafka's names "
                   "(--set and the flags below override it)")
    b.add_argument("--node-id", type=int, default=None,
                   help="this broker's id in the cluster (node.id; default 1)")
    b.add_argument("--zookeeper", default=None, metavar="HOST:PORT[/CHROOT]",
                   help="join the cluster coordinated by this ZooKeeper (zookeeper.connect)")
    b.add_argument("--data-dir", default=None,
                   help="directory for the logs and metadata (default: log.dirs of --config)")
    b.add_argument("--host", default=None,
                   help=f"address to listen on (default {DEFAULT_HOST}, or the host of "
                   "listeners=)")
    b.add_argument("--port", type=int, default=None,
                   help=f"port to listen on (default {DEFAULT_PORT}, or the port of "
                   "listeners=; 0 picks a free one)")
    b.add_argument("--metrics-port", type=int, default=None, help="serve the metrics as "
                   "Prometheus text at http://HOST:PORT/metrics (metrics.port; 0 picks a free "
                   "port; HTTPS and the broker's users as the console's port, which serves "
                   "/metrics too)")
    b.add_argument("--console-port", type=int, default=None, help="serve the read-only web "
                   "console at http://HOST:PORT/ (console.port; 0 picks a free port)")
    b.add_argument("--set", action="append", type=key_value, default=[], metavar="KEY=VALUE",
                   help="a broker setting under Kafka's name, e.g. log.segment.bytes=1048576 "
                   "or log.flush.interval.messages=1 (repeatable)")
    b.add_argument("--security-protocol", choices=PROTOCOLS, default=None,
                   help="SASL_PLAINTEXT / SASL_SSL: clients authenticate (PLAIN, "
                   "SCRAM-SHA-256/512) and ACLs apply; SSL / SASL_SSL: TLS, with the ssl.* "
                   "settings (security.protocol; docs/security.md)")
    b.add_argument("--users", default=None, metavar="FILE",
                   help="the SASL users, one name:password per line (sasl.users.file)")
    b.add_argument("--log-file", default=None, metavar="PATH",
                   help="write the broker's log to this file (appended to) instead of stderr")
    b.add_argument("--log-format", choices=["text", "json"], default="text",
                   help="text (default), or json: one JSON object per line with time, level, "
                   "logger and message")
    b.add_argument("--log-config", default=None, metavar="FILE",
                   help="Python's logging configuration instead of --log-file/--log-format: "
                   "a .json file is a logging.config.dictConfig dictionary, any other an INI "
                   "file for logging.config.fileConfig (docs/cli.md)")


def _listener(value: str, protocol_map: str) -> tuple[str, str, int]:
    """(security protocol, host, port) of Kafka's ``listeners`` value, which must name one
    listener here."""
    listeners = [x.strip() for x in value.split(",") if x.strip()]
    if len(listeners) != 1:
        raise ValueError(f"listeners={value}: an oncelog broker has one listener")
    name, sep, address = listeners[0].partition("://")
    host, colon, port = address.rpartition(":")
    if not sep or not colon or not port.isdigit():
        raise ValueError(f"listeners={value}: expected NAME://HOST:PORT, e.g. SSL://:9093")
    mapping = dict(pair.split(":", 1) for pair in protocol_map.split(",") if ":" in pair)
    protocol = mapping.get(name, name).strip().upper()
    if protocol not in PROTOCOLS:
        raise ValueError(f"listeners={value}: listener {name} has no security protocol "
                         f"({', '.join(PROTOCOLS)}, or listener.security.protocol.map)")
    return protocol, host.strip("[]"), int(port)


def broker_settings(args) -> tuple[str, str, int, dict[str, str]]:
    """(data dir, host, port, settings) from the file, --set and the flags."""
    settings: dict[str, str] = {}
    if args.config is not None:
        settings.update(load_properties(args.config))
    settings.update(dict(args.set))
    host, port = DEFAULT_HOST, DEFAULT_PORT
    protocol_map = settings.pop("listener.security.protocol.map", "")
    listeners = settings.pop("listeners", None)
    if listeners:
        protocol, listen_host, port = _listener(listeners, protocol_map)
        host = listen_host or host  # empty: the default address (Kafka's: every interface)
        settings.setdefault("security.protocol", protocol)
    if "broker.id" in settings:
        settings.setdefault("node.id", settings.pop("broker.id"))
    log_dirs = settings.pop("log.dirs", None) or settings.pop("log.dir", None)
    settings.pop("log.dir", None)
    data_dir = args.data_dir
    if data_dir is None:
        dirs = [d.strip() for d in (log_dirs or "").split(",") if d.strip()]
        if len(dirs) != 1:
            raise ValueError("--data-dir is needed (or log.dirs naming one directory in "
                             "--config)" if not dirs else
                             f"log.dirs={log_dirs}: an oncelog broker has one data directory")
        data_dir = dirs[0]
    if args.host is not None:
        host = args.host
    if args.port is not None:
        port = args.port
    if args.metrics_port is not None:
        settings["metrics.port"] = str(args.metrics_port)
    if args.console_port is not None:
        settings["console.port"] = str(args.console_port)
    if args.node_id is not None:
        settings["node.id"] = str(args.node_id)
    if args.zookeeper is not None:
        settings["zookeeper.connect"] = args.zookeeper
    if args.security_protocol is not None:
        settings["security.protocol"] = args.security_protocol
    if args.users is not None:
        settings["sasl.users.file"] = str(Path(args.users).resolve())
    return data_dir, host, port, settings


def run(args) -> int:
    from ..server import ConfigError, run_broker

    host, port = args.host, args.port  # (for the message if the settings fail to load)
    try:
        data_dir, host, port, settings = broker_settings(args)
        run_broker(data_dir, host, port, settings, log_config=args.log_config,
                   log_file=args.log_file, log_format=args.log_format)
    except (ConfigError, PropertiesError, ValueError) as exc:
        print(f"oncelog broker: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        # In words, without errno numbers or asyncio's address tuples (an error of ours,
        # with no errno, says it all already).
        if exc.errno == errno.EADDRINUSE:
            text = f"failed to bind to {host}:{port}: {os.strerror(exc.errno)}"
        elif exc.errno:
            text = os.strerror(exc.errno) + (f": {exc.filename}" if exc.filename else "")
        else:
            text = str(exc)
        print(f"oncelog broker: cannot start: {text}", file=sys.stderr)
        return 1
    return 0
