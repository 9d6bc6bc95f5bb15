"""The backend the sandbox tiers serve a program, and tier 4's verdict: the optimizer's side.

Tiers 3 and 4 drive a program through evaluation's own requests (:mod:`sandbox.tiers`); the
host gives the program the same :class:`sandbox.serve.RemoteBackend` as in an evaluation, and
the optimizer answers its frames here, where the program cannot reach:

- **The backend** (:class:`ProbeBackend`, the host's ``serve`` callback) has the evaluation's
  shape (:class:`BackendShape`: the embedder's dimension, 384 for MiniLM unless the caller says
  otherwise, and the task-LLM call budget) and answers as an offline evaluation's
  :class:`evolve.evaluation.backend.BackendService` does, refusals word for word: ``embed`` at
  most :data:`MAX_EMBED_TEXTS` strings and :data:`MAX_REPLY_BYTES` of rows, ``complete``
  refused with :data:`OFFLINE_COMPLETE`, any other method refused. Its rows are float32,
  L2-normalised, and drawn to have the statistics of MiniLM rows of a real conversation
  rather than of isotropic gaussians: a shared mean direction and a decaying spectrum in a
  random basis. A text's row is that mean plus :data:`PICKS` rows of a bank of
  :data:`BANK_ROWS`, picked by a min-hash of its words, so texts sharing words have close
  rows, equal texts equal rows. On 400 LoCoMo messages these rows have a mean of norm 0.51,
  pairwise cosines 0.26 ± 0.12, top components 8.4 %, 7.3 %, 5.5 % of the variance;
  all-MiniLM-L6-v2's rows of the same messages 0.52, 0.27 ± 0.14 and 7.8 %, 6.1 %, 5.5 %
  (isotropic gaussian rows: 0.05, 0.00 ± 0.05, under 1 %). Bank, basis, mean and hash salt
  are drawn afresh for every check: no row can be known in advance. Embedding 2,600 texts
  takes about 0.05 s. Calls and texts are counted here (:meth:`ProbeBackend.take`).
- **CPU time** is read from the kernel's accounting of the host process
  (:meth:`sandbox.isolate.Host.cpu_seconds`, ``/proc/<pid>/stat``) before and after each run,
  so a program that stops or rewinds a clock inside the host changes nothing.

The verdict (:func:`judge`): the program fails when a full run costs over :data:`CPU_BUDGET_S`,
when multiplying the units by :data:`GROWTH_SIZES` multiplies its CPU time by more than
:data:`GROWTH_LIMIT` per doubling while the full run costs over :data:`GROWTH_FLOOR_S` (below
that floor timings are too small to be told apart from noise, and too small to matter), when
backend calls grow faster than the sessions, or embedded texts faster than the units (by more
than :data:`TEXTS_GROWTH`). Runs at full size and at 1/:data:`GROWTH_SIZES` of it follow an
untimed warm-up run. The verdict is robust to a busy machine: growth per doubling is measured
over a fourfold size step (its square root), so a load factor L on one run moves it by √L, not
L; and a verdict in doubt (growth over :data:`GROWTH_DOUBT`; linear work measures 1.6-2.4) is
measured again, both sizes alternately, up to :data:`GROWTH_REPEATS` times while the probe
stays within :data:`REPEAT_WALL_S` of wall clock, keeping each size's cheapest run. Purely
linear work stays under the limit and purely quadratic work over it with any one run slowed by
up to :data:`LOAD_TOLERANCE`.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from zlib import crc32 as _crc32

import numpy as np

from contract.types import BackendError
from sandbox.wire import pack_array

PROBE_UNITS = 2000
CPU_BUDGET_S = 20.0
GROWTH_LIMIT = 3.0  # per doubling: linear work doubles (2x), quadratic quadruples (4x)
GROWTH_FLOOR_S = 0.5
GROWTH_SIZES = 4  # the small run has a quarter of the units: 2 doublings
GROWTH_DOUBT = 2.5  # growth per doubling over this is measured again
GROWTH_REPEATS = 3  # measurements per size at most, when the verdict is in doubt
REPEAT_WALL_S = 60.0  # no repetition that would end later than this after the probe started
LOAD_TOLERANCE = 1.7  # any single run may be this much slower (busy machine), verdicts hold
TEXTS_GROWTH = 2.0  # embedded texts may grow this much faster than the units, no more

# What evaluation runs with by default (evolve.models.embed.Embedder.dim, all-MiniLM-L6-v2;
# evolve.evaluation.setup.EvalSetup.max_complete_calls), and how its backend service refuses
# (evolve.evaluation.backend imports the last three; tests/test_verdicts.py checks the first two).
EVAL_DIM = 384
EVAL_COMPLETE_CALLS = 8
MAX_EMBED_TEXTS = 16_384
MAX_REPLY_BYTES = 64 << 20
OFFLINE_COMPLETE = "backend.complete: no task LLM is configured (offline mode)"

BANK_ROWS = 4096
PICKS = 6  # bank rows summed per text, one per min-hashed word
MIN_WORD = 4  # words shorter than this are not picked (the, of, I)
MEAN_WEIGHT = 0.55  # the shared direction's weight against the bank rows' unit spread
SPECTRUM = (2.0, 0.5)  # component i of the spread has scale (offset + i) ** -power


def embed_texts(header: dict[str, Any], dim: int) -> list[str]:
    """The texts of a backend ``embed`` request, refused as evaluation's backend service and
    the tiers' backend both refuse it: not a list of strings, or more texts than
    :data:`MAX_EMBED_TEXTS` or than rows of ``dim`` floats :data:`MAX_REPLY_BYTES` holds."""
    texts = header.get("texts")
    if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
        raise TypeError("backend.embed takes a list of strings")
    most = min(MAX_EMBED_TEXTS, MAX_REPLY_BYTES // (4 * dim))
    if len(texts) > most:
        raise ValueError(f"backend.embed: at most {most} texts per call")
    return texts


class ProbeFailure(Exception):
    """The program failed the probe's rule; the message says which, for a model to repair."""


