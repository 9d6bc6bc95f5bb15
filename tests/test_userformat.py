"""The user format v1 (evolve/datasets/usercheck.py, userformat.py, usersplits.py, userbench.py).

A table of hostile folders: each gives its exact ``FILE:LINE: FIELD: what`` lines from the
reader, the same lines as ``error:`` lines from ``evolve eval --bench jsonl`` (exit 2, no
traceback) and leaves the folder as it was (no splits.json, no temporary folder). Then the
writer (round trip, nothing half-written when it fails midway), the seeded splits written next
to the data, and an evaluation on the ``jsonl`` bench.
"""

from __future__ import annotations

import json
import os
import re
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from contract.types import Message, Segment
from evolve.benches import registry
from evolve.cli.main import main
from evolve.datasets import userformat, usersplits
from evolve.datasets.types import Conversation, DataError, Question
from evolve.datasets.usercheck import CONTENT_LIMIT, LINE_LIMIT, MAX_PROBLEMS
from evolve.datasets.userformat import Dataset, Invalid, read_dataset, write_dataset
from evolve.datasets.usersplits import SPLITS, ensure_splits, render_rule, split_dataset
from evolve.models.testing import ScriptedLLM

ROOT = Path(__file__).resolve().parents[1]
DENSE = ROOT / "seeds" / "dense.py"
MANIFEST = {"format": "prismem-conversations", "version": 1, "name": "t", "source": "hand"}


def _session(cid: str, sid: str, date: str | None, *ids: str) -> dict[str, Any]:
    messages = [{"id": m, "role": "user", "content": f"I moved to Lisbon ({m})"} for m in ids]
    return {"conversation": cid, "session": sid, "date": date, "messages": messages}


def _question(qid: str, cid: str, *evidence: str) -> dict[str, Any]:
    return {"id": qid, "conversation": cid, "question": "Where did I move to Lisbon?",
            "answer": "Lisbon", "evidence": list(evidence)}  # fmt: skip


def _base() -> dict[str, Any]:
    """A valid folder's records: the manifest, three session lines, two question lines."""
    return {
        "manifest": dict(MANIFEST),
        "sessions": [
            _session("c1", "s1", "2024-03-01", "m1", "m2"),
            _session("c2", "s1", "2024-03-02T10:00:00Z", "m1"),
            _session("c1", "s2", "2024-03-05", "m3"),
        ],
        "questions": [_question("q1", "c1", "m1"), _question("q2", "c2", "m1")],
    }


def _lines(records: list[Any]) -> bytes:
    return b"".join((r if isinstance(r, bytes) else json.dumps(r).encode()) + b"\n"
                    for r in records)  # fmt: skip


