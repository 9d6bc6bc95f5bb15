"""The ChatGPT export (``conversations.json``, the folder the export unpacks into, or its zip)
as a user-format dataset.

An export is a list of chats. A chat's messages are a tree, ``mapping`` (node id -> ``{id,
message, parent, children}``): editing a message or regenerating a reply adds a sibling branch
beside the old one, and ``current_node`` is the last node of the branch the user kept.

Keeps: the kept branch only, found from ``current_node`` back through ``parent`` to the root
and reversed, never a sibling branch (walking ``children`` would take abandoned edits and
regenerations); of it, the user's and the assistant's visible messages addressed to everyone
(``recipient`` ``all``) whose ``content_type`` is ``text`` (its parts) or ``multimodal_text``
(its string parts only), parts joined with a newline. A message's id is its node id; a chat is
one session, its id the chat's ``id`` (else ``conversation_id``, else ``chat-<n>``), dated by
its ``create_time`` (ISO 8601, UTC, to the second).

Skips, counted: nodes with no message; hidden messages
(``metadata.is_visually_hidden_from_conversation``); system and tool messages (by role);
assistant messages addressed to a tool (``recipient`` other than ``all``: tool calls, memory
writes); non-text messages (code, execution output, browsing, reasoning, ...); non-text parts of
multimodal messages (images, audio, files); empty messages; messages over the format's content
limit; the messages on abandoned branches (every message of the chat not on the kept branch);
chats left with no message.

Conversations (:func:`~evolve.importers.common.assemble`): the whole export is one
conversation, named after the dataset (one person's history across chats, which a deployed
memory serves as one user), each chat a session, in order of creation. ``per_chat`` makes each
chat a conversation of its own: for a memory meant to serve one chat at a time, or so that
splits, which go by conversation, can hold out whole chats.

Problems (the import fails, one line each, naming the chat by its place and id): an export
that is not a list, a chat or node that is not an object, a ``current_node`` that is not in
``mapping``, a parent chain that leaves ``mapping`` or loops, a message whose author, content
or parts are malformed, a ``create_time`` that is not a number.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from contract.types import Message
from evolve.datasets.types import Conversation
from evolve.importers.common import (
    PART_JOIN,
    Chat,
    ImportCounts,
    Imported,
    chat_id,
    epoch_time,
    read_chats,
    run_import,
)

KEPT_ROLES = ("user", "assistant")
TEXT_TYPES = ("text", "multimodal_text")
HIDDEN = "is_visually_hidden_from_conversation"


def import_chatgpt(source: Path, name: str, *, per_chat: bool = False) -> Imported:
    """The export at ``source`` as a dataset named ``name`` (see the module's docstring)."""
    return run_import("chatgpt", _read, source, name, per_chat)


def _read(source: Path, name: str, per_chat: bool, tally: ImportCounts) -> list[Conversation]:
    return read_chats(source, name, per_chat, tally, _chat)


def kept_branch(mapping: dict[str, Any], current: str) -> list[str] | str:
    """The node ids of the kept branch, root first: from ``current`` back through each
    node's ``parent``. A string when the chain is broken (what is wrong)."""
    path: list[str] = []
    seen: set[str] = set()
    node_id: Any = current
    while node_id is not None:
        if not isinstance(node_id, str) or node_id not in mapping:
            return f"node {node_id!r} (on the kept branch) is not in mapping"
        if node_id in seen:
            return f"the parent chain loops at node {node_id!r}"
        node = mapping[node_id]
        if not isinstance(node, dict):
            return f"node {node_id!r} is {type(node).__name__}, not an object"
        seen.add(node_id)
        path.append(node_id)
        node_id = node.get("parent")
    path.reverse()
    return path


def _chat(raw: Any, index: int, where: str, tally: ImportCounts) -> Chat | None:
    named = chat_id(raw, ("id", "conversation_id"), index, where, tally)
    if named is None:
        return None
    cid, where = named
    mapping, current = raw.get("mapping"), raw.get("current_node")
    if not isinstance(mapping, dict):
        tally.problem(where, f"mapping: expected an object, got {type(mapping).__name__}")
        return None
    if not isinstance(current, str) or current not in mapping:
        tally.problem(where, f"current_node: {current!r} is not a node of mapping")
        return None
    created = raw.get("create_time")
    when = epoch_time(created)
    if created is not None and when is None:
        tally.problem(where, f"create_time: {created!r} is not seconds since the epoch")
        return None
    branch = kept_branch(mapping, current)
    if isinstance(branch, str):
        tally.problem(where, f"mapping: {branch}")
        return None
    on_branch = set(branch)
    tally.skip("messages on abandoned branches", sum(
        1 for nid, node in mapping.items()
        if nid not in on_branch and isinstance(node, dict) and node.get("message") is not None
    ))  # fmt: skip
    messages = []
    for node_id in branch:
        message = _message(node_id, mapping[node_id].get("message"), where, tally)
        if message is not None:
            messages.append(message)
    return Chat(cid, when, tuple(messages), index)


def _message(node_id: str, msg: Any, where: str, tally: ImportCounts) -> Message | None:
    """The kept message of one node of the kept branch, or None (skipped and counted, or a
    problem)."""
    at = f"{where}: node {node_id!r}"
    if msg is None:
        tally.skip("nodes with no message")
        return None
    if not isinstance(msg, dict):
        tally.problem(at, f"message: expected an object, got {type(msg).__name__}")
        return None
    author = msg.get("author")
    role = author.get("role") if isinstance(author, dict) else None
    if not isinstance(role, str) or not role:
        tally.problem(at, "message.author.role: expected a string")
        return None
    metadata = msg.get("metadata")
    if isinstance(metadata, dict) and metadata.get(HIDDEN):
        tally.skip("hidden messages")
        return None
    if role not in KEPT_ROLES:
        tally.skip(f"{role} messages")
        return None
    if msg.get("recipient", "all") not in ("all", None):
        tally.skip("messages addressed to a tool")
        return None
    content = msg.get("content")
    if not isinstance(content, dict):
        tally.problem(at, f"message.content: expected an object, got {type(content).__name__}")
        return None
    if content.get("content_type") not in TEXT_TYPES:
        tally.skip("non-text messages")
        return None
    parts = content.get("parts")
    if not isinstance(parts, list):
        tally.problem(at, f"message.content.parts: expected a list, got "
                      f"{type(parts).__name__}")  # fmt: skip
        return None
    texts = [p for p in parts if isinstance(p, str)]
    tally.skip("non-text parts", len(parts) - len(texts))
    return tally.message(node_id, role, PART_JOIN.join(texts), drop_empty=True)
