"""The run report's pictures, as inline SVG: the progress chart and the lineage tree.

Owns the records the report hands over (:class:`Point`, :class:`Series`, :class:`CeilingMark`,
:class:`Panel` and :class:`Progress`; :class:`Node` and :class:`Tree`) and their drawing:

- :func:`progress_svg`: panels sharing one x axis, the candidates in creation order, shaded by
  stage. Each series is a step line of the best fitness so far, with markers (``points``) on
  the candidates' own recorded scores; the seed is a labelled vertical line, each split's
  ceiling a dashed line labelled ``ceiling``; y ticks span the observed range (ceilings
  included); a legend beside each panel names each line once.
- :func:`tree_svg`: the lineage layered by generation (a candidate's generation is one more
  than its deepest parent's; a root's is 0), one column per candidate in creation order, so
  no two nodes overlap and the columns read as the chart's x axis. Nodes are coloured by
  stage, hollow where a candidate was not evaluated, ringed black for the best overall and
  red where a guard held the candidate back; an edge runs from each parent to its child (the
  first parent solid, a further one dashed). Wide trees scroll sideways in their own box.

Invariants: the output is SVG (and its scroll box) only: no script, nothing fetched; every text
from the run is HTML-escaped; the picture is a function of the records alone; every drawn
point, line, ceiling, edge and node carries the numbers it shows as ``data-*`` attributes
(``data-candidate``, ``data-split``, ``data-capability``, ``data-value``; a line's
``data-points``), floats written by ``repr`` so that they read back exactly.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

from markupsafe import Markup, escape

STAGE_NAMES = {"seed": "seed", "cold_start": "cold start", "refinement": "refinement",
               "integration": "integration"}  # fmt: skip
STAGE_FILL = {"seed": "#d9d9d9", "cold_start": "#9ecae1", "refinement": "#fdae6b",
              "integration": "#bcbddc"}  # fmt: skip
STAGE_LINE = {"seed": "#636363", "cold_start": "#3182bd", "refinement": "#e6550d",
              "integration": "#756bb1"}  # fmt: skip
HELD = "#d62728"  # a guard held it back
FONT = 'font-family="system-ui,sans-serif"'
HALO = 'stroke="#fff" stroke-width="3" paint-order="stroke"'  # keeps a label readable on lines


@dataclass(frozen=True)
class Point:
    """A marker: one candidate's recorded fitness on the series' split (and capability);
    ``best``: it set a new best so far; ``held_back``: a guard held the candidate back."""

    candidate: str
    number: int
    value: float
    best: bool
    held_back: bool = False


@dataclass(frozen=True)
class Series:
    """One line: ``split`` (``valid`` or a guard's scores key) overall or on ``capability``;
    ``line``: (candidate number, best so far) from its first value on; ``points``: markers."""

    key: str
    split: str
    capability: str | None
    label: str
    colour: str
    line: tuple[tuple[int, float], ...]
    points: tuple[Point, ...]


@dataclass(frozen=True)
class CeilingMark:
    """The most a program can score on a split (drawn dashed in its series' colour)."""

    split: str
    value: float
    colour: str


@dataclass(frozen=True)
class Panel:
    title: str
    series: tuple[Series, ...]
    ceilings: tuple[CeilingMark, ...] = ()
    own_scores: bool = False  # its hollow markers are candidates' own scores (legend says so)


@dataclass(frozen=True)
class Progress:
    """The chart: every candidate's (number, stage) for the x axis, the seed's id and number,
    the fitness mode's name (the y axis) and the panels."""

    candidates: tuple[tuple[int, str], ...]
    seed: tuple[str, int] | None
    fitness: str
    panels: tuple[Panel, ...]


@dataclass(frozen=True)
class Node:
    """One candidate of the tree: its valid fitness (None: not evaluated), whether it is the best
    overall, the capabilities it is the specialist for, and why a guard held it back (empty:
    it was not)."""

    id: str
    number: int
    stage: str
    target: str | None
    status: str
    parents: tuple[str, ...]
    value: float | None
    best: bool
    specialist_for: tuple[str, ...]
    held_back: tuple[str, ...]


@dataclass(frozen=True)
class Tree:
    nodes: tuple[Node, ...]  # in creation order


def _data(**fields: object) -> str:
    """``data-*`` attributes (``_`` in a name becomes ``-``): floats by repr, None empty."""
    parts = []
    for name, value in fields.items():
        if value is None:
            text = ""
        elif isinstance(value, bool):
            text = "true" if value else "false"
        else:
            text = repr(value) if isinstance(value, float) else str(value)
        parts.append(f' data-{name.replace("_", "-")}="{escape(text)}"')
    return "".join(parts)


def _ticks(lo: float, hi: float) -> list[float]:
    """Evenly spaced round values covering [lo, hi] (at most 7; never below 0 for fitness)."""
    if hi - lo < 0.02:  # flat: a little room around it, within [0, 1] where the values are
        mid = (lo + hi) / 2
        low, high = mid - 0.01, mid + 0.01
        if low < 0 <= lo:
            low, high = 0.0, 0.02
        elif high > 1 >= hi:
            low, high = 0.98, 1.0
        lo, hi = low, high
    steps = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)  # fitness: within [0, 1]
    step = next((s for s in steps if (hi - lo) / s <= 6), steps[-1])
    first = math.floor(lo / step + 1e-9) * step
    first = max(0.0, first) if lo >= 0 else first
    count = math.ceil((hi - first) / step - 1e-9)
    return [round(first + i * step, 6) for i in range(count + 1)]


def _tick_label(value: float, ticks: Sequence[float]) -> str:
    return f"{value:.{3 if ticks[1] - ticks[0] < 0.0099 else 2}f}"


def _x_ticks(lo: int, hi: int) -> list[int]:
    step = next(s for s in (1, 2, 5, 10, 20, 25, 50, 100, 200, 500, 1000) if (hi - lo) / s <= 14)
    return list(range(math.ceil(lo / step) * step, hi + 1, step))


def _spread(wanted: list[float], gap: float) -> list[float]:
    """Label positions near ``wanted`` (ascending) at least ``gap`` apart."""
    out: list[float] = []
    for y in wanted:
        out.append(max(y, out[-1] + gap) if out else y)
    return out


def _short(text: str, most: int = 34) -> str:
    return text if len(text) <= most else text[: most - 1] + "…"


LEFT, PLOT_W, GAP, LEGEND_W = 62, 600, 22, 260  # chart: margins, plot and legend widths
TOP, PANEL_H, BETWEEN, BOTTOM = 30, 210, 52, 46


@dataclass(frozen=True)
class _Frame:
    """One panel's coordinates: candidate ``lo`` in the first slot of ``slot`` pixels; fitness
    ``y_lo`` at the bottom, ``y_hi`` at the top of the panel starting at ``top``."""

    lo: int
    slot: float
    top: float
    y_lo: float = 0.0
    y_hi: float = 1.0

    def x(self, n: float) -> float:
        return LEFT + self.slot * (n - self.lo + 0.5)

    def y(self, v: float) -> float:
        return self.top + PANEL_H - PANEL_H * (v - self.y_lo) / ((self.y_hi - self.y_lo) or 1)


def progress_svg(progress: Progress) -> Markup:
    """The progress chart (see the module docstring); a line of text when nothing is scored."""
    panels = [p for p in progress.panels if any(s.line for s in p.series)]
    if not panels or not progress.candidates:
        return Markup("<p>no evaluated candidate yet</p>")
    numbers = [n for n, _ in progress.candidates]
    lo, hi = min(numbers), max(numbers)
    frame = _Frame(lo, PLOT_W / (hi - lo + 1), TOP)
    width = LEFT + PLOT_W + GAP + LEGEND_W
    bottom = TOP + len(panels) * PANEL_H + (len(panels) - 1) * BETWEEN
    height = bottom + BOTTOM
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="progress" width="{width}" '
           f'height="{height}" viewBox="0 0 {width} {height}" {FONT} font-size="11" role="img" '
           'aria-label="best fitness so far by candidate: valid and guard sets, and valid per '
           'capability">']  # fmt: skip
    held = any(p.held_back for panel in panels for s in panel.series for p in s.points)
    for i, panel in enumerate(panels):
        top = TOP + i * (PANEL_H + BETWEEN)
        values = [v for s in panel.series for _, v in s.line]
        values += [p.value for s in panel.series for p in s.points]
        ticks = _ticks(min(values + [c.value for c in panel.ceilings]),
                       max(values + [c.value for c in panel.ceilings]))  # fmt: skip
        at = dataclasses.replace(frame, top=top, y_lo=ticks[0], y_hi=ticks[-1])
        out.append(f'<g class="panel"{_data(title=panel.title)}>')
        out += _bands(at, progress.candidates, named=i == 0, seed=progress.seed)
        out += _grid(at, ticks, progress.fitness)
        out += _ceilings(at, panel.ceilings) + _lines(at, panel.series)
        out += _points(at, panel.series, progress.seed[1] if progress.seed else None)
        out += _axes(at, lo, hi) + _legend(panel, top, marks=i == 0, held=held)
        out.append("</g>")
    if progress.seed is not None:
        seed_id, seed_n = progress.seed
        sx = frame.x(seed_n)
        out.append(f'<line class="seed"{_data(candidate=seed_id, number=seed_n)} '
                   f'x1="{sx:.1f}" y1="{TOP - 4}" x2="{sx:.1f}" y2="{bottom}" stroke="#444" '
                   f'stroke-dasharray="2,3"/><text x="{sx:.1f}" y="{TOP - 8}" '
                   'text-anchor="middle" font-weight="bold">seed</text>')  # fmt: skip
    out.append(
        f'<text x="{LEFT + PLOT_W / 2:.1f}" y="{height - 8}" text-anchor="middle">'
        "candidate, in creation order (the columns of the lineage tree)</text></svg>"
    )
    return Markup("".join(out))


