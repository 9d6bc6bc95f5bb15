"""Evidence coverage: the offline fitness that measures whether the evidence reached the context.

Owns :func:`evidence_coverage`, :class:`CoverageScorer`, :class:`ScoreInput`, :func:`ceiling`
and :data:`FITNESS_VERSION`: the retrieval fitness (:mod:`.fitness`) and the
embedding diagnostics beside it, ``evidence_similarity`` (mean over the evidence of the max
cosine of its content view to R's windows) and ``evidence_hit_rate`` (share at cosine ≥
:data:`HIT_THRESHOLD`), which read the same vectors and so cost nothing more.

Definition. Both texts are read as **token streams**: case-folded, every run of characters that
are not letters or digits (punctuation, markup, bullets, separators, whitespace) is one break,
so ``"[2024-03-01] - **User:** I moved."`` reads ``2024 03 01 user i moved``. An evidence
message's leading speaker label (``user:``) is dropped, so a program that omits it loses
nothing. For each evidence message e with m tokens, credit(e, R) ∈ [0, 1]:

1. **containment** — credit 1 when some window of m consecutive tokens of R holds at least
   ``ceil(NEAR_VERBATIM · m)`` of e's tokens (as multisets). Verbatim text is the case where it
   holds all m; a few words substituted, inserted or deleted keep it above the level.
2. otherwise **by piece** — e's tokens are cut into ``ceil(m / PIECE_TOKENS)`` consecutive
   pieces of near-equal length (one piece when m ≤ :data:`PIECE_TOKENS`), and credit(e) is the
   token-weighted mean of the pieces' credits, each piece scored by the same two rules: 1 when
   it is contained, else its **meaning** credit ``SEMANTIC_CAP · ramp(c)``, with c the max
   cosine (the scorer's embedder) between the piece and R's windows and ``ramp`` linear from 0
   at :data:`COS_FLOOR` to 1 at :data:`COS_FULL`, clipped. So a part of a long message earns
   about its share of it, wherever in the message it sits (``coverage-2`` embedded a long
   message whole: MiniLM reads only its first ~256 word pieces, so its first tenth earned 0.44
   and its last tenth 0.19; ``docs/performance.md``, "Piecewise credit"), and a short message
   is one piece: containment or meaning, as before. Meaning-only credit is always below a
   containment hit. Windows are cut per **line** of R (each line alone, in pieces of
   :data:`WINDOW_TOKENS` tokens at half-window strides from the line's start). Pieces and
   windows are embedded in their *content view*: the token stream without format tokens (any
   token with a digit, speaker and header words, month and weekday names,
   :data:`FORMAT_WORDS`), so date / role / id headers change no vector; a piece whose content
   view is empty earns only by containment.

Per question: the mean credit over its evidence messages that have tokens; none → ``None``.

Invariants (tests/test_coverage.py):

- format invariance: headers made of format tokens, bullets, separators (on their own lines or
  at line breaks) and the order of the units change no credit: containment reads the token
  stream, and every window depends on one line's content view only;
- monotone: for any texts A and B, ``credit(e, A + "\\n" + B) ≥ credit(e, A)`` and
  ``≥ credit(e, B)`` — B's tokens only add windows after A's, and lines of A are untouched;
- a meaning-only credit is ≤ SEMANTIC_CAP < 1 = a containment credit; the ceiling (gold
  evidence packed into the budget, shortest message first, the first that does not fit cut to
  what is left) scores 1 on every question whose evidence fits, so no context of the same
  budget beats it there.

Containment costs O(|R|) per evidence (a sliding multiset count, skipped when a substring test
or a token-count bound already decides); the embedder is called once per batch, on each
distinct content view and window once (the diagnostics need every evidence's cosine).
"""

from __future__ import annotations

import itertools
import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from evolve.datasets.types import Question
from evolve.models.embed import Embedder

