"""The `evolve` command line: the JSON report end to end, and one-line errors on bad input."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from evolve.cli.main import main
from evolve.cli.run import _kept
from evolve.config import stored_config
from evolve.datasets.slices import write_slice

ROOT = Path(__file__).resolve().parents[1]
DENSE = str(ROOT / "seeds" / "dense.py")


@pytest.fixture
def one_conv(data_dir: Path, tmp_path: Path) -> Path:
    """A data root holding one BEAM-100K conversation (a copy in tmp, for `--split all`)."""
    src = data_dir / "beam" / "chats" / "100K" / "1"
    dst = tmp_path / "data" / "beam" / "chats" / "100K" / "1"
    shutil.copytree(src, dst)
    return tmp_path / "data"


@pytest.fixture(scope="module")
def beam_slice(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data root with every train and valid conversation, cut small (for `run`)."""
    return write_slice(data_dir, tmp_path_factory.mktemp("slice"), messages=12)


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("error:")]


def test_eval_json_report(one_conv: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    code, out, err = run_cli(
        capsys, "eval", "--program", DENSE, "--bench", "beam", "--split", "all",
        "--data-dir", str(one_conv), "--json", "--embedder", "hashing", "--jobs", "1",
        "--runs-dir", str(tmp_path / "runs"), "--cache-dir", str(tmp_path / "cache"),
        "--no-progress",
    )  # fmt: skip
    assert code == 0, err
    assert "offline: retrieval-only" in err and "test double" in err
    report = json.loads(out)
    meta = report["meta"]
    assert meta["bench"] == "beam" and meta["split"] == "all" and meta["questions"] == 20
    assert meta["mode"] == "offline: retrieval-only" and len(meta["program_hash"]) == 64
    assert meta["models"]["task"] is None
    assert set(report["scores"]) == {"overall", "by_capability", "by_type"}
    assert set(report["scores"]["by_capability"]) == {"F", "T", "P", "M", "A"}
    assert len(report["scores"]["by_type"]) == 10
    assert 0.0 < report["scores"]["overall"]["evidence_similarity"] <= 1.0
    overall = report["scores"]["overall"]  # coverage beside its ceiling, in every block
    assert overall["fitness"] == overall["evidence_coverage"] <= overall["ceiling"] <= 1.0
    assert meta["ceiling"]["overall"] == overall["ceiling"] and meta["ceiling"]["budget"] == 16_000
    assert all("ceiling" in b for b in report["scores"]["by_capability"].values())
    assert meta["fitness"]["coverage"] == meta["ceiling"]["fitness_version"]
    assert report["stages"]["retrieve"]["computed"] == 20
    assert report["usage"] == {}
    lines = Path(meta["traces"]).read_text().splitlines()
    assert len(lines) == 20 and "retrieved" in json.loads(lines[0])


@pytest.mark.parametrize(
    ("bench", "data", "types", "questions"),
    [
        ("locomo", None, 5, 199),  # the shipped sample: every category, default split `all`
        ("longmemeval", ROOT / "tests" / "fixtures", 6, 14),  # the fixture, split `all`
    ],
)
def test_eval_other_benchmarks_share_the_json_layout(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], bench: str,
    data: Path | None, types: int, questions: int,
):  # fmt: skip
    split = [] if bench == "locomo" else ["--split", "all"]
    code, out, err = run_cli(
        capsys, "eval", "--program", DENSE, "--bench", bench, *split,
        "--data-dir", str(data or data_dir), "--json", "--embedder", "hashing", "--jobs", "2",
        "--runs-dir", str(tmp_path / "runs"), "--cache-dir", str(tmp_path / "cache"),
        "--no-progress",
    )  # fmt: skip
    assert code == 0, err
    report = json.loads(out)
    assert report["meta"]["bench"] == bench and report["meta"]["questions"] == questions
    assert set(report["scores"]) == {"overall", "by_capability", "by_type"}
    assert len(report["scores"]["by_type"]) == types
    recall = [row["evidence_recall"] for row in report["scores"]["by_type"].values()]
    assert any(r is not None and r > 0 for r in recall)
    assert (
        report["meta"]["judge"]["judge"] is None and "no judge" in report["meta"]["judge"]["note"]
    )


