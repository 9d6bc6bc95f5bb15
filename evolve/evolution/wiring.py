"""A run assembled from its :class:`~evolve.config.RunConfig`: the one place a config becomes
the objects the loop (:mod:`evolve.evolution.loop`), ``freeze`` and ``evolve run``'s checks and
dry run work with.

Owns :func:`eval_setup` (what the run's evaluations run with), :func:`task_set` and
:func:`guard_sets` (the run's data), :func:`workload` (its model work, counted from that data),
:func:`job_backend`, :func:`judge_client`, :func:`constant_proposer`, the strategy registries
:data:`SELECTIONS`, :data:`CASE_ORDERS` and :data:`SEARCHES`, and :func:`assemble`, which builds
a run's :class:`RunParts` (its clients, proposer, strategies, evaluation setup and embedder).

Invariants:

- **A config keeps its strings.** ``RunConfig.selection``, ``cases`` and ``offline_search`` are
  stored in the manifest as the names the command line gives; they become strategy objects
  here only, through a registry whose names are exactly the config's choices
  (``tests/test_strategies.py``). The loop asks the objects (``proposer.builds_cases``,
  ``selection.targets``, ``order.order``), never compares a name or a type.
- **One proposer per run**: the coder when the run has a coder model (or one is injected),
  else the constant search ``offline_search`` names.
- **Every client logs to the run's call log** (:func:`~evolve.evolution.budget.calls_path`), so
  its calls count in the run's spend and its caps; replies are cached in the run's cache
  folder (the judge's only with ``reuse``).
- Building parts starts no backend and loads no task set: the loop starts its backend on the
  first evaluation and loads a split when it first asks for it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evolve.benches.guards import load_guard, parse_guard
from evolve.benches.registry import bench
from evolve.config import SPLITS, RunConfig
from evolve.datasets.types import TaskSet
from evolve.evaluation.distributed import JobBackend, make_backend
from evolve.evaluation.prompts import extraction_windows
from evolve.evaluation.setup import EvalSetup, make_embedder
from evolve.evolution.budget import Workload, calls_path
from evolve.evolution.cases import CASE_CHARS, CaseOrder, SeededDraw, WorstFirst
from evolve.evolution.coder import CoderProposer, render_request, system_prompt
from evolve.evolution.constants import ConstantProposer
from evolve.evolution.evaluator import Phase
from evolve.evolution.proposer import CandidateView, Proposer, Request
from evolve.evolution.selection import DependencyAware, RoundRobin, Selection
from evolve.evolution.tpe import TPEProposer
from evolve.models.clients import role_client
from evolve.models.embed import Embedder
from evolve.models.llm import LLMClient

_SELECTIONS: tuple[Selection, ...] = (DependencyAware(), RoundRobin())
_CASE_ORDERS: tuple[CaseOrder, ...] = (WorstFirst(), SeededDraw())
SELECTIONS = {s.name: s for s in _SELECTIONS}  # RunConfig.selection, --selection
CASE_ORDERS = {o.name: o for o in _CASE_ORDERS}  # RunConfig.cases, --cases
# RunConfig.offline_search, --offline-search: (config, run folder) -> the constant search
SEARCHES: dict[str, Callable[[RunConfig, Path], ConstantProposer]] = {
    TPEProposer.name: lambda c, run_dir: TPEProposer(c.rng_seed, run_dir, c.index_moves),
    ConstantProposer.name: lambda c, _: ConstantProposer(c.rng_seed, c.index_moves),
}


def eval_setup(config: RunConfig, run_root: Path, call_prefix: str, **changes: Any) -> EvalSetup:
    """What the evaluation workers of a run need (the one place it is built from a config):
    the run's cache, task model and embedder; LLM calls go to the run's call log, so they
    count in its spend. ``changes`` override fields (``cache_dir``, ``embedder``, ...)."""
    fields: dict[str, Any] = {
        "cache_dir": config.cache_dir, "task_model": config.task_model,
        "embedder": config.embedder, "call_prefix": call_prefix,
        "calls_log": str(calls_path(run_root)), "reuse": config.reuse,
        "llm_concurrency": config.llm_concurrency, "llm_timeout": config.llm_timeout,
    }  # fmt: skip
    return EvalSetup(**{**fields, **changes})


def task_set(config: RunConfig, split: str) -> TaskSet:
    """A run's ``split`` (train, valid or test) of its bench, as the bench's registry names it
    (:meth:`~evolve.benches.registry.Bench.run_split`): only its first ``config.conversations``
    conversations."""
    data_dir, entry = Path(config.data_dir), bench(config.bench)
    tasks = entry.load_taskset(data_dir, entry.run_split(data_dir, split))
    return tasks.first(config.conversations)


def guard_sets(config: RunConfig) -> Phase:
    """A run's guards as (scores key, task set), each read from its data root
    (:meth:`~evolve.config.RunConfig.guard_root`); DataError (one line) for a guard that does
    not load or shares a conversation with the run's train or valid."""
    run = [task_set(config, split) for split in SPLITS]
    guards = [parse_guard(spec) for spec in config.guards]
    return [(g.key, load_guard(g, config.guard_root(g), run)) for g in guards]


