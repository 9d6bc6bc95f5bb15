"""seeds/prism.py on small hand-made conversations, with a fake backend.

The fake backend embeds hashed bags of words (deterministic, no model) unless a text has a
vector of its own, and its ``complete`` raises BackendError (offline) or answers from a script.
Checks: the relation-bridge templates reach an episode no backbone path brings into the bundle
(episode chain, dated facts, evolution edges) and the temporal intent's discount lets it in;
intent routing (keyword tier, LLM tier); entity merging at cosine 0.90; the LLM path (PRISM
units, causal induction, rerank, call budget); the parameter sheet against the constants; the
sandbox check.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from contract.program import LoadedProgram, load_program, offline_units
from contract.state import dump_state, load_state
from contract.types import BackendError, Message, Segment
from sandbox.check import check_program

PATH = Path(__file__).resolve().parents[1] / "seeds" / "prism.py"
DIM = 512
QUIET = {"user", "assistant", "from"}  # words the fake embedder ignores


class FakeBackend:
    """Hashed bag-of-words embeddings; ``complete`` scripted or raising BackendError."""

    def __init__(
        self,
        script: Callable[[str], str] | None = None,
        vectors: dict[str, np.ndarray] | None = None,
        max_complete_calls: int = 8,
    ) -> None:
        self.dim = DIM
        self.max_complete_calls = max_complete_calls
        self.script = script
        self.vectors = vectors or {}
        self.prompts: list[str] = []

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), DIM), dtype=np.float32)
        for i, text in enumerate(texts):
            if text in self.vectors:
                out[i] = self.vectors[text]
                continue
            for word in re.findall(r"[a-z0-9]+", text.lower()):
                if word not in QUIET:
                    out[i, int(hashlib.md5(word.encode()).hexdigest(), 16) % DIM] += 1.0
            norm = np.linalg.norm(out[i])
            out[i] = out[i] / norm if norm else np.eye(DIM, dtype=np.float32)[0]
        return out

    def complete(self, prompt: str, max_tokens: int = 256) -> str:
        self.prompts.append(prompt)
        if self.script is None:
            raise BackendError("backend.complete: no task LLM configured")
        return self.script(prompt)


@pytest.fixture(scope="module")
def program() -> LoadedProgram:
    return load_program(PATH.read_text(), str(PATH))


def fresh(program: LoadedProgram) -> LoadedProgram:
    """A separate module, so a test may change its constants."""
    return load_program(PATH.read_text(), str(PATH))


def session(program: LoadedProgram, sid: str, day: str, *texts: str) -> tuple[list[Any], Segment]:
    """Offline units, as the executor builds them: one per message, role and date filled."""
    messages = tuple(Message(f"{sid}-{i}", "user", text) for i, text in enumerate(texts))
    segment = Segment(sid, day, messages)
    units = offline_units(program, segment)
    return units, segment


def query(program: LoadedProgram, text: str, **fields: Any) -> Any:
    return program.query(text=text, **fields)


def distractors(program: LoadedProgram, memory: Any, n: int = 12) -> None:
    """n one-message sessions in January 2024 that share only the word 'i' with the queries."""
    for k in range(n):
        words = " ".join(f"w{k}x{j}" for j in range(16))
        memory.index(*session(program, f"d{k}", f"2024-01-{k + 1:02d}", f"i {words}"))


# -- N1 and N2: relation bridges ------------------------------------------------------------


def build_temporal(program: LoadedProgram) -> Any:
    memory = program.get("Memory")(FakeBackend())
    distractors(program, memory)
    memory.index(*session(program, "a", "2024-06-01", "when did i buy the violin"))
    memory.index(*session(program, "t", "2024-06-02", "qqz rrk plonk vext"))
    return memory


def test_temporal_bridge_reaches_the_next_episode(program: LoadedProgram) -> None:
    text = build_temporal(program).retrieve(query(program, "When did I buy the violin?"))
    assert "when did i buy the violin" in text
    assert "qqz rrk plonk vext" in text  # no word in common with the question
    assert "2024-06-02" in text and len(text) <= program.get("OUT_CHAR_BUDGET")


def test_temporal_bridge_needs_the_relation_paths(program: LoadedProgram) -> None:
    off = fresh(program)
    off.module.RELATION_PATHS = False
    text = build_temporal(off).retrieve(query(off, "When did I buy the violin?"))
    assert "when did i buy the violin" in text and "qqz rrk plonk vext" not in text


def test_temporal_discount_follows_the_intent(program: LoadedProgram) -> None:
    """Without a temporal trigger the chain edge costs full price and the bridge loses."""
    text = build_temporal(program).retrieve(query(program, "Did I buy the violin?"))
    assert "buy the violin" in text and "qqz rrk plonk vext" not in text


def test_evolution_bridge_reaches_an_old_episode_of_the_same_entity(program: LoadedProgram) -> None:
    def build(prog: LoadedProgram) -> Any:
        memory = prog.get("Memory")(FakeBackend())
        memory.index(*session(prog, "old", "2023-05-01", "zzq Marcello brv kloo"))
        distractors(prog, memory)
        memory.index(*session(prog, "a", "2024-06-01", "when did i buy the violin from Marcello"))
        return memory

    text = build(program).retrieve(query(program, "When did I buy the violin?"))
    assert "zzq Marcello brv kloo" in text and "2023-05-01" in text
    off = fresh(program)
    off.module.RELATION_PATHS = False
    assert "zzq Marcello brv kloo" not in build(off).retrieve(query(off, "When did I buy it?"))


def test_temporal_bridge_between_dated_facts(program: LoadedProgram) -> None:
    """Facts with explicit dates are linked to the nearest dated facts before and after."""

    def build(prog: LoadedProgram) -> Any:
        memory = prog.get("Memory")(FakeBackend())
        memory.index(*session(prog, "old", "2023-05-01", "zzq brv kloo on March 4, 2024"))
        distractors(prog, memory)
        memory.index(*session(prog, "a", "2024-06-01", "when did i buy the violin March 3, 2024"))
        return memory

    memory = build(program)
    assert [t for t, _ in memory.timed] == [738948, 738949]  # 2024-03-03, 2024-03-04
    assert "zzq brv kloo" in memory.retrieve(query(program, "When did I buy the violin?"))
    off = fresh(program)
    off.module.RELATION_PATHS = False
    assert "zzq brv kloo" not in build(off).retrieve(query(off, "When did I buy the violin?"))


# -- N4: intent routing -------------------------------------------------------------------------


def test_keyword_tier_routes_when_and_before_questions(program: LoadedProgram) -> None:
    backend = FakeBackend(script=lambda prompt: pytest.fail("the keyword tier needs no LLM"))
    memory = program.get("Memory")(backend)
    calls = program.get("Calls")(backend.max_complete_calls)
    for question in ("When did I move to Lisbon?", "What did I cook before the party?"):
        qvec = backend.embed([question])[0]
        assert memory._route(question, qvec, calls) == {"temporal"}
    question = "Why did I quit the band?"
    assert memory._route(question, backend.embed([question])[0], calls) == {"causal"}
    assert memory.prototypes is None and backend.prompts == []


def test_llm_tier_scores_intents_and_multi_hop_suppresses_entity_centric(
    program: LoadedProgram,
) -> None:
    reply = {"temporal": 0.1, "causal": 0.3, "multi_hop": 0.9, "entity_centric": 0.6}
    backend = FakeBackend(script=lambda prompt: "Scores: " + json.dumps(reply))
    memory = program.get("Memory")(backend)
    calls = program.get("Calls")(backend.max_complete_calls)
    question = "Summarise my gardening plans"
    assert memory._route(question, backend.embed([question])[0], calls) == {"multi_hop"}
    assert len(backend.prompts) == 1 and question in backend.prompts[0]
    offline = program.get("Memory")(FakeBackend())
    offline_calls = program.get("Calls")(8)
    assert offline._route(question, backend.embed([question])[0], offline_calls) == set()


# -- graph construction -------------------------------------------------------------------------


def unit_vector(cos: float, axis: int = 0) -> np.ndarray:
    """A vector at the given cosine from the axis, in the plane of the axis and the next."""
    v = np.zeros(DIM, dtype=np.float32)
    v[axis], v[axis + 1] = cos, np.sqrt(1.0 - cos * cos)
    return v


def test_entities_merge_at_cosine_090(program: LoadedProgram) -> None:
    vectors = {
        "Alpha Centauri": unit_vector(1.0),
        "Alpha Centaurus": unit_vector(0.91),
        "Alpha Station": unit_vector(0.89),
        "Gamma Ray": unit_vector(1.0, axis=4),
        "Gamma Rays": unit_vector(0.92, axis=4),
    }
    memory = program.get("Memory")(FakeBackend(vectors=vectors))
    memory.index(*session(program, "1", "2024-01-01", "we flew to Alpha Centauri today"))
    memory.index(*session(program, "2", "2024-01-02", "we flew to Alpha Centaurus today"))
    memory.index(*session(program, "3", "2024-01-03", "we flew to Alpha Station today"))
    ids = memory.entity_ids
    assert ids["alpha centaurus"] == ids["alpha centauri"]  # cosine 0.91
    assert ids["alpha station"] != ids["alpha centauri"]  # cosine 0.89
    # two names new in the same batch merge with each other too
    memory.index(*session(program, "4", "2024-01-04", "we saw Gamma Ray", "we saw Gamma Rays"))
    assert ids["gamma rays"] == ids["gamma ray"] == 2
    names = [e.name for e in memory.entities]
    assert sorted(names) == ["Alpha Centauri", "Alpha Station", "Gamma Ray"]


def test_offline_graph_layers_and_stored_state(program: LoadedProgram) -> None:
    backend = FakeBackend()
    memory = program.get("Memory")(backend)
    texts = [f"day {i}: tour k{i}a k{i}b k{i}c of Lisbon on March {i + 1}, 2024" for i in range(6)]
    texts[1] = texts[0] + " again"  # a near copy in the same episode: one facet
    memory.index(*session(program, "s", "2024-03-20", *texts))
    assert len(memory.episodes) == 2  # EPISODE_UNITS = 4 messages per episode
    assert len(memory.facets) == 5 and len(memory.points) == 6
    assert [len(f.points) for f in memory.facets] == [2, 1, 1, 1, 1]
    assert len(memory.timed) == 6  # every fact carries an explicit date
    lisbon = memory.entity_ids["lisbon"]
    assert len(memory.entities[lisbon].points) == 6 and len(memory.evolution) == 6
    assert "march" not in memory.entity_ids and "2024-03-01" in memory.entity_ids
    restored = load_state(
        program.get("Memory"),
        dump_state(memory, program.module.__name__, backend),
        vars(program.module),
        backend,
    )
    question = query(program, "What happened in Lisbon?")
    assert restored.retrieve(question) == memory.retrieve(question)


# -- the LLM path -------------------------------------------------------------------------------


def llm_unit(program: LoadedProgram, k: int) -> Any:
    return program.memory_unit(
        summary=f"Episode {k}: the user repaired bike number {k} with Dora",
        date="2024-02-01",
        entities=["Dora | person", f"bike {k} | other"],
        facet_points=[
            f"the user repaired bike {k} | bike {k} | 2024-02-0{k + 1}",
            f"Dora lent the user a wrench for bike {k} | Dora | null",
        ],
        facets=["repairs | 0, 1"],
        temporal_info=[f"bike {k} | last week | 2024-02-0{k + 1} | at"],
    )


def script(prompt: str) -> str:
    if "causal_pairs" in prompt:
        return json.dumps(
            {
                "causal_pairs": [
                    {"cause_id": "E0", "effect_id": "E1", "description": "d", "confidence": 0.9},
                    {"cause_id": "E2", "effect_id": "E3", "description": "d", "confidence": 0.5},
                    {"cause_id": "E9", "effect_id": "E1", "description": "d", "confidence": 0.9},
                ]
            }
        )
    if "Rate from 0 to 10" in prompt:
        return json.dumps([{"index": i, "score": i} for i in range(10)])
    return '{"temporal": 0.0, "causal": 0.0, "multi_hop": 0.0, "entity_centric": 0.0}'


def test_llm_units_causal_induction_and_rerank(program: LoadedProgram) -> None:
    backend = FakeBackend(script=script, max_complete_calls=2)
    memory = program.get("Memory")(backend)
    units = [llm_unit(program, k) for k in range(6)]
    memory.index(units, Segment("1", "2024-02-10", ()))
    assert len(memory.episodes) == 6 and memory.episodes[0].summary.startswith("Episode 0")
    assert memory.causal == {0: [1], 1: [0]}  # below 0.7 and unknown ids are dropped
    assert sum("causal_pairs" in p for p in backend.prompts) == 1  # every 5 episodes
    dora = memory.entities[memory.entity_ids["dora"]]
    assert len(dora.points) == 6 and len(memory.timed) == 12  # times via temporal_info
    assert memory.points[0].time is not None
    broken = program.memory_unit(summary="", facet_points=["", "null | Dora"], facets=["x | 7"])
    memory.index([broken], Segment("2", "2024-02-11", ()))  # nothing usable: no episode
    assert len(memory.episodes) == 6
    backend.prompts.clear()
    text = memory.retrieve(query(program, "Which bike did Dora help with?"))
    assert len(backend.prompts) <= backend.max_complete_calls
    reranks = [p for p in backend.prompts if "Rate from 0 to 10" in p]
    assert len(reranks) == 1 and len(re.findall(r"^\[\d\] ", reranks[0], re.M)) == 6
    assert text.count("## Episode") == program.get("RERANK_M")
    assert text.count("Dora lent the user") == program.get("RERANK_M")


def test_small_bundle_skips_the_rerank(program: LoadedProgram) -> None:
    backend = FakeBackend(script=script)
    memory = program.get("Memory")(backend)
    memory.index([llm_unit(program, k) for k in range(3)], Segment("1", "2024-02-10", ()))
    memory.retrieve(query(program, "When was bike 1 repaired?"))
    assert not any("Rate from 0 to 10" in p for p in backend.prompts)


# -- the parameter sheet and the sandbox ------------------------------------------------------


def sheet(doc: str) -> dict[str, str]:
    rows = [line.strip("| ").split(" | ") for line in doc.splitlines() if line.startswith("| ")]
    out: dict[str, str] = {}
    for cells in rows[1:]:
        names = [n.strip() for n in cells[0].split(",")]
        values = [v.strip() for v in cells[1].split(",")]
        if len(values) != len(names):
            values = [cells[1]] * len(names)
        out.update(zip(names, values, strict=True))
    return out


def test_parameter_sheet_matches_the_constants(program: LoadedProgram) -> None:
    rows = sheet(program.module.__doc__ or "")
    constants = {
        name: value
        for name, value in vars(program.module).items()
        if name.isupper() and isinstance(value, int | float) and name != "OUT_CHAR_BUDGET"
    }
    assert set(constants) <= set(rows), f"missing from the sheet: {set(constants) - set(rows)}"
    for name, value in constants.items():
        cell = rows[name]
        if isinstance(value, bool):
            assert cell.startswith("on" if value else "off"), name
        else:
            number = re.match(r"\d+(?:\.\d+)?", cell)
            assert number and float(number.group(0)) == value, f"{name}: sheet {cell}, {value}"
    triggers, prototypes = program.get("TRIGGERS"), program.get("PROTOTYPES")
    assert rows["triggers"].startswith(f"{len(triggers['temporal'])} + {len(triggers['causal'])}")
    sizes = {len(p) for p in prototypes.values()}
    assert len(sizes) == 1 and f"{sizes.pop()} per intent" in rows["prototypes"]


def test_passes_every_sandbox_tier() -> None:
    report = check_program(PATH.read_text(), str(PATH))
    assert report.passed, report.repair_text()
    assert [t.name for t in report.tiers] == ["source", "schema", "smoke", "probe"]
