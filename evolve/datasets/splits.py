"""Split files: build them deterministically from a seed, write them, and verify them.

Owns ``splits/beam.json``. BEAM (docs/design.md §6): the BEAM-100K conversations found on disk, in
numeric order, are shuffled with ``random.Random(seed)``; the first 8 are train, the next 6
valid, the last 6 holdout. Test is every BEAM-1M conversation with a chat file in the data dir,
guard (the default run's longer-history guard set, :mod:`evolve.benches.guards`) every BEAM-500K
one.

Invariants:
- The same seed and the same data give byte-identical files (no timestamps, sorted keys).
- No conversation is in two splits; counts (questions, per capability, per ability) are computed
  from the loaded probing questions, never typed in.
- `evolve.datasets.beam.load_taskset` reads what this module writes.

Usage: ``python -m evolve.datasets.splits [--data-dir DIR] [--seed N] [--check]``.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from evolve.datasets import beam
from evolve.datasets.types import CAPABILITIES, DataError
from evolve.environment import folder

BEAM_TRAIN, BEAM_VALID, BEAM_HOLDOUT = 8, 6, 6
BEAM_GENERATOR = (
    "evolve.datasets.splits.build_beam_splits: BEAM-100K conversation numbers in numeric order, "
    "shuffled with random.Random(seed); first 8 = train, next 6 = valid, last 6 = holdout; "
    "test = every BEAM-1M conversation with a chat file in the data dir (numeric order); "
    "guard = every BEAM-500K conversation with a chat file in the data dir (numeric order)"
)


def _summary(data_dir: Path, refs: list[tuple[str, str]]) -> dict[str, Any]:
    """The split entry: conversation refs plus counts computed from their probing questions."""
    questions = [q for size, conv in refs for q in beam.load_questions(data_dir, size, conv)]
    per_cap = Counter(q.capability for q in questions)
    per_ability = Counter(q.ability for q in questions)
    return {
        "conversations": [{"size": size, "conv": conv} for size, conv in refs],
        "n_conversations": len(refs),
        "n_questions": len(questions),
        "per_capability": {c: per_cap.get(c, 0) for c in CAPABILITIES},
        "per_ability": {a: per_ability.get(a, 0) for a in sorted(beam.ABILITY_CAPABILITY)},
    }


def build_beam_splits(data_dir: Path, seed: int = 0) -> dict[str, Any]:
    """The BEAM splits for ``seed`` as a JSON-ready dict."""
    convs = beam.list_conversations(data_dir, "100K")
    need = BEAM_TRAIN + BEAM_VALID + BEAM_HOLDOUT
    if len(convs) != need:
        raise DataError(
            f"BEAM splits need {need} BEAM-100K conversations with chats, found {len(convs)} "
            f"under {Path(data_dir) / 'beam' / 'chats' / '100K'}"
        )
    order = list(convs)
    random.Random(seed).shuffle(order)
    parts = {
        "train": order[:BEAM_TRAIN],
        "valid": order[BEAM_TRAIN : BEAM_TRAIN + BEAM_VALID],
        "holdout": order[BEAM_TRAIN + BEAM_VALID :],
    }
    key = beam.conv_sort_key
    splits = {name: [("100K", c) for c in sorted(cs, key=key)] for name, cs in parts.items()}
    splits["test"] = [("1M", c) for c in beam.list_conversations(data_dir, "1M")]
    splits["guard"] = [("500K", c) for c in beam.list_conversations(data_dir, "500K")]
    return {
        "bench": "beam",
        "seed": seed,
        "generator": BEAM_GENERATOR,
        "splits": {name: _summary(data_dir, refs) for name, refs in splits.items()},
    }


def render(splits: dict[str, Any]) -> str:
    """The file text: stable indentation, a trailing newline."""
    return json.dumps(splits, indent=2, ensure_ascii=False) + "\n"


def write_beam_splits(data_dir: Path, seed: int = 0, path: Path | None = None) -> Path:
    """Build the BEAM splits and write them (default: the repo's ``splits/beam.json``)."""
    out = Path(path) if path is not None else beam.DEFAULT_SPLITS_FILE
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render(build_beam_splits(data_dir, seed)), encoding="utf-8")
    return out


def verify_beam_splits(data_dir: Path, path: Path | None = None) -> list[str]:
    """Differences between a splits file and what its own seed produces (empty: they match)."""
    file = Path(path) if path is not None else beam.DEFAULT_SPLITS_FILE
    existing = beam.read_json(file)
    if not isinstance(existing, dict) or not isinstance(existing.get("seed"), int):
        return [f"{file}: no integer 'seed'"]
    expected = build_beam_splits(data_dir, existing["seed"])
    problems: list[str] = []
    for key in ("bench", "seed", "generator"):
        if existing.get(key) != expected[key]:
            problems.append(f"{key}: file has {existing.get(key)!r}, seed gives {expected[key]!r}")
    raw = existing.get("splits")
    have: dict[str, Any] = raw if isinstance(raw, dict) else {}
    for name in sorted(set(have) | set(expected["splits"])):
        if name not in have:
            problems.append(f"split {name!r} missing from the file")
        elif name not in expected["splits"]:
            problems.append(f"split {name!r} is not produced by the generator")
        else:
            entry = have[name] if isinstance(have[name], dict) else {}
            for field, value in expected["splits"][name].items():
                if entry.get(field) != value:
                    problems.append(f"split {name!r} field {field!r} differs from the seed's")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build or check splits/beam.json.")
    parser.add_argument(
        "--data-dir", type=Path, default=folder("DATA"),
        help="the folder holding beam/ (default: $PRISMEM_DATA)",
    )  # fmt: skip
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--check", action="store_true", help="verify instead of writing")
    args = parser.parse_args(argv)
    if args.data_dir is None:
        print("error: no data directory: pass --data-dir or set PRISMEM_DATA", file=sys.stderr)
        return 2
    args.data_dir = Path(args.data_dir)
    try:
        if args.check:
            problems = verify_beam_splits(args.data_dir, args.out)
            for p in problems:
                print(p, file=sys.stderr)
            return 1 if problems else 0
        print(write_beam_splits(args.data_dir, args.seed, args.out))
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
