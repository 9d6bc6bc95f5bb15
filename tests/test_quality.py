"""Quality floor with the real embedder: ranked seeds beat the paper's simple seed.

The first session of the smallest BEAM-100K validation conversation (about 100,000 characters,
six times the retrieval budget) and the questions whose evidence lies there, offline mode,
all-MiniLM-L6-v2. The simple seed returns the start of the history whatever the question; dense
and hybrid rank by the question, so they must retrieve more of the gold evidence (coverage, the
fitness; similarity and hit rate).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import first_sessions

from contract.spec import OUT_CHAR_BUDGET
from evolve.datasets.beam import load_taskset
from evolve.evaluation.executor import run_eval
from evolve.evaluation.setup import EvalSetup

SEEDS = Path(__file__).resolve().parents[1] / "seeds"


@pytest.fixture(scope="module")
def scores(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    valid = load_taskset(data_dir, "valid")
    smallest = min(valid.conversations, key=lambda c: c.n_chars)
    tasks = first_sessions(data_dir, 1, 100, conv_id=smallest.id.rsplit("/", 1)[-1])
    assert tasks.questions and tasks.conversations[0].n_chars > 5 * OUT_CHAR_BUDGET
    config = EvalSetup(cache_dir=str(tmp_path_factory.mktemp("cache")), task_model=None)
    return {
        seed: run_eval(SEEDS / f"{seed}.py", tasks, config, jobs=1).scores.overall.as_scores()
        for seed in ("simple", "dense", "hybrid")
    }


@pytest.mark.parametrize("seed", ["dense", "hybrid"])
@pytest.mark.parametrize(
    "metric", ["evidence_coverage", "evidence_similarity", "evidence_hit_rate"]
)
def test_ranked_seed_beats_simple(scores: dict[str, dict], seed: str, metric: str):
    assert scores[seed][metric] > scores["simple"][metric], scores
