"""The run store: layout, candidates, lookups, events, state, recovery and secrets."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from evolve.evolution.store import (
    REDACTED,
    CandidateNotFound,
    RunNotFound,
    RunStore,
    scrub_secrets,
)
from evolve.trace import QuestionTrace

SOURCE = 'TOP_K = 5\nEXTRACTION_INSTRUCTION = "Keep the facts."\n'
MANIFEST = {
    "models": {
        "task": {
            "model": "openai/gpt",
            "api_key": "sk-abc123def456ghi789jkl012mno345",
            "max_tokens": 512,
        }
    },
    "env": {"OPENAI_API_KEY": "sk-proj-ZZZ999yyy888xxx777www666vvv"},
    "seeds": [1, 2],
}


def _add(store: RunStore, source: str, **kw: Any):
    args: dict[str, Any] = {"parents": [], "stage": "seed", "capability": None, "message": "seed"}
    return store.add_candidate(source, **{**args, **kw})


def _json_ids(store: RunStore) -> list[str]:
    return sorted(p.stem for p in (store.root / "candidates").glob("c*.json"))


def test_create_open_list(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = RunStore.create(tmp_path, MANIFEST, run_id="older")
    assert store.run_id == "older" and store.root == tmp_path / "older"
    assert store.manifest["run_id"] == "older" and store.manifest["seeds"] == [1, 2]
    time.sleep(0.01)
    newer = RunStore.create(tmp_path, {"seeds": [3]})
    assert re.fullmatch(r"\d{8}-\d{6}-[0-9a-f]{4}", newer.run_id)
    _add(newer, SOURCE)
    newer.save_state({"best": "c0000", "round": 1})
    (tmp_path / "eval-20261129-172735-3c28a355").mkdir()  # an `evolve eval` folder: skipped
    (tmp_path / "README.md").write_text("x")  # programs/ ships one: not a run, not damaged

    with caplog.at_level(logging.WARNING, logger="evolve.damage"):
        runs = RunStore.list_runs(tmp_path)
    assert caplog.messages == []
    assert [r["id"] for r in runs] == [newer.run_id, "older"]
    assert runs[0]["candidates"] == 1 and runs[0]["best"] == "c0000"
    assert runs[1]["candidates"] == 0 and runs[1]["best"] is None
    assert RunStore.list_runs(tmp_path / "nowhere") == []

    assert RunStore.open(tmp_path, "older").manifest == store.manifest
    with pytest.raises(FileExistsError, match="already exists"):
        RunStore.create(tmp_path, {}, run_id="older")
    for bad in ("missing", "../older", "eval-20261129-172735-3c28a355"):
        with pytest.raises(RunNotFound) as err:
            RunStore.open(tmp_path, bad)
        assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="invalid run id"):
        RunStore.create(tmp_path, {}, run_id="a/b")


def test_add_candidate_writes_files_and_row(tmp_path: Path) -> None:
    store = RunStore.create(tmp_path, {})
    source = SOURCE + "# é, and a CRLF line\r\n"
    seed = _add(store, source, message="the seed\nsecond line")
    sha = hashlib.sha256(source.encode()).hexdigest()
    assert seed.id == f"c0000-{sha[:8]}" and seed.number == 0
    assert seed.status == "proposed" and seed.source_sha256 == sha and seed.frozen is False
    assert seed.message == "the seed second line"
    assert seed.sandbox is None and seed.scores == {} and seed.usage == {}
    py = store.root / "candidates" / f"{seed.id}.py"
    assert py.read_bytes() == source.encode() and store.source(seed.id) == source
    on_disk = json.loads((store.root / "candidates" / f"{seed.id}.json").read_text())
    assert on_disk == seed.model_dump()

    child = _add(store, "TOP_K = 9\n", parents=["c0000"], stage="refinement", capability="T")
    assert child.number == 1 and child.parents == [seed.id] and child.capability == "T"
    assert [c.id for c in store.candidates()] == [seed.id, child.id]
    assert _add(store, source).id == seed.id  # same source: the existing candidate
    assert len(store.candidates()) == 2
    with pytest.raises(ValidationError):
        _add(store, "X = 1\n", stage="mutation")
    with pytest.raises(ValidationError):
        _add(store, "X = 1\n", capability="Z")
    with pytest.raises(CandidateNotFound):
        _add(store, "X = 1\n", parents=["c0042"])
    assert len(store.candidates()) == 2  # rejected adds take no number and write nothing
    assert _add(store, "X = 1\n").number == 2


def test_update(tmp_path: Path) -> None:
    store = RunStore.create(tmp_path, {})
    cand = _add(store, SOURCE)
    scores = {"train": {"overall": {"hit": 0.5}, "by_capability": {"F": {"hit": 0.7}}}}
    usage = {"prompt_tokens": 10, "completion_tokens": 5, "cost_usd": 0.01, "api_key": "x"}
    updated = store.update(
        "c0000", status="evaluated", scores=scores, usage=usage, sandbox={"passed": True}
    )
    assert updated.status == "evaluated"
    assert {k: v.model_dump() for k, v in updated.scores.items()} == scores
    assert updated.usage == {"prompt_tokens": 10, "completion_tokens": 5, "cost_usd": 0.01}
    reopened = RunStore.open(tmp_path, store.run_id)
    assert reopened.get(cand.id) == updated
    with pytest.raises(ValidationError):
        store.update(cand.id, status="great")
    with pytest.raises(ValidationError):
        store.update(cand.id, colour="blue")
    with pytest.raises(ValueError, match="cannot change id, number"):
        store.update(cand.id, id="c0009-00000000", number=9)
    assert store.get(cand.id) == updated


def test_lookup_by_prefix(tmp_path: Path) -> None:
    store = RunStore.create(tmp_path, {})
    ids = [_add(store, f"X = {i}\n").id for i in range(12)]
    assert store.get("c0007").id == ids[7]
    assert store.get(ids[11]).id == ids[11]
    assert store.source("c0003") == "X = 3\n"
    with pytest.raises(CandidateNotFound) as err:
        store.get("c000")
    message = str(err.value)
    assert "ambiguous" in message and "and 5 more" in message and "\n" not in message
    for missing in ("c0099", "", "../manifest", "*"):
        with pytest.raises(CandidateNotFound, match="no candidate"):
            store.get(missing)


def test_events_round_trip(tmp_path: Path) -> None:
    store = RunStore.create(tmp_path, {})
    store.log_event("round", stage="cold_start", round=1)
    store.log_event("spend", usd=0.25, headers={"Authorization": "Bearer abc"})
    store.log_event("round", stage="refinement", round=2)
    events = store.events()
    assert [e["kind"] for e in events] == ["round", "spend", "round"]
    assert events[1]["data"] == {"usd": 0.25, "headers": {}}
    assert [e["data"]["round"] for e in store.events("round")] == [1, 2]
    assert all(isinstance(e["ts"], float) for e in events) and store.events("none") == []


def test_state_round_trip(tmp_path: Path) -> None:
    store = RunStore.create(tmp_path, {})
    assert store.load_state() == {}
    state = {"rounds": {"refinement": 3}, "best": "c0001", "round_costs": [{"usd": 1.5}]}
    store.save_state(state)
    assert RunStore.open(tmp_path, store.run_id).load_state() == state
    with pytest.raises(TypeError):
        store.save_state({"when": object()})
    assert store.load_state() == state
    assert not list(store.root.glob(".tmp-*"))


def test_deleting_the_index_loses_only_the_event_log(tmp_path: Path) -> None:
    store = RunStore.create(tmp_path, {})
    for i in range(3):
        _add(store, f"X = {i}\n")
    store.update("c0001", status="failed")
    store.log_event("kept")
    before = store.candidates()
    for suffix in ("", "-wal", "-shm"):
        Path(f"{store.root / 'index.sqlite'}{suffix}").unlink(missing_ok=True)
    reopened = RunStore.open(tmp_path, store.run_id)
    assert reopened.candidates() == before and reopened.get("c0001").status == "failed"
    assert reopened.events() == []  # the event log lives only in SQLite


def test_a_run_whose_index_has_the_old_candidates_table_opens(tmp_path: Path) -> None:
    store = RunStore.create(tmp_path, {})
    seed = _add(store, "X = 1\n")
    store.log_event("kept")
    with sqlite3.connect(store.root / "index.sqlite") as conn:  # as runs before wrote it
        conn.execute("CREATE TABLE candidates (id TEXT PRIMARY KEY, meta TEXT NOT NULL)")
        conn.execute("INSERT INTO candidates VALUES ('c0099-deadbeef', '{}')")
    reopened = RunStore.open(tmp_path, store.run_id)
    assert reopened.candidates() == [seed]
    assert [e["kind"] for e in reopened.events()] == ["kept"]
    assert _add(reopened, "X = 2\n").number == 1


def test_numbers_never_repeat(tmp_path: Path) -> None:
    store = RunStore.create(tmp_path, {})
    _add(store, "X = 0\n")
    _add(store, "X = 1\n")
    (store.root / "claims" / "c0002").touch()  # a writer died after taking number 2
    assert _add(store, "X = 3\n").number == 3  # a gap, never a reuse
    shutil.rmtree(store.root / "claims")  # even without the claims, taken numbers are skipped
    assert _add(store, "X = 4\n").number == 4
    assert [c.number for c in store.candidates()] == [0, 1, 3, 4]


KILL_SCRIPT = """
import sys
from pathlib import Path
from evolve.evolution.store import RunStore