FITNESS_VERSION = "coverage-3"  # bump whenever a credit can change for the same texts
METRICS = ("evidence_coverage", "evidence_contained", "evidence_similarity", "evidence_hit_rate")
HIT_THRESHOLD = 0.8  # cosine at which the hit rate counts an evidence message as retrieved
NEAR_VERBATIM = 0.9  # share of the evidence's tokens a window must hold for containment
# The meaning ramp, calibrated with MiniLM on BEAM-100K valid (docs/performance.md, "Calibrating
# the meaning credit"; bench/coverage.py --calibrate). Max cosine of an evidence message to the
# retrieved text of another conversation's question: mean 0.32, p99 0.57, max 0.61 — so the
# floor sits above all of it and unrelated text earns 0. Hand-written extraction-style
# paraphrases of 16 evidence messages: 0.71-0.92, mean 0.81 — so the ramp is full by 0.85 and
# they keep a mean 0.63 credit. Same-topic neighbours of an evidence message that did not reach
# the context (mean 0.62, p90 0.78) overlap the paraphrases; they keep a mean 0.11.
COS_FLOOR = 0.7  # cosine at which meaning-only credit starts
COS_FULL = 0.85  # cosine at which meaning-only credit reaches SEMANTIC_CAP
SEMANTIC_CAP = 0.9  # highest meaning-only credit (below a containment hit)
WINDOW_TOKENS = 128  # content tokens per window of a long line (MiniLM reads ~256 pieces)
PIECE_TOKENS = 128  # most tokens per scored piece of an evidence message (the windows' size)
BUDGET = 16000  # characters of retrieved text the environment allows (the ceiling's budget)

_TOKEN = re.compile(r"[^\W_]+")
_SPEAKER = re.compile(r"^\s*(?:user|assistant|system)\s*:\s*", re.IGNORECASE)
_DIGIT = re.compile(r"\d")
FORMAT_WORDS = frozenset(
    """user assistant system speaker role date time session id msg turn am pm
    january february march april may june july august september october november december
    jan feb mar apr jun jul aug sep sept oct nov dec
    monday tuesday wednesday thursday friday saturday sunday
    mon tue tues wed thu thur thurs fri sat sun""".split()
)


def tokens(text: str) -> list[str]:
    """The token stream: case-folded runs of letters and digits."""
    return _TOKEN.findall(text.casefold())


def content_view(toks: Sequence[str]) -> list[str]:
    """The tokens without format tokens (digits, speaker, header, month and weekday words)."""
    return [t for t in toks if t not in FORMAT_WORDS and not _DIGIT.search(t)]


def evidence_tokens(evidence: str) -> list[str]:
    """An evidence message's tokens, its leading speaker label dropped."""
    return tokens(_SPEAKER.sub("", evidence, count=1))


def pieces(ev: Sequence[str]) -> list[list[str]]:
    """``ev`` cut into ceil(len / PIECE_TOKENS) consecutive pieces of near-equal length."""
    k = max(math.ceil(len(ev) / PIECE_TOKENS), 1)
    bounds = [round(i * len(ev) / k) for i in range(k + 1)]
    return [list(ev[a:b]) for a, b in itertools.pairwise(bounds)]


def windows(retrieved: str) -> list[str]:
    """The content-view windows of a retrieved text: per line, pieces of WINDOW_TOKENS tokens
    at half-window strides from the line's start (each depends on its own line only)."""
    out: list[str] = []
    step = WINDOW_TOKENS // 2
    for line in retrieved.split("\n"):
        view = content_view(tokens(line))
        starts = range(0, max(len(view) - step, 1), step) if len(view) > WINDOW_TOKENS else [0]
        out.extend(" ".join(view[s : s + WINDOW_TOKENS]) for s in starts if view)
    return out


def contained(ev: Sequence[str], ctx: Sequence[str], ctx_counts: Counter[str]) -> bool:
    """Some window of len(ev) consecutive ctx tokens holds ≥ ceil(NEAR_VERBATIM·len(ev)) of
    ev's tokens (multiset overlap); a substring test and a count bound decide most cases."""
    m = len(ev)
    if f" {' '.join(ev)} " in f" {' '.join(ctx)} ":
        return True
    need = math.ceil(NEAR_VERBATIM * m)
    want = Counter(ev)
    if sum(min(n, ctx_counts[t]) for t, n in want.items()) < need:
        return False
    have: Counter[str] = Counter()
    overlap = 0
    for i, tok in enumerate(ctx):
        if have[tok] < want[tok]:
            overlap += 1
        have[tok] += 1
        if i >= m:
            old = ctx[i - m]
            have[old] -= 1
            if have[old] < want[old]:
                overlap -= 1
        if overlap >= need:
            return True
    return False


