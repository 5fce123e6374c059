"""Kafka wire framing shared by the broker and our client.

Every frame is ``int32 size`` followed by a header and a body. Bodies are encoded and decoded
with the ``kio`` package (one dataclass per API, version and direction); headers are read here
by hand because they are tiny, on the hot path, and must be read before we know whether kio has
a schema for the request at all (an unknown API key still deserves a reply).

Request header v1 (non-flexible APIs): api_key int16, api_version int16, correlation_id int32,
client_id nullable string. v2 (flexible APIs) adds tagged fields. Response header v0:
correlation_id; v1 (flexible) adds tagged fields. ApiVersions always answers with header v0.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import io
import struct
from dataclasses import dataclass
from functools import cache
from types import ModuleType
from typing import Any

from kio.index import load_payload_module
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer
from kio.static.constants import EntityType

from ..primitives import DecodeError, encode_string, read_uvarint
from ..records.region import FileRegion
from .apis import API_NAMES, ApiKey
from .bounds import BoundsError, check_body
from .fetch_response import FetchResponseWriter
from .produce_request import ProduceRequestError, read_produce_request
from .produce_response import ProduceResponseWriter

_HEADER_FIXED = struct.Struct(">hhi")
_SIZE = struct.Struct(">i")
_I16 = struct.Struct(">h")

__all__ = [
    "API_NAMES",
    "ApiKey",
    "ProtocolError",
    "RequestHeader",
    "decode_data",
    "decode_request_body",
    "decode_response",
    "encode_data",
    "encode_request",
    "encode_response",
    "encode_response_parts",
    "make",
    "millis",
    "parse_request_header",
    "request_class",
    "request_module",
    "response_class",
    "response_module",
]


class ProtocolError(ValueError):
    """A frame that cannot be understood: truncated, malformed, or of an unknown shape."""


@dataclass(frozen=True, slots=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    body_offset: int


@cache
def request_module(api_key: int, version: int) -> ModuleType:
    try:
        return load_payload_module(api_key, version, EntityType.request)
    except Exception as exc:
        raise ProtocolError(f"no schema for api {api_key} v{version}") from exc


@cache
def response_module(api_key: int, version: int) -> ModuleType:
    try:
        return load_payload_module(api_key, version, EntityType.response)
    except Exception as exc:
        raise ProtocolError(f"no schema for api {api_key} v{version}") from exc


_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.UTC)


def _convert(kafka_type: str, value: Any) -> Any:
    if kafka_type in ("timedelta_i32", "timedelta_i64") and isinstance(value, int):
        return _dt.timedelta(milliseconds=value)
    if kafka_type == "datetime_i64" and isinstance(value, int):
        return None if value < 0 else _EPOCH + _dt.timedelta(milliseconds=value)
    if kafka_type == "error_code" and not isinstance(value, ErrorCode):
        return ErrorCode(int(value))
    return value


@cache
def _field_types(cls: type) -> dict[str, str]:
    return {f.name: f.metadata.get("kafka_type", "") for f in dataclasses.fields(cls)}


def make(cls: type, **values: Any) -> Any:
    """Build a kio entity from plain Python values, keeping only the fields this version has.

    One code path then serves every version of an API: fields a version lacks are dropped,
    milliseconds become timedeltas/datetimes and error codes become ErrorCode members.
    """
    types = _field_types(cls)
    return cls(**{k: _convert(types[k], v) for k, v in values.items() if k in types})


def millis(value: Any) -> int:
    """A kio timedelta/datetime field back to integer milliseconds (None/-1 stay -1)."""
    if value is None:
        return -1
    if isinstance(value, _dt.timedelta):
        return round(value.total_seconds() * 1000)
    if isinstance(value, _dt.datetime):
        return round((value - _EPOCH).total_seconds() * 1000)
    return int(value)


@cache
def request_class(api_key: int, version: int) -> Any:
    """kio's request dataclass, or raise ProtocolError if kio has no such API/version."""
    try:
        module = load_payload_module(api_key, version, EntityType.request)
    except Exception as exc:
        raise ProtocolError(f"no schema for api {api_key} v{version}") from exc
    for obj in vars(module).values():
        if isinstance(obj, type) and getattr(obj, "__type__", None) == EntityType.request:
            return obj
    raise ProtocolError(f"no request class for api {api_key} v{version}")


