"""The fake OpenAI-compatible model server: faults, latency, in-flight count, clean stop, and an
LLMClient going through it on the real litellm transport (loopback only; bounded loops)."""

from __future__ import annotations

import http.client
import json
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from pydantic import ValidationError
from tenacity import wait_none

from evolve.models.fake_server import (
    FAULT_KINDS,
    FakeModelServer,
    Fault,
    FaultPlan,
    fake_script,
    main,
    parse_rates,
    parse_sequence,
    request_purpose,
)
from evolve.models.llm import LLMClient, ModelConfig, Models
from evolve.models.transport import parse_json_reply

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
JSON_FORMAT = {"type": "json_object", "schema": SCHEMA}
BODY = {"model": "fake", "messages": [{"role": "user", "content": "give me n"}]}


def n_is_two(role: str, purpose: str, messages: list[dict[str, Any]]) -> str:
    return '{"n": 2}'


def post(
    server: FakeModelServer, body: dict[str, Any] = BODY, timeout: float = 5.0
) -> http.client.HTTPResponse:
    """One chat-completion request; the caller reads the response."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=timeout)
    conn.request("POST", "/v1/chat/completions", json.dumps(body))
    return conn.getresponse()


def get(server: FakeModelServer, path: str) -> Any:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    conn.request("GET", path)
    return json.loads(conn.getresponse().read())


def until(condition: Callable[[], bool], seconds: float = 5.0) -> bool:
    """Poll ``condition`` for at most ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


def one_fault(kind: str, **params: Any) -> FaultPlan:
    return FaultPlan(sequence=(Fault(kind=kind, **params),))


def test_429_carries_retry_after() -> None:
    with FakeModelServer(n_is_two, faults=one_fault("429", retry_after=3)) as server:
        response = post(server)
        assert response.status == 429 and response.getheader("Retry-After") == "3"
        assert json.loads(response.read())["error"]["type"] == "rate_limit_error"
        assert post(server).status == 200  # the plan's sequence is spent: the next one answers
        assert server.stats().faults == {**dict.fromkeys(FAULT_KINDS, 0), "429": 1}


def test_500() -> None:
    with FakeModelServer(n_is_two, faults=one_fault("500")) as server:
        assert post(server).status == 500
        assert server.stats().faults["500"] == 1


def test_truncated_body_stops_mid_json() -> None:
    with FakeModelServer(n_is_two, faults=one_fault("truncate")) as server:
        response = post(server)
        assert response.status == 200
        with pytest.raises(http.client.IncompleteRead) as caught:
            response.read()
        with pytest.raises(ValueError):
            json.loads(caught.value.partial)
        assert server.stats().faults["truncate"] == 1


def test_garbage_is_plain_text() -> None:
    with FakeModelServer(n_is_two, faults=one_fault("garbage")) as server:
        response = post(server)
        assert response.status == 200 and response.getheader("Content-Type") == "text/plain"
        with pytest.raises(ValueError):
            json.loads(response.read())


def test_prose_where_json_was_asked_only() -> None:
    plan = FaultPlan(sequence=(Fault(kind="prose"), Fault(kind="prose")))
    with FakeModelServer(n_is_two, faults=plan) as server:
        reply = json.loads(post(server, {**BODY, "response_format": JSON_FORMAT}).read())
        with pytest.raises(ValueError):
            parse_json_reply(reply["choices"][0]["message"]["content"])
        plain = json.loads(post(server).read())  # no JSON asked: answered, no fault counted
        assert plain["choices"][0]["message"]["content"] == '{"n": 2}'
        assert server.stats().faults["prose"] == 1


def test_hang_with_a_time_answers_after_it() -> None:
    with FakeModelServer(n_is_two, faults=one_fault("hang", seconds=0.4)) as server:
        began = time.monotonic()
        reply = json.loads(post(server).read())
        assert 0.4 <= time.monotonic() - began < 2.0
        assert reply["choices"][0]["message"]["content"] == '{"n": 2}'


def test_endless_hang_ends_when_the_client_leaves() -> None:
    with FakeModelServer(n_is_two, faults=one_fault("hang")) as server:
        with pytest.raises(TimeoutError):
            post(server, timeout=0.3).read()
        assert until(lambda: server.stats().in_flight == 0)
        stats = server.stats()
        assert (stats.faults["hang"], stats.disconnects, stats.answered) == (1, 1, 0)


def test_latency_is_honoured() -> None:
    with FakeModelServer(n_is_two, latency_s=0.3) as server:
        began = time.monotonic()
        assert post(server).status == 200
        assert 0.3 <= time.monotonic() - began < 1.5


