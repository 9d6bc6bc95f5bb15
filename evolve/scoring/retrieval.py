"""Retrieval scoring: the retrieval-side metrics that need no LLM (scored offline and online).

Per question (docs/design.md §4), from :class:`RetrievalScorer`:

- ``evidence_coverage``, ``evidence_contained``, ``evidence_similarity``,
  ``evidence_hit_rate`` — from :mod:`.coverage` (one embedding matcher, all-MiniLM-L6-v2, on
  the evidence's and the retrieved text's content views; the hit threshold is
  :data:`~evolve.scoring.coverage.HIT_THRESHOLD` unless the caller states another, and the
  report records it). Coverage is the retrieval fitness; the rest are diagnostics.
- ``evidence_recall`` — share of evidence messages whose opening (first
  :data:`VERBATIM_CHARS` characters, whitespace-normalised) appears verbatim in the retrieved
  text: exact, but meaningful only for programs that keep messages verbatim (as offline
  extraction does); comparable to the floors in docs/benchmarks.md §2.7.
- ``answer_recall`` — share of the gold answer's content words (lower-cased, stemmed with
  PyStemmer's ``english`` (Snowball's Porter2), stopwords removed) present in the retrieved
  text.

Also owns :func:`blocks` (the retrieved text cut at blank lines; the step diagnostics read it).
Questions without evidence (BEAM abstention) get ``None`` for every metric and are left out of
the means. Aggregation: mean per capability (the questions with none as ``unlabelled``), per
native type and overall (over questions).
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import Stemmer

from evolve.datasets.types import GROUPS, UNLABELLED, Question
from evolve.models.embed import Embedder
from evolve.scoring import coverage
from evolve.scoring.coverage import HIT_THRESHOLD, ScoreInput

__all__ = ["HIT_THRESHOLD", "METRICS", "RetrievalScorer", "ScoreInput", "aggregate", "blocks"]
METRICS = (*coverage.METRICS, "evidence_recall", "answer_recall")
BLOCK_CHARS = 1000
MIN_BLOCK_CHARS = 120
VERBATIM_CHARS = 200

_STOPWORDS = frozenset(
    """a about above after again against all am an and any are as at be because been before
    being below between both but by can could did do does doing down during each few for from
    further had has have having he her here hers herself him himself his how i if in into is it
    its itself just me more most my myself no nor not now of off on once only or other our ours
    ourselves out over own same she should so some such than that the their theirs them
    themselves then there these they this those through to too under until up very was we were
    what when where which while who whom why will with would you your yours yourself yourselves
    llm response should state mention contain""".split()
)
_WORD = re.compile(r"[a-z0-9]+(?:[.'][a-z0-9]+)*")
_stemmer = Stemmer.Stemmer("english")


def content_words(text: str) -> set[str]:
    words = [w for w in _WORD.findall(text.lower()) if w not in _STOPWORDS]
    return set(_stemmer.stemWords(words))


def blocks(text: str) -> list[str]:
    """The retrieved text cut at blank lines into blocks of at most BLOCK_CHARS characters.

    A paragraph shorter than MIN_BLOCK_CHARS joins the block before it; a longer one than
    BLOCK_CHARS is cut into pieces. Blocks depend only on local text, so the same retrieved
    unit yields the same blocks in every candidate and its embedding is computed once.
    """
    out: list[str] = []
    for para in text.split("\n\n"):
        if not para.strip():
            continue
        if out and len(para) < MIN_BLOCK_CHARS and len(out[-1]) + len(para) + 2 <= BLOCK_CHARS:
            out[-1] = f"{out[-1]}\n\n{para}"
            continue
        out.extend(para[i : i + BLOCK_CHARS] for i in range(0, len(para), BLOCK_CHARS))
    return out


def _normalise(text: str) -> str:
    return " ".join(text.split())


class RetrievalScorer:
    """Every offline metric of a batch of questions: one embedding call for the batch."""

    def __init__(self, embedder: Embedder, hit_threshold: float = HIT_THRESHOLD) -> None:
        self.covered = coverage.CoverageScorer(embedder, hit_threshold)
        self.hit_threshold = hit_threshold

    def score(self, items: Sequence[ScoreInput]) -> list[dict[str, float | None]]:
        """Metrics for each item (keys :data:`METRICS`)."""
        return [{**{m: cov[m] for m in coverage.METRICS}, **_recall(item)}
                for item, cov in zip(items, self.covered.score(items), strict=True)]  # fmt: skip


def _recall(item: ScoreInput) -> dict[str, float | None]:
    if not item.evidence:
        return {"evidence_recall": None, "answer_recall": None}
    flat = _normalise(item.retrieved)
    verbatim = [_normalise(e)[:VERBATIM_CHARS] in flat for e in item.evidence]
    gold = content_words(item.question.gold)
    found = content_words(item.retrieved) if gold else set()
    return {
        "evidence_recall": float(np.mean(verbatim)),
        "answer_recall": len(gold & found) / len(gold) if gold else None,
    }


def aggregate(
    rows: Iterable[tuple[Question, dict[str, Any]]], metrics: Sequence[str] = METRICS
) -> dict[str, Any]:
    """``{"overall": {...}, "by_capability": {cap: {...}}, "by_type": {type: {...}}}``.

    Each leaf maps metric → mean over the questions that have a value, plus ``n`` (questions).
    Questions with no capability ("") are grouped under ``by_capability[UNLABELLED]``.
    """
    groups: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for question, scores in rows:
        for key in (("overall", ""), ("by_capability", question.capability or UNLABELLED),
                    ("by_type", question.ability)):  # fmt: skip
            groups[key].append(scores)

    def summary(group: list[dict[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {"n": len(group)}
        for m in metrics:
            values = [s[m] for s in group if s.get(m) is not None]
            out[m] = float(np.mean(values)) if values else None
        return out

    by_capability = {cap: summary(groups[("by_capability", cap)])
                     for cap in GROUPS if ("by_capability", cap) in groups}  # fmt: skip
    by_type = {name: summary(group) for (kind, name), group in sorted(groups.items())
               if kind == "by_type"}  # fmt: skip
    overall = summary(groups.get(("overall", ""), []))
    return {"overall": overall, "by_capability": by_capability, "by_type": by_type}
