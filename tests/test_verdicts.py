"""A program cannot tell the sandbox tiers from an evaluation by its backend, so it cannot behave
well only where it is watched (sandbox/tiers.py, sandbox/probe.py).

The tiers give a program the evaluation's backend class, dimension, call budget and answers
(refusals word for word), with rows whose statistics resemble MiniLM's: a program that reads
every backend tell-tale in a check and in an offline evaluation (:class:`evolve.evaluation.pipeline.
Pipeline`) sees the same values, and a quadratic program that would behave linearly only
under the probe's backend is rejected.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import unchecked

from contract.types import BackendError, Message, Segment
from evolve.evaluation.backend import MAX_EMBED_TEXTS, MAX_REPLY_BYTES, BackendService
from evolve.evaluation.pipeline import Pipeline
from evolve.evaluation.setup import EvalSetup
from evolve.models.embed import Embedder, HashingEmbedder
from sandbox import probe, tiers
from sandbox.check import check_program
from sandbox.isolate import ProgramFailure

MINIMAL = (Path(__file__).parent / "fixtures" / "minimal_program.py").read_text()


def test_the_tiers_defaults_and_refusals_are_evaluations() -> None:
    assert probe.EVAL_DIM == Embedder.dim
    assert probe.EVAL_COMPLETE_CALLS == EvalSetup("", None).max_complete_calls
    assert (probe.MAX_EMBED_TEXTS, probe.MAX_REPLY_BYTES) == (MAX_EMBED_TEXTS, MAX_REPLY_BYTES)
    served, service = probe.ProbeBackend(seed=1), BackendService(HashingEmbedder(), None, "t", 8)
    for header in (
        {"method": "complete", "prompt": "hi", "max_tokens": 5},
        {"method": "embed", "texts": "not a list"},
        {"method": "embed", "texts": ["x"] * (MAX_EMBED_TEXTS + 1)},
        {"method": "forget"},
    ):
        errors = []
        for serve in (served.serve, service):
            with pytest.raises(Exception) as raised:
                serve(header, [])
            errors.append((type(raised.value), str(raised.value)))
        assert errors[0] == errors[1], header
    assert errors[0][0] is not BackendError or "offline mode" in errors[0][1]


def rows_of(texts: list[str]) -> np.ndarray:
    return probe.ProbeBackend(seed=3).embed(texts)


def test_probe_rows_look_like_sentence_embeddings_not_gaussians() -> None:
    """Measured on 400 LoCoMo messages with all-MiniLM-L6-v2: mean row norm 0.52, mean pairwise
    cosine 0.27, top components 8 %, 6 %, 6 % of the variance; isotropic gaussian rows have a
    mean near 0, cosines near 0, and no component over 1 %."""
    conversation = tiers.SyntheticConversation.draw(400, seed=5)
    texts = [m.text() for s in conversation.sessions for m in s.messages]
    rows = rows_of(texts)
    assert rows.dtype == np.float32 and rows.shape == (400, probe.EVAL_DIM)
    assert np.allclose(np.linalg.norm(rows, axis=1), 1.0, atol=1e-5)
    cos = (rows @ rows.T)[np.triu_indices(len(rows), 1)]
    spectrum = np.linalg.svd(rows - rows.mean(0), compute_uv=False) ** 2
    assert 0.35 < np.linalg.norm(rows.mean(0)) < 0.65
    assert 0.15 < cos.mean() < 0.35 and cos.std() > 0.08
    assert 0.04 < spectrum[0] / spectrum.sum() < 0.2
    again = rows_of(["the budget meeting moved to Friday", "the budget meeting moved to Monday"])
    other = rows_of(["the budget meeting moved to Friday", "my cat painted a guitar in Oslo"])
    assert float(again[0] @ again[1]) > float(other[0] @ other[1])  # shared words: closer rows
    assert np.array_equal(rows_of(["same text"]), rows_of(["same text"]))


# Everything a program can read of its backend, raised as the error of its first retrieve.
DETECTOR_TOP = """
import numpy as np