@dataclass(frozen=True)
class BackendShape:
    """What the program's backend looks like: the embedder's dimension and the number of task
    LLM calls a request may make, both as the evaluation it is checked for will have them."""

    dim: int = EVAL_DIM
    max_complete_calls: int = EVAL_COMPLETE_CALLS

    def limits(self) -> dict[str, int]:
        """The ``open``/``restore`` request's fields (as
        :class:`evolve.evaluation.pipeline.Pipeline`)."""
        return {"dim": self.dim, "max_complete_calls": self.max_complete_calls}


@dataclass
class ProbeBackend:
    """Answers the host's ``backend`` frames in tiers 3 and 4 (see the module docstring);
    ``seed`` None draws a fresh one."""

    dim: int = EVAL_DIM
    seed: int | None = None
    embed_calls: int = 0
    texts: int = 0
    _bank: np.ndarray = field(init=False, repr=False)
    _mean: np.ndarray = field(init=False, repr=False)
    _salt: int = field(init=False, repr=False)

    def __post_init__(self) -> None:
        rng = np.random.default_rng(self.seed)
        offset, power = SPECTRUM
        scales = (offset + np.arange(self.dim)) ** -power
        scales *= 1.0 / (np.sqrt((scales**2).sum()) * math.sqrt(PICKS))  # a sum of PICKS rows
        basis = np.linalg.qr(rng.standard_normal((self.dim, self.dim)))[0]
        self._bank = ((rng.standard_normal((BANK_ROWS, self.dim)) * scales) @ basis.T).astype(
            np.float32
        )
        mean = rng.standard_normal(self.dim)
        self._mean = (mean * (MEAN_WEIGHT / np.linalg.norm(mean))).astype(np.float32)
        self._salt = int(rng.integers(1 << 32))

    def serve(self, header: dict[str, Any], _: list[bytes]) -> tuple[dict[str, Any], list[bytes]]:
        method = header.get("method")
        if method == "embed":
            texts = embed_texts(header, self.dim)
            self.embed_calls += 1
            self.texts += len(texts)
            meta, blob = pack_array(self.embed(texts))
            return {"array": meta}, [blob]
        if method == "complete":
            raise BackendError(OFFLINE_COMPLETE)
        raise ValueError(f"unknown backend method {method!r}")

    def embed(self, texts: list[str]) -> np.ndarray:
        """One float32, L2-normalised row per text (see the module docstring)."""
        picks = np.empty((len(texts), PICKS), dtype=np.int64)
        salt = self._salt
        for i, text in enumerate(texts):
            words = {w for w in text.lower().split() if len(w) >= MIN_WORD}
            # crc32 seeded by the salt: stable across processes (hash() of a str is not)
            keys = sorted({_crc32(w.encode(), salt) for w in words})[:PICKS]
            while len(keys) < PICKS:  # fewer words than picks
                keys.append(_crc32(f"{len(keys)} {text}".encode(), salt))
            picks[i] = keys
        picks %= BANK_ROWS
        out = np.repeat(self._mean[None, :], len(texts), axis=0)
        for k in range(PICKS):
            out += self._bank[picks[:, k]]
        out /= np.linalg.norm(out, axis=1, keepdims=True)
        return out

    def take(self) -> dict[str, int]:
        """The counts since the last call, reset."""
        counts = {"embed_calls": self.embed_calls, "texts": self.texts}
        self.embed_calls = self.texts = 0
        return counts


