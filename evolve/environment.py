"""The environment settings that name PrisMem's folders: ``PRISMEM_DATA`` (the benchmark data
root), ``PRISMEM_RUNS`` (where run folders go) and ``PRISMEM_CACHE`` (the step, embedding and
LLM caches).

Owns :data:`PREFIX`, :data:`OLD_PREFIX` and :func:`folder`, the one reader of these settings
(the command line, the split builder, the bench scripts and the tests all ask it).

Invariants: a setting is read under its ``PRISMEM_`` name; the ``EVOLVE_`` name is accepted
for this release when the new one is unset, with one ``warning:`` line on stderr naming the new
name, once per setting and process; when both are set the new one wins and the old one is not
read. An empty value counts as unset. This module imports nothing of the project.
"""

from __future__ import annotations

import os
import sys
from typing import Literal

PREFIX = "PRISMEM_"
OLD_PREFIX = "EVOLVE_"  # accepted for this release, with a warning

Folder = Literal["DATA", "RUNS", "CACHE"]

_warned: set[str] = set()  # the old names this process has warned about


def folder(name: Folder) -> str | None:
    """The value of ``PRISMEM_<name>``, else of ``EVOLVE_<name>`` (one warning line, once),
    else None."""
    value = os.environ.get(PREFIX + name)
    if value:
        return value
    old = os.environ.get(OLD_PREFIX + name)
    if not old:
        return None
    if name not in _warned:
        _warned.add(name)
        print(f"warning: {OLD_PREFIX}{name} is read for this release only; set {PREFIX}{name} "
              "instead", file=sys.stderr, flush=True)  # fmt: skip
    return old