def _write(folder: Path, data: dict[str, Any]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    if data["manifest"] is not None:
        (folder / "prismem-data.json").write_text(json.dumps(data["manifest"]))
    (folder / "conversations.jsonl").write_bytes(_lines(data["sessions"]))
    (folder / "questions.jsonl").write_bytes(_lines(data["questions"]))
    return folder


def _set(part: str, i: int, **fields: Any) -> Callable[[dict[str, Any]], None]:
    return lambda d: d[part][i].update(fields)


def _drop(part: str, i: int, key: str) -> Callable[[dict[str, Any]], None]:
    return lambda d: d[part][i].pop(key)


def _line(part: str, i: int, raw: Any) -> Callable[[dict[str, Any]], None]:
    return lambda d: d[part].__setitem__(i, raw)


def _message(i: int, j: int, **fields: Any) -> Callable[[dict[str, Any]], None]:
    return lambda d: d["sessions"][i]["messages"][j].update(fields)


HUGE = 50 * 1024 * 1024  # a 50 MB message: its line is over the line limit
HUGE_LINE = b'{"conversation": "c2", "session": "s1", "messages": [{"id": "m1", "role": "user", ' \
    b'"content": "' + b"x" * HUGE + b'"}]}'  # fmt: skip

HOSTILE: dict[str, tuple[Callable[[dict[str, Any]], None], list[str]]] = {
    "duplicate session id": (
        lambda d: d["sessions"].append(_session("c2", "s1", None, "m9")),
        ["conversations.jsonl:4: session: repeats 's1' in conversation 'c2' (first at line 2)"]),
    "duplicate message id in a session": (
        _message(0, 1, id="m1"),
        ["conversations.jsonl:1: messages[1].id: repeats 'm1' (first at line 1)"]),
    "duplicate message id across sessions": (
        _message(2, 0, id="m2"),
        ["conversations.jsonl:3: messages[0].id: repeats 'm2' (first at line 1)"]),
    "duplicate question id": (
        _set("questions", 1, id="q1"),
        ["questions.jsonl:2: id: repeats 'q1' (first at line 1)"]),
    "evidence id that does not exist": (
        _set("questions", 0, evidence=["m1", "m9"]),
        ["questions.jsonl:1: evidence[1]: 'm9' is not a message of conversation 'c1'"]),
    "evidence id of another conversation": (
        _set("questions", 1, evidence=["m3"]),
        ["questions.jsonl:2: evidence[0]: 'm3' is not a message of conversation 'c2'"]),
    "question of an unknown conversation": (
        _set("questions", 1, conversation="c9"),
        ["questions.jsonl:2: conversation: 'c9' is not a conversation of conversations.jsonl"]),
    "dates out of order": (
        _set("sessions", 2, date="2024-02-29T23:00:00Z"),
        ["conversations.jsonl:3: date: '2024-02-29T23:00:00Z' is before '2024-03-01' of the "
         "conversation's previous dated session (line 1)"]),
    "date that is not ISO": (
        _set("sessions", 0, date="March 1st"),
        ["conversations.jsonl:1: date: 'March 1st' is not an ISO 8601 date or datetime"]),
    "empty session": (
        _set("sessions", 1, messages=[]),
        ["conversations.jsonl:2: messages: empty (a session needs at least one message)"]),
    "non-UTF-8 bytes": (
        _line("sessions", 1, b'{"conversation": "c2", "session": "s1", "messages": [{"id": "m1", '
              b'"role": "user", "content": "caf\xe9"}]}'),
        ["conversations.jsonl:2: not UTF-8: byte 0xe9 at byte 98 of the line"]),
    "a 50 MB message": (
        _line("sessions", 1, HUGE_LINE),
        [f"conversations.jsonl:2: line is {len(HUGE_LINE):,} bytes (limit {LINE_LIMIT:,}; "
         "skipped)"]),
    "a message over the content limit": (
        _message(1, 0, content="y" * (CONTENT_LIMIT + 1)),
        ["conversations.jsonl:2: messages[0].content: 1,000,001 characters (limit 1,000,000)"]),
    "malformed JSON line": (
        _line("sessions", 1, b'{"conversation": "c2"'),
        ["conversations.jsonl:2: not valid JSON (Expecting ',' delimiter at column 22)"]),
    "a line that is not an object": (
        _line("questions", 0, [1, 2]),
        ["questions.jsonl:1: is an array, not an object (one question per line)"]),
    "wrong type": (
        _set("questions", 0, answer=42),
        ["questions.jsonl:1: answer: expected a string, got a number"]),
    "wrong type in a message": (
        _message(0, 0, role=None),
        ["conversations.jsonl:1: messages[0].role: expected a string, got null"]),
    "missing field": (
        _drop("questions", 1, "evidence"),
        ["questions.jsonl:2: evidence: missing (a list of message ids, [] for none)"]),
    "unknown field": (
        _set("sessions", 0, sesion="s1"),
        ["conversations.jsonl:1: sesion: unknown field (expected conversation, session, date, "
         "messages)"]),
    "capability not in F/T/P/M/A": (
        _set("questions", 0, capability="X"),
        ["questions.jsonl:1: capability: 'X' is not one of F, T, P, M, A (or null)"]),
    "missing manifest": (
        lambda d: d.update(manifest=None),
        ['prismem-data.json: missing (a data folder starts with {"format": '
         '"prismem-conversations", "version": 1, "name": ..., "source": ...})']),
    "unknown manifest": (
        lambda d: d["manifest"].update(format="chat-logs"),
        ["prismem-data.json: format: expected 'prismem-conversations' (got 'chat-logs')"]),
    "a newer version": (
        lambda d: d["manifest"].update(version=2),
        ["prismem-data.json: version: 2 is newer than this PrisMem reads (1); upgrade PrisMem"]),
}  # fmt: skip


@pytest.mark.parametrize("case", list(HOSTILE))
def test_each_hostile_input_is_its_own_line_and_exit_2_with_nothing_written(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    edit, expected = HOSTILE[case]
    data = _base()
    edit(data)
    folder = _write(tmp_path / "data", data)
    before = sorted(p.name for p in tmp_path.iterdir()), sorted(folder.iterdir())
    tracemalloc.start()
    started = time.perf_counter()
    try:
        with pytest.raises(Invalid) as raised:
            read_dataset(folder)
    finally:
        took = time.perf_counter() - started
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert raised.value.problems == expected
    assert took < 2 and peak < LINE_LIMIT + 8 * 2**20  # a 50 MB line is never held whole

    code = main(["eval", "--program", str(DENSE), "--bench", "jsonl", "--data-dir", str(folder),
                 "--split", "train", "--embedder", "hashing", "--jobs", "1", "--no-progress",
                 "--runs-dir", str(tmp_path / "runs"),
                 "--cache-dir", str(tmp_path / "cache")])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2
    assert [line for line in err.splitlines() if line.startswith("error:")] == [
        f"error: {p}" for p in expected
    ]
    assert "Traceback" not in err
    assert (sorted(p.name for p in tmp_path.iterdir() if p.name not in ("runs", "cache")),
            sorted(folder.iterdir())) == before  # fmt: skip


def test_the_cli_prints_every_problem_as_its_own_error_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = _base()
    for edit, _ in (HOSTILE["duplicate question id"], HOSTILE["empty session"],
                    HOSTILE["wrong type"]):  # fmt: skip
        edit(data)
    data["sessions"] += [b"{nope"] * 60
    folder = _write(tmp_path / "data", data)
    code = main(["eval", "--program", str(DENSE), "--bench", "jsonl", "--data-dir", str(folder),
                 "--embedder", "hashing", "--no-progress", "--runs-dir", str(tmp_path / "runs"),
                 "--cache-dir", str(tmp_path / "cache")])  # fmt: skip
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == MAX_PROBLEMS + 1
    assert errors[0] == "error: conversations.jsonl:2: messages: empty (a session needs at " \
        "least one message)"  # fmt: skip
    assert errors[-1] == "error: stopped after 50 problems: fix these and check again"


def test_a_valid_folder_reads_into_the_benchmark_types(tmp_path: Path) -> None:
    data = _base()
    data["questions"][0].update(date="2024-04-01", capability="T", kind="when", rubric=["r"],
                                meta={"posed": "Where?"})  # fmt: skip
    dataset = read_dataset(_write(tmp_path, data))
    assert [c.id for c in dataset.conversations] == ["c1", "c2"]  # first appearance
    assert [s.session_id for s in dataset.conversations[0].sessions] == ["s1", "s2"]
    assert dataset.conversations[1].sessions[0].date == "2024-03-02T10:00:00Z"  # verbatim
    q1, q2 = dataset.questions
    assert (q1.ability, q1.capability, q1.question_date, q1.rubric, q1.posed) == (
        "when", "T", "2024-04-01", ("r",), "Where?")  # fmt: skip
    assert (q2.ability, q2.capability, q2.evidence_ids) == ("user", "", ("m1",))


def test_the_documented_example_is_a_valid_folder(tmp_path: Path) -> None:
    text = (ROOT / "docs" / "user-format.md").read_text()
    blocks = re.findall(r"^`([a-z-]+\.jsonl?)`:\n```json\n(.*?)```", text, re.M | re.S)
    assert [name for name, _ in blocks] == ["prismem-data.json", "conversations.jsonl",
                                            "questions.jsonl"]  # fmt: skip
    for name, body in blocks:
        (tmp_path / name).write_text(body)
    dataset = read_dataset(tmp_path)
    assert (len(dataset.conversations), len(dataset.questions)) == (1, 1)


def test_the_reader_stops_after_50_problems_and_says_so(tmp_path: Path) -> None:
    data = _base()
    data["sessions"] += [b"{nope"] * 80
    with pytest.raises(Invalid) as raised:
        read_dataset(_write(tmp_path, data))
    assert len(raised.value.problems) == MAX_PROBLEMS and raised.value.truncated
    assert raised.value.lines()[-1].startswith("stopped after 50 problems")
    assert str(raised.value).endswith("(and 49 more)")


def test_a_beam_1m_sized_conversation_loads_in_well_under_two_seconds(tmp_path: Path) -> None:
    text = "word " * 2000  # 10,000 characters a message, 400 messages: 4M characters
    data = _base()
    data["sessions"] = [
        {"conversation": "big", "session": f"s{j}", "date": f"2024-01-{j + 1:02d}",
         "messages": [{"id": f"m{j}.{i}", "role": "user", "content": text} for i in range(40)]}
        for j in range(10)
    ]  # fmt: skip
    data["questions"] = [_question("q1", "big", "m0.0")]
    folder = _write(tmp_path, data)
    started = time.perf_counter()
    dataset = read_dataset(folder)
    assert time.perf_counter() - started < 2
    assert dataset.conversations[0].n_chars == 4_000_000


# ------------------------------------------------------------------------ writing


def _dataset() -> Dataset:
    def conv(cid: str, *dates: str | None) -> Conversation:
        return Conversation(cid, tuple(
            Segment(f"s{i}", d, (Message(f"m{i}", "user", f"fact {cid} {i} é"),
                                 Message(f"a{i}", "Caroline", "")))
            for i, d in enumerate(dates)))  # fmt: skip

    convs = (conv("c1", "2024-01-01", None, "2024-01-02T08:00:00+02:00"), conv("c2", None))
    questions = (
        Question("q1", "c1", "user", "", "What fact?", "fact c1 0", (), ("m0", "m2")),
        Question("q2", "c2", "kind-x", "A", "Q?", "", ("a", "b"), (), "2024-05-01", {"k": [1]}),
    )
    return Dataset("mine", "hand", convs, questions)


def test_write_then_read_gives_equal_records(tmp_path: Path) -> None:
    dataset = _dataset()
    assert write_dataset(tmp_path / "d", dataset) == tmp_path / "d"
    back = read_dataset(tmp_path / "d")
    assert back == dataset
    assert [q.meta for q in back.questions] == [q.meta for q in dataset.questions]
    assert [p.name for p in tmp_path.iterdir()] == ["d"]  # no temporary sibling left


def test_the_writer_refuses_invalid_records_and_writes_nothing(tmp_path: Path) -> None:
    dataset = _dataset()
    twice = Dataset("mine", "hand", (*dataset.conversations, dataset.conversations[0]), ())
    with pytest.raises(Invalid) as raised:
        write_dataset(tmp_path / "d", twice)
    assert raised.value.problems == [
        "conversations.jsonl:5: conversation: repeats 'c1' (first at line 1: two conversations "
        "with one id)"]  # fmt: skip
    bad = Dataset("mine", "hand", dataset.conversations,
                  (Question("q1", "c2", "user", "", "Q?", "A", (), ("m9",)),))  # fmt: skip
    with pytest.raises(Invalid, match=r"questions.jsonl:1: evidence\[0\]: 'm9' is not a message"):
        write_dataset(tmp_path / "d", bad)
    assert list(tmp_path.iterdir()) == []


def test_a_writer_that_fails_midway_leaves_the_old_folder_or_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dataset = _dataset()

    def crash(q: Question) -> dict[str, Any]:
        raise RuntimeError("killed while writing questions")

    monkeypatch.setattr(userformat, "question_record", crash)
    with pytest.raises(RuntimeError):
        write_dataset(tmp_path / "new", dataset)
    assert list(tmp_path.iterdir()) == []  # no folder, no temporary one
    monkeypatch.undo()
    old = write_dataset(tmp_path / "old", Dataset("old", "hand", dataset.conversations, ()))
    files = {p.name: p.read_bytes() for p in old.iterdir()}
    monkeypatch.setattr(userformat, "question_record", crash)
    with pytest.raises(RuntimeError):
        write_dataset(old, dataset, replace=True)
    assert [p.name for p in tmp_path.iterdir()] == ["old"]
    assert {p.name: p.read_bytes() for p in old.iterdir()} == files
    monkeypatch.undo()
    rename = os.rename

    def full(src: Path, dst: Path) -> None:  # the last rename fails: the old folder comes back
        if ".tmp-" in str(src):
            raise OSError(28, "No space left on device")
        rename(src, dst)

    monkeypatch.setattr(os, "rename", full)
    with pytest.raises(DataError, match=r"cannot write \(No space left on device\)"):
        write_dataset(old, dataset, replace=True)
    assert [p.name for p in tmp_path.iterdir()] == ["old"]
    assert {p.name: p.read_bytes() for p in old.iterdir()} == files
    monkeypatch.undo()
    write_dataset(old, dataset, replace=True)
    assert read_dataset(old) == dataset and [p.name for p in tmp_path.iterdir()] == ["old"]


def test_the_writer_replaces_only_a_data_folder(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "notes.txt").write_text("mine")
    with pytest.raises(DataError, match="exists and is not empty"):
        write_dataset(tmp_path / "docs", _dataset())
    with pytest.raises(DataError, match="not a data folder, so it is not replaced"):
        write_dataset(tmp_path / "docs", _dataset(), replace=True)
    assert (tmp_path / "docs" / "notes.txt").read_text() == "mine"


def test_write_questions_checks_them_against_the_conversations(tmp_path: Path) -> None:
    dataset = _dataset()
    folder = write_dataset(tmp_path / "d", Dataset("d", "hand", dataset.conversations, ()))
    with pytest.raises(Invalid, match=r"questions.jsonl:2: evidence\[0\]: 'm2' is not a message"):
        stray = Question("q9", "c2", "user", "", "Q?", "A", (), ("m2",))
        userformat.write_questions(folder, [dataset.questions[0], stray])
    assert not (folder / "questions.jsonl").exists()
    userformat.write_questions(folder, dataset.questions)
    assert read_dataset(folder).questions == dataset.questions


# ------------------------------------------------------------------------ splits


def _conversations(n: int, questions: int = 1) -> Dataset:
    convs = tuple(Conversation(f"c{i}", (Segment("s", None, (Message("m", "user", "x"),)),))
                  for i in range(n))  # fmt: skip
    qs = tuple(Question(f"q{i}.{j}", f"c{i}", "user", "", "Q?", "x", (), ("m",))
               for i in range(n) for j in range(questions))  # fmt: skip
    return Dataset("n", "hand", convs, qs)


@pytest.mark.parametrize(("n", "sizes"), [
    (2, (1, 1, 0, 0)), (3, (1, 1, 0, 1)), (4, (2, 1, 0, 1)), (5, (2, 1, 1, 1)),
    (10, (4, 2, 2, 2)), (23, (8, 5, 5, 5)),
])  # fmt: skip
def test_conversation_split_sizes(n: int, sizes: tuple[int, ...]) -> None:
    splits = split_dataset(_conversations(n))
    assert splits["by"] == "conversation" and "reason" not in splits
    assert tuple(len(splits["splits"][name]) for name in usersplits.NAMES) == sizes
    assert sorted(i for ids in splits["splits"].values() for i in ids) == sorted(
        f"c{i}" for i in range(n))  # fmt: skip


def test_the_same_seed_gives_the_same_bytes_and_a_resumed_load_reads_them(tmp_path: Path) -> None:
    dataset = _conversations(12)
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        assert ensure_splits(tmp_path / name, dataset, seed=3)[1] is True
    first = (tmp_path / "a" / SPLITS).read_bytes()
    assert first == (tmp_path / "b" / SPLITS).read_bytes()
    assert split_dataset(dataset, seed=4) != split_dataset(dataset, seed=3)
    again, written = ensure_splits(tmp_path / "a", dataset, seed=4)  # the file wins
    assert not written and again["seed"] == 3 and (tmp_path / "a" / SPLITS).read_bytes() == first


def test_one_conversation_is_split_by_question_and_the_reason_is_said_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dataset = _conversations(1, questions=8)
    folder = write_dataset(tmp_path / "d", dataset)
    loader = registry.bench("jsonl")
    train = loader.load_taskset(folder, "train")
    valid = loader.load_taskset(folder, "valid")
    splits = json.loads((folder / SPLITS).read_text())
    assert splits["by"] == "question" and "split by question" in splits["reason"]
    assert (len(train.questions), len(valid.questions)) == (4, 2)
    test = loader.load_taskset(folder, loader.run_split(folder, "test"))
    assert [q.id for q in test.questions] == splits["splits"]["holdout"]  # test reads holdout
    notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("note:")]
    assert notes == [f"note: {folder}: {splits['reason']}"]


def test_a_changed_dataset_is_one_line_telling_to_split_again(tmp_path: Path) -> None:
    folder = write_dataset(tmp_path / "d", _conversations(4))
    registry.bench("jsonl").load_taskset(folder, "train")  # writes splits.json
    grown = _conversations(5)
    (folder / SPLITS).rename(tmp_path / "kept.json")
    write_dataset(folder, grown, replace=True)
    (tmp_path / "kept.json").rename(folder / SPLITS)
    with pytest.raises(DataError) as raised:
        registry.bench("jsonl").load_taskset(folder, "valid")
    assert str(raised.value) == (
        f"{folder / SPLITS}: no longer matches the data: conversation 'c4' is in no split; run "
        f"`evolve data split {folder}` to split again (scores on the old split do not compare "
        "with the new)")  # fmt: skip
    assert ensure_splits(folder, grown, rewrite=True)[1]
    assert registry.bench("jsonl").load_taskset(folder, "valid").questions


def test_a_folder_that_cannot_be_written_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = write_dataset(tmp_path / "d", _conversations(3))

    def refuse(path: Path, data: bytes, *, mode: int | None = None) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(usersplits, "write_atomic", refuse)
    with pytest.raises(DataError, match=r"cannot write splits.json \(Permission denied\); the "
                       "data folder must be writable"):  # fmt: skip
        registry.bench("jsonl").load_taskset(folder, "train")


def test_the_shipped_rule_file_is_the_rule() -> None:
    assert registry.bench("jsonl").splits_file.read_text() == render_rule()


# ------------------------------------------------------------------------ the bench


def test_evolve_eval_runs_on_the_jsonl_bench(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    folder = write_dataset(tmp_path / "d", _conversations(5))
    args = ["eval", "--program", str(DENSE), "--bench", "jsonl", "--data-dir", str(folder),
            "--embedder", "hashing", "--jobs", "1", "--no-progress", "--json", "--runs-dir",
            str(tmp_path / "runs"), "--cache-dir", str(tmp_path / "cache")]  # fmt: skip
    assert main(args) == 0
    meta = json.loads(capsys.readouterr().out)["meta"]
    assert (meta["bench"], meta["split"], meta["questions"]) == ("jsonl", "all", 5)
    assert not (folder / SPLITS).exists()  # `all` needs no split
    assert main([*args, "--split", "holdout"]) == 0
    meta = json.loads(capsys.readouterr().out)["meta"]
    assert (meta["split"], meta["questions"]) == ("holdout", 1)
    assert (folder / SPLITS).is_file()


def test_the_jsonl_scorer_judges_against_the_gold_answer() -> None:
    judge = ScriptedLLM(["Yes.", "no"])
    scorer = registry.bench("jsonl").scorer(judge)
    question = _dataset().questions[0]
    right, wrong = scorer.score(question, "fact c1 0"), scorer.score(question, "nothing")
    assert (right.scores, wrong.scores["judge_correct"]) == (
        {"judge_correct": 1.0, "answer_f1": 1.0}, 0.0)  # fmt: skip
    role, purpose, messages = judge.transport_calls[1]
    assert (role, purpose) == ("judge", "jsonl/judge")
    assert "Reference answer: fact c1 0\nAssistant's response: nothing" in messages[-1]["content"]
    assert registry.bench("jsonl").scorer(None).score(question, "fact").scores == {
        "judge_correct": None, "answer_f1": 0.5}  # fmt: skip
