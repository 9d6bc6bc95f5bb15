"""The run report (``evolve report``): one self-contained HTML file that shows a whole run.

Owns :func:`report_data` (everything the page shows, derived from the run store and its call
log: plain values, and the records of its two pictures, :mod:`evolve.evolution.charts`),
:func:`render_html`, :func:`write_report` and :func:`watch` (``evolve report --watch``: the
page rewritten while a run goes, reloading itself, until the run is finished).

Sections, each an ``<section id=...>``: ``summary``, ``transfer`` (the best's and the seed's
fitness on valid and on each guard set, beside the ceiling), ``matrix`` (capability ×
candidate valid fitness), ``lineage`` (the drawn tree: each node's stage, status, target and
valid fitness, the best and the candidates a guard held back marked; the same as a table
behind a ``<details>``), ``progress`` (the best fitness so far by candidate on valid and on
each guard set, with every candidate's own score, the seed and each split's ceiling; then valid
per capability), ``spend`` (per role and per role/purpose), ``cache`` (step-cache hit rates of
the evaluations) and ``integration`` (the specialists that went into each integrated program).

What the pictures show is read as the rest of the report reads it: fitness by
:func:`~evolve.evolution.summary.split_fitness`, ceilings by
:func:`~evolve.evolution.summary.split_ceiling` (the seed's record), the guards and the
guard tests a candidate failed from the archive's replay
(:func:`~evolve.evolution.archive.archive`: ``held_back``), so the chart, the tree and the
transfer table always agree. A marker is flagged held back where a guard held the candidate
back from the role its series shows (overall: the best; a capability: its specialist).

Invariants: the page needs no network and no script — styles are inline, charts are inline SVG,
a watched page reloads by a meta refresh and is replaced atomically;
every text from the run (messages, ids, model names) is HTML-escaped by the template; nothing
here writes to the run except the caller's output file. Figures a run did not record (step
counts of runs made before they were kept, a split a candidate never reached) show as "—".
"""

from __future__ import annotations

import time
from collections.abc import Callable
from importlib.resources import files
from pathlib import Path
from typing import Any

from jinja2 import Environment
from markupsafe import Markup

from contract.spec import COMPONENTS
from evolve.benches.guards import KEY_PREFIX as GUARD_PREFIX
from evolve.datasets.types import CAPABILITIES, CAPABILITY_NAMES, UNLABELLED
from evolve.evolution.archive import Archive, archive, guard_keys
from evolve.evolution.budget import read_spend
from evolve.evolution.candidate import VALID
from evolve.evolution.charts import (
    CeilingMark,
    Node,
    Panel,
    Point,
    Progress,
    Series,
    Tree,
    progress_svg,
    tree_svg,
)
from evolve.evolution.store import CandidateMeta, RunStore
from evolve.evolution.summary import (
    fitness_mode,
    local_time,
    split_ceiling,
    split_fitness,
    status,
    transfer,
)
from evolve.files import write_atomic
from evolve.scoring import fmt_score

TEMPLATE = "report.html.j2"  # beside this module
COLOURS = {"F": "#1f77b4", "T": "#ff7f0e", "P": "#2ca02c", "M": "#d62728", "A": "#9467bd"}
VALID_COLOUR = "#222222"
GUARD_COLOURS = ("#e377c2", "#17becf", "#8c564b", "#bcbd22", "#7f7f7f")  # one per guard, in turn


def report_data(store: RunStore) -> dict[str, Any]:
    """What the report shows, from the store and the call log only."""
    candidates = store.candidates()
    kept = archive(candidates)
    by_id = {c.id: c for c in candidates}
    unlabelled = any(split_fitness(c, cap=UNLABELLED) is not None for c in candidates)
    groups = (*CAPABILITIES, *([UNLABELLED] if unlabelled else []))  # the matrix's columns
    matrix = [
        {
            "id": c.id, "stage": c.stage, "target": c.capability, "status": c.status,
            "overall": split_fitness(c),
            "by_capability": {cap: split_fitness(c, cap=cap) for cap in groups},
            "message": c.message,
        }
        for c in candidates
    ]  # fmt: skip
    spend = read_spend(store.root)
    mode = fitness_mode(store.manifest)
    return {
        "run": store.run_id,
        "created": local_time(store.manifest.get("created")),
        "config": store.manifest.get("config", {}),
        "fitness": mode,
        "groups": groups,
        "ceiling": _ceiling(candidates, groups),
        "best": kept.best.id if kept.best else None,
        "transfer": transfer(candidates, kept),
        "specialists": {cap: m.id for cap, m in kept.specialists.items()},
        "matrix": matrix,
        "lineage": _lineage(candidates),
        "progress": _progress(candidates, kept, mode.name),
        "tree": _tree(candidates, kept),
        "spend": spend.as_json(),
        "cache": _cache_rates(candidates),
        "integration": [
            {"id": c.id, "status": c.status, "overall": split_fitness(c),
             "parents": [{"id": p, "stage": by_id[p].stage, "target": by_id[p].capability,
                          "specialist_for": [k for k, m in kept.specialists.items() if m.id == p]}
                         for p in c.parents if p in by_id]}
            for c in candidates if c.stage == "integration"
        ],
    }  # fmt: skip


