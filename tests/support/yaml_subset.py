"""A strict reader of the YAML subset the shipped Prometheus rule file is written in (block
mappings and sequences by indentation, double- or single-quoted strings, plain scalars that
YAML reads as strings): the test environment has no YAML library. Anything outside the subset,
or that YAML would read otherwise (a plain ``true``, ``300``, a ``key: value`` inside a plain
scalar, a tab, a duplicate key), is a ValueError with its line number, so the file stays
readable by any YAML parser (Prometheus') exactly as read here."""

from __future__ import annotations

import json
import re

_KEY = re.compile(r"[A-Za-z0-9_.-]+\Z")
_INDICATORS = set("-?:,[]{}#&*!|>'\"%@`")
# What YAML 1.1/1.2 resolvers read as something else than a string
_NOT_A_STRING = re.compile(
    r"(?i:~|null|true|false|yes|no|on|off|y|n)\Z|[-+]?(\d[\d_]*(\.\d*)?|\.\d+)([eE][-+]?\d+)?\Z"
    r"|[-+]?\.(?i:inf|nan)\Z|0[xob][0-9a-fA-F_]+\Z|\d+(:[0-5]?\d)+\Z")


def load(text: str) -> object:
    lines = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if "\t" in line:
            raise ValueError(f"line {n}: a tab")
        lines.append((n, line.rstrip()))
    if not lines:
        return None
    value, i = _block(lines, 0, _indent(lines[0][1]))
    if i != len(lines):
        raise ValueError(f"line {lines[i][0]}: unexpected indentation")
    return value


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _block(lines: list, i: int, indent: int) -> tuple[object, int]:
    body = lines[i][1][indent:]
    if body == "-" or body.startswith("- "):
        return _sequence(lines, i, indent)
    return _mapping(lines, i, indent)


def _sequence(lines: list, i: int, indent: int) -> tuple[list, int]:
    out = []
    while i < len(lines) and _indent(lines[i][1]) == indent:
        n, line = lines[i]
        if not line[indent:].startswith("- "):
            raise ValueError(f"line {n}: a mapping key among sequence items")
        inner = indent + 2
        rest = line[inner:]
        if rest.strip() == "" or _indent(rest) != 0:
            raise ValueError(f"line {n}: an empty or oddly indented sequence item")
        if ":" not in rest or rest.startswith(('"', "'")):
            out.append(_scalar(rest, n))
            i += 1
            continue
        lines[i] = (n, " " * inner + rest)  # the item's mapping starts where its first key is
        value, i = _mapping(lines, i, inner)
        out.append(value)
    return out, i


def _mapping(lines: list, i: int, indent: int) -> tuple[dict, int]:
    out: dict[str, object] = {}
    while i < len(lines) and _indent(lines[i][1]) == indent:
        n, line = lines[i]
        key, sep, rest = line[indent:].partition(":")
        if not sep or not _KEY.match(key) or (rest and not rest.startswith(" ")):
            raise ValueError(f"line {n}: not a 'key: value' line")
        if key in out:
            raise ValueError(f"line {n}: key {key!r} twice")
        rest = rest.strip()
        i += 1
        if rest:
            out[key] = _scalar(rest, n)
        elif i < len(lines) and _indent(lines[i][1]) > indent:
            out[key], i = _block(lines, i, _indent(lines[i][1]))
        else:
            raise ValueError(f"line {n}: {key!r} has no value")
    if i < len(lines) and _indent(lines[i][1]) > indent:
        raise ValueError(f"line {lines[i][0]}: unexpected indentation")
    return out, i


def _scalar(text: str, n: int) -> str:
    if text.startswith('"'):
        if len(text) < 2 or not text.endswith('"'):
            raise ValueError(f"line {n}: an unterminated double-quoted string")
        try:
            value = json.loads(text)  # JSON's escapes are YAML's (those used here)
        except json.JSONDecodeError as e:
            raise ValueError(f"line {n}: {e}") from None
        return value
    if text.startswith("'"):
        inner = text[1:-1]
        if len(text) < 2 or not text.endswith("'") or re.search(r"(?<!')'(?!')", inner):
            raise ValueError(f"line {n}: a bad single-quoted string")
        return inner.replace("''", "'")
    if text[0] in _INDICATORS or ": " in text or " #" in text or text.endswith(":"):
        raise ValueError(f"line {n}: {text!r} is not a plain scalar of this subset")
    if _NOT_A_STRING.match(text):
        raise ValueError(f"line {n}: YAML reads {text!r} as no string")
    return text