@cache
def response_class(api_key: int, version: int) -> Any:
    try:
        module = load_payload_module(api_key, version, EntityType.response)
    except Exception as exc:
        raise ProtocolError(f"no schema for api {api_key} v{version}") from exc
    for obj in vars(module).values():
        if isinstance(obj, type) and getattr(obj, "__type__", None) == EntityType.response:
            return obj
    raise ProtocolError(f"no response class for api {api_key} v{version}")


@cache
def _reader(cls: Any) -> Any:
    return entity_reader(cls)


@cache
def _writer(cls: Any) -> Any:
    return entity_writer(cls)


def _read_uvarint(buf, pos: int) -> tuple[int, int]:
    try:
        return read_uvarint(buf, pos)
    except DecodeError as exc:
        raise ProtocolError(f"{exc} in header") from None


def _skip_tagged_fields(buf, pos: int) -> int:
    count, pos = _read_uvarint(buf, pos)
    for _ in range(count):
        _tag, pos = _read_uvarint(buf, pos)
        size, pos = _read_uvarint(buf, pos)
        pos += size
        if pos > len(buf):
            raise ProtocolError("truncated tagged field in header")
    return pos


def _is_flexible_request(api_key: int, version: int) -> bool:
    try:
        return bool(request_class(api_key, version).__flexible__)
    except ProtocolError:
        return False


def parse_request_header(frame) -> RequestHeader:
    """Parse a request header from a frame (size prefix already stripped).

    Works for any API key and version, known or not, so that the broker can answer
    UNSUPPORTED_VERSION with the right correlation id.
    """
    if len(frame) < 8:
        raise ProtocolError(f"request header truncated: {len(frame)} bytes")
    api_key, api_version, correlation_id = _HEADER_FIXED.unpack_from(frame, 0)
    pos = 8
    if len(frame) < 10:
        raise ProtocolError("request header truncated: no client id")
    (n,) = _I16.unpack_from(frame, pos)
    pos += 2
    client_id: str | None = None
    if n >= 0:
        if pos + n > len(frame):
            raise ProtocolError("request header truncated: client id")
        client_id = bytes(frame[pos : pos + n]).decode("utf-8", "replace")
        pos += n
    elif n != -1:
        raise ProtocolError(f"bad client id length {n}")
    if _is_flexible_request(api_key, api_version):
        pos = _skip_tagged_fields(frame, pos)
    return RequestHeader(api_key, api_version, correlation_id, client_id, pos)


def decode_request_body(header: RequestHeader, frame) -> Any:
    if header.api_key == ApiKey.PRODUCE and 3 <= header.api_version <= 12:
        try:  # read by hand: record sets stay views of the frame (produce_request.py)
            return read_produce_request(header.api_version, frame, header.body_offset)
        except ProduceRequestError as exc:
            raise ProtocolError(f"malformed ProduceRequest v{header.api_version}: {exc}"
                                ) from None
    cls = request_class(header.api_key, header.api_version)
    try:
        # Every length checked before kio's native reader reserves memory for it (bounds.py).
        check_body(cls, frame, header.body_offset)
    except BoundsError as exc:
        raise ProtocolError(f"malformed {cls.__name__} v{header.api_version}: {exc}") from None
    try:
        obj, size = _reader(cls)(frame, header.body_offset)
    except Exception as exc:
        raise ProtocolError(f"malformed {cls.__name__} v{header.api_version}: {exc}") from exc
    if header.body_offset + size > len(frame):
        raise ProtocolError(f"{cls.__name__} v{header.api_version}: body truncated")
    # Trailing bytes are ignored, as Kafka's own parser does: librdkafka's Metadata v12
    # request, for one, carries a few bytes past the schema.
    return obj


