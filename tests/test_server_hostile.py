"""Hostile clients on loopback (bounded): oversized and malformed bodies, wrong types, unknown
scopes, a huge header, 10,000 connections opened and dropped, slowloris clients. Each gets a 4xx
or is shed, nothing reaches the runtime or the store, and the server keeps serving ``/health``
and a real ``context`` throughout and afterwards."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

from test_server_http import add, serving, store_bytes

from evolve.server.limits import ServerBounds

CONNECTIONS = 10_000


def raw(port: int, data: bytes) -> bytes:
    """Send ``data`` on a fresh connection; what comes back before the server closes it (a
    connection the server reset or closed early reads as what it had sent)."""
    out = b""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        try:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
        except OSError:  # the server answered and closed before taking it all
            pass
        try:
            while chunk := sock.recv(65536):
                out += chunk
        except OSError:  # reset: shed
            pass
    return out


def served_ok(s: object) -> None:
    client = s.client  # type: ignore[attr-defined]
    assert client.get("/health", timeout=5).status_code == 200
    r = client.post("/v1/scopes/ana/context", json={"question": "where"}, timeout=5,
                    headers=s.auth("ana"))  # type: ignore[attr-defined]  # fmt: skip
    assert r.status_code == 200 and "Lyon" in r.json()["context"]


def test_hostile_requests_get_4xx_write_nothing_and_the_server_keeps_serving(tmp_path: Path):
    with serving(tmp_path) as s:
        assert add(s, "ana", "ana", "ana lives in Lyon", sid="a1").status_code == 200
        port = int(s.url.rsplit(":", 1)[1])
        before, s.calls[:] = store_bytes(s.store), []
        h = {**s.auth("ana"), "Content-Type": "application/json"}
        hostile = [  # (method, path, body bytes, headers) -> a 4xx each
            ("POST", "/v1/scopes/ana/sessions", b'{"messages": [{"content": "' + b"x" * (5 << 20)
             + b'"}]}', h),
            ("POST", "/v1/scopes/ana/sessions", b'{"messages": [{"content": "a"', h),
            ("POST", "/v1/scopes/ana/sessions", b'{"messages": [{"content": {"$gt": ""}}]}', h),
            ("POST", "/v1/scopes/ana/sessions", b'{"messages": "all of them"}', h),
            ("POST", "/v1/scopes/ana/sessions", b"\xff\xfe not utf-8", h),
            ("POST", "/v1/scopes/zed/sessions", b'{"messages": [{"content": "a"}]}', h),
            ("POST", "/v1/scopes/ana%2F..%2Fbob/sessions", b'{"messages": [{"content": "a"}]}', h),
            ("GET", "/v1/scopes/../scopes/bob/sessions", b"", h),
            ("POST", "/v1/scopes/ana/context", b'{"question": null}', h),
            ("POST", "/v1/scopes/ana/context", b'{"question": "x", "user": "bob"}', h),
            ("POST", "/v1/scopes/ana/sessions", b'{"messages": [{"content": "a"}]}',
             {**h, "Authorization": "Bearer " + "A" * 10_000}),
            ("GET", "/v1/nothing-here", b"", h),
        ]  # fmt: skip
        for method, path, body, headers in hostile:
            r = s.client.request(method, path, content=body, headers=headers)
            assert 400 <= r.status_code < 500, (path, body[:40], r.status_code, r.text[:200])
            assert list(r.json()) == ["error"]
        # a head beyond h11's bound, and bytes that are not HTTP: answered 4xx or dropped
        reply = raw(port, b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 200_000
                    + b"\r\n\r\n")  # fmt: skip
        assert reply == b"" or reply.startswith(b"HTTP/1.1 4"), reply[:80]
        reply = raw(port, b"\x16\x03\x01\x02\x00 not http at all\r\n\r\n")
        assert reply == b"" or reply.startswith(b"HTTP/1.1 4"), reply[:80]
        served_ok(s)
        # 10,000 connections opened and dropped: half with a partial request, some reset
        t0 = time.monotonic()
        for batch in range(CONNECTIONS // 250):
            socks = []
            for k in range(250):
                sock = socket.socket()
                if k % 3 == 0:  # dropped with a reset
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\0\0\0\0\0\0\0")
                sock.connect(("127.0.0.1", port))
                if k % 2:
                    sock.send(b"POST /v1/scopes/ana/sessions HTTP/1.1\r\nHost: x\r\nContent-Le")
                socks.append(sock)
            for sock in socks:
                sock.close()
            if batch % 10 == 0:
                assert s.client.get("/health", timeout=5).status_code == 200
        assert time.monotonic() - t0 < 60
        served_ok(s)
        assert s.calls == [("context", "ana")] * 2, "a hostile request reached the runtime"
        assert store_bytes(s.store) == before, "a hostile request changed the store"


def test_slowloris_clients_do_not_stop_others_and_are_cut_off(tmp_path: Path):
    bounds = ServerBounds(request_read_s=1.0, max_connections=64)
    with serving(tmp_path, bounds=bounds) as s:
        assert add(s, "ana", "ana", "ana lives in Lyon", sid="a1").status_code == 200
        port = int(s.url.rsplit(":", 1)[1])
        before, s.calls[:] = store_bytes(s.store), []
        closed_after: list[float] = []

        def trickle(body: bool) -> None:
            sock = socket.create_connection(("127.0.0.1", port), timeout=10)
            t0 = time.monotonic()
            head = (b"POST /v1/scopes/ana/sessions HTTP/1.1\r\nHost: x\r\n"
                    b"Authorization: Bearer tok-ana\r\n"
                    b"Content-Type: application/json\r\n")  # fmt: skip
            if body:  # the head whole, then the body a byte at a time
                head += b"Content-Length: 40\r\n\r\n{"
            else:
                head += b"X-Slow: "
            sock.sendall(head)
            try:
                for _ in range(100):  # one byte every 0.1 s, for up to 10 s
                    time.sleep(0.1)
                    sock.send(b"a")
            except OSError:  # the server closed it
                pass
            finally:
                closed_after.append(time.monotonic() - t0)
                sock.close()

        lorises = [threading.Thread(target=trickle, args=(k % 2 == 0,)) for k in range(20)]
        for t in lorises:
            t.start()
        time.sleep(0.3)
        for _ in range(5):  # the others are served meanwhile, at once
            t0 = time.monotonic()
            served_ok(s)
            assert time.monotonic() - t0 < 1.0
        for t in lorises:
            t.join(15)
        assert len(closed_after) == 20 and max(closed_after) < 5, closed_after  # cut at ~1 s
        served_ok(s)
        assert s.calls == [("context", "ana")] * 6
        assert store_bytes(s.store) == before
