"""The pipeline (evolve.evaluation.pipeline) is what evaluation runs: driven directly, session by
session, it
retrieves what evaluation retrieved, byte for byte (offline and with the scripted task model);
a memory state larger than one wire chunk crosses whole; the history is ingested before the
questions; and a memory that failed to build is not built again by every later question.
"""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path
from typing import Any

import pytest
from conftest import unchecked

from evolve.datasets.beam import load_conversation
from evolve.datasets.types import TaskSet
from evolve.evaluation.conversation import run_conversation
from evolve.evaluation.executor import run_eval
from evolve.evaluation.pipeline import Pipeline
from evolve.evaluation.setup import EvalSetup, make_llm
from evolve.models.fake_server import FakeModelServer, fake_script
from evolve.models.llm import Message, ModelConfig
from evolve.models.testing import HashingEmbedder, task_script
from sandbox.wire import STATE_CHUNK_BYTES

SEEDS = Path(__file__).resolve().parents[1] / "seeds"


@pytest.fixture(scope="module")
def conversation(data_dir: Path) -> TaskSet:
    """BEAM-100K conversation 1, whole: its sessions and every question."""
    conv, questions = load_conversation(data_dir, "100K", "1")
    return TaskSet("beam", "one", (conv,), tuple(questions))


def pipeline_for(source: str, path: str, config: EvalSetup) -> Pipeline:
    return Pipeline(unchecked(source, path), llm=make_llm(config), embedder=HashingEmbedder(),
                    call_prefix=config.call_prefix, max_complete_calls=config.max_complete_calls,
                    call_timeout=config.call_timeout)  # fmt: skip


@pytest.mark.parametrize("seed", ["hybrid.py", "dense.py"])
@pytest.mark.parametrize("mode", ["offline", "scripted"])
def test_the_pipeline_retrieves_what_evaluation_retrieved(
    conversation: TaskSet, tmp_path: Path, seed: str, mode: str
) -> None:
    model = None if mode == "offline" else ModelConfig(model="scripted")
    config = EvalSetup(cache_dir=str(tmp_path / "c"), task_model=model, embedder="hashing",
                          script=task_script if model else None)  # fmt: skip
    program = SEEDS / seed
    report = run_eval(program, conversation, config, jobs=1)
    assert report.meta.errors == 0, [t.error for t in report.traces if t.error]
    evaluated = {t.id: t.retrieved for t in report.traces}
    fresh = dataclasses.replace(config, cache_dir=str(tmp_path / "direct"))  # no reply reused
    pipeline = pipeline_for(program.read_text(), str(program), fresh)
    try:
        pipeline.open()
        for segment in conversation.conversations[0].sessions:
            pipeline.add(segment, pipeline.extract(segment))
        for q in conversation.questions:
            got = pipeline.retrieve(pipeline.plan(q.question, q.question_date))
            assert got.text == evaluated[q.id], q.id
            assert got.text  # a real retrieval, not two empty strings
    finally:
        pipeline.close()


PADDED = (
    (SEEDS / "simple.py")
    .read_text()
    .replace(
        "        self.units.extend(units)\n",
        "        self.units.extend(units)\n"
        "        self.pad = getattr(self, 'pad', '') + segment.session_id * 12_000_000\n",
    )
    .replace(
        "        return text[:OUT_CHAR_BUDGET]\n",
        "        return (str(len(self.pad)) + text)[:OUT_CHAR_BUDGET]\n",
    )
)


def test_a_state_of_several_chunks_crosses_whole(conversation: TaskSet, tmp_path: Path) -> None:
    assert "self.pad" in PADDED and "len(self.pad)" in PADDED
    config = EvalSetup(cache_dir=str(tmp_path), task_model=None, embedder="hashing")
    built, restored = (pipeline_for(PADDED, "padded.py", config) for _ in range(2))
    q = conversation.questions[0]
    try:
        built.open()
        for segment in conversation.conversations[0].sessions:
            built.add(segment, built.extract(segment))
        dump = built.dump()
        size = len(dump.state or b"")
        assert dump.state is not None and size > 2 * STATE_CHUNK_BYTES, (size, dump.reason)
        restored.restore(dump.state)
        query = built.plan(q.question, q.question_date)
        want = built.retrieve(query)
        assert want.text.startswith(str(12_000_000 * 3))  # every session's padding is there
        assert restored.retrieve(query).text == want.text
    finally:
        built.close()
        restored.close()


