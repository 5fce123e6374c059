"""The web console from outside: HTTP requests, the rows a page shows, a broker process started
with ``--console-port``: tests/test_console.py and tests/test_console_browser.py."""

from __future__ import annotations

import base64
import re
import socket
import ssl
import urllib.error
import urllib.request
from html.parser import HTMLParser
from pathlib import Path

from oncelog.harness.broker_process import BrokerProcess
from support.waiting import wait_until


def get(url: str, user: str | None = None, password: str = "",
        context: ssl.SSLContext | None = None, method: str = "GET"
        ) -> tuple[int, dict[str, str], str]:
    """(status, headers, body) of one request; an HTTP error status is returned, not raised."""
    request = urllib.request.Request(url, method=method)
    if user is not None:
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=20, context=context) as r:
            return r.status, dict(r.headers), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read().decode()


def raw(port: int, data: bytes) -> bytes:
    """Send ``data`` as it is, half-close, and read the answer until the console hangs up."""
    with socket.create_connection(("127.0.0.1", port), timeout=20) as s:
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
        return out


def status_of(answer: bytes) -> int:
    m = re.match(rb"HTTP/1\.1 (\d{3}) ", answer)
    assert m, answer[:200]
    return int(m.group(1))


class _Rows(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.rows: list[dict[str, str]] = []

    def handle_starttag(self, tag, attrs) -> None:
        if tag in ("tr", "section"):
            self.rows.append({k: v or "" for k, v in attrs})


def rows(page: str, **match: object) -> list[dict[str, str]]:
    """The attributes of the page's table rows (and sections) whose data attributes match:
    ``rows(page, topic="t", partition=0)`` looks for data-topic="t" data-partition="0"."""
    parser = _Rows()
    parser.feed(page)
    want = {"data-" + k.replace("_", "-"): str(v) for k, v in match.items()}
    return [r for r in parser.rows if all(r.get(k) == v for k, v in want.items())]


class ConsoleBrokerProcess(BrokerProcess):
    """A broker process started as users start it: ``oncelog broker --console-port 0``; the
    console's address is read from the line the broker prints."""

    def command(self) -> list[str]:
        return [*super().command(), "--console-port", "0"]

    def wait_listening(self, timeout: float = 30.0):
        super().wait_listening(timeout)
        log = Path(self.log_path)
        self.console_url = wait_until(
            lambda: (m := re.findall(r"oncelog console at (http\S+)/", log.read_text()))
            and m[-1], timeout, "the console's address on the broker's stdout")
        return self
