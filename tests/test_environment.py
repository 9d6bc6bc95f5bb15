"""The folder settings (evolve/environment.py): ``PRISMEM_DATA``, ``PRISMEM_RUNS`` and
``PRISMEM_CACHE``; the ``EVOLVE_`` names are read for this release with one warning line, and
the new name wins when both are set. Every reader asks :func:`evolve.environment.folder`."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from evolve import environment
from evolve.cli.common import data_dir, default_cache_dir
from evolve.cli.main import build_parser
from evolve.environment import folder

ROOT = Path(__file__).resolve().parents[1]
NAMES = ("DATA", "RUNS", "CACHE")
# bench/identical.py drives only the command line, so that it records any version of the code:
# it imports nothing of PrisMem and reads PRISMEM_DATA itself
OWN_READERS = {"environment.py", "test_environment.py", "identical.py"}


@pytest.fixture
def clean(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No folder setting in the environment, and no warning given yet in this process."""
    for name in NAMES:
        monkeypatch.delenv(f"PRISMEM_{name}", raising=False)
        monkeypatch.delenv(f"EVOLVE_{name}", raising=False)
    monkeypatch.setattr(environment, "_warned", set())
    return monkeypatch


def test_the_old_name_is_read_with_one_warning_line_once(
    clean: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    clean.setenv("EVOLVE_DATA", str(tmp_path))
    clean.setenv("EVOLVE_CACHE", str(tmp_path / "cache"))
    clean.setenv("EVOLVE_RUNS", str(tmp_path / "runs"))
    assert data_dir(None) == tmp_path and data_dir(None) == tmp_path
    assert default_cache_dir() == tmp_path / "cache"
    runs = build_parser().parse_args(["runs"]).runs_dir
    assert runs == tmp_path / "runs"
    warnings = capsys.readouterr().err.splitlines()
    assert warnings == [
        f"warning: EVOLVE_{name} is read for this release only; set PRISMEM_{name} instead"
        for name in ("DATA", "CACHE", "RUNS")
    ]


def test_the_new_name_wins_and_warns_nothing(
    clean: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in NAMES:
        clean.setenv(f"EVOLVE_{name}", str(tmp_path / "old"))
        clean.setenv(f"PRISMEM_{name}", str(tmp_path / name.lower()))
    assert [folder(name) for name in NAMES] == [str(tmp_path / n.lower()) for n in NAMES]
    assert default_cache_dir() == tmp_path / "cache"
    assert build_parser().parse_args(["runs"]).runs_dir == tmp_path / "runs"
    assert capsys.readouterr().err == ""


def test_unset_or_empty_is_none(clean: pytest.MonkeyPatch) -> None:
    clean.setenv("PRISMEM_DATA", "")
    assert [folder(name) for name in NAMES] == [None, None, None]


def test_only_the_environment_module_reads_the_folder_settings() -> None:
    """No other reader of these variables in the code, the bench scripts or the tests."""
    pattern = re.compile(r"(EVOLVE|PRISMEM)_(DATA|RUNS|CACHE)\b")
    readers = []
    for folder_name in ("evolve", "sandbox", "contract", "bench", "tests"):
        for path in (ROOT / folder_name).rglob("*.py"):
            if path.name in OWN_READERS or "fixtures" in path.parts:
                continue
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if pattern.search(line) and "environ" in line:
                    readers.append(f"{path.relative_to(ROOT)}:{number}")
    assert readers == []
