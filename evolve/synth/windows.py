"""The history cut into windows, the part of a conversation one writing call sees.

Owns :class:`Window`, :func:`cut` (a dataset's windows), :func:`choose` (at most N windows of
each sort, by seed), :func:`history` (a conversation's messages in order, with their sessions)
and :func:`show` (messages as a check shows them to a model).

Two sorts of window, both deterministic functions of the conversations and ``chars``:

- **plain** (``<conversation>/w<n>``): consecutive messages of one conversation in history
  order, as many as fit in ``chars`` characters of rendered text, session headers included
  (at least one message), crossing session boundaries where they fall; every message is in
  exactly one plain window.
- **span** (``<conversation>/span<n>``, for questions whose evidence must come from several
  sessions): a conversation with two sessions or more has its sessions split into consecutive
  groups of at least two (``n // SPAN_SESSIONS`` groups, sizes as even as possible, earlier
  groups the larger); each session of a group contributes its first messages within an equal
  share of ``chars``.

Invariants: a window holds messages of one conversation, in history order, grouped by session
as :class:`contract.types.Segment` parts, rendered by :meth:`Segment.render` (one ``[id] role:
content`` line per message under a dated session header). Wherever a message is shown to a
model, in a window or by :func:`show`, its content is cut by :func:`clip` to the window's
size (with a mark), so no single message makes a request unbounded.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from contract.types import Message, Segment
from evolve.datasets.types import Conversation

SPAN_SESSIONS = 3  # sessions per span window, about
CUT_MARK = " […]"


@dataclass(frozen=True)
class Window:
    id: str
    conversation: str
    parts: tuple[Segment, ...]  # the sessions it shows, in history order, messages clipped
    span: bool  # a span window (several sessions) rather than a plain one

    def render(self) -> str:
        return "\n\n".join(part.render() for part in self.parts)

    def session_of(self) -> dict[str, str]:
        """Message id → the id of its session, for the messages this window shows."""
        return {m.id: part.session_id for part in self.parts for m in part.messages}


def clip(message: Message, chars: int) -> Message:
    """``message`` with its content cut to ``chars`` characters (and a mark) when longer."""
    if len(message.content) <= chars:
        return message
    return Message(message.id, message.role, message.content[:chars] + CUT_MARK)


def history(conversation: Conversation) -> list[tuple[Segment, Message]]:
    """Every message of ``conversation`` in history order, with its session."""
    return [(session, m) for session in conversation.sessions for m in session.messages]


def show(placed: Sequence[tuple[Segment, Message]], chars: int) -> str:
    """Messages (in history order) rendered as a window renders them, each cut to ``chars``."""
    parts = _parts([(session, clip(m, chars)) for session, m in placed])
    return "\n\n".join(part.render() for part in parts)


def _line_chars(message: Message) -> int:
    return len(f"[{message.id}] {message.text()}") + 1


def _parts(placed: Sequence[tuple[Segment, Message]]) -> tuple[Segment, ...]:
    """Messages with their sessions grouped into one Segment per run of one session."""
    parts: list[Segment] = []
    for session, message in placed:
        if parts and parts[-1].session_id == session.session_id:
            last = parts[-1]
            parts[-1] = Segment(last.session_id, last.date, (*last.messages, message))
        else:
            parts.append(Segment(session.session_id, session.date, (message,)))
    return tuple(parts)


def _header_chars(session: Segment) -> int:
    return len(Segment(session.session_id, session.date, ()).render()) + 2


def plain_windows(conversation: Conversation, chars: int) -> list[Window]:
    windows: list[Window] = []
    current: list[tuple[Segment, Message]] = []
    used = 0
    for session, message in history(conversation):
        shown = clip(message, chars)
        new_part = not current or current[-1][0].session_id != session.session_id
        size = _line_chars(shown) + (_header_chars(session) if new_part else 0)
        if current and used + size > chars:
            windows.append(_window(conversation.id, f"w{len(windows) + 1}", current, False))
            current, used = [], 0
            size = _line_chars(shown) + _header_chars(session)
        current.append((session, shown))
        used += size
    if current:
        windows.append(_window(conversation.id, f"w{len(windows) + 1}", current, False))
    return windows


def span_windows(conversation: Conversation, chars: int) -> list[Window]:
    sessions = conversation.sessions
    if len(sessions) < 2:
        return []
    groups = max(1, len(sessions) // SPAN_SESSIONS)
    size, extra = divmod(len(sessions), groups)
    windows: list[Window] = []
    start = 0
    for g in range(groups):
        group = sessions[start : start + size + (1 if g < extra else 0)]
        start += len(group)
        share = chars // len(group)
        placed: list[tuple[Segment, Message]] = []
        for session in group:
            used = 0
            for message in session.messages:
                shown = clip(message, share)
                if used and used + _line_chars(shown) > share:
                    break
                placed.append((session, shown))
                used += _line_chars(shown)
        windows.append(_window(conversation.id, f"span{g + 1}", placed, True))
    return windows


def _window(
    conversation: str, name: str, placed: Sequence[tuple[Segment, Message]], span: bool
) -> Window:
    return Window(f"{conversation}/{name}", conversation, _parts(placed), span)


def cut(conversations: Sequence[Conversation], chars: int) -> tuple[list[Window], list[Window]]:
    """The plain and the span windows of every conversation, in history order."""
    plain = [w for c in conversations for w in plain_windows(c, chars)]
    spans = [w for c in conversations for w in span_windows(c, chars)]
    return plain, spans


def choose(windows: list[Window], most: int | None, seed: int) -> list[Window]:
    """At most ``most`` of ``windows`` (None: all), drawn with ``seed``, kept in history order."""
    if most is None or len(windows) <= most:
        return list(windows)
    picked = set(random.Random(seed).sample(range(len(windows)), most))
    return [w for i, w in enumerate(windows) if i in picked]
