"""LLMClient through ScriptedLLM: accounting, request cache, JSON repair, retries, secrets."""

from __future__ import annotations

import json
import logging
import pickle
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from tenacity import wait_none

from evolve.models.llm import (
    LOUD_RETRY,
    Completion,
    LLMClient,
    LLMError,
    ModelConfig,
    Models,
)
from evolve.models.testing import ScriptedLLM
from evolve.models.transport import parse_json_reply

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


def positive_n(data: Any) -> int:
    if not isinstance(data, dict) or not isinstance(data.get("n"), int) or data["n"] <= 0:
        raise ValueError(f"expected {{'n': positive int}}, got {data!r}")
    return int(data["n"])


def rows(path: Path, sql: str) -> list[tuple[Any, ...]]:
    with sqlite3.connect(path) as conn:
        return conn.execute(sql).fetchall()


def test_construction_is_lazy_and_roles_checked() -> None:
    client = LLMClient(Models(task=ModelConfig(model="openai/x", api_base="http://h:1/v1")))
    assert client.available("task") and not client.available("judge")
    with pytest.raises(LLMError, match="no model configured"):
        client.complete("judge", "s", "hi")
    with pytest.raises(ValueError, match="unknown role"):
        client.available("oracle")
    with pytest.raises(ValueError):
        ModelConfig(model="m", api_key="sk-nope")  # type: ignore[call-arg]


def test_accounting_per_role_and_purpose(tmp_path: Path) -> None:
    log = tmp_path / "llm.sqlite"
    llm = ScriptedLLM(["one two", "three", "four five six"], log_path=log, usd_per_token=0.5)
    a = llm.complete("task", "extract", "a b c")
    llm.complete("task", "answer", [{"role": "user", "content": "d e"}])
    llm.complete("judge", "grade", "f")
    assert (a.text, a.prompt_tokens, a.completion_tokens, a.cost_usd) == ("one two", 3, 2, 2.5)
    assert not a.cached and a.model == "scripted"
    summary = llm.usage_summary()
    assert summary["task"] == {
        "calls": 2,
        "prompt_tokens": 5,
        "completion_tokens": 3,
        "cost_usd": 4.0,
        "cached_calls": 0,
        "errors": 0,
        **dict.fromkeys(("retries", "rate_limited", "timeouts", "repairs"), 0),
    }
    assert summary["judge"]["calls"] == 1 and summary["judge"]["completion_tokens"] == 3
    logged = rows(log, "SELECT role, stage, prompt_tokens, completion_tokens, cached FROM calls")
    assert logged == [
        ("task", "extract", 3, 2, 0),
        ("task", "answer", 2, 1, 0),
        ("judge", "grade", 1, 3, 0),
    ]

    records = llm.drain_records()
    assert [r.purpose for r in records] == ["extract", "answer", "grade"]
    assert llm.usage_summary() == {} and llm.drain_records() == []
    parent = ScriptedLLM([])
    parent.merge_records(pickle.loads(pickle.dumps(records)))  # as shipped from a worker
    assert parent.usage_summary()["task"]["calls"] == 2


def test_request_cache_hit_costs_no_transport_call(tmp_path: Path) -> None:
    db = tmp_path / "llm.sqlite"  # log and cache may share one file
    first = ScriptedLLM(["cached answer"], log_path=db, cache_path=db, usd_per_token=1.0)
    assert first.complete("task", "s", "same prompt").text == "cached answer"
    second = ScriptedLLM([], log_path=db, cache_path=db)  # another process, same cache
    hit = second.complete("task", "s", "same prompt")
    assert hit.text == "cached answer" and hit.cached and hit.cost_usd == 0.0
    assert second.transport_calls == []
    assert second.usage_summary()["task"]["cached_calls"] == 1
    assert rows(db, "SELECT cached, cost_usd FROM calls") == [(0, 4.0), (1, 0.0)]
    with pytest.raises(LLMError, match="exhausted"):  # a different request is not a hit
        second.complete("task", "s", "same prompt", max_tokens=7)


def test_malformed_json_is_repaired(tmp_path: Path) -> None:
    llm = ScriptedLLM(["{n: oops", 'Sure!\n```json\n{"n": 4}\n```'], cache_path=tmp_path / "c.db")
    assert llm.complete_json("annotator", "label", "give n", SCHEMA, positive_n) == 4
    assert len(llm.transport_calls) == 2
    repair = llm.transport_calls[1][2]
    assert [m["role"] for m in repair] == ["user", "assistant", "user"]
    assert repair[1]["content"] == "{n: oops" and "could not be used" in repair[2]["content"]
    assert llm.usage_summary()["annotator"]["calls"] == 2


