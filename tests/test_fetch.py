"""Hub release -> file layout: `convert_row` on hand-made rows in the hub's format and on a
real BEAM conversation turned into a hub row (round trip), and the offline failure modes of
`fetch_beam` (no network is needed or used)."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

import pytest

from evolve.datasets import beam, fetch
from evolve.datasets.types import DataError

TOPIC = {"id": 7, "category": "Coding", "title": "A tiny app", "theme": "t", "subtopics": ["a"]}


def _user(i: int, text: str, qtype: str = "main_question", anchor: str | None = None) -> dict:
    m: dict[str, Any] = {"role": "user", "id": i, "content": text, "question_type": qtype}
    if anchor:
        m["time_anchor"] = anchor
    return m


def _asst(i: int, text: str) -> dict:
    return {"role": "assistant", "id": i, "content": text}


def _batch(start: int, anchor: str) -> list[dict]:
    """Two turns: main question + reply + answer_ai_question + reply, then main + reply."""
    return [
        _user(start, f"q{start} ->-> 1,1", anchor=anchor),
        _asst(start + 1, "a"),
        _user(start + 2, "more", qtype="answer_ai_question"),
        _asst(start + 3, "b"),
        _user(start + 4, "next question"),
        _asst(start + 5, "c"),
    ]


QUESTIONS = {
    "information_extraction": [
        {"question": "What?", "answer": "That.", "difficulty": "easy", "question_type": "x",
         "source_chat_ids": [0], "rubric": ["LLM response should state: That"]}
    ],
    "knowledge_update": [
        {"question": "Now?", "answer": "New.", "difficulty": "hard", "update_type": "y",
         "source_chat_ids": {"original_info": [4], "updated_info": [6]}, "rubric": ["New"]}
    ],
    "abstention": [
        {"question": "Who?", "ideal_response": "Not said.", "difficulty": "easy",
         "abstention_type": "missing_detail", "rubric": ["Not said"]}
    ],
}  # fmt: skip


def _row(**over: Any) -> dict[str, Any]:
    row = {
        "conversation_id": 7,
        "conversation_seed": TOPIC,
        "narratives": "ignored",
        "chat": [_batch(0, "March-15-2024"), repr(_batch(6, "April-02-2024"))],  # 2nd stringified
        "probing_questions": repr(QUESTIONS),
    }
    row.update(over)
    return row


def test_convert_row_writes_the_loader_layout(tmp_path: Path) -> None:
    written = fetch.convert_row(_row(), "100K", tmp_path)
    conv_dir = tmp_path / "beam" / "chats" / "100K" / "7"
    assert sorted(written) == sorted(
        [conv_dir / "chat.json", conv_dir / "topic.json", conv_dir / beam.QUESTIONS_FILE]
    )
    chat = json.loads((conv_dir / "chat.json").read_text())
    assert [b["batch_number"] for b in chat] == [1, 2]
    assert [[m["id"] for m in t] for t in chat[0]["turns"]] == [[0, 1, 2, 3], [4, 5]]
    assert [b["time_anchor"] for b in chat] == [None, None]  # as in the release: on messages
    conv, _ = beam.load_conversation(tmp_path, "100K", "7")
    assert [s.date for s in conv.sessions] == ["2024-03-15", "2024-04-02"]
    assert json.loads((conv_dir / "topic.json").read_text()) == TOPIC

    conv, qs = beam.load_conversation(tmp_path, "100K", "7")
    assert conv.id == "beam/100K/7" and conv.meta["title"] == "A tiny app"
    assert [(s.session_id, s.date) for s in conv.sessions] == [
        ("1", "2024-03-15"),
        ("2", "2024-04-02"),
    ]
    assert [m.id for m in conv.sessions[1].messages] == [str(i) for i in range(6, 12)]
    assert conv.sessions[0].messages[0].content == "q0 ->-> 1,1"
    by_ability = {q.ability: q for q in qs}
    assert by_ability["knowledge_update"].evidence_ids == ("4", "6")
    abstention = by_ability["abstention"]
    assert abstention.gold == "Not said." and abstention.capability == "A"
    assert beam.list_conversations(tmp_path, "100K") == ["7"]


def hub_row(conv_dir: Path) -> dict[str, Any]:
    """A conversation of the release in the hub's row format: each batch a flat message list
    (every other one stringified, as the hub holds some), questions as a Python literal."""
    chat = json.loads((conv_dir / "chat.json").read_text())
    flat = [[m for turn in batch["turns"] for m in turn] for batch in chat]
    return {
        "conversation_id": conv_dir.name,
        "conversation_seed": json.loads((conv_dir / beam.TOPIC_FILE).read_text()),
        "chat": [repr(b) if i % 2 else b for i, b in enumerate(flat)],
        "probing_questions": repr(json.loads((conv_dir / beam.QUESTIONS_FILE).read_text())),
    }


def test_a_real_conversation_round_trips_through_the_hub_format(
    data_dir: Path, tmp_path: Path
) -> None:
    """BEAM-100K conversation 1 -> hub row -> files: the chat is byte-for-byte the release's,
    topic and questions are the same JSON (the release's own whitespace is hand-made), and the
    loader reads the same conversation and questions from both."""
    conv_dir = data_dir / "beam" / "chats" / "100K" / "1"
    fetch.convert_row(hub_row(conv_dir), "100K", tmp_path)
    out = tmp_path / "beam" / "chats" / "100K" / "1"
    assert (out / "chat.json").read_bytes() == (conv_dir / "chat.json").read_bytes()
    for name in (beam.TOPIC_FILE, beam.QUESTIONS_FILE):
        assert json.loads((out / name).read_text()) == json.loads((conv_dir / name).read_text())
    assert beam.load_conversation(tmp_path, "100K", "1") == beam.load_conversation(
        data_dir, "100K", "1"
    )


def test_convert_row_accepts_a_stringified_chat(tmp_path: Path) -> None:
    fetch.convert_row(_row(chat=repr([_batch(0, "May-1-2024")])), "1M", tmp_path)
    conv, _ = beam.load_conversation(tmp_path, "1M", "7")
    assert conv.sessions[0].date == "2024-05-01"


def test_convert_row_10m_plans(tmp_path: Path) -> None:
    plan1 = [_batch(0, "March-01-2024"), _batch(6, "March-09-2024")]
    plan2 = [repr(_batch(0, "June-01-2024"))]  # ids restart at 0 in each plan
    chat = [
        {"plan-1": plan1, "plan-2": None},
        {"plan-1": None, "plan-2": plan2},
    ]
    fetch.convert_row(_row(chat=chat, plans=["p1", "p2"]), "10M", tmp_path)
    raw = json.loads((tmp_path / "beam/chats/10M/7/chat.json").read_text())
    assert [list(entry) for entry in raw] == [["plan-1"], ["plan-2"]]
    conv, qs = beam.load_conversation(tmp_path, "10M", "7")
    assert [s.session_id for s in conv.sessions] == ["plan-1/1", "plan-1/2", "plan-2/1"]
    assert [s.date for s in conv.sessions] == ["2024-03-01", "2024-03-09", "2024-06-01"]
    assert [m.id for m in conv.sessions[2].messages] == [str(i) for i in range(12, 18)]
    assert "renumbered_ids" not in conv.meta and len(qs) == 3


def test_malicious_literal_is_rejected(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    evil = f"__import__('os').system('touch {marker}')"
    with pytest.raises(DataError, match="probing_questions: not a plain Python literal"):
        fetch.convert_row(_row(probing_questions=evil), "100K", tmp_path)
    with pytest.raises(DataError, match="chat: not a plain Python literal"):
        fetch.convert_row(_row(chat=evil), "100K", tmp_path)
    assert not marker.exists()
    assert not (tmp_path / "beam").exists()  # nothing written for a rejected row


@pytest.mark.parametrize(
    ("over", "message"),
    [
        ({"conversation_id": "../x"}, "unusable conversation_id"),
        ({"chat": None}, "missing column 'chat'"),
        ({"probing_questions": repr({"telepathy": []})}, "unknown ability 'telepathy'"),
        ({"chat": [[{"role": "user", "content": "no id"}]]}, "has no 'id'"),
        ({"conversation_seed": "[1, 2]"}, "conversation_seed is not an object"),
    ],
)
def test_convert_row_rejects_bad_rows(tmp_path: Path, over: dict, message: str) -> None:
    with pytest.raises(DataError, match=message):
        fetch.convert_row(_row(**over), "100K", tmp_path)


def test_write_checksums(tmp_path: Path) -> None:
    files = fetch.convert_row(_row(), "100K", tmp_path)
    size_dir = tmp_path / "beam" / "chats" / "100K"
    out = fetch.write_checksums(size_dir, files)
    lines = out.read_text().splitlines()
    assert len(lines) == 3
    for line in lines:
        digest, rel = line.split("  ")
        assert hashlib.sha256((size_dir / rel).read_bytes()).hexdigest() == digest
    assert beam.list_conversations(tmp_path, "100K") == ["7"]  # checksum file is not a conv


@pytest.mark.parametrize(
    ("path", "split", "ok"),
    [
        ("data/100K-00000-of-00001.parquet", "100K", True),
        ("data/10M-00000-of-00001.parquet", "1M", False),
        ("default/1M/0000.parquet", "1M", True),
        ("1M.parquet", "1M", True),
        ("data/1M-00000.json", "1M", False),
    ],
)
def test_split_file_matching(path: str, split: str, ok: bool) -> None:
    assert fetch._is_split_file(path, split) is ok


def test_read_parquet_then_convert(tmp_path: Path) -> None:
    """A parquet file with the hub's columns reads back into rows that convert and load."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    row = _row(chat=repr(_row()["chat"]))  # the hub stores nested columns as literals
    pq.write_table(pa.Table.from_pylist([row]), tmp_path / "100K-00000.parquet")
    rows = fetch.read_parquet(tmp_path / "100K-00000.parquet")
    assert rows[0]["conversation_id"] == 7 and rows[0]["conversation_seed"] == TOPIC
    fetch.convert_row(rows[0], "100K", tmp_path / "data")
    conv, questions = beam.load_conversation(tmp_path / "data", "100K", "7")
    assert len(conv.sessions) == 2 and questions


def test_fetch_unreachable_hub_fails_fast(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for var in fetch._PROXY_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(fetch, "read_parquet", lambda path: [])
    start = time.monotonic()
    with pytest.raises(DataError) as err:
        fetch.fetch_beam(tmp_path, ["100K"], progress=False, endpoint="http://127.0.0.1:9")
    assert time.monotonic() - start < 5
    msg = str(err.value)
    assert msg.startswith("cannot reach the Hugging Face hub (127.0.0.1:9")
    assert f"place it under {tmp_path}/beam/chats/<size>/<n>/ (chat.json, " in msg
    assert "\n" not in msg
    with pytest.raises(DataError, match="unknown BEAM size"):
        fetch.fetch_beam(tmp_path, ["2M"], progress=False)


def test_fetch_with_a_fake_hub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The whole flow with the hub client, download and parquet reader replaced by fakes."""
    import huggingface_hub

    class FakeApi:
        def __init__(self, endpoint: str | None = None) -> None:
            pass

        def list_repo_files(self, repo: str, repo_type: str, revision: str | None) -> list[str]:
            assert repo == "Mohammadta/BEAM" and repo_type == "dataset"
            return ["README.md", "data/100K-00000-of-00001.parquet", "data/1M-0.parquet"]

    def fake_download(repo: str, name: str, **kw: Any) -> str:
        return str(tmp_path / "cache" / name)

    rows = {"100K-00000-of-00001.parquet": [_row(), _row(conversation_id="8")]}
    monkeypatch.setattr(fetch, "_probe", lambda *a: None)
    monkeypatch.setattr(fetch, "read_parquet", lambda path: rows[path.name])
    monkeypatch.setattr(huggingface_hub, "HfApi", FakeApi)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download)
    out = tmp_path / "data"
    assert fetch.fetch_beam(out, ["100K"], progress=False) == {"100K": 2}
    assert beam.list_conversations(out, "100K") == ["7", "8"]
    sums = (out / "beam/chats/100K" / fetch.CHECKSUMS_FILE).read_text().splitlines()
    assert len(sums) == 6 and sums[0].endswith("  7/chat.json")
