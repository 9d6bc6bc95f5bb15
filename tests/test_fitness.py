"""The retrieval fitness end to end: evidence coverage through the real executor (format
invariant, monotone), selection reads it, its ceiling beside every score, and a run scored
under another fitness is not resumed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import first_sessions

from evolve.benches.registry import bench
from evolve.cli.eval import ceiling_line
from evolve.cli.main import main
from evolve.config import RunConfig
from evolve.datasets.types import TaskSet
from evolve.evaluation.executor import run_eval
from evolve.evaluation.setup import EvalSetup
from evolve.evolution.archive import archive
from evolve.evolution.store import CandidateMeta, RunStore
from evolve.models.testing import HashingEmbedder
from evolve.scoring.ceiling import question_ceilings
from evolve.scoring.fitness import KEY

ROOT = Path(__file__).resolve().parents[1]
HYBRID = (ROOT / "seeds" / "hybrid.py").read_text()
RENDER = 'return f"[{unit.date}] {text}" if DATE_PREFIX and unit.date else text'
FIT = "kept = fit(blocks, OUT_CHAR_BUDGET)"
ALL = "kept = list(range(len(blocks)))"  # every block, in relevance order
REVERSED = "kept = list(range(len(blocks)))[::-1]"
BUDGET = 16000


@pytest.fixture(scope="module")
def tasks(data_dir: Path) -> TaskSet:
    """Three sessions of BEAM-100K conversation 1 and the questions whose evidence lies there."""
    tasks = first_sessions(data_dir, 3, 8)
    assert len(tasks.questions) >= 4
    return tasks


def program(tmp_path: Path, name: str, *edits: tuple[str, str]) -> Path:
    """The hybrid seed keeping its top 3 units, all of them (no greedy packing, so the same
    units are kept in every format), with ``edits``."""
    assert FIT in HYBRID and "TOP_K = 80" in HYBRID
    source = HYBRID.replace("TOP_K = 80", "TOP_K = 3").replace(FIT, ALL)
    for old, new in edits:
        assert old in source, old
        source = source.replace(old, new)
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    return path


def evaluated(path: Path, tasks: TaskSet, cache: Path) -> Any:
    config = EvalSetup(cache_dir=str(cache), task_model=None, embedder="hashing")
    return run_eval(path, tasks, config, jobs=1)


def test_dates_headers_and_order_do_not_move_the_fitness_and_more_never_lowers_it(
    tasks: TaskSet, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    plain = program(tmp_path, "plain", ("DATE_PREFIX = True", "DATE_PREFIX = False"))
    dated = program(tmp_path, "dated")
    styled = program(
        tmp_path,
        "styled",  # an id / session header line, a role and a bullet, in reverse order
        (RENDER, 'return f"(session {self.sessions[i]} · msg {i} · {unit.date})\\n'
                 '- {unit.role}: {text}"'),
        (ALL, REVERSED),
    )  # fmt: skip
    more = program(
        tmp_path, "more", ("TOP_K = 3", "TOP_K = 5"), ("DATE_PREFIX = True", "DATE_PREFIX = False")
    )
    reports = {p.stem: evaluated(p, tasks, cache) for p in (plain, dated, styled, more)}
    base = reports["plain"].scores.overall.fitness
    assert base is not None
    assert 0.0 < base < 1.0
    texts = {name: [t.retrieved_text for t in r.traces] for name, r in reports.items()}
    formats = ("plain", "dated", "styled")
    assert max(len(t) for f in formats for t in texts[f]) < BUDGET  # nothing was cut
    assert all("[20" in t for t in texts["dated"]) and all("· msg" in t for t in texts["styled"])
    for name in ("dated", "styled"):
        assert texts[name] != texts["plain"]
        assert abs((reports[name].scores.overall.fitness or 0.0) - base) <= 0.005, name
    for a, b in zip(reports["plain"].traces, reports["more"].traces, strict=True):
        assert b.retrieved_text.startswith(a.retrieved_text)  # the same units, then more
        assert b.scores[KEY] >= a.scores[KEY] - 1e-9
    mode = reports["plain"].meta.fitness
    assert mode is not None and mode.coverage == "coverage-3"


def _meta(number: int, per_question: dict[str, float]) -> CandidateMeta:
    mean = sum(per_question.values()) / len(per_question)
    valid = {"overall": {KEY: mean, "n": len(per_question)}, "by_capability": {},
             "questions": per_question, "question_capabilities": {}}  # fmt: skip
    return CandidateMeta(
        id=f"c{number:04d}-{number:08x}", number=number, parents=[], stage="seed",
        capability=None, message="m", source_sha256=f"{number:064x}", status="evaluated",
        sandbox=None, scores={"valid": valid}, usage={}, seconds=0.0, created=0.0,
    )  # fmt: skip


def test_selection_reads_coverage_where_the_old_metrics_disagree() -> None:
    """Holder: high cosines to the evidence (dated blocks of neighbours) but the evidence itself
    missing; challenger: the evidence in the context, lower cosines. The executor's per-question
    fitness is what the archive compares, and it must be coverage."""
    fit = bench("beam").fitness(None, judged=False)
    holder = {"evidence_coverage": 0.2, "evidence_similarity": 0.95, "evidence_hit_rate": 1.0}
    challenger = {"evidence_coverage": 0.9, "evidence_similarity": 0.6, "evidence_hit_rate": 0.2}
    ids = [f"q{i}" for i in range(20)]

    def per_question(scores: dict[str, float]) -> dict[str, float]:
        value = fit.question(scores)
        assert value is not None
        return dict.fromkeys(ids, value)

    kept = archive([_meta(0, per_question(holder)), _meta(1, per_question(challenger))])
    assert kept.best is not None and kept.best.number == 1


def test_the_ceiling_is_beside_every_score_cached_and_one_where_the_evidence_fits(
    tasks: TaskSet, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    report = evaluated(program(tmp_path, "plain"), tasks, cache)
    overall = report.scores.overall
    assert report.meta.ceiling is not None
    assert overall.ceiling == 1.0 == report.meta.ceiling.overall  # small: all fits
    for row in report.scores.by_capability.values():
        assert row.ceiling == 1.0 and (row.metric("evidence_coverage") or 0.0) <= row.ceiling
    assert all(t.scores["ceiling"] == 1.0 for t in report.traces)
    line = ceiling_line(overall)
    covered = overall.metric("evidence_coverage")
    assert line.startswith(f"coverage {covered:.3f} of a possible 1.000")
    (stored,) = (cache / "ceilings").iterdir()  # one task set, one file
    stored.write_text(json.dumps(dict.fromkeys(json.loads(stored.read_text()), 0.5)))
    again = evaluated(program(tmp_path, "plain"), tasks, cache)
    assert again.scores.overall.ceiling == 0.5  # read from the cache, not recomputed


def test_a_question_whose_evidence_exceeds_the_budget_has_a_ceiling_below_one(
    tmp_path: Path,
) -> None:
    evidence = {"fits": ["user: I moved to Berlin in 2021."],
                "long": ["user: " + "my sister Clara bakes lemon cakes " * 30,
                         "assistant: noted, lemon cakes"],
                "none": []}  # fmt: skip
    embedder = HashingEmbedder(dim=384)
    tight = question_ceilings(evidence, embedder, tmp_path, budget=200)
    assert tight["fits"] == 1.0 and tight["none"] is None
    assert tight["long"] is not None and 0.5 <= tight["long"] < 1.0  # one of two fits
    assert question_ceilings(evidence, embedder, tmp_path, budget=20000)["long"] == 1.0
    assert len(list((tmp_path / "ceilings").iterdir())) == 2  # the budget is in the key


def test_resume_of_a_run_scored_under_another_fitness_is_one_error_line(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = RunConfig(data_dir=str(data_dir), seed_program=str(ROOT / "seeds" / "dense.py"),
                       cache_dir=str(tmp_path / "c"), embedder="hashing")  # fmt: skip
    old = {"name": "retrieval", "version": "1", "variant": "described", "definition": "mean"}
    store = RunStore.create(tmp_path, {"config": config.as_json(), "fitness": old}, run_id="old")
    code = main(["run", "--resume", "old", "--runs-dir", str(tmp_path), "--no-progress"])
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1 and "Traceback" not in err
    assert errors[0].startswith("error: run old cannot be resumed: its scores were recorded "
                                "under fitness version 1, coverage unrecorded")  # fmt: skip
    assert not store.candidates()  # nothing ran
