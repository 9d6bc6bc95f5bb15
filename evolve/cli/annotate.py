"""``evolve data annotate DIR --model M``: label the questions of a user-format folder that carry
no capability.

Owns the ``annotate`` subparser (:func:`add_command`, on the ``data`` subparsers) and
:func:`cmd_annotate`. The labels are the run's annotator's (:mod:`evolve.evolution.annotate`: the
same prompt, schema and validation, role ``annotator``, purpose ``annotate``); each labelled
question gets the annotator's primary capability and ``meta["capability_source"]``
(``annotator:<model>``), written back with :func:`evolve.datasets.userformat.write_questions`.

Invariants: a question that has a capability is never changed, and neither is one the annotator
gave no valid label (it stays unlabelled, counted apart); the questions file is replaced
atomically after the whole folder was read and the new questions checked, so an interrupted
command leaves it as it was. Every call is logged and cached in the folder's own workspace
``DIR/annotate/`` (``calls.sqlite``, ``llm-cache.sqlite``): the labels written into the data
are explained by the calls kept beside it, wherever the folder is copied, and a rerun after an
interruption or a failure pays for no call it already made. Without a model: one ``error:``
line, exit status 2, nothing read or written.
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path
from typing import Any

from rich.markup import escape

from evolve.cli.common import UsageError, api_base_url, err, model_flag, out
from evolve.datasets.types import CAPABILITIES
from evolve.datasets.userformat import read_dataset, write_questions
from evolve.evolution.annotate import label_questions, unlabelled, with_labels
from evolve.evolution.budget import calls_path, read_spend
from evolve.models.clients import llm_client
from evolve.models.llm import Models

WORKSPACE = "annotate"  # DIR/annotate/: the command's call log and request cache
CACHE_FILE = "llm-cache.sqlite"


def add_command(data_subparsers: Any) -> None:
    """Register ``annotate`` on the ``data`` command's subparsers."""
    annotate = data_subparsers.add_parser(
        "annotate",
        help="label the questions of a folder of your own conversations that carry no "
        "capability, with an annotator model (docs/user-format.md)",
    )
    annotate.add_argument("dir", type=Path, help="the folder (holds prismem-data.json)")
    annotate.add_argument("--model", default=None, help="annotator LLM as a litellm id (required)")
    annotate.add_argument(
        "--api-base",
        type=api_base_url,
        default=None,
        help="API base URL of the model, http(s)://HOST[:PORT][/PATH] (e.g. a local server)",
    )


def cmd_annotate(args: argparse.Namespace) -> int:
    model = model_flag(args.model, args.api_base)
    if model is None:
        raise UsageError("evolve data annotate needs an annotator model (--model M): it labels "
                         "each question that carries no capability with one call")  # fmt: skip
    folder = Path(args.dir)
    dataset = read_dataset(folder)
    todo = unlabelled(dataset.questions)
    kept = len(dataset.questions) - len(todo)
    if not todo:
        out.print(escape(f"{folder}: every one of its {len(dataset.questions)} questions has a "
                         "capability; nothing to annotate"), highlight=False)  # fmt: skip
        return 0
    work = folder / WORKSPACE
    work.mkdir(exist_ok=True)
    before = read_spend(work).total
    err.print(escape(f"annotating {len(todo)} questions with {model.model} (one call each; "
                     f"logged and cached in {work})"), highlight=False)  # fmt: skip
    llm = llm_client(Models(annotator=model), log_path=calls_path(work),
                     cache_path=work / CACHE_FILE)  # fmt: skip
    questions = with_labels(dataset.questions, label_questions(todo, llm))
    done = [q for q, old in zip(questions, dataset.questions, strict=True) if q is not old]
    if done:
        write_questions(folder, questions)
    per = Counter(q.capability for q in done)
    lines = [f"{len(done)} of {len(todo)} unlabelled questions labelled by {model.model}: "
             + ", ".join(f"{c} {per[c]}" for c in CAPABILITIES)]  # fmt: skip
    if len(done) < len(todo):
        lines.append(f"{len(todo) - len(done)} left unlabelled (the annotator gave no valid "
                     "label; a rerun asks again)")  # fmt: skip
    if kept:
        lines.append(f"{kept} already had a capability (unchanged)")
    after = read_spend(work).total
    calls, cached = after.calls - before.calls, after.cached_calls - before.cached_calls
    cost = after.cost_usd - before.cost_usd
    lines.append(f"{calls} calls ({cached} from the cache), ${cost:.4f}; log {calls_path(work)}")
    for line in lines:
        out.print(escape(line), highlight=False)
    return 0
