"""Progress from the first second: a run whose stderr is no terminal prints a plain line with
counts and elapsed time at least every PRISMEM_PROGRESS_SECONDS (30 by default), the seed's
first evaluation counting sessions extracted, memories indexed and questions; the executor's
progress line counts judge calls."""

from __future__ import annotations

import io
import re
import sys
import time
from pathlib import Path

import pytest

from evolve.cli.main import main
from evolve.datasets.slices import write_slice
from evolve.datasets.types import TaskSet
from evolve.evaluation.executor import WorkerEvents

INTERVAL = 0.2
LINE = re.compile(r"^\[\d+:\d\d\] round ")


class Stamped(io.StringIO):
    """A stderr that records when each line arrived."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[tuple[float, str]] = []

    def write(self, text: str) -> int:
        now = time.monotonic()
        self.lines += [(now, line) for line in text.splitlines() if line]
        return super().write(text)

    def isatty(self) -> bool:
        return False


@pytest.fixture(scope="module")
def beam_slice(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_slice(data_dir, tmp_path_factory.mktemp("slice"), messages=12)


def test_a_run_without_a_terminal_prints_progress_lines_at_the_interval(
    beam_slice: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("PRISMEM_PROGRESS_SECONDS", str(INTERVAL))
    stderr = Stamped()
    monkeypatch.setattr(sys, "stderr", stderr)
    started = time.monotonic()
    code = main(["run", "--bench", "beam", "--data-dir", str(beam_slice), "--embedder", "hashing",
                 "--rounds", "0,1,0", "--conversations", "1", "--jobs", "1", "--cache-dir",
                 str(tmp_path / "c"), "--runs-dir", str(tmp_path / "runs")])  # fmt: skip
    ended = time.monotonic()
    assert code == 0, stderr.getvalue()
    lines = [(t, line) for t, line in stderr.lines if LINE.match(line)]
    assert len(lines) >= 3, stderr.getvalue()
    times = [started] + [t for t, _ in lines] + [ended]
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    # the first line comes once the bar starts (after the seed's sandbox check), then one per
    # interval; slack for a loaded machine
    assert max(gaps[1:]) < INTERVAL + 1.5, gaps
    text = "\n".join(line for _, line in lines)
    assert re.search(r"evaluating c0000-\w+ train: questions \d+/\d+", text), text
    assert re.search(r"\d+/\d+ sessions extracted", text), text
    # each evaluation's last line (printed before the next one's row replaces it) counts every
    # question and the memory indexed; the child's restores or indexes it; the last ends the round
    for split in ("train", "valid"):
        assert re.search(rf"c0000-\w+ {split}: questions (\d+)/\1 \(.*1 indexed", text), text
    assert re.search(r"c0001-\w+ \w+: questions (\d+)/\1 \(.*1 (restored|indexed)", text), text
    assert "round 1/1" in lines[-1][1]


def test_a_bad_progress_interval_is_one_error_line_before_any_run(
    beam_slice: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
):
    monkeypatch.setenv("PRISMEM_PROGRESS_SECONDS", "soon")
    code = main(["run", "--data-dir", str(beam_slice), "--embedder", "hashing", "--runs-dir",
                 str(tmp_path / "runs"), "--cache-dir", str(tmp_path / "c")])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and "PRISMEM_PROGRESS_SECONDS" in err and "Traceback" not in err
    assert not (tmp_path / "runs").exists()


def test_the_progress_line_counts_windows_indexing_and_judge_calls(data_dir: Path):
    from evolve.benches.registry import bench

    tasks = bench("beam").load_taskset(data_dir, "train")
    conv = tasks.conversations[0]
    tally = WorkerEvents(TaskSet(tasks.bench, tasks.split, [conv], ()))
    assert tally.line() is None  # nothing reported yet
    tally.add(conv.id, "window")
    tally.add(conv.id, "session")
    tally.add(conv.id, "indexing")
    line = tally.line()
    assert line is not None
    assert f"1/{len(conv.sessions)} sessions extracted" in line
    assert "1 extraction windows" in line and f"indexing {conv.id}" in line
    tally.add(conv.id, "indexed")
    tally.judge_calls = 3
    line = tally.line() or ""
    assert "1 indexed" in line and "indexing" not in line and "3 judge calls" in line


def test_an_evaluation_with_a_task_model_and_a_judge_reports_windows_and_judge_calls(
    beam_slice: Path, tmp_path: Path
):
    """Through the executor: the descriptions handed to on_progress count the extraction
    windows the task model answered, the memory indexed and the judge calls; the question
    counts add up to the questions."""
    import json
    from typing import Any

    from evolve.config import RunConfig
    from evolve.evaluation.executor import run_eval
    from evolve.evaluation.setup import EvalSetup
    from evolve.evolution.wiring import task_set
    from evolve.models.llm import ModelConfig, Models
    from evolve.models.testing import ScriptedLLM, task_script

    def judge_script(role: str, purpose: str, messages: list[dict[str, Any]]) -> str:
        return "NO" if purpose == "beam/align" else json.dumps({"score": 1.0, "reason": "ok"})

    seed = Path(__file__).resolve().parents[1] / "seeds" / "simple.py"
    run = RunConfig(data_dir=str(beam_slice), seed_program=str(seed),
                    cache_dir=str(tmp_path / "c"), conversations=1)  # fmt: skip
    tasks = task_set(run, "train")
    config = EvalSetup(cache_dir=str(tmp_path / "c"), embedder="hashing",
                          task_model=ModelConfig(model="scripted"), script=task_script)  # fmt: skip
    judge = ScriptedLLM(judge_script, Models(judge=ModelConfig(model="scripted-judge")))
    seen: list[tuple[int, str | None]] = []
    run_eval(seed, tasks, config, jobs=1, judge=judge,
             on_progress=lambda n, what: seen.append((n, what)))  # fmt: skip
    assert sum(n for n, _ in seen) == len(tasks.questions)
    lines = [what or "" for _, what in seen]
    assert any(re.search(r"\d+ extraction windows", line) for line in lines), lines
    assert any("1 indexed" in line for line in lines), lines
    assert re.search(rf"{len(judge.records)} judge calls", lines[-1]), lines[-1]
    assert judge.records
