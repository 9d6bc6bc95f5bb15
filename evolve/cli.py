"""The ``evolve`` command line: parsing, output and exit codes only.

Each command delegates to one module: ``eval`` to :mod:`evolve.executor`, ``check`` to
:mod:`sandbox.check`, ``data fetch`` to :mod:`evolve.datasets.fetch`. Every expected failure
(bad flag, missing or malformed data, unreadable program) ends with one ``error:`` line on
stderr and exit status 2; nothing computed before the failure is lost, because stage outputs
are stored as they are produced. ``check`` exits 1 when a program fails a tier.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from evolve.datasets.types import CAPABILITY_NAMES, DataError

err = Console(stderr=True, soft_wrap=True)  # an error stays one line, whatever the width
out = Console()


class UsageError(Exception):
    """A bad flag or flag combination."""


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
    parser = argparse.ArgumentParser(prog="evolve", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    ev = sub.add_parser("eval", help="evaluate one memory program on a benchmark split")
    ev.add_argument("--program", required=True, type=Path, help="memory program file (.py)")
    ev.add_argument(
        "--split",
        default="valid",
        help="train | valid | holdout | test | all | all:<size> (e.g. all:1M)",
    )
    ev.add_argument(
        "--model",
        default="none",
        help="task LLM as a litellm id, or 'none' for offline retrieval-only mode",
    )
    ev.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    ev.add_argument(
        "--hit-threshold",
        type=float,
        default=None,
        help="cosine at which an evidence message counts as retrieved (default 0.8)",
    )
    _add_run_options(ev)

    run = sub.add_parser("run", help="evolve a memory program (offline: its tunable constants)")
    run.add_argument(
        "--seed",
        type=Path,
        default=None,
        help="starting program (default seeds/hybrid.py offline, seeds/simple.py with a coder)",
    )
    run.add_argument(
        "--model", default="none", help="task LLM as a litellm id, or 'none' (offline retrieval)"
    )
    run.add_argument(
        "--coder",
        default=None,
        help="coding LLM as a litellm id (default: --model); 'none' = the offline proposer",
    )
    run.add_argument("--api-base", default=None, help="API base URL for the models (local servers)")
    run.add_argument(
        "--rounds",
        default=None,
        help="rounds of cold start, refinement, integration (default 2,6,2); with "
        "--resume, raises the run's caps",
    )
    run.add_argument("--max-usd", type=float, default=None, help="stop before spending more USD")
    run.add_argument("--max-tokens", type=int, default=None, help="stop before more LLM tokens")
    run.add_argument(
        "--dry-run", action="store_true", help="print the work and cost estimate; run nothing"
    )
    run.add_argument(
        "--conversations",
        type=int,
        default=None,
        help="use only the first N conversations of train and valid (quick runs)",
    )
    run.add_argument("--resume", metavar="RUN_ID", help="continue an interrupted or capped run")
    _add_run_options(run)

    chk = sub.add_parser("check", help="run the sandbox's four tiers on a program file")
    chk.add_argument("file", type=Path, help="memory program file (.py)")
    chk.add_argument("--parent", type=Path, help="the program it was patched from")
    chk.add_argument("--json", action="store_true", help="print one JSON object")

    from evolve import runs_cli

    runs_cli.add_commands(sub)

    data = sub.add_parser("data", help="benchmark data")
    data_sub = data.add_subparsers(dest="data_command", required=True)
    fetch = data_sub.add_parser("fetch", help="download a benchmark release into the data dir")
    fetch.add_argument("bench", choices=["beam"])
    fetch.add_argument("--data-dir", help="benchmark data root (default: $EVOLVE_DATA)")
    fetch.add_argument("--sizes", default="100K,1M", help="comma-separated: 100K,500K,1M,10M")
    return parser


def _add_run_options(parser: argparse.ArgumentParser) -> None:
    """Options shared by the commands that evaluate programs on a benchmark."""
    parser.add_argument("--bench", default="beam", choices=["beam"], help="benchmark")
    parser.add_argument("--data-dir", help="benchmark data root (default: $EVOLVE_DATA)")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes (default 2)")
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
    args = parser.parse_args(argv)
    try:
        if args.command == "eval":
            return cmd_eval(args)
        if args.command == "check":
            return cmd_check(args)
        if args.command == "run":
            return cmd_run(args)
        if args.command != "data":
            from evolve import runs_cli

            return runs_cli.dispatch(args)
        return cmd_fetch(args)
    except (UsageError, DataError) as exc:
        err.print(f"[red]error:[/] {escape(str(exc))}", highlight=False, markup=True)
        return 2
    except KeyboardInterrupt:
        err.print("interrupted: stage outputs computed so far are kept in the cache")
        return 130


def cmd_eval(args: argparse.Namespace) -> int:
    from evolve.datasets.beam import load_taskset
    from evolve.executor import OFFLINE_MODE, EvalError, evaluate, write_run
    from evolve.models.llm import ModelConfig
    from evolve.worker import WorkerConfig

    if args.jobs < 1:
        raise UsageError("--jobs must be at least 1")
    if not args.program.is_file():
        raise UsageError(f"program file {args.program} not found")
    root = data_dir(args.data_dir)
    try:
        tasks = load_taskset(root, args.split)
    except DataError as exc:
        if "evolve data fetch beam" not in str(exc) or not _confirm_fetch(exc):
            raise
        from evolve.datasets.fetch import fetch_beam

        fetch_beam(root, ["100K", "1M"])
        tasks = load_taskset(root, args.split)
    task_model = None if args.model.lower() in ("none", "") else ModelConfig(model=args.model)
    if task_model is None:
        err.print(
            f"[bold yellow]no task model configured — {OFFLINE_MODE}:[/] extraction keeps "
            "one unit per message, the question is the query, answers are skipped"
        )
    if args.embedder == "hashing":
        err.print("[bold red]embedder 'hashing' is a test double: scores are not meaningful[/]")
    cache = args.cache_dir or default_cache_dir()
    config = WorkerConfig(cache_dir=str(cache), task_model=task_model, embedder=args.embedder)

    with _progress(len(tasks.questions), not args.no_progress) as advance:
        try:
            report = evaluate(
                args.program,
                tasks,
                config,
                jobs=args.jobs,
                on_progress=advance,
                hit_threshold=args.hit_threshold,
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
        first = next(t["error"] for t in report.traces if t.get("error"))
        err.print(f"[red]error:[/] every question failed; first: {escape(first)}", highlight=False)
        return 1
    return 0


def _model(name: str | None, api_base: str | None, **params: Any) -> dict[str, Any] | None:
    if name is None or name.lower() in ("none", ""):
        return None
    from evolve.models.llm import ModelConfig

    return ModelConfig(model=name, api_base=api_base, **params).model_dump()


def _run_config(args: argparse.Namespace) -> Any:
    """The RunConfig of a new run, or of the resumed one with this invocation's raised caps."""
    from evolve.evolution.loop import RunConfig

    if args.jobs < 1:
        raise UsageError("--jobs must be at least 1")
    for flag in ("max_usd", "max_tokens"):
        value = getattr(args, flag)
        if value is not None and not value >= 0:
            raise UsageError(f"--{flag.replace('_', '-')} must be a non-negative number")
    try:
        counts = [int(x) for x in (args.rounds or "2,6,2").split(",")]
    except ValueError:
        counts = []
    if len(counts) != 3 or min(counts) < 0:
        raise UsageError("--rounds takes three non-negative numbers, e.g. 2,6,2")
    rounds = dict(zip(("cold_start", "refinement", "integration"), counts, strict=True))
    caps: dict[str, Any] = {
        k: getattr(args, k) for k in ("max_usd", "max_tokens") if getattr(args, k) is not None
    }
    if args.resume:  # raised caps for this resumption; the manifest keeps the original ones
        config = RunConfig(**_open_run(args)[1]["config"])
        if args.rounds:
            caps["rounds"] = rounds
        return dataclasses.replace(config, **caps)
    task = _model(args.model, args.api_base)
    from evolve.evolution.coder import MAX_TOKENS

    coder_id = args.model if args.coder is None else args.coder
    coder = _model(coder_id, args.api_base, max_tokens=MAX_TOKENS)
    default_seed = "simple.py" if coder else "hybrid.py"
    seed = args.seed or Path(__file__).resolve().parents[1] / "seeds" / default_seed
    if not Path(seed).is_file():
        raise UsageError(f"seed program {seed} not found")
    return RunConfig(
        data_dir=str(data_dir(args.data_dir)), seed_program=str(seed),
        cache_dir=str(args.cache_dir or default_cache_dir()), rounds=rounds, jobs=args.jobs,
        embedder=args.embedder, conversations=args.conversations, task_model=task,
        coder_model=coder, **caps,
    )  # fmt: skip


