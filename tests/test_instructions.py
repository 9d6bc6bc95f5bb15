"""The task-model prompts carry the instructions the loaded program holds, however its source
builds them (annotated, concatenated, assigned twice), as its host reports them at load; the
report is checked on the optimizer's side, since the host is untrusted."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from conftest import first_sessions

from contract.types import ContractError
from evolve.datasets.types import TaskSet
from evolve.evaluation.executor import run_eval
from evolve.evaluation.prompts import INSTRUCTION_MAX_CHARS, reported_instructions
from evolve.evaluation.setup import EvalSetup
from evolve.models.fake_server import FakeModelServer, fake_script
from evolve.models.llm import Message, ModelConfig

SEEDS = Path(__file__).resolve().parents[1] / "seeds"
DENSE = (SEEDS / "dense.py").read_text()
# The instructions in the styles tier 1 accepts: annotated, concatenated, and a first value the
# module replaces with a second one.
STYLED = (
    DENSE.replace("EXTRACTION_INSTRUCTION = (", "EXTRACTION_INSTRUCTION: str = (\n    'QXTR ' +", 1)
    .replace(
        "PLANNING_INSTRUCTION = (",
        'PLANNING_INSTRUCTION = "a first plan"\nPLANNING_INSTRUCTION = "QPLN " + (',
        1,
    )
    .replace("ANSWER_INSTRUCTION = (", 'ANSWER_INSTRUCTION = "QANS " + "two " + (', 1)
)


@pytest.fixture(scope="module")
def tasks(data_dir: Path) -> TaskSet:
    return first_sessions(data_dir, 1, 3)


def test_styled_instructions_reach_every_prompt_through_a_model(
    tasks: TaskSet, tmp_path: Path
) -> None:
    assert STYLED.count("QXTR") == STYLED.count("QPLN") == STYLED.count("QANS") == 1
    prompts: list[tuple[str, str]] = []
    lock = threading.Lock()

    def recording(role: str, purpose: str, messages: list[Message]) -> str:
        with lock:
            prompts.append((purpose, str(messages[-1].get("content", ""))))
        return fake_script(role, purpose, messages)

    path = tmp_path / "styled.py"
    path.write_text(STYLED)
    with FakeModelServer(recording) as server:
        model = ModelConfig(model="openai/fake", api_base=server.base_url)
        cfg = EvalSetup(cache_dir=str(tmp_path / "cache"), task_model=model, embedder="hashing")
        report = run_eval(path, tasks, cfg, jobs=1)
    assert [t.error for t in report.traces] == [None] * len(tasks.questions)
    assert all(t.answer for t in report.traces)
    marks = {"extract": "QXTR Read the conversation", "plan": "QPLN Rewrite the question",
             "answer": "QANS two Answer the question"}  # fmt: skip
    seen = {purpose.rsplit("/", 1)[-1] for purpose, _ in prompts}
    assert {"extract", "plan", "answer"} <= seen
    for purpose, prompt in prompts:
        kind = purpose.rsplit("/", 1)[-1]
        if kind in marks:
            assert prompt.startswith(marks[kind]), (purpose, prompt[:80])
            assert "a first plan" not in prompt


def _report(**values: Any) -> dict[str, Any]:
    names = {"EXTRACTION_INSTRUCTION": "x", "PLANNING_INSTRUCTION": "p", "ANSWER_INSTRUCTION": "a"}
    return {"instructions": {**names, **values}}


def test_the_hosts_report_is_checked() -> None:
    assert reported_instructions(_report()) == {"extract": "x", "plan": "p", "answer": "a"}
    long = "y" * (INSTRUCTION_MAX_CHARS + 1)
    bad: list[Any] = [
        None,
        {"instructions": ["x"]},
        {"instructions": {}},
        _report(ANSWER_INSTRUCTION=7),
        _report(ANSWER_INSTRUCTION="   "),
        _report(PLANNING_INSTRUCTION=long),
    ]
    for report in bad:
        with pytest.raises(ContractError):
            reported_instructions(report)
    with pytest.raises(ContractError, match=f"at most {INSTRUCTION_MAX_CHARS}"):
        reported_instructions(_report(PLANNING_INSTRUCTION=long))
