"""evolve/evolution/constants.py: tunable discovery, seeded guided mutation and crossover."""

from __future__ import annotations

import ast
import io
import tokenize
from collections import Counter
from pathlib import Path

import pytest
from conftest import minimal

from evolve.evolution.constants import GUIDANCE, ConstantProposer, Tunable, searchable, tunables
from sandbox.fingerprint import changed_components
from sandbox.static import check_source

SEEDS = Path(__file__).resolve().parents[1] / "seeds"
HYBRID = (SEEDS / "hybrid.py").read_text()
DENSE = (SEEDS / "dense.py").read_text()
HYBRID_NAMES = [
    "DENSE_WEIGHT", "LEXICAL_WEIGHT", "USER_WEIGHT", "ASSISTANT_WEIGHT", "TOP_K", "MIN_SCORE",
    "MMR_LAMBDA", "NEIGHBOURS", "CHUNK_CHARS", "DATE_PREFIX", "RETURN_CHUNK", "CHUNK_CONTEXT",
    "CHRONOLOGICAL", "SESSION_CAP", "CHUNK_OVERLAP", "RARE_TERMS", "RECENCY_WEIGHT",
    "RELATIVE_FLOOR", "SHORT_CHARS", "LENGTH_PENALTY", "BUDGET_COST",
]  # fmt: skip
# Every constant strictly inside its range, so each guided direction is open.
HYBRID_MID = (
    HYBRID.replace("MMR_LAMBDA = 1.0", "MMR_LAMBDA = 0.6")
    .replace("NEIGHBOURS = 0", "NEIGHBOURS = 1")
    .replace("DATE_PREFIX = True", "DATE_PREFIX = False")
)


def program(constants: str, used: str) -> str:
    """The minimal program with ``constants`` at its top level and a ``retrieve`` that reads the
    names in ``used``."""
    return minimal(
        ('ANSWER_INSTRUCTION = "Answer."\n', f'ANSWER_INSTRUCTION = "Answer."\n\n{constants}\n'),
        ('        return "\\n".join(u.content for u in self.units)[:16000]\n',
         f"        return str(({used},))\n"),
    )  # fmt: skip


def by_name(source: str) -> dict[str, Tunable]:
    return {t.name: t for t in tunables(source)}


def comments(source: str) -> list[str]:
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    return [tok.string for tok in tokens if tok.type == tokenize.COMMENT]


def literal_text(source: str, t: Tunable) -> str:
    return source.splitlines()[t.line - 1][t.col : t.end_col]


# --- discovery -------------------------------------------------------------------------------


def test_hybrid_tunables_are_all_declared() -> None:
    found = tunables(HYBRID)
    assert [t.name for t in found] == HYBRID_NAMES  # OUT_CHAR_BUDGET excluded
    assert all(t.declared for t in found)
    named = {t.name: t for t in found}
    assert (named["TOP_K"].kind, named["TOP_K"].low, named["TOP_K"].high) == ("int", 5, 500)
    assert (named["MMR_LAMBDA"].kind, named["MMR_LAMBDA"].low) == ("float", 0.3)
    assert (named["DATE_PREFIX"].kind, named["DATE_PREFIX"].low) == ("bool", None)
    for t in found:
        assert literal_text(HYBRID, t) == repr(t.value)


def test_dense_tunables() -> None:
    named = by_name(DENSE)
    assert list(named) == ["TOP_K", "MIN_SCORE"]
    assert (named["TOP_K"].low, named["TOP_K"].high, named["TOP_K"].declared) == (10, 1000, True)
    assert (named["MIN_SCORE"].low, named["MIN_SCORE"].high) == (0.0, 0.6)


def test_inferred_and_declared_ranges() -> None:
    source = "\n".join(
        [
            "COUNT = 80",
            "ZERO = 0",
            "SHARE = 0.35",
            "SCALE = 2.5",
            "FLAG = False",
            "DOTS = 4  # (range 1..9)",
            "WORDS = 0.5  # (Range -2 to 3.5)",
            "lower = 3",  # not all caps
            "TEXT = 'x'",
            "A = B = 2",  # several targets
            "TWICE = 1",
            "TWICE = 2",  # assigned twice: ambiguous
            "OUT_CHAR_BUDGET = 9000",
            "TUPLE = (1, 2)",
            "",
        ]
    )
    named = by_name(source)
    assert list(named) == ["COUNT", "ZERO", "SHARE", "SCALE", "FLAG", "DOTS", "WORDS"]
    ranges = {n: (t.low, t.high, t.declared) for n, t in named.items()}
    assert ranges["COUNT"] == (40, 170, False)
    assert ranges["ZERO"] == (0, 10, False)
    assert ranges["SHARE"] == (0.0, 1.0, False)
    assert ranges["SCALE"] == (0.0, 6.0, False)
    assert ranges["FLAG"] == (None, None, False)
    assert ranges["DOTS"] == (1, 9, True)
    assert ranges["WORDS"] == (-2, 3.5, True)


