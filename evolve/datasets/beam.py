"""BEAM loader: the on-disk release layout -> `Conversation`, `Question` and `TaskSet`.

Owns reading ``<data_dir>/beam/chats/<size>/<n>/`` (``chat.json`` or ``chat_trunecated.json``,
``probing_questions/probing_questions.json``, ``topic.json``; format in docs/benchmarks.md §2) and
mapping BEAM's ten abilities onto the five native capabilities. Split files are read here but
written by `evolve.datasets.splits`; the hub download lives in `evolve.datasets.fetch`.

Invariants:
- ``chat_trunecated.json`` (sic) is preferred over ``chat.json``, as in the official runner.
- One `Segment` per batch, in file order; ``session_id`` is ``str(batch_number)`` (10M layout:
  ``"<plan>/<batch_number>"``, plans in file order). The date comes from the first user message
  carrying ``time_anchor`` (ISO ``YYYY-MM-DD`` when parseable, otherwise the raw text).
- Message ids are ``str(id)``, unique within a conversation; contents are verbatim (the
  ``" ->-> b,q"`` markers are kept). A repeated upstream id (1M/5 restarts at 0 in its last
  batch) is renumbered past the largest id and recorded in ``meta["renumbered_ids"]``.
- Question ids are ``beam/<size>/<conv>/<ability>/<i>``; ``evidence_ids`` are the flattened
  ``source_chat_ids`` as strings, deduplicated in order (non-id placeholders such as ``"--"``
  are dropped and listed in ``meta["dropped_evidence"]``).
- Every malformed or missing file raises `DataError` with one line naming the file.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import date
from pathlib import Path
from typing import Any

from contract.types import Message, Segment
from evolve.datasets.types import Conversation, DataError, Question, TaskSet, read_json
from evolve.resources import split_file

SIZES: tuple[str, ...] = ("100K", "500K", "1M", "10M")

ABILITY_CAPABILITY: dict[str, str] = {
    "information_extraction": "F",
    "temporal_reasoning": "T",
    "event_ordering": "T",
    "knowledge_update": "T",
    "preference_following": "P",
    "instruction_following": "P",
    "multi_session_reasoning": "M",
    "summarization": "M",
    "abstention": "A",
    "contradiction_resolution": "A",
}

GOLD_FIELD: dict[str, str] = {
    "abstention": "ideal_response",
    "contradiction_resolution": "ideal_answer",
    "event_ordering": "answer",
    "information_extraction": "answer",
    "instruction_following": "expected_compliance",
    "knowledge_update": "answer",
    "multi_session_reasoning": "answer",
    "preference_following": "expected_compliance",
    "summarization": "ideal_summary",
    "temporal_reasoning": "answer",
}

SUBTYPE_FIELD: dict[str, str] = {
    "abstention": "abstention_type",
    "contradiction_resolution": "contradiction_type",
    "event_ordering": "ordering_type",
    "information_extraction": "question_type",
    "instruction_following": "instruction_type",
    "knowledge_update": "update_type",
    "multi_session_reasoning": "reasoning_type",
    "preference_following": "preference_type",
    "summarization": "summarization_type",
    "temporal_reasoning": "temporal_type",
}

CHAT_FILES: tuple[str, ...] = ("chat_trunecated.json", "chat.json")  # preference order
QUESTIONS_FILE = Path("probing_questions") / "probing_questions.json"
TOPIC_FILE = "topic.json"
SPLIT_NAMES: tuple[str, ...] = ("train", "valid", "holdout", "test", "guard")
DEFAULT_SPLIT = "valid"  # what `evolve eval` scores unless told otherwise
DEFAULT_SPLITS_FILE = split_file("beam.json")

_MONTH_NAMES = (
    "january february march april may june july august september october november december"
)
_MONTHS = {m: i + 1 for i, m in enumerate(_MONTH_NAMES.split())}
_ANCHOR_RE = re.compile(r"^\s*([A-Za-z]+)[-\s]+(\d{1,2})[-,\s]+(\d{4})\s*$")
_ID_RE = re.compile(r"^\d+$")


# ---------------------------------------------------------------- paths and files


def _size_dir(data_dir: Path, size: str) -> Path:
    if size not in SIZES:
        raise DataError(f"unknown BEAM size {size!r} (expected one of {', '.join(SIZES)})")
    return Path(data_dir) / "beam" / "chats" / size


def _missing_hint(data_dir: Path, size: str) -> str:
    return (
        f"BEAM files are expected at {Path(data_dir)}/beam/chats/{size}/<n>/chat.json "
        "(run `evolve data fetch beam` to download them)"
    )


def _conv_dir(data_dir: Path, size: str, conv: str) -> Path:
    if not conv or "/" in conv or "\\" in conv or conv in (".", ".."):
        raise DataError(f"invalid BEAM conversation name {conv!r}")
    root = _size_dir(data_dir, size)
    if not root.is_dir():
        raise DataError(f"no BEAM-{size} data in {root}: {_missing_hint(data_dir, size)}")
    path = root / conv
    if not path.is_dir():
        raise DataError(f"{path}: no such BEAM conversation; {_missing_hint(data_dir, size)}")
    return path


def chat_file(conv_dir: Path) -> Path | None:
    """The chat file the official runner would use in ``conv_dir``, or None if it has none."""
    for name in CHAT_FILES:
        if (conv_dir / name).is_file():
            return conv_dir / name
    return None


def conv_sort_key(name: str) -> tuple[int, int, str]:
    """Numeric names first, in numeric order; any others after them, by name."""
    return (0, int(name), "") if _ID_RE.match(name) else (1, 0, name)


def list_conversations(data_dir: Path, size: str) -> list[str]:
    """Conversation names of ``size`` that have a chat file, in numeric order."""
    root = _size_dir(data_dir, size)
    if not root.is_dir():
        raise DataError(f"no BEAM-{size} data in {root}: {_missing_hint(data_dir, size)}")
    names = [p.name for p in root.iterdir() if p.is_dir() and chat_file(p) is not None]
    return sorted(names, key=conv_sort_key)


def list_question_sets(data_dir: Path, size: str) -> list[str]:
    """Conversation names of ``size`` that have probing questions (chat or not), numeric order."""
    root = _size_dir(data_dir, size)
    if not root.is_dir():
        raise DataError(f"no BEAM-{size} data in {root}: {_missing_hint(data_dir, size)}")
    names = [p.name for p in root.iterdir() if (p / QUESTIONS_FILE).is_file()]
    return sorted(names, key=conv_sort_key)


# ---------------------------------------------------------------- chat


def normalise_date(text: str) -> str:
    """``"March-15-2024"`` -> ``"2024-03-15"``; unparseable text is returned unchanged."""
    m = _ANCHOR_RE.match(text)
    if m:
        name, day, year = m.group(1).lower(), int(m.group(2)), int(m.group(3))
        month = _MONTHS.get(name) or next(
            (v for k, v in _MONTHS.items() if len(name) >= 3 and k.startswith(name)), None
        )
        if month is not None:
            try:
                return date(year, month, day).isoformat()
            except ValueError:
                pass
    return text


def _batches(chat: Any, path: Path) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(session id, location for errors, batch dict) for both the plain and the 10M layout."""
    if not isinstance(chat, list):
        raise DataError(f"{path}: expected a list of batches, got {type(chat).__name__}")
    for i, entry in enumerate(chat):
        if not isinstance(entry, dict):
            raise DataError(f"{path}: batch {i + 1} is {type(entry).__name__}, not an object")
        if "turns" in entry:
            number = entry.get("batch_number", i + 1)
            yield str(number), f"batch {number}", entry
            continue
        for plan, batches in entry.items():  # 10M: {"plan-k": [batches...]}, nulls dropped
            if batches is None:
                continue
            if not isinstance(batches, list):
                raise DataError(f"{path}: entry {i + 1} {plan!r} is not a list of batches")
            for j, batch in enumerate(batches):
                if not isinstance(batch, dict) or "turns" not in batch:
                    raise DataError(f"{path}: {plan} batch {j + 1} has no 'turns'")
                number = batch.get("batch_number", j + 1)
                yield f"{plan}/{number}", f"{plan} batch {number}", batch


