"""The flags of ``evolve run`` made into the run's :class:`~evolve.config.RunConfig`, and the
checks made before a run folder is created.

Owns :func:`run_config` (a new run's configuration, or a resumed run's stored one with this
invocation's raised caps), :func:`guards`, :func:`guard_data_dir` and
:func:`stored_guard_root` (the data root of guards of other benches: ``--guard-data-dir``, else
``$PRISMEM_DATA`` for a bench whose data dir is a folder of its own, else the run's data
dir), :func:`conversations_slice`, :func:`check_seed`, :func:`check_tasks` and
:func:`open_run`; :mod:`evolve.cli.run` parses and reports.

Invariants:

- Every refusal is one :class:`~evolve.cli.common.UsageError` line, raised before a run folder
  exists (a new run) or before anything of the run changes (``--resume``).
- A resumed run keeps what its scores rest on: its bench, fitness, cache folder, guards and
  their data root cannot change on ``--resume``; only caps, transport limits and rounds may be
  raised.
- Paths are stored absolute, so a run may be resumed from another directory. The guard data
  root is stored only where a guard of another bench reads a root other than the data dir, so
  the config of any other run is stored as before ``--guard-data-dir`` existed.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.markup import escape

from evolve.benches import registry
from evolve.benches.guards import parse_guard
from evolve.cli.common import (
    MAX_ROUNDS,
    UsageError,
    data_dir,
    default_cache_dir,
    err,
    llm_flags,
    model_flag,
    read_program,
    task_config,
)
from evolve.config import SPLITS, RunConfig, stored_config
from evolve.datasets.types import DataError
from evolve.environment import folder
from evolve.evolution.store import RunNotFound, RunStore
from evolve.resources import seed_file
from evolve.scoring.fitness import mismatch

if TYPE_CHECKING:
    from sandbox.check import CheckReport


def run_config(args: argparse.Namespace) -> RunConfig:
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
        manifest = open_run(args)[1]
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
        if args.guard_data_dir is not None and guard_data_dir(
            args.guard_data_dir, config.data_dir, config.bench
        ) != (config.guard_data_dir or config.data_dir):
            raise UsageError(f"run {args.resume} reads its guards of other benches from "
                             f"{config.guard_data_dir or config.data_dir}; --guard-data-dir "
                             "cannot move them on --resume (start a new run)")  # fmt: skip
        if args.guard is not None and sorted(guards(args.guard, config)) != sorted(config.guards):
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
    root = str(data_dir(args.data_dir).resolve())
    config = RunConfig(
        # absolute paths: a resumed run may be started from another directory
        data_dir=root, seed_program=str(Path(seed).resolve()),
        bench=args.bench or "beam", rounds=rounds, jobs=args.jobs,
        cache_dir=str(Path(args.cache_dir or default_cache_dir()).resolve()),
        embedder=args.embedder, task_model=task,
        conversations=conversations_slice(args.conversations, args.bench or "beam"),
        backend=args.backend, ray_address=args.ray_address,
        coder_model=coder, judge_model=model_flag(args.judge, args.api_base, max_tokens=256),
        judge_variant=args.judge_variant,
        holistic=args.holistic, selection=args.selection, cases=args.cases,
        offline_search=args.offline_search, index_moves=args.index_moves,
        reuse=not args.no_reuse, children=args.children, cascade=not args.no_cascade,
        minibatch=args.minibatch, rng_seed=args.search_seed,
        guard_data_dir=guard_data_dir(args.guard_data_dir, root, args.bench or "beam"), **caps,
    )  # fmt: skip
    config = config.replace(guards=guards(args.guard, config))
    return config.replace(guard_data_dir=stored_guard_root(config))


def guard_data_dir(given: str | None, root: str, bench: str) -> str:
    """The guard data root of a run of ``bench`` whose data dir is ``root``, absolute:
    ``--guard-data-dir`` (``given``; one error line when it is not a folder), else, for a bench
    whose data dir is a folder of its own (``Bench.own_folder``: a user's data), ``$PRISMEM_DATA``
    when set, else ``root`` (a data root holds the other benches too)."""
    own = registry.bench(bench).own_folder
    path = Path(given or (own and folder("DATA")) or root).expanduser()
    if given and not path.is_dir():
        raise UsageError(f"--guard-data-dir: data directory {path} does not exist")
    return str(path.resolve())


def stored_guard_root(config: RunConfig) -> str | None:
    """``config.guard_data_dir`` as the run stores it: None (read from the data dir, as a run
    stored before the field existed) unless a guard of another bench reads a different root."""
    if config.guard_data_dir == config.data_dir:
        return None
    if all(parse_guard(spec).bench == config.bench for spec in config.guards):
        return None
    return config.guard_data_dir


def guards(given: list[str] | None, config: RunConfig) -> tuple[str, ...]:
    """The run's guard specs: the flags' (``none``: no guards), else the bench's default
    (``Bench.guards``, :mod:`evolve.benches.registry`) less those whose data root
    (:meth:`~evolve.config.RunConfig.guard_root`) lacks their files, each left out in one warning
    line; a spec that does not parse is one error line."""
    if given is None:
        kept = []
        for spec in registry.bench(config.bench).guards:
            guard = parse_guard(spec)
            root = config.guard_root(guard)
            try:
                registry.bench(guard.bench).split_files(root, guard.split, guard.conversations)
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


def conversations_slice(given: int | str | None, bench: str) -> int | None:
    """The run's ``conversations``: the flag's count, None for ``all``, else the bench's default
    (``Bench.conversations``, :mod:`evolve.benches.registry`), said in one line."""
    default = registry.bench(bench).conversations
    if given is None and default is not None:
        given = default
        err.print(
            f"{bench}: train and valid read their first {given} conversations (the default; "
            "--conversations all reads the full splits)",
            highlight=False,
        )
    return None if given in (None, "all") else int(given)


def check_seed(seed: str) -> CheckReport:
    """Refuse a seed that fails the sandbox before a run is created for it (no run folder);
    the report of one that passes, so the run does not check it again."""
    from sandbox.check import check_program

    err.print(f"checking seed {Path(seed).name} in the sandbox")  # progress from the first second
    report = check_program(read_program(Path(seed), "seed program"), seed)
    report.require(lambda why: UsageError(f"seed program {seed}: {why}"))
    return report


def check_tasks(config: RunConfig, given: int | str | None) -> None:
    """Refuse, before a run is created, splits that leave nothing to evaluate, a
    ``--conversations`` count (``given``) above what train or valid holds, and guards that do
    not load, are empty or share a conversation with train or valid."""
    from evolve.evaluation.executor import EvalError, check_evaluable
    from evolve.evolution.wiring import guard_sets, task_set

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


def open_run(args: argparse.Namespace) -> tuple[RunStore, dict[str, Any]]:
    try:
        store = RunStore.open(args.runs_dir, args.resume)
    except RunNotFound as exc:
        raise UsageError(str(exc)) from None
    return store, store.manifest
