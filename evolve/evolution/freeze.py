"""Freezing a candidate: its one look at the test split.

Owns the test split's only reader and :class:`FreezeError`.

Invariants:

- **Test is read here and nowhere else.** :func:`freeze` is the only code that loads the test
  split for a run; the loop selects on valid and never sees test. A candidate is scored on test
  at most once: its test block and ``frozen=True`` are written together in one metadata write
  (with a ``frozen`` event), and freezing a frozen candidate returns the stored block without
  evaluating anything. Only an ``evaluated`` candidate can be frozen, of a run whose stored
  config validates (:func:`evolve.config.stored_config`). Freezing a second candidate of the
  same run is allowed, but :class:`Frozen` names the others so the caller can warn that
  comparing several test scores is selection on test.
- **A test score is complete or absent.** If any test question fails (a program error, or a
  host killed for time on an overloaded machine), nothing is recorded and the candidate is not
  frozen: a partial score would describe the machine, not the program. Traces are written to
  ``freeze-<id>/`` either way, and the step cache keeps what was computed.
- **The test tasks match the run's.** Same restriction to the first ``conversations``
  conversations as the loop's (:func:`evolve.evolution.wiring.task_set`), the run's embedder,
  cache and task model unless the caller overrides them
  (:func:`~evolve.evolution.wiring.eval_setup`), its backend, and its judge (so the test score
  is the run's fitness mode); the block is a :class:`~evolve.evaluation.report.ScoreBlock` of its
  ``TEST_FIELDS`` (``fitness``, ``overall``, ``by_capability``, ``errors``). The ``frozen``
  event records the sha256 of every test data file read, as the manifest does for train and
  valid.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path

from evolve.config import ConfigError, stored_config
from evolve.evaluation.executor import EvalError, ProgressFn, run_eval, write_run
from evolve.evaluation.report import ScoreBlock
from evolve.evolution.archive import fitness
from evolve.evolution.candidate import TEST
from evolve.evolution.manifest import data_hashes
from evolve.evolution.store import CandidateMeta, RunStore
from evolve.evolution.wiring import eval_setup, job_backend, judge_client, task_set
from evolve.trace import first_error


class FreezeError(Exception):
    """A candidate cannot be frozen; the message is one line for the user."""


@dataclass(frozen=True)
class Frozen:
    """The outcome of :func:`freeze`: the candidate as stored now, whether this call scored it,
    and the run's other frozen candidates."""

    meta: CandidateMeta
    scored: bool
    others: list[str]

    @property
    def test(self) -> ScoreBlock:
        return self.meta.scores[TEST]


Progress = Callable[[int], AbstractContextManager[ProgressFn]]
"""Given the number of questions, a context manager yielding ``advance(n, description)``."""


def freeze(
    store: RunStore,
    candidate_id: str,
    *,
    data_dir: Path | None = None,
    cache_dir: str | None = None,
    embedder: str | None = None,
    jobs: int | None = None,
    progress: Progress | None = None,
) -> Frozen:
    """Mark a candidate final and score it once on test; see the module's invariants. Every
    keyword defaults to the run config's value."""
    meta = store.get(candidate_id)
    others = [c.id for c in store.candidates() if c.frozen and c.id != meta.id]
    if meta.frozen and TEST in meta.scores:
        return Frozen(meta, False, others)
    if meta.status != "evaluated":
        raise FreezeError(
            f"only an evaluated candidate can be frozen; {store.run_id}/{meta.id} is {meta.status}"
        )
    try:
        config = stored_config(store.manifest, store.run_id)
    except ConfigError as exc:
        raise FreezeError(str(exc)) from None
    root = Path(data_dir or config.data_dir)
    if not root.is_dir():
        raise FreezeError(f"data directory {root} does not exist; pass --data-dir")
    # test-split LLM calls count in the run's spend (the run's call log)
    setup = eval_setup(config, store.root, "freeze", reuse=True,
                           cache_dir=cache_dir or config.cache_dir,
                           embedder=embedder or config.embedder)  # fmt: skip
    config = config.replace(data_dir=str(root))
    tasks = task_set(config, TEST)
    with progress(len(tasks.questions)) if progress else nullcontext(None) as advance:
        try:
            report = run_eval(
                store.source_path(meta.id),
                tasks,
                setup,
                on_progress=advance,
                backend=job_backend(config, jobs),
                judge=judge_client(config, store.root, setup.cache_dir, cached=True),
                judge_variant=config.judge_variant,
            )
        except EvalError as exc:
            raise FreezeError(str(exc)) from None
    write_run(report, store.root / f"freeze-{meta.id}")  # traces, kept even when refused
    if report.meta.errors:
        first = first_error(report.traces)
        raise FreezeError(
            f"{report.meta.errors} of {report.meta.questions} test questions failed "
            f"(first: {first[:200]}); no test score was recorded — steps computed so far are "
            f"cached, so freeze again (traces in {store.root / f'freeze-{meta.id}'})"
        )
    block = ScoreBlock.test_block(report)
    meta = store.update(meta.id, frozen=True, scores={**meta.scores, TEST: block})
    store.log_event(
        "frozen",
        candidate=meta.id,
        test=fitness(block.overall),
        conversations=len(tasks.conversations),
        questions=len(tasks.questions),
        embedder=setup.embedder,
        data=data_hashes(config, TEST),
        others=others,
    )
    return Frozen(meta, True, others)
