"""The HTTP API (:mod:`evolve.server.http`) with a real client (httpx) against a real uvicorn on
a loopback ephemeral port: verbs, tenancy (401/403 and nothing read or written), durable
acknowledgement and retries, body and field limits, per-scope queues (429 + Retry-After),
fairness between scopes, deadlines, draining, health, stats, the program's record, OpenAPI.

:func:`serving` (also used by ``test_server_hostile``) serves ``seeds/simple.py`` offline with
the hashing embedder, or with a scripted task model, over a fresh store."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

import evolve
from evolve.evaluation.setup import EvalSetup
from evolve.models.llm import ModelConfig
from evolve.models.testing import task_script
from evolve.server.auth import digest
from evolve.server.http import make_app
from evolve.server.limits import ServerBounds, listen, uvicorn_config
from evolve.server.service import MemoryService, ServiceLimits

ROOT = Path(__file__).resolve().parents[1]
SIMPLE = ROOT / "seeds" / "simple.py"
TOKENS = {"ana": ["ana"], "bob": ["bob"], "both": ["ana", "bob"]}  # token name -> scopes
PAST = "2020-01-01T00:00:00Z"


@dataclass
class Served:
    url: str
    client: httpx.Client
    memory: Any
    service: MemoryService
    store: Path
    calls: list[tuple[str, str]] = field(default_factory=list)  # (verb, user) the runtime got

    def auth(self, name: str) -> dict[str, str]:
        return {"Authorization": f"Bearer tok-{name}"}


def write_tokens(path: Path) -> Path:
    rows = [{"name": n, "sha256": digest(f"tok-{n}"), "scopes": s, "expires": None}
            for n, s in TOKENS.items()]  # fmt: skip
    rows.append({"name": "old", "sha256": digest("tok-old"), "scopes": ["ana"], "expires": PAST})
    path.write_text(json.dumps({"tokens": rows}))
    path.chmod(0o600)
    return path


def store_bytes(store: Path) -> dict[str, bytes]:
    return {str(p.relative_to(store)): p.read_bytes() for p in sorted(store.rglob("*"))
            if p.is_file()}  # fmt: skip


def _recorded(memory: Any, calls: list[tuple[str, str]]) -> None:
    """Record every verb the runtime is asked for, with its user."""
    for verb in ("add", "context", "answer", "history", "forget"):
        real = getattr(memory, verb)

        def wrapper(*a: Any, _real: Callable[..., Any] = real, _verb: str = verb,
                    **kw: Any) -> Any:  # fmt: skip
            calls.append((_verb, kw.get("user", a[0] if _verb in ("history", "forget") else "?")))
            return _real(*a, **kw)

        setattr(memory, verb, wrapper)


@contextmanager
def serving(
    tmp_path: Path,
    *,
    limits: ServiceLimits | None = None,
    bounds: ServerBounds | None = None,
    script: Callable[..., str] | None = None,
    timeout: float = 10.0,
) -> Iterator[Served]:
    store = tmp_path / "store"
    setup = None
    if script is not None:
        setup = EvalSetup(cache_dir=str(store / "cache"), embedder="hashing",
                          task_model=ModelConfig(model="scripted"), script=script,
                          call_prefix="runtime")  # fmt: skip
    kw: dict[str, Any] = {"setup": setup} if setup else {"embedder": "hashing"}
    memory = evolve.open_memory(SIMPLE, store, notice=lambda line: None, **kw)
    service = MemoryService(memory, SIMPLE, limits=limits, isolation=lambda: "test isolation")
    from evolve.server.auth import TokenFile

    bounds = bounds or ServerBounds()
    app = make_app(service, TokenFile(write_tokens(tmp_path / "tokens.json")),
                   max_body=bounds.max_body)  # fmt: skip
    sock = listen("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn_config(app, bounds, log_level="error"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    end = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < end, "the server did not start"
        time.sleep(0.01)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    served = Served(url, httpx.Client(base_url=url, timeout=timeout), memory, service, store)
    _recorded(memory, served.calls)
    try:
        yield served
    finally:
        served.client.close()
        server.should_exit = True
        thread.join(30)
        service.close()
        sock.close()


def add(s: Served, who: str, scope: str, text: str, sid: str | None = None) -> httpx.Response:
    body: dict[str, Any] = {"messages": [{"role": "user", "content": text}]}
    if sid is not None:
        body["session_id"] = sid
    return s.client.post(f"/v1/scopes/{scope}/sessions", json=body, headers=s.auth(who))


def test_add_context_history_forget_and_a_retry_is_not_doubled(tmp_path: Path):
    with serving(tmp_path) as s:
        first = add(s, "ana", "ana", "I moved to Lyon", sid="s1")
        assert first.status_code == 200 and first.json() == {"session_id": "s1", "added": True}
        # acknowledged = the runtime's add returned: the log holds it before the answer came
        assert [x.session_id for x in s.memory.history("ana")] == ["s1"]
        again = add(s, "ana", "ana", "I moved to Lyon", sid="s1")
        assert again.json() == {"session_id": "s1", "added": False}
        fresh = add(s, "ana", "ana", "My cat is Tom").json()
        assert fresh["added"] and len(fresh["session_id"]) == 32
        hist = s.client.get("/v1/scopes/ana/sessions", headers=s.auth("ana")).json()["sessions"]
        assert [h["session_id"] for h in hist] == ["s1", fresh["session_id"]]
        assert hist[0]["messages"] == [{"id": "s1.0", "role": "user", "content": "I moved to Lyon"}]
        ctx = s.client.post("/v1/scopes/ana/context", json={"question": "where?"},
                            headers=s.auth("ana"))  # fmt: skip
        assert ctx.status_code == 200 and "Lyon" in ctx.json()["context"]
        no_model = s.client.post("/v1/scopes/ana/answer", json={"question": "where?"},
                                 headers=s.auth("ana"))  # fmt: skip
        assert no_model.status_code == 409 and "task model" in no_model.json()["error"]
        gone = s.client.delete("/v1/scopes/ana/sessions/s1", headers=s.auth("ana"))
        assert gone.status_code == 200 and gone.json() == {"session_id": "s1", "forgotten": 1}
        assert s.client.delete("/v1/scopes/ana/sessions/s1", headers=s.auth("ana")).status_code \
            == 404  # fmt: skip
        assert s.client.delete("/v1/scopes/ana", headers=s.auth("ana")).json()["forgotten"] == 1
        assert s.client.get("/v1/scopes/ana/sessions", headers=s.auth("ana")).json() == {
            "sessions": []}  # fmt: skip


REQUESTS = [  # (method, path under /v1/scopes/{scope}, body)
    ("POST", "/sessions", {"messages": [{"content": "secret"}], "session_id": "x"}),
    ("GET", "/sessions", None),
    ("POST", "/context", {"question": "anything"}),
    ("POST", "/answer", {"question": "anything"}),
    ("DELETE", "/sessions/a1", None),
    ("DELETE", "", None),
]


def test_tenancy_401_and_403_read_and_write_nothing(tmp_path: Path):
    with serving(tmp_path) as s:
        assert add(s, "ana", "ana", "ana lives in Lyon", sid="a1").status_code == 200
        assert add(s, "bob", "bob", "bob lives in Oslo", sid="b1").status_code == 200
        before, s.calls[:] = store_bytes(s.store), []
        refused = {  # headers -> the status every request with them gets, on ana's scope
            "missing": ({}, 401), "wrong": ({"Authorization": "Bearer tok-nobody"}, 401),
            "expired": ({"Authorization": "Bearer tok-old"}, 401),
            "other scheme": ({"Authorization": "Basic dG9rLWFuYQ=="}, 401),
            "another user's token": (s.auth("bob"), 403),
        }  # fmt: skip
        for what, (headers, status) in refused.items():
            for method, tail, body in REQUESTS:
                r = s.client.request(method, f"/v1/scopes/ana{tail}", json=body, headers=headers)
                assert r.status_code == status, (what, method, tail, r.text)
                assert list(r.json()) == ["error"], r.text
            for path in ("/v1/stats", "/v1/program"):
                if status == 401:
                    assert s.client.get(path, headers=headers).status_code == 401
        # a token of two scopes: the URL's scope, checked; a third scope is refused
        for method, tail, body in REQUESTS:
            r = s.client.request(method, f"/v1/scopes/carol{tail}", json=body,
                                 headers=s.auth("both"))  # fmt: skip
            assert r.status_code == 403, (method, tail, r.text)
        assert s.calls == [], "a refused request reached the runtime"
        assert store_bytes(s.store) == before, "a refused request changed the store"
        assert [x.session_id for x in s.memory.history("ana")] == ["a1"]
        s.calls[:] = []
        both = s.client.post("/v1/scopes/bob/context", json={"question": "where"},
                             headers=s.auth("both")).json()["context"]  # fmt: skip
        assert "Oslo" in both and "Lyon" not in both
        assert s.calls == [("context", "bob")]


def test_body_limit_and_malformed_requests_answer_4xx_naming_the_field(tmp_path: Path):
    with serving(tmp_path) as s:
        before = store_bytes(s.store)
        url, h = "/v1/scopes/ana/sessions", s.auth("ana")
        big = {"messages": [{"content": "x" * 999_000}] * 5}  # each within the message limit
        r = s.client.post(url, json=big, headers=h)
        assert r.status_code == 413 and r.json()["error"].startswith("body:")
        port = int(s.url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=3) as sock:  # refused unread
            sock.sendall(
                b"POST /v1/scopes/ana/sessions HTTP/1.1\r\nHost: x\r\n"
                b"Authorization: Bearer tok-ana\r\nContent-Length: 5000000\r\n\r\n"
            )
            assert sock.recv(4096).startswith(b"HTTP/1.1 413 ")
        chunks = (b"x" * 65536 for _ in range(80))  # 5 MiB, chunked: no Content-Length
        r = s.client.post(url, content=chunks, headers={**h, "Content-Type": "application/json"})
        assert r.status_code == 413, r.text
        cases = [  # (body text, status, the error's start)
            ('{"messages": [', 400, "body: malformed JSON"),
            ("{}", 422, "messages: Field required"),
            ('{"messages": []}', 422, "messages: List should have at least 1"),
            ('{"messages": [{"content": 5}]}', 422, "messages.0.content: Input should be a valid"),
            ('{"messages": [{"content": "a", "role": ["x"]}]}', 422, "messages.0.role:"),
            ('{"messages": [{"content": "a"}], "session_id": 7}', 422, "session_id:"),
            ('{"messages": [{"content": "a"}], "scope": "bob"}', 422, "scope: Extra inputs"),
            ('{"messages": [{"content": "a"}], "date": "' + "9" * 300 + '"}', 422, "date:"),
            (json.dumps({"messages": [{"content": "a"}] * 1001}), 422, "messages: List should"),
            ('"just a string"', 422, "body:"),
        ]
        for text, status, start in cases:
            r = s.client.post(url, content=text, headers={**h, "Content-Type": "application/json"})
            assert r.status_code == status, (text[:60], r.text)
            assert r.json()["error"].startswith(start), (text[:60], r.json())
        q = s.client.post("/v1/scopes/ana/context", json={"question": "q" * 10_001}, headers=h)
        assert q.status_code == 422 and q.json()["error"].startswith("question:")
        assert s.calls == [] and store_bytes(s.store) == before


def _blocking(memory: Any, verb: str, scope: str, gate: threading.Event) -> list[str]:
    """Make ``memory.<verb>`` for ``scope`` wait for ``gate``; the list of calls that started."""
    real, started = getattr(memory, verb), []

    def held(*a: Any, **kw: Any) -> Any:
        if kw.get("user") == scope:
            started.append(scope)
            assert gate.wait(30)
        return real(*a, **kw)

    setattr(memory, verb, held)
    return started


def test_a_full_scope_queue_answers_429_with_retry_after_and_other_scopes_are_served(
    tmp_path: Path,
):
    gate = threading.Event()
    with serving(tmp_path, limits=ServiceLimits(scope_queue=1, scope_workers=1, workers=4)) as s:
        started = _blocking(s.memory, "add", "ana", gate)
        results: list[int] = []
        threads = [
            threading.Thread(
                target=lambda k=k: results.append(
                    add(s, "ana", "ana", f"held {k}", sid=f"h{k}").status_code
                )
            )
            for k in range(2)
        ]
        for t in threads:
            t.start()
            time.sleep(0.2)  # the first runs (held), the second waits in the queue
        assert started == ["ana"]
        full = add(s, "ana", "ana", "one too many", sid="h9")
        assert full.status_code == 429 and int(full.headers["Retry-After"]) >= 1
        assert "waiting" in full.json()["error"]
        t0 = time.monotonic()
        assert add(s, "bob", "bob", "bob is served", sid="b1").status_code == 200
        ctx = s.client.post("/v1/scopes/bob/context", json={"question": "x"},
                            headers=s.auth("bob"))  # fmt: skip
        assert ctx.status_code == 200 and "bob is served" in ctx.json()["context"]
        assert time.monotonic() - t0 < 5
        gate.set()
        for t in threads:
            t.join(20)
        assert results == [200, 200]
        assert [x.session_id for x in s.memory.history("ana")] == ["h0", "h1"]  # not h9
        stats = s.client.get("/v1/stats", headers=s.auth("ana")).json()
        assert stats["refused"]["busy"] == 1


def test_a_slow_answer_of_one_scope_never_blocks_another_scopes_context(tmp_path: Path):
    gate = threading.Event()

    def slow(role: str, purpose: str, messages: list[Any]) -> str:
        if purpose.endswith("/answer") and "ana-question" in str(messages):
            assert gate.wait(30)  # the task model, stuck on ana's answers
        return task_script(role, purpose, messages)

    with serving(tmp_path, limits=ServiceLimits(workers=2, scope_workers=1), script=slow) as s:
        assert add(s, "bob", "bob", "bob lives in Oslo").status_code == 200
        answers: list[httpx.Response] = []
        threads = [threading.Thread(target=lambda: answers.append(s.client.post(
            "/v1/scopes/ana/answer", json={"question": "ana-question"}, headers=s.auth("ana"),
            timeout=30))) for _ in range(3)]  # fmt: skip
        for t in threads:
            t.start()
        time.sleep(0.3)
        t0 = time.monotonic()
        for _ in range(5):
            r = s.client.post("/v1/scopes/bob/context", json={"question": "where"},
                              headers=s.auth("bob"), timeout=5)  # fmt: skip
            assert r.status_code == 200 and "Oslo" in r.json()["context"]
        assert time.monotonic() - t0 < 4
        assert answers == []  # ana's answers are still held
        gate.set()
        for t in threads:
            t.join(30)
        assert [a.status_code for a in answers] == [200] * 3
        assert answers[0].json()["answer"] == "This is a scripted answer."


def test_deadlines_answer_504(tmp_path: Path):
    gate = threading.Event()
    limits = ServiceLimits(read_deadline_s=0.5, scope_workers=1)
    with serving(tmp_path, limits=limits) as s:
        started = _blocking(s.memory, "context", "ana", gate)
        slow = [
            threading.Thread(
                target=lambda: s.client.post(
                    "/v1/scopes/ana/context", json={"question": "q"}, headers=s.auth("ana")
                )
            )
        ]
        slow[0].start()  # runs, held past its deadline
        time.sleep(0.1)
        r = s.client.post("/v1/scopes/ana/context", json={"question": "q"}, headers=s.auth("ana"))
        assert r.status_code == 504 and "did not start" in r.json()["error"]  # withdrawn
        gate.set()
        slow[0].join(10)
        assert started == ["ana"]  # the withdrawn one never ran


def test_drain_refuses_new_verbs_with_503_and_health_says_draining(tmp_path: Path):
    with serving(tmp_path) as s:
        assert add(s, "ana", "ana", "before").status_code == 200
        s.service.begin_drain()
        r = add(s, "ana", "ana", "after", sid="late")
        assert r.status_code == 503 and "shutting down" in r.json()["error"]
        assert s.client.get("/health").json()["status"] == "draining"
        assert [x.session_id for x in s.memory.history("ana")] != ["late"]


def test_health_stats_program_and_openapi_report_real_figures(tmp_path: Path):
    with serving(tmp_path) as s:
        for k in range(4):
            assert add(s, "ana", "ana", f"fact {k}").status_code == 200
        for _ in range(3):
            s.client.post("/v1/scopes/ana/context", json={"question": "q"}, headers=s.auth("ana"))
        add(s, "bob", "bob", "bob's fact")
        health = s.client.get("/health")
        assert health.status_code == 200
        h = health.json()
        assert h["status"] == "ok" and h["waiting"] == 0 and h["uptime_s"] > 0
        assert "ana" not in health.text and "fact" not in health.text  # no user data
        stats = s.client.get("/v1/stats", headers=s.auth("ana")).json()
        assert stats["latency"]["add"]["count"] == 5 and stats["latency"]["context"]["count"] == 3
        assert 0 < stats["latency"]["add"]["p50_ms"] <= stats["latency"]["add"]["p99_ms"]
        assert stats["latency"]["answer"] == {"count": 0, "p50_ms": None, "p99_ms": None}
        assert stats["live_hosts"] == s.memory.live_hosts() >= 2
        assert stats["isolation"] == "test isolation"
        assert stats["limits"]["scope_queue"] == 64
        assert "bob" not in json.dumps(stats)  # the other scopes are not named to ana
        program = s.client.get("/v1/program", headers=s.auth("ana")).json()
        assert program["sha256"] == hashlib.sha256(SIMPLE.read_bytes()).hexdigest()
        assert program["scored_as"] is None and program["running_as"]["mode"] == "offline"
        spec = s.client.get("/openapi.json").json()
        paths = spec["paths"]
        assert {"/v1/scopes/{scope}/sessions", "/v1/scopes/{scope}/context", "/v1/stats",
                "/v1/scopes/{scope}/answer", "/v1/scopes/{scope}", "/v1/program", "/health",
                "/v1/scopes/{scope}/sessions/{session_id}"} <= set(paths)  # fmt: skip
        post = paths["/v1/scopes/{scope}/sessions"]["post"]
        assert post["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith(
            "/AddIn"
        )
        assert {"AddIn", "Added", "MessageIn", "QuestionIn", "Stats", "ErrorOut"} <= set(
            spec["components"]["schemas"]
        )
        assert "429" in post["responses"] and "401" in post["responses"]


def test_program_record_reads_an_exports_header(tmp_path: Path):
    from evolve.evaluation.identity import ScoredAs

    scored = ScoredAs.here(None, "hashing")
    header = ["# PrisMem export of a memory program (contract version 1)", *scored.lines(),
              "# scores (fitness: mean):", "#   valid: fitness 0.5000",
              "# candidate c7 against seed c0 (fitness; of a possible: the ceiling):",
              "#   valid: seed 0.40, candidate 0.50 (+10.0 pp) of a possible 0.90",
              "# lineage (back to the seed):", "#   c7 [explore] <- c0: better"]  # fmt: skip
    exported = tmp_path / "best.py"
    exported.write_text("\n".join(header) + "\n\n" + SIMPLE.read_text())
    memory = evolve.open_memory(exported, tmp_path / "store", embedder="hashing",
                                notice=lambda line: None)  # fmt: skip
    service = MemoryService(memory, exported)
    try:
        record = service.program()
    finally:
        service.close()
    assert record.scored_as is not None and record.scored_as.embedder == "hashing"
    assert record.differences == []
    assert record.transfer == [header[-4][2:], header[-3][2:]]
    assert os.path.basename(record.path) == "best.py"


@pytest.mark.parametrize("header", ["Bearer", "Bearer ", "bearer tok-ana", "Token tok-ana"])
def test_authorization_header_forms(tmp_path: Path, header: str):
    from evolve.server.auth import parse_bearer

    assert parse_bearer(header) == ("tok-ana" if header == "bearer tok-ana" else None)


def test_token_add_stores_only_the_digest_and_a_loose_file_is_refused(tmp_path: Path, capsys):
    from evolve.cli.common import Parser, UsageError
    from evolve.cli.serve import add_command, cmd_serve, cmd_token
    from evolve.server.auth import TokenFile, TokenFileError
    from evolve.server.records import Forbidden, ServiceError, Unauthorized

    parser = Parser(prog="evolve")
    add_command(parser.add_subparsers(dest="command", required=True))
    path = tmp_path / "tokens.json"

    def token_add(*extra: str) -> str:
        argv = ["token", "add", str(path), *extra]
        assert cmd_token(parser.parse_args(argv)) == 0
        return capsys.readouterr().out.strip()

    ana = token_add("--name", "a", "--scope", "ana")
    two = token_add("--name", "b", "--scope", "ana", "--scope", "bob", "--expires", "1")
    assert ana not in path.read_text() and digest(ana) in path.read_text()
    assert path.stat().st_mode & 0o777 == 0o600
    tokens = TokenFile(path)
    assert tokens.resolve(ana).scope(None) == "ana"
    grant = tokens.resolve(two)
    assert grant.scope("bob") == "bob"
    with pytest.raises(Forbidden):
        grant.scope("carol")
    with pytest.raises(ServiceError, match="scope: this token grants several"):
        grant.scope(None)
    from datetime import UTC, datetime, timedelta

    with pytest.raises(Unauthorized):  # a day and more later: expired
        tokens.resolve(two, now=datetime.now(UTC) + timedelta(days=1, seconds=5))
    with pytest.raises(UsageError, match="already has a token named"):
        token_add("--name", "a", "--scope", "ana")
    with pytest.raises(UsageError, match="does not match"):
        token_add("--name", "c", "--scope", "../etc")
    path.chmod(0o620)
    with pytest.raises(TokenFileError, match="writable by group or others"):
        TokenFile(path)
    path.chmod(0o600)
    path.write_text('{"tokens": [{"name": "x", "sha256": "abc", "scopes": ["a"]}]}')
    with pytest.raises(TokenFileError, match="sha256 is 64"):
        TokenFile(path)
    with pytest.raises(UsageError, match="needs --store"):
        cmd_serve(parser.parse_args(["serve", str(SIMPLE)]))