def _message(raw: Any, where: str, path: Path) -> Message:
    if not isinstance(raw, dict):
        raise DataError(f"{path}: {where} is {type(raw).__name__}, not an object")
    for key in ("id", "role", "content"):
        if key not in raw:
            raise DataError(f"{path}: {where} has no {key!r}")
    mid, role, content = raw["id"], raw["role"], raw["content"]
    if isinstance(mid, bool) or not isinstance(mid, int | str):
        raise DataError(f"{path}: {where} has a non-integer id {mid!r}")
    if not isinstance(role, str) or not isinstance(content, str):
        raise DataError(f"{path}: {where} has a non-string role or content")
    return Message(id=str(mid), role=role, content=content)


def parse_chat(chat: Any, path: Path) -> tuple[tuple[Segment, ...], list[list[str]]]:
    """Segments from a parsed chat file (``path`` only names the file in errors).

    A message id already used earlier in the chat (upstream 1M/5 restarts its ids at 0 in batch
    10) gets the next integer above the chat's largest id; the second value lists those changes
    as ``[session_id, old_id, new_id]``. Earlier occurrences keep their ids, so evidence ids
    (which point at the first occurrence in the data seen so far) still resolve.
    """
    batches = list(_batches(chat, path))
    parsed: list[tuple[str, str, dict[str, Any], list[tuple[Message, dict[str, Any]]]]] = []
    for session_id, where, batch in batches:
        turns = batch["turns"]
        if not isinstance(turns, list):
            raise DataError(f"{path}: {where}: 'turns' is not a list")
        msgs: list[tuple[Message, dict[str, Any]]] = []
        for t, turn in enumerate(turns):
            if not isinstance(turn, list):
                raise DataError(f"{path}: {where} turn {t + 1} is not a list of messages")
            for k, raw in enumerate(turn):
                msgs.append((_message(raw, f"{where} turn {t + 1} message {k + 1}", path), raw))
        parsed.append((session_id, where, batch, msgs))
    int_ids = [int(m.id) for *_, msgs in parsed for m, _ in msgs if _ID_RE.match(m.id)]
    next_id = max(int_ids, default=-1) + 1
    seen: set[str] = set()
    renumbered: list[list[str]] = []
    sessions: list[Segment] = []
    for session_id, where, batch, msgs in parsed:
        messages: list[Message] = []
        anchor: str | None = None
        for msg, raw in msgs:
            if msg.id in seen:
                if not _ID_RE.match(msg.id):
                    raise DataError(f"{path}: {where}: duplicate message id {msg.id!r}")
                renumbered.append([session_id, msg.id, str(next_id)])
                msg = Message(id=str(next_id), role=msg.role, content=msg.content)
                next_id += 1
            seen.add(msg.id)
            messages.append(msg)
            if anchor is None and msg.role == "user" and isinstance(raw.get("time_anchor"), str):
                anchor = raw["time_anchor"]
        if anchor is None and isinstance(batch.get("time_anchor"), str):
            anchor = batch["time_anchor"]
        date_ = normalise_date(anchor) if anchor else None
        sessions.append(Segment(session_id=session_id, date=date_, messages=tuple(messages)))
    return tuple(sessions), renumbered


