"""The MCP server (:mod:`evolve.server.mcptools`) through the ``mcp`` package's real client: in
process, over streamable HTTP on a loopback port (a real uvicorn) and over stdio (a real
process): schemas from the typed signatures, add then context, the tenant from the token (a
wrong or missing token and a scope not granted read and write nothing), retries that do not
double, sessions bounded. Offline: the hashing embedder, no task model."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pytest
import uvicorn
from fastapi import FastAPI
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

import evolve
from evolve.server.auth import TOKEN_ENV, TokenFile, add_token
from evolve.server.http import make_app
from evolve.server.mcptools import PATH, build_server, mount, token_grant
from evolve.server.records import MessageIn
from evolve.server.service import MemoryService

ROOT = Path(__file__).resolve().parents[1]
PROGRAM = ROOT / "seeds" / "simple.py"
BOB_SECRET = "Bob hides the key under the blue Zanzibar flowerpot"
INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "t", "version": "0"}}}  # fmt: skip
JSON_SSE = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


class Env:
    """A served memory: its service, token file and one token per grant."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.memory = evolve.open_memory(PROGRAM, root / "store", embedder="hashing",
                                         notice=lambda line: None)  # fmt: skip
        self.service = MemoryService(self.memory, PROGRAM)
        self.token_path = root / "tokens.json"
        self.token = {name: add_token(self.token_path, name, scopes) for name, scopes in
                      [("ana", ["ana"]), ("bob", ["bob"]), ("two", ["ana", "carl"])]}  # fmt: skip
        self.tokens = TokenFile(self.token_path)
        asyncio.run(self.service.add("bob", [MessageIn(content=BOB_SECRET)], session_id="b1"))

    def sessions(self, scope: str) -> list[str]:
        return [s.session_id for s in asyncio.run(self.service.history(scope))]

    def close(self) -> None:
        self.service.close()


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    served = Env(tmp_path_factory.mktemp("mcp"))
    yield served
    served.close()


def said(result: Any) -> str:
    return " ".join(getattr(c, "text", "") for c in result.content)


# -- in process -----------------------------------------------------------------------------


def test_tool_schemas_come_from_the_typed_signatures(env: Env):
    async def go() -> dict[str, Any]:
        async with Client(
            build_server(env.service, token_grant(env.tokens, env.token["ana"]))
        ) as c:
            return {t.name: t for t in (await c.list_tools()).tools}

    tools = asyncio.run(go())
    assert set(tools) == {"add_session", "get_context", "answer", "get_history", "forget"}
    add = tools["add_session"].input_schema
    assert add["required"] == ["messages"]
    messages = add["properties"]["messages"]
    assert (messages["type"], messages["minItems"], messages["maxItems"]) == ("array", 1, 1000)
    message = add["$defs"]["MessageIn"]
    assert message["required"] == ["content"] and message["additionalProperties"] is False
    assert message["properties"]["content"]["type"] == "string"
    assert {"type": "string", "maxLength": 256} in add["properties"]["session_id"]["anyOf"]
    scope = next(a for a in add["properties"]["scope"]["anyOf"] if a.get("type") == "string")
    assert scope["pattern"].startswith("^[A-Za-z0-9]")
    ctx = tools["get_context"]
    assert ctx.input_schema["properties"]["question"] == {"maxLength": 10000, "title": "Question",
                                                          "type": "string"}  # fmt: skip
    assert ctx.input_schema["required"] == ["question"]
    assert ctx.output_schema["properties"]["context"]["type"] == "string"
    assert tools["add_session"].output_schema["required"] == ["session_id", "added"]
    assert "ctx" not in json.dumps([t.input_schema for t in tools.values()])  # the SDK's context
    assert tools["get_context"].annotations.read_only_hint is True


