"""The runtime's session log and store folder, without a host: a torn tail is dropped, damage
is refused, a session id is logged once, snapshots are whole and filed by build and position."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from contract.types import Message, Segment
from evolve.runtime.log import MAGIC, LogError, SessionLog, encode
from evolve.runtime.store import Deployment, MemoryStore, MemoryStoreError, scope_key


def seg(i: int, text: str = "hello") -> Segment:
    return Segment(f"s{i}", f"2024-01-{i + 1:02d}", (Message(f"s{i}.0", "user", f"{text} {i}"),))


def test_append_is_read_back_in_order(tmp_path: Path):
    log, opened = SessionLog.open(tmp_path / "log")
    assert opened.sessions == [] and opened.dropped_bytes == 0
    for i in range(5):
        assert log.append(seg(i)) == (i, True)
    again, opened = SessionLog.open(tmp_path / "log")
    assert again.sessions == [seg(i) for i in range(5)] and opened.dropped_bytes == 0


def test_a_session_id_is_logged_once(tmp_path: Path):
    log, _ = SessionLog.open(tmp_path / "log")
    log.append(seg(0))
    size = (tmp_path / "log").stat().st_size
    assert log.append(seg(0, "another text")) == (0, False)
    assert (tmp_path / "log").stat().st_size == size
    assert SessionLog.open(tmp_path / "log")[0].sessions == [seg(0)]


@pytest.mark.parametrize("cut", [1, 5, 36, 40, -1])
def test_a_torn_last_record_is_dropped(tmp_path: Path, cut: int):
    """A record cut anywhere (in its head, its payload, its last byte) is dropped on open and
    the file truncated to the whole records; the next append lands after them."""
    path = tmp_path / "log"
    log, _ = SessionLog.open(path)
    log.append(seg(0))
    whole = path.stat().st_size
    record = encode(seg(1))
    with open(path, "ab") as fh:
        fh.write(record[:cut] if cut > 0 else record[:cut])
    log, opened = SessionLog.open(path)
    assert log.sessions == [seg(0)] and opened.dropped_bytes > 0
    assert path.stat().st_size == whole
    log.append(seg(2))
    assert SessionLog.open(path)[0].sessions == [seg(0), seg(2)]


def test_a_last_record_with_a_bad_checksum_is_dropped(tmp_path: Path):
    path = tmp_path / "log"
    log, _ = SessionLog.open(path)
    log.append(seg(0))
    record = bytearray(encode(seg(1)))
    record[-1] ^= 0xFF  # its last byte never reached the disk as written
    with open(path, "ab") as fh:
        fh.write(bytes(record))
    assert SessionLog.open(path)[0].sessions == [seg(0)]


def test_damage_before_whole_records_is_refused_not_truncated(tmp_path: Path):
    path = tmp_path / "log"
    log, _ = SessionLog.open(path)
    for i in range(3):
        log.append(seg(i))
    data = bytearray(path.read_bytes())
    data[len(MAGIC) + 40] ^= 0xFF  # inside the first record's payload
    path.write_bytes(bytes(data))
    with pytest.raises(LogError, match="damaged"):
        SessionLog.open(path)
    assert path.read_bytes() == bytes(data)


def test_a_file_that_is_not_a_log_is_refused(tmp_path: Path):
    (tmp_path / "log").write_bytes(b"something else entirely")
    with pytest.raises(LogError, match="not a PrisMem session log"):
        SessionLog.open(tmp_path / "log")


def deployment(sha: str = "a" * 64, embedder: str = "hashing") -> Deployment:
    return Deployment(sha, "1", "e" * 64, None, embedder, "fp32")


def test_the_build_key_is_the_one_existing_stores_were_written_with():
    """The pipeline version is hashed under its stored name (``evaluator_version``), so the
    snapshots of a store written before the rename keep their build key."""
    assert deployment().key() == "019e2fda956e9ddfd72a2c26"
    assert "evaluator_version" in deployment().as_stored()


def test_snapshots_by_build_and_position(tmp_path: Path):
    store = MemoryStore(tmp_path, deployment(), "x = 1\n")
    store.open_log("ana")
    assert store.snapshot("ana", 10) is None
    store.put_snapshot("ana", 3, b"three")
    store.put_snapshot("ana", 5, b"five")
    assert store.snapshot("ana", 10) == (5, b"five")
    assert store.snapshot("ana", 4) is None  # the older one was removed once the newer landed
    assert store.snapshot("bob", 10) is None
    store.close()
    other = MemoryStore(tmp_path, deployment(embedder="minilm"), "x = 1\n")  # another build
    assert other.snapshot("ana", 10) is None


def test_switching_programs_keeps_the_previous_one(tmp_path: Path):
    first = MemoryStore(tmp_path, deployment("a" * 64), "first = 1\n")
    assert first.switched_from is None and first.previous_program() is None
    first.close()
    second = MemoryStore(tmp_path, deployment("b" * 64), "second = 1\n")
    assert second.switched_from == "a" * 64
    previous = second.previous_program()
    assert previous is not None and previous.read_text() == "first = 1\n"
    second.close()
    back = MemoryStore(tmp_path, deployment("a" * 64), "first = 1\n")  # roll back
    assert back.switched_from == "b" * 64 and back.manifest["active"] == "a" * 64


def test_scope_ids_cannot_name_paths(tmp_path: Path):
    store = MemoryStore(tmp_path, deployment(), "x = 1\n")
    assert store.scope_dir("../../etc").parent == tmp_path / "scopes"
    assert scope_key("a") != scope_key("b")
    with pytest.raises(MemoryStoreError):
        scope_key("")


def test_a_damaged_manifest_is_one_error(tmp_path: Path):
    MemoryStore(tmp_path, deployment(), "x = 1\n").close()
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(MemoryStoreError, match="manifest.json is unreadable"):
        MemoryStore(tmp_path, deployment(), "x = 1\n")


def test_one_process_per_store(tmp_path: Path):
    store = MemoryStore(tmp_path, deployment(), "x = 1\n")
    with pytest.raises(MemoryStoreError, match=rf"open in another process \(PID {os.getpid()}\)"):
        MemoryStore(tmp_path, deployment(), "x = 1\n")
    store.close()
    MemoryStore(tmp_path, deployment(), "x = 1\n").close()


def test_drop_last_takes_back_the_last_append(tmp_path: Path):
    path = tmp_path / "log"
    log, _ = SessionLog.open(path)
    log.append(seg(0))
    size = path.stat().st_size
    log.append(seg(1))
    log.drop_last()
    assert path.stat().st_size == size and log.sessions == [seg(0)] and log.position("s1") is None
    assert log.append(seg(1)) == (1, True)
    assert SessionLog.open(path)[0].sessions == [seg(0), seg(1)]


def test_the_public_api_loads_on_first_use_only():
    """``import evolve.config`` (what the reading commands import) loads no runtime, pipeline
    or host code; ``evolve.open_memory`` loads it."""
    code = (
        "import sys, evolve.config; "
        "assert not {'evolve.runtime.api', 'evolve.evaluation.pipeline'} & set(sys.modules); "
        "import evolve; evolve.open_memory; assert 'evolve.runtime.api' in sys.modules"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
