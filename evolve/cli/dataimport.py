"""``evolve data import KIND SOURCE --out DIR``: a user's chat logs, or a deployed memory's
store, as a folder of the user format (:mod:`evolve.importers`,
:mod:`evolve.datasets.userformat`).

Owns :func:`add_command` (registers ``import`` on ``evolve data``'s subcommands) and
:func:`cmd_import`.

Invariants: errors follow :mod:`evolve.cli.common` — input the importer cannot take is one
``error:`` line per problem, exit status 2, and nothing is written; the folder is written by
:func:`~evolve.datasets.userformat.write_dataset` (checked again, whole or not at all; an
existing non-empty ``--out`` is refused unless ``--replace``). On success it prints what was
kept and what was skipped, in counts, and the importer's notes, each on a line of its own.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rich.markup import escape

from evolve.cli.common import err, out
from evolve.datasets.types import DataError
from evolve.datasets.userformat import Invalid, write_dataset
from evolve.importers import KINDS


def add_command(data_sub: Any) -> None:
    """Register ``import`` on ``evolve data``'s subparsers."""
    imp = data_sub.add_parser(
        "import", help="import chat logs or a memory store as a folder of your own conversations"
    )
    imp.add_argument("kind", choices=list(KINDS), help="what SOURCE is")
    imp.add_argument(
        "source", type=Path,
        help="openai: a JSONL file; chatgpt, claude: conversations.json, the export's folder or "
        "its zip; store: a memory store folder (read while a runtime may hold it open)",
    )  # fmt: skip
    imp.add_argument("--out", type=Path, required=True, help="the folder to write")
    imp.add_argument("--name", help="the dataset's name (default: the --out folder's name)")
    imp.add_argument(
        "--per-chat", action="store_true",
        help="chatgpt, claude, openai: each chat its own conversation (default: your whole "
        "history is one conversation, each chat a session of it)",
    )  # fmt: skip
    imp.add_argument("--replace", action="store_true", help="replace an existing data folder")


def cmd_import(args: argparse.Namespace) -> int:
    """Import ``args.source`` as ``args.kind`` and write it to ``args.out`` (see the module's
    invariants)."""
    name = args.name or Path(args.out).absolute().name
    try:
        imported = KINDS[args.kind](Path(args.source), name, per_chat=args.per_chat)
        folder = write_dataset(Path(args.out), imported.dataset, replace=args.replace)
    except DataError as exc:  # Invalid: every problem; another: its one line
        for problem in exc.lines() if isinstance(exc, Invalid) else [str(exc)]:
            err.print(f"[red]error:[/] {escape(problem)}", highlight=False, markup=True)
        return 2
    lines = summary(imported.kept, imported.skipped, imported.notes)
    for line in [*lines, f"wrote {folder} ({imported.dataset.source})"]:
        out.print(escape(line), highlight=False, soft_wrap=True)
    return 0


def summary(kept: dict[str, int], skipped: dict[str, int], notes: tuple[str, ...]) -> list[str]:
    """What an import kept (one line), what it skipped (a line per what, most first) and its
    notes (a line each)."""
    lines = ["kept: " + ", ".join(f"{what} {n:,}" for what, n in kept.items())]
    order = sorted(skipped.items(), key=lambda item: (-item[1], item[0]))
    lines += [f"skipped: {n:>7,} {what}" for what, n in order] or ["skipped: nothing"]
    return lines + [f"note: {note}" for note in notes]
