"""``evolve report --out`` writes only to a regular file or a new path: a FIFO, a symbolic link,
a device or a folder there is refused in one error line and left as it was (an atomic rename
would have replaced it with a regular file)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from evolve.cli.main import main
from evolve.evolution.store import RunStore

RUN = "reported"


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    RunStore.create(tmp_path / "runs", {"config": {}}, run_id=RUN)
    return tmp_path / "runs"


def report(runs: Path, out: Path | str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(["report", RUN, "--runs-dir", str(runs), "--out", str(out)])
    return code, capsys.readouterr().err


def test_a_fifo_is_refused_and_kept(runs: Path, tmp_path: Path, capsys) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    code, err = report(runs, fifo, capsys)
    assert code == 2 and err.count("error:") == 1 and "a FIFO" in err, err
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_a_symlink_is_refused_and_its_target_untouched(runs: Path, tmp_path: Path, capsys) -> None:
    target = tmp_path / "precious.txt"
    target.write_text("keep me")
    link = tmp_path / "link.html"
    link.symlink_to(target)
    code, err = report(runs, link, capsys)
    assert code == 2 and "symbolic link" in err, err
    assert link.is_symlink() and target.read_text() == "keep me"


def test_a_device_is_refused(runs: Path, tmp_path: Path, capsys) -> None:
    device = tmp_path / "null"  # a device node of our own: a broken check must not hit /dev/null
    try:
        os.mknod(device, stat.S_IFCHR | 0o600, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("making a device node needs root")
    code, err = report(runs, device, capsys)
    assert code == 2 and "device" in err, err
    assert stat.S_ISCHR(os.lstat(device).st_mode)


def test_a_regular_file_or_a_new_path_is_written(runs: Path, tmp_path: Path, capsys) -> None:
    for out in (tmp_path / "new.html", tmp_path / "new.html"):  # new, then a regular file
        code, err = report(runs, out, capsys)
        assert code == 0, err
        assert out.read_text().lstrip().lower().startswith("<!doctype html")
