"""Running a broker in the foreground: event loop (uvloop when installed), signals, banner."""

from __future__ import annotations

import asyncio
import logging
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


def run_broker(data_dir: str | Path, host: str = "127.0.0.1", port: int = 9092,
               overrides: dict[str, str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    set_log_levels(os.environ.get("ONCELOG_LOG_LEVEL", ""))
    config = BrokerConfig(overrides)
    check_broker_settings(config)  # a bad certificate file is named before anything starts
    inter_broker_login(config)  # so is a SASL cluster broker without its own credentials
    loop = new_event_loop()
    try:
        loop.run_until_complete(_serve(Path(data_dir), host, port, config))
    finally:
        loop.close()
