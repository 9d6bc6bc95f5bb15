"""The evolution loop with the constant proposer: archive, specialists, selection, and resume
after interruption.

Runs on the first BEAM-100K conversation of train and of valid with the hashing embedder (a
test double: the numbers mean nothing, but they are deterministic, which resume relies on).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from conftest import Unavailable, paired_beats, run_config
from test_report_pictures import check_pictures

from evolve.cli.main import main
from evolve.datasets.slices import write_slice
from evolve.evolution.loop import Evolution, best_overall, specialists
from evolve.evolution.store import RunStore

ROOT = Path(__file__).resolve().parents[1]
ROUNDS = {"cold_start": 1, "refinement": 2, "integration": 1}
pytestmark = pytest.mark.usefixtures("check_once")  # the runs here check the same programs


def archive(store: RunStore) -> list[tuple[str, str, str, list[str]]]:
    """Candidates by content (a kill may leave a gap in the numbering, so not by id)."""
    sha = {c.id: c.source_sha256 for c in store.candidates()}
    return [(c.source_sha256, c.stage, c.status, [sha[p] for p in c.parents])
            for c in store.candidates()]  # fmt: skip


@pytest.fixture(scope="module")
def uninterrupted(
    data_dir: Path, offline_cache: Path, tmp_path_factory: pytest.TempPathFactory
) -> RunStore:
    root = tmp_path_factory.mktemp("runs")
    cfg = run_config(data_dir, offline_cache, rounds=ROUNDS)
    store = RunStore.create(root, {"config": cfg.as_json()}, run_id="whole")
    Evolution(store, cfg).run()
    return store


def shared_cache(run: RunStore) -> Path:
    """The uninterrupted run's cache (conftest's ``offline_cache``): tests that compare
    outcomes, not step counts, reuse it (step reuse gives the same results)."""
    return Path(run.manifest["config"]["cache_dir"])


def test_loop_fills_the_archive(uninterrupted: RunStore):
    candidates = uninterrupted.candidates()
    assert candidates[0].stage == "seed" and candidates[0].status == "evaluated"
    k = uninterrupted.manifest["config"]["children"]
    assert k > 1  # the default proposes several children per round
    assert [c.stage for c in candidates[1:]] == [stage for stage, n in ROUNDS.items()
                                                 for _ in range(n * k)]  # fmt: skip
    assert all(c.parents for c in candidates[1:])
    refinement = [c for c in candidates if c.stage == "refinement"]
    assert all(c.capability in {"F", "T", "P", "M", "A"} for c in refinement)
    evaluated = [c for c in candidates if c.status == "evaluated"]
    for c in evaluated:  # every child was screened on the minibatch first, the seed was not
        screen = {"minibatch"} if c.stage != "seed" else set()
        assert set(c.scores) == {"train", "valid"} | screen and c.sandbox and c.sandbox["passed"]
    best = best_overall(candidates)
    assert best is not None
    assert not [c for c in evaluated if paired_beats(c, best, None)]  # none the test prefers
    assert best.id == candidates[0].id or paired_beats(best, candidates[0], None)
    kept = specialists(candidates)
    assert set(kept) == {"F", "T", "P", "M", "A"}  # the seed fills every slot first ...
    promoted = {cap: c for cap, c in kept.items() if c.stage != "seed"}
    assert promoted  # ... and a child took at least one by the paired test:
    assert all(paired_beats(c, candidates[0], cap) for cap, c in promoted.items())
    state = uninterrupted.load_state()
    assert state["rounds"] == ROUNDS and state["best"] == best.id
    assert state["round_costs"] == [{"usd": 0.0, "tokens": 0}] * sum(ROUNDS.values())
    assert [e["kind"] for e in uninterrupted.events("evaluated")]


def test_resume_with_a_higher_cap_matches_an_uninterrupted_run(
    uninterrupted: RunStore, data_dir: Path, tmp_path: Path
):
    cache = shared_cache(uninterrupted)
    short = run_config(data_dir, cache, rounds={"cold_start": 1, "refinement": 1})
    store = RunStore.create(tmp_path, {"config": short.as_json()}, run_id="capped")
    Evolution(store, short).run()
    assert len(store.candidates()) == 1 + 2 * short.children
    Evolution(RunStore.open(tmp_path, "capped"), run_config(data_dir, cache, rounds=ROUNDS)).run()
    assert archive(RunStore.open(tmp_path, "capped")) == archive(uninterrupted)


def test_run_ablations_no_integration_and_random_cases(
    uninterrupted: RunStore, data_dir: Path, tmp_path: Path
):
    """`--no-integration` files no integrated candidate; `--cases random` and
    `--offline-search random` are recorded, and the constant proposer, which reads no cases, is
    given none; `--children 1 --no-cascade`: one child per round, evaluated in full."""
    argv = ["run", "--data-dir", str(data_dir), "--rounds", "1,1,1", "--no-integration",
            "--children", "1", "--no-cascade", "--offline-search", "random",
            "--cases", "random", "--conversations", "1", "--jobs", "1", "--embedder", "hashing",
            "--runs-dir", str(tmp_path), "--cache-dir", str(shared_cache(uninterrupted)),
            "--no-progress", "--guard", "none"]  # fmt: skip
    assert main(argv) == 0
    (run,) = RunStore.list_runs(tmp_path)
    store = RunStore.open(tmp_path, run["id"])
    assert [c.stage for c in store.candidates()] == ["seed", "cold_start", "refinement"]
    assert store.load_state()["rounds"] == {"cold_start": 1, "refinement": 1}
    recorded = store.manifest["config"]
    assert recorded["cases"] == "random" and recorded["rounds"]["integration"] == 0
    assert recorded["offline_search"] == "random"  # the random mutation, not optuna
    assert all(c.message.startswith("random: ") for c in store.candidates()[1:])
    assert recorded["children"] == 1 and recorded["cascade"] is False
    assert all(c.cascade is None and "minibatch" not in c.scores for c in store.candidates())
    proposed = store.events("proposed")
    assert [e["data"]["stage"] for e in proposed] == ["cold_start", "refinement"]
    assert all(e["data"]["cases"] == [] for e in proposed)


def test_a_round_replayed_after_its_child_was_evaluated_files_nothing_new(
    uninterrupted: RunStore, data_dir: Path, tmp_path: Path
):
    """Killed after the last round's child was evaluated but before the round was saved: the
    replayed round must see the run as the original round did (without that child) and so
    propose the same child, which the run already holds."""
    shutil.copytree(uninterrupted.root, tmp_path / "whole")
    store = RunStore.open(tmp_path, "whole")
    state = store.load_state()
    rounds = {**state["rounds"], "integration": state["rounds"]["integration"] - 1}
    store.save_state({**state, "rounds": rounds, "round_costs": state["round_costs"][:-1]})
    Evolution(store, run_config(data_dir, shared_cache(uninterrupted), rounds=ROUNDS)).run()
    assert archive(RunStore.open(tmp_path, "whole")) == archive(uninterrupted)


# Where the SIGKILL test kills `evolve run` (two children per round, cascade on): when the n-th
# candidate file appears (the seed's evaluation has just started; a round's children are filed,
# its cascade starts), when n children hold a screen (during a cascade: a sibling may still be
# on its minibatch) or when n candidates are judged (after a cascade, during the full
# evaluations, between rounds or inside the next proposals). Each point is reached in a fresh
# process: the previous one was killed.
KILL_POINTS = [("filed", 1), ("filed", 3), ("screened", 1), ("judged", 3), ("screened", 4),
               ("judged", 7)]  # fmt: skip
JUDGED = ("evaluated", "stopped")


def test_sigkill_then_resume_matches_an_uninterrupted_run(
    uninterrupted: RunStore, data_dir: Path, tmp_path: Path
):
    """Kill `evolve run` at every point of :data:`KILL_POINTS` (SIGKILL), resume each time;
    no candidate is evaluated twice or lost, and the archive equals an uninterrupted run's."""
    argv = [sys.executable, "-m", "evolve", "run", "--data-dir", str(data_dir),
            "--rounds", "1,2,1", "--conversations", "1", "--jobs", "1", "--embedder", "hashing",
            "--runs-dir", str(tmp_path), "--cache-dir", str(shared_cache(uninterrupted)),
            "--no-progress", "--guard", "none"]  # fmt: skip
    proc = _start(argv)
    run_dir = _wait_for_run(tmp_path)
    for point in KILL_POINTS:
        assert _wait_for(run_dir, point, proc), f"the run ended before {point}"
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        proc = _start([*argv, "--resume", run_dir.name])
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err.decode()[-2000:]
    store = RunStore.open(tmp_path, run_dir.name)
    assert archive(store) == archive(uninterrupted)
    judged = {c.id: c.status for c in store.candidates() if c.status in JUDGED}
    started = {(e["data"]["candidate"], e["data"]["phase"]) for e in store.events("evaluating")}
    filed = Counter((e["data"]["candidate"], "full") for e in store.events("evaluated"))
    filed += Counter((e["data"]["candidate"], "minibatch") for e in store.events("screened"))
    assert max(filed.values()) == 1 and set(filed) <= started  # none screened/evaluated twice
    # none lost: every evaluation started was finished and filed (a kill between filing a
    # result and logging its event may leave the event out, never the result)
    screened = {c.id for c in store.candidates() if c.cascade}
    assert {c for c, phase in started if phase == "minibatch"} == screened
    assert {c for c, phase in started if phase == "full"} == {
        c for c, status in judged.items() if status == "evaluated"}  # fmt: skip
    assert {c for c, _ in started} == set(judged)
    assert "stopped" in judged.values()  # the kills went through a cascade that stopped one
    # a start after the candidate's own result for that phase would be a second evaluation
    done: set[tuple[str, str]] = set()
    for event in store.events():
        data = event["data"]
        if event["kind"] == "evaluating":
            assert (data["candidate"], data["phase"]) not in done, f"{data} evaluated again"
        elif event["kind"] in ("evaluated", "screened"):
            done.add((data["candidate"], "full" if event["kind"] == "evaluated" else "minibatch"))
    manifest = store.manifest  # what the run started from, hashed
    train = manifest["data"]["train"]
    assert len(train) == 3 and all(len(h) == 64 for h in train.values())
    assert manifest["seed"]["sha256"] == uninterrupted.candidates()[0].source_sha256
    assert manifest["packages"]["numpy"] and manifest["models"]["coder"] is None


def _start(argv: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)  # fmt: skip


def _wait_for_run(runs: Path, timeout: float = 60) -> Path:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [p for p in runs.iterdir() if (p / "manifest.json").exists()]
        if found:
            return found[0]
        time.sleep(0.1)
    raise AssertionError("the run folder never appeared")


def _wait_for(run: Path, point: tuple[str, int], proc: subprocess.Popen[bytes]) -> bool:
    """Wait until ``point`` holds while ``proc`` runs; False when it exited first."""
    kind, n = point
    while proc.poll() is None:
        metas = list((run / "candidates").glob("*.json"))
        if kind == "judged":
            metas = [m for m in metas if _meta(m).get("status") in JUDGED]
        elif kind == "screened":
            metas = [m for m in metas if _meta(m).get("cascade")]
        if len(metas) >= n:
            return True
        time.sleep(0.02)
    return False


def _meta(meta: Path) -> dict[str, object]:
    try:
        found = json.loads(meta.read_bytes())
    except (OSError, ValueError):  # replaced between the listing and the read
        return {}
    return found if isinstance(found, dict) else {}


@pytest.mark.parametrize("seed", ["prism", "ariadne"])
def test_reference_programs_seed_a_run(seed: str, data_dir: Path, tmp_path: Path):
    """PRISM and AriadneMem start an offline run: the seed is evaluated and a cold-start child,
    made from the seed's own tunable constants, passes the sandbox and is evaluated too."""
    data = write_slice(data_dir, tmp_path / "data", messages=12, chars=400)
    cfg = run_config(data, tmp_path / "cache", seed_program=str(ROOT / "seeds" / f"{seed}.py"),
                     rounds={"cold_start": 1, "refinement": 0, "integration": 0}, children=1,
                     cascade=False)  # fmt: skip
    store = RunStore.create(tmp_path, {"config": cfg.as_json()}, run_id=seed)
    Evolution(store, cfg).run()
    parent, child = store.candidates()
    assert (parent.stage, parent.status) == ("seed", "evaluated")
    assert (child.stage, child.status, child.parents) == ("cold_start", "evaluated", [parent.id])
    assert store.source(child.id) != store.source(parent.id)
    assert child.sandbox and child.sandbox["passed"]


# What makes a browser fetch something; an SVG namespace attribute names a URL it never loads.
NETWORK = {
    "absolute URL": re.compile(r"\b(?:https?|ftp|wss?)://", re.I),
    "protocol-relative URL": re.compile(r"""(?:=|url\()\s*["']?\s*//""", re.I),
    "<link": re.compile(r"<link\b", re.I),
    "<script src": re.compile(r"<script\b[^>]*\bsrc\s*=", re.I),
    "CSS url(": re.compile(r"\burl\s*\(", re.I),
    "CSS @import": re.compile(r"@import\b", re.I),
}
_NAMESPACE = re.compile(r"""\bxmlns(?::\w+)?\s*=\s*["']http://www\.w3\.org/[^"']*["']""")


def network_references(html: str) -> list[str]:
    """The kinds of network reference in ``html`` (empty: the page loads nothing)."""
    text = _NAMESPACE.sub("", html)
    return [kind for kind, pattern in NETWORK.items() if pattern.search(text)]


@pytest.mark.parametrize(
    ("snippet", "kind"),
    [
        ('<img src="https://cdn.example/x.png">', "absolute URL"),
        ('<img src="http://cdn.example/x.png">', "absolute URL"),
        ("<img src='//cdn.example/x.png'>", "protocol-relative URL"),
        ('<link rel="stylesheet" href="style.css">', "<link"),
        ('<script src="app.js"></script>', "<script src"),
        ("<style>body { background: url(bg.png) }</style>", "CSS url("),
        ('<style>@import "theme.css";</style>', "CSS @import"),
    ],
)
def test_network_check_catches_each_kind_of_reference(snippet: str, kind: str):
    clean = '<html><body><svg xmlns="http://www.w3.org/2000/svg"><polyline/></svg>'
    assert network_references(clean + "</body></html>") == []
    assert kind in network_references(f"{clean}{snippet}</body></html>")


REPORT_SECTIONS = ("summary", "matrix", "lineage", "progress", "spend", "cache", "integration")


def test_report_is_self_contained_and_renders(
    uninterrupted: RunStore, tmp_path: Path, unavailable: Unavailable
):
    """`evolve report` writes one HTML file with every section; headless Chromium renders it
    (DOM dumped, screenshot taken) with no network, its pictures showing the run's scores."""
    page = tmp_path / "report.html"
    runs = str(uninterrupted.root.parent)
    assert main(["report", "whole", "--runs-dir", runs, "--out", str(page)]) == 0
    html = page.read_text()
    assert all(f'<section id="{s}">' in html for s in REPORT_SECTIONS)
    assert "<script" not in html and network_references(html) == []
    integration = html[html.index('<section id="integration">') :]
    merged = [c for c in uninterrupted.candidates()
              if c.stage == "integration" and c.status == "evaluated"]  # fmt: skip
    assert merged and all(
        m.id in integration and all(p in integration for p in m.parents) for m in merged
    )
    cache = html[html.index('<section id="cache">') : html.index('<section id="integration">')]
    # offline: every stage but answer ran (and was counted); answer has no rate
    assert cache.count(" %</td>") == 4 and "<td>answer</td>" in cache
    for c in uninterrupted.candidates():
        assert c.id in html[html.index('<section id="lineage">') :]
    matrix = html[html.index('<section id="matrix">') : html.index('<section id="lineage">')]
    seed = next(c for c in uninterrupted.candidates() if c.stage == "seed")
    top = seed.scores["valid"].overall.ceiling  # the split's ceiling, beside every score
    assert '<tr id="ceiling"' in matrix and f">{top:.3f}<" in matrix

    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        unavailable("PRISMEM_CHROMIUM", "chromium is not installed: see docs/contributing.md")
    flags = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1280,2000"]
    dom = subprocess.run([*flags, "--dump-dom", page.as_uri()], capture_output=True, text=True,
                         timeout=120, check=True).stdout  # fmt: skip
    for title in ("Capability × candidate", "Lineage", "Best valid fitness so far", "Spend",
                  "Step cache", "Integration"):  # fmt: skip
        assert f"{title}" in dom
    assert 'class="progress"' in dom and 'class="tree"' in dom
    check_pictures(dom, uninterrupted)  # the drawn points and nodes are the run's recorded scores
    shot = tmp_path / "report.png"
    subprocess.run([*flags, f"--screenshot={shot}", page.as_uri()], capture_output=True,
                   timeout=120, check=True)  # fmt: skip
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000


def test_report_watch_rewrites_after_each_filed_candidate_until_the_run_is_finished(
    uninterrupted: RunStore, tmp_path: Path
):
    """`evolve report --watch`: the page (reloading itself, still loading nothing) is rewritten
    when a candidate is filed and not when nothing changed; once the run is finished a last
    page without the reload is written and the watch returns."""
    from evolve.evolution.report import watch

    shutil.copytree(uninterrupted.root, tmp_path / "runs" / "whole")
    store = RunStore.open(tmp_path / "runs", "whole")
    state = store.load_state()
    rounds = dict(state["rounds"])
    store.save_state({**state, "rounds": {**rounds, "integration": rounds["integration"] - 1}})
    page, pages, writes = tmp_path / "watch.html", [], []
    seed = next(c for c in store.candidates() if c.stage == "seed")

    def tick(seconds: float) -> None:
        assert seconds == 7
        pages.append(page.read_text())
        if len(pages) == 2:  # a child is filed
            pages.append(store.add_candidate(store.source(seed.id) + "\n# watched\n",
                                             parents=[seed.id], stage="integration",
                                             capability=None, message="watched").id)  # fmt: skip
        elif len(pages) > 3:  # the round is done: the run is finished
            store.save_state(state)

    watch(store, page, 7, sleep=tick, on_write=writes.append)
    first, child, after_child, last = pages[0], pages[2], pages[3], page.read_text()
    assert writes == [False, False, True]  # the second look saw no change: no rewrite
    assert '<meta http-equiv="refresh" content="7">' in first and child not in first
    assert network_references(first) == [] and "<script" not in first
    assert child in after_child and "refresh" in after_child
    assert child in last and 'http-equiv="refresh"' not in last


def test_report_watch_of_a_finished_run_and_ctrl_c(
    uninterrupted: RunStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
):
    runs, page = str(uninterrupted.root.parent), tmp_path / "r.html"
    assert main(["report", "whole", "--runs-dir", runs, "--out", str(page), "--watch"]) == 0
    assert "finished" in capsys.readouterr().err and "refresh" not in page.read_text()

    shutil.copytree(uninterrupted.root, tmp_path / "runs" / "whole")
    store = RunStore.open(tmp_path / "runs", "whole")
    store.save_state({**store.load_state(), "rounds": {}})  # every round still to go

    def interrupt(seconds: float) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr("evolve.evolution.report.time.sleep", interrupt)
    args = ["report", "whole", "--runs-dir", str(tmp_path / "runs"), "--out", str(page)]
    assert main([*args, "--watch", "3"]) == 0
    err = capsys.readouterr().err
    assert "stopped watching" in err and "Traceback" not in err
    assert '<meta http-equiv="refresh" content="3">' in page.read_text()
