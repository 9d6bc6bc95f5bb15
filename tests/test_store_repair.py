"""``evolve store verify`` and ``repair`` (:mod:`evolve.runtime.upkeep`, :func:`evolve.runtime.log.
salvage`): one flipped byte in the middle of a user's log makes the runtime refuse that user;
verify names the damage (exit 1); repair keeps every other session of that user, moves the
damaged log aside, says what was lost, and the memory answers again; other users untouched."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

import evolve
from contract.types import Message, Segment
from evolve.cli.common import UsageError
from evolve.cli.store import add_command, cmd_store
from evolve.runtime.log import LogError, SessionLog, encode, salvage
from evolve.runtime.store import scope_key

ROOT = Path(__file__).resolve().parents[1]
ALL = (
    (ROOT / "seeds" / "simple.py")
    .read_text()
    .replace(  # every unit, in index order
        'text = "\\n\\n".join(render(u) for u in self.units)',
        'text = " ".join(u.content for u in self.units)',
    )
)


def seg(i: int) -> Segment:
    return Segment(f"s{i}", None, (Message(f"s{i}.0", "user", f"the word is kiwi{i}fig"),))


def logged(path: Path, n: int) -> list[int]:
    """A log of ``n`` sessions at ``path``; each record's start offset."""
    log, _ = SessionLog.open(path)
    starts = []
    for i in range(n):
        starts.append(path.stat().st_size)
        log.append(seg(i))
    return starts


def flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


def test_salvage_keeps_the_records_before_and_after_a_bad_one(tmp_path: Path):
    path = tmp_path / "log"
    starts = logged(path, 5)
    flip(path, starts[2] + 36 + 30)  # inside the third record's payload (its message text)
    found = salvage(path.read_bytes())
    assert [s.session_id for s in found.sessions] == ["s0", "s1", "s3", "s4"]
    assert [(x.start, x.end, x.why, x.records, x.session_id) for x in found.lost] == [
        (starts[2], starts[3], "checksum", 1, "s2")
    ]
    assert found.damaged and found.torn == 0


def test_a_damaged_length_is_refused_not_taken_for_a_torn_tail(tmp_path: Path):
    """A record whose length now runs past the end of the file, with whole records after it, is
    damage: open refuses it (truncating would drop the records after it) and salvage finds
    them."""
    path = tmp_path / "log"
    starts = logged(path, 4)
    data = bytearray(path.read_bytes())
    data[starts[1] + 1] ^= 0x10  # the length's second byte: now about a megabyte
    path.write_bytes(bytes(data))
    with pytest.raises(LogError, match=f"damaged at byte {starts[1]} .*with records after it"):
        SessionLog.open(path)
    assert path.read_bytes() == bytes(data)  # nothing truncated
    found = salvage(bytes(data))
    assert [s.session_id for s in found.sessions] == ["s0", "s2", "s3"]


def test_a_torn_tail_is_not_damage(tmp_path: Path):
    path = tmp_path / "log"
    logged(path, 2)
    with open(path, "ab") as fh:
        fh.write(encode(seg(9))[:-3])
    found = salvage(path.read_bytes())
    assert not found.damaged and found.torn > 0 and len(found.sessions) == 2


def store_cli(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    add_command(parser.add_subparsers(dest="command"))
    return cmd_store(parser.parse_args(["store", *argv]))


def open_store(tmp_path: Path) -> evolve.AgentMemory:
    program = tmp_path / "all.py"
    program.write_text(ALL)
    return evolve.open_memory(program, tmp_path / "store", embedder="hashing", snapshot_every=1,
                              notice=lambda line: None)  # fmt: skip


def test_repair_brings_a_damaged_user_back_with_every_other_session(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    store = tmp_path / "store"
    with open_store(tmp_path) as memory:
        for i in range(5):
            memory.add([{"content": f"ana's word is kiwi{i}fig"}], user="ana", session_id=f"a{i}")
        memory.add([{"content": "bob's word is plum"}], user="bob", session_id="b0")
    ana, bob = (store / "scopes" / scope_key(u) for u in ("ana", "bob"))
    bobs = {p.name: p.read_bytes() for p in bob.iterdir()}
    data = (ana / "log").read_bytes()
    middle = data.index(b"kiwi2fig")
    flip(ana / "log", middle)

    with open_store(tmp_path) as memory:
        with pytest.raises(evolve.AgentMemoryError, match="damaged at byte"):
            memory.context("what is ana's word?", user="ana")
        assert "plum" in memory.context("what is bob's word?", user="bob")

    assert store_cli("verify", str(store)) == 1
    said = capsys.readouterr().out
    assert f"scope {scope_key('ana')}: log damaged at byte" in said and "'a2'" in said
    assert f"scope {scope_key('bob')}: log whole, 1 session" in said

    assert store_cli("repair", str(store)) == 0
    said = capsys.readouterr().out
    assert "4 sessions kept" in said and "session 'a2'" in said and "log.damaged-" in said
    assert [p.name for p in ana.glob("log.damaged-*")]
    assert not list(ana.glob("*.state"))  # rebuilt from the repaired log
    assert {p.name: p.read_bytes() for p in bob.iterdir()} == bobs

    assert store_cli("verify", str(store)) == 0
    with open_store(tmp_path) as memory:
        said = memory.context("what is ana's word?", user="ana")
        assert [f"kiwi{i}fig" in said for i in range(5)] == [True, True, False, True, True]
        assert [s.session_id for s in memory.history("ana")] == ["a0", "a1", "a3", "a4"]
        assert memory.add([{"content": "again"}], user="ana", session_id="a5")
    assert {p.name: p.read_bytes() for p in bob.iterdir()} == bobs


def test_verify_reports_a_snapshot_that_does_not_decode_and_repair_removes_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    store = tmp_path / "store"
    with open_store(tmp_path) as memory:
        memory.add([{"content": "ana's word is kiwi"}], user="ana")
    (snapshot,) = (store / "scopes" / scope_key("ana")).glob("*.state")
    snapshot.write_bytes(snapshot.read_bytes()[:-5])
    assert store_cli("verify", str(store)) == 1
    assert f"snapshot {snapshot.name} does not decode" in capsys.readouterr().out
    assert store_cli("repair", str(store)) == 0
    assert not snapshot.exists()
    assert store_cli("verify", str(store)) == 0
    with open_store(tmp_path) as memory:
        assert "kiwi" in memory.context("word?", user="ana")


def test_a_folder_that_is_not_a_store_is_one_error(tmp_path: Path):
    with pytest.raises(UsageError, match="not a memory store"):
        store_cli("verify", str(tmp_path))
    with pytest.raises(UsageError, match="not a memory store"):
        store_cli("repair", str(tmp_path))