store = RunStore.open(Path(sys.argv[1]), sys.argv[2])
i = int(sys.argv[3])
while True:
    c = store.add_candidate(f"X = {i}\\n" * 50, parents=[], stage="seed", capability=None,
                            message=f"n{i}")
    store.update(c.id, status="evaluated", usage={"prompt_tokens": i})
    store.log_event("added", id=c.id)
    i += 1
"""


def test_sigkill_while_adding_loses_nothing(tmp_path: Path) -> None:
    store = RunStore.create(tmp_path, {})
    script = tmp_path / "adder.py"
    script.write_text(KILL_SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    start = 0
    for delay in (0.0, 0.013, 0.029):
        proc = subprocess.Popen(
            [sys.executable, str(script), str(tmp_path), store.run_id, str(start)], env=env
        )
        target = len(_json_ids(store)) + 5
        deadline = time.monotonic() + 60
        while len(_json_ids(store)) < target and proc.poll() is None:
            assert time.monotonic() < deadline, "the adder made no progress"
            time.sleep(0.005)
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        assert proc.wait() == -signal.SIGKILL
        start += 1000

        reopened = RunStore.open(tmp_path, store.run_id)
        cands = reopened.candidates()
        assert [c.id for c in cands] == _json_ids(store)  # every .json is a candidate, no more
        assert len({c.number for c in cands}) == len(cands)
        for c in cands:
            source = reopened.source(c.id)
            assert hashlib.sha256(source.encode()).hexdigest() == c.source_sha256
    last = _add(reopened, "Y = 1\n")
    assert last.number > max(c.number for c in cands)


def test_scrub_secrets() -> None:
    cleaned = scrub_secrets(MANIFEST)
    assert cleaned["models"]["task"] == {"model": "openai/gpt", "max_tokens": 512}
    assert cleaned["env"] == {} and cleaned["seeds"] == [1, 2]
    assert MANIFEST["env"]  # the input is not modified
    keep = {"tokens": 1, "prompt_tokens": 2, "completion_tokens": 3, "token_budget": 4, "keys": 5}
    assert scrub_secrets(keep) == keep
    drop = ["key", "hf_token", "HF_TOKEN", "apiKey", "x-api-key", "client_secret", "password"]
    drop += ["Authorization", "aws_credentials", "basic_auth"]
    assert scrub_secrets({name: "v" for name in drop}) == {}
    text = (
        "failed with sk-proj-Ab12cd34EF56gh78IJ90kl, 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, "
        "ghp_abcdefghij0123456789abcdefghij012345, AKIAIOSFODNN7EXAMPLE and Bearer abc.def-ghi"
        "jklmnopqrs"
    )
    assert scrub_secrets([text]) == [
        f"failed with {REDACTED}, {REDACTED}, {REDACTED}, {REDACTED} and {REDACTED}"
    ]
    harmless = "sha 3c28a3553c28a3553c28a3553c28a355, task-123456789012345678901234, hf_dataset_x"
    assert scrub_secrets(harmless) == harmless


def test_secret_env_values_are_redacted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MISTRAL_API_KEY", "plainkeywithoutprefix42")
    assert scrub_secrets({"error": "bad key plainkeywithoutprefix42"}) == {
        "error": f"bad key {REDACTED}"
    }


def test_no_secret_reaches_the_disk(tmp_path: Path) -> None:
    store = RunStore.create(tmp_path, MANIFEST)
    cand = _add(store, SOURCE, message="retry after sk-live0123456789abcdefghijkl failed")
    store.update(
        cand.id,
        sandbox={"passed": False, "tiers": [{"error": "token sk-abcdef0123456789abcdefgh"}]},
        usage={"prompt_tokens": 3, "api_key": "sk-abcdef0123456789abcdefgh"},
    )
    store.log_event("call", config={"api_key": "sk-abcdef0123456789abcdefgh", "model": "m"})
    store.save_state({"best": cand.id})
    assert store.manifest["models"]["task"]["max_tokens"] == 512
    for path in store.root.rglob("*"):
        if path.is_file():
            assert b"sk-" not in path.read_bytes(), path


def test_the_store_names_its_own_paths(tmp_path: Path) -> None:
    store = RunStore.create(tmp_path, {})
    seed = _add(store, SOURCE)
    assert store.source_path(seed.id[:5]).read_text() == SOURCE  # a prefix is enough
    trace = QuestionTrace(id="q1", conversation_id="c1")
    store.write_traces(seed.id, "train", [trace])
    assert store.traces_path(seed.id, "train").is_file()
    assert store.traces(seed.id, "train") == [trace]
    assert {store.source_path(seed.id), store.traces_path(seed.id, "train")} <= set(
        (store.root / "candidates").iterdir()
    )


def _round(store: RunStore, stage: str, round_no: int, judged: list[bool], failed: int = 0) -> None:
    """Log one round as the loop does: its children proposed (judged or not), then ``failed``
    children whose proposal failed."""
    for i, done in enumerate(judged):
        meta = store.add_candidate(f"{SOURCE}R = {round_no}\nC = {i}\n", parents=[],
                                   stage=stage, capability=None, message="m")  # fmt: skip
        store.log_event("proposed", candidate=meta.id, stage=stage, round=round_no, child=i)
        if done:
            store.update(meta.id, status="evaluated")
    for i in range(len(judged), len(judged) + failed):
        store.log_event("proposal_failed", stage=stage, round=round_no, child=i, errors=[])


def test_a_damaged_state_is_rebuilt_from_the_event_log(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Rounds, not children, are counted: two children per round, two cold-start rounds and one
    refinement round finished, a second refinement round cut off mid-judging (its second child
    still proposed). Counting judged candidates per stage said cold_start 4, refinement 3."""
    store = RunStore.create(tmp_path, {})
    seed = store.add_candidate(SOURCE, parents=[], stage="seed", capability=None, message="s")
    store.update(seed.id, status="evaluated")
    _round(store, "cold_start", 0, [True, True])
    _round(store, "cold_start", 1, [True], failed=1)
    _round(store, "refinement", 2, [True, True])
    _round(store, "refinement", 3, [True, False])
    (store.root / "state.json").write_text('{"rounds": {"cold_')
    with caplog.at_level(logging.WARNING, logger="evolve.damage"):
        state = store.load_state(children=2)
    assert state == {"rounds": {"cold_start": 2, "refinement": 1}, "best": None,
                     "round_costs": []}  # fmt: skip
    [line] = [r.getMessage() for r in caplog.records]
    assert "rebuilt from the event log: cold_start 2, refinement 1" in line
    assert store.load_state() == state  # the children per round read off the log
    store.update(store.candidates()[-1].id, status="stopped")  # the cut-off round is judged
    assert store.load_state(children=2)["rounds"] == {"cold_start": 2, "refinement": 2}


