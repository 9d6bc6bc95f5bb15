"""No channel between two users of one runtime through a cache (:mod:`evolve.runtime.scopes`):
a program running for one user that asks for another user's texts (embeddings, task-model
prompts) gets cache misses, and the time it measures for them is that of texts nobody sent; one
user's use does not evict another's entries; an earlier store's shared caches are not read.

The probing program times ``backend.embed`` and ``backend.complete`` itself (``datetime``, which
the sandbox allows); every other measure here is on the trusted side, by counting what reached
the encoder or the model (a miss) per text."""

from __future__ import annotations

import hashlib
import json
import re
import sqlite3
import statistics
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import MINIMAL

import evolve
from evolve.evaluation.setup import EvalSetup
from evolve.models import embed
from evolve.models.embed import Embedder, HashingEmbedder
from evolve.models.llm import ModelConfig
from evolve.models.testing import task_script
from evolve.runtime.store import scope_key

# Embeds every unit it indexes (and, with ASK, sends it to the task model); a query
# ``probe:{"embed": [...], "complete": [...]}`` makes retrieve ask for each text in its own call
# and return the seconds each call took, as the program measures them.
INDEX = """    def index(self, units, segment):
        self.units.extend(units)
"""
PROBE_INDEX = """    def index(self, units, segment):
        self.backend.embed([u.content for u in units])
        for u in units:
            if ASK:
                try:
                    self.backend.complete("note: " + u.content)
                except Exception:  # the sandbox's check has no task model
                    pass
"""
RETRIEVE = """    def retrieve(self, query):
        return "\\n".join(u.content for u in self.units)[:16000]"""
PROBE_RETRIEVE = """    def retrieve(self, query):
        if not query.text.startswith("probe:"):
            return ""
        asked = json.loads(query.text[6:])
        spent = []
        for text in asked.get("embed", []):
            began = datetime.datetime.now()
            self.backend.embed([text])
            spent.append((datetime.datetime.now() - began).total_seconds())
        for prompt in asked.get("complete", []):
            began = datetime.datetime.now()
            self.backend.complete(prompt)
            spent.append((datetime.datetime.now() - began).total_seconds())
        return json.dumps(spent)"""
PROBE = "import datetime\nimport json\n\nASK = False\n" + MINIMAL.replace(
    INDEX, PROBE_INDEX
).replace(RETRIEVE, PROBE_RETRIEVE)
assert PROBE_INDEX in PROBE and PROBE_RETRIEVE in PROBE
DELAY = 0.004  # seconds the slowed hashing double takes to encode one text (a miss)


def probe(
    memory: Any, user: str, *, texts: Sequence[str] = (), prompts: Sequence[str] = ()
) -> list[float]:
    """The seconds each of ``user``'s program's calls for ``texts`` and ``prompts`` took."""
    asked = json.dumps({"embed": list(texts), "complete": list(prompts)})
    return [float(s) for s in json.loads(memory.context("probe:" + asked, user=user))]


def opened(
    tmp_path: Path, setup: EvalSetup, notices: list[str] | None = None, ask: bool = False
) -> Any:
    prog = tmp_path / "probe.py"
    prog.write_text(PROBE.replace("ASK = False", f"ASK = {ask}"))
    said = notices if notices is not None else []
    return evolve.open_memory(prog, tmp_path / "store", setup=setup, notice=said.append)


def secret(k: int) -> str:
    return f"ana's secret number {k} is " + " ".join(f"a{k}w{j}" for j in range(12))


def unseen(k: int) -> str:
    return f"nobody's text number {k} is " + " ".join(f"n{k}w{j}" for j in range(12))


class SlowTokens:
    """The hashing double's tokenizer, slowed by :data:`DELAY` per text and counting the texts
    it tokenizes: a text the double encodes (a miss of its row cache) is counted and slow, a
    text served from a cache is neither."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.real = re.compile(r"\w+")

    def findall(self, text: str) -> list[str]:
        self.seen.append(text)
        time.sleep(DELAY)
        return self.real.findall(text)

    def count(self, text: str) -> int:
        return self.seen.count(text.lower())


@pytest.fixture
def slow_tokens(monkeypatch: pytest.MonkeyPatch) -> Iterator[SlowTokens]:
    tokens = SlowTokens()
    monkeypatch.setattr(embed, "_TOKEN", tokens)
    yield tokens


@pytest.fixture
def encoded(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """MiniLM's embedder with its disk cache but no model: each text it encodes (a miss of the
    cache file) is listed and gets the hashing double's row."""
    texts: list[str] = []
    rows = HashingEmbedder(dim=Embedder.dim)

    def fake(self: Embedder, batch: list[str]) -> np.ndarray:
        texts.extend(batch)
        return rows._encode(batch)

    monkeypatch.setattr(Embedder, "_encode", fake)
    return texts


def offline(tmp_path: Path, embedder: str) -> EvalSetup:
    return EvalSetup(cache_dir=str(tmp_path / "store" / "cache"), task_model=None,
                     embedder=embedder, call_prefix="runtime")  # fmt: skip


