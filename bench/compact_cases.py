"""Benchmark: how much compact diagnostic cases (docs/design.md §4) shrink full cases (not a test).

On BEAM-100K train, builds each question's *full* case — question, reference answer, every
evidence message with its whole session as source text, a retrieved text, and per evidence
message the memory units that represent it — then compacts it with
:func:`evolve.evolution.compact.compact_case` and prints, in characters: mean sizes before and
after, the reduction (of the mean size, as the paper reports it: −43.8 %, and the mean of
per-case reductions), sizes by part, and the share of evidence snippets whose best unit is kept
(must be 100 %).

Stand-ins, printed with the results: the retrieved text is the conversation's messages ranked by
BM25 of the question (bm25s), packed up to 16,000 characters (the dense seed's own retrieval
needs its offline index, too slow to build here); the units of an evidence message are the five
messages of its conversation ranked highest by BM25 of that message (what a one-unit-per-message
program stores); there is no predicted answer (offline). ``--limit`` questions are a fixed-seed
sample of the split.

    python bench/compact_cases.py --data-dir ../shared/data [--limit 40] [--embedder hashing]
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import bm25s
import numpy as np
import Stemmer

from evolve.datasets.beam import load_taskset
from evolve.datasets.types import Conversation, Question
from evolve.evolution.compact import EXCERPT_CHARS, best_unit, compact_case
from evolve.models.embed import Embedder
from evolve.models.testing import HashingEmbedder

RETRIEVED_CHARS = 16_000
UNITS_PER_EVIDENCE = 5
SEED = 0  # of the question sample
OPENING = 80  # characters of an evidence message looked for in its source excerpt
PARTS = {
    "question, answer, evidence": ("question", "reference_answer", "answer", "evidence"),
    "source texts": ("evidence_source",),
    "retrieved": ("retrieved",),
    "units": ("units_for_evidence",),
}
_stemmer = Stemmer.Stemmer("english")


def _chars(value: Any) -> int:
    if isinstance(value, str):
        return len(value)
    if isinstance(value, list):
        return sum(_chars(v) for v in value)
    return 0


def part_chars(case: dict[str, Any]) -> dict[str, int]:
    """Characters of the displayed texts of a case, by part; a repeated source text counts once."""
    shown = {**case, "evidence_source": list(dict.fromkeys(case.get("evidence_source") or []))}
    return {name: sum(_chars(shown.get(k)) for k in keys) for name, keys in PARTS.items()}


class Lexical:
    """BM25 over one conversation's messages, each rendered ``[date] role: content``."""

    def __init__(self, conv: Conversation) -> None:
        self.ids = [m.id for s in conv.sessions for m in s.messages]
        self.texts = [
            f"[{s.date or 'undated'}] {m.role}: {m.content}"
            for s in conv.sessions
            for m in s.messages
        ]
        self.index = bm25s.BM25()
        tokens = bm25s.tokenize(self.texts, stopwords="en", stemmer=_stemmer, show_progress=False)
        self.index.index(tokens, show_progress=False)

    def ranked(self, query: str) -> list[int]:
        tokens = bm25s.tokenize(
            [query], stopwords="en", stemmer=_stemmer, return_ids=False, show_progress=False
        )[0]
        if not tokens:
            return []
        scores = self.index.get_scores(tokens)
        order = np.argsort(-scores, kind="stable")
        return [int(i) for i in order if scores[i] > 0]

    def retrieved(self, query: str) -> str:
        """Top messages in rank order, each kept if it still fits in RETRIEVED_CHARS."""
        out: list[str] = []
        used = 0
        for i in self.ranked(query):
            cost = len(self.texts[i]) + (2 if out else 0)
            if used + cost <= RETRIEVED_CHARS:
                out.append(self.texts[i])
                used += cost
        return "\n\n".join(out)


def full_case(q: Question, conv: Conversation, lexical: Lexical) -> dict[str, Any]:
    """The uncut case of ``q``, in the shape :func:`compact_case` reads."""
    found = conv.messages()
    ids = [e for e in q.evidence_ids if e in found]
    evidence = [lexical.texts[lexical.ids.index(e)] for e in ids]
    retrieved = lexical.retrieved(q.question)
    return {
        "id": q.id,
        "capability": q.capability,
        "ability": q.ability,
        "question": q.question,
        "reference_answer": q.gold,
        "evidence": evidence,
        "evidence_source": [found[e][0].render() for e in ids],
        "units_for_evidence": [
            [lexical.texts[i] for i in lexical.ranked(e)[:UNITS_PER_EVIDENCE]] for e in evidence
        ],
        "query": {"text": q.question},
        "retrieved": retrieved,
        "retrieved_chars": len(retrieved),
        "answer": None,
        "scores": {},
        "error": None,
    }


