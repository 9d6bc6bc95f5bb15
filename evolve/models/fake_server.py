"""TEST DOUBLE — a fake OpenAI-compatible model server on loopback, with latency and faults.

Owns :class:`FakeModelServer` (a real HTTP server, bound to 127.0.0.1 only, an ephemeral port by
default), :class:`Fault` and :class:`FaultPlan` (which request gets which injected fault),
:class:`ServerStats` (what the server saw), :func:`fake_script` (the default replies) and the
command line ``python -m evolve.models.fake_server`` (users dry-run their setup against it).

It speaks enough of the OpenAI API for litellm's ``openai/<name>`` provider with ``api_base``:
``POST /v1/chat/completions`` (non-streaming), ``GET /v1/models``, and ``GET /stats`` (the
:class:`ServerStats` as JSON). Replies come from a script in the convention of
:class:`evolve.models.testing.ScriptedLLM` — a list consumed in order, or a callable ``(role,
purpose, messages) -> reply`` — called with a role and purpose read off the request (see
:func:`request_purpose`); by default :func:`fake_script`, which is
:func:`evolve.models.testing.task_script` plus a judge that awards full marks. Usage tokens are
whitespace-split words of the prompt and of the reply, as ScriptedLLM counts them.

Faults (each request draws one from the plan, or none): ``429`` (with ``Retry-After``), ``500``,
``hang`` (no answer for ``Fault.seconds``, then a normal reply; never, when None), ``truncate``
(200 whose body stops mid-JSON and the connection closes), ``garbage`` (200 ``text/plain``
that is not JSON) and ``prose`` (a well-formed completion whose content is prose, not the JSON
the request asked for; drawn for a request that asked for no JSON, it is not injected nor
counted, since prose is a valid answer there). Latency (``latency_s``) is waited before every
reply and every fault but ``hang``.

Invariants: only chat-completion requests are counted (``requests``, ``in_flight``,
``max_in_flight``, ``faults``); the in-flight counter is raised when such a request arrives and
lowered just before its reply is written (or in a ``finally`` when none is), under one lock, so
``max_in_flight`` is exact and a client that sends its next request as soon as a reply arrives
is never counted twice; every other count is made before the reply it concerns. A wait
(latency, hang) ends when its time is up, when the client hangs up (counted in
``disconnects``) or when the server stops, so :meth:`FakeModelServer.stop` returns with every
handler thread joined and the port freed. Nothing here is ever selected silently: a caller
starts a server by name.
"""

from __future__ import annotations

import argparse
import json
import random
import select
import signal
import socket
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal, cast

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from evolve.models.llm import Message
from evolve.models.testing import Script, task_script

FaultKind = Literal["429", "500", "hang", "truncate", "garbage", "prose"]
FAULT_KINDS: tuple[FaultKind, ...] = ("429", "500", "hang", "truncate", "garbage", "prose")
PROSE = "Sorry, I would rather answer in words than in JSON."
GARBAGE = b"<html>upstream proxy error: not JSON</html>"
POLL_S = 0.02  # how often a wait looks for a hung-up client


class Fault(BaseModel):
    """One injected fault. ``retry_after`` (seconds) is the 429's header; ``seconds`` is how long
    a ``hang`` lasts before the reply is sent (None: until the client leaves or the server
    stops)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: FaultKind
    retry_after: float = Field(default=1.0, ge=0)
    seconds: float | None = Field(default=None, ge=0)


class FaultPlan(BaseModel):
    """Which request gets which fault. Request ``n`` (0-based, in order of arrival) gets
    ``sequence[n]`` (None: no fault) while the sequence lasts; after it, a fault of kind ``k``
    with probability ``rates[k]``, drawn from a generator seeded by (``seed``, ``n``), so a plan
    gives the same faults to the same request numbers in every run. ``retry_after`` and
    ``hang_s`` parametrise the drawn faults."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    sequence: tuple[Fault | None, ...] = ()
    rates: dict[FaultKind, float] = Field(default_factory=dict)
    seed: int = 0
    retry_after: float = Field(default=1.0, ge=0)
    hang_s: float | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _rates_are_probabilities(self) -> FaultPlan:
        if any(not 0 <= r <= 1 for r in self.rates.values()) or sum(self.rates.values()) > 1:
            raise ValueError(f"fault rates must be in [0, 1] and sum to at most 1: {self.rates}")
        return self

    def fault_for(self, n: int) -> Fault | None:
        if n < len(self.sequence):
            return self.sequence[n]
        u = random.Random(f"{self.seed}:{n}").random()
        for kind in FAULT_KINDS:  # a fixed order, so the draw does not depend on dict order
            u -= self.rates.get(kind, 0.0)
            if u < 0:
                return Fault(kind=kind, retry_after=self.retry_after, seconds=self.hang_s)
        return None


