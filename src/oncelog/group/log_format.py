"""``__consumer_offsets`` records, in Kafka's own layout.

    offset commit:  key   => version int16 (1), group string, topic string, partition int32
                    value => version int16 (3), offset int64, leader_epoch int32,
                             metadata string, commit_timestamp int64
    group metadata: key   => version int16 (2), group string
                    value => version int16 (3), protocol_type string, generation int32,
                             protocol nullable string, leader nullable string,
                             current_state_timestamp int64,
                             [member_id string, group_instance_id nullable string,
                              client_id string, client_host string, rebalance_timeout int32,
                              session_timeout int32, subscription bytes, assignment bytes]

A null value (a tombstone) deletes what its key names. Strings are int16-length-prefixed,
bytes int32-length-prefixed, arrays int32-count-prefixed.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from ..primitives import INT16 as _H
from ..primitives import INT32 as _I
from ..primitives import INT64 as _Q
from ..primitives import DecodeError, encode_bytes, encode_string, read_bytes, read_string

OFFSET_KEY_VERSION = 1
GROUP_KEY_VERSION = 2
OFFSET_VALUE_VERSION = 3
GROUP_VALUE_VERSION = 3


class GroupLogFormatError(ValueError):
    pass


@dataclass(frozen=True)
class OffsetKey:
    group: str
    topic: str
    partition: int


@dataclass(frozen=True)
class GroupKey:
    group: str


@dataclass(frozen=True)
class OffsetValue:
    offset: int
    leader_epoch: int = -1
    metadata: str = ""
    commit_timestamp: int = -1


@dataclass(frozen=True)
class MemberValue:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    subscription: bytes
    assignment: bytes


@dataclass(frozen=True)
class GroupValue:
    protocol_type: str
    generation: int
    protocol: str | None
    leader: str | None
    current_state_timestamp: int
    members: tuple[MemberValue, ...]


class _Writer:
    def __init__(self) -> None:
        self.out = bytearray()

    def int16(self, v: int) -> _Writer:
        self.out += _H.pack(v)
        return self

    def int32(self, v: int) -> _Writer:
        self.out += _I.pack(v)
        return self

    def int64(self, v: int) -> _Writer:
        self.out += _Q.pack(v)
        return self

    def string(self, s: str | None) -> _Writer:
        self.out += encode_string(s)
        return self

    def bytes_(self, b: bytes) -> _Writer:
        self.out += encode_bytes(b)
        return self


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def _take(self, fmt: struct.Struct) -> int:
        if self.pos + fmt.size > len(self.data):
            raise GroupLogFormatError("record truncated")
        (v,) = fmt.unpack_from(self.data, self.pos)
        self.pos += fmt.size
        return v

    def int16(self) -> int:
        return self._take(_H)

    def int32(self) -> int:
        return self._take(_I)

    def int64(self) -> int:
        return self._take(_Q)

    def string(self) -> str | None:
        try:
            s, self.pos = read_string(self.data, self.pos)
        except DecodeError as exc:
            raise GroupLogFormatError(str(exc)) from None
        return s

    def bytes_(self) -> bytes:
        try:
            b, self.pos = read_bytes(self.data, self.pos)
        except DecodeError as exc:
            raise GroupLogFormatError(str(exc)) from None
        return b

    def end(self) -> None:
        if self.pos != len(self.data):
            raise GroupLogFormatError("trailing bytes")


def encode_key(key: OffsetKey | GroupKey) -> bytes:
    if isinstance(key, OffsetKey):
        return bytes(_Writer().int16(OFFSET_KEY_VERSION).string(key.group).string(key.topic)
                     .int32(key.partition).out)
    return bytes(_Writer().int16(GROUP_KEY_VERSION).string(key.group).out)


def decode_key(data: bytes) -> OffsetKey | GroupKey:
    r = _Reader(data)
    version = r.int16()
    group = r.string() or ""
    if version in (0, 1):
        key: OffsetKey | GroupKey = OffsetKey(group, r.string() or "", r.int32())
    elif version == GROUP_KEY_VERSION:
        key = GroupKey(group)
    else:
        raise GroupLogFormatError(f"unknown __consumer_offsets key version {version}")
    r.end()
    return key


def encode_offset(v: OffsetValue) -> bytes:
    return bytes(_Writer().int16(OFFSET_VALUE_VERSION).int64(v.offset).int32(v.leader_epoch)
                 .string(v.metadata).int64(v.commit_timestamp).out)


def decode_offset(data: bytes) -> OffsetValue:
    r = _Reader(data)
    version = r.int16()
    if version != OFFSET_VALUE_VERSION:
        raise GroupLogFormatError(f"unknown offset commit value version {version}")
    v = OffsetValue(r.int64(), r.int32(), r.string() or "", r.int64())
    r.end()
    return v


def encode_group(v: GroupValue) -> bytes:
    w = (_Writer().int16(GROUP_VALUE_VERSION).string(v.protocol_type).int32(v.generation)
         .string(v.protocol).string(v.leader).int64(v.current_state_timestamp)
         .int32(len(v.members)))
    for m in v.members:
        (w.string(m.member_id).string(m.group_instance_id).string(m.client_id)
         .string(m.client_host).int32(m.rebalance_timeout_ms).int32(m.session_timeout_ms)
         .bytes_(m.subscription).bytes_(m.assignment))
    return bytes(w.out)


def decode_group(data: bytes) -> GroupValue:
    r = _Reader(data)
    version = r.int16()
    if version != GROUP_VALUE_VERSION:
        raise GroupLogFormatError(f"unknown group metadata value version {version}")
    protocol_type = r.string() or ""
    generation = r.int32()
    protocol = r.string()
    leader = r.string()
    ts = r.int64()
    members = []
    for _ in range(r.int32()):
        members.append(MemberValue(r.string() or "", r.string(), r.string() or "",
                                   r.string() or "", r.int32(), r.int32(), r.bytes_(),
                                   r.bytes_()))
    r.end()
    return GroupValue(protocol_type, generation, protocol, leader, ts, tuple(members))