def _bands(
    at: _Frame, candidates: Sequence[tuple[int, str]], named: bool, seed: tuple[str, int] | None
) -> list[str]:
    """A light band behind each run of candidates of one stage; ``named``: each band's stage
    above the panel where it fits (the seed's is the seed line's label)."""
    runs: list[list[tuple[int, str]]] = []
    for n, stage in candidates:
        if runs and runs[-1][-1][1] == stage:
            runs[-1].append((n, stage))
        else:
            runs.append([(n, stage)])
    out = []
    for run in runs:
        stage, a, b = run[0][1], run[0][0], run[-1][0]
        left, w = at.x(a) - at.slot / 2, at.slot * (b - a + 1)
        fill = STAGE_FILL.get(stage, "#eee")
        out.append(
            f'<rect class="band"{_data(stage=stage)} x="{left:.1f}" y="{at.top}" '
            f'width="{w:.1f}" height="{PANEL_H}" fill="{fill}" fill-opacity="0.22"/>'
        )
        name = STAGE_NAMES.get(stage, stage)
        start = max(left + 3, at.x(seed[1]) + 18 if seed else left)
        if named and stage != "seed" and left + w - start > 6.5 * len(name):
            colour = STAGE_LINE.get(stage, "#555")
            out.append(f'<text x="{start:.1f}" y="{at.top - 8}" font-size="10" '
                       f'fill="{colour}">{escape(name)}</text>')  # fmt: skip
    return out


