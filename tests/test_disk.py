"""The data directory on disk, from the outside (issue 16, section 7): one broker per directory,
index files checked before they are trusted, every truncation by recovery logged with its
figures, and retention run on ``log.retention.check.interval.ms``."""

from __future__ import annotations

import logging
import os
import re
import struct
import subprocess
import time
from pathlib import Path

import pytest
from support.logs import open_log
from support.raw_wire import (
    BASE_TIMESTAMP,
    RawConnection,
    create_topics_request,
    fetch_all,
    latest_offset,
    list_offsets_request,
    produce,
)

from oncelog.harness.broker_process import BrokerProcess, BrokerProcessError
from oncelog.log import LogConfig
from oncelog.records import build_batch, iter_batches, split_batches
from oncelog.server import BrokerConfig, ConfigError
from oncelog.server.embedded import EmbeddedBroker

TOPIC = "disk"


def _log_since_last_start(broker: BrokerProcess) -> str:
    text = broker.log_path.read_text(errors="replace")
    return text.rsplit("--- start #", 1)[-1]


# -- the data directory's lock -----------------------------------------------------------------


def test_a_second_broker_on_the_same_directory_refuses_and_names_the_holder(tmp_path):
    data = tmp_path / "data"
    with BrokerProcess(data) as first:
        second = BrokerProcess(data)
        second.log_path = tmp_path / "second.log"
        with pytest.raises(BrokerProcessError, match="before listening"):
            second.start()
        assert second.proc is not None and second.proc.returncode == 1
        log = second.log_path.read_text()
        assert (f"data directory {data} is in use by another broker (pid {first.proc.pid}, "
                f"listening on {first.bootstrap_servers})") in log
        assert "Traceback" not in log
        # The holder is untouched and still serves.
        with RawConnection(first.bootstrap_servers) as conn:
            assert conn.request(create_topics_request(TOPIC)).topics[0].error_code == 0
            assert latest_offset(conn, TOPIC) == 0


def test_the_lock_dies_with_a_killed_broker(tmp_path):
    data = tmp_path / "data"
    first = BrokerProcess(data).start()
    with RawConnection(first.bootstrap_servers) as conn:
        assert conn.request(create_topics_request(TOPIC)).topics[0].error_code == 0
    first.kill()
    assert (data / ".lock").exists()  # a stale file is no lock: flock went with the process
    with BrokerProcess(data, port=first.port) as second:
        with RawConnection(second.bootstrap_servers) as conn:
            assert latest_offset(conn, TOPIC) == 0
        assert f"pid={second.proc.pid}" in (data / ".lock").read_text()


def test_the_command_line_refuses_an_embedded_brokers_directory(tmp_path):
    """The lock holds between processes whatever the holder is, and an embedded broker on a
    held directory is refused too (flock locks the open file, not the process)."""
    data = tmp_path / "data"
    with EmbeddedBroker(data_dir=data) as embedded:
        out = subprocess.run(BrokerProcess(data).command(), capture_output=True, text=True,
                             timeout=30, check=False)
        assert out.returncode == 1, out
        assert out.stderr.strip() == (
            f"oncelog broker: cannot start: data directory {data} is in use by another broker "
            f"(pid {os.getpid()}, listening on {embedded.bootstrap_servers})")
        with pytest.raises(OSError, match=re.escape(f"data directory {data} is in use")):
            EmbeddedBroker(data_dir=data).start()
    # Stopped cleanly: the directory is free again.
    with EmbeddedBroker(data_dir=data):
        pass


# -- index files are checked before they are trusted -------------------------------------------

BATCH = 5  # records per batch
BATCHES = 40
SMALL_SEGMENTS = {"log.segment.bytes": "2048", "log.index.interval.bytes": "300"}


def _fill(broker: BrokerProcess) -> None:
    """BATCHES batches of BATCH records at timestamps BASE_TIMESTAMP + offset, over several
    segments with several index entries each."""
    with RawConnection(broker.bootstrap_servers) as conn:
        assert conn.request(create_topics_request(TOPIC)).topics[0].error_code == 0
        for n in range(BATCHES):
            first = n * BATCH
            batch = build_batch([(None, b"v%d" % (first + i), [], BASE_TIMESTAMP + first + i)
                                 for i in range(BATCH)])
            assert produce(conn, TOPIC, 0, batch).base_offset == first


def _sealed_segment(broker: BrokerProcess) -> Path:
    """The first segment's .log: sealed, so a clean restart loads its indexes as they are."""
    logs = sorted((broker.data_dir / f"{TOPIC}-0").glob("*.log"))
    assert len(logs) >= 3
    return logs[0]


