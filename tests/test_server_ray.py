"""``evolve serve --backend ray`` (:mod:`evolve.server.rayserve`) on a private local Ray
instance, as the evaluation backend's Ray tests run: the HTTP API through Ray Serve with a real
client (add, context, history, retries, tenancy, errors), one writer per scope — two ingress
replicas take concurrent adds for one scope and exactly one process, the one holding the
store's lock, writes them; a second owner of the store is refused — an owner killed with
SIGKILL restarted without losing an acknowledged session, and ``evolve serve --backend ray``
stopping in order on SIGTERM (its own process and Ray instance).

Ray Serve is in the ray extra (``pip install -e '.[ray]'``). Without it these tests skip and say
so; ``PRISMEM_RAY=require`` (``.ci/run``) turns that skip into a failure. One server for the
module (Ray and Serve start slowly); token authentication is off for the instance
(``RAY_AUTH_MODE=disabled``): it accepts connections from this machine only.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import Unavailable

import evolve
from evolve.runtime.api import AgentMemoryError
from evolve.server.auth import digest
from evolve.server.rayserve import NAMESPACE, RayOptions, RayServer, StoreOwner

ROOT = Path(__file__).resolve().parents[1]
SIMPLE = ROOT / "seeds" / "simple.py"
TOKENS = {"ana": ["ana"], "bob": ["bob"], "carol": ["carol"]}  # token name -> scopes
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # Ray Serve's pydantic
CONCURRENT = 32  # adds for one scope at once
START_S = 180.0  # Ray and Serve starting on a loaded two-core machine


@dataclass
class Served:
    server: RayServer
    client: httpx.Client
    store: Path

    def add(self, who: str, scope: str, text: str, sid: str | None = None) -> httpx.Response:
        body: dict[str, Any] = {"messages": [{"role": "user", "content": text}]}
        if sid is not None:
            body["session_id"] = sid
        return self.client.post(f"/v1/scopes/{scope}/sessions", json=body, headers=auth(who))


def auth(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer tok-{name}"}


def write_tokens(path: Path) -> Path:
    rows = [{"name": n, "sha256": digest(f"tok-{n}"), "scopes": s, "expires": None}
            for n, s in TOKENS.items()]  # fmt: skip
    rows.append({"name": "old", "sha256": digest("tok-old"), "scopes": ["ana"],
                 "expires": "2020-01-01T00:00:00Z"})  # fmt: skip
    path.write_text(json.dumps({"tokens": rows}))
    path.chmod(0o600)
    return path


@pytest.fixture(scope="module")
def served(unavailable: Unavailable) -> Iterator[Served]:
    try:
        import ray
        from ray import serve  # noqa: F401  (the serve extra)
    except ImportError:
        unavailable("PRISMEM_RAY", "Ray Serve is not installed: pip install -e '.[ray]'")
    tmp = Path(tempfile.mkdtemp(prefix="prismem-serve-"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    options = RayOptions(program=str(SIMPLE), store=str(tmp / "store"),
                         tokens=str(write_tokens(tmp / "tokens.json")), embedder="hashing",
                         replicas=2, port=port, drain_s=10.0)  # fmt: skip
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAY_AUTH_MODE", "disabled")
        mp.delenv("RAY_ADDRESS", raising=False)
        assert not ray.is_initialized()
        server = RayServer(options)
        try:
            with httpx.Client(base_url=server.url, timeout=60) as client:
                yield Served(server, client, tmp / "store")
        finally:
            assert server.stop()
            assert not ray.is_initialized()
            shutil.rmtree(tmp, ignore_errors=True)


def test_add_context_history_and_a_retry_is_not_doubled(served: Served) -> None:
    first = served.add("ana", "ana", "I moved to Lyon", sid="s1")
    assert first.status_code == 200 and first.json() == {"session_id": "s1", "added": True}
    again = served.add("ana", "ana", "I moved to Lyon", sid="s1")
    assert again.status_code == 200 and again.json() == {"session_id": "s1", "added": False}
    fresh = served.add("ana", "ana", "My cat is Tom").json()
    assert fresh["added"] and fresh["session_id"] not in ("", "s1")
    context = served.client.post("/v1/scopes/ana/context", json={"question": "Where?"},
                                 headers=auth("ana"))  # fmt: skip
    assert context.status_code == 200 and "Lyon" in context.json()["context"]
    history = served.client.get("/v1/scopes/ana/sessions", headers=auth("ana")).json()
    assert [s["session_id"] for s in history["sessions"]] == ["s1", fresh["session_id"]]
    assert history["sessions"][0]["messages"][0]["content"] == "I moved to Lyon"


def test_the_tenant_comes_from_the_token(served: Served) -> None:
    assert served.add("bob", "bob", "Bob's secret: the blue door").status_code == 200
    before = served.client.get("/v1/scopes/bob/sessions", headers=auth("bob")).json()
    body = {"messages": [{"role": "user", "content": "planted"}]}
    refused = [
        served.client.post("/v1/scopes/bob/sessions", json=body),  # no token
        served.client.post("/v1/scopes/bob/sessions", json=body, headers=auth("nobody")),
        served.client.post("/v1/scopes/ana/sessions", json=body, headers=auth("old")),  # expired
        served.client.post("/v1/scopes/bob/sessions", json=body, headers=auth("ana")),
        served.client.post(
            "/v1/scopes/bob/context", json={"question": "secret?"}, headers=auth("ana")
        ),  # fmt: skip
        served.client.get("/v1/scopes/bob/sessions", headers=auth("ana")),
        served.client.post(
            "/v1/scopes/ana/sessions", json={**body, "scope": "bob"}, headers=auth("ana")
        ),  # fmt: skip
    ]
    assert [r.status_code for r in refused] == [401, 401, 401, 403, 403, 403, 422]
    assert all(list(r.json()) == ["error"] and "blue door" not in r.text for r in refused)
    after = served.client.get("/v1/scopes/bob/sessions", headers=auth("bob")).json()
    assert after == before  # nothing written to bob's memory
    mine = served.client.post("/v1/scopes/ana/context", json={"question": "secret?"},
                              headers=auth("ana"))  # fmt: skip
    assert mine.status_code == 200 and "blue door" not in mine.text


def test_errors_health_and_program_cross_the_owner(served: Served) -> None:
    answer = served.client.post("/v1/scopes/ana/answer", json={"question": "Where?"},
                                headers=auth("ana"))  # fmt: skip
    assert answer.status_code == 409 and "task model" in answer.json()["error"]  # the owner's
    wrong = served.client.post("/v1/scopes/ana/context", json={"question": 3},
                               headers=auth("ana"))  # fmt: skip
    assert wrong.status_code == 422 and wrong.json()["error"].startswith("question")
    huge = served.client.post("/v1/scopes/ana/sessions", headers=auth("ana"),
                              json={"messages": [{"content": "x" * (5 * 2**20)}]})  # fmt: skip
    assert huge.status_code == 413 and huge.json()["error"].startswith("body")
    health = served.client.get("/health")
    assert health.status_code == 200 and health.json()["status"] == "ok"
    program = served.client.get("/v1/program", headers=auth("ana")).json()
    assert program["sha256"] == hashlib.sha256(SIMPLE.read_bytes()).hexdigest()
    stats = served.client.get("/v1/stats", headers=auth("ana")).json()
    assert stats["latency"]["add"]["count"] >= 1 and set(stats["waiting_by_scope"]) <= {"ana"}
    assert "/v1/scopes/{scope}/sessions" in served.client.get("/openapi.json").json()["paths"]


def test_two_replicas_never_both_write_one_scope(served: Served) -> None:
    async def adds() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=served.server.url, timeout=60) as client:
            return await asyncio.gather(*[
                client.post("/v1/scopes/carol/sessions", headers=auth("carol"),
                            json={"messages": [{"role": "user", "content": f"fact {k}"}],
                                  "session_id": f"c{k}"})
                for k in range(CONCURRENT)
            ])  # fmt: skip

    answers = asyncio.run(adds())
    assert [r.status_code for r in answers] == [200] * CONCURRENT
    assert all(r.json()["added"] for r in answers)
    record = served.server.ownership()["carol"]
    holder = (served.store / "lock").read_text().strip()  # the PID holding the store's flock
    assert list(record.writers) == [record.writers.most_common(1)[0][0]]  # one process wrote
    assert [w.rsplit(":", 1)[1] for w in record.writers] == [holder]
    assert sum(record.writers.values()) == CONCURRENT
    assert len(record.origins) == 2 and sum(record.origins.values()) == CONCURRENT  # both
    history = served.client.get("/v1/scopes/carol/sessions", headers=auth("carol")).json()
    assert sorted(s["session_id"] for s in history["sessions"]) == sorted(
        f"c{k}" for k in range(CONCURRENT)
    )  # each acknowledged session once


def test_a_second_owner_of_the_store_is_refused(served: Served) -> None:
    import ray

    with pytest.raises(AgentMemoryError, match="already served"):
        RayServer(served.server.options)  # the owner's name is taken in the cluster
    other = ray.remote(StoreOwner).options(name="prismem-test-intruder", namespace=NAMESPACE,
                                           num_cpus=0).remote(served.server.options)  # fmt: skip
    try:
        info = ray.get(other.ready.remote())
        assert info.problem is not None and "open in another process" in info.problem
        reply = ray.get(other.call.remote("add", "test", ("carol", []), {}))
        with pytest.raises(Exception, match="could not open the store"):
            reply.result()
    finally:
        ray.kill(other)


def test_an_owner_killed_is_restarted_and_loses_nothing_acknowledged(served: Served) -> None:
    acknowledged = [served.add("bob", "bob", f"before {k}", sid=f"k{k}") for k in range(3)]
    assert [r.status_code for r in acknowledged] == [200] * 3
    old = int((served.store / "lock").read_text())
    os.kill(old, signal.SIGKILL)
    end = time.monotonic() + 60
    while True:  # 503 while Ray restarts the owner, then served again
        after = served.add("bob", "bob", "after", sid="k-after")
        if after.status_code == 200:
            break
        assert after.status_code == 503 and "retry with session_id k-after" in after.text
        assert time.monotonic() < end, after.text
        time.sleep(0.5)
    assert int((served.store / "lock").read_text()) != old  # a new process owns the store
    sessions = served.client.get("/v1/scopes/bob/sessions", headers=auth("bob")).json()
    ids = [s["session_id"] for s in sessions["sessions"]]
    assert [i for i in ids if i.startswith("k")] == ["k0", "k1", "k2", "k-after"]


def test_the_command_stops_in_order_on_sigterm(tmp_path: Path, served: Served) -> None:
    """``evolve serve --backend ray`` in its own process and Ray instance: SIGTERM drains,
    stops, exits 0, and the store is free and holds what was acknowledged."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store = tmp_path / "store"
    tokens = write_tokens(tmp_path / "tokens.json")
    command = [sys.executable, "-m", "evolve", "serve", str(SIMPLE), "--store", str(store),
               "--tokens", str(tokens), "--backend", "ray", "--port", str(port),
               "--embedder", "hashing", "--replicas", "1", "--drain", "10"]  # fmt: skip
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    env.pop("RAY_ADDRESS", None)
    log = tmp_path / "serve.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen(command, stdout=sink, env=env,
                                stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    try:
        end = time.monotonic() + START_S
        while "serving " not in log.read_text(errors="replace"):
            assert proc.poll() is None, log.read_text(errors="replace")[-2000:]
            assert time.monotonic() < end, "evolve serve did not start"
            time.sleep(0.5)
        url = f"http://127.0.0.1:{port}"
        body = {"messages": [{"role": "user", "content": "kept"}], "session_id": "t1"}
        added = httpx.post(f"{url}/v1/scopes/ana/sessions", json=body, headers=auth("ana"),
                           timeout=60)  # fmt: skip
        assert added.status_code == 200 and added.json()["added"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(START_S) == 0, log.read_text(errors="replace")[-2000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    with evolve.open_memory(SIMPLE, store, embedder="hashing", notice=lambda _: None) as memory:
        assert [s.session_id for s in memory.history("ana")] == ["t1"]  # the lock is free
