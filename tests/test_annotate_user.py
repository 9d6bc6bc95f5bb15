"""Questions with no capability (a user's): annotated with an annotator, unlabelled without one,
counted overall and grouped as ``unlabelled`` in evaluations, never a refinement target; and
``evolve data annotate`` writing the annotator's labels into a user-format folder."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from conftest import first_sessions, run_config

from contract.types import Message, Segment
from evolve.cli import annotate as annotate_cli
from evolve.cli import run as run_cli
from evolve.cli.common import UsageError, out
from evolve.cli.eval import _print_report
from evolve.datasets.types import UNLABELLED, Conversation, Question, TaskSet
from evolve.datasets.userformat import Dataset, read_dataset, write_dataset
from evolve.evaluation.executor import run_eval
from evolve.evaluation.setup import EvalSetup
from evolve.evolution import loop
from evolve.evolution.annotate import NO_ANNOTATOR, Labels, annotate, with_labels
from evolve.evolution.archive import fitness
from evolve.evolution.report import render_html, report_data
from evolve.evolution.selection import ranking, train_by_capability
from evolve.evolution.store import RunStore
from evolve.models.llm import ModelConfig, Models
from evolve.models.testing import ScriptedLLM

SEEDS = Path(__file__).resolve().parents[1] / "seeds"
pytestmark = pytest.mark.usefixtures("check_once")  # the run here checks the seed and its child


def question(qid: str, capability: str, text: str = "Where do I live?") -> Question:
    return Question(qid, "c1", "user", capability, text, "Lisbon", evidence_ids=("m1",))


def tasks(*questions: Question) -> TaskSet:
    message = Message("m1", "user", "I live in Lisbon.")
    conv = Conversation("c1", (Segment("s1", "2024-03-15", (message,)),))
    return TaskSet("jsonl", "all", (conv,), questions)


def labeller(role: str, purpose: str, messages: list[dict[str, Any]]) -> str:
    """The annotator: T for a question about when, else P (and F as a secondary)."""
    assert (role, purpose) == ("annotator", "annotate")
    asked = messages[-1]["content"].split("Question: ")[1].lower()
    return json.dumps({"primary": "T" if "when" in asked else "P", "secondary": ["F"]})


def test_unlabelled_questions_get_the_annotators_label_and_stay_unlabelled_without_one():
    mixed = tasks(question("q1", ""), question("q2", "M"), question("q3", "", "When did I move?"))
    none = annotate(mixed, None)
    assert none["q1"] == none["q3"] == Labels("", (), NO_ANNOTATOR)
    assert none["q2"] == Labels("M", (), "native")
    assert not none["q1"].labelled and none["q2"].labelled

    llm = ScriptedLLM(labeller, Models(annotator=ModelConfig(model="m1")))
    labels = annotate(mixed, llm)
    assert labels["q1"] == Labels("P", ("F",), "annotator:m1")
    assert labels["q3"] == Labels("T", ("F",), "annotator:m1")
    q1, q2, q3 = with_labels(mixed.questions, labels)  # the annotator labels q2 P too: kept M
    assert (q1.capability, q2.capability, q3.capability) == ("P", "M", "T")
    assert q1.meta == {"capability_source": "annotator:m1"} and q2.meta == {}

    broken = ScriptedLLM(lambda *_: "not json", Models(annotator=ModelConfig(model="m1")))
    kept = annotate(mixed, broken)  # never a valid reply: unlabelled ones stay unlabelled
    assert kept["q1"] == Labels("", (), "none: the annotator gave no valid label")
    assert kept["q2"] == Labels("M", (), "native: the annotator gave no valid label")


def test_an_unlabelled_question_is_never_a_refinement_target():
    labels = {"q1": Labels("", (), NO_ANNOTATOR), "q2": Labels("T", (), "native"),
              "q3": Labels("", (), NO_ANNOTATOR)}  # fmt: skip
    per_question = {"q1": 0.0, "q2": 0.9, "q3": 0.0}  # the unlabelled ones are the weakest
    assert ranking(per_question, labels) == ["T"]
    assert train_by_capability(_with_rows(), labels) == {"T": 0.5}


def _with_rows() -> Any:
    """A candidate from before per-question scores were kept, with an ``unlabelled`` train row."""
    from evolve.evaluation.report import MetricRow, ScoreBlock
    from evolve.evolution.candidate import CandidateMeta

    rows = {"T": MetricRow(n=1, fitness=0.5), UNLABELLED: MetricRow(n=2, fitness=0.0)}
    return CandidateMeta(id="c0001-00000001", number=1, parents=[], stage="seed",
                         capability=None, message="m", source_sha256="0" * 64,
                         status="evaluated", sandbox=None,
                         scores={"train": ScoreBlock(by_capability=rows)}, usage={},
                         seconds=0.0, created=0.0)  # fmt: skip


def blank(task_set: TaskSet, every: int = 1) -> TaskSet:
    """``task_set`` with the capability of every ``every``-th question removed."""
    questions = tuple(replace(q, capability="") if i % every == 0 else q
                      for i, q in enumerate(task_set.questions))  # fmt: skip
    return replace(task_set, questions=questions)


def test_an_eval_scores_unlabelled_questions_overall_and_as_their_own_group(
    data_dir: Path, offline_cache: Path
):
    mixed = blank(first_sessions(data_dir, 2, 6), every=2)
    unlabelled = sum(1 for q in mixed.questions if not q.capability)
    assert 0 < unlabelled < len(mixed.questions)
    setup = EvalSetup(cache_dir=str(offline_cache), task_model=None, embedder="hashing",
                      diagnose=True)  # fmt: skip
    report = run_eval(SEEDS / "hybrid.py", mixed, setup, jobs=1)
    scores = report.scores
    assert scores.overall.n == len(mixed.questions) and scores.overall.fitness is not None
    assert scores.by_capability[UNLABELLED].n == unlabelled
    assert sum(row.n for row in scores.by_capability.values()) == scores.overall.n
    assert scores.diagnostics is not None and UNLABELLED in scores.diagnostics
    with out.capture() as shown:
        _print_report(report)
    assert "unlabelled" in shown.get()


def test_a_run_on_unlabelled_questions_refines_with_no_target(
    data_dir: Path, offline_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
):  # fmt: skip
    real = loop.task_set
    monkeypatch.setattr(loop, "task_set", lambda config, split: blank(real(config, split)))
    config = run_config(data_dir, offline_cache, children=1,
                        rounds={"cold_start": 0, "refinement": 1, "integration": 0})  # fmt: skip
    store = RunStore.create(tmp_path, {"config": config.as_json()}, run_id="unlabelled")
    evolution = loop.Evolution(store, config)
    evolution.run()
    assert {lab.source for lab in evolution.labels().values()} == {NO_ANNOTATOR}
    seed, child = store.candidates()
    assert child.stage == "refinement" and child.capability is None
    assert seed.scores["valid"].by_capability.keys() == {UNLABELLED}
    assert seed.scores["train"].diagnostics is not None
    assert UNLABELLED in seed.scores["train"].diagnostics
    data = report_data(store)  # the report's matrix has the group as a column of its own
    assert data["groups"][-1] == UNLABELLED
    assert data["matrix"][0]["by_capability"][UNLABELLED] == fitness(
        seed.scores["valid"].by_capability[UNLABELLED]
    )
    assert 'title="questions with no capability"' in render_html(data)

    monkeypatch.setattr("evolve.evolution.wiring.task_set", loop.task_set)
    run_cli._say_unlabelled(config)
    line = capsys.readouterr().err
    total = sum(len(evolution.tasks(s).questions) for s in ("train", "valid"))
    assert f"{total} of {total} train and valid questions carry no capability" in line
    assert "--coder" in line


def dataset() -> Dataset:
    messages = (Message("m1", "user", "I moved to Lisbon in May."),
                Message("m2", "assistant", "Noted."))  # fmt: skip
    conv = Conversation("c1", (Segment("s1", "2024-06-01", messages),))
    questions = (question("q1", ""), question("q2", "F", "Where do I live now?"),
                 question("q3", "", "When did I move?"))  # fmt: skip
    return Dataset("mine", "hand", (conv,), questions)


def args(folder: Path, model: str | None) -> argparse.Namespace:
    return argparse.Namespace(dir=folder, model=model, api_base=None)


def test_the_command_labels_unlabelled_questions_and_leaves_labelled_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    folder = write_dataset(tmp_path / "mine", dataset())
    before = (folder / "questions.jsonl").read_bytes()
    with pytest.raises(UsageError, match="--model"):
        annotate_cli.cmd_annotate(args(folder, None))
    assert (folder / "questions.jsonl").read_bytes() == before
    assert not (folder / "annotate").exists()

    made: list[ScriptedLLM] = []

    def client(models: Models, *, log_path: Path, cache_path: Path) -> ScriptedLLM:
        assert models.annotator is not None
        script = labeller if models.annotator.model == "m1" else (lambda *_: "no label")
        made.append(ScriptedLLM(script, models, log_path=log_path, cache_path=cache_path))
        return made[-1]

    monkeypatch.setattr(annotate_cli, "llm_client", client)
    written = (folder / "questions.jsonl").stat()
    assert annotate_cli.cmd_annotate(args(folder, "broken")) == 0  # no valid label: no write
    assert (folder / "questions.jsonl").stat().st_ino == written.st_ino
    assert "2 left unlabelled" in capsys.readouterr().out
    assert annotate_cli.cmd_annotate(args(folder, "m1")) == 0
    got = {q.id: q for q in read_dataset(folder).questions}
    assert (got["q1"].capability, got["q3"].capability) == ("P", "T")
    assert got["q1"].meta["capability_source"] == "annotator:m1"
    assert got["q2"] == dataset().questions[1] and "capability_source" not in got["q2"].meta
    assert len(made[1].transport_calls) == 2  # the labelled question is never asked about
    assert (folder / "annotate" / "calls.sqlite").is_file()
    shown = capsys.readouterr().out
    assert "2 of 2 unlabelled questions labelled by m1: F 0, T 1, P 1, M 0, A 0" in shown
    assert "1 already had a capability (unchanged)" in shown

    after = (folder / "questions.jsonl").read_bytes()
    assert annotate_cli.cmd_annotate(args(folder, "m1")) == 0  # nothing left to label
    assert (folder / "questions.jsonl").read_bytes() == after and len(made) == 2