def test_run_no_reuse_recomputes_every_stage(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
):  # fmt: skip
    import sandbox.check
    from evolve.evolution import evaluator, loop
    from evolve.evolution.store import RunStore

    checked: list[str] = []

    def counted(source: str, *args: Any, **kwargs: Any) -> Any:
        checked.append(source)
        return real(source, *args, **kwargs)

    real = sandbox.check.check_program
    for module in (sandbox.check, evaluator, loop):
        monkeypatch.setattr(module, "check_program", counted)
    data = write_slice(data_dir, tmp_path / "data", messages=12)
    runs = tmp_path / "runs"
    code, _, err = run_cli(capsys, "run", "--data-dir", str(data), "--runs-dir", str(runs),
                           "--cache-dir", str(tmp_path / "c"), "--embedder", "hashing",
                           "--rounds", "0,2,0", "--conversations", "1", "--jobs", "1",
                           "--no-progress", "--no-reuse", "--children", "1",
                           "--no-cascade")  # fmt: skip
    assert code == 0, err
    # the run names the seed's constants constant search keeps (extraction and indexing read them)
    assert "but CHUNK_CHARS, CHUNK_OVERLAP (extraction and indexing read them" in " ".join(
        err.split()
    )
    (run,) = runs.iterdir()
    store = RunStore.open(runs, run.name)
    assert store.manifest["config"]["reuse"] is False
    config = stored_config(store.manifest, run.name)
    assert config.index_moves is False and _kept(config.replace(index_moves=True)) == ""
    evaluated = [c for c in store.candidates() if c.status == "evaluated"]
    assert len(evaluated) == 3
    seed = store.source(store.candidates()[0].id)
    assert checked.count(seed) == 1  # before the run is created, and not again by the run
    for c in evaluated:
        for split in ("train", "valid"):
            stages = c.scores[split].steps
            assert all(counts["reused"] == 0 for counts in stages.values()), (c.id, stages)
            assert stages["extract"]["computed"] > 0 and stages["index"]["computed"] == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--data-dir", "/nonexistent/data"], "data directory /nonexistent/data does not exist"),
        (["--split", "nosuch"], "unknown BEAM split 'nosuch'"),
        (["--program", "/nonexistent/prog.py"], "program file /nonexistent/prog.py not found"),
        (["--jobs", "0"], "argument --jobs: must be an integer from 1 to"),
        (["--split", "all:1M"], "no BEAM-1M data"),
    ],
)
def test_eval_bad_input_is_one_error_line(
    one_conv: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
):
    base = {"--program": DENSE, "--split": "all", "--data-dir": str(one_conv)}
    for flag, value in zip(args[::2], args[1::2], strict=True):
        base[flag] = value
    argv = ["eval", *[x for kv in base.items() for x in kv], "--no-progress"]
    code, _, err = run_cli(capsys, *argv)
    assert code == 2
    assert len(error_lines(err)) == 1 and message in error_lines(err)[0], err
    assert "Traceback" not in err


