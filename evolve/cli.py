"""The ``evolve`` command line: parsing, output and exit codes only.

Each command delegates to one module: ``eval`` to :mod:`evolve.executor`, ``check`` to
:mod:`sandbox.check`, ``data fetch`` to :mod:`evolve.datasets.fetch`; ``run`` lives in
:mod:`evolve.cli_run` and the inspect and ship commands in :mod:`evolve.cli_inspect`, which
share this module's options, progress bar and error handling. Every expected failure
(bad flag, missing or malformed data, unreadable program) ends with one ``error:`` line on
stderr and exit status 2 — argparse's own errors included (:class:`Parser`); numeric flags are
checked by the shared argparse types (:data:`positive_int`, :data:`probability`, ...) and
program paths by :func:`read_program`; nothing computed before the failure is lost, because
stage outputs are stored as they are produced. ``check`` exits 1 when a program fails a tier.
A damaged file that a command works around (:func:`evolve.models.damaged`) is one
``warning:`` line, once.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from evolve.datasets.types import CAPABILITY_NAMES, DataError
from evolve.models import DAMAGE_LOG
from evolve.models.llm import LLMError

err = Console(stderr=True, soft_wrap=True)  # an error stays one line, whatever the width
out = Console(width=None if sys.stdout.isatty() else 160)  # piped tables are not cut at 80


class UsageError(Exception):
    """A bad flag or flag combination."""


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors are :class:`UsageError`, so a bad flag ends like every
    other expected failure: one ``error:`` line and exit status 2 (subcommands inherit it)."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see {self.prog} --help)")


def _bounded(cast: Callable[[str], Any], test: Callable[[Any], bool], what: str) -> Any:
    """An argparse ``type``: ``cast`` the text, refuse it unless ``test`` holds."""

    def parse(text: str) -> Any:
        try:
            value = cast(text)
        except ValueError:
            value = None
        if value is None or not test(value):
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}")
        return value

    return parse


# The argparse types of every command's numeric flags (one definition, shared).
positive_int = _bounded(int, lambda v: v >= 1, "an integer >= 1")
non_negative_int = _bounded(int, lambda v: v >= 0, "an integer >= 0")
non_negative_float = _bounded(float, lambda v: math.isfinite(v) and v >= 0, "a number >= 0")
probability = _bounded(float, lambda v: 0 < v <= 1, "a number in (0, 1]")


def read_program(path: Path, what: str = "program file") -> str:
    """The text of a program named on the command line; a UsageError says in one line why it
    cannot be read (missing, a directory, not UTF-8, unreadable)."""
    if path.is_dir():
        raise UsageError(f"{what} {path} is a directory, not a .py file")
    if not path.exists():
        raise UsageError(f"{what} {path} not found")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(
            f"cannot read {what} {path}: not UTF-8 text ({exc.reason} at byte {exc.start})"
        ) from None
    except OSError as exc:
        raise UsageError(f"cannot read {what} {path}: {exc.strerror or exc}") from None


class _DamageLines(logging.Handler):
    """Prints each damaged-file report of one command once, as one ``warning:`` line."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if text not in self.seen:
            self.seen.add(text)
            err.print(f"[yellow]warning:[/] {escape(text)}", highlight=False)


_DAMAGE_LINES = _DamageLines()


def default_cache_dir() -> Path:
    base = (
        os.environ.get("EVOLVE_CACHE")
        or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "prismem"
    )
    return Path(base)


