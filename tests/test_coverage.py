"""evolve/scoring/coverage.py: evidence coverage (format-invariant, monotone) and its ceiling."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from evolve.models.embed import Embedder
from evolve.models.testing import HashingEmbedder
from evolve.scoring.coverage import (
    FITNESS_VERSION,
    SEMANTIC_CAP,
    CoverageScorer,
    ceiling,
    evidence_tokens,
    pack_gold,
    pieces,
)

EVIDENCE = [
    "user: I moved to Berlin in March 2021 and started a new job at a small bakery near the "
    "river, where I bake sourdough bread every morning before sunrise with two colleagues.",
    "assistant: Your marathon training plan has four long runs a week, rising from twelve to "
    "thirty kilometres, with rest days on Monday and Friday and a taper in the final fortnight.",
    "user: My sister Clara is getting married in Lisbon next summer and I promised to bake the "
    "wedding cake, a three tiered lemon sponge with elderflower cream and fresh berries.",
]
# a paraphrase close enough, under the hashing double too, to land on the meaning ramp
PARAPHRASE = (
    "The user's sister Clara marries in Lisbon next summer; the user promised to bake her "
    "wedding cake, a lemon sponge with elderflower cream."
)
DISTRACTORS = [
    "assistant: Here is a summary of the football results from last weekend, including the "
    "scores of every match in the second division and the top scorers of the season.",
    "user: My favourite programming language is Haskell because of its type system, and I "
    "write compilers as a hobby on weekends with a cup of green tea.",
    "assistant: To repot a fern, water it a day before, loosen the root ball gently and move "
    "it to a pot one size larger with fresh peat-free compost.",
]
HEADERS = [
    "",
    "[2024-03-01] ",
    "user: ",
    "(id 17) ",
    "Monday, March 4, 2024 - ",
    "Date: 2024-03-01\n",
]
BULLETS = ["", "- ", "* ", "• ", "1. ", "> "]
SEPARATORS = ["\n", "\n\n", "\n---\n", "\n\n### \n\n", "\n=====\n"]
WORDS = st.text(alphabet="abcdefghijklmnopqrstuvwxyz", min_size=1, max_size=9)


@pytest.fixture(scope="module")
def scorer() -> CoverageScorer:
    return CoverageScorer(HashingEmbedder(dim=384))


def _coverage(scorer: CoverageScorer, retrieved: str, evidence: list[str] = EVIDENCE) -> float:
    value = scorer.coverage([(evidence, retrieved)])[0]["evidence_coverage"]
    assert value is not None
    return float(value)


def _body(text: str) -> str:
    return text.split(": ", 1)[1]


UNITS = st.lists(
    st.sampled_from([_body(EVIDENCE[0]), EVIDENCE[1], PARAPHRASE, *DISTRACTORS]),
    min_size=1,
    max_size=6,
    unique=True,
)


@settings(max_examples=60, deadline=None)
@given(UNITS, st.data())
def test_format_and_order_do_not_change_the_score(units: list[str], data: st.DataObject) -> None:
    scorer = CoverageScorer(HashingEmbedder(dim=384))
    plain = _coverage(scorer, "\n".join(units))
    order = data.draw(st.permutations(units))
    header, bullet = data.draw(st.sampled_from(HEADERS)), data.draw(st.sampled_from(BULLETS))
    separator = data.draw(st.sampled_from(SEPARATORS))
    styled = separator.join(f"{bullet}{header}{unit}" for unit in order)
    assert abs(_coverage(scorer, styled) - plain) <= 0.005


@pytest.mark.parametrize("header", HEADERS)
def test_headers_do_not_change_meaning_only_credit(scorer: CoverageScorer, header: str) -> None:
    plain = _coverage(scorer, PARAPHRASE, [EVIDENCE[2]])
    assert 0.0 < plain < 1.0  # credit by meaning, the case a header could shift
    assert _coverage(scorer, f"- {header}{PARAPHRASE}", [EVIDENCE[2]]) == pytest.approx(plain)


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=300), st.text(max_size=300), st.sampled_from([" ", "\n", ". ", "] "]))
def test_verbatim_evidence_scores_one_whatever_surrounds_it(
    before: str, after: str, gap: str
) -> None:
    scorer = CoverageScorer(HashingEmbedder(dim=384))
    for text in EVIDENCE:
        retrieved = f"{before}{gap}{_body(text)}{gap}{after}"
        assert _coverage(scorer, retrieved, [text]) == 1.0


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_a_few_changed_words_still_count_as_contained(data: st.DataObject) -> None:
    scorer = CoverageScorer(HashingEmbedder(dim=384))
    text = EVIDENCE[data.draw(st.integers(0, len(EVIDENCE) - 1))]
    words = _body(text).split()
    for _ in range(data.draw(st.integers(1, len(words) // 10))):  # ≤ 10 % of the words
        i = data.draw(st.integers(0, len(words) - 1))
        edit = data.draw(st.sampled_from(["replace", "insert", "delete"]))
        if edit == "replace":
            words[i] = data.draw(WORDS)
        elif edit == "insert":
            words.insert(i, data.draw(WORDS))
        else:
            del words[i]
    assert _coverage(scorer, f"{DISTRACTORS[0]}\n{' '.join(words)}", [text]) == 1.0


def test_most_of_the_message_is_not_containment_and_earns_less(scorer: CoverageScorer) -> None:
    words = _body(EVIDENCE[0]).split()
    most = _coverage(scorer, " ".join(words[: 3 * len(words) // 4]), [EVIDENCE[0]])
    assert 0.0 < most <= SEMANTIC_CAP


def test_a_paraphrase_earns_partial_credit_below_a_hit(scorer: CoverageScorer) -> None:
    credit = _coverage(scorer, f"{DISTRACTORS[1]}\n{PARAPHRASE}", [EVIDENCE[2]])
    assert 0.0 < credit < 1.0
    assert credit <= SEMANTIC_CAP
    assert _coverage(scorer, DISTRACTORS[1], [EVIDENCE[2]]) < credit


@settings(max_examples=60, deadline=None)
@given(UNITS, st.text(max_size=400), st.booleans())
# found by hypothesis: one more window changed a matrix product's rounding of another cosine
@example([_body(EVIDENCE[0]), EVIDENCE[1], DISTRACTORS[0], PARAPHRASE], "\u00b9", True)
def test_adding_text_never_lowers_any_credit(units: list[str], extra: str, front: bool) -> None:
    scorer = CoverageScorer(HashingEmbedder(dim=384))
    base = "\n\n".join(units)
    grown = f"{extra}\n{base}" if front else f"{base}\n{extra}"
    before, after = scorer.credits([(EVIDENCE, base), (EVIDENCE, grown)])
    assert all(a >= b for a, b in zip(after, before, strict=True))


def test_questions_without_evidence_score_none_and_record_the_version(
    scorer: CoverageScorer,
) -> None:
    (empty, tokenless, some) = scorer.coverage([([], "x"), (["user: ?!"], "x"), (EVIDENCE, "")])
    assert empty["evidence_coverage"] is None and tokenless["evidence_coverage"] is None
    assert some["evidence_coverage"] == 0.0
    assert {r["fitness_version"] for r in (empty, tokenless, some)} == {FITNESS_VERSION}


def test_the_speaker_label_is_dropped_from_the_evidence() -> None:
    assert evidence_tokens("User:  I moved") == ["i", "moved"]
    assert evidence_tokens("I said user: hi") == ["i", "said", "user", "hi"]


# --- long messages: credit by piece ------------------------------------------------------------

_RNG = random.Random(14)
# about 550 distinct made-up words: five pieces, none repeating another's text
LONG = "assistant: " + " ".join(
    "".join(_RNG.choice("bcdfghjklmnpqrstvwz") + _RNG.choice("aeiou") for _ in range(4))
    for _ in range(550)
)


def test_a_long_message_is_scored_by_piece_and_a_short_one_whole() -> None:
    assert len(pieces(evidence_tokens(LONG))) == 5  # 550 tokens, 128 at most each
    assert [len(p) for p in pieces(list("ab"))] == [2]
    sizes = [len(p) for p in pieces(evidence_tokens(LONG))]
    assert max(sizes) - min(sizes) <= 1 and sum(sizes) == len(evidence_tokens(LONG))


@pytest.mark.parametrize("share", [0.2, 0.4, 0.6])
def test_part_of_a_long_message_earns_about_its_share_wherever_it_sits(
    scorer: CoverageScorer, share: float
) -> None:
    words = LONG.split()
    n = int(share * len(words))
    head, tail = " ".join(words[:n]), " ".join(words[-n:])
    middle = " ".join(words[(len(words) - n) // 2 : (len(words) + n) // 2])
    credits = [_coverage(scorer, part, [LONG]) for part in (head, middle, tail)]
    assert all(share - 0.2 <= c <= share + 0.2 for c in credits), credits
    assert max(credits) - min(credits) <= 0.2, credits
    assert _coverage(scorer, LONG, [LONG]) == 1.0


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 400), st.integers(1, 400), st.text(max_size=200), st.booleans())
def test_adding_text_never_lowers_a_long_messages_credit(
    start: int, size: int, extra: str, front: bool
) -> None:
    scorer = CoverageScorer(HashingEmbedder(dim=384))
    part = " ".join(LONG.split()[start : start + size])
    grown = f"{extra}\n{part}" if front else f"{part}\n{extra}"
    (before,), (after,) = scorer.credits([([LONG], part), ([LONG], grown)])
    assert after >= before


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 400), st.integers(1, 400), st.sampled_from(HEADERS))
def test_a_header_does_not_change_a_long_messages_credit(
    start: int, size: int, header: str
) -> None:
    scorer = CoverageScorer(HashingEmbedder(dim=384))
    part = " ".join(LONG.split()[start : start + size])
    (plain,), (headed,) = scorer.credits([([LONG], part), ([LONG], f"{header}{part}")])
    assert abs(plain - headed) <= 0.005


# --- ceiling -------------------------------------------------------------------------------


def test_pack_gold_packs_the_shortest_whole_then_cuts_the_next_to_the_budget() -> None:
    long, short = "x " * 500, "user: short message here"
    budget = len(short) + len(EVIDENCE[0]) + 2
    packed = pack_gold([long, short, EVIDENCE[0]], budget=budget)
    assert packed == f"{short}\n\n{EVIDENCE[0]}"  # the long one did not fit and was left out
    room = budget + 2 + 40
    cut = pack_gold([long, short, EVIDENCE[0]], budget=room)
    assert cut.startswith("x x ") and cut.endswith(f"\n\n{short}\n\n{EVIDENCE[0]}")  # order kept
    assert len(cut) <= room and " ".join(cut.split("\n\n")[0].split()) == cut.split("\n\n")[0]
    assert pack_gold(EVIDENCE, budget=12) == "user: I"  # cut at a space, within the budget
    assert pack_gold(EVIDENCE, budget=3) == ""


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from([*EVIDENCE, *DISTRACTORS]), min_size=1, max_size=4), UNITS)
def test_the_ceiling_beats_any_context_when_the_evidence_fits(
    evidence: list[str], units: list[str]
) -> None:
    scorer = CoverageScorer(HashingEmbedder(dim=384))
    top = ceiling([evidence], scorer)
    program = scorer.coverage([(evidence, "\n\n".join(units))])[0]["evidence_coverage"]
    assert top.per_question[0] is not None and program is not None
    assert top.per_question[0] >= program


def test_the_ceiling_is_below_one_when_the_evidence_does_not_fit(scorer: CoverageScorer) -> None:
    budget = len(EVIDENCE[0]) + 10
    top = ceiling([EVIDENCE, [EVIDENCE[0]], []], scorer, budget=budget)
    first = top.per_question[0]
    assert first is not None and 1 / 3 <= first < 1.0  # one of three fits
    assert top.per_question[1:] == [1.0, None]
    assert top.mean == pytest.approx((first + 1.0) / 2)
    assert (top.budget, top.fitness_version) == (budget, FITNESS_VERSION)


# --- the real model on BEAM evidence ---------------------------------------------------------


@pytest.fixture(scope="module")
def beam_evidence(data_dir: Path) -> list[str]:
    from evolve.datasets import beam

    tasks = beam.load_taskset(data_dir, "valid")
    conv = tasks.conversations[0]
    messages = conv.messages()
    ids = [e for q in tasks.questions if q.conversation_id == conv.id for e in q.evidence_ids]
    texts = [f"{messages[e][1].role}: {messages[e][1].content}" for e in ids if e in messages]
    return list(dict.fromkeys(texts))[:6]


@pytest.mark.slow
def test_minilm_dates_and_roles_do_not_change_coverage(
    beam_evidence: list[str], tmp_path: Path
) -> None:
    scorer = CoverageScorer(Embedder(tmp_path / "e.sqlite"))
    hit, miss = beam_evidence[:3], beam_evidence[3:]
    plain = "\n\n".join(_body(t) for t in hit)
    dated = "\n\n".join(f"[2024-03-0{i + 1}] {t}" for i, t in enumerate(reversed(hit)))
    a, b = scorer.coverage([(beam_evidence, plain), (beam_evidence, dated)])
    assert abs(a["evidence_coverage"] - b["evidence_coverage"]) <= 0.005
    assert a["evidence_contained"] == b["evidence_contained"] == len(hit) / len(beam_evidence)
    rows = scorer.credits([(miss, dated)])[0]
    assert all(0.0 <= c <= SEMANTIC_CAP for c in rows)  # meaning only, below a hit
