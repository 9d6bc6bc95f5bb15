"""The ``evolve`` commands that deliver a run's result: ``freeze``, ``export`` and ``report``.

``freeze`` delegates to :mod:`evolve.evolution.freeze` (imported when it runs: it needs the
evaluation engine, which the reading commands do not load), ``export`` to
:mod:`evolve.evolution.export`, ``report`` (``--watch``: kept current while a run goes) to
:mod:`evolve.evolution.report`. Candidates and runs are named and found as in
:mod:`.inspect`, whose helpers these commands use.

Invariants (those of :mod:`.inspect`, and):

- Every expected failure is one ``error:`` line and exit 2: the store's errors, export's
  ExportError and freeze's FreezeError become a :class:`~evolve.cli.common.UsageError`
  (:func:`~.inspect.run_command`).
- ``freeze`` scores test once per candidate, and warns when the run has other frozen ones.
- With ``--json`` a command prints one JSON object on stdout; notes and warnings go to stderr.
"""

from __future__ import annotations

import argparse
import os
import stat
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.markup import escape
from rich.table import Table

from evolve.cli.common import ProgressBar, UsageError, err, jobs_count, out, watch_seconds
from evolve.cli.eval import ceiling_line
from evolve.cli.inspect import CANDIDATE_HELP, command, emit, name, open_run, resolve, run_command
from evolve.datasets.types import group_title
from evolve.evaluation.identity import read_scored_as
from evolve.evolution import export
from evolve.evolution.archive import fitness
from evolve.evolution.summary import transfer, transfer_lines
from evolve.scoring import fmt_score
from evolve.scoring.ceiling import KEY as CEILING_KEY


def add_commands(sub: Any) -> None:
    """Register this module's subcommands on the ``evolve`` parser's subparsers."""
    freeze = command(sub, "freeze", "mark a candidate final and score it once on test", run=True)
    freeze.add_argument("candidate", help=CANDIDATE_HELP)
    freeze.add_argument("--data-dir", type=Path, help="benchmark data root (default: the run's)")
    freeze.add_argument("--jobs", type=jobs_count, help="worker processes (default: the run's)")
    freeze.add_argument("--cache-dir", help="stage and embedding caches (default: the run's)")
    freeze.add_argument(
        "--embedder", choices=["minilm", "hashing"], help="embedder (default: the run's)"
    )
    freeze.add_argument("--no-progress", action="store_true", help="no progress bar")

    export = command(sub, "export", "write a candidate as a standalone program file", run=True)
    export.add_argument("candidate", help=CANDIDATE_HELP)
    export.add_argument("--out", type=Path, required=True, help="the program file to write")
    export.add_argument("--force", action="store_true", help="overwrite an existing --out")

    report = command(sub, "report", "write a run's self-contained HTML report")
    report.add_argument("run", nargs="?", help="run id (default: newest)")
    report.add_argument("--out", type=Path, help="the HTML file (default: <run>/report.html)")
    report.add_argument("--watch", type=watch_seconds, nargs="?", const=10, metavar="SECONDS",
                        help="rewrite it as the run goes, looking every SECONDS (default 10; "
                        "the page reloads itself) until the run is finished or Ctrl-C")  # fmt: skip


