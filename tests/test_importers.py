"""The importers (:mod:`evolve.importers`) and ``evolve data import``: the ChatGPT export's kept
branch only, what each importer skips (counted), Claude and OpenAI-style logs, the runtime's
store read while a runtime holds it open and appends, and hostile inputs (one ``error:`` line
each, exit 2, nothing written)."""

from __future__ import annotations

import argparse
import json
import threading
import zipfile
from pathlib import Path
from typing import Any

import pytest

import evolve
from contract.types import Message, Segment
from evolve.cli.dataimport import add_command, cmd_import
from evolve.datasets.userformat import Invalid, read_dataset
from evolve.importers import KINDS, Imported
from evolve.runtime.log import MAGIC, SessionLog, encode, scan
from evolve.runtime.store import scope_key

ROOT = Path(__file__).resolve().parents[1]
MARCH_15 = 1710496920.0  # 2024-03-15T10:02:00Z
MARCH_1 = 1709283600.0  # 2024-03-01T09:00:00Z


# ------------------------------------------------------------------------------- ChatGPT


def node(nid: str, parent: str | None, children: list[str], message: Any) -> dict[str, Any]:
    return {"id": nid, "message": message, "parent": parent, "children": children}


def msg(role: str, text: Any, *, ctype: str = "text", hidden: bool = False,
        recipient: str = "all") -> dict[str, Any]:  # fmt: skip
    parts = text if isinstance(text, list) else [text]
    return {"author": {"role": role}, "content": {"content_type": ctype, "parts": parts},
            "metadata": {"is_visually_hidden_from_conversation": hidden} if hidden else {},
            "recipient": recipient}  # fmt: skip


def tree_chat() -> dict[str, Any]:
    """A chat whose user edited a message (u2_old -> u2) and regenerated a reply (a2_old ->
    a2); the kept branch then runs through a tool call, a tool reply, an image with a question,
    code and a hidden message to the current node a3."""
    nodes = [
        node("root", None, ["sys"], None),
        node("sys", "root", ["u1"], msg("system", "", hidden=True)),
        node("u1", "sys", ["a1"], msg("user", "I live in Paris")),
        node("a1", "u1", ["u2_old", "u2"], msg("assistant", "Nice!")),
        node("u2_old", "a1", ["a2_older"], msg("user", "My dog is called Rex")),
        node("a2_older", "u2_old", [], msg("assistant", "Rex is a fine name")),
        node("u2", "a1", ["a2_old", "a2"], msg("user", "My dog is called Max")),
        node("a2_old", "u2", [], msg("assistant", "Max, noted")),
        node("a2", "u2", ["call"], msg("assistant", "Max is a great name")),
        node("call", "a2", ["tool"], msg("assistant", "dog: Max", recipient="bio")),
        node("tool", "call", ["img"], msg("tool", "Model set context updated.")),
        node(
            "img",
            "tool",
            ["code"],
            msg("user", [{"asset_pointer": "file-1"}, "What is this?"], ctype="multimodal_text"),
        ),  # fmt: skip
        node("code", "img", ["hid"], msg("assistant", "print(1)", ctype="code")),
        node("hid", "code", ["a3"], msg("assistant", "thinking", hidden=True)),
        node("a3", "hid", [], msg("assistant", "It is a cat.")),
    ]
    mapping = {n["id"]: n for n in nodes}
    return {"id": "chat-b", "title": "dogs", "create_time": MARCH_15, "mapping": mapping,
            "current_node": "a3"}  # fmt: skip


def small_chat(cid: str, created: float | None, text: str) -> dict[str, Any]:
    mapping = {"r": node("r", None, ["m"], None), "m": node("m", "r", [], msg("user", text))}
    return {"id": cid, "create_time": created, "mapping": mapping, "current_node": "m"}


def hidden_chat() -> dict[str, Any]:
    mapping = {"h": node("h", None, [], msg("user", "custom instructions", hidden=True))}
    return {"id": "chat-h", "create_time": MARCH_1, "mapping": mapping, "current_node": "h"}