def _ceiling(
    candidates: list[CandidateMeta], groups: tuple[str, ...]
) -> dict[str, float | None] | None:
    """The valid coverage ceiling overall and per capability (the same for every candidate of a
    run: the seed's record), shown as the matrix's first row; None before any has one."""
    for c in candidates:
        if split_ceiling(c) is not None:
            return {"overall": split_ceiling(c),
                    **{cap: split_ceiling(c, cap=cap) for cap in groups}}  # fmt: skip
    return None


def _lineage(candidates: list[CandidateMeta]) -> list[dict[str, Any]]:
    """Depth-first rows of the tree under each root; a child of two parents (a crossover or an
    integration) sits under its first parent and names the others."""
    children: dict[str | None, list[CandidateMeta]] = {}
    for c in candidates:
        children.setdefault(c.parents[0] if c.parents else None, []).append(c)
    rows: list[dict[str, Any]] = []

    def walk(node: CandidateMeta, depth: int) -> None:
        rows.append({"id": node.id, "depth": depth, "stage": node.stage,
                     "target": node.capability, "status": node.status,
                     "also": node.parents[1:], "overall": split_fitness(node)})  # fmt: skip
        for child in children.get(node.id, []):
            walk(child, depth + 1)

    for root in children.get(None, []):
        walk(root, 0)
    return rows


def _progress(candidates: list[CandidateMeta], kept: Archive, mode: str) -> Progress:
    """The chart's records: valid and each guard overall (with every candidate's own score and
    each split's ceiling, the seed's record), then valid per capability (new bests only)."""
    seed = next((c for c in candidates if c.stage == "seed" and c.status == "evaluated"), None)
    held = {c.id: {g.role for g in kept.held_back(c.id)} for c in candidates}
    first = seed or next((c for c in candidates if c.status == "evaluated"), None)
    overall, ceilings = [], []
    splits = [(VALID, "valid (all questions)", VALID_COLOUR)] + [
        (key, f"guard {key.removeprefix(GUARD_PREFIX)}", GUARD_COLOURS[i % len(GUARD_COLOURS)])
        for i, key in enumerate(guard_keys(candidates))]  # fmt: skip
    for split, label, colour in splits:
        overall.append(_series(candidates, split, None, label, colour, held, every=True))
        top = None if first is None else split_ceiling(first, split)
        if top is not None:
            ceilings.append(CeilingMark(split, top, colour))
    per_cap = [_series(candidates, VALID, cap, f"{cap} {CAPABILITY_NAMES[cap]}", COLOURS[cap],
                       held, every=False) for cap in CAPABILITIES]  # fmt: skip
    return Progress(
        candidates=tuple((c.number, c.stage) for c in candidates),
        seed=None if seed is None else (seed.id, seed.number),
        fitness=mode,
        panels=(Panel("valid and guard sets, all questions", tuple(overall), tuple(ceilings),
                      own_scores=True),
                Panel("valid, per capability", tuple(per_cap))),
    )  # fmt: skip


def _series(
    candidates: list[CandidateMeta], split: str, cap: str | None, label: str, colour: str,
    held: dict[str, set[str]], every: bool,
) -> Series:  # fmt: skip
    """The best fitness so far on ``split`` (overall or ``cap``) by candidate; a marker on each
    candidate's own score (``every``) or on each new best only, flagged where a guard held the
    candidate back from the role the series shows (``held``: id -> roles; overall: ``best``)."""
    role = "best" if cap is None else cap
    best: float | None = None
    line: list[tuple[int, float]] = []
    points: list[Point] = []
    for c in candidates:
        value = split_fitness(c, split, cap)
        if value is not None:
            new = best is None or value > best
            best = value if new else best
            if every or new:
                points.append(Point(c.id, c.number, value, new, role in held[c.id]))
        if best is not None:
            line.append((c.number, best))
    key = split if cap is None else f"{split}:{cap}"
    return Series(key, split, cap, label, colour, tuple(line), tuple(points))


