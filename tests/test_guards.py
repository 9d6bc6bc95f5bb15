"""Guard sets: a valid winner is promoted only when it is not worse on every guard.

The archive's rule is tested on scripted scores; the loop (evaluation on the guards, step
reuse, what never reaches a proposer, resume) on the first BEAM-100K conversation of train and
valid with the hashing embedder (a test double: deterministic numbers), guarded by the first
holdout conversation and the LoCoMo sample; the CLI's flags on a dry run.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from conftest import run_config

from evolve.benches.guards import Guard, parse_guard
from evolve.benches.registry import bench
from evolve.cli.main import main
from evolve.evaluation.report import ScoreBlock
from evolve.evolution.archive import MARGIN, archive, non_inferior
from evolve.evolution.coder import render_request
from evolve.evolution.loop import Evolution
from evolve.evolution.proposer import Request
from evolve.evolution.selection import DependencyAware
from evolve.evolution.store import CandidateMeta, RunStore
from evolve.evolution.summary import transfer, transfer_lines
from evolve.evolution.wiring import constant_proposer

CAPS = {f"q{i}": "FT"[i % 2] for i in range(24)}  # 12 F questions, 12 T questions
GUARD = "guard:locomo:all@1"
BASE = {q: 0.5 for q in CAPS}


def block(per_question: dict[str, float]) -> dict[str, Any]:
    def part(ids: list[str]) -> dict[str, Any]:
        mean = sum(per_question[q] for q in ids) / len(ids)
        return {"fitness": mean, "ceiling": 0.9, "n": len(ids)}

    return {"overall": part(list(per_question)),
            "by_capability": {c: part([q for q in per_question if CAPS[q] == c]) for c in "FT"},
            "questions": per_question, "question_capabilities": CAPS}  # fmt: skip


def meta(number: int, valid: dict[str, float], guard: dict[str, float] | None) -> CandidateMeta:
    scores = {"valid": block(valid)} | ({GUARD: block(guard)} if guard is not None else {})
    return CandidateMeta(
        id=f"c{number:04d}-{number:08x}", number=number, parents=[], stage="seed" if number == 0
        else "refinement", capability=None, message="m", source_sha256=f"{number:064x}",
        status="evaluated", sandbox=None, scores=scores, usage={}, seconds=0.0, created=0.0,
    )  # fmt: skip


def plus(d: float, only: str | None = None) -> dict[str, float]:
    return {q: v + (d if only in (None, CAPS[q]) else 0.0) for q, v in BASE.items()}


def test_a_valid_winner_that_loses_a_guard_beyond_the_margin_is_not_promoted():
    seed, winner = meta(0, BASE, BASE), meta(1, plus(0.1), plus(-2 * MARGIN))
    kept = archive([seed, winner])
    assert kept.best is seed and {c.id for c in kept.specialists.values()} == {seed.id}
    failed = kept.held_back(winner.id)
    assert {c.role for c in failed} == {"best", "F", "T"}  # the best and both specialists
    reason = failed[0].reason or ""
    assert "guard locomo:all@1" in reason and seed.id in reason and "1 pp" in reason
    assert failed[0].fitness == pytest.approx(0.5 - 2 * MARGIN) and failed[0].holder_fitness == 0.5
    t = transfer([seed, winner], kept)
    assert t is not None and t.held_back == {winner.id: [c.reason for c in failed]}
    # without the guard, the same scores promote it
    assert archive([meta(0, BASE, None), meta(1, plus(0.1), None)]).best.number == 1  # type: ignore[union-attr]


def test_a_valid_winner_that_ties_or_stays_within_the_margin_is_promoted():
    for guard in (BASE, plus(-MARGIN / 2)):
        seed, winner = meta(0, BASE, BASE), meta(1, plus(0.1), guard)
        kept = archive([seed, winner])
        assert kept.best is winner and kept.specialists["F"] is winner
        assert kept.checks[winner.id] and not kept.held_back(winner.id)


def test_non_inferiority_is_a_paired_bootstrap_with_a_margin():
    assert non_inferior(BASE, BASE) and non_inferior({}, {})  # a tie; nothing to compare
    assert not non_inferior(plus(-2 * MARGIN), BASE)
    # mostly equal, a few questions much worse: the mean drops 2.5 pp, refused
    noisy = {q: v - (0.3 if i < 2 else 0.0) for i, (q, v) in enumerate(BASE.items())}
    assert not non_inferior(noisy, BASE)
    # a question the holder answered and the challenger did not counts 0 for it
    assert not non_inferior({q: v for q, v in BASE.items() if q != "q0"}, BASE)


def test_a_specialist_is_guarded_on_its_own_capability():
    """An F specialist that loses T questions on the guard (not F ones) still replaces the F
    holder; it is not the best (the T loss on the guard holds that back)."""
    seed = meta(0, BASE, BASE)
    f_winner = meta(1, plus(0.2, "F"), plus(-0.2, "T"))
    kept = archive([seed, f_winner])
    assert kept.specialists["F"] is f_winner and kept.specialists["T"] is seed
    assert kept.best is seed and {c.role for c in kept.held_back(f_winner.id)} == {"best"}


def test_a_valid_winner_without_guard_figures_is_pending():
    seed, winner, later = meta(0, BASE, BASE), meta(1, plus(0.1), None), meta(2, plus(0.2), None)
    kept = archive([seed, winner, later])
    assert kept.pending == winner.id and kept.best is seed
    loser = meta(1, plus(-0.1), None)  # loses valid: never needs its guard figures
    assert archive([seed, loser]).pending is None


def test_guard_specs_parse_and_refuse_one_line_each():
    assert parse_guard("beam:all:500K@2") == Guard("beam", "all:500K", 2)
    assert parse_guard("locomo:sample:valid").name == "locomo:sample:valid"
    assert [parse_guard(g).name for g in bench("beam").guards] == list(bench("beam").guards)
    for bad in ("beam", "nope:valid", "beam:valid@0", "beam:valid@x", ""):
        with pytest.raises(ValueError) as exc:
            parse_guard(bad)
        assert "\n" not in str(exc.value)


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["run", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_the_cli_defaults_turns_off_and_refuses_guards(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    common = ["--dry-run", "--data-dir", str(data_dir), "--runs-dir", str(tmp_path)]
    code, out, _ = run_cli(capsys, *common)
    assert code == 0
    for spec in bench("beam").guards:
        assert f"guard {spec}: 1 conversation" in out
    code, out, _ = run_cli(capsys, *common, "--guard", "none")
    assert code == 0 and "guard " not in out
    code, out, _ = run_cli(capsys, *common, "--guard", "beam:holdout@2", "--guard", "locomo:all")
    assert code == 0 and "guard beam:holdout@2: 2 conversations, 40 questions" in out
    bad_flags = [(["--guard", "beam"], "is not BENCH:SPLIT"),
                 (["--guard", "beam:nosuch"], "unknown BEAM split"),
                 (["--guard", "beam:valid"], "shares beam/100K/4"),
                 (["--guard", "none", "--guard", "beam:holdout"], "--guard none")]  # fmt: skip
    for bad, says in bad_flags:
        code, _, err = run_cli(capsys, *common, *bad)
        errors = [line for line in err.splitlines() if line.startswith("error:")]
        assert code == 2 and len(errors) == 1 and says in errors[0], err
        assert "Traceback" not in err


# --- the loop ------------------------------------------------------------------------------

ROUNDS = {"cold_start": 1, "refinement": 2, "integration": 0}
GUARDS = ("beam:holdout@1", "locomo:all@1")
GUARDED = {"rounds": ROUNDS, "guards": GUARDS}  # the runs here: conftest's run_config and these
pytestmark = pytest.mark.usefixtures("check_once")  # the runs here check the same programs


class Recording(Evolution):
    """The loop, keeping every request it hands a proposer."""

    requests: list[Request]

    def request(self, *args: Any, **kwargs: Any) -> Request:
        request = super().request(*args, **kwargs)
        self.requests.append(request)
        return request


@pytest.fixture(scope="module")
def guarded(
    data_dir: Path, offline_cache: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[RunStore, Recording]:
    root = tmp_path_factory.mktemp("runs")
    cfg = run_config(data_dir, offline_cache, **GUARDED)
    store = RunStore.create(root, {"config": cfg.as_json()}, run_id="guarded")
    evolution = Recording(store, cfg)
    evolution.requests = []
    evolution.proposer.builds_cases = True  # cases are built as for a coder (they read traces)
    evolution.run()
    return store, evolution


def test_the_seed_is_scored_on_every_guard_once_and_winners_only_on_demand(guarded):
    store, _ = guarded
    seed, *children = store.candidates()
    keys = {f"guard:{g}" for g in GUARDS}
    assert keys <= set(seed.scores) and all(seed.scores[k].questions for k in keys)
    kept = archive(store.candidates())
    assert kept.pending is None
    # exactly the children that won valid against a holder were scored on the guards, once each
    guarded_ids = [e["data"]["candidate"] for e in store.events("evaluating")
                   if e["data"]["phase"] == "guard"]  # fmt: skip
    assert len(guarded_ids) == len(set(guarded_ids)) == len(kept.checks)
    assert set(guarded_ids) == set(kept.checks)
    assert guarded_ids, "no child won valid: the run tests nothing (change ROUNDS)"
    for c in children:
        assert (keys <= set(c.scores)) == (c.id in kept.checks)
        if c.id in kept.checks:  # filed with its checks, as the archive replays them
            assert c.guards == [check.as_json() for check in kept.checks[c.id]]
    holders = {"best": kept.best, **kept.specialists}
    for role, holder in holders.items():  # no holder failed a guard test for its role
        assert holder is not None
        assert role not in {c.role for c in kept.held_back(holder.id)}
    lines = transfer_lines(transfer(store.candidates()))
    assert any(line.startswith("  guard beam:holdout@1: seed ") for line in lines), lines


def test_guard_evaluations_reuse_stage_outputs(guarded):
    """A child scored on a guard encodes nothing again (constant search keeps the chunk sizes):
    its index is the seed's, served from the step cache (so nothing is extracted either)."""
    store, _ = guarded
    kept = archive(store.candidates())
    for cid in kept.checks:
        for g in GUARDS:
            stages = store.get(cid).scores[f"guard:{g}"].steps
            assert stages["extract"]["computed"] == 0, stages
            assert stages["index"]["reused"] > 0 and stages["index"]["computed"] == 0, stages
            assert stages["retrieve"]["computed"] > 0, stages  # what the child changed