def _grid(at: _Frame, ticks: list[float], fitness: str) -> list[str]:
    """Horizontal grid lines at the y ticks, their labels, and the y axis's title."""
    out = []
    for t in ticks:
        ty = at.y(t)
        out.append(f'<line x1="{LEFT}" y1="{ty:.1f}" x2="{LEFT + PLOT_W}" y2="{ty:.1f}" '
                   f'stroke="#e3e3e3"/><text x="{LEFT - 6}" y="{ty + 4:.1f}" '
                   f'text-anchor="end">{_tick_label(t, ticks)}</text>')  # fmt: skip
    mid = at.top + PANEL_H / 2
    out.append(f'<text x="14" y="{mid:.1f}" text-anchor="middle" transform="rotate(-90 14 '
               f'{mid:.1f})">fitness ({escape(fitness)})</text>')  # fmt: skip
    return out


def _ceilings(at: _Frame, ceilings: Sequence[CeilingMark]) -> list[str]:
    """Dashed lines, each labelled ``ceiling`` below its right end (labels kept apart)."""
    order = sorted(ceilings, key=lambda c: -c.value)
    out = []
    for c, ly in zip(order, _spread([at.y(c.value) + 11 for c in order], 12), strict=True):
        cy = at.y(c.value)
        out.append(f'<line class="ceiling"{_data(split=c.split, value=c.value)} x1="{LEFT}" '
                   f'y1="{cy:.1f}" x2="{LEFT + PLOT_W}" y2="{cy:.1f}" stroke="{c.colour}" '
                   'stroke-width="1.2" stroke-dasharray="6,4"/>'
                   f'<text x="{LEFT + PLOT_W - 4}" y="{ly:.1f}" text-anchor="end" font-size="10" '
                   f'fill="{c.colour}" {HALO}>ceiling {c.value:.3f}</text>')  # fmt: skip
    return out


