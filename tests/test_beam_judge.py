"""BEAM answer scoring on hand-computed cases: τ-b, ordering alignment, both rubric variants."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from evolve.benches.registry import bench
from evolve.datasets.types import Question
from evolve.models.testing import ScriptedLLM
from evolve.scoring.beam_judge import Scorer
from evolve.scoring.ordering import answer_lines, kendall_tau_b, ordering_scores, rank_vectors


def question(ability: str = "information_extraction", rubric: tuple[str, ...] = ("x",),
             conv: str = "beam/100K/1", qid: str = "q") -> Question:  # fmt: skip
    return Question(qid, conv, ability, "F", "When does my sprint end?", "March 29", rubric)


def test_kendall_tau_b_known_permutations_and_ties():
    assert kendall_tau_b([1, 2, 3, 4], [1, 2, 3, 4]) == 1.0
    assert kendall_tau_b([1, 2, 3, 4], [4, 3, 2, 1]) == -1.0
    assert kendall_tau_b([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(4 / 6)  # C 5, D 1
    # one tie on y: C 5, D 0, n0 6, ties_y 1 -> 5 / sqrt(6 * 5)
    assert kendall_tau_b([1, 2, 3, 4], [1, 2, 5, 5]) == pytest.approx(5 / math.sqrt(30))
    assert math.isnan(kendall_tau_b([1, 2, 3], [7, 7, 7]))


def test_ordering_alignment_ranks_and_scores():
    gold = ["A", "B", "C", "D"]
    answer = "1. B\n\n2. A\n- C\n* X\n"
    assert answer_lines(answer) == ["B", "A", "C", "X"]
    result = ordering_scores(answer, gold, lambda line, item: line.lower() == item.lower())
    assert result.alignment == [1, 0, 2, -1]
    assert rank_vectors(4, result.alignment) == ([1, 2, 3, 4, 6], [2, 1, 3, 6, 4])
    assert (result.precision, result.recall, result.f1) == (0.75, 0.75, 0.75)
    assert result.tau_b == pytest.approx(0.6)  # C 8, D 2, no ties
    assert result.tau_norm == pytest.approx(0.8) and result.final == pytest.approx(0.6)
    empty = ordering_scores("nothing relevant", gold, lambda a, b: False)
    assert (empty.tau_norm, empty.final, empty.tau_b) == (0.0, 0.0, None)


def rubric_script(role: str, purpose: str, messages: list[dict[str, Any]]) -> str:
    """Item 'partial' earns 0.5, item 'full' earns 1.0, in both variants."""
    prompt = messages[-1]["content"]
    assert role == "judge" and purpose == "beam/rubric"
    return json.dumps({"score": 0.5 if "partial" in prompt else 1.0, "reason": "r"})


def test_rubric_partial_credit_in_both_variants():
    llm = ScriptedLLM(rubric_script)
    judged = Scorer(llm).score(question(rubric=("partial", "full")), "It ends on March 29.")
    assert judged.scores["beam_official"] == 0.5  # (int(0.5) + 1) / 2
    assert judged.scores["beam_described"] == 0.75  # (0.5 + 1) / 2
    prompts = [m[-1]["content"] for _, _, m in llm.transport_calls]
    assert len(prompts) == 4
    shown = [p for p in prompts if "When does my sprint end?" in p]
    assert len(shown) == 2  # the question is shown in the described variant only
    assert llm.usage_summary()["judge"]["calls"] == 4


def test_rubric_reply_outside_the_scale_is_asked_again():
    def script(role: str, purpose: str, messages: list[dict[str, Any]]) -> str:
        # by the conversation, not the call order: the two variants are judged at once
        return '{"score": 0.7}' if len(messages) == 1 else '{"score": 1}'

    llm = ScriptedLLM(script)
    judged = Scorer(llm).score(question(rubric=("full",)), "March 29")
    assert judged.scores["beam_official"] == judged.scores["beam_described"] == 1.0
    asked_again = [m[-1]["content"] for _, _, m in llm.transport_calls if len(m) > 1]
    assert len(llm.transport_calls) == 4 and len(asked_again) == 2  # once per variant
    assert all("not one of 0, 0.5, 1" in prompt for prompt in asked_again)


def test_event_ordering_uses_alignment_and_tau_norm():
    def align(role: str, purpose: str, messages: list[dict[str, Any]]) -> str:
        assert purpose == "beam/align"
        prompt = messages[-1]["content"]
        line = prompt.split("A: ")[1].split("\n")[0]
        item = prompt.split("B: ")[1].split("\n")[0]
        return "YES" if line.lower() == item.lower() else "NO"

    q = question("event_ordering", ("A", "B", "C", "D"))
    judged = Scorer(ScriptedLLM(align)).score(q, "B\nA\nC\nX")
    assert judged.scores["beam_official"] == judged.scores["beam_described"] == pytest.approx(0.8)
    assert judged.scores["ordering_f1"] == 0.75
    assert judged.scores["ordering_final"] == pytest.approx(0.6)


def test_headline_averages_questions_per_conversation_then_conversations():
    scorer = Scorer(None)
    rows = [
        (question(conv="a", qid="1"), {"beam_official": 1.0, "beam_described": 1.0}),
        (question(conv="a", qid="2"), {"beam_official": 0.0, "beam_described": 0.5}),
        (question(conv="b", qid="3"), {"beam_official": 1.0, "beam_described": 1.0}),
        (question("abstention", conv="b", qid="4"), {"beam_official": 0.0,
                                                      "beam_described": None}),
    ]  # fmt: skip
    summary = scorer.summarize(rows)
    assert summary["official"]["by_ability"]["information_extraction"] == 0.75  # (0.5 + 1) / 2
    assert summary["official"]["overall"] == 0.375  # mean of 0.75 and 0.0
    assert summary["described"]["by_ability"] == {"information_extraction": 0.875}


def test_without_a_judge_nothing_is_judged_and_the_report_says_so():
    scorer = bench("beam").scorer(None)
    scores = scorer.score(question(), "x").scores
    assert {v for k, v in scores.items() if k != "answer_f1"} == {None}
    assert scores["answer_f1"] == 0.0  # the judge-free token F1 is still computed
    assert scorer.describe()["judge"] is None and "no judge" in scorer.describe()["note"]
    described = Scorer(ScriptedLLM([])).describe()
    assert described["judge"] == "scripted" and len(described["prompts"]["rubric"]) == 64