def test_guard_data_never_reaches_diagnosis_cases_or_a_proposer(guarded, data_dir: Path):
    store, evolution = guarded
    guard_tasks = [tasks for _, tasks in evolution.guards()]
    conversations = {c.id for t in guard_tasks for c in t.conversations}
    questions = {q.id for t in guard_tasks for q in t.questions}
    texts = [q.question for t in guard_tasks for q in t.questions if len(q.question) > 30]
    assert evolution.requests and any(r.cases for r in evolution.requests)
    for request in evolution.requests:
        prompt = render_request(request)  # what the coder would read
        assert not any(text in prompt for text in texts)
        assert not any(q in prompt for q in questions | conversations)
        assert not {case["id"] for case in request.cases} & questions
        for view in (request.parent, *request.specialists):
            assert set(view.scores) <= {"train"}
    for c in store.candidates():
        for key in c.scores:
            if key.startswith("guard:"):
                assert c.scores[key].diagnostics is None  # never diagnosed
    assert not set(evolution.labels()) & questions  # never annotated


def test_the_constant_proposer_and_its_targets_ignore_guard_scores(guarded, tmp_path: Path):
    """Scramble every guard figure of a copy of the run: the same request gives the same
    refinement targets and the same constant proposal."""
    store, evolution = guarded
    request = evolution.requests[-1]
    labels = evolution.labels()
    parent = store.get(request.parent.id)

    def outcome(s: RunStore) -> tuple[Any, ...]:
        candidates = s.candidates()
        targets = DependencyAware().targets(parent, candidates, labels, 0, 2)
        proposal = constant_proposer(evolution.config, s.root).propose(request)
        return targets, proposal.source, proposal.message

    copy_root = tmp_path / "copy"
    shutil.copytree(store.root, copy_root / store.run_id)
    copy = RunStore.open(copy_root, store.run_id)
    before = outcome(copy)
    for c in copy.candidates():
        scores = {k: (_scrambled(v) if k.startswith("guard:") else v) for k, v in c.scores.items()}
        copy.update(c.id, scores=scores)
    assert outcome(copy) == before