def test_add_then_context_in_process_and_a_retry_does_not_double(env: Env):
    async def go() -> tuple[Any, ...]:
        async with Client(
            build_server(env.service, token_grant(env.tokens, env.token["ana"]))
        ) as c:
            msg = [{"role": "user", "content": "I moved to Lyon in May to work at the bakery"}]
            first = await c.call_tool("add_session", {"messages": msg, "session_id": "a1"})
            again = await c.call_tool("add_session", {"messages": msg, "session_id": "a1"})
            found = await c.call_tool("get_context", {"question": "Where does Ana live?"})
            history = await c.call_tool("get_history", {})
            return first, again, found, history

    first, again, found, history = asyncio.run(go())
    assert first.structured_content == {"session_id": "a1", "added": True}
    assert again.structured_content == {"session_id": "a1", "added": False}
    assert "Lyon" in found.structured_content["context"]
    assert BOB_SECRET not in found.structured_content["context"]
    ids = [s["session_id"] for s in history.structured_content["sessions"]]
    assert ids.count("a1") == 1 and env.sessions("ana").count("a1") == 1


def test_forget_and_answer_through_mcp(env: Env):
    async def go() -> list[Any]:
        async with Client(
            build_server(env.service, token_grant(env.tokens, env.token["two"]))
        ) as c:
            calls: list[tuple[str, dict[str, Any]]] = [
                ("add_session", {"scope": "carl", "session_id": "f1",
                                 "messages": [{"content": "Carl's locker code is 4471"}]}),
                ("get_context", {"scope": "carl", "question": "locker code?"}),
                ("forget", {"scope": "carl", "session_id": "f1"}),
                ("get_context", {"scope": "carl", "question": "locker code?"}),
                ("get_history", {"scope": "carl"}),
                ("forget", {"scope": "carl", "session_id": "f1"}),
                ("answer", {"scope": "carl", "question": "locker code?"}),
            ]  # fmt: skip
            return [await c.call_tool(name, args) for name, args in calls]

    added, seen, forgotten, unseen, history, again, answer = asyncio.run(go())
    assert added.structured_content["added"] and "4471" in seen.structured_content["context"]
    assert forgotten.structured_content == {"session_id": "f1", "forgotten": 1}
    assert "4471" not in unseen.structured_content["context"]
    assert "f1" not in json.dumps(history.structured_content)
    assert again.is_error and "404 session_id: 'f1'" in said(again)
    assert answer.is_error and "409 answer needs a task model" in said(answer)


def test_a_scope_argument_only_chooses_among_the_tokens_grants(env: Env):
    before = env.sessions("bob")

    async def go(token: str, calls: list[tuple[str, dict[str, Any]]]) -> list[Any]:
        async with Client(build_server(env.service, token_grant(env.tokens, token))) as c:
            return [await c.call_tool(name, args) for name, args in calls]

    msg = [{"content": "Ana writes into Bob's memory"}]
    ana = asyncio.run(go(env.token["ana"], [
        ("get_context", {"question": "Where is the key?", "scope": "bob"}),
        ("get_history", {"scope": "bob"}),
        ("add_session", {"messages": msg, "scope": "bob", "session_id": "evil"}),
        ("forget", {"scope": "bob"}),
    ]))  # fmt: skip
    for result in ana:
        assert result.is_error and said(result).split(": ", 1)[1].startswith("403 scope:")
        assert "Zanzibar" not in said(result)
    assert env.sessions("bob") == before  # nothing written, nothing forgotten
    two = asyncio.run(go(env.token["two"], [
        ("get_context", {"question": "Where is the key?"}),
        ("get_context", {"question": "Where is the key?", "scope": "bob"}),
        ("get_context", {"question": "Where is the key?", "scope": "carl"}),
    ]))  # fmt: skip
    assert two[0].is_error and "400 scope: this token grants several" in said(two[0])
    assert two[1].is_error and "403" in said(two[1]) and "Zanzibar" not in said(two[1])
    assert not two[2].is_error and "Zanzibar" not in two[2].structured_content["context"]
    # the owner does read it: the refusals above are the grant's, not an empty memory's
    bob = asyncio.run(go(env.token["bob"], [("get_context", {"question": "Where is the key?"})]))
    assert "Zanzibar" in bob[0].structured_content["context"]


