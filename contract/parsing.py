"""Parsing Python source into an AST: the one way the project does it (``parse``).

CPython 3.11's AST constructor keeps its recursion depth in per-interpreter state, so two
threads building an AST at once can corrupt each other's count and one of them fails with
``SystemError: AST constructor recursion depth mismatch`` (python/cpython#106905). An
evaluation judges and plans questions in many threads, and readers of a program's source
(fingerprints, tunables, the static check) may run in them. Every ``ast.parse`` of the
project goes through :func:`parse`, which holds one process-wide lock.

Invariants: ``parse(source, mode)`` returns what ``ast.parse(source, mode=mode)`` returns and
raises what it raises; no two threads of a process are inside ``ast.parse`` through it at once.
"""

from __future__ import annotations

import ast
import threading
from typing import Any

_LOCK = threading.Lock()


def parse(source: str, mode: str = "exec") -> Any:
    """``ast.parse(source, mode=mode)``, one thread at a time (module docstring)."""
    with _LOCK:
        return ast.parse(source, mode=mode)
