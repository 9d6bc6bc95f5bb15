"""numpy inside the sandbox host works as a program expects (:mod:`sandbox.host`).

numpy's C code imports its own private helpers on first use (``x.sum()`` needs
``numpy._core._methods``) and some on every use (``str(x.dtype)``: ``numpy._core._dtype``),
through the calling program's ``__import__``, which refuses private modules. A program that
summed an array or printed one failed the smoke tier with "import of 'numpy._core._methods' is
not allowed". The host uses those helpers once before any program runs, and its import guard
admits the reviewed per-use ones (:data:`sandbox.surface.NUMPY_RUNTIME_IMPORTS`). Hosts with and
without the on-demand libraries (:data:`sandbox.surface.LOADED_ON_DEMAND`) both hold.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sandbox.check import check_program
from sandbox.static import imported_modules

DENSE = (Path(__file__).resolve().parents[1] / "seeds" / "dense.py").read_text()
USES = """        x = scores
        used = [x.max(), x.min(), x.sum(), x.prod(), x.mean(), x.std(), x.var(), x.any(),
                x.all(), x.clip(0, 1), x.round(2), x.cumsum(), np.median(x), np.unique(x),
                str(x), repr(x), str(x.dtype), repr(x.dtype), f"{x[0]:.3f}", str(np.float32(1.5)),
                repr(np.zeros(2, dtype=[("a", "f4"), ("b", "i4")]))]
        if len(used) != 21:
            return ""
"""
ANCHOR = "        k = min(TOP_K, len(scores))\n"


@pytest.mark.parametrize("with_bm25s", [False, True], ids=["lean-host", "bm25s-host"])
def test_a_program_sums_and_prints_arrays_in_the_host(with_bm25s: bool) -> None:
    source = DENSE.replace(ANCHOR, USES + ANCHOR, 1)
    if with_bm25s:
        source = source.replace("import numpy as np\n", "import bm25s\nimport numpy as np\n", 1)
    assert ("bm25s" in imported_modules(source)) is with_bm25s
    report = check_program(source, "numpy_uses.py")
    assert report.passed, report.repair_text()
