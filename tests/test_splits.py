"""splits/beam.json: reproducible from its seed, disjoint, with the design's counts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evolve.datasets import beam, splits
from evolve.datasets.types import DataError

EXPECTED = {  # split -> (conversations, questions); capabilities are 2F 6T 4P 4M 4A per conv
    "train": (8, 160),
    "valid": (6, 120),
    "holdout": (6, 120),
    "test": (13, 260),
    "guard": (6, 120),  # the BEAM-500K conversations shipped for guard sets
}


@pytest.fixture(scope="module")
def committed() -> dict:
    return json.loads(beam.DEFAULT_SPLITS_FILE.read_text())


def test_committed_file_is_what_the_seed_produces(data_dir: Path, committed: dict) -> None:
    built = splits.build_beam_splits(data_dir, committed["seed"])
    assert splits.render(built) == beam.DEFAULT_SPLITS_FILE.read_text()
    assert splits.verify_beam_splits(data_dir) == []
    assert committed["seed"] == 0 and committed["bench"] == "beam"


def test_counts_per_split(committed: dict) -> None:
    assert set(committed["splits"]) == set(EXPECTED)
    for name, (n_conv, n_q) in EXPECTED.items():
        entry = committed["splits"][name]
        assert entry["n_conversations"] == len(entry["conversations"]) == n_conv
        assert entry["n_questions"] == n_q
        assert entry["per_capability"] == {
            "F": 2 * n_conv,
            "T": 6 * n_conv,
            "P": 4 * n_conv,
            "M": 4 * n_conv,
            "A": 4 * n_conv,
        }
        assert entry["per_ability"] == {a: 2 * n_conv for a in sorted(beam.ABILITY_CAPABILITY)}
    sizes = {r["size"] for name in ("train", "valid", "holdout") for r in _refs(committed, name)}
    assert sizes == {"100K"}
    assert {r["size"] for r in _refs(committed, "test")} == {"1M"}
    assert [(r["size"], r["conv"]) for r in _refs(committed, "guard")] == [
        ("500K", c) for c in ("3", "7", "11", "15", "19", "23")
    ]


def _refs(data: dict, name: str) -> list[dict]:
    return data["splits"][name]["conversations"]


def test_no_conversation_in_two_splits(committed: dict) -> None:
    seen: list[tuple[str, str]] = []
    for name in EXPECTED:
        seen.extend((r["size"], r["conv"]) for r in _refs(committed, name))
    assert len(seen) == len(set(seen))
    hundred_k = {c for s, c in seen if s == "100K"}
    assert hundred_k == {str(i) for i in range(1, 21)}


def test_load_taskset_follows_the_file(data_dir: Path, committed: dict) -> None:
    ts = beam.load_taskset(data_dir, "valid")
    assert ts.split == "valid" and len(ts.questions) == 120
    expected = [r["conv"] for r in _refs(committed, "valid")]
    assert [c.meta["conv"] for c in ts.conversations] == expected


def test_verify_detects_changes_and_other_seeds_differ(data_dir: Path, tmp_path: Path) -> None:
    path = splits.write_beam_splits(data_dir, seed=1, path=tmp_path / "beam.json")
    assert splits.verify_beam_splits(data_dir, path) == []
    other = json.loads(path.read_text())
    base = splits.build_beam_splits(data_dir, 0)
    assert other["splits"]["train"] != base["splits"]["train"]
    other["splits"]["train"]["conversations"][0]["conv"] = "99"
    other["splits"]["valid"]["n_questions"] = 1
    path.write_text(json.dumps(other))
    problems = splits.verify_beam_splits(data_dir, path)
    assert problems == [
        "split 'train' field 'conversations' differs from the seed's",
        "split 'valid' field 'n_questions' differs from the seed's",
    ]


def test_build_needs_twenty_conversations(tmp_path: Path) -> None:
    (tmp_path / "beam" / "chats" / "100K").mkdir(parents=True)
    with pytest.raises(DataError, match="need 20 BEAM-100K conversations with chats, found 0"):
        splits.build_beam_splits(tmp_path)
