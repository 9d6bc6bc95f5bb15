"""What a run spends on models: its call log, the caps, and the estimate before a run.

Owns the run's call log ``<run>/calls.sqlite`` (:mod:`evolve.models.calllog`):
every LLM call of the run — the coder's proposals and repairs, the task model's extraction,
planning and answers in the evaluation workers — is appended by
:class:`~evolve.models.llm.LLMClient` as the call returns, before its reply is used.

Invariants:

- Spend is read from the log, never kept anywhere else, and the log only grows; so spend is never
  reset — a run resumed after ``kill -9`` starts from what it had paid, including calls whose
  result was lost with the process.
- Spend is summed by :class:`~evolve.models.usage.Tally`: ``cost_usd`` counts money actually
  spent (a cache hit costs 0 and its tokens are counted apart, ``cached_tokens``); ``tokens``
  (what ``--max-tokens`` caps) counts prompt and completion tokens of calls that reached a
  model. A call whose model has no known price counts in ``unpriced_calls``; a USD cap cannot
  see those, and the run says so.
- :meth:`Budget.stop_reason` is checked before each round: a round starts only when the spend
  so far plus the projected cost of one more round stays within every cap; the projection is
  the most any finished round of the run has cost (nothing before the first round, so a cap
  smaller than one round is passed once). Within a round, no repair attempt starts once a cap
  is reached (:meth:`Budget.exhausted`), and every model call of the run, in every process, is
  admitted under the caps with the calls in flight counted (:mod:`evolve.models.spendcap`,
  whose caps file the loop writes beside the call log); a refused call ends the round and the
  run, whose saved state is that of its last finished round. A run stopped at a cap resumes
  with a higher cap.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evolve.models import calllog
from evolve.models.llm import ModelConfig
from evolve.models.usage import Tally

CALLS_FILE = "calls.sqlite"


@dataclass
class Spend:
    """A run's spend: in total, per role and per (role, purpose)."""

    total: Tally = field(default_factory=Tally)
    by_role: dict[str, Tally] = field(default_factory=dict)
    by_purpose: dict[str, Tally] = field(default_factory=dict)  # "role/purpose" -> tally

    def as_json(self) -> dict[str, Any]:
        return {
            "total": self.total.as_json(),
            "by_role": {k: v.as_json() for k, v in sorted(self.by_role.items())},
            "by_purpose": {k: v.as_json() for k, v in sorted(self.by_purpose.items())},
        }


def calls_path(run_root: Path) -> Path:
    return Path(run_root) / CALLS_FILE


def read_spend(run_root: Path) -> Spend:
    """The spend recorded in a run's call log (all zero when the run made no call)."""
    spend = Spend()
    path = calls_path(run_root)
    if not path.exists():
        return spend
    for row in calllog.read_rows(path):
        spend.total.add(row)
        spend.by_role.setdefault(row["role"], Tally()).add(row)
        spend.by_purpose.setdefault(f"{row['role']}/{row['purpose']}", Tally()).add(row)
    return spend


@dataclass(frozen=True)
class Budget:
    """Caps on a run; None = no cap. Rounds are capped by the run config."""

    max_usd: float | None = None
    max_tokens: int | None = None

    def __post_init__(self) -> None:
        for name in ("max_usd", "max_tokens"):
            value = getattr(self, name)
            if value is not None and (not math.isfinite(value) or value < 0):
                raise ValueError(f"{name.replace('_', '-')} must be a non-negative number")

    def stop_reason(self, spend: Spend, rounds: list[dict[str, float]]) -> str | None:
        """Why the next round must not start, or None. ``rounds`` holds what each finished round
        spent (``{"usd", "tokens"}``); the dearest of them is the projected cost of the next."""
        total = spend.total
        usd = max((r["usd"] for r in rounds), default=0.0)
        tokens = max((r["tokens"] for r in rounds), default=0.0)
        if self.max_usd is not None and total.cost_usd + usd > self.max_usd:
            return (
                f"USD cap reached: spent ${total.cost_usd:.4f}; a round has cost up to "
                f"${usd:.4f}, and the cap is ${self.max_usd:g}"
            )
        if self.max_tokens is not None and total.tokens + tokens > self.max_tokens:
            return (
                f"token cap reached: spent {total.tokens:,} tokens; a round has used up to "
                f"{int(tokens):,}, and the cap is {self.max_tokens:,}"
            )
        return None

    def exhausted(self, spend: Spend) -> bool:
        """Whether a cap is already reached (no further repair attempt is made)."""
        total = spend.total
        return (self.max_usd is not None and total.cost_usd >= self.max_usd) or (
            self.max_tokens is not None and total.tokens >= self.max_tokens
        )


