"""Connection limits of ``serve`` on a real loopback server: headers that never complete are closed."""

from __future__ import annotations

import socket
import time

import httpx
import pytest
from fakes import ScriptedLM
from serving import serving
from test_serve import make_service, script

from crag_dspy.serve import ServePolicy, create_app
from crag_dspy.serve.connections import H11HeaderDeadline, serve_config
from crag_dspy.settings import Settings

PARTIAL = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "  # no blank line: the headers never end


def _server_config(app, **settings):
    return serve_config(app, Settings(**settings), log_level="warning", lifespan="off")


def _connect(url: str) -> socket.socket:
    return socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])), timeout=5)


def _open_partial(url: str, count: int) -> list[socket.socket]:
    sockets = []
    for _ in range(count):
        sock = _connect(url)
        sock.sendall(PARTIAL)
        sockets.append(sock)
    return sockets


def _closed_by_server(sock: socket.socket, within_s: float) -> bool:
    """True when the server closed ``sock`` (EOF or reset) within ``within_s`` seconds."""
    sock.settimeout(within_s)
    try:
        return sock.recv(1024) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_connections_whose_headers_never_complete_are_closed_after_the_header_timeout():
    app = create_app(make_service())
    with serving(app, config=_server_config(app, serve_header_timeout_s=0.5)) as url:
        started = time.monotonic()
        sockets = _open_partial(url, 4)
        try:
            assert all(_closed_by_server(sock, within_s=5) for sock in sockets)
            assert 0.4 < time.monotonic() - started < 5
            # A request that sends its headers at once is answered as before.
            assert httpx.get(f"{url}/health").status_code == 200
        finally:
            for sock in sockets:
                sock.close()


def test_a_connection_that_starts_its_next_request_on_keep_alive_gets_the_deadline_too():
    app = create_app(make_service())
    with serving(app, config=_server_config(app, serve_header_timeout_s=0.5)) as url:
        sock = _connect(url)
        try:
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            sock.settimeout(5)
            assert sock.recv(4096).startswith(b"HTTP/1.1 200")
            sock.sendall(PARTIAL)  # the next request, started within the keep-alive time, never ends
            assert _closed_by_server(sock, within_s=3)
        finally:
            sock.close()


def test_past_the_waiting_limit_the_oldest_half_open_connection_is_closed_and_health_answers():
    app = create_app(make_service())
    config = _server_config(app, serve_header_timeout_s=60, serve_max_waiting_connections=3)
    with serving(app, config=config) as url:
        sockets = _open_partial(url, 5)
        try:
            time.sleep(0.2)  # the server has accepted them all
            # The two oldest made room; the header timeout (60 s) has not passed.
            assert [_closed_by_server(sock, within_s=1) for sock in sockets[:2]] == [True, True]
            assert not _closed_by_server(sockets[-1], within_s=0.3)
            assert httpx.get(f"{url}/health", timeout=5).status_code == 200
        finally:
            for sock in sockets:
                sock.close()


def test_a_request_in_progress_is_not_closed_by_the_header_timeout():
    def slow(system: str, user: str):
        time.sleep(0.2)  # three calls a question: each answer takes twice the header timeout
        return script(system, user)

    app = create_app(make_service(lm=ScriptedLM(slow)))
    config = _server_config(app, serve_header_timeout_s=0.3)
    with serving(app, config=config) as url, httpx.Client(base_url=url, timeout=10) as client:
        for _ in range(2):  # the same keep-alive connection
            response = client.post("/ask", json={"question": "What is the range of the AquaProbe 220?"})
            assert response.status_code == 200


BODY = b'{"question": "What is the range of the AquaProbe 220?"}'
SLOW_BODY_HEADERS = (
    b"POST /ask HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    b"Content-Length: 1000\r\n\r\n"
)  # the headers promise 1000 bytes; the body sent is shorter, or trickles


def _reply(sock: socket.socket, within_s: float) -> bytes:
    """What the server sends on ``sock`` until it closes it (or ``within_s`` passes)."""
    sock.settimeout(within_s)
    received = b""
    try:
        while chunk := sock.recv(4096):
            received += chunk
    except (TimeoutError, ConnectionResetError):
        pass
    return received


def test_a_body_that_stops_is_answered_408_and_the_connection_closed_after_the_body_timeout():
    app = create_app(make_service())
    with serving(app, config=_server_config(app, serve_body_timeout_s=0.5)) as url:
        sock = _connect(url)
        try:
            started = time.monotonic()
            sock.sendall(SLOW_BODY_HEADERS + b'{"question": ')  # then nothing more
            reply = _reply(sock, within_s=5)
            assert 0.4 < time.monotonic() - started < 5
            assert reply.startswith(b"HTTP/1.1 408") and b"CRAG_SERVE_BODY_TIMEOUT_S" in reply
            assert _closed_by_server(sock, within_s=1)
            assert httpx.get(f"{url}/health", timeout=5).status_code == 200
        finally:
            sock.close()


def test_a_body_sent_a_byte_at_a_time_is_cut_at_the_body_timeout_not_kept_alive_by_each_byte():
    app = create_app(make_service())
    with serving(app, config=_server_config(app, serve_body_timeout_s=0.6)) as url:
        sock = _connect(url)
        try:
            started = time.monotonic()
            sock.sendall(SLOW_BODY_HEADERS)
            for byte in BODY[:20]:  # one byte every 0.1 s: each arrives well within the timeout
                try:
                    sock.sendall(bytes([byte]))
                except OSError:
                    break  # closed by the server
                time.sleep(0.1)
            assert _reply(sock, within_s=5).startswith(b"HTTP/1.1 408")
            assert time.monotonic() - started < 3
        finally:
            sock.close()


