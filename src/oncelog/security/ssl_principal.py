"""The principal of a TLS client certificate, as Kafka names it.

Kafka's ``DefaultKafkaPrincipalBuilder`` takes the certificate's subject as Java's
``X500Principal.getName()`` prints it (RFC 2253: the most specific RDN first, ``CN=alice,
OU=eng,O=acme`` without spaces, the keywords CN, C, L, ST, O, OU, STREET, DC and UID, any other
attribute as its dotted OID with the value's DER bytes in hex, ``1.2.840.113549.1.9.1=#16...``;
``,=+<>#;"\\`` escaped with a backslash, leading and trailing spaces too), then passes it
through ``ssl.principal.mapping.rules`` (KIP-371): a comma-separated list of ``DEFAULT`` (the
name as it is) and ``RULE:pattern/replacement/`` with an optional ``L`` or ``U`` (lower or
upper case the result). The first rule whose pattern matches the whole name gives the
principal ``User:<result>``; when none does, the connection is refused.

The subject is read from the certificate's DER bytes (Python's ``getpeercert()`` dictionary
loses each value's ASN.1 type, which decides between text and hex); every length is checked
against the bytes that are there.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["CertificateError", "NoMatchingRule", "SslPrincipalMapper", "subject_rfc2253"]


class CertificateError(ValueError):
    """The certificate's DER does not hold a subject we can read."""


class NoMatchingRule(ValueError):
    """No ``ssl.principal.mapping.rules`` rule applies to the name."""


# -- DER ---------------------------------------------------------------------------------------


def _tlv(data: bytes, pos: int, end: int) -> tuple[int, int, int]:
    """(tag, start of the value, end of the value) of the element at ``pos``."""
    if pos + 2 > end:
        raise CertificateError("truncated element")
    tag = data[pos]
    if tag & 0x1F == 0x1F:
        raise CertificateError("multi-byte tags are not used in a certificate's subject")
    first = data[pos + 1]
    pos += 2
    if first < 0x80:
        length = first
    else:
        count = first & 0x7F
        if count == 0 or count > 4 or pos + count > end:
            raise CertificateError("bad length")
        length = int.from_bytes(data[pos:pos + count], "big")
        pos += count
    if length > end - pos:
        raise CertificateError(f"an element claims {length} bytes, {end - pos} are there")
    return tag, pos, pos + length


def _children(data: bytes, start: int, end: int) -> list[tuple[int, int, int, int]]:
    """(tag, value start, value end, element start) of each element in [start, end)."""
    out = []
    pos = start
    while pos < end:
        tag, vstart, vend = _tlv(data, pos, end)
        out.append((tag, vstart, vend, pos))
        pos = vend
    return out


