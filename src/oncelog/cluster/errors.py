"""The cluster's refusals. Apart from the ZooKeeper client because a single node's metadata
and the controller's decisions (cluster/controller.py) raise them too, without kazoo.

ZooKeeper being away is none of these: that is a ``kazoo.exceptions.KazooException``."""

from __future__ import annotations

__all__ = [
    "BrokerIdInUseError",
    "ClusterConnectionError",
    "ClusterError",
    "ControllerMovedError",
    "TopicExistsError",
    "UnknownTopicError",
]


class ClusterError(Exception):
    """A cluster-level refusal (not ZooKeeper being away: that is a KazooException)."""


class ClusterConnectionError(ClusterError):
    """ZooKeeper could not be reached when connecting."""


class BrokerIdInUseError(ClusterError):
    """Another live ZooKeeper session holds ``/brokers/ids/<id>``."""


class TopicExistsError(ClusterError):
    """The topic exists (or is being deleted)."""


class UnknownTopicError(ClusterError):
    """No such topic."""


class ControllerMovedError(ClusterError):
    """A fenced controller write failed: another controller was elected since."""
