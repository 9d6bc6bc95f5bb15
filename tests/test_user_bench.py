"""A benchmark converted into the user format is the same bench to PrisMem, and a run on it works.

``bench/convert.py`` writes the first BEAM-100K conversation of train and the LoCoMo sample
(``$PRISMEM_DATA/locomo``) as user-format folders. Read back by the ``jsonl`` bench, they render
byte-identically, and an offline evaluation of ``seeds/dense.py`` retrieves byte-identical text
for every question with equal evidence coverage and retrieval metrics on the native bench and
on the converted one (each from its own cold step cache, the hashing embedder on both sides:
a test double, but the same one, so equal inputs must give equal numbers). Then
``evolve run --bench jsonl`` on the converted LoCoMo sample completes offline, guarded by the
first BEAM-100K holdout conversation read from the guard data root, and its status shows the
guard's scores beside the seed's.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from evolve.benches.registry import bench
from evolve.cli.main import main
from evolve.datasets.types import TaskSet
from evolve.evaluation.executor import run_eval
from evolve.evaluation.setup import EvalSetup
from evolve.evolution.store import RunStore

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("convert", ROOT / "bench" / "convert.py")
assert _spec is not None and _spec.loader is not None
convert = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(convert)

SOURCES = {"beam": ("beam:train", 1), "locomo": ("locomo:all", None)}  # spec, conversations
GUARD = "beam:holdout@1"


@pytest.fixture(scope="module")
def converted(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each source's user-format folder."""
    root = tmp_path_factory.mktemp("converted")
    for name, (spec, n) in SOURCES.items():
        convert.convert(spec, root / name, data_dir, n)
    return {name: root / name for name in SOURCES}


def evaluate(tasks: TaskSet, cache: Path) -> Any:
    setup = EvalSetup(cache_dir=str(cache), task_model=None, embedder="hashing")
    return run_eval(ROOT / "seeds" / "dense.py", tasks, setup, jobs=1)


@pytest.mark.parametrize("name", list(SOURCES))
def test_a_converted_bench_evaluates_as_the_native_one(
    name: str, converted: dict[str, Path], data_dir: Path, tmp_path: Path
):
    spec, n = SOURCES[name]
    native = convert.read(spec, data_dir, n)
    user = bench("jsonl").load_taskset(converted[name], "all")
    assert user.bench == "jsonl" and [c.id for c in user.conversations] == [
        c.id for c in native.conversations]  # fmt: skip
    rendered = [[s.render() for s in c.sessions] for c in native.conversations]
    assert [[s.render() for s in c.sessions] for c in user.conversations] == rendered
    assert user.questions == native.questions  # every field, meta aside (compare=False) ...
    assert [q.meta for q in user.questions] == [q.meta for q in native.questions]  # ... and it
    mine, theirs = evaluate(native, tmp_path / "native"), evaluate(user, tmp_path / "user")
    assert mine.meta.errors == theirs.meta.errors == 0
    assert len(mine.traces) == len(theirs.traces) == len(native.questions)
    by_id = {t.id: t for t in theirs.traces}
    for t in mine.traces:
        other = by_id[t.id]
        assert t.retrieved is not None and t.retrieved == other.retrieved, t.id
        assert t.scores == other.scores, t.id  # evidence coverage, contained, similarity, ...
    assert mine.scores.overall == theirs.scores.overall
    assert mine.scores.by_capability == theirs.scores.by_capability
    assert mine.scores.overall.metric("evidence_coverage") is not None


