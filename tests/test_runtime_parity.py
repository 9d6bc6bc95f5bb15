"""Deployed = evaluated: a BEAM-100K conversation added session by session through the public
API gives, for every question, ``context()`` equal byte for byte to the retrieved text the
evaluation scores (``evolve.evaluation.executor.run_eval``, same program, same embedder), offline
and with a
scripted task model. The two sides share no cache."""

from __future__ import annotations

from pathlib import Path

import pytest

import evolve
from evolve.datasets.beam import load_conversation
from evolve.datasets.types import TaskSet
from evolve.evaluation.executor import run_eval
from evolve.evaluation.setup import EvalSetup
from evolve.models.llm import ModelConfig
from evolve.models.testing import task_script

PROGRAM = Path(__file__).resolve().parents[1] / "seeds" / "dense.py"


@pytest.mark.parametrize("mode", ["offline", "scripted"])
def test_context_equals_the_evaluations_retrieved_text(data_dir: Path, tmp_path: Path, mode: str):
    conv, questions = load_conversation(data_dir, "100K", "1")
    tasks = TaskSet("beam", "parity", (conv,), tuple(questions))

    def setup(cache: str) -> EvalSetup:
        if mode == "offline":
            return EvalSetup(cache_dir=str(tmp_path / cache), task_model=None,
                                embedder="hashing")  # fmt: skip
        model = ModelConfig(model="scripted")
        return EvalSetup(cache_dir=str(tmp_path / cache), embedder="hashing",
                            task_model=model, script=task_script)  # fmt: skip

    report = run_eval(PROGRAM, tasks, setup("eval-cache"), jobs=1)
    assert report.meta.errors == 0
    retrieved = {t.id: t.retrieved or "" for t in report.traces}

    notices: list[str] = []
    with evolve.open_memory(PROGRAM, tmp_path / "store", setup=setup("runtime-cache"),
                            notice=notices.append) as memory:  # fmt: skip
        for session in conv.sessions:
            memory.add(session.messages, user="beam-1", date=session.date,
                       session_id=session.session_id)  # fmt: skip
        for q in questions:
            got = memory.context(q.question, user="beam-1", date=q.question_date)
            assert got == retrieved[q.id], q.id
        if mode == "scripted":  # the program's answer instruction, through the task model
            q = questions[0]
            assert memory.answer(q.question, user="beam-1", date=q.question_date) == (
                "This is a scripted answer."
            )
    assert len(questions) >= 10 and any(len(t) > 1000 for t in retrieved.values())
    assert any("offline stand-ins" in n for n in notices) == (mode == "offline")