@dataclass
class ServerStats:
    """What the server saw: chat-completion requests received, answered normally, in flight now
    and at most at once, faults injected per kind, clients that hung up during a wait, and
    requests refused as malformed (or whose script failed)."""

    requests: int = 0
    answered: int = 0
    in_flight: int = 0
    max_in_flight: int = 0
    faults: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FAULT_KINDS, 0))
    disconnects: int = 0
    bad_requests: int = 0


def request_purpose(body: Mapping[str, Any]) -> tuple[str, str]:
    """The (role, purpose) a request stands for, read off its ``response_format`` schema: an
    extraction reply (``units``) → ``task``/``fake/extract``; a judge's (``score``) →
    ``judge``/``fake/judge``; any other schema (a program's query) → ``task``/``fake/plan``; no
    schema → ``task``/``fake/answer``."""
    fmt = body.get("response_format")
    if not isinstance(fmt, dict):
        return "task", "fake/answer"
    nested = fmt.get("json_schema")
    schema = fmt.get("schema") or (nested.get("schema") if isinstance(nested, dict) else None)
    props = schema.get("properties", {}) if isinstance(schema, dict) else {}
    if "units" in props:
        return "task", "fake/extract"
    if "score" in props:
        return "judge", "fake/judge"
    return "task", "fake/plan"


def fake_script(role: str, purpose: str, messages: list[Message]) -> str:
    """The default replies: :func:`~evolve.models.testing.task_script` for the task model, and a
    judge that gives every rubric item full marks. Both answer the conversation's first user
    message, so a repair turn ("reply again with the corrected JSON") gets the reply the
    original prompt gets, as from a model that corrects itself."""
    if role == "judge":
        return json.dumps({"score": 1, "reason": "scripted judge"})
    first = next((i for i, m in enumerate(messages) if m.get("role") == "user"), len(messages))
    return task_script(role, purpose, messages[: first + 1])


