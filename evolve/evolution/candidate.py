"""One candidate's record and its files: :class:`CandidateMeta`, the keys its score blocks
are filed under (:data:`TRAIN`, :data:`VALID`, :data:`MINIBATCH`, :data:`TEST`; a guard's key
is :mod:`evolve.benches.guards`'), and the rules by which a
candidate's ``.json`` and ``.py`` are read or judged damaged (:class:`DamagedFile`).

Invariants (the run store's, :mod:`evolve.evolution.store`, relies on them):
- A ``.json`` is a candidate only if it validates as :class:`CandidateMeta` and names itself:
  its file stem, its ``id`` and ``c<number>-<sha256[:8]>`` agree (:func:`parse_meta`).
- A ``.json`` written by the store carries a checksum of its fields (:func:`sealed`); one
  whose fields do not match it (an edit, even to valid JSON) is damaged. A record without one
  (a run from before checksums) is read as it is.
- A ``.py`` is a candidate's source only if its sha256 is the one its record holds
  (:func:`source_problem`). Every problem is one line naming the file.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator

from evolve.config import SPLITS, STAGES
from evolve.datasets.types import CAPABILITIES
from evolve.evaluation.report import ScoreBlock
from evolve.models import why

TRAIN, VALID = SPLITS  # the keys of a candidate's blocks on the run's splits
MINIBATCH = "minibatch"  # the key of its cascade screen's block (evolve.evolution.cascade)
TEST = "test"  # the key of a frozen candidate's test block (evolve.evolution.freeze)
ORIGINS = ("seed", *STAGES)  # what a candidate's ``stage`` names: the seed, or its evolution stage
STATUSES = ("proposed", "rejected", "evaluated", "failed", "stopped")  # stopped: by the cascade
_ALLOWED = {"stage": ORIGINS, "status": STATUSES, "capability": (*CAPABILITIES, None)}


class DamagedFile(ValueError):
    """A run file is there but cannot be read as what it should hold; the message names it."""


class CandidateMeta(BaseModel):
    """What the store knows about one candidate; the ``.json`` file holds exactly this."""

    model_config = ConfigDict(extra="forbid")

    id: str  # "c0007-<first 8 hex of the source sha256>"
    number: int  # 0-based creation order
    parents: list[str]
    stage: str
    capability: str | None  # the target capability, one of CAPABILITIES
    message: str  # one line
    source_sha256: str
    status: str
    sandbox: dict[str, Any] | None  # the sandbox report (CheckReport.as_json())
    # TRAIN, VALID, MINIBATCH, a guard's key (evolve.benches.guards) or test -> its block
    scores: dict[str, ScoreBlock]
    usage: dict[str, Any]  # tokens and cost spent producing and evaluating it
    seconds: float
    created: float  # unix time
    frozen: bool = False
    attempts: list[str] = []  # why each earlier attempt of its round failed (repair feedback)
    cascade: dict[str, Any] | None = None  # its minibatch screen (evolve.evolution.cascade)
    # the guard tests it met when it won valid (evolve.evolution.archive.GuardCheck.as_json)
    guards: list[dict[str, Any]] = []
    # rebuilt from its intact source after its record was damaged: scored again on resume
    recovered: bool = False
    checksum: str = ""  # sha256 of every other field (meta_checksum); "" in older runs

    @field_validator("stage", "status", "capability")
    @classmethod
    def _known(cls, value: str | None, info: ValidationInfo) -> str | None:
        allowed = _ALLOWED[str(info.field_name)]
        if value not in allowed:
            raise ValueError(f"unknown {info.field_name} {value!r}; expected one of {allowed}")
        return value

    @field_validator("message")
    @classmethod
    def _one_line(cls, value: str) -> str:
        return " ".join(value.split())


def meta_checksum(meta: CandidateMeta) -> str:
    """The sha256 of a record's fields but ``checksum``, as canonical JSON."""
    fields = meta.model_dump(mode="json", exclude={"checksum"})
    canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def sealed(meta: CandidateMeta) -> CandidateMeta:
    """``meta`` with its checksum set (what the store writes)."""
    return meta.model_copy(update={"checksum": meta_checksum(meta)})


def parse_meta(path: Path, data: bytes) -> CandidateMeta:
    try:
        meta = CandidateMeta.model_validate_json(data)
    except ValueError as exc:  # pydantic's ValidationError included
        raise DamagedFile(f"candidate file {path} is damaged ({why(exc)})") from None
    if meta.checksum and meta.checksum != meta_checksum(meta):
        raise DamagedFile(f"candidate file {path} is damaged (edited: its fields do not match "
                          "its checksum)")  # fmt: skip
    expected = f"c{meta.number:04d}-{meta.source_sha256[:8]}"
    if not path.stem == meta.id == expected:
        raise DamagedFile(f"candidate file {path} is damaged (it describes {meta.id!r})")
    return meta


def read_meta(path: Path) -> CandidateMeta:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise DamagedFile(f"candidate file {path} is unreadable ({why(exc)})") from None
    return parse_meta(path, data)


def source_problem(path: Path, meta: CandidateMeta) -> str | None:
    """Why the candidate's ``.py`` at ``path`` cannot be used, or None when it is its
    recorded source."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return f"candidate source {path} is missing"
    except OSError as exc:
        return f"candidate source {path} is unreadable ({why(exc)})"
    if hashlib.sha256(data).hexdigest() != meta.source_sha256:
        return f"candidate source {path} is damaged (not the source its sha256 records)"
    return None
