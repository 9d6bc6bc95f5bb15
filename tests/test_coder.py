"""The LLM coder: reply parsing, and the loop driven by a scripted coder.

The scripted coder returns fixed patches — good ones, one that breaks the contract, a hostile
one, one that does not apply — and the tests check the archive, the specialists, the repair
attempts (each fed the previous error), the sandbox rejection, the accounting in the run's call
log, the budget stop with resume at a higher cap, and that a run interrupted mid-round resumes
to the archive of an uninterrupted one. Evaluation is offline with the hashing embedder on one
conversation per split: the numbers mean nothing, but they are deterministic.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import paired_beats, run_config

from evolve.config import REPAIRS
from evolve.evaluation.report import ScoreBlock
from evolve.evolution.budget import calls_path, read_spend
from evolve.evolution.coder import PatchError, apply_reply, render_request, system_prompt
from evolve.evolution.loop import Evolution, RunConfig, specialists
from evolve.evolution.proposer import CandidateView, Request
from evolve.evolution.store import RunStore
from evolve.models.llm import LLMError
from evolve.models.testing import ScriptedLLM
from evolve.scoring.fitness import DEFINITIONS, MODES, VERSION, Fitness, Mode

ROOT = Path(__file__).resolve().parents[1]
HYBRID = (ROOT / "seeds" / "hybrid.py").read_text()
ROUNDS = {"cold_start": 1, "refinement": 2, "integration": 1}
# the runs here: conftest's run_config with these, one child per round, a scripted coder
SCRIPTED = {"rounds": ROUNDS, "coder_model": {"model": "scripted"}, "children": 1,
            "cascade": False}  # fmt: skip
pytestmark = pytest.mark.usefixtures("check_once")  # the runs here check the same programs


def edit(message: str, search: str, replace: str) -> str:
    return f"MESSAGE: {message}\n<<<<<<< SEARCH\n{search}\n=======\n{replace}\n>>>>>>> REPLACE\n"


GOOD_TOP_K = edit("keep more units", "TOP_K = 80", "TOP_K = 120")
GOOD_NEIGHBOURS = edit("add one neighbour", "NEIGHBOURS = 0", "NEIGHBOURS = 1")
GOOD_USER = edit("weigh the user's words up", "USER_WEIGHT = 1.0", "USER_WEIGHT = 1.3")
BREAKS_CONTRACT = edit("rename retrieve", "    def retrieve(self, query):",
                       "    def fetch(self, query):")  # fmt: skip
HOSTILE = edit("cache on disk", "import bm25s", "import bm25s\nimport os\nos.system('id')")
MISSING = edit("tune", "TOP_K = 999", "TOP_K = 5")
# Repairs apply to the program the last applied reply left: each one fixes what it was told.
RENAME_BACK = edit("restore retrieve", "    def fetch(self, query):",
                   "    def retrieve(self, query):")  # fmt: skip
DROP_OS = edit("no os", "import bm25s\nimport os\nos.system('id')", "import bm25s")
REFINE_ATTEMPTS = [BREAKS_CONTRACT, RENAME_BACK + HOSTILE, MISSING, DROP_OS + GOOD_NEIGHBOURS]


def coder_script(role: str, purpose: str, messages: list[dict[str, Any]]) -> str:
    """Round by stage and attempt: cold start is good at once; the first refinement round
    breaks the contract, is hostile, does not apply, then is good; the second is hostile every
    time; integration is good."""
    repairs = sum(1 for m in messages if m["role"] == "assistant")
    if purpose.endswith("/diagnose"):
        assert "diagnose" in messages[-1]["content"] and "SEARCH" not in messages[-1]["content"]
        return "The retrieval keeps too few units; raise what it keeps."
    assert "## Your diagnosis" in messages[1]["content"]
    if purpose == "cold_start/propose":
        return GOOD_TOP_K
    if purpose.startswith("refinement"):
        if "coder: no os" in messages[1]["content"]:  # the history shows the first round
            return HOSTILE
        return REFINE_ATTEMPTS[repairs]
    if purpose.startswith("integration"):
        return GOOD_USER
    raise AssertionError(f"unexpected coder call {purpose} with {repairs} repairs")


def start(root: Path, run_id: str, cfg: RunConfig, script: Any = coder_script) -> Evolution:
    """Run ``run_id`` in ``root`` (opened when it exists) with the scripted coder, whose request
    cache lives in ``root``: step outputs may be shared, scripted replies are not."""
    try:
        store = RunStore.open(root, run_id)
    except Exception:
        store = RunStore.create(root, {"config": cfg.as_json()}, run_id=run_id)
    coder = ScriptedLLM(script, log_path=calls_path(store.root), usd_per_token=1e-6,
                        cache_path=root / "llm-cache.sqlite")  # fmt: skip
    return Evolution(store, cfg, coder=coder)


def archive(store: RunStore) -> list[tuple[Any, ...]]:
    sha = {c.id: c.source_sha256 for c in store.candidates()}
    return [(c.source_sha256, c.stage, c.status, c.message, [sha[p] for p in c.parents])
            for c in store.candidates()]  # fmt: skip


# --- reply parsing -------------------------------------------------------------------------


def test_blocks_apply_in_order_and_message_is_kept():
    reply = GOOD_TOP_K + edit("", "TOP_K = 120", "TOP_K = 130")
    source, message = apply_reply(HYBRID, reply)
    assert "TOP_K = 130  #" in source and "TOP_K = 80" not in source
    assert message == "coder: keep more units"


def test_trailing_whitespace_is_tolerated_but_ambiguity_and_misses_are_refused():
    source, _ = apply_reply(HYBRID, edit("x", "TOP_K = 80  # most units kept per query (range "
                                             "5-500)   ", "TOP_K = 81"))  # fmt: skip
    assert "TOP_K = 81\n" in source
    with pytest.raises(PatchError, match="occurs .* times"):
        apply_reply(HYBRID, edit("x", "import", "import"))
    with pytest.raises(PatchError, match="does not match the program exactly"):
        apply_reply(HYBRID, MISSING)
    with pytest.raises(PatchError, match="unchanged"):
        apply_reply(HYBRID, edit("x", "TOP_K = 80", "TOP_K = 80"))


def test_whole_file_fallback_and_no_usable_reply():
    whole = HYBRID.replace("TOP_K = 80", "TOP_K = 90")
    source, message = apply_reply(HYBRID, f"MESSAGE: rewrite\n```python\n{whole}```\n")
    assert source == whole and message == "coder: rewrite"
    with pytest.raises(PatchError, match="no SEARCH/REPLACE block"):
        apply_reply(HYBRID, "I would change TOP_K.")


def test_prompt_shows_contract_train_scores_cases_and_never_valid():
    scores = {"train": ScoreBlock.model_validate({
        "overall": {"n": 3, "evidence_similarity": 0.5, "evidence_hit_rate": 0.25},
        "by_capability": {}})}  # fmt: skip
    case = {"id": "q1", "capability": "T", "ability": "temporal_reasoning", "question": "When?",
            "reference_answer": "In May", "evidence": ["[2024-05-01] user: it was May"],
            "query": {"text": "When?"}, "retrieved": "nothing", "retrieved_chars": 7,
            "answer": None, "scores": {"evidence_similarity": 0.1}, "error": None}  # fmt: skip
    request = Request("refinement", 1, CandidateView("c0001-abcdef12", HYBRID, scores), "T",
                      cases=(case,))  # fmt: skip
    text = render_request(request)
    assert "temporal tracking" in text and "it was May" in text and "0.500" in text
    assert HYBRID in text and "valid" not in text.lower().replace("invalid", "")
    prompt = system_prompt(Fitness("retrieval"))
    assert "MemoryUnit" in prompt and "numpy" in prompt


@pytest.mark.parametrize("mode", MODES)
def test_the_coder_is_told_the_fitness_in_force(mode: Mode, monkeypatch: pytest.MonkeyPatch):
    """The system prompt states the mode's one definition (scoring/fitness.py), and follows a
    change of it."""
    fitness = Fitness(mode, ("beam_{variant}",))
    prompt = system_prompt(fitness)
    assert DEFINITIONS[mode] in prompt and f"version {VERSION}" in prompt
    assert all(DEFINITIONS[other] not in prompt for other in MODES if other != mode)
    assert "hit rate" not in prompt  # version 1's fitness, no longer selected on
    monkeypatch.setitem(DEFINITIONS, mode, "the number of vowels in the retrieved text")
    assert "the number of vowels in the retrieved text" in system_prompt(fitness)


# --- the loop with a scripted coder ---------------------------------------------------------


@pytest.fixture(scope="module")
def coder_run(
    data_dir: Path, offline_cache: Path, tmp_path_factory: pytest.TempPathFactory
) -> Evolution:
    root = tmp_path_factory.mktemp("coder")
    evolution = start(root, "whole", run_config(data_dir, offline_cache, **SCRIPTED))
    evolution.run()
    return evolution


def test_archive_repairs_and_rejection(coder_run: Evolution):
    store = coder_run.store
    seed, cold, fixed, hostile, merged = store.candidates()
    assert [c.stage for c in (seed, cold, fixed, hostile, merged)] == [
        "seed", "cold_start", "refinement", "refinement", "integration"]  # fmt: skip
    assert cold.status == "evaluated" and "TOP_K = 120" in store.source(cold.id)
    assert cold.attempts == [] and cold.parents == [seed.id]
    # contract-breaking, hostile, not applying, then repaired: three failures on record
    assert fixed.status == "evaluated" and "NEIGHBOURS = 1" in store.source(fixed.id)
    assert len(fixed.attempts) == REPAIRS
    assert "retrieve" in fixed.attempts[0] and "os" in fixed.attempts[1]
    assert "does not match" in fixed.attempts[2]
    # hostile four times: filed as rejected, with its sandbox report, never evaluated
    assert hostile.status == "rejected" and hostile.scores == {}
    assert hostile.sandbox and not hostile.sandbox["passed"]
    assert len(hostile.attempts) == REPAIRS and "import os" in store.source(hostile.id)
    assert merged.status == "evaluated" and merged.capability is None
    kept = specialists(store.candidates())
    assert hostile.id not in {c.id for c in kept.values()}
    promoted = {cap: c for cap, c in kept.items() if c.stage != "seed"}
    assert promoted and all(paired_beats(c, seed, cap) for cap, c in promoted.items())
    for c in (cold, fixed, merged):
        assert set(c.scores) == {"train", "valid"} and store.traces(c.id, "train")


def test_the_runs_coder_is_told_the_runs_fitness(coder_run: Evolution):
    assert isinstance(coder_run.coder, ScriptedLLM)
    fitness = coder_run.config.fitness()
    systems = [m[0]["content"] for _, _, m in coder_run.coder.transport_calls]
    assert systems and all(fitness.objective() in text for text in systems)


def test_each_repair_sees_the_previous_error(coder_run: Evolution):
    assert isinstance(coder_run.coder, ScriptedLLM)
    calls = coder_run.coder.transport_calls
    repairs = [m for _, purpose, m in calls if purpose == "refinement/repair"]
    assert len(repairs) == 2 * REPAIRS
    first = repairs[0][-1]["content"]
    assert first.startswith("Your last reply could not be used") and "retrieve" in first
    assert "import" in repairs[1][-1]["content"] and "does not match" in repairs[2][-1]["content"]


def test_accounting_in_the_run_call_log(coder_run: Evolution):
    store = coder_run.store
    spend = read_spend(store.root)
    assert isinstance(coder_run.coder, ScriptedLLM)
    calls = coder_run.coder.transport_calls
    diagnoses = [purpose for _, purpose, _ in calls if purpose.endswith("/diagnose")]
    assert len(diagnoses) == 4  # one per round, before the first proposal
    assert spend.by_role["coder"].calls == len(calls) == 1 + 4 + 4 + 1 + 4
    assert spend.by_purpose["coder/refinement/repair"].calls == 2 * REPAIRS
    assert spend.total.cost_usd == pytest.approx(1e-6 * spend.total.tokens)
    per_candidate = sum(c.usage.get("proposal", {}).get("calls", 0) for c in store.candidates())
    assert per_candidate == len(calls)
    events = [e["data"]["attempt"] for e in store.events("attempt_failed")]
    assert events == [0, 1, 2, 0, 1, 2, 3]


def test_budget_stops_cleanly_and_resumes_with_a_higher_cap(
    coder_run: Evolution, data_dir: Path, offline_cache: Path, tmp_path: Path
):
    first_round = coder_run.store.load_state()["round_costs"][0]["usd"]
    cap = 1.5 * first_round  # room for the first round, not for a second as dear
    first = start(tmp_path, "capped", run_config(data_dir, offline_cache, **SCRIPTED, max_usd=cap))
    first.run()
    assert first.stopped and "USD cap" in first.stopped
    done = len(first.store.candidates())
    spent = read_spend(first.store.root).total
    assert done == 2 and spent.cost_usd == pytest.approx(first_round) and spent.cost_usd <= cap
    uncapped = run_config(data_dir, offline_cache, **SCRIPTED, max_usd=1.0)
    resumed = start(tmp_path, "capped", uncapped)
    resumed.run()
    assert resumed.stopped is None and len(resumed.store.candidates()) == 5
    assert read_spend(resumed.store.root).total.calls > spent.calls  # never reset


def test_interrupted_coder_run_resumes_to_the_same_archive(
    coder_run: Evolution, data_dir: Path, offline_cache: Path, tmp_path: Path
):
    cfg = run_config(data_dir, offline_cache, **SCRIPTED)
    calls = []

    def crashing(role: str, purpose: str, messages: list[dict[str, Any]]) -> str:
        calls.append(purpose)
        if len(calls) == 4:  # mid-way through the first refinement round's repairs
            raise RuntimeError("the coder's process died")
        return coder_script(role, purpose, messages)

    with pytest.raises(LLMError):
        start(tmp_path, "broken", cfg, crashing).run()
    start(tmp_path, "broken", cfg).run()
    assert archive(RunStore.open(tmp_path, "broken")) == archive(coder_run.store)
