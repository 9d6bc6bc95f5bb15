"""The checked program crosses the process boundary whole: one evaluation parses a candidate's
source once, in the sandbox check (:func:`sandbox.check.check_program`), however many
conversations it runs. The workers take the :class:`~sandbox.check.CheckedProgram` (its
fingerprints key the steps, its imports start the host) and parse nothing; the host compiles
what it runs on its own side of the wall (not counted here: another process)."""

from __future__ import annotations

import ast
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from conftest import first_sessions

from evolve.datasets.types import TaskSet
from evolve.evaluation.distributed import JobBackend
from evolve.evaluation.executor import run_eval
from evolve.evaluation.setup import EvalSetup
from sandbox.check import check_program

SEED = Path(__file__).resolve().parents[1] / "seeds" / "simple.py"


def test_one_evaluation_parses_the_program_once(
    data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a text no earlier test fingerprinted, so no cache of this process hides a parse
    source = SEED.read_text() + f"# {uuid.uuid4()}\n"
    parses: list[str] = []
    real = ast.parse

    def counted(text: Any, *args: Any, **kwargs: Any) -> Any:
        if text == source:
            parses.append("parse")
        return real(text, *args, **kwargs)

    monkeypatch.setattr(ast, "parse", counted)
    program = check_program(source, "simple.py").require(AssertionError)
    assert len(parses) == 1  # the check's one parse: source tier, imports and fingerprints

    one, two = first_sessions(data_dir, 1, 2, "1"), first_sessions(data_dir, 1, 2, "2")
    tasks = TaskSet("beam", "two", one.conversations + two.conversations,
                    one.questions + two.questions)  # fmt: skip
    config = EvalSetup(cache_dir=str(tmp_path), task_model=None, embedder="hashing")
    with ThreadPoolExecutor(max_workers=2) as pool:  # workers in this process, to be counted
        backend = JobBackend("in-process", pool, live_progress=False)
        report = run_eval(program, tasks, config, backend=backend)
    assert len(report.traces) == len(tasks.questions) >= 2
    assert [t.error for t in report.traces] == [None] * len(report.traces)  # all steps ran
    assert len(parses) == 1  # and parsed nothing again
