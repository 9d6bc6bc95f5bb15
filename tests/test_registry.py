"""The benchmark registry: a new bench is one module and one entry (evolve/benches/registry.py).

The tiny bench here stands for that module: its loader reads ``tiny.jsonl`` (one conversation
and its questions per line) and its scorer is exact match. Registered for one test at a time
(its one line, as a test registers it), it is evaluated by ``evolve eval --bench tiny`` and by
the executor with a scripted task model: the loader, the scorer, the fitness metrics and guard
specs come from its entry, and nothing else in PrisMem names it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from contract.types import Message, Segment
from evolve.benches import registry
from evolve.benches.guards import parse_guard
from evolve.benches.registry import Bench
from evolve.cli.main import main
from evolve.datasets.types import Conversation, DataError, Question, TaskSet
from evolve.evaluation.executor import run_eval
from evolve.evaluation.setup import EvalSetup
from evolve.models.llm import LLMClient, ModelConfig
from evolve.models.testing import task_script
from evolve.scoring.answers import Judged
from evolve.scoring.fitness import BenchMetrics

ROOT = Path(__file__).resolve().parents[1]
DENSE = ROOT / "seeds" / "dense.py"
SCRIPTED_ANSWER = "This is a scripted answer."  # what task_script answers every question


class TinyLoader:
    """The tiny bench's loader: ``<data_dir>/tiny.jsonl``, split ``all`` only."""

    SPLIT_NAMES = ("all",)
    DEFAULT_SPLIT = "all"
    DEFAULT_SPLITS_FILE = Path(__file__)  # no splits file: every conversation is in ``all``

    def load_taskset(self, data_dir: Path, split: str) -> TaskSet:
        conversations, questions = [], []
        for line in (data_dir / "tiny.jsonl").read_text(encoding="utf-8").splitlines():
            raw = json.loads(line)
            sessions = tuple(
                Segment(str(i), None, tuple(Message(f"{i}.{j}", "user", text)
                                            for j, text in enumerate(session)))
                for i, session in enumerate(raw["sessions"])
            )  # fmt: skip
            conversations.append(Conversation(raw["id"], sessions))
            questions += [
                Question(f"{raw['id']}/{k}", raw["id"], "recall", "F", q["question"], q["gold"],
                         evidence_ids=tuple(q["evidence"]))
                for k, q in enumerate(raw["questions"])
            ]  # fmt: skip
        return TaskSet("tiny", split, tuple(conversations), tuple(questions))

    def split_files(self, data_dir: Path, split: str, conversations: int | None) -> list[Path]:
        return [data_dir / "tiny.jsonl"]

    def run_split(self, data_dir: Path, role: str) -> str:
        return "all"


class ExactScorer:
    """The tiny bench's answer scorer: 1 when the gold answer is in the answer."""

    bench = "tiny"
    metrics = ("exact",)
    judge_metrics = ()

    def __init__(self, judge: LLMClient | None) -> None:
        self.judge = judge

    def score(self, question: Question, answer: str) -> Judged:
        return Judged({"exact": float(question.gold.lower() in answer.lower())})

    def max_judge_calls(self, question: Question) -> int:
        return 0

    def summarize(self, rows: list[tuple[Question, dict[str, Any]]]) -> dict[str, Any]:
        return {"exact_matches": sum(scores["exact"] for _, scores in rows)}

    def describe(self) -> dict[str, Any]:
        return {"judge": None, "prompts": {}, "variants": [], "note": "exact match, no judge"}


TINY = Bench("tiny", TinyLoader(), ExactScorer, BenchMetrics(("exact",), ("exact",)))


@pytest.fixture
def tiny(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The tiny bench registered (for this test only) and a data dir holding its file."""
    monkeypatch.setitem(registry.REGISTRY, "tiny", TINY)
    sessions = [["I moved to Lisbon in May.", "My sister Ana is a nurse."],
                ["We adopted a cat called Miso.", "Miso is grey and loves boxes."]]  # fmt: skip
    questions = [
        {"question": "Where did I move?", "gold": "Lisbon", "evidence": ["0.0"]},
        {"question": "What is my cat's name?", "gold": "scripted answer", "evidence": ["1.0"]},
    ]
    data = tmp_path / "data"
    data.mkdir()
    line = {"id": "tiny/1", "sessions": sessions, "questions": questions}
    (data / "tiny.jsonl").write_text(json.dumps(line) + "\n", encoding="utf-8")
    return data


def test_the_shipped_benches_have_one_entry_each() -> None:
    assert registry.names() == ("beam", "locomo", "longmemeval", "jsonl")
    assert len({entry.name for entry in registry.ENTRIES}) == len(registry.ENTRIES)
    assert registry.fetchable() == ("beam",)
    for entry in registry.ENTRIES:
        assert entry.default_split in (*entry.splits, "all") and entry.splits_file.is_file()
        assert entry.scorer(None).bench == entry.name
        assert all(parse_guard(spec).name == spec for spec in entry.guards)


def test_a_registered_bench_is_evaluated_by_the_cli(
    tiny: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main([
        "eval", "--program", str(DENSE), "--bench", "tiny", "--data-dir", str(tiny), "--json",
        "--embedder", "hashing", "--jobs", "1", "--no-progress",
        "--runs-dir", str(tmp_path / "runs"), "--cache-dir", str(tmp_path / "cache"),
    ])  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0, err
    meta = json.loads(out)["meta"]
    assert (meta["bench"], meta["split"], meta["questions"]) == ("tiny", "all", 2)
    assert parse_guard("tiny:all@1").name == "tiny:all@1"  # guard specs may name it


def test_a_registered_bench_scores_answers_with_its_own_scorer_and_metrics(
    tiny: Path, tmp_path: Path
) -> None:
    tasks = registry.bench("tiny").load_taskset(tiny)
    config = EvalSetup(cache_dir=str(tmp_path / "cache"), task_model=ModelConfig(model="scripted"),
                       embedder="hashing", script=task_script)  # fmt: skip
    report = run_eval(DENSE, tasks, config, jobs=1)
    assert [t.answer for t in report.traces] == [SCRIPTED_ANSWER] * 2
    assert [t.scores["exact"] for t in report.traces] == [0.0, 1.0]
    assert [t.scores["fitness"] for t in report.traces] == [0.0, 1.0]  # answer-f1 reads exact
    written = report.as_json()  # as report.json and `evolve eval --json` hold it
    assert written["scores"]["overall"]["fitness"] == 0.5
    assert written["meta"]["fitness"]["name"] == "answer-f1"
    assert written["scores"]["headline"] == {"exact_matches": 1.0}


def test_an_unregistered_bench_is_refused_in_one_line() -> None:
    with pytest.raises(ValueError, match="unknown bench 'tiny'"):
        parse_guard("tiny:all")
    with pytest.raises(DataError, match="expected one of beam, locomo, longmemeval") as exc:
        registry.bench("tiny")
    assert "\n" not in str(exc.value)
