"""Executor: step reuse by component fingerprint, scripted-LLM accounting, failure handling."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from conftest import first_sessions

from evolve.datasets.beam import load_conversation
from evolve.datasets.types import Conversation, TaskSet
from evolve.evaluation.executor import EvalError, run_eval
from evolve.evaluation.setup import EvalSetup
from evolve.models.llm import ModelConfig
from evolve.models.testing import task_script

SEEDS = Path(__file__).resolve().parents[1] / "seeds"
DENSE = (SEEDS / "dense.py").read_text()


@pytest.fixture(scope="module")
def tasks(data_dir: Path) -> TaskSet:
    """Two sessions of BEAM-100K conversation 1 and the questions whose evidence lies there."""
    tasks = first_sessions(data_dir, 2, 6)
    assert len(tasks.questions) >= 3
    return tasks


def variant(tmp_path: Path, name: str, old: str, new: str, base: str = DENSE) -> Path:
    assert old in base, old
    path = tmp_path / f"{name}.py"
    path.write_text(base.replace(old, new))
    return path


def run(path: Path, tasks: TaskSet, cache: Path, **config: object) -> dict:
    cfg = EvalSetup(cache_dir=str(cache), task_model=None, embedder="hashing")
    if config:
        cfg = EvalSetup(cache_dir=str(cache), embedder="hashing", **config)  # type: ignore[arg-type]
    report = run_eval(path, tasks, cfg, jobs=1)
    return {**report.as_json(), "traces": report.traces}


def computed(report: dict, stage: str) -> int:
    return report["stages"][stage]["computed"]


def test_retrieval_only_revision_reuses_extraction_and_index(tasks: TaskSet, tmp_path: Path):
    cache = tmp_path / "cache"
    n_sessions, n_questions = len(tasks.conversations[0].sessions), len(tasks.questions)
    base = run(variant(tmp_path, "base", "TOP_K = 200", "TOP_K = 200"), tasks, cache)
    assert computed(base, "extract") == n_sessions
    assert computed(base, "index") == 1
    assert computed(base, "retrieve") == n_questions
    assert base["meta"]["mode"] == "offline: retrieval-only"

    child = run(variant(tmp_path, "child", "TOP_K = 200", "TOP_K = 3"), tasks, cache)
    assert computed(child, "extract") == 0
    assert computed(child, "index") == 0
    assert child["stages"]["index"]["reused"] == 1
    assert child["stages"]["plan"]["reused"] == n_questions
    assert computed(child, "retrieve") == n_questions
    # Reused memory behaves exactly like memory built from scratch.
    fresh = run(variant(tmp_path, "child", "TOP_K = 200", "TOP_K = 3"), tasks, tmp_path / "c2")
    assert [t.retrieved for t in child["traces"]] == [t.retrieved for t in fresh["traces"]]


def test_extraction_instruction_change_recomputes_extraction_onward(tasks: TaskSet, tmp_path: Path):
    cache = tmp_path / "cache"
    run(variant(tmp_path, "base", "TOP_K = 200", "TOP_K = 200"), tasks, cache)
    child = run(variant(tmp_path, "child", "Read the conversation", "Study the conversation"),
                tasks, cache)  # fmt: skip
    assert computed(child, "extract") == len(tasks.conversations[0].sessions)
    assert computed(child, "index") == 1
    assert computed(child, "retrieve") == len(tasks.questions)
    # Query planning reads no memory: its key is unchanged, so plans are reused.
    assert child["stages"]["plan"]["reused"] == len(tasks.questions)


def test_helper_used_by_index_invalidates_indexing_only(tasks: TaskSet, tmp_path: Path):
    cache = tmp_path / "cache"
    run(variant(tmp_path, "base", "TOP_K = 200", "TOP_K = 200"), tasks, cache)
    old = 'return f"[{unit.date}] {unit.content}" if unit.date else unit.content'
    child = run(variant(tmp_path, "child", old, old.replace("] ", "] -- ")), tasks, cache)
    assert computed(child, "extract") == 0
    assert child["stages"]["extract"]["reused"] == len(tasks.conversations[0].sessions)
    assert computed(child, "index") == 1
    assert all(" -- " in t.retrieved for t in child["traces"] if t.retrieved)


def test_scripted_llm_retrieval_revision_costs_no_extraction_calls(tasks: TaskSet, tmp_path: Path):
    cache = tmp_path / "cache"
    online = {"task_model": ModelConfig(model="scripted"), "script": task_script}
    base = run(variant(tmp_path, "base", "TOP_K = 200", "TOP_K = 200"), tasks, cache, **online)
    # a question that failed (a step past its time limit on a loaded machine) makes no plan or
    # answer call: say so, rather than fail the counts below without a reason
    assert [t.error for t in base["traces"]] == [None] * len(tasks.questions)
    purposes = base["usage"]["task"]["purposes"]
    assert purposes["eval/extract"] >= len(tasks.conversations[0].sessions)
    assert purposes["eval/plan"] == purposes["eval/answer"] == len(tasks.questions)
    assert base["meta"]["mode"] == "online"
    assert all(t.answer == "This is a scripted answer." for t in base["traces"])

    child = run(variant(tmp_path, "child", "TOP_K = 200", "TOP_K = 3"), tasks, cache, **online)
    purposes = child["usage"]["task"]["purposes"]
    assert "eval/extract" not in purposes and "eval/plan" not in purposes
    assert purposes["eval/answer"] == len(tasks.questions)


def test_reuse_off_recomputes_every_stage_and_task_call(tasks: TaskSet, tmp_path: Path):
    """``reuse=False`` (``evolve run --no-reuse``): the same retrieval-only child recomputes
    extraction, indexing and planning and pays for every task call again, with equal results."""
    cache = tmp_path / "cache"
    online = {"task_model": ModelConfig(model="scripted"), "script": task_script}
    base = run(variant(tmp_path, "base", "TOP_K = 200", "TOP_K = 200"), tasks, cache, **online)
    path = variant(tmp_path, "child", "TOP_K = 200", "TOP_K = 3")
    child = run(path, tasks, cache, reuse=False, **online)
    assert child["stages"]["extract"] == base["stages"]["extract"]
    for stage in ("extract", "index", "plan", "retrieve", "answer"):
        assert child["stages"][stage]["reused"] == 0
    assert child["usage"]["task"]["purposes"] == base["usage"]["task"]["purposes"]
    assert child["usage"]["task"]["calls"] == base["usage"]["task"]["calls"] > 0
    reused = run(path, tasks, cache, **online)
    assert reused["stages"]["retrieve"]["reused"] == len(tasks.questions)  # stored all the same
    assert [t.retrieved for t in child["traces"]] == [t.retrieved for t in reused["traces"]]


def test_failing_program_scores_zero_and_is_not_cached(tasks: TaskSet, tmp_path: Path):
    cache = tmp_path / "cache"
    # Fails on BEAM data only (its user messages carry "->->" markers), so it passes the sandbox.
    crash = '        if any("->->" in b for b in self.blocks):\n            1 / 0\n'
    path = variant(
        tmp_path, "bad", "        if not self.blocks:\n", crash + "        if not self.blocks:\n"
    )
    report = run(path, tasks, cache)
    assert report["meta"]["errors"] == len(tasks.questions)
    assert all(t.error.startswith("retrieve: ZeroDivisionError") for t in report["traces"])
    assert "(line " in report["traces"][0].error
    assert report["scores"]["overall"]["evidence_similarity"] == 0.0
    assert report["stages"]["retrieve"]["failed"] == len(tasks.questions)
    again = run(path, tasks, cache)
    assert again["stages"]["retrieve"]["failed"] == len(tasks.questions)  # failures not stored


def test_unpicklable_memory_is_rebuilt_not_reused(tasks: TaskSet, tmp_path: Path):
    cache = tmp_path / "cache"
    old = "        self.blocks: list[str] = []\n"
    path = variant(tmp_path, "lam", old, old + "        self.key = lambda x: x\n")
    run(path, tasks, cache)
    child = variant(tmp_path, "lam2", "TOP_K = 200", "TOP_K = 5", path.read_text())
    report = run(child, tasks, cache)
    assert computed(report, "index") == 1 and computed(report, "extract") == 0


def test_an_unstorable_memory_is_counted_with_its_reason(tasks: TaskSet, tmp_path: Path):
    cache = tmp_path / "cache"
    old = "        self.blocks: list[str] = []\n"
    path = variant(tmp_path, "lam", old, old + "        self.key = lambda x: x\n")
    child = variant(tmp_path, "lam2", "TOP_K = 200", "TOP_K = 5", path.read_text())
    for program in (path, child):  # the child builds it again: counted again, with the reason
        report = run(program, tasks, cache)
        assert report["stages"]["index"]["unstored"] == computed(report, "index") == 1
        [(conv, why)] = report["meta"]["unstored_memory"].items()
        assert conv == tasks.conversations[0].id and "lambda" in why.lower()
    stored = run(variant(tmp_path, "plain", "TOP_K = 200", "TOP_K = 199"), tasks, cache)
    assert stored["stages"]["index"]["unstored"] == 0 and stored["meta"]["unstored_memory"] == {}


def test_contract_violation_is_refused_before_evaluation(tasks: TaskSet, tmp_path: Path):
    path = variant(
        tmp_path, "noinstr", "PLANNING_INSTRUCTION = (", 'PLANNING_INSTRUCTION = "" and ('
    )
    with pytest.raises(EvalError, match="PLANNING_INSTRUCTION must be a non-empty string"):
        run(path, tasks, tmp_path / "cache")
    broken = tmp_path / "syntax.py"
    broken.write_text("def f(:\n")
    with pytest.raises(EvalError, match="line 1: syntax error"):
        run(broken, tasks, tmp_path / "cache")


# Run-time containment: these programs pass the sandbox (they misbehave only on BEAM data,
# whose user messages carry "->->" markers) and must still be contained during evaluation.
ON_BEAM = '        if any("->->" in b for b in self.blocks):\n'


def test_hang_in_retrieve_is_killed_and_fails_the_conversation(tasks: TaskSet, tmp_path: Path):
    code = ON_BEAM + "            while True:\n                pass\n"
    path = variant(
        tmp_path, "hang", "        if not self.blocks:\n", code + "        if not self.blocks:\n"
    )
    cfg = EvalSetup(cache_dir=str(tmp_path / "c"), task_model=None, embedder="hashing",
                       call_timeout=3.0)  # fmt: skip
    start = time.monotonic()
    report = run_eval(path, tasks, cfg, jobs=1)
    assert time.monotonic() - start < 60
    errors = [t.error for t in report.traces]
    assert all("timed out" in e for e in errors), errors
    # The first question times out in retrieve; the host is gone, so later ones fail at plan.
    failed = report.steps["retrieve"]["failed"] + report.steps["plan"]["failed"]
    assert report.steps["retrieve"]["failed"] >= 1 and failed == len(tasks.questions)


def test_memory_bomb_in_index_is_contained(tasks: TaskSet, tmp_path: Path):
    old = "        vectors = self.backend.embed([u.content for u in units])\n"
    bomb = (
        '        if any("->->" in u.content for u in units):\n            x = bytearray(10**11)\n'
    )
    path = variant(tmp_path, "bomb", old, bomb + old)
    report = run(path, tasks, tmp_path / "c")
    assert all("MemoryError" in t.error for t in report["traces"]), report["traces"][0]
    assert report["stages"]["index"]["failed"] >= 1


def test_results_do_not_depend_on_the_number_of_jobs(data_dir: Path, tmp_path: Path):
    """Same scores and traces with 1 and 2 worker processes, each from a cold step cache."""
    convs, questions = [], []
    for name in ("1", "3"):
        conv, qs = load_conversation(data_dir, "100K", name)
        sessions = conv.sessions[:2]
        ids = {m.id for s in sessions for m in s.messages}
        questions += [q for q in qs if set(q.evidence_ids) <= ids][:4]
        convs.append(Conversation(conv.id, sessions, conv.meta))
    small = TaskSet("beam", "small", tuple(convs), tuple(questions))
    reports = []
    for jobs in (1, 2):
        cfg = EvalSetup(cache_dir=str(tmp_path / f"cache{jobs}"), task_model=None,
                           embedder="hashing")  # fmt: skip
        reports.append(run_eval(SEEDS / "hybrid.py", small, cfg, jobs=jobs))
    one, two = reports
    assert one.scores == two.scores and one.steps == two.steps
    keep = ("id", "retrieved", "scores", "error")
    assert [{k: getattr(t, k) for k in keep} for t in one.traces] == [
        {k: getattr(t, k) for k in keep} for t in two.traces
    ]


def test_answers_are_scored_by_the_benchmark_judge(tasks: TaskSet, tmp_path: Path):
    """Online with a scripted task model and a scripted judge: every rubric item is judged in
    both variants, results carry the judge's identity, the headline is BEAM's."""
    from evolve.models.llm import Models
    from evolve.models.testing import ScriptedLLM

    judge = ScriptedLLM(lambda role, purpose, messages: (
        "NO" if purpose == "beam/align" else '{"score": 0.5, "reason": "partly"}'),
        models=Models(judge=ModelConfig(model="scripted-judge")))  # fmt: skip
    cfg = EvalSetup(cache_dir=str(tmp_path / "c"), task_model=ModelConfig(model="scripted"),
                       embedder="hashing", script=task_script)  # fmt: skip
    report = run_eval(SEEDS / "dense.py", tasks, cfg, jobs=1, judge=judge)
    assert report.meta.judge.judge == "scripted-judge"
    assert report.meta.models["judge"] == "scripted-judge"
    assert "beam_official" in report.meta.metrics
    rubric = [q for q in tasks.questions if q.ability != "event_ordering"]
    assert judge.usage_summary()["judge"]["calls"] >= 2 * sum(len(q.rubric) for q in rubric)
    assert report.usage["judge"]["calls"] == judge.usage_summary()["judge"]["calls"]
    again = run_eval(SEEDS / "dense.py", tasks, cfg, jobs=1, judge=judge)  # counts its own calls
    assert again.usage["judge"]["calls"] == report.usage["judge"]["calls"]
    assert again.usage["judge"]["cached_calls"] == 0  # the scripted judge has no request cache
    for trace in report.traces:
        q = next(q for q in tasks.questions if q.id == trace.id)
        if q.ability != "event_ordering" and q.rubric:
            assert trace.scores["beam_official"] == 0.0  # int(0.5)
            assert trace.scores["beam_described"] == 0.5
    assert report.scores.headline is not None
    assert report.scores.headline["described"]["overall"] is not None
    offline = run_eval(SEEDS / "dense.py", tasks, EvalSetup(
        cache_dir=str(tmp_path / "c"), task_model=None, embedder="hashing"), jobs=1)  # fmt: skip
    assert "beam_official" not in offline.meta.metrics
    assert "headline" not in offline.as_json()["scores"]
    assert offline.meta.judge.judge is None


def test_backend_time_does_not_count_against_the_program(tasks: TaskSet):
    """A busy embedder (the optimizer's side) must not time the program out; a program that
    itself hangs still is killed at its deadline."""
    from dataclasses import asdict

    from evolve.evaluation.backend import BackendService
    from evolve.models.testing import HashingEmbedder
    from sandbox.isolate import Host, HostFailure, Limits

    class SlowEmbedder(HashingEmbedder):
        def embed(self, texts: Any) -> Any:
            time.sleep(1.2)  # a loaded machine
            return super().embed(texts)

    conv = tasks.conversations[0]
    first = conv.sessions[0]
    units = [{"content": f"{m.role}: {m.content}"} for m in first.messages]
    add = {"segment": asdict(first), "units": units}
    serve = BackendService(SlowEmbedder(), None, "t", 1)
    with Host(Limits(cpu_seconds=60, call_seconds=30.0), serve=serve) as host:
        host.call("load", {"source": DENSE, "path": "dense.py"})
        host.call("open", {"dim": 384, "max_complete_calls": 1})
        start = time.monotonic()
        host.call("add", add, timeout=1.0)  # one session: 1.2 s of embedding
        assert time.monotonic() - start > 1.0
    hang = DENSE.replace(
        "    def retrieve(self, query):\n",
        "    def retrieve(self, query):\n        while True:\n            pass\n",
    )
    with Host(Limits(cpu_seconds=60, call_seconds=30.0), serve=serve) as host:
        host.call("load", {"source": hang, "path": "hang.py"})
        host.call("open", {"dim": 384, "max_complete_calls": 1})
        host.call("add", add, timeout=10.0)
        with pytest.raises(HostFailure, match="timed out"):
            host.call("retrieve", {"query": {"text": "x"}}, timeout=1.0)


def test_a_hook_returning_an_ill_typed_unit_fails_extraction(tasks: TaskSet, tmp_path: Path):
    """Records handed to the host are not checked again there, but what a hook returns is
    (the hook spoils units only where real data differs from the sandbox's: an apostrophe)."""
    hook = (
        "\n\ndef postprocess_units(units, segment):\n"
        "    for u in units:\n"
        '        if "\'" in u.content:\n            u.date = 7\n'
        "    return units\n"
    )
    path = tmp_path / "hook.py"
    path.write_text(DENSE + hook)
    report = run(path, tasks, tmp_path / "c")
    assert report["meta"]["errors"] == len(tasks.questions)
    assert all("MemoryUnit: field 'date'" in t.error for t in report["traces"])
    assert report["stages"]["extract"]["failed"] >= 1
