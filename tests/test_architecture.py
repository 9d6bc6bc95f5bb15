"""The architecture contracts (``[tool.importlinter]`` in pyproject.toml) cover the whole package:
every module and subpackage directly under ``evolve/`` sits in one layer, so a new module cannot
escape the layering by not being named (``lint-imports`` in .ci/run checks the imports)."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_top_level_module_of_evolve_is_in_a_layer() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (layers,) = [c["layers"] for c in config["contracts"]
                 if c["type"] == "layers" and "containers" not in c]  # fmt: skip
    named = {name.strip() for layer in layers for name in layer.split("|")}
    present = {
        f"evolve.{p.stem if p.is_file() else p.name}"
        for p in (ROOT / "evolve").iterdir()
        if (p.suffix == ".py" and p.name != "__init__.py") or (p / "__init__.py").is_file()
    }
    assert present <= named, sorted(present - named)
    assert {"sandbox", "contract"} <= named
