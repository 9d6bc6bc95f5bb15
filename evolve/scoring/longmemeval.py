"""LongMemEval's answer scoring: the per-type yes/no judge (docs/benchmarks.md §3.3).

Owns :class:`Scorer` (the :class:`~evolve.scoring.answers.AnswerScorer` for ``longmemeval``),
the judge prompt templates (our own wording of the official criteria), the LongMemEval
headline numbers, and the yes/no judging and its description (:func:`judge_yes_no`,
:func:`yes_no_description`), which :mod:`evolve.scoring.userjudge` shares.

Protocol:

- One judge call per question, role ``judge``, purpose ``longmemeval/judge``, ``max_tokens=10``;
  the label is ``"yes" in reply.lower()`` (the official rule), scored 1.0 / 0.0 as
  ``judge_correct``.
- The template follows the question: abstention (id ending ``_abs``, any type) → the response
  must say the question cannot be answered (the gold is the explanation); temporal-reasoning →
  contains the answer, an off-by-one count of days (weeks, months) tolerated; knowledge-update
  → contains the updated answer, earlier values may be mentioned too; single-session-preference
  → the gold is a rubric and the response must recall and use the user's information correctly
  (not every rubric point); every other type → contains the answer, not only part of it.
- Headline (``print_qa_metrics.py``): accuracy per type, overall accuracy (every judged
  question), task-averaged accuracy (mean of the per-type accuracies over the types that have
  judged questions; all six on a full split), abstention accuracy (the ``_abs`` items, which
  also count in their type).
- **Judge-free** ``answer_f1`` (always computed, the ``answer-f1`` fitness of
  :mod:`evolve.scoring.fitness`): LoCoMo's official stemmed token F1 against the gold answer,
  a stated stand-in, not a LongMemEval metric.

Invariants: without a judge ``judge_correct`` is ``None`` and :meth:`Scorer.describe` says that
no judge was used; the official numbers use gpt-4o-2024-08-06, so results with another judge
are labelled with the judge's model id. Prompt hashes are in :meth:`Scorer.describe`.
"""

from __future__ import annotations

from typing import Any

from evolve.datasets.longmemeval import TYPES, is_abstention
from evolve.datasets.types import Question
from evolve.models.llm import LLMClient
from evolve.scoring.answers import Judged, prompt_sha256
from evolve.scoring.locomo import token_f1

PURPOSE = "longmemeval/judge"
MAX_TOKENS = 10
VARIANTS = ("per-type-yes-no",)
METRIC = "judge_correct"
NO_JUDGE = "no judge was used: answers are not scored (judge_correct is None)"

_ANSWER_HEAD = """You check whether a chat assistant correctly answered a question about its \
earlier conversations with a user.

Question: {question}
Reference answer: {gold}
Assistant's response: {response}

Say yes if the response contains the reference answer: in other words, as an equivalent value, \
or worked out through reasoning that arrives at it. Say no if it gives a different answer, no \
answer, or only part of what the reference answer requires."""

_ANSWER_TAIL = "\n\nIs the response correct? Reply with yes or no only."

DEFAULT_PROMPT = _ANSWER_HEAD + _ANSWER_TAIL

TEMPORAL_PROMPT = (
    _ANSWER_HEAD
    + """
Counting tolerance: when the question asks how many days (or weeks, months, ...) passed, a \
count that is off by one from the reference (say 19 days where the reference says 18) is still \
correct."""
    + _ANSWER_TAIL
)

UPDATE_PROMPT = (
    _ANSWER_HEAD
    + """
The user's situation changed over time and the reference answer is the latest one. A response \
that also mentions earlier, outdated information is still correct as long as the answer it \
gives as current is the reference answer."""
    + _ANSWER_TAIL
)

PREFERENCE_PROMPT = """You check whether a chat assistant gave a user a suitably personalised \
response.

User's request: {question}
Rubric (what a good personalised response does): {gold}
Assistant's response: {response}

Say yes if the response remembers personal information the user shared earlier and uses it \
correctly to tailor the reply; it need not cover every point of the rubric. Say no if it \
ignores, contradicts or misremembers the user's information.

Does the response meet the rubric? Reply with yes or no only."""

ABSTENTION_PROMPT = """You check a chat assistant's response to a question that cannot be \
answered from its earlier conversations with a user.

Question: {question}
Why it cannot be answered: {gold}
Assistant's response: {response}

Say yes if the response recognises that the question cannot be answered: for example it says \
the information was never given or is incomplete, or that it only knows about something \
related but different. Say no if it answers as though the information were available.

Does the response recognise that the question is unanswerable? Reply with yes or no only."""

