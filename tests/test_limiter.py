"""The run's shared LLM limit and the transport's fault handling, against the fake server: one
limit across processes, a SIGKILLed holder leaks no slot, AIMD, joint Retry-After back-off, the
retry budget, abandoned hangs, and the fault counts in the call log, the usage totals and
``evolve status``."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from email.utils import formatdate
from pathlib import Path
from typing import Any

import pytest
from tenacity import wait_none

from evolve.evolution.budget import read_spend
from evolve.models import attempts
from evolve.models.clients import llm_client, role_client
from evolve.models.fake_server import FakeModelServer, Fault, FaultPlan
from evolve.models.limiter import FORGET_S, Limiter, retry_after_seconds, shared_limiter
from evolve.models.llm import LLMClient, ModelConfig, Models
from evolve.models.testing import ScriptedLLM
from evolve.models.usage import fault_text

CHILD = textwrap.dedent(
    """
    import http.client, json, sys, threading, time
    from pathlib import Path
    from evolve.models.limiter import Limiter
    from evolve.models.llm import Completion, LLMClient, ModelConfig, Models

    port, root, limit, calls = int(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), 3

    class HTTPClient(LLMClient):  # a plain HTTP transport: no litellm import in the child
        def _transport(self, role, stage, config, messages, *, json_schema, max_tokens):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            body = {"model": "fake", "messages": messages}
            conn.request("POST", "/v1/chat/completions", json.dumps(body))
            text = json.loads(conn.getresponse().read())["choices"][0]["message"]["content"]
            return Completion(text, 0, 0, None, 0.0, False, config.model)

    llm = HTTPClient(Models(task=ModelConfig(model="fake")), limiter=Limiter(root, limit),
                     log_path=root / "calls.sqlite")
    print("ready", flush=True)
    while not (root / "go").exists():
        time.sleep(0.01)

    def work(i):
        for j in range(calls):
            llm.complete("task", "t", f"call {i} {j}")

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2 * limit)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(len(llm.records), flush=True)
    """
)


def children(count: int, *args: Any) -> list[subprocess.Popen[str]]:
    """``count`` processes running CHILD with ``args``, each started and ready."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, *map(str, args)], stdout=subprocess.PIPE, text=True
        )  # fmt: skip
        for _ in range(count)
    ]
    for proc in procs:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return procs


def test_the_limit_holds_across_two_processes(tmp_path: Path) -> None:
    limit = 2
    with FakeModelServer(lambda *_: "ok", latency_s=0.15) as server:
        procs = children(2, server.port, tmp_path, limit)
        (tmp_path / "go").touch()
        made = [int(p.communicate(timeout=60)[0].strip()) for p in procs]
        stats = server.stats()
    assert made == [2 * limit * 3] * 2 and stats.answered == 4 * limit * 3
    assert stats.max_in_flight == limit  # each process alone tried 2 * limit at once
    with sqlite3.connect(tmp_path / "calls.sqlite") as conn:  # every thread's call was logged
        assert conn.execute("SELECT COUNT(*) FROM calls").fetchone() == (stats.answered,)