def _lines(at: _Frame, series: Sequence[Series]) -> list[str]:
    """Each series as steps: the best so far holds until a later candidate beats it."""
    out = []
    for s in series:
        if not s.line:
            continue
        (n0, v0), half = s.line[0], at.slot / 2
        path = [f"M{at.x(n0) - half:.1f},{at.y(v0):.1f} H{at.x(n0):.1f}"]
        path += [f"H{at.x(n):.1f} V{at.y(v):.1f}" for n, v in s.line[1:]]
        path.append(f"H{at.x(s.line[-1][0]) + half:.1f}")
        pairs = " ".join(f"{n}:{v!r}" for n, v in s.line)
        attrs = _data(series=s.key, split=s.split, capability=s.capability, points=pairs)
        width = 2.4 if s.split == "valid" and s.capability is None else 1.8
        out.append(f'<path class="line"{attrs} d="{" ".join(path)}" fill="none" '
                   f'stroke="{s.colour}" stroke-width="{width}"/>')  # fmt: skip
    return out


def _points(at: _Frame, series: Sequence[Series], seed: int | None) -> list[str]:
    """The markers: filled on a new best, hollow otherwise, ringed red where a guard held the
    candidate back; the seed's larger. Each has its figures as a tooltip."""
    out = []
    for s in series:
        for p in s.points:
            radius = 4.5 if p.number == seed else 3.2
            fill = s.colour if p.best else "#fff"
            stroke = HELD if p.held_back else "#fff" if p.best else s.colour
            tip = " · ".join(
                [p.candidate, s.label, f"{p.value:.4f}"]
                + ["new best"] * p.best
                + ["held back by a guard"] * p.held_back
            )
            attrs = _data(series=s.key, split=s.split, capability=s.capability,
                          candidate=p.candidate, number=p.number, value=p.value, best=p.best,
                          held_back=p.held_back)  # fmt: skip
            out.append(f'<circle class="point"{attrs} cx="{at.x(p.number):.1f}" '
                       f'cy="{at.y(p.value):.1f}" r="{radius}" fill="{fill}" stroke="{stroke}" '
                       f'stroke-width="{2 if p.held_back else 1.3}">'
                       f"<title>{escape(tip)}</title></circle>")  # fmt: skip
    return out


def _axes(at: _Frame, lo: int, hi: int) -> list[str]:
    """The panel's left and bottom axes, the bottom one with candidate numbers."""
    bottom = at.top + PANEL_H
    out = [
        f'<line x1="{LEFT}" y1="{at.top}" x2="{LEFT}" y2="{bottom}" stroke="#888"/>'
        f'<line x1="{LEFT}" y1="{bottom}" x2="{LEFT + PLOT_W}" y2="{bottom}" stroke="#888"/>'
    ]
    for n in _x_ticks(lo, hi):
        tx = at.x(n)
        out.append(f'<line x1="{tx:.1f}" y1="{bottom}" x2="{tx:.1f}" y2="{bottom + 4}" '
                   f'stroke="#888"/><text x="{tx:.1f}" y="{bottom + 16}" '
                   f'text-anchor="middle">{n}</text>')  # fmt: skip
    return out