def test_negative_literals() -> None:
    source = "OFFSET = -3  # (range -10-5)\nSHIFT = -4\nTILT = -0.5\nNOPE = -True\n"
    named = by_name(source)
    assert list(named) == ["OFFSET", "SHIFT", "TILT"]
    assert (named["OFFSET"].value, named["OFFSET"].low, named["OFFSET"].high) == (-3, -10, 5)
    assert literal_text(source, named["OFFSET"]) == "-3"
    assert (named["SHIFT"].low, named["SHIFT"].high) == (-18, -2)  # mirrored: sign kept
    assert (named["TILT"].low, named["TILT"].high) == (-1.0, 0.0)
    parent = program(source, "OFFSET")
    for round_no in range(20):
        child = ConstantProposer().mutate(parent, None, round_no)
        new = by_name(child.source)["OFFSET"].value
        assert child.changes == {"OFFSET": (-3, new)} and -10 <= new <= 5
        ast.parse(child.source)


def test_annotated_assignment_and_multibyte_columns() -> None:
    source = 'S = "é"; LIMIT: int = 12  # (range 1-20)\n'
    [limit] = tunables(source)
    assert (limit.name, limit.value, limit.low, limit.high) == ("LIMIT", 12, 1, 20)
    assert literal_text(source, limit) == "12"
    child = ConstantProposer().mutate(program(source, "LIMIT, S"), None, 0)
    assert "# (range 1-20)" in child.source
    assert f'S = "é"; LIMIT: int = {child.changes["LIMIT"][1]}  #' in child.source


# --- mutation --------------------------------------------------------------------------------


def test_proposals_are_deterministic() -> None:
    for target in (None, "M", "F"):
        first = ConstantProposer(seed=3).mutate(HYBRID, target, 7)
        assert ConstantProposer(seed=3).mutate(HYBRID, target, 7) == first
    sources = {ConstantProposer(seed=3).mutate(HYBRID, "M", r).source for r in range(12)}
    assert len(sources) >= 8
    assert ConstantProposer(seed=4).mutate(HYBRID, "M", 7) != first


def test_two_hundred_proposals_stay_valid() -> None:
    parent_ranges = by_name(HYBRID)
    proposer = ConstantProposer(seed=1)
    targets = (None, "F", "T", "P", "M", "A")
    children = [proposer.mutate(HYBRID, targets[r % len(targets)], r) for r in range(200)]
    for child in children:
        assert child.message.startswith("random: ") and "\n" not in child.message
        assert 1 <= len(child.changes) <= 2
        assert comments(child.source) == comments(HYBRID)
        changed_lines = sum(
            a != b for a, b in zip(HYBRID.splitlines(), child.source.splitlines(), strict=True)
        )
        assert changed_lines == len(child.changes)
        now = by_name(child.source)
        for name, (old, new) in child.changes.items():
            t = parent_ranges[name]
            assert old == t.value and new != old and now[name].value == new
            assert type(new) is type(old)
            if t.kind != "bool":
                assert t.low is not None and t.high is not None and t.low <= new <= t.high
            if t.kind == "float":
                assert float(f"{new:.3g}") == new  # no spurious precision
    # The fingerprint check runs once per distinct child; tier 1 (pure, and reading names,
    # never values) once per constant moved: the first child that moves it.
    checked: set[str] = set()
    for source, child in {child.source: child for child in children}.items():
        if not set(child.changes) <= checked:
            assert check_source(source, parent_source=HYBRID) == []
            checked |= set(child.changes)
        components = changed_components(HYBRID, source)
        if {"CHUNK_CHARS", "CHUNK_OVERLAP"} & set(child.changes):
            assert "index" in components
        else:
            assert components == ["retrieve"]
    assert any(list(child.changes) == ["TOP_K"] for child in children)