class _FrameParts:
    """A kio Writable that keeps large ``bytes`` writes (a Fetch response's record sets) by
    reference and gathers the small ones, so that a response goes to the socket as a list of
    parts (one writev) without being copied into one buffer first."""

    __slots__ = ("parts", "size", "small")
    LARGE = 16 * 1024

    def __init__(self) -> None:
        self.parts: list[Any] = [b""]  # [0]: size prefix and header, set last
        self.small = bytearray()
        self.size = 0

    def write(self, data: Any) -> int:
        n = len(data)
        if (n >= self.LARGE and type(data) is bytes) or type(data) is FileRegion:
            # immutable bytes, or bytes left in a file: kept by reference
            if self.small:
                self.parts.append(bytes(self.small))
                self.small.clear()
            self.parts.append(data)
        else:
            self.small += data
        self.size += n
        return n


_HAND_WRITTEN = (FetchResponseWriter, ProduceResponseWriter)


def encode_response_parts(correlation_id: int, response: Any) -> list[Any]:
    """A complete response frame, size prefix included, as parts to write in order: bytes,
    and FileRegions (record sets a Fetch left in their segment files)."""
    if type(response) in _HAND_WRITTEN:  # encoded as it was built
        return response.frame(correlation_id)
    head = _SIZE.pack(correlation_id)
    if response.__header_schema__.__version__ >= 1:
        head += b"\x00"  # no tagged fields in the response header
    out = _FrameParts()
    _writer(type(response))(out, response)  # type: ignore[arg-type]
    if out.small:
        out.parts.append(bytes(out.small))
    out.parts[0] = _SIZE.pack(len(head) + out.size) + head
    return out.parts


def encode_response(correlation_id: int, response: Any) -> bytes:
    """A complete response frame, size prefix included."""
    return b"".join(p.read() if type(p) is FileRegion else p
                    for p in encode_response_parts(correlation_id, response))


def encode_request(correlation_id: int, client_id: str | None, request: Any) -> bytes:
    """A complete request frame, size prefix included."""
    cls: Any = type(request)
    buf = io.BytesIO()
    buf.write(b"\x00\x00\x00\x00")
    buf.write(_HEADER_FIXED.pack(cls.__api_key__, cls.__version__, correlation_id))
    buf.write(encode_string(client_id))  # nullable
    if cls.__flexible__:
        buf.write(b"\x00")
    _writer(cls)(buf, request)
    data = buf.getbuffer()
    _SIZE.pack_into(data, 0, len(data) - 4)
    del data
    return buf.getvalue()


def decode_response(api_key: int, version: int, frame) -> tuple[int, Any]:
    """Decode a response frame (size prefix stripped): (correlation id, response object)."""
    cls = response_class(api_key, version)
    if len(frame) < 4:
        raise ProtocolError("response truncated")
    (correlation_id,) = _SIZE.unpack_from(frame, 0)
    pos = 4
    if cls.__header_schema__.__version__ >= 1:
        pos = _skip_tagged_fields(frame, pos)
    try:
        check_body(cls, frame, pos)  # a hostile broker must not end our process either
        obj, _size = _reader(cls)(frame, pos)
    except Exception as exc:
        if api_key == ApiKey.DESCRIBE_TRANSACTIONS and version == 0:
            # kio refuses the -1 start time Kafka sends for a transaction not open
            from .describe_transactions import read_describe_transactions

            try:
                return correlation_id, read_describe_transactions(frame, pos)
            except DecodeError:
                pass
        raise ProtocolError(f"malformed {cls.__name__} v{version}: {exc}") from exc
    return correlation_id, obj


def encode_data(entity: Any) -> bytes:
    """A kio data entity (a schema of Kafka's that is no request or response, such as
    ConsumerProtocolSubscription) as its bytes, without a version prefix."""
    buf = io.BytesIO()
    cls: Any = type(entity)
    _writer(cls)(buf, entity)
    return buf.getvalue()


def decode_data(cls: Any, data: Any, pos: int = 0) -> Any:
    """A kio data entity of ``cls`` at ``pos`` in ``data``, every length checked first;
    ProtocolError when malformed. Bytes after it are left alone (later versions append)."""
    try:
        check_body(cls, data, pos)
        obj, _size = _reader(cls)(data, pos)
    except Exception as exc:
        raise ProtocolError(f"malformed {cls.__name__} v{cls.__version__}: {exc}") from exc
    return obj
