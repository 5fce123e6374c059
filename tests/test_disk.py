"""The data directory on disk, from the outside (issue 16, section 7): one broker per directory,
index files checked before they are trusted, every truncation by recovery logged with its
figures, and retention run on ``log.retention.check.interval.ms``."""

from __future__ import annotations

import os
import re
import subprocess

import pytest
from broker_process import BrokerProcess, BrokerProcessError
from raw_wire import RawConnection, create_topics_request, latest_offset

from oncelog.server.embedded import EmbeddedBroker

TOPIC = "disk"


def _stderr_since_last_start(broker: BrokerProcess) -> str:
    text = broker.stderr_path.read_text(errors="replace")
    return text.rsplit("--- start #", 1)[-1]


# -- the data directory's lock -----------------------------------------------------------------


def test_a_second_broker_on_the_same_directory_refuses_and_names_the_holder(tmp_path):
    data = tmp_path / "data"
    with BrokerProcess(data) as first:
        second = BrokerProcess(data)
        second.stderr_path = tmp_path / "second.stderr.log"
        with pytest.raises(BrokerProcessError, match="before listening"):
            second.start()
        assert second.proc is not None and second.proc.returncode == 1
        log = second.stderr_path.read_text()
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
