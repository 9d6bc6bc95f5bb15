"""LongMemEval loader and split rule: the released JSON files -> `Conversation`s and `Question`s.

Owns reading ``<data_dir>/longmemeval/`` (format in docs/benchmarks.md §3.1), the native
capability map (docs/design.md §3) and the split rule of ``splits/longmemeval.json``
(docs/design.md §6).

Files, looked up in this order per variant (the first that exists is read):

- ``s``: ``longmemeval_s.json``, then ``longmemeval_s_cleaned.json``;
- ``m``: ``longmemeval_m.json``, then ``longmemeval_m_cleaned.json``;
- ``oracle``: ``longmemeval_oracle.json``.

Invariants:
- One haystack per question: each instance becomes its own `Conversation`
  ``longmemeval/<variant>/<question_id>`` with one `Segment` per haystack session
  (``session_id`` = the haystack session id, date = ISO ``YYYY-MM-DD`` from ``haystack_dates``,
  the original date texts in ``meta["session_dates"]``). Sessions are put in time order (a
  stable sort; S and M are already sorted, oracle is not) when every date parses; a change of
  order is recorded in ``meta["reordered_by_date"]``.
- A session id repeated within one haystack (some released S histories repeat a filler) keeps
  every occurrence; the k-th occurrence (k >= 2) becomes ``<id>#<k>``, listed in
  ``meta["duplicate_sessions"]``. Message ids are ``<session_id>:<turn index from 0>``.
- ``evidence_ids`` are the turns marked ``has_answer: true``; when none is marked, every turn of
  the ``answer_session_ids`` sessions (``meta["evidence_source"]`` says which). Abstention
  questions (id ending ``_abs``) have no evidence, as in the official retrieval evaluation; their
  marked turns stay in ``meta["marked_evidence_ids"]``.
- ``Question.ability`` is the ``question_type`` (``_abs`` items keep their type);
  ``capability`` is the native map, ``A`` for every ``_abs`` item. For
  single-session-preference the gold answer is a rubric and is also ``rubric[0]``.
- Split rule (``splits/longmemeval.json``): the question ids of the split's file, per
  ``question_type``, sorted, then shuffled with ``random.Random(f"{seed}/{type}")``; each type's
  order is cut into consecutive slices in the rule's split order (train, valid, test). A
  split's size is allocated to the types in proportion to their counts by largest remainder
  (ties to the alphabetically first type; a type with no questions left passes its seat on),
  so the totals are exact. S and M hold the same questions, so train/valid (from S) and test
  (from M) are disjoint. A file with fewer questions than the release (``release_questions``)
  scales every split to ``round_half_up(n * N / release)``; a split that scales to 0 questions
  is a `DataError`, and scaled conversations say so in ``meta["split_scaled"]``.
- A split validates every instance's id and type; the instances it selects are parsed in full.
- Every missing or malformed file raises `DataError` with one line naming the file (and the
  instance index and question id).
"""

from __future__ import annotations

import json
import random
import re
from collections import Counter
from datetime import date, datetime
from pathlib import Path
from typing import Any

from contract.types import Message, Segment
from evolve.datasets.types import (
    Conversation,
    DataError,
    Question,
    TaskSet,
    read_json,
    read_records,
)
from evolve.resources import split_file

TYPE_CAPABILITY: dict[str, str] = {
    "single-session-user": "F",
    "single-session-assistant": "F",
    "single-session-preference": "P",
    "temporal-reasoning": "T",
    "knowledge-update": "T",
    "multi-session": "M",
}
TYPES: tuple[str, ...] = tuple(TYPE_CAPABILITY)
ABSTENTION_CAPABILITY = "A"
ABSTENTION_SUFFIX = "_abs"
PREFERENCE = "single-session-preference"

FILE_NAMES: dict[str, tuple[str, ...]] = {  # lookup order per variant
    "s": ("longmemeval_s.json", "longmemeval_s_cleaned.json"),
    "m": ("longmemeval_m.json", "longmemeval_m_cleaned.json"),
    "oracle": ("longmemeval_oracle.json",),
}
VARIANTS: tuple[str, ...] = tuple(FILE_NAMES)
SPLIT_NAMES: tuple[str, ...] = ("train", "valid", "test")
DEFAULT_SPLIT = "valid"  # what `evolve eval` scores unless told otherwise (as for BEAM)
DEFAULT_SPLITS_FILE = split_file("longmemeval.json")

