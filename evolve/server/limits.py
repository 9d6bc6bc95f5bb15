"""The server's transport bounds and its stop: what no request may exceed before it reaches a
route, and SIGTERM as drain-then-exit.

Owns :class:`BodyLimit` (an ASGI middleware: a body over ``max_body`` bytes answers 413 before
the route runs), :class:`DeadlinedH11` (uvicorn's h11 protocol with a deadline on reading each
request: a client that trickles its headers or body, or connects and sends nothing, is cut off
after ``REQUEST_READ_S`` seconds), :class:`ServerBounds` (connection caps and timeouts),
:func:`uvicorn_config` and :class:`DrainingServer` (a uvicorn server whose first SIGTERM or
SIGINT drains the service — new verbs 503, admitted ones finish — then stops, exit status 0).

Invariants:

- A request is read whole within ``request_read_s`` of its first byte (or of the connection, or
  of the previous response), or its connection is closed; a request read whole is never cut
  off, however long its verb runs (the service's deadlines bound that).
- A body over the limit is refused by its ``Content-Length`` without being read, or, sent
  without one, as soon as the bytes read pass the limit; the route never sees it.
- A drained stop never re-raises the signal: the process ends with status 0 once every
  admitted verb finished (or the drain timeout passed; then status 1); connections still open
  :data:`CLOSE_S` seconds after the drain (an idle MCP stream) are cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import socket
import threading
from collections.abc import Callable, Generator
from dataclasses import dataclass
from types import FrameType
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

MAX_BODY = 4 * 2**20  # bytes of one request body
REQUEST_READ_S = 10.0  # seconds to send one request, headers and body
# seconds a stopping server waits for open connections after the drain (an MCP stream, a
# response being written) before it cancels them
CLOSE_S = 5

Scope = dict[str, Any]
Receive = Callable[[], Any]
Send = Callable[[dict[str, Any]], Any]


@dataclass(frozen=True)
class ServerBounds:
    """What one connection, and all of them, may hold (``evolve serve`` flags)."""

    max_body: int = MAX_BODY
    max_connections: int = 1024  # connections and requests at once; beyond: 503
    keep_alive_s: float = 5.0  # an idle keep-alive connection is closed after this
    request_read_s: float = REQUEST_READ_S
    max_header_bytes: int = 64 * 1024  # h11's bound on an incomplete request head
    drain_s: float = 130.0  # how long SIGTERM waits for admitted verbs


async def _send_error(send: Send, status: int, message: str) -> None:
    body = json.dumps({"error": message}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})  # fmt: skip
    await send({"type": "http.response.body", "body": body})


class BodyLimit:
    """ASGI middleware: 413 for a body over ``max_body`` bytes."""

    def __init__(self, app: Any, max_body: int = MAX_BODY) -> None:
        self.app = app
        self.max_body = max_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        too_large = f"body: larger than {self.max_body} bytes"
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    await _send_error(send, 400, "content-length: not a number")
                    return
                if declared > self.max_body:
                    await _send_error(send, 413, too_large)
                    return
        seen = 0
        started = answered = False

        async def counted() -> dict[str, Any]:
            nonlocal seen, started, answered
            if answered:
                return {"type": "http.disconnect"}
            message = dict(await receive())
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_body:  # sent without a Content-Length: refused here
                    if not started:
                        await _send_error(send, 413, too_large)
                    started = answered = True
                    return {"type": "http.disconnect"}  # the route stops reading
            return message

        async def watched(message: dict[str, Any]) -> None:
            nonlocal started
            if answered:
                return  # the 413 was the answer
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, watched)
        except Exception:
            if not answered:
                raise


class DeadlinedH11(H11Protocol):
    """h11 with a deadline on reading each request (see the module's invariants)."""

    request_read_s = REQUEST_READ_S  # set per server by :func:`uvicorn_config`
    _read_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm()  # the next request on this connection has its own deadline

    def _arm(self) -> None:
        self._disarm()
        self._read_deadline = self.loop.call_later(self.request_read_s, self._too_slow)

    def _disarm(self) -> None:
        if self._read_deadline is not None:
            self._read_deadline.cancel()
            self._read_deadline = None

    def _too_slow(self) -> None:
        self._read_deadline = None
        if self.transport.is_closing() or self.conn.their_state in (h11.DONE, h11.MUST_CLOSE):
            return  # read whole: the verb runs under the service's deadline
        self.transport.close()


def uvicorn_config(app: Any, bounds: ServerBounds, **kw: Any) -> uvicorn.Config:
    """A uvicorn config serving ``app`` under ``bounds`` (no access log; ``kw`` passed on)."""
    protocol = type("BoundedH11", (DeadlinedH11,), {"request_read_s": bounds.request_read_s})
    return uvicorn.Config(
        app, http=protocol, lifespan="auto", access_log=False,
        limit_concurrency=bounds.max_connections, timeout_keep_alive=int(bounds.keep_alive_s),
        h11_max_incomplete_event_size=bounds.max_header_bytes,
        timeout_graceful_shutdown=CLOSE_S, **kw,
    )  # fmt: skip


def listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host``:``port`` (0: an ephemeral port)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


class DrainingServer(uvicorn.Server):
    """A uvicorn server whose first SIGTERM/SIGINT starts ``drain`` (refuse new verbs), then,
    once ``wait_idle(drain_s)`` returns, stops serving; a second signal stops at once."""

    def __init__(
        self,
        config: uvicorn.Config,
        *,
        begin_drain: Callable[[], None],
        wait_idle: Callable[[float], bool],
        drain_s: float,
    ) -> None:
        super().__init__(config)
        self._begin_drain = begin_drain
        self._wait_idle = wait_idle
        self._drain_s = drain_s
        self.drained: bool | None = None  # None: not asked to stop by a signal

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        originals = {sig: signal.signal(sig, self.handle_exit)
                     for sig in (signal.SIGINT, signal.SIGTERM)}  # fmt: skip
        try:
            yield
        finally:
            for sig, handler in originals.items():
                signal.signal(sig, handler)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.drained is not None or self.should_exit:
            self.force_exit = self.should_exit = True
            return
        self.drained = False
        self._begin_drain()
        threading.Thread(target=self._drain_then_stop, name="drain", daemon=True).start()

    def _drain_then_stop(self) -> None:
        self.drained = self._wait_idle(self._drain_s)
        self.should_exit = True