def _open_run(args: argparse.Namespace) -> tuple[Any, dict[str, Any]]:
    from evolve.evolution.store import RunNotFound, RunStore

    try:
        store = RunStore.open(args.runs_dir, args.resume)
    except RunNotFound as exc:
        raise UsageError(str(exc)) from None
    return store, store.manifest


def cmd_run(args: argparse.Namespace) -> int:
    from evolve.evolution.budget import read_spend
    from evolve.evolution.loop import Evolution, fitness
    from evolve.evolution.manifest import build_manifest
    from evolve.evolution.store import RunStore
    from evolve.executor import EvalError
    from evolve.models.llm import LLMError

    config = _run_config(args)
    if args.dry_run:
        return _dry_run(config)
    store = _open_run(args)[0] if args.resume else RunStore.create(
        args.runs_dir, build_manifest(config, args.bench))  # fmt: skip
    seed = Path(config.seed_program).name
    if config.coder_model is None:
        err.print(f"[bold yellow]no coder model configured — offline evolution:[/] the offline "
                  f"proposer mutates {seed}'s tunable constants (run {store.run_id})")  # fmt: skip
    else:
        err.print(f"coder {config.coder_model['model']} revises {seed} (run {store.run_id})")
    if config.task_model is None:
        err.print("[bold yellow]no task model configured — scored by offline retrieval metrics:"
                  "[/] one unit per message, the question is the query, no answers")  # fmt: skip
    with _progress(sum(config.rounds.values()), not args.no_progress, "round") as advance:
        done = [0]

        def progress(description: str, finished: int, total: int) -> None:
            advance(finished - done[0], description)
            done[0] = finished

        evolution = Evolution(store, config, progress)
        try:
            best = evolution.run()
        except (EvalError, LLMError) as exc:
            raise UsageError(f"{exc} (resume with: evolve run --resume {store.run_id})") from None
    seed_meta = store.candidates()[0]
    for label, meta in (("seed", seed_meta), ("best", best)):
        v = meta.scores["valid"]["overall"]
        sim, hit = v["evidence_similarity"], v["evidence_hit_rate"]
        out.print(f"{label} {meta.id}: valid fitness {fitness(v):.3f} "
                  f"(similarity {sim:.3f}, hit rate {hit:.3f})")  # fmt: skip
    spend = read_spend(store.root).total
    if spend.calls:
        out.print(f"spent ${spend.cost_usd:.4f}, {spend.tokens:,} tokens in {spend.calls} calls"
                  + (f" ({spend.unpriced_calls} without a known price)"
                     if spend.unpriced_calls else ""))  # fmt: skip
    out.print(f"run {store.run_id}: {len(store.candidates())} candidates in {store.root}")
    if evolution.stopped:
        resume = f"evolve run --resume {store.run_id}"
        err.print(f"[yellow]stopped early: {escape(evolution.stopped)}[/] — continue with "
                  f"{resume} and a higher cap", highlight=False)  # fmt: skip
    return 0