def _scrambled(block: ScoreBlock) -> ScoreBlock:
    per = {q: 1.0 - v for q, v in block.questions.items()}
    overall = block.overall.model_copy(update={"fitness": 0.0})
    return block.model_copy(update={"questions": per, "overall": overall})


def test_an_interrupted_guard_evaluation_is_finished_on_resume(
    guarded, data_dir: Path, tmp_path: Path
):
    """Killed after a winner's full evaluation and before its guard figures were filed: the
    resumed run scores it on the guards and ends with the same archive."""
    store, evolution = guarded
    kept = archive(store.candidates())
    victim = next(iter(kept.checks))
    shutil.copytree(store.root, tmp_path / store.run_id)
    copy = RunStore.open(tmp_path, store.run_id)
    meta = copy.get(victim)
    copy.update(victim, guards=[], scores={k: v for k, v in meta.scores.items()
                                           if not k.startswith("guard:")})  # fmt: skip
    assert archive(copy.candidates()).pending == victim
    resumed = Evolution(copy, evolution.config)
    resumed.run()  # every round is done: only the guard evaluation is left
    again = archive(copy.candidates())
    assert again.pending is None and again.best.id == kept.best.id  # type: ignore[union-attr]
    assert {k: v.id for k, v in again.specialists.items()} == {
        k: v.id for k, v in kept.specialists.items()}  # fmt: skip
    assert json.dumps(copy.get(victim).guards) == json.dumps(store.get(victim).guards)


