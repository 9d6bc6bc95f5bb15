"""Every numeric flag has an upper bound (what the machine, the model or the data allows), and
an empty ``--rounds`` or ``--split`` is refused rather than read as the default: each bad value
is one ``error:`` line naming the flag, exit status 2, before any work starts."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from evolve.cli.common import JOBS_PER_CPU
from evolve.cli.main import main
from evolve.models import cores

ROOT = Path(__file__).resolve().parents[1]
DENSE = str(ROOT / "seeds" / "dense.py")
EVAL = ["eval", "--program", DENSE, "--embedder", "hashing", "--no-progress"]
RUN = ["run", "--embedder", "hashing", "--no-progress", "--dry-run"]

# (command line, the flag the one error line must name)
TOO_MUCH: list[tuple[list[str], str]] = [
    ([*EVAL, "--jobs", "1000000000"], "--jobs"),
    ([*EVAL, "--jobs", str(JOBS_PER_CPU * cores.count() + 1)], "--jobs"),
    ([*EVAL, "--llm-timeout", "1e300"], "--llm-timeout"),
    ([*EVAL, "--llm-timeout", "3601"], "--llm-timeout"),
    ([*EVAL, "--llm-concurrency", "1000000000"], "--llm-concurrency"),
    ([*EVAL, "--task-max-tokens", "1000000000"], "--task-max-tokens"),
    ([*EVAL, "--conversations", "1000000000"], "--conversations"),
    ([*EVAL, "--split", ""], "--split"),
    ([*EVAL, "--model", "openai/m", "--api-base", "not-a-url"], "--api-base"),
    ([*EVAL, "--api-base", "ftp://host/v1"], "--api-base"),
    ([*EVAL, "--split", "  "], "--split"),
    (["compare", "--split", "", "--no-progress"], "--split"),
    ([*RUN, "--children", "1000000000"], "--children"),
    ([*RUN, "--children", "65"], "--children"),
    ([*RUN, "--minibatch", "1000000000"], "--minibatch"),
    ([*RUN, "--rounds", ""], "--rounds"),
    ([*RUN, "--rounds", "2,6,1000000000"], "--rounds"),
    ([*RUN, "--repairs", "1000000000"], "--repairs"),
    ([*RUN, "--coder-max-tokens", "1000000000"], "--coder-max-tokens"),
    ([*RUN, "--max-tokens", "1" + "0" * 20], "--max-tokens"),
    ([*RUN, "--conversations", "1000000000"], "--conversations"),
    ([*RUN, "--jobs", "1000000000"], "--jobs"),
    ([*RUN, "--llm-timeout", "inf"], "--llm-timeout"),
    (["freeze", "some-run", "--jobs", "1000000000"], "--jobs"),
    (["report", "some-run", "--watch", "1000000000"], "--watch"),
]


@pytest.mark.parametrize(("argv", "flag"), TOO_MUCH, ids=[" ".join(a[3:]) for a, _ in TOO_MUCH])
def test_out_of_bounds_is_one_line(
    argv: list[str], flag: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # no data where the command would look: a bound that is missing cannot start real work
    where = ["--runs-dir", str(tmp_path / "runs"), "--data-dir", str(tmp_path / "no-data")]
    code = main([*argv, *where] if argv[0] in ("eval", "run", "compare") else argv)
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and flag in lines[0], err
    assert "Traceback" not in err
    assert not (tmp_path / "runs").exists()  # refused before any work


def test_the_bounds_let_the_largest_allowed_values_through() -> None:
    """The bounds refuse only what is out of range: the largest allowed values parse."""
    from evolve.cli.main import build_parser

    most = str(JOBS_PER_CPU * cores.count())
    args = build_parser().parse_args(
        [*EVAL, "--jobs", most, "--llm-timeout", "3600", "--llm-concurrency", "1024",
         "--conversations", "1000000", "--split", "valid"]
    )  # fmt: skip
    assert (args.jobs, args.llm_timeout, args.llm_concurrency) == (int(most), 3600.0, 1024)
    args = build_parser().parse_args([*RUN, "--children", "64", "--rounds", "0,0,1000"])
    assert args.children == 64 and args.rounds == "0,0,1000"


@pytest.fixture
def one_conv(data_dir: Path, tmp_path: Path) -> Path:
    """A data root holding one BEAM-100K conversation."""
    src = data_dir / "beam" / "chats" / "100K" / "1"
    shutil.copytree(src, tmp_path / "data" / "beam" / "chats" / "100K" / "1")
    return tmp_path / "data"


def test_more_conversations_than_the_split_holds_is_one_line(
    one_conv: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The data's bound: ``--conversations 5`` on a split of one conversation is refused (it
    silently read the whole split before), naming what the split holds."""
    code = main([*EVAL, "--bench", "beam", "--split", "all", "--data-dir", str(one_conv),
                 "--conversations", "5", "--runs-dir", str(tmp_path / "runs"),
                 "--cache-dir", str(tmp_path / "cache")])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2
    assert [line for line in err.splitlines() if line.startswith("error:")] == [
        "error: --conversations 5: beam all holds 1 conversations (use at most that, or 'all')"
    ]