def data_dir(arg: str | None) -> Path:
    value = arg or os.environ.get("EVOLVE_DATA")
    if not value:
        raise UsageError("no data directory: pass --data-dir DIR or set EVOLVE_DATA")
    path = Path(value).expanduser()
    if not path.is_dir():
        raise DataError(f"data directory {path} does not exist")
    return path


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="evolve", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    ev = sub.add_parser("eval", help="evaluate one memory program on a benchmark split")
    ev.add_argument("--program", required=True, type=Path, help="memory program file (.py)")
    ev.add_argument(
        "--split",
        default=None,
        help="BEAM: train | valid (default) | holdout | test | all | all:<size> (e.g. all:1M); "
        "LoCoMo: train | valid | test | all (default); LongMemEval: see README",
    )
    ev.add_argument(
        "--model",
        default="none",
        help="task LLM as a litellm id, or 'none' for offline retrieval-only mode",
    )
    ev.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    ev.add_argument(
        "--hit-threshold",
        type=probability,
        default=None,
        help="cosine at which an evidence message counts as retrieved (default 0.8)",
    )
    add_run_options(ev)

    from evolve import cli_run

    cli_run.add_command(sub)

    cmp_ = sub.add_parser(
        "compare", help="evaluate several programs on one split and print them side by side"
    )
    cmp_.add_argument(
        "programs", nargs="*", type=Path,
        help="program files (default: the shipped seeds and reference programs)",
    )  # fmt: skip
    cmp_.add_argument("--split", default=None, help="as for eval")
    cmp_.add_argument("--model", default="none", help="task LLM (litellm id) or 'none'")
    cmp_.add_argument("--json", action="store_true", help="print one JSON object")
    add_run_options(cmp_)

    chk = sub.add_parser("check", help="run the sandbox's four tiers on a program file")
    chk.add_argument("file", type=Path, help="memory program file (.py)")
    chk.add_argument("--parent", type=Path, help="the program it was patched from")
    chk.add_argument("--json", action="store_true", help="print one JSON object")

    from evolve import cli_inspect

    cli_inspect.add_commands(sub)

    data = sub.add_parser("data", help="benchmark data")
    data_sub = data.add_subparsers(dest="data_command", required=True)
    fetch = data_sub.add_parser("fetch", help="download a benchmark release into the data dir")
    fetch.add_argument("bench", choices=["beam"])
    fetch.add_argument("--data-dir", help="benchmark data root (default: $EVOLVE_DATA)")
    fetch.add_argument("--sizes", default="100K,1M", help="comma-separated: 100K,500K,1M,10M")
    return parser


