"""How ``oncelog consume`` prints a record and ``oncelog produce`` reads one.

Printing: Kafka's console consumer (its DefaultMessageFormatter and the ``print.*`` properties:
``CreateTime:1700000000000``, ``Partition:0``, ``Offset:3``, headers ``k:v,k2:v2`` or
``NO_HEADERS``, the key, the value, tab-separated), or a kcat ``-f`` format string.
Reading: Kafka's console producer (LineMessageReader: ``parse.headers``, ``parse.key`` and their
separators, ``null.marker``, ``ignore.error``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

from ..client.types import ConsumerRecord

TIMESTAMP_TYPES = {0: "CreateTime", 1: "LogAppendTime"}


def _bool(value: str) -> bool:
    return value.strip().lower() == "true"


def _text(data: bytes | None, null: bytes) -> bytes:
    return null if data is None else data


class KafkaFormatter:
    """Kafka's DefaultMessageFormatter: timestamp, partition, offset, headers, key, value in
    that order, each present one followed by ``key.separator`` (a tab) and the record by
    ``line.separator``. Properties as Kafka's ``--property`` (``print.key=true`` ...)."""

    def __init__(self, props: Mapping[str, str]) -> None:
        self.timestamp = _bool(props.get("print.timestamp", "false"))
        self.partition = _bool(props.get("print.partition", "false"))
        self.offset = _bool(props.get("print.offset", "false"))
        self.headers = _bool(props.get("print.headers", "false"))
        self.key = _bool(props.get("print.key", "false"))
        self.value = _bool(props.get("print.value", "true"))
        self.separator = props.get("key.separator", "\t").encode()
        self.line_separator = props.get("line.separator", "\n").encode()
        self.headers_separator = props.get("headers.separator", ",").encode()
        self.null = props.get("null.literal", "null").encode()

    def __call__(self, r: ConsumerRecord) -> bytes:
        cells: list[bytes] = []
        if self.timestamp:
            kind = TIMESTAMP_TYPES.get(r.timestamp_type)
            cells.append(f"{kind}:{r.timestamp}".encode() if kind and r.timestamp >= 0
                         else b"NO_TIMESTAMP")
        if self.partition:
            cells.append(b"Partition:%d" % r.partition)
        if self.offset:
            cells.append(b"Offset:%d" % r.offset)
        if self.headers:
            cells.append(self.headers_separator.join(
                k.encode() + b":" + _text(v, self.null) for k, v in r.headers)
                if r.headers else b"NO_HEADERS")
        if self.key:
            cells.append(_text(r.key, self.null))
        if self.value:
            cells.append(_text(r.value, self.null))
        # As Kafka's writeSeparator: a tab after each cell but the last, the line separator
        # after the last.
        return self.separator.join(cells) + self.line_separator if cells else b""


_TOKENS: dict[str, Callable[[ConsumerRecord], bytes]] = {
    "t": lambda r: r.topic.encode(),
    "p": lambda r: b"%d" % r.partition,
    "o": lambda r: b"%d" % r.offset,
    "k": lambda r: r.key or b"",
    "s": lambda r: r.value or b"",
    "K": lambda r: b"%d" % (-1 if r.key is None else len(r.key)),
    "S": lambda r: b"%d" % (-1 if r.value is None else len(r.value)),
    "T": lambda r: b"%d" % r.timestamp,
    "h": lambda r: b",".join(k.encode() + b"=" + (v or b"") for k, v in r.headers),
    "%": lambda r: b"%",
}
_ESCAPES = {"n": b"\n", "t": b"\t", "r": b"\r", "\\": b"\\"}


