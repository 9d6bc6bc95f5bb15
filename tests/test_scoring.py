"""evolve/scoring/retrieval.py: retrieved-text blocks, content words, metrics, aggregation."""

from __future__ import annotations

import pytest

from evolve.datasets.types import CAPABILITIES, Question
from evolve.models.testing import HashingEmbedder
from evolve.scoring.retrieval import (
    BLOCK_CHARS,
    HIT_THRESHOLD,
    METRICS,
    MIN_BLOCK_CHARS,
    VERBATIM_CHARS,
    RetrievalScorer,
    ScoreInput,
    aggregate,
    blocks,
    content_words,
)

EVIDENCE = (
    "user: I moved to Berlin in March 2021 and started a new job at a small bakery near the "
    "river, where I bake sourdough bread every morning before sunrise."
)
OTHER = (
    "assistant: Here is a summary of the football results from last weekend, including the "
    "scores of every match in the second division and the top scorers of the season."
)
UNRELATED = (
    "user: My favourite programming language is Haskell because of its type system, and I "
    "write compilers as a hobby on weekends with a cup of green tea."
)


def _question(
    qid: str = "q1",
    *,
    gold: str = "Berlin",
    capability: str = "F",
    ability: str = "information_extraction",
    evidence_ids: tuple[str, ...] = ("m1",),
) -> Question:
    return Question(
        id=qid,
        conversation_id="c1",
        ability=ability,
        capability=capability,
        question="Where did I move?",
        gold=gold,
        evidence_ids=evidence_ids,
    )


@pytest.fixture(scope="module")
def scorer() -> RetrievalScorer:
    return RetrievalScorer(HashingEmbedder(dim=384))


# --- blocks -------------------------------------------------------------------------------


def test_blocks_split_at_blank_lines() -> None:
    a, b = "a" * 200, "b" * 300
    assert blocks(f"{a}\n\n{b}") == [a, b]
    assert blocks(f"{a}\n{b}") == [f"{a}\n{b}"]  # a single newline does not split


def test_blocks_short_paragraph_merges_into_previous() -> None:
    a = "a" * 200
    short = "s" * (MIN_BLOCK_CHARS - 1)
    assert blocks(f"{a}\n\n{short}") == [f"{a}\n\n{short}"]
    long_enough = "l" * MIN_BLOCK_CHARS
    assert blocks(f"{a}\n\n{long_enough}") == [a, long_enough]


def test_blocks_short_first_paragraph_stays() -> None:
    b = "b" * 200
    assert blocks(f"hi\n\n{b}") == ["hi", b]
    assert blocks("hi\n\nthere") == ["hi\n\nthere"]


def test_blocks_short_paragraph_does_not_overflow_previous() -> None:
    a = "a" * (BLOCK_CHARS - 50)
    short = "s" * 60
    assert blocks(f"{a}\n\n{short}") == [a, short]


def test_blocks_long_paragraph_cut() -> None:
    long = "x" * (2 * BLOCK_CHARS + 500)
    assert blocks(long) == ["x" * BLOCK_CHARS, "x" * BLOCK_CHARS, "x" * 500]
    assert blocks(f"{long}\n\nend") == ["x" * BLOCK_CHARS, "x" * BLOCK_CHARS, "x" * 500 + "\n\nend"]
    assert all(len(b) <= BLOCK_CHARS for b in blocks(f"{long}\n\n{long}\n\nend"))


@pytest.mark.parametrize("text", ["", "\n\n", "\n\n\n\n", "   ", " \n\n \t "])
def test_blocks_empty(text: str) -> None:
    assert blocks(text) == []


def test_blocks_skip_blank_paragraphs() -> None:
    a, b = "a" * 200, "b" * 200
    assert blocks(f"\n\n{a}\n\n  \n\n{b}\n\n") == [a, b]


# --- content_words ------------------------------------------------------------------------


def test_content_words_stem_and_drop_stopwords() -> None:
    assert content_words("Alice moved to Berlin in 2021") == {"alic", "move", "berlin", "2021"}
    assert content_words("The user's preferences were RUNNING daily") == {
        "user",
        "prefer",
        "run",
        "daili",
    }
    assert content_words("moves moving moved") == {"move"}


def test_content_words_rubric_boilerplate_removed() -> None:
    assert content_words("The LLM response should mention the Berlin move") == {"berlin", "move"}
    assert content_words("Response should state and contain it") == set()


def test_content_words_numbers_and_punctuation() -> None:
    assert content_words("It costs 3.5 dollars!") == {"cost", "3.5", "dollar"}
    assert content_words("") == set()
    assert content_words("... , ;") == set()


# --- RetrievalScorer ------------------------------------------------------------------------


