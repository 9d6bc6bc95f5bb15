"""The ``evolve`` command line: parsing, output and exit codes only.

Owns the parser (:func:`build_parser`) and the dispatch (:func:`main`, the console script and
``python -m evolve``). The commands live in :mod:`evolve.cli.eval` (``eval``, ``compare``,
``check``), :mod:`evolve.cli.data` (``data``), :mod:`evolve.cli.synth` (``synth``),
:mod:`evolve.cli.serve` (``serve``, ``token``), :mod:`evolve.cli.store` (``store``),
:mod:`evolve.cli.run` (``run``), :mod:`evolve.cli.inspect` (the commands that read a run) and
:mod:`evolve.cli.deliver` (those that freeze, export and report it), which share
:mod:`evolve.cli.common`; imports go one way, from this module down to the command modules
(``deliver`` uses ``inspect``'s helpers) and from them to ``common``.

Every expected failure (bad flag, missing or malformed data, unreadable program, a run whose
stored configuration does not load) ends with one ``error:`` line on stderr and exit status 2
— argparse's own errors included (:class:`~evolve.cli.common.Parser`); nothing computed before
the failure is lost, because step outputs are stored as they are produced. A damaged file that
a command works around (:func:`evolve.models.damaged`) is one ``warning:`` line, once. A reader
of stdout that leaves early (``evolve runs --json | head``) ends the command quietly, status 141
(a shell's for SIGPIPE), never with a ``BrokenPipeError`` traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

from rich.markup import escape

from evolve.cli import cache, data, deliver, inspect, run, serve, store, synth
from evolve.cli import eval as eval_commands
from evolve.cli.common import Parser, UsageError, check_settings, err, report_damage
from evolve.config import ConfigError
from evolve.datasets.types import DataError
from evolve.datasets.userformat import Invalid
from evolve.models.llm import LLMError
from sandbox import barrier

ISOLATED = ("check", "run", "eval", "compare")  # the commands that run candidate code

COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "eval": eval_commands.cmd_eval,
    "run": run.cmd_run,
    "compare": eval_commands.cmd_compare,
    "check": eval_commands.cmd_check,
    **{name: inspect.dispatch for name in inspect.COMMANDS},
    **{name: deliver.dispatch for name in deliver.COMMANDS},
    "data": data.cmd_data,
    "synth": synth.cmd_synth,
    "serve": serve.cmd_serve,
    "token": serve.cmd_token,
    "store": store.cmd_store,
    "cache": cache.cmd_cache,
}


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="evolve", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    eval_commands.add_eval(sub)
    run.add_command(sub)
    eval_commands.add_compare_check(sub)
    inspect.add_commands(sub)
    deliver.add_commands(sub)
    data.add_command(sub)
    synth.add_command(sub)
    serve.add_command(sub)
    store.add_command(sub)
    cache.add_command(sub)
    for name in ISOLATED:
        sub.choices[name].add_argument(
            "--isolation",
            choices=("auto", "strict"),
            default=os.environ.get(barrier.ISOLATION_ENV, "auto"),
            help="strict: refuse to run candidate code without the whole OS barrier (namespaces, "
            f"capped chroot, seccomp); also ${barrier.ISOLATION_ENV}",
        )
    return parser


def isolation_gate(args: argparse.Namespace) -> None:
    """One line at the start when this machine's barrier is incomplete; under ``strict`` the
    command stops there (and every host refuses to start without the barrier)."""
    if args.command not in ISOLATED:
        return
    if args.isolation == "strict":
        os.environ[barrier.ISOLATION_ENV] = "strict"
    report = barrier.survey()
    if barrier.complete(report):
        return
    if args.isolation == "strict":
        raise UsageError(barrier.describe(report) + " (--isolation strict)")
    err.print(f"[yellow]{escape(barrier.describe(report))}[/]", highlight=False, markup=True)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    report_damage()
    try:
        args = parser.parse_args(argv)
        check_settings()
        isolation_gate(args)
        code = COMMANDS[args.command](args)
        sys.stdout.flush()  # a reader that left is found here, not at the interpreter's exit
        return code
    except Invalid as exc:  # a data folder's every problem, each its own line
        for line in exc.lines():
            err.print(f"[red]error:[/] {escape(line)}", highlight=False, markup=True)
        return 2
    except (UsageError, DataError, ConfigError) as exc:
        err.print(f"[red]error:[/] {escape(str(exc))}", highlight=False, markup=True)
        return 2
    except LLMError as exc:
        err.print(f"[red]error:[/] {escape(str(exc))} (step outputs computed so far are kept in "
                  "the cache)", highlight=False, markup=True)  # fmt: skip
        return 2
    except KeyboardInterrupt:
        err.print("interrupted: step outputs computed so far are kept in the cache")
        return 130
    except BrokenPipeError:  # the reader of stdout left (``--json | head``): nothing more to say
        _quiet_stdout()
        return 141  # as a shell reports a process ended by SIGPIPE


def _quiet_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's last flush of a closed pipe raises
    nothing at exit."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass
