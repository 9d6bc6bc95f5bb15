"""A regular install carries the seeds and split files.

Builds the wheel from a copy of the source (so the checkout gets no ``build/``), checks what it
holds, and uses it installed with ``pip install --target`` from a folder outside the
repository: ``evolve run --dry-run`` must find its default seed and the split files through
the package (:mod:`evolve.resources`). ``.ci/run`` also runs ``evolve check`` on a shipped seed
from a fresh venv holding the wheel.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from evolve.benches.registry import ENTRIES
from evolve.compare import REFERENCE_PROGRAMS, reference_programs
from evolve.resources import seed_file

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("pyproject.toml", "README.md", "evolve", "sandbox", "contract", "seeds", "splits")


def _pip(*args: str) -> None:
    done = subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src, out = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("wheel")
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    for name in SOURCES:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=ignore)
        else:
            shutil.copy2(path, src / name)
    _pip("wheel", "-q", "--no-deps", "--no-build-isolation", str(src), "-w", str(out))
    (built,) = out.glob("prismem-*.whl")
    return built


def test_the_wheel_holds_seeds_splits_and_every_package(wheel: Path):
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {f"evolve/seeds/{name}.py" for name in REFERENCE_PROGRAMS} <= names
    assert {f"evolve/splits/{bench.name}.json" for bench in ENTRIES} <= names
    shipped = json.loads(zipfile.ZipFile(wheel).read("evolve/splits/beam.json"))
    assert shipped["splits"]["guard"]["n_questions"] > 0  # the default guard's split
    packages = {str(p.relative_to(ROOT)) for top in ("evolve", "sandbox", "contract")
                for p in ROOT.joinpath(top).rglob("__init__.py")}  # fmt: skip
    assert packages and packages <= names  # pyproject lists every package of the tree


def test_an_installed_wheel_runs_from_outside_the_checkout(
    wheel: Path, tmp_path: Path, data_dir: Path
):
    site, elsewhere = tmp_path / "site", tmp_path / "elsewhere"
    elsewhere.mkdir()
    _pip("install", "-q", "--no-deps", "--target", str(site), str(wheel))
    env = {**os.environ, "PYTHONPATH": str(site)}  # before the editable install's finder

    def evolve(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "evolve", *args], cwd=elsewhere,
                              env=env, capture_output=True, text=True)  # fmt: skip

    done = evolve("run", "--dry-run", "--data-dir", str(data_dir.resolve()), "--conversations",
                  "1", "--runs-dir", str(elsewhere / "runs"))  # fmt: skip
    assert done.returncode == 0 and "dry run on beam:" in done.stdout, done.stderr
    # the default guards' split definitions come from the package's splits file
    assert "guard beam:guard@1: 1 conversation, 20 questions" in done.stdout, done.stdout
    assert "guard locomo:all@1: 1 conversation" in done.stdout, done.stdout
    where = subprocess.run(
        [sys.executable, "-c", "import evolve.resources as r; from evolve.datasets import beam; "
         "print(r.__file__); print(r.seed_file('hybrid.py')); print(beam.DEFAULT_SPLITS_FILE)"],
        cwd=elsewhere, env=env, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    assert all(Path(p).is_relative_to(site) and Path(p).is_file() for p in where), where


def test_the_resource_helper_finds_the_shipped_files():
    assert [p.stem for p in reference_programs()] == list(REFERENCE_PROGRAMS)
    assert seed_file("hybrid.py").read_text() == (ROOT / "seeds" / "hybrid.py").read_text()
    assert all(bench.splits_file.is_file() for bench in ENTRIES)


def test_compare_with_nothing_to_compare_is_one_error_line(
    data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
):  # fmt: skip
    import evolve.compare
    from evolve.cli.main import main

    monkeypatch.setattr(evolve.compare, "reference_programs", list)  # no shipped seed found
    code = main(["compare", "--bench", "locomo", "--data-dir", str(data_dir), "--embedder",
                 "hashing", "--cache-dir", str(tmp_path), "--no-progress"])  # fmt: skip
    captured = capsys.readouterr()
    errors = [line for line in captured.err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1 and "nothing to compare" in errors[0], captured
    assert not captured.out