def test_a_reply_that_is_not_the_json_asked_for_is_not_cached(tmp_path: Path) -> None:
    """Prose where JSON was asked for is not kept in the request cache as a success: the same
    request, replayed (another process on the same cache), asks the model again and gets
    JSON; the repaired reply, a success, is cached (the prose was replayed before)."""
    cache = tmp_path / "c.db"
    first = ScriptedLLM(["I would rather answer in words.", '{"n": 4}'], cache_path=cache)
    assert first.complete_json("task", "extract", "give n", SCHEMA, positive_n) == 4
    again = ScriptedLLM(['{"n": 5}'], cache_path=cache)
    assert again.complete_json("task", "extract", "give n", SCHEMA, positive_n) == 5
    assert len(again.transport_calls) == 1  # the prose was not served from the cache
    third = ScriptedLLM([], cache_path=cache)  # the successful reply is served
    assert third.complete_json("task", "extract", "give n", SCHEMA, positive_n) == 5


def test_validation_failing_three_times_raises() -> None:
    llm = ScriptedLLM(lambda role, purpose, messages: '{"n": -1}')
    with pytest.raises(LLMError, match="3 attempts.*positive int"):
        llm.complete_json("judge", "grade", "give n", SCHEMA, positive_n)
    assert len(llm.transport_calls) == 3


def test_transient_errors_are_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    import litellm

    monkeypatch.setattr(LLMClient, "retry_wait", wait_none())
    llm = ScriptedLLM(["ok"])
    real = ScriptedLLM._transport
    failures = [litellm.RateLimitError("slow down", "openai", "scripted")] * 2

    def flaky(self: ScriptedLLM, *args: Any, **kwargs: Any) -> Completion:
        if failures:
            raise failures.pop()
        return real(self, *args, **kwargs)

    monkeypatch.setattr(ScriptedLLM, "_transport", flaky)
    assert llm.complete("task", "s", "hi").text == "ok"
    assert llm.usage_summary()["task"] == {
        "calls": 1,
        "prompt_tokens": 1,
        "completion_tokens": 1,
        "cost_usd": 0.0,
        "cached_calls": 0,
        "errors": 0,
        "retries": 2,
        "rate_limited": 2,
        "timeouts": 0,
        "repairs": 0,
    }


def test_retries_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    import litellm

    monkeypatch.setattr(LLMClient, "retry_wait", wait_none())
    attempts = []

    def down(self: ScriptedLLM, *args: Any, **kwargs: Any) -> Completion:
        attempts.append(1)
        raise litellm.ServiceUnavailableError("503", "openai", "scripted")

    monkeypatch.setattr(ScriptedLLM, "_transport", down)
    with pytest.raises(LLMError, match="ServiceUnavailableError"):
        ScriptedLLM([]).complete("task", "s", "hi")
    assert len(attempts) == LLMClient.retry_attempts


def test_errors_are_not_cached_and_keys_never_stored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret_env, secret_extra = "sk-env-SECRET-0123456789", "sk-extra-SECRET-9876543210"
    monkeypatch.setenv("OPENAI_API_KEY", secret_env)
    db = tmp_path / "llm.sqlite"
    models = Models(task=ModelConfig(model="scripted", extra={"api_key": secret_extra}))
    replies = iter(["boom", "fine"])

    def script(role: str, purpose: str, messages: list[dict[str, Any]]) -> str:
        reply = next(replies)
        if reply == "boom":
            raise RuntimeError(f"auth failed for {secret_env} / {secret_extra}\nsecond line")
        return reply

    llm = ScriptedLLM(script, models, log_path=db, cache_path=db)
    with pytest.raises(LLMError) as info:
        llm.complete("task", "s", "hi")
    message = str(info.value)
    assert "\n" not in message and "***" in message
    assert secret_env not in message and secret_extra not in message
    assert rows(db, "SELECT COUNT(*) FROM responses") == [(0,)]
    assert llm.complete("task", "s", "hi").text == "fine"  # the error was not cached
    assert len(llm.transport_calls) == 2
    assert llm.usage_summary()["task"]["errors"] == 1
    for path in tmp_path.iterdir():  # database, WAL and shm files
        raw = path.read_bytes()
        assert secret_env.encode() not in raw and secret_extra.encode() not in raw


