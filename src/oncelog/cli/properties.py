"""Java properties files (``server.properties``, a tool's ``--command-config``), read as
``java.util.Properties.load`` reads them: ``#`` and ``!`` comment lines; ``key=value``,
``key: value`` or ``key value``; a line ending in an odd number of backslashes continues on
the next (whose leading blanks are dropped); ``\\t \\n \\r \\f \\uXXXX`` escapes, and a
backslash before any other character stands for that character (``\\=`` and ``\\:`` in keys).
A key given twice keeps its last value, as Java's does.
"""

from __future__ import annotations

from pathlib import Path

_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}
_BLANKS = " \t\f"


class PropertiesError(ValueError):
    pass


def load_properties(path: str | Path) -> dict[str, str]:
    """The settings of a properties file; PropertiesError naming the file when it cannot be
    read. Java reads ISO-8859-1; UTF-8 is tried first, which is what files are today."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise PropertiesError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = data.decode("latin-1")
    try:
        return parse_properties(text)
    except PropertiesError as exc:
        raise PropertiesError(f"{path}: {exc}") from None


def parse_properties(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for number, line in _logical_lines(text):
        key, value = _split(line, number)
        out[key] = value
    return out


def _logical_lines(text: str):
    """(line number, logical line): comments and blank lines dropped, continuations joined."""
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    i = 0
    while i < len(lines):
        number = i + 1
        line = lines[i].lstrip(_BLANKS)
        i += 1
        if not line or line[0] in "#!":
            continue
        while _continues(line) and i < len(lines):
            line = line[:-1] + lines[i].lstrip(_BLANKS)
            i += 1
        if _continues(line):  # a backslash at the very end of the file: dropped, as Java
            line = line[:-1]
        yield number, line


def _continues(line: str) -> bool:
    trailing = len(line) - len(line.rstrip("\\"))
    return trailing % 2 == 1


def _split(line: str, number: int) -> tuple[str, str]:
    """Key and value: the key ends at the first unescaped ``=``, ``:`` or blank; blanks and
    one ``=`` or ``:`` after it separate it from the value."""
    i, n = 0, len(line)
    while i < n:
        c = line[i]
        if c == "\\":
            i += 2
            continue
        if c in "=:" or c in _BLANKS:
            break
        i += 1
    key = line[:i]
    while i < n and line[i] in _BLANKS:
        i += 1
    if i < n and line[i] in "=:":
        i += 1
        while i < n and line[i] in _BLANKS:
            i += 1
    return _unescape(key, number), _unescape(line[i:], number)


def _unescape(text: str, number: int) -> str:
    if "\\" not in text:
        return text
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c != "\\" or i + 1 >= n:
            out.append(c)
            i += 1
            continue
        nxt = text[i + 1]
        if nxt == "u":
            digits = text[i + 2 : i + 6]
            try:
                if len(digits) != 4:
                    raise ValueError
                out.append(chr(int(digits, 16)))
            except ValueError:
                raise PropertiesError(f"line {number}: malformed \\uXXXX escape "
                                      f"{text[i:i + 6]!r}") from None
            i += 6
            continue
        out.append(_ESCAPES.get(nxt, nxt))
        i += 2
    return "".join(out)
