"""Kafka's ConsumerProtocol (the metadata a consumer joins a group with, and the assignment
its leader hands out) through kio's classes for Kafka's schemas, every version: a newer version
than we know is read with the newest we know (later versions only append fields). The client's
assignors (client/consumer/assignors.py) and the broker's OffsetDelete (which must know the topics a
group is subscribed to) read it here."""

from __future__ import annotations

import struct
from typing import Any

from kio.schema.consumer_protocol_assignment.v0 import data as asg_v0
from kio.schema.consumer_protocol_assignment.v1 import data as asg_v1
from kio.schema.consumer_protocol_assignment.v2 import data as asg_v2
from kio.schema.consumer_protocol_assignment.v3 import data as asg_v3
from kio.schema.consumer_protocol_subscription.v0 import data as sub_v0
from kio.schema.consumer_protocol_subscription.v1 import data as sub_v1
from kio.schema.consumer_protocol_subscription.v2 import data as sub_v2
from kio.schema.consumer_protocol_subscription.v3 import data as sub_v3

from . import ProtocolError, decode_data

VERSION = struct.Struct(">h")
SUBSCRIPTIONS: tuple[Any, ...] = (sub_v0.ConsumerProtocolSubscription,
                                  sub_v1.ConsumerProtocolSubscription,
                                  sub_v2.ConsumerProtocolSubscription,
                                  sub_v3.ConsumerProtocolSubscription)
ASSIGNMENTS: tuple[Any, ...] = (asg_v0.ConsumerProtocolAssignment,
                                asg_v1.ConsumerProtocolAssignment,
                                asg_v2.ConsumerProtocolAssignment,
                                asg_v3.ConsumerProtocolAssignment)


def schema_for(data: bytes, schemas: tuple[Any, ...], what: str) -> Any:
    """The class to read ``data`` (a version, then the body) with; ProtocolError without one."""
    if len(data) < 2:
        raise ProtocolError(f"{what} of {len(data)} bytes has no version")
    (version,) = VERSION.unpack_from(data, 0)
    if version < 0:
        raise ProtocolError(f"{what} version {version}")
    return schemas[min(version, len(schemas) - 1)]


def read_subscription(data: bytes) -> Any:
    """The kio ConsumerProtocolSubscription in ``data``; ProtocolError when malformed."""
    return decode_data(schema_for(data, SUBSCRIPTIONS, "subscription"), data, 2)


def read_assignment(data: bytes) -> Any:
    """The kio ConsumerProtocolAssignment in ``data``; ProtocolError when malformed."""
    return decode_data(schema_for(data, ASSIGNMENTS, "assignment"), data, 2)


def subscribed_topics(data: bytes) -> frozenset[str]:
    """The topics a consumer's group metadata subscribes to (none when it cannot be read)."""
    try:
        return frozenset(read_subscription(data).topics)
    except ProtocolError:
        return frozenset()
