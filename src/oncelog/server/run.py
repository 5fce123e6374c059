"""Running a broker in the foreground: event loop (uvloop when installed), signals, banner."""

from __future__ import annotations

import asyncio
import configparser
import datetime as _dt
import json
import logging
import logging.config
import os
import signal
import sys
from pathlib import Path

from ..loop_thread import new_event_loop
from ..security.tls import check_broker_settings
from .broker import Broker
from .config import BrokerConfig
from .interbroker_sasl import inter_broker_login
from .network import BrokerServer


async def _serve(data_dir: Path, host: str, port: int, config: BrokerConfig) -> None:
    broker = Broker(data_dir, config, host=host, port=port)
    server = BrokerServer(broker, host, port)
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    protocol = str(config.get("security.protocol"))
    tls = f" with {protocol}" if protocol != "PLAINTEXT" else ""
    print(f"oncelog broker listening on {host}:{server.port}{tls} (data dir {data_dir}, "
          f"cluster {broker.cluster_id})", flush=True)
    if server.http is not None and server.metrics_port is not None:
        print(f"oncelog metrics at {server.http.scheme}://{host}:{server.metrics_port}/metrics",
              flush=True)
    if server.console is not None:
        print(f"oncelog console at {server.console.scheme}://{host}:{server.console.port}/",
              flush=True)
    await stop.wait()
    await server.stop()
    print("oncelog broker stopped cleanly", flush=True)


def set_log_levels(spec: str) -> None:
    """``ONCELOG_LOG_LEVEL``: a level for everything (``DEBUG``) and/or for loggers
    (``oncelog.txn=DEBUG,oncelog.replication=DEBUG``), as log4j's logger levels in Kafka."""
    for part in filter(None, (p.strip() for p in spec.split(","))):
        name, _, level = part.rpartition("=")
        try:
            logging.getLogger(name or None).setLevel(level.strip().upper())
        except ValueError:
            print(f"oncelog broker: ignoring ONCELOG_LOG_LEVEL part {part!r} (levels: DEBUG, "
                  f"INFO, WARNING, ERROR)", file=sys.stderr)


TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
LOG_FORMATS = ("text", "json")


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``time`` (ISO 8601, UTC, milliseconds), ``level``,
    ``logger``, ``message``, and ``exception`` (its traceback) when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = _dt.datetime.fromtimestamp(record.created, _dt.UTC)
        out = {"time": stamp.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
               "level": record.levelname, "logger": record.name,
               "message": record.getMessage()}
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exception"] = record.exc_text
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, ensure_ascii=False)


def configure_logging(log_config: str | Path | None = None, log_file: str | Path | None = None,
                      log_format: str = "text") -> None:
    """The broker's logging: by default INFO and up, as text, to stderr. ``log_file``: to
    that file instead (appended to); ``log_format`` "json": one JSON object per line.
    ``log_config``: Python's own logging configuration instead of both, as Kafka takes a
    log4j file: a ``.json`` file is a ``logging.config.dictConfig`` dictionary, any other
    file ``logging.config.fileConfig``'s INI format. ``ONCELOG_LOG_LEVEL`` applies on top.
    Raises ValueError for a configuration that cannot be used."""
    if log_format not in LOG_FORMATS:
        raise ValueError(f"--log-format {log_format}: expected one of {', '.join(LOG_FORMATS)}")
    if log_config is not None:
        path = Path(log_config)
        try:
            if path.suffix.lower() == ".json":
                logging.config.dictConfig(json.loads(path.read_text()))
            else:
                if not path.is_file():
                    raise FileNotFoundError(f"no such file: {path}")
                logging.config.fileConfig(path, disable_existing_loggers=False)
        except (OSError, ValueError, TypeError, KeyError, AttributeError, ImportError,
                configparser.Error) as exc:
            raise ValueError(f"--log-config {path}: {exc}") from None
    else:
        handler: logging.Handler
        if log_file is not None:
            try:
                handler = logging.FileHandler(log_file, encoding="utf-8")
            except OSError as exc:
                raise ValueError(f"--log-file {log_file}: {os.strerror(exc.errno or 0)}"
                                 if exc.errno else f"--log-file {log_file}: {exc}") from None
        else:
            handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(JsonFormatter() if log_format == "json"
                             else logging.Formatter(TEXT_FORMAT))
        logging.basicConfig(level=logging.INFO, handlers=[handler], force=True)
    set_log_levels(os.environ.get("ONCELOG_LOG_LEVEL", ""))


def run_broker(data_dir: str | Path, host: str = "127.0.0.1", port: int = 9092,
               overrides: dict[str, str] | None = None, *,
               log_config: str | Path | None = None, log_file: str | Path | None = None,
               log_format: str = "text") -> None:
    configure_logging(log_config, log_file, log_format)
    config = BrokerConfig(overrides)
    check_broker_settings(config)  # a bad certificate file is named before anything starts
    inter_broker_login(config)  # so is a SASL cluster broker without its own credentials
    loop = new_event_loop()
    try:
        loop.run_until_complete(_serve(Path(data_dir), host, port, config))
    finally:
        loop.close()
