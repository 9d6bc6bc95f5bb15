"""The inspect and ship commands (`evolve runs/status/programs/show/diff/lineage/freeze/export`).

One small real run (seed, one cold-start and one refinement round on the first conversation of
each split, hashing embedder) is built once; commands that change a run work on a copy of it.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from dataclasses import asdict
from pathlib import Path

import pytest

from contract.spec import CONTRACT_VERSION
from evolve.cli.main import main
from evolve.evaluation.identity import (
    HEADER_MARK,
    ScoredAs,
    pipeline_version,
    read_scored_as,
    split_preamble,
)
from evolve.evolution.archive import fitness
from evolve.evolution.loop import Evolution, RunConfig, best_overall, specialists
from evolve.evolution.store import RunStore
from evolve.models.embed import precision
from evolve.scoring import fmt_score
from evolve.scoring.fitness import retrieval_fitness
from sandbox.check import check_program
from sandbox.fingerprint import fingerprints

ROOT = Path(__file__).resolve().parents[1]
RUN = "alpha"


@pytest.fixture(scope="module")
def runs(data_dir: Path, offline_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A runs dir holding run ``alpha``: c0000 seed, c0001 cold start, c0002 refinement."""
    root = tmp_path_factory.mktemp("runs")
    cfg = RunConfig(data_dir=str(data_dir), seed_program=str(ROOT / "seeds" / "hybrid.py"),
                    cache_dir=str(offline_cache), jobs=1, embedder="hashing",
                    rounds={"cold_start": 1, "refinement": 1, "integration": 0},
                    conversations=1, children=1, cascade=False)  # fmt: skip
    Evolution(RunStore.create(root, {"config": cfg.as_json()}, run_id=RUN), cfg).run()
    return root


@pytest.fixture
def copy(runs: Path, tmp_path: Path) -> RunStore:
    """A private copy of run ``alpha`` (same run id) in a fresh runs dir, for commands that
    change a run."""
    shutil.copytree(runs / RUN, tmp_path / "runs" / RUN)
    return RunStore.open(tmp_path / "runs", RUN)


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def as_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    code, out, err = cli(capsys, *args, "--json")
    assert code == 0, err
    return json.loads(out)


def add_variant(store: RunStore, source: str, parents: list[str], message: str) -> str:
    return store.add_candidate(source, parents=parents, stage="refinement", capability="F",
                               message=message).id  # fmt: skip


# --- reading a run ------------------------------------------------------------------------


def test_runs_lists_the_run_with_its_best(runs: Path, capsys: pytest.CaptureFixture[str]):
    store = RunStore.open(runs, RUN)
    best = best_overall(store.candidates())
    assert best is not None
    report = as_json(capsys, "runs", "--runs-dir", str(runs))
    [row] = report["runs"]
    assert row["id"] == RUN and row["candidates"] == 3 and row["best"] == best.id
    assert row["best_valid_fitness"] == pytest.approx(fitness(best.scores["valid"].overall))
    assert row["created"] == store.manifest["created"] and row["created_local"]
    code, out, _ = cli(capsys, "runs", "--runs-dir", str(runs))
    assert code == 0 and RUN in out and best.id in out