def write_json(path: Path, data: Any) -> Path:
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def contents(imported: Imported) -> list[list[tuple[str, str, str]]]:
    """Each session's messages as (id, role, content), every conversation in order."""
    return [[(m.id, m.role, m.content) for m in s.messages]
            for c in imported.dataset.conversations for s in c.sessions]  # fmt: skip


def test_chatgpt_keeps_only_the_branch_the_user_kept(tmp_path: Path):
    export = write_json(
        tmp_path / "conversations.json",
        [tree_chat(), small_chat("chat-a", MARCH_1, "hello"), hidden_chat()],
    )
    got = KINDS["chatgpt"](export, "me")
    (conv,) = got.dataset.conversations
    assert conv.id == "me" and got.dataset.source == "import:chatgpt"
    assert [(s.session_id, s.date) for s in conv.sessions] == [
        ("chat-a", "2024-03-01T09:00:00Z"), ("chat-b", "2024-03-15T10:02:00Z")]  # fmt: skip
    assert contents(got)[1] == [
        ("u1", "user", "I live in Paris"),
        ("a1", "assistant", "Nice!"),
        ("u2", "user", "My dog is called Max"),
        ("a2", "assistant", "Max is a great name"),
        ("img", "user", "What is this?"),
        ("a3", "assistant", "It is a cat."),
    ]
    assert got.kept == {"conversations": 1, "sessions": 2, "messages": 7}
    assert got.skipped == {
        "messages on abandoned branches": 3, "nodes with no message": 2, "hidden messages": 3,
        "messages addressed to a tool": 1, "tool messages": 1, "non-text messages": 1,
        "non-text parts": 1, "chats with no message kept": 1,
    }  # fmt: skip


def test_chatgpt_per_chat_and_the_export_zip(tmp_path: Path):
    data = json.dumps([tree_chat(), small_chat("chat-a", None, "undated")])
    with zipfile.ZipFile(tmp_path / "export.zip", "w") as archive:
        archive.writestr("chat.html", "<html></html>")
        archive.writestr("conversations.json", data)
    got = KINDS["chatgpt"](tmp_path / "export.zip", "me", per_chat=True)
    assert [c.id for c in got.dataset.conversations] == ["chat-b", "chat-a"]  # undated last
    assert got.dataset.conversations[1].sessions[0].date is None
    assert got.kept == {"conversations": 2, "sessions": 2, "messages": 7}


# -------------------------------------------------------------------------------- Claude


def claude_message(uid: str, sender: str, text: str, parent: str | None = None,
                   **extra: Any) -> dict[str, Any]:  # fmt: skip
    m = {"uuid": uid, "sender": sender, "text": text, "created_at": "2024-05-01T08:00:00Z",
         "content": [{"type": "text", "text": text}], **extra}  # fmt: skip
    if parent is not None:
        m["parent_message_uuid"] = parent
    return m


def test_claude_maps_senders_skips_non_text_and_follows_the_kept_branch(tmp_path: Path):
    root = "00000000-0000-4000-8000-000000000000"
    flat = {"uuid": "c1", "name": "flat", "created_at": "2024-05-01T08:00:00.123456+02:00",
            "chat_messages": [
                claude_message("h1", "human", "I am vegetarian",
                               attachments=[{"file_name": "a.txt", "extracted_content": "x"}]),
                {**claude_message("x1", "assistant", ""), "content": [
                    {"type": "thinking", "thinking": "hm"}, {"type": "text", "text": "Noted"},
                    {"type": "tool_use", "name": "search", "input": {}}]},
                claude_message("e1", "assistant", "   "),
            ]}  # fmt: skip
    branched = {"uuid": "c2", "name": "edit", "created_at": "2024-06-01T10:00:00Z",
                "chat_messages": [
                    claude_message("q_old", "human", "Book Rome", root),
                    claude_message("r_old", "assistant", "Rome booked", "q_old"),
                    claude_message("q", "human", "Book Lisbon", root),
                    claude_message("r", "assistant", "Lisbon booked", "q"),
                ]}  # fmt: skip
    got = KINDS["claude"](write_json(tmp_path / "c.json", [branched, flat]), "me")
    assert [s.session_id for s in got.dataset.conversations[0].sessions] == ["c1", "c2"]
    assert got.dataset.conversations[0].sessions[0].date == "2024-05-01T06:00:00Z"
    assert contents(got) == [
        [("h1", "user", "I am vegetarian"), ("x1", "assistant", "Noted")],
        [("q", "user", "Book Lisbon"), ("r", "assistant", "Lisbon booked")],
    ]
    assert got.skipped == {"attachments and files": 1, "non-text content blocks": 2,
                           "empty messages": 1, "messages on abandoned branches": 2}  # fmt: skip