HOLDER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from evolve.models.limiter import Limiter
    with Limiter(Path(sys.argv[1]), 1).slot():
        print("held", flush=True)
        time.sleep(60)
    """
)


def test_a_killed_holder_leaks_no_slot(tmp_path: Path) -> None:
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path)],
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    limiter = Limiter(tmp_path, 1)
    got = threading.Event()

    def take() -> None:
        with limiter.slot():
            got.set()

    waiter = threading.Thread(target=take, daemon=True)
    waiter.start()
    assert not got.wait(0.3)  # the other process holds the only slot
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert got.wait(5)


def test_aimd_window_halves_once_per_burst_and_grows_back(tmp_path: Path) -> None:
    limiter = Limiter(tmp_path, 8)
    assert limiter.state().window == 8
    before = time.time()
    limiter.rate_limited(0.0, started=before)
    limiter.rate_limited(0.0, started=before)  # the same burst: started before the decrease
    assert limiter.state().window == 4
    limiter.rate_limited(0.0, started=time.time())
    assert limiter.state().window == 2
    for _ in range(3):
        limiter.rate_limited(0.0, started=time.time())
    assert limiter.state().window == 1  # never below 1
    for _ in range(200):
        limiter.succeeded()
    assert limiter.state().window == 8  # never above the limit
    assert Limiter(tmp_path, 3).state().window == 3  # a smaller limit on the same folder


def test_retry_after_seconds_or_http_date() -> None:
    assert retry_after_seconds("3") == 3.0 and retry_after_seconds("-2") == 0.0
    now = time.time()
    assert retry_after_seconds(formatdate(now + 30, usegmt=True), now=now) == pytest.approx(30, 1)
    assert retry_after_seconds("soon") is None and retry_after_seconds(None) is None


@pytest.fixture(autouse=True)
def litellm_loaded() -> None:
    """litellm imported before any clock starts (its first import takes seconds)."""
    import litellm

    assert litellm.completion is not None


def fake_client(server: FakeModelServer, **kwargs: Any) -> LLMClient:
    return LLMClient(Models(task=ModelConfig(model="openai/fake", api_base=server.base_url)),
                     **kwargs)  # fmt: skip


def test_a_429_holds_every_client_of_the_run_back_for_its_retry_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(LLMClient, "retry_wait", wait_none())  # only Retry-After may slow it
    plan = FaultPlan(sequence=(Fault(kind="429", retry_after=1),))
    with FakeModelServer(lambda *_: "ok", faults=plan) as server:
        first = fake_client(server, limiter=Limiter(tmp_path, 4), log_path=tmp_path / "c.db")
        other = fake_client(server, limiter=Limiter(tmp_path, 4))  # as in another process
        replies: list[float] = []
        thread = threading.Thread(
            target=lambda: replies.append(first.complete("task", "a", "x").latency_s)
        )
        thread.start()
        shared = Limiter(tmp_path, 4)
        deadline = time.monotonic() + 10  # until the 429 has reached the first client
        while shared.state().not_before == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        began = time.monotonic()
        assert other.complete("task", "b", "y").text == "ok"  # never got a 429 itself
        waited = time.monotonic() - began
        thread.join()
    assert replies[0] >= 1.0 and waited >= 0.8
    # halved by the 429 (4 -> 2), then each of the two successes added 1 / window
    assert shared.state().window == pytest.approx(2 + 1 / 2 + 1 / 2.5)
    assert first.records[0].rate_limited == 1 and first.records[0].retries == 1


def test_without_a_limiter_a_429_still_waits_its_retry_after(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(LLMClient, "retry_wait", wait_none())
    plan = FaultPlan(sequence=(Fault(kind="429", retry_after=1),))
    with FakeModelServer(lambda *_: "ok", faults=plan) as server:
        reply = fake_client(server).complete("task", "a", "x")
    assert reply.text == "ok" and reply.latency_s >= 1.0


def test_rate_limits_do_not_spend_the_budget_of_real_failures(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(LLMClient, "retry_wait", wait_none())
    burst = (*[Fault(kind="429", retry_after=0)] * 8, *[Fault(kind="500")] * 4)
    with FakeModelServer(lambda *_: "ok", faults=FaultPlan(sequence=burst)) as server:
        llm = fake_client(server)
        assert llm.complete("task", "a", "x").text == "ok"  # 8 429s and 4 500s: not lost
        record = llm.records[0]
    assert (record.retries, record.rate_limited, record.timeouts) == (12, 8, 0)


def test_a_hung_reply_is_abandoned_at_its_timeout_and_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(LLMClient, "retry_wait", wait_none())
    limiter = Limiter(tmp_path, 1)
    with FakeModelServer(
        lambda *_: "ok", faults=FaultPlan(sequence=(Fault(kind="hang"),))
    ) as server:
        llm = fake_client(server, limiter=limiter, timeout=0.5)
        reply = llm.complete("task", "a", "x")
        assert reply.text == "ok" and 0.5 <= reply.latency_s < 5
        assert llm.complete("task", "b", "y").text == "ok"  # the only slot was given back
    assert (llm.records[0].retries, llm.records[0].timeouts) == (1, 1)


def test_a_reply_that_never_completes_holds_no_caller_nor_slot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A transport stuck past its timeout (a reply trickling in) is abandoned by the watchdog."""
    monkeypatch.setattr(LLMClient, "retry_wait", wait_none())
    monkeypatch.setattr(attempts, "WATCHDOG_GRACE_S", 0.5)
    stuck = threading.Event()

    def script(role: str, purpose: str, messages: list[dict[str, Any]]) -> str:
        if not stuck.is_set():
            stuck.set()
            time.sleep(8)  # no timeout of the HTTP library would fire here
        return "late but fine"

    limiter = Limiter(tmp_path, 1)
    llm = ScriptedLLM(script, limiter=limiter, timeout=0.2)
    began = time.monotonic()
    assert llm.complete("task", "a", "x").text == "late but fine"
    assert time.monotonic() - began < 4
    with limiter.slot():  # free again
        pass
    assert llm.records[0].timeouts == 1


