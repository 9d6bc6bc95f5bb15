"""OpenAI-style chat logs (JSONL, one ``{"messages": [{"role", "content"}, ...], ...}`` per
line, as fine-tuning files and most agent logs store them) as a user-format dataset.

Each line is one session. Optional keys of a line, honoured when present: ``id`` (the
session's id, a string or an integer; else ``line-<n>``), ``date`` (ISO 8601 or null; kept as
written) and ``conversation`` (the conversation it belongs to; else the one conversation
named after the dataset, the user's whole history). Other keys (``tools``, ...) are ignored.
``per_chat`` makes each line a conversation of its own (named by the session's id).

Keeps: every message whose role is not a system or tool role (:data:`SKIPPED_ROLES`), roles
as written; its ``content`` when a string, or the text parts of a list of parts (``type``
``text``, ``input_text`` or ``output_text``), joined with a newline. A message's id is
``<session id>.<k>``, ``k`` its place in the line's ``messages`` (skipped ones included, so ids
do not move when a rule of what is skipped does).

Skips, counted: system, developer, tool and function messages (by role); non-text parts
(images, audio, files); tool calls (an assistant message's ``tool_calls``; a message that is
nothing else is skipped with them); empty messages; messages over the format's content limit;
lines left with no message. Blank lines are passed over.

Problems (the import fails; one line each, ``FILE:LINE: FIELD: what``): a line that
:func:`~evolve.datasets.usercheck.jsonl_lines` refuses (longer than the format's line limit,
read with a bounded ``readline`` and never held whole; a byte order mark; not UTF-8; not JSON),
a line that is not an object; ``messages`` not a list; a message
that is not an object, whose role is not a non-empty string, or whose content is neither a
string, a list of parts nor null; an ``id``, ``date`` or ``conversation`` of the wrong kind;
a session id that repeats within its conversation; a date before the previous dated session of
its conversation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from contract.types import Message, Segment
from evolve.datasets.types import Conversation
from evolve.datasets.usercheck import jsonl_lines, parse_date
from evolve.datasets.userformat import Invalid
from evolve.importers.common import PART_JOIN, ImportCounts, Imported, run_import, unique_messages

SKIPPED_ROLES = ("system", "developer", "tool", "function")
TEXT_PARTS = ("text", "input_text", "output_text")


@dataclass
class _OpenConversation:
    sessions: list[Segment] = field(default_factory=list)
    lines: dict[str, int] = field(default_factory=dict)  # session id -> its line
    last_date: tuple[str, datetime, int] | None = None  # text, value, line


def import_openai(source: Path, name: str, *, per_chat: bool = False) -> Imported:
    """The JSONL file at ``source`` as a dataset named ``name`` (see the module's docstring)."""
    return run_import("openai", _read, source, name, per_chat)


def _read(source: Path, name: str, per_chat: bool, tally: ImportCounts) -> list[Conversation]:
    if not source.is_file():
        raise Invalid([f"{source}: no such file"])
    convs: dict[str, _OpenConversation] = {}
    try:
        for at, number, obj, _ in jsonl_lines(source, source.name, tally.checker):
            _session(obj, number, at, name, per_chat, convs, tally)
    except OSError as exc:
        raise Invalid([f"{source}: cannot read ({exc.strerror or exc})"]) from None
    return [Conversation(cid, unique_messages(c.sessions, tally))
            for cid, c in convs.items() if c.sessions]  # fmt: skip


def _session(
    obj: Any, number: int, at: str, name: str, per_chat: bool, convs: dict[str, _OpenConversation],
    tally: ImportCounts,
) -> None:  # fmt: skip
    """One line's session, added to its conversation in ``convs`` (or problems)."""
    if not isinstance(obj, dict):
        tally.problem(at, f"is {type(obj).__name__}, not a JSON object")
        return
    sid = obj.get("id", f"line-{number}")
    if isinstance(sid, int) and not isinstance(sid, bool):
        sid = str(sid)
    if not isinstance(sid, str) or not sid:
        tally.problem(at, f"id: expected a non-empty string or an integer, got {sid!r}")
        return
    cid = sid if per_chat else obj.get("conversation", name)
    if not isinstance(cid, str) or not cid:
        tally.problem(at, f"conversation: expected a non-empty string, got {cid!r}")
        return
    date = obj.get("date")
    when = parse_date(date) if isinstance(date, str) else None
    if date is not None and when is None:
        tally.problem(at, f"date: {date!r} is not an ISO 8601 date or datetime (or null)")
        return
    raw = obj.get("messages")
    if not isinstance(raw, list):
        tally.problem(at, f"messages: expected a list, got {type(raw).__name__}")
        return
    conv = convs.setdefault(cid, _OpenConversation())
    first = conv.lines.setdefault(sid, number)
    if first != number:
        tally.problem(at, f"id: {sid!r} repeats the session of line {first} "
                      f"(conversation {cid!r})")  # fmt: skip
        return
    if when is not None and isinstance(date, str):
        if conv.last_date is not None and when < conv.last_date[1]:
            text, _, line = conv.last_date
            tally.problem(at, f"date: {date!r} is before {text!r} of line {line}, the previous "
                          f"dated session of conversation {cid!r}")  # fmt: skip
            return
        conv.last_date = (date, when, number)
    messages = []
    for k, m in enumerate(raw):
        message = _message(m, f"{sid}.{k}", f"{at}: messages[{k}]", tally)
        if message is not None:
            messages.append(message)
    if messages:
        conv.sessions.append(Segment(sid, date, tuple(messages)))
    else:
        tally.skip("lines with no message kept")


def _message(m: Any, mid: str, at: str, tally: ImportCounts) -> Message | None:
    if not isinstance(m, dict):
        tally.problem(at, f"is {type(m).__name__}, not a JSON object")
        return None
    role, content = m.get("role"), m.get("content")
    if not isinstance(role, str) or not role:
        tally.problem(f"{at}.role", f"expected a non-empty string, got {role!r}")
        return None
    if role in SKIPPED_ROLES:
        tally.skip(f"{role} messages")
        return None
    calls = m.get("tool_calls") or m.get("function_call")
    if calls:
        tally.skip("tool calls", len(calls) if isinstance(calls, list) else 1)
    if content is None:
        if not calls:
            tally.skip("empty messages")
        return None
    if isinstance(content, list):
        texts = []
        for part in content:
            if isinstance(part, dict) and part.get("type") in TEXT_PARTS:
                if isinstance(part.get("text"), str):
                    texts.append(part["text"])
        tally.skip("non-text parts", len(content) - len(texts))
        content = PART_JOIN.join(texts)
    elif not isinstance(content, str):
        tally.problem(f"{at}.content", "expected a string, a list of parts or null, got "
                      f"{type(content).__name__}")  # fmt: skip
        return None
    if calls and not content.strip():
        return None  # a tool call with nothing else: counted with the calls
    return tally.message(mid, role, content, drop_empty=True)