Run = Callable[[int], dict[str, float]]  # units -> cpu_s, sessions, embed_calls, texts


def judge(run: Run, units: int = PROBE_UNITS) -> dict[str, Any]:
    """Warm up, measure both sizes (again while in doubt) and give the verdict: the result,
    or :class:`ProbeFailure` with a repair hint."""
    started = time.monotonic()
    run(max(1, units // 20))  # warm-up, not judged
    runs: dict[str, list[dict[str, float]]] = {"small": [], "full": []}
    sizes = {"small": units // GROWTH_SIZES, "full": units}

    def measure() -> float:
        began = time.monotonic()
        for name, n in sizes.items():
            runs[name].append(run(n))
        return time.monotonic() - began

    took = measure()
    small, full, growth = _growth(runs)
    while (
        growth > GROWTH_DOUBT
        and GROWTH_FLOOR_S < full["cpu_s"] <= CPU_BUDGET_S
        and len(runs["full"]) < GROWTH_REPEATS
        and time.monotonic() + took - started <= REPEAT_WALL_S
    ):  # a verdict in doubt is worth more measurements: keep each size's cheapest run
        took = measure()
        small, full, growth = _growth(runs)
    result = {"small": small, "full": full, "cpu_growth": round(growth, 2),
              "repeats": len(runs["full"])}  # fmt: skip
    if full["cpu_s"] > CPU_BUDGET_S:
        raise ProbeFailure(
            f"CPU budget exceeded: {full['cpu_s']:.1f} s for {units} units "
            f"(budget {CPU_BUDGET_S} s); make indexing and retrieval cheaper"
        )
    if growth > GROWTH_LIMIT and full["cpu_s"] > GROWTH_FLOOR_S:
        raise ProbeFailure(
            f"super-linear work: doubling the units multiplied CPU time by {growth:.1f}"
            f" ({small['cpu_s']:.2f} s for {sizes['small']} units → {full['cpu_s']:.2f} s"
            f" for {units}); avoid comparing every unit with every other unit"
        )
    sessions = full["sessions"] / max(1, small["sessions"])
    if full["embed_calls"] > sessions * small["embed_calls"] + 4:
        calls = f"{small['embed_calls']} → {full['embed_calls']}"
        raise ProbeFailure(
            f"super-linear backend calls: {calls} embed calls when the units grew "
            f"{GROWTH_SIZES}-fold (sessions {small['sessions']} → {full['sessions']})"
        )
    if full["texts"] > TEXTS_GROWTH * GROWTH_SIZES * small["texts"] + 64:
        texts = f"{small['texts']} → {full['texts']}"
        raise ProbeFailure(
            f"super-linear embedding: {texts} texts embedded when the units grew "
            f"{GROWTH_SIZES}-fold; embed each unit once, in index(), and keep its vector"
        )
    return result


def _growth(runs: dict[str, list[dict[str, float]]]) -> tuple[Any, Any, float]:
    """Each size's cheapest run, and the CPU growth per doubling of the units between them."""
    small = min(runs["small"], key=lambda r: r["cpu_s"])
    full = min(runs["full"], key=lambda r: r["cpu_s"])
    ratio = full["cpu_s"] / max(small["cpu_s"], 1e-3)
    return small, full, ratio ** (1 / math.log2(GROWTH_SIZES))


def fresh_seed() -> int:
    """A seed for one check's backend and conversation, unknown to the program."""
    return random.SystemRandom().getrandbits(62)