def test_fault_counts_reach_the_log_the_usage_totals_and_status(tmp_path: Path) -> None:
    import litellm

    faults = [litellm.InternalServerError("boom", "openai", "x"),
              litellm.RateLimitError("slow", "openai", "x")]  # fmt: skip
    replies = iter(["{n: oops", '{"n": 3}'])

    class Flaky(ScriptedLLM):
        def _transport(self, *args: Any, **kwargs: Any) -> Any:
            if faults:
                raise faults.pop()
            return super()._transport(*args, **kwargs)

    Flaky.retry_wait = wait_none()
    llm = Flaky(lambda *_: next(replies), log_path=tmp_path / "calls.sqlite")
    schema = {"type": "object"}
    assert llm.complete_json("coder", "propose", "n?", schema, lambda d: d["n"]) == 3
    with sqlite3.connect(tmp_path / "calls.sqlite") as conn:
        rows = conn.execute("SELECT retries, rate_limited, timeouts, repair FROM calls").fetchall()
    assert rows == [(2, 1, 0, 0), (0, 0, 0, 1)]
    usage = llm.usage_summary()["coder"]
    assert (usage["retries"], usage["rate_limited"], usage["repairs"]) == (2, 1, 1)
    spend = read_spend(tmp_path).by_purpose["coder/propose"].as_json()
    assert fault_text(spend) == "2 retries (1 rate-limited), 1 JSON repair"


OLD_CALLS = """CREATE TABLE calls (
    id INTEGER PRIMARY KEY AUTOINCREMENT, ts REAL NOT NULL, role TEXT NOT NULL,
    stage TEXT NOT NULL, model TEXT NOT NULL, prompt_tokens INTEGER NOT NULL,
    completion_tokens INTEGER NOT NULL, cost_usd REAL, latency_s REAL NOT NULL,
    cached INTEGER NOT NULL, request_hash TEXT NOT NULL, error TEXT);
INSERT INTO calls VALUES (1, 0, 'task', 'eval/answer', 'm', 3, 2, NULL, 0.1, 0, 'h', NULL);"""


def test_an_older_call_log_stays_readable_and_gains_the_counts(tmp_path: Path) -> None:
    log = tmp_path / "calls.sqlite"
    with sqlite3.connect(log) as conn:
        conn.executescript(OLD_CALLS)
    old = read_spend(tmp_path).total
    assert (old.calls, old.tokens, old.retries) == (1, 5, 0)
    ScriptedLLM(["ok"], log_path=log).complete("task", "eval/answer", "again")
    assert read_spend(tmp_path).total.calls == 2


