"""Event-ordering scores (BEAM, docs/benchmarks.md §2.5): align answer lines to gold items, then
compare the orders with Kendall τ-b.

Owns :func:`answer_lines`, :func:`align`, :func:`rank_vectors`, :func:`kendall_tau_b` and
:func:`ordering_scores`. The LLM's part (is this line the same item as that gold item?) is a
callable passed in, so everything here is deterministic and testable by hand.

Protocol, as the official report computes it:

1. The answer is split into lines (blank lines are dropped; leading list markers such as
   ``1.``, ``-``, ``*`` are stripped before matching).
2. Each line is aligned to the first gold item, in gold order, that it matches and that no
   earlier line took (the official code asks an LLM a YES/NO equivalence question per pair).
3. Precision = aligned lines / lines, recall = aligned gold items / gold items, F1 as usual.
4. Over the union U of the gold items and the unaligned lines, each side ranks the items it
   contains by position (1, 2, ...); an item a side does not contain gets rank ``len(U) + 1``.
   τ-b is taken between the two rank vectors; ``tau_norm = (τ_b + 1) / 2``;
   ``final = tau_norm × F1``. BEAM reports ``tau_norm`` for event ordering.

Edge rule (ours; the official code leaves it to scipy's NaN): an answer that aligns no gold
item scores ``tau_norm = 0`` and ``final = 0`` — the ranks carry no information.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

_MARKER = re.compile(r"^\s*(?:[-*•]|\(?\d+[.)]|\(?[a-zA-Z][.)])\s+")


def answer_lines(answer: str) -> list[str]:
    """The answer's non-blank lines, list markers stripped."""
    lines = (_MARKER.sub("", line).strip() for line in answer.splitlines())
    return [line for line in lines if line]


def align(lines: Sequence[str], gold: Sequence[str], same: Callable[[str, str], bool]) -> list[int]:
    """For each line, the index of the gold item it is aligned to, or -1."""
    taken: set[int] = set()
    out = []
    for line in lines:
        match = next((i for i, g in enumerate(gold) if i not in taken and same(line, g)), -1)
        if match >= 0:
            taken.add(match)
        out.append(match)
    return out


def rank_vectors(n_gold: int, alignment: Sequence[int]) -> tuple[list[int], list[int]]:
    """Gold and predicted ranks over the union of gold items and unaligned lines."""
    unaligned = sum(1 for a in alignment if a < 0)
    size = n_gold + unaligned
    missing = size + 1
    gold_rank = [i + 1 for i in range(n_gold)] + [missing] * unaligned
    pred_rank = [missing] * size
    extra = n_gold
    for position, a in enumerate(alignment, 1):
        if a >= 0:
            pred_rank[a] = position
        else:
            pred_rank[extra] = position
            extra += 1
    return gold_rank, pred_rank


def kendall_tau_b(x: Sequence[float], y: Sequence[float]) -> float:
    """Kendall's τ-b of two equally long sequences; NaN when either side is constant."""
    if len(x) != len(y):
        raise ValueError("kendall_tau_b needs two sequences of the same length")
    concordant = discordant = ties_x = ties_y = 0
    n = len(x)
    for i in range(n):
        for j in range(i + 1, n):
            dx, dy = x[i] - x[j], y[i] - y[j]
            if dx == 0 and dy == 0:
                ties_x += 1
                ties_y += 1
            elif dx == 0:
                ties_x += 1
            elif dy == 0:
                ties_y += 1
            elif (dx > 0) == (dy > 0):
                concordant += 1
            else:
                discordant += 1
    pairs = n * (n - 1) // 2
    denominator = math.sqrt((pairs - ties_x) * (pairs - ties_y))
    return (concordant - discordant) / denominator if denominator else math.nan


@dataclass(frozen=True)
class OrderingScore:
    precision: float
    recall: float
    f1: float
    tau_b: float | None  # None when no gold item was aligned
    tau_norm: float
    final: float
    alignment: list[int]


def ordering_scores(
    answer: str, gold: Sequence[str], same: Callable[[str, str], bool]
) -> OrderingScore:
    """The full protocol of the module docstring for one answer."""
    lines = answer_lines(answer)
    alignment = align(lines, gold, same)
    hits = sum(1 for a in alignment if a >= 0)
    precision = hits / len(lines) if lines else 0.0
    recall = hits / len(gold) if gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if hits else 0.0
    if not hits:
        return OrderingScore(precision, recall, f1, None, 0.0, 0.0, alignment)
    tau = kendall_tau_b(*rank_vectors(len(gold), alignment))
    tau_norm = (tau + 1) / 2
    return OrderingScore(precision, recall, f1, tau, tau_norm, tau_norm * f1, alignment)