# -------------------------------------------------------------------------------- OpenAI


def jsonl(path: Path, *records: Any) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n"
                            for r in records), encoding="utf-8")  # fmt: skip
    return path


def test_openai_lines_are_sessions_and_system_tool_and_non_text_are_skipped(tmp_path: Path):
    log = jsonl(
        tmp_path / "chats.jsonl",
        {"messages": [{"role": "system", "content": "Be brief."},
                      {"role": "user", "content": "I moved to Lyon"},
                      {"role": "assistant", "content": None, "tool_calls": [{"id": "t"}]},
                      {"role": "tool", "content": "ok"},
                      {"role": "assistant", "content": "Noted, Lyon."}]},
        "",
        {"id": 7, "date": "2024-05-02", "messages": [
            {"role": "user", "content": [{"type": "text", "text": "What is this?"},
                                         {"type": "image_url", "image_url": {"url": "x"}}]}]},
        {"id": "w", "conversation": "work", "messages": [{"role": "user", "content": "standup"}]},
    )  # fmt: skip
    got = KINDS["openai"](log, "me")
    assert [(c.id, [s.session_id for s in c.sessions]) for c in got.dataset.conversations] == [
        ("me", ["line-1", "7"]), ("work", ["w"])]  # fmt: skip
    assert contents(got) == [
        [("line-1.1", "user", "I moved to Lyon"), ("line-1.4", "assistant", "Noted, Lyon.")],
        [("7.0", "user", "What is this?")],
        [("w.0", "user", "standup")],
    ]
    assert got.dataset.conversations[0].sessions[1].date == "2024-05-02"
    assert got.skipped == {"system messages": 1, "tool calls": 1, "tool messages": 1,
                           "non-text parts": 1}  # fmt: skip


# ------------------------------------------------------------------------------ the store


def test_the_store_is_read_while_a_runtime_holds_it_open_and_appends(tmp_path: Path):
    """Every session acknowledged before an import is in it, in log order, each user a
    conversation named by their scope folder; imports taken while another thread adds see a
    prefix of the log; the store is left as it was and the runtime goes on working."""
    store = tmp_path / "store"
    with evolve.open_memory(ROOT / "seeds" / "simple.py", store, embedder="hashing",
                            notice=lambda _: None) as memory:  # fmt: skip
        memory.add([{"content": "I live in Paris"}, {"role": "assistant", "content": "ok"}],
                   user="ana", date="2024-05-01", session_id="a1")  # fmt: skip
        memory.add([{"content": "Bob likes tea"}], user="bob", session_id="b1")
        lock = (store / "lock").read_bytes()
        seen: list[list[str]] = []
        adding = threading.Thread(target=lambda: [
            memory.add([{"content": f"note {k}"}], user="ana", session_id=f"a{k}")
            for k in range(2, 8)])  # fmt: skip
        adding.start()
        while adding.is_alive() or not seen:
            got = KINDS["store"](store, "users")
            by_id = {c.id: c for c in got.dataset.conversations}
            seen.append([s.session_id for s in by_id[scope_key("ana")].sessions])
        adding.join()
        final = [f"a{k}" for k in range(1, 8)]
        assert all(ids == final[: len(ids)] and ids for ids in seen)
        got = KINDS["store"](store, "users")
        ana, bob = (next(c for c in got.dataset.conversations if c.id == scope_key(u))
                    for u in ("ana", "bob"))  # fmt: skip
        assert [s.session_id for s in ana.sessions] == final
        assert ana.sessions[0] == Segment(
            "a1",
            "2024-05-01",
            (Message("a1.0", "user", "I live in Paris"), Message("a1.1", "assistant", "ok")),
        )
        assert [m.content for s in bob.sessions for m in s.messages] == ["Bob likes tea"]
        assert any("not recoverable" in n for n in got.notes)
        assert (store / "lock").read_bytes() == lock
        assert memory.add([{"content": "after the import"}], user="ana", session_id="a9")
        assert "after the import" in memory.context("import", user="ana")
    assert [s.session_id for s in SessionLog.open(store / "scopes" / scope_key("ana") / "log")[0]
            .sessions][-1] == "a9"  # fmt: skip