def check(case: dict[str, Any], small: dict[str, Any], embedder: Embedder) -> list[int]:
    """[best units kept, snippets with units, snippets, openings shown in their source excerpt]."""
    counts = [0, 0, len(case["evidence"]), 0]
    sources = case["evidence_source"]
    pairs = zip(case["evidence"], case["units_for_evidence"], strict=True)
    for i, (snippet, units) in enumerate(pairs):
        if units:
            counts[0] += best_unit(snippet, units, embedder) in small["units_shown"][i]
            counts[1] += 1
        opening = snippet.partition(": ")[2][:OPENING]  # "[date] role: content"
        counts[3] += opening in small["evidence_source"][sources.index(sources[i])]
    return counts


def sample(questions: tuple[Question, ...], limit: int) -> list[Question]:
    """A fixed-seed sample of ``limit`` questions (all of them when fewer), in loader order."""
    chosen = set(random.Random(SEED).sample(range(len(questions)), min(limit, len(questions))))
    return [q for i, q in enumerate(questions) if i in chosen]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", type=Path, default=Path("../shared/data"))
    parser.add_argument("--limit", type=int, default=40, help="questions (a fixed-seed sample)")
    parser.add_argument("--embedder", choices=("minilm", "hashing"), default="minilm")
    args = parser.parse_args()
    print("$ python " + " ".join(shlex.quote(a) for a in sys.argv))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores ({cores} usable), "
          f"load average {load}, Python {platform.python_version()}")  # fmt: skip
    if args.embedder == "hashing":
        embedder: Embedder = HashingEmbedder()
        print("embedder: HashingEmbedder (TEST DOUBLE, not a language model): a quick run only")
    else:
        embedder = Embedder(cache_path=Path.home() / ".cache/prismem/embeddings.sqlite")
        print(f"embedder: {embedder.name}, cache {embedder.cache_path}")
    print(f"stand-ins: retrieved = BM25 of the question over the conversation's messages, packed "
          f"to {RETRIEVED_CHARS:,} chars; units = the {UNITS_PER_EVIDENCE} messages ranked "
          f"highest by BM25 of each evidence message; no prediction (offline)")  # fmt: skip
    tasks = load_taskset(args.data_dir, "train")
    convs = {c.id: c for c in tasks.conversations}
    lexicals: dict[str, Lexical] = {}
    before: list[dict[str, int]] = []
    after: list[dict[str, int]] = []
    seconds: list[float] = []
    counts = [0, 0, 0, 0]  # see check()
    for q in sample(tasks.questions, args.limit):
        if q.conversation_id not in lexicals:
            lexicals[q.conversation_id] = Lexical(convs[q.conversation_id])
        case = full_case(q, convs[q.conversation_id], lexicals[q.conversation_id])
        start = time.perf_counter()
        small = compact_case(case, embedder)
        seconds.append(time.perf_counter() - start)
        counts = [a + b for a, b in zip(counts, check(case, small, embedder), strict=True)]
        before.append(part_chars(case))
        after.append(part_chars(small))
        print(f"{q.id}: {sum(before[-1].values()):>9,} -> {sum(after[-1].values()):>6,} chars "
              f"({len(case['evidence'])} evidence, {seconds[-1]:.1f} s)", flush=True)  # fmt: skip
    totals_before = [sum(c.values()) for c in before]
    totals_after = [sum(c.values()) for c in after]
    mean_before, mean_after = statistics.mean(totals_before), statistics.mean(totals_after)
    per_case = [1 - a / b for a, b in zip(totals_after, totals_before, strict=True) if b]
    print(f"\n{len(before)} questions, excerpt budget {EXCERPT_CHARS:,} chars")
    print(f"mean case size: {mean_before:,.0f} -> {mean_after:,.0f} chars "
          f"({mean_after / mean_before - 1:+.1%} of the mean; the paper: -43.8 % in tokens); "
          f"mean per-case change {-statistics.mean(per_case):+.1%}")  # fmt: skip
    for name in PARTS:
        b = statistics.mean(c[name] for c in before)
        a = statistics.mean(c[name] for c in after)
        change = f"{a / b - 1:+.1%}" if b else "—"
        print(f"  {name:>27}: {b:>9,.0f} -> {a:>6,.0f} chars ({change})")
    rest = [sum(c.values()) - c["source texts"] for c in before]
    rest_after = [sum(c.values()) - c["source texts"] for c in after]
    print(f"  without source texts: {statistics.mean(rest):,.0f} -> "
          f"{statistics.mean(rest_after):,.0f} chars "
          f"({sum(rest_after) / sum(rest) - 1:+.1%})")  # fmt: skip
    kept, with_units, snippets, visible = counts
    share = f"{kept / with_units:.1%}" if with_units else "—"
    print(f"best unit kept: {kept}/{with_units} evidence snippets with units ({share})")
    print(f"evidence message opening ({OPENING} chars) shown in its source excerpt: "
          f"{visible}/{snippets}")  # fmt: skip
    print(f"compaction: {statistics.mean(seconds):.2f} s per case (mean), "
          f"{statistics.median(seconds):.2f} s median; embedder {embedder.stats}")  # fmt: skip


if __name__ == "__main__":
    main()
