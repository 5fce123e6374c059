"""Inputs for the wire fuzzer (tests/test_fuzz_wire.py): hypothesis strategies for request and
response bodies of every API and version the broker advertises, valid ones and the same pushed
out of shape (lengths and counts at their extremes, truncations, bad tagged fields, flipped
bytes), plus random bytes behind valid and invalid headers.

Run as a script it decodes such inputs in this process, as the broker and our client do, and
prints how many it tried: a decoder that aborts the process (kio's native reader did, issue 16)
shows as this process dying, which the test reports with the input that did it
(``--last FILE`` keeps each input there before it is decoded).
"""

from __future__ import annotations

import argparse
import io
import os
import struct
import sys
import time

import hypothesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.serial import entity_writer
from kio.static.primitive import Records

from oncelog.protocol import (
    ProtocolError,
    decode_request_body,
    decode_response,
    parse_request_header,
    request_class,
    response_class,
)
from oncelog.protocol.apis import SUPPORTED_VERSIONS


def _register_kio_strategies() -> None:
    """kio's types register their hypothesis strategies when their classes are created, but
    oncelog imports kio with hypothesis hidden (a 0.4 s import saved per process), so register
    them here, for every phantom type kio defines; and one for record sets, which have none."""
    import kio.schema.types  # noqa: F401  (creates the phantom types of names and ids)
    from kio.static._phantom import Phantom

    todo = list(Phantom.__subclasses__())
    while todo:
        cls = todo.pop()
        todo += cls.__subclasses__()
        cls.__hypothesis_hook__()  # registers cls (the hook is inherited)
    st.register_type_strategy(Records, st.binary(max_size=128).map(Records))


_register_kio_strategies()

API_VERSIONS = [(key, v) for key, (lo, hi) in sorted(SUPPORTED_VERSIONS.items())
                for v in range(lo, hi + 1)]

# Lengths and counts a hostile peer sends: compact (uvarint) lengths near 2^32 and 2^35,
# int32 and int16 extremes, negative lengths, a tagged-field section claiming much.
EXTREMES = [
    b"\xff\xff\xff\xff\x0f", b"\xfe\xff\xff\xff\x0f", b"\xff\xff\xff\xff\x7f",
    b"\xff\xff\xff\xff\xff\x01", b"\x80\x80\x80\x80\x08",
    b"\x7f\xff\xff\xff", b"\x80\x00\x00\x00", b"\xff\xff\xff\xff", b"\xff\xff\xff\xfe",
    b"\x7f\xff", b"\x80\x00", b"\xff\xfe", b"\x00\x00", b"\x00", b"\x01",
    b"\x05\x01\xff\xff\xff\xff\x0f", b"\x01\x00\xff\xff\xff\x7f",
]

_HEADER = struct.Struct(">hhi")


def request_header(api_key: int, version: int, correlation_id: int = 7,
                   client_id: bytes | None = b"fuzz", tagged: bytes = b"\x00") -> bytes:
    head = _HEADER.pack(api_key, version, correlation_id)
    head += struct.pack(">h", -1) if client_id is None else \
        struct.pack(">h", len(client_id)) + client_id
    try:
        flexible = request_class(api_key, version).__flexible__
    except ProtocolError:  # an API or version kio has no schema for: header v1
        flexible = False
    if flexible:
        head += tagged
    return head


def encode_body(cls: type, entity: object) -> bytes:
    out = io.BytesIO()
    entity_writer(cls)(out, entity)
    return out.getvalue()


@st.composite
def mutated(draw: st.DrawFn, body: bytes) -> bytes:
    """``body`` as it is, or pushed out of shape in one to three places."""
    data = bytearray(body)
    for _ in range(draw(st.integers(0, 3))):
        how = draw(st.sampled_from(["extreme", "truncate", "insert", "flip", "tagged"]))
        at = draw(st.integers(0, len(data)))
        if how == "extreme":
            value = draw(st.sampled_from(EXTREMES))
            data[at:at + len(value)] = value
        elif how == "truncate":
            del data[at:]
        elif how == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=8))
        elif how == "flip" and data:
            data[min(at, len(data) - 1)] ^= draw(st.integers(1, 255))
        elif how == "tagged":
            data += draw(st.sampled_from(EXTREMES))
    return bytes(data)


