"""What every ``evolve`` command shares: errors, consoles, progress, shared options, flag types.

Owns :class:`UsageError` and :class:`Parser` (argparse errors become one ``error:`` line and
exit status 2), the two consoles (:data:`err`, :data:`out`), :class:`ProgressBar` (a live bar
on a terminal, else a plain line at least every ``PRISMEM_PROGRESS_SECONDS``), the check of
the ``PRISMEM_*`` environment settings (:func:`check_settings`), the shared
options of the commands that evaluate programs (:func:`add_run_options`) and the runs-dir
default (:func:`add_runs_dir`), the LLM transport flags (:func:`llm_flags`), the argparse types
of numeric flags (:data:`positive_int`, :data:`probability`, ...), program paths
(:func:`read_program`), the model flags (:func:`model_flag`: ``none`` or an empty name means no
model) and the damaged-file warning handler (:func:`report_damage`). Scores print by
:func:`evolve.scoring.fmt_score`.

Invariants: nothing here imports a command module or the evaluation engine, so every command
module imports this one and nothing imports back; an error stays one line whatever the
terminal width; a damaged file is one ``warning:`` line per command, however often it is hit.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

from evolve.benches.registry import names
from evolve.datasets.types import DataError
from evolve.environment import folder
from evolve.models import DAMAGE_LOG, cores
from evolve.models.llm import ModelConfig

PLAIN_SECONDS = 30.0  # a plain progress line at least this often when stderr is no terminal
err = Console(stderr=True, soft_wrap=True)  # an error stays one line, whatever the width
out = Console(width=None if sys.stdout.isatty() else 160)  # piped tables are not cut at 80


class UsageError(Exception):
    """A bad flag or flag combination."""


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors are :class:`UsageError`, so a bad flag ends like every
    other expected failure: one ``error:`` line and exit status 2 (subcommands inherit it)."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see {self.prog} --help)")


def _bounded(cast: Callable[[str], Any], test: Callable[[Any], bool], what: str) -> Any:
    """An argparse ``type``: ``cast`` the text, refuse it unless ``test`` holds."""

    def parse(text: str) -> Any:
        try:
            value = cast(text)
        except ValueError:
            value = None
        if value is None or not test(value):
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}")
        return value

    return parse


# Upper bounds of the numeric flags: what the machine allows (worker processes per CPU), what a
# model reply, a request or a wait can sensibly take, what a run can get through.
JOBS_PER_CPU = 4  # worker processes per CPU (a worker waiting on a model call uses no CPU)
MAX_REPLY_TOKENS = 1_000_000
MAX_LLM_CONCURRENCY = 1024
MAX_LLM_TIMEOUT_S = 3600.0
MAX_WATCH_S = 86400
MAX_REPAIRS = 100
MAX_ROUNDS = 1000  # per stage
MAX_CHILDREN = 64  # children per round: each is proposed, then all are evaluated at once
MAX_CONVERSATIONS = 1_000_000
MAX_TOKENS_CAP = 10**15


def ranged(cast: Callable[[str], Any], low: float, high: float, what: str) -> Any:
    """An argparse ``type``: a finite number ``cast`` from the text within ``[low, high]``."""
    return _bounded(cast, lambda v: math.isfinite(v) and low <= v <= high, what)


# The argparse types of every command's numeric flags (one definition, shared).
positive_int = _bounded(int, lambda v: v >= 1, "an integer >= 1")
non_negative_int = _bounded(int, lambda v: v >= 0, "an integer >= 0")
non_negative_float = _bounded(float, lambda v: math.isfinite(v) and v >= 0, "a number >= 0")
positive_float = _bounded(float, lambda v: math.isfinite(v) and v > 0, "a number > 0")
probability = _bounded(float, lambda v: 0 < v <= 1, "a number in (0, 1]")
reply_tokens = ranged(int, 1, MAX_REPLY_TOKENS, f"an integer from 1 to {MAX_REPLY_TOKENS:,}")
llm_concurrency = ranged(int, 1, MAX_LLM_CONCURRENCY, f"an integer from 1 to {MAX_LLM_CONCURRENCY}")
llm_timeout = _bounded(
    float,
    lambda v: math.isfinite(v) and 0 < v <= MAX_LLM_TIMEOUT_S,
    f"a number of seconds > 0 and at most {MAX_LLM_TIMEOUT_S:g} (one hour)",
)
watch_seconds = ranged(int, 1, MAX_WATCH_S, f"an integer from 1 to {MAX_WATCH_S} (a day)")
repairs_count = ranged(int, 0, MAX_REPAIRS, f"an integer from 0 to {MAX_REPAIRS}")
token_cap = ranged(int, 0, MAX_TOKENS_CAP, f"an integer from 0 to {MAX_TOKENS_CAP:.0e}")
children_count = ranged(int, 1, MAX_CHILDREN, f"an integer from 1 to {MAX_CHILDREN}")
minibatch_count = ranged(int, 1, MAX_CONVERSATIONS, f"an integer from 1 to {MAX_CONVERSATIONS:,}")
# ``--conversations``: a count, or "all" (the whole splits; the run's config stores None); a
# count larger than a split holds is refused where the split is read (the data's bound)
conversation_count = _bounded(
    lambda t: t if t == "all" else int(t),
    lambda v: v == "all" or 1 <= v <= MAX_CONVERSATIONS,
    f"an integer from 1 to {MAX_CONVERSATIONS:,} or 'all'",
)


def jobs_count(text: str) -> int:
    """``--jobs``: worker processes, at most :data:`JOBS_PER_CPU` per CPU of this machine."""
    most = JOBS_PER_CPU * cores.count()
    what = f"an integer from 1 to {most} ({JOBS_PER_CPU} per CPU; this machine has " \
        f"{cores.count()})"  # fmt: skip
    value: int = ranged(int, 1, most, what)(text)
    return value


def api_base_url(text: str) -> str:
    """``--api-base``: an http or https URL with a host (``http://localhost:8000/v1``)."""
    from urllib.parse import urlsplit

    try:
        url = urlsplit(text.strip())
        url.port  # noqa: B018 (a port that is not a number raises here)
        usable = url.scheme in ("http", "https") and bool(url.hostname)
    except ValueError:
        usable = False
    if not usable:
        raise argparse.ArgumentTypeError(
            f"must be an http:// or https:// URL with a host, e.g. http://localhost:8000/v1; "
            f"got {text!r}"
        )
    return text.strip()


def split_name(text: str) -> str:
    """``--split``: a split's name; an empty or blank one is refused (it is not the default)."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"must name a split, got {text!r} (leave the flag out "
                                         "for the default)")  # fmt: skip
    return text


def read_program(path: Path, what: str = "program file") -> str:
    """The text of a program named on the command line; a UsageError says in one line why it
    cannot be read (missing, a directory, not UTF-8, unreadable)."""
    if path.is_dir():
        raise UsageError(f"{what} {path} is a directory, not a .py file")
    if not path.exists():
        raise UsageError(f"{what} {path} not found")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(
            f"cannot read {what} {path}: not UTF-8 text ({exc.reason} at byte {exc.start})"
        ) from None
    except OSError as exc:
        raise UsageError(f"cannot read {what} {path}: {exc.strerror or exc}") from None


def model_flag(name: str | None, api_base: str | None, **params: Any) -> ModelConfig | None:
    """The model a ``--model`` / ``--coder`` / ``--judge`` flag names; None for no flag,
    ``none`` or an empty name (the offline mode of that role)."""
    if name is None or name.lower() in ("none", ""):
        return None
    return ModelConfig(model=name, api_base=api_base, **params)


class _DamageLines(logging.Handler):
    """Prints each damaged-file report of one command once, as one ``warning:`` line."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if text not in self.seen:
            self.seen.add(text)
            err.print(f"[yellow]warning:[/] {escape(text)}", highlight=False)


_DAMAGE_LINES = _DamageLines()


def report_damage() -> None:
    """From now on, print each damaged-file report once as a ``warning:`` line (one command)."""
    _DAMAGE_LINES.seen.clear()
    if _DAMAGE_LINES not in DAMAGE_LOG.handlers:
        DAMAGE_LOG.addHandler(_DAMAGE_LINES)


def default_cache_dir() -> Path:
    base = (
        folder("CACHE")
        or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "prismem"
    )
    return Path(base)


def data_dir(arg: str | None) -> Path:
    value = arg or folder("DATA")
    if not value:
        raise UsageError("no data directory: pass --data-dir DIR or set PRISMEM_DATA")
    path = Path(value).expanduser()
    if not path.is_dir():
        raise DataError(f"data directory {path} does not exist")
    return path


def add_runs_dir(parser: argparse.ArgumentParser, help: str) -> None:
    """``--runs-dir``: where run folders are (default ``programs/`` or ``$PRISMEM_RUNS``)."""
    default = Path(folder("RUNS") or "programs")
    parser.add_argument("--runs-dir", type=Path, default=default, help=help)


def add_run_options(parser: argparse.ArgumentParser) -> None:
    """Options shared by the commands that evaluate programs on a benchmark."""
    parser.add_argument("--bench", default="beam", choices=list(names()), help="benchmark")
    parser.add_argument(
        "--judge",
        default=None,
        help="judge LLM (litellm id) that scores answers by the benchmark's protocol; "
        "without one only the retrieval metrics are scored",
    )
    parser.add_argument(
        "--judge-variant",
        default="described",
        choices=["described", "official"],
        help="BEAM rubric judge variant the judged fitness reads (default described)",
    )
    parser.add_argument(
        "--api-base",
        type=api_base_url,
        default=None,
        help="API base URL of the models, http(s)://HOST[:PORT][/PATH] (e.g. a local server)",
    )
    parser.add_argument(
        "--task-max-tokens",
        type=reply_tokens,
        default=1024,
        help="reply limit of the task model per call (default 1024)",
    )
    parser.add_argument("--data-dir", help="benchmark data root (default: $PRISMEM_DATA)")
    parser.add_argument(
        "--jobs",
        type=jobs_count,
        default=2,
        help=f"worker processes, at most {JOBS_PER_CPU} per CPU (default 2)",
    )
    parser.add_argument(
        "--llm-concurrency",
        type=llm_concurrency,
        default=None,
        help="LLM requests in flight at once for the whole run on this machine, all worker "
        "processes together; lowered on rate limits (default 16)",
    )
    parser.add_argument(
        "--llm-timeout",
        type=llm_timeout,
        default=None,
        help="seconds one LLM request may take before it is abandoned and retried (default 120)",
    )
    parser.add_argument(
        "--backend",
        default="local",
        choices=["local", "ray"],
        help="where conversations are evaluated: local processes (default) or a Ray cluster",
    )
    parser.add_argument(
        "--ray-address",
        default=None,
        help="Ray cluster to join (e.g. auto or ray://head:10001); default: a local instance",
    )
    add_runs_dir(parser, "where run folders go (default programs/ or $PRISMEM_RUNS)")
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="step, embedding and LLM caches (default ~/.cache/prismem or $PRISMEM_CACHE)",
    )
    parser.add_argument(
        "--embedder",
        default="minilm",
        choices=["minilm", "hashing"],
        help="'hashing' is a test double: never use it for real results",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def llm_flags(args: argparse.Namespace) -> dict[str, Any]:
    """``llm_concurrency`` / ``llm_timeout`` as given on the command line (absent: not given,
    so the config's default, or a resumed run's stored value, stands)."""
    given = {"llm_concurrency": args.llm_concurrency, "llm_timeout": args.llm_timeout}
    return {k: v for k, v in given.items() if v is not None}


def task_config(args: argparse.Namespace) -> ModelConfig | None:
    """The task model from ``--model``, ``--api-base`` and ``--task-max-tokens`` (None: offline)."""
    return model_flag(args.model, args.api_base, max_tokens=args.task_max_tokens)


def progress_seconds() -> float:
    """Seconds between two plain progress lines: ``PRISMEM_PROGRESS_SECONDS`` (default 30)."""
    text = os.environ.get("PRISMEM_PROGRESS_SECONDS", "")
    try:
        value = float(text) if text else PLAIN_SECONDS
    except ValueError:
        value = 0.0
    if not (math.isfinite(value) and value > 0):
        raise UsageError(f"PRISMEM_PROGRESS_SECONDS must be a number > 0, got {text!r}")
    return value


def check_settings() -> None:
    """Refuse a bad ``PRISMEM_*`` environment setting before any command starts (UsageError)."""
    from evolve.models.embed import precision

    progress_seconds()
    try:
        precision()
    except ValueError as exc:
        raise UsageError(str(exc)) from None


@dataclass
class _Row:
    label: str
    total: int
    done: int = 0
    description: str | None = None

    def text(self) -> str:
        what = f" ({self.description})" if self.description else ""
        return f"{self.label} {self.done}/{self.total}{what}"


class ProgressBar:
    """Progress on stderr, as a context manager yielding ``advance(n, description=None)`` for
    its first row; :meth:`row` adds (or replaces) another, e.g. the evaluation under a run's
    rounds. On a terminal it is a live rich bar; elsewhere (a log file, a pipe) one plain line
    with every row's counts and the elapsed time is printed at the start, then at least every
    :func:`progress_seconds` (read here, so a bad setting fails before any work), before a row
    is replaced, and at the end. Disabled, it prints nothing."""

    def __init__(self, total: int, enabled: bool, label: str = "evaluating") -> None:
        self.total, self.enabled, self.label = total, enabled, label
        self.live = err.is_terminal
        self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TimeElapsedColumn(), console=err, transient=True)  # fmt: skip
        self.rows: dict[str, tuple[_Row, TaskID | None]] = {}
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.started, self.interval = time.monotonic(), progress_seconds()
        self.printer: threading.Thread | None = None

    def __enter__(self) -> Advance:
        if not self.enabled:
            return _no_progress
        self.started = time.monotonic()
        if self.live:
            self.bar.start()
        advance = self.row("main", self.label, self.total)
        if not self.live:
            self._print_line()
            self.printer = threading.Thread(target=self._print_every, daemon=True)
            self.printer.start()
        return advance

    def row(self, key: str, label: str, total: int) -> Advance:
        """A row (replacing the row of the same ``key``) and its ``advance`` function."""
        if not self.enabled:
            return _no_progress
        if key in self.rows and not self.live:
            self._print_line()  # where the replaced row ended
        with self.lock:
            old = self.rows.pop(key, None)
            if old is not None and old[1] is not None:
                self.bar.remove_task(old[1])
            item = _Row(label, total)
            task = self.bar.add_task(label, total=total) if self.live else None
            self.rows[key] = (item, task)

        def advance(n: int, description: str | None = None) -> None:
            with self.lock:
                item.done += n
                item.description = description or item.description
                if task is not None:
                    text = f"{label} · {description}" if description else label
                    self.bar.update(task, advance=n, description=text)

        return advance

    def _print_line(self) -> None:
        with self.lock:
            rows = " · ".join(item.text() for item, _ in self.rows.values())
        elapsed = int(time.monotonic() - self.started)
        err.print(f"[{elapsed // 60}:{elapsed % 60:02d}] {rows}", markup=False, highlight=False)

    def _print_every(self) -> None:
        while not self.stop.wait(self.interval):
            self._print_line()

    def __exit__(self, *exc: object) -> None:
        if not self.enabled:
            return
        if self.live:
            self.bar.stop()
            return
        self.stop.set()
        if self.printer is not None:
            self.printer.join()
        self._print_line()


Advance = Callable[..., None]  # advance(n, description=None)


def _no_progress(n: int, description: str | None = None) -> None:
    """The ``advance`` of a disabled progress display."""
