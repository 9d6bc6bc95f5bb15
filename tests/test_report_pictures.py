"""The report's pictures: the progress chart (valid and each guard set, the seed and the
ceilings marked) and the lineage tree (nodes by stage, marked where a guard held one back).

A scripted run (no evaluation: its scores are written into the store, so the test takes
milliseconds) has a seed, a cold-start child that wins valid but loses a guard, a stopped child,
refinements and an integration of two parents, under two guards. Every drawn number is read
back from the page's ``data-*`` attributes and compared with the scores the store recorded,
read here from the candidates' records (never through the report's code): once from the page
as written, once from the DOM headless Chromium builds of it.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from conftest import Unavailable

from evolve.cli.main import main
from evolve.datasets.types import CAPABILITIES
from evolve.evolution.archive import archive
from evolve.evolution.store import CandidateMeta, RunStore

RUN = "pictures"
GUARDS = ("guard:beam:holdout@1", "guard:locomo:all@1")
CAPS = {f"q{i}": "FT"[i % 2] for i in range(24)}
BASE = {q: 0.5 for q in CAPS}


def plus(d: float) -> dict[str, float]:
    return {q: v + d for q, v in BASE.items()}


def block(per_question: dict[str, float], ceiling: float) -> dict[str, Any]:
    def part(ids: list[str]) -> dict[str, Any]:
        return {"fitness": sum(per_question[q] for q in ids) / len(ids), "ceiling": ceiling,
                "n": len(ids)}  # fmt: skip

    return {"overall": part(list(per_question)),
            "by_capability": {c: part([q for q in per_question if CAPS[q] == c]) for c in "FT"},
            "questions": per_question, "question_capabilities": CAPS}  # fmt: skip


# (stage, parents by number, target, status, valid, guards: per guard or None)
SCRIPT: list[tuple[str, list[int], str | None, str, float | None, tuple[float, float] | None]] = [
    ("seed", [], None, "evaluated", 0.0, (0.0, 0.0)),
    ("cold_start", [0], None, "evaluated", 0.10, (-0.05, 0.0)),  # wins valid, loses a guard
    ("cold_start", [0], None, "stopped", None, None),
    ("refinement", [0], "F", "evaluated", 0.05, (0.01, 0.02)),  # promoted: the guards hold
    ("refinement", [3], "T", "evaluated", 0.02, None),  # loses valid: never guarded
    ("integration", [3, 1], None, "evaluated", 0.20, (0.03, 0.02)),
]


def scripted_run(runs: Path, script: list[Any] = SCRIPT, run_id: str = RUN) -> RunStore:
    """A run whose candidates carry the scores of ``script``, with the guard checks filed as
    the evaluator files them (the candidates' ``guards`` and a ``guarded`` event each)."""
    store = RunStore.create(runs, {"config": {}}, run_id=run_id)
    ids: list[str] = []
    for i, (stage, parents, target, status, valid, guard) in enumerate(script):
        meta = store.add_candidate(f"# candidate {i}\n", parents=[ids[p] for p in parents],
                                   stage=stage, capability=target, message=f"step {i}")  # fmt: skip
        scores = {} if valid is None else {"valid": block(plus(valid), 0.9)}
        if guard is not None:
            scores |= {key: block(plus(d + 0.1 * k), 0.8 - 0.1 * k)
                       for k, (key, d) in enumerate(zip(GUARDS, guard, strict=True))}  # fmt: skip
        store.update(meta.id, status=status, scores=scores)
        ids.append(meta.id)
    for cid, checks in archive(store.candidates()).checks.items():
        store.update(cid, guards=[c.as_json() for c in checks])
        failed = [c.reason for c in checks if not c.passed]
        store.log_event("guarded", candidate=cid, passed=not failed, reasons=failed)
    return store


@dataclass
class Drawn:
    """The pictures' elements in a page, as their ``data-*`` attributes, by class."""

    elements: dict[str, list[dict[str, str]]] = field(default_factory=dict)

    def of(self, cls: str, **where: str) -> list[dict[str, str]]:
        return [e for e in self.elements.get(cls, [])
                if all(e.get(k.replace("_", "-")) == v for k, v in where.items())]  # fmt: skip


def drawn(page: str) -> Drawn:
    """Every element of the page with a class and ``data-*`` attributes."""
    out = Drawn()

    class Collect(HTMLParser):
        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            found = {k: v or "" for k, v in attrs}
            data = {k.removeprefix("data-"): v for k, v in found.items() if k.startswith("data-")}
            if "class" in found and data:
                out.elements.setdefault(found["class"], []).append(data)

        handle_startendtag = handle_starttag

    Collect().feed(page)
    return out


def recorded(c: CandidateMeta, split: str, cap: str | None = None) -> float | None:
    """A candidate's fitness on a split as its record holds it (overall or one capability)."""
    if split not in c.scores:
        return None
    row = c.scores[split].overall if cap is None else c.scores[split].by_capability.get(cap)
    return None if row is None else row.fitness


def best_so_far(
    candidates: list[CandidateMeta], split: str, cap: str | None = None
) -> tuple[str, dict[str, float]]:
    """The ``data-points`` a line of the best so far on ``split`` (overall or ``cap``) must
    carry, and the candidates that set a new best, with their scores."""
    best, pairs, records = None, [], {}
    for c in candidates:
        value = recorded(c, split, cap)
        if value is not None and (best is None or value > best):
            best = records[c.id] = value
        if best is not None:
            pairs.append(f"{c.number}:{best!r}")
    return " ".join(pairs), records


def check_pictures(page: str, store: RunStore) -> None:
    """The chart's lines and markers and the tree's nodes and edges in ``page`` equal what
    ``store`` recorded: valid and each guard (every candidate's own score, the best so far, the
    ceiling), the seed, and each candidate's stage, parents, valid fitness and whether a guard
    held it back (its filed guard checks)."""
    d = drawn(page)
    candidates = store.candidates()
    seed = next(c for c in candidates if c.stage == "seed")
    guards = sorted(k for k in seed.scores if k.startswith("guard:"))
    for split in ("valid", *guards):
        points = d.of("point", split=split, capability="")
        scored = {c.id: recorded(c, split) for c in candidates if recorded(c, split) is not None}
        assert {p["candidate"]: float(p["value"]) for p in points} == scored, split
        held = {p["candidate"] for p in points if p["held-back"] == "true"}
        assert held == {c.id for c in candidates for g in c.guards
                        if g["role"] == "best" and not g["passed"]}, split  # fmt: skip
        (line,) = d.of("line", split=split, capability="")
        points_of_line, records = best_so_far(candidates, split)
        assert line["points"] == points_of_line, split
        assert {p["candidate"]: float(p["value"]) for p in points if p["best"] == "true"} == records
        (ceiling,) = d.of("ceiling", split=split)
        assert float(ceiling["value"]) == seed.scores[split].overall.ceiling
    for cap in CAPABILITIES:  # valid per capability: a marker on each new best
        points_of_line, records = best_so_far(candidates, "valid", cap)
        lines = d.of("line", split="valid", capability=cap)
        assert [e["points"] for e in lines] == ([points_of_line] if records else []), cap
        points = d.of("point", split="valid", capability=cap)
        assert {p["candidate"]: float(p["value"]) for p in points} == records, cap
    labels = [e["label"] for e in d.of("legend-label")]
    assert len(labels) == len(set(labels)) and "overall overall" not in page
    assert {"valid (all questions)", *(f"guard {g.removeprefix('guard:')}" for g in guards)} <= set(
        labels
    )
    assert [s["candidate"] for s in d.of("seed")] == [seed.id]

    nodes = {n["candidate"]: n for n in d.of("node")}
    assert list(nodes) == [c.id for c in candidates]
    for c in candidates:
        n = nodes[c.id]
        value = recorded(c, "valid")
        assert (n["stage"], n["status"], n["parents"]) == (c.stage, c.status, " ".join(c.parents))
        assert n["value"] == ("" if value is None else repr(value))
        assert n["held-back"] == str(any(not g["passed"] for g in c.guards)).lower(), c.id
    edges = {(e["parent"], e["child"]) for e in d.of("edge")}
    assert edges == {(p, c.id) for c in candidates for p in c.parents}


@pytest.fixture
def run(tmp_path: Path) -> RunStore:
    return scripted_run(tmp_path / "runs")


def report(store: RunStore, out: Path) -> str:
    assert main(["report", store.run_id, "--runs-dir", str(store.root.parent), "--out",
                 str(out)]) == 0  # fmt: skip
    return out.read_text()


def test_the_scripted_run_holds_what_the_pictures_must_show(run: RunStore):
    """The run's story, on its own records: one child held back by a guard, one promoted."""
    c = run.candidates()
    assert [g["passed"] for g in c[1].guards if g["role"] == "best"] == [False, True]
    assert archive(c).best.id == c[5].id  # type: ignore[union-attr]
    assert c[4].guards == [] and "guard:beam:holdout@1" not in c[4].scores


def test_the_pictures_show_the_recorded_scores(run: RunStore, tmp_path: Path):
    page = report(run, tmp_path / "report.html")
    check_pictures(page, run)
    d = drawn(page)
    # generations: the seed; its children; the integration one more than its deepest parent
    assert [n["generation"] for n in d.of("node")] == ["0", "1", "1", "1", "2", "2"]
    merged = d.of("edge", child=run.candidates()[5].id)
    assert [(e["parent"][:5], e["first"]) for e in merged] == [
        ("c0003", "true"),
        ("c0001", "false"),
    ]
    for svg in re.findall(r"<svg\b.*?</svg>", page, re.S):
        ET.fromstring(svg)  # each picture (and legend swatch) is well-formed SVG
    assert "<script" not in page


def test_a_tree_of_fifty_candidates_has_no_two_nodes_in_one_place(tmp_path: Path):
    """A run of the default size and more: one column per candidate, one row per generation."""
    script = [SCRIPT[0]] + [("refinement", [max(0, i - 1 - i % 3)], "FTPMA"[i % 5],
                             "evaluated", 0.001 * i, None) for i in range(1, 50)]  # fmt: skip
    store = scripted_run(tmp_path / "runs", script)
    page = report(store, tmp_path / "report.html")
    check_pictures(page, store)
    circles = _node_circles(page)
    xs = [float(c.get("cx", "")) for c in circles]
    assert len(xs) == 50 and xs == sorted(set(xs))  # a column each, in creation order
    rows = {(int(n["generation"]), float(c.get("cy", ""))) for n, c in
            zip(drawn(page).of("node"), circles, strict=True)}  # fmt: skip
    assert sorted(rows) == sorted(rows, key=lambda r: r[1]) and len(rows) == len(dict(rows))
    assert 'class="scroll"' in page  # a wide tree scrolls in its own box


def test_a_run_of_only_its_seed_is_drawn(tmp_path: Path):
    """One candidate: one node, one column; flat lines get a y range inside [0, 1]."""
    store = scripted_run(tmp_path / "runs", SCRIPT[:1])
    page = report(store, tmp_path / "report.html")
    check_pictures(page, store)
    ticks = [float(t) for t in re.findall(r'text-anchor="end">([0-9.]+)</text>', page)]
    assert ticks and max(ticks) <= 1.0 and min(ticks) >= 0.0  # a flat line, inside [0, 1]


def _node_circles(page: str) -> list[ET.Element]:
    """The tree's node circles (each node's first), in document order."""
    (svg,) = re.findall(r'<svg [^>]*class="tree".*?</svg>', page, re.S)
    ns = "{http://www.w3.org/2000/svg}"
    nodes = [g for g in ET.fromstring(svg).iter(f"{ns}g") if g.get("class") == "node"]
    return [c for g in nodes if (c := g.find(f"{ns}circle")) is not None]


def chromium_dom(page: Path, unavailable: Unavailable) -> str:
    """The DOM headless Chromium builds of ``page`` (no network: it is a file)."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        unavailable("PRISMEM_CHROMIUM", "chromium is not installed: see docs/contributing.md")
    flags = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1280,2000"]
    return subprocess.run([*flags, "--dump-dom", page.as_uri()], capture_output=True, text=True,
                          timeout=120, check=True).stdout  # fmt: skip


def test_the_pictures_render_in_chromium_with_the_recorded_scores(
    run: RunStore, tmp_path: Path, unavailable: Unavailable
):
    page = tmp_path / "report.html"
    report(run, page)
    dom = chromium_dom(page, unavailable)
    assert 'class="progress"' in dom and 'class="tree"' in dom
    check_pictures(dom, run)
