"""``evolve synth``: questions written from a history with a scripted task model, each verified.

The scripted model (:func:`synth_script`) answers every synth prompt by a plain rule, so a
planted bad question fails the one check meant for it: the writer returns the questions of
:data:`WRITTEN`; the support check says "supported" when every content word of the answer is
in the cited messages; the supersede check says "changed" when a later message shown starts
over with "Actually"; the closed-book model knows only :data:`WORLD`; the judge calls two
answers the same when their content words are. Each check's test also runs with that check
turned off and finds its planted question kept, so it is dropped by exactly that check.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from contract.types import Message, Segment
from evolve.cli import synth as synth_cli
from evolve.cli.main import main
from evolve.datasets.types import Conversation, Question
from evolve.datasets.userformat import Dataset, read_dataset, write_dataset
from evolve.models import clients
from evolve.models.fake_server import FakeModelServer
from evolve.models.llm import Message as Turn
from evolve.synth import checks, driver, windows
from evolve.synth.checks import content_words
from evolve.synth.report import table_rows

ROOT = Path(__file__).resolve().parents[1]

# conversation -> sessions (id, date, [(message id, role, content)])
HISTORY: dict[str, list[tuple[str, str, list[tuple[str, str, str]]]]] = {
    "c1": [
        ("s1", "2024-01-05", [
            ("a1", "user", "I just adopted a beagle puppy named Biscuit."),
            ("a2", "assistant", "Congratulations on Biscuit! Beagles are friendly dogs."),
            ("a3", "user", "I work as a nurse at Saint Mary hospital, mostly night shifts."),
            ("a4", "assistant", "Night shifts are hard; remember to rest."),
        ]),
        ("s2", "2024-02-10", [
            ("a5", "user", "I prefer green tea over coffee in the mornings."),
            ("a6", "assistant", "Green tea is a gentle start to the day."),
            ("a7", "user", "Biscuit chewed my running shoes yesterday."),
        ]),
        ("s3", "2024-03-20", [
            ("a8", "user", "Actually I changed jobs: I am a paramedic now, no longer a nurse at "
                           "the hospital."),
            ("a9", "assistant", "Good luck with the paramedic work!"),
        ]),
    ],
    "c2": [
        ("t1", "2024-05-01", [
            ("b1", "user", "My sister Lena is visiting from Oslo in June."),
            ("b2", "assistant", "How nice, enjoy the visit."),
            ("b3", "user", "We plan to hike the Besseggen ridge together."),
            ("b4", "user", "Lena says Paris is the capital of France, and she loves it there."),
        ]),
    ],
}  # fmt: skip


def q(question: str, answer: str, *evidence: str) -> dict[str, Any]:
    return {"question": question, "answer": answer, "evidence": list(evidence)}


# what the writer returns, by (conversation, kind); "PLANT" marks nothing to the model: the
# comments say which check each planted question is for
WRITTEN: dict[tuple[str, str], list[dict[str, Any]] | str] = {
    ("c1", "factual"): [
        q("What is the name of my puppy?", "Biscuit", "a1"),
        q("What breed is my puppy Biscuit?", "a golden retriever", "a1"),  # unsupported
        q("What do I drink in the morning?", "green tea", "a99"),  # unsupported: no such id
    ],
    ("c1", "temporal"): [q("When did I adopt my puppy?", "2024-01-05", "a1")],
    ("c1", "preference"): [
        q("Do I prefer tea or coffee in the morning?", "green tea", "a5"),
        q("do I prefer TEA or coffee in the morning", "green tea", "[a5]"),  # duplicate
    ],
    ("c1", "update"): [
        q("Where do I work?", "a nurse at Saint Mary hospital", "a3"),  # superseded
        q("What is my job now?", "paramedic", "a8"),
    ],
    ("c1", "adversarial"): [
        q(
            "What is the name of my cat?", "You never mentioned a cat; your puppy is Biscuit.", "a1"
        ),  # fmt: skip
    ],
    ("c1", "multi-session"): [
        q(
            "What did my puppy do after I adopted him?",
            "Biscuit the beagle puppy chewed my running shoes",
            "a1",
            "a7",
        ),  # fmt: skip
        q("What did I adopt?", "a beagle puppy named Biscuit", "a1", "a2"),  # unsupported: one
        # session
    ],
    ("c2", "factual"): [
        q("Who is visiting me from Oslo?", "my sister Lena", "b1"),
        q("What is the capital of France?", "Paris", "b4"),  # closed-book
    ],
    ("c2", "temporal"): [q("When is Lena visiting?", "in June", "b1")],
}
PLANTED = {
    "unsupported": ["What breed is my puppy Biscuit?", "What do I drink in the morning?",
                    "What did I adopt?"],
    "superseded": ["Where do I work?"],
    "closed-book": ["What is the capital of France?"],
    "duplicate": ["do I prefer TEA or coffee in the morning"],
}  # fmt: skip
REASONS = {"What do I drink in the morning?": "a99", "What did I adopt?": "2 sessions"}  # in
# their rejection's reason
WORLD = {"What is the capital of France?": "Paris", "Who is visiting me from Oslo?": "a cousin"}
IDS = {m[0]: conv for conv, sessions in HISTORY.items() for s in sessions for m in s[2]}


def _field(prompt: str, name: str) -> str:
    found = re.search(rf"^{name}: (.*)$", prompt, re.MULTILINE)
    assert found, (name, prompt)
    return found.group(1)


def synth_script(role: str, purpose: str, messages: list[Turn]) -> str:
    """The scripted task model (see the module docstring); keyed on each prompt's opening, so
    the fake server, which sees no purpose, can serve it too."""
    prompt = str(next(m for m in messages if m["role"] == "user")["content"])
    if prompt.startswith("You write probing questions"):
        kind = re.search(r"^Write \d+ (\S+) question", prompt, re.MULTILINE)
        shown = re.findall(r"^\[([^\]]+)\] ", prompt, re.MULTILINE)
        assert kind and shown, prompt
        written = WRITTEN.get((IDS[shown[0]], kind.group(1)), [])
        return written if isinstance(written, str) else json.dumps({"questions": written})
    if prompt.startswith("You check a question"):
        cited = prompt.split("Cited messages:\n", 1)[1].split("\n\nQuestion: ", 1)[0]
        answer = _field(prompt, "Proposed answer")
        adversarial = "meant to be unanswerable" in prompt
        ok = adversarial or content_words(answer) <= content_words(cited)
        return json.dumps({"supported": ok, "reason": "scripted"})
    if prompt.startswith("A question about a user's conversation history"):
        later = prompt.split("These messages came later", 1)[1]
        changed = any(line.split(": ", 1)[-1].startswith("Actually") for line in later.splitlines())
        return json.dumps({"changed": changed, "reason": "scripted"})
    if prompt.startswith("Answer this question"):
        return json.dumps({"answer": WORLD.get(_field(prompt, "Question"), "unknown")})
    if prompt.startswith("Do these two answers"):
        same = content_words(_field(prompt, "Reference answer")) == content_words(
            _field(prompt, "Other answer")
        )
        return json.dumps({"same": same, "reason": "scripted"})
    raise AssertionError(f"unexpected prompt: {prompt[:200]}")


def make_folder(path: Path, questions: tuple[Question, ...] = ()) -> Path:
    conversations = tuple(
        Conversation(cid, tuple(Segment(sid, date, tuple(Message(*m) for m in msgs))
                                for sid, date, msgs in sessions))
        for cid, sessions in HISTORY.items()
    )  # fmt: skip
    return write_dataset(path, Dataset("synth-test", "hand", conversations, questions))


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    return make_folder(tmp_path / "data")


@pytest.fixture
def scripted(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The command's client answers from :func:`synth_script` (the ``scripted`` double) at the
    price per token in the returned list (empty: no price)."""
    import evolve.models.testing  # noqa: F401  (registers the scripted double)

    price: list[float] = []

    def client(*args: Any, **kwargs: Any) -> Any:
        made = clients.llm_client(*args, script=synth_script, **kwargs)
        made.usd_per_token = price[0] if price else None  # type: ignore[attr-defined]
        return made

    monkeypatch.setattr(synth_cli, "llm_client", client)
    return price