class _Server(ThreadingHTTPServer):
    daemon_threads = False  # server_close() joins every handler thread
    block_on_close = True

    def __init__(self, owner: FakeModelServer, port: int) -> None:
        self.owner = owner
        super().__init__(("127.0.0.1", port), _Handler)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    timeout = 10  # an idle connection cannot hold a handler thread for longer
    _flying = False  # a chat-completion request counted in flight

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        owner = self.server.owner
        if self.path.rstrip("/") == "/stats":
            self._json(200, asdict(owner.stats()))
        elif self.path.rstrip("/") == "/v1/models":
            models = [{"id": m, "object": "model", "owned_by": "prismem"} for m in owner.models]
            self._json(200, {"object": "list", "data": models})
        else:
            self._json(404, _error(f"no route GET {self.path}", "not_found"))

    def do_POST(self) -> None:
        if self.path.rstrip("/") != "/v1/chat/completions":
            self._json(404, _error(f"no route POST {self.path}", "not_found"))
            return
        owner = self.server.owner
        n = owner._arrive()
        self._flying = True
        try:
            self._complete(owner, owner.faults.fault_for(n))
        finally:
            self._land()

    def _land(self) -> None:
        """Count this request out of flight, once."""
        if self._flying:
            self._flying = False
            self.server.owner._leave()

    def _complete(self, owner: FakeModelServer, fault: Fault | None) -> None:
        try:
            length = max(0, int(self.headers.get("Content-Length", 0)))
            body, messages = _parse(self.rfile.read(length))
        except ValueError as exc:
            owner._count("bad_requests")
            self._json(400, _error(f"malformed request: {exc}", "invalid_request_error"))
            return
        if fault is not None and fault.kind == "prose" and not body.get("response_format"):
            fault = None  # prose is a fault only where JSON was asked for
        if fault is not None:
            owner._fault(fault.kind)
        wait = fault.seconds if fault is not None and fault.kind == "hang" else owner.latency_s
        if not self._wait(owner, wait):
            return
        if fault is not None and fault.kind != "hang":
            self._inject(fault, body)
            return
        try:
            text = owner._reply(*request_purpose(body), messages)
        except Exception as exc:  # a broken script is the test's bug: refuse, never retry
            owner._count("bad_requests")
            self._json(400, _error(f"script failed: {exc}", "invalid_request_error"))
            return
        owner._count("answered")  # before the reply, so a client that has it sees it counted
        self._json(200, _completion(body, messages, text))

    def _wait(self, owner: FakeModelServer, seconds: float | None) -> bool:
        """Wait ``seconds`` (None: forever); False when the client hung up or the server is
        stopping first."""
        deadline = None if seconds is None else time.monotonic() + seconds
        while deadline is None or time.monotonic() < deadline:
            left = POLL_S if deadline is None else min(POLL_S, deadline - time.monotonic())
            if owner._stopping.wait(max(left, 0.0)):
                return False
            if self._client_gone():
                owner._count("disconnects")
                return False
        return True

    def _client_gone(self) -> bool:
        poller = select.poll()  # not select(): it cannot watch a descriptor numbered 1024 or more
        poller.register(self.connection, select.POLLIN)
        if not poller.poll(0):
            return False
        try:
            return self.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    def _inject(self, fault: Fault, body: dict[str, Any]) -> None:
        if fault.kind == "429":
            headers = {"Retry-After": f"{fault.retry_after:g}"}
            self._json(429, _error("rate limit reached (injected)", "rate_limit_error"), headers)
        elif fault.kind == "500":
            self._json(500, _error("internal error (injected)", "server_error"))
        elif fault.kind == "truncate":
            data = json.dumps(_completion(body, body["messages"], PROSE)).encode()
            self._head(200, "application/json", len(data))
            self.wfile.write(data[: len(data) // 2])
            self.close_connection = True
        elif fault.kind == "garbage":
            self._head(200, "text/plain", len(GARBAGE))
            self.wfile.write(GARBAGE)
        else:  # prose
            self._json(200, _completion(body, body["messages"], PROSE))

    def _json(self, status: int, payload: Any, headers: Mapping[str, str] = {}) -> None:
        data = json.dumps(payload).encode()
        self._head(status, "application/json", len(data), headers)
        self.wfile.write(data)

    def _head(
        self, status: int, content_type: str, length: int, headers: Mapping[str, str] = {}
    ) -> None:
        self._land()  # before the reply, so a client's next request never overlaps this one
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(length))
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()


def _parse(raw: bytes) -> tuple[dict[str, Any], list[Message]]:
    """A chat-completion body and its messages; ValueError when it is not one."""
    body = json.loads(raw)
    messages = body.get("messages") if isinstance(body, dict) else None
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise ValueError("the body must be a JSON object with a list of message objects")
    return body, messages


def _error(message: str, kind: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "code": None}}


