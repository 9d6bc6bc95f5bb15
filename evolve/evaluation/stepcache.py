"""Step reuse: cache keys over the component fingerprints, and the step store.

A step is one of the pipeline's cached computations (extract, index, plan, retrieve, answer),
not an evolution stage (:mod:`evolve.evolution.stages`). Owns the step cache's layout: keys and
folders are derived here only (docs/design.md §2); the fingerprints are
:mod:`sandbox.fingerprint`'s:

1. :class:`StepKeys` — cache keys that chain each step's fingerprint with every upstream key,
   the model signature, the pipeline version and a digest of the input data, so a key changes
   whenever anything that could change the output changes.
2. :class:`StepStore` — an on-disk store of step outputs, one folder per pipeline version
   under each step (:func:`stale_folders` and :func:`step_usage` find the others), each written by
   :func:`evolve.files.write_atomic`. Memory state is stored as the bytes of
   :mod:`contract.state` (pickled and unpickled only in the sandbox host). Failures are never
   stored. Every read checks the shape of what it reads (:data:`SHAPES`: extract a list of unit
   records, plan a query record, retrieve the retrieval record, answer a string; index state a
   complete pickle stream) and its checksum: each entry is written framed, one header line
   ``prismem-stage sha256=<hex>`` over the payload that follows (:func:`frame`), and a read
   whose payload does not hash to its header (an edit, even one that leaves valid JSON; an
   entry from before checksums) is invalid like a wrong shape: a miss, reported to
   ``on_invalid``, recomputed by the caller and overwritten.
3. :func:`program_steps` — a program's keys and the store they address, from the setup an
   evaluation runs with: what every reader and writer of the step cache opens it with.

On disk the store keeps the names it was first written with, so existing caches stay readable:
it lives at ``<cache>/stages`` (:func:`step_root`; one folder per step below), and the entry
header reads ``prismem-stage``.
"""

from __future__ import annotations

import hashlib
import json
import pickletools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

from evolve.files import write_atomic
from sandbox.fingerprint import digest


@dataclass(frozen=True)
class StepKeys:
    """Cache keys for one program under one model configuration."""

    fp: dict[str, str]
    model_sig: str  # "offline" or the task model id and parameters
    embed_sig: str  # the embedder's name: index state contains its vectors
    pipeline_version: str  # the pipeline version: what the pipeline adds to outputs

    def _key(self, step: str, *parts: Any) -> str:
        return digest(step, self.fp[step], self.pipeline_version, *parts)

    def extract(self, segment_digest: str) -> str:
        return self._key("extract", self.model_sig, segment_digest)

    def index(self, extract_keys: list[str]) -> str:
        return self._key("index", self.embed_sig, extract_keys)

    def plan(self, question: str, question_date: str | None) -> str:
        return self._key("plan", self.model_sig, question, question_date)

    def retrieve(self, index_key: str, plan_key: str) -> str:
        return self._key("retrieve", index_key, plan_key)

    def answer(self, retrieve_key: str, question: str) -> str:
        return self._key("answer", self.model_sig, retrieve_key, question)


# --- the store ---------------------------------------------------------------------------


class _Retrieved(BaseModel):
    """A stored retrieval (what :mod:`evolve.evaluation.conversation` records for one question)."""

    model_config = ConfigDict(strict=True)
    retrieved: str
    over_budget: bool
    raw_chars: int
    retrieve_ms: float | None = None


_STRICT = ConfigDict(strict=True)
SHAPES: dict[str, TypeAdapter[Any]] = {  # what a JSON entry of each step must be
    "extract": TypeAdapter(list[dict[str, Any]], config=_STRICT),
    "plan": TypeAdapter(dict[str, Any], config=_STRICT),
    "retrieve": TypeAdapter(_Retrieved),
    "answer": TypeAdapter(str, config=_STRICT),
}


# An entry's header line; on disk it keeps the old word "stage" for a step, so stored entries read.
_HEADER = b"prismem-stage sha256="


def frame(payload: bytes) -> bytes:
    """An entry as stored: the checksum header line, then ``payload``."""
    return _HEADER + hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload


def unframe(data: bytes) -> bytes | None:
    """The payload of a stored entry, or None when its header is missing or its checksum does
    not match the payload."""
    head, newline, payload = data.partition(b"\n")
    if not newline or not head.startswith(_HEADER):
        return None
    if head[len(_HEADER) :] != hashlib.sha256(payload).hexdigest().encode():
        return None
    return payload


def _complete_pickle(data: bytes) -> bool:
    """Whether ``data`` is one whole pickle stream (opcodes are read, nothing is built)."""
    try:
        return any(op.name == "STOP" for op, _, _ in pickletools.genops(data))
    except Exception:  # pickletools raises ValueError, and others on garbage
        return False


def version_folder(version: str) -> str:
    """The folder under each step that holds the entries of pipeline version ``version``
    (``""``: none, the entries lie directly under the step, as tests may keep them)."""
    return f"v-{version[:16]}" if version else ""


@dataclass(frozen=True)
class StepUsage:
    """What a step store holds on disk: bytes and entries of the current pipeline version, and
    of every other one (which no current pipeline version reads)."""

    current_bytes: int = 0
    current_entries: int = 0
    stale_bytes: int = 0
    stale_entries: int = 0


