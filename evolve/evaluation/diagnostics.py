"""Cold-start step diagnostics: where in the pipeline evidence gets lost (docs/design.md §4).

For a task with evidence set E and one embedding matcher φ, s(e, Z) = max over z in Z of
cos(φ(e), φ(z)), and per evidence snippet e:

- ``d_ext`` = s(e, U_e): the units extracted from e's own session — did extraction keep it?
- ``d_idx`` = s(e, R_e): what retrieval returns when e itself is the query — can the index
  find it at all?
- ``d_ret`` = s(e, R_x): what retrieval returns for the real question; this is the offline
  ``evidence_similarity``, computed by the scorer.

High ``d_ext`` but low ``d_idx`` points at indexing; high ``d_idx`` but low ``d_ret`` at
planning or retrieval. Also reported: mean unit length and mean retrieved length.

Owns :func:`question_diagnostics` (worker side: needs the run's units and a lookup, what
retrieval returns for a text as the question) and :func:`summarize` (parent side: means per
capability). Invariants: the lookup query is the
program's own offline stand-in built from e's text (no task-LLM call is spent), lookup results
are cached in the step store like any retrieval, and reading units for a diagnosis does not
count as step reuse.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

import numpy as np

from evolve.datasets.types import UNLABELLED, Conversation, Question
from evolve.models.embed import Embedder
from evolve.scoring.retrieval import blocks
from evolve.trace import QuestionTrace

KEYS = ("d_ext", "d_idx", "d_ret", "unit_chars", "retrieved_chars")
OVERALL = "overall"  # the group of every question, beside one per capability


def unit_text(unit: dict[str, Any]) -> str:
    """A unit record as one text: its string and list-of-string fields, in field order."""
    parts: list[str] = []
    for value in unit.values():
        if isinstance(value, str):
            parts.append(value)
        elif isinstance(value, list):
            parts.extend(str(v) for v in value)
    return " ".join(p for p in parts if p)


def _best(embedder: Embedder, text: str, others: list[str]) -> float:
    if not others:
        return 0.0
    vectors = embedder.embed([text, *others])
    return float(np.max(vectors[1:] @ vectors[0]))


def question_diagnostics(
    q: Question,
    conv: Conversation,
    units_of: Callable[[int], list[dict[str, Any]] | None],
    lookup: Callable[[str], str],
    embedder: Embedder,
) -> dict[str, float] | None:
    """``d_ext``, ``d_idx`` and the mean unit length for one question (None without evidence).
    ``units_of(i)`` gives session i's units (None when not available), ``lookup(text)`` the
    retrieved text when ``text`` is the question."""
    messages = conv.messages()
    index = {s.session_id: i for i, s in enumerate(conv.sessions)}
    ext, idx, lengths = [], [], []
    for e in q.evidence_ids:
        if e not in messages:
            continue
        segment, message = messages[e]
        snippet = message.text()
        units = [unit_text(u) for u in units_of(index[segment.session_id]) or []]
        lengths += [len(u) for u in units]
        ext.append(_best(embedder, snippet, units))
        idx.append(_best(embedder, snippet, blocks(lookup(message.content))))
    if not ext:
        return None
    return {"d_ext": float(np.mean(ext)), "d_idx": float(np.mean(idx)),
            "unit_chars": float(np.mean(lengths)) if lengths else 0.0}  # fmt: skip


def summarize(traces: list[QuestionTrace]) -> dict[str, dict[str, float | None]]:
    """Means of every diagnostic per capability (the questions with none under ``unlabelled``)
    and overall (``"overall"``), from traces that carry ``diagnostics`` and offline scores."""
    groups: dict[str, list[dict[str, float | None]]] = defaultdict(list)
    for t in traces:
        if not t.diagnostics:
            continue
        row = {**t.diagnostics, "d_ret": t.scores.get("evidence_similarity"),
               "retrieved_chars": float(len(t.retrieved_text))}  # fmt: skip
        groups[t.capability or UNLABELLED].append(row)
        groups[OVERALL].append(row)

    def mean(rows: list[dict[str, Any]], key: str) -> float | None:
        values = [r[key] for r in rows if isinstance(r.get(key), int | float)]
        return float(np.mean(values)) if values else None

    return {g: {k: mean(rows, k) for k in KEYS} for g, rows in sorted(groups.items())}