# ---------------------------------------------------------------- questions


def _evidence(raw: Any, out: list[str], dropped: list[Any]) -> None:
    if raw is None:
        return
    if isinstance(raw, dict):
        for value in raw.values():
            _evidence(value, out, dropped)
    elif isinstance(raw, list):
        for value in raw:
            _evidence(value, out, dropped)
    elif isinstance(raw, int) and not isinstance(raw, bool):
        out.append(str(raw))
    elif isinstance(raw, str) and _ID_RE.match(raw.strip()):
        out.append(str(int(raw.strip())))
    else:
        dropped.append(raw)


def evidence_ids(raw: Any) -> tuple[tuple[str, ...], list[Any]]:
    """Flatten ``source_chat_ids`` (list, nested lists, dict of lists, or None).

    Returns the ids as strings, deduplicated in order, and the entries that are not ids.
    """
    out: list[str] = []
    dropped: list[Any] = []
    _evidence(raw, out, dropped)
    return tuple(dict.fromkeys(out)), dropped


def parse_questions(data: Any, conversation_id: str, path: Path) -> list[Question]:
    """Questions from a parsed probing_questions.json (``path`` only names the file in errors)."""
    if not isinstance(data, dict):
        raise DataError(f"{path}: expected an object of ability -> questions")
    questions: list[Question] = []
    for ability, items in data.items():
        if ability not in ABILITY_CAPABILITY:
            known = ", ".join(sorted(ABILITY_CAPABILITY))
            raise DataError(f"{path}: unknown ability {ability!r} (expected one of {known})")
        if not isinstance(items, list):
            raise DataError(f"{path}: {ability} is not a list of questions")
        gold_field = GOLD_FIELD[ability]
        for i, q in enumerate(items):
            where = f"{ability}[{i}]"
            if not isinstance(q, dict):
                raise DataError(f"{path}: {where} is not an object")
            if not isinstance(q.get("question"), str):
                raise DataError(f"{path}: {where} has no string 'question'")
            if not isinstance(q.get(gold_field), str):
                raise DataError(f"{path}: {where} has no string {gold_field!r}")
            rubric = q.get("rubric") or []
            if not isinstance(rubric, list) or not all(isinstance(r, str) for r in rubric):
                raise DataError(f"{path}: {where}: 'rubric' is not a list of strings")
            ids, dropped = evidence_ids(q.get("source_chat_ids"))
            meta = {k: v for k, v in q.items() if k not in ("question", gold_field, "rubric")}
            meta["gold_field"] = gold_field
            if SUBTYPE_FIELD[ability] in q:
                meta["subtype"] = q[SUBTYPE_FIELD[ability]]
            if dropped:
                meta["dropped_evidence"] = dropped
            questions.append(
                Question(
                    id=f"{conversation_id}/{ability}/{i}",
                    conversation_id=conversation_id,
                    ability=ability,
                    capability=ABILITY_CAPABILITY[ability],
                    question=q["question"],
                    gold=q[gold_field],
                    rubric=tuple(rubric),
                    evidence_ids=ids,
                    question_date=None,
                    meta=meta,
                )
            )
    return questions