def test_every_result_shows_valid_and_guard_figures_beside_the_seed(
    guarded, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    """status, programs, report, the export header and freeze each show the best's (export and
    freeze: the candidate's) fitness on valid and on each guard, the seed's and the ceiling."""
    store, _ = guarded
    shutil.copytree(store.root, tmp_path / store.run_id)
    copy = RunStore.open(tmp_path, store.run_id)
    t = transfer(copy.candidates())
    assert t is not None and [r.split for r in t.rows] == ["valid", *GUARDS]
    seed = copy.candidates()[0]
    for r in t.rows:  # the figures are the stored ones, not recomputed
        key = r.split if r.split == "valid" else f"guard:{r.split}"
        assert r.seed == seed.scores[key].overall.fitness
        assert r.ceiling == seed.scores[key].overall.ceiling is not None
    expected = transfer_lines(t)
    runs = ["--runs-dir", str(tmp_path)]

    def shown(*argv: str) -> str:
        assert main([*argv, *runs]) == 0
        return capsys.readouterr().out

    for argv in (["status", store.run_id], ["programs", "--run", store.run_id]):
        out = shown(*argv)
        assert all(line.strip() in out for line in expected), (argv, out)
    status = json.loads(shown("status", store.run_id, "--json"))
    assert status["transfer"] == json.loads(json.dumps(t.as_json()))
    best = t.program
    shown("export", f"{store.run_id}/{best}", "--out", str(tmp_path / "best.py"))
    header = (tmp_path / "best.py").read_text()
    assert all(f"# {line}" in header for line in expected)
    shown("report", store.run_id, "--out", str(tmp_path / "report.html"))
    page = (tmp_path / "report.html").read_text()
    assert 'id="transfer"' in page and all(f"guard {g}" in page for g in GUARDS)
    # freeze: a candidate frozen before shows its stored test block, and the transfer
    test = seed.scores["valid"].model_copy(update={"errors": 0})
    copy.update(best, frozen=True, scores={**copy.get(best).scores, "test": test})
    out = shown("freeze", f"{store.run_id}/{best}")
    assert all(line.strip() in out for line in expected), out


def test_a_resumed_run_keeps_its_guards(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    from evolve.evolution.manifest import build_manifest

    cfg = run_config(data_dir, tmp_path / "cache", **GUARDED)
    RunStore.create(tmp_path, build_manifest(cfg), run_id="kept")
    resume = ["--resume", "kept", "--runs-dir", str(tmp_path), "--dry-run"]
    code, out, _ = run_cli(capsys, *resume)
    assert code == 0 and all(f"guard {g}: 1 conversation" in out for g in GUARDS)
    same = [a for g in reversed(GUARDS) for a in ("--guard", g)]  # the same set, in any order
    assert run_cli(capsys, *resume, *same)[0] == 0
    code, _, err = run_cli(capsys, *resume, "--guard", "none")
    assert code == 2 and "keeps the guards it started with (beam:holdout@1, locomo:all@1)" in err


def test_the_manifest_hashes_each_guards_files(data_dir: Path, tmp_path: Path):
    from evolve.evolution.manifest import build_manifest, sha256_file

    data = build_manifest(run_config(data_dir, tmp_path, **GUARDED))["data"]
    assert set(data) == {"train", "valid", *(f"guard:{g}" for g in GUARDS)}
    beam = data["guard:beam:holdout@1"]
    chat = "beam/chats/100K/2/chat.json"  # the first holdout conversation
    assert beam[chat] == sha256_file(data_dir / chat) and "splits/beam.json" in beam
    assert "locomo/locomo-sample.json" in data["guard:locomo:all@1"] or (
        "locomo/locomo10.json" in data["guard:locomo:all@1"]
    )


# --- data roots ----------------------------------------------------------------------------


def test_a_guard_of_another_bench_reads_the_guard_data_root(tmp_path: Path):
    from evolve.benches.guards import guard_root
    from evolve.config import stored_config

    run, shared = tmp_path / "mine", tmp_path / "shared"
    locomo, beam = parse_guard("locomo:all@1"), parse_guard("beam:holdout@1")
    assert guard_root(locomo, "beam", run, shared) == shared
    assert guard_root(beam, "beam", run, shared) == run  # the run's own bench: its data dir
    assert guard_root(locomo, "beam", run, None) == run
    cfg = run_config(run, tmp_path, guards=("locomo:all@1", "beam:holdout@1"))
    assert [cfg.guard_root(g) for g in (locomo, beam)] == [run, run]
    assert "guard_data_dir" not in cfg.as_json()  # stored as before the field existed
    moved = cfg.replace(guard_data_dir=str(shared))
    assert moved.as_json()["guard_data_dir"] == str(shared)
    assert [moved.guard_root(g) for g in (locomo, beam)] == [shared, run]
    again = stored_config({"config": moved.as_json()}, "r")
    assert again == moved and stored_config({"config": cfg.as_json()}, "r") == cfg


def test_the_cli_reads_guards_of_other_benches_from_the_guard_data_root(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch
):
    """A run on a data dir holding BEAM only: its LoCoMo guard is read from --guard-data-dir,
    else the data dir (where it is missing; $PRISMEM_DATA is the default only for a bench whose
    data dir is a folder of its own, tests/test_user_bench.py); its BEAM guard from the data
    dir whatever the guard data root."""
    from evolve.cli.main import build_parser
    from evolve.cli.runconfig import run_config as flags_config
    from evolve.datasets.slices import write_slice
    from evolve.evolution.manifest import build_manifest

    mine = write_slice(data_dir, tmp_path / "mine")  # BEAM's train and valid, nothing else
    for name in ("PRISMEM_DATA", "EVOLVE_DATA"):
        monkeypatch.delenv(name, raising=False)
    common = ["--dry-run", "--data-dir", str(mine), "--runs-dir", str(tmp_path / "runs")]
    locomo = ["--guard", "locomo:all@1"]
    code, _, err = run_cli(capsys, *common, *locomo)
    assert code == 2 and "guard locomo:all@1" in err and "Traceback" not in err
    code, out, _ = run_cli(capsys, *common, *locomo, "--guard-data-dir", str(data_dir))
    assert code == 0 and "guard locomo:all@1: 1 conversation" in out
    code, _, err = run_cli(capsys, *common, "--guard", "beam:holdout@1",
                           "--guard-data-dir", str(data_dir))  # fmt: skip
    assert code == 2 and "guard beam:holdout@1" in err  # the slice holds no holdout
    code, _, err = run_cli(capsys, *common, *locomo, "--guard-data-dir", str(tmp_path / "no"))
    assert code == 2 and "--guard-data-dir" in err
    monkeypatch.setenv("PRISMEM_DATA", str(data_dir))
    code, out, err = run_cli(capsys, *common)  # beam's data dir is a data root: read it only
    assert code == 0 and "default guard locomo:all@1 left out" in err
    # the stored config names the root; the manifest hashes the guard's files under it
    given = ["--guard-data-dir", str(data_dir)]
    cfg = flags_config(build_parser().parse_args(["run", *common[1:], *locomo, *given]))
    assert cfg.guard_data_dir == str(data_dir.resolve())
    manifest = build_manifest(cfg)
    assert manifest["config"]["guard_data_dir"] == str(data_dir.resolve())
    assert "locomo/locomo-sample.json" in manifest["data"]["guard:locomo:all@1"]
    RunStore.create(tmp_path / "runs", manifest, run_id="rooted")  # resumed: the root is kept
    resume = ["--resume", "rooted", "--runs-dir", str(tmp_path / "runs"), "--dry-run"]
    monkeypatch.delenv("PRISMEM_DATA")
    code, out, _ = run_cli(capsys, *resume)
    assert code == 0 and "guard locomo:all@1: 1 conversation" in out
    code, _, err = run_cli(capsys, *resume, "--guard-data-dir", str(mine))
    assert code == 2 and "--guard-data-dir cannot move them on --resume" in err
    same = flags_config(build_parser().parse_args(["run", *common[1:], "--data-dir",
                                                   str(data_dir), *locomo]))  # fmt: skip
    assert same.guard_data_dir is None and "guard_data_dir" not in build_manifest(same)["config"]
