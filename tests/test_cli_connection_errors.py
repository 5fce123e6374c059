"""What a command and a client say when the address they were given is not a Kafka broker: a
closed port, a listener that never answers, an HTTP server, a TLS listener reached in
plaintext. The command gives up within seconds (the check of client/reachable.py: 5 s for
the connection, 5 s for the answer) with one line naming the address and the cause, where it
used to retry for a minute and name "node -1"; the library's timeout names the last
connection error."""

from __future__ import annotations

import http.server
import socket
import ssl
import threading
import time

import pytest
from support.cli import oncelog
from support.tls import make_certificates

from oncelog import Admin, Producer
from oncelog.client.errors import KafkaTimeoutError


def _accepting(handle) -> tuple[socket.socket, int]:
    """A listener on 127.0.0.1 whose every connection goes to ``handle`` on a thread."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()

    def loop() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=handle, args=(conn,), daemon=True).start()

    threading.Thread(target=loop, daemon=True).start()
    return listener, listener.getsockname()[1]


@pytest.fixture
def silent_port():
    held: list[socket.socket] = []  # accepted, never answered, closed at the end
    listener, port = _accepting(held.append)
    yield port
    listener.close()
    for conn in held:
        conn.close()


@pytest.fixture
def http_port():
    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


@pytest.fixture
def tls_port(tmp_path):
    certs = make_certificates(tmp_path)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(certs.server_pem)

    def handshake(conn: socket.socket) -> None:
        conn.settimeout(10)
        try:
            with context.wrap_socket(conn, server_side=True) as tls:
                tls.recv(1)
        except OSError:
            pass
        finally:
            conn.close()

    listener, port = _accepting(handshake)
    yield port
    listener.close()


@pytest.fixture
def closed_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again: nothing listens there


def _topics_list(port: int, *extra: str):
    start = time.monotonic()
    proc = oncelog("topics", "list", "--bootstrap-server", f"127.0.0.1:{port}", *extra,
                   check=False)
    return proc, time.monotonic() - start


@pytest.mark.parametrize("listener, cause", [
    ("closed_port", "connection refused to 127.0.0.1:{port}"),
    ("silent_port", "no answer from 127.0.0.1:{port} in 5 s (a silent listener"),
    ("http_port", "no Kafka response from 127.0.0.1:{port}: is it an HTTP server?"),
    ("tls_port", "the peer at 127.0.0.1:{port} speaks TLS: use --security-protocol SSL"),
])
def test_a_command_names_what_is_at_the_address_and_gives_up(request, listener, cause):
    port = request.getfixturevalue(listener)
    proc, took = _topics_list(port)
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout == ""
    # one line, the cause once; no retries, no bootstrap node number
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("oncelog topics: " + cause.format(port=port)), proc.stderr
    assert "node -1" not in proc.stderr and "retrying" not in proc.stderr
    # it used to take 65 s; generous, far below that (the check waits 5 + 5 s at most)
    assert took < 30, took


def test_tls_to_a_plaintext_or_http_listener_says_so(silent_port, http_port, tmp_path):
    plain, _ = _accepting(lambda conn: conn.close())  # closes at our TLS hello, as a broker
    try:
        proc, _ = _topics_list(plain.getsockname()[1], "--security-protocol", "SSL")
    finally:
        plain.close()
    assert proc.returncode == 1
    assert "closed the connection at our TLS hello: is it a PLAINTEXT listener?" in proc.stderr
    proc, _ = _topics_list(silent_port, "--security-protocol", "SSL")
    assert "no TLS answer from" in proc.stderr and "silent listener" in proc.stderr
    assert proc.stderr.count("\n") == 1, proc.stderr


def test_the_clients_timeouts_name_the_last_connection_error(closed_port):
    address = f"127.0.0.1:{closed_port}"
    with Producer(bootstrap_servers=address, max_block_ms=1000) as producer:
        future = producer.send("somewhere", b"v")
        with pytest.raises(KafkaTimeoutError) as caught:
            future.result(30)
    text = str(caught.value)
    assert "not present in metadata after 1000 ms" in text
    assert f"last connection error: cannot connect to node -1 at {address}: " \
        "connection refused" in text
    with Admin(bootstrap_servers=address, default_api_timeout_ms=1000) as admin, \
            pytest.raises(KafkaTimeoutError, match=f"{address}: connection refused"):
        admin.list_topics()
