"""``evolve synth DIR``: probing questions written from a user's history by a task model, each
verified; the kept ones go to DIR/questions.jsonl (:mod:`evolve.synth.driver`).

Owns :func:`add_command` (the flags) and :func:`cmd_synth` (the command: its client, its
progress, the rejection table and its exit status).

Invariants: without a task model the command says so in one ``error:`` line (a user who
brings their own questions needs none) and exits 2 before reading anything; a DIR that does
not validate prints each of the reader's problems as its own ``error:`` line and exits 2; a
run stopped by a model failure (the ``--max-usd`` cap, an endpoint down) prints the table of
what finished, writes it, and ends with one ``error:`` line and exit 2. Every model call goes
through one client (:func:`evolve.models.clients.llm_client`) logging to
``DIR/synth/llm-calls.sqlite`` with the caps of ``--max-usd`` beside it
(:func:`evolve.models.spendcap.write_caps`, rewritten on every run: no flag, no cap) and
caching in ``DIR/synth/llm-cache.sqlite``.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rich.markup import escape
from rich.table import Table

from evolve.cli.common import (
    MAX_CONVERSATIONS,
    ProgressBar,
    UsageError,
    api_base_url,
    err,
    llm_concurrency,
    llm_timeout,
    model_flag,
    non_negative_float,
    non_negative_int,
    out,
    ranged,
    reply_tokens,
)
from evolve.datasets.usercheck import QUESTIONS
from evolve.datasets.userformat import Invalid, read_dataset
from evolve.models.clients import llm_client
from evolve.models.llm import LLMClient, ModelConfig, Models
from evolve.models.spendcap import Caps, write_caps
from evolve.synth.driver import CACHE, CALL_LOG, REPORT, Settings, Task, synthesize, tasks_of
from evolve.synth.driver import workspace as workspace_of
from evolve.synth.kinds import KINDS
from evolve.synth.report import OUTCOMES, table_rows

MAX_PER_WINDOW = 20
MIN_WINDOW_CHARS, MAX_WINDOW_CHARS = 500, 1_000_000
NO_MODEL = (
    "evolve synth writes questions with a task model and none is given (--model, e.g. "
    "openai/gpt-4o-mini, or openai/NAME with --api-base for a local server); a user who brings "
    f"their own questions needs no model: put them in DIR/{QUESTIONS}"
)

per_window = ranged(int, 1, MAX_PER_WINDOW, f"an integer from 1 to {MAX_PER_WINDOW}")
window_chars = ranged(
    int,
    MIN_WINDOW_CHARS,
    MAX_WINDOW_CHARS,
    f"an integer from {MIN_WINDOW_CHARS} to {MAX_WINDOW_CHARS:,}",
)
window_count = ranged(int, 1, MAX_CONVERSATIONS, f"an integer from 1 to {MAX_CONVERSATIONS:,}")


def kinds_list(text: str) -> tuple[str, ...]:
    """``--kinds``: comma-separated kind names, each once, in the order given."""
    names = tuple(dict.fromkeys(k.strip() for k in text.split(",") if k.strip()))
    unknown = [k for k in names if k not in KINDS]
    if not names or unknown:
        raise argparse.ArgumentTypeError(
            f"must name kinds among {', '.join(KINDS)}, comma-separated; got {text!r}"
        )
    return names


def add_command(sub: Any) -> None:
    """Register ``evolve synth`` on the ``evolve`` parser's subparsers."""
    parser = sub.add_parser(
        "synth",
        help="write probing questions from a history with a task model, each verified",
        description="Write probing questions (factual, temporal, preference, multi-session, "
        "update, adversarial) from the conversations of a user-format folder with a task "
        "model, drop those whose cited messages do not support them, that a later message "
        "supersedes, that the model answers without the history, or that duplicate another; "
        f"the kept ones go to DIR/{QUESTIONS}. Resumable: a rerun reuses every answered call.",
    )
    parser.add_argument("dir", type=Path, metavar="DIR", help="a user-format data folder")
    parser.add_argument("--model", default=None, help="the task model (litellm id)")
    parser.add_argument(
        "--api-base",
        type=api_base_url,
        default=None,
        help="API base URL of the model, http(s)://HOST[:PORT][/PATH] (e.g. a local server)",
    )
    parser.add_argument(
        "--max-usd",
        type=non_negative_float,
        default=None,
        help="stop before the model calls of DIR/synth/ would spend more (default: no cap)",
    )
    d = Settings()  # the run's settings, a flag each, defaults the record's
    for flag, parse, default, text in (
        ("--per-window", per_window, d.per_window,
         f"questions asked per window and kind (default {d.per_window})"),
        ("--window-chars", window_chars, d.window_chars,
         f"characters of history one writing call sees (default {d.window_chars})"),
        ("--windows", window_count, d.windows,
         "at most this many windows of each sort, drawn with --seed (default: all)"),
        ("--kinds", kinds_list, d.kinds,
         f"kinds of question, comma-separated (default all: {','.join(d.kinds)})"),
        ("--jobs", llm_concurrency, d.jobs,
         f"windows worked on at once, and model requests in flight (default {d.jobs})"),
        ("--seed", non_negative_int, d.seed, "which windows --windows draws"),
    ):  # fmt: skip
        parser.add_argument(flag, type=parse, default=default, help=text)
    parser.add_argument(
        "--task-max-tokens",
        type=reply_tokens,
        default=1024,
        help="reply limit of the model per call (default 1024)",
    )
    parser.add_argument(
        "--llm-timeout",
        type=llm_timeout,
        default=None,
        help="seconds one request may take before it is abandoned and retried (default 120)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def _client(model: ModelConfig, directory: Path, args: argparse.Namespace) -> LLMClient:
    """The run's client: its call log with the ``--max-usd`` caps beside it, its cache."""
    workspace = workspace_of(directory)
    workspace.mkdir(parents=True, exist_ok=True)
    log = workspace / CALL_LOG
    write_caps(log, Caps(max_usd=args.max_usd))
    return llm_client(Models(task=model), log_path=log, cache_path=workspace / CACHE,
                      concurrency=args.jobs, timeout=args.llm_timeout)  # fmt: skip


def cmd_synth(args: argparse.Namespace) -> int:
    model = model_flag(args.model, args.api_base, max_tokens=args.task_max_tokens)
    if model is None:
        raise UsageError(NO_MODEL)
    try:
        dataset = read_dataset(args.dir)
    except Invalid as exc:
        for line in exc.lines():
            err.print(f"[red]error:[/] {escape(line)}", highlight=False)
        return 2
    settings = Settings(per_window=args.per_window, window_chars=args.window_chars,
                        kinds=args.kinds, windows=args.windows, seed=args.seed,
                        jobs=args.jobs)  # fmt: skip
    client = _client(model, args.dir, args)
    total = len(tasks_of(dataset.conversations, settings))
    if not total:
        err.print("no window to ask: multi-session questions need a conversation with two "
                  "sessions or more", highlight=False)  # fmt: skip

    def started(total: int, resumed: int) -> None:
        if resumed:
            err.print(f"resuming: {resumed} of {total} windows × kinds finished before (their "
                      "calls come from the cache)", highlight=False)  # fmt: skip

    with ProgressBar(total, not args.no_progress, "synth") as advance:

        def progress(task: Task) -> None:
            advance(1, task.id)

        outcome = synthesize(args.dir, dataset, client, settings, progress, started)
    report = outcome.report
    table = Table(title="questions written and dropped, per check (share of those written)")
    for header in ("capability", "written", *OUTCOMES):
        table.add_column(header, justify="left" if header == "capability" else "right")
    for row in table_rows(report.counts):
        table.add_row(*row)
    out.print(table)
    asked, tasks = report.questions, report.tasks
    failed = f", {tasks.write_failed} gave no usable reply" if tasks.write_failed else ""
    own = f" (after the folder's own {asked.own})" if asked.own else ""
    out.print(
        f"{tasks.finished} of {tasks.total} windows × kinds{failed}; kept "
        f"{asked.kept} of {asked.written} questions written, in "
        f"{Path(args.dir) / QUESTIONS}{own}; report {workspace_of(args.dir) / REPORT}",
        highlight=False,
    )
    if outcome.stopped:
        err.print(f"[red]error:[/] {escape(outcome.stopped)}; {tasks.finished} of "
                  f"{tasks.total} windows × kinds finished and their questions are written; "
                  "run again to go on (calls answered so far come from the cache)",
                  highlight=False)  # fmt: skip
        return 2
    return 0