def _tree(candidates: list[CandidateMeta], kept: Archive) -> Tree:
    """The lineage tree's records: each candidate's stage, status, valid fitness, whether it is
    the best or a specialist, and the guard tests that held it back."""
    best = kept.best.id if kept.best else None
    return Tree(tuple(
        Node(c.id, c.number, c.stage, c.capability, c.status, tuple(c.parents), split_fitness(c),
             c.id == best, tuple(k for k, m in kept.specialists.items() if m.id == c.id),
             tuple(f"guard {g.guard} for {g.role}: {g.fitness:.4f} against {g.holder}'s "
                   f"{g.holder_fitness:.4f}" for g in kept.held_back(c.id)))
        for c in candidates))  # fmt: skip


def _cache_rates(candidates: list[CandidateMeta]) -> dict[str, dict[str, Any]]:
    """Per cached step: computed and reused counts over every evaluation, and the hit rate
    (all None for a run that kept no counts)."""
    totals = {s: {"computed": 0, "reused": 0} for s in COMPONENTS}
    recorded = False
    for c in candidates:
        for block in c.scores.values():
            for step, counts in block.steps.items():
                if step in totals:
                    recorded = True
                    totals[step]["computed"] += int(counts.get("computed", 0))
                    totals[step]["reused"] += int(counts.get("reused", 0))
    out: dict[str, dict[str, Any]] = {}
    for step, t in totals.items():
        n = t["computed"] + t["reused"]
        if not recorded:  # a run made before step counts were kept
            out[step] = {"computed": None, "reused": None, "hit_rate": None}
        else:
            out[step] = {**t, "hit_rate": t["reused"] / n if n else None}
    return out


def _cell(value: float | None) -> Markup:
    """A table cell shaded by fitness (0 white → 1 green)."""
    if value is None:
        return Markup('<td class="num none">—</td>')
    shade = int(255 - 120 * max(0.0, min(1.0, value)))
    style = f"background:rgb({shade},255,{shade})"
    return Markup(f'<td class="num" style="{style}">{fmt_score(value)}</td>')


def render_html(data: dict[str, Any], refresh: int | None = None) -> str:
    """The report page for :func:`report_data`'s output (template ``report.html.j2``); with
    ``refresh``, the page reloads itself every that many seconds (a meta refresh)."""
    env = Environment(autoescape=True, trim_blocks=True)
    env.filters["score"] = fmt_score
    env.filters["percent"] = lambda v: "—" if v is None else f"{100 * v:.1f} %"
    template = env.from_string(files(__package__).joinpath(TEMPLATE).read_text("utf-8"))
    names = {**CAPABILITY_NAMES, UNLABELLED: "questions with no capability"}
    return template.render(d=data, caps=data["groups"], names=names, cell=_cell,
                           chart=progress_svg(data["progress"]), tree=tree_svg(data["tree"]),
                           refresh=refresh)  # fmt: skip


def write_report(store: RunStore, target: Path, refresh: int | None = None) -> None:
    """Render the run's report into ``target``, atomically (a reloading browser never reads
    half a page); OSError when it cannot be written."""
    write_atomic(target, render_html(report_data(store), refresh).encode("utf-8"), mode=0o644)


def watch(
    store: RunStore,
    target: Path,
    seconds: int,
    *,
    sleep: Callable[[float], None] | None = None,
    on_write: Callable[[bool], None] = lambda finished: None,
) -> None:
    """Keep ``target`` current while the run goes: every ``seconds`` look at the run and
    rewrite the page when a candidate was filed or changed status, or the round counters moved
    (``on_write(False)``), the page reloading itself as often; return once the run is finished
    or stopped at a cap (:func:`evolve.evolution.summary.status`), after a last page without
    the reload (``on_write(True)``). A run that died stays watched until the caller stops it
    (Ctrl-C)."""
    last: tuple[Any, ...] | None = None
    while True:
        now = status(store)
        seen = tuple((c.id, c.status) for c in store.candidates())
        state = (seen, now.stage, now.round, now.stopped)
        finished = now.stage == "finished" or now.stopped is not None
        if finished or state != last:
            write_report(store, target, None if finished else seconds)
            on_write(finished)
            last = state
        if finished:
            return
        (sleep or time.sleep)(seconds)
