"""The broker: ``run_broker`` for the command line, ``EmbeddedBroker`` for tests and demos."""

from .broker import Broker
from .config import BrokerConfig, ConfigError
from .network import BrokerServer
from .run import run_broker

__all__ = ["Broker", "BrokerConfig", "BrokerServer", "ConfigError", "run_broker"]