@pytest.mark.parametrize(
    "state",
    [
        {"rounds": {"cold_start": "2"}},
        {"rounds": ["cold_start"]},
        {"rounds": {"cold_start": True}},
        {"rounds": {"cold_start": -1}},
        {"best": 5},
        {"round_costs": {"usd": 1}},
        {"round_costs": [{"usd": "1"}]},
        [1, 2],
    ],
)
def test_a_state_of_the_wrong_types_is_damaged_and_rebuilt(
    state: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = RunStore.create(tmp_path, {})
    _round(store, "cold_start", 0, [True])
    (store.root / "state.json").write_text(json.dumps(state))
    with caplog.at_level(logging.WARNING, logger="evolve.damage"):
        assert store.load_state() == {"rounds": {"cold_start": 1}, "best": None,
                                      "round_costs": []}  # fmt: skip
    [line] = [r.getMessage() for r in caplog.records]
    assert "state.json is damaged" in line and "cold_start 1" in line
    assert len(store.damage()) == 1


def test_without_an_event_log_no_round_counts_as_finished(tmp_path: Path) -> None:
    store = RunStore.create(tmp_path, {})
    (store.root / "state.json").write_text("{")
    assert store.load_state() == {"rounds": {}, "best": None, "round_costs": []}


def test_a_lost_call_log_is_rebuilt_from_the_round_costs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run with models whose calls.sqlite was deleted: a resume rebuilds its spend from the
    finished rounds' costs (one warning line), so --max-usd does not start from zero again, and
    the rebuilt row is not read as the price of one call."""
    from evolve.cli.run import _rebuild_lost_log
    from evolve.config import RunConfig
    from evolve.evolution.budget import calls_path, read_spend
    from evolve.models import spendcap
    from evolve.models.llm import ModelConfig

    store = RunStore.create(tmp_path, {})
    store.add_candidate(SOURCE, parents=[], stage="seed", capability=None, message="s")
    store.save_state(
        {
            "rounds": {"cold_start": 2},
            "best": None,
            "round_costs": [{"usd": 1.25, "tokens": 1000}, {"usd": 0.5, "tokens": 500}],
        }
    )
    config = RunConfig(
        data_dir=str(tmp_path),
        seed_program=str(tmp_path / "s.py"),
        cache_dir=str(tmp_path / "c"),
        coder_model=ModelConfig(model="openai/m"),
    )
    assert not calls_path(store.root).exists()
    assert _rebuild_lost_log(store, config) == 1.75
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "call log" in err and "$1.7500" in err
    spend = read_spend(store.root).total
    assert (spend.cost_usd, spend.tokens) == (1.75, 1500)
    assert _rebuild_lost_log(store, config) is None  # the log is there now
    spendcap.write_caps(calls_path(store.root), spendcap.Caps(max_usd=2.0))
    with spendcap.admit(calls_path(store.root)):  # $0.25 left: one call of unknown price goes
        pass
    spendcap.write_caps(calls_path(store.root), spendcap.Caps(max_usd=1.0))
    with pytest.raises(spendcap.SpendCapReached), spendcap.admit(calls_path(store.root)):
        pass  # the rebuilt spend is over this cap (it started from $0 before)
