"""BEAM loader: counts against docs/benchmarks.md §2.4, format details, and error paths."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest

from evolve.datasets import beam
from evolve.datasets.types import CAPABILITIES, Conversation, DataError, Question

TRUNCATED_100K = {"5", "7", "10", "11", "12", "16", "17", "18", "19", "20"}
AVAILABLE_1M = ["3", "4", "5", "6", "7", "8", "9", "10", "15", "17", "24", "31", "32"]
ISO = re.compile(r"^\d{4}-\d{2}-\d{2}$")


def _check_conversation(conv: Conversation, questions: list[Question]) -> None:
    ids = [m.id for s in conv.sessions for m in s.messages]
    assert len(ids) == len(set(ids)), "message ids must be unique"
    messages = conv.messages()
    for s in conv.sessions:
        assert s.date is not None and ISO.match(s.date), (conv.id, s.session_id, s.date)
    for q in questions:
        assert q.conversation_id == conv.id
        assert q.capability == beam.ABILITY_CAPABILITY[q.ability]
        assert isinstance(q.gold, str) and q.gold
        assert q.rubric and all(isinstance(r, str) for r in q.rubric)
        assert len(set(q.evidence_ids)) == len(q.evidence_ids)
        missing = [e for e in q.evidence_ids if e not in messages]
        assert not missing, (q.id, missing)


@pytest.fixture(scope="module")
def beam_100k(data_dir: Path) -> list[tuple[Conversation, list[Question]]]:
    return [
        beam.load_conversation(data_dir, "100K", c)
        for c in beam.list_conversations(data_dir, "100K")
    ]


def _copy_conversation(data_dir: Path, size: str, conv: str, root: Path) -> Path:
    """A writable copy of one small conversation under ``root/beam/chats/<size>/<conv>``."""
    src = data_dir / "beam" / "chats" / size / conv
    dst = root / "beam" / "chats" / size / conv
    for rel in ("chat.json", "topic.json", "probing_questions/probing_questions.json"):
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        (dst / rel).write_bytes((src / rel).read_bytes())
    return dst


# ---------------------------------------------------------------- tables and helpers


def test_ability_tables_cover_all_capabilities() -> None:
    assert set(beam.ABILITY_CAPABILITY) == set(beam.GOLD_FIELD) == set(beam.SUBTYPE_FIELD)
    assert len(beam.ABILITY_CAPABILITY) == 10
    assert set(beam.ABILITY_CAPABILITY.values()) == set(CAPABILITIES)
    assert beam.SIZES == ("100K", "500K", "1M", "10M")


@pytest.mark.parametrize(
    ("raw", "iso"),
    [
        ("March-15-2024", "2024-03-15"),
        ("September-1-2024", "2024-09-01"),
        ("Sept-03-2024", "2024-09-03"),
        ("February-30-2024", "February-30-2024"),
        ("sometime next spring", "sometime next spring"),
    ],
)
def test_normalise_date(raw: str, iso: str) -> None:
    assert beam.normalise_date(raw) == iso


def test_evidence_ids_forms() -> None:
    assert beam.evidence_ids(None) == ((), [])
    assert beam.evidence_ids([28, 29, 28]) == (("28", "29"), [])
    assert beam.evidence_ids({"first_statement": [58], "second_statement": [24, 58]}) == (
        ("58", "24"),
        [],
    )
    assert beam.evidence_ids([[70, 72], [174], 70]) == (("70", "72", "174"), [])
    assert beam.evidence_ids(["12", "--", 3]) == (("12", "3"), ["--"])


# ---------------------------------------------------------------- real data


def test_100k_counts_and_integrity(beam_100k: list[tuple[Conversation, list[Question]]]) -> None:
    assert [c.id for c, _ in beam_100k] == [f"beam/100K/{n}" for n in range(1, 21)]
    questions = [q for _, qs in beam_100k for q in qs]
    assert len(questions) == 400
    assert set(Counter(q.ability for q in questions).values()) == {40}
    per_cap = Counter(q.capability for q in questions)
    assert per_cap == {"F": 40, "T": 120, "P": 80, "M": 80, "A": 80}
    assert len({q.id for q in questions}) == 400
    sizes = [sum(len(s.messages) for s in c.sessions) for c, _ in beam_100k]
    assert min(sizes) == 188 and max(sizes) == 310
    assert round(sum(sizes) / len(sizes)) == 255
    for conv, qs in beam_100k:
        n = conv.meta["conv"]
        expected = "chat_trunecated.json" if n in TRUNCATED_100K else "chat.json"
        assert conv.meta["chat_file"] == expected
        assert conv.meta["title"] and conv.meta["category"]
        assert [s.session_id for s in conv.sessions] == [
            str(i + 1) for i in range(len(conv.sessions))
        ]
        _check_conversation(conv, qs)


def test_100k_message_and_question_details(
    beam_100k: list[tuple[Conversation, list[Question]]],
) -> None:
    conv, qs = beam_100k[0]
    first = conv.sessions[0]
    assert first.date == "2024-03-15"
    assert first.messages[0].id == "0" and first.messages[0].role == "user"
    assert first.messages[0].content.endswith("->-> 1,1")  # markers kept verbatim
    by_id = {q.id: q for q in qs}
    ie = by_id["beam/100K/1/information_extraction/0"]
    assert ie.gold == "My first sprint ends on March 29."
    assert ie.evidence_ids == ("28",)
    assert ie.meta["difficulty"] == "easy" and ie.meta["subtype"] == "context_date/time"
    assert "conversation_reference" in ie.meta and ie.question_date is None
    cr = by_id["beam/100K/1/contradiction_resolution/0"]
    assert cr.evidence_ids == ("58", "24")
    assert cr.meta["source_chat_ids"] == {"first_statement": [58], "second_statement": [24]}
    ab = by_id["beam/100K/1/abstention/0"]
    assert ab.evidence_ids == () and ab.gold.startswith("Based on the provided chat")
    json.dumps([q.meta for q in qs])  # plain JSON


def test_1m_available_conversations(data_dir: Path) -> None:
    assert beam.list_conversations(data_dir, "1M") == AVAILABLE_1M
    ts = beam.load_taskset(data_dir, "all:1M")
    assert ts.split == "all:1M" and len(ts.conversations) == 13 and len(ts.questions) == 260
    by_conv = ts.by_conversation()
    for conv in ts.conversations:
        n = conv.meta["conv"]
        expected = "chat_trunecated.json" if n in {"6", "24"} else "chat.json"
        assert conv.meta["chat_file"] == expected
        assert 1556 <= sum(len(s.messages) for s in conv.sessions) <= 2088
        _check_conversation(conv, by_conv[conv.id])
    # upstream 1M/5 restarts its ids at 0 in batch 10: renumbered past the largest id
    five = next(c for c in ts.conversations if c.id == "beam/1M/5")
    renumbered = five.meta["renumbered_ids"]
    assert len(renumbered) == 150 and renumbered[0] == ["10", "0", "1600"]
    assert five.sessions[-1].messages[0].id == "1600"


def test_10m_has_questions_only(data_dir: Path) -> None:
    assert beam.list_conversations(data_dir, "10M") == []
    assert beam.list_question_sets(data_dir, "10M") == [str(i) for i in range(1, 11)]
    qs = beam.load_questions(data_dir, "10M", "1")
    assert len(qs) == 20 and qs[0].id.startswith("beam/10M/1/")
    with pytest.raises(DataError, match="no chat.json or chat_trunecated.json"):
        beam.load_conversation(data_dir, "10M", "1")


def test_all_split_is_every_100k_conversation(data_dir: Path) -> None:
    ts = beam.load_taskset(data_dir, "all")
    assert ts.bench == "beam" and len(ts.conversations) == 20 and len(ts.questions) == 400


# ---------------------------------------------------------------- synthetic layouts


def _write_chat(root: Path, conv: str, chat: object) -> None:
    d = root / "beam" / "chats" / "10M" / conv
    (d / "probing_questions").mkdir(parents=True)
    (d / "chat.json").write_text(json.dumps(chat))
    (d / "topic.json").write_text(json.dumps({"title": "t", "category": "c"}))
    (d / "probing_questions" / "probing_questions.json").write_text("{}")


def _msg(i: int, role: str = "user", anchor: str | None = None) -> dict[str, object]:
    m: dict[str, object] = {"role": role, "id": i, "content": f"m{i}"}
    if anchor:
        m["time_anchor"] = anchor
    return m


def test_10m_plan_layout_and_duplicate_ids(tmp_path: Path) -> None:
    batch = {"batch_number": 1, "time_anchor": None}
    chat = [
        {"plan-1": [{**batch, "turns": [[_msg(0, anchor="May-02-2024"), _msg(1, "assistant")]]}]},
        {"plan-1": None, "plan-2": [{**batch, "turns": [[_msg(2, anchor="Q3"), _msg(0)]]}]},
    ]
    _write_chat(tmp_path, "1", chat)
    conv, qs = beam.load_conversation(tmp_path, "10M", "1")
    assert qs == []
    assert [s.session_id for s in conv.sessions] == ["plan-1/1", "plan-2/1"]
    assert [s.date for s in conv.sessions] == ["2024-05-02", "Q3"]
    assert [m.id for m in conv.sessions[1].messages] == ["2", "3"]
    assert conv.meta["renumbered_ids"] == [["plan-2/1", "0", "3"]]


# ---------------------------------------------------------------- error paths


def test_missing_data_dir_says_where_files_go(tmp_path: Path) -> None:
    with pytest.raises(DataError) as err:
        beam.list_conversations(tmp_path, "100K")
    msg = str(err.value)
    assert "\n" not in msg
    assert f"{tmp_path}/beam/chats/100K/<n>/chat.json" in msg
    assert "evolve data fetch beam" in msg
    with pytest.raises(DataError, match="evolve data fetch beam"):
        beam.load_conversation(tmp_path, "100K", "1")
    with pytest.raises(DataError, match="unknown BEAM size"):
        beam.list_conversations(tmp_path, "2M")
    (tmp_path / "beam" / "chats" / "500K").mkdir(parents=True)
    assert beam.list_conversations(tmp_path, "500K") == []
    with pytest.raises(DataError, match="no BEAM-500K conversation with a chat file"):
        beam.load_taskset(tmp_path, "all:500K")


def test_malformed_json_names_file_and_position(data_dir: Path, tmp_path: Path) -> None:
    conv = _copy_conversation(data_dir, "100K", "1", tmp_path)
    (conv / "chat.json").write_text('[\n  {"batch_number": 1,\n   "turns": [}\n]')
    with pytest.raises(DataError) as err:
        beam.load_conversation(tmp_path, "100K", "1")
    msg = str(err.value)
    assert msg == f"{conv / 'chat.json'}: not valid JSON (line 3 column 14)"


def test_structural_errors(data_dir: Path, tmp_path: Path) -> None:
    conv = _copy_conversation(data_dir, "100K", "1", tmp_path)
    chat = json.loads((conv / "chat.json").read_text())
    del chat[1]["turns"][2][1]["content"]
    (conv / "chat.json").write_text(json.dumps(chat))
    with pytest.raises(DataError, match=r"chat.json: batch 2 turn 3 message 2 has no 'content'"):
        beam.load_conversation(tmp_path, "100K", "1")
    (conv / "chat.json").write_text(json.dumps({"not": "a list"}))
    with pytest.raises(DataError, match="expected a list of batches"):
        beam.load_conversation(tmp_path, "100K", "1")


def test_missing_topic_and_questions(data_dir: Path, tmp_path: Path) -> None:
    conv = _copy_conversation(data_dir, "100K", "1", tmp_path)
    (conv / "topic.json").unlink()
    with pytest.raises(DataError, match=r"topic.json: file not found"):
        beam.load_conversation(tmp_path, "100K", "1")


def test_unknown_ability(data_dir: Path, tmp_path: Path) -> None:
    conv = _copy_conversation(data_dir, "100K", "1", tmp_path)
    qfile = conv / "probing_questions" / "probing_questions.json"
    data = json.loads(qfile.read_text())
    data["telepathy"] = data["abstention"]
    qfile.write_text(json.dumps(data))
    with pytest.raises(DataError, match=r"probing_questions.json: unknown ability 'telepathy'"):
        beam.load_conversation(tmp_path, "100K", "1")


def test_missing_gold_field(data_dir: Path, tmp_path: Path) -> None:
    conv = _copy_conversation(data_dir, "100K", "1", tmp_path)
    qfile = conv / "probing_questions" / "probing_questions.json"
    data = json.loads(qfile.read_text())
    del data["summarization"][1]["ideal_summary"]
    qfile.write_text(json.dumps(data))
    with pytest.raises(DataError, match=r"summarization\[1\] has no string 'ideal_summary'"):
        beam.load_conversation(tmp_path, "100K", "1")


def test_unknown_split_lists_valid_names(data_dir: Path) -> None:
    with pytest.raises(DataError) as err:
        beam.load_taskset(data_dir, "training")
    msg = str(err.value)
    for name in ("train", "valid", "holdout", "test", "all", "all:1M"):
        assert name in msg
    with pytest.raises(DataError, match="unknown BEAM size"):
        beam.load_taskset(data_dir, "all:3M")


def test_split_conversation_missing_on_disk(data_dir: Path, tmp_path: Path) -> None:
    _copy_conversation(data_dir, "100K", "1", tmp_path)
    splits = tmp_path / "beam.json"
    refs = [{"size": "100K", "conv": "1"}, {"size": "100K", "conv": "99"}]
    splits.write_text(json.dumps({"splits": {"train": {"conversations": refs}}}))
    with pytest.raises(DataError, match=r"split 'train' names beam/100K/99"):
        beam.load_taskset(tmp_path, "train", splits)
    with pytest.raises(DataError, match="no conversation list for split 'valid'"):
        beam.load_taskset(tmp_path, "valid", splits)
    with pytest.raises(DataError, match="file not found"):
        beam.load_taskset(tmp_path, "train", tmp_path / "nope.json")
