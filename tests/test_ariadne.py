"""seeds/ariadne.py on small hand-made conversations: gating, coarsening (Merge, Link), bridge
discovery, path serialisation, LLM extraction windows, the output budget, the step cache and
the sandbox."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import numpy as np

from contract.program import LoadedProgram, load_program, offline_units
from contract.records import build_record
from contract.spec import OUT_CHAR_BUDGET
from contract.state import dump_state, load_state
from contract.types import BackendError, Message, Segment
from sandbox.check import check_program

SEED = Path(__file__).resolve().parents[1] / "seeds" / "ariadne.py"
DIM = 512


class BagOfWords:
    """Deterministic backend: hashed bag-of-words vectors, L2-normalised; no LLM by default."""

    def __init__(self, replies: list[str] | None = None, max_complete_calls: int = 8) -> None:
        self.dim = DIM
        self.max_complete_calls = max_complete_calls
        self.replies = list(replies or [])
        self.prompts: list[str] = []

    def embed(self, texts: list[str]) -> np.ndarray:
        out = np.zeros((len(texts), DIM), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in re.findall(r"[a-z0-9]+", text.lower()):
                out[row, int(hashlib.md5(word.encode()).hexdigest(), 16) % DIM] += 1.0
            norm = np.linalg.norm(out[row])
            if norm:
                out[row] /= norm
        return out

    def complete(self, prompt: str, max_tokens: int = 256) -> str:
        if not self.replies:
            raise BackendError("no task LLM")
        self.prompts.append(prompt)
        return self.replies.pop(0)


def program(**constants: Any) -> LoadedProgram:
    loaded = load_program(SEED.read_text(), str(SEED))
    for name, value in constants.items():
        assert name in vars(loaded.module), name
        vars(loaded.module)[name] = value
    return loaded


def session(sid: str, date: str | None, *texts: str, role: str = "user") -> Segment:
    return Segment(sid, date, tuple(Message(f"{sid}-{i}", role, t) for i, t in enumerate(texts)))


def build(prog: LoadedProgram, backend: BagOfWords, *segments: Segment) -> Any:
    memory = prog.get("Memory")(backend)
    for segment in segments:
        assert memory.index(offline_units(prog, segment), segment) is None
    return memory


def ask(prog: LoadedProgram, memory: Any, question: str) -> str:
    text = memory.retrieve(build_record(prog.query, question, vars(prog.module)))
    assert isinstance(text, str) and len(text) <= OUT_CHAR_BUDGET
    return text


def cosine(backend: BagOfWords, a: str, b: str) -> float:
    va, vb = backend.embed([a, b])
    return float(va @ vb)


OLD = "the team meeting with Dana on Friday is at 2pm in room B"
NEW = "the team meeting with Dana on Friday is changed to 3pm in room B"


def test_a_changed_meeting_time_is_linked_not_merged() -> None:
    prog, backend = program(), BagOfWords()
    assert cosine(backend, f"user: {OLD}", f"user: {NEW}") > 0.7  # similar enough to coarsen
    memory = build(prog, backend, session("1", "2024-05-01", OLD), session("2", "2024-05-02", NEW))
    assert memory.stats["linked"] == 1 and memory.stats["merged"] == 0
    assert memory.size == 2 and memory.newer == {0: [1]} and memory.older == {1: [0]}
    text = ask(prog, memory, "When is the team meeting with Dana?")
    assert "F1 --update--> F2" in text  # the path, old state first
    assert "[F1 | 2024-05-01 | updated by F2] user: " + OLD in text
    assert "[F2 | 2024-05-02 | updates F1] user: " + NEW in text


def test_the_public_code_variant_has_no_link() -> None:
    prog, backend = program(PUBLIC_CODE_VALUES=True), BagOfWords()
    memory = build(prog, backend, session("1", "2024-05-01", OLD), session("2", "2024-05-02", NEW))
    assert memory.size == 2 and memory.newer == {} and memory.stats["linked"] == 0


def test_a_near_duplicate_within_the_hour_is_gated_but_a_later_one_is_merged() -> None:
    prog, backend = program(), BagOfWords()
    said = "I bought a red bicycle for my commute to work"
    again = "I bought a red bicycle for my commute to work today"
    assert cosine(backend, f"user: {said}", f"user: {again}") > 0.6
    first = session("1", "2024-05-01", said)
    soon = session("2", "2024-05-01", again)  # same day: follows session 1 within minutes
    memory = build(prog, backend, first, soon)
    assert memory.stats["gated"] == 1 and memory.size == 1
    assert memory.texts == [f"user: {said}"]
    # a week later the same words pass the gate (long-term recurrence) and merge as a duplicate
    memory.index(offline_units(prog, later := session("3", "2024-05-08", said)), later)
    assert memory.stats["gated"] == 1 and memory.stats["merged"] == 1 and memory.size == 1
    assert memory.repeats == [1] and memory.stamps == ["2024-05-08"]
    assert "said 2 times" in ask(prog, memory, "What did I buy for my commute?")


def test_a_bridge_node_joins_two_disconnected_facts_and_the_path_is_serialised() -> None:
    prog, backend = program(K_SEM=2, K_LEX=0, NODE_BUDGET_MIN=1), BagOfWords()
    start = "we adopted a golden retriever puppy named Biscuit"
    bridge = "our puppy Biscuit had a checkup with Doctor Ruiz, who spotted an allergy"
    end = "Doctor Ruiz recommended a grain free diet for the allergy"
    segments = [
        session("1", "2024-06-01", start),
        session("2", "2024-06-03", bridge),
        session("3", "2024-06-05", end),
        session("4", "2024-08-01", "I repainted the kitchen walls a pale blue colour"),
    ]
    memory = build(prog, backend, *segments)
    assert memory.entities[0] == ["biscuit"] and memory.entities[2] == ["ruiz"]  # no overlap
    question = "which diet for our golden retriever puppy was recommended"
    text = ask(prog, memory, question)
    assert "[F2 | 2024-06-03 | bridge] user: " + bridge in text
    assert "F1 --bridge--> F2 --bridge--> F3" in text
    assert "kitchen" not in text
    # outside the 1-168 h window no bridge is searched for
    far = program(K_SEM=2, K_LEX=0, NODE_BUDGET_MIN=1, BRIDGE_MAX_HOURS=24.0)
    assert "bridge" not in ask(far, build(far, BagOfWords(), *segments), question)


def test_llm_windows_replace_units_within_the_call_budget() -> None:
    reply = {
        "units": [
            {
                "content": "Sam moved to Lisbon on 2024-04-02.",
                "keywords": ["moved", "Lisbon"],
                "entities": ["Sam", "Lisbon"],
                "timestamp": "2024-04-02",
                "role": "user",
                "message_ids": ["1-0", "1-1"],
            }
        ]
    }
    prog = program(EXTRACTION_WINDOW=2)
    backend = BagOfWords(replies=[json.dumps(reply)], max_complete_calls=1)
    segment = session(
        "1",
        "2024-04-03",
        "I moved yesterday",
        "to Lisbon, with Sam",
        "the flat has a balcony",
        "and a view of the river",
    )
    memory = build(prog, backend, segment)
    assert len(backend.prompts) == 1 and "[1-0]" in backend.prompts[0]
    assert memory.stats["llm_windows"] == 1  # the second window fell back to the units
    assert memory.texts == [
        "Sam moved to Lisbon on 2024-04-02.",
        "user: the flat has a balcony",
        "user: and a view of the river",
    ]
    assert memory.entities[0] == ["sam", "lisbon"] and memory.stamps[0] == "2024-04-02"


def test_long_histories_stay_within_the_character_budget() -> None:
    prog, backend = program(FACT_CHARS=8000), BagOfWords()
    segments = [
        session(
            str(s),
            f"2024-01-{s + 1:02d}",
            *(" ".join(f"alpha w{s}x{i}x{j % 60}" for j in range(300)) for i in range(6)),
            role="assistant",
        )
        for s in range(8)
    ]
    memory = build(prog, backend, *segments)
    assert memory.size == 48
    text = ask(prog, memory, "alpha")
    assert text.startswith("Evidence graph:") and 12000 < len(text) <= OUT_CHAR_BUDGET


def test_lexical_terminals_are_those_of_a_bm25s_index_over_every_node() -> None:
    """The postings ``index`` grows, session after session, score every node exactly as a
    bm25s index built over every node's text does (float32, bit for bit), so the K_LEX
    lexical terminals are the same."""
    import bm25s

    prog, backend = program(K_LEX=6, GATE_REDUNDANCY=1.0), BagOfWords()
    words = ["meeting", "Dana", "room", "Lyon", "budget", "flight", "garden", "piano", "tax"]
    segments = [
        session(
            str(s),
            f"2024-02-{s + 1:02d}",
            *(
                " ".join(words[(s * 7 + i * 3 + j) % len(words)] for j in range(2 + i % 5))
                + f" note {s}-{i}"
                for i in range(5)
            ),
        )  # fmt: skip
        for s in range(6)
    ]
    memory = build(prog, backend, *segments)
    assert memory.size > 12 and len(memory.node_terms) == memory.size
    stem = vars(prog.module)["_stemmer"]
    corpus = bm25s.tokenize(memory.texts, stopwords="en", stemmer=stem, show_progress=False)
    index = bm25s.BM25()
    index.index(corpus, show_progress=False)
    for question in ("Dana meeting room", "the flight to Lyon", "piano piano tax", "nothing"):
        terms = bm25s.tokenize([question], stopwords="en", stemmer=stem, return_ids=False,
                               show_progress=False)[0]  # fmt: skip
        scores = index.get_scores(terms) if terms else np.zeros(memory.size, dtype=np.float32)
        assert np.array_equal(memory._bm25(terms), scores), question
        top = vars(prog.module)["top_indices"](scores, 6)
        assert memory._lexical_hits(question) == [int(i) for i in top if scores[i] > 0]


def test_the_built_memory_survives_the_stage_cache() -> None:
    prog, backend = program(), BagOfWords()
    memory = build(prog, backend, session("1", "2024-05-01", OLD), session("2", "2024-05-02", NEW))
    before = ask(prog, memory, "When is the team meeting?")
    data = dump_state(memory, prog.module.__name__, backend)
    restored = load_state(prog.get("Memory"), data, vars(prog.module), backend)
    assert ask(prog, restored, "When is the team meeting?") == before


def test_the_program_passes_every_sandbox_tier() -> None:
    report = check_program(SEED.read_text(), str(SEED))
    assert report.passed, report.repair_text()