def test_a_body_that_arrives_in_pieces_within_the_body_timeout_is_answered():
    app = create_app(make_service())
    with serving(app, config=_server_config(app, serve_body_timeout_s=2)) as url:
        sock = _connect(url)
        try:
            head = b"POST /ask HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            sock.sendall(head + b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(BODY) + BODY[:10])
            time.sleep(0.5)
            sock.sendall(BODY[10:])
            assert _reply(sock, within_s=10).startswith(b"HTTP/1.1 200")
        finally:
            sock.close()


def test_connections_waiting_for_a_body_count_towards_the_waiting_limit():
    app = create_app(make_service())
    config = _server_config(app, serve_body_timeout_s=60, serve_max_waiting_connections=3)
    with serving(app, config=config) as url:
        sockets = []
        try:
            for _ in range(5):
                sock = _connect(url)
                sock.sendall(SLOW_BODY_HEADERS + b"{")
                sockets.append(sock)
                time.sleep(0.05)  # in order: the first is the one that has waited longest
            time.sleep(0.2)
            # The two oldest made room; the body timeout (60 s) has not passed.
            assert [_closed_by_server(sock, within_s=1) for sock in sockets[:2]] == [True, True]
            assert not _closed_by_server(sockets[-1], within_s=0.3)
            assert httpx.get(f"{url}/health", timeout=5).status_code == 200
        finally:
            for sock in sockets:
                sock.close()


def _stream_header(sock: socket.socket, total: int, piece: int = 4096) -> int:
    """Send one header of ``total`` bytes in pieces, as bighdr.py did; the bytes sent before the server
    closed the connection."""
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: ")
    sent = 0
    while sent < total:
        try:
            sock.sendall(b"a" * piece)
        except OSError:  # closed by the server
            break
        sent += piece
    return sent


@pytest.mark.parametrize("http", ["httptools", "h11"])
def test_a_request_head_over_the_limit_is_answered_431_and_closed(http):
    # httptools had no limit at all: one header streamed for the whole header timeout was buffered whole
    # (probe 3: +94 MB from one connection). h11 stops at the same limit (with its own 400).
    app = create_app(make_service())
    config = _server_config(app, serve_max_header_bytes=8192, serve_header_timeout_s=60)
    if http == "h11":
        config.http = H11HeaderDeadline
    with serving(app, config=config) as url:
        sock = _connect(url)
        try:
            assert _stream_header(sock, total=4 * 1024 * 1024) < 4 * 1024 * 1024  # cut long before
            reply = _reply(sock, within_s=5)
            if http == "httptools":
                assert reply.startswith(b"HTTP/1.1 431") and b"CRAG_SERVE_MAX_HEADER_BYTES" in reply
            else:
                assert reply.startswith((b"HTTP/1.1 400", b"HTTP/1.1 431"))
        finally:
            sock.close()
        # A head within the limit, sent in pieces, is answered; and so is the next request.
        with httpx.Client(base_url=url, timeout=5) as client:
            assert client.get("/health", headers={"X-Big": "a" * 6000}).status_code == 200
            assert client.get("/health", headers={"X-Big": "a" * 6000}).status_code == 200


def test_a_body_in_the_same_read_as_its_headers_does_not_count_towards_the_head_limit():
    app = create_app(make_service())
    with serving(app, config=_server_config(app, serve_max_header_bytes=1024)) as url:
        sock = _connect(url)
        try:
            head = b"POST /ask HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            body = b'{"question": "What is the range of the AquaProbe 220?%s"}' % (b" " * 1800)
            sock.sendall(head + b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)
            assert _reply(sock, within_s=10).startswith(b"HTTP/1.1 200")
        finally:
            sock.close()


def _addresses_counted(url: str, forwarded: list[str]) -> list[int]:
    """The status of one GET /program per forged X-Forwarded-For: under a 2/minute limit, the third is a
    429 when they all count against this machine's address."""
    with httpx.Client(base_url=url, timeout=10) as client:
        return [client.get("/program", headers={"X-Forwarded-For": ip}).status_code for ip in forwarded]


def test_a_forged_x_forwarded_for_does_not_reset_the_rate_limit_by_default():
    app = create_app(make_service(), ServePolicy(rate_limit="2/minute"))
    with serving(app, config=_server_config(app)) as url:
        assert _addresses_counted(url, ["10.0.0.1", "10.0.0.2", "10.0.0.3"]) == [200, 200, 429]


def test_proxy_headers_are_trusted_from_the_configured_addresses_only():
    app = create_app(make_service(), ServePolicy(rate_limit="2/minute"))
    config = _server_config(app, forwarded_allow_ips=("127.0.0.1",))  # a reverse proxy on this machine
    with serving(app, config=config) as url:
        assert _addresses_counted(url, ["10.0.0.1", "10.0.0.2", "10.0.0.3"]) == [200, 200, 200]
    app = create_app(make_service(), ServePolicy(rate_limit="2/minute"))
    config = _server_config(app, forwarded_allow_ips=("10.9.9.9",))  # the proxy is elsewhere: not us
    with serving(app, config=config) as url:
        assert _addresses_counted(url, ["10.0.0.1", "10.0.0.2", "10.0.0.3"]) == [200, 200, 429]
