"""The wire fuzzer: nothing a client sends, and nothing a broker answers, ends the process or
balloons it (issue 16).

Structure-aware inputs (tests/support/wire_fuzz.py): bodies of every API and version the broker
advertises, built by hypothesis from kio's schemas, then pushed out of shape (lengths and counts
at their extremes, truncations, bad tagged fields, flipped bytes); random bytes behind valid and
invalid headers. They go (1) through our decoders in a child process, requests as the broker
reads them and responses as our client reads them, and (2) over sockets to a real broker
process, open and with SASL on (unauthenticated input), which must stay up, answer ApiVersions
afterwards and keep its peak memory bounded. The decoder tests run a sample in the unit
tier (new inputs each run) and their whole sweep marked ``slow`` (tests/support/tiers.py); the
long runs try as many again, from other seeds (new inputs, not the default run's again). ONCELOG_FUZZ_SCALE=N multiplies every count, for a deeper run than the suite's:
    ONCELOG_FUZZ_SCALE=10 .venv/bin/python -m pytest tests/test_fuzz_wire.py
"""

from __future__ import annotations

import os
import random
import socket
import struct
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st
from support.raw_wire import RawConnection
from support.tiers import sample_and_sweep
from support.wire_fuzz import API_VERSIONS, encode_body, request_frames

from oncelog.harness.broker_process import BrokerProcess
from oncelog.protocol import (
    ApiKey,
    ProtocolError,
    decode_request_body,
    encode_request,
    make,
    parse_request_header,
    request_class,
    request_module,
    response_class,
)
from oncelog.protocol.bounds import check_body

HERE = Path(__file__).resolve().parent
MIB = 1024 * 1024
# The broker's peak resident memory may grow this much over what it had after start-up while
# it is fuzzed: the inputs are at most a few KB each, so anything near this is a balloon.
RSS_GROWTH_LIMIT = 200 * MIB
SCALE = float(os.environ.get("ONCELOG_FUZZ_SCALE", "1"))
# The long runs (other seeds, more inputs) are a command, not part of the suite:
#   ONCELOG_FUZZ_SCALE=4 .venv/bin/python -m pytest -q tests/test_fuzz_wire.py
# (SCALE multiplies every run's inputs; from 2 up the long runs join in).
long_run = pytest.mark.skipif(
    SCALE < 2, reason="the long fuzz runs with ONCELOG_FUZZ_SCALE=2 or more (a command; the "
                      "suite runs the short ones)")


def scaled(examples: int) -> int:
    return max(1, round(examples * SCALE))


def test_the_23_byte_metadata_request_is_refused_not_fatal():
    """Issue 16's reproduction: a compact array length of 2^32-1 in a Metadata v12 request made
    kio's native reader reserve 34 GB and abort the process."""
    frame = bytes.fromhex("0003000c00000001ffff00") + b"\xff\xff\xff\xff\x0f" + b"\x00" * 7
    assert len(frame) == 23
    header = parse_request_header(frame)
    with pytest.raises(ProtocolError, match="out of range"):
        decode_request_body(header, frame)


def test_a_count_larger_than_the_bytes_left_is_refused():
    """A compact (flexible) topic array of 2^31 in Metadata v12, and a classic int32 count of
    2^31-1 topics in OffsetCommit v7 (which today only the kernel's overcommit survives), each
    with a few bytes behind it."""
    frame = bytes.fromhex("0003000c00000001ffff00") + b"\x80\x80\x80\x80\x08" + b"\x00" * 7
    with pytest.raises(ProtocolError):
        decode_request_body(parse_request_header(frame), frame)
    cls = request_class(ApiKey.OFFSET_COMMIT, 7)
    body = encode_body(cls, make(cls, group_id="g", generation_id_or_member_epoch=-1,
                                 member_id="", group_instance_id=None, topics=()))
    assert body.endswith(b"\x00\x00\x00\x00")  # the topic count, last
    frame = bytes.fromhex("0008000700000001ffff") + body[:-4] + b"\x7f\xff\xff\xff" + b"\0" * 16
    with pytest.raises(ProtocolError, match="array of 2147483647 elements"):
        decode_request_body(parse_request_header(frame), frame)


@pytest.mark.parametrize("examples", sample_and_sweep(len(API_VERSIONS) // 5,
                                                    len(API_VERSIONS) * 6))