def test_status_reports_stage_best_specialists_and_spend(
    runs: Path, capsys: pytest.CaptureFixture[str]
):
    store = RunStore.open(runs, RUN)
    candidates = store.candidates()
    best = best_overall(candidates)
    assert best is not None
    status = as_json(capsys, "status", RUN, "--runs-dir", str(runs))
    assert status["stage"] == "finished" and status["round"] is None and status["stopped"] is None
    assert status["created"] == store.manifest["created"]
    assert status["rounds"] == {"cold_start": {"done": 1, "planned": 1},
                                "refinement": {"done": 1, "planned": 1},
                                "integration": {"done": 0, "planned": 0}}  # fmt: skip
    valid = best.scores["valid"].overall
    scores = valid.as_scores()
    assert status["best"] == {"id": best.id, "fitness": pytest.approx(fitness(valid)),
                              "retrieval_fitness": pytest.approx(retrieval_fitness(scores)),
                              "ceiling": valid.ceiling,
                              "similarity": scores["evidence_similarity"],
                              "hit_rate": scores["evidence_hit_rate"]}  # fmt: skip
    assert valid.ceiling is not None
    assert 0.0 < valid.ceiling <= 1.0 and valid.ceiling >= scores["evidence_coverage"]
    assert status["fitness"]["name"] == "retrieval"  # offline
    assert fitness(valid) == pytest.approx(retrieval_fitness(scores))  # same definition offline
    kept = specialists(candidates)
    assert {cap: s["id"] for cap, s in status["specialists"].items()} == {
        cap: m.id for cap, m in kept.items()
    }
    for cap, reported in status["specialists"].items():
        held = kept[cap].scores["valid"].by_capability[cap]
        assert reported["valid_fitness"] == pytest.approx(fitness(held))
    assert status["by_status"] == {
        "proposed": 0,
        "rejected": 0,
        "evaluated": 3,
        "failed": 0,
        "stopped": 0,
    }
    assert status["spend"]["total"]["calls"] == 0 and status["frozen"] == []
    code, out, err = cli(capsys, "status", "--runs-dir", str(runs))  # newest run by default
    assert code == 0 and f"newest run {RUN}" in err
    assert "no LLM calls" in out and "frozen: none" in out and best.id in out


def test_status_of_a_run_stopped_at_a_cap(copy: RunStore, capsys: pytest.CaptureFixture[str]):
    copy.save_state({"rounds": {"cold_start": 1}, "best": None})
    copy.log_event("budget_stop", reason="USD cap reached: spent $1", round=1)
    status = as_json(capsys, "status", RUN, "--runs-dir", str(copy.root.parent))
    assert (status["stage"], status["round"]) == ("refinement", 1)
    assert status["stopped"] == "USD cap reached: spent $1"
    code, out, _ = cli(capsys, "status", RUN, "--runs-dir", str(copy.root.parent))
    text = " ".join(out.split())  # rich wraps at 80 columns
    assert code == 0 and "next: refinement round 1 of 1" in text and "USD cap reached" in text


def test_programs_has_one_row_per_candidate(runs: Path, capsys: pytest.CaptureFixture[str]):
    store = RunStore.open(runs, RUN)
    rows = as_json(capsys, "programs", RUN, "--runs-dir", str(runs))["candidates"]
    assert [r["id"] for r in rows] == [c.id for c in store.candidates()]
    for row, meta in zip(rows, store.candidates(), strict=True):
        assert (row["stage"], row["capability"], row["status"], row["parents"]) == (
            meta.stage, meta.capability, meta.status, meta.parents)  # fmt: skip
        valid = meta.scores["valid"]
        assert row["valid_fitness"] == pytest.approx(fitness(valid.overall))
        assert row["by_capability"] == {
            cap: pytest.approx(fitness(block)) for cap, block in valid.by_capability.items()
        }
    code, out, _ = cli(capsys, "programs", RUN, "--runs-dir", str(runs))
    assert code == 0 and all(c.id in out for c in store.candidates())


@pytest.mark.parametrize("form", ["{run}/{id}", "{run}:{id}", "{run}/c0001", "c0001 --run {run}"])
def test_show_accepts_every_candidate_form(
    runs: Path, capsys: pytest.CaptureFixture[str], form: str
):
    store = RunStore.open(runs, RUN)
    meta = store.get("c0001")
    args = form.format(run=RUN, id=meta.id).split()
    shown = as_json(capsys, "show", *args, "--runs-dir", str(runs))
    assert shown["candidate"] == f"{RUN}/{meta.id}"
    assert shown["source"] == store.source(meta.id) and shown["meta"] == meta.model_dump()


def test_show_bare_id_uses_the_newest_run(runs: Path, capsys: pytest.CaptureFixture[str]):
    code, out, err = cli(capsys, "show", "c0002", "--runs-dir", str(runs))
    assert code == 0 and f"using the newest run {RUN}" in err
    assert "LEXICAL_WEIGHT" in out and RunStore.open(runs, RUN).get("c0002").id in out


