"""The Claude.ai export (``conversations.json``, the folder the export unpacks into, or its zip)
as a user-format dataset.

An export is a list of chats (``uuid``, ``name``, ``created_at``, ``chat_messages``); a message
has ``uuid``, ``sender`` (``human`` or ``assistant``), ``text``, ``content`` (blocks ``{type,
text, ...}``), ``created_at``, ``attachments`` and ``files``, and in newer exports
``parent_message_uuid``.

Branches: where messages carry ``parent_message_uuid``, an edited message or a retried reply
leaves its sibling in ``chat_messages`` too. The kept branch is followed from the chat's
``current_leaf_message_uuid`` when it names one of its messages, else from its last message
(the newest), back through ``parent_message_uuid`` until a parent that is not a message of the
chat (the root); no sibling branch is taken. A chat whose messages name no parent is taken in
list order.

Keeps: the human's messages (role ``user``) and the assistant's: the text blocks of
``content``, joined with a newline, or ``text`` where ``content`` is absent or empty. A
message's id is its ``uuid`` (else ``<chat id>.<n>``); a chat is one session, its id the chat's
``uuid`` (else ``chat-<n>``), dated by its ``created_at`` (ISO 8601, UTC, to the second).

Skips, counted: non-text content blocks (tool use and results, thinking, images, ...);
attachments and files (their extracted text too); messages of other senders; empty messages;
messages over the format's content limit; the messages on abandoned branches; chats left with
no message.

Conversations as :mod:`.chatgpt` makes them (:func:`~evolve.importers.common.assemble`): the
whole export one conversation, each chat a session in order of creation; ``per_chat``: each
chat a conversation of its own.

Problems (the import fails, one line each): an export that is not a list, a chat or message
that is not an object, ``chat_messages`` not a list, a ``created_at`` that is not ISO 8601, a
``content`` that is not a list of blocks, a text block whose text is not a string, a parent
chain that loops.
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
    iso_time,
    read_chats,
    run_import,
)

ROLES = {"human": "user", "assistant": "assistant"}
PARENT = "parent_message_uuid"
LEAF = "current_leaf_message_uuid"


def import_claude(source: Path, name: str, *, per_chat: bool = False) -> Imported:
    """The export at ``source`` as a dataset named ``name`` (see the module's docstring)."""
    return run_import("claude", _read, source, name, per_chat)


def _read(source: Path, name: str, per_chat: bool, tally: ImportCounts) -> list[Conversation]:
    return read_chats(source, name, per_chat, tally, _chat)


def kept_messages(chat: dict[str, Any], messages: list[dict[str, Any]]) -> list[int] | str:
    """The places in ``messages`` of the kept branch, in order (see the module's docstring);
    a string when the parent chain loops."""
    if not any(isinstance(m.get(PARENT), str) for m in messages):
        return list(range(len(messages)))
    by_id = {m["uuid"]: k for k, m in enumerate(messages) if isinstance(m.get("uuid"), str)}
    at: Any = chat.get(LEAF)
    at = by_id[at] if isinstance(at, str) and at in by_id else len(messages) - 1
    path: list[int] = []
    seen: set[int] = set()
    while True:
        if at in seen:
            return f"the parent chain loops at message {messages[at].get('uuid')!r}"
        seen.add(at)
        path.append(at)
        parent = messages[at].get(PARENT)
        if not isinstance(parent, str) or parent not in by_id:
            break
        at = by_id[parent]
    path.reverse()
    return path


def _chat(raw: Any, index: int, where: str, tally: ImportCounts) -> Chat | None:
    named = chat_id(raw, ("uuid",), index, where, tally)
    if named is None:
        return None
    cid, where = named
    created = raw.get("created_at")
    when = iso_time(created)
    if created is not None and when is None:
        tally.problem(where, f"created_at: {created!r} is not an ISO 8601 time")
        return None
    raw_messages = raw.get("chat_messages", [])
    if not isinstance(raw_messages, list):
        tally.problem(where, f"chat_messages: expected a list, got "
                      f"{type(raw_messages).__name__}")  # fmt: skip
        return None
    bad = [k for k, m in enumerate(raw_messages) if not isinstance(m, dict)]
    for k in bad:
        tally.problem(where, f"chat_messages[{k}]: is not an object")
    if bad:
        return None
    branch = kept_messages(raw, raw_messages) if raw_messages else []
    if isinstance(branch, str):
        tally.problem(where, f"chat_messages: {branch}")
        return None
    tally.skip("messages on abandoned branches", len(raw_messages) - len(branch))
    messages = []
    for k in branch:
        message = _message(raw_messages[k], f"{cid}.{k}", f"{where}: chat_messages[{k}]", tally)
        if message is not None:
            messages.append(message)
    return Chat(cid, when, tuple(messages), index)


def _message(
    raw: dict[str, Any], fallback_id: str, where: str, tally: ImportCounts
) -> Message | None:
    tally.skip("attachments and files", sum(
        len(raw[key]) for key in ("attachments", "files") if isinstance(raw.get(key), list)
    ))  # fmt: skip
    sender = raw.get("sender")
    if sender not in ROLES:
        tally.skip(f"{sender} messages" if isinstance(sender, str) else "messages with no sender")
        return None
    mid = raw.get("uuid") or fallback_id
    if not isinstance(mid, str):
        tally.problem(where, f"uuid: expected a string, got {type(mid).__name__}")
        return None
    content = raw.get("content")
    if content:
        if not isinstance(content, list):
            tally.problem(where, f"content: expected a list of blocks, got "
                          f"{type(content).__name__}")  # fmt: skip
            return None
        texts = []
        for j, block in enumerate(content):
            if isinstance(block, dict) and block.get("type") == "text":
                if not isinstance(block.get("text"), str):
                    tally.problem(where, f"content[{j}].text: expected a string")
                    return None
                texts.append(block["text"])
        tally.skip("non-text content blocks", len(content) - len(texts))
        text = PART_JOIN.join(texts)
    else:
        text = raw.get("text") or ""
        if not isinstance(text, str):
            tally.problem(where, f"text: expected a string, got {type(text).__name__}")
            return None
    return tally.message(mid, ROLES[sender], text, drop_empty=True)