def test_max_in_flight_is_exact() -> None:
    n = 8
    barrier = threading.Barrier(n, timeout=10)

    def together(role: str, purpose: str, messages: list[dict[str, Any]]) -> str:
        barrier.wait()  # passes only with all n requests in flight at once
        return "ok"

    statuses: list[int] = []
    with FakeModelServer(together) as server:
        clients = [
            threading.Thread(target=lambda: statuses.append(post(server, timeout=15).status))
            for _ in range(n)
        ]
        for client in clients:
            client.start()
        for client in clients:
            client.join(timeout=20)
    stats = server.stats()  # after stop: every handler has finished
    assert statuses == [200] * n
    assert (stats.requests, stats.max_in_flight, stats.in_flight) == (n, n, 0)


def test_back_to_back_requests_are_one_in_flight() -> None:
    with FakeModelServer(n_is_two) as server:
        for _ in range(30):  # each sent the moment the previous reply arrived
            post(server).read()
            assert server.stats().in_flight == 0
    assert (server.stats().max_in_flight, server.stats().requests) == (1, 30)


def test_stop_ends_waits_joins_threads_and_frees_the_port() -> None:
    before = set(threading.enumerate())
    server = FakeModelServer(n_is_two, faults=one_fault("hang")).start()
    port = server.port
    errors: list[BaseException] = []

    def wait_for_reply() -> None:
        try:
            post(server, timeout=30).read()
        except OSError as exc:  # the server closed the connection without a reply
            errors.append(exc)

    hung = threading.Thread(target=wait_for_reply)
    hung.start()
    assert until(lambda: server.stats().in_flight == 1)
    began = time.monotonic()
    server.stop()
    assert time.monotonic() - began < 2.0
    assert set(threading.enumerate()) - before <= {hung}  # every server thread joined
    hung.join(timeout=5)
    assert [type(e) for e in errors] == [http.client.RemoteDisconnected]
    server.stop()  # idempotent
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5)
    FakeModelServer(port=port).stop()  # the port is free for a new server


def test_stop_lets_a_reply_being_written_finish() -> None:
    before = set(threading.enumerate())

    def slow(role: str, purpose: str, messages: list[dict[str, Any]]) -> str:
        time.sleep(0.8)
        return "late but whole"

    server = FakeModelServer(slow).start()
    replies: list[bytes] = []
    waiting = threading.Thread(target=lambda: replies.append(post(server).read()))
    waiting.start()
    assert until(lambda: server.stats().requests == 1)
    server.stop()
    assert set(threading.enumerate()) - before <= {waiting}  # the handler was joined
    waiting.join(timeout=5)
    assert b"late but whole" in replies[0]


def test_models_and_stats_routes() -> None:
    with FakeModelServer(n_is_two, models=("fake", "other")) as server:
        post(server).read()
        assert [m["id"] for m in get(server, "/v1/models")["data"]] == ["fake", "other"]
        stats = get(server, "/stats")
        assert (stats["requests"], stats["answered"], stats["max_in_flight"]) == (1, 1, 1)


def test_usage_counts_words_and_list_scripts_run_out() -> None:
    with FakeModelServer(["three word reply"]) as server:
        reply = json.loads(post(server).read())
        assert reply["usage"] == {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}
        exhausted = post(server)
        assert exhausted.status == 400 and b"exhausted" in exhausted.read()
        assert server.stats().bad_requests == 1


@pytest.mark.parametrize(
    "body",
    [{"model": "fake"}, [1], {"messages": ["hi"]}, {**BODY, "response_format": "json"}, "x"],
)
def test_malformed_request_is_refused_or_answered(body: Any) -> None:
    with FakeModelServer(n_is_two) as server:
        status = post(server, body).status
    assert status in (200, 400)  # never a crashed handler (which sends no reply)
    assert server.stats().bad_requests == (status == 400)


def test_seeded_rates_are_reproducible_and_near_their_rate() -> None:
    plan = FaultPlan(rates={"500": 0.3, "429": 0.1}, seed=7, sequence=(None, Fault(kind="hang")))
    draws = [plan.fault_for(n) for n in range(2000)]
    assert draws == [FaultPlan(**plan.model_dump()).fault_for(n) for n in range(2000)]
    assert draws[0] is None and draws[1] == Fault(kind="hang")
    kinds = [d.kind if d else None for d in draws[2:]]
    assert abs(kinds.count("500") / len(kinds) - 0.3) < 0.04
    assert abs(kinds.count("429") / len(kinds) - 0.1) < 0.03
    with pytest.raises(ValidationError):
        FaultPlan(rates={"500": 0.7, "429": 0.4})