def semantic_credit(cosine: float) -> float:
    """Meaning-only credit: SEMANTIC_CAP · linear ramp from COS_FLOOR to COS_FULL, clipped."""
    ramp = (cosine - COS_FLOOR) / (COS_FULL - COS_FLOOR)
    return SEMANTIC_CAP * min(max(ramp, 0.0), 1.0)


def _max_cosine(vector: np.ndarray, windows: np.ndarray) -> float:
    """The max cosine of one unit vector to rows of unit vectors, computed row by row in float64
    (exact products, a fixed summation order): a matrix product's rounding depends on the
    matrix's shape, and adding a window must never lower another window's cosine."""
    if not len(windows):
        return 0.0
    return float((windows * vector.astype(np.float64)).sum(axis=1).max())


@dataclass(frozen=True)
class Piece:
    """One piece of an evidence message: its token count, whether it is contained, and the max
    cosine of its content view to the retrieved text's windows (0 when the view is empty)."""

    tokens: int
    contained: bool
    cosine: float

    def credit(self) -> float:
        return 1.0 if self.contained else semantic_credit(self.cosine)


@dataclass(frozen=True)
class Measured:
    """One pair: per evidence message that has tokens, whether it is contained whole, and its
    pieces (:func:`pieces`)."""

    contained: list[bool]
    pieces: list[list[Piece]]

    @property
    def cosines(self) -> list[float]:
        """Per evidence message, the token-weighted mean of its pieces' max cosines."""
        return [_weighted([(p.tokens, p.cosine) for p in ps]) for ps in self.pieces]

    def credits(self) -> list[float]:
        pairs = zip(self.contained, self.pieces, strict=True)
        return [1.0 if c else _weighted([(p.tokens, p.credit()) for p in ps]) for c, ps in pairs]


def _weighted(pairs: Sequence[tuple[int, float]]) -> float:
    total = sum(n for n, _ in pairs)
    return sum(n * x for n, x in pairs) / total


@dataclass(frozen=True)
class _Part:
    """A piece before embedding: its token count, containment and content view."""

    tokens: int
    contained: bool
    view: str


def _parts(ev: list[str], ctx: list[str], counts: Counter[str]) -> tuple[bool, list[_Part]]:
    """Whether ``ev`` is contained whole, and its pieces; containment is tested once for a
    message of one piece, and pieces of a message contained whole are contained."""
    cut = pieces(ev)
    whole = contained(ev, ctx, counts)
    flags = (
        [whole] * len(cut) if whole or len(cut) == 1 else [contained(p, ctx, counts) for p in cut]
    )
    return whole, [
        _Part(len(p), f, " ".join(content_view(p))) for p, f in zip(cut, flags, strict=True)
    ]


@dataclass(frozen=True)
class ScoreInput:
    """One question to score: its evidence texts (as ``Message.text()`` renders them) and the
    text the program retrieved for it."""

    question: Question
    evidence: Sequence[str]
    retrieved: str


