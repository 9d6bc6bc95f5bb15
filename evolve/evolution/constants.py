"""Constant proposer: evolve a program's tunable constants without an LLM (docs/design.md §4).

Owns :func:`tunables` (find a program's module-level numeric and boolean constants and their
ranges), the source edits every constant-search strategy shares (:func:`live_names`, :func:`patch`,
:func:`describe`, :func:`round3`) and :class:`ConstantProposer`, the ``--offline-search random``
strategy (an ablation): it mutates the constants as source patches, steered by the weakest
capability, and crosses two programs over by their constants. The default strategy, TPE over
the same tunables, is :mod:`evolve.evolution.tpe`.

A tunable is a top-level ``NAME = <literal>`` (or ``NAME: T = <literal>``) assigned once, NAME all
caps and not in :data:`EXCLUDED`, the literal an int, float (finite) or bool on one line; ``-5``
counts. Its range is declared by ``(range a-b)`` (also ``a..b``, ``a to b``; negative and decimal
bounds allowed) or ``(bool)`` in that line's comment, otherwise inferred, never flipping a sign
(a negative constant gets the mirror image of the rule for ``|v|``):

- bool: flips; int ``v >= 0``: ``[v // 2, 2v + 10]``;
- float in ``[0, 1]``: ``[0, 1]``; other float ``v > 1``: ``[0, 2v + 1]`` (3 significant digits).

``(format)`` in the comment marks a choice of presentation the offline fitness cannot judge:
evidence coverage reads the evidence's words, not the dates a reader needs, so dropping the
date prefixes only frees budget (a run's best step did exactly that). Constant search never
moves such a tunable (:func:`searchable`, the one list both strategies and crossover move);
with a task model and a judge the answers decide, and a coder may change it.

Index moves. A tunable that extraction or indexing reads (:func:`rebuild_names`: its change
alters a :data:`REBUILD` fingerprint, e.g. the hybrid seed's chunk sizes) makes a child whose
evaluation builds every conversation's memory again, while any other move reuses the parent's
stored index. A proposer built with ``index_moves=False`` (a run's default,
``RunConfig.index_moves``) never moves one; its children differ from their parent only in
planning, retrieval or answer.

Guidance (:data:`GUIDANCE`): capability -> name keywords (substring match) and the preferred
direction (+1 up / True, -1 down / False). With probability :data:`GUIDED_PROBABILITY` a move
goes to a guided tunable in its preferred direction (one already at its bound is skipped);
otherwise, or when none can move, a random tunable moves either way. One or two tunables move
per proposal: a bool flips; an int is multiplied or divided by a factor in [1.25, 2] (by +-1
when its range spans at most :data:`SMALL_INT_SPAN`); a float moves by a gaussian 15-30 % of
its range, rounded to 3 significant digits; each result is clamped and differs from the old.

Invariants:
- Deterministic: a proposal depends only on (seed, source, target, round_no, child), a crossover
  on (seed, a, b, round_no, child) (``child``: the request's child index; 0 seeds as before);
  randomness is ``random.Random`` seeded by a string, so it is the same in every process.
- A patch replaces exactly the literals' text; comments and layout are untouched. Every result
  parses, differs from its parent (a mutated value stays within its range and type; a crossed
  value is the other parent's) and changes at least one component fingerprint
  (:func:`sandbox.fingerprint.changed_components` is non-empty): a constant that no component
  uses is never moved (which constants are used is cached per source).
"""

from __future__ import annotations

import ast
import functools
import hashlib
import io
import math
import random
import re
import tokenize
from collections import Counter
from dataclasses import dataclass, replace
from typing import Any

from contract.parsing import parse
from evolve.datasets.types import CAPABILITIES
from evolve.evolution.proposer import Proposal, Request
from sandbox.fingerprint import fingerprints

Value = int | float | bool

