"""``evolve store``: the upkeep of a runtime's memory store (:mod:`evolve.runtime.upkeep`).

Owns :func:`add_command` (``evolve store verify|repair|forget``) and :func:`cmd_store`.

- ``evolve store verify DIR``: one line per scope (named by its folder, the sha256 of the user
  id: the id itself is stored nowhere) saying whether its log is whole, ends in a torn tail (a
  write cut short, which the next open drops), or is damaged (each bad byte range, and the
  sessions still readable), and which snapshots fail their check. Exit 1 when a scope is
  damaged, 0 when every scope is whole. It reads only, so it may run beside a runtime.
- ``evolve store repair DIR``: repairs every damaged scope (:func:`~evolve.runtime.upkeep.repair`)
  and says what each lost; exit 0.
- ``evolve store forget DIR --user U [--session S]``: forgets one session of a user, or the
  whole user, from every file of the store; prints how many sessions were forgotten.

Invariants: ``repair`` and ``forget`` change a store no other process has open: they take the
store's lock, and a store open elsewhere is one ``error:`` line (exit 2), nothing changed; a
folder that is not a store is one ``error:`` line too.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from evolve.cli.common import UsageError, out
from evolve.runtime.log import LogError, Lost
from evolve.runtime.store import MemoryStoreError, hold, scope_key
from evolve.runtime.upkeep import ScopeReport, examine, forget_scope, forget_session, repair


def add_command(sub: Any) -> None:
    """Register ``evolve store`` on the ``evolve`` parser's subparsers."""
    parser = sub.add_parser("store", help="verify, repair or forget in a runtime memory store")
    verbs = parser.add_subparsers(dest="store_command", required=True)
    verify = verbs.add_parser("verify", help="report damage per scope (exit 1 when damaged)")
    verify.add_argument("dir", type=Path, help="the store folder")
    fix = verbs.add_parser(
        "repair", help="salvage every whole record of damaged logs; say what was lost"
    )
    fix.add_argument("dir", type=Path, help="the store folder (not open elsewhere)")
    forget = verbs.add_parser(
        "forget", help="remove a user's session, or the whole user, from every file of the store"
    )
    forget.add_argument("dir", type=Path, help="the store folder (not open elsewhere)")
    forget.add_argument("--user", required=True, help="the user (scope) id")
    forget.add_argument("--session", default=None, help="one session id (default: every one)")


def _say(line: str) -> None:
    """One line of output, as it is (no markup, never wrapped)."""
    out.print(line, highlight=False, markup=False, soft_wrap=True)


def _sessions(n: int) -> str:
    return f"{n} session{'' if n == 1 else 's'}"


def _lost(lost: Lost) -> str:
    what = f"bytes {lost.start}-{lost.end} ({lost.why}"
    if lost.records == 1:
        what += ", one record"
    if lost.session_id is not None:
        what += f", session {lost.session_id!r}"
    return what + ")"


def _describe(report: ScopeReport) -> str:
    parts = []
    if report.unreadable is not None:
        parts.append(f"log unreadable ({report.unreadable})")
    elif report.log is None:
        parts.append("no log")
    else:
        log = report.log
        if log.damaged:
            first = log.lost[0].start if log.lost else 0
            parts.append(f"log damaged at byte {first}: "
                         f"{'; '.join(_lost(x) for x in log.lost) or 'the file header'}"
                         f"{' (and its header)' if log.bad_header and log.lost else ''}; "
                         f"{_sessions(len(log.sessions))} readable")  # fmt: skip
        else:
            parts.append(f"log whole, {_sessions(len(log.sessions))}")
        if log.torn:
            parts.append(f"a torn tail of {log.torn} bytes (a write cut short: the next open "
                         "drops it)")  # fmt: skip
    parts += [f"snapshot {name} does not decode ({why})" for name, why in report.bad_snapshots]
    if report.set_aside:
        parts.append(f"damaged logs set aside: {', '.join(report.set_aside)}")
    return f"scope {report.key}: " + "; ".join(parts)


def cmd_store(args: argparse.Namespace) -> int:
    root = Path(args.dir)
    try:
        if args.store_command == "verify":
            return _verify(root)
        if args.store_command == "repair":
            return _repair(root)
        return _forget(root, args.user, args.session)
    except (MemoryStoreError, LogError) as exc:
        raise UsageError(str(exc)) from None
    except OSError as exc:
        raise UsageError(f"store {root}: {exc.strerror or exc}") from None


def _verify(root: Path) -> int:
    reports = examine(root)
    for report in reports:
        _say(_describe(report))
    damaged = sum(r.damaged for r in reports)
    if damaged:
        _say(f"{damaged} of {len(reports)} scopes damaged: evolve store repair {root} "
             "salvages every whole record")  # fmt: skip
        return 1
    _say(f"{len(reports)} scopes, all whole")
    return 0


def _repair(root: Path) -> int:
    with hold(root):
        damaged = [r for r in examine(root) if r.damaged]
        for report in damaged:
            done = repair(root, report)
            line = f"scope {done.key}: "
            if done.moved_to is not None:
                lost = "; ".join(_lost(x) for x in done.lost) or "the file header only"
                line += (f"log repaired, {_sessions(done.kept)} kept, lost {lost}; the damaged "
                         f"log is {done.moved_to}")  # fmt: skip
            if done.snapshots_removed:
                line += (f"{'; ' if done.moved_to else ''}snapshots removed (rebuilt from the "
                         f"log): {', '.join(done.snapshots_removed)}")  # fmt: skip
            _say(line)
    _say(f"{len(damaged)} scopes repaired")
    return 0


def _forget(root: Path, user: str, session: str | None) -> int:
    if not user:
        raise UsageError("--user is a non-empty user (scope) id")
    with hold(root):
        folder = root / "scopes" / scope_key(user)
        if session is None:
            count = forget_scope(root, folder)
        else:
            count = forget_session(folder, session)
    what = f"session {session!r} of user {user!r}" if session else f"user {user!r}"
    _say(f"forgot {what}: {_sessions(count)}")
    return 0
