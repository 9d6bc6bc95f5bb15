"""Turns: a question that fails before its host section still passes its turn, so the later
questions of its conversation do not wait for it forever."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from conftest import first_sessions, unchecked

from evolve.datasets.types import TaskSet
from evolve.evaluation.conversation import ConversationRun, run_conversation
from evolve.evaluation.setup import EvalSetup
from evolve.fanout import Turns

SEED = Path(__file__).resolve().parents[1] / "seeds" / "dense.py"


def test_a_turn_passed_without_entering_lets_the_next_in() -> None:
    turns, order = Turns(), []

    def task(k: int) -> None:
        if k == 1:
            turns.pass_turn(k)  # failed before its section
            return
        with turns.turn(k):
            order.append(k)

    threads = [threading.Thread(target=task, args=(k,), daemon=True) for k in (3, 2, 1, 0)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert order == [0, 2, 3] and not any(t.is_alive() for t in threads)
    turns.pass_turn(2)  # again: a no-op


@pytest.fixture(scope="module")
def tasks(data_dir: Path) -> TaskSet:
    tasks = first_sessions(data_dir, 1, 4)
    assert len(tasks.questions) >= 3
    return tasks


def test_a_question_failing_before_its_section_does_not_stall_the_conversation(
    tasks: TaskSet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = tasks.questions[0].id
    original = ConversationRun.question

    def question(self: ConversationRun, q: Any, turn: Any = None) -> Any:
        if q.id == first:
            raise RuntimeError("failed before its host section")
        return original(self, q, turn)

    monkeypatch.setattr(ConversationRun, "question", question)
    cfg = EvalSetup(cache_dir=str(tmp_path), task_model=None, embedder="hashing",
                       llm_concurrency=4)  # fmt: skip
    outcome: list[BaseException] = []

    def run() -> None:
        try:
            run_conversation(unchecked(SEED.read_text(), SEED), tasks.conversations[0],
                             list(tasks.questions), cfg)  # fmt: skip
        except BaseException as exc:  # noqa: BLE001 - the outcome is what the test reads
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(120)
    assert not thread.is_alive(), "the later questions waited forever for the first one's turn"
    assert [str(e) for e in outcome] == ["failed before its host section"]