def test_evidence_included_verbatim(scorer: RetrievalScorer) -> None:
    retrieved = f"{OTHER}\n\n{EVIDENCE}\n\n{UNRELATED}"
    [result] = scorer.score([ScoreInput(_question(), [EVIDENCE], retrieved)])
    assert set(result) == set(METRICS)
    assert result["evidence_similarity"] == pytest.approx(1.0, abs=1e-5)
    assert result["evidence_hit_rate"] == 1.0
    assert result["evidence_recall"] == 1.0
    assert result["answer_recall"] == 1.0  # "berlin" is in the retrieved text


def test_evidence_absent(scorer: RetrievalScorer) -> None:
    retrieved = f"{OTHER}\n\n{UNRELATED}"
    [result] = scorer.score([ScoreInput(_question(), [EVIDENCE], retrieved)])
    assert result["evidence_similarity"] is not None
    assert result["evidence_similarity"] < HIT_THRESHOLD
    assert result["evidence_similarity"] < 0.9
    assert result["evidence_hit_rate"] == 0.0
    assert result["evidence_recall"] == 0.0
    assert result["answer_recall"] == 0.0


def test_question_without_evidence_all_none(scorer: RetrievalScorer) -> None:
    item = ScoreInput(_question(evidence_ids=()), [], f"{EVIDENCE}\n\n{OTHER}")
    assert scorer.score([item]) == [dict.fromkeys(METRICS)]


def test_empty_retrieved_text(scorer: RetrievalScorer) -> None:
    [result] = scorer.score([ScoreInput(_question(), [EVIDENCE], "")])
    assert result == {
        "evidence_coverage": 0.0,
        "evidence_contained": 0.0,
        "evidence_similarity": 0.0,
        "evidence_hit_rate": 0.0,
        "evidence_recall": 0.0,
        "answer_recall": 0.0,
    }


def test_two_evidence_one_found(scorer: RetrievalScorer) -> None:
    retrieved = f"{OTHER}\n\n{EVIDENCE}"
    [result] = scorer.score([ScoreInput(_question(), [EVIDENCE, UNRELATED], retrieved)])
    assert result["evidence_hit_rate"] == 0.5
    assert result["evidence_recall"] == 0.5
    assert 0.5 < result["evidence_similarity"] < 1.0


def test_verbatim_recall_normalises_whitespace_and_uses_opening(scorer: RetrievalScorer) -> None:
    evidence = "user:   I moved\nto   Berlin " + "and then some more words " * 20
    assert len(evidence) > VERBATIM_CHARS
    opening = " ".join(evidence.split())[:VERBATIM_CHARS]
    retrieved = f"{OTHER}\n\n{opening} but the end was different."
    [result] = scorer.score([ScoreInput(_question(), [evidence], retrieved)])
    assert result["evidence_recall"] == 1.0


def test_answer_recall_hand_computed(scorer: RetrievalScorer) -> None:
    # gold words {alic, move, berlin, 2021}; retrieved has alic and 2021 -> 2 / 4
    question = _question(gold="Alice moved to Berlin in 2021")
    retrieved = "Alice lives in Paris since 2021."
    [result] = scorer.score([ScoreInput(question, [EVIDENCE], retrieved)])
    assert result["answer_recall"] == 0.5


def test_answer_recall_none_for_empty_gold(scorer: RetrievalScorer) -> None:
    [result] = scorer.score([ScoreInput(_question(gold="the"), [EVIDENCE], EVIDENCE)])
    assert result["answer_recall"] is None
    assert result["evidence_recall"] == 1.0


def test_custom_hit_threshold() -> None:
    lenient = RetrievalScorer(HashingEmbedder(dim=384), hit_threshold=-1.0)
    [result] = lenient.score([ScoreInput(_question(), [EVIDENCE], UNRELATED)])
    assert result["evidence_hit_rate"] == 1.0
    assert lenient.hit_threshold == -1.0


def test_batch_matches_single_items(scorer: RetrievalScorer) -> None:
    items = [
        ScoreInput(_question("q1"), [EVIDENCE], f"{OTHER}\n\n{EVIDENCE}"),
        ScoreInput(_question("q2", evidence_ids=()), [], OTHER),
        ScoreInput(_question("q3"), [EVIDENCE, OTHER], UNRELATED),
        ScoreInput(_question("q4"), [UNRELATED], ""),
        ScoreInput(_question("q5", gold="football scores"), [OTHER], f"{OTHER}\n\n{UNRELATED}"),
    ]
    batched = scorer.score(items)
    assert len(batched) == len(items)
    for item, result in zip(items, batched, strict=True):
        [single] = scorer.score([item])
        assert result.keys() == single.keys()
        for metric in METRICS:
            assert result[metric] == pytest.approx(single[metric], abs=1e-6)
    assert scorer.score([]) == []


# --- aggregate ----------------------------------------------------------------------------