def test_request_purpose_and_default_script() -> None:
    units = {"type": "json_object", "schema": {"properties": {"units": {}}}}
    judge = {"type": "json_schema", "json_schema": {"schema": {"properties": {"score": {}}}}}
    assert request_purpose({"response_format": units}) == ("task", "fake/extract")
    assert request_purpose({"response_format": judge}) == ("judge", "fake/judge")
    assert request_purpose({"response_format": JSON_FORMAT}) == ("task", "fake/plan")
    assert request_purpose({}) == ("task", "fake/answer")
    assert json.loads(fake_script("judge", "fake/judge", []))["score"] == 1
    prompt = [{"role": "user", "content": "schema...\n\nQuestion: Where is it?"}]
    repair = [*prompt, {"role": "assistant", "content": "?"}, {"role": "user", "content": "again"}]
    assert json.loads(fake_script("task", "fake/plan", repair)) == {"text": "Where is it?"}


def test_cli_flags_are_parsed_and_bad_ones_are_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert parse_rates("429:0.1, 500:0.05") == {"429": 0.1, "500": 0.05}
    assert parse_sequence("ok,429,hang") == [None, "429", "hang"]
    for argv in (["--faults", "429:2"], ["--faults", "teapot:0.1"], ["--latency", "-1"]):
        assert main(["--port", "0", *argv]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM])
def test_cli_serves_until_interrupted(stop: signal.Signals) -> None:
    """Ctrl-C or a plain ``kill`` stops it cleanly, also when started with SIGINT ignored (as a
    shell's background job is)."""
    command = ["-m", "evolve.models.fake_server", "--port", "0", "--sequence", "500"]
    ignore_sigint = lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)  # noqa: E731
    proc = subprocess.Popen(
        [sys.executable, *command], stdout=subprocess.PIPE, text=True, preexec_fn=ignore_sigint
    )
    try:
        assert proc.stdout is not None
        base = proc.stdout.readline().split()[4]
        port = int(base.rsplit(":", 1)[1].split("/")[0])
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.request("POST", "/v1/chat/completions", json.dumps(BODY))
        assert conn.getresponse().status == 500
        proc.send_signal(stop)
        out, _ = proc.communicate(timeout=10)
    finally:
        proc.kill()
    assert proc.returncode == 0
    assert json.loads(out)["faults"]["500"] == 1


def client(server: FakeModelServer, timeout: float = 5.0) -> LLMClient:
    config = ModelConfig(model="openai/fake", api_base=server.base_url, timeout=timeout)
    return LLMClient(Models(task=config))


def positive_n(data: Any) -> int:
    if not isinstance(data, dict) or not isinstance(data.get("n"), int):
        raise ValueError("expected an object with an integer n")
    return int(data["n"])


def test_llm_client_gets_a_reply_through_litellm() -> None:
    with FakeModelServer(n_is_two) as server:
        llm = client(server)
        assert llm.complete_json("task", "extract", "give me n", SCHEMA, positive_n) == 2
        reply = llm.complete("task", "answer", "give me n please")
        assert (reply.prompt_tokens, reply.completion_tokens) == (4, 2)
        assert server.stats().requests == 2


@pytest.mark.parametrize("kind", ["429", "500"])
def test_llm_client_retries_through_a_fault(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(LLMClient, "retry_wait", wait_none())
    plan = FaultPlan(sequence=(Fault(kind=kind, retry_after=0), Fault(kind=kind, retry_after=0)))
    with FakeModelServer(n_is_two, faults=plan) as server:
        llm = client(server)
        assert llm.complete_json("task", "extract", "give me n", SCHEMA, positive_n) == 2
        stats = server.stats()
    assert (stats.requests, stats.faults[kind], stats.answered) == (3, 2, 1)
    assert llm.usage_summary()["task"]["calls"] == 1


def test_llm_client_abandons_a_hung_reply_at_its_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(LLMClient, "retry_wait", wait_none())
    with FakeModelServer(n_is_two, faults=one_fault("hang")) as server:
        began = time.monotonic()
        assert client(server, timeout=0.5).complete("task", "answer", "n?").text == '{"n": 2}'
        assert 0.5 <= time.monotonic() - began < 5.0
        assert until(lambda: server.stats().disconnects == 1)
        assert server.stats().requests == 2