@pytest.mark.parametrize("target", list(GUIDANCE))
def test_guided_moves_mostly_go_the_preferred_way(target: str) -> None:
    moves: Counter[tuple[str, bool]] = Counter()  # (name, went the preferred way)
    preferred = dict(GUIDANCE[target])
    for round_no in range(200):
        for name, (old, new) in (
            ConstantProposer().mutate(HYBRID_MID, target, round_no).changes.items()
        ):
            if name in preferred:
                moves[name, (new > old) == (preferred[name] > 0)] += 1
    for name in preferred:
        total = moves[name, True] + moves[name, False]
        assert total >= 20 and moves[name, True] / total >= 0.8, (name, moves)


def test_bool_flips() -> None:
    parent = program("FLAG = True  # (bool)", "FLAG")
    child = ConstantProposer().mutate(parent, "T", 0)
    assert child.changes == {"FLAG": (True, False)}
    assert "FLAG = False  # (bool)" in child.source
    back = ConstantProposer().mutate(child.source, None, 1)
    assert back.source == parent


def test_nothing_can_change() -> None:
    stuck = program("PINNED = 5  # (range 5-5)\nUNUSED = 3  # (range 0-9)", "PINNED")
    for source in (stuck, program("NAME = 'x'", "NAME")):
        with pytest.raises(ValueError, match="no tunable constant can change"):
            ConstantProposer().mutate(source, "M", 0)
    with pytest.raises(ValueError, match="unknown capability"):
        ConstantProposer().mutate(HYBRID, "Z", 0)


def test_unused_constants_are_never_moved() -> None:
    parent = program("USED = 3  # (range 0-9)\nUNUSED = 3  # (range 0-9)", "USED")
    for round_no in range(20):
        assert list(ConstantProposer().mutate(parent, None, round_no).changes) == ["USED"]


# --- crossover -------------------------------------------------------------------------------


def test_crossover_mixes_both_parents() -> None:
    b = (
        HYBRID.replace("TOP_K = 80", "TOP_K = 120")
        .replace("MIN_SCORE = 0.15", "MIN_SCORE = 0.3")
        .replace("NEIGHBOURS = 0", "NEIGHBOURS = 2")
        .replace("RETURN_CHUNK = False", "RETURN_CHUNK = True")
        .replace("DATE_PREFIX = True", "DATE_PREFIX = False")  # a format choice: never taken
    )
    a_values, b_values = by_name(HYBRID), by_name(b)
    differing = {"TOP_K", "MIN_SCORE", "NEIGHBOURS", "RETURN_CHUNK"}
    taken: Counter[tuple[str, str]] = Counter()
    for round_no in range(20):
        child = ConstantProposer(seed=2).crossover(HYBRID, b, round_no)
        assert child == ConstantProposer(seed=2).crossover(HYBRID, b, round_no)
        assert 1 <= len(child.changes) < len(differing)  # some from b, some from a
        assert child.message.startswith("constant crossover: from b ")
        assert check_source(child.source, parent_source=HYBRID) == []
        assert comments(child.source) == comments(HYBRID)
        values = by_name(child.source)
        assert values["DATE_PREFIX"].value is True
        for name in differing:
            parent = "b" if name in child.changes else "a"
            source_values = b_values if parent == "b" else a_values
            assert values[name].value == source_values[name].value
            assert (name in child.changes) == (name in child.message)
            taken[name, parent] += 1
    assert all(taken[name, p] > 0 for name in differing for p in "ab"), taken


def test_crossover_with_one_difference_takes_b() -> None:
    b = HYBRID.replace("TOP_K = 80", "TOP_K = 120")
    child = ConstantProposer().crossover(HYBRID, b, 0)
    assert child.changes == {"TOP_K": (80, 120)} and child.source == b


def test_crossover_needs_a_difference() -> None:
    with pytest.raises(ValueError, match="no differing tunable"):
        ConstantProposer().crossover(HYBRID, HYBRID, 0)
    restyled = HYBRID.replace("# most units kept per query", "# units kept")
    with pytest.raises(ValueError, match="no differing tunable"):
        ConstantProposer().crossover(HYBRID, restyled, 0)


def test_constant_search_never_moves_a_format_choice() -> None:
    """Evidence coverage cannot see what dates give a reader, so dropping them only frees
    budget: a run's best step once did exactly that. ``(format)`` tunables stay put."""
    formats = {"DATE_PREFIX", "CHRONOLOGICAL"}  # coverage reads neither dates nor order
    assert {t.name for t in tunables(HYBRID) if t.format} == formats
    assert not formats & {t.name for t in searchable(HYBRID)}
    moved = {name for target in (None, *GUIDANCE) for round_no in range(100)
             for name in ConstantProposer().mutate(HYBRID, target, round_no).changes}  # fmt: skip
    assert not formats & moved and len(moved) >= 10
