"""The ``evolve`` commands that read a run: ``runs``, ``status``, ``programs``, ``show``,
``diff`` and ``lineage``; and the helpers every run-folder command shares (finding runs and
candidates, ``--json`` output, one error rule), which :mod:`.deliver` (``freeze``, ``export``,
``report``) uses too. Parsing and rendering live here; the data comes from
:mod:`evolve.evolution.summary` and the run store.

Invariants:

- One candidate syntax everywhere (:data:`CANDIDATE_HELP`): ``RUN/ID``, ``RUN:ID`` the same,
  or a bare ``ID`` looked up in ``--run RUN``, else in the newest run (said on stderr). ``ID``
  may be any unique prefix of a candidate id.
- Every expected failure is one ``error:`` line and exit 2 (a
  :class:`~evolve.cli.common.UsageError`); the store's RunNotFound / CandidateNotFound /
  DamagedFile are turned into one (:func:`run_command`). Damaged candidates the store skips
  are ``warning:`` lines, and the rest is shown.
- With ``--json`` a command prints one JSON object on stdout; notes and warnings go to stderr.
"""

from __future__ import annotations

import argparse
import difflib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich import box
from rich.console import JustifyMethod
from rich.markup import escape
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from evolve.cli.common import UsageError, add_runs_dir, err, out
from evolve.datasets.types import CAPABILITIES, GROUPS
from evolve.evolution import summary
from evolve.evolution.archive import archive, fitness
from evolve.evolution.store import (
    CandidateMeta,
    CandidateNotFound,
    DamagedFile,
    RunNotFound,
    RunStore,
)
from evolve.models.usage import fault_text
from evolve.scoring import fmt_score
from sandbox.printable import printable

CANDIDATE_HELP = (
    "RUN/ID (or RUN:ID); ID may be a unique prefix such as c0003, or best (the run's best "
    "overall, as status shows it). A bare ID is looked up in --run RUN, else in the newest run"
)
MESSAGE_WIDTH = 60
BEST = "best"  # the candidate reference of a run's best overall