RELEASE_QUESTIONS = 500
RELEASE_PER_TYPE: dict[str, int] = {  # docs/benchmarks.md §3.2
    "single-session-user": 70,
    "single-session-assistant": 56,
    "single-session-preference": 30,
    "temporal-reasoning": 133,
    "knowledge-update": 78,
    "multi-session": 133,
}
SPLIT_SIZES: dict[str, tuple[str, int]] = {
    "train": ("s", 60),
    "valid": ("s", 60),
    "test": ("m", 200),
}
GENERATOR = (
    "evolve.datasets.longmemeval.plan: the question ids of the split's file grouped by "
    "question_type, sorted, shuffled with random.Random(f'{seed}/{type}'), and cut into "
    "consecutive slices in split order (train, valid, test); each split's size is allocated to "
    "the types in proportion to their counts by largest remainder (ties: alphabetical type); "
    "files with fewer than release_questions questions scale each size to "
    "round_half_up(size * N / release_questions)"
)

_DATE_RE = re.compile(
    r"^\s*(\d{4})/(\d{1,2})/(\d{1,2})\s*(?:\([A-Za-z]+\))?\s*(?:(\d{1,2}):(\d{2}))?\s*$"
)


# ---------------------------------------------------------------- files


def is_abstention(question_id: str) -> bool:
    return question_id.endswith(ABSTENTION_SUFFIX)


def data_file(data_dir: Path, variant: str) -> Path:
    """The file read for ``variant``: the first of :data:`FILE_NAMES` that exists."""
    if variant not in FILE_NAMES:
        raise DataError(f"unknown LongMemEval variant {variant!r} (expected one of {VARIANTS})")
    root = Path(data_dir) / "longmemeval"
    for name in FILE_NAMES[variant]:
        if (root / name).is_file():
            return root / name
    expected = " or ".join(str(root / name) for name in FILE_NAMES[variant])
    raise DataError(f"no LongMemEval-{variant} file: expected {expected}")


def read_instances(path: Path) -> list[dict[str, Any]]:
    """The instances of one file, each checked to be an object with a unique string
    ``question_id`` and a known ``question_type`` (:func:`parse_instance` checks the rest)."""
    data = read_records(path, "instance", "question_id")
    for i, raw in enumerate(data):
        qid = raw["question_id"]
        if raw.get("question_type") not in TYPE_CAPABILITY:
            raise DataError(
                f"{path}: instance [{i}] {qid}: unknown question_type "
                f"{raw.get('question_type')!r} (expected one of {', '.join(TYPES)})"
            )
    return data


# ---------------------------------------------------------------- instances


def parse_date(text: str) -> tuple[str, datetime | None]:
    """``"2023/05/30 (Tue) 23:40"`` -> (``"2023-05-30"``, the datetime); unparseable text is
    returned unchanged, with None."""
    m = _DATE_RE.match(text)
    if m:
        try:
            day = date(int(m.group(1)), int(m.group(2)), int(m.group(3)))
            hour, minute = int(m.group(4) or 0), int(m.group(5) or 0)
            return day.isoformat(), datetime(day.year, day.month, day.day, hour, minute)
        except ValueError:
            pass
    return text, None


def _string_list(raw: dict[str, Any], key: str, where: str) -> list[str]:
    value = raw.get(key)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise DataError(f"{where}: {key!r} is not a list of strings")
    return value


def _sessions(raw: dict[str, Any], where: str) -> list[tuple[str, str, list[dict[str, Any]]]]:
    """(original session id, date text, turns) per haystack session, checked, in file order."""
    ids = _string_list(raw, "haystack_session_ids", where)
    dates = _string_list(raw, "haystack_dates", where)
    sessions = raw.get("haystack_sessions")
    if not isinstance(sessions, list):
        raise DataError(f"{where}: 'haystack_sessions' is not a list")
    if not len(ids) == len(dates) == len(sessions):
        raise DataError(
            f"{where}: {len(ids)} haystack_session_ids, {len(dates)} haystack_dates and "
            f"{len(sessions)} haystack_sessions (they must match)"
        )
    for s, turns in enumerate(sessions):
        if not isinstance(turns, list):
            raise DataError(f"{where}: haystack session [{s}] is not a list of turns")
        for t, turn in enumerate(turns):
            if not isinstance(turn, dict):
                raise DataError(f"{where}: haystack session [{s}] turn [{t}] is not an object")
            for key in ("role", "content"):
                if not isinstance(turn.get(key), str):
                    raise DataError(
                        f"{where}: haystack session [{s}] turn [{t}] has no string {key!r}"
                    )
    return list(zip(ids, dates, sessions, strict=True))


