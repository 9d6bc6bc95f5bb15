"""Forget (:meth:`evolve.runtime.api.AgentMemory.forget`, ``evolve store forget``): after one
session or a whole user is forgotten, no byte of any file under the store (log, snapshots, the
embedding and reply caches with their -wal/-shm files, the call log) holds its text or the
sha256 its embedding is cached under; the memory answers without it; other users' folders are
byte for byte as they were; a crash part way leaves every other session; ``open_memory`` takes
the task model's ``api_base``."""

from __future__ import annotations

import argparse
import hashlib
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import evolve
from evolve.cli.common import UsageError
from evolve.cli.store import add_command, cmd_store
from evolve.evaluation.setup import EvalSetup
from evolve.models.embed import Embedder, HashingEmbedder
from evolve.models.llm import ModelConfig
from evolve.models.testing import task_script
from evolve.runtime import upkeep
from evolve.runtime.store import scope_key

ROOT = Path(__file__).resolve().parents[1]
SIMPLE = ROOT / "seeds" / "dense.py"  # embeds every unit: the embedding cache is used


def text(user: str, k: int) -> str:
    return f"{user} says the token quokka{user}{k}zephyr is theirs"


def marks(user: str, k: int) -> list[bytes]:
    """What would give session ``k`` of ``user`` away: its text, and the sha256 (hex and raw)
    of the unit the embedding cache files it under."""
    unit = f"user: {text(user, k)}"
    digest = hashlib.sha256(unit.encode()).digest()
    return [f"quokka{user}{k}zephyr".encode(), digest.hex().encode(), digest]


def holding(store: Path, needles: list[bytes]) -> list[str]:
    """The files under ``store`` whose bytes hold any of ``needles``."""
    found = []
    for path in sorted(store.rglob("*")):
        if path.is_file():
            data = path.read_bytes()
            if any(n in data for n in needles):
                found.append(str(path.relative_to(store)))
    return found