def cmd_freeze(args: argparse.Namespace) -> int:
    from evolve.evolution.freeze import FreezeError, freeze

    store, meta = resolve(args.runs_dir, args.candidate, args.run)

    def bar(total: int) -> ProgressBar:
        return ProgressBar(total, not args.no_progress, "test")

    try:
        result = freeze(store, meta.id, data_dir=args.data_dir, cache_dir=args.cache_dir,
                        embedder=args.embedder, jobs=args.jobs, progress=bar)  # fmt: skip
    except FreezeError as exc:
        raise UsageError(str(exc)) from None
    ref = name(store, result.meta)
    if not result.scored:
        err.print(
            f"{ref} was frozen before: its stored test scores (not scored again)", highlight=False
        )
    if result.others:
        err.print(
            f"[bold red]warning: run {store.run_id} has other frozen candidates "
            f"({', '.join(result.others)}). Looking at the test scores of several candidates "
            "is selection on test: report only the first one you froze.[/]",
            highlight=False,
        )
    test = result.test
    moved = transfer(store.candidates(), of=result.meta)
    if emit(args, {"candidate": ref, "scored": result.scored, "other_frozen": result.others,
                    "test_fitness": fitness(test.row(None)), "test": test.model_dump(),
                    "transfer": moved and moved.as_json()}):  # fmt: skip
        return 0
    for line in transfer_lines(moved):
        out.print(line, markup=False, highlight=False)
    table = Table(title=f"test scores of {ref} (frozen)")
    for column in ("capability", "n", "fitness", "similarity", "hit rate"):
        table.add_column(column, justify="left" if column == "capability" else "right")
    rows = [(group_title(cap), row) for cap, row in test.by_capability.items()]
    for label, row in [*rows, ("[bold]overall", test.overall)]:
        table.add_row(label, str(row.n), fmt_score(fitness(row)),
                      fmt_score(row.metric("evidence_similarity")),
                      fmt_score(row.metric("evidence_hit_rate")))  # fmt: skip
    out.print(table)
    if test.overall.has(CEILING_KEY):
        out.print(ceiling_line(test.overall))
    if test.errors:
        out.print(f"[red]{test.errors} test questions failed[/]")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    store, meta = resolve(args.runs_dir, args.candidate, args.run)
    if meta.status != "evaluated":
        err.print(
            f"[yellow]warning:[/] {name(store, meta)} is {meta.status}, not evaluated",
            highlight=False,
        )
    text = export.export(store, meta.id, args.out, force=args.force)
    scored = read_scored_as(text)  # how its scores were made (the header's record)
    report = {
        "candidate": name(store, meta),
        "out": str(args.out),
        "source_sha256": meta.source_sha256,
        "bytes": len(text.encode()),
        "frozen": meta.frozen,
        "check": "passed",
        "scored_as": asdict(scored) if scored else None,
    }
    if not emit(args, report):
        out.print(
            f"exported {report['candidate']} to {args.out} (sandbox check passed; "
            f"{'frozen' if meta.frozen else 'not frozen'})",
            markup=False,
            highlight=False,
        )
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from evolve.evolution.report import watch, write_report

    store = open_run(args.runs_dir, args.run)
    target = args.out or store.root / "report.html"
    _regular_or_new(target)
    try:
        if args.watch is None:
            write_report(store, target)
        else:  # a line per rewrite; the last one when the run is finished
            err.print(f"watching run {store.run_id}: {escape(str(target))} (Ctrl-C stops)")
            watch(store, target, args.watch, on_write=lambda done: err.print(
                f"report {'of the finished run ' * done}rewritten", highlight=False))  # fmt: skip
    except OSError as exc:
        raise UsageError(f"cannot write {target}: {exc.strerror or exc}") from None
    except KeyboardInterrupt:
        err.print(f"stopped watching; the report stays at {escape(str(target))}")
    if not emit(args, {"run": store.run_id, "report": str(target)}):
        out.print(f"report of run {store.run_id} written to {escape(str(target))}")
    return 0


def _regular_or_new(target: Path) -> None:
    """The report replaces only a regular file (or makes a new one): a FIFO, a device, a
    symbolic link or a folder at ``target`` is refused, since an atomic rename would replace
    it with a file."""
    try:
        mode = os.lstat(target).st_mode
    except FileNotFoundError:
        return
    except OSError as exc:
        raise UsageError(f"cannot write {target}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(mode):
        kind = ("a symbolic link" if stat.S_ISLNK(mode) else "a folder" if stat.S_ISDIR(mode)
                else "a FIFO" if stat.S_ISFIFO(mode) else "a device or socket")  # fmt: skip
        raise UsageError(f"--out {target} is {kind}; the report is written only to a regular "
                         "file or a new path")  # fmt: skip


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "freeze": cmd_freeze,
    "export": cmd_export,
    "report": cmd_report,
}


def dispatch(args: argparse.Namespace) -> int:
    """Run one of :data:`COMMANDS`; the expected errors become a UsageError."""
    return run_command(COMMANDS, args, (export.ExportError,))
