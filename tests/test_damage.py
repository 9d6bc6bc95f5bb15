"""Damaged files: run-store files, step-cache entries, the embedding cache.

Each case damages one file the way a crash, a full disk or a hostile edit would, then drives
the CLI in-process (``evolve.cli.main.main``): a command that can go on says so in one ``warning:``
line naming the file and exits 0; one that cannot is one ``error:`` line and exit 2; never a
traceback. One small real run (seed and one cold-start round on the first conversation of
each split, hashing embedder, plus a proposed child) is built once; each test damages a copy.
"""

from __future__ import annotations

import json
import pickle
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import run_config

from evolve.cli.main import main
from evolve.evaluation.executor import run_eval, write_run
from evolve.evaluation.setup import EvalSetup
from evolve.evaluation.stepcache import StepStore
from evolve.evolution.loop import Evolution, RunConfig
from evolve.evolution.store import RunStore
from evolve.evolution.wiring import task_set
from evolve.models import close_connections
from evolve.models.embed import _SCHEMA, HashingEmbedder, _sha256
from evolve.models.llm import LLMError
from evolve.models.testing import ScriptedLLM

ROOT = Path(__file__).resolve().parents[1]
RUN = "alpha"
pytestmark = pytest.mark.usefixtures("check_once")  # the runs here check the same programs


