"""The ``evolve run`` command: build or reopen a run, estimate it, run the loop, report.

Parsing and output only; the flags become the run's configuration in
:mod:`evolve.cli.runconfig` (with the checks before a run folder is created); the loop is
:mod:`evolve.evolution.loop`, what a run is assembled from (its data, guards and workload)
:mod:`evolve.evolution.wiring`, the manifest :mod:`evolve.evolution.manifest`, the estimate and
caps :mod:`evolve.evolution.budget`. The config is :class:`evolve.config.RunConfig`; on
``--resume`` the stored one is validated first (:func:`evolve.config.stored_config`), so a
damaged or incompatible run is one error line.
Errors follow :mod:`evolve.cli.common`: one ``error:`` line and exit status 2
(:class:`~evolve.cli.common.UsageError`); a run stopped by an error or a cap keeps everything it
computed and resumes with ``--resume``, which names every damaged file it could not recover and
continues with the rest. The engine modules are imported inside the functions that use them,
so that the commands that only read a run do not load the engine.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from rich.markup import escape
from rich.table import Table

from evolve.benches.registry import ENTRIES, bench
from evolve.cli.common import (
    ProgressBar,
    UsageError,
    add_run_options,
    children_count,
    conversation_count,
    err,
    minibatch_count,
    non_negative_float,
    non_negative_int,
    out,
    repairs_count,
    reply_tokens,
    token_cap,
)
from evolve.cli.runconfig import check_seed, check_tasks, open_run, run_config
from evolve.config import (
    CHILDREN,
    MINIBATCH,
    SPLITS,
    RunConfig,
)
from evolve.evolution.annotate import unlabelled
from evolve.evolution.archive import MARGIN
from evolve.evolution.budget import estimate, read_spend
from evolve.evolution.constants import rebuild_names
from evolve.evolution.manifest import build_manifest
from evolve.evolution.store import RunLocked, RunStore
from evolve.evolution.summary import transfer, transfer_lines
from evolve.models.llm import LLMError


def add_command(sub: Any) -> None:
    """Register ``run`` on the ``evolve`` parser's subparsers."""
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
        help="coding LLM as a litellm id (default: --model); 'none' = the constant proposer",
    )
    run.add_argument(
        "--rounds",
        default=None,
        help="rounds of cold start, refinement, integration (default 2,6,2); with "
        "--resume, raises the run's caps",
    )
    run.add_argument(
        "--coder-max-tokens",
        type=reply_tokens,
        default=None,
        help="reply limit of the coder model (default 8192: a reply may be a whole program)",
    )
    run.add_argument(
        "--repairs",
        type=repairs_count,
        default=None,
        help="repair attempts after a proposal fails to apply or fails the sandbox (default 3)",
    )
    run.add_argument(
        "--max-usd", type=non_negative_float, default=None, help="stop before spending more USD"
    )
    run.add_argument(
        "--max-tokens", type=token_cap, default=None, help="stop before more LLM tokens"
    )
    run.add_argument(
        "--dry-run", action="store_true", help="print the work and cost estimate; run nothing"
    )
    run.add_argument(
        "--conversations",
        type=conversation_count,
        default=None,
        help="read only the first N conversations of train and valid, or 'all' (default: "
        f"{', '.join(f'{b.conversations} on {b.name}' for b in ENTRIES if b.conversations)}, "
        "all elsewhere)",
    )
    run.add_argument(
        "--no-reuse",
        action="store_true",
        help="recompute every step and task-model reply in every evaluation (the baseline "
        "step reuse is measured against; bench/run_reuse.py)",
    )
    run.add_argument(
        "--children",
        type=children_count,
        default=CHILDREN,
        help=f"children proposed per round, evaluated concurrently (default {CHILDREN})",
    )
    run.add_argument(
        "--minibatch",
        type=minibatch_count,
        default=MINIBATCH,
        help="train conversations (where the parent fails most) a child is screened on before "
        f"full train + valid (default {MINIBATCH})",
    )
    run.add_argument(
        "--no-cascade",
        action="store_true",
        help="evaluate every child on full train + valid (no minibatch screen)",
    )
    run.add_argument(
        "--index-moves",
        action="store_true",
        help="let constant search move the constants extraction and indexing read (chunk "
        "sizes); each such child encodes every conversation again",
    )
    run.add_argument(
        "--search-seed",
        type=non_negative_int,
        default=0,
        help="seed of the run's random choices (constant search, sampled cases); a run repeated "
        "with other seeds shows how much its outcome varies (default 0)",
    )
    run.add_argument(
        "--guard",
        action="append",
        metavar="BENCH:SPLIT[@N]",
        default=None,
        help="a guard set (repeatable): data the run never tunes on, where a new best or "
        "specialist must not be worse than the program it replaces (paired bootstrap, margin "
        f"{MARGIN * 100:g} pp); @N: its first N conversations; 'none': no guards (default: "
        + "; ".join(f"{', '.join(b.guards)} on {b.name}" for b in ENTRIES if b.guards)
        + ", none elsewhere)",
    )
    run.add_argument(
        "--guard-data-dir",
        metavar="DIR",
        default=None,
        help="data root of the guards of another bench than --bench's (a guard of the run's own "
        "bench reads --data-dir; default: --data-dir, but for --bench jsonl (a folder of your own "
        "data) $PRISMEM_DATA when set)",
    )
    run.add_argument("--resume", metavar="RUN_ID", help="continue an interrupted or capped run")
    ablations = run.add_argument_group("ablations (docs/design.md §4)")
    ablations.add_argument(
        "--holistic", action="store_true", help="no capabilities: no targets, no specialists"
    )
    ablations.add_argument(
        "--no-integration", action="store_true", help="skip trace-guided integration"
    )
    ablations.add_argument(
        "--selection",
        choices=["dependency", "round-robin"],
        default="dependency",
        help="how refinement picks its capability (default: dependency-aware)",
    )
    ablations.add_argument(
        "--cases",
        choices=["worst", "random"],
        default="worst",
        help="which failing cases the proposer sees (default: the worst)",
    )
    ablations.add_argument(
        "--offline-search",
        choices=["optuna", "random"],
        default="optuna",
        help="constant proposer: model-based TPE search (default) or seeded random mutation",
    )
    add_run_options(run)
    run.set_defaults(bench=None)  # unset: a new run's default is beam; a resumed run keeps its own


