"""The run report (``evolve report``): one self-contained HTML file that shows a whole run.

Owns :func:`report_data` (everything the page shows, JSON-ready, derived from the run store and
its call log), :func:`render_html`, :func:`write_report` and :func:`watch` (``evolve report
--watch``: the page rewritten while a run goes, reloading itself, until the run is finished).

Sections, each an ``<section id=...>``: ``summary``, ``transfer`` (the best's and the seed's
fitness on valid and on each guard set, beside the ceiling), ``matrix`` (capability ×
candidate valid fitness), ``lineage`` (the tree with each node's stage and target
capability), ``progress`` (best valid fitness so far per capability, by candidate),
``spend`` (per role and per role/purpose), ``cache`` (step-cache hit rates of the evaluations)
and ``integration`` (the specialists that went into each integrated program).

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
from markupsafe import Markup, escape

from contract.spec import COMPONENTS
from evolve.datasets.types import CAPABILITIES, CAPABILITY_NAMES
from evolve.evolution.archive import archive
from evolve.evolution.budget import read_spend
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


def report_data(store: RunStore) -> dict[str, Any]:
    """What the report shows, from the store and the call log only."""
    candidates = store.candidates()
    kept = archive(candidates)
    by_id = {c.id: c for c in candidates}
    matrix = [
        {
            "id": c.id, "stage": c.stage, "target": c.capability, "status": c.status,
            "overall": split_fitness(c),
            "by_capability": {cap: split_fitness(c, cap=cap) for cap in CAPABILITIES},
            "message": c.message,
        }
        for c in candidates
    ]  # fmt: skip
    spend = read_spend(store.root)
    return {
        "run": store.run_id,
        "created": local_time(store.manifest.get("created")),
        "config": store.manifest.get("config", {}),
        "fitness": fitness_mode(store.manifest),
        "ceiling": _ceiling(candidates),
        "best": kept.best.id if kept.best else None,
        "transfer": transfer(candidates, kept),
        "specialists": {cap: m.id for cap, m in kept.specialists.items()},
        "matrix": matrix,
        "lineage": _lineage(candidates),
        "progress": _progress(candidates),
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


def _ceiling(candidates: list[CandidateMeta]) -> dict[str, float | None] | None:
    """The valid coverage ceiling overall and per capability (the same for every candidate of a
    run: the seed's record), shown as the matrix's first row; None before any has one."""
    for c in candidates:
        if split_ceiling(c) is not None:
            return {"overall": split_ceiling(c),
                    **{cap: split_ceiling(c, cap=cap) for cap in CAPABILITIES}}  # fmt: skip
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


def _progress(candidates: list[CandidateMeta]) -> dict[str, list[tuple[int, float]]]:
    """Per capability (and overall): (candidate number, best valid fitness so far)."""
    series: dict[str, list[tuple[int, float]]] = {}
    for key in ("overall", *CAPABILITIES):
        best: float | None = None
        for c in candidates:
            value = split_fitness(c, cap=None if key == "overall" else key)
            if value is not None and (best is None or value > best):
                best = value
            if best is not None:
                series.setdefault(key, []).append((c.number, best))
    return series


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


def _chart(
    series: dict[str, list[tuple[int, float]]], width: int = 760, height: int = 260
) -> Markup:
    """An inline SVG line chart of best-so-far fitness per capability."""
    points = [p for s in series.values() for p in s]
    if not points:
        return Markup("<p>no evaluated candidate yet</p>")
    pad, right = 40, 200
    xmax = max(1, max(x for x, _ in points))
    ymin = min(y for _, y in points)
    ymax = max(y for _, y in points)
    ymin, ymax = (ymin - 0.05, ymax + 0.05) if ymax - ymin < 0.1 else (ymin, ymax)

    def xy(x: int, y: float) -> str:
        px = pad + (width - pad - right) * x / xmax
        py = height - pad - (height - 2 * pad) * (y - ymin) / (ymax - ymin)
        return f"{px:.1f},{py:.1f}"

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'role="img" aria-label="best valid fitness so far per capability">',
             f'<line x1="{pad}" y1="{height - pad}" x2="{width - right}" y2="{height - pad}" '
             'stroke="#888"/>',
             f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{height - pad}" stroke="#888"/>',
             f'<text x="{pad}" y="{height - 10}" font-size="11">candidate 0</text>',
             f'<text x="{width - right}" y="{height - 10}" font-size="11" '
             f'text-anchor="end">{xmax}</text>',
             f'<text x="4" y="{pad}" font-size="11">{ymax:.2f}</text>',
             f'<text x="4" y="{height - pad}" font-size="11">{ymin:.2f}</text>']  # fmt: skip
    for i, (key, values) in enumerate(series.items()):
        colour = COLOURS.get(key, "#000")
        line = " ".join(xy(x, y) for x, y in values)
        dash = ' stroke-dasharray="5,3"' if key == "overall" else ""
        parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="2"{dash} '
                     f'points="{line}"/>')  # fmt: skip
        label = escape(CAPABILITY_NAMES.get(key, key))
        parts.append(f'<text x="{width - right + 6}" y="{pad + 14 * i}" font-size="11" '
                     f'fill="{colour}">{escape(key)} {label}</text>')  # fmt: skip
    parts.append("</svg>")
    return Markup("".join(parts))


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
    return template.render(d=data, caps=CAPABILITIES, names=CAPABILITY_NAMES, cell=_cell,
                           chart=_chart(data["progress"]), refresh=refresh)  # fmt: skip


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