def test_a_token_removed_from_the_file_stops_working_in_process(env: Env, tmp_path: Path):
    path = tmp_path / "tokens.json"
    token = add_token(path, "gone", ["ana"])
    tokens = TokenFile(path)

    async def go() -> list[Any]:
        async with Client(build_server(env.service, token_grant(tokens, token))) as c:
            ok = await c.call_tool("get_history", {})
            path.write_text('{"tokens": []}\n')
            os.utime(path, ns=(1, 1))  # a changed signature, whatever the clock's grain
            return [ok, await c.call_tool("get_history", {})]

    ok, refused = asyncio.run(go())
    assert not ok.is_error
    assert refused.is_error and "401" in said(refused) and "Lyon" not in said(refused)


# -- streamable HTTP on a loopback port -----------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@asynccontextmanager
async def _served(app: FastAPI) -> AsyncIterator[str]:
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           timeout_graceful_shutdown=2))  # fmt: skip
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        assert thread.is_alive()
        await asyncio.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}{PATH}"
    finally:
        server.should_exit = True
        await asyncio.to_thread(thread.join, 10)


def _app(env: Env, **kw: Any) -> FastAPI:
    """The HTTP API's app with MCP mounted, as ``evolve serve`` builds it."""
    app = make_app(env.service, env.tokens)
    mount(app, env.service, env.tokens, **kw)
    return app


def _client(url: str, token: str | None, mode: str = "legacy") -> Client:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    http = httpx2.AsyncClient(headers=headers, timeout=20)
    return Client(streamable_http_client(url, http_client=http), mode=mode)


def test_over_http_the_token_is_the_tenant(env: Env):
    before = {s: env.sessions(s) for s in ("ana", "bob")}

    async def go() -> dict[str, Any]:
        out: dict[str, Any] = {}
        async with _served(_app(env)) as url:
            for mode in ("legacy", "auto"):  # a handshake session, and per-request calls
                async with _client(url, env.token["ana"], mode) as c:
                    out[mode] = [
                        await c.call_tool("add_session", {"session_id": f"h-{mode}", "messages": [
                            {"content": f"Over {mode} HTTP Ana says she keeps bees"}]}),
                        await c.call_tool("get_context", {"question": "What does Ana keep?"}),
                        await c.call_tool("get_context", {"question": "the key?", "scope": "bob"}),
                    ]  # fmt: skip
            for token in (None, "pmt_wrong", env.token["ana"] + "x"):
                with pytest.raises(BaseExceptionGroup) as refused:
                    async with _client(url, token) as c:
                        await c.call_tool("get_context", {"question": "the key?", "scope": "bob"})
                assert refused.group_contains(MCPError, match="error response")
            async with httpx.AsyncClient() as raw:
                out["raw"] = [
                    await raw.post(url, json=INIT, headers=JSON_SSE),
                    await raw.post(url, json=INIT, headers={**JSON_SSE,
                                                            "Authorization": "Bearer pmt_no"}),
                    await raw.post(url, json=INIT, headers={**JSON_SSE,
                                                            "Authorization": "Basic pmt_no"}),
                ]  # fmt: skip
        return out

    out = asyncio.run(go())
    for mode in ("legacy", "auto"):
        added, found, other = out[mode]
        assert added.structured_content == {"session_id": f"h-{mode}", "added": True}
        assert "bees" in found.structured_content["context"]
        assert other.is_error and "403" in said(other) and "Zanzibar" not in said(other)
    for response in out["raw"]:
        assert response.status_code == 401
        assert response.json() == {"error": "missing, unknown or expired bearer token"}
    assert env.sessions("bob") == before["bob"]
    assert env.sessions("ana") == before["ana"] + ["h-legacy", "h-auto"]


