"""Compact diagnostic cases (docs/design.md §4): long texts cut into spans, the most relevant kept.

Owns :data:`EXCERPT_CHARS`, :class:`Span`, :class:`Target` and five functions:
:func:`split_spans` (a text's spans), :func:`case_targets` (what a case's excerpts should
cover), :func:`excerpt` (one displayed excerpt), :func:`best_unit` (the memory unit that best
represents an evidence snippet) and :func:`compact_case` (a whole case, one embedding call).

Spans. A text is cut into *records* at lines that start one: a session header
(``## Session 3 (2024-03-15)``), a bracketed tag optionally followed by a role
(``[2024-03-15] user:``, ``[12] assistant:``, ``[2024-03-15]`` followed by text) or a bare role
(``user:``, ``assistant:``, ``system:``). A record longer than :data:`SPAN_CHARS` is cut at
blank lines (paragraphs), a paragraph still too long at line breaks, a line at sentence ends and
a sentence at spaces. A fenced code block (```` ``` ```` … ```` ``` ````) that fits in one
excerpt is never cut (a longer one is cut like text). A heading line (``#``…, session headers
included) is joined to the span that follows it. Headers travel with the spans they head: a
span shown after an omission is prefixed with its session header (when the span before it on
display is of another session) and its record's header (``[12] assistant:``, when the record's
first span is not the one just before it), so every displayed span says where it came from.

Selection. Each span is scored against weighted targets (:func:`case_targets`): question with
reference answer (weight 1), the evidence snippets (1 in total, shared equally) and the
prediction (0.5, when there is one); score = 0.75 × cosine + 0.25 × Dice overlap of stemmed
non-stopwords, floored at 0. The objective Σ_t w_t × max over chosen spans of score(span, t) is
grown greedily, one span at a time, until no span fits; a span's cost is the displayed
characters it adds (markers and repeated headers included). Two greedy runs are made, one
adding the span with the largest gain per added character, the other the span with the largest
absolute gain (ties within a run: the earlier span), and the run that reaches the higher
objective gives the excerpt (ties: the per-character run). This is the usual remedy for
budgeted coverage (Leskovec et al. 2007, "CELF"): per-character gain alone can fill the budget
with small spans and miss a long span that alone covers more; absolute gain alone spends the
budget on long spans. With additive costs the better run is within (1 - 1/e)/2 of the optimum;
here markers make costs depend slightly on the neighbours. How often each run wins on BEAM
cases is in docs/performance.md ("Compact cases: which greedy run wins").
Chosen spans are shown in source order, joined by the source's own whitespace when adjacent and
by an omission line ``...`` otherwise (also before the first and after the last span when text
is left out there).

Invariants: an excerpt never exceeds its budget (markers and headers counted); a text that fits
is returned unchanged; spans keep source order; the result is a function of the texts and the
embedding vectors only (ties broken by position), so it is deterministic.
"""

from __future__ import annotations

import re
from bisect import bisect_left, bisect_right, insort
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from evolve.models.embed import Embedder
from evolve.scoring.retrieval import content_words

EXCERPT_CHARS = 2_400  # most characters one displayed excerpt may take
SPAN_CHARS = 600  # a record, paragraph or line up to this long is one span
MIN_BUDGET = 500  # smallest budget an excerpt accepts
COSINE_WEIGHT = 0.75  # of a span's score; Dice overlap gets the rest
QA_WEIGHT = 1.0
EVIDENCE_WEIGHT = 1.0  # shared equally among the evidence snippets
PREDICTION_WEIGHT = 0.5
GAP, LEAD, TRAIL = "\n...\n", "...\n", "\n..."  # omission markers: between, before, after
HEADER_CHARS = 99  # a longer session or record header is not repeated
MAX_HEAD = 2 * (HEADER_CHARS + 1)  # most characters of repeated headers ahead of a span
SAME_SOURCE = "(same source text as evidence {n})"
SAME_UNIT = "(the evidence snippet itself)"  # shown for a unit whose text is its snippet's
_TEXT_FIELDS = ("question", "reference_answer", "query", "retrieved", "answer")