def folder_bytes(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


@pytest.fixture
def encoded(monkeypatch: pytest.MonkeyPatch) -> None:
    """MiniLM's embedder with its disk cache (per user) but no model: the hashing rows."""
    rows = HashingEmbedder(dim=Embedder.dim)

    def fake(self: Embedder, batch: list[str]) -> np.ndarray:
        return rows._encode(batch)

    monkeypatch.setattr(Embedder, "_encode", fake)


def opened(store: Path) -> Any:
    setup = EvalSetup(cache_dir=str(store / "cache"), embedder="minilm",
                      task_model=ModelConfig(model="scripted"), script=task_script,
                      call_prefix="runtime")  # fmt: skip
    return evolve.open_memory(SIMPLE, store, setup=setup, snapshot_every=1,
                              notice=lambda line: None)  # fmt: skip


def filled(store: Path) -> Any:
    """ana with three sessions, bob with two; each asked once (the caches hold every text);
    closed and reopened, so snapshots and caches are on disk."""
    memory = opened(store)
    for user, n in (("ana", 3), ("bob", 2)):
        for k in range(n):
            memory.add([{"content": text(user, k)}], user=user, session_id=f"{user}-{k}")
        memory.context(f"what is {user}'s token?", user=user)
    memory.close()
    memory = opened(store)
    for user in ("ana", "bob"):
        memory.context(f"what is {user}'s token?", user=user)
    return memory


def test_forgetting_a_session_removes_its_text_from_every_file(tmp_path: Path, encoded: None):
    store = tmp_path / "store"
    memory = filled(store)
    ana, bob = (store / "scopes" / scope_key(u) for u in ("ana", "bob"))
    before = holding(store, marks("ana", 1))  # where the search finds it before the forget
    for part in ("/log", "/llm-cache.sqlite", "/embeddings.sqlite", ".state"):
        assert any(part in f for f in before), (part, before)
    bobs = folder_bytes(bob)
    try:
        assert memory.forget("ana", "ana-1") == 1
        assert holding(store, marks("ana", 1)) == []
        assert [s.session_id for s in memory.history("ana")] == ["ana-0", "ana-2"]
        said = memory.context("what is ana's token?", user="ana")
        assert "quokkaana1zephyr" not in said
        assert "quokkaana0zephyr" in said and "quokkaana2zephyr" in said
        assert memory.forget("ana", "ana-1") == 0  # gone already: nothing to do
        assert folder_bytes(bob) == bobs
        assert "quokkabob1zephyr" in memory.context("what is bob's token?", user="bob")
    finally:
        memory.close()
    assert holding(store, marks("ana", 1)) == []  # closing (snapshots) brought nothing back
    assert holding(store, marks("ana", 0)) != []


def test_forgetting_a_user_removes_their_folder_and_nothing_else(tmp_path: Path, encoded: None):
    store = tmp_path / "store"
    memory = filled(store)
    ana, bob = (store / "scopes" / scope_key(u) for u in ("ana", "bob"))
    bobs = folder_bytes(bob)
    try:
        assert memory.forget("ana") == 3
        assert not ana.exists()
        assert holding(store, [m for k in range(3) for m in marks("ana", k)]) == []
        assert memory.history("ana") == []
        assert "quokkaana" not in memory.context("what is ana's token?", user="ana")
        assert folder_bytes(bob) == bobs
        memory.add([{"content": "ana starts again"}], user="ana", session_id="ana-0")
        assert [s.session_id for s in memory.history("ana")] == ["ana-0"]
    finally:
        memory.close()


def store_cli(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    add_command(parser.add_subparsers(dest="command"))
    return cmd_store(parser.parse_args(["store", *argv]))


def test_the_cli_forgets_in_a_closed_store_and_refuses_an_open_one(tmp_path: Path, encoded: None):
    store = tmp_path / "store"
    memory = filled(store)
    with pytest.raises(UsageError, match="open in another process"):
        store_cli("forget", str(store), "--user", "ana", "--session", "ana-1")
    memory.close()
    assert holding(store, marks("ana", 1))
    assert store_cli("forget", str(store), "--user", "ana", "--session", "ana-1") == 0
    assert holding(store, marks("ana", 1)) == []
    assert store_cli("forget", str(store), "--user", "bob") == 0
    assert not (store / "scopes" / scope_key("bob")).exists()
    with opened(store) as again:
        assert [s.session_id for s in again.history("ana")] == ["ana-0", "ana-2"]
        assert "quokkaana2zephyr" in again.context("what is ana's token?", user="ana")


class Crash(BaseException):
    pass


def test_a_crash_part_way_keeps_every_other_session(
    tmp_path: Path, encoded: None, monkeypatch: pytest.MonkeyPatch
):
    """Killed inside the log's replacement (the snapshots and caches are gone already): the
    old log is whole; the memory rebuilds with every session; a second forget finishes."""
    store = tmp_path / "store"
    memory = filled(store)

    def crash(*_: object, **__: object) -> None:
        raise Crash

    with monkeypatch.context() as patch:
        patch.setattr(upkeep, "rewrite", crash)
        with pytest.raises(Crash):
            memory.forget("ana", "ana-1")
    assert [s.session_id for s in memory.history("ana")] == ["ana-0", "ana-1", "ana-2"]
    said = memory.context("what is ana's token?", user="ana")
    assert all(f"quokkaana{k}zephyr" in said for k in range(3))
    assert memory.forget("ana", "ana-1") == 1
    memory.close()
    assert holding(store, marks("ana", 1)) == []


def test_a_crash_removing_a_forgotten_users_folder_leaves_it_gone(
    tmp_path: Path, encoded: None, monkeypatch: pytest.MonkeyPatch
):
    """The folder leaves scopes/ in one rename: killed after it, the user is gone, and the
    next open of the store removes what was left."""
    store = tmp_path / "store"
    memory = filled(store)

    rmtree = upkeep.shutil.rmtree

    def crash(path: Path, *args: Any, **kw: Any) -> None:
        if Path(path).name.startswith(".tmp-forget-"):
            raise Crash
        rmtree(path, *args, **kw)

    with monkeypatch.context() as patch:
        patch.setattr(upkeep.shutil, "rmtree", crash)
        with pytest.raises(Crash):
            memory.forget("ana")
    memory.close()
    assert not (store / "scopes" / scope_key("ana")).exists()
    assert holding(store, marks("ana", 0))  # in .tmp-forget-*, until the next open
    with opened(store) as again:
        assert holding(store, [m for k in range(3) for m in marks("ana", k)]) == []
        assert again.history("ana") == []


def test_open_memory_passes_api_base_to_the_task_model(tmp_path: Path):
    url = "http://127.0.0.1:8000/v1"
    with evolve.open_memory(SIMPLE, tmp_path / "store", model="openai/local", api_base=url,
                            embedder="hashing", notice=lambda line: None) as memory:  # fmt: skip
        assert memory.setup.task_model is not None
        assert memory.setup.task_model.api_base == url
        assert memory.setup.task_model.model == "openai/local"
    with pytest.raises(evolve.AgentMemoryError, match="api_base"):
        evolve.open_memory(SIMPLE, tmp_path / "store", api_base=url, embedder="hashing")


def test_forget_waits_for_reads_and_other_users_read_on(tmp_path: Path, encoded: None):
    """Threads read ana and bob while ana's session is forgotten: every read succeeds, holds
    the session whole or not at all, and none after the forget returned holds it."""
    store = tmp_path / "store"
    memory = filled(store)
    done = threading.Event()
    seen: dict[str, list[tuple[bool, str]]] = {"ana": [], "bob": []}
    errors: list[BaseException] = []

    def reader(user: str) -> None:
        try:
            while not done.is_set():
                gone = done_forget.is_set()
                seen[user].append((gone, memory.context(f"what is {user}'s token?", user=user)))
        except BaseException as exc:  # noqa: BLE001 (reported below)
            errors.append(exc)

    done_forget = threading.Event()
    threads = [threading.Thread(target=reader, args=(u,)) for u in ("ana", "ana", "bob")]
    for t in threads:
        t.start()

    def until(ready: Callable[[], bool]) -> None:  # a loaded machine reads slowly: wait, bounded
        deadline = time.monotonic() + 30
        while not ready() and time.monotonic() < deadline:
            time.sleep(0.05)

    try:
        until(lambda: len(seen["ana"]) >= 2 and len(seen["bob"]) >= 1)
        assert memory.forget("ana", "ana-1") == 1
        done_forget.set()
        until(lambda: sum(gone for gone, _ in seen["ana"]) >= 2)
    finally:
        done.set()
        for t in threads:
            t.join()
        memory.close()
    assert not errors, errors
    assert all("quokkaana1zephyr" not in said for gone, said in seen["ana"] if gone)
    assert all("quokkaana0zephyr" in said for _, said in seen["ana"])
    assert any(gone for gone, _ in seen["ana"]) and any(not gone for gone, _ in seen["ana"])
    assert all("quokkabob1zephyr" in said for _, said in seen["bob"])
    assert holding(store, marks("ana", 1)) == []