def _assert_every_record_served(broker: BrokerProcess) -> None:
    total = BATCH * BATCHES
    with RawConnection(broker.bootstrap_servers) as conn:
        for start in range(total):  # every start offset, so every index entry is looked up
            records = fetch_all(conn, TOPIC, start=start)
            assert [r[0] for r in records] == list(range(start, total)), start
            assert records[0][2] == b"v%d" % start
        for offset in range(total):
            lo = conn.request(list_offsets_request(TOPIC, 0, BASE_TIMESTAMP + offset))
            assert lo.topics[0].partitions[0].offset == offset


def _shift_offset_index_entry(segment: Path) -> str:
    """Entry 2's position moved 3 bytes into its batch: no longer a batch boundary."""
    index = bytearray(segment.with_suffix(".index").read_bytes())
    assert len(index) >= 3 * 8
    rel, pos = struct.unpack_from(">ii", index, 16)
    struct.pack_into(">ii", index, 16, rel, pos + 3)
    segment.with_suffix(".index").write_bytes(index)
    return segment.with_suffix(".index").name


def _lower_time_index_entry(segment: Path) -> str:
    """Entry 1 of the time index claims a timestamp just above entry 0's: still in order, but
    a lookup by timestamp between the two would start at entry 1's offset, past the answer."""
    index = bytearray(segment.with_suffix(".timeindex").read_bytes())
    assert len(index) >= 3 * 12
    (ts0, _rel0), (ts1, rel1) = struct.unpack_from(">qi", index, 0), struct.unpack_from(
        ">qi", index, 12)
    assert ts1 - ts0 > 2
    struct.pack_into(">qi", index, 12, ts0 + 1, rel1)
    segment.with_suffix(".timeindex").write_bytes(index)
    return segment.with_suffix(".timeindex").name


@pytest.mark.parametrize("damage", [_shift_offset_index_entry, _lower_time_index_entry],
                         ids=["offset-index", "time-index"])
def test_a_damaged_index_entry_is_caught_on_load_and_the_index_rebuilt(tmp_path, damage):
    with BrokerProcess(tmp_path / "data", settings=SMALL_SEGMENTS) as broker:
        _fill(broker)
        assert broker.stop() == 0
        segment = _sealed_segment(broker)
        name = damage(segment)
        broker.start()
        _assert_every_record_served(broker)
        log = _log_since_last_start(broker)
        assert re.search(rf"WARNING oncelog\.log: .*{re.escape(name)}.* rebuilding", log), log
        # Rebuilt on disk too: the next start finds it sane and says nothing.
        assert broker.restart()
        assert "rebuilding" not in _log_since_last_start(broker)
        _assert_every_record_served(broker)


# -- recovery says what it cuts ----------------------------------------------------------------


def _batches(segment: Path) -> list:
    return list(iter_batches(segment.read_bytes()))


def test_recovery_after_a_kill_logs_every_truncation_with_its_figures(tmp_path):
    """A batch damaged near the start of the active segment of a killed broker: recovery cuts
    it and the 35 records behind it, and the broker's log says where and what went."""
    with BrokerProcess(tmp_path / "data") as broker:
        with RawConnection(broker.bootstrap_servers) as conn:
            assert conn.request(create_topics_request(TOPIC)).topics[0].error_code == 0
            for n in range(8):
                batch = build_batch([(None, b"v%d" % (n * BATCH + i), [], BASE_TIMESTAMP)
                                     for i in range(BATCH)])
                assert produce(conn, TOPIC, 0, batch).base_offset == n * BATCH
        broker.kill()
        segment = broker.data_dir / f"{TOPIC}-0" / "00000000000000000000.log"
        batches = _batches(segment)
        size = segment.stat().st_size
        pos, h = batches[1]  # offsets 5..9
        with open(segment, "r+b") as f:  # one flipped bit in its records: a CRC mismatch
            f.seek(pos + h.size - 2)
            byte = f.read(1)
            f.seek(pos + h.size - 2)
            f.write(bytes([byte[0] ^ 0x01]))

        broker.start()
        with RawConnection(broker.bootstrap_servers) as conn:
            assert latest_offset(conn, TOPIC) == 5
        log = _log_since_last_start(broker)
        assert (f"WARNING oncelog.log: Recovery truncated {segment} at byte {pos} (file {size} "
                f"bytes): batch CRC32C mismatch. Last good offset 4; dropped {size - pos} bytes "
                f"holding 35 records in batch headers still readable (offsets 5..39)") in log, log