ATTEMPTS = 5  # mutation seeds tried per round before accepting a child the run already holds
EXCLUDED = frozenset({"OUT_CHAR_BUDGET"})  # fixed by the environment, not a choice
# Components whose outputs every later step is built on: a child that changes one is encoded
# again in full (docs/performance.md, "The default run": 103-216 s a child, against 2-18 s)
REBUILD = frozenset({"extract", "index"})
GUIDED_PROBABILITY = 0.7
SMALL_INT_SPAN = 10  # ints whose range is at most this wide move by +-1
# Measured, not guessed (docs/performance.md, "One move from the hybrid seed" and "A length
# cost that reads the budget"; bench/space.py --moves): on BEAM-100K train, from the seed, the
# role weights gain on every capability (USER_WEIGHT 1.0 -> 1.25: +7.2 pp, ASSISTANT_WEIGHT
# 0.9 -> 0.7: +8.2 pp; F least, +0.9 pp), and a length cost in packing gains most on T, P and
# M: BUDGET_COST 0 -> 2 (+10.4 pp: T +9.6, P +26.7, M +7.7, A +1.1, F -6.0) as much as
# LENGTH_PENALTY 0 -> 0.25 (+10.5 pp). BUDGET_COST is the one guided: its cost is the share of
# the budget a hit takes, so it reorders nothing among short chat turns, where the log penalty
# over a large pool of hits packs the shortest turns first (docs/performance.md, "Length orders
# packing, not relevance"); LENGTH_PENALTY stays searchable by random moves. With the cost on,
# a larger pool of hits gains (TOP_K 80 -> 290 at BUDGET_COST 2: +3.3 pp; T +7.1, P +3.7,
# M +2.3) where from the seed it moves nothing; RARE_TERMS 0 -> 4 is +8.6 pp on P. The old
# guesses (more neighbours, more diversity, a higher floor, a heavier lexical weight, smaller
# chunks) gained nothing or lost 0.6-12.9 pp.
GUIDANCE: dict[str, tuple[tuple[str, int], ...]] = {
    "F": (("USER_WEIGHT", 1), ("ASSISTANT_WEIGHT", -1)),  # nothing gains F more
    "T": (("BUDGET_COST", 1), ("TOP_K", 1), ("ASSISTANT_WEIGHT", -1), ("USER_WEIGHT", 1)),
    "P": (
        ("BUDGET_COST", 1),
        ("TOP_K", 1),
        ("USER_WEIGHT", 1),
        ("ASSISTANT_WEIGHT", -1),
        ("RARE_TERMS", 1),
    ),  # the user's words, and many short ones
    "M": (("BUDGET_COST", 1), ("TOP_K", 1), ("USER_WEIGHT", 1), ("ASSISTANT_WEIGHT", -1)),
    "A": (("USER_WEIGHT", 1), ("ASSISTANT_WEIGHT", -1), ("BUDGET_COST", 1)),
}

_NAME = re.compile(r"[A-Z][A-Z0-9_]*\Z")
_NUMBER = r"-?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"
_RANGE = re.compile(rf"\(range\s+({_NUMBER})\s*(?:\.\.|-|to)\s*({_NUMBER})\s*\)", re.IGNORECASE)
_BOOL = re.compile(r"\(bool\)", re.IGNORECASE)
_FORMAT = re.compile(r"\(format\)", re.IGNORECASE)
_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z")


@dataclass(frozen=True)
class Tunable:
    """One mutable constant: its value, range and the literal's exact position."""

    name: str
    value: Value
    low: float | None  # None for bools
    high: float | None
    kind: str  # "int" | "float" | "bool"
    declared: bool  # the range (or "(bool)") came from the line's comment
    line: int  # 1-based line of the literal
    col: int  # 0-based character columns of the literal's text on that line
    end_col: int
    format: bool = False  # "(format)" in its comment: constant search never moves it


def tunables(source: str) -> list[Tunable]:
    """Every tunable constant of ``source`` in source order. Raises SyntaxError if unparsable."""
    tree = parse(source)
    lines = _LINE.findall(source)
    comments = _comments(source)
    bound = Counter(name for stmt in tree.body for name in _bound(stmt))
    found = []
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
            target, node = stmt.targets[0], stmt.value
        elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
            target, node = stmt.target, stmt.value
        else:
            continue
        if not isinstance(target, ast.Name) or target.id in EXCLUDED or bound[target.id] > 1:
            continue
        value = _literal(node)
        if not _NAME.match(target.id) or value is None or node.end_lineno != node.lineno:
            continue
        raw = lines[node.lineno - 1].encode()  # ast columns are UTF-8 byte offsets
        col, end_col = (len(raw[:c].decode()) for c in (node.col_offset, node.end_col_offset))
        kind = type(value).__name__
        low, high, declared = _range(kind, value, comments.get(node.lineno, ""))
        position = (node.lineno, col, end_col)
        comment = comments.get(node.lineno, "")
        found.append(Tunable(target.id, value, low, high, kind, declared, *position,
                             format=bool(_FORMAT.search(comment))))  # fmt: skip
    return found


def searchable(source: str, index_moves: bool = True) -> list[Tunable]:
    """The tunables constant search may move: live (:func:`live_names`), not ``(format)`` and,
    unless ``index_moves``, none that :func:`rebuild_names` lists."""
    live = live_names(source) - (frozenset() if index_moves else rebuild_names(source))
    return [t for t in tunables(source) if t.name in live and not t.format]


