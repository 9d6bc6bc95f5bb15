"""The capability-driven stages with a scripted coder and annotator: annotation, diagnostics,
dependency-aware selection, history, integration inputs, routing baselines and the ablations.

Evaluation is offline with the hashing embedder on one conversation per split (deterministic,
meaningless numbers). Unit tests cover the pure pieces on hand-made candidates.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
from conftest import run_config

from evolve.datasets.types import Question, TaskSet
from evolve.evolution.annotate import Labels, annotate
from evolve.evolution.budget import calls_path
from evolve.evolution.cases import SeededDraw, differential_cases, failing_cases
from evolve.evolution.coder import render_request
from evolve.evolution.loop import Evolution
from evolve.evolution.proposer import CandidateView, Request
from evolve.evolution.selection import dependency_aware, round_robin
from evolve.evolution.stages import common_ancestor, partners
from evolve.evolution.store import CandidateMeta, RunStore
from evolve.models.testing import HashingEmbedder, ScriptedLLM
from evolve.trace import QuestionTrace

ROOT = Path(__file__).resolve().parents[1]
HYBRID = (ROOT / "seeds" / "hybrid.py").read_text()
pytestmark = pytest.mark.usefixtures("check_once")  # the runs here check the same programs


def annotator_script(role: str, purpose: str, messages: list[dict[str, Any]]) -> str:
    assert role == "annotator"
    question = messages[-1]["content"].split("Question: ")[1].lower()
    if purpose == "route":
        return json.dumps({"capability": "T" if "when" in question else "F"})
    return json.dumps({"primary": "T" if "when" in question else "F", "secondary": ["M", "T"]})


def coder_script() -> Any:
    values = itertools.count(81)

    def reply(role: str, purpose: str, messages: list[dict[str, Any]]) -> str:
        if purpose.endswith("/diagnose"):
            return "Retrieval keeps too few units."
        new = next(values)
        block = f"<<<<<<< SEARCH\nTOP_K = 80\n=======\nTOP_K = {new}\n>>>>>>> REPLACE\n"
        return f"MESSAGE: top k {new}\n{block}"

    return reply


def run(data_dir: Path, stages: Path, root: Path, run_id: str, **over: Any) -> Evolution:
    """A run in ``root`` with the scripted coder and annotator; step outputs go to ``stages``
    (a cache shared with other offline tests), the LLM request cache stays in ``root``."""
    base = {"coder_model": {"model": "scripted"}, "children": 1,
            "rounds": {"cold_start": 1, "refinement": 2, "integration": 1}}  # fmt: skip
    config = run_config(data_dir, stages, **{**base, **over})
    store = RunStore.create(root, {"config": config.as_json()}, run_id=run_id)
    cache = root / "cache" / "llm-cache.sqlite"
    coder = ScriptedLLM(coder_script(), log_path=calls_path(store.root), cache_path=cache)
    annotator = ScriptedLLM(annotator_script, log_path=calls_path(store.root), cache_path=cache)
    evolution = Evolution(store, config, coder=coder, annotator=annotator)
    evolution.run()
    return evolution


@pytest.fixture(scope="module")
def full(
    data_dir: Path, offline_cache: Path, tmp_path_factory: pytest.TempPathFactory
) -> Evolution:
    return run(data_dir, offline_cache, tmp_path_factory.mktemp("stages"), "full")


def test_annotation_is_cached_per_task_and_model(full: Evolution):
    tasks = full.tasks("train")
    assert isinstance(full.annotator, ScriptedLLM)
    labels = full.labels()
    assert {lab.source for lab in labels.values()} == {"annotator:scripted"}
    assert all("M" in lab.secondary and lab.primary not in lab.secondary for lab in labels.values())
    reached = len(full.annotator.transport_calls)
    again = annotate(tasks, full.annotator)  # same model, same tasks: the request cache answers
    assert len(full.annotator.transport_calls) == reached
    assert again == {q.id: labels[q.id] for q in tasks.questions}


def test_diagnostics_per_capability_reach_the_coder(full: Evolution):
    seed = full.store.candidates()[0]
    table = seed.scores["train"].diagnostics
    assert table is not None and {"overall", "F", "T"} <= set(table)
    for row in table.values():
        assert 0.0 <= row["d_ext"] <= 1.0 + 1e-6 and 0.0 <= row["d_idx"] <= 1.0 + 1e-6
        assert row["unit_chars"] > 0 and row["retrieved_chars"] > 0
    assert seed.scores["valid"].diagnostics is None  # diagnostics steer on train only
    assert isinstance(full.coder, ScriptedLLM)
    prompts = [m[-1]["content"] for _, purpose, m in full.coder.transport_calls
               if purpose == "cold_start/diagnose"]  # fmt: skip
    assert prompts and "Stage diagnostics" in prompts[0] and "d_idx" in prompts[0]


def test_refinement_targets_follow_the_dependency_rule(full: Evolution):
    targets = [c.capability for c in full.store.candidates() if c.stage == "refinement"]
    assert len(targets) == 2 and all(t in "FTPMA" for t in targets)
    # M is every task's secondary capability here, so it outranks an equally weak one
    labels = {f"q{i}": Labels("F" if i % 2 else "T", ("M",), "x") for i in range(10)}
    labels["m"] = Labels("M", (), "x")
    per_question = {q: 0.5 for q in labels}
    assert dependency_aware(per_question, labels) == "M"
    assert dependency_aware(per_question, labels, stalled="M") != "M"
    weak_f = {q: 0.0 for q, lab in labels.items() if lab.primary == "F"}
    assert dependency_aware({**per_question, **weak_f}, labels) == "F"  # 1.0 beats 0.5 x 21/11
    assert [round_robin(k) for k in range(6)] == ["F", "T", "P", "M", "A", "F"]


def test_integration_is_compared_with_routing(full: Evolution):
    merged = [c for c in full.store.candidates() if c.stage == "integration"]
    assert len(merged) == 1 and merged[0].status == "evaluated"
    routing = merged[0].scores["valid"].routing
    assert routing is not None
    assert routing["oracle_router"] is not None and routing["question_router"] is not None
    assert isinstance(routing["beats_routing"], bool)
    (event,) = full.store.events("routing")
    assert event["data"]["candidate"] == merged[0].id


def meta(number: int, parents: list[str]) -> CandidateMeta:
    return CandidateMeta(id=f"c{number:04d}-0000000{number}", number=number, parents=parents,
                         stage="seed", capability=None, message="m", source_sha256="0" * 64,
                         status="evaluated", sandbox=None, scores={}, usage={}, seconds=0.0,
                         created=0.0)  # fmt: skip


def test_partners_rotate_and_the_common_ancestor_is_the_latest_shared_one():
    c0, c1 = meta(0, []), meta(1, ["c0000-00000000"])
    c2, c3 = meta(2, ["c0001-00000001"]), meta(3, ["c0001-00000001"])
    assert common_ancestor([c0, c1, c2, c3], c2, c3) == c1
    kept = {"F": c2, "T": c3, "P": c2, "M": c0}
    assert [p.id for p in partners(c0, kept, 0)] == [c2.id, c3.id]
    assert [p.id for p in partners(c0, kept, 1)] == [c3.id, c2.id]


def tiny_tasks() -> tuple[TaskSet, list[dict[str, Any]], list[dict[str, Any]]]:
    from contract.types import Message, Segment
    from evolve.datasets.types import Conversation

    seg = Segment("1", "2024-01-01", tuple(Message(str(i), "user", f"fact {i}") for i in range(4)))
    conv = Conversation("c", (seg,))
    qs = tuple(Question(f"q{i}", "c", "information_extraction", "F", f"what {i}?", str(i),
                        evidence_ids=(str(i),)) for i in range(4))  # fmt: skip

    def traces(values: list[float]) -> list[QuestionTrace]:
        return [QuestionTrace(id=f"q{i}", conversation_id="c", retrieved=f"fact {i}",
                              query={"text": "x"},
                              scores={"evidence_similarity": v, "evidence_hit_rate": v})
                for i, v in enumerate(values)]  # fmt: skip

    return (
        TaskSet("beam", "train", (conv,), qs),
        traces([0.9, 0.2, 0.5, 0.5]),
        traces([0.3, 0.8, 0.5, 0.5]),
    )


def test_differential_cases_pair_both_traces_and_reach_the_integration_prompt():
    tasks, mine, theirs = tiny_tasks()
    cases = differential_cases(mine, theirs, tasks, HashingEmbedder())
    assert [c["id"] for c in cases] == ["q1", "q0"]  # theirs wins on q1, mine on q0
    assert all("other" in c for c in cases)
    parent = CandidateView("c0002-aaaaaaaa", HYBRID, {})
    partner = CandidateView("c0003-bbbbbbbb", HYBRID.replace("TOP_K = 80", "TOP_K = 90"), {})
    ancestor = CandidateView(
        "c0001-cccccccc", HYBRID.replace("MIN_SCORE = 0.15", "MIN_SCORE = 0.1"), {}
    )
    request = Request("integration", 3, parent, None, specialists=(partner,), ancestor=ancestor,
                      differential=cases)  # fmt: skip
    text = render_request(request, partner)
    assert "common ancestor c0001-cccccccc" in text and "+TOP_K = 90" in text
    assert "Paired cases" in text and "Specialist retrieved" in text


def test_random_cases_differ_from_the_worst():
    tasks, mine, _ = tiny_tasks()
    embedder = HashingEmbedder()
    worst = [c["id"] for c in failing_cases(mine, tasks, None, limit=2, embedder=embedder)]
    assert worst == ["q1", "q2"]
    drawn = {tuple(c["id"] for c in failing_cases(mine, tasks, None, limit=2, order=SeededDraw(),
                                                 seed=str(s), embedder=embedder))
             for s in range(8)}  # fmt: skip
    assert len(drawn) > 1


def test_ablations_change_behaviour_as_named(data_dir: Path, offline_cache: Path, tmp_path: Path):
    rounds = {"cold_start": 0, "refinement": 1, "integration": 1}
    holistic = run(data_dir, offline_cache, tmp_path, "holistic", rounds=rounds, holistic=True)
    assert all(c.capability is None for c in holistic.store.candidates())
    assert isinstance(holistic.coder, ScriptedLLM)
    integration = [m[1]["content"] for _, s, m in holistic.coder.transport_calls
                   if s == "integration/propose"]  # fmt: skip
    assert integration and "Specialist for" not in integration[0]
    two = {"cold_start": 0, "refinement": 2}
    robin = run(data_dir, offline_cache, tmp_path, "robin", rounds=two, selection="round-robin")
    assert [c.capability for c in robin.store.candidates()[1:]] == ["F", "T"]
    assert not [c for c in robin.store.candidates() if c.stage == "integration"]
    drawn = run(data_dir, offline_cache, tmp_path, "drawn", rounds=two, selection="round-robin",
                cases="random")  # fmt: skip
    assert [c.capability for c in drawn.store.candidates()[1:]] == ["F", "T"]
    worst, random = recorded_cases(robin), recorded_cases(drawn)
    assert [len(ids) for ids in random] == [len(ids) for ids in worst] and all(worst)
    assert random != worst  # same parents and targets, other cases


def recorded_cases(evolution: Evolution) -> list[list[str]]:
    """The failing cases each round's proposal was shown, as the run's events record them."""
    return [e["data"]["cases"] for e in evolution.store.events("proposed")]


def test_cases_are_compact_and_keep_each_evidence_best_unit(full: Evolution):
    from evolve.evolution.compact import EXCERPT_CHARS

    request = full.request("refinement", 1, 0)
    assert request.cases
    for case in request.cases:
        for text in (case["retrieved"], *case["evidence"], *case["evidence_source"]):
            assert len(text) <= EXCERPT_CHARS
        assert len(case["units_for_evidence"]) == len(case["evidence"])
        assert all(units for units in case["units_for_evidence"])  # the best unit at least
