"""seeds/hybrid.py's structural tunables: each one, moved from its default, changes what
``retrieve`` returns for some input; the widened seed still passes the sandbox at the extremes
of its ranges."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_ariadne import BagOfWords

from contract.program import LoadedProgram, load_program, offline_units
from contract.records import build_record
from contract.types import Message, Segment
from evolve.evolution.constants import tunables
from sandbox.check import check_program

SEED = Path(__file__).resolve().parents[1] / "seeds" / "hybrid.py"
SOURCE = SEED.read_text()
FILLER = "we talked about the weather and the traffic and lunch plans again today "


def program(**constants: Any) -> LoadedProgram:
    loaded = load_program(SOURCE, str(SEED))
    for name, value in constants.items():
        assert name in vars(loaded.module), name
        vars(loaded.module)[name] = value
    return loaded


def session(sid: str, date: str, *texts: str) -> Segment:
    return Segment(sid, date, tuple(Message(f"{sid}-{i}", "user", t) for i, t in enumerate(texts)))


CONVERSATION = (
    session("1", "2024-01-01", "my dentist is doctor zhivago on elm street", FILLER,
            "the dentist appointment moved to friday", FILLER * 12 + "dentist bill was paid",
            "dentist visits make me nervous"),
    session("2", "2024-02-01", FILLER, "i play the oboe in the orchestra", "zhivago called"),
    session("3", "2024-03-01", "another dentist recommended flossing", FILLER),
)  # fmt: skip


def retrieve(question: str, **constants: Any) -> str:
    prog = program(**constants)
    memory = prog.get("Memory")(BagOfWords())
    for segment in CONVERSATION:
        memory.index(offline_units(prog, segment), segment)
    return str(memory.retrieve(build_record(prog.query, question, vars(prog.module))))


PASSAGES = {"RETURN_CHUNK": True, "CHUNK_CHARS": 200, "CHUNK_CONTEXT": 0}
NEW = {
    "RETURN_CHUNK": {"RETURN_CHUNK": True, "CHUNK_CHARS": 200},
    "CHUNK_CONTEXT": {"RETURN_CHUNK": True, "CHUNK_CHARS": 200, "CHUNK_CONTEXT": 0},
    "CHRONOLOGICAL": {"CHRONOLOGICAL": True},
    "SESSION_CAP": {"SESSION_CAP": 1},
    "CHUNK_OVERLAP": {"CHUNK_OVERLAP": 100, **PASSAGES},
    "RARE_TERMS": {"RARE_TERMS": 1, "LEXICAL_WEIGHT": 0.0, "TOP_K": 1},
    "RECENCY_WEIGHT": {"RECENCY_WEIGHT": 0.3},
    "RELATIVE_FLOOR": {"RELATIVE_FLOOR": 0.9},
    "SHORT_CHARS": {"SHORT_CHARS": 100, "LENGTH_PENALTY": 0.5, "TOP_K": 6, "CHUNK_CHARS": 200},
    "LENGTH_PENALTY": {"LENGTH_PENALTY": 0.5},
}
BASE = {"RETURN_CHUNK": {"CHUNK_CHARS": 200},
        "CHUNK_CONTEXT": {"RETURN_CHUNK": True, "CHUNK_CHARS": 200},
        "CHUNK_OVERLAP": PASSAGES,
        "RARE_TERMS": {"LEXICAL_WEIGHT": 0.0, "TOP_K": 1},
        "SHORT_CHARS": {"LENGTH_PENALTY": 0.5, "TOP_K": 6, "CHUNK_CHARS": 200}}  # fmt: skip


def test_new_tunables_are_declared_with_neutral_defaults() -> None:
    named = {t.name: t for t in tunables(SOURCE)}
    for name in NEW:
        assert named[name].declared, name
    defaults = {"RETURN_CHUNK": False, "CHRONOLOGICAL": False, "SESSION_CAP": 0,
                "CHUNK_OVERLAP": 0, "RARE_TERMS": 0, "RECENCY_WEIGHT": 0.0,
                "RELATIVE_FLOOR": 0.0, "SHORT_CHARS": 0, "LENGTH_PENALTY": 0.0,
                "BUDGET_COST": 0.0}  # fmt: skip
    assert {n: named[n].value for n in defaults} == defaults


@pytest.mark.parametrize("name", list(NEW))
def test_each_new_tunable_changes_what_retrieve_returns(name: str) -> None:
    question = "dentist zhivago"
    base, moved = retrieve(question, **BASE.get(name, {})), retrieve(question, **NEW[name])
    assert base != moved
    if name == "RETURN_CHUNK":  # the long unit's best chunk, not the whole unit
        assert "dentist bill was paid" in base and "dentist bill was paid" in moved
        assert len(moved) < len(base) - 200
    if name == "CHRONOLOGICAL":  # same units, indexing order
        assert sorted(base.split("\n\n")) == sorted(moved.split("\n\n"))
        dates = [block[1:11] for block in moved.split("\n\n")]
        assert dates == sorted(dates) and dates != [b[1:11] for b in base.split("\n\n")]
    if name == "SESSION_CAP":
        assert [b[1:11] for b in moved.split("\n\n")] == ["2024-01-01", "2024-02-01", "2024-03-01"]


def test_rare_terms_expand_the_query_with_the_rarest_word() -> None:
    # "dentist" is in five units, "zhivago" in two: expansion adds zhivago, and the one unit
    # kept is then the one that names him (dense only, so the BM25 score cannot decide)
    plain = retrieve("dentist zhivago", LEXICAL_WEIGHT=0.0, TOP_K=1, DATE_PREFIX=False)
    expanded = retrieve("dentist zhivago", LEXICAL_WEIGHT=0.0, TOP_K=1, DATE_PREFIX=False,
                        RARE_TERMS=1)  # fmt: skip
    assert "zhivago" in expanded and expanded != plain


def test_length_penalty_orders_packing_never_selection() -> None:
    # the long unit (twelve fillers, then "dentist bill was paid") has the best chunk for the
    # question, so it ranks first; the penalty packs it last but keeps it among the TOP_K hits:
    # length decides the packing order, never which units are hits
    at = {"CHUNK_CHARS": 200, "DATE_PREFIX": False}
    plain = retrieve("dentist bill", TOP_K=4, **at).split("\n\n")
    penalised = retrieve("dentist bill", TOP_K=4, LENGTH_PENALTY=0.5, **at).split("\n\n")
    assert plain[0].endswith("dentist bill was paid")
    assert sorted(penalised) == sorted(plain) and penalised[-1].endswith("dentist bill was paid")
    # in a budget that the long hit nearly fills, the penalty packs the short hits instead
    small = {"OUT_CHAR_BUDGET": 1000, "TOP_K": 4, **at}
    first = retrieve("dentist bill", **small).split("\n\n")
    packed = retrieve("dentist bill", LENGTH_PENALTY=0.5, **small).split("\n\n")
    assert first[0].endswith("dentist bill was paid") and len(first) < 4
    assert sorted(packed) == sorted(plain[1:])


def test_budget_cost_pushes_back_long_hits_and_leaves_short_ones_in_score_order() -> None:
    # (BUDGET_COST's "changes what retrieve returns" test.) The cost is linear in the share of
    # the budget a hit takes: in a budget of 1,000 characters the long hit (891 characters)
    # costs 0.89 of BUDGET_COST and is packed last, while hits of a few dozen characters differ
    # by a few hundredths and keep the score's order; the hits are still the TOP_K by score
    at = {"CHUNK_CHARS": 200, "DATE_PREFIX": False, "TOP_K": 6}
    ranked = retrieve("dentist bill", **at).split("\n\n")  # all fit: the score's order
    assert ranked[0].endswith("dentist bill was paid") and len(ranked[0]) > 800
    short = [b for b in ranked if len(b) <= 100]
    small = {**at, "OUT_CHAR_BUDGET": 1000}
    costed = retrieve("dentist bill", BUDGET_COST=1.0, **small).split("\n\n")
    assert costed == short  # every short hit, in score order; the long one no longer fits
    assert retrieve("dentist bill", **small).split("\n\n")[0] == ranked[0]  # without the cost
    # the log penalty, at a weight that pushes the long hit back as well, reorders short ones
    logged = retrieve("dentist bill", LENGTH_PENALTY=0.5, **small).split("\n\n")
    assert sorted(logged) == sorted(short) and logged != short


def test_mmr_adjusts_the_costs_packing_order_rather_than_undoing_it() -> None:
    # MMR reads the packing key as relevance: at a lambda so near 1 that diversity can only
    # break near-ties, the budget cost's order stands (the long hit stays last and, in a budget
    # of 1,000 characters, out); relevance read as the raw score would pack the long hit first
    at = {"CHUNK_CHARS": 200, "DATE_PREFIX": False, "TOP_K": 6, "OUT_CHAR_BUDGET": 1000}
    costed = retrieve("dentist bill", BUDGET_COST=1.0, **at).split("\n\n")
    both = retrieve("dentist bill", BUDGET_COST=1.0, MMR_LAMBDA=0.9999, **at).split("\n\n")
    assert both == costed and all(len(b) <= 100 for b in both)
    # and MMR still acts when diversity weighs
    assert retrieve("dentist bill", BUDGET_COST=1.0, MMR_LAMBDA=0.3, **at).split("\n\n") != costed


def test_short_units_that_are_not_hits_are_never_packed() -> None:
    # many short, barely related turns: ranked by score less the penalty they would beat the
    # relevant units into the TOP_K; selected by score they stay out, whatever the penalty
    chatter = session("4", "2024-04-01", *[f"ok {w}" for w in ("yes", "sure", "fine", "right")])
    memory_units = [*CONVERSATION, chatter]
    at = {"CHUNK_CHARS": 200, "DATE_PREFIX": False, "TOP_K": 3, "MIN_SCORE": 0.0}
    kept = {}
    for penalty in (0.0, 0.5):
        prog = program(**at, LENGTH_PENALTY=penalty)
        memory = prog.get("Memory")(BagOfWords())
        for segment in memory_units:
            memory.index(offline_units(prog, segment), segment)
        text = memory.retrieve(build_record(prog.query, "dentist visits", vars(prog.module)))
        kept[penalty] = sorted(str(text).split("\n\n"))
    assert kept[0.0] == kept[0.5] and not any(b.startswith("user: ok") for b in kept[0.5])


def test_relative_floor_keeps_hits_near_the_best() -> None:
    # the floor reads the query's best unit: 0.9 of it keeps only the closest units
    at = {"CHUNK_CHARS": 200, "DATE_PREFIX": False}
    every = retrieve("dentist zhivago", **at).split("\n\n")
    near = retrieve("dentist zhivago", RELATIVE_FLOOR=0.9, **at).split("\n\n")
    assert 1 <= len(near) < len(every) and near == every[: len(near)]


def test_short_chars_lets_the_score_order_short_hits() -> None:
    # "zhivago called" is shorter than the better hit "my dentist is doctor zhivago ...": the
    # penalty packs it first; with SHORT_CHARS 100 both count as 100 characters long, so the
    # score orders the short hits again, and only the long unit (891 characters) is pushed back
    at = {"CHUNK_CHARS": 200, "DATE_PREFIX": False, "TOP_K": 6}
    plain = retrieve("dentist zhivago", **at).split("\n\n")
    short = [b for b in plain if len(b) <= 100]
    penalised = retrieve("dentist zhivago", LENGTH_PENALTY=0.5, **at).split("\n\n")
    floored = retrieve("dentist zhivago", LENGTH_PENALTY=0.5, SHORT_CHARS=100, **at)
    assert len(short) == 5 and penalised[:5] != short and floored.split("\n\n")[:5] == short


def seed_selection(constants: dict[str, Any], unit_scores: np.ndarray) -> list[int]:
    """The hybrid seed's hit selection as first written: the TOP_K best units by score among
    those at or above MIN_SCORE, best first. Its defaults must still select this way."""
    rank = np.where(unit_scores >= constants["MIN_SCORE"], unit_scores, -np.inf)
    k = min(constants["TOP_K"], len(rank))
    best = np.argpartition(-rank, k - 1)[:k]
    best = best[np.argsort(-rank[best], kind="stable")]
    return [int(i) for i in best if unit_scores[i] >= constants["MIN_SCORE"]]


@pytest.mark.parametrize("question", ["dentist zhivago", "dentist bill", "oboe", "weather"])
def test_defaults_select_and_pack_as_the_seed_did(question: str) -> None:
    prog = program(CHUNK_CHARS=200, TOP_K=5)
    memory = prog.get("Memory")(BagOfWords())
    for segment in CONVERSATION:
        memory.index(offline_units(prog, segment), segment)
    seen: dict[str, Any] = {}
    relevant = memory._relevant

    def spy(unit_scores: np.ndarray) -> list[int]:
        seen["scores"], seen["hits"] = unit_scores.copy(), relevant(unit_scores)
        return list(seen["hits"])

    memory._relevant = spy
    text = str(memory.retrieve(build_record(prog.query, question, vars(prog.module))))
    assert seen["hits"] == seed_selection(vars(prog.module), seen["scores"])
    assert text == "\n\n".join(memory._render(i) for i in seen["hits"])  # all fit, in that order


def test_chunk_overlap_shares_characters_and_stays_linear() -> None:
    prog = program()
    spans = prog.get("chunk_spans")
    text = FILLER * 20
    plain, shared = spans(text, 200, 0), spans(text, 200, 300)
    assert all(a[1] == b[0] for a, b in zip(plain, plain[1:], strict=False))  # no overlap
    assert all(b[0] < a[1] for a, b in zip(shared, shared[1:], strict=False))  # overlapping
    assert all(b[0] - a[0] >= 50 for a, b in zip(shared, shared[1:], strict=False))  # progress
    assert shared[-1][1] == len(text) and len(shared) <= 2 * len(plain) + 1


def test_extreme_settings_pass_the_sandbox() -> None:
    extreme = SOURCE
    for old, new in [("RETURN_CHUNK = False", "RETURN_CHUNK = True"),
                     ("CHUNK_CHARS = 600", "CHUNK_CHARS = 200"),
                     ("CHUNK_OVERLAP = 0", "CHUNK_OVERLAP = 300"),
                     ("CHUNK_CONTEXT = 150", "CHUNK_CONTEXT = 1000"),
                     ("RARE_TERMS = 0", "RARE_TERMS = 8"), ("SESSION_CAP = 0", "SESSION_CAP = 1"),
                     ("CHRONOLOGICAL = False", "CHRONOLOGICAL = True"),
                     ("RECENCY_WEIGHT = 0.0", "RECENCY_WEIGHT = 0.3"),
                     ("RELATIVE_FLOOR = 0.0", "RELATIVE_FLOOR = 0.9"),
                     ("SHORT_CHARS = 0", "SHORT_CHARS = 2000"),
                     ("LENGTH_PENALTY = 0.0", "LENGTH_PENALTY = 0.5"),
                     ("BUDGET_COST = 0.0", "BUDGET_COST = 4.0")]:  # fmt: skip
        assert old in extreme
        extreme = extreme.replace(old, new)
    report = check_program(extreme, "extreme hybrid", SOURCE)
    assert report.passed, report.repair_text()