class ConstantProposer:
    """Seeded mutation and crossover of tunable constants; see the module docstring.

    As a :class:`~evolve.evolution.proposer.Proposer`: integration crosses the parent with each
    specialist in the request's order and takes the first child the run does not hold;
    otherwise, or when no crossover gives a new child, it mutates the parent, trying up to
    :data:`ATTEMPTS` seeds for a new child before accepting a known one. It cannot repair.
    """

    name = "random"
    builds_cases = False  # reads constants and scores, never cases

    def __init__(self, seed: int = 0, index_moves: bool = True) -> None:
        self.seed = seed
        self.index_moves = index_moves  # may move the tunables extraction or indexing read

    def propose(self, request: Request) -> Proposal:
        parent = request.parent

        def new(child: Proposal) -> bool:
            assert child.source is not None
            return hashlib.sha256(child.source.encode()).hexdigest() not in request.known

        others = request.specialists if request.stage == "integration" else ()
        for other in others:  # this round's partner first
            try:
                child = self.crossover(parent.source, other.source, request.round_no,
                                       request.child)  # fmt: skip
            except ValueError:
                continue
            if new(child):
                return replace(child, parents=(parent.id, other.id))
        try:
            for attempt in range(ATTEMPTS):
                round_no = request.round_no + 1000 * attempt
                child = self.mutate(parent.source, request.target, round_no, request.child)
                if new(child):
                    break
        except ValueError as exc:
            return Proposal(None, "random: nothing to mutate", (parent.id,), error=str(exc))
        return replace(child, parents=(parent.id,))

    def repair(self, request: Request, failed: Proposal, error: str) -> Proposal | None:
        return None

    def mutate(self, source: str, target: str | None, round_no: int, child: int = 0) -> Proposal:
        """Move one or two tunables of ``source``, preferring moves that help ``target``."""
        if target is not None and target not in CAPABILITIES:
            raise ValueError(f"unknown capability {target!r}; expected one of {CAPABILITIES}")
        found = searchable(source, self.index_moves)
        rng = random.Random(f"{self.seed}:{round_no}:{target}" + _child_key(child))
        edits: dict[Tunable, Value] = {}
        for _ in range(rng.choice((1, 2))):
            options = [t for t in found if t not in edits]
            guided = [
                (t, direction)
                for keyword, direction in GUIDANCE.get(target or "", ())
                for t in options
                if keyword in t.name
            ]
            move = _pick(options, guided, rng)
            if move is None:
                break
            edits[move[0]] = move[1]
        if not edits:
            raise ValueError("no tunable constant can change")
        changes = {t.name: (t.value, new) for t, new in edits.items()}
        suffix = f" (target {target})" if target else ""
        message = f"random: {describe(changes)}{suffix}"
        return Proposal(patch(source, edits), message, (), changes=changes)

    def crossover(self, a: str, b: str, round_no: int, child: int = 0) -> Proposal:
        """``a`` with some of its differing tunables set to ``b``'s values (``a``'s code kept).

        Each differing constant comes from either parent; at least one comes from ``b`` and,
        when two or more differ, at least one from ``a``, so the child equals neither."""
        in_b = {t.name: t for t in tunables(b)}
        differing = [
            t
            for t in searchable(a, self.index_moves)
            if t.name in in_b and (t.kind, t.value) != (in_b[t.name].kind, in_b[t.name].value)
        ]
        if not differing:
            raise ValueError("the programs share no differing tunable constant")
        rng = random.Random(f"{self.seed}:{round_no}:crossover" + _child_key(child))
        from_b = [t for t in differing if rng.random() < 0.5] or [rng.choice(differing)]
        if len(from_b) == len(differing) > 1:
            from_b.remove(rng.choice(from_b))
        edits: dict[Tunable, Value] = {t: in_b[t.name].value for t in from_b}
        changes = {t.name: (t.value, new) for t, new in edits.items()}
        message = f"constant crossover: from b {describe(changes)}"
        return Proposal(patch(a, edits), message, (), changes=changes)


def _child_key(child: int) -> str:
    """What a child index adds to a seed string (nothing for child 0: one child per round
    proposes what it always did)."""
    return f":child{child}" if child else ""