def test_show_and_diff_print_no_terminal_control_a_source_holds(
    copy: RunStore, capsys: pytest.CaptureFixture[str]
):
    """A candidate that failed tier 1 may hold any character; show and diff print escapes."""
    hostile = copy.source("c0001") + 'NOTE = "\x1b]0;pwned\x07\u202e"\n'
    cid = add_variant(copy, hostile, ["c0001"], "evil \x1b[2J message")
    runs = str(copy.root.parent)
    for argv in (["show", f"{RUN}/{cid}"], ["diff", f"{RUN}/c0001", f"{RUN}/{cid}"]):
        code, out, err = cli(capsys, *argv, "--runs-dir", runs)
        assert code == 0, err
        assert "pwned" in out and not any(c in out for c in "\x07\u202e"), argv
        assert "\x1b]" not in out and "\x1b[2J" not in out, argv


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["show", "nope/c0001"], "run 'nope' not found"),
        (["show", f"{RUN}/c9999"], "no candidate 'c9999'"),
        (["show", f"{RUN}/c000"], "ambiguous"),
        (["show", "c000", "--run", RUN], "ambiguous"),
        (["show", f"{RUN}/c0001/x"], "bad candidate"),
        (["show", f"{RUN}/"], "bad candidate"),
        (["show", f"{RUN}/c0001", "--run", "other"], "--run is other"),
        (["diff", f"{RUN}/c0001", "nope:c0001"], "run 'nope' not found"),
        (["lineage", f"{RUN}/c0042"], "no candidate 'c0042'"),
        (["status", "nope"], "run 'nope' not found"),
        (["programs", "../x"], "not found"),
        (["freeze", f"{RUN}/c0001", "--jobs", "0"], "--jobs: must be an integer from 1 to"),
    ],
)
def test_expected_failures_are_one_error_line(
    runs: Path, capsys: pytest.CaptureFixture[str], argv: list[str], words: str
):
    code, out, err = cli(capsys, *argv, "--runs-dir", str(runs))
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and err.startswith("error: ") and words in err


