"""A run and a runtime store written by an earlier commit resume and reopen with the same results.

The fixture (``tests/fixtures/before41``, made by its ``make.py`` at commit 5c6a5f9) pins what
that code wrote: a run stopped after refinement with its status, the status it reached when
resumed with integration added, and a store of two users with the contexts it gave before
closing, after reopening and after one more session. Today's code must read and continue
both to the same results.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

import evolve
from evolve.cli.main import main

FIXTURE = Path(__file__).parent / "fixtures" / "before41"
SEEDS = Path(__file__).resolve().parents[1] / "seeds"
_spec = importlib.util.spec_from_file_location("before41_make", FIXTURE / "make.py")
assert _spec is not None and _spec.loader is not None
make = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(make)


def status(capsys: pytest.CaptureFixture[str], run: str, runs: Path) -> dict:
    assert main(["status", run, "--json", "--runs-dir", str(runs)]) == 0
    return make.stable(json.loads(capsys.readouterr().out))


def expected(name: str) -> dict:
    return json.loads((FIXTURE / name).read_text())


def test_an_earlier_run_reads_and_resumes_to_the_same_archive(
    tmp_path: Path, data_dir: Path, capsys: pytest.CaptureFixture[str]
):
    (source,) = list((FIXTURE / "run").iterdir())
    runs = tmp_path / "runs"
    shutil.copytree(source, runs / source.name)
    make.relocate(runs / source.name, data_dir, tmp_path / "cache", SEEDS / "hybrid.py")
    assert status(capsys, source.name, runs) == expected("run-status.json")
    code = main(["run", "--resume", source.name, "--rounds", "1,1,1", "--runs-dir", str(runs),
                 "--no-progress", "--jobs", "1"])  # fmt: skip
    capsys.readouterr()
    assert code == 0
    assert status(capsys, source.name, runs) == expected("run-resumed.json")


def test_an_earlier_store_reopens_with_the_same_contexts(tmp_path: Path):
    store = tmp_path / "store"
    shutil.copytree(FIXTURE / "store", store)
    want = expected("store-expected.json")
    memory = evolve.open_memory(str(SEEDS / "simple.py"), store=str(store), model=None,
                                embedder="hashing", notice=lambda line: None)  # fmt: skip
    try:
        for user, (date, text) in make.LATER.items():
            assert memory.context(make.QUESTIONS[user], user=user) == want["reopened"][user]
            memory.add([{"role": "user", "content": text}], user=user, date=date,
                       session_id=f"{user}-later")  # fmt: skip
            assert memory.context(make.QUESTIONS[user], user=user) == want["added"][user]
    finally:
        memory.close()
    assert want["reopened"] == want["context"]  # what was acknowledged before closing survives
