"""``evolve compare`` never shows a failed question as a plain score: a program whose questions
failed gets a ``failed`` column, one line naming it with the first error, and a program that
failed every question makes the command exit 1 (in ``--json`` mode too)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from evolve.cli.main import main

ROOT = Path(__file__).resolve().parents[1]
SIMPLE = (ROOT / "seeds" / "simple.py").read_text()
# Passes the sandbox (its smoke and probe sessions are small) and fails every question of a
# history whose sessions hold over 40 messages.
BRITTLE = (
    SIMPLE.replace(
        "        self.units.extend(units)\n",
        "        self.units.extend(units)\n        self.long = self.long or len(units) > 40\n",
    )
    .replace(
        "        self.units: list[MemoryUnit] = []\n",
        "        self.units: list[MemoryUnit] = []\n        self.long = False\n",
    )
    .replace(
        "    def retrieve(self, query):\n",
        "    def retrieve(self, query):\n        if self.long:\n"
        '            raise ValueError("brittle: a long session")\n',
    )
)


@pytest.fixture
def one_conv(data_dir: Path, tmp_path: Path) -> Path:
    shutil.copytree(data_dir / "beam" / "chats" / "100K" / "1",
                    tmp_path / "data" / "beam" / "chats" / "100K" / "1")  # fmt: skip
    return tmp_path / "data"


@pytest.mark.parametrize("as_json", [False, True])
def test_a_program_that_fails_every_question_is_named_and_exits_1(
    one_conv: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], as_json: bool
) -> None:
    assert BRITTLE.count("self.long") == 4
    brittle = tmp_path / "brittle.py"
    brittle.write_text(BRITTLE)
    args = ["compare", str(ROOT / "seeds" / "dense.py"), str(brittle), "--split", "all",
            "--data-dir", str(one_conv), "--embedder", "hashing", "--jobs", "1",
            "--cache-dir", str(tmp_path / "c"), "--no-progress"]  # fmt: skip
    code = main(args + (["--json"] if as_json else []))
    out, err = capsys.readouterr()
    assert code == 1, err
    said = [line for line in err.splitlines() if "questions failed" in line]
    assert len(said) == 1 and said[0].startswith("brittle.py: 20 of 20 questions failed"), err
    assert "brittle: a long session" in said[0]
    if as_json:
        rows = json.loads(out)["programs"]
        assert [r["errors"] for r in rows] == [0, 20]
        assert rows[0]["first_error"] is None and "a long session" in rows[1]["first_error"]
    else:
        assert "failed" in out, out  # the column, shown only when a program failed questions
