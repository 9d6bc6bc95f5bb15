"""Concurrent model calls inside an evaluation: results equal a sequential run's.

A jittery scripted model (small random sleeps, so replies come back out of order under threads)
and a program whose retrieval counts its calls (so any change in the order of host calls shows
in the retrieved text) are evaluated at concurrency 1 and 16 from cold caches; traces, scores,
step counters, per-stage call counts and the step store must be identical. Against the fake
model server, one conversation with ``jobs=1`` keeps several requests in flight.
"""

from __future__ import annotations

import dataclasses
import json
import random
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import first_sessions, unchecked

from evolve.datasets.types import TaskSet
from evolve.evaluation.executor import run_eval
from evolve.evaluation.setup import EvalSetup
from evolve.evaluation.stepcache import unframe
from evolve.fanout import Turns, WallClock, ordered_map
from evolve.models.fake_server import FakeModelServer
from evolve.models.llm import Message, ModelConfig, Models
from evolve.models.testing import ScriptedLLM, task_script
from sandbox.check import CheckedProgram

SEEDS = Path(__file__).resolve().parents[1] / "seeds"
# dense, with a retrieval that numbers its calls: the text depends on the order of host calls.
# Its retrieve changes the memory, which the sandbox's checks refuse; it is handed to the
# evaluation as checked (a program that slipped past them), since the order must hold anyway.
COUNTING = (SEEDS / "dense.py").read_text().replace(
    "    def retrieve(self, query):\n",
    "    asked = 0\n\n    def retrieve(self, query):\n        self.asked += 1\n",
).replace("        return pack(chosen, OUT_CHAR_BUDGET)\n",
          '        return f"call {self.asked}\\n" + pack(chosen, OUT_CHAR_BUDGET)\n')  # fmt: skip


def jittery_task(role: str, purpose: str, messages: list[Message]) -> str:
    time.sleep(random.uniform(0, 0.02))
    return task_script(role, purpose, messages)


def jittery_judge(role: str, purpose: str, messages: list[Message]) -> str:
    time.sleep(random.uniform(0, 0.01))
    prompt = str(messages[-1]["content"])
    return json.dumps({"score": (0, 0.5, 1)[len(prompt) % 3]})  # varies by item and variant


@pytest.fixture(scope="module")
def tasks(data_dir: Path) -> TaskSet:
    """Three sessions of BEAM-100K conversation 1, eight questions, and a copy of the first
    question under another id (it shares its plan, retrieval and answer keys)."""
    small = first_sessions(data_dir, 3, 8)
    keep = list(small.questions)
    assert len(keep) >= 4 and any(q.rubric for q in keep)
    keep.insert(3, dataclasses.replace(keep[0], id=f"{keep[0].id}-twin"))
    return dataclasses.replace(small, questions=tuple(keep))


def _evaluate(
    program: CheckedProgram, tasks: TaskSet, cache: Path, concurrency: int
) -> dict[str, Any]:
    config = EvalSetup(cache_dir=str(cache), task_model=ModelConfig(model="scripted"),
                          embedder="hashing", script=jittery_task, diagnose=True,
                          llm_concurrency=concurrency)  # fmt: skip
    judge = ScriptedLLM(jittery_judge, Models(judge=ModelConfig(model="scripted")))
    report = run_eval(program, tasks, config, jobs=1, judge=judge)
    traces = [json.loads(t.to_json()) for t in report.traces]
    for t in traces:
        t.pop("retrieve_ms")  # wall-clock time, not a result
    calls = {role: u["purposes"] for role, u in report.usage.items()}
    return {"traces": traces, "scores": report.scores, "steps": report.steps, "calls": calls,
            "store": _store(cache / "stages")}  # fmt: skip


def _store(root: Path) -> dict[str, Any]:
    """Every step output on disk, checked and without its checksum line (retrieval records
    without their wall-clock time)."""
    out: dict[str, Any] = {}
    for path in sorted(root.rglob("*")):
        if not path.is_file():
            continue
        payload = unframe(path.read_bytes())
        assert payload is not None, path
        if path.suffix == ".json":
            value = json.loads(payload)
            if isinstance(value, dict):
                value.pop("retrieve_ms", None)
            out[str(path.relative_to(root))] = value
        else:
            out[str(path.relative_to(root))] = payload
    return out


def test_concurrency_16_equals_sequential(tasks: TaskSet, tmp_path: Path) -> None:
    program = unchecked(COUNTING, tmp_path / "counting.py")
    one = _evaluate(program, tasks, tmp_path / "c1", 1)
    many = _evaluate(program, tasks, tmp_path / "c16", 16)
    assert one["traces"][0]["retrieved"].startswith("call 1\n")  # the adversary is in place
    assert one["steps"]["plan"]["reused"] == 1  # the twin reuses its plan
    for part in ("traces", "scores", "steps", "calls", "store"):
        assert many[part] == one[part], part


def test_one_conversation_keeps_several_calls_in_flight(tasks: TaskSet, tmp_path: Path) -> None:
    with FakeModelServer(latency_s=0.2) as server:
        model = ModelConfig(model="openai/fake", api_base=server.base_url)
        config = EvalSetup(cache_dir=str(tmp_path / "c"), task_model=model,
                              embedder="hashing", llm_concurrency=8)  # fmt: skip
        report = run_eval(SEEDS / "dense.py", tasks, config, jobs=1)
        stats = server.stats()
    assert report.meta.errors == 0, [t.error for t in report.traces if t.error]
    assert stats.max_in_flight > 1  # windows and questions overlap within one conversation
    split = report.meta.time
    assert split["model_wait"] > 0 and split["sandbox"] > 0 and split["local"] > 0
    assert sum(split[k] for k in ("model_wait", "sandbox", "local")) <= report.meta.seconds


def test_ordered_map_raises_the_first_failure_in_item_order() -> None:
    def fn(i: int) -> int:
        time.sleep(0.05 if i == 1 else 0)  # item 3 fails first in time, item 1 first in order
        if i in (1, 3):
            raise ValueError(f"item {i}")
        return i * 10

    assert ordered_map(lambda i: i * 10, range(5), 4) == [0, 10, 20, 30, 40]
    with pytest.raises(ValueError, match="item 1"):
        ordered_map(fn, range(5), 4)


def test_turns_admit_tasks_in_number_order() -> None:
    turns, seen = Turns(), []

    def task(k: int) -> None:
        time.sleep(random.uniform(0, 0.01))
        with turns.turn(k):
            seen.append(k)

    threads = [threading.Thread(target=task, args=(k,)) for k in reversed(range(8))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen == list(range(8))


def test_wall_clock_splits_overlapping_activity() -> None:
    clock = WallClock()
    with clock.during("sandbox"):
        time.sleep(0.05)
        with clock.during("model"):  # a completion the host asked for: model wait wins
            time.sleep(0.05)
    time.sleep(0.05)
    split = clock.seconds()
    assert split["model_wait"] == pytest.approx(0.05, abs=0.03)
    assert split["sandbox"] == pytest.approx(0.05, abs=0.03)
    assert split["local"] == pytest.approx(0.05, abs=0.03)