def _pick(
    options: list[Tunable],
    guided: list[tuple[Tunable, int]],
    rng: random.Random,
) -> tuple[Tunable, Value] | None:
    """A guided move with probability GUIDED_PROBABILITY, else (or failing that) a random one."""
    tries: list[tuple[Tunable, int]] = []
    if guided and rng.random() < GUIDED_PROBABILITY:
        tries += rng.sample(guided, len(guided))
    for t in rng.sample(options, len(options)):
        first = (-1 if t.value else 1) if t.kind == "bool" else rng.choice((1, -1))
        tries += [(t, first), (t, -first)]
    for t, direction in tries:
        new = _step(t, direction, rng)
        if new is not None:
            return t, new
    return None


def _step(t: Tunable, direction: int, rng: random.Random) -> Value | None:
    """``t``'s value moved one step in ``direction`` within its range; None if it cannot move."""
    if t.kind == "bool":
        return None if bool(t.value) == (direction > 0) else direction > 0
    assert t.low is not None and t.high is not None
    v = t.value
    new: Value
    if t.kind == "int":
        low, high = math.ceil(t.low), math.floor(t.high)
        if low > high:
            return None
        if high - low <= SMALL_INT_SPAN or v == 0:
            new = v + direction
        else:
            factor = rng.uniform(1.25, 2.0)
            new = round(v * factor if (direction > 0) == (v > 0) else v / factor)
            new = new if new != v else v + direction
        new = min(max(new, low), high)
    else:
        fraction = min(max(abs(rng.gauss(0.225, 0.05)), 0.15), 0.30)
        new = min(max(round3(v + direction * fraction * (t.high - t.low)), t.low), t.high)
    return new if (new - v) * direction > 0 else None


def live_names(source: str) -> frozenset[str]:
    """Tunables whose change alters some component fingerprint; the rest no component uses."""
    return frozenset(_moved(source))


def rebuild_names(source: str) -> frozenset[str]:
    """Live tunables that :data:`REBUILD` components read: a child that moves one builds every
    conversation's index again (its parent's stored index cannot be reused)."""
    return frozenset(n for n, moved in _moved(source).items() if moved & REBUILD)


@functools.lru_cache(maxsize=128)
def _moved(source: str) -> dict[str, frozenset[str]]:
    """Each live tunable -> the components whose fingerprint its change alters."""
    base = fingerprints(source)
    out = {}
    for t in tunables(source):
        after = fingerprints(patch(source, {t: not t.value if t.kind == "bool" else t.value + 1}))
        moved = frozenset(c for c, fp in after.items() if fp != base[c])
        if moved:
            out[t.name] = moved
    return out


def patch(source: str, edits: dict[Tunable, Value]) -> str:
    lines = _LINE.findall(source)
    for t, new in sorted(edits.items(), key=lambda e: (e[0].line, e[0].col), reverse=True):
        text = lines[t.line - 1]
        lines[t.line - 1] = text[: t.col] + _render(new) + text[t.end_col :]
    return "".join(lines)


def _render(value: Value) -> str:
    return repr(value)  # True/False; ints plainly; floats by the shortest round-tripping repr


def round3(x: float) -> float:
    return float(f"{x:.3g}")


def describe(changes: dict[str, tuple[Any, Any]]) -> str:
    return ", ".join(f"{n} {_render(old)} -> {_render(new)}" for n, (old, new) in changes.items())


def _range(kind: str, value: Value, comment: str) -> tuple[float | None, float | None, bool]:
    if kind == "bool":
        return None, None, bool(_BOOL.search(comment))
    if match := _RANGE.search(comment):
        low, high = sorted((float(match[1]), float(match[2])))
        return low, high, True
    size = abs(value)
    if kind == "int":
        low, high = float(size // 2), float(2 * size + 10)
    else:
        low, high = 0.0, (1.0 if size <= 1 else round3(2 * size + 1))
    return (low, high, False) if value >= 0 else (0.0 - high, 0.0 - low, False)  # never -0.0


def _literal(node: ast.expr) -> Value | None:
    negative = isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub)
    operand = node.operand if isinstance(node, ast.UnaryOp) and negative else node
    if not isinstance(operand, ast.Constant):
        return None
    value = operand.value
    if isinstance(value, bool):
        return None if negative else value
    if not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return -value if negative else value


def _bound(stmt: ast.stmt) -> list[str]:
    if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return [stmt.name]
    if isinstance(stmt, ast.Assign | ast.AnnAssign | ast.AugAssign):
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
        return [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
    return []


def _comments(source: str) -> dict[int, str]:
    """Line number -> the comment on that line."""
    tokens = tokenize.generate_tokens(io.StringIO(source, newline="").readline)
    return {tok.start[0]: tok.string for tok in tokens if tok.type == tokenize.COMMENT}