def test_missing_data_dir_setting(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    monkeypatch.delenv("PRISMEM_DATA", raising=False)
    monkeypatch.delenv("EVOLVE_DATA", raising=False)
    code, _, err = run_cli(capsys, "eval", "--program", DENSE)
    assert code == 2 and "pass --data-dir DIR or set PRISMEM_DATA" in error_lines(err)[0]


def test_malformed_benchmark_file(one_conv: Path, capsys: pytest.CaptureFixture[str]):
    (one_conv / "beam" / "chats" / "100K" / "1" / "chat.json").write_text('[{"batch_number": 1,')
    code, _, err = run_cli(capsys, "eval", "--program", DENSE, "--split", "all",
                           "--data-dir", str(one_conv))  # fmt: skip
    assert code == 2
    assert "chat.json: not valid JSON" in error_lines(err)[0]


def test_broken_program_is_refused(
    one_conv: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    bad = tmp_path / "bad.py"
    bad.write_text(Path(DENSE).read_text().replace("class Memory:", "class Memo:"))
    code, _, err = run_cli(capsys, "eval", "--program", str(bad), "--split", "all",
                           "--data-dir", str(one_conv), "--no-progress")  # fmt: skip
    assert code == 2
    assert "sandbox tier 1 (source) failed, rule missing-definition" in error_lines(err)[0]
    assert "'Memory' is not defined" in error_lines(err)[0]


def test_program_failing_every_question_exits_nonzero(  # passes the sandbox, fails on data
    one_conv: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    bad = tmp_path / "crash.py"
    bad.write_text(
        Path(DENSE)
        .read_text()
        .replace(
            "        if not units:",
            "        if len(units) > 30:\n"
            "            raise KeyError('boom')\n"
            "        if not units:",
        )
    )
    code, _, err = run_cli(
        capsys, "eval", "--program", str(bad), "--split", "all", "--data-dir", str(one_conv),
        "--embedder", "hashing", "--runs-dir", str(tmp_path / "runs"),
        "--cache-dir", str(tmp_path / "cache"), "--no-progress",
    )  # fmt: skip
    assert code == 1
    assert "every question failed" in error_lines(err)[0] and "KeyError" in error_lines(err)[0]


def test_check_reports_every_tier(capsys: pytest.CaptureFixture[str]):
    code, out, _ = run_cli(capsys, "check", DENSE, "--json")
    report = json.loads(out)
    assert code == 0 and report["passed"] is True
    assert [t["name"] for t in report["tiers"]] == ["source", "schema", "smoke", "probe"]
    assert all(t["passed"] and t["seconds"] < 10 for t in report["tiers"])


def test_check_fails_with_tier_rule_and_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    bad = tmp_path / "bad.py"
    bad.write_text(
        Path(DENSE).read_text().replace("import numpy as np", "import numpy as np\nimport os")
    )
    code, out, _ = run_cli(capsys, "check", str(bad))
    assert code == 1
    assert "sandbox tier 1 (source) failed, rule import-not-allowed at line" in out
    code, _, err = run_cli(capsys, "check", str(tmp_path / "missing.py"))
    assert code == 2 and "missing.py not found" in error_lines(err)[0]


def test_run_dry_run_estimates_without_running(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    base = ["run", "--dry-run", "--data-dir", str(data_dir), "--conversations", "1",
            "--runs-dir", str(tmp_path), "--rounds", "1,2,1", "--children", "3"]  # fmt: skip
    code, out, _ = run_cli(capsys, *base)
    assert code == 0 and "4 rounds of 3 children, up to 13 evaluations" in out
    assert "costs nothing" in out
    code, out, _ = run_cli(capsys, *base, "--model", "gpt-4o-mini", "--max-usd", "2")
    assert code == 0 and "│ task" in out and "│ coder" in out and "$2" in out
    assert "unknown price" not in out  # litellm's local price map knows this model
    code, out, _ = run_cli(capsys, *base, "--coder", "openai/my-local-model")
    assert code == 0 and "unknown" in out and "│ coder" in out and "│ task" not in out
    assert not list(tmp_path.iterdir())  # nothing was created


def test_run_reads_the_benchs_default_slice_unless_told(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    """BEAM's default run reads the first ``Bench.conversations`` of train and valid, says so and
    stores it; ``--conversations all`` reads the full splits, a count reads that many."""
    from evolve.benches.registry import bench
    from evolve.config import RunConfig
    from evolve.evolution.wiring import task_set

    def questions(conversations: int | None) -> int:
        config = RunConfig(data_dir=str(data_dir), seed_program="x", cache_dir="x",
                           conversations=conversations)  # fmt: skip
        return sum(len(task_set(config, split).questions) for split in ("train", "valid"))

    base = ["run", "--dry-run", "--data-dir", str(data_dir), "--runs-dir", str(tmp_path)]
    default = bench("beam").conversations
    code, out, err = run_cli(capsys, *base)
    said = f"read their first {default} conversations (the default"
    assert code == 0 and said in err and f"of {questions(default)} train+valid" in out
    code, out, err = run_cli(capsys, *base, "--conversations", "all")
    assert code == 0 and said not in err and f"of {questions(None)} train+valid" in out
    assert questions(None) > questions(default)
    code, out, err = run_cli(capsys, *base, "--conversations", "2")
    assert code == 0 and said not in err and f"of {questions(2)} train+valid" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--max-usd", "-1"], "argument --max-usd: must be a number >= 0, got '-1'"),
        (["--max-tokens", "-5"], "--max-tokens: must be an integer from 0 to 1e+15, got '-5'"),
        (["--rounds", "1,2"], "--rounds takes three numbers from 0 to 1000"),
        (["--resume", "no-such-run"], "run 'no-such-run' not found"),
        (["--seed", "missing.py"], "seed program missing.py not found"),
    ],
)
def test_run_bad_flags_are_one_error_line(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str],
    message: str,
):  # fmt: skip
    code, _, err = run_cli(capsys, "run", "--data-dir", str(data_dir), "--runs-dir",
                           str(tmp_path), *args)  # fmt: skip
    assert code == 2 and len(error_lines(err)) == 1 and message in error_lines(err)[0], err


def test_eval_and_compare_read_the_first_conversations(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    """``--conversations N`` scores the split's first N conversations only (a run's slice)."""
    for conv in ("1", "3"):
        shutil.copytree(data_dir / "beam" / "chats" / "100K" / conv,
                        tmp_path / "data" / "beam" / "chats" / "100K" / conv)  # fmt: skip
    common = ("--split", "all", "--data-dir", str(tmp_path / "data"), "--json", "--jobs", "1",
              "--embedder", "hashing", "--cache-dir", str(tmp_path / "c"),
              "--no-progress")  # fmt: skip
    code, out, err = run_cli(capsys, "eval", "--program", DENSE, "--conversations", "1", *common)
    assert code == 0, err
    meta = json.loads(out)["meta"]
    assert (meta["conversations"], meta["questions"]) == (1, 20)
    assert "its first 1 of 2 conversations (20 questions)" in err
    code, out, err = run_cli(capsys, "compare", DENSE, "--conversations", "1", *common)
    assert code == 0, err
    assert json.loads(out)["programs"][0]["latency_questions"] == 20
    code, out, err = run_cli(capsys, "compare", DENSE, "--conversations", "all", *common)
    assert code == 0 and json.loads(out)["programs"][0]["latency_questions"] == 40, err
    code, _, err = run_cli(capsys, "eval", "--program", DENSE, "--conversations", "0", *common)
    assert code == 2 and error_lines(err) and "--conversations" in err


def test_compare_prints_programs_side_by_side(
    one_conv: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    simple = str(ROOT / "seeds" / "simple.py")
    code, out, err = run_cli(
        capsys, "compare", DENSE, simple, "--split", "all", "--data-dir", str(one_conv),
        "--json", "--embedder", "hashing", "--jobs", "1", "--cache-dir", str(tmp_path / "c"),
        "--no-progress",
    )  # fmt: skip
    assert code == 0, err
    rows = json.loads(out)["programs"]
    assert [Path(r["program"]).stem for r in rows] == ["dense", "simple"]
    for r in rows:
        assert r["latency_questions"] == 20 and r["retrieve_ms_p50"] > 0
        assert 0 < r["context_chars"] <= 16_000 and r["context_tokens"] == r["context_chars"] / 4
        assert set(r["by_capability"]) == {"F", "T", "P", "M", "A"}
    assert rows[0]["fitness"] != rows[1]["fitness"]
    assert rows[0]["ceiling"] == rows[1]["ceiling"]  # the split's, the same for every program
    assert all(r["fitness"] <= r["ceiling"] <= 1.0 for r in rows)
    code, out, _ = run_cli(
        capsys, "compare", DENSE, "--split", "all", "--data-dir", str(one_conv), "--embedder",
        "hashing", "--jobs", "1", "--cache-dir", str(tmp_path / "c"), "--no-progress",
    )  # fmt: skip
    assert code == 0 and "ceiling" in out and f"{rows[0]['ceiling']:.3f}" in out
    code, _, err = run_cli(capsys, "compare", "missing.py", "--data-dir", str(one_conv))
    assert code == 2 and "program file missing.py not found" in err


def assert_one_error_line(code: int, err: str, message: str) -> None:
    assert code == 2, err
    assert len(error_lines(err)) == 1 and message in error_lines(err)[0], err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["eval", "--hit-threshold", "7"], "argument --hit-threshold: must be a number in (0, 1]"),
        (["eval", "--hit-threshold", "0"], "argument --hit-threshold: must be a number in (0, 1]"),
        (["eval", "--hit-threshold", "nan"], "must be a number in (0, 1], got 'nan'"),
        (
            ["eval", "--task-max-tokens", "0"],
            "argument --task-max-tokens: must be an integer from 1 to 1,000,000",
        ),
        (["compare", "--jobs", "-1"], "argument --jobs: must be an integer from 1 to"),
        (["compare", "--jobs", "two"], "got 'two'"),
        (
            ["run", "--conversations", "0"],
            "--conversations: must be an integer from 1 to 1,000,000",
        ),
        (["run", "--conversations", "most"], "1,000,000 or 'all', got 'most'"),
        (["run", "--conversations", "-2"], "--conversations: must be an integer from 1 to"),
        (["run", "--jobs", "0"], "argument --jobs: must be an integer from 1 to"),
        (
            ["run", "--repairs", "-1"],
            "argument --repairs: must be an integer from 0 to 100, got '-1'",
        ),
        (["run", "--max-usd", "nan"], "argument --max-usd: must be a number >= 0, got 'nan'"),
        (
            ["eval", "--llm-concurrency", "0"],
            "argument --llm-concurrency: must be an integer from 1 to 1024",
        ),
        (["run", "--llm-timeout", "0"], "argument --llm-timeout: must be a number of seconds > 0"),
        (
            ["compare", "--llm-timeout", "inf"],
            "argument --llm-timeout: must be a number of seconds > 0",
        ),
        (
            ["run", "--coder-max-tokens", "0"],
            "argument --coder-max-tokens: must be an integer from 1 to 1,000,000",
        ),
    ],
)
def test_numeric_flags_are_validated_by_every_command(
    beam_slice: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str],
    message: str,
):  # fmt: skip
    """Every numeric flag is checked by one shared argparse type: a bad value is one error line
    and exit 2, before anything runs (``run --dry-run`` would otherwise print a plan)."""
    command, *flags = argv
    split = ["--split", "valid"]
    extra = {"eval": ["--program", DENSE, *split], "compare": [DENSE, *split],
             "run": ["--dry-run"]}[command]  # fmt: skip
    runs = tmp_path / "runs"
    code, out, err = run_cli(capsys, command, *extra, *flags, "--data-dir", str(beam_slice),
                             "--runs-dir", str(runs), "--embedder", "hashing",
                             "--cache-dir", str(tmp_path / "c"), "--no-progress")  # fmt: skip
    assert_one_error_line(code, err, message)
    assert out == "" and not runs.exists()