def load_questions(data_dir: Path, size: str, conv: str) -> list[Question]:
    """Only the probing questions of one conversation (works for 10M, which has no chats here)."""
    path = _conv_dir(data_dir, size, conv) / QUESTIONS_FILE
    return parse_questions(read_json(path), f"beam/{size}/{conv}", path)


# ---------------------------------------------------------------- conversations and task sets


def load_conversation(data_dir: Path, size: str, conv: str) -> tuple[Conversation, list[Question]]:
    """One BEAM conversation and its probing questions."""
    cdir = _conv_dir(data_dir, size, conv)
    cfile = chat_file(cdir)
    if cfile is None:
        raise DataError(
            f"{cdir}: no chat.json or chat_trunecated.json; {_missing_hint(data_dir, size)}"
        )
    sessions, renumbered = parse_chat(read_json(cfile), cfile)
    topic_path = cdir / TOPIC_FILE
    topic = read_json(topic_path)
    if not isinstance(topic, dict):
        raise DataError(f"{topic_path}: expected an object")
    cid = f"beam/{size}/{conv}"
    meta = {
        "bench": "beam",
        "size": size,
        "conv": conv,
        "chat_file": cfile.name,
        "title": topic.get("title"),
        "category": topic.get("category"),
        "topic": topic,
    }
    if renumbered:
        meta["renumbered_ids"] = renumbered
    conversation = Conversation(id=cid, sessions=sessions, meta=meta)
    qpath = cdir / QUESTIONS_FILE
    return conversation, parse_questions(read_json(qpath), cid, qpath)


