"""Connection limits of ``serve`` on a real loopback server: headers that never complete are closed."""

from __future__ import annotations

import socket
import time

import httpx
from fakes import ScriptedLM
from serving import serving
from test_serve import make_service, script

from crag_dspy.serve import ServePolicy, create_app
from crag_dspy.serve.connections import serve_config
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
