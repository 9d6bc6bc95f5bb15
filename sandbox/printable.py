"""Text a program or its host wrote, made safe to print to a terminal or write to a log.

A candidate program controls the text of its exceptions, its exception classes' names and what
it writes to stderr; :mod:`sandbox.isolate` passes all of it through :func:`printable` where it
enters the optimizer, and ``evolve check`` again where it prints.

Invariants: the result has no C0 control character but tab (so no ESC, BEL or newline), no
DEL, no C1 control, no bidirectional override, embedding, isolate or mark, no line or
paragraph separator and no lone surrogate (which a UTF-8 stream cannot even encode); each is
shown instead as its escape (``\\x1b``, ``\\u202e``), so a reader sees that it was there. It is
at most ``limit`` characters long, ending in ``…`` when cut. Applying it twice changes nothing
more.
"""

from __future__ import annotations

import re

MAX_CHARS = 2000

_UNSAFE = re.compile(
    "[\x00-\x08\x0a-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069\ud800-\udfff]"
)


def _shown(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: object, limit: int = MAX_CHARS) -> str:
    """``text`` (``repr`` of anything that is not a str) with every unsafe character shown as
    its escape, cut to ``limit`` characters."""
    raw = text if isinstance(text, str) else repr(text)
    shown = _UNSAFE.sub(_shown, raw[: limit + 1])
    return shown if len(shown) <= limit else shown[: limit - 1] + "…"