def seg(i: int) -> Segment:
    return Segment(f"s{i}", None, (Message(f"s{i}.0", "user", f"hello {i}"),))


def test_scan_skips_a_damaged_record_and_leaves_a_record_being_written(tmp_path: Path):
    """A damaged record among whole ones is skipped with its byte offset; bytes of a record
    still being written are not read; the file is not changed and a missing one not made."""
    path = tmp_path / "log"
    log, _ = SessionLog.open(path)
    for i in range(3):
        log.append(seg(i))
    data = bytearray(path.read_bytes())
    damaged_at = len(MAGIC) + len(encode(seg(0)))
    data[damaged_at + 40] ^= 0xFF  # inside the second record's payload
    data += encode(seg(3))[:-5]  # a record being written
    path.write_bytes(bytes(data))
    read = scan(path)
    assert [s.session_id for s in read.sessions] == ["s0", "s2"]
    assert read.damaged == [(damaged_at, "checksum")]
    assert read.unread == len(encode(seg(3))) - 5
    assert path.read_bytes() == bytes(data)
    with pytest.raises(FileNotFoundError):
        scan(tmp_path / "absent")
    assert not (tmp_path / "absent").exists()


def test_the_store_importer_reports_damage_and_keeps_the_rest(tmp_path: Path):
    folder = tmp_path / "store" / "scopes" / scope_key("ana")
    folder.mkdir(parents=True)
    log, _ = SessionLog.open(folder / "log")
    for i in range(3):
        log.append(seg(i))
    data = bytearray((folder / "log").read_bytes())
    data[len(MAGIC) + 40] ^= 0xFF
    (folder / "log").write_bytes(bytes(data))
    (tmp_path / "store" / "scopes" / "empty").mkdir()
    got = KINDS["store"](tmp_path / "store", "users")
    assert [s.session_id for c in got.dataset.conversations for s in c.sessions] == ["s1", "s2"]
    assert got.skipped == {"damaged records": 1, "scopes with no session": 1}
    assert any(f"byte {len(MAGIC)}" in n for n in got.notes)


# ------------------------------------------------------------------------ the command line


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_command(parser.add_subparsers(dest="data_command"))
    return parser.parse_args(["import", *argv])


def test_the_command_writes_the_folder_and_says_what_it_kept_and_skipped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    export = write_json(tmp_path / "conversations.json", [tree_chat()])
    out = tmp_path / "mine"
    assert cmd_import(parse("chatgpt", str(export), "--out", str(out))) == 0
    said = capsys.readouterr().out
    assert "kept: conversations 1, sessions 1, messages 6" in said
    assert "skipped:       3 messages on abandoned branches\n" in said
    assert "skipped:       2 hidden messages\n" in said
    dataset = read_dataset(out)
    assert dataset.name == "mine" and dataset.source == "import:chatgpt"
    assert [m.id for m in dataset.conversations[0].sessions[0].messages] == [
        "u1", "a1", "u2", "a2", "img", "a3"]  # fmt: skip
    assert cmd_import(parse("chatgpt", str(export), "--out", str(out))) == 2  # exists
    assert "error:" in capsys.readouterr().err
    assert cmd_import(parse("chatgpt", str(export), "--out", str(out), "--replace")) == 0


def chatgpt_loop() -> list[dict[str, Any]]:
    chat = small_chat("c", MARCH_1, "hi")
    chat["mapping"]["r"]["parent"] = "m"
    return [chat]


