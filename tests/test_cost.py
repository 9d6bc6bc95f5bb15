"""Cost: a program's backend.complete prompt has a size cap, and a run's caps hold at every model
call, mid-round, with calls in flight counted; a run stopped there resumes with a higher cap."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from contract.types import BackendError
from evolve.config import RunConfig
from evolve.datasets.slices import write_slice
from evolve.evaluation.backend import MAX_PROMPT_CHARS, BackendService
from evolve.evolution.budget import calls_path, read_spend
from evolve.evolution.loop import Evolution
from evolve.evolution.manifest import build_manifest
from evolve.evolution.store import RunStore
from evolve.models import calllog
from evolve.models.llm import LLMError, ModelConfig
from evolve.models.spendcap import Caps, SpendCapReached, write_caps
from evolve.models.testing import HashingEmbedder, ScriptedLLM, task_script

ROOT = Path(__file__).resolve().parents[1]
SEED = (ROOT / "seeds" / "simple.py").read_text()
CUT = "return text[:OUT_CHAR_BUDGET]"
pytestmark = pytest.mark.usefixtures("check_once")  # the runs here check the same programs


def test_a_programs_prompt_over_the_cap_never_reaches_the_model() -> None:
    llm = ScriptedLLM(lambda role, purpose, messages: "ok")
    serve = BackendService(HashingEmbedder(), llm, "eval", 8)
    header = {"method": "complete", "max_tokens": 10}
    with pytest.raises(BackendError, match=f"at most {MAX_PROMPT_CHARS:,}"):
        serve({**header, "prompt": "x" * (MAX_PROMPT_CHARS + 1)}, [])
    with pytest.raises(BackendError, match="string prompt"):
        serve({**header, "prompt": ["x"]}, [])
    assert llm.transport_calls == []
    assert serve({**header, "prompt": "x" * MAX_PROMPT_CHARS}, [])[0] == {"text": "ok"}
    assert len(llm.transport_calls) == 1


def test_concurrent_calls_stop_at_the_cap_counting_those_in_flight(tmp_path: Path) -> None:
    log = tmp_path / "calls.sqlite"

    def slow(role: str, purpose: str, messages: Any) -> str:
        time.sleep(0.05)
        return "four words of reply"

    # each call: 2 prompt words + 4 reply words = 6 tokens, $0.006
    llm = ScriptedLLM(slow, log_path=log, usd_per_token=0.001)
    write_caps(log, Caps(max_usd=0.0305))  # five calls fit, not six
    outcomes: list[str] = []

    def caller(i: int) -> None:
        for j in range(4):
            try:
                llm.complete("task", "s", f"prompt {i}-{j}")
                outcomes.append("ok")
            except SpendCapReached:
                outcomes.append("refused")

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    spend = read_spend(tmp_path)
    assert spend.total.cost_usd <= 0.0305 and spend.total.calls == outcomes.count("ok") == 5
    assert outcomes.count("refused") == 32 - 5  # refused before anything is sent or logged
    assert len(llm.transport_calls) == 5
    write_caps(log, Caps(max_usd=1.0))  # a higher cap: calls go again
    llm.complete("task", "s", "again")
    assert isinstance(SpendCapReached("x"), LLMError)


def coder_script() -> Any:
    replies = iter([SEED.replace(CUT, f"return text[:{n}]") for n in (300, 400, 500, 600)])

    def reply(role: str, purpose: str, messages: list[dict[str, Any]]) -> str:
        if purpose.endswith("/diagnose"):
            return "Keep less text."
        return f"MESSAGE: whole file\n```python\n{next(replies)}```\n"

    return reply


def test_a_token_cap_stops_a_run_mid_round_and_it_resumes_with_a_higher_cap(
    data_dir: Path, tmp_path: Path
) -> None:
    data = write_slice(data_dir, tmp_path / "data", messages=4, chars=200)
    (tmp_path / "seed.py").write_text(SEED)
    config = RunConfig(
        data_dir=str(data), seed_program=str(tmp_path / "seed.py"),
        cache_dir=str(tmp_path / "cache"), jobs=1, embedder="hashing", conversations=2,
        task_model=ModelConfig(model="scripted"), coder_model=ModelConfig(model="scripted"),
        rounds={"cold_start": 2, "refinement": 0, "integration": 0}, repairs=0, children=1,
        cascade=False, reuse=False,
    )  # fmt: skip
    store = RunStore.create(tmp_path / "runs", build_manifest(config), run_id="capped")
    coder = coder_script()

    def evolution(cfg: RunConfig) -> Evolution:
        # a request cache of the run's own: the resumed round asks again, and gets the same
        client = ScriptedLLM(coder, log_path=calls_path(store.root),
                             cache_path=store.root / "coder-cache.sqlite")  # fmt: skip
        return Evolution(store, cfg, coder=client, task_script=task_script)

    first = evolution(config)
    first.run()  # uncapped, to learn what the seed and one round cost
    seed = store.candidates()[0]
    seed_tokens = sum(seed.usage[split]["task"][kind] for split in ("train", "valid")
                      for kind in ("prompt_tokens", "completion_tokens"))  # fmt: skip
    spent = read_spend(store.root).total.tokens
    assert seed_tokens > 0 and spent > seed_tokens

    # a fresh run whose cap falls inside its first child's evaluation
    store = RunStore.create(tmp_path / "runs", build_manifest(config), run_id="capped2")
    coder = coder_script()
    rows = calllog.read_rows(calls_path(RunStore.open(tmp_path / "runs", "capped").root))
    first_child = next(i for i, r in enumerate(rows) if r["purpose"].endswith("/propose"))
    before = sum(r["prompt_tokens"] + r["completion_tokens"] for r in rows[: first_child + 1])
    cap = before + seed_tokens // 2  # the seed, the first proposal, half an evaluation
    run = evolution(config.replace(max_tokens=cap))
    run.run()
    assert run.stopped and "spend cap reached" in run.stopped
    metas = store.candidates()
    assert [m.status for m in metas] == ["evaluated", "proposed"]  # nothing filed from it
    rows = calllog.read_rows(calls_path(store.root))
    dearest = max(r["prompt_tokens"] + r["completion_tokens"] for r in rows)
    # the parent (coder) and the one worker each count their own calls in flight
    assert read_spend(store.root).total.tokens <= cap + dearest
    events = store.events("budget_stop")
    assert events and "spend cap reached" in events[-1]["data"]["reason"]

    resumed = evolution(config)  # no cap: the round is redone and the run finishes
    resumed.run()
    assert resumed.stopped is None
    assert [m.status for m in store.candidates()] == ["evaluated"] * 3
