"""The one broker launcher (oncelog.harness.broker_process): what the tests, the benchmarks,
``oncelog verify`` and the local cluster rely on beyond starting and stopping."""

from __future__ import annotations

import os
import signal

import pytest
from support.raw_wire import RawConnection, create_topics_request

from oncelog.harness.broker_process import BrokerProcess, BrokerProcessError


def test_restart_keeps_the_port_and_the_log_gets_all_of_stdout(tmp_path):
    with BrokerProcess(tmp_path / "data") as broker:
        port = broker.port
        assert port != 0
        with RawConnection(broker.bootstrap_servers) as conn:
            assert conn.request(create_topics_request("t")).topics[0].error_code == 0
        broker.kill()
        broker.start()
        assert broker.port == port
        assert broker.restart().port == port
    # The banner is read by the launcher; what the broker prints after it (here: on each clean
    # stop) reaches the log even though nothing of ours reads its stdout any more.
    log = broker.log_path.read_text()
    assert log.count("--- start #") == 3
    assert log.count("oncelog broker stopped cleanly") == 2


def test_pause_and_resume_in_a_session_of_its_own(tmp_path):
    with BrokerProcess(tmp_path / "data", new_session=True) as broker:
        assert broker.pid is not None and os.getpgid(broker.pid) == broker.pid
        broker.pause()
        with pytest.raises(OSError), RawConnection(broker.bootstrap_servers, timeout=1) as conn:
            conn.request(create_topics_request("paused"))
        broker.resume()
        with RawConnection(broker.bootstrap_servers) as conn:
            assert conn.request(create_topics_request("resumed")).topics[0].error_code == 0
        broker.pause()
        assert broker.stop() == 0  # a paused broker still stops cleanly (SIGCONT with SIGTERM)


def test_a_broker_that_cannot_start_shows_its_log(tmp_path):
    broker = BrokerProcess(tmp_path / "data", settings={"no.such.setting": "1"})
    with pytest.raises(BrokerProcessError, match="before listening") as failed:
        broker.start()
    assert str(broker.log_path) in str(failed.value)
    assert not broker.running


def test_a_signal_sent_by_hand_is_waited_for_and_reaped(tmp_path):
    with BrokerProcess(tmp_path / "data") as broker:
        broker.send_signal(signal.SIGTERM)
        assert broker.wait(30) == 0 and not broker.running