def chatgpt_lost_node() -> list[dict[str, Any]]:
    chat = small_chat("c", MARCH_1, "hi")
    chat["current_node"] = "gone"
    return [chat]


HOSTILE: list[tuple[str, str, Any, list[str]]] = [
    ("chatgpt", "c.json", b"[{", ["c.json:1: not JSON"]),
    ("chatgpt", "c.json", b'["\xff"]', ["c.json: not UTF-8 text (byte 2)"]),
    ("chatgpt", "c.json", {"mapping": {}}, ["c.json: expected a list of chats, got dict"]),
    ("chatgpt", "c.json", chatgpt_lost_node(),
     ["c.json: chat 0 (c): current_node: 'gone' is not a node of mapping"]),
    ("chatgpt", "c.json", chatgpt_loop(),
     ["c.json: chat 0 (c): mapping: the parent chain loops at node 'm'"]),
    ("chatgpt", "c.json", [small_chat("c", "yesterday", "hi")],  # type: ignore[arg-type]
     ["c.json: chat 0 (c): create_time: 'yesterday' is not seconds since the epoch"]),
    ("chatgpt", "e.zip", "zip:other.json", ["e.zip: the zip holds no conversations.json"]),
    ("claude", "c.json", [{"uuid": "c", "created_at": "soon", "chat_messages": []}],
     ["c.json: chat 0 (c): created_at: 'soon' is not an ISO 8601 time"]),
    ("openai", "l.jsonl", '{"messages": []}\n{"messages": [\n',
     ["l.jsonl:2: not valid JSON"]),
    ("openai", "l.jsonl", '{"id": "a", "messages": [{"role": "user", "content": "x"}]}\n'
     '{"id": "a", "messages": [{"role": "user", "content": "y"}]}\n',
     ["l.jsonl:2: id: 'a' repeats the session of line 1"]),
    ("openai", "l.jsonl", '{"date": "2024-05-02", "messages": [{"role": "user", "content": "x"}]}'
     '\n{"date": "2024-05-01", "messages": [{"role": "user", "content": "y"}]}\n',
     ["l.jsonl:2: date: '2024-05-01' is before '2024-05-02' of line 1"]),
    ("openai", "l.jsonl", '{"messages": [{"role": 3, "content": "x"}, {"content": 5}]}\n',
     ["l.jsonl:1: messages[0].role: expected", "l.jsonl:1: messages[1].role: expected"]),
    ("openai", "l.jsonl", '{"messages": [{"role": "system", "content": "only this"}]}\n',
     ["l.jsonl: nothing to import (no message was kept)"]),
    ("store", "s", "dir", ["s is not a memory store (it has no scopes/ folder)"]),
    ("openai", "missing.jsonl", None, ["missing.jsonl: no such file"]),
]  # fmt: skip


@pytest.mark.parametrize("kind, name, content, lines", HOSTILE,
                         ids=[f"{k}-{i}" for i, (k, *_) in enumerate(HOSTILE)])  # fmt: skip
def test_hostile_input_is_one_line_per_problem_exit_2_and_nothing_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str, name: str, content: Any,
    lines: list[str],
) -> None:  # fmt: skip
    source = tmp_path / name
    if content == "dir":
        source.mkdir()
    elif isinstance(content, str) and content.startswith("zip:"):
        with zipfile.ZipFile(source, "w") as archive:
            archive.writestr(content[4:], "[]")
    elif isinstance(content, bytes | str):
        source.write_bytes(content if isinstance(content, bytes) else content.encode())
    elif content is not None:
        write_json(source, content)
    out = tmp_path / "out"
    assert cmd_import(parse(kind, str(source), "--out", str(out))) == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == len(lines), errors
    for got, want in zip(errors, lines, strict=True):
        assert got.startswith("error: ") and want in got.replace(str(tmp_path) + "/", "")
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ([] if content is None else [name])


def test_every_importer_raises_invalid_not_a_crash_on_an_empty_list(tmp_path: Path):
    for kind in ("chatgpt", "claude"):
        with pytest.raises(Invalid, match="nothing to import"):
            KINDS[kind](write_json(tmp_path / f"{kind}.json", []), "me")