class CoverageScorer:
    """Evidence coverage for batches of (evidence texts, retrieved text) pairs, with evidence
    similarity and hit rate from the same vectors (``hit_threshold``: the hit rate's cosine)."""

    def __init__(self, embedder: Embedder, hit_threshold: float = HIT_THRESHOLD) -> None:
        self.embedder = embedder
        self.hit_threshold = hit_threshold

    def measure(self, pairs: Sequence[tuple[Sequence[str], str]]) -> list[Measured]:
        """Containment per evidence message, and one embedding call for every content view and
        window involved (equal texts are embedded once, and cached across calls)."""
        rows: list[tuple[list[bool], list[list[_Part]], list[str]]] = []
        for evidence, retrieved in pairs:
            ctx = tokens(retrieved)
            counts = Counter(ctx)
            found = [_parts(ev, ctx, counts) for ev in map(evidence_tokens, evidence) if ev]
            whole, parts = [w for w, _ in found], [ps for _, ps in found]
            rows.append((whole, parts, windows(retrieved) if found else []))
        views = (p.view for _, parts, _ in rows for ps in parts for p in ps if p.view)
        texts = list(dict.fromkeys([*views, *(w for _, _, wins in rows for w in wins)]))
        index = {t: i for i, t in enumerate(texts)}
        vectors = self.embedder.embed(texts) if texts else np.zeros((0, 1), dtype=np.float32)
        out = []
        for whole, parts, wins in rows:
            win = vectors[[index[t] for t in wins]].astype(np.float64)
            measured = [
                [Piece(p.tokens, p.contained,
                       _max_cosine(vectors[index[p.view]], win) if p.view else 0.0) for p in ps]
                for ps in parts
            ]  # fmt: skip
            out.append(Measured(whole, measured))
        return out

    def credits(self, pairs: Sequence[tuple[Sequence[str], str]]) -> list[list[float]]:
        """Per pair, the credit of each evidence message that has tokens (in order)."""
        return [m.credits() for m in self.measure(pairs)]

    def coverage(self, pairs: Sequence[tuple[Sequence[str], str]]) -> list[dict[str, Any]]:
        """Per pair: ``evidence_coverage`` (mean credit), ``evidence_contained`` (share with a
        containment hit), ``evidence_similarity`` (mean max cosine), ``evidence_hit_rate``
        (share at cosine ≥ the hit threshold), each None without evidence, and
        ``fitness_version``."""
        return [self._summary(m) for m in self.measure(pairs)]

    def score(self, items: Sequence[ScoreInput]) -> list[dict[str, Any]]:
        """:meth:`coverage` for the offline scorer's inputs."""
        return self.coverage([(item.evidence, item.retrieved) for item in items])

    def _summary(self, m: Measured) -> dict[str, Any]:
        if not m.contained:
            return {**dict.fromkeys(METRICS), "fitness_version": FITNESS_VERSION}
        cosines = np.array(m.cosines)
        return {
            "evidence_coverage": float(np.mean(m.credits())),
            "evidence_contained": float(np.mean(m.contained)),
            "evidence_similarity": float(np.mean(cosines)),
            "evidence_hit_rate": float(np.mean(cosines >= self.hit_threshold)),
            "fitness_version": FITNESS_VERSION,
        }


def evidence_coverage(evidence: Sequence[str], retrieved: str, embedder: Embedder) -> float | None:
    """One question's coverage: mean credit over its evidence; None without evidence."""
    return CoverageScorer(embedder).coverage([(evidence, retrieved)])[0]["evidence_coverage"]


def pack_gold(evidence: Sequence[str], budget: int = BUDGET) -> str:
    """The gold evidence packed into ``budget`` characters, blank-line separated: whole messages,
    shortest first (credit is about proportional to the share of a message that is there, so
    that order covers the most), then the first message that no longer fits cut to what is
    left, at a space where there is one; the messages keep their evidence order."""
    order = sorted(range(len(evidence)), key=lambda i: len(evidence[i]))
    kept: dict[int, str] = {}
    used = 0
    for i in order:
        sep = 2 if kept else 0
        if used + sep + len(evidence[i]) <= budget:
            kept[i] = evidence[i]
            used += sep + len(evidence[i])
            continue
        cut = evidence[i][: max(budget - used - sep + 1, 0)]  # +1: a space just past the room
        space = cut.rfind(" ")
        if space > 0 and cut[:space].strip():
            kept[i] = cut[:space]
        break
    return "\n\n".join(kept[i] for i in sorted(kept))


@dataclass(frozen=True)
class Ceiling:
    """The scorer on the gold evidence packed into the budget: per question and the mean over
    the questions that have evidence (None when none has)."""

    per_question: list[float | None]
    mean: float | None
    budget: int
    fitness_version: str = FITNESS_VERSION


def ceiling(
    evidence: Sequence[Sequence[str]], scorer: CoverageScorer, budget: int = BUDGET
) -> Ceiling:
    """The ceiling of a split: each question's evidence texts packed by :func:`pack_gold`."""
    rows = scorer.coverage([(ev, pack_gold(ev, budget)) for ev in evidence])
    values = [r["evidence_coverage"] for r in rows]
    known = [v for v in values if v is not None]
    return Ceiling(values, float(np.mean(known)) if known else None, budget)