_FENCE = re.compile(r"^[ \t]*```[^\n]*\n.*?(?:^[ \t]*```[ \t]*$|\Z)", re.M | re.S)
_SESSION = re.compile(r"^#{1,6}[ \t]*session\b[^\n]{0,80}$", re.I | re.M)
_RECORD = re.compile(
    r"^(?:\[[^\]\n]{1,48}\](?:[ \t]+[\w.'-]{1,24}(?: [\w.'-]{1,24})?:|(?=\s))"
    r"|(?:user|assistant|system|human|ai)[ \t]*:)",
    re.I | re.M,
)
_HEADINGS = re.compile(r"#{1,6}[ \t]+\S[^\n]*(?:\s*\n#{1,6}[ \t]+\S[^\n]*)*")  # heading lines only
_CUTS = (
    re.compile(r"\n[ \t]*\n\s*"),  # paragraphs
    re.compile(r"\n\s*"),  # lines
    re.compile(r"(?<=[.!?])\s+|(?<=[.!?][\"')\]])\s+"),  # sentences
)


class Target(NamedTuple):
    """A text the excerpt should cover, and how much covering it is worth."""

    text: str
    weight: float


@dataclass(frozen=True)
class Span:
    """``text == source[start:end]``, a piece without surrounding whitespace.

    ``record`` numbers the record it belongs to and ``prefix`` is that record's header
    (``[12] assistant:``, or ``""``); ``heads`` is True when the span holds the record's first
    line. ``session`` is the session header line in force (``""`` when none) and
    ``session_start`` its offset (-1 when none).
    """

    start: int
    end: int
    text: str
    record: int
    prefix: str
    heads: bool
    session: str
    session_start: int


def _max_span(budget: int) -> int:
    if budget < MIN_BUDGET:
        raise ValueError(f"excerpt budget {budget} is below {MIN_BUDGET} characters")
    return budget - len(LEAD) - len(TRAIL) - MAX_HEAD


def _strip(text: str, s: int, e: int) -> tuple[int, int]:
    while s < e and text[s].isspace():
        s += 1
    while e > s and text[e - 1].isspace():
        e -= 1
    return s, e


def _inside(pos: int, fences: list[tuple[int, int]]) -> bool:
    """Whether ``pos`` lies strictly inside a fence (``fences``: sorted, disjoint)."""
    i = bisect_left(fences, (pos,)) - 1  # the last fence that starts before pos
    return i >= 0 and pos < fences[i][1]


def _within(s: int, e: int, fences: list[tuple[int, int]]) -> bool:
    """Whether ``[s, e)`` lies within one fence (``fences``: sorted, disjoint)."""
    i = bisect_right(fences, (s, float("inf"))) - 1  # the last fence that starts at or before s
    return i >= 0 and e <= fences[i][1]


def _hard_cut(text: str, s: int, e: int, size: int) -> list[tuple[int, int]]:
    """Pieces of at most ``size`` characters, cut at the last space of each window if any."""
    out = []
    while e - s > size:
        cut = text.rfind(" ", s + 1, s + size + 1)
        cut = cut if cut > s else s + size
        out.append(_strip(text, s, cut))
        s = _strip(text, cut, e)[0]
    return [*out, (s, e)]


def _pieces(
    text: str, s: int, e: int, fences: list[tuple[int, int]], size: int, most: int, level: int = 0
) -> list[tuple[int, int]]:
    """``text[s:e]`` cut at the coarsest level that brings pieces to ``size`` characters."""
    s, e = _strip(text, s, e)
    if s >= e:
        return []
    fenced = _within(s, e, fences)  # the piece is (part of) a code block
    if e - s <= size or (fenced and e - s <= most):
        return [(s, e)]
    if level == len(_CUTS):
        return _hard_cut(text, s, e, size)
    out: list[tuple[int, int]] = []
    for m in _CUTS[level].finditer(text, s, e):
        if not _inside(m.start(), fences):
            out.extend(_pieces(text, s, m.start(), fences, size, most, level + 1))
            s = m.end()
    return out + _pieces(text, s, e, fences, size, most, level + 1)


def _short(header: str) -> str:
    header = header.strip()
    return header if len(header) <= HEADER_CHARS else ""


