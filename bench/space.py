"""Benchmark: what offline tuning can reach in a program's space of tunables.

A measurement script, not a test. It runs the program **in process, with no sandbox host**, so
give it only a trusted program (the project's seeds). Each variant is the program with some
tunable constants set (:func:`evolve.evolution.constants.searchable`: the ones constant search may
move), run through offline mode's stand-ins as the executor runs them (one unit per message,
the question as the query; :mod:`contract.program`) over a split (BEAM-100K unless named
otherwise), and scored with evidence coverage (:mod:`evolve.scoring.coverage`), overall, per
capability, and for broad and narrow questions (:data:`BROAD_EVIDENCE`).

- ``--moves``: the program as written, then each tunable moved alone halfway to each end of its
  range (a bool flipped): the gain of every single move, per capability, on ``--split``. This
  is the evidence behind :data:`evolve.evolution.constants.GUIDANCE`. ``--at NAME=VALUE ...``
  measures the moves from a tuned point instead (a move's worth depends on where a run already
  is: at LENGTH_PENALTY 0.25 the role weights, worth 7-8 pp at the seed, move under a point),
  and ``--only NAME ...`` moves just the tunables named.
- ``--score``: the program at ``--at`` on each of ``--splits`` (default train and valid), overall
  and per capability; a split is ``[BENCH:]SPLIT[@N]`` (``holdout``, ``locomo:all``,
  ``test@2``: the first 2 conversations). Tune on BEAM-100K train and valid only; the other
  benchmarks and sizes are there to check that what was tuned transfers, never to choose by.
- ``--search N``: optuna's TPE (seeded) over all the tunables at once for N trials on train,
  starting from the program as written; the best trial is then scored on valid and holdout.
  An upper bound, in practice, on what a run's constant search finds in that space. ``--keep
  NAME ...`` holds some tunables at their written values (a new chunking encodes every
  conversation again: minutes per trial).

    python bench/space.py --data-dir ../shared/data --moves
    python bench/space.py --data-dir ../shared/data --moves --at LENGTH_PENALTY=0.25 \
        --only USER_WEIGHT ASSISTANT_WEIGHT
    python bench/space.py --data-dir ../shared/data --search 120 --keep CHUNK_CHARS CHUNK_OVERLAP
    python bench/space.py --data-dir ../shared/data --score --at LENGTH_PENALTY=0.3 \
        --splits train valid locomo:all all:500K@2

Embeddings are read from and written to the shared cache (``--cache-dir``, default
``~/.cache/prismem``), so only a chunking not seen before costs encoding time.
"""

from __future__ import annotations

import argparse
import ast
import json
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import optuna
from scale import LocalBackend

from contract.program import load_program, offline_units
from contract.spec import OUT_CHAR_BUDGET
from evolve.benches import registry
from evolve.datasets.types import TaskSet
from evolve.evolution.constants import Tunable, Value, searchable
from evolve.models.embed import Embedder
from evolve.resources import seed_file
from evolve.scoring.coverage import CoverageScorer, ScoreInput

CAPS = ("F", "T", "P", "M", "A")
BROAD_EVIDENCE = 8  # a question with this many evidence messages or more is "broad" (a summary,
# a timeline of the whole history); the rest are "narrow" (docs/performance.md, "Broad questions")
GROUPS = ("all", *CAPS, "broad", "narrow")


class Space:
    """A program's variants scored on benchmark splits (``[BENCH:]SPLIT[@N]``), in process."""

    def __init__(self, program: Path, data_dir: Path, cache_dir: Path) -> None:
        self.source, self.path = program.read_text(), str(program)
        self.data_dir = data_dir
        self.embedder = Embedder(cache_path=cache_dir / "embeddings.sqlite")
        self.scorer = CoverageScorer(self.embedder)
        self.tasks: dict[str, TaskSet] = {}

    def score(self, split: str, values: dict[str, Value]) -> dict[str, float]:
        """Coverage of the program with ``values`` set: overall and per capability."""
        if split not in self.tasks:
            self.tasks[split] = taskset(self.data_dir, split)
        tasks = self.tasks[split]
        evidence, by_conv = tasks.evidence_texts(), tasks.by_conversation()
        items = []
        for conv in tasks.conversations:
            program = load_program(self.source, self.path)
            vars(program.module).update(values)
            memory = program.module.Memory(LocalBackend(self.embedder))
            for segment in conv.sessions:
                memory.index(offline_units(program, segment), segment)
            for q in by_conv[conv.id]:
                text = memory.retrieve(program.module.Query(text=q.question))[:OUT_CHAR_BUDGET]
                items.append(ScoreInput(q, evidence[q.id], text))
        groups: dict[str, list[float]] = defaultdict(list)
        for item, row in zip(items, self.scorer.score(items), strict=True):
            if row["evidence_coverage"] is not None:
                breadth = "broad" if len(item.evidence) >= BROAD_EVIDENCE else "narrow"
                for group in ("all", item.question.capability, breadth):
                    groups[group].append(row["evidence_coverage"])
        return {k: float(np.mean(v)) for k, v in groups.items()}


