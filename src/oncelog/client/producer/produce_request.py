"""The Produce request body, written by hand: the producer's hot path.

kio builds a request from nested dataclasses and writes it field by field; for a Produce
request that is one object per topic and per partition and a copy of every batch, rebuilt for
each request the sender makes. This writes the same bytes (Kafka's ProduceRequest, v3-v12:
v3 added the transactional id, v9 made it flexible, v13 names topics by id) straight from the
batches' wire bytes, joined once. ``tests/test_produce_request.py`` checks it against kio's
encoding, version by version.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from ...primitives import encode_string, encode_uvarint

MIN_VERSION = 3
MAX_VERSION = 12  # v13 names topics by id
FIRST_FLEXIBLE = 9

_ACKS_TIMEOUT = struct.Struct(">hi")
_I32 = struct.Struct(">i")

# (topic, [(partition, batch bytes), ...]) in the order they go on the wire
TopicData = Sequence[tuple[str, Sequence[tuple[int, bytes]]]]


def produce_body(version: int, transactional_id: str | None, acks: int, timeout_ms: int,
                 topics: TopicData) -> bytes:
    """The body (after the request header) of a Produce request of ``version``."""
    if not MIN_VERSION <= version <= MAX_VERSION:
        raise ValueError(f"Produce v{version}: written by hand for v{MIN_VERSION}-v{MAX_VERSION}")
    parts: list[bytes] = []
    add = parts.append
    if version >= FIRST_FLEXIBLE:
        if transactional_id is None:
            add(b"\x00")
        else:
            data = transactional_id.encode()
            add(encode_uvarint(len(data) + 1) + data)
        add(_ACKS_TIMEOUT.pack(acks, timeout_ms))
        add(encode_uvarint(len(topics) + 1))
        for name, partitions in topics:
            data = name.encode()
            add(encode_uvarint(len(data) + 1) + data + encode_uvarint(len(partitions) + 1))
            for index, records in partitions:
                add(_I32.pack(index) + encode_uvarint(len(records) + 1))
                add(records)
                add(b"\x00")  # the partition's tagged fields
            add(b"\x00")  # the topic's
        add(b"\x00")  # the request's
    else:
        add(encode_string(transactional_id))
        add(_ACKS_TIMEOUT.pack(acks, timeout_ms))
        add(_I32.pack(len(topics)))
        for name, partitions in topics:
            add(encode_string(name) + _I32.pack(len(partitions)))
            for index, records in partitions:
                add(_I32.pack(index) + _I32.pack(len(records)))
                add(records)
    return b"".join(parts)
