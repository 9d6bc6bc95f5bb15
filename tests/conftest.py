"""Shared pytest fixtures."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import evolve.models.testing  # noqa: F401  (registers the test doubles in evolve.models.DOUBLES)


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The benchmark data root (holds ``beam/``): ``$EVOLVE_DATA``, else ../shared/data."""
    default = Path(__file__).resolve().parents[1].parent / "shared" / "data"
    path = Path(os.environ.get("EVOLVE_DATA") or default)
    if not path.is_dir():
        pytest.fail(f"benchmark data not found at {path} (set EVOLVE_DATA)")
    return path
