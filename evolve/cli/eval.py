"""The ``evolve`` commands that evaluate programs: ``eval``, ``compare`` and ``check``.

Each command delegates to one module: ``eval`` to :mod:`evolve.evaluation.executor` (and, when
BEAM is missing on an interactive terminal, offers :mod:`evolve.datasets.fetch`), ``compare``
to :mod:`evolve.compare`, ``check`` to :mod:`sandbox.check`; what is left here is parsing their
flags and rendering their results. Errors follow :mod:`evolve.cli.common`: one ``error:`` line
and exit status 2; ``check`` exits 1 when a program fails a tier, ``eval`` when every question
failed. The engine modules are imported inside the command that runs them, so that the
commands that only read a run (``evolve runs``, ...) do not load the engine.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.markup import escape
from rich.table import Table

from evolve.benches.registry import bench
from evolve.cli.common import (
    ProgressBar,
    UsageError,
    add_run_options,
    conversation_count,
    data_dir,
    default_cache_dir,
    err,
    llm_flags,
    model_flag,
    out,
    probability,
    read_program,
    split_name,
    task_config,
)
from evolve.datasets.types import GROUPS, DataError, TaskSet, group_title
from evolve.evaluation.distributed import make_backend
from evolve.models.clients import role_client
from evolve.scoring import fmt_score

if TYPE_CHECKING:
    from evolve.compare import ProgramRow
    from evolve.evaluation.report import EvalReport, MetricRow
    from evolve.evaluation.setup import EvalSetup

HEADLINE_WORDS = ("overall", "accuracy")  # a headline number whose name holds one is shown


def add_eval(sub: Any) -> None:
    """Register ``eval`` on the ``evolve`` parser's subparsers."""
    ev = sub.add_parser("eval", help="evaluate one memory program on a benchmark split")
    ev.add_argument("--program", required=True, type=Path, help="memory program file (.py)")
    ev.add_argument(
        "--split",
        type=split_name,
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
    add_slice(ev)
    ev.add_argument(
        "--hit-threshold",
        type=probability,
        default=None,
        help="cosine at which an evidence message counts as retrieved (default 0.8)",
    )
    add_run_options(ev)


def add_compare_check(sub: Any) -> None:
    """Register ``compare`` and ``check``."""
    cmp_ = sub.add_parser(
        "compare", help="evaluate several programs on one split and print them side by side"
    )
    cmp_.add_argument(
        "programs", nargs="*", type=Path,
        help="program files (default: the shipped seeds and reference programs)",
    )  # fmt: skip
    cmp_.add_argument("--split", type=split_name, default=None, help="as for eval")
    cmp_.add_argument("--model", default="none", help="task LLM (litellm id) or 'none'")
    cmp_.add_argument("--json", action="store_true", help="print one JSON object")
    add_slice(cmp_)
    add_run_options(cmp_)

    chk = sub.add_parser("check", help="run the sandbox's four tiers on a program file")
    chk.add_argument("file", type=Path, help="memory program file (.py)")
    chk.add_argument("--parent", type=Path, help="the program it was patched from")
    chk.add_argument("--json", action="store_true", help="print one JSON object")


def add_slice(parser: argparse.ArgumentParser) -> None:
    """``--conversations``: score only the split's first N conversations (a run's slice)."""
    parser.add_argument(
        "--conversations", type=conversation_count, default="all",
        help="read only the split's first N conversations, or 'all' (default), e.g. to score "
        "the slice a default run read",
    )  # fmt: skip


def sliced(tasks: TaskSet, given: int | str) -> TaskSet:
    """``tasks`` cut to ``--conversations`` (said on stderr when it cuts); a count above what
    the split holds is a UsageError (it would silently read the whole split)."""
    if given == "all":
        return tasks
    if int(given) > len(tasks.conversations):
        raise UsageError(f"--conversations {given}: {tasks.bench} {tasks.split} holds "
                         f"{len(tasks.conversations)} conversations (use at most that, or "
                         "'all')")  # fmt: skip
    kept = tasks.first(int(given))
    err.print(f"{tasks.bench} {tasks.split}: its first {len(kept.conversations)} of "
              f"{len(tasks.conversations)} conversations ({len(kept.questions)} questions)",
              highlight=False)  # fmt: skip
    return kept


def backend_of(args: argparse.Namespace) -> Any:
    """The evaluation backend of ``--backend/--jobs/--ray-address`` (UsageError if unusable)."""
    try:
        return make_backend(args.backend, args.jobs, args.ray_address)
    except RuntimeError as exc:
        raise UsageError(str(exc)) from None


def judge_client(name: str | None, api_base: str | None, setup: EvalSetup) -> Any:
    """The LLM client of the judge role (None without a judge); calls logged and cached beside
    the task model's, under the same limits (``setup``)."""
    judge = model_flag(name, api_base, max_tokens=256)
    cache = Path(setup.cache_dir)
    return role_client("judge", judge, log_path=cache / "llm-calls.sqlite",
                       cache_path=cache / "llm-cache.sqlite", concurrency=setup.llm_concurrency,
                       timeout=setup.llm_timeout)  # fmt: skip


def cmd_eval(args: argparse.Namespace) -> int:
    from evolve.evaluation.executor import EvalError, run_eval, write_run
    from evolve.evaluation.identity import OFFLINE_MODE
    from evolve.evaluation.setup import EvalSetup, reset_endpoint
    from evolve.trace import first_error

    read_program(args.program)
    root = data_dir(args.data_dir)
    try:
        tasks = bench(args.bench).load_taskset(root, args.split)
    except DataError as exc:
        if "evolve data fetch beam" not in str(exc) or not _confirm_fetch(exc):
            raise
        from evolve.datasets.fetch import fetch_beam

        fetch_beam(root, ["100K", "1M"])
        tasks = bench(args.bench).load_taskset(root, args.split)
    tasks = sliced(tasks, args.conversations)
    args.jobs = min(args.jobs, max(1, len(tasks.conversations)))  # a worker per conversation
    task_model = task_config(args)
    if task_model is None:
        err.print(
            f"[bold yellow]no task model configured — {OFFLINE_MODE}:[/] extraction keeps "
            "one unit per message, the question is the query, answers are skipped"
        )
    if args.embedder == "hashing":
        err.print("[bold red]embedder 'hashing' is a test double: scores are not meaningful[/]")
    cache = args.cache_dir or default_cache_dir()
    setup = EvalSetup(cache_dir=str(cache), task_model=task_model, embedder=args.embedder,
                      **llm_flags(args))  # fmt: skip
    reset_endpoint(setup)  # a breaker an earlier command tripped: the endpoint may be back
    judge = judge_client(args.judge, args.api_base, setup)
    if judge is not None and task_model is None:
        err.print("[yellow]--judge has nothing to score without a task model (--model)[/]")
    elif judge is None and task_model is not None:
        err.print("[bold yellow]no judge configured (--judge): answers are scored WITHOUT a "
                  "judge (token F1 against the gold answer)[/]")  # fmt: skip

    with ProgressBar(len(tasks.questions), not args.no_progress) as advance:
        try:
            report = run_eval(
                args.program,
                tasks,
                setup,
                jobs=args.jobs,
                on_progress=advance,
                hit_threshold=args.hit_threshold,
                judge=judge,
                backend=backend_of(args),
                judge_variant=args.judge_variant,
            )
        except EvalError as exc:
            raise UsageError(str(exc)) from None
    run_id = f"eval-{time.strftime('%Y%m%d-%H%M%S')}-{report.meta.program_hash[:8]}"
    traces = str(args.runs_dir / run_id / "questions.jsonl")
    report.meta = report.meta.model_copy(update={"traces": traces})
    write_run(report, args.runs_dir / run_id)
    if args.json:
        print(json.dumps(report.as_json(), indent=2))
    else:
        _print_report(report)
    failed = report.meta.errors
    if failed and failed == report.meta.questions:
        first = first_error(report.traces)
        err.print(f"[red]error:[/] every question failed; first: {escape(first)}", highlight=False)
        return 1
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from evolve.compare import CHARS_PER_TOKEN, compare_programs, reference_programs
    from evolve.evaluation.executor import EvalError
    from evolve.evaluation.setup import EvalSetup, reset_endpoint

    paths = args.programs or reference_programs()
    if not paths:
        raise UsageError("nothing to compare: name program files (no shipped seed was found)")
    for path in paths:
        read_program(path)
    tasks = bench(args.bench).load_taskset(data_dir(args.data_dir), args.split)
    tasks = sliced(tasks, args.conversations)
    task_model = task_config(args)
    cache = args.cache_dir or default_cache_dir()
    setup = EvalSetup(cache_dir=str(cache), task_model=task_model, embedder=args.embedder,
                      **llm_flags(args))  # fmt: skip
    reset_endpoint(setup)  # a breaker an earlier command tripped: the endpoint may be back
    if task_model is None:
        err.print("[bold yellow]no task model configured — offline: retrieval-only[/]")
    total = len(tasks.questions) * len(paths)
    with ProgressBar(total, not args.no_progress, "comparing") as advance:
        try:
            judge = judge_client(args.judge, args.api_base, setup)
            rows = compare_programs(paths, tasks, setup, on_progress=advance, judge=judge,
                                    backend=backend_of(args),
                                    judge_variant=args.judge_variant)  # fmt: skip
        except EvalError as exc:
            raise UsageError(str(exc)) from None
    if args.json:
        programs = [r.as_json() for r in rows]
        print(json.dumps({"bench": tasks.bench, "split": tasks.split, "programs": programs},
                         indent=2))  # fmt: skip
        return _say_failures(rows, len(tasks.questions))
    caps = [c for c in GROUPS if any(c in r.by_capability for r in rows)]
    mode = rows[0].fitness_mode if rows else None
    name, definition = (mode.name, mode.definition) if mode else ("retrieval", "")
    table = Table(title=f"{tasks.bench} {tasks.split}: {len(tasks.questions)} questions · fitness "
                  f"{name} = {definition} · tokens ≈ characters / {CHARS_PER_TOKEN}")  # fmt: skip
    failures = any(r.errors for r in rows)
    for column in ("program", "fitness", *caps, "retrieval fitness", "ceiling", "similarity",
                   "hit rate", "ctx chars", "ctx tokens", "retrieve p50 ms", "p95 ms",
                   *(["failed"] if failures else [])):  # fmt: skip
        table.add_column(column, justify="left" if column == "program" else "right")
    for r in rows:
        table.add_row(
            Path(r.program).stem, fmt_score(r.fitness),
            *(fmt_score(r.by_capability.get(c)) for c in caps),
            fmt_score(r.retrieval_fitness), fmt_score(r.ceiling),
            fmt_score(r.evidence_similarity), fmt_score(r.evidence_hit_rate),
            _num(r.context_chars), _num(r.context_tokens),
            _num(r.retrieve_ms_p50, 1), _num(r.retrieve_ms_p95, 1),
            *([f"[red]{r.errors}[/]" if r.errors else "0"] if failures else []),
        )  # fmt: skip
    out.print(table)
    return _say_failures(rows, len(tasks.questions))


def _say_failures(rows: list[ProgramRow], questions: int) -> int:
    """One line per program that failed questions (they count as 0 in its figures); exit
    status 1 when a program failed every question, else 0."""
    for r in rows:
        if r.errors:
            err.print(f"[red]{Path(r.program).name}: {r.errors} of {questions} questions "
                      "failed[/] (each counts as 0 in its figures); first: "
                      f"{escape(r.first_error or '')}", highlight=False)  # fmt: skip
    return 1 if any(r.errors and r.errors == questions for r in rows) else 0


def _num(value: float | None, digits: int = 0) -> str:
    return "—" if value is None else f"{value:,.{digits}f}"


def cmd_check(args: argparse.Namespace) -> int:
    from sandbox.check import check_program
    from sandbox.printable import printable  # a program's text: no terminal control, no markup

    parent = read_program(args.parent, "parent program") if args.parent else None
    report = check_program(read_program(args.file), str(args.file), parent)
    if args.json:
        print(json.dumps(report.as_json(), indent=2))
        return 0 if report.passed else 1
    table = Table(title=f"sandbox check of {args.file}")
    for column in ("tier", "result", "seconds", "first error"):
        table.add_column(column)
    for t in report.tiers:
        error = escape(printable(f"{t.rule}: {t.error}")) if t.error else ""
        verdict = "[green]pass[/]" if t.passed else "[red]FAIL[/]"
        table.add_row(f"{t.tier} {t.name}", verdict, f"{t.seconds:.2f}", error)
    out.print(table)
    if report.isolation:
        out.print("isolation: " + ", ".join(f"{k} {v}" for k, v in report.isolation.items()))
    repair = escape(printable(report.repair_text()))
    out.print("[green]passed[/]" if report.passed else f"[red]{repair}[/]", highlight=False)
    return 0 if report.passed else 1


def _confirm_fetch(exc: DataError) -> bool:
    """Offer to download BEAM when it is missing (interactive terminals only)."""
    if not sys.stdin.isatty():
        return False
    err.print(f"[yellow]{escape(str(exc))}[/]", highlight=False)
    return input("Download BEAM 100K and 1M now? [y/N] ").strip().lower() in ("y", "yes")


def _score_table(title: str, label: str, rows: dict[str, MetricRow], metrics: list[str]) -> Table:
    table = Table(title=title)
    table.add_column(label)
    table.add_column("n", justify="right")
    for m in metrics:
        table.add_column(m.replace("_", " "), justify="right")
    for name, row in rows.items():
        table.add_row(name, str(row.n), *(fmt_score(row.metric(m)) for m in metrics))
    return table


def _headline(block: dict[str, Any], prefix: str = "") -> list[str]:
    """The benchmark's headline numbers: overall scores and accuracies, one line each."""
    lines = []
    for key, value in block.items():
        if isinstance(value, dict):
            lines += _headline(value, f"{prefix}{key} ")
        elif isinstance(value, float) and any(word in key for word in HEADLINE_WORDS):
            lines.append(f"{prefix}{key.replace('_', ' ')}: {fmt_score(value)}")
    return lines


def ceiling_line(overall: MetricRow) -> str:
    """``coverage 0.71 of a possible 0.93``: the evidence coverage beside its ceiling."""
    covered, top = fmt_score(overall.metric("evidence_coverage")), fmt_score(overall.ceiling)
    return f"coverage {covered} of a possible {top} (the gold evidence packed into the budget)"


def _print_report(report: EvalReport) -> None:
    from evolve.evaluation.identity import OFFLINE_MODE
    from evolve.evaluation.report import FitnessMode

    meta, scores = report.meta, report.scores
    out.print(f"[bold]{meta.mode}[/] · {meta.bench} {meta.split} · "
              f"{meta.questions} questions in {meta.conversations} conversations · "
              f"program {meta.program} ({meta.program_hash[:8]})")  # fmt: skip
    metrics = meta.metrics
    by_cap = {group_title(c): row for c, row in scores.by_capability.items()}
    by_cap["[bold]overall"] = scores.overall
    threshold = f"hit threshold {meta.hit_threshold}"
    out.print(_score_table(f"scores by capability ({threshold})", "capability", by_cap, metrics))
    out.print(_score_table(f"scores by {meta.bench} type", "type", scores.by_type, metrics))
    for line in _headline(scores.headline or {}):
        out.print(line)
    if meta.mode != OFFLINE_MODE:
        out.print(f"judge: {meta.judge.judge or 'none'} — {meta.judge.note}")
    fit = meta.fitness or FitnessMode()
    out.print(f"fitness {fit.name} v{fit.version} ({fit.coverage}): {fit.definition}")
    out.print(ceiling_line(scores.overall))
    steps = ", ".join(f"{s} {c['computed']}/{c['reused']}"
                      + (f" ({c['invalid']} bad entries recomputed)" if c.get("invalid") else "")
                      for s, c in report.steps.items())  # fmt: skip
    out.print(f"steps (computed/reused): {steps}")
    for conv, why in meta.unstored_memory.items():
        out.print(f"[yellow]memory of {escape(conv)} not stored, rebuilt every evaluation:[/] "
                  f"{escape(why)}")  # fmt: skip
    if split := meta.time:
        out.print(f"time (s, summed over conversations): model wait {split['model_wait']:.1f}, "
                  f"sandbox {split['sandbox']:.1f}, local {split['local']:.1f}; "
                  f"judging {split['judging']:.1f}")  # fmt: skip
    if meta.errors:
        out.print(f"[red]{meta.errors} questions failed[/] — see {meta.traces}")
    out.print(f"traces: {meta.traces}")