def _kept(config: RunConfig) -> str:
    """What the constant proposer keeps of the seed's constants, for the run's first lines."""
    if config.index_moves:
        return ""
    try:  # a resumed run's seed file may be gone or changed since: then nothing is named
        kept = sorted(rebuild_names(Path(config.seed_program).read_text(encoding="utf-8")))
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
        return ""
    return (f" but {', '.join(kept)} (extraction and indexing read them: --index-moves moves "
            "them too)") if kept else ""  # fmt: skip


def _say_fitness(config: RunConfig) -> None:
    """Which fitness selection uses; loudly when answers are scored without a judge."""
    fit = config.fitness().describe()
    line = f"fitness {fit['name']} v{fit['version']}: {fit['definition']}"
    if fit["name"] == "answer-f1":
        err.print(f"[bold yellow]no judge configured (--judge) — {line}[/]")
    else:
        err.print(line)


def _sayguards(config: RunConfig) -> None:
    """The run's guards in one line (or that it has none)."""
    if not config.guards:
        err.print("no guard sets: selection reads valid only (--guard BENCH:SPLIT adds one)")
        return
    err.print(f"guards: {', '.join(config.guards)} — a new best or specialist must not be worse "
              f"there than the program it replaces (margin {MARGIN * 100:g} pp; --guard none "
              "turns them off)", highlight=False)  # fmt: skip


def cmd_run(args: argparse.Namespace) -> int:
    held: list[RunStore] = []  # the run whose lock this command took, released at its end
    try:
        return _cmd_run(args, held)
    finally:
        for store in held:
            store.unlock()


