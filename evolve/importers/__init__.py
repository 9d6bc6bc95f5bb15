"""Importers: a user's chat logs, or a deployed memory's store, as a user-format dataset
(:mod:`evolve.datasets.userformat`).

Owns :data:`KINDS`, the importer of each kind of source: ``openai`` (:mod:`.openai`: chat logs
as OpenAI-style ``messages`` JSONL), ``chatgpt`` (:mod:`.chatgpt`: ChatGPT's export),
``claude`` (:mod:`.claude`: Claude.ai's export) and ``store`` (:mod:`.store`: the runtime's
memory store, read beside a running runtime). Every importer returns an
:class:`~.common.Imported` (the dataset, what it kept and what it skipped, in counts) or raises
:class:`~evolve.datasets.userformat.Invalid` naming every problem of its input; none writes
(:mod:`.common` holds what they share). ``evolve data import`` is :mod:`evolve.cli.dataimport`.
"""

from __future__ import annotations

from evolve.importers.chatgpt import import_chatgpt
from evolve.importers.claude import import_claude
from evolve.importers.common import Imported, Importer
from evolve.importers.openai import import_openai
from evolve.importers.store import import_store

KINDS: dict[str, Importer] = {
    "openai": import_openai,
    "chatgpt": import_chatgpt,
    "claude": import_claude,
    "store": import_store,
}

__all__ = ["KINDS", "Imported", "Importer"]