@pytest.fixture
def unreadable_programs(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    """Program paths that cannot be read as a program, with the words their error must say."""
    folder = tmp_path / "prog.py"
    folder.mkdir()
    latin1 = tmp_path / "latin1.py"
    latin1.write_bytes(
        Path(DENSE).read_bytes().replace(b"import numpy", b"# caf\xe9\nimport numpy")
    )
    return {
        "directory": (folder, f"{folder} is a directory, not a .py file"),
        "non-utf8": (latin1, f"cannot read {{what}} {latin1}: not UTF-8 text (invalid"),
    }


@pytest.mark.parametrize("kind", ["directory", "non-utf8"])
@pytest.mark.parametrize("command", ["eval", "compare", "check", "run"])
def test_unreadable_program_is_one_error_line(
    one_conv: Path, beam_slice: Path, capsys: pytest.CaptureFixture[str], command: str,
    kind: str, unreadable_programs: dict[str, tuple[Path, str]],
):  # fmt: skip
    path, message = unreadable_programs[kind]
    what = "seed program" if command == "run" else "program file"
    argv = {
        "eval": ["eval", "--program", str(path), "--split", "all", "--data-dir", str(one_conv)],
        "compare": ["compare", str(path), "--split", "all", "--data-dir", str(one_conv)],
        "check": ["check", str(path)],
        "run": ["run", "--seed", str(path), "--data-dir", str(beam_slice), "--dry-run"],
    }[command]
    code, _, err = run_cli(capsys, *argv, *(["--no-progress"] if command != "check" else []))
    assert_one_error_line(code, err, message.format(what=what))


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (("class Memory:", "class Memory(:"), "rule syntax at line"),
        (("class Memory:", "class Memo:"), "rule missing-definition"),
    ],
)
def test_run_refuses_a_bad_seed_before_creating_the_run(
    beam_slice: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], edit: tuple[str, str],
    message: str,
):  # fmt: skip
    seed = tmp_path / "seed.py"
    seed.write_text(Path(DENSE).read_text().replace(*edit))
    runs = tmp_path / "runs"
    code, _, err = run_cli(capsys, "run", "--seed", str(seed), "--data-dir", str(beam_slice),
                           "--runs-dir", str(runs), "--cache-dir", str(tmp_path / "c"),
                           "--embedder", "hashing", "--rounds", "0,1,0",
                           "--no-progress")  # fmt: skip
    assert_one_error_line(code, err, f"seed program {seed}: sandbox tier 1 (source) failed")
    assert message in error_lines(err)[0] and "--resume" not in err
    assert not runs.exists() or not list(runs.iterdir())  # no run folder was created