def test_parse_json_reply() -> None:
    assert parse_json_reply('{"a": 1}') == {"a": 1}
    assert parse_json_reply("Here you go:\n```json\n[1, 2]\n```\nThanks") == [1, 2]
    assert parse_json_reply('I think [note] the answer is {"a": [1]} ok') == {"a": [1]}
    with pytest.raises(ValueError, match="no JSON"):
        parse_json_reply("no json here")


def test_scripted_llm_does_not_import_litellm() -> None:
    code = (
        "import sys; from evolve.models.testing import ScriptedLLM; "
        "ScriptedLLM(['x']).complete('coder', 's', 'hi'); "
        "assert 'litellm' not in sys.modules and 'torch' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_cache_key_covers_the_server(tmp_path: Path) -> None:
    """The same ``openai/<name>`` served by another server is another model: no cached reply of
    the first server is returned for it; without an api_base, keys are as they were."""
    cache = tmp_path / "cache.sqlite"

    def client(base: str | None, reply: str) -> ScriptedLLM:
        task = ModelConfig(model="openai/qwen", api_base=base)
        return ScriptedLLM([reply], Models(task=task), cache_path=cache)

    assert client("http://a:8000/v1", "from a").complete("task", "s", "hi").text == "from a"
    other = client("http://b:8000/v1", "from b")
    assert other.complete("task", "s", "hi").text == "from b" and other.transport_calls
    again = client("http://a:8000/v1", "unused")
    assert again.complete("task", "s", "hi").text == "from a" and not again.transport_calls


def test_cache_key_covers_schema(tmp_path: Path) -> None:
    llm = ScriptedLLM(["a", "b"], cache_path=tmp_path / "c.db")
    llm.complete("task", "s", "p")
    assert llm.complete("task", "s", "p", json_schema=SCHEMA).text == "b"
    assert json.loads(json.dumps(llm.usage_summary()))["task"]["cached_calls"] == 0


@pytest.fixture()
def stub_server() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A local OpenAI-compatible endpoint (like llama.cpp's) that records request bodies."""
    bodies: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            bodies.append(body)
            reply = {
                "id": "c1",
                "object": "chat.completion",
                "created": 0,
                "model": body["model"],
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": '{"n": 2}'},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14},
            }
            data = json.dumps(reply).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1", bodies
    server.shutdown()
    server.server_close()


def test_real_transport_against_local_server(
    stub_server: tuple[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    api_base, bodies = stub_server
    config = ModelConfig(model="openai/local", api_base=api_base, extra={"api_key": "sk-local-key"})
    llm = LLMClient(Models(task=config), log_path=tmp_path / "l.db", cache_path=tmp_path / "l.db")
    assert llm.complete_json("task", "extract", "give n", SCHEMA, positive_n) == 2
    assert bodies[0]["response_format"] == {"type": "json_object", "schema": SCHEMA}
    assert bodies[0]["max_tokens"] == 1024 and bodies[0]["temperature"] == 0.0
    again = llm.complete("task", "extract", "give n", json_schema=SCHEMA)
    assert again.cached and len(bodies) == 1
    assert (again.prompt_tokens, again.completion_tokens, again.model) == (11, 3, "openai/local")


def test_a_call_warns_once_at_its_third_retry_not_at_every_one(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Retries are counted in the call log; stderr hears of a call once it keeps failing."""
    import litellm

    monkeypatch.setattr(LLMClient, "retry_wait", wait_none())
    real = ScriptedLLM._transport

    def failing(times: int) -> Any:
        failures = [litellm.ServiceUnavailableError("503", "openai", "scripted")] * times

        def flaky(self: ScriptedLLM, *args: Any, **kwargs: Any) -> Completion:
            if failures:
                raise failures.pop()
            return real(self, *args, **kwargs)

        return flaky

    for times, warnings in ((LOUD_RETRY - 1, 0), (LLMClient.retry_attempts - 1, 1)):
        caplog.clear()
        monkeypatch.setattr(ScriptedLLM, "_transport", failing(times))
        with caplog.at_level(logging.DEBUG, logger="evolve.models.llm"):
            assert ScriptedLLM(["ok"]).complete("task", "eval/answer", "hi").text == "ok"
        loud = [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(loud) == warnings and len(caplog.records) == times
        assert all("task/eval/answer scripted: attempt 3 failed" in r.getMessage() for r in loud)