def parse_instance(
    raw: dict[str, Any], variant: str, path: Path, index: int
) -> tuple[Conversation, Question]:
    """One instance (already through :func:`read_instances`) as its conversation and question."""
    qid: str = raw["question_id"]
    qtype: str = raw["question_type"]
    where = f"{path}: instance [{index}] {qid}"
    for key in ("question", "question_date"):
        if not isinstance(raw.get(key), str):
            raise DataError(f"{where}: no string {key!r}")
    answer = raw.get("answer")
    if isinstance(answer, bool) or not isinstance(answer, str | int | float):
        raise DataError(f"{where}: 'answer' is not a string or a number")
    answer_sessions = _string_list(raw, "answer_session_ids", where)

    occurrences: Counter[str] = Counter()
    duplicates: list[list[str]] = []
    parsed: list[tuple[datetime | None, Segment, str, str]] = []
    marked: list[str] = []
    for original, date_text, turns in _sessions(raw, where):
        occurrences[original] += 1
        sid = original if occurrences[original] == 1 else f"{original}#{occurrences[original]}"
        if sid != original:
            duplicates.append([original, sid])
        iso, when = parse_date(date_text)
        messages = tuple(
            Message(id=f"{sid}:{t}", role=turn["role"], content=turn["content"])
            for t, turn in enumerate(turns)
        )
        marked += [
            m.id for m, turn in zip(messages, turns, strict=True) if turn.get("has_answer") is True
        ]
        parsed.append(
            (when, Segment(session_id=sid, date=iso, messages=messages), original, date_text)
        )
    if all(when is not None for when, *_ in parsed):
        ordered = sorted(parsed, key=lambda p: p[0] or datetime.min)
    else:
        ordered = parsed
    sessions = tuple(seg for _, seg, _, _ in ordered)

    abstention = is_abstention(qid)
    if abstention:
        evidence, source = [], "none (abstention)"
    elif marked:
        evidence, source = marked, "has_answer"
    else:
        wanted = set(answer_sessions)
        evidence = [m.id for _, seg, orig, _ in parsed if orig in wanted for m in seg.messages]
        source = "answer_session_ids" if evidence else "none"

    cid = f"longmemeval/{variant}/{qid}"
    conv_meta: dict[str, Any] = {
        "bench": "longmemeval",
        "variant": variant,
        "file": path.name,
        "question_id": qid,
        "session_dates": {seg.session_id: text for _, seg, _, text in parsed},
    }
    if duplicates:
        conv_meta["duplicate_sessions"] = duplicates
    if ordered != parsed:
        conv_meta["reordered_by_date"] = True
    q_date, _ = parse_date(raw["question_date"])
    q_meta: dict[str, Any] = {
        "abstention": abstention,
        "answer_session_ids": list(answer_sessions),
        "variant": variant,
        "question_date_raw": raw["question_date"],
        "evidence_source": source,
    }
    if abstention and marked:
        q_meta["marked_evidence_ids"] = marked
    gold = str(answer)
    question = Question(
        id=qid,
        conversation_id=cid,
        ability=qtype,
        capability=ABSTENTION_CAPABILITY if abstention else TYPE_CAPABILITY[qtype],
        question=raw["question"],
        gold=gold,
        rubric=(gold,) if qtype == PREFERENCE else (),
        evidence_ids=tuple(evidence),
        question_date=q_date,
        meta=q_meta,
    )
    return Conversation(id=cid, sessions=sessions, meta=conv_meta), question


# ---------------------------------------------------------------- split rule


