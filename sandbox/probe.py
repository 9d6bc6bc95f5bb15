"""Sandbox tier 4, the complexity probe, judged from outside the host.

The host only runs the program (:func:`sandbox.tiers.probe_run`: index :data:`PROBE_UNITS`
synthetic units over :data:`PROBE_BATCHES` batches, answer two queries); everything the verdict
rests on lives here, in the optimizer, where the program cannot reach it:

- **CPU time** is read from the kernel's accounting of the host process
  (:meth:`sandbox.isolate.Host.cpu_seconds`, ``/proc/<pid>/stat``) before and after each run,
  so a program that stops or rewinds a clock inside the host changes nothing.
- **Embeddings** come from :class:`ProbeBackend`, served over the wire: deterministic
  :data:`PROBE_DIM`-dimensional pseudo-embeddings, each text's the normalised sum of three rows
  of a fixed gaussian bank (:data:`BANK_ROWS` rows) picked by the text's hash. Its calls and
  texts are counted here, and its work is done here, so it is not in the host's CPU time.

The verdict (:func:`judge`): the program fails when a full run costs over :data:`CPU_BUDGET_S`,
when doubling the units multiplies its CPU time by more than :data:`GROWTH_LIMIT` while the full
run costs over :data:`GROWTH_FLOOR_S` (below that floor timings are too small to be told apart
from noise, and too small to matter), or when backend calls grow faster than the units. Runs
at full size and at 1/:data:`GROWTH_SIZES` of it follow an untimed warm-up run. The verdict is
robust to a busy machine: growth per doubling is measured over a fourfold size step (its square
root), so a load factor L on one run moves it by √L, not L; and a verdict in doubt (growth over
:data:`GROWTH_DOUBT`; linear work measures 1.9-2.4) is measured again, both sizes alternately,
up to :data:`GROWTH_REPEATS` times while the probe stays within :data:`REPEAT_WALL_S` of wall
clock, keeping each size's cheapest run. Purely linear work stays under the limit and purely
quadratic work over it with any one run slowed by up to :data:`LOAD_TOLERANCE`.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from sandbox.wire import pack_array

PROBE_UNITS = 2000
PROBE_BATCHES = 100
PROBE_DIM = 4096
CPU_BUDGET_S = 20.0
GROWTH_LIMIT = 3.0  # per doubling: linear work doubles (2x), quadratic quadruples (4x)
GROWTH_FLOOR_S = 0.5
GROWTH_SIZES = 4  # the small run has a quarter of the units: 2 doublings
GROWTH_DOUBT = 2.5  # growth per doubling over this is measured again
GROWTH_REPEATS = 3  # measurements per size at most, when the verdict is in doubt
REPEAT_WALL_S = 60.0  # no repetition that would end later than this after the probe started
LOAD_TOLERANCE = 1.7  # any single run may be this much slower (busy machine), verdicts hold
MAX_TEXTS = 4 * PROBE_UNITS  # most texts one embed request may carry
BANK_ROWS = 256  # a text's vector sums three rows picked by its hash's bytes: 256**3 vectors


class ProbeFailure(Exception):
    """The program failed the probe's rule; the message says which, for a model to repair."""


@dataclass
class ProbeBackend:
    """Pseudo-embeddings for the host's ``embed`` requests, counted where the program cannot
    reach: ``serve`` is the :class:`sandbox.isolate.Host` callback."""

    dim: int = PROBE_DIM
    embed_calls: int = 0
    texts: int = 0

    def __post_init__(self) -> None:
        rows = np.random.default_rng(0).standard_normal((BANK_ROWS, self.dim))
        self._bank = rows.astype(np.float32)

    def serve(self, header: dict[str, Any], _: list[bytes]) -> tuple[dict[str, Any], list[bytes]]:
        texts = header.get("texts")
        if header.get("method") != "embed" or not isinstance(texts, list):
            raise ProbeFailure("the probe's backend answers embed only; no task LLM in the sandbox")
        if len(texts) > MAX_TEXTS or not all(type(t) is str for t in texts):
            raise ProbeFailure(f"backend.embed takes a list of at most {MAX_TEXTS} strings")
        self.embed_calls += 1
        self.texts += len(texts)
        digests = b"".join(hashlib.blake2b(t.encode(), digest_size=3).digest() for t in texts)
        picks = np.frombuffer(digests, dtype=np.uint8).reshape(len(texts), 3)
        out = self._bank[picks[:, 0]] + self._bank[picks[:, 1]] + self._bank[picks[:, 2]]
        out /= np.maximum(np.linalg.norm(out, axis=1, keepdims=True), np.float32(1e-12))
        meta, blob = pack_array(out)
        return {"array": meta}, [blob]

    def take(self) -> dict[str, int]:
        """The counts since the last call, reset."""
        counts = {"embed_calls": self.embed_calls, "texts": self.texts}
        self.embed_calls = self.texts = 0
        return counts


Run = Callable[[int, int], dict[str, float]]  # (units, batches) -> cpu_s, embed_calls, texts


def judge(run: Run, units: int = PROBE_UNITS, batches: int = PROBE_BATCHES) -> dict[str, Any]:
    """Warm up, measure both sizes (again while in doubt) and give the verdict: the result,
    or :class:`ProbeFailure` with a repair hint."""
    started = time.monotonic()
    run(max(1, units // 20), max(1, batches // 20))  # warm-up, not judged
    runs: dict[str, list[dict[str, float]]] = {"small": [], "full": []}
    sizes = {"small": (units // GROWTH_SIZES, batches // GROWTH_SIZES), "full": (units, batches)}

    def measure() -> float:
        began = time.monotonic()
        for name, (n, b) in sizes.items():
            runs[name].append(run(n, b))
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
            f" ({small['cpu_s']:.2f} s for {sizes['small'][0]} units → {full['cpu_s']:.2f} s"
            f" for {units}); avoid comparing every unit with every other unit"
        )
    if full["embed_calls"] > GROWTH_SIZES * small["embed_calls"] + 4:
        calls = f"{small['embed_calls']} → {full['embed_calls']}"
        raise ProbeFailure(
            f"super-linear backend calls: {calls} embed calls when the units grew "
            f"{GROWTH_SIZES}-fold"
        )
    return result


def _growth(runs: dict[str, list[dict[str, float]]]) -> tuple[Any, Any, float]:
    """Each size's cheapest run, and the CPU growth per doubling of the units between them."""
    small = min(runs["small"], key=lambda r: r["cpu_s"])
    full = min(runs["full"], key=lambda r: r["cpu_s"])
    ratio = full["cpu_s"] / max(small["cpu_s"], 1e-3)
    return small, full, ratio ** (1 / math.log2(GROWTH_SIZES))