def workload(config: RunConfig) -> Workload:
    """A run's model work, counted from its data (for ``evolve run --dry-run``)."""
    windows = chars = questions = judged = 0
    scorer = bench(config.bench).scorer(None)
    for split in SPLITS:
        tasks = task_set(config, split)
        questions += len(tasks.questions)
        judged += sum(scorer.max_judge_calls(q) for q in tasks.questions)
        for segment in (s for c in tasks.conversations for s in c.sessions):
            for window in extraction_windows(segment):
                windows += 1
                chars += sum(len(m.content) for m in window.messages)
    seed = CandidateView("seed", Path(config.seed_program).read_text(), {})
    prompt = system_prompt(config.fitness()) + render_request(Request("refinement", 0, seed, "F"))
    rounds = sum(config.rounds.values())
    return Workload(rounds, rounds * config.children + 1, windows, chars, questions,
                    len(prompt) + 4 * CASE_CHARS, config.repairs, judged,
                    config.children)  # fmt: skip


def job_backend(config: RunConfig, jobs: int | None = None) -> JobBackend:
    """The run's job backend (``config.backend``) with ``jobs`` workers (default
    ``config.jobs``)."""
    return make_backend(config.backend, jobs or config.jobs, config.ray_address)


def judge_client(
    config: RunConfig, run_root: Path, cache_dir: str, *, cached: bool
) -> LLMClient | None:
    """The run's judge (None without ``config.judge_model``), logging to the run's call log;
    its replies cached under ``cache_dir`` when ``cached``."""
    cache = Path(cache_dir) / "llm-cache.sqlite" if cached else None
    return role_client("judge", config.judge_model, log_path=calls_path(run_root),
                       cache_path=cache, **config.llm_limits())  # fmt: skip


def constant_proposer(config: RunConfig, run_dir: Path) -> ConstantProposer:
    """The constant search ``config.offline_search`` names (:data:`SEARCHES`), for the run in
    ``run_dir``."""
    return SEARCHES[config.offline_search](config, run_dir)


@dataclass(frozen=True)
class RunParts:
    """What the loop of one run works with (:func:`assemble`): the coder's, annotator's and
    judge's clients (None: the role has no model; without an annotator the native capability
    map stands in), the proposer, the refinement target selection, the order of failing cases,
    the evaluations' setup, and the embedder that makes cases compact."""

    coder: LLMClient | None
    annotator: LLMClient | None
    judge: LLMClient | None
    proposer: Proposer
    selection: Selection
    case_order: CaseOrder
    setup: EvalSetup
    embedder: Embedder


def assemble(
    config: RunConfig,
    run_root: Path,
    *,
    coder: LLMClient | None = None,
    annotator: LLMClient | None = None,
    judge: LLMClient | None = None,
    task_script: Callable[..., str] | None = None,
) -> RunParts:
    """The parts of the run in ``run_root``. ``coder``, ``annotator`` and ``judge`` replace the
    clients built from ``config.coder_model`` and ``config.judge_model`` (tests); the coder's
    model labels the tasks, so an injected coder without an injected annotator leaves the run
    without one. ``task_script`` makes the evaluation workers answer task prompts from a
    script (tests only)."""
    injected_coder = coder is not None
    log, cache = calls_path(run_root), Path(config.cache_dir) / "llm-cache.sqlite"
    if coder is None:
        coder = role_client("coder", config.coder_model, log_path=log, cache_path=cache,
                            **config.llm_limits())  # fmt: skip
    proposer: Proposer = (
        CoderProposer(coder, config.fitness())
        if coder is not None
        else constant_proposer(config, run_root)
    )
    judge = judge or judge_client(config, run_root, config.cache_dir, cached=config.reuse)
    if annotator is None and not injected_coder:
        annotator = role_client("annotator", config.coder_model, log_path=log,
                                cache_path=cache, **config.llm_limits())  # fmt: skip
    return RunParts(
        coder=coder,
        annotator=annotator,
        judge=judge,
        proposer=proposer,
        selection=SELECTIONS[config.selection],
        case_order=CASE_ORDERS[config.cases],
        setup=eval_setup(config, run_root, "evolve", script=task_script),
        embedder=make_embedder(config.embedder, config.cache_dir),
    )