def tell_tales(backend):
    seen = {"class": type(backend).__name__, "dim": backend.dim,
            "budget": backend.max_complete_calls}
    rows = backend.embed(["one text", "another text"])
    seen["rows"] = (type(rows).__name__, str(rows.dtype), rows.shape[1], rows.flags.writeable,
                    rows.flags.c_contiguous, round(float(np.linalg.norm(rows[0])), 3))
    seen["empty"] = backend.embed([]).shape
    try:
        backend.complete("Say hello.")
        seen["complete"] = "answered"
    except Exception as exc:
        seen["complete"] = (type(exc).__name__, str(exc))
    try:
        backend.embed([3])
    except Exception as exc:
        seen["embed_int"] = (type(exc).__name__, str(exc))
    names = ("dim", "max_complete_calls", "calls", "seconds", "texts", "embed_calls", "model")
    seen["attributes"] = [n for n in names if hasattr(backend, n)]
    return seen
"""
IMPORTS = "from dataclasses import dataclass\n"
DETECTOR = MINIMAL.replace(IMPORTS, IMPORTS + DETECTOR_TOP).replace(
    "    def retrieve(self, query):\n",
    "    def retrieve(self, query):\n        raise ValueError(repr(tell_tales(self.backend)))\n",
)


def test_a_smoke_tier_detector_learns_nothing() -> None:
    report = check_program(DETECTOR, "detector.py")
    failure = report.failure
    assert failure is not None and failure.tier == 3, report.repair_text()
    in_check = failure.error
    pipeline = Pipeline(unchecked(DETECTOR, "detector.py"), llm=None, embedder=HashingEmbedder(),
                        call_prefix="test", max_complete_calls=8, call_timeout=30.0)  # fmt: skip
    segment = Segment("1", "2024-03-01", (Message("1:0", "user", "I moved the budget meeting."),))
    try:
        pipeline.open()
        pipeline.add(segment, pipeline.extract(segment))
        with pytest.raises(ProgramFailure) as raised:
            pipeline.retrieve(pipeline.plan("When is the budget meeting?", "2024-03-02"))
    finally:
        pipeline.close()
    assert "RemoteBackend" in str(raised.value) and "offline mode" in str(raised.value)
    assert in_check == str(raised.value)


def test_the_checked_backend_has_the_callers_dimension() -> None:
    source = MINIMAL.replace(
        "        self.units = []\n",
        "        self.units = []\n        if backend.dim != 512:\n"
        "            raise ValueError(f'built for 512 dimensions, given {backend.dim}')\n",
    )
    assert check_program(source, "wide.py", backend=probe.BackendShape(dim=512)).passed
    report = check_program(source, "wide.py")
    assert report.failure is not None and "given 384" in (report.failure.error or "")


# Quadratic work (each unit's row against every row before it, one Python-level product per
# pair, as a red team's program did) done only where the backend does not look watched.
HIDING_TOP = """
import numpy as np


def watched(backend, rows):
    tells = [backend.dim != 384, type(backend).__name__ != "RemoteBackend"]
    try:
        backend.complete("ping")
    except Exception as exc:
        tells.append("offline mode" not in str(exc))
    if len(rows) > 2:  # isotropic gaussian rows: cosines near 0, no shared direction
        cos = rows @ rows.T
        tells.append(float(cos[np.triu_indices(len(rows), 1)].mean()) < 0.1)
    return any(tells)
"""
HIDING = (
    MINIMAL.replace(IMPORTS, IMPORTS + HIDING_TOP)
    .replace("        self.units = []\n", "        self.units = []\n        self.vecs = []\n")
    .replace(
        "        self.units.extend(units)\n",
        """        if not units:
            return
        rows = self.backend.embed([u.content for u in units])
        linear = watched(self.backend, rows)
        for row in rows:
            if not linear:
                for other in self.vecs:
                    float(row @ other)
            self.vecs.append(row)
        self.units.extend(units)
""",
    )
)


def test_a_quadratic_program_hiding_from_the_probe_is_rejected() -> None:
    report = check_program(HIDING, "hiding.py")
    failure = report.failure
    assert failure is not None and failure.tier == 4, report.repair_text()
    assert failure.rule in ("probe", "timeout"), report.repair_text()