def synth(capsys: pytest.CaptureFixture[str], folder: Path, *flags: str) -> tuple[int, str, str]:
    code = main(["synth", str(folder), "--model", "scripted", "--per-window", "3",
                 "--no-progress", *flags])  # fmt: skip
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def kept_and_rejected(folder: Path) -> tuple[dict[str, Question], dict[str, dict[str, Any]]]:
    kept = {q.question: q for q in read_dataset(folder).questions}
    lines = (folder / "synth" / "rejected.jsonl").read_text().splitlines()
    rejected = {r["question"]: r for r in map(json.loads, lines)}
    return kept, rejected


def calls(folder: Path) -> list[dict[str, Any]]:
    with sqlite3.connect(folder / "synth" / "llm-calls.sqlite") as conn:
        conn.row_factory = sqlite3.Row
        return [dict(r) for r in conn.execute("SELECT * FROM calls ORDER BY id")]


def test_synth_writes_verified_questions_that_validate(
    folder: Path,
    scripted: list[float],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    outcomes: list[driver.Outcome] = []

    def recorded(*args: Any) -> driver.Outcome:
        outcomes.append(driver.synthesize(*args))
        return outcomes[-1]

    monkeypatch.setattr(synth_cli, "synthesize", recorded)
    code, out, err = synth(capsys, folder, "--jobs", "3")
    assert code == 0, err
    dataset = read_dataset(folder)  # the output validates
    messages = {c.id: c.messages() for c in dataset.conversations}
    assert dataset.questions
    for question in dataset.questions:
        assert question.evidence_ids and all(
            e in messages[question.conversation_id] for e in question.evidence_ids
        )
        meta = question.meta["synth"]
        assert meta["model"] == "scripted" and meta["kind"] == question.ability
        assert question.id == f"synth/{meta['window']}/{meta['kind']}/" + question.id[-1]
        assert set(meta["verdicts"]) == set(checks.CHECKS)
        assert all(v["passed"] for v in meta["verdicts"].values())
    kept, rejected = kept_and_rejected(folder)
    by_kind = {q.ability for q in kept.values()}
    assert by_kind == {"factual", "temporal", "preference", "update", "adversarial",
                       "multi-session"}  # fmt: skip
    assert kept["What did my puppy do after I adopted him?"].capability == "M"
    assert kept["What is my job now?"].capability == "T"  # update -> T
    assert (
        kept["What is the name of my cat?"]
        .meta["synth"]["verdicts"]["closed-book"]["reason"]
        .startswith("not applied")
    )
    assert kept["Who is visiting me from Oslo?"].question_date == "2024-05-01"
    assert kept["Do I prefer tea or coffee in the morning?"].evidence_ids == ("a5",)
    planted = {text for texts in PLANTED.values() for text in texts}
    assert set(rejected) == planted
    purposes = {r["stage"] for r in calls(folder)}
    assert purposes == {"synth/write", "synth/support", "synth/supersede",
                        "synth/closed-book", "synth/match"}  # fmt: skip

    # the table and report.json say the same counts as the files
    report = json.loads((folder / "synth" / "report.json").read_text())
    counts = report["counts"]["by_capability"]
    for cap, group in counts.items():
        mine = [q for q in kept.values() if cap in ("all", q.capability)]
        theirs = [r for r in rejected.values() if cap in ("all", r["capability"])]
        assert group["kept"] == len(mine) and group["written"] == len(mine) + len(theirs)
        for check in checks.CHECKS:
            assert group[check] == sum(r["check"] == check for r in theirs)
    printed = [[c.strip() for c in line.split("│")[1:-1]] for line in out.splitlines()]
    assert json.loads(json.dumps(outcomes[0].report.as_json())) == report  # what it printed
    rows = table_rows(outcomes[0].report.counts)
    assert [row[0] for row in rows] == ["F", "T", "P", "M", "A", "all"]
    for row in rows:  # every cell printed is a stored count
        assert row in printed, (row, out)
        group = counts[row[0]]
        assert [cell.split()[0] for cell in row[1:]] == [
            str(group[k]) for k in ("written", *checks.CHECKS, "kept")
        ]
    assert rows[-1][2:] == [
        f"{n} ({n / (len(kept) + len(rejected)):.0%})"
        for n in [*(len(PLANTED[c]) for c in checks.CHECKS), len(kept)]
    ]

    before = len(calls(folder))
    again = synth(capsys, folder, "--jobs", "1")  # a rerun: same output, no model call
    assert again[0] == 0, again[2]
    assert [q.id for q in read_dataset(folder).questions] == [q.id for q in dataset.questions]
    rerun = calls(folder)[before:]
    assert len(rerun) == before and all(r["cached"] for r in rerun)


@pytest.mark.parametrize(
    ("check", "owner", "name"),
    [
        ("unsupported", checks, "support"),
        ("superseded", checks, "supersede"),
        ("closed-book", checks, "closed_book"),
        ("duplicate", checks.Seen, "duplicate"),
    ],
)
def test_each_check_drops_the_questions_planted_for_it(
    check: str,
    owner: object,
    name: str,
    folder: Path,
    scripted: list[float],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each text planted for ``check`` is dropped by it (and no other question is), and kept
    once ``owner.name`` (the check) always passes."""
    code, _, err = synth(capsys, folder)
    assert code == 0, err
    kept, rejected = kept_and_rejected(folder)
    for text in PLANTED[check]:
        assert rejected[text]["check"] == check, rejected[text]
        assert text not in kept
        assert REASONS.get(text, "") in rejected[text]["reason"]
    others = [r for r in rejected.values() if r["question"] not in PLANTED[check]]
    assert all(r["check"] != check for r in others)
    # no call was made for a question whose cited ids do not exist
    assert not any('"a99"' in str(r) for r in calls(folder) if r["stage"] == "synth/support")

    passed = checks.Verdict(check, True, "off")
    monkeypatch.setattr(owner, name, lambda *a: passed)
    off = folder.parent / "off"
    make_folder(off)
    code, _, err = synth(capsys, off)
    assert code == 0, err
    kept, rejected = kept_and_rejected(off)
    assert all(text in kept for text in PLANTED[check]), rejected


def test_the_folder_s_own_questions_are_kept_and_never_duplicated(
    tmp_path: Path, scripted: list[float], capsys: pytest.CaptureFixture[str]
) -> None:
    own = Question("mine", "c2", "user", "", "When is Lena visiting?", "June", (), ("b1",))
    folder = make_folder(tmp_path / "data", (own,))
    code, _, err = synth(capsys, folder, "--kinds", "temporal,factual")
    assert code == 0, err
    questions = read_dataset(folder).questions
    assert questions[0].id == "mine"
    _, rejected = kept_and_rejected(folder)
    assert rejected["When is Lena visiting?"]["reason"] == "duplicates mine"


def test_max_usd_stops_in_one_line_and_keeps_what_was_computed(
    folder: Path, scripted: list[float], capsys: pytest.CaptureFixture[str]
) -> None:
    scripted.append(1e-4)  # dollars per token: a call costs about 2 to 6 cents
    code, out, err = synth(capsys, folder, "--jobs", "1", "--max-usd", "0.25")
    assert code == 2
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "spend cap reached" in errors[0], err
    assert "Traceback" not in err
    report = json.loads((folder / "synth" / "report.json").read_text())
    assert 0 < report["tasks"]["finished"] < report["tasks"]["total"]
    assert report["stopped"].startswith("spend cap reached")
    kept = read_dataset(folder).questions  # what finished is written, and validates
    assert len(kept) == report["questions"]["kept"] > 0
    first = calls(folder)
    paid = {r["request_hash"] for r in first if not r["cached"]}
    assert sum(r["cost_usd"] or 0 for r in first) <= 0.25

    code, _, err = synth(capsys, folder, "--jobs", "1")  # no cap: it goes on
    assert code == 0, err
    rest = calls(folder)[len(first) :]
    assert paid <= {r["request_hash"] for r in rest if r["cached"]}  # none paid again
    assert not paid & {r["request_hash"] for r in rest if not r["cached"]}


def test_a_write_that_never_gives_json_is_journaled_and_not_paid_again(
    folder: Path,
    scripted: list[float],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(WRITTEN, ("c2", "factual"), "I would rather answer in words.")
    code, out, err = synth(capsys, folder, "--kinds", "factual")
    assert code == 0, err
    assert "2 of 2 windows × kinds, 1 gave no usable reply" in out
    first = calls(folder)
    assert sum(r["stage"] == "synth/write" for r in first) == 1 + 3  # c2's asked 3 times
    code, _, err = synth(capsys, folder, "--kinds", "factual")
    assert code == 0, err
    rerun = calls(folder)[len(first) :]
    assert rerun and all(r["cached"] for r in rerun)  # the failed write is not asked again
    assert sum(r["stage"] == "synth/write" for r in rerun) == 1


def test_windows_cover_the_history_once_and_spans_cross_sessions(folder: Path) -> None:
    conversations = read_dataset(folder).conversations
    plain, spans = windows.cut(conversations, 120)
    shown = [m.id for w in plain for part in w.parts for m in part.messages]
    assert shown == [m.id for c in conversations for s in c.sessions for m in s.messages]
    assert len(plain) > len(conversations) and all(len(w.render()) <= 120 for w in plain)
    assert [w.id for w in spans] == ["c1/span1"]  # c2 has one session
    assert [p.session_id for p in spans[0].parts] == ["s1", "s2", "s3"]
    assert windows.cut(conversations, 120) == (plain, spans)
    for seed in range(5):  # at most N, drawn by the seed, kept in history order
        chosen = windows.choose(plain, 3, seed)
        assert len(chosen) == 3 and chosen == [w for w in plain if w in chosen]
        assert chosen == windows.choose(plain, 3, seed)


def test_without_a_model_it_says_so_in_one_line(
    folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["synth", str(folder)])
    err = capsys.readouterr().err
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and err.startswith("error:")
    assert "needs no model" in err
    assert not (folder / "synth").exists()


def test_a_folder_that_does_not_validate_prints_the_reader_s_lines(
    folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = folder / "conversations.jsonl"
    path.write_text(path.read_text() + "not json\n{}\n")
    code = main(["synth", str(folder), "--model", "scripted"])
    err = capsys.readouterr().err
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) >= 2 and all(line.startswith("error: conversations.jsonl:") for line in lines)
    assert not (folder / "synth").exists()


# ------------------------------------------------- killed mid-run, resumed: a real HTTP model


def _cli(folder: Path, url: str) -> list[str]:
    return [sys.executable, "-m", "evolve", "synth", str(folder), "--model", "openai/fake",
            "--api-base", url, "--per-window", "3", "--jobs", "2", "--no-progress"]  # fmt: skip


def test_kill_9_mid_synth_and_rerun_gives_the_same_questions_without_paying_again(
    tmp_path: Path,
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI")}
    with FakeModelServer(synth_script, latency_s=0.05) as server:
        clean = make_folder(tmp_path / "clean")
        done = subprocess.run(_cli(clean, server.base_url), env=env, capture_output=True,
                              text=True, timeout=120)  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        total = server.stats().requests

        folder = make_folder(tmp_path / "killed")
        before = server.stats().answered
        proc = subprocess.Popen(_cli(folder, server.base_url), env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        deadline = time.monotonic() + 60
        while server.stats().answered - before < total // 2:
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        first = server.stats().requests - total
        assert not (folder / "questions.jsonl").exists()  # nothing half-written

        resumed = subprocess.run(_cli(folder, server.base_url), env=env, capture_output=True,
                                 text=True, timeout=120)  # fmt: skip
        assert resumed.returncode == 0, resumed.stderr[-2000:]
        second = server.stats().requests - total - first
    assert (folder / "questions.jsonl").read_bytes() == (clean / "questions.jsonl").read_bytes()
    assert "resuming:" in resumed.stderr
    # only what was asked but never answered to the killed run (at most --jobs calls in
    # flight) is asked again
    assert first + second <= total + 2 and second < total - total // 3
    logged = calls(folder)
    paid = [r["request_hash"] for r in logged if not r["cached"]]
    assert len(paid) == len(set(paid))