def add_run_options(parser: argparse.ArgumentParser) -> None:
    """Options shared by the commands that evaluate programs on a benchmark."""
    from evolve.datasets.benches import BENCHES

    parser.add_argument("--bench", default="beam", choices=list(BENCHES), help="benchmark")
    parser.add_argument(
        "--judge",
        default=None,
        help="judge LLM (litellm id) that scores answers by the benchmark's protocol; "
        "without one only the retrieval metrics are scored",
    )
    parser.add_argument(
        "--api-base", default=None, help="API base URL of the models (e.g. a local server)"
    )
    parser.add_argument(
        "--task-max-tokens",
        type=positive_int,
        default=1024,
        help="reply limit of the task model per call (default 1024)",
    )
    parser.add_argument("--data-dir", help="benchmark data root (default: $EVOLVE_DATA)")
    parser.add_argument("--jobs", type=positive_int, default=2, help="worker processes (default 2)")
    parser.add_argument(
        "--backend",
        default="local",
        choices=["local", "ray"],
        help="where conversations are evaluated: local processes (default) or a Ray cluster",
    )
    parser.add_argument(
        "--ray-address",
        default=None,
        help="Ray cluster to join (e.g. auto or ray://head:10001); default: a local instance",
    )
    parser.add_argument(
        "--runs-dir",
        type=Path,
        default=Path(os.environ.get("EVOLVE_RUNS", "programs")),
        help="where run folders go (default programs/ or $EVOLVE_RUNS)",
    )
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="stage, embedding and LLM caches (default ~/.cache/prismem or $EVOLVE_CACHE)",
    )
    parser.add_argument(
        "--embedder",
        default="minilm",
        choices=["minilm", "hashing"],
        help="'hashing' is a test double: never use it for real results",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    _DAMAGE_LINES.seen.clear()
    if _DAMAGE_LINES not in DAMAGE_LOG.handlers:
        DAMAGE_LOG.addHandler(_DAMAGE_LINES)
    try:
        args = parser.parse_args(argv)
        if args.command == "eval":
            return cmd_eval(args)
        if args.command == "check":
            return cmd_check(args)
        if args.command == "compare":
            return cmd_compare(args)
        if args.command == "run":
            from evolve import cli_run

            return cli_run.cmd_run(args)
        if args.command != "data":
            from evolve import cli_inspect

            return cli_inspect.dispatch(args)
        return cmd_fetch(args)
    except (UsageError, DataError) as exc:
        err.print(f"[red]error:[/] {escape(str(exc))}", highlight=False, markup=True)
        return 2
    except LLMError as exc:
        err.print(f"[red]error:[/] {escape(str(exc))} (stage outputs computed so far are kept in "
                  "the cache)", highlight=False, markup=True)  # fmt: skip
        return 2
    except KeyboardInterrupt:
        err.print("interrupted: stage outputs computed so far are kept in the cache")
        return 130


def task_config(args: argparse.Namespace) -> Any:
    """The task model from ``--model``, ``--api-base`` and ``--task-max-tokens`` (None: offline)."""
    if args.model.lower() in ("none", ""):
        return None
    from evolve.models.llm import ModelConfig

    return ModelConfig(model=args.model, api_base=args.api_base, max_tokens=args.task_max_tokens)


def backend_of(args: argparse.Namespace) -> Any:
    """The evaluation backend of ``--backend/--jobs/--ray-address`` (UsageError if unusable)."""
    from evolve.distributed import make_backend

    try:
        return make_backend(args.backend, args.jobs, args.ray_address)
    except RuntimeError as exc:
        raise UsageError(str(exc)) from None


def judge_client(name: str | None, api_base: str | None, cache: Path) -> Any:
    """The LLM client of the judge role (None without a judge); calls logged and cached."""
    if name is None or name.lower() in ("none", ""):
        return None
    from evolve.models.llm import LLMClient, ModelConfig, Models

    judge = ModelConfig(model=name, api_base=api_base, max_tokens=256)
    return LLMClient(Models(judge=judge), log_path=cache / "llm-calls.sqlite",
                     cache_path=cache / "llm-cache.sqlite")  # fmt: skip


def cmd_eval(args: argparse.Namespace) -> int:
    from evolve.datasets.benches import load_taskset
    from evolve.executor import OFFLINE_MODE, EvalError, evaluate, write_run
    from evolve.trace import first_error
    from evolve.worker import WorkerConfig

    read_program(args.program)
    root = data_dir(args.data_dir)
    try:
        tasks = load_taskset(args.bench, root, args.split)
    except DataError as exc:
        if "evolve data fetch beam" not in str(exc) or not _confirm_fetch(exc):
            raise
        from evolve.datasets.fetch import fetch_beam

        fetch_beam(root, ["100K", "1M"])
        tasks = load_taskset(args.bench, root, args.split)
    task_model = task_config(args)
    if task_model is None:
        err.print(
            f"[bold yellow]no task model configured — {OFFLINE_MODE}:[/] extraction keeps "
            "one unit per message, the question is the query, answers are skipped"
        )
    if args.embedder == "hashing":
        err.print("[bold red]embedder 'hashing' is a test double: scores are not meaningful[/]")
    cache = args.cache_dir or default_cache_dir()
    config = WorkerConfig(cache_dir=str(cache), task_model=task_model, embedder=args.embedder)
    judge = judge_client(args.judge, args.api_base, Path(cache))
    if judge is not None and task_model is None:
        err.print("[yellow]--judge has nothing to score without a task model (--model)[/]")
    elif judge is None and task_model is not None:
        err.print("[yellow]no judge configured (--judge): answers are not scored[/]")

    with ProgressBar(len(tasks.questions), not args.no_progress) as advance:
        try:
            report = evaluate(
                args.program,
                tasks,
                config,
                jobs=args.jobs,
                on_progress=advance,
                hit_threshold=args.hit_threshold,
                judge=judge,
                backend=backend_of(args),
            )
        except EvalError as exc:
            raise UsageError(str(exc)) from None
    run_id = f"eval-{time.strftime('%Y%m%d-%H%M%S')}-{report.meta['program_hash'][:8]}"
    report.meta["traces"] = str(args.runs_dir / run_id / "questions.jsonl")
    write_run(report, args.runs_dir / run_id)
    if args.json:
        print(json.dumps(report.as_json(), indent=2))
    else:
        _print_report(report.as_json())
    failed = report.meta["errors"]
    if failed and failed == report.meta["questions"]:
        first = first_error(report.traces)
        err.print(f"[red]error:[/] every question failed; first: {escape(first)}", highlight=False)
        return 1
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from evolve.compare import CHARS_PER_TOKEN, compare_programs, reference_programs
    from evolve.datasets.benches import load_taskset
    from evolve.executor import EvalError
    from evolve.worker import WorkerConfig

    paths = args.programs or reference_programs()
    if not paths:
        raise UsageError("nothing to compare: name program files (no shipped seed was found)")
    for path in paths:
        read_program(path)
    tasks = load_taskset(args.bench, data_dir(args.data_dir), args.split)
    task_model = task_config(args)
    cache = args.cache_dir or default_cache_dir()
    config = WorkerConfig(cache_dir=str(cache), task_model=task_model, embedder=args.embedder)
    if task_model is None:
        err.print("[bold yellow]no task model configured — offline: retrieval-only[/]")
    total = len(tasks.questions) * len(paths)
    with ProgressBar(total, not args.no_progress, "comparing") as advance:
        try:
            judge = judge_client(args.judge, args.api_base, Path(cache))
            rows = compare_programs(paths, tasks, config, on_progress=advance, judge=judge,
                                    backend=backend_of(args))  # fmt: skip
        except EvalError as exc:
            raise UsageError(str(exc)) from None
    if args.json:
        print(json.dumps({"bench": tasks.bench, "split": tasks.split, "programs": rows}, indent=2))
        return 0
    caps = [c for c in CAPABILITY_NAMES if any(c in r["by_capability"] for r in rows)]
    table = Table(title=f"{tasks.bench} {tasks.split}: {len(tasks.questions)} questions · fitness "
                  f"= mean of evidence similarity and hit rate · tokens ≈ characters / "
                  f"{CHARS_PER_TOKEN}")  # fmt: skip
    for column in ("program", "fitness", *caps, "similarity", "hit rate", "ctx chars",
                   "ctx tokens", "retrieve p50 ms", "p95 ms"):  # fmt: skip
        table.add_column(column, justify="left" if column == "program" else "right")
    for r in rows:
        table.add_row(
            Path(r["program"]).stem, _fmt(r["fitness"]),
            *(_fmt(r["by_capability"].get(c)) for c in caps),
            _fmt(r["evidence_similarity"]), _fmt(r["evidence_hit_rate"]),
            _num(r["context_chars"]), _num(r["context_tokens"]),
            _num(r["retrieve_ms_p50"], 1), _num(r["retrieve_ms_p95"], 1),
        )  # fmt: skip
    out.print(table)
    return 0


def _num(value: float | None, digits: int = 0) -> str:
    return "—" if value is None else f"{value:,.{digits}f}"


def cmd_check(args: argparse.Namespace) -> int:
    from sandbox.check import check_program

    parent = read_program(args.parent, "parent program") if args.parent else None
    report = check_program(read_program(args.file), str(args.file), parent)
    if args.json:
        print(json.dumps(report.as_json(), indent=2))
        return 0 if report.passed else 1
    table = Table(title=f"sandbox check of {args.file}")
    for column in ("tier", "result", "seconds", "first error"):
        table.add_column(column)
    for t in report.tiers:
        error = f"{t.rule}: {t.error}" if t.error else ""
        verdict = "[green]pass[/]" if t.passed else "[red]FAIL[/]"
        table.add_row(f"{t.tier} {t.name}", verdict, f"{t.seconds:.2f}", error)
    out.print(table)
    if report.isolation:
        out.print("isolation: " + ", ".join(f"{k} {v}" for k, v in report.isolation.items()))
    out.print(
        "[green]passed[/]" if report.passed else f"[red]{report.repair_text()}[/]", highlight=False
    )
    return 0 if report.passed else 1


def cmd_fetch(args: argparse.Namespace) -> int:
    from evolve.datasets.fetch import fetch_beam

    root = Path(args.data_dir or os.environ.get("EVOLVE_DATA") or "")
    if not str(root) or str(root) == ".":
        raise UsageError("no data directory: pass --data-dir DIR or set EVOLVE_DATA")
    sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    fetch_beam(root, sizes)
    err.print(f"BEAM {', '.join(sizes)} written under {root / 'beam'}")
    return 0


def _confirm_fetch(exc: DataError) -> bool:
    """Offer to download BEAM when it is missing (interactive terminals only)."""
    if not sys.stdin.isatty():
        return False
    err.print(f"[yellow]{escape(str(exc))}[/]", highlight=False)
    return input("Download BEAM 100K and 1M now? [y/N] ").strip().lower() in ("y", "yes")


class ProgressBar:
    """A rich progress bar (or nothing), as a context manager yielding
    ``advance(n, description=None)``."""

    def __init__(self, total: int, enabled: bool, label: str = "evaluating") -> None:
        self.total, self.enabled, self.label = total, enabled, label
        self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TimeElapsedColumn(), console=err, transient=True)  # fmt: skip

    def __enter__(self) -> Any:
        if not self.enabled:
            return lambda n, description=None: None
        self.bar.start()
        task = self.bar.add_task(self.label, total=self.total)

        def advance(n: int, description: str | None = None) -> None:
            self.bar.update(task, advance=n, description=description or self.label)

        return advance

    def __exit__(self, *exc: object) -> None:
        if self.enabled:
            self.bar.stop()


