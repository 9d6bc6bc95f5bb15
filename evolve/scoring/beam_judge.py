"""BEAM's answer scoring: rubric judge (two variants), event ordering (docs/benchmarks.md §2.5).

Owns :class:`Scorer` (the :class:`~evolve.scoring.answers.AnswerScorer` for ``beam``), the judge
prompt templates (our own wording of the protocol) and the BEAM headline numbers.

Protocol:

- **Rubric judge**: every rubric item is judged on its own, on the scale 1 (complete) / 0.5
  (partial) / 0 (none), as JSON ``{"score", "reason"}``; a question's score is the mean over
  its items. Two variants are scored side by side:

  - ``official`` — as the published code behaves: the judge is not shown the question (its
    placeholder is never filled in the official code) and a 0.5 counts as 0 (``int(score)``);
  - ``described`` — as the paper describes it: the question is shown and 0.5 is kept.

- **Event ordering** (:mod:`evolve.scoring.ordering`): answer lines are aligned to the rubric's
  gold items by a YES/NO equivalence judgement per (line, item) pair; BEAM reports
  ``tau_norm``, which is the event-ordering score in both variants (``ordering_final`` =
  tau_norm × F1 is kept too). The rubric judge is not run on ordering questions.
- **Headline**: per ability, the mean over questions within each conversation, then over
  conversations (as ``report_results.py`` does); overall = the mean of the ten ability scores.

- **Judge-free** ``answer_f1`` (always computed, the ``answer-f1`` fitness of
  :mod:`evolve.scoring.fitness`): LoCoMo's official Porter-stemmed token F1 against the gold
  answer — a stated stand-in, not a BEAM metric.

Invariants: judge calls use role ``judge`` and purposes ``beam/rubric`` and ``beam/align``;
without a judge every judged metric is ``None``. A question's rubric calls are independent and
run concurrently (bounded by its item count; the run-wide limit is the client's), their scores
kept in rubric order; ordering's alignment calls stay sequential (each depends on the ones
before it). Prompt hashes are in :meth:`Scorer.describe`.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from evolve.datasets.types import Question
from evolve.fanout import ordered_map
from evolve.models.llm import LLMClient
from evolve.scoring.answers import Judged, prompt_sha256
from evolve.scoring.locomo import token_f1
from evolve.scoring.ordering import ordering_scores

VARIANTS = ("official", "described")
ORDERING = "event_ordering"

RUBRIC_PROMPT = """You grade one answer of an AI assistant against ONE rubric criterion.
{question_block}
RUBRIC CRITERION:
{item}

ASSISTANT'S ANSWER:
{answer}

How to grade:
- Judge meaning, not wording: paraphrases, synonyms, equivalent numbers, units and date formats
  satisfy the criterion.
- Ignore style, length and tone unless the criterion is about them.
- An answer that does not respond to what was asked earns 0.
- A criterion that says something must NOT appear is met when it does not appear.
- Score 1.0 when the criterion is fully met, 0.5 when it is partly met (some of what it asks
  for, or stated vaguely), 0.0 when it is not met or the answer contradicts it.

Reply with JSON only: {{"score": <1.0, 0.5 or 0.0>, "reason": "<one sentence>"}}"""

QUESTION_BLOCK = "\nQUESTION THE ASSISTANT WAS ANSWERING:\n{question}\n"

ALIGN_PROMPT = """Do these two texts refer to the same event or item (wording may differ)?

A: {line}
B: {item}

