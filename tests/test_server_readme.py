"""The README's "Serve it to any agent" section runs as written: its bash block, unchanged, in a
folder holding a ``best.py`` (the hybrid seed, as ``evolve export`` would have written one), then
the background server is stopped with SIGTERM. The block must end with a context that holds
what it added, and the server must stop cleanly."""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SECTION = "## Serve it to any agent"
PORT = 8765  # the README's


def readme_block() -> str:
    text = (ROOT / "README.md").read_text()
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"```bash\n(.*?)```", section, re.S)
    return block


def test_the_readme_section_runs_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    with socket.socket() as probe:
        if probe.connect_ex(("127.0.0.1", PORT)) == 0:
            pytest.fail(f"port {PORT} is taken: the README's server cannot start")
    shutil.copy(ROOT / "seeds" / "hybrid.py", tmp_path / "best.py")
    monkeypatch.setenv("PRISMEM_CACHE", str(tmp_path / "cache"))
    script = readme_block() + 'kill -TERM %1\nwait %1\necho "server exit $?"\n'
    done = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    health, rest = done.stdout.split("}", 1)  # the replies are JSON objects, one after another
    added, rest = rest.split("}", 1)
    assert '"status":"ok"' in health and '"added":true' in added, done.stdout
    assert "Lyon" in rest and rest.endswith("server exit 0\n"), done.stdout
    assert (tmp_path / "memstore" / "manifest.json").is_file()
