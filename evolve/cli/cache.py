"""``evolve cache``: what the cache folder holds, and pruning what no current pipeline version
reads.

Owns :func:`add_command` and :func:`cmd_cache`. The step store keeps one folder per pipeline
version under each step (:mod:`evolve.evaluation.stepcache`); an entry of another version, or of the
layout before version folders, is never read by this pipeline version
(:func:`evolve.evaluation.identity.pipeline_version` is in every key), so ``--prune`` removes
those
folders. The other caches (embeddings, LLM replies, ceilings) are keyed by their content and
stay readable across versions; they are shown, never pruned here.

Invariants: without ``--prune`` nothing is changed; a cache folder that does not exist is one
``error:`` line; pruning removes only folders :func:`evolve.evaluation.stepcache.stale_folders`
names.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path
from typing import Any

from evolve.cli.common import UsageError, default_cache_dir, out
from evolve.evaluation.identity import pipeline_version
from evolve.evaluation.stepcache import STEPS_FOLDER, stale_folders, step_root, step_usage


def add_command(sub: Any) -> None:
    """Register ``evolve cache`` on the ``evolve`` parser's subparsers."""
    parser = sub.add_parser(
        "cache", help="show the cache's size; --prune removes step outputs no version reads"
    )
    parser.add_argument(
        "--cache-dir", type=Path, default=None,
        help="the cache folder (default ~/.cache/prismem or $PRISMEM_CACHE)",
    )  # fmt: skip
    parser.add_argument(
        "--prune", action="store_true",
        help="remove the step outputs of other pipeline versions (no current one reads them)",
    )  # fmt: skip


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def _mib(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB"


def cmd_cache(args: argparse.Namespace) -> int:
    root = Path(args.cache_dir) if args.cache_dir is not None else default_cache_dir()
    if not root.is_dir():
        raise UsageError(f"no cache folder at {root}")
    version = pipeline_version()
    steps = step_root(root)
    usage = step_usage(steps, version)
    out.print(f"cache {root}")
    out.print(f"steps, this pipeline version: {usage.current_entries:,} entries, "
              f"{_mib(usage.current_bytes)}")  # fmt: skip
    out.print(f"steps, other versions (unreadable now): {usage.stale_entries:,} entries, "
              f"{_mib(usage.stale_bytes)}")  # fmt: skip
    for other in sorted(p for p in root.iterdir() if p.name != STEPS_FOLDER):
        out.print(f"{other.name}: {_mib(_size(other))}")
    if not args.prune:
        if usage.stale_entries:
            out.print("evolve cache --prune removes the step outputs of other versions")
        return 0
    for folder in stale_folders(steps, version):
        shutil.rmtree(folder)
    out.print(f"pruned {usage.stale_entries:,} entries, {_mib(usage.stale_bytes)}")
    return 0