Answer YES or NO only."""

RUBRIC_SCHEMA = {
    "type": "object",
    "properties": {"score": {"type": "number", "enum": [0, 0.5, 1]}, "reason": {"type": "string"}},
    "required": ["score"],
}


def _score_value(data: Any) -> float:
    """The judged score (0, 0.5 or 1); ValueError otherwise, so the client asks again."""
    if not isinstance(data, dict) or "score" not in data:
        raise ValueError('expected a JSON object with a "score"')
    try:
        value = float(data["score"])
    except (TypeError, ValueError):
        raise ValueError(f"score {data['score']!r} is not a number") from None
    if value not in (0.0, 0.5, 1.0):
        raise ValueError(f"score {value} is not one of 0, 0.5, 1")
    return value


def answer_f1(question: Question, answer: str) -> float:
    """The judge-free answer metric: LoCoMo's official stemmed token F1 against the gold answer
    (the rubric items joined when a question has no gold answer)."""
    return token_f1(answer, question.gold or " ".join(question.rubric))


class Scorer:
    """BEAM's rubric judge and ordering score; see the module docstring."""

    bench = "beam"
    metrics = ("beam_official", "beam_described", "ordering_f1", "ordering_final", "answer_f1")
    judge_metrics = ("beam_official", "beam_described")  # 0 when its reply never parses

    def __init__(self, judge: LLMClient | None) -> None:
        self.judge = judge if judge is not None and judge.available("judge") else None

    def score(self, question: Question, answer: str) -> Judged:
        judged = self._judged(question, answer)
        return Judged({**judged.scores, "answer_f1": answer_f1(question, answer)}, judged.detail)

    def _judged(self, question: Question, answer: str) -> Judged:
        if self.judge is None or not question.rubric:
            return Judged(dict.fromkeys(self.metrics))
        if question.ability == ORDERING:
            return self._ordering(question, answer)
        official, described, detail = [], [], []
        pairs = [(item, variant) for item in question.rubric for variant in VARIANTS]
        # every (item, variant) is judged on its own: all at once, results in rubric order
        values = ordered_map(lambda p: self._rubric(question, answer, *p), pairs, len(pairs))
        for (item, variant), value in zip(pairs, values, strict=True):
            if variant == "official":
                official.append(float(int(value)))  # the published code's int(): 0.5 -> 0
            else:
                described.append(value)
            detail.append({"item": item, "variant": variant, "score": value})
        scores: dict[str, float | None] = dict.fromkeys(self.metrics)
        scores["beam_official"] = sum(official) / len(official)
        scores["beam_described"] = sum(described) / len(described)
        return Judged(scores, {"rubric": detail})

    def _rubric(self, question: Question, answer: str, item: str, variant: str) -> float:
        assert self.judge is not None
        shown = QUESTION_BLOCK.format(question=question.question)
        prompt = RUBRIC_PROMPT.format(
            question_block=shown if variant == "described" else "", item=item, answer=answer
        )
        return self.judge.complete_json(
            "judge", "beam/rubric", prompt, RUBRIC_SCHEMA, _score_value, max_tokens=200
        )

    def max_judge_calls(self, question: Question) -> int:
        # two variants per rubric item; ordering: up to one call per (line, item) pair
        n = len(question.rubric)
        return n**2 if question.ability == ORDERING else 2 * n

    def _ordering(self, question: Question, answer: str) -> Judged:
        assert self.judge is not None
        judge = self.judge

        def same(line: str, item: str) -> bool:
            prompt = ALIGN_PROMPT.format(line=line, item=item)
            reply = judge.complete("judge", "beam/align", prompt, max_tokens=5)
            return "yes" in reply.text.lower()

        result = ordering_scores(answer, question.rubric, same)
        scores: dict[str, float | None] = {
            "beam_official": result.tau_norm,
            "beam_described": result.tau_norm,
            "ordering_f1": result.f1,
            "ordering_final": result.final,
        }
        detail = {"alignment": result.alignment, "tau_b": result.tau_b,
                  "precision": result.precision, "recall": result.recall}  # fmt: skip
        return Judged(scores, {"ordering": detail})

    def summarize(self, rows: list[tuple[Question, dict[str, Any]]]) -> dict[str, Any]:
        """Per ability (question mean per conversation, then the mean over conversations) and
        overall (mean of the ability scores), for each variant; None when nothing was judged."""
        out: dict[str, Any] = {}
        for variant in VARIANTS:
            metric = f"beam_{variant}"
            per: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
            for q, scores in rows:
                if scores.get(metric) is not None:
                    per[q.ability][q.conversation_id].append(float(scores[metric]))
            abilities = {
                ability: sum(sum(v) / len(v) for v in convs.values()) / len(convs)
                for ability, convs in sorted(per.items())
            }
            overall = sum(abilities.values()) / len(abilities) if abilities else None
            out[variant] = {"by_ability": abilities, "overall": overall,
                            "abilities_scored": len(abilities)}  # fmt: skip
        return out

    def describe(self) -> dict[str, Any]:
        model = None
        if self.judge is not None and self.judge.models.judge is not None:
            model = self.judge.models.judge.model
        return {
            "judge": model,
            "prompts": {
                "rubric": prompt_sha256(RUBRIC_PROMPT + QUESTION_BLOCK),
                "align": prompt_sha256(ALIGN_PROMPT),
            },  # fmt: skip
            "variants": list(VARIANTS),
            "note": "BEAM rubric judge (official and described variants) and event ordering "
            "(tau_norm)"
            if model
            else "no judge was used: answers are not scored",
        }