class KcatFormatter:
    """kcat's ``-f``: %t topic, %p partition, %o offset, %k key, %s value, %K / %S their
    lengths (-1 for null), %T timestamp (ms), %h headers (``n=v`` comma-separated), %%; the
    escapes \\n \\t \\r \\\\. A null key or value prints as nothing, as kcat without -Z. No
    newline is added: put ``\\n`` in the format."""

    def __init__(self, fmt: str) -> None:
        self.parts: list[bytes | Callable[[ConsumerRecord], bytes]] = []
        for m in re.finditer(r"%(.?)|\\(.?)|[^%\\]+", fmt, re.DOTALL):
            token, escape = m.group(1), m.group(2)
            if token is not None:
                if token not in _TOKENS:
                    raise ValueError(f"--format: unsupported token %{token} (kcat's: "
                                     "%t %p %o %k %s %K %S %T %h %%)")
                self.parts.append(_TOKENS[token])
            elif escape is not None:
                self.parts.append(_ESCAPES.get(escape, ("\\" + escape).encode()))
            else:
                self.parts.append(m.group(0).encode())

    def __call__(self, r: ConsumerRecord) -> bytes:
        return b"".join(p if isinstance(p, bytes) else p(r) for p in self.parts)


class LineReader:
    """Kafka's LineMessageReader: a line is ``[headers<delimiter>][key<separator>]value``;
    headers ``k:v,k2:v2``. A line without a separator it needs is an error (its message),
    unless ``ignore.error=true``; ``null.marker`` stands for a null key, value or header
    value."""

    def __init__(self, props: Mapping[str, str]) -> None:
        self.parse_key = _bool(props.get("parse.key", "false"))
        self.key_separator = props.get("key.separator", "\t")
        self.parse_headers = _bool(props.get("parse.headers", "false"))
        self.headers_delimiter = props.get("headers.delimiter", "\t")
        self.headers_separator = props.get("headers.separator", ",")
        self.headers_key_separator = props.get("headers.key.separator", ":")
        self.ignore_error = _bool(props.get("ignore.error", "false"))
        self.null_marker = props.get("null.marker")
        for a, b in (("headers.delimiter", "headers.separator"),
                     ("headers.delimiter", "headers.key.separator"),
                     ("headers.separator", "headers.key.separator")):
            if self._prop(a) == self._prop(b):
                raise ValueError(f"{a} and {b} may not be equal")
        for name in ("key.separator", "headers.separator", "headers.delimiter",
                     "headers.key.separator"):
            if self._prop(name) == self.null_marker:
                raise ValueError(f"null.marker and {name} may not be equal")

    def _prop(self, name: str) -> str:
        return getattr(self, name.replace(".", "_"))

    def read(self, line: str, number: int
             ) -> tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]]]:
        """(key, value, headers) of line ``number``; raises ValueError with Kafka's text."""
        headers_text = self._field(self.parse_headers, line, 0, self.headers_delimiter,
                                   "headers delimiter", number)
        at = 0 if headers_text is None else len(headers_text) + len(self.headers_delimiter)
        key = self._field(self.parse_key, line, at, self.key_separator, "key separator",
                          number)
        at += 0 if key is None else len(key) + len(self.key_separator)
        value = line[at:]
        headers = [] if headers_text is None or headers_text == self.null_marker else \
            self._headers(headers_text, number)
        return self._bytes(key), self._bytes(value), headers

    def _field(self, enabled: bool, line: str, start: int, separator: str, name: str,
               number: int) -> str | None:
        if not enabled:
            return None
        end = line.find(separator, start)
        if end < 0:
            if self.ignore_error:
                return None
            raise ValueError(f"No {name} found on line number {number}: '{line}'")
        return line[start:end]

    def _headers(self, text: str, number: int) -> list[tuple[str, bytes | None]]:
        out: list[tuple[str, bytes | None]] = []
        for pair in re.split(self.headers_separator, text):
            key, sep, value = pair.partition(self.headers_key_separator)
            if not sep:
                if self.ignore_error:
                    out.append((pair, None))
                    continue
                raise ValueError(f"No header key separator found in pair '{pair}' on line "
                                 f"number {number}")
            if key == self.null_marker:
                raise ValueError("Header keys should not be equal to the null marker "
                                 f"'{self.null_marker}' as they can't be null")
            out.append((key, self._bytes(value)))
        return out

    def _bytes(self, text: str | None) -> bytes | None:
        # surrogateescape: bytes that are not UTF-8 go through as they came
        return None if text is None or text == self.null_marker else \
            text.encode("utf-8", "surrogateescape")
