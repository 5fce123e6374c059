"""The web console in a real browser: Debian's chromium, headless, against a broker process
started as users start it (``oncelog broker --console-port 0``) with a transaction left open
(confluent-kafka's producer) and a group behind (our consumer's commit). The pages are loaded
as Chromium renders them (``--dump-dom``) and checked, and screenshots are saved in the test's
directory (and copied to ``$ONCELOG_CONSOLE_SCREENSHOT`` when it is set).

Chromium comes from ``bash scripts/bootstrap.sh --with-chromium`` (the full suite installs it);
without it the tests skip, except in CI (``CI`` set), where they fail."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import time
from pathlib import Path

import pytest
from confluent_kafka import Producer as ConfluentProducer
from support.console import ConsoleBrokerProcess, rows
from support.waiting import wait_until

from oncelog import Admin, Consumer, NewTopic, Producer, TopicPartition

pytestmark = pytest.mark.slow

TXN_ID = "payments-writer"
GROUP = "billing"
WINDOW = (1400, 900)


def chromium_binary() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed, and CI must run the console's browser "
                        "tests: bash scripts/bootstrap.sh --with-chromium")
        pytest.skip("chromium is not installed (bash scripts/bootstrap.sh --with-chromium)")
    return path


def chromium(profile: Path, url: str, *args: str) -> subprocess.CompletedProcess:
    binary = chromium_binary()
    command = [binary, "--headless", "--disable-gpu", "--disable-dev-shm-usage",
               "--no-first-run", "--no-default-browser-check", "--hide-scrollbars",
               f"--user-data-dir={profile}", *args, url]
    if os.geteuid() == 0:
        command.insert(1, "--no-sandbox")  # Chromium refuses to run as root with its sandbox
    proc = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


@pytest.fixture(scope="module")
def console(tmp_path_factory):
    chromium_binary()
    tmp = tmp_path_factory.mktemp("console-browser")
    settings = {"transaction.state.log.num.partitions": "2", "offsets.topic.num.partitions": "2",
                "group.initial.rebalance.delay.ms": "0"}
    with ConsoleBrokerProcess(tmp / "data", settings=settings) as b:
        bs = b.bootstrap_servers
        with Admin(bootstrap_servers=bs) as admin:
            admin.create_topics([NewTopic("payments", 2, 1), NewTopic("audit", 1, 1)])
        with Producer(bootstrap_servers=bs) as p:
            for i in range(20):
                p.send("payments", value=f"p{i}", partition=i % 2)
                p.send("audit", value=f"a{i}", partition=0)
        txn = ConfluentProducer({"bootstrap.servers": bs, "transactional.id": TXN_ID})
        txn.init_transactions(30)
        txn.begin_transaction()
        txn.produce("payments", b"never committed", partition=0)
        txn.flush(30)
        member = Consumer(bootstrap_servers=bs, group_id=GROUP, client_id="billing-1",
                          enable_auto_commit=False)
        member.commit({TopicPartition("payments", 0): 2, TopicPartition("payments", 1): 10})
        member.subscribe(["payments"])

        def assigned() -> bool:
            member.poll(0.2)  # joins the group; commits nothing
            return len(member.assignment()) == 2

        wait_until(assigned, 30, "the member's assignment")
        # The HW climbing past the held LSO, over a few of the sampler's one-second readings:
        # the chart is of time, so time has to pass.
        with Producer(bootstrap_servers=bs) as p:
            for burst in range(4):
                for i in range(5):
                    p.send("payments", value=f"late{burst}-{i}", partition=0)
                p.flush()
                time.sleep(1.2)
        b.profile = tmp / "profile"
        yield b
        member.close()
        txn.abort_transaction(30)


def dom(b, path: str) -> str:
    return chromium(b.profile, b.console_url + path, "--dump-dom").stdout


def screenshot(b, path: str, out: Path) -> None:
    chromium(b.profile, b.console_url + path, f"--screenshot={out}",
             f"--window-size={WINDOW[0]},{WINDOW[1]}")
    assert png_size(out) == WINDOW
    target = os.environ.get("ONCELOG_CONSOLE_SCREENSHOT")
    if target:  # for a person to look at (the note)
        name = Path(target)
        if path != "/topics":
            suffix = path.strip("/").replace("/", "-")
            name = name.with_name(f"{name.stem}-{suffix}{name.suffix}")
        shutil.copyfile(out, name)


def test_chromium_shows_the_open_transaction_with_its_state(console, tmp_path):
    page = dom(console, "/transactions")
    [row] = rows(page, transactional_id=TXN_ID)
    assert row["data-state"] == "Ongoing"
    assert ">Ongoing</span>" in page and "payments-0" in page
    [held] = rows(page, topic="payments", partition=0)
    assert held["data-hanging"] == "no"
    screenshot(console, "/transactions", tmp_path / "transactions.png")


def test_chromium_shows_the_lso_behind_the_hw(console, tmp_path):
    page = dom(console, "/topics")
    [held] = rows(page, topic="payments", partition=0)
    assert int(held["data-lso"]) == 10 and int(held["data-hw"]) == 31
    assert held["class"] == "stuck" and held["data-open-transactions"] == "1"
    [free] = rows(page, topic="payments", partition=1)
    assert free["data-lso"] == free["data-hw"] == "10"
    assert "21 behind" in page
    assert held["data-held-by"] == TXN_ID and "stuck for" in page  # who holds it, how long
    assert page.count("<polyline") >= 6  # HW and LSO lines of each partition's chart
    screenshot(console, "/topics", tmp_path / "topics.png")
    detail = dom(console, "/topics/payments")
    assert "Open transactions" in detail and "<svg" in detail
    assert "LSO stuck at 10 for" in detail and f"held by {TXN_ID} (producer" in detail
    assert len([r for r in rows(detail) if "data-producer-id" in r]) == 1  # on payments-0
    screenshot(console, "/topics/payments", tmp_path / "topic.png")


def test_chromium_shows_the_group_lag(console, tmp_path):
    page = dom(console, "/groups")
    [member] = [r for r in rows(page, group=GROUP) if "data-member-id" in r]
    [p0] = rows(page, topic="payments", partition=0, lag=29)  # HW 31 - committed 2
    [p1] = rows(page, topic="payments", partition=1, lag=0)
    assert p0["data-consumer-id"] == p1["data-consumer-id"] == member["data-member-id"]
    assert "billing-1" in page and ">Stable</span>" in page
    screenshot(console, "/groups", tmp_path / "groups.png")


def test_chromium_shows_the_brokers_and_leaders(console):
    page = dom(console, "/brokers")
    assert rows(page, node_id=1)
    assert rows(page, topic="audit", partition=0, leader=1)