def test_recovery_of_a_hand_truncated_segment_names_the_torn_batch(tmp_path):
    with BrokerProcess(tmp_path / "data") as broker:
        with RawConnection(broker.bootstrap_servers) as conn:
            assert conn.request(create_topics_request(TOPIC)).topics[0].error_code == 0
            for n in range(3):
                batch = build_batch([(None, b"v", [], BASE_TIMESTAMP)] * BATCH)
                assert produce(conn, TOPIC, 0, batch).base_offset == n * BATCH
        assert broker.stop() == 0
        segment = broker.data_dir / f"{TOPIC}-0" / "00000000000000000000.log"
        pos, h = _batches(segment)[-1]
        os.truncate(segment, pos + 20)  # inside the last batch's header

        broker.start()
        with RawConnection(broker.bootstrap_servers) as conn:
            assert latest_offset(conn, TOPIC) == 10
        log = _log_since_last_start(broker)
        assert (f"Recovery truncated {segment} at byte {pos} (file {pos + 20} bytes): a batch "
                f"of {h.size} bytes with only 20 in the file. Last good offset 9; dropped 20 "
                f"bytes holding part of a batch at offset 10") in log, log


def test_a_corrupt_batch_in_a_sealed_segment_costs_only_that_segments_tail(tmp_path):
    """Damage found in a flushed, sealed segment (its index was wrong, so it was validated):
    the segment is cut at the bad batch, with a warning, and the later segments are kept (a gap,
    as Kafka's LogLoader leaves one), not thrown away with it."""
    with BrokerProcess(tmp_path / "data", settings=SMALL_SEGMENTS) as broker:
        _fill(broker)
        assert broker.stop() == 0
        segment = _sealed_segment(broker)
        batches = _batches(segment)
        end = batches[-1][1].next_offset
        pos, h = batches[3]  # offsets 15..19
        data = bytearray(segment.read_bytes())
        data[pos + h.size - 1] ^= 0x01
        segment.write_bytes(data)
        _shift_offset_index_entry(segment)

        broker.start()
        log = _log_since_last_start(broker)
        assert f"Recovery truncated {segment} at byte {pos}" in log, log
        assert (f"Last good offset 14; dropped {len(data) - pos} bytes holding "
                f"{end - 15} records in batch headers still readable (offsets 15..{end - 1})"
                ) in log, log
        with RawConnection(broker.bootstrap_servers) as conn:
            assert latest_offset(conn, TOPIC) == BATCH * BATCHES
            offsets = [r[0] for r in fetch_all(conn, TOPIC)]
        assert offsets == list(range(15)) + list(range(end, BATCH * BATCHES))


def test_bytes_past_the_last_batch_of_a_sealed_segment_are_cut(tmp_path):
    with BrokerProcess(tmp_path / "data", settings=SMALL_SEGMENTS) as broker:
        _fill(broker)
        assert broker.stop() == 0
        segment = _sealed_segment(broker)
        size = segment.stat().st_size
        with open(segment, "ab") as f:
            f.write(b"\x00" * 100)

        broker.start()
        assert segment.stat().st_size == size
        log = _log_since_last_start(broker)
        assert f"the batches end at byte {size} of {size + 100}; rebuilding" in log, log
        assert "dropped 100 bytes holding only zeros" in log, log
        _assert_every_record_served(broker)


# -- log.retention.check.interval.ms -----------------------------------------------------------

# Segments of one batch each, whose records (an hour old) are past retention.ms at once.
RETENTION = {"log.segment.bytes": "200", "log.retention.ms": "1000",
             "producer.snapshot.interval.ms": "50"}


def _produce_expired_batches(broker: BrokerProcess) -> None:
    with RawConnection(broker.bootstrap_servers) as conn:
        assert conn.request(create_topics_request(TOPIC)).topics[0].error_code == 0
        for n in range(5):
            batch = build_batch([(None, b"x" * 100, [], BASE_TIMESTAMP)])
            assert produce(conn, TOPIC, 0, batch).base_offset == n


def _segments(broker: BrokerProcess) -> list[Path]:
    return sorted((broker.data_dir / f"{TOPIC}-0").glob("*.log"))


def _fill_expired_segments(broker: BrokerProcess) -> list[Path]:
    _produce_expired_batches(broker)
    logs = _segments(broker)
    assert len(logs) >= 4
    return logs