def split_spans(text: str, budget: int = EXCERPT_CHARS) -> list[Span]:
    """The spans of ``text`` for excerpts of ``budget`` characters, in source order."""
    most = _max_span(budget)
    fences = [m.span() for m in _FENCE.finditer(text) if m.end() - m.start() <= most]
    marks = [m.start() for r in (_SESSION, _RECORD) for m in r.finditer(text)]
    starts = sorted({0} | {p for p in marks if not _inside(p, fences)})
    raw: list[Span] = []
    session, session_start = "", -1
    for k, rs in enumerate(starts):
        re_ = starts[k + 1] if k + 1 < len(starts) else len(text)
        header = _SESSION.match(text, rs)
        if header:
            session, session_start = _short(header.group(0)), rs
        role = _RECORD.match(text, rs)
        prefix = _short(role.group(0)) if role else ""
        first = _strip(text, rs, re_)[0]
        for s, e in _pieces(text, rs, re_, fences, min(SPAN_CHARS, most), most):
            raw.append(Span(s, e, text[s:e], k, prefix, s == first, session, session_start))
    return _join_headings(text, raw, most)


def _join_headings(text: str, spans: list[Span], most: int) -> list[Span]:
    """Spans with each run of heading lines joined to the span after it (same record, or the
    session's first record after a session header) when the two fit in ``most`` characters."""
    out: list[Span] = []
    held: Span | None = None  # heading lines waiting for the span they head
    for span in spans:
        if (
            held is not None
            and span.end - held.start <= most
            and (span.record == held.record or held.session_start == held.start)
        ):
            heads = span.heads or (held.heads and held.record == span.record)
            span = Span(held.start, span.end, text[held.start : span.end], span.record,
                        span.prefix, heads, span.session, span.session_start)  # fmt: skip
        elif held is not None:
            out.append(held)
        held = span if _HEADINGS.fullmatch(span.text) else None
        if held is None:
            out.append(span)
    return out if held is None else [*out, held]


def _dice(a: set[str], b: set[str]) -> float:
    return 2 * len(a & b) / (len(a) + len(b)) if a or b else 0.0


class _Embedded:
    """Vectors (one embedding call) and content words for a fixed set of texts."""

    def __init__(self, embedder: Embedder, texts: Sequence[str]) -> None:
        unique = list(dict.fromkeys(texts))
        self._row = {t: i for i, t in enumerate(unique)}
        self._vecs = embedder.embed(unique)
        self._words: dict[str, set[str]] = {}

    def words(self, text: str) -> set[str]:
        if text not in self._words:
            self._words[text] = content_words(text)
        return self._words[text]

    def scores(self, rows: Sequence[str], cols: Sequence[str]) -> np.ndarray:
        """``(len(rows), len(cols))``: 0.75 × cosine + 0.25 × Dice, floored at 0."""
        if not rows or not cols:
            return np.zeros((len(rows), len(cols)))
        cos = self._vecs[[self._row[r] for r in rows]] @ self._vecs[[self._row[c] for c in cols]].T
        dice = np.array([[_dice(self.words(r), self.words(c)) for c in cols] for r in rows])
        return np.maximum(COSINE_WEIGHT * cos + (1 - COSINE_WEIGHT) * dice, 0.0)


def _head(spans: list[Span], i: int, before: int | None) -> str:
    """What is shown ahead of span ``i`` when it follows an omission after span ``before``."""
    s, p = spans[i], None if before is None else spans[before]
    out = ""
    owns_session = s.start <= s.session_start < s.end
    if s.session and not owns_session and (p is None or p.session_start != s.session_start):
        out += s.session + "\n"
    if s.prefix and not s.heads and (p is None or p.record != s.record):
        out += s.prefix + " "
    return out


def _join(text: str, spans: list[Span], p: int, s: int) -> str:
    return text[spans[p].end : spans[s].start] if s == p + 1 else GAP + _head(spans, s, p)


def _render(text: str, spans: list[Span], chosen: list[int]) -> str:
    if not chosen:
        return ""
    first, last = chosen[0], chosen[-1]
    parts = [(LEAD if first > 0 else "") + _head(spans, first, None), spans[first].text]
    for p, s in zip(chosen, chosen[1:], strict=False):
        parts += [_join(text, spans, p, s), spans[s].text]
    parts.append(TRAIL if last < len(spans) - 1 else "")
    return "".join(parts)