def _legend(panel: Panel, top: float, marks: bool, held: bool) -> list[str]:
    """The panel's title, one row per line, then (``marks``: the first panel's) one per kind
    of mark, so that the chart names each once (``held``: some marker is ringed)."""
    left = LEFT + PLOT_W + GAP
    out = [f'<text x="{left}" y="{top + 4}" font-weight="bold">{escape(panel.title)}</text>']
    rows: list[tuple[str, str]] = []
    for s in (s for s in panel.series if s.line):
        swatch = (f'<line x1="0" y1="0" x2="22" y2="0" stroke="{s.colour}" stroke-width="2.2"/>'
                  f'<circle cx="11" cy="0" r="3" fill="{s.colour}"/>')  # fmt: skip
        rows.append((swatch, s.label))
    if panel.ceilings:
        rows.append(('<line x1="0" y1="0" x2="22" y2="0" stroke="#666" stroke-dasharray="6,4"/>',
                     "ceiling (gold evidence in budget)"))  # fmt: skip
    if marks:
        rows.append(('<circle cx="11" cy="0" r="3.2" fill="#666"/>', "a new best so far"))
    if panel.own_scores:
        rows.append(('<circle cx="11" cy="0" r="3.2" fill="#fff" stroke="#666" '
                     'stroke-width="1.3"/>', "a candidate's own score"))  # fmt: skip
    if marks and held:
        rows.append((f'<circle cx="11" cy="0" r="3.2" fill="#fff" stroke="{HELD}" '
                     'stroke-width="2"/>', "held back by a guard"))  # fmt: skip
    for i, (swatch, label) in enumerate(rows):
        ry = top + 24 + 17 * i
        out.append(f'<g class="legend" transform="translate({left} {ry - 4})">{swatch}</g>'
                   f'<text class="legend-label"{_data(label=label)} x="{left + 30}" y="{ry}">'
                   f"<title>{escape(label)}</title>"
                   f"{escape(_short(label))}</text>")  # fmt: skip
    return out


COL, ROW, R = 30, 58, 10  # tree: column width, row height, node radius
T_LEFT, T_TOP = 58, 22


def _generations(nodes: Sequence[Node]) -> dict[str, int]:
    """Each node's generation: 0 for a root (or one whose parents are not in the run), else
    one more than its deepest parent's. Parents precede their children in creation order."""
    gen: dict[str, int] = {}
    for n in nodes:
        known = [gen[p] for p in n.parents if p in gen]
        gen[n.id] = 1 + max(known) if known else 0
    return gen


def tree_svg(tree: Tree) -> Markup:
    """The lineage tree with its legend (see the module docstring); text when it is empty."""
    if not tree.nodes:
        return Markup("<p>no candidate yet</p>")
    gen = _generations(tree.nodes)
    col = {n.id: i for i, n in enumerate(tree.nodes)}

    def at(node_id: str) -> tuple[float, float]:
        return T_LEFT + COL * col[node_id] + COL / 2, T_TOP + ROW * gen[node_id] + R + 4

    width = T_LEFT + COL * len(tree.nodes) + 12
    height = T_TOP + ROW * (max(gen.values()) + 1) + 4
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="tree" width="{width}" '
           f'height="{height}" viewBox="0 0 {width} {height}" {FONT} font-size="10" role="img" '
           'aria-label="lineage tree: candidates by generation, coloured by stage">']  # fmt: skip
    for g in range(max(gen.values()) + 1):
        gy = T_TOP + ROW * g + R + 4
        out.append(f'<line x1="{T_LEFT}" y1="{gy}" x2="{width - 8}" y2="{gy}" stroke="#f0f0f0"/>'
                   f'<text x="6" y="{gy + 4}" fill="#777">gen {g}</text>')  # fmt: skip
    for n in tree.nodes:
        cx, cy = at(n.id)
        for i, p in enumerate(pp for pp in n.parents if pp in col):
            px, py = at(p)
            mid = (py + cy + 14) / 2
            dash = ' stroke-dasharray="4,3"' if i else ""
            out.append(f'<path class="edge"{_data(parent=p, child=n.id, first=i == 0)} '
                       f'd="M{px:.1f},{py + R + 14:.1f} C{px:.1f},{mid:.1f} {cx:.1f},{mid:.1f} '
                       f'{cx:.1f},{cy - R:.1f}" fill="none" stroke="#a8a8a8" '
                       f'stroke-width="1.3"{dash}/>')  # fmt: skip
    for n in tree.nodes:
        out.append(_node(n, *at(n.id), gen[n.id]))
    out.append("</svg>")
    return Markup(_tree_legend(tree) + '<div class="scroll">' + "".join(out) + "</div>")