def test_every_body_kio_encodes_passes_the_bounds_check(examples):
    """The bounds check reads kio's layout exactly: every valid body passes and ends where it
    ends, for every API and version, requests and responses (the sweep: six bodies of each on
    average; the unit tier's sample: a fifth of them, others each run)."""

    @settings(max_examples=examples, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(st.data())
    def check(data):
        api_key, version = data.draw(st.sampled_from(API_VERSIONS))
        for cls in (request_class(api_key, version), response_class(api_key, version)):
            body = encode_body(cls, data.draw(st.from_type(cls)))
            assert check_body(cls, body, 0) == len(body)

    check()


DECODER_SWEEP = 3000  # inputs, from seed 16


@pytest.mark.parametrize("examples", sample_and_sweep(500, DECODER_SWEEP))
def test_fuzzed_frames_never_end_a_decoding_process(tmp_path, examples):
    """Requests as the broker decodes them, responses as our client does, in a child process:
    a decoder that aborts shows as the child dying, with the input it died on. The sweep sends
    3000 inputs from seed 16; the unit tier's sample 500 from a seed of its own each run."""
    last = tmp_path / "last-input"
    seed_ = 16 if examples == DECODER_SWEEP else random.randrange(2**32)
    run = subprocess.run([sys.executable, str(HERE / "support" / "wire_fuzz.py"),
                          "--examples", str(scaled(examples)), "--seed", str(seed_),
                          "--last", str(last)],
                         capture_output=True, text=True, timeout=900, check=False, cwd=HERE)
    assert run.returncode == 0, (
        f"the decoding process (--seed {seed_}) ended with {run.returncode} on input "
        f"{last.read_text()}\n" + run.stderr[-3000:])
    assert "refused=" in run.stdout, run.stdout


# -- against a broker process -----------------------------------------------------------------

def peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def send_one(address: tuple[str, int], frame: bytes, wait: float = 0.1) -> None:
    """Send one frame (size prefix added) on a fresh connection and read what comes back for a
    moment: an answer, a close, or nothing (a long poll, a request still being served). The
    frame is in the broker's socket buffer before the wait starts, so the wait only decides
    when we hang up; a frame the broker answers neither way costs the whole wait, which was
    most of these tests' time at 0.25 s."""
    with socket.create_connection(address, timeout=5) as sock:
        sock.sendall(struct.pack(">i", len(frame)) + frame)
        sock.settimeout(wait)
        try:
            while sock.recv(65536):
                pass
        except (TimeoutError, ConnectionResetError):
            pass


def assert_serving(broker: BrokerProcess) -> None:
    assert broker.running, "the broker died\n" + broker.log_tail()
    with RawConnection(broker.bootstrap_servers, timeout=10) as conn:
        request = make(request_module(ApiKey.API_VERSIONS, 3).ApiVersionsRequest,
                       client_software_name="fuzz", client_software_version="1")
        assert conn.request(request).error_code == 0


def fuzz_broker(broker: BrokerProcess, examples: int, batch: int = 200, seed_: int = 16) -> int:
    """Send ``examples`` fuzzed frames, each on its own connection, 16 at a time (long polls,
    JoinGroups that wait for a rebalance and acks=0 produces are left after a moment); after
    each batch the broker must be up and answer ApiVersions."""
    address = (broker.host, broker.port)
    assert_serving(broker)
    start_peak = peak_rss(broker.proc.pid)
    frames: list[bytes] = []

    @seed(seed_)
    @settings(max_examples=scaled(examples), deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(request_frames() | st.binary(max_size=64))
    def generate(frame: bytes) -> None:
        frames.append(frame)

    generate()
    with ThreadPoolExecutor(16) as pool:
        for i in range(0, len(frames), batch):
            list(pool.map(lambda f: send_one(address, f), frames[i:i + batch]))
            assert_serving(broker)
    growth = peak_rss(broker.proc.pid) - start_peak
    assert growth < RSS_GROWTH_LIMIT, f"peak RSS grew {growth / MIB:.0f} MiB while fuzzed"
    return len(frames)


def sasl_settings(tmp_path: Path) -> dict[str, str]:
    users = tmp_path / "users"
    users.write_text("admin:admin-secret\n")
    return {"security.protocol": "SASL_PLAINTEXT", "sasl.users.file": str(users),
            "super.users": "User:admin"}


@pytest.mark.parametrize("security", ["plaintext", "sasl"])
def test_a_broker_survives_fuzzed_requests(tmp_path, security):
    settings_ = sasl_settings(tmp_path) if security == "sasl" else {}
    with BrokerProcess(tmp_path / "data", settings=settings_) as broker:
        started = time.monotonic()
        sent = fuzz_broker(broker, examples=1200 if security == "plaintext" else 600)
        print(f"{security}: {sent} inputs in {time.monotonic() - started:.0f} s")


@long_run
@pytest.mark.slow
@pytest.mark.parametrize("security", ["plaintext", "sasl"])
def test_a_broker_survives_a_long_fuzz(tmp_path, security):
    settings_ = sasl_settings(tmp_path) if security == "sasl" else {}
    with BrokerProcess(tmp_path / "data", settings=settings_) as broker:
        # Another seed: inputs the default run above does not send (the same seed would
        # start with the same ones).
        fuzz_broker(broker, examples=1300 if security == "plaintext" else 900, seed_=1617)


@long_run
@pytest.mark.slow
def test_a_long_fuzz_of_the_decoders(tmp_path):
    last = tmp_path / "last-input"
    run = subprocess.run([sys.executable, str(HERE / "support" / "wire_fuzz.py"), "--examples",
                          str(scaled(2500)), "--seed", "1616", "--last", str(last)], capture_output=True, check=False,
                         text=True, timeout=900, cwd=HERE)
    assert run.returncode == 0, (
        f"the decoding process ended with {run.returncode} on input {last.read_text()}\n"
        + run.stderr[-3000:])


def test_encode_request_round_trips_through_the_check():
    """Our own client's requests pass (a sanity check of the header/body split)."""
    request = make(request_module(ApiKey.METADATA, 12).MetadataRequest, topics=None,
                   allow_auto_topic_creation=False, include_topic_authorized_operations=False)
    frame = encode_request(3, "c", request)[4:]
    assert decode_request_body(parse_request_header(frame), frame) == request