def _added(text: str, spans: list[Span], chosen: list[int], i: int) -> int:
    """Characters that showing span ``i`` too adds to the rendering of ``chosen``."""
    at = bisect_left(chosen, i)
    p = chosen[at - 1] if at > 0 else None
    n = chosen[at] if at < len(chosen) else None
    lead = len(LEAD) if i > 0 else 0
    trail = len(TRAIL) if i < len(spans) - 1 else 0
    left = lead + len(_head(spans, i, None)) if p is None else len(_join(text, spans, p, i))
    right = trail if n is None else len(_join(text, spans, i, n))
    if p is not None and n is not None:
        old = len(_join(text, spans, p, n))
    elif p is not None:
        old = len(TRAIL) if p < len(spans) - 1 else 0
    elif n is not None:
        old = (len(LEAD) if n > 0 else 0) + len(_head(spans, n, None))
    else:
        old = 0
    return left + len(spans[i].text) + right - old


def _greedy(
    text: str,
    spans: list[Span],
    score: np.ndarray,
    weights: np.ndarray,
    budget: int,
    per_char: bool,
) -> tuple[float, list[int]]:
    """Spans added by largest gain (per added character when ``per_char``; ties: the earlier
    span) until none fits in ``budget``; returns the objective reached and the spans' indices.

    A span's added characters depend only on its chosen neighbours, so after each pick only
    the spans between the pick's own neighbours are re-measured (linear, not quadratic, in
    the number of spans per pick)."""
    n = len(spans)
    cover = np.zeros(score.shape[1])
    costs = np.array([_added(text, spans, [], i) for i in range(n)], dtype=np.float64)
    free = np.ones(n, dtype=bool)
    chosen: list[int] = []
    used = 0
    while True:
        gains = np.maximum(score - cover, 0.0) @ weights
        keys = gains / np.maximum(costs, 1.0) if per_char else gains
        fits = free & (used + costs <= budget)
        if not fits.any():
            return float(cover @ weights), chosen
        best = int(np.flatnonzero(fits)[np.argmax(keys[fits])])  # the first of equal keys
        at = bisect_left(chosen, best)
        lo = chosen[at - 1] + 1 if at > 0 else 0
        hi = chosen[at] if at < len(chosen) else n
        insort(chosen, best)
        used += int(costs[best])
        free[best] = False
        cover = np.maximum(cover, score[best])
        for i in range(lo, hi):
            if free[i]:
                costs[i] = _added(text, spans, chosen, i)


def _select(
    text: str, spans: list[Span], targets: Sequence[Target], table: _Embedded, budget: int
) -> str:
    """The better of per-character and absolute greedy coverage of ``targets`` by spans."""
    score = table.scores([s.text for s in spans], [t.text for t in targets])
    weights = np.array([t.weight for t in targets], dtype=np.float64)
    runs = [_greedy(text, spans, score, weights, budget, per_char) for per_char in (True, False)]
    out = _render(text, spans, max(runs, key=lambda run: run[0])[1])  # ties: per character
    assert len(out) <= budget, (len(out), budget)
    return out


def excerpt(
    text: str, targets: Sequence[Target], embedder: Embedder, budget: int = EXCERPT_CHARS
) -> str:
    """``text`` itself when it fits in ``budget``, else its spans that best cover ``targets``."""
    if len(text) <= budget:
        return text
    spans = split_spans(text, budget)
    table = _Embedded(embedder, [s.text for s in spans] + [t.text for t in targets])
    return _select(text, spans, targets, table, budget)


def _best(table: _Embedded, snippet: str, units: Sequence[str]) -> tuple[int, np.ndarray]:
    scores = table.scores(list(units), [snippet])[:, 0]
    return int(np.argmax(scores)), scores  # argmax: the first of equal scores


def best_unit(snippet: str, units: Sequence[str], embedder: Embedder) -> int:
    """Index of the unit that scores highest for ``snippet`` (the first one on ties)."""
    if not units:
        raise ValueError("best_unit needs at least one unit")
    return _best(_Embedded(embedder, [snippet, *units]), snippet, units)[0]


def case_targets(case: dict[str, Any]) -> list[Target]:
    """The weighted targets of a case: question + reference answer, evidence, prediction."""
    qa = "\n".join(t for t in (case.get("question"), case.get("reference_answer")) if t)
    out = [Target(qa, QA_WEIGHT)] if qa else []
    evidence = [e for e in case.get("evidence") or [] if e]
    out += [Target(e, EVIDENCE_WEIGHT / len(evidence)) for e in evidence]
    if isinstance(case.get("answer"), str) and case["answer"]:
        out.append(Target(case["answer"], PREDICTION_WEIGHT))
    return out


