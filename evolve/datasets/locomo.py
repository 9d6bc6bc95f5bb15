"""LoCoMo loader: the official ``locomo10.json`` format -> `Conversation`, `Question`, `TaskSet`.

Owns reading ``<data_dir>/locomo/locomo10.json`` (else the one-conversation
``locomo-sample.json``; format in docs/benchmarks.md §4.1), the category -> capability map and
``splits/locomo.json`` (built by :func:`build_splits`, read by :func:`load_taskset`).

Capability map (design §3; the category number stays authoritative in ``Question.ability``,
e.g. ``"category_2_temporal"``, and in ``meta["category"]``):
1 multi-hop -> M (answers combine turns from several sessions), 2 temporal -> T,
3 open-domain / commonsense inference -> F (a fact about a speaker plus world knowledge),
4 single-hop -> F, 5 adversarial (unanswerable; ``adversarial_answer`` is the trap) -> A.

Invariants:
- One `Segment` per ``session_<n>`` list present, in numeric order (date keys may exist for
  absent sessions and are ignored); ``session_id`` is ``str(n)``; ``date`` is the ISO date of
  ``session_<n>_date_time`` ("1:56 pm on 8 May, 2023" -> "2023-05-08"), the raw text when it
  does not parse, None when absent. The raw texts are kept in ``meta["session_dates"]``.
- Message id = ``dia_id`` ("D1:3"), role = the speaker's name, content = ``text``; an image turn
  gets ``" [image: <blip_caption>]"`` appended (the images are not released).
- Conversation ids are ``locomo/<sample_id>``, question ids ``locomo/<sample_id>/<index in qa>``.
  ``gold`` is ``str(answer)`` (six answers are ints); for category 5 it is
  :data:`NOT_MENTIONED`, with ``adversarial_answer`` (and ``answer``, which two items also
  have) in ``meta``. ``question_date`` is None: LoCoMo dates sessions, not questions.
- Evidence: each ``evidence`` entry is split on ``;``, ``,`` and whitespace (the release packs
  several ids into one entry, e.g. ``"D8:6; D9:17"``, ``"D9:1 D4:4 D4:6"``). A piece that is
  not a message id of the conversation is read as ``D<s>:<t>`` allowing one stray colon and
  leading zeros (``"D:11:26"`` -> ``"D11:26"``, ``"D30:05"`` -> ``"D30:5"``); rewrites are
  listed in ``meta["evidence_repairs"]`` as ``[entry, [ids]]``, and pieces that still name no
  message go to ``meta["dropped_evidence"]``. Ids are deduplicated in order.
- A split naming samples absent from the file on disk, and every malformed file, raise
  `DataError` with one line naming the file.
- Question halves (:data:`HALF_SPLITS`, for ``evolve run`` on the sample file, whose one
  sample is in no train or valid split): ``sample:train`` / ``sample:valid`` hold every sample
  on disk with every other question of each category in ``qa`` order (the 1st, 3rd, … to
  train, the 2nd, 4th, … to valid), so the halves are disjoint and stratified by category. A
  run reads them (:func:`run_split`) only when ``locomo10.json`` is absent and says so. The
  shipped sample, conv-26, is in the full file's test split: such a run is a trial, and its
  programs have seen that test sample.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
from collections import Counter
from datetime import date
from pathlib import Path
from typing import Any

from evolve.datasets.types import (
    CAPABILITIES,
    Conversation,
    DataError,
    Message,
    Question,
    Segment,
    TaskSet,
    read_json,
    read_records,
)
from evolve.resources import split_file

DATA_FILES: tuple[str, ...] = ("locomo10.json", "locomo-sample.json")  # preference order
OFFICIAL_SAMPLES: tuple[str, ...] = (
    "conv-26", "conv-30", "conv-41", "conv-42", "conv-43",
    "conv-44", "conv-47", "conv-48", "conv-49", "conv-50",
)  # fmt: skip
SPLIT_NAMES: tuple[str, ...] = ("train", "valid", "test")
HALF_SPLITS: dict[str, int] = {"sample:train": 0, "sample:valid": 1}  # -> parity of the question
DEFAULT_SPLIT = "all"  # LoCoMo is an evaluation benchmark: `evolve eval` scores every sample
SPLIT_SIZES: dict[str, int] = {"train": 3, "valid": 2, "test": 5}
DEFAULT_SPLITS_FILE = split_file("locomo.json")
SPLITS_GENERATOR = (
    "evolve.datasets.locomo.build_splits: the 10 official sample ids in file order (conv-26 … "
    "conv-50), shuffled with random.Random(seed); first 3 = train, next 2 = valid, last 5 = "
    "test (each listed in file order). Seed 0 puts conv-26, the shipped sample, in test. "
    "Split 'all' (not listed) = every sample in the data file on disk."
)

CATEGORY_ABILITY: dict[int, str] = {
    1: "category_1_multi_hop",
    2: "category_2_temporal",
    3: "category_3_open_domain",
    4: "category_4_single_hop",
    5: "category_5_adversarial",
}
CATEGORY_CAPABILITY: dict[int, str] = {1: "M", 2: "T", 3: "F", 4: "F", 5: "A"}
ABILITY_CAPABILITY: dict[str, str] = {
    CATEGORY_ABILITY[c]: cap for c, cap in CATEGORY_CAPABILITY.items()
}
NOT_MENTIONED = "Not mentioned in the conversation"

_SESSION_KEY = re.compile(r"^session_(\d+)$")
_DATE_TEXT = re.compile(r"(\d{1,2})\s+([A-Za-z]+),?\s+(\d{4})\s*$")
_MONTHS = {
    m: i + 1
    for i, m in enumerate(
        "january february march april may june july august september october november "
        "december".split()
    )
}
_EVIDENCE_SEP = re.compile(r"[;,\s]+")
_EVIDENCE_LOOSE = re.compile(r"^D:?(\d+):0*(\d+)$")
_ABILITY = re.compile(r"^category_(\d)_")


def category_of(question: Question) -> int:
    """The LoCoMo category (1–5) of a question, read from its ability label."""
    m = _ABILITY.match(question.ability)
    if m is None or int(m.group(1)) not in CATEGORY_ABILITY:
        raise ValueError(f"{question.id}: {question.ability!r} is not a LoCoMo category label")
    return int(m.group(1))


# ---------------------------------------------------------------- files


def data_file(data_dir: Path) -> Path:
    """``locomo10.json`` when present, else ``locomo-sample.json``; DataError when neither is."""
    root = Path(data_dir) / "locomo"
    for name in DATA_FILES:
        if (root / name).is_file():
            return root / name
    raise DataError(f"no LoCoMo data in {root}: expected {' or '.join(DATA_FILES)}")


def read_samples(path: Path) -> dict[str, dict[str, Any]]:
    """sample_id -> sample, in file order, after checking the top-level shape."""
    return {sample["sample_id"]: sample for sample in read_records(path, "sample", "sample_id")}


# ---------------------------------------------------------------- conversation


def normalise_date(text: str) -> str:
    """``"1:56 pm on 8 May, 2023"`` -> ``"2023-05-08"``; unparseable text is returned unchanged."""
    m = _DATE_TEXT.search(text)
    if m:
        name = m.group(2).lower()
        month = _MONTHS.get(name) or next(
            (v for k, v in _MONTHS.items() if len(name) >= 3 and k.startswith(name)), None
        )
        if month is not None:
            try:
                return date(int(m.group(3)), month, int(m.group(1))).isoformat()
            except ValueError:
                pass
    return text


def _turn(raw: Any, where: str, path: Path) -> Message:
    if not isinstance(raw, dict):
        raise DataError(f"{path}: {where} is {type(raw).__name__}, not an object")
    for key in ("speaker", "dia_id", "text"):
        if not isinstance(raw.get(key), str):
            raise DataError(f"{path}: {where} has no string {key!r}")
    content = raw["text"]
    caption = raw.get("blip_caption")
    if isinstance(caption, str) and caption.strip():
        content += f" [image: {caption.strip()}]"
    return Message(id=raw["dia_id"], role=raw["speaker"], content=content)


def parse_conversation(sample: dict[str, Any], path: Path, file_name: str) -> Conversation:
    """The sessions of one sample (``path`` only names the file in errors)."""
    sid = sample["sample_id"]
    conv = sample.get("conversation")
    if not isinstance(conv, dict):
        raise DataError(f"{path}: {sid} has no 'conversation' object")
    for key in ("speaker_a", "speaker_b"):
        if not isinstance(conv.get(key), str):
            raise DataError(f"{path}: {sid} conversation has no string {key!r}")
    numbers = sorted(int(m.group(1)) for k in conv if (m := _SESSION_KEY.match(k)))
    if not numbers:
        raise DataError(f"{path}: {sid} conversation has no session_<n> lists")
    sessions: list[Segment] = []
    raw_dates: dict[str, str] = {}
    seen: set[str] = set()
    for n in numbers:
        turns = conv[f"session_{n}"]
        if not isinstance(turns, list):
            raise DataError(f"{path}: {sid} session_{n} is not a list of turns")
        messages = [_turn(t, f"{sid} session_{n} turn {i + 1}", path) for i, t in enumerate(turns)]
        for msg in messages:
            if msg.id in seen:
                raise DataError(f"{path}: {sid} session_{n}: duplicate dia_id {msg.id!r}")
            seen.add(msg.id)
        when = conv.get(f"session_{n}_date_time")
        if when is not None and not isinstance(when, str):
            raise DataError(f"{path}: {sid} session_{n}_date_time is not a string")
        if when is not None:
            raw_dates[str(n)] = when
        date_ = normalise_date(when) if when else None
        sessions.append(Segment(session_id=str(n), date=date_, messages=tuple(messages)))
    meta = {
        "bench": "locomo",
        "sample_id": sid,
        "data_file": file_name,
        "speakers": [conv["speaker_a"], conv["speaker_b"]],
        "session_dates": raw_dates,
    }
    return Conversation(id=f"locomo/{sid}", sessions=tuple(sessions), meta=meta)


# ---------------------------------------------------------------- questions


def evidence_ids(
    raw: list[Any], known: set[str]
) -> tuple[tuple[str, ...], list[list[Any]], list[Any]]:
    """(ids, repairs, dropped) from an ``evidence`` list; see the module invariants."""
    ids: list[str] = []
    repairs: list[list[Any]] = []
    dropped: list[Any] = []
    for entry in raw:
        if not isinstance(entry, str):
            dropped.append(entry)
            continue
        found: list[str] = []
        for piece in (p for p in _EVIDENCE_SEP.split(entry) if p):
            m = _EVIDENCE_LOOSE.match(piece)
            loose = f"D{int(m.group(1))}:{int(m.group(2))}" if m else ""
            if piece in known or loose in known:
                found.append(piece if piece in known else loose)
            else:
                dropped.append(piece)
        if found != [entry]:
            repairs.append([entry, found])
        ids.extend(found)
    return tuple(dict.fromkeys(ids)), [r for r in repairs if r[1]], dropped


def _answer_text(value: Any, where: str, path: Path) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise DataError(f"{path}: {where} has a {type(value).__name__} answer, not text")
    return str(value)


def parse_questions(sample: dict[str, Any], conv: Conversation, path: Path) -> list[Question]:
    """The ``qa`` items of one sample (``path`` only names the file in errors)."""
    sid = sample["sample_id"]
    qa = sample.get("qa")
    if not isinstance(qa, list):
        raise DataError(f"{path}: {sid} has no 'qa' list")
    known = set(conv.messages())
    questions: list[Question] = []
    for i, q in enumerate(qa):
        where = f"{sid} qa[{i}]"
        if not isinstance(q, dict):
            raise DataError(f"{path}: {where} is not an object")
        if not isinstance(q.get("question"), str):
            raise DataError(f"{path}: {where} has no string 'question'")
        category = q.get("category")
        if isinstance(category, bool) or category not in CATEGORY_ABILITY:
            raise DataError(f"{path}: {where} has category {category!r}, not an integer 1-5")
        evidence = q.get("evidence", [])
        if not isinstance(evidence, list):
            raise DataError(f"{path}: {where}: 'evidence' is not a list")
        meta: dict[str, Any] = {"category": category}
        if category == 5:
            gold = NOT_MENTIONED
            for key in ("adversarial_answer", "answer"):
                if key in q:
                    meta[key] = _answer_text(q[key], where, path)
        elif "answer" not in q:
            raise DataError(f"{path}: {where} (category {category}) has no 'answer'")
        else:
            gold = _answer_text(q["answer"], where, path)
        posed = _posed(f"locomo/{sid}/{i}", q["question"], category, meta)
        if posed != q["question"]:
            meta["posed"] = posed
        ids, repairs, dropped = evidence_ids(evidence, known)
        if repairs:
            meta["evidence_repairs"] = repairs
        if dropped:
            meta["dropped_evidence"] = dropped
        questions.append(
            Question(
                id=f"locomo/{sid}/{i}",
                conversation_id=conv.id,
                ability=CATEGORY_ABILITY[category],
                capability=CATEGORY_CAPABILITY[category],
                question=q["question"],
                gold=gold,
                evidence_ids=ids,
                question_date=None,
                meta=meta,
            )
        )
    return questions


def _posed(qid: str, question: str, category: int, meta: dict[str, Any]) -> str:
    """The question as LoCoMo's official QA run poses it to the answer model: category 2 asks
    for an approximate date; category 5 is a two-way choice between "Not mentioned in the
    conversation" and the adversarial answer, in an order fixed per question (the official
    code draws it at random)."""
    if category == 2:
        return f"{question} Use DATE of CONVERSATION to answer with an approximate date."
    trap = meta.get("adversarial_answer") or meta.get("answer")
    if category != 5 or not trap:
        return question
    options = [NOT_MENTIONED, trap]
    random.Random(qid).shuffle(options)
    return f"{question} Select the correct answer: (a) {options[0]} (b) {options[1]}."


def load_sample(sample: dict[str, Any], path: Path) -> tuple[Conversation, list[Question]]:
    """One sample (already read by :func:`read_samples`) as a conversation and its questions."""
    conv = parse_conversation(sample, path, path.name)
    return conv, parse_questions(sample, conv, path)


# ---------------------------------------------------------------- splits and task sets


def split_samples(split: str, splits_file: Path | None = None) -> list[str]:
    """The sample ids of a named split in the splits file."""
    path = Path(splits_file) if splits_file is not None else DEFAULT_SPLITS_FILE
    try:
        ids = read_json(path)["splits"][split]["samples"]
    except (KeyError, TypeError):
        raise DataError(f"{path}: no sample list for split {split!r}") from None
    if not isinstance(ids, list) or not all(isinstance(s, str) for s in ids):
        raise DataError(f"{path}: split {split!r}: 'samples' is not a list of strings")
    return ids


def load_taskset(data_dir: Path, split: str, splits_file: Path | None = None) -> TaskSet:
    """A named split (train/valid/test from the splits file), ``all`` (every sample on disk) or
    a question half (``sample:train``, ``sample:valid``; see the module docstring)."""
    if split != "all" and split not in SPLIT_NAMES and split not in HALF_SPLITS:
        valid = ", ".join([*SPLIT_NAMES, "all", *HALF_SPLITS])
        raise DataError(f"unknown LoCoMo split {split!r} (valid: {valid})")
    path = data_file(data_dir)
    samples = read_samples(path)
    named = split != "all" and split not in HALF_SPLITS
    wanted = split_samples(split, splits_file) if named else list(samples)
    missing = [s for s in wanted if s not in samples]
    if missing:
        only = (
            f"only the sample file {path.name} is present (put the full {DATA_FILES[0]} there)"
            if path.name != DATA_FILES[0]
            else "the file does not hold them"
        )
        raise DataError(
            f"split {split!r} needs LoCoMo samples missing from {path}: {', '.join(missing)}; "
            + only
        )
    conversations: list[Conversation] = []
    questions: list[Question] = []
    for sid in wanted:
        conv, qs = load_sample(samples[sid], path)
        if split in HALF_SPLITS:
            qs = _half(qs, HALF_SPLITS[split])
        conversations.append(conv)
        questions.extend(qs)
    return TaskSet("locomo", split, tuple(conversations), tuple(questions))


def _half(questions: list[Question], parity: int) -> list[Question]:
    """Every other question of each category, in order, starting with the first (parity 0)
    or the second (parity 1)."""
    seen: Counter[int] = Counter()
    kept = []
    for q in questions:
        category = category_of(q)
        if seen[category] % 2 == parity:
            kept.append(q)
        seen[category] += 1
    return kept


def run_split(data_dir: Path, role: str) -> str:
    """The split a run's ``role`` reads: its own with ``locomo10.json``; on the sample file,
    train and valid read the question halves (test stays ``test``, which needs the full file)."""
    half = f"sample:{role}"
    return half if half in HALF_SPLITS and data_file(data_dir).name != DATA_FILES[0] else role


def split_files(data_dir: Path, split: str, conversations: int | None = None) -> list[Path]:
    """The files a split is read from: the one data file, whichever samples it takes."""
    return [data_file(data_dir)]


def _counts(questions: list[Question]) -> dict[str, Any]:
    per_cap = Counter(q.capability for q in questions)
    per_cat = Counter(category_of(q) for q in questions)
    return {
        "n_questions": len(questions),
        "per_capability": {c: per_cap.get(c, 0) for c in CAPABILITIES},
        "per_category": {str(c): per_cat.get(c, 0) for c in CATEGORY_ABILITY},
    }


def build_splits(data_dir: Path, seed: int = 0) -> dict[str, Any]:
    """The splits file for ``seed`` as a JSON-ready dict; counts are computed for every sample
    in the data file on disk and for each split whose samples are all there (else None)."""
    order = list(OFFICIAL_SAMPLES)
    random.Random(seed).shuffle(order)
    parts, start = {}, 0
    for name in SPLIT_NAMES:
        chosen = set(order[start : start + SPLIT_SIZES[name]])
        parts[name] = [s for s in OFFICIAL_SAMPLES if s in chosen]
        start += SPLIT_SIZES[name]
    path = data_file(data_dir)
    samples = read_samples(path)
    loaded = {sid: load_sample(sample, path)[1] for sid, sample in samples.items()}
    splits: dict[str, Any] = {}
    for name, ids in parts.items():
        present = all(s in loaded for s in ids)
        counts = _counts([q for s in ids for q in loaded[s]]) if present else None
        splits[name] = {"samples": ids, "n_samples": len(ids), "counts": counts}
    return {
        "bench": "locomo",
        "seed": seed,
        "generator": SPLITS_GENERATOR,
        "capability_map": {CATEGORY_ABILITY[c]: cap for c, cap in CATEGORY_CAPABILITY.items()},
        "counts_note": (
            f"counts computed from {path.name}; a split's counts are null unless all its "
            f"samples are in that file (the full {DATA_FILES[0]} is needed for every split)"
        ),
        "sample_counts": {sid: _counts(qs) for sid, qs in loaded.items()},
        "splits": splits,
    }


def render_splits(splits: dict[str, Any]) -> str:
    """The splits file text: stable indentation, a trailing newline."""
    return json.dumps(splits, indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    """``python -m evolve.datasets.locomo --data-dir DIR [--seed N] [--check]``."""
    parser = argparse.ArgumentParser(description="Build or check splits/locomo.json.")
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--check", action="store_true", help="verify instead of writing")
    args = parser.parse_args(argv)
    try:
        text = render_splits(build_splits(args.data_dir, args.seed))
        if args.check:
            same = DEFAULT_SPLITS_FILE.read_text(encoding="utf-8") == text
            print("splits file matches" if same else "splits file differs", file=sys.stderr)
            return 0 if same else 1
        DEFAULT_SPLITS_FILE.write_text(text, encoding="utf-8")
    except (DataError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
