"""The ``jsonl`` bench's answer scoring: a yes/no judge that compares an answer with the gold.

Owns :class:`Scorer` (the :class:`~evolve.scoring.answers.AnswerScorer` of a user-format
bench). A user's questions carry no benchmark protocol, so it reuses the one shipped judge
prompt that assumes none: LongMemEval's default template
(:data:`evolve.scoring.longmemeval.DEFAULT_PROMPT`: does the assistant's response contain the
reference answer, as an equivalent value or reasoned to it), and LoCoMo's official stemmed token
F1 against the gold answer (:func:`evolve.scoring.locomo.token_f1`) as the judge-free metric.

Protocol: one judge call per question, role ``judge``, purpose ``jsonl/judge``,
``max_tokens=10``; the label is ``"yes" in reply.lower()``, scored 1.0 / 0.0 as
``judge_correct``. ``answer_f1`` is always computed (the ``answer-f1`` fitness).

Invariants: without a judge ``judge_correct`` is ``None`` and :meth:`Scorer.describe` says that
no judge was used; the prompt's sha256 is in :meth:`Scorer.describe`.
"""

from __future__ import annotations

from typing import Any

from evolve.datasets.types import Question
from evolve.models.llm import LLMClient
from evolve.scoring.answers import Judged
from evolve.scoring.longmemeval import DEFAULT_PROMPT, METRIC, judge_yes_no, yes_no_description

PURPOSE = "jsonl/judge"
PROMPTS: dict[str, str] = {"default": DEFAULT_PROMPT}


class Scorer:
    """A yes/no judge against the gold answer, and token F1; see the module docstring."""

    bench = "jsonl"
    metrics = (METRIC, "answer_f1")
    judge_metrics = (METRIC,)  # 0 when its reply never parses

    def __init__(self, judge: LLMClient | None) -> None:
        self.judge = judge if judge is not None and judge.available("judge") else None

    def score(self, question: Question, answer: str) -> Judged:
        return judge_yes_no(self.judge, PURPOSE, "default", question, answer)

    def max_judge_calls(self, question: Question) -> int:
        return 1

    def summarize(self, rows: list[tuple[Question, dict[str, Any]]]) -> dict[str, Any]:
        """Overall accuracy over the judged rows (None when nothing was judged)."""
        judged = [float(v) for _, scores in rows if (v := scores.get(METRIC)) is not None]
        accuracy = sum(judged) / len(judged) if judged else None
        return {"overall_accuracy": accuracy, "n_judged": len(judged)}

    def describe(self) -> dict[str, Any]:
        note = (
            "yes/no judge against the gold answer ({model}; LongMemEval's default prompt; "
            "label = 'yes' in the lower-cased reply)"
        )
        return yes_no_description(self.judge, PROMPTS, ["yes-no"], note)
