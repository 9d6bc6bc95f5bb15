"""The ceiling beside every coverage score, computed once per task set and cached.

Owns :func:`question_ceilings` and :data:`KEY`. The ceiling of a question is
:func:`evolve.scoring.coverage.ceiling`'s: the same scorer on the question's gold evidence
packed into the retrieval budget — 1 where the evidence fits, less where it does not. The
executor writes it into every trace's scores under :data:`KEY`, so every aggregate block
(overall, per capability, per type) carries the mean ceiling of its own questions beside its
coverage.

Invariants: the cache file of a task set is named by a digest of everything a ceiling depends
on — the coverage scorer's version, the embedder (name and encoding version), the budget and
the data (each question's id and evidence texts) — so a changed scorer, embedder or data file
never reads a stale ceiling. A cache file that cannot be read or parsed is recomputed and
replaced; one that cannot be written costs only the recomputation next time.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from evolve.files import write_atomic
from evolve.models.embed import Embedder, embedding_version
from evolve.scoring.coverage import BUDGET, FITNESS_VERSION, CoverageScorer, ceiling

KEY = "ceiling"  # the per-question (and per-block) ceiling in score dicts


def cache_key(evidence: Mapping[str, Sequence[str]], embedder: Embedder, budget: int) -> str:
    """The digest naming a task set's ceiling file (see the module's invariants)."""
    data = sorted((q, list(texts)) for q, texts in evidence.items())
    stamp = [FITNESS_VERSION, f"{embedder.name}@{embedding_version()}", budget, data]
    return hashlib.sha256(json.dumps(stamp).encode()).hexdigest()


def question_ceilings(
    evidence: Mapping[str, Sequence[str]],
    embedder: Embedder,
    cache_dir: Path | None,
    budget: int = BUDGET,
) -> dict[str, float | None]:
    """Question id → ceiling (None without evidence), read from ``cache_dir/ceilings`` when a
    file for exactly this task set, scorer and embedder is there, else computed and stored."""
    path = None
    if cache_dir is not None:
        path = Path(cache_dir) / "ceilings" / f"{cache_key(evidence, embedder, budget)}.json"
        stored = _read(path, evidence.keys())
        if stored is not None:
            return stored
    ids = list(evidence)
    top = ceiling([evidence[q] for q in ids], CoverageScorer(embedder), budget)
    values = dict(zip(ids, top.per_question, strict=True))
    if path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(path, json.dumps(values).encode())
        except OSError:
            pass  # an unwritable cache costs a recomputation, never the evaluation
    return values


def _read(path: Path, ids: Iterable[str]) -> dict[str, float | None] | None:
    """The stored ceilings when the file holds a number or null for every id, else None."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    wanted = set(ids)
    if not isinstance(data, dict) or set(data) != wanted:
        return None
    if not all(v is None or isinstance(v, int | float) for v in data.values()):
        return None
    return {q: None if v is None else float(v) for q, v in data.items()}
