"""A run's configuration: :class:`RunConfig`, what an ``evolve run`` is started with.

Owns :class:`RunConfig` (the bench, the data and cache folders, the rounds per evolution stage,
where evaluation runs, one typed :class:`~evolve.models.llm.ModelConfig` per model role, the LLM
transport limits (requests in flight for the whole run, seconds per request), the budget caps,
the repair attempts per round (:data:`REPAIRS` by default), the children per round and the
evaluation cascade (docs/design.md §4), the guard sets (:mod:`evolve.benches.guards`) and the
data root a guard of another bench reads (:meth:`RunConfig.guard_root`), the constant
proposer's search strategy and its index moves, and the ablations), the evolution stages'
order (:data:`STAGES`, the keys of ``rounds``) and the splits a run evaluates on
(:data:`SPLITS`), and which fitness a run selects on (:meth:`RunConfig.fitness`, its bench's
entry in :mod:`evolve.benches.registry`). The run manifest stores the config as JSON
(:meth:`RunConfig.as_json`); :func:`stored_config` reads it back.

Invariants: a config is validated whenever it is built, from flags or from a stored manifest:
unknown keys, wrong types and values outside their choices are refused, and a stored config
that does not validate is a :class:`ConfigError` with one line saying what is wrong (a damaged
or incompatible run is never resumed or frozen on a guess). A stored config from before
``children`` / ``cascade`` / ``index_moves`` existed reads as the run ran: one child per round,
no cascade, index moves allowed (:data:`AS_RAN`). ``guard_data_dir`` is stored only when it is
set: a config without it reads every guard from its data dir, as one stored before it existed
does. This module imports no part of the engine, so the commands that only read a run do not
load it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
)

from evolve.benches.guards import Guard, guard_root, parse_guard
from evolve.benches.registry import bench, names
from evolve.models import why
from evolve.models.limiter import DEFAULT_CONCURRENCY
from evolve.models.llm import ModelConfig
from evolve.scoring.fitness import Fitness, Variant

STAGES = ("cold_start", "refinement", "integration")
SPLITS = ("train", "valid")
REPAIRS = 3  # repair attempts after a proposal that fails to apply or fails the sandbox
CHILDREN = 2  # children proposed per round (evaluated concurrently)
MINIBATCH = 2  # train conversations of a round's cascade minibatch
# How a config stored without these keys ran: one child, no cascade, index moves allowed
AS_RAN = {"children": 1, "cascade": False, "index_moves": True}


class ConfigError(ValueError):
    """A stored run configuration is damaged or incompatible; the message is one line."""


class RunConfig(BaseModel):
    """What a run needs; stored (as JSON) in the run manifest."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    data_dir: str
    seed_program: str
    cache_dir: str
    bench: str = "beam"  # evolve.benches.registry: the task sets, scorer and fitness metrics
    rounds: dict[str, NonNegativeInt] = Field(
        default_factory=lambda: {"cold_start": 2, "refinement": 6, "integration": 2}
    )
    jobs: PositiveInt = 2
    backend: Literal["local", "ray"] = "local"  # evolve.evaluation.distributed
    ray_address: str | None = None  # None: a local Ray instance
    rng_seed: int = 0
    embedder: Literal["minilm", "hashing"] = "minilm"
    conversations: PositiveInt | None = None  # only the first N conversations of each split
    task_model: ModelConfig | None = None  # None = offline retrieval
    coder_model: ModelConfig | None = None  # None = the constant proposer
    judge_model: ModelConfig | None = None  # scores answers by the benchmark's protocol
    judge_variant: Variant = "described"  # BEAM's rubric variant the judged fitness reads
    llm_concurrency: PositiveInt = DEFAULT_CONCURRENCY  # requests in flight, whole run, per node
    llm_timeout: PositiveFloat = 120.0  # seconds one LLM request may take (then retried)
    max_usd: float | None = Field(default=None, ge=0)
    max_tokens: NonNegativeInt | None = None
    reuse: bool = True  # False: every evaluation recomputes every step (a measurement baseline)
    repairs: NonNegativeInt = REPAIRS  # repair attempts after a proposal that fails
    children: PositiveInt = CHILDREN  # children per round, evaluated concurrently
    cascade: bool = True  # screen each child on a train minibatch before full train + valid
    minibatch: PositiveInt = MINIBATCH  # train conversations in a round's minibatch
    # guard sets (evolve.benches.guards specs, canonical): a stored config without them ran
    # without guards
    guards: tuple[str, ...] = ()
    # the data root a guard of another bench reads (evolve.benches.guards.guard_root); None, and
    # absent from the stored config: the run's data dir
    guard_data_dir: str | None = None
    # ablations (docs/design.md §4): no capabilities; how refinement picks its target; which cases
    holistic: bool = False
    selection: Literal["dependency", "round-robin"] = "dependency"
    cases: Literal["worst", "random"] = "worst"
    offline_search: Literal["optuna", "random"] = "optuna"  # the constant proposer's strategy
    # constant search may move the constants extraction and indexing read (each such child is
    # encoded again in full: evolve.evolution.constants, "Index moves")
    index_moves: bool = False

    @field_validator("rounds")
    @classmethod
    def _known_stages(cls, rounds: dict[str, int]) -> dict[str, int]:
        unknown = sorted(set(rounds) - set(STAGES))
        if unknown:
            raise ValueError(f"unknown stages {unknown}; stages are {', '.join(STAGES)}")
        return rounds

    @field_validator("bench")
    @classmethod
    def _known_bench(cls, name: str) -> str:
        if name not in names():
            raise ValueError(f"unknown bench {name!r}; benches are {', '.join(names())}")
        return name

    @field_validator("guards")
    @classmethod
    def _guard_specs(cls, guards: tuple[str, ...]) -> tuple[str, ...]:
        names = tuple(parse_guard(g).name for g in guards)
        if len(set(names)) != len(names):
            raise ValueError(f"a guard is named twice in {', '.join(names)}")
        return names

    @model_serializer(mode="wrap")
    def _without_unset_guard_root(self, dump: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """The fields, less ``guard_data_dir`` when it is None (a config that reads every guard
        from its data dir is stored as before that field existed)."""
        fields: dict[str, Any] = dump(self)
        if fields.get("guard_data_dir") is None:
            fields.pop("guard_data_dir", None)
        return fields

    def as_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    def guard_root(self, guard: Guard) -> Path:
        """The data root ``guard`` reads in this run (:func:`evolve.benches.guards.guard_root`)."""
        root = None if self.guard_data_dir is None else Path(self.guard_data_dir)
        return guard_root(guard, self.bench, Path(self.data_dir), root)

    def fitness(self) -> Fitness:
        """The fitness this run selects on (its bench's, :func:`evolve.scoring.fitness.choose`)."""
        return bench(self.bench).fitness(self.task_model, self.judge_model is not None,
                                         self.judge_variant)  # fmt: skip

    def llm_limits(self) -> dict[str, Any]:
        """The transport limits as :func:`evolve.models.clients.role_client` takes them."""
        return {"concurrency": self.llm_concurrency, "timeout": self.llm_timeout}

    def replace(self, **changes: Any) -> RunConfig:
        """This config with ``changes``, validated like a new one."""
        return RunConfig.model_validate({**self.model_dump(), **changes})


def stored_config(manifest: dict[str, Any], run_id: str) -> RunConfig:
    """The config a run's manifest holds; ConfigError (one line) when it is missing, damaged or
    from an incompatible version."""
    stored = manifest.get("config")
    if not isinstance(stored, dict):
        raise ConfigError(f"run {run_id} has no usable config in its manifest")
    try:
        return RunConfig.model_validate({**AS_RAN, **stored})
    except ValueError as exc:
        raise ConfigError(
            f"run {run_id}: the config in its manifest is damaged or incompatible ({why(exc)})"
        ) from None