# --- the estimate before a run (`evolve run --dry-run`) -------------------------------------

CHARS_PER_TOKEN = 4  # a rough rule for English text; the estimate says it is rough
PLAN_COMPLETION, ANSWER_COMPLETION = 60, 120  # tokens a query plan / an answer takes, roughly
PLAN_PROMPT_CHARS, ANSWER_PROMPT_CHARS = 1_500, 17_500  # instruction + schema / + retrieved text
EXTRACT_OVERHEAD_CHARS = 1_500  # instruction and schema around each extraction window


@dataclass(frozen=True)
class Workload:
    """The model work of one run, counted from its data before it starts."""

    rounds: int
    evaluations: int  # the seed and every child of every round (the cascade may stop some)
    extract_windows: int  # extraction calls for one full evaluation (train and valid)
    extract_chars: int  # the history text those calls read
    questions: int  # train and valid questions (one plan and one answer call each)
    coder_prompt_chars: int  # the coder's first prompt for the seed
    repairs: int  # repair attempts allowed per round
    judge_calls: int = 0  # judge calls to score one evaluation's answers (BEAM: per rubric item)
    children: int = 1  # children (proposals) per round


def _usd(model: str, prompt: int, completion: int) -> float | None:
    import litellm  # the local price map only (evolve.models.llm sets it before importing)

    try:
        cost_in, cost_out = litellm.cost_per_token(
            model=model, prompt_tokens=prompt, completion_tokens=completion
        )
    except Exception:
        return None
    return float(cost_in + cost_out)


JUDGE_PROMPT_CHARS, JUDGE_COMPLETION = 2_000, 40  # a rubric item with the answer; the verdict


def estimate(
    work: Workload,
    task: ModelConfig | None,
    coder: ModelConfig | None,
    judge: ModelConfig | None = None,
) -> list[dict[str, Any]]:
    """Rows ``{"role", "what", "calls", "prompt_tokens", "completion_tokens", "usd"}``: upper
    bounds (every evaluation recomputes every step, no child is stopped by the cascade; every
    child uses all its repairs) and, for the coder, the expected case of one call per child.
    ``usd`` is None for a model litellm has no price for. Tokens are characters / 4."""
    rows: list[dict[str, Any]] = []

    def row(role: str, model: ModelConfig, what: str, calls: int, prompt: int, out: int) -> None:
        usd = _usd(model.model, prompt, out)
        rows.append({"role": role, "model": model.model, "what": what, "calls": calls,
                     "prompt_tokens": prompt, "completion_tokens": out, "usd": usd})  # fmt: skip

    if task is not None:
        n = work.evaluations
        extract_in = (work.extract_chars + work.extract_windows * EXTRACT_OVERHEAD_CHARS) // 4
        max_out = task.max_tokens
        extract_out = min(work.extract_windows * max_out, extract_in // 2)
        row("task", task, "extraction (no reuse)", n * work.extract_windows, n * extract_in,
            n * extract_out)  # fmt: skip
        q = work.questions * n
        row("task", task, "planning", q, q * PLAN_PROMPT_CHARS // 4, q * PLAN_COMPLETION)
        row("task", task, "answers", q, q * ANSWER_PROMPT_CHARS // 4, q * ANSWER_COMPLETION)
        if judge is not None:
            calls = work.judge_calls * n
            row("judge", judge, "answer scoring", calls, calls * JUDGE_PROMPT_CHARS // 4,
                calls * JUDGE_COMPLETION)  # fmt: skip
    if coder is not None:
        prompt = work.coder_prompt_chars // CHARS_PER_TOKEN
        out, children = coder.max_tokens, work.rounds * work.children
        row("coder", coder, "proposals, one per child", children, children * prompt,
            children * out // 4)  # fmt: skip
        most = children * (1 + work.repairs)
        # a repair resends the conversation so far: on average about twice the first prompt
        row("coder", coder, "proposals with every repair", most,
            children * prompt * (1 + 2 * work.repairs), most * out)  # fmt: skip
    return rows
