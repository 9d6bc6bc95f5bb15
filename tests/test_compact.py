"""Compact diagnostic cases: spans, budgeted greedy excerpts, best units, whole cases."""

from __future__ import annotations

import random
import re
from collections.abc import Sequence

import numpy as np
import pytest

from evolve.evolution.compact import (
    EXCERPT_CHARS,
    GAP,
    LEAD,
    SAME_SOURCE,
    SAME_UNIT,
    SPAN_CHARS,
    TRAIL,
    Target,
    _added,
    _greedy,
    _inside,
    _render,
    _within,
    best_unit,
    case_targets,
    compact_case,
    excerpt,
    split_spans,
)
from evolve.models.testing import HashingEmbedder

WORDS = (
    "river garden violin copper lantern meadow orbit pepper canyon harbor marble velvet "
    "thunder willow saddle pixel tundra glacier amber falcon quartz nectar ember prism"
).split()


class CountingEmbedder(HashingEmbedder):
    """The hashing double, counting calls to ``embed``."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.calls += 1
        return super().embed(texts)


def filler(rng: random.Random, sentences: int) -> str:
    """Unrelated prose: sentences of random words from WORDS."""
    return " ".join(
        " ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 14))).capitalize() + "."
        for _ in range(sentences)
    )


def session(rng: random.Random, sid: int, messages: int, first_id: int = 0) -> str:
    lines = [f"## Session {sid} (2024-03-{10 + sid:02d})"]
    for k in range(messages):
        role = "user" if k % 2 == 0 else "assistant"
        paras = "\n\n".join(filler(rng, rng.randint(1, 6)) for _ in range(rng.randint(1, 4)))
        lines.append(f"[{first_id + k}] {role}: {paras}")
    return "\n".join(lines)


def assert_in_order(out: str, text: str) -> None:
    """Every displayed piece is verbatim source text, in source order."""
    pos = 0
    for line in out.split("\n"):
        for piece in (p for p in line.split(" ... ") if p not in ("", "...")):
            body = re.sub(r"^\[\d+\] (?:user|assistant): ", "", piece)
            if re.fullmatch(r"## Session \d+ \(2024-03-\d\d\)", body):
                continue  # a repeated session header
            found = text.find(body, pos)
            assert found >= 0, (body[:80], pos)
            pos = found + len(body)


def test_records_are_spans_with_their_headers() -> None:
    text = (
        "## Session 1 (2024-03-15)\n[0] user: Hello there.\n[1] assistant: Hi! How can I help?\n"
        "user: a bare role line\nassistant: another one\n[2024-03-16] user: dated record"
    )
    spans = split_spans(text)
    assert [s.text for s in spans] == [
        "## Session 1 (2024-03-15)\n[0] user: Hello there.",  # the header stays with its record
        "[1] assistant: Hi! How can I help?",
        "user: a bare role line",
        "assistant: another one",
        "[2024-03-16] user: dated record",
    ]
    assert [s.prefix for s in spans] == [
        "[0] user:", "[1] assistant:", "user:", "assistant:", "[2024-03-16] user:"
    ]  # fmt: skip
    assert all(s.heads and s.session == "## Session 1 (2024-03-15)" for s in spans)
    assert all(text[s.start : s.end] == s.text for s in spans)


def test_long_records_split_into_paragraphs_then_sentences() -> None:
    rng = random.Random(1)
    paras = [filler(rng, 3) for _ in range(4)]
    long_para = " ".join(filler(rng, 1) for _ in range(60))
    text = "[5] assistant: " + "\n\n".join(paras) + "\n\n" + long_para + "\n[6] user: ok"
    spans = split_spans(text)
    assert [s.text for s in spans[:4]] == ["[5] assistant: " + paras[0], *paras[1:]]
    assert spans[0].heads and not any(s.heads for s in spans[1:-1])
    assert {s.record for s in spans[:-1]} == {spans[0].record} != {spans[-1].record}
    sentences = spans[4:-1]
    assert len(sentences) > 5 and all(s.text.endswith(".") for s in sentences)
    assert all(len(s.text) <= SPAN_CHARS for s in spans)
    assert " ".join(s.text for s in sentences) == long_para


def test_code_blocks_stay_whole_and_headings_join_their_paragraph() -> None:
    rng = random.Random(2)
    code = "```python\n" + "\n\n".join(f"x_{i} = {i}  # {filler(rng, 1)}" for i in range(20))
    code += "\n```"
    assert SPAN_CHARS < len(code) < EXCERPT_CHARS - 300
    fake = "[3] user: not a record inside code"
    code = code.replace("x_7 = 7", fake)
    text = f"[1] user: {filler(rng, 8)}\n\n### Heading\n\n{filler(rng, 2)}\n\n{code}\n\nAfter."
    texts = [s.text for s in split_spans(text)]
    assert code in texts  # blank lines and a record-like line inside do not cut it
    assert any(t.startswith("### Heading\n\n") for t in texts)
    assert "### Heading" not in texts


def test_spans_cover_the_text_in_order_with_only_whitespace_between() -> None:
    rng = random.Random(3)
    text = "\n".join(session(rng, s, 12, 12 * s) for s in range(3))
    text += "\n" + "y" * 5000  # no spaces: cut hard
    spans = split_spans(text)
    assert all(a.end <= b.start for a, b in zip(spans, spans[1:], strict=False))
    assert all(text[a.end : b.start].strip() == "" for a, b in zip(spans, spans[1:], strict=False))
    assert text[: spans[0].start].strip() == text[spans[-1].end :].strip() == ""
    headed = [s for s in spans if s.text.startswith("## Session")]  # a header joins its span
    assert len(headed) == 3
    assert max(len(s.text) for s in spans if s not in headed) <= SPAN_CHARS
    assert [len(s.text) for s in spans[-9:]] == [600] * 8 + [200]


def test_budget_never_exceeded_and_order_kept() -> None:
    embedder = HashingEmbedder()
    for seed in range(8):
        rng = random.Random(seed)
        text = "\n".join(session(rng, s, rng.randint(3, 15), 20 * s) for s in range(3))
        targets = [Target(filler(rng, 1), 1.0), Target(filler(rng, 2), 0.5)]
        for budget in (500, 1_000, EXCERPT_CHARS):
            out = excerpt(text, targets, embedder, budget)
            assert 0 < len(out) <= budget
            assert_in_order(out, text)


def test_greedy_updates_costs_as_if_recomputed_each_pick() -> None:
    """Only the spans between a pick's neighbours are re-measured; the picks equal those of
    re-measuring every span at every pick (ties included)."""
    rng = random.Random(7)
    for trial in range(12):
        text = "\n".join(session(rng, k, rng.randint(3, 9)) for k in range(1, 4))
        spans = split_spans(text, 1200)
        score = np.round(np.random.default_rng(trial).random((len(spans), 3)), 1)
        weights = np.array([1.0, 0.5, 0.25])
        for per_char in (True, False):
            chosen: list[int] = []
            cover, used = np.zeros(3), 0
            while True:  # the definition: every span's added characters measured afresh
                gains = np.maximum(score - cover, 0.0) @ weights
                pick = None
                for i in (i for i in range(len(spans)) if i not in chosen):
                    cost = _added(text, spans, chosen, i)
                    key = gains[i] / max(cost, 1) if per_char else gains[i]
                    if used + cost <= 1200 and (pick is None or key > pick[0]):
                        pick = (key, i, cost)
                if pick is None:
                    break
                chosen, used = sorted([*chosen, pick[1]]), used + pick[2]
                cover = np.maximum(cover, score[pick[1]])
            assert _greedy(text, spans, score, weights, 1200, per_char) == (
                float(cover @ weights), chosen)  # fmt: skip


def test_fence_lookups_match_a_scan() -> None:
    fences = [(3, 9), (12, 13), (20, 40)]
    for pos in range(45):
        assert _inside(pos, fences) == any(a < pos < b for a, b in fences)
        for end in range(pos + 1, 45):
            assert _within(pos, end, fences) == any(a <= pos and end <= b for a, b in fences)
    assert not _inside(5, []) and not _within(5, 6, [])


def test_headers_repeated_after_an_omission() -> None:
    answer = "The launch is on 14 October in Lisbon with Marta."
    line = " ".join(WORDS * 2)
    first = "\n".join(f"[{i}] user: {line}" for i in range(15))
    text = (
        f"## Session 1 (2024-03-11)\n{first}\n## Session 2 (2024-03-12)\n"
        f"[20] assistant: {line}\n\n{answer}\n\n{line}\n[21] user: {line}"
    )
    out = excerpt(text, [Target(answer, 1)], HashingEmbedder())
    assert len(out) <= EXCERPT_CHARS
    head = re.escape("...\n## Session 2 (2024-03-12)\n[20] assistant: ")
    assert re.search(f"{head}(?:{re.escape(line)}\n\n)?{re.escape(answer)}", out)


def test_cost_accounting_is_exact() -> None:
    rng = random.Random(6)
    text = "\n".join(session(rng, s, 6, 10 * s) for s in range(1, 4))
    spans = split_spans(text)
    for _ in range(50):
        chosen: list[int] = []
        used = 0
        for i in rng.sample(range(len(spans)), rng.randint(1, 12)):
            used += _added(text, spans, sorted(chosen), i)
            chosen = sorted([*chosen, i])
            assert used == len(_render(text, spans, chosen))


def test_omitted_head_and_tail_are_marked() -> None:
    filler_para = " ".join(WORDS)
    facts = [
        f"Fact {k}: the {w} vault access code is {k * 37 + 100}, keep it."
        for k, w in enumerate(WORDS[:8])
    ]
    text = "\n\n".join([filler_para] * 5 + facts + [filler_para] * 5)
    out = excerpt(text, [Target(f, 1) for f in facts], HashingEmbedder(), budget=500)
    assert out == LEAD + "\n\n".join(facts) + TRAIL
    assert len(out) + len(GAP) + len(filler_para) > 500  # no filler paragraph fits


def test_the_span_with_the_answer_is_chosen() -> None:
    embedder = HashingEmbedder()
    for seed in range(5):
        rng = random.Random(seed)
        answer = "Priya adopted a greyhound named Biscuit in Toronto."
        paras = [filler(rng, 5) for _ in range(30)]
        paras.insert(rng.randrange(30), answer)
        text = "\n\n".join(paras)
        case = {"question": "What dog did Priya adopt?", "reference_answer": "Biscuit, a greyhound"}
        out = excerpt(text, case_targets(case), embedder)
        assert answer in out


def test_short_texts_unchanged() -> None:
    embedder = CountingEmbedder()
    text = "[1] user: short\n\n" + "z " * 1000
    assert len(text) <= EXCERPT_CHARS
    assert excerpt(text, [Target("anything", 1.0)], embedder) == text
    case = {"question": "q?", "reference_answer": "a", "evidence": ["e"], "retrieved": text}
    assert compact_case(case, embedder) == case


def test_targets_and_weights() -> None:
    case = {"question": "Q?", "reference_answer": "A.", "evidence": ["e1", "e2"], "answer": "P"}
    assert case_targets(case) == [
        Target("Q?\nA.", 1.0), Target("e1", 0.5), Target("e2", 0.5), Target("P", 0.5)
    ]  # fmt: skip
    assert case_targets({"question": "Q?", "evidence": [], "answer": None}) == [Target("Q?", 1.0)]


def test_best_unit() -> None:
    embedder = HashingEmbedder()
    units = ["copper lantern", "Priya adopted Biscuit the greyhound", "Priya adopted"]
    assert best_unit("Priya adopted a greyhound named Biscuit", units, embedder) == 1
    assert best_unit("zzz", ["a b", "a b"], embedder) == 0  # ties: the first
    with pytest.raises(ValueError):
        best_unit("x", [], embedder)


def big_case(seed: int) -> dict:
    rng = random.Random(seed)
    evidence = [
        "[2024-03-11] user: Priya adopted a greyhound named Biscuit in Toronto.",
        "[2024-03-12] assistant: " + filler(rng, 80),  # longer than an excerpt
        "[2024-03-12] user: The marathon was moved to Sunday the ninth.",
    ]
    source_1 = session(rng, 1, 12) + "\n[8] user: " + evidence[0].split(": ", 1)[1]
    source_2 = session(rng, 2, 8, 9) + "\n[17] assistant: " + evidence[1].split(": ", 1)[1]
    marathon = "The marathon was moved to Sunday the ninth, said the user."
    units = [
        [filler(rng, 20), evidence[0], filler(rng, 20), filler(rng, 20), marathon],
        [filler(rng, 25), filler(rng, 25), evidence[1], filler(rng, 25)],
        [filler(rng, 3), marathon],
    ]
    return {
        "id": "beam/x/0",
        "question": "What dog did Priya adopt, and when is the marathon?",
        "reference_answer": "Biscuit, a greyhound; Sunday the ninth.",
        "evidence": evidence,
        "evidence_source": [source_1, source_2, source_2],
        "units_for_evidence": units,
        "query": {"text": "dog marathon"},
        "retrieved": "\n\n".join(filler(rng, 6) for _ in range(40)),
        "retrieved_chars": 0,
        "answer": "Biscuit; the marathon is on Saturday.",
        "scores": {"evidence_similarity": 0.2},
    }


def test_compact_case() -> None:
    embedder = CountingEmbedder()
    case = big_case(0)
    assert min(len(case["retrieved"]), *map(len, case["evidence_source"])) > EXCERPT_CHARS
    out = compact_case(case, embedder)
    assert embedder.calls == 1  # one batched call per case
    assert out["id"] == case["id"] and out["query"] == case["query"]
    assert out["scores"] == case["scores"] and out["evidence"][0] == case["evidence"][0]
    for key in ("retrieved", "evidence_source", "evidence", "units_for_evidence"):
        assert out[key] != case[key]
    assert all(len(t) <= EXCERPT_CHARS for t in [out["retrieved"], *out["evidence"]])
    assert all(len(t) <= EXCERPT_CHARS for t in out["evidence_source"])
    assert out["evidence_source"][2] == SAME_SOURCE.format(n=2)
    assert "Priya adopted a greyhound named Biscuit" in out["evidence_source"][0]
    pairs = zip(case["evidence"], case["units_for_evidence"], strict=True)
    bests = [best_unit(e, us, embedder) for e, us in pairs]
    assert bests == [1, 2, 1]
    assert all(b in kept for b, kept in zip(bests, out["units_shown"], strict=True))
    views, shown = out["units_for_evidence"], out["units_shown"]
    assert views[0][shown[0].index(1)] == views[1][shown[1].index(2)] == SAME_UNIT
    assert views[2][shown[2].index(1)] == case["units_for_evidence"][2][1]
    assert sum(len(v) for vs in views for v in vs) <= EXCERPT_CHARS
    assert [len(vs) for vs in views] == [len(k) for k in out["units_shown"]]
    raw = [case["units_for_evidence"][i][j] for i, k in enumerate(out["units_shown"]) for j in k]
    assert len(raw) == len(set(raw)) > 3  # other units added, none twice
    assert compact_case(case, HashingEmbedder()) == out  # deterministic


def test_units_beyond_the_best_fill_one_budget_without_repeats() -> None:
    rng = random.Random(5)
    marathon = "The marathon was moved to Sunday the ninth, said the user."
    units = [
        [filler(rng, 3), "Priya adopted Biscuit, a greyhound.", marathon, filler(rng, 60)],
        [filler(rng, 4), marathon],
    ]
    case = {
        "question": "Which dog, and when is the marathon?",
        "evidence": ["Priya adopted a greyhound named Biscuit.", "The marathon moved to Sunday."],
        "units_for_evidence": units,
    }
    out = compact_case(case, HashingEmbedder())
    assert out["units_shown"] == [[0, 1], [0, 1]]  # the marathon unit is shown once, as a best
    assert out["units_for_evidence"] == [[units[0][0], units[0][1]], units[1]]
    assert sum(map(len, units[0][:2] + units[1])) + len(units[0][3]) > EXCERPT_CHARS


def test_compact_case_checks_unit_lists() -> None:
    case = big_case(1)
    case["units_for_evidence"] = case["units_for_evidence"][:2]
    with pytest.raises(ValueError):
        compact_case(case, HashingEmbedder())


def test_small_budgets_rejected() -> None:
    with pytest.raises(ValueError):
        excerpt("x" * 1000, [], HashingEmbedder(), budget=100)