def command(sub: Any, name: str, help: str, *, run: bool = False) -> argparse.ArgumentParser:
    """A subcommand on run folders, here or in :mod:`.deliver` (``--runs-dir``, ``--json``;
    ``run``: it names a candidate, so it takes ``--run``)."""
    parser: argparse.ArgumentParser = sub.add_parser(
        name, help=help, description=help + (f". CANDIDATE is {CANDIDATE_HELP}" if run else "")
    )
    add_runs_dir(parser, "where run folders are (default programs/ or $PRISMEM_RUNS)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    if run:
        parser.add_argument("--run", help="the run a bare candidate ID is looked up in")
    return parser


def add_commands(sub: Any) -> None:
    """Register this module's subcommands on the ``evolve`` parser's subparsers."""

    command(sub, "runs", "list the runs, newest first")
    for name, text in (
        ("status", "where a run stands: stage, best, specialists, spend, frozen"),
        ("programs", "one row per candidate of a run"),
    ):
        command(sub, name, text).add_argument("run", nargs="?", help="run id (default: newest)")
    command(sub, "show", "a candidate's source and metadata", run=True).add_argument(
        "candidate", help=CANDIDATE_HELP
    )
    diff = command(sub, "diff", "unified diff of two candidates' sources", run=True)
    diff.add_argument("a", help=CANDIDATE_HELP)
    diff.add_argument("b", help="like A; a bare ID is looked up in A's run unless --run is given")
    command(sub, "lineage", "a candidate's ancestry back to the seed", run=True).add_argument(
        "candidate", help=CANDIDATE_HELP
    )


def dispatch(args: argparse.Namespace) -> int:
    """Run one of :data:`COMMANDS`; the expected errors become a UsageError."""
    return run_command(COMMANDS, args)


def run_command(
    commands: dict[str, Callable[[argparse.Namespace], int]],
    args: argparse.Namespace,
    expected: tuple[type[Exception], ...] = (),
) -> int:
    """``commands[args.command](args)``; the store's errors and ``expected`` become one
    UsageError line (the run-folder commands' one error rule, here and in :mod:`.deliver`)."""
    errors: tuple[type[Exception], ...] = (
        UsageError, RunNotFound, CandidateNotFound, DamagedFile, *expected
    )  # fmt: skip
    try:
        return commands[args.command](args)
    except errors as exc:
        raise UsageError(escape(str(exc))) from None  # cli.main prints it as rich markup


# --- finding runs and candidates ----------------------------------------------------------


def open_run(runs_dir: Path, run_id: str | None) -> RunStore:
    """A run by id, or the newest run (said on stderr) when ``run_id`` is None."""
    if run_id is None:
        runs = RunStore.list_runs(runs_dir)
        if not runs:
            raise UsageError(f"no runs in {runs_dir}")
        run_id = runs[0]["id"]
        err.print(f"using the newest run {run_id} in {runs_dir}", markup=False, highlight=False)
    return RunStore.open(runs_dir, run_id)


def resolve(
    runs_dir: Path, ref: str, run: str | None, default: RunStore | None = None
) -> tuple[RunStore, CandidateMeta]:
    """A candidate reference (:data:`CANDIDATE_HELP`); a bare ID goes to ``run``, then
    ``default``, then the newest run."""
    parts = ref.replace(":", "/").split("/")
    if len(parts) > 2 or not all(parts):
        raise UsageError(f"bad candidate {ref!r}: expected {CANDIDATE_HELP}")
    if len(parts) == 2:
        if run is not None and run != parts[0]:
            raise UsageError(f"candidate {ref!r} names run {parts[0]} but --run is {run}")
        store = RunStore.open(runs_dir, parts[0])
    elif run is None and default is not None:
        store = default
    else:
        store = open_run(runs_dir, run)
    if parts[-1] == BEST:
        kept = archive(store.candidates()).best
        if kept is None:
            raise UsageError(f"run {store.run_id} has no best yet (no candidate evaluated)")
        return store, kept
    return store, store.get(parts[-1])


def name(store: RunStore, meta: CandidateMeta) -> str:
    return f"{store.run_id}/{meta.id}"


def emit(args: argparse.Namespace, obj: dict[str, Any]) -> bool:
    """Print ``obj`` as JSON when ``--json`` was given; True if it did."""
    if args.json:
        print(json.dumps(obj, indent=2, ensure_ascii=False))
    return bool(args.json)


# --- runs, status, programs ---------------------------------------------------------------


def cmd_runs(args: argparse.Namespace) -> int:
    rows = summary.runs(args.runs_dir)
    if emit(args, {"runs_dir": str(args.runs_dir), "runs": rows}):
        return 0
    if not rows:
        out.print(f"no runs in {args.runs_dir}", markup=False, highlight=False)
        return 0
    table = Table(title=f"runs in {args.runs_dir}")
    for column in ("run", "created", "candidates", "best", "valid fitness"):
        table.add_column(
            column, justify="right" if column in ("candidates", "valid fitness") else "left"
        )
    for r in rows:
        cells = (r["id"], r["created_local"] or "—", str(r["candidates"]), r["best"] or "—")
        table.add_row(*map(Text, cells), fmt_score(r["best_valid_fitness"]))
    out.print(table)
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    evaluation = summary.evaluation(args.runs_dir / args.run) if args.run else None
    if evaluation is not None:
        if not emit(args, evaluation.as_json()):
            out.print(summary.describe_evaluation(evaluation), markup=False, highlight=False)
        return 0
    store = open_run(args.runs_dir, args.run)
    status = summary.status(store)
    if emit(args, status.as_json()):
        return 0
    cfg, rounds = status.config, status.rounds
    out.print(
        f"[bold]run {store.run_id}[/] · created {status.created_local} · seed "
        f"{escape(Path(cfg.get('seed_program', '?')).name)} · embedder {cfg.get('embedder')} · "
        f"conversations {cfg.get('conversations') or 'all'}"
    )
    progress = ", ".join(f"{s} {r['done']}/{r['planned']}" for s, r in rounds.items())
    where = status.stage
    if where in rounds:
        where = f"next: {where} round {status.round} of {rounds[where]['planned']}"
    out.print(f"rounds: {progress} — {where}", highlight=False)
    if status.stopped:
        out.print(f"[bold yellow]stopped:[/] {escape(status.stopped)}", highlight=False)
    mode = status.fitness
    out.print(f"fitness: {mode.name} (version {mode.version or 'unrecorded'}, "
              f"{mode.coverage or 'coverage unrecorded'})")  # fmt: skip
    if status.best:
        best = status.best_figures
        out.print(
            f"best overall: {status.best} valid fitness {fmt_score(best.fitness)} (retrieval "
            f"fitness {fmt_score(best.retrieval_fitness)} of a possible "
            f"{fmt_score(best.ceiling)}, similarity "
            f"{fmt_score(best.similarity)}, hit rate {fmt_score(best.hit_rate)})"
        )
    for line in summary.transfer_lines(status.transfer):
        out.print(line, markup=False, highlight=False)
    if status.diagnostics:
        diag = Table(title="step diagnostics of the best program (train)")
        keys = ("d_ext", "d_idx", "d_ret", "unit_chars", "retrieved_chars")
        diag.add_column("capability")
        for k in keys:
            diag.add_column(k.replace("_", " "), justify="right")
        for group, row in status.diagnostics.items():
            diag.add_row(group, *(fmt_score(row.get(k)) for k in keys))
        out.print(diag)
    table = Table(title="specialists (best valid fitness on each capability)")
    for column in ("capability", "candidate", "valid fitness"):
        table.add_column(column)
    for cap, s in status.specialists.items():
        table.add_row(f"{cap} {s['name']}", s["id"], fmt_score(s["valid_fitness"]))
    out.print(table)
    counts = ", ".join(f"{n} {s}" for s, n in status.by_status.items() if n)
    out.print(f"candidates: {status.candidates} ({counts or 'none'})")
    if status.by_status.get("stopped"):
        out.print(f"cascade: about {status.cascade_saved_seconds:.0f} s of evaluation saved")
    _print_spend(status.spend)
    frozen = [f"{c} (test fitness {fmt_score(test.fitness)})" for c, test in status.frozen]
    out.print("frozen: " + (", ".join(frozen) or "none"))
    return 0


def _print_spend(spend: dict[str, Any]) -> None:
    total = spend["total"]
    if not total["calls"]:
        out.print("spend: no LLM calls")
        return

    def line(t: dict[str, Any]) -> str:
        return (
            f"{t['calls']} calls ({t['cached_calls']} cached), {t['tokens']:,} tokens, "
            f"${t['cost_usd']:.4f}"
            + (f", {t['unpriced_calls']} unpriced" if t["unpriced_calls"] else "")
            + (f", {faults}" if (faults := fault_text(t)) else "")
        )

    out.print(f"spend: {line(total)}", highlight=False)
    for role, tally in spend["by_role"].items():
        out.print(f"  {role}: {line(tally)}", highlight=False)


def cmd_programs(args: argparse.Namespace) -> int:
    store = open_run(args.runs_dir, args.run)
    candidates = store.candidates()
    rows = [summary.candidate(c) for c in candidates]
    transfer = summary.transfer(candidates)
    if emit(args, {"run": store.run_id, "candidates": [r.as_json() for r in rows],
                   "transfer": transfer and transfer.as_json()}):  # fmt: skip
        return 0
    held = transfer.held_back if transfer else {}
    caps = [c for c in GROUPS if c in CAPABILITIES or any(c in r.by_capability for r in rows)]
    cells = [
        [r.id + (" *" if r.frozen else "") + (" !" if r.id in held else ""), r.stage,
         r.capability or "", r.status,
         ", ".join(p.split("-")[0] for p in r.parents), fmt_score(r.valid_fitness),
         *(fmt_score(r.by_capability.get(cap)) for cap in caps),
         r.message[:MESSAGE_WIDTH]]
        for r in rows
    ]  # fmt: skip
    headers = ["id", "stage", "cap", "status", "parents", "valid", *caps]
    widths = [max([len(h), *(len(row[i]) for row in cells)]) for i, h in enumerate(headers)]
    notes = ["* frozen"] if any(r.frozen for r in rows) else []
    notes += ["! won valid, held back by a guard (below)"] if held else []
    if sum(widths) + len(widths) + 20 > out.width:  # too narrow: keep the message readable
        headers, widths = headers[:6], widths[:6]
        cells = [row[:6] + row[-1:] for row in cells]
        notes.append("per-capability columns hidden: widen the terminal or use --json")
    table = Table(title=f"candidates of run {store.run_id} (fitness on valid)",
                  caption="; ".join(notes) or None, box=box.SIMPLE_HEAD, padding=(0, 1),
                  pad_edge=False, collapse_padding=True)  # fmt: skip
    for column, width in zip(headers, widths, strict=True):  # fixed; the message gets the rest
        justify: JustifyMethod = "right" if column in ("valid", *caps) else "left"
        table.add_column(column, justify=justify, no_wrap=True, min_width=width)
    room = out.width - sum(widths) - 2 * len(widths) - 2
    table.add_column("message", no_wrap=True, overflow="ellipsis", max_width=max(8, room))
    for row in cells:
        table.add_row(*map(Text, row))  # messages may hold "[...]": never read as markup
    out.print(table)
    for line in summary.transfer_lines(transfer):
        out.print(line, markup=False, highlight=False)
    for cid, reasons in held.items():
        out.print(f"{cid} held back: {'; '.join(reasons)}", markup=False, highlight=False)
    return 0


# --- show, diff, lineage ------------------------------------------------------------------


def _shown(source: str) -> str:
    """A candidate's source as a terminal may show it: control characters (a source that
    failed tier 1 may hold any) as escapes, line by line."""
    return "\n".join(printable(line, len(line) * 6 + 1) for line in source.split("\n"))


def cmd_show(args: argparse.Namespace) -> int:
    store, meta = resolve(args.runs_dir, args.candidate, args.run)
    source = store.source(meta.id)
    if emit(args, {"candidate": name(store, meta), "meta": meta.model_dump(), "source": source}):
        return 0
    table = Table(title=name(store, meta), show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value", overflow="fold")
    scores = "; ".join(
        f"{split} {fmt_score(fitness(block.row(None)))}" for split, block in meta.scores.items()
    )
    for field, value in (
        ("stage", meta.stage),
        ("capability", meta.capability or "—"),
        ("status", meta.status),
        ("parents", ", ".join(meta.parents) or "—"),
        ("message", meta.message),
        ("fitness", scores or "—"),
        ("frozen", "yes" if meta.frozen else "no"),
        ("created", summary.local_time(meta.created)),
        ("sha256", meta.source_sha256),
    ):
        table.add_row(field, Text(printable(str(value), 10_000)))
    out.print(table)
    out.print(Syntax(_shown(source), "python", line_numbers=True, word_wrap=True))
    return 0


def cmd_diff(args: argparse.Namespace) -> int:
    store_a, a = resolve(args.runs_dir, args.a, args.run)
    store_b, b = resolve(args.runs_dir, args.b, args.run, default=store_a)
    name_a, name_b = name(store_a, a), name(store_b, b)
    lines = difflib.unified_diff(
        _shown(store_a.source(a.id)).split("\n"),
        _shown(store_b.source(b.id)).split("\n"),
        fromfile=name_a,
        tofile=name_b,
        lineterm="",
    )
    diff = "\n".join(lines)
    if emit(args, {"a": name_a, "b": name_b, "diff": diff}):
        return 0
    if not diff:
        out.print(f"{name_a} and {name_b} have the same source", markup=False, highlight=False)
        return 0
    styles = (("+++", "bold"), ("---", "bold"), ("@@", "cyan"), ("+", "green"), ("-", "red"))
    for line in diff.splitlines():
        style = next((s for prefix, s in styles if line.startswith(prefix)), "")
        out.print(Text(line, style=style), soft_wrap=True)
    return 0


def cmd_lineage(args: argparse.Namespace) -> int:
    store, meta = resolve(args.runs_dir, args.candidate, args.run)
    nodes = {m.id: m for m in summary.ancestry(store, meta.id)}
    if emit(
        args,
        {
            "candidate": name(store, meta),
            "ancestors": [summary.candidate(m).as_json() for m in nodes.values()],
        },
    ):
        return 0

    def label(m: CandidateMeta, repeated: bool) -> Text:
        text = Text(m.id, style="bold")
        text.append(f" {m.stage}" + (f" {m.capability}" if m.capability else ""), style="cyan")
        text.append(f" {m.status} valid {fmt_score(summary.split_fitness(m))}")
        text.append(
            " (shown above)" if repeated else f" — {m.message}", style="dim" if repeated else ""
        )
        return text

    shown: set[str] = set()

    def grow(tree: Tree, m: CandidateMeta) -> None:
        repeated = m.id in shown
        branch = tree.add(label(m, repeated))
        shown.add(m.id)
        if not repeated:
            parents(branch, m)

    def parents(tree: Tree, m: CandidateMeta) -> None:
        for parent in m.parents:
            if parent in nodes:
                grow(tree, nodes[parent])
            else:  # skipped by the store, which said why
                tree.add(Text(f"{parent} (damaged: not shown)", style="red"))

    root = Tree(label(meta, False))
    shown.add(meta.id)
    parents(root, meta)
    out.print(root)
    return 0


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "runs": cmd_runs,
    "status": cmd_status,
    "programs": cmd_programs,
    "show": cmd_show,
    "diff": cmd_diff,
    "lineage": cmd_lineage,
}