@st.composite
def request_frames(draw: st.DrawFn) -> bytes:
    """A request frame (size prefix stripped) of an advertised API and version: a valid body
    mutated, or random bytes, behind a valid header, now and then a header gone wrong."""
    api_key, version = draw(st.sampled_from(API_VERSIONS))
    kind = draw(st.sampled_from(["structured", "structured", "structured", "random", "header"]))
    if kind == "random":
        return request_header(api_key, version) + draw(st.binary(max_size=256))
    cls = request_class(api_key, version)
    body = draw(mutated(encode_body(cls, draw(st.from_type(cls)))))
    if kind == "header":
        # unknown APIs and versions, bad client ids, bad header tagged fields, short headers
        head = request_header(draw(st.integers(-(2**15), 2**15 - 1)),
                              draw(st.integers(-(2**15), 2**15 - 1)),
                              client_id=draw(st.none() | st.binary(max_size=8)),
                              tagged=draw(st.sampled_from(EXTREMES)))
        head = head[:draw(st.integers(0, len(head)))]
        return head + body
    return request_header(api_key, version) + body


@st.composite
def response_frames(draw: st.DrawFn) -> tuple[int, int, bytes]:
    """(api key, version, response frame) as our client would read it from a broker."""
    api_key, version = draw(st.sampled_from(API_VERSIONS))
    cls = response_class(api_key, version)
    head = b"\x00\x00\x00\x07" + (b"\x00" if cls.__header_schema__.__version__ >= 1 else b"")
    if draw(st.booleans()):
        return api_key, version, head + draw(st.binary(max_size=256))
    return api_key, version, head + draw(mutated(encode_body(cls, draw(st.from_type(cls)))))


def decode_request_frame(frame: bytes) -> bool:
    """Decode as the broker does; True if it decoded, False if refused as malformed."""
    try:
        header = parse_request_header(frame)
        decode_request_body(header, frame)
    except ProtocolError:
        return False
    return True


def decode_response_frame(api_key: int, version: int, frame: bytes) -> bool:
    try:
        decode_response(api_key, version, frame)
    except ProtocolError:
        return False
    return True


def fuzz_in_process(examples: int, last: str | None, seed: int) -> dict[str, int]:
    counts = {"requests": 0, "responses": 0, "decoded": 0, "refused": 0}
    fd = os.open(last, os.O_WRONLY | os.O_CREAT | os.O_TRUNC) if last else None

    def keep(kind: str, data: bytes) -> None:
        if fd is not None:
            os.ftruncate(fd, 0)
            os.pwrite(fd, kind.encode() + b" " + data.hex().encode(), 0)

    config = settings(max_examples=examples, deadline=None, database=None,
                      suppress_health_check=list(HealthCheck), derandomize=False)

    @config
    @given(st.one_of(request_frames(), response_frames()))
    def run(item: bytes | tuple[int, int, bytes]) -> None:
        if isinstance(item, bytes):
            keep("request", item)
            counts["requests"] += 1
            ok = decode_request_frame(item)
        else:
            api_key, version, frame = item
            keep(f"response {api_key} {version}", frame)
            counts["responses"] += 1
            ok = decode_response_frame(api_key, version, frame)
        counts["decoded" if ok else "refused"] += 1

    hypothesis.seed(seed)(run)()
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--examples", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=16)
    parser.add_argument("--last", help="file that holds the input being decoded")
    args = parser.parse_args()
    start = time.monotonic()
    counts = fuzz_in_process(args.examples, args.last, args.seed)
    counts["seconds"] = round(time.monotonic() - start)
    print(" ".join(f"{k}={v}" for k, v in counts.items()))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