def _earliest_offset(broker: BrokerProcess) -> int:
    with RawConnection(broker.bootstrap_servers) as conn:
        response = conn.request(list_offsets_request(TOPIC, 0, -2))
    return response.topics[0].partitions[0].offset


def test_retention_runs_every_check_interval(tmp_path):
    settings = {**RETENTION, "log.retention.check.interval.ms": "200"}
    with BrokerProcess(tmp_path / "data", settings=settings) as broker:
        # (Retention may already run while the batches go in: the segments are counted at the
        # end, not in between.)
        _produce_expired_batches(broker)
        deadline = time.monotonic() + 30
        while _earliest_offset(broker) != 4:  # every segment but the active one goes
            assert time.monotonic() < deadline, "retention never ran"
            time.sleep(0.05)
        assert [int(p.stem) for p in _segments(broker)] == [4]


def test_retention_waits_for_the_check_interval(tmp_path):
    """With the default interval (5 minutes) nothing is deleted while the broker's other
    periodic work (the 1 s maintenance tick: producer snapshots every 50 ms here, of a log that
    moved) runs, as it did before the interval was honoured."""
    with BrokerProcess(tmp_path / "data", settings=RETENTION) as broker:
        logs = _fill_expired_segments(broker)
        # A tick snapshots a partition whose log moved since its last snapshot: a record
        # appended, then its snapshot (named by the new log end) seen, three times over.
        deadline = time.monotonic() + 30
        with RawConnection(broker.bootstrap_servers) as conn:
            for n in range(5, 8):
                batch = build_batch([(None, b"y", [], int(time.time() * 1000))])
                assert produce(conn, TOPIC, 0, batch).base_offset == n
                snapshot = broker.data_dir / f"{TOPIC}-0" / f"{n + 1:020d}.snapshot"
                while not snapshot.exists():
                    assert time.monotonic() < deadline, "the maintenance tick never ran"
                    time.sleep(0.05)
        assert _earliest_offset(broker) == 0
        assert all(p.exists() for p in logs)


def test_the_retention_check_interval_must_be_positive():
    with pytest.raises(ConfigError, match="log.retention.check.interval.ms"):
        BrokerConfig({"log.retention.check.interval.ms": "0"})


def test_an_embedded_broker_that_cannot_bind_frees_its_directory(tmp_path):
    data = tmp_path / "data"
    with EmbeddedBroker(data_dir=tmp_path / "other") as holder, \
            pytest.raises(OSError, match="address already in use"):
        EmbeddedBroker(data_dir=data, port=holder.port).start()
    with EmbeddedBroker(data_dir=data):  # not "in use by another broker"
        pass


def test_recovery_that_drops_later_unflushed_segments_says_so(tmp_path, caplog):
    """After an unclean stop every segment past the recovery point is validated; a bad batch in
    one of them makes the segments after it unreachable, and their deletion is logged."""
    d = tmp_path / "t-0"
    log = open_log(d, LogConfig(segment_bytes=200))
    for n in range(6):
        data = bytearray(build_batch([(None, b"x" * 100, [], BASE_TIMESTAMP)]))
        log.append(data, split_batches(data), BASE_TIMESTAMP)
    bases = [seg.base_offset for seg in log.segments]
    assert bases == [0, 1, 2, 3, 4, 5]
    sizes = [seg.size for seg in log.segments]
    log.close_unclean()
    (d / "recovery-point").write_text("1")  # segments 1.. may hold unflushed data
    segment = d / "00000000000000000002.log"
    data = bytearray(segment.read_bytes())
    data[-1] ^= 0x01
    segment.write_bytes(data)

    with caplog.at_level(logging.WARNING, logger="oncelog.log"):
        log = open_log(d, LogConfig(segment_bytes=200))
    assert log.log_end_offset == 2 and [s.base_offset for s in log.segments] == [0, 1, 2]
    assert not (d / "00000000000000000003.log").exists()
    messages = [r.getMessage() for r in caplog.records]
    assert (f"Recovery truncated {segment} at byte 0 (file {sizes[2]} bytes): batch CRC32C "
            f"mismatch. Last good offset none (the segment starting at 2 is now empty); "
            f"dropped {sizes[2]} bytes holding 1 record in batch headers still readable "
            f"(offsets 2..2)") in messages
    assert (f"Recovery of {d}: deleting the 3 segment(s) after the cut, which held offsets 3 "
            f"and up ({sum(sizes[3:])} bytes; segments 3, 4, 5)") in messages