PROMPTS: dict[str, str] = {
    "default": DEFAULT_PROMPT,
    "temporal-reasoning": TEMPORAL_PROMPT,
    "knowledge-update": UPDATE_PROMPT,
    "single-session-preference": PREFERENCE_PROMPT,
    "abstention": ABSTENTION_PROMPT,
}
DEFAULT_TYPES = ("single-session-user", "single-session-assistant", "multi-session")


def prompt_name(question: Question) -> str:
    """The template a question is judged with (a key of :data:`PROMPTS`)."""
    if is_abstention(question.id):
        return "abstention"
    if question.ability in DEFAULT_TYPES:
        return "default"
    if question.ability in PROMPTS:
        return question.ability
    raise ValueError(f"question {question.id}: {question.ability!r} is not a LongMemEval type")


def judge_yes_no(
    judge: LLMClient | None, purpose: str, name: str, question: Question, answer: str
) -> Judged:
    """``answer`` judged with the template ``PROMPTS[name]`` (purpose ``purpose``; no judge:
    ``judge_correct`` None), and its token F1 (see the module docstring's protocol)."""
    f1 = token_f1(answer, question.gold)
    if judge is None:
        return Judged({METRIC: None, "answer_f1": f1})
    prompt = PROMPTS[name].format(question=question.question, gold=question.gold, response=answer)
    reply = judge.complete("judge", purpose, prompt, max_tokens=MAX_TOKENS)
    label = "yes" in reply.text.lower()
    scores: dict[str, float | None] = {METRIC: 1.0 if label else 0.0, "answer_f1": f1}
    return Judged(scores, {"prompt": name, "reply": reply.text})


def yes_no_description(
    judge: LLMClient | None, prompts: dict[str, str], variants: list[str], note: str
) -> dict[str, Any]:
    """A yes/no scorer's ``describe()``: the judge's model, the sha256 of ``prompts``, the
    ``variants`` and ``note`` (``{model}`` filled in), or, without a judge, that none was used."""
    model = None
    if judge is not None and judge.models.judge is not None:
        model = judge.models.judge.model
    return {
        "judge": model,
        "prompts": {name: prompt_sha256(text) for name, text in prompts.items()},
        "variants": variants,
        "note": NO_JUDGE if model is None else note.format(model=model),
    }


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


class Scorer:
    """LongMemEval's per-type yes/no judge; see the module docstring."""

    bench = "longmemeval"
    metrics = (METRIC, "answer_f1")
    judge_metrics = (METRIC,)  # 0 when its reply never parses

    def __init__(self, judge: LLMClient | None) -> None:
        self.judge = judge if judge is not None and judge.available("judge") else None

    def score(self, question: Question, answer: str) -> Judged:
        return judge_yes_no(self.judge, PURPOSE, prompt_name(question), question, answer)

    def max_judge_calls(self, question: Question) -> int:
        return 1

    def summarize(self, rows: list[tuple[Question, dict[str, Any]]]) -> dict[str, Any]:
        """Per-type, overall, task-averaged and abstention accuracy over the judged rows (a
        ``None`` score is left out); every accuracy is None when nothing was judged."""
        per_type: dict[str, list[float]] = {t: [] for t in TYPES}
        judged: list[float] = []
        abstention: list[float] = []
        for q, scores in rows:
            value = scores.get(METRIC)
            if value is None:
                continue
            judged.append(float(value))
            per_type.setdefault(q.ability, []).append(float(value))
            if is_abstention(q.id):
                abstention.append(float(value))
        by_type = {t: _mean(v) for t, v in per_type.items()}
        typed = [acc for t in TYPES if (acc := by_type[t]) is not None]
        return {
            "per_type": {t: {"accuracy": by_type[t], "n": len(v)} for t, v in per_type.items()},
            "overall_accuracy": _mean(judged),
            "task_averaged_accuracy": _mean(typed),
            "types_averaged": len(typed),
            "abstention_accuracy": _mean(abstention),
            "n_judged": len(judged),
            "n_abstention": len(abstention),
        }

    def describe(self) -> dict[str, Any]:
        note = (
            "LongMemEval per-type yes/no judge ({model}; our wording of the official criteria; "
            "label = 'yes' in the lower-cased reply); the official numbers use gpt-4o-2024-08-06"
        )
        return yes_no_description(self.judge, PROMPTS, list(VARIANTS), note)