def allocate(size: int, counts: dict[str, int], room: dict[str, int]) -> dict[str, int]:
    """``size`` seats over the types of ``counts`` in proportion to them (largest remainder,
    ties to the alphabetically first type), no type above its ``room``."""
    total = sum(counts.values())
    seats = {t: min(size * n // total, room[t]) for t, n in counts.items()}
    order = sorted(counts, key=lambda t: (-(size * counts[t] % total), t))
    while (left := size - sum(seats.values())) > 0:
        open_types = [t for t in order if seats[t] < room[t]]
        if not open_types:
            raise DataError(f"cannot place {left} more questions: every type is used up")
        for t in open_types[:left]:
            seats[t] += 1
    return seats


def allocate_splits(sizes: dict[str, int], counts: dict[str, int]) -> dict[str, dict[str, int]]:
    """Split -> type -> seats: each split in turn (in ``sizes`` order) takes its proportional
    share from what the earlier splits left."""
    room = dict(counts)
    out: dict[str, dict[str, int]] = {}
    for name, size in sizes.items():
        out[name] = allocate(size, counts, room)
        for t, n in out[name].items():
            room[t] -= n
    return out


def split_sizes(rule: dict[str, Any], n_questions: int) -> dict[str, int]:
    """Each split's size for a file of ``n_questions`` (scaled down below the release size)."""
    release: int = rule["release_questions"]
    sizes: dict[str, int] = {}
    for name, entry in rule["splits"].items():
        size: int = entry["n_questions"]
        scaled = (2 * size * n_questions + release) // (2 * release)  # round half up
        sizes[name] = size if n_questions >= release else scaled
    return sizes


def plan(rule: dict[str, Any], types: dict[str, str]) -> dict[str, list[str]]:
    """Split name -> its question ids (sorted), for a file whose questions have these types."""
    by_type: dict[str, list[str]] = {}
    for qid in sorted(types):
        by_type.setdefault(types[qid], []).append(qid)
    for t, ids in by_type.items():
        random.Random(f"{rule['seed']}/{t}").shuffle(ids)
    counts = {t: len(ids) for t, ids in sorted(by_type.items())}
    seats = allocate_splits(split_sizes(rule, len(types)), counts)
    taken = dict.fromkeys(counts, 0)
    out: dict[str, list[str]] = {}
    for name, per_type in seats.items():
        out[name] = sorted(
            q for t, n in per_type.items() for q in by_type[t][taken[t] : taken[t] + n]
        )
        for t, n in per_type.items():
            taken[t] += n
    return out


def build_rule(seed: int = 0) -> dict[str, Any]:
    """The split rule as written to ``splits/longmemeval.json``, with the per-type counts the
    rule gives on the full release (computed, for reference; the loader recomputes from disk)."""
    sizes = {name: n for name, (_, n) in SPLIT_SIZES.items()}
    seats = allocate_splits(sizes, RELEASE_PER_TYPE)
    return {
        "bench": "longmemeval",
        "seed": seed,
        "generator": GENERATOR,
        "stratify": "question_type",
        "release_questions": RELEASE_QUESTIONS,
        "release_per_type": dict(RELEASE_PER_TYPE),
        "splits": {
            name: {
                "variant": variant,
                "n_questions": n,
                "release_per_type": {t: seats[name][t] for t in TYPES},
            }
            for name, (variant, n) in SPLIT_SIZES.items()
        },
    }


def render_rule(seed: int = 0) -> str:
    """The text of ``splits/longmemeval.json`` for ``seed``. Regenerate the file with
    ``python -c "import evolve.datasets.longmemeval as l; print(l.render_rule(), end='')"``."""
    return json.dumps(build_rule(seed), indent=2, ensure_ascii=False) + "\n"


def read_rule(path: Path | None = None) -> dict[str, Any]:
    """The split rule, checked for the fields :func:`plan` uses."""
    file = Path(path) if path is not None else DEFAULT_SPLITS_FILE
    rule = read_json(file)
    ok = (
        isinstance(rule, dict)
        and isinstance(rule.get("seed"), int)
        and isinstance(rule.get("release_questions"), int)
        and rule["release_questions"] > 0
        and isinstance(rule.get("splits"), dict)
        and all(
            isinstance(e, dict)
            and e.get("variant") in VARIANTS
            and isinstance(e.get("n_questions"), int)
            and e["n_questions"] > 0
            for e in rule["splits"].values()
        )
    )
    if not ok:
        raise DataError(
            f"{file}: not a LongMemEval split rule (needs integer 'seed' and "
            "'release_questions', and 'splits' of {variant, n_questions})"
        )
    return rule


def split_ids(data_dir: Path, split: str, splits_file: Path | None = None) -> list[str]:
    """The question ids of a named split, computed from the split's file on disk (sorted)."""
    if split not in SPLIT_NAMES:
        raise DataError(f"unknown LongMemEval split {split!r} (expected one of {SPLIT_NAMES})")
    return sorted(_select(data_dir, split, splits_file).chosen)


class _Selection:
    """The file a split reads, its checked instances, the chosen ids and a scaling note."""

    def __init__(self, variant: str, path: Path, instances: list[dict[str, Any]]) -> None:
        self.variant, self.path, self.instances = variant, path, instances
        self.chosen = {raw["question_id"] for raw in instances}
        self.note: str | None = None


def _variant(split: str, rule: dict[str, Any] | None) -> str:
    """The variant a split reads: ``all[:<variant>]`` names it, a rule split has one."""
    if rule is None:
        variant = split.partition(":")[2] or "s"
        if variant not in VARIANTS:
            raise DataError(f"unknown LongMemEval variant in split {split!r} (expected {VARIANTS})")
        return variant
    if split not in rule["splits"]:
        raise DataError(f"no split {split!r} in the LongMemEval split rule")
    return str(rule["splits"][split]["variant"])


def _rule_of(split: str, splits_file: Path | None) -> dict[str, Any] | None:
    return None if split == "all" or split.startswith("all:") else read_rule(splits_file)


def split_files(data_dir: Path, split: str, conversations: int | None = None) -> list[Path]:
    """The file a split is read from (one per variant, whichever questions it takes)."""
    return [data_file(data_dir, _variant(split, _rule_of(split, None)))]


def run_split(data_dir: Path, role: str) -> str:
    """The split a run's ``role`` (train, valid, test) reads: the split of that name."""
    return role


def _select(data_dir: Path, split: str, splits_file: Path | None) -> _Selection:
    rule = _rule_of(split, splits_file)
    variant = _variant(split, rule)
    path = data_file(data_dir, variant)
    sel = _Selection(variant, path, read_instances(path))
    if rule is None:
        return sel
    types = {raw["question_id"]: raw["question_type"] for raw in sel.instances}
    size = split_sizes(rule, len(types))[split]
    if size == 0:
        need = -(-rule["release_questions"] // (2 * rule["splits"][split]["n_questions"]))
        raise DataError(
            f"{path}: {len(types)} questions are too few for split {split!r} "
            f"(it needs at least {need} to scale to one question)"
        )
    sel.chosen = set(plan(rule, types)[split])
    wanted = rule["splits"][split]["n_questions"]
    if size < wanted:
        sel.note = (
            f"{split}: {size} of {wanted} questions (the file holds {len(types)} of the "
            f"release's {rule['release_questions']})"
        )
    return sel


# ---------------------------------------------------------------- task sets


def load_taskset(data_dir: Path, split: str, splits_file: Path | None = None) -> TaskSet:
    """A named split (train/valid/test by the split rule), ``all`` (every instance of the S
    file) or ``all:<variant>`` (``all:s``, ``all:m``, ``all:oracle``), in file order."""
    if split not in SPLIT_NAMES and split != "all" and not split.startswith("all:"):
        valid = ", ".join([*SPLIT_NAMES, "all", *(f"all:{v}" for v in VARIANTS)])
        raise DataError(f"unknown LongMemEval split {split!r} (valid: {valid})")
    sel = _select(data_dir, split, splits_file)
    conversations: list[Conversation] = []
    questions: list[Question] = []
    for i, raw in enumerate(sel.instances):
        if raw["question_id"] in sel.chosen:
            conv, question = parse_instance(raw, sel.variant, sel.path, i)
            if sel.note is not None:
                conv.meta["split_scaled"] = sel.note
            conversations.append(conv)
            questions.append(question)
    return TaskSet("longmemeval", split, tuple(conversations), tuple(questions))
