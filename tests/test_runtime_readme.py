"""The README's "Use the evolved program in your agent" section runs as written: its code block,
taken from README.md, runs in a fresh process next to a ``best.py`` that ``evolve export`` wrote
(the hybrid seed of a run), and prints the context that holds what was added."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from evolve.cli.main import main
from evolve.config import RunConfig
from evolve.evolution.store import RunStore

ROOT = Path(__file__).resolve().parents[1]
SECTION = "## Use the evolved program in your agent"


def readme_block() -> tuple[str, int]:
    """The section's python block and the section's length in lines (heading to last line)."""
    text = (ROOT / "README.md").read_text()
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"```python\n(.*?)```", section, re.S)
    return block, len((SECTION + section).rstrip().splitlines())


def test_the_readme_section_runs_as_written(tmp_path: Path, data_dir: Path):
    code, lines = readme_block()
    assert lines <= 20
    seed = ROOT / "seeds" / "hybrid.py"
    config = RunConfig(data_dir=str(data_dir), seed_program=str(seed),
                       cache_dir=str(tmp_path / "cache"), embedder="minilm")  # fmt: skip
    store = RunStore.create(tmp_path / "runs", {"config": config.as_json()}, run_id="readme")
    meta = store.add_candidate(seed.read_text(), parents=[], stage="seed", capability=None,
                               message="seed hybrid.py")  # fmt: skip
    work = tmp_path / "agent"
    work.mkdir()
    assert main(["export", f"readme/{meta.id}", "--out", str(work / "best.py"),
                 "--runs-dir", str(tmp_path / "runs")]) == 0  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code], cwd=work, env=env, capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "Lyon" in done.stdout and "old town" in done.stdout, done.stdout
    notices = done.stderr.strip().splitlines()
    assert notices and all(line.startswith("runtime: ") for line in notices), done.stderr
    assert (work / "memstore" / "manifest.json").is_file()