def _units(
    evidence: list[str], units: list[list[str]], view: Callable[[int, int], str], table: _Embedded
) -> list[list[int]]:
    """Indices of the units shown per snippet: every snippet's best unit, then other units,
    best-scoring for their snippet first, while the whole view fits in one excerpt budget."""
    keep: list[set[int]] = [set() for _ in units]
    extras: list[tuple[float, int, int]] = []
    shown: set[str] = set()
    used = 0
    for i, (snippet, candidates) in enumerate(zip(evidence, units, strict=True)):
        if candidates:
            best, scores = _best(table, snippet, candidates)
            keep[i].add(best)
            shown.add(candidates[best])
            used += len(view(i, best))
            extras += [(-float(scores[j]), i, j) for j in range(len(candidates)) if j != best]
    for _, i, j in sorted(extras):
        if units[i][j] not in shown and used + len(view(i, j)) <= EXCERPT_CHARS:
            keep[i].add(j)
            shown.add(units[i][j])
            used += len(view(i, j))
    return [sorted(k) for k in keep]


def compact_case(case: dict[str, Any], embedder: Embedder) -> dict[str, Any]:
    """The case with every text longer than :data:`EXCERPT_CHARS` excerpted.

    Reads the case shape of :mod:`evolve.evolution.cases` with full (uncut) texts, plus the
    optional ``evidence_source`` (one source text per evidence snippet) and
    ``units_for_evidence`` (per snippet, the memory units that represent it). Returns a new
    dict: the string fields question, reference answer, query, retrieved text and predicted
    answer, each evidence snippet and each source text excerpted (a source text equal to an
    earlier one becomes :data:`SAME_SOURCE`). ``units_for_evidence`` holds, per snippet and in
    their given order, its best unit (:func:`best_unit`, always, even past the budget) and such
    other units as fit: ranked by score for their own snippet across the case, each is added
    while all the units shown fit in one excerpt budget, and a unit already shown is not shown
    again (a best unit is, under each snippet it is best for); a unit whose text is its snippet's
    shows as :data:`SAME_UNIT`. ``units_shown`` holds the indices of the units shown. Embeds
    once, in one batch.
    """
    targets = case_targets(case)
    evidence = [str(e) for e in case.get("evidence") or []]
    sources = [str(s) for s in case.get("evidence_source") or []]
    units = [[str(u) for u in us] for us in case.get("units_for_evidence") or []]
    if "units_for_evidence" in case and len(units) != len(evidence):
        raise ValueError(f"{len(units)} unit lists for {len(evidence)} evidence snippets")
    fields = [case[k] for k in _TEXT_FIELDS if isinstance(case.get(k), str)]
    flat_units = [u for us in units for u in us]
    texts = dict.fromkeys([*fields, *evidence, *sources, *flat_units])
    long = {t: split_spans(t) for t in texts if len(t) > EXCERPT_CHARS}
    span_texts = [s.text for spans in long.values() for s in spans]
    table = _Embedded(embedder, [*(t.text for t in targets), *evidence, *flat_units, *span_texts])
    views: dict[str, str] = {}

    def show(text: str) -> str:
        if text not in views:
            spans = long.get(text)
            views[text] = _select(text, spans, targets, table, EXCERPT_CHARS) if spans else text
        return views[text]

    out = dict(case)
    out.update({k: show(case[k]) for k in _TEXT_FIELDS if isinstance(case.get(k), str)})
    if "evidence" in case:
        out["evidence"] = [show(e) for e in evidence]
    if "evidence_source" in case:
        first = {s: i for i, s in reversed(list(enumerate(sources)))}
        out["evidence_source"] = [
            show(s) if first[s] == i else SAME_SOURCE.format(n=first[s] + 1)
            for i, s in enumerate(sources)
        ]
    if "units_for_evidence" in case:

        def view(i: int, j: int) -> str:
            return SAME_UNIT if units[i][j] == evidence[i] else show(units[i][j])

        out["units_shown"] = _units(evidence, units, view, table)
        out["units_for_evidence"] = [
            [view(i, j) for j in kept] for i, kept in enumerate(out["units_shown"])
        ]
    return out
