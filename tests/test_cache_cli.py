"""``evolve cache``: sizes, and pruning exactly the step outputs no current pipeline version
reads."""

from __future__ import annotations

from pathlib import Path

import pytest

from evolve.cli.main import main
from evolve.evaluation.identity import pipeline_version
from evolve.evaluation.stepcache import StepStore


def test_cache_shows_sizes_and_prunes_only_other_versions(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stages = tmp_path / "stages"
    current = StepStore(stages, version=pipeline_version())
    current.put_json("answer", "ab" * 32, "kept")
    current.put_bytes("index", "cd" * 32, b"state")
    StepStore(stages, version="0" * 64).put_json("answer", "ef" * 32, "an old release's")
    StepStore(stages).put_json("plan", "12" * 32, {"text": "before version folders"})
    (tmp_path / "llm-cache.sqlite").write_bytes(b"x" * 2048)

    assert main(["cache", "--cache-dir", str(tmp_path)]) == 0
    shown = capsys.readouterr().out
    assert "this pipeline version: 2 entries" in shown
    assert "other versions (unreadable now): 2 entries" in shown and "llm-cache.sqlite" in shown
    assert len([f for f in stages.rglob("*") if f.is_file()]) == 4  # nothing removed

    assert main(["cache", "--cache-dir", str(tmp_path), "--prune"]) == 0
    assert "pruned 2 entries" in capsys.readouterr().out
    assert sorted(f.suffix for f in stages.rglob("*") if f.is_file()) == [".bin", ".json"]
    assert current.get_json("answer", "ab" * 32) == "kept"
    assert (tmp_path / "llm-cache.sqlite").exists()
    assert main(["cache", "--cache-dir", str(tmp_path / "none")]) == 2
    assert "no cache folder" in capsys.readouterr().err