def _cmd_run(args: argparse.Namespace, held: list[RunStore]) -> int:
    from evolve.evaluation.executor import EvalError
    from evolve.evolution.loop import Evolution

    config = run_config(args)
    _say_splits(config)
    if args.dry_run:
        return _dry_run(config)
    bar = ProgressBar(sum(config.rounds.values()), not args.no_progress, "round")
    seed_report = None
    if not args.resume:
        seed_report = check_seed(config.seed_program)
        check_tasks(config, args.conversations)
    store = open_run(args)[0] if args.resume else RunStore.create(
        args.runs_dir, build_manifest(config))  # fmt: skip
    try:
        store.lock()  # one process per run
    except RunLocked as exc:
        raise UsageError(str(exc)) from None
    held.append(store)
    seed = Path(config.seed_program).name
    if config.coder_model is None:
        err.print(f"[bold yellow]no coder model configured — constant search:[/] the constant "
                  f"proposer mutates {seed}'s tunable constants{_kept(config)} "
                  f"(run {store.run_id})")  # fmt: skip
    else:
        err.print(f"coder {config.coder_model.model} revises {seed} (run {store.run_id})")
    if config.task_model is None:
        err.print("[bold yellow]no task model configured — scored by offline retrieval metrics:"
                  "[/] one unit per message, the question is the query, no answers")  # fmt: skip
    _say_fitness(config)
    _sayguards(config)
    _say_unlabelled(config)
    if args.resume:
        _say_unrecovered(store)
        _rebuild_lost_log(store, config)
    with bar as advance:
        done = [0]

        def progress(description: str, finished: int, total: int) -> None:
            advance(finished - done[0], description)
            done[0] = finished

        def eval_progress(slot: int, label: str, questions: int) -> Any:
            return bar.row(f"evaluation {slot}", f"evaluating {label}: questions", questions)

        evolution = Evolution(store, config, progress, eval_progress=eval_progress)
        try:
            evolution.run(seed_report)
        except (EvalError, LLMError) as exc:
            raise UsageError(f"{exc} (resume with: evolve run --resume {store.run_id})") from None
    for line in transfer_lines(transfer(store.candidates())):
        out.print(line, highlight=False)
    spend = read_spend(store.root).total
    if spend.calls:
        out.print(f"spent ${spend.cost_usd:.4f}, {spend.tokens:,} tokens in {spend.calls} calls"
                  + (f" ({spend.unpriced_calls} without a known price)"
                     if spend.unpriced_calls else ""))  # fmt: skip
    candidates = store.candidates()
    n = len(candidates)
    out.print(f"run {store.run_id}: {n} candidate{'s' * (n != 1)} in {store.root}")
    failed = [c for c in candidates if c.status == "failed"]
    if failed:  # a program that fails every question, or whose evaluation failed
        out.print(f"{len(failed)} candidate{'s' * (len(failed) != 1)} failed (the reason is in "
                  f"each one's message: evolve programs {store.run_id}), first: "
                  f"{failed[0].message[:200]}", highlight=False)  # fmt: skip
    _say_cascade(store)
    if evolution.stopped:
        resume = f"evolve run --resume {store.run_id}"
        err.print(f"[yellow]stopped early: {escape(evolution.stopped)}[/] — continue with "
                  f"{resume} and a higher cap", highlight=False)  # fmt: skip
    return 0


def _say_cascade(store: RunStore) -> None:
    """How many children the cascade stopped, and the evaluation seconds that saved."""
    from evolve.evolution.cascade import saved_seconds

    candidates = store.candidates()
    stopped = sum(1 for c in candidates if c.status == "stopped")
    if stopped:
        saved = saved_seconds(candidates)
        out.print(f"cascade: {stopped} child{'ren' * (stopped != 1)} stopped on the train "
                  f"minibatch, about {saved:.0f} s of evaluation saved")  # fmt: skip


def _say_splits(config: RunConfig) -> None:
    """One line when the bench's train or valid split is not the one of that name."""
    names = {s: bench(config.bench).run_split(Path(config.data_dir), s) for s in SPLITS}
    if any(name != split for split, name in names.items()):
        chosen = ", ".join(f"{split} reads split {name!r}" for split, name in names.items())
        err.print(f"[yellow]{config.bench}: {chosen}[/] (the data holds no full train and valid "
                  "split; README, Benchmarks)", highlight=False)  # fmt: skip


