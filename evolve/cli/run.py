"""The ``evolve run`` command: build or reopen a run, estimate it, run the loop, report.

Parsing and output only; the loop is :mod:`evolve.evolution.loop`, the manifest
:mod:`evolve.evolution.manifest`, the estimate and caps :mod:`evolve.evolution.budget`. The
config is :class:`evolve.config.RunConfig`; on ``--resume`` the stored one is validated first
(:func:`evolve.config.stored_config`), so a damaged or incompatible run is one error line.
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

from evolve.cli.common import (
    MAX_ROUNDS,
    ProgressBar,
    UsageError,
    add_run_options,
    children_count,
    conversation_count,
    data_dir,
    default_cache_dir,
    err,
    llm_flags,
    minibatch_count,
    model_flag,
    non_negative_float,
    non_negative_int,
    out,
    read_program,
    repairs_count,
    reply_tokens,
    task_config,
    token_cap,
)
from evolve.config import (
    CHILDREN,
    DEFAULT_CONVERSATIONS,
    MINIBATCH,
    SPLITS,
    RunConfig,
    stored_config,
)
from evolve.datasets.benches import run_split, split_files
from evolve.datasets.guards import DEFAULT_GUARDS, parse_guard
from evolve.datasets.types import DataError
from evolve.evolution.archive import MARGIN
from evolve.evolution.budget import estimate, read_spend
from evolve.evolution.constants import rebuild_names
from evolve.evolution.manifest import build_manifest
from evolve.evolution.store import RunLocked, RunNotFound, RunStore
from evolve.evolution.summary import transfer, transfer_lines
from evolve.models.llm import LLMError
from evolve.resources import seed_file
from evolve.scoring.fitness import mismatch


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
        f"{', '.join(f'{n} on {b}' for b, n in DEFAULT_CONVERSATIONS.items())}, all elsewhere)",
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
        + "; ".join(f"{', '.join(g)} on {b}" for b, g in DEFAULT_GUARDS.items())
        + ", none elsewhere)",
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


def _run_config(args: argparse.Namespace) -> RunConfig:
    """The RunConfig of a new run, or of the resumed one with this invocation's raised caps."""
    try:
        counts = [int(x) for x in (args.rounds if args.rounds is not None else "2,6,2").split(",")]
    except ValueError:
        counts = []
    if len(counts) != 3 or min(counts) < 0 or max(counts) > MAX_ROUNDS:
        raise UsageError(f"--rounds takes three numbers from 0 to {MAX_ROUNDS}, e.g. 2,6,2; got "
                         f"{args.rounds!r}")  # fmt: skip
    rounds = dict(zip(("cold_start", "refinement", "integration"), counts, strict=True))
    if args.no_integration:
        rounds["integration"] = 0
    caps: dict[str, Any] = {
        k: getattr(args, k)
        for k in ("max_usd", "max_tokens", "repairs")
        if getattr(args, k) is not None
    }
    caps.update(llm_flags(args))  # transport limits: a resumption may change them too
    if args.resume:  # raised caps for this resumption; the manifest keeps the original ones
        manifest = _open_run(args)[1]
        config = stored_config(manifest, args.resume)
        why = mismatch(manifest.get("fitness"), config.fitness().describe())
        if why:  # its stored scores and new ones would be mixed in one archive
            raise UsageError(f"run {args.resume} cannot be resumed: {why} (start a new run)")
        if args.bench is not None and args.bench != config.bench:
            raise UsageError(f"run {args.resume} evolves on {config.bench}; --bench {args.bench} "
                             "cannot change that (start a new run for another bench)")  # fmt: skip
        given = args.cache_dir and str(Path(args.cache_dir).resolve())
        if given and given != config.cache_dir:  # replayed model calls live in the run's cache
            raise UsageError(f"run {args.resume} keeps its cache at {config.cache_dir}; "
                             "--cache-dir cannot move it on --resume (move the folder back, or "
                             "start a new run)")  # fmt: skip
        root = Path(config.data_dir)
        if args.guard is not None and sorted(_guards(args.guard, config.bench, root)) != sorted(
            config.guards
        ):
            raise UsageError(f"run {args.resume} keeps the guards it started with "
                             f"({', '.join(config.guards) or 'none'}); --guard cannot change "
                             "them (start a new run)")  # fmt: skip
        if args.rounds is not None:
            caps["rounds"] = rounds
        return config.replace(**caps)
    task = task_config(args)
    from evolve.evolution.coder import MAX_TOKENS

    coder_id = args.model if args.coder is None else args.coder
    coder = model_flag(coder_id, args.api_base, max_tokens=args.coder_max_tokens or MAX_TOKENS)
    default_seed = "simple.py" if coder else "hybrid.py"
    seed = args.seed or seed_file(default_seed)
    read_program(Path(seed), "seed program")
    return RunConfig(
        # absolute paths: a resumed run may be started from another directory
        data_dir=str(data_dir(args.data_dir).resolve()), seed_program=str(Path(seed).resolve()),
        bench=args.bench or "beam", rounds=rounds, jobs=args.jobs,
        cache_dir=str(Path(args.cache_dir or default_cache_dir()).resolve()),
        embedder=args.embedder, conversations=_slice(args.conversations, args.bench or "beam"),
        task_model=task,
        backend=args.backend, ray_address=args.ray_address,
        coder_model=coder, judge_model=model_flag(args.judge, args.api_base, max_tokens=256),
        judge_variant=args.judge_variant,
        holistic=args.holistic, selection=args.selection, cases=args.cases,
        offline_search=args.offline_search, index_moves=args.index_moves,
        reuse=not args.no_reuse, children=args.children, cascade=not args.no_cascade,
        minibatch=args.minibatch, rng_seed=args.search_seed,
        guards=_guards(args.guard, args.bench or "beam", data_dir(args.data_dir)), **caps,
    )  # fmt: skip