def _dry_run(config: Any) -> int:
    from evolve.evolution.budget import estimate
    from evolve.evolution.loop import workload

    work = workload(config)
    rows = estimate(work, config.task_model, config.coder_model)
    out.print(f"dry run: {work.rounds} rounds, up to {work.evaluations} evaluations of "
              f"{work.questions} train+valid questions; {work.extract_windows} extraction "
              f"windows ({work.extract_chars:,} characters) per full evaluation")  # fmt: skip
    if not rows:
        out.print("no LLM configured: the run makes no model call and costs nothing")
        return 0
    table = Table(title="estimated model work (tokens ≈ characters / 4; upper bounds)")
    for column in ("role", "model", "what", "calls", "prompt tokens", "completion tokens", "USD"):
        table.add_column(column, justify="right" if column[0] in "cpU" else "left")
    for r in rows:
        usd = "unknown price" if r["usd"] is None else f"{r['usd']:.2f}"
        table.add_row(r["role"], r["model"], r["what"], f"{r['calls']:,}",
                      f"{r['prompt_tokens']:,}", f"{r['completion_tokens']:,}", usd)  # fmt: skip
    out.print(table)
    caps = [f"${config.max_usd:g}" if config.max_usd is not None else None,
            f"{config.max_tokens:,} tokens" if config.max_tokens is not None else None]  # fmt: skip
    out.print("caps: " + (", ".join(c for c in caps if c) or "none (set --max-usd/--max-tokens)"))
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    from sandbox.check import check_program

    def read(path: Path) -> str:
        try:
            return path.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"cannot read {path}: {exc}") from None

    parent = read(args.parent) if args.parent else None
    report = check_program(read(args.file), str(args.file), parent)
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


class _progress:
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


def _print_report(report: dict[str, Any]) -> None:
    meta, scores = report["meta"], report["scores"]
    out.print(f"[bold]{meta['mode']}[/] · {meta['bench']} {meta['split']} · "
              f"{meta['questions']} questions in {meta['conversations']} conversations · "
              f"program {meta['program']} ({meta['program_hash'][:8]})")  # fmt: skip
    metrics = meta["metrics"]
    table = Table(title=f"scores by capability (hit threshold {meta['hit_threshold']})")
    table.add_column("capability")
    table.add_column("n", justify="right")
    for m in metrics:
        table.add_column(m.replace("_", " "), justify="right")
    for cap, row in scores["by_capability"].items():
        table.add_row(
            f"{cap} {CAPABILITY_NAMES[cap]}", str(row["n"]), *(_fmt(row[m]) for m in metrics)
        )
    overall = scores["overall"]
    table.add_row("[bold]overall", str(overall["n"]), *(_fmt(overall[m]) for m in metrics))
    out.print(table)
    stages = ", ".join(f"{s} {c['computed']}/{c['reused']}" for s, c in report["stages"].items())
    out.print(f"stages (computed/reused): {stages}")
    if meta["errors"]:
        out.print(f"[red]{meta['errors']} questions failed[/] — see {meta.get('traces')}")
    out.print(f"traces: {meta.get('traces')}")


if __name__ == "__main__":  # `python -m evolve.cli`: the package's module, so one UsageError
    from evolve.cli import main as package_main

    sys.exit(package_main())