def _say_unlabelled(config: RunConfig) -> None:
    """One line when train or valid holds questions with no capability (a user's): how many,
    and who labels them (the annotator is the coder's model)."""
    from evolve.evolution.wiring import task_set

    tasks = [task_set(config, split) for split in SPLITS]
    none = sum(len(unlabelled(t.questions)) for t in tasks)
    if not none:
        return
    total = sum(len(t.questions) for t in tasks)
    line = f"{none} of {total} train and valid questions carry no capability"
    if config.coder_model is not None:
        err.print(f"{line}: the annotator ({config.coder_model.model}) labels them for "
                  "refinement", highlight=False)  # fmt: skip
        return
    err.print(f"[yellow]{line}[/]: they count in overall fitness and show as unlabelled, but "
              "no refinement targets them (an annotator labels them: --coder M, default "
              "--model; or label them once with evolve data annotate DIR --model M)",
              highlight=False)  # fmt: skip


def _say_unrecovered(store: RunStore) -> None:
    """On ``--resume``: how much of the run was lost to damaged files (each named in a warning)."""
    lost = store.damage()
    if lost:
        kept = len(store.candidates())  # warns once per damaged candidate file
        store.load_state()  # and about a damaged state
        store.log_event("resume_damage", files=lost)
        err.print(f"[yellow]resume:[/] could not recover {len(lost)} damaged file(s), named above; "
                  f"continuing with the {kept} readable candidates (not evaluated again)",
                  highlight=False)  # fmt: skip


def _rebuild_lost_log(store: RunStore, config: RunConfig) -> float | None:
    """On ``--resume``: a run with models whose call log is gone would count its spend, and so
    its ``--max-usd`` / ``--max-tokens`` caps, from zero. Its spend is rebuilt into a new log
    from ``state.json``'s round costs (one row, role ``rebuilt``), said in one warning line;
    returns the USD rebuilt (None when the log is there or the run calls no model)."""
    from dataclasses import asdict

    from evolve.evolution.budget import calls_path
    from evolve.models import calllog
    from evolve.models.llm import UsageRecord

    path = calls_path(store.root)
    models = (config.task_model, config.coder_model, config.judge_model)
    if path.exists() or all(m is None for m in models) or not store.candidates():
        return None
    costs = store.load_state().get("round_costs", [])
    usd = sum(float(c.get("usd", 0.0)) for c in costs)
    tokens = int(sum(float(c.get("tokens", 0)) for c in costs))
    record = UsageRecord(ts=time.time(), role=calllog.REBUILT, purpose="lost call log",
                         model="unknown", prompt_tokens=tokens, completion_tokens=0,
                         cost_usd=usd, latency_s=0.0, cached=False, request_hash="rebuilt",
                         error=None)  # fmt: skip
    calllog.append(path, asdict(record))
    err.print(f"[yellow]warning:[/] the run's call log {escape(str(path))} is missing: its spend "
              f"is rebuilt from the finished rounds' costs in state.json (${usd:.4f}, "
              f"{tokens:,} tokens; the seed's and an unfinished round's calls are not counted), "
              "so the caps do not start from zero", highlight=False)  # fmt: skip
    return usd


def _dry_run(config: RunConfig) -> int:
    from evolve.evolution.wiring import guard_sets, workload

    work = workload(config)
    for key, tasks in guard_sets(config):
        n = len(tasks.conversations)
        out.print(f"guard {key.removeprefix('guard:')}: {n} conversation{'s' * (n != 1)}, "
                  f"{len(tasks.questions)} questions, scored for the seed and for each "
                  "candidate that wins valid", highlight=False)  # fmt: skip
    rows = estimate(work, config.task_model, config.coder_model, config.judge_model)
    out.print(f"dry run on {config.bench}: {work.rounds} rounds of {config.children} "
              f"child{'ren' * (config.children != 1)}, up to {work.evaluations} "
              f"evaluations of {work.questions} train+valid questions; {work.extract_windows} "
              f"extraction windows ({work.extract_chars:,} characters) per evaluation")  # fmt: skip
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
