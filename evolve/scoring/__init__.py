"""Scoring (docs/design.md): offline retrieval metrics (:mod:`.offline`) and the benchmarks'
answer scorers (:mod:`.answers` and the judges).

Owns :func:`fmt_score`, how a score prints everywhere (tables, the run report, prompts to the
coder). Importing this package loads no scorer.
"""

from __future__ import annotations


def fmt_score(value: float | None) -> str:
    """A score as the tables print it: three decimals, or a dash where there is none."""
    return "—" if value is None else f"{value:.3f}"
