"""Convert a benchmark's task set into the user format (docs/user-format.md).

Reads any registered ``BENCH:SPLIT`` (``evolve eval --split``'s names: ``beam:train``,
``beam:all:500K``, ``locomo:all``, ...) from the data root with the bench's own loader and
writes it with :func:`evolve.datasets.userformat.write_dataset` as a folder that
``--bench jsonl --data-dir OUT`` reads::

    python bench/convert.py beam:train /tmp/beam-train --conversations 2
    python bench/convert.py locomo:all /tmp/locomo-sample --data-dir ../shared/data

Everything a memory program or a scorer reads is kept verbatim: conversation, session,
message and question ids, session and question dates, roles, contents, gold answers, evidence
ids, capabilities, rubrics and question meta (which holds the question as the benchmark poses
it); the benchmark's question type becomes ``kind`` (the question's ``ability``). So the
converted data renders byte-identically and an offline evaluation of a program retrieves the
same text on both (``tests/test_user_bench.py``). What the user format has no place for —
a conversation's meta (title, speakers, the file it was read from) — is left out; nothing
downstream of the loaders reads it.

A task set that breaks a rule of the format (a dangling evidence id, dates out of order) is
refused with one ``error:`` line per problem and exit status 2; nothing is written.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from evolve.benches.registry import bench
from evolve.datasets.types import DataError, TaskSet
from evolve.datasets.userformat import Dataset, Invalid, write_dataset
from evolve.environment import folder


def read(spec: str, data_dir: Path, conversations: int | None = None) -> TaskSet:
    """The task set ``BENCH:SPLIT`` names, read from ``data_dir`` (its first ``conversations``
    conversations; None: all). DataError (one line) for a spec or split that does not load."""
    name, colon, split = spec.partition(":")
    if not colon or not split:
        raise DataError(f"{spec!r} is not BENCH:SPLIT (e.g. beam:train, locomo:all)")
    return bench(name).load_taskset(data_dir, split).first(conversations)


def dataset(tasks: TaskSet, name: str) -> Dataset:
    """``tasks`` as a user-format dataset named ``name``; the records are the loader's own."""
    return Dataset(name=name, source=f"convert:{tasks.bench}", conversations=tasks.conversations,
                   questions=tasks.questions)  # fmt: skip


def convert(
    spec: str, out: Path, data_dir: Path, conversations: int | None = None, replace: bool = False
) -> Dataset:
    """Write ``spec``'s task set under ``out`` (``replace``: swap out a dataset already there);
    the dataset written."""
    tasks = read(spec, data_dir, conversations)
    tail = "" if conversations is None else f"@{conversations}"
    converted = dataset(tasks, f"{spec}{tail}")
    write_dataset(out, converted, replace=replace)
    return converted


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec", help="BENCH:SPLIT, e.g. beam:train, beam:all:500K, locomo:all")
    parser.add_argument("out", type=Path, help="the folder to write (must not hold data)")
    parser.add_argument("--conversations", type=int, default=None,
                        help="only the split's first N conversations")  # fmt: skip
    parser.add_argument("--data-dir", type=Path, default=None,
                        help="benchmark data root (default: $PRISMEM_DATA)")  # fmt: skip
    parser.add_argument("--replace", action="store_true", help="replace a dataset in OUT")
    args = parser.parse_args(argv)
    root = args.data_dir or folder("DATA")
    if root is None:
        parser.error("no data directory: pass --data-dir DIR or set PRISMEM_DATA")
    if args.conversations is not None and args.conversations < 1:
        parser.error("--conversations must be at least 1")
    try:
        written = convert(args.spec, args.out, Path(root), args.conversations, args.replace)
    except Invalid as exc:
        for line in exc.lines():
            print(f"error: {line}", file=sys.stderr)
        return 2
    except DataError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    sessions = sum(len(c.sessions) for c in written.conversations)
    print(f"{args.out}: {len(written.conversations)} conversations, {sessions} sessions, "
          f"{len(written.questions)} questions ({written.name}, {written.source})")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
