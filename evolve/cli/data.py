"""The ``evolve data`` commands: the benchmark releases and a folder of your own conversations.

Owns the ``data`` parser (:func:`add_command`) and its dispatch (:func:`cmd_data`), and three
of its subcommands: ``fetch`` (a benchmark's release into the data root, by its bench entry's
``fetch``, :mod:`evolve.benches.registry`), ``validate DIR`` (reads a user-format folder,
:mod:`evolve.datasets.userformat`, and prints what it holds) and ``split DIR`` (writes its
seeded ``splits.json``, :mod:`evolve.datasets.usersplits`). ``import`` is
:mod:`evolve.cli.dataimport`'s and ``annotate`` :mod:`evolve.cli.annotate`'s, registered and
dispatched here.

Invariants: errors follow :mod:`evolve.cli.common` — one ``error:`` line and exit status 2; a
folder that does not validate is one ``error:`` line per problem (the format module's
``FILE:LINE: FIELD: what is wrong``, printed by :func:`evolve.cli.main.main`), exit status 2,
and nothing is written. ``validate`` writes nothing; ``split`` writes ``splits.json`` only.
What the commands print is counted from the dataset as read, never from the files' text.
"""

from __future__ import annotations

import argparse
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.markup import escape

from evolve.benches.registry import bench, fetchable
from evolve.cli import annotate, dataimport
from evolve.cli.common import UsageError, err, non_negative_int, out
from evolve.datasets.types import CAPABILITIES
from evolve.datasets.userformat import Dataset, read_dataset
from evolve.datasets.usersplits import NAMES, SPLITS, ensure_splits
from evolve.environment import folder


def add_command(sub: Any) -> None:
    """Register ``data`` and its subcommands on the ``evolve`` parser's subparsers."""
    data = sub.add_parser("data", help="benchmark data and folders of your own conversations")
    data_sub = data.add_subparsers(dest="data_command", required=True)
    fetch = data_sub.add_parser("fetch", help="download a benchmark release into the data dir")
    fetch.add_argument("bench", choices=list(fetchable()))
    fetch.add_argument("--data-dir", help="benchmark data root (default: $PRISMEM_DATA)")
    fetch.add_argument("--sizes", default="100K,1M", help="comma-separated: 100K,500K,1M,10M")
    validate = data_sub.add_parser(
        "validate", help="check a folder of your own conversations (docs/user-format.md)"
    )
    validate.add_argument("dir", type=Path, help="the folder (holds prismem-data.json)")
    split = data_sub.add_parser(
        "split", help="write (or rewrite) a folder's seeded train/valid/holdout splits"
    )
    split.add_argument("dir", type=Path, help="the folder (holds prismem-data.json)")
    split.add_argument("--seed", type=non_negative_int, default=0, help="split seed (default 0)")
    dataimport.add_command(data_sub)
    annotate.add_command(data_sub)


def cmd_data(args: argparse.Namespace) -> int:
    """Run the ``data`` subcommand ``args`` names."""
    return SUBCOMMANDS[args.data_command](args)


def cmd_fetch(args: argparse.Namespace) -> int:
    fetch = bench(args.bench).fetch
    if fetch is None:
        raise UsageError(f"{args.bench} has no release to fetch")
    root = Path(args.data_dir or folder("DATA") or "")
    if not str(root) or str(root) == ".":
        raise UsageError("no data directory: pass --data-dir DIR or set PRISMEM_DATA")
    sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    fetch(root, sizes)
    err.print(f"BEAM {', '.join(sizes)} written under {root / 'beam'}")
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    dataset = read_dataset(args.dir)  # Invalid: main prints each problem as an error line
    for line in counts(dataset):
        out.print(escape(line), highlight=False)
    if not (args.dir / SPLITS).is_file():
        out.print(f"no {SPLITS} yet (a run's first load, or `evolve data split DIR`, writes it)")
        return 0
    splits, _ = ensure_splits(args.dir, dataset)  # read back: DataError when it no longer fits
    for line in split_lines(splits, dataset):
        out.print(escape(line), highlight=False)
    return 0


def cmd_split(args: argparse.Namespace) -> int:
    dataset = read_dataset(args.dir)  # Invalid: main prints each problem as an error line
    splits, _ = ensure_splits(args.dir, dataset, seed=args.seed, rewrite=True)
    out.print(escape(f"{args.dir / SPLITS} written"), highlight=False)
    for line in split_lines(splits, dataset):
        out.print(escape(line), highlight=False)
    return 0


def counts(dataset: Dataset) -> list[str]:
    """What a dataset holds, in three lines: its name and source; conversations, sessions and
    messages; questions per capability and those not labelled."""
    sessions = [s for c in dataset.conversations for s in c.sessions]
    messages = sum(len(s.messages) for s in sessions)
    by_capability = Counter(q.capability for q in dataset.questions)
    labelled = ", ".join(f"{c} {by_capability[c]}" for c in CAPABILITIES if by_capability[c])
    return [
        f"{dataset.name} (source {dataset.source})",
        f"{_count(len(dataset.conversations), 'conversation')}, "
        f"{_count(len(sessions), 'session')}, {_count(messages, 'message')}",
        f"{_count(len(dataset.questions), 'question')}: {labelled or 'none labelled'}; "
        f"{by_capability['']} unlabelled",
    ]


def _count(n: int, what: str) -> str:
    return f"{n:,} {what}{'s' * (n != 1)}"


def split_lines(splits: dict[str, Any], dataset: Dataset) -> list[str]:
    """A folder's splits in one line of sizes (each split's conversations or questions, and
    its questions), and the reason when they are by question."""
    ids = splits["splits"]
    if splits["by"] == "conversation":
        asked = Counter(q.conversation_id for q in dataset.questions)
        sizes = [f"{name} {len(ids[name])} ({sum(asked[c] for c in ids[name])} questions)"
                 for name in NAMES if ids[name]]  # fmt: skip
        lines = [f"splits by conversation (seed {splits['seed']}): {', '.join(sizes)}"]
    else:
        sizes = [f"{name} {len(ids[name])}" for name in NAMES if ids[name]]
        lines = [f"splits by question (seed {splits['seed']}): {', '.join(sizes)} questions"]
    if splits.get("reason"):
        lines.append(f"why: {splits['reason']}")
    return lines


SUBCOMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "fetch": cmd_fetch,
    "validate": cmd_validate,
    "split": cmd_split,
    "import": dataimport.cmd_import,
    "annotate": annotate.cmd_annotate,
}