def _completion(body: Mapping[str, Any], messages: list[Message], text: str) -> dict[str, Any]:
    prompt_tokens = sum(len(str(m.get("content", "")).split()) for m in messages)
    completion_tokens = len(text.split())
    return {
        "id": "fake-1",
        "object": "chat.completion",
        "created": 0,
        "model": str(body.get("model", "fake")),
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": "stop",
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


class FakeModelServer:
    """TEST DOUBLE — a fake OpenAI-compatible server on 127.0.0.1; never selected silently.

    ``with FakeModelServer(latency_s=1, faults=FaultPlan(rates={"429": 0.1})) as server:`` then
    point a model at ``server.base_url`` (``.../v1``) as ``openai/fake``. ``script`` follows
    :class:`~evolve.models.testing.ScriptedLLM`'s convention (a list of replies, or a callable
    ``(role, purpose, messages) -> reply``). ``port=0`` takes an ephemeral port.
    """

    def __init__(
        self,
        script: Script = fake_script,
        *,
        latency_s: float = 0.0,
        faults: FaultPlan | None = None,
        port: int = 0,
        models: Sequence[str] = ("fake",),
    ) -> None:
        if latency_s < 0:
            raise ValueError(f"latency must be >= 0 seconds, not {latency_s}")
        self.script = script if callable(script) else list(script)
        self.latency_s = latency_s
        self.faults = faults or FaultPlan()
        self.models = tuple(models)
        self._lock = threading.Lock()
        self._stats = ServerStats()
        self._replies_used = 0
        self._stopping = threading.Event()
        self._httpd = _Server(self, port)
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> FakeModelServer:
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="fake-server")
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, end every wait, join every thread and free the port (idempotent)."""
        self._stopping.set()
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join()
            self._thread = None
        self._httpd.server_close()

    def __enter__(self) -> FakeModelServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stats(self) -> ServerStats:
        """A consistent snapshot of the counters."""
        with self._lock:
            return ServerStats(**{**asdict(self._stats), "faults": dict(self._stats.faults)})

    def _arrive(self) -> int:
        with self._lock:
            s = self._stats
            s.requests += 1
            s.in_flight += 1
            s.max_in_flight = max(s.max_in_flight, s.in_flight)
            return s.requests - 1

    def _leave(self) -> None:
        with self._lock:
            self._stats.in_flight -= 1

    def _count(self, name: str) -> None:
        with self._lock:
            setattr(self._stats, name, getattr(self._stats, name) + 1)

    def _fault(self, kind: str) -> None:
        with self._lock:
            self._stats.faults[kind] += 1

    def _reply(self, role: str, purpose: str, messages: list[Message]) -> str:
        if callable(self.script):
            return self.script(role, purpose, messages)
        with self._lock:
            used, self._replies_used = self._replies_used, self._replies_used + 1
        if used >= len(self.script):
            raise IndexError(f"script exhausted after {len(self.script)} replies")
        return self.script[used]


def parse_rates(spec: str) -> dict[FaultKind, float]:
    """``"429:0.1,500:0.05"`` → ``{"429": 0.1, "500": 0.05}``; ValueError in one line."""
    rates: dict[FaultKind, float] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        kind, sep, rate = item.partition(":")
        if not sep or kind not in FAULT_KINDS:
            raise ValueError(f"{item!r} is not KIND:RATE with KIND one of {', '.join(FAULT_KINDS)}")
        try:
            rates[cast(FaultKind, kind)] = float(rate)
        except ValueError:
            raise ValueError(f"{item!r}: the rate {rate!r} is not a number") from None
    return rates


def parse_sequence(spec: str) -> list[FaultKind | None]:
    """``"ok,429,hang"`` → ``[None, "429", "hang"]`` (``ok``: no fault); ValueError in one line."""
    kinds: list[FaultKind | None] = []
    for item in filter(None, (part.strip() for part in spec.split(","))):
        if item != "ok" and item not in FAULT_KINDS:
            raise ValueError(f"{item!r} is not ok or one of {', '.join(FAULT_KINDS)}")
        kinds.append(None if item == "ok" else cast(FaultKind, item))
    return kinds


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m evolve.models.fake_server",
        description="A fake OpenAI-compatible model server on 127.0.0.1, for dry runs: "
        "scripted replies, a set latency and injected faults. Stop it with Ctrl-C.",
    )
    parser.add_argument("--port", type=int, default=8099, help="port (0: any free one)")
    parser.add_argument("--latency", type=float, default=0.0, help="seconds per request")
    parser.add_argument(
        "--faults",
        default="",
        help=f"fault rates KIND:RATE,... with KIND one of {', '.join(FAULT_KINDS)}",
    )
    parser.add_argument(
        "--sequence", default="", help="faults of the first requests, e.g. ok,429,hang"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the fault draws")
    parser.add_argument("--retry-after", type=float, default=1.0, help="a 429's Retry-After")
    parser.add_argument(
        "--hang", type=float, default=None, help="seconds a hang lasts (default: forever)"
    )
    parser.add_argument("--model", action="append", help="model id listed at /v1/models")
    return parser


def _plan(args: argparse.Namespace) -> FaultPlan:
    params = {"retry_after": args.retry_after}
    faults = [
        k and Fault(kind=k, seconds=args.hang, **params) for k in parse_sequence(args.sequence)
    ]
    rates, seed = parse_rates(args.faults), args.seed
    return FaultPlan(sequence=tuple(faults), rates=rates, seed=seed, hang_s=args.hang, **params)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        server = FakeModelServer(
            latency_s=args.latency,
            faults=_plan(args),
            port=args.port,
            models=args.model or ("fake",),
        )
    except (ValueError, OSError) as exc:  # a pydantic ValidationError is a ValueError
        why = "; ".join(e["msg"] for e in exc.errors()) if isinstance(exc, ValidationError) else exc
        print(f"error: {' '.join(str(why).split())}", file=sys.stderr)
        return 2
    # Ctrl-C or a plain kill stops it, also when started as a background job (SIGINT ignored)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    with server:
        try:  # Ctrl-C may come as soon as the address is printed
            print(f"fake model server at {server.base_url} (stats: GET /stats; Ctrl-C stops)")
            sys.stdout.flush()
            threading.Event().wait()
        except KeyboardInterrupt:
            pass
    print(json.dumps(asdict(server.stats())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
