"""Selection on the task score: one fitness per mode, and everything that selects on it.

A tiny BEAM slice (one information-extraction and one abstention question per conversation), a
scripted task model whose answer follows the program's ANSWER_INSTRUCTION, and a scripted judge
that passes one answer and fails every other."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from evolve.benches.registry import bench
from evolve.config import RunConfig
from evolve.datasets.slices import write_slice
from evolve.evolution.budget import calls_path
from evolve.evolution.loop import Evolution
from evolve.evolution.manifest import build_manifest
from evolve.evolution.store import CandidateMeta, RunStore
from evolve.evolution.summary import status
from evolve.models.llm import ModelConfig, Models
from evolve.models.testing import ScriptedLLM, task_script
from evolve.scoring.fitness import Fitness

ROOT = Path(__file__).resolve().parents[1]
SIMPLE = (ROOT / "seeds" / "simple.py").read_text()
GOOD = "GOOD ANSWER"
# the seed answers badly and retrieves 30 characters; A changes only its answer instruction;
# B retrieves everything (better retrieval) and answers badly again
BAD_INSTRUCTION = '"Answer. SCRIPTED-ANSWER[no idea]"'
SEED = SIMPLE.replace("return text[:OUT_CHAR_BUDGET]", "return text[:30]").replace(
    SIMPLE[SIMPLE.index("ANSWER_INSTRUCTION = (") : SIMPLE.index("@dataclass")],
    f"ANSWER_INSTRUCTION = {BAD_INSTRUCTION}\n\n\n",
)
CHILD_A = SEED.replace(BAD_INSTRUCTION, f'"Answer. SCRIPTED-ANSWER[{GOOD}]"')
CHILD_B = SEED.replace("return text[:30]", "return text[:OUT_CHAR_BUDGET]")


def judge_script(role: str, purpose: str, messages: list[dict[str, Any]]) -> str:
    if purpose == "beam/align":
        return "NO"
    answer = messages[-1]["content"].split("ASSISTANT'S ANSWER:")[1]
    return json.dumps({"score": 1.0 if GOOD in answer else 0.0, "reason": "scripted"})


def coder_script() -> Any:
    replies = iter([CHILD_A, CHILD_B])

    def reply(role: str, purpose: str, messages: list[dict[str, Any]]) -> str:
        if purpose.endswith("/diagnose"):
            return "The answers are wrong."
        return f"MESSAGE: whole file\n```python\n{next(replies)}```\n"

    return reply


@pytest.fixture(scope="module")
def judged_run(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Evolution:
    root = tmp_path_factory.mktemp("taskscore")
    data = write_slice(data_dir, root / "data", messages=4, chars=200)
    (root / "seed.py").write_text(SEED)
    config = RunConfig(
        data_dir=str(data), seed_program=str(root / "seed.py"), cache_dir=str(root / "cache"),
        jobs=1, embedder="hashing", conversations=3, task_model=ModelConfig(model="scripted"),
        judge_model=ModelConfig(model="scripted-judge"), coder_model=ModelConfig(model="scripted"),
        rounds={"cold_start": 2, "refinement": 0, "integration": 0}, repairs=0,
        children=1, cascade=False,
    )  # fmt: skip
    store = RunStore.create(root / "runs", build_manifest(config), run_id="judged")
    log, cache = calls_path(store.root), root / "cache" / "llm-cache.sqlite"
    judge = ScriptedLLM(judge_script, Models(judge=ModelConfig(model="scripted-judge")),
                        log_path=log, cache_path=cache)  # fmt: skip
    coder = ScriptedLLM(coder_script(), log_path=log, cache_path=cache)
    evolution = Evolution(store, config, coder=coder, judge=judge, task_script=task_script)
    evolution.run()
    return evolution


def by_source(evolution: Evolution) -> dict[str, CandidateMeta]:
    metas = evolution.store.candidates()
    return {name: next(m for m in metas if evolution.store.source(m.id) == source)
            for name, source in (("seed", SEED), ("A", CHILD_A), ("B", CHILD_B))}  # fmt: skip


def test_a_better_answer_instruction_wins_and_better_retrieval_with_worse_answers_does_not(
    judged_run: Evolution,
):
    c = by_source(judged_run)
    seed, a, b = (c[k].scores["valid"] for k in ("seed", "A", "B"))
    retrieval = ("evidence_similarity", "evidence_hit_rate")
    assert all(m.status == "evaluated" for m in c.values())
    report = status(judged_run.store)
    assert report.best == c["A"].id
    # A: same retrieval as its parent, judged answers flipped from 0 to 1 on several questions
    assert {k: a.overall.metric(k) for k in retrieval} == {
        k: seed.overall.metric(k) for k in retrieval
    }
    flipped = [q for q in a.questions if seed.questions[q] == 0.0 and a.questions[q] == 1]
    assert len(flipped) >= 4
    # B: better retrieval than A, worse judged answers
    assert (b.overall.metric("evidence_similarity") or 0) > (
        a.overall.metric("evidence_similarity") or 0
    )
    assert (b.overall.fitness or 0) < (a.overall.fitness or 0)
    assert report.fitness.name == "judged" and report.fitness.version
    assert a.fitness is not None and a.fitness.name == "judged"  # every block names its mode


def test_abstention_questions_count_in_the_adversarial_capability(judged_run: Evolution):
    c = by_source(judged_run)
    valid = judged_run.tasks("valid")
    abstention = {q.id for q in valid.questions if q.ability == "abstention"}
    assert abstention and all(q.capability == "A" for q in valid.questions if q.id in abstention)
    for meta in c.values():
        assert abstention <= set(meta.scores["valid"].questions)
    assert c["A"].scores["valid"].by_capability["A"].fitness == 1.0
    assert c["seed"].scores["valid"].by_capability["A"].fitness == 0.0
    assert status(judged_run.store).specialists["A"]["id"] == c["A"].id


def test_a_child_with_unchanged_answers_makes_no_new_judge_call(judged_run: Evolution):
    """B answers exactly as the seed did: every judge request is answered from the cache."""
    c, store = by_source(judged_run), judged_run.store
    for split in ("train", "valid"):
        # a question the seed failed on, or a judge call that failed, leaves B's request unseen
        # (12 of 14 cached in CI once: a plan step failed on a thread-unsafe ast.parse, since
        # serialised by contract/parsing.py): name it first
        for name in ("seed", "B"):
            failed = [(t.id, t.error) for t in store.traces(c[name].id, split) if t.error]
            assert not failed, (name, split, failed)
            assert c[name].usage[split]["judge"]["errors"] == 0, (name, c[name].usage[split])
        judged = c["B"].usage[split]["judge"]
        assert judged["calls"] > 0 and judged["cached_calls"] == judged["calls"]


def test_the_mode_follows_the_configuration():
    model = ModelConfig(model="m")
    beam, locomo = bench("beam"), bench("locomo")
    assert beam.fitness(None, True).mode == "retrieval"
    assert beam.fitness(model, False).mode == "answer-f1"
    assert beam.fitness(model, True, "official").describe()["variant"] == "official"
    scores = {"beam_official": 0.0, "beam_described": 0.5, "answer_f1": 0.2}
    assert beam.fitness(model, True).question(scores) == 0.5
    assert beam.fitness(model, True, "official").question(scores) == 0.0
    assert beam.fitness(model, False).question(scores) == 0.2
    category_5 = {"judge_correct": None, "f1_official": 1.0}  # the official rule, no judge
    assert locomo.fitness(model, True).question(category_5) == 1.0
    assert locomo.fitness(model, True).question({"judge_correct": 0.0, "f1_official": 1.0}) == 0
    assert Fitness("retrieval").question({"evidence_similarity": None}) is None