def test_best_names_the_runs_best_overall(
    runs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    best = best_overall(RunStore.open(runs, RUN).candidates())
    assert best is not None
    for ref in (f"{RUN}/best", "best"):
        shown = as_json(capsys, "show", ref, "--runs-dir", str(runs))
        assert shown["candidate"] == f"{RUN}/{best.id}"
    empty = RunStore.create(tmp_path, {"config": {}}, run_id="empty")
    empty.add_candidate("x = 1\n", parents=[], stage="seed", capability=None, message="seed")
    code, _, err = cli(capsys, "show", "empty/best", "--runs-dir", str(tmp_path))
    assert code == 2 and err.strip() == "error: run empty has no best yet (no candidate evaluated)"


def test_no_runs_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    code, _, err = cli(capsys, "show", "c0001", "--runs-dir", str(tmp_path))
    assert code == 2 and err.strip() == f"error: no runs in {tmp_path}"
    assert as_json(capsys, "runs", "--runs-dir", str(tmp_path))["runs"] == []


def test_diff_of_a_child_against_its_parent(runs: Path, capsys: pytest.CaptureFixture[str]):
    store = RunStore.open(runs, RUN)
    child = store.get("c0001")
    names = re.findall(r"([A-Z_]+) \S+ -> ", child.message)  # "random: NAME old -> new, ..."
    assert names
    report = as_json(capsys, "diff", child.parents[0], child.id, "--run", RUN,
                     "--runs-dir", str(runs))  # fmt: skip
    assert report["a"] == f"{RUN}/{child.parents[0]}" and report["b"] == f"{RUN}/{child.id}"
    lines = report["diff"].splitlines()
    assert lines[0] == f"--- {RUN}/{child.parents[0]}" and lines[1] == f"+++ {RUN}/{child.id}"
    for name in names:
        assert any(line.startswith(f"-{name} = ") for line in lines)
        assert any(line.startswith(f"+{name} = ") for line in lines)
    code, out, _ = cli(capsys, "diff", f"{RUN}/c0000", "c0001", "--runs-dir", str(runs))
    assert code == 0 and f"+{names[0]} = " in out  # B is looked up in A's run
    same = as_json(capsys, "diff", f"{RUN}/c0001", f"{RUN}:c0001", "--runs-dir", str(runs))
    assert same["diff"] == ""


def test_diff_across_runs(copy: RunStore, capsys: pytest.CaptureFixture[str]):
    other = RunStore.create(copy.root.parent, {"config": copy.manifest["config"]}, run_id="beta")
    seed = other.add_candidate(copy.source("c0002"), parents=[], stage="seed", capability=None,
                               message="seed copied")  # fmt: skip
    runs_dir = str(copy.root.parent)
    report = as_json(capsys, "diff", f"{RUN}/c0002", f"beta/{seed.id}", "--runs-dir", runs_dir)
    assert report["b"] == f"beta/{seed.id}" and report["diff"] == ""
    report = as_json(capsys, "diff", f"{RUN}/c0000", f"beta/{seed.id}", "--runs-dir", runs_dir)
    pairs = zip(copy.source("c0000").splitlines(), copy.source("c0002").splitlines(), strict=True)
    changed = next(b for a, b in pairs if a != b)  # a tunable the proposer moved
    assert report["diff"].startswith(f"--- {RUN}/") and f"+{changed}\n" in report["diff"]


def test_lineage_reaches_the_seed_through_two_parents(
    copy: RunStore, capsys: pytest.CaptureFixture[str]
):
    runs_dir = str(copy.root.parent)
    chain = as_json(capsys, "lineage", f"{RUN}/c0002", "--runs-dir", runs_dir)["ancestors"]
    assert chain[0]["stage"] == "refinement" and chain[-1]["stage"] == "seed"  # via its best
    assert chain[-1]["parents"] == []
    assert all(n["parents"] == [up["id"]] for n, up in zip(chain, chain[1:], strict=False))
    a = copy.get("c0001")  # the cold start: a child of the seed
    b = copy.get(add_variant(copy, copy.source(a.parents[0]) + "\n", a.parents, "sibling"))
    cross = add_variant(copy, copy.source(b.id) + "\n", [a.id, b.id], "crossover")
    chain = as_json(capsys, "lineage", cross, "--run", RUN, "--runs-dir", runs_dir)["ancestors"]
    assert [n["id"] for n in chain] == [cross, a.id, b.id, a.parents[0]]  # the seed once
    code, out, _ = cli(capsys, "lineage", f"{RUN}/{cross}", "--runs-dir", runs_dir)
    assert code == 0 and out.count(a.parents[0]) == 2 and "shown above" in out


def test_messages_are_printed_verbatim(copy: RunStore, capsys: pytest.CaptureFixture[str]):
    """Messages hold "[rejected: ...]" and the like: never read as rich markup."""
    cid = add_variant(copy, copy.source("c0002") + "\n", ["c0002"], "[/x] [y: z]")
    for argv in (["programs", RUN], ["show", f"{RUN}/{cid}"], ["lineage", f"{RUN}/{cid}"]):
        code, out, err = cli(capsys, *argv, "--runs-dir", str(copy.root.parent))
        assert code == 0 and "[/x] [y: z]" in out, err


# --- freeze -------------------------------------------------------------------------------


def test_freeze_scores_test_once(copy: RunStore, capsys: pytest.CaptureFixture[str]):
    runs_dir = str(copy.root.parent)
    before = {c.id: c.scores for c in copy.candidates()}
    assert all(set(s) == {"train", "valid"} for s in before.values())  # the loop never saw test
    # c0001 was frozen earlier (a stand-in block): freezing it again must return exactly that.
    stand_in = {"overall": {"n": 1, "evidence_similarity": 0.5, "evidence_hit_rate": 0.25},
                "by_capability": {}, "errors": 0}  # fmt: skip
    copy.update("c0001", frozen=True, scores={**before[copy.get("c0001").id], "test": stand_in})

    args = ("--runs-dir", runs_dir, "--no-progress", "--jobs", "1")
    code, out, err = cli(capsys, "freeze", f"{RUN}/c0002", *args, "--json")
    assert code == 0, err
    report = json.loads(out)
    assert "selection on test" in err and report["other_frozen"] == [copy.get("c0001").id]
    meta = copy.get("c0002")
    test = meta.scores["test"]
    assert meta.frozen and report["scored"] is True and report["test"] == test.model_dump()
    assert set(test.model_dump()) == {"fitness", "overall", "by_capability", "errors"}
    assert test.overall.n > 0 and test.errors == 0
    assert {k: meta.scores[k] for k in ("train", "valid")} == before[meta.id]
    assert report["test_fitness"] == pytest.approx(fitness(test.overall))
    [event] = [e["data"] for e in copy.events("frozen")]
    assert event["candidate"] == meta.id and event["conversations"] == 1
    assert event["data"] and all(k.startswith("beam/") and "/1M/" in k for k in event["data"])

    code, out, err = cli(capsys, "freeze", f"{RUN}/c0002", *args)
    assert code == 0 and "not scored again" in err and "test scores" in out
    top = meta.scores["test"].overall.ceiling  # the ceiling beside the test scores
    assert f"of a possible {fmt_score(top)}" in " ".join(out.split())
    assert copy.get("c0002") == meta and len(copy.events("frozen")) == 1
    again = as_json(capsys, "freeze", f"{RUN}:c0001", *args)
    assert again["scored"] is False and again["test"] == stand_in
    status = as_json(capsys, "status", RUN, "--runs-dir", runs_dir)
    assert [f["id"] for f in status["frozen"]] == [copy.get("c0001").id, meta.id]


def test_freeze_refuses_a_candidate_that_is_not_evaluated(
    copy: RunStore, capsys: pytest.CaptureFixture[str]
):
    pending = add_variant(copy, copy.source("c0002") + "\n", ["c0002"], "not evaluated yet")
    code, _, err = cli(capsys, "freeze", f"{RUN}/{pending}", "--runs-dir", str(copy.root.parent))
    assert code == 2 and err.strip() == (
        f"error: only an evaluated candidate can be frozen; {RUN}/{pending} is proposed"
    )
    assert not copy.get(pending).frozen and copy.events("frozen") == []


def test_freeze_records_nothing_when_test_questions_fail(
    copy: RunStore, capsys: pytest.CaptureFixture[str]
):
    """A program that breaks only on the (much longer) BEAM-1M test conversation."""
    trap = 8 * " " + "if len(self.units) > 1000 and len(set(self.sessions)) < 50:\n"
    trap += 12 * " " + "1 / 0\n"
    # the sandbox probe indexes 2,000 units in 100 sessions; a BEAM-1M history ~1,700 in ~10
    source = copy.source("c0002").replace(
        "    def retrieve(self, query):\n", "    def retrieve(self, query):\n" + trap
    )
    assert source != copy.source("c0002")
    broken = add_variant(copy, source, ["c0002"], "fails on long histories")
    copy.update(broken, status="evaluated", scores=copy.get("c0002").scores)
    code, _, err = cli(capsys, "freeze", f"{RUN}/{broken}", "--runs-dir", str(copy.root.parent),
                       "--no-progress", "--jobs", "1")  # fmt: skip
    assert code == 2 and "test questions failed" in err and "no test score was recorded" in err
    meta = copy.get(broken)
    assert not meta.frozen and "test" not in meta.scores and copy.events("frozen") == []
    assert (copy.root / f"freeze-{meta.id}" / "questions.jsonl").is_file()


# --- export -------------------------------------------------------------------------------


def body(text: str) -> str:
    """An export without its header block (the ``#`` lines from HEADER_MARK and one blank)."""
    lines = text.splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines) if line.startswith(HEADER_MARK))
    end = next(i for i in range(start, len(lines)) if not lines[i].startswith("#"))
    assert lines[end] == "\n"
    return "".join(lines[:start] + lines[end + 1 :])