def test_a_run_on_a_converted_bench_completes_offline_and_shows_its_beam_guard(
    converted: dict[str, Path],
    data_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
):
    monkeypatch.setenv("PRISMEM_DATA", str(data_dir))  # the guard data root
    runs = tmp_path / "runs"
    code = main(["run", "--bench", "jsonl", "--data-dir", str(converted["locomo"]),
                 "--guard", GUARD, "--rounds", "1,0,0", "--no-cascade",
                 "--runs-dir", str(runs), "--cache-dir", str(tmp_path / "cache"),
                 "--embedder", "hashing", "--jobs", "1", "--no-progress"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 0, err
    (run,) = runs.iterdir()
    store = RunStore.open(runs, run.name)
    assert store.manifest["bench"] == "jsonl"
    seed = store.candidates()[0]
    guard = seed.scores[f"guard:{GUARD}"]
    assert guard.questions and guard.overall.fitness is not None
    assert main(["status", run.name, "--json", "--runs-dir", str(runs)]) == 0
    status = json.loads(capsys.readouterr().out)
    rows = {r["split"]: r for r in status["transfer"]["rows"]}
    assert rows[GUARD]["seed"] == guard.overall.fitness and rows[GUARD]["guard"]
    assert main(["status", run.name, "--runs-dir", str(runs)]) == 0
    assert f"guard {GUARD}: seed" in capsys.readouterr().out


# --- evolve data validate | split | fetch ----------------------------------------------------


def data_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["data", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_validate_counts_a_folder_and_split_writes_its_splits(
    converted: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    from evolve.datasets.userformat import read_dataset
    from evolve.datasets.usersplits import SPLITS, render, split_dataset

    folder = tmp_path / "beam"
    shutil.copytree(converted["beam"], folder)
    dataset = read_dataset(folder)
    messages = sum(len(s.messages) for c in dataset.conversations for s in c.sessions)
    sessions = sum(len(c.sessions) for c in dataset.conversations)
    code, out, _ = data_cli(capsys, "validate", str(folder))
    assert code == 0 and f"1 conversation, {sessions} sessions, {messages} messages" in out
    assert f"{len(dataset.questions)} questions: F " in out and "; 0 unlabelled" in out
    assert f"no {SPLITS} yet" in out and not (folder / SPLITS).exists()  # validate writes nothing
    code, out, _ = data_cli(capsys, "split", str(folder), "--seed", "3")
    assert code == 0 and (folder / SPLITS).read_bytes() == render(split_dataset(dataset, 3))
    assert "splits by question (seed 3): train " in out and "why: one conversation" in out
    code, again, _ = data_cli(capsys, "validate", str(folder))
    assert code == 0 and "splits by question (seed 3): train " in again


def test_validate_says_every_problem_in_its_own_line_and_split_writes_nothing(
    converted: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    from evolve.datasets.usersplits import SPLITS

    folder = tmp_path / "bad"
    shutil.copytree(converted["beam"], folder)
    path = folder / "questions.jsonl"
    lines = path.read_text().splitlines()
    first = json.loads(lines[0])
    lines[0] = json.dumps({**first, "evidence": ["no-such-message"]})
    lines[1] = lines[1][:20]  # not JSON
    path.write_text("\n".join(lines) + "\n")
    for command in ("validate", "split"):
        code, out, err = data_cli(capsys, command, str(folder))
        errors = err.splitlines()
        assert code == 2 and not out and len(errors) == 2, err
        assert errors[0].startswith("error: questions.jsonl:1: evidence[0]: 'no-such-message'")
        assert errors[1].startswith("error: questions.jsonl:2: ")
        assert not (folder / SPLITS).exists()


def test_fetch_downloads_into_the_data_root(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
):
    from evolve.cli import data

    fetched: list[tuple[Path, list[str]]] = []
    entry = SimpleNamespace(fetch=lambda root, sizes: fetched.append((root, sizes)))
    monkeypatch.setattr(data, "bench", lambda name: entry)
    assert data_cli(capsys, "fetch", "beam", "--data-dir", str(tmp_path), "--sizes", "100K")[0] == 0
    assert fetched == [(tmp_path, ["100K"])]
    for name in ("PRISMEM_DATA", "EVOLVE_DATA"):
        monkeypatch.delenv(name, raising=False)
    code, _, err = data_cli(capsys, "fetch", "beam")
    assert code == 2 and "no data directory" in err and len(fetched) == 1


def test_every_file_of_a_data_folder_gets_the_mode_open_would_give(data_dir: Path, tmp_path: Path):
    """The manifest, questions and splits are written atomically (a temporary file is 0600),
    yet read alike with the sessions: 0666 less the umask, so another user the owner lets in
    (a shared data folder, the CI's ordinary user) can read the whole folder, not part of it."""
    import os

    from evolve.datasets.userformat import Dataset, write_dataset
    from evolve.datasets.usersplits import ensure_splits

    tasks = bench("locomo").load_taskset(data_dir, "all")
    dataset = Dataset("modes", "test", tasks.conversations, tasks.questions)
    old = os.umask(0o027)
    try:
        folder = write_dataset(tmp_path / "mine", dataset)
        ensure_splits(folder, dataset)
    finally:
        os.umask(old)
    modes = {p.name: p.stat().st_mode & 0o777 for p in folder.iterdir()}
    assert modes == dict.fromkeys(modes, 0o640) and len(modes) == 4, modes
