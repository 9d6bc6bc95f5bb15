"""`evolve run --bench locomo | longmemeval` evolves on that bench.

End to end and offline on the fixtures: the LoCoMo sample (``$PRISMEM_DATA/locomo``, one
conversation, so train and valid are its question halves) and the LongMemEval fixture
(tests/fixtures/longmemeval). Each run must have evaluated exactly the questions of its bench's
train and valid splits, labelled with that bench's native capabilities, and its manifest must
hash that bench's data file. The hashing embedder keeps it fast (the scores mean nothing).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from evolve.benches import registry
from evolve.cli.main import main
from evolve.datasets import locomo
from evolve.datasets.types import TaskSet
from evolve.evolution.manifest import sha256_file
from evolve.evolution.store import RunStore

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def _splits(bench: str, root: Path) -> dict[str, TaskSet]:
    entry = registry.bench(bench)
    return {s: entry.load_taskset(root, entry.run_split(root, s)) for s in ("train", "valid")}


def _run(capsys: pytest.CaptureFixture[str], tmp_path: Path, *args: str) -> tuple[RunStore, str]:
    runs = tmp_path / "runs"
    code = main(["run", *args, "--runs-dir", str(runs), "--cache-dir", str(tmp_path / "cache"),
                 "--embedder", "hashing", "--jobs", "1", "--no-progress"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 0, err
    (run,) = runs.iterdir()
    return RunStore.open(runs, run.name), err


def _assert_evolved_on(store: RunStore, bench: str, root: Path, data_file: Path) -> None:
    expected = _splits(bench, root)
    manifest = store.manifest
    assert manifest["bench"] == bench and manifest["config"]["bench"] == bench
    rel = str(data_file.relative_to(root))
    for split in ("train", "valid"):
        assert manifest["data"][split] == {rel: sha256_file(data_file)}
    assert manifest["splits_file"]["path"] == f"{bench}.json"
    evaluated = [c for c in store.candidates() if c.status == "evaluated"]
    assert len(evaluated) >= 2  # the seed and a child of a round
    for c in evaluated:
        for split, tasks in expected.items():
            native = {q.id: q.capability for q in tasks.questions}
            assert c.scores[split].question_capabilities == native, (c.id, split)
        traced = [t.id for t in store.traces(c.id, "train")]
        assert sorted(traced) == sorted(q.id for q in expected["train"].questions)


def test_run_on_the_locomo_sample_evolves_on_its_question_halves(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    # no cascade: a child stopped on the minibatch would leave only the seed evaluated in full
    store, err = _run(capsys, tmp_path, "--bench", "locomo", "--data-dir", str(data_dir),
                      "--rounds", "1,0,0", "--no-cascade")  # fmt: skip
    assert "train reads split 'sample:train', valid reads split 'sample:valid'" in err
    assert store.manifest["splits"] == {"train": "sample:train", "valid": "sample:valid"}
    _assert_evolved_on(store, "locomo", data_dir, locomo.data_file(data_dir))


def test_run_on_the_longmemeval_fixture_evolves_on_its_splits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    store, _ = _run(capsys, tmp_path, "--bench", "longmemeval", "--data-dir", str(FIXTURES),
                    "--rounds", "0,1,0")  # fmt: skip
    assert store.manifest["splits"] == {"train": "train", "valid": "valid"}
    refined = [c for c in store.candidates() if c.stage == "refinement"]
    native = {q.capability for t in _splits("longmemeval", FIXTURES).values() for q in t.questions}
    assert refined and all(c.capability in native for c in refined)
    _assert_evolved_on(store, "longmemeval", FIXTURES,
                       FIXTURES / "longmemeval" / "longmemeval_s.json")  # fmt: skip


@pytest.mark.parametrize("bench", ["beam", "locomo", "longmemeval"])
def test_dry_run_counts_the_questions_of_its_bench(
    bench: str, data_dir: Path, capsys: pytest.CaptureFixture[str]
):
    root = FIXTURES if bench == "longmemeval" else data_dir
    splits = _splits(bench, root).values()
    first = [t.conversations[0].id for t in splits]  # --conversations 1
    n = sum(q.conversation_id in first for t in splits for q in t.questions)
    code = main(["run", "--dry-run", "--bench", bench, "--data-dir", str(root),
                 "--conversations", "1"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0 and f"dry run on {bench}:" in out and f"of {n} train+valid questions" in out


def test_locomo_question_halves_are_disjoint_and_stratified(data_dir: Path):
    whole = locomo.load_taskset(data_dir, "all")
    train, valid = (locomo.load_taskset(data_dir, s) for s in locomo.HALF_SPLITS)
    ids = [q.id for q in train.questions], [q.id for q in valid.questions]
    assert not set(ids[0]) & set(ids[1])
    assert sorted(ids[0] + ids[1]) == sorted(q.id for q in whole.questions)
    per = [Counter(locomo.category_of(q) for q in t.questions) for t in (train, valid)]
    assert all(0 <= per[0][c] - per[1][c] <= 1 for c in locomo.CATEGORY_ABILITY)