def _guards(given: list[str] | None, bench: str, root: Path) -> tuple[str, ...]:
    """The run's guard specs: the flags' (``none``: no guards), else the bench's default
    (:data:`~evolve.datasets.guards.DEFAULT_GUARDS`) less those whose data ``root`` lacks, each
    left out in one warning line; a spec that does not parse is one error line."""
    if given is None:
        kept = []
        for spec in DEFAULT_GUARDS.get(bench, ()):
            guard = parse_guard(spec)
            try:
                split_files(guard.bench, root, guard.split, guard.conversations)
            except DataError as exc:
                err.print(f"[yellow]default guard {spec} left out:[/] {escape(str(exc))} "
                          "(--guard chooses guards, --guard none turns them off)",
                          highlight=False)  # fmt: skip
                continue
            kept.append(guard.name)
        return tuple(kept)
    if "none" in given:
        if len(given) > 1:
            raise UsageError("--guard none turns guards off; it cannot be combined with others")
        return ()
    try:
        names = [parse_guard(g).name for g in given]
    except ValueError as exc:
        raise UsageError(f"--guard: {exc}") from None
    if len(set(names)) != len(names):
        raise UsageError(f"--guard: a guard is named twice ({', '.join(names)})")
    return tuple(names)


def _slice(given: int | str | None, bench: str) -> int | None:
    """The run's ``conversations``: the flag's count, None for ``all``, else the bench's default
    (:data:`~evolve.config.DEFAULT_CONVERSATIONS`), said in one line."""
    if given is None and bench in DEFAULT_CONVERSATIONS:
        given = DEFAULT_CONVERSATIONS[bench]
        err.print(
            f"{bench}: train and valid read their first {given} conversations (the default; "
            "--conversations all reads the full splits)",
            highlight=False,
        )
    return None if given in (None, "all") else int(given)


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


def _check_seed(seed: str) -> None:
    """Refuse a seed that fails the sandbox before a run is created for it (no run folder)."""
    from sandbox.check import check_program

    err.print(f"checking seed {Path(seed).name} in the sandbox")  # progress from the first second
    report = check_program(read_program(Path(seed), "seed program"), seed)
    if not report.passed:
        raise UsageError(f"seed program {seed}: {report.repair_text()}")


def _check_tasks(config: RunConfig, given: int | str | None) -> None:
    """Refuse, before a run is created, splits that leave nothing to evaluate, a
    ``--conversations`` count (``given``) above what train or valid holds, and guards that do
    not load, are empty or share a conversation with train or valid."""
    from evolve.evolution.loop import guard_sets, task_set
    from evolve.executor import EvalError, check_evaluable

    try:
        for split in SPLITS:
            tasks = task_set(config, split)
            check_evaluable(tasks)
            if given not in (None, "all") and len(tasks.conversations) < int(str(given)):
                raise UsageError(f"--conversations {given}: {config.bench} {split} holds "
                                 f"{len(tasks.conversations)} conversations (use at most that, "
                                 "or 'all')")  # fmt: skip
        for _, tasks in guard_sets(config):
            check_evaluable(tasks)
    except (EvalError, DataError) as exc:
        raise UsageError(str(exc)) from None


def _say_guards(config: RunConfig) -> None:
    """The run's guards in one line (or that it has none)."""
    if not config.guards:
        err.print("no guard sets: selection reads valid only (--guard BENCH:SPLIT adds one)")
        return
    err.print(f"guards: {', '.join(config.guards)} — a new best or specialist must not be worse "
              f"there than the program it replaces (margin {MARGIN * 100:g} pp; --guard none "
              "turns them off)", highlight=False)  # fmt: skip


def _open_run(args: argparse.Namespace) -> tuple[RunStore, dict[str, Any]]:
    try:
        store = RunStore.open(args.runs_dir, args.resume)
    except RunNotFound as exc:
        raise UsageError(str(exc)) from None
    return store, store.manifest


def cmd_run(args: argparse.Namespace) -> int:
    held: list[RunStore] = []  # the run whose lock this command took, released at its end
    try:
        return _cmd_run(args, held)
    finally:
        for store in held:
            store.unlock()


def _cmd_run(args: argparse.Namespace, held: list[RunStore]) -> int:
    from evolve.evolution.loop import Evolution
    from evolve.executor import EvalError

    config = _run_config(args)
    _say_splits(config)
    if args.dry_run:
        return _dry_run(config)
    bar = ProgressBar(sum(config.rounds.values()), not args.no_progress, "round")
    if not args.resume:
        _check_seed(config.seed_program)
        _check_tasks(config, args.conversations)
    store = _open_run(args)[0] if args.resume else RunStore.create(
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
    _say_guards(config)
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
            evolution.run()
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
    names = {s: run_split(config.bench, Path(config.data_dir), s) for s in SPLITS}
    if any(name != split for split, name in names.items()):
        chosen = ", ".join(f"{split} reads split {name!r}" for split, name in names.items())
        err.print(f"[yellow]{config.bench}: {chosen}[/] (the data holds no full train and valid "
                  "split; README, Benchmarks)", highlight=False)  # fmt: skip


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
    from evolve.evolution.loop import guard_sets, workload

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