def test_the_transport_limits_reach_every_client_of_a_run(tmp_path: Path) -> None:
    from evolve.config import RunConfig
    from evolve.evaluation.setup import make_llm
    from evolve.evolution.wiring import eval_setup

    config = RunConfig(data_dir=str(tmp_path), seed_program="s.py", cache_dir=str(tmp_path),
                       task_model=ModelConfig(model="openai/fake"), llm_concurrency=3,
                       llm_timeout=7.5)  # fmt: skip
    worker = eval_setup(config, tmp_path / "run", "evolve")
    assert (worker.llm_concurrency, worker.llm_timeout) == (3, 7.5)
    task = make_llm(worker)
    judge = role_client("judge", ModelConfig(model="openai/fake"),
                        log_path=Path(worker.calls_log or ""), cache_path=None,
                        **config.llm_limits())  # fmt: skip
    assert task is not None and judge is not None
    assert task.limiter is not None and judge.limiter is not None
    assert task.limiter.root == judge.limiter.root  # one log, one limit for the run
    assert (task.limiter.limit, task.timeout) == (3, 7.5)


def test_clients_built_per_job_share_one_limiter_and_its_descriptors(tmp_path: Path) -> None:
    log = tmp_path / "calls.sqlite"

    def client() -> LLMClient:
        return llm_client(Models(task=ModelConfig(model="scripted")), log_path=log,
                          cache_path=None, script=lambda *_: "ok", concurrency=2)  # fmt: skip

    client().complete("task", "t", "warm up")  # the log's and the limiter's files are open
    before = len(os.listdir("/proc/self/fd"))
    for n in range(30):  # a worker builds one client per job
        client().complete("task", "t", f"job {n}")
    # no growth (other objects of the test process may close descriptors meanwhile)
    assert len(os.listdir("/proc/self/fd")) <= before
    assert client().limiter is client().limiter


def test_folders_of_runs_long_gone_are_removed_but_not_one_in_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every call log ever used gets a limiter folder in the temporary directory: making a
    limiter sweeps those untouched for a day with no slot held (486 had piled up here)."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    first = shared_limiter(tmp_path / "old-run.sqlite", 2)
    with first.slot():
        pass
    held = shared_limiter(tmp_path / "old-but-held.sqlite", 2)
    with held.slot():
        pass
    recent = shared_limiter(tmp_path / "recent.sqlite", 2)
    with recent.slot():
        pass
    long_ago = time.time() - FORGET_S - 60
    for folder in (first.root, held.root):
        for path in (*folder.iterdir(), folder):
            os.utime(path, (long_ago, long_ago))
    with held.slot():  # a run that holds a slot is never swept, however old its files
        shared_limiter(tmp_path / "new-run.sqlite", 2)
    assert not first.root.exists()
    assert held.root.is_dir() and recent.root.is_dir()


def _take_a_slot(root: Path) -> None:
    with Limiter(root, 2).slot():
        pass


def test_a_folder_that_is_not_private_is_refused_and_links_are_never_followed(
    tmp_path: Path,
) -> None:
    open_to_all = tmp_path / "open"
    open_to_all.mkdir()
    open_to_all.chmod(0o777)  # another user could have made it, or put files in it
    with pytest.raises(PermissionError, match="mode 777"):
        _take_a_slot(open_to_all / "run")
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (private / "linked").symlink_to(elsewhere)
    with pytest.raises(PermissionError, match="not a folder"):
        _take_a_slot(private / "linked")
    planted = private / "run"
    planted.mkdir(mode=0o700)
    victim = tmp_path / "victim"
    for i in range(2):
        (planted / f"slot-{i}.lock").symlink_to(victim)
    with pytest.raises(OSError):
        _take_a_slot(planted)
    assert not victim.exists()  # the link was not followed
    if os.getuid() == 0:  # a folder owned by someone else
        theirs = private / "theirs"
        theirs.mkdir(mode=0o700)
        os.chown(theirs, 4321, -1)
        with pytest.raises(PermissionError, match="uid 4321"):
            _take_a_slot(theirs / "run")
    _take_a_slot(private / "fine")  # a private folder of one's own works