def empty_input(conv: Path, kind: str) -> None:
    """Make the BEAM conversation folder ``conv`` give nothing to evaluate, in one of three ways."""
    chat = conv / "chat.json"
    if kind == "chat []":
        chat.write_text("[]")
    elif kind == "empty turns":
        batches = json.loads(chat.read_text())
        chat.write_text(json.dumps([{**b, "turns": [[] for _ in b["turns"]]} for b in batches]))
    else:
        (conv / "probing_questions" / "probing_questions.json").write_text("{}")


EMPTY_KINDS = {"chat []": "has no message text", "empty turns": "has no message text",
               "questions {}": "has no questions"}  # fmt: skip


@pytest.mark.parametrize("kind", list(EMPTY_KINDS))
@pytest.mark.parametrize("command", ["eval", "compare"])
def test_empty_input_says_nothing_was_evaluated(
    one_conv: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str, kind: str
):
    empty_input(one_conv / "beam" / "chats" / "100K" / "1", kind)
    program = ["--program", DENSE] if command == "eval" else [DENSE]
    runs = tmp_path / "runs"
    code, out, err = run_cli(capsys, command, *program, "--split", "all", "--data-dir",
                             str(one_conv), "--embedder", "hashing", "--runs-dir", str(runs),
                             "--cache-dir", str(tmp_path / "c"), "--no-progress")  # fmt: skip
    assert_one_error_line(code, err, "nothing was evaluated: ")
    assert EMPTY_KINDS[kind] in error_lines(err)[0] and out == "" and not runs.exists()