def _oid(raw: bytes) -> str:
    if not raw:
        raise CertificateError("empty OID")
    parts: list[int] = []
    value = 0
    for byte in raw:
        value = (value << 7) | (byte & 0x7F)
        if not byte & 0x80:
            parts.append(value)
            value = 0
    if raw[-1] & 0x80:
        raise CertificateError("truncated OID")
    first = parts[0]
    head = [min(first // 40, 2), first - 40 * min(first // 40, 2)]
    return ".".join(str(p) for p in head + parts[1:])


_SEQUENCE, _SET, _OID = 0x30, 0x31, 0x06
# Java's DerValue.isDerString (non-canonical): the types it prints as text
_UTF8, _PRINTABLE, _T61, _IA5, _GENERAL, _BMP = 0x0C, 0x13, 0x14, 0x16, 0x1B, 0x1E
_TEXT_TYPES = {_UTF8, _PRINTABLE, _T61, _IA5, _GENERAL, _BMP}
# Java's AVAKeyword table, the RFC 2253 keywords
_KEYWORDS = {"2.5.4.3": "CN", "2.5.4.6": "C", "2.5.4.7": "L", "2.5.4.8": "ST", "2.5.4.10": "O",
             "2.5.4.11": "OU", "2.5.4.9": "STREET", "0.9.2342.19200300.100.1.25": "DC",
             "0.9.2342.19200300.100.1.1": "UID"}
_ESCAPED = set(',=+<>#;"\\')


def subject_rfc2253(der: bytes) -> str:
    """The subject of a DER certificate as Java's ``X500Principal.getName()`` prints it."""
    _, cstart, cend = _expect(der, 0, len(der), _SEQUENCE, "certificate")
    _, tstart, tend = _expect(der, cstart, cend, _SEQUENCE, "tbsCertificate")
    fields = _children(der, tstart, tend)
    if fields and fields[0][0] == 0xA0:  # [0] EXPLICIT version
        fields = fields[1:]
    # serialNumber, signature, issuer, validity, subject
    if len(fields) < 5 or fields[4][0] != _SEQUENCE:
        raise CertificateError("no subject in the certificate")
    _, sstart, send, _ = fields[4]
    rdns = []
    for tag, rstart, rend, _ in _children(der, sstart, send):
        if tag != _SET:
            raise CertificateError("an RDN is not a SET")
        avas = []
        for atag, astart, aend, _ in _children(der, rstart, rend):
            if atag != _SEQUENCE:
                raise CertificateError("an attribute is not a SEQUENCE")
            parts = _children(der, astart, aend)
            if len(parts) != 2 or parts[0][0] != _OID:
                raise CertificateError("an attribute is not (OID, value)")
            oid = _oid(der[parts[0][1]:parts[0][2]])
            vtag, vstart, vend, velement = parts[1]
            avas.append(_ava(oid, vtag, der[vstart:vend], der[velement:vend]))
        rdns.append("+".join(avas))
    return ",".join(reversed(rdns))  # most specific (last encoded) first, as Java prints


def _expect(der: bytes, pos: int, end: int, tag: int, what: str) -> tuple[int, int, int]:
    found = _tlv(der, pos, end)
    if found[0] != tag:
        raise CertificateError(f"{what} is not a SEQUENCE")
    return found


def _ava(oid: str, tag: int, value: bytes, element: bytes) -> str:
    keyword = _KEYWORDS.get(oid)
    if keyword is None or tag not in _TEXT_TYPES:
        return f"{keyword or oid}=#{element.hex()}"
    text = value.decode("utf-16-be" if tag == _BMP else "utf-8" if tag == _UTF8 else "latin-1",
                        errors="replace")
    out = []
    for ch in text:
        if ch in _ESCAPED:
            out.append("\\" + ch)
        elif ch == "\0":
            out.append("\\00")
        else:
            out.append(ch)
    chars = "".join(out)
    # leading and trailing spaces (and CRs) escaped, as Java's AVA.toRFC2253String
    lead = len(chars) - len(chars.lstrip(" \r"))
    trail = len(chars.rstrip(" \r"))
    body = "".join("\\" + c if i < lead or i >= trail else c for i, c in enumerate(chars))
    return f"{keyword}={body}"


# -- ssl.principal.mapping.rules ----------------------------------------------------------------

# Kafka's SslPrincipalMapper grammar (the same regular expressions, in Python's syntax)
_RULE = r"(DEFAULT)|RULE:((\\.|[^\\/])*)/((\\.|[^\\/])*)/([LU]?).*?|(.*?)"
_SPLITTER = re.compile(r"\s*(" + _RULE + r")\s*(,\s*|$)")
_PARSER = re.compile(_RULE)
_BACK_REFERENCE = re.compile(r"\$(\d+)")


@dataclass(frozen=True)
class _Rule:
    pattern: re.Pattern | None = None  # None: DEFAULT
    replacement: str = ""
    lower: bool = False
    upper: bool = False

    def __str__(self) -> str:
        if self.pattern is None:
            return "DEFAULT"
        case = "/L" if self.lower else "/U" if self.upper else ""
        return f"RULE:{self.pattern.pattern}/{self.replacement}{case}"

    def apply(self, name: str) -> str | None:
        if self.pattern is None:
            return name
        if self.pattern.fullmatch(name) is None:
            return None
        groups = self.pattern.groups
        result = self.pattern.sub(lambda m: _java_replacement(self.replacement, m, groups), name)
        if self.lower:
            return result.lower()
        if self.upper:
            return result.upper()
        return result


def _java_replacement(replacement: str, match: re.Match, groups: int) -> str:
    """Java's ``Matcher.appendReplacement`` text for one match: ``\\x`` is x, ``$n`` group n
    (as many digits as still name a group); a ``$n`` past the groups is literal text (Kafka's
    escapeLiteralBackReferences)."""
    out = []
    i = 0
    while i < len(replacement):
        ch = replacement[i]
        if ch == "\\" and i + 1 < len(replacement):
            out.append(replacement[i + 1])
            i += 2
            continue
        if ch == "$" and i + 1 < len(replacement) and replacement[i + 1].isdigit() \
                and replacement[i + 1] != "0" and groups:
            number = int(replacement[i + 1])
            j = i + 2
            while j < len(replacement) and replacement[j].isdigit() and \
                    number * 10 + int(replacement[j]) <= groups:
                number = number * 10 + int(replacement[j])
                j += 1
            if number <= groups:
                out.append(match.group(number) or "")
                i = j
                continue
        if ch == "$" and i + 1 < len(replacement) and replacement[i + 1] == "0":
            out.append(match.group(0))
            i += 2
            continue
        out.append(ch)
        i += 1
    return "".join(out)


class SslPrincipalMapper:
    """``ssl.principal.mapping.rules``; a rule Kafka would refuse raises ValueError."""

    def __init__(self, rules: str | None) -> None:
        self.rules = [r for r in (_parse(text) for text in _split(rules)) if r is not None]

    def __str__(self) -> str:
        return "[" + ", ".join(str(r) for r in self.rules) + "]"

    def name(self, distinguished_name: str) -> str:
        for rule in self.rules:
            result = rule.apply(distinguished_name)
            if result is not None:
                return result
        raise NoMatchingRule(f"no ssl.principal.mapping.rules rule applies to "
                             f"{distinguished_name!r} (rules {self})")


def _split(rules: str | None) -> list[str]:
    text = "DEFAULT" if rules is None else rules.strip()
    out = []
    pos = 0
    while pos <= len(text):
        m = _SPLITTER.search(text, pos)
        if m is None:
            break
        out.append(m.group(1))
        pos = m.end() if m.end() > m.start() else m.end() + 1  # as Java's find()
    return out


def _parse(rule: str) -> _Rule | None:
    m = _PARSER.match(rule)
    if m is None or m.end() != len(rule):
        unmatched = rule[m.end():] if m is not None else rule
        raise ValueError(f"ssl.principal.mapping.rules: invalid rule {rule!r}, unmatched "
                         f"{unmatched!r}")
    if m.group(1) is not None:
        return _Rule()
    if m.group(2) is None:
        return None  # an empty rule is ignored
    try:
        pattern = re.compile(m.group(2))
    except re.error as exc:
        raise ValueError(f"ssl.principal.mapping.rules: bad pattern {m.group(2)!r}: "
                         f"{exc}") from None
    return _Rule(pattern, m.group(4), m.group(6) == "L", m.group(6) == "U")