def _scores(sim: float | None, hit: float | None, rec: float | None, ans: float | None) -> dict:
    return {
        "evidence_coverage": hit,  # the aggregate treats every metric alike
        "evidence_contained": hit,
        "evidence_similarity": sim,
        "evidence_hit_rate": hit,
        "evidence_recall": rec,
        "answer_recall": ans,
    }


def test_aggregate_means_and_counts() -> None:
    rows = [
        (_question("q1", capability="F", ability="information_extraction"),
         _scores(0.9, 1.0, 1.0, 0.5)),
        (_question("q2", capability="T", ability="temporal_reasoning"),
         _scores(0.5, 0.0, 0.0, 1.0)),
        (_question("q3", capability="T", ability="event_ordering"),
         _scores(0.7, 1.0, None, None)),
        (_question("q4", capability="A", ability="abstention", evidence_ids=()),
         _scores(None, None, None, None)),
    ]  # fmt: skip
    result = aggregate(rows)
    overall = result["overall"]
    assert overall["n"] == 4
    assert overall["evidence_similarity"] == pytest.approx((0.9 + 0.5 + 0.7) / 3)
    assert overall["evidence_hit_rate"] == pytest.approx(2 / 3)
    assert overall["evidence_recall"] == pytest.approx(0.5)
    assert overall["answer_recall"] == pytest.approx(0.75)

    by_cap = result["by_capability"]
    assert list(by_cap) == ["F", "T", "A"]  # capability order, present ones only
    assert by_cap["F"] == {"n": 1, **_scores(0.9, 1.0, 1.0, 0.5)}
    assert by_cap["T"]["n"] == 2
    assert by_cap["T"]["evidence_similarity"] == pytest.approx(0.6)
    assert by_cap["T"]["evidence_hit_rate"] == pytest.approx(0.5)
    assert by_cap["T"]["evidence_recall"] == 0.0
    assert by_cap["T"]["answer_recall"] == 1.0
    assert by_cap["A"] == {"n": 1, **_scores(None, None, None, None)}

    by_type = result["by_type"]
    assert list(by_type) == sorted(by_type)
    assert set(by_type) == {
        "information_extraction",
        "temporal_reasoning",
        "event_ordering",
        "abstention",
    }
    assert by_type["event_ordering"] == {"n": 1, **_scores(0.7, 1.0, None, None)}
    assert by_type["abstention"]["n"] == 1


def test_aggregate_all_capabilities_in_order() -> None:
    rows = [
        (_question(f"q{c}", capability=c, ability=f"type_{c}"), _scores(1.0, 1.0, 1.0, 1.0))
        for c in reversed(CAPABILITIES)
    ]
    result = aggregate(rows)
    assert list(result["by_capability"]) == list(CAPABILITIES)
    assert result["overall"]["n"] == len(CAPABILITIES)


def test_aggregate_selected_metrics() -> None:
    rows = [(_question(), {"evidence_recall": 1.0}), (_question("q2"), {"evidence_recall": 0.0})]
    result = aggregate(rows, metrics=["evidence_recall"])
    assert result["overall"] == {"n": 2, "evidence_recall": 0.5}


def test_aggregate_empty() -> None:
    result = aggregate([])
    assert result["overall"] == {"n": 0, **dict.fromkeys(METRICS)}
    assert result["by_capability"] == {} and result["by_type"] == {}


def test_aggregate_of_scorer_output(scorer: RetrievalScorer) -> None:
    questions = [_question("q1"), _question("q2", evidence_ids=())]
    items = [
        ScoreInput(questions[0], [EVIDENCE], EVIDENCE),
        ScoreInput(questions[1], [], EVIDENCE),
    ]
    result = aggregate(zip(questions, scorer.score(items), strict=True))
    assert result["overall"]["n"] == 2
    assert result["overall"]["evidence_recall"] == 1.0
    assert result["by_capability"]["F"]["n"] == 2


def test_a_score_prints_alike_in_tables_the_run_report_and_the_coders_prompt() -> None:
    from evolve.evaluation.report import ScoreBlock
    from evolve.evolution.coder import FITNESS_KEY, _score_table
    from evolve.evolution.report import _cell
    from evolve.scoring import fmt_score

    value = 2 / 3
    assert fmt_score(value) == f"{value:.3f}" and fmt_score(None) == "—"
    row = {**dict.fromkeys((FITNESS_KEY, *METRICS), value), "n": 3}  # the fitness column first
    block = ScoreBlock.model_validate({"overall": row, "by_capability": {}})
    table = _score_table({"train": block}, "train")
    cells = " | ".join([fmt_score(value)] * (len(METRICS) + 1))
    assert table.splitlines()[2] == f"| overall | 3 | {cells} |"
    assert f">{fmt_score(value)}<" in _cell(value)