def test_export_writes_a_standalone_checked_program(
    runs: Path, data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    store = RunStore.open(runs, RUN)
    meta = store.get("c0002")
    target = tmp_path / "best.py"
    report = as_json(
        capsys, "export", f"{RUN}/c0002", "--out", str(target), "--runs-dir", str(runs)
    )
    assert report["candidate"] == f"{RUN}/{meta.id}" and report["check"] == "passed"
    text = target.read_text()
    source = store.source(meta.id)
    assert body(text) == source and hashlib.sha256(body(text).encode()).hexdigest() == (
        meta.source_sha256
    )
    header = text[: len(text) - len(source)]
    seed = next(c for c in store.candidates() if c.stage == "seed")
    fitnesses = [f"{split}: fitness {fitness(meta.scores[split].overall):.4f}, similarity 0."
                 for split in ("valid", "train")]  # fmt: skip
    for needle in (f"run: {RUN}", f"candidate: {meta.id}", f"contract version {CONTRACT_VERSION}",
                   f"sha256: {meta.source_sha256}", "test: not frozen", "exported: ",
                   f"{meta.id} [refinement] <- {meta.parents[0]}: {meta.message}",
                   f"{seed.id} [seed]: seed hybrid.py", *fitnesses):  # fmt: skip
        assert needle in header, needle
    assert fingerprints(text) == fingerprints(source)
    assert check_program(text, str(target)).passed
    config = store.manifest["config"]  # how it was scored, recorded and read back
    scored = read_scored_as(text)
    assert scored == ScoredAs("offline", None, config["embedder"], precision(), pipeline_version())
    assert config["task_model"] is None and report["scored_as"] == asdict(scored)
    assert read_scored_as(body(text)) is None

    code, _, err = cli(
        capsys, "export", f"{RUN}/c0001", "--out", str(target), "--runs-dir", str(runs)
    )
    assert code == 2 and err.strip() == f"error: {target} exists; pass --force to overwrite it"
    assert target.read_text() == text
    code, _, err = cli(capsys, "export", f"{RUN}/c0001", "--out", str(target), "--force",
                       "--runs-dir", str(runs))  # fmt: skip
    assert code == 0, err
    assert body(target.read_text()) == store.source("c0001")
    missing = tmp_path / "no" / "such" / "dir.py"
    code, _, err = cli(
        capsys, "export", f"{RUN}/c0001", "--out", str(missing), "--runs-dir", str(runs)
    )
    assert code == 2 and err.startswith("error: cannot write") and len(err.splitlines()) == 1

    # The export runs without the run store, reusing the candidate's cached stages.
    code, out, err = cli(
        capsys, "eval", "--program", str(target), "--split", "valid", "--embedder", "hashing",
        "--data-dir", str(data_dir), "--runs-dir", str(tmp_path / "evals"), "--jobs", "2",
        "--cache-dir", store.manifest["config"]["cache_dir"], "--json", "--no-progress",
    )  # fmt: skip
    assert code == 0, err
    evaluated = json.loads(out)
    assert evaluated["meta"]["errors"] == 0 and evaluated["meta"]["questions"] > 0
    assert evaluated["meta"]["fingerprints"] == fingerprints(store.source("c0001"))
    assert evaluated["stages"]["retrieve"]["reused"] > 0


def test_export_refuses_a_program_that_fails_the_sandbox(
    copy: RunStore, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    bad = add_variant(copy, "import os\n" + copy.source("c0000"), ["c0000"], "imports os")
    target = tmp_path / "bad.py"
    code, _, err = cli(capsys, "export", f"{RUN}/{bad}", "--out", str(target),
                       "--runs-dir", str(copy.root.parent))  # fmt: skip
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1 and "import-not-allowed" in errors[0]
    assert not target.exists() and not list(tmp_path.glob(".bad.py*"))


def test_export_keeps_shebang_and_encoding_first(
    copy: RunStore, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    preamble = "#!/usr/bin/env python3\n# -*- coding: utf-8 -*-\n"
    source = preamble + copy.source("c0002")
    cid = add_variant(copy, source, ["c0002"], "with a shebang")
    target = tmp_path / "shebang.py"
    code, _, err = cli(capsys, "export", f"{RUN}/{cid}", "--out", str(target),
                       "--runs-dir", str(copy.root.parent))  # fmt: skip
    assert code == 0 and "is proposed, not evaluated" in err
    text = target.read_text()
    assert text.startswith(preamble + HEADER_MARK) and body(text) == source
    assert fingerprints(text) == fingerprints(source)


@pytest.mark.parametrize(
    ("source", "kept"),
    [
        ("x = 1\n", ""),
        ("#!/bin/python\nx = 1\n", "#!/bin/python\n"),
        ("# coding: latin-1\nx = 1\n", "# coding: latin-1\n"),
        ("#!/bin/python\n# vim: set fileencoding=utf-8 :\nx = 1\n",
         "#!/bin/python\n# vim: set fileencoding=utf-8 :\n"),
        ("# a comment\n# -*- coding: utf-8 -*-\nx = 1\n", "# a comment\n# -*- coding: utf-8 -*-\n"),
        ("x = 1\n# coding: utf-8\n", ""),  # too late to be an encoding line
        ("x = 1\n#!/bin/python\n", ""),
    ],
)  # fmt: skip
def test_split_preamble(source: str, kept: str):
    assert split_preamble(source) == (kept, source[len(kept) :])