@pytest.mark.parametrize("kind", list(EMPTY_KINDS))
def test_run_on_empty_input_creates_no_run(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str
):
    from evolve.datasets.beam import split_refs

    size, first = split_refs("train")[0]  # --conversations 1: the only one the run reads
    data = write_slice(
        data_dir, tmp_path / "data", refs=[*split_refs("train"), *split_refs("valid")]
    )
    empty_input(data / "beam" / "chats" / size / first, kind)
    runs = tmp_path / "runs"
    code, _, err = run_cli(capsys, "run", "--data-dir", str(data), "--conversations", "1",
                           "--rounds", "0,0,0", "--embedder", "hashing", "--runs-dir", str(runs),
                           "--cache-dir", str(tmp_path / "c"), "--no-progress")  # fmt: skip
    assert_one_error_line(code, err, "nothing was evaluated: beam train (1 conversation) ")
    assert EMPTY_KINDS[kind] in error_lines(err)[0] and not runs.exists()


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda c: {**c, "jobs": "many"}, "jobs: Input should be a valid integer"),
        (lambda c: {**c, "from_a_newer_version": 1}, "from_a_newer_version: Extra inputs"),
        (lambda c: {k: v for k, v in c.items() if k != "seed_program"}, "seed_program: Field"),
        (lambda c: {**c, "task_model": {"name": "x"}}, "task_model.model: Field required"),
        (lambda c: "not a mapping", "has no usable config in its manifest"),
    ],
)
def test_resume_of_a_damaged_stored_config_is_one_error_line(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: Any,
    message: str,
):  # fmt: skip
    """The config a run stored is validated on --resume: a damaged or incompatible one is
    refused in one line, before anything runs."""
    from evolve.config import RunConfig
    from evolve.evolution.store import RunStore

    good = RunConfig(data_dir=str(data_dir), seed_program=DENSE, cache_dir=str(tmp_path / "c"))
    store = RunStore.create(tmp_path, {"config": damage(good.as_json())}, run_id="damaged")
    code, _, err = run_cli(capsys, "run", "--resume", "damaged", "--runs-dir", str(tmp_path),
                           "--no-progress")  # fmt: skip
    assert_one_error_line(code, err, "run damaged")
    assert message in error_lines(err)[0], err
    assert not list(store.candidates())  # nothing ran