def cached_texts(path: Path) -> set[str]:
    if not path.exists():
        return set()
    with sqlite3.connect(path) as conn:
        return {row[0] for row in conn.execute("SELECT text_sha256 FROM embeddings")}


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def test_another_users_texts_are_misses_and_take_as_long_as_unseen_ones(
    tmp_path: Path, slow_tokens: SlowTokens
):
    """Deterministic: each of ana's texts is encoded again when bob's program asks for it.
    Statistical: the time bob's program measures for ana's texts is that of texts nobody sent
    (before each user had caches of their own: ~0.1 ms against ~DELAY)."""
    trials = 12
    with opened(tmp_path, offline(tmp_path, "hashing")) as memory:
        memory.add([{"content": secret(k)} for k in range(trials)], user="ana")
        memory.add([{"content": "bob's own text"}], user="bob")
        probe(memory, "bob", texts=["warm up"])
        theirs, never = [], []
        for k in range(trials):
            anas, nobodys = f"user: {secret(k)}", unseen(k)  # an offline unit: "role: text"
            pair = [anas, nobodys] if k % 2 else [nobodys, anas]
            spent = dict(zip(pair, probe(memory, "bob", texts=pair), strict=True))
            theirs.append(spent[anas])
            never.append(spent[nobodys])
    assert all(slow_tokens.count(f"user: {secret(k)}") == 2 for k in range(trials)), (
        "ana's texts were served to bob's program from a cache"
    )
    mid_theirs, mid_never = statistics.median(theirs), statistics.median(never)
    assert mid_never >= DELAY, never  # the probe sees a miss's cost
    assert 0.5 < mid_theirs / mid_never < 2, (theirs, never)


def test_the_embedding_cache_file_is_the_users_own(tmp_path: Path, encoded: list[str]):
    """MiniLM's disk cache: each user's texts are in a file in their own scope folder, and bob's
    program asking for ana's texts gets them encoded (misses of bob's file)."""
    notices: list[str] = []
    with opened(tmp_path, offline(tmp_path, "minilm"), notices) as memory:
        memory.add([{"content": secret(k)} for k in range(3)], user="ana")
        memory.add([{"content": "bob's own text"}], user="bob")
        store = tmp_path / "store"
        ana, bob = (store / "scopes" / scope_key(u) / "embeddings.sqlite" for u in ("ana", "bob"))
        theirs = {sha(f"user: {secret(k)}") for k in range(3)}
        assert theirs <= cached_texts(ana) and not theirs & cached_texts(bob)
        assert not (store / "cache" / "embeddings.sqlite").exists()
        probe(memory, "bob", texts=[f"user: {secret(k)}" for k in range(3)])
    assert all(encoded.count(f"user: {secret(k)}") == 2 for k in range(3)), encoded
    assert theirs <= cached_texts(bob)  # now bob's own, from bob's own request
    assert not any("earlier" in n for n in notices), notices


def test_another_users_task_model_replies_are_not_served(tmp_path: Path):
    """The request cache: a prompt ana's program sent, or a question ana asked, reaches the task
    model again when bob's program sends it or bob asks it."""
    sent: list[str] = []

    def script(role: str, purpose: str, messages: list[dict[str, Any]]) -> str:
        sent.append(str(messages[-1].get("content", "")))
        return task_script(role, purpose, messages)

    setup = EvalSetup(cache_dir=str(tmp_path / "store" / "cache"), embedder="hashing",
                       task_model=ModelConfig(model="scripted"), script=script,
                       call_prefix="runtime")  # fmt: skip
    with opened(tmp_path, setup, ask=True) as memory:
        memory.add([{"content": secret(k)} for k in range(3)], user="ana")
        memory.context("where does ana live?", user="ana")
        notes = [p for p in sent if p.startswith("note: ")]
        assert len(notes) == 3
        probe(memory, "bob", prompts=notes)
        memory.context("where does ana live?", user="bob")
        assert all(sent.count(p) == 2 for p in notes), sent
        plans = [p for p in sent if "where does ana live?" in p]
        assert len(plans) == 2 and plans[0] == plans[1], plans


def test_one_user_filling_a_cache_does_not_evict_anothers_entries(
    tmp_path: Path, slow_tokens: SlowTokens, monkeypatch: pytest.MonkeyPatch
):
    """A bounded in-memory cache (the hashing double's rows, here 4) is the user's own: ana
    adding many texts does not push bob's out, so bob's hit does not tell him ana was busy."""
    monkeypatch.setattr(HashingEmbedder, "rows_cached", 4)
    with opened(tmp_path, offline(tmp_path, "hashing")) as memory:
        probe(memory, "bob", texts=["bob's kept text"])
        memory.add([{"content": secret(k)} for k in range(10)], user="ana")
        probe(memory, "bob", texts=["bob's kept text"])
    assert slow_tokens.count("bob's kept text") == 1, slow_tokens.seen


def test_an_earlier_stores_shared_caches_are_not_read(tmp_path: Path, encoded: list[str]):
    """A store made when the runtime had one embedding cache for every user still opens; that
    file (which holds ana's text) is never read, and the runtime says so once."""
    legacy = tmp_path / "store" / "cache" / "embeddings.sqlite"
    legacy.parent.mkdir(parents=True)
    Embedder(cache_path=legacy).embed([f"user: {secret(0)}"])
    notices: list[str] = []
    with opened(tmp_path, offline(tmp_path, "minilm"), notices) as memory:
        probe(memory, "bob", texts=[f"user: {secret(0)}"])
    assert encoded.count(f"user: {secret(0)}") == 2, encoded
    said = [n for n in notices if "embeddings.sqlite" in n]
    assert len(said) == 1 and "every user" in said[0], notices