def _fmt(value: Any) -> str:
    return "—" if value is None else f"{value:.3f}"


def _score_table(title: str, label: str, rows: dict[str, Any], metrics: list[str]) -> Table:
    table = Table(title=title)
    table.add_column(label)
    table.add_column("n", justify="right")
    for m in metrics:
        table.add_column(m.replace("_", " "), justify="right")
    for name, row in rows.items():
        table.add_row(name, str(row["n"]), *(_fmt(row.get(m)) for m in metrics))
    return table


def _headline(block: dict[str, Any], prefix: str = "") -> list[str]:
    """The benchmark's headline numbers: overall scores and accuracies, one line each."""
    lines = []
    for key, value in block.items():
        if isinstance(value, dict):
            lines += _headline(value, f"{prefix}{key} ")
        elif isinstance(value, float) and ("overall" in key or "accuracy" in key):
            lines.append(f"{prefix}{key.replace('_', ' ')}: {value:.3f}")
    return lines


def _print_report(report: dict[str, Any]) -> None:
    meta, scores = report["meta"], report["scores"]
    out.print(f"[bold]{meta['mode']}[/] · {meta['bench']} {meta['split']} · "
              f"{meta['questions']} questions in {meta['conversations']} conversations · "
              f"program {meta['program']} ({meta['program_hash'][:8]})")  # fmt: skip
    metrics = meta["metrics"]
    by_cap = {f"{c} {CAPABILITY_NAMES[c]}": row for c, row in scores["by_capability"].items()}
    by_cap["[bold]overall"] = scores["overall"]
    threshold = f"hit threshold {meta['hit_threshold']}"
    out.print(_score_table(f"scores by capability ({threshold})", "capability", by_cap, metrics))
    out.print(_score_table(f"scores by {meta['bench']} type", "type", scores["by_type"], metrics))
    for line in _headline(scores.get("headline") or {}):
        out.print(line)
    if meta["mode"] != "offline: retrieval-only":
        out.print(f"judge: {meta['judge']['judge'] or 'none'} — {meta['judge']['note']}")
    stages = ", ".join(f"{s} {c['computed']}/{c['reused']}"
                       + (f" ({c['invalid']} bad entries recomputed)" if c.get("invalid") else "")
                       for s, c in report["stages"].items())  # fmt: skip
    out.print(f"stages (computed/reused): {stages}")
    if meta["errors"]:
        out.print(f"[red]{meta['errors']} questions failed[/] — see {meta.get('traces')}")
    out.print(f"traces: {meta.get('traces')}")


if __name__ == "__main__":  # `python -m evolve.cli`: the package's module, so one UsageError
    from evolve.cli import main as package_main

    sys.exit(package_main())