def test_run_records_absolute_paths_so_resume_works_from_elsewhere(
    data_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
):
    """A run started with relative --seed, --data-dir and --cache-dir resumes from another
    directory: the manifest holds absolute paths."""
    from evolve.evolution.store import RunStore

    work = tmp_path / "work"
    write_slice(data_dir, work / "data", messages=12)
    shutil.copy(ROOT / "seeds" / "dense.py", work / "seed.py")
    monkeypatch.chdir(work)
    runs = tmp_path / "runs"
    code, _, err = run_cli(capsys, "run", "--data-dir", "data", "--seed", "seed.py",
                           "--runs-dir", str(runs), "--cache-dir", "cache", "--embedder",
                           "hashing", "--rounds", "0,1,0", "--conversations", "1", "--jobs", "1",
                           "--children", "1", "--no-progress")  # fmt: skip
    assert code == 0, err
    (run,) = runs.iterdir()
    config = RunStore.open(runs, run.name).manifest["config"]
    for key in ("data_dir", "seed_program", "cache_dir"):
        assert Path(config[key]).is_absolute(), (key, config[key])
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(capsys, "run", "--resume", run.name, "--runs-dir", str(runs),
                           "--bench", "locomo", "--rounds", "0,2,0", "--no-progress")  # fmt: skip
    assert code == 2 and error_lines(err) == [  # a resumed run keeps its bench, said, not ignored
        f"error: run {run.name} evolves on beam; --bench locomo cannot change that "
        "(start a new run for another bench)"
    ]
    code, _, err = run_cli(capsys, "run", "--resume", run.name, "--runs-dir", str(runs),
                           "--bench", "beam", "--rounds", "0,2,0", "--no-progress")  # fmt: skip
    assert code == 0, err
    assert len(RunStore.open(runs, run.name).candidates()) == 3


def test_a_seed_that_fails_every_real_question_stops_the_run(
    beam_slice: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    """The seed passes the sandbox (its synthetic messages hold no apostrophe) but raises on every
    real conversation: the run stops after the seed's evaluation, exit 2, one error line with
    the first error; the seed is filed ``failed`` with it (it was filed evaluated, exit 0)."""
    from evolve.evolution.store import RunStore

    bad = tmp_path / "crash.py"
    bad.write_text(Path(DENSE).read_text().replace(
        "        if not units:",
        "        if any(\"'\" in u.content for u in units):\n"
        "            raise KeyError('too many units')\n"
        "        if not units:",
    ))  # fmt: skip
    runs = tmp_path / "runs"
    code, _, err = run_cli(capsys, "run", "--seed", str(bad), "--data-dir", str(beam_slice),
                           "--runs-dir", str(runs), "--cache-dir", str(tmp_path / "c"),
                           "--embedder", "hashing", "--rounds", "1,0,0", "--conversations", "1",
                           "--jobs", "1", "--no-progress", "--children", "1",
                           "--guard", "none")  # fmt: skip
    assert code == 2, err
    [line] = error_lines(err)
    assert "the seed program failed" in line and "every question failed" in line
    assert "KeyError" in line and "too many units" in line
    (run,) = runs.iterdir()
    [seed] = RunStore.open(runs, run.name).candidates()
    assert seed.status == "failed" and "too many units" in seed.message


@pytest.mark.parametrize("command", [["runs", "--json"], ["runs"]])
def test_a_reader_that_leaves_early_gets_no_traceback(command: list[str], tmp_path: Path):
    """``evolve runs --json | head -c0``: stdout's reader is gone before the command writes;
    the command ends quietly (a BrokenPipeError traceback, or 'Exception ignored', before)."""
    import os
    import subprocess
    import sys

    from evolve.evolution.store import RunStore

    for i in range(40):  # output longer than one write
        RunStore.create(tmp_path, {"config": {}}, run_id=f"run-{i:03d}")
    read, write = os.pipe()
    os.close(read)  # the reader left before anything was written
    proc = subprocess.run([sys.executable, "-m", "evolve", *command, "--runs-dir", str(tmp_path)],
                          stdout=write, stderr=subprocess.PIPE, text=True, timeout=120)  # fmt: skip
    os.close(write)
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr, proc.stderr
    assert proc.returncode in (0, 1, 141)  # 1: rich ends so on a closed pipe