def _taskset(data_dir: Path, split: str, refs: list[tuple[str, str]]) -> TaskSet:
    conversations: list[Conversation] = []
    questions: list[Question] = []
    for size, conv in refs:
        c, qs = load_conversation(data_dir, size, conv)
        conversations.append(c)
        questions.extend(qs)
    return TaskSet("beam", split, tuple(conversations), tuple(questions))


def split_refs(split: str, splits_file: Path | None = None) -> list[tuple[str, str]]:
    """(size, conv) pairs of a named split in the splits file."""
    path = Path(splits_file) if splits_file is not None else DEFAULT_SPLITS_FILE
    data = read_json(path)
    try:
        refs = data["splits"][split]["conversations"]
        return [(str(r["size"]), str(r["conv"])) for r in refs]
    except (KeyError, TypeError):
        raise DataError(f"{path}: no conversation list for split {split!r}") from None


def data_files(data_dir: Path, refs: list[tuple[str, str]]) -> list[Path]:
    """The files a task set of these (size, conv) pairs is read from (for run manifests)."""
    files = []
    for size, conv in refs:
        cdir = _conv_dir(data_dir, size, conv)
        chat = chat_file(cdir)
        files += [p for p in (chat, cdir / QUESTIONS_FILE, cdir / TOPIC_FILE) if p is not None]
    return files


def load_taskset(data_dir: Path, split: str, splits_file: Path | None = None) -> TaskSet:
    """A named split (train/valid/holdout/test from the splits file), ``all`` (every 100K
    conversation on disk) or ``all:<size>`` (every conversation of that size on disk)."""
    return _taskset(data_dir, split, _refs(data_dir, split, splits_file))


def split_files(data_dir: Path, split: str, conversations: int | None = None) -> list[Path]:
    """The files a split (its first ``conversations`` conversations) is read from."""
    return data_files(data_dir, _refs(data_dir, split)[:conversations])


def run_split(data_dir: Path, role: str) -> str:
    """The split a run's ``role`` (train, valid, test) reads: the split of that name."""
    return role


def _refs(data_dir: Path, split: str, splits_file: Path | None = None) -> list[tuple[str, str]]:
    """The (size, conv) pairs of a split, each checked to have a chat file on disk."""
    if split == "all" or split.startswith("all:"):
        size = split.partition(":")[2] or "100K"
        if size not in SIZES:
            raise DataError(f"unknown BEAM size in split {split!r} (expected one of {SIZES})")
        convs = list_conversations(data_dir, size)
        if not convs:
            raise DataError(
                f"no BEAM-{size} conversation with a chat file: {_missing_hint(data_dir, size)}"
            )
        return [(size, c) for c in convs]
    if split not in SPLIT_NAMES:
        valid = ", ".join([*SPLIT_NAMES, "all", *(f"all:{s}" for s in SIZES)])
        raise DataError(f"unknown BEAM split {split!r} (valid: {valid})")
    refs = split_refs(split, splits_file)
    for size, conv in refs:
        cdir = _size_dir(data_dir, size) / conv
        if not cdir.is_dir() or chat_file(cdir) is None:
            raise DataError(
                f"split {split!r} names beam/{size}/{conv} but {cdir} has no chat file; "
                f"{_missing_hint(data_dir, size)}"
            )
    return refs