def test_a_failed_memory_is_not_built_again_for_every_question(
    conversation: TaskSet, tmp_path: Path
) -> None:
    """The task model answers every extraction with a reply of the wrong shape: the memory
    fails to build once; the conversation's other questions fail with the same reason without
    asking the model again."""
    extractions = 0
    lock = threading.Lock()

    def script(role: str, purpose: str, messages: list[Message]) -> str:
        nonlocal extractions
        if purpose == "fake/extract":
            with lock:
                extractions += 1
            return '{"units": "none"}'
        return fake_script(role, purpose, messages)

    def run(questions: int, cache: Path) -> tuple[int, list[str]]:
        nonlocal extractions
        extractions = 0
        tasks = dataclasses.replace(conversation, questions=conversation.questions[:questions])
        with FakeModelServer(script) as server:
            model = ModelConfig(model="openai/fake", api_base=server.base_url)
            # no response cache: a window asked again reaches the server again
            config = EvalSetup(cache_dir=str(cache), task_model=model, embedder="hashing",
                                  llm_concurrency=1, reuse=False)  # fmt: skip
            report = run_eval(SEEDS / "dense.py", tasks, config, jobs=1)
        return extractions, [t.error or "" for t in report.traces]

    once, (error,) = run(1, tmp_path / "one")
    assert once > 0 and error.startswith("retrieve: ")
    many, errors = run(8, tmp_path / "eight")
    assert errors == [error] * 8  # every question fails, with the same reason
    assert many == once  # the model was asked to extract once per window, not once per question


ASKING = (
    (SEEDS / "simple.py")
    .read_text()
    .replace(
        "        self.units.extend(units)\n",
        "        self.units.extend(units)\n"
        "        self.replies = getattr(self, 'replies', []) + [self.backend.complete('Hi.')]\n",
    )
    .replace(
        "        return text[:OUT_CHAR_BUDGET]\n",
        "        return ('|'.join(self.replies) + text)[:OUT_CHAR_BUDGET]\n",
    )
)


def test_the_completion_budget_is_per_add(conversation: TaskSet, tmp_path: Path) -> None:
    """``backend.max_complete_calls`` bounds each host request (contract.spec): a program may
    spend it again in every session's ``index``."""
    assert "self.backend.complete" in ASKING and "self.replies" in ASKING
    config = EvalSetup(cache_dir=str(tmp_path), task_model=ModelConfig(model="scripted"),
                          embedder="hashing", script=task_script, max_complete_calls=1)  # fmt: skip
    pipeline = pipeline_for(ASKING, "asking.py", config)
    sessions = conversation.conversations[0].sessions
    assert len(sessions) >= 3
    try:
        units = [pipeline.units(segment, None) for segment in sessions]
        pipeline.open()
        for segment, unit_dicts in zip(sessions, units, strict=True):  # adds back to back
            pipeline.add(segment, unit_dicts)
        got = pipeline.retrieve(pipeline.query("anything", None, None))
        assert got.text.startswith("|".join(["This is a scripted answer."] * len(sessions)))
    finally:
        pipeline.close()


def test_the_history_is_ingested_before_the_first_question(
    conversation: TaskSet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Evaluation ingests the history in a step of its own (open, then per session its units and
    one add, then dump; a small state in one chunk) before any question reaches the host."""
    ops: list[str] = []
    original = Pipeline.call

    def call(self: Pipeline, op: str, *args: Any, **kwargs: Any) -> Any:
        ops.append(op)
        return original(self, op, *args, **kwargs)

    monkeypatch.setattr(Pipeline, "call", call)
    conv, questions = conversation.conversations[0], list(conversation.questions[:3])
    program = SEEDS / "dense.py"
    config = EvalSetup(cache_dir=str(tmp_path), task_model=None, embedder="hashing",
                          llm_concurrency=4)  # fmt: skip
    result = run_conversation(unchecked(program.read_text(), program), conv, questions, config)
    assert [t.error for t in result.traces] == [None] * len(questions)
    ingest = ["open", *["units", "add"] * len(conv.sessions), "dump", "state_chunk"]
    assert ops == [*ingest, *["query", "retrieve"] * len(questions)]