def test_a_session_is_usable_only_with_the_token_that_opened_it(env: Env):
    async def go() -> tuple[int, int]:
        async with _served(_app(env)) as url, httpx.AsyncClient() as raw:
            opened = await raw.post(url, json=INIT, headers={
                **JSON_SSE, "Authorization": f"Bearer {env.token['ana']}"})  # fmt: skip
            sid = opened.headers["mcp-session-id"]
            call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                    "params": {"name": "get_history", "arguments": {}}}  # fmt: skip
            stolen = await raw.post(url, json=call, headers={
                **JSON_SSE, "Authorization": f"Bearer {env.token['bob']}", "mcp-session-id": sid,
                "mcp-protocol-version": "2025-06-18"})  # fmt: skip
            return opened.status_code, stolen.status_code

    assert asyncio.run(go()) == (200, 404)


def test_mcp_sessions_are_capped_and_idle_ones_expire(env: Env):
    async def go() -> tuple[list[int], bool, int, int]:
        headers = {**JSON_SSE, "Authorization": f"Bearer {env.token['ana']}"}
        async with _served(_app(env, max_sessions=4, idle_s=1.0)) as url:
            async with httpx.AsyncClient() as raw:  # 10 clients open a session and drop it
                opened = [(await raw.post(url, json=INIT, headers=headers)).status_code
                          for _ in range(10)]  # fmt: skip
            with pytest.raises(BaseExceptionGroup) as refused:  # a handshake client too
                async with _client(url, env.token["ana"]) as c:
                    await c.list_tools()
            full = refused.group_contains(MCPError, match="Too many open sessions")
            await asyncio.sleep(2.5)  # the dropped sessions expire
            async with httpx.AsyncClient() as raw:
                after = (await raw.post(url, json=INIT, headers=headers)).status_code
                async with _client(url, env.token["ana"]) as c:
                    served = len((await c.list_tools()).tools)
        return opened, full, after, served

    opened, full, after, served = asyncio.run(go())
    assert opened == [200] * 4 + [503] * 6
    assert full
    assert (after, served) == (200, 5)


# -- stdio ----------------------------------------------------------------------------------

_SERVE = [sys.executable, "-m", "evolve", "serve"]  # ``evolve serve`` as a process


def _stdio(env: Env, root: Path, token: str) -> StdioServerParameters:
    args = [str(PROGRAM), "--store", str(root / "stdio-store"), "--tokens", str(env.token_path),
            "--embedder", "hashing", "--stdio"]  # fmt: skip
    return StdioServerParameters(command=_SERVE[0], args=[*_SERVE[1:], *args],
                                 env={**os.environ, TOKEN_ENV: token}, cwd=str(ROOT))  # fmt: skip


def test_stdio_takes_the_tenant_from_the_environment_token(env: Env, tmp_path: Path):
    async def go() -> tuple[Any, ...]:
        async with Client(_stdio(env, tmp_path, env.token["two"])) as c:
            added = await c.call_tool("add_session", {"scope": "carl", "messages": [
                {"content": "Carl plays the oboe on Sundays"}]})  # fmt: skip
            found = await c.call_tool("get_context", {"question": "oboe?", "scope": "carl"})
            other = await c.call_tool("get_context", {"question": "oboe?", "scope": "bob"})
        return added, found, other

    added, found, other = asyncio.run(go())
    assert added.structured_content["added"] is True
    assert "oboe" in found.structured_content["context"]
    assert other.is_error and "403" in said(other)

    refused = subprocess.run(
        [_SERVE[0], *_stdio(env, tmp_path / "refused", "pmt_wrong").args], cwd=ROOT, timeout=60,
        env={**os.environ, TOKEN_ENV: "pmt_wrong"}, input=json.dumps(INIT) + "\n",
        capture_output=True, text=True,
    )  # fmt: skip
    assert refused.returncode == 2 and refused.stdout == ""
    assert "missing, unknown or expired bearer token" in refused.stderr
    assert "Traceback" not in refused.stderr and not (tmp_path / "refused").exists()
