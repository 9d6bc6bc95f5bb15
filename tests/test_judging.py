"""Judging in a run: each evaluation's usage holds its own judge calls only (children of a
round and the splits of one child are judged at the same time through one client), the shared
clients keep no records, and a judge reply that never parses costs its question, not the run."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from evolve.config import RunConfig
from evolve.datasets.slices import write_slice
from evolve.evolution.budget import calls_path
from evolve.evolution.loop import Evolution
from evolve.evolution.manifest import build_manifest
from evolve.evolution.store import RunStore
from evolve.models.llm import ModelConfig, Models
from evolve.models.testing import ScriptedLLM, task_script
from evolve.scoring.answers import UNJUDGED

ROOT = Path(__file__).resolve().parents[1]
SEED = (ROOT / "seeds" / "simple.py").read_text()
CUT = "return text[:OUT_CHAR_BUDGET]"
LOCK = threading.Lock()
CHILDREN = [SEED.replace(CUT, "return text[:400]"), SEED.replace(CUT, "return text[:500]")]
BROKEN: list[str] = []  # the rubric item whose every judge reply is prose, not JSON
VALID_ITEMS: set[str] = set()  # the rubric items of the valid split's questions
FIRST: list[bool] = []  # whether the run's first judge call judged a valid question
OTHER_SPLIT = threading.Event()  # a call of the other split has arrived


def judge_script(role: str, purpose: str, messages: list[dict[str, Any]]) -> str:
    prompt = messages[0]["content"]  # a repair request repeats it
    valid = any(item in prompt for item in VALID_ITEMS)
    with LOCK:
        first = not FIRST
        if first:
            FIRST.append(valid)
    if first:  # the seed's train and valid are judged at once: hold this call until the other
        OTHER_SPLIT.wait(30)  # split's judging has made calls, so the two overlap
    elif valid != FIRST[0]:
        OTHER_SPLIT.set()
    if purpose == "beam/align":
        return "NO"
    if any(item in prompt for item in BROKEN):
        return "I would rather not say."
    return json.dumps({"score": 1.0, "reason": "scripted"})


def coder_script() -> Any:
    replies = iter(CHILDREN)

    def reply(role: str, purpose: str, messages: list[dict[str, Any]]) -> str:
        if purpose.endswith("/diagnose"):
            return "Keep less text."
        return f"MESSAGE: whole file\n```python\n{next(replies)}```\n"

    return reply


@pytest.fixture(scope="module")
def run(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Evolution, ScriptedLLM]:
    root = tmp_path_factory.mktemp("judging")
    data = write_slice(data_dir, root / "data", messages=4, chars=200)
    (root / "seed.py").write_text(SEED)
    config = RunConfig(
        data_dir=str(data), seed_program=str(root / "seed.py"), cache_dir=str(root / "cache"),
        jobs=1, embedder="hashing", conversations=2, task_model=ModelConfig(model="scripted"),
        judge_model=ModelConfig(model="scripted-judge"), coder_model=ModelConfig(model="scripted"),
        rounds={"cold_start": 1, "refinement": 0, "integration": 0}, repairs=0,
        children=2, cascade=False,
    )  # fmt: skip
    store = RunStore.create(root / "runs", build_manifest(config), run_id="judging")
    log = calls_path(store.root)
    judge = ScriptedLLM(
        judge_script, Models(judge=ModelConfig(model="scripted-judge")), log_path=log
    )  # fmt: skip  (no request cache: every judging calls)
    coder = ScriptedLLM(coder_script(), log_path=log)
    evolution = Evolution(store, config, coder=coder, judge=judge, task_script=task_script)
    rubric = [
        q for q in evolution.tasks("valid").questions if q.rubric and q.ability != "event_ordering"
    ]
    BROKEN[:] = [rubric[0].rubric[0]]
    VALID_ITEMS.update(item for q in evolution.tasks("valid").questions for item in q.rubric)
    evolution.run()
    return evolution, judge


def test_each_evaluation_counts_its_own_judge_calls(run: tuple[Evolution, ScriptedLLM]) -> None:
    evolution, judge = run
    metas = evolution.store.candidates()
    assert len(metas) == 3 and all(m.status == "evaluated" for m in metas)
    # the answers do not depend on the retrieval cut: every program's judging of a split makes
    # the same calls, whatever ran beside it
    for split in ("train", "valid"):
        calls = {m.id: m.usage[split]["judge"]["calls"] for m in metas}
        assert len(set(calls.values())) == 1, (split, calls)
    total = sum(m.usage[s]["judge"]["calls"] for m in metas for s in ("train", "valid"))
    assert total == len(judge.transport_calls)
    assert OTHER_SPLIT.is_set()  # the judging of two evaluations did overlap
    assert judge.records == ()  # the run's shared judge keeps nothing


def test_a_judge_reply_that_never_parses_costs_its_question(
    run: tuple[Evolution, ScriptedLLM],
) -> None:
    evolution, _ = run
    for meta in evolution.store.candidates():
        block = meta.scores["valid"]
        assert block.unjudged >= 1
        broken = [q for q in evolution.tasks("valid").questions if BROKEN[0] in q.rubric]
        assert all(block.questions[q.id] == 0.0 for q in broken)
        assert any(v == 1.0 for v in block.questions.values())  # the others were judged
    traces = evolution.store.traces(evolution.store.candidates()[0].id, "train")
    assert all(
        UNJUDGED not in (t.judged or {}) or t.scores["beam_described"] == 0.0 for t in traces
    )