@pytest.fixture(scope="module")
def pristine(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A runs dir holding run ``alpha``: c0000 seed and c0001 cold start (both evaluated),
    c0002 a proposed child of c0001."""
    root = tmp_path_factory.mktemp("runs")
    cfg = run_config(data_dir, root.parent / "cache", children=1, cascade=False,
                     rounds={"cold_start": 1, "refinement": 0, "integration": 0})  # fmt: skip
    manifest = {"config": cfg.as_json(), "fitness": cfg.fitness().describe()}  # as a run's
    store = RunStore.create(root, manifest, run_id=RUN)
    best = Evolution(store, cfg).run()
    assert best.id.startswith("c000")
    store.add_candidate("X = 1\n", parents=[store.candidates()[1].id], stage="refinement",
                        capability="F", message="a child of the cold start")  # fmt: skip
    return root


@pytest.fixture
def runs(pristine: Path, tmp_path: Path) -> Path:
    shutil.copytree(pristine, tmp_path / "runs")
    return tmp_path / "runs"


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    captured = capsys.readouterr()
    assert "Traceback" not in captured.out + captured.err
    return code, captured.out, captured.err


def warnings_in(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("warning:")]


def candidate_file(runs: Path, number: int, suffix: str = ".json") -> Path:
    [path] = (runs / RUN / "candidates").glob(f"c{number:04d}-*{suffix}")
    return path


def other_id(path: Path) -> dict[str, Any]:
    meta = json.loads(path.read_text())
    return {**meta, "id": "c0009-00000000"}


DAMAGES = {
    "truncated": lambda path: path.read_bytes()[:100],
    "wrong schema": lambda path: json.dumps({"id": path.stem, "stage": 3}).encode(),
    "another candidate": lambda path: json.dumps(other_id(path)).encode(),
}


# --- the run store ------------------------------------------------------------------------


@pytest.mark.parametrize("damage", DAMAGES)
def test_damaged_candidate_is_skipped_with_one_warning(
    runs: Path, damage: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = candidate_file(runs, 1)
    path.write_bytes(DAMAGES[damage](path))
    rd = ("--runs-dir", str(runs))
    for command in (["status", RUN], ["programs", RUN], ["runs"], ["report", RUN]):
        code, out, err = cli(capsys, *command, *rd)
        assert code == 0, (command, err)
        [line] = warnings_in(err)
        assert str(path) in line and "skipped" in line, (command, err)
    report = json.loads(cli(capsys, "programs", RUN, *rd, "--json")[1])
    assert [r["id"][:5] for r in report["candidates"]] == ["c0000", "c0002"]
    child = candidate_file(runs, 2).stem
    code, out, err = cli(capsys, "lineage", f"{RUN}/{child}", *rd)
    assert code == 0 and child in out and f"{path.stem} (damaged" in out
    code, out, err = cli(capsys, "show", f"{RUN}/c0001", *rd)
    assert code == 2 and out == ""
    [line] = err.splitlines()
    assert line.startswith("error:") and str(path) in line


def test_deleted_source_is_named(runs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = candidate_file(runs, 1, ".py")
    source.unlink()
    code, out, err = cli(capsys, "show", f"{RUN}/c0001", "--runs-dir", str(runs))
    assert code == 2 and out == ""
    [line] = err.splitlines()
    assert line.startswith("error:") and str(source) in line and "missing" in line
    code, out, err = cli(capsys, "programs", RUN, "--runs-dir", str(runs))
    assert code == 0
    [line] = warnings_in(err)
    assert str(source) in line


def test_altered_source_is_not_used(runs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = candidate_file(runs, 1, ".py")
    source.write_text(source.read_text() + "\nX = 1\n")
    code, _, err = cli(capsys, "show", f"{RUN}/c0001", "--runs-dir", str(runs))
    assert code == 2 and str(source) in err and "sha256" in err


def test_adding_a_lost_source_restores_it(runs: Path, caplog: pytest.LogCaptureFixture) -> None:
    source = candidate_file(runs, 0, ".py")
    text = source.read_text()
    source.unlink()
    store = RunStore.open(runs, RUN)
    again = store.add_candidate(text, parents=[], stage="seed", capability=None, message="seed")
    assert again.id == source.stem and source.read_text() == text
    assert any(str(source) in r.getMessage() and "restored" in r.getMessage()
               for r in caplog.records)  # fmt: skip


def test_garbage_index_is_rebuilt_from_the_files(
    runs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    index = runs / RUN / "index.sqlite"
    before = [c.model_dump() for c in RunStore.open(runs, RUN).candidates()]
    index.write_bytes(b"this is not a database" * 100)
    code, out, err = cli(capsys, "runs", "--runs-dir", str(runs))
    assert code == 0 and RUN in out
    [line] = warnings_in(err)
    assert str(index) in line and "rebuilt" in line
    assert len(list(index.parent.glob("index.sqlite.corrupt-*"))) == 1
    code, out, err = cli(capsys, "status", RUN, "--runs-dir", str(runs))
    assert code == 0 and warnings_in(err) == []  # rebuilt once, for good
    assert [c.model_dump() for c in RunStore.open(runs, RUN).candidates()] == before


def test_truncated_state_keeps_the_run_listed(
    runs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = runs / RUN / "state.json"
    rounds = json.loads(state.read_text())["rounds"]
    state.write_bytes(state.read_bytes()[:10])
    code, out, err = cli(capsys, "runs", "--runs-dir", str(runs), "--json")
    assert code == 0 and [r["id"] for r in json.loads(out)["runs"]] == [RUN]
    [line] = warnings_in(err)
    assert str(state) in line
    code, out, err = cli(capsys, "status", RUN, "--runs-dir", str(runs), "--json")
    assert code == 0
    done = {s: r["done"] for s, r in json.loads(out)["rounds"].items() if r["done"]}
    assert done == rounds


def test_damaged_manifest_is_named(runs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    manifest = runs / RUN / "manifest.json"
    manifest.write_bytes(manifest.read_bytes()[:20])
    code, out, err = cli(capsys, "runs", "--runs-dir", str(runs))
    assert code == 0 and any(str(runs / RUN) in line for line in warnings_in(err))
    code, _, err = cli(capsys, "status", RUN, "--runs-dir", str(runs))
    assert code == 2 and str(manifest) in err


def test_resume_says_what_it_could_not_recover(
    runs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    damaged = candidate_file(runs, 1)
    damaged.write_bytes(damaged.read_bytes()[:100])
    source = candidate_file(runs, 1, ".py")  # its source lost too: nothing to rebuild it from
    source.write_text(source.read_text() + "\nX = 1\n")
    kept = {p: p.read_bytes() for p in (candidate_file(runs, 0), candidate_file(runs, 2))}
    code, out, err = cli(capsys, "run", "--resume", RUN, "--runs-dir", str(runs),
                         "--no-progress")  # fmt: skip
    assert code == 0, err
    assert any(str(damaged) in line for line in warnings_in(err))
    [summary] = [line for line in err.splitlines() if line.startswith("resume:")]
    assert "could not recover 1 damaged file" in summary and "2 readable candidates" in summary
    assert {p: p.read_bytes() for p in kept} == kept  # the rest is not evaluated again
    [event] = RunStore.open(runs, RUN).events("resume_damage")
    [lost] = event["data"]["files"]
    assert lost.startswith(f"candidate file {damaged} is damaged")


@pytest.mark.parametrize("damage", ["truncated", "edited"])
def test_a_damaged_record_with_an_intact_source_is_scored_again(
    runs: Path, damage: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The best candidate's record damaged (truncated, or edited into other valid JSON, which
    its checksum catches), its ``.py`` intact: a resume rebuilds it and scores it again,
    instead of dropping it (it was skipped as lost before)."""
    best = RunStore.open(runs, RUN).load_state()["best"]
    path = candidate_file(runs, int(best[1:5]))
    before = json.loads(path.read_text())
    if damage == "truncated":
        path.write_bytes(path.read_bytes()[:100])
    else:
        path.write_text(json.dumps({**before, "seconds": before["seconds"] + 1.0}))
    code, out, err = cli(capsys, "run", "--resume", RUN, "--runs-dir", str(runs),
                         "--no-progress")  # fmt: skip
    assert code == 0, err
    [line] = warnings_in(err)
    assert str(path) in line and "rebuilt from its intact source" in line
    assert not [line for line in err.splitlines() if line.startswith("resume:")]
    meta = RunStore.open(runs, RUN).get(best)
    assert meta.status == "evaluated" and meta.recovered
    assert meta.scores["valid"].overall.model_dump() == before["scores"]["valid"]["overall"]


# --- evaluation folders -------------------------------------------------------------------


@pytest.fixture(scope="module")
def one_conversation(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The first valid conversation, a step cache and the report of a clean evaluation."""
    cfg = RunConfig(data_dir=str(data_dir), seed_program="", cache_dir="", conversations=1)
    tasks = task_set(cfg, "valid")
    cache = tmp_path_factory.mktemp("stepcache")
    config = EvalSetup(cache_dir=str(cache), task_model=None, embedder="hashing")
    report = run_eval(ROOT / "seeds" / "hybrid.py", tasks, config, jobs=1)
    return tasks, config, report


def test_status_of_an_evaluation_folder(
    one_conversation: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = one_conversation[2]
    write_run(report, tmp_path / "eval-x")
    code, out, err = cli(capsys, "status", "eval-x", "--runs-dir", str(tmp_path))
    assert code == 0 and "evaluation folder" in out and "hybrid.py" in out
    assert "beam valid" in out and "no valid manifest" not in out + err
    code, out, _ = cli(capsys, "status", "eval-x", "--runs-dir", str(tmp_path), "--json")
    assert code == 0 and json.loads(out)["questions"] == report.meta.questions
    code, _, err = cli(capsys, "programs", "eval-x", "--runs-dir", str(tmp_path))
    assert code == 2 and "evaluation folder" in err


# --- the step cache ----------------------------------------------------------------------


def _entries(cache: str, stage: str, suffix: str) -> list[Path]:
    return sorted((Path(cache) / "stages" / stage).rglob(f"*{suffix}"))


def test_wrong_shape_stage_entries_are_recomputed_and_counted(one_conversation: Any) -> None:
    tasks, config, clean = one_conversation
    path = ROOT / "seeds" / "hybrid.py"
    retrieves = _entries(config.cache_dir, "retrieve", ".json")
    indexes = _entries(config.cache_dir, "index", ".bin")
    assert len(retrieves) == len(tasks.questions) and len(indexes) == 1
    for i, entry in enumerate(retrieves):  # valid JSON, wrong shape
        entry.write_text(json.dumps([{"retrieved": 5}, "text", [], None][i % 4]))
    indexes[0].write_bytes(pickle.dumps([1, 2]))  # a whole pickle, not a memory state
    again = run_eval(path, tasks, config, jobs=1)
    assert again.scores.overall == clean.scores.overall and again.meta.errors == 0
    n = len(tasks.questions)
    assert again.steps["retrieve"] == {**again.steps["retrieve"], "computed": n, "invalid": n}
    assert again.steps["index"]["computed"] == 1 == again.steps["index"]["invalid"]
    third = run_eval(path, tasks, config, jobs=1)  # the bad entries were overwritten
    assert third.steps["retrieve"]["reused"] == n and third.steps["retrieve"]["invalid"] == 0
    assert third.scores.overall == clean.scores.overall


@pytest.mark.parametrize(
    ("stage", "bad"),
    [("extract", {"units": []}), ("extract", [1]), ("plan", "q"), ("answer", 3),
     ("retrieve", {"retrieved": "x"}), ("retrieve", {"retrieved": "x", "over_budget": 0,
                                                      "raw_chars": 1})],
)  # fmt: skip
def test_every_json_read_checks_its_shape(tmp_path: Path, stage: str, bad: Any) -> None:
    seen: list[str] = []
    store = StepStore(tmp_path, on_invalid=seen.append)
    store.put_json(stage, "ab12", bad)
    assert store.get_json(stage, "ab12") is None and seen == [stage]
    (tmp_path / stage / "ab" / "ab12.json").write_bytes(b'{"trunc')
    assert store.get_json(stage, "ab12") is None and seen == [stage, stage]


def test_index_state_must_be_a_whole_pickle(tmp_path: Path) -> None:
    seen: list[str] = []
    store = StepStore(tmp_path, on_invalid=seen.append)
    data = pickle.dumps({"units": list(range(100))})
    store.put_bytes("index", "cd34", data[:-5])
    assert store.get_bytes("index", "cd34") is None and seen == ["index"]
    store.put_bytes("index", "cd34", data)
    assert store.get_bytes("index", "cd34") == data and seen == ["index"]


def test_an_edit_that_keeps_the_shape_fails_the_checksum(tmp_path: Path) -> None:
    """A stage entry edited into other valid JSON of the right shape (or a pickle into another
    whole pickle) is served no more: its checksum fails, it is counted invalid and recomputed
    (served as if computed, before)."""
    seen: list[str] = []
    store = StepStore(tmp_path, on_invalid=seen.append)
    store.put_json("answer", "ab12", "Paris")
    path = next((tmp_path / "answer").rglob("ab12.json"))
    path.write_bytes(path.read_bytes().replace(b'"Paris"', b'"Rome"'))
    assert json.loads(path.read_bytes().partition(b"\n")[2]) == "Rome"  # valid JSON, a string
    assert store.get_json("answer", "ab12") is None and seen == ["answer"]
    store.put_json("answer", "ab12", "Paris")  # recomputed and overwritten: served again
    assert store.get_json("answer", "ab12") == "Paris" and seen == ["answer"]
    store.put_bytes("index", "cd34", pickle.dumps({"units": [1, 2]}))
    path = next((tmp_path / "index").rglob("cd34.bin"))
    head, _, _ = path.read_bytes().partition(b"\n")
    path.write_bytes(head + b"\n" + pickle.dumps({"units": [1, 3]}))  # a whole pickle
    assert store.get_bytes("index", "cd34") is None and seen == ["answer", "index"]


# --- the embedding cache ------------------------------------------------------------------

TEXTS = [f"message number {i} about the weather" for i in range(40)]


def _built_cache(path: Path) -> np.ndarray:
    """A cache file written by a plain sqlite3 connection (none stays open in this process)."""
    embedder = HashingEmbedder()
    vecs = embedder._encode(TEXTS)
    with sqlite3.connect(path) as conn:
        conn.executescript(_SCHEMA)
        conn.executemany("INSERT INTO embeddings VALUES (?, ?, ?)",
                         [(embedder._cache_model, _sha256(t), v.astype("<f4").tobytes())
                          for t, v in zip(TEXTS, vecs, strict=True)])  # fmt: skip
    conn.close()
    return vecs


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_corrupt_embedding_cache_is_set_aside(
    tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "embeddings.sqlite"
    vecs = _built_cache(path)
    data = path.read_bytes()
    path.write_bytes(b"garbage!" * 512 if damage == "garbage" else data[: len(data) // 2])
    embedder = HashingEmbedder(cache_path=path)
    with caplog.at_level("WARNING", logger="evolve.damage"):
        assert np.array_equal(embedder.embed(TEXTS), vecs)
    [record] = caplog.records
    assert str(path) in record.getMessage() and "fresh cache" in record.getMessage()
    assert len(list(tmp_path.glob("embeddings.sqlite.corrupt-*"))) == 1
    fresh = HashingEmbedder(cache_path=path)
    assert np.array_equal(fresh.embed(TEXTS), vecs) and fresh.stats.cache_hits == len(TEXTS)


def test_embedding_rows_of_the_wrong_size_are_recomputed(tmp_path: Path) -> None:
    path = tmp_path / "embeddings.sqlite"
    vecs = _built_cache(path)
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE embeddings SET vec = x'00112233'")
    conn.close()
    embedder = HashingEmbedder(cache_path=path)
    assert np.array_equal(embedder.embed(TEXTS), vecs)
    assert embedder.stats.invalid == len(TEXTS) == embedder.stats.encoded
    again = HashingEmbedder(cache_path=path)
    assert np.array_equal(again.embed(TEXTS), vecs) and again.stats.cache_hits == len(TEXTS)


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_corrupt_llm_request_cache_is_set_aside(
    tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The LLM request cache is a cache: a damaged file is set aside with one warning and the
    call is made (and cached) again."""
    cache = tmp_path / "llm-cache.sqlite"
    first = ScriptedLLM(["an answer"], cache_path=cache)
    assert first.complete("task", "t", "q?").text == "an answer"
    close_connections(cache)
    data = cache.read_bytes()
    cache.write_bytes(b"garbage!" * 512 if damage == "garbage" else data[: len(data) // 2])
    again = ScriptedLLM(["asked again"], cache_path=cache)
    with caplog.at_level("WARNING", logger="evolve.damage"):
        reply = again.complete("task", "t", "q?")
    assert reply.text == "asked again" and not reply.cached
    [record] = caplog.records
    assert str(cache) in record.getMessage() and "fresh cache" in record.getMessage()
    assert len(list(tmp_path.glob("llm-cache.sqlite.corrupt-*"))) == 1
    assert ScriptedLLM([], cache_path=cache).complete("task", "t", "q?").cached


def test_corrupt_call_log_is_one_error_not_a_fresh_log(tmp_path: Path) -> None:
    """The call log records what a run spent: a damaged one is never replaced silently; logging
    to it and reading the spend both raise one LLMError line naming the file."""
    from evolve.evolution.budget import calls_path, read_spend

    log = calls_path(tmp_path)
    ScriptedLLM(["one"], log_path=log).complete("task", "t", "q?")
    close_connections(log)
    log.write_bytes(b"garbage!" * 512)
    with pytest.raises(LLMError, match="call log .*calls.sqlite is damaged") as caught:
        read_spend(tmp_path)
    assert "\n" not in str(caught.value)
    with pytest.raises(LLMError, match="is damaged"):
        ScriptedLLM(["two"], log_path=log).complete("task", "t", "q?")
    assert log.read_bytes() == b"garbage!" * 512 and not list(tmp_path.glob("*.corrupt-*"))