def taskset(data_dir: Path, spec: str) -> TaskSet:
    """The split named ``[BENCH:]SPLIT[@N]`` (BEAM unless BENCH is a benchmark's name; @N: the
    first N conversations)."""
    name, _, first = spec.partition("@")
    bench, _, split = name.partition(":")
    if bench not in registry.names():
        bench, split = "beam", name
    tasks = registry.bench(bench).load_taskset(data_dir, split)
    return tasks.first(int(first) if first else None)


def halfway(t: Tunable) -> list[Value]:
    """The single moves of ``t``: halfway to each end of its range (a bool: flipped)."""
    if t.kind == "bool":
        return [not t.value]
    assert t.low is not None and t.high is not None
    out: list[Value] = []
    for end in (t.low, t.high):
        x = (float(t.value) + end) / 2
        v: Value = int(round(x)) if t.kind == "int" else round(x, 3)
        if v != t.value and v not in out:
            out.append(v)
    return out


def _row(label: str, scores: dict[str, float], base: dict[str, float] | None = None) -> str:
    ref = base or dict.fromkeys(scores, 0.0)
    sign = "+" if base else ""
    cells = [f"{k} {scores[k] - ref[k]:{sign}.3f}" for k in GROUPS if k in scores]
    return f"{label:28s} " + "  ".join(cells)


def moves(space: Space, split: str, at: dict[str, Value], only: list[str]) -> None:
    base = space.score(split, at)
    print(_row(f"at {json.dumps(at)}" if at else "as written", base), flush=True)
    for t in searchable(space.source):
        if only and t.name not in only:
            continue
        t = replace(t, value=at.get(t.name, t.value))
        for value in halfway(t):
            scores = space.score(split, {**at, t.name: value})
            print(_row(f"{t.name} {t.value} -> {value}", scores, base), flush=True)


def score(space: Space, splits: list[str], at: dict[str, Value]) -> None:
    for split in splits:
        began = time.perf_counter()
        scores = space.score(split, at)
        print(_row(f"{split} ({time.perf_counter() - began:.0f} s)", scores), flush=True)


def assignment(text: str) -> tuple[str, Value]:
    """``NAME=VALUE`` (a Python literal: 0.25, 3, True) as a pair; argparse's type."""
    name, _, literal = text.partition("=")
    try:
        value = ast.literal_eval(literal)
    except (ValueError, SyntaxError) as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: VALUE must be a number or a bool") from exc
    if not name or not isinstance(value, int | float):
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAME=VALUE")
    return name, value


def _suggest(trial: optuna.Trial, t: Tunable) -> Value:
    if t.kind == "bool":
        return bool(trial.suggest_categorical(t.name, [False, True]))
    assert t.low is not None and t.high is not None
    if t.kind == "int":
        return trial.suggest_int(t.name, int(t.low), int(t.high))
    return trial.suggest_float(t.name, t.low, t.high)


def search(space: Space, trials: int, seed: int, keep: list[str]) -> None:
    names = [t for t in searchable(space.source) if t.name not in keep]
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=seed))
    study.enqueue_trial({t.name: t.value for t in names})

    def objective(trial: optuna.Trial) -> float:
        return space.score("train", {t.name: _suggest(trial, t) for t in names})["all"]

    began = time.perf_counter()
    for n in range(1, trials + 1):
        study.optimize(objective, n_trials=1)
        if n % 10 == 0 or n == trials:
            seconds = time.perf_counter() - began
            print(f"trial {n}: best train {study.best_value:.4f} ({seconds:.0f} s)", flush=True)
    best: dict[str, Any] = study.best_params
    print("best:", json.dumps(best))
    for split in ("train", "valid", "holdout"):
        seed_scores, best_scores = space.score(split, {}), space.score(split, best)
        print(_row(f"{split} as written", seed_scores))
        print(_row(f"{split} best", best_scores))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--program", type=Path, default=seed_file("hybrid.py"))
    parser.add_argument("--cache-dir", type=Path, default=Path.home() / ".cache" / "prismem")
    parser.add_argument("--split", default="train")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", nargs="*", default=[], metavar="NAME", help="not searched")
    parser.add_argument(
        "--at",
        nargs="*",
        type=assignment,
        default=[],
        metavar="NAME=VALUE",
        help="--moves from this point, not the program as written",
    )
    parser.add_argument("--only", nargs="*", default=[], metavar="NAME", help="--moves: just these")
    parser.add_argument("--splits", nargs="*", default=["train", "valid"], help="--score: where")
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--moves", action="store_true")
    mode.add_argument("--search", type=int, metavar="N")
    mode.add_argument("--score", action="store_true", help="the program at --at on --splits")
    args = parser.parse_args()
    space = Space(args.program, args.data_dir, args.cache_dir)
    print(f"{args.program} in process (no sandbox), evidence coverage")
    if args.moves:
        moves(space, args.split, dict(args.at), args.only)
    elif args.score:
        score(space, args.splits, dict(args.at))
    else:
        search(space, args.search, args.seed, args.keep)


if __name__ == "__main__":
    main()