def _tree(path: Path) -> tuple[int, int]:
    files = [f for f in path.rglob("*") if f.is_file() and not f.is_symlink()]
    return sum(f.stat().st_size for f in files), len(files)


def stale_folders(root: Path, version: str) -> list[Path]:
    """The folders under ``root``'s step folders that hold entries pipeline version
    ``version`` does not read: other versions' folders and entries of the layout before version
    folders (two-character key prefixes directly under a step)."""
    keep = version_folder(version)
    out: list[Path] = []
    for step in sorted(p for p in Path(root).glob("*") if p.is_dir() and not p.is_symlink()):
        out += [p for p in sorted(step.iterdir()) if p.is_dir() and p.name != keep]
    return out


def step_usage(root: Path, version: str) -> StepUsage:
    """Bytes and entries under ``root`` readable by ``version`` and not (:func:`stale_folders`)."""
    stale = [_tree(p) for p in stale_folders(root, version)]
    current = [_tree(step / version_folder(version)) for step in Path(root).glob("*")
               if (step / version_folder(version)).is_dir()]  # fmt: skip
    return StepUsage(sum(b for b, _ in current), sum(n for _, n in current),
                      sum(b for b, _ in stale), sum(n for _, n in stale))  # fmt: skip


class StepStore:
    """Step outputs on disk: JSON for records and texts, bytes for memory state.

    Entries live in one folder per pipeline version under each step (``version``:
    :func:`evolve.evaluation.identity.pipeline_version`, which every key carries too), so the
    entries no current pipeline version reads can be found and pruned (``evolve cache``;
    :func:`stale_folders`).

    With ``reuse=False`` the store still writes every output (so trusted-side readers such as
    compact cases find them) but reads back only what this instance wrote: nothing computed by
    another evaluation is reused (``evolve run --no-reuse``, the baseline reuse is measured by).
    A read that finds an entry of the wrong shape (:data:`SHAPES`) returns None and calls
    ``on_invalid(step)``.
    """

    def __init__(
        self,
        root: Path,
        *,
        version: str = "",
        reuse: bool = True,
        on_invalid: Callable[[str], None] | None = None,
    ) -> None:
        self.root = Path(root)
        self.folder = version_folder(version)  # entries of this pipeline version live here
        self._own: set[Path] | None = None if reuse else set()
        self._on_invalid = on_invalid or (lambda _step: None)

    def _path(self, step: str, key: str, suffix: str) -> Path:
        return self.root / step / self.folder / key[:2] / f"{key}{suffix}"

    def _readable(self, path: Path) -> bool:
        return self._own is None or path in self._own

    def has(self, step: str, key: str) -> bool:
        return any(
            self._readable(path) and path.exists()
            for path in (self._path(step, key, suffix) for suffix in (".json", ".bin"))
        )

    def get_json(self, step: str, key: str) -> Any | None:
        path = self._path(step, key, ".json")
        if not self._readable(path):
            return None
        try:
            payload = unframe(path.read_bytes())
            if payload is None:  # edited, torn or from before checksums
                raise ValueError("checksum")
            value = json.loads(payload)
        except FileNotFoundError:
            return None
        except ValueError:  # its checksum fails, not JSON, or not UTF-8
            self._on_invalid(step)
            return None
        try:
            if step in SHAPES:
                SHAPES[step].validate_python(value)
        except ValidationError:
            self._on_invalid(step)
            return None
        return value

    def put_json(self, step: str, key: str, value: Any) -> None:
        self._write(self._path(step, key, ".json"), json.dumps(value).encode())

    def get_bytes(self, step: str, key: str) -> bytes | None:
        path = self._path(step, key, ".bin")
        if not self._readable(path):
            return None
        try:
            data = unframe(path.read_bytes())
        except FileNotFoundError:
            return None
        if data is None or not _complete_pickle(data):
            self._on_invalid(step)
            return None
        return data

    def put_bytes(self, step: str, key: str, value: bytes) -> None:
        self._write(self._path(step, key, ".bin"), value)

    def _write(self, path: Path, data: bytes) -> None:
        if self._own is not None:
            self._own.add(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, frame(data))


# The step store's folder under a cache folder; on disk it keeps the old word "stages" for the
# steps, so existing caches read.
STEPS_FOLDER = "stages"


def step_root(cache_dir: str | Path) -> Path:
    """The step store's folder under the cache folder ``cache_dir``."""
    return Path(cache_dir) / STEPS_FOLDER


class StepSetup(Protocol):
    """What the step cache reads of an evaluation's setup
    (:class:`evolve.evaluation.setup.EvalSetup`)."""

    @property
    def cache_dir(self) -> str: ...
    @property
    def model_sig(self) -> str: ...
    @property
    def embedder(self) -> str: ...


def program_steps(
    setup: StepSetup,
    fingerprints: Mapping[str, str],
    version: str,
    *,
    reuse: bool = True,
    on_invalid: Callable[[str], None] | None = None,
) -> tuple[StepKeys, StepStore]:
    """The step keys of the program with these component ``fingerprints`` under ``setup``'s
    models and pipeline ``version``, and the step store they address in ``setup``'s cache
    folder (``reuse`` and ``on_invalid`` as :class:`StepStore` takes them)."""
    keys = StepKeys(dict(fingerprints), setup.model_sig, setup.embedder, version)
    store = StepStore(step_root(setup.cache_dir), version=version, reuse=reuse,
                      on_invalid=on_invalid)  # fmt: skip
    return keys, store