def _node(n: Node, cx: float, cy: float, generation: int) -> str:
    evaluated = n.value is not None
    line = STAGE_LINE.get(n.stage, "#555")
    fill = STAGE_FILL.get(n.stage, "#eee") if evaluated else "#fff"
    dash = "" if evaluated else ' stroke-dasharray="3,2"'
    parts = [f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="{R}" fill="{fill}" stroke="{line}" '
             f'stroke-width="1.5"{dash}/>']  # fmt: skip
    ring = R + 3.5
    if n.best:
        parts.append(f'<circle class="best" cx="{cx:.1f}" cy="{cy:.1f}" r="{ring}" fill="none" '
                     'stroke="#111" stroke-width="2"/>')  # fmt: skip
        ring += 3.5
    if n.held_back:
        parts.append(f'<circle class="held-back" cx="{cx:.1f}" cy="{cy:.1f}" r="{ring}" '
                     f'fill="none" stroke="{HELD}" stroke-width="2"/>')  # fmt: skip
    parts.append(f'<text x="{cx:.1f}" y="{cy + 3.5:.1f}" text-anchor="middle" font-size="9" '
                 f'fill="{"#111" if evaluated else "#777"}">{n.number}</text>')  # fmt: skip
    shown = "—" if n.value is None else f"{n.value:.3f}".removeprefix("0")
    parts.append(f'<text x="{cx:.1f}" y="{cy + R + 11:.1f}" text-anchor="middle" font-size="9" '
                 f'fill="#444">{shown}</text>')  # fmt: skip
    if n.target:
        parts.append(f'<text x="{cx:.1f}" y="{cy - R - 8:.1f}" text-anchor="middle" '
                     f'font-size="9" font-weight="bold" fill="#333" {HALO}>'
                     f"{escape(n.target)}</text>")  # fmt: skip
    tip = [n.id, STAGE_NAMES.get(n.stage, n.stage)]
    tip += [f"target {n.target}"] if n.target else []
    tip += [n.status, "valid —" if n.value is None else f"valid {n.value:.4f}"]
    tip += ["best overall"] if n.best else []
    tip += [f"specialist for {', '.join(n.specialist_for)}"] if n.specialist_for else []
    tip += [f"held back: {'; '.join(n.held_back)}"] if n.held_back else []
    tip += [f"parents {', '.join(n.parents)}"] if n.parents else []
    attrs = _data(candidate=n.id, number=n.number, generation=generation, stage=n.stage,
                  target=n.target, status=n.status, value=n.value, best=n.best,
                  held_back=bool(n.held_back), parents=" ".join(n.parents))  # fmt: skip
    return (f'<g class="node"{attrs}><title>{escape(" · ".join(tip))}</title>'
            f"{''.join(parts)}</g>")  # fmt: skip


def _tree_legend(tree: Tree) -> str:
    """A row of swatches above the tree: the stages present, then the marks."""
    stages = [s for s in STAGE_NAMES if any(n.stage == s for n in tree.nodes)]
    items: list[tuple[str, str]] = [
        (f'<circle cx="9" cy="9" r="7" fill="{STAGE_FILL[s]}" stroke="{STAGE_LINE[s]}" '
         'stroke-width="1.5"/>', STAGE_NAMES[s]) for s in stages]  # fmt: skip
    items += [
        ('<circle cx="9" cy="9" r="7" fill="#fff" stroke="#777" stroke-width="1.5" '
         'stroke-dasharray="3,2"/>', "not evaluated (stopped, rejected, failed)"),
        ('<circle cx="9" cy="9" r="7" fill="none" stroke="#111" stroke-width="2"/>',
         "best overall"),
        (f'<circle cx="9" cy="9" r="7" fill="none" stroke="{HELD}" stroke-width="2"/>',
         "held back by a guard"),
        ('<path d="M0,9 H18" stroke="#9a9a9a" stroke-width="1.3" stroke-dasharray="4,3"/>',
         "a further parent (merged)"),
    ]  # fmt: skip
    spans = [f'<span class="key"><svg xmlns="http://www.w3.org/2000/svg" width="18" height="18" '
             f'viewBox="0 0 18 18">{swatch}</svg> {escape(label)}</span>'
             for swatch, label in items]  # fmt: skip
    return (
        '<p class="legend">' + " ".join(spans) + "<br>in each node its number (creation "
        "order), below it its valid fitness, above it the capability it targeted</p>"
    )
