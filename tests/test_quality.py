"""Quality floor with the real embedder: ranked seeds beat the paper's simple seed.

One BEAM-100K validation conversation, offline mode, all-MiniLM-L6-v2. The simple seed returns
the start of the history whatever the question; dense and hybrid rank by the question, so they
must retrieve more of the gold evidence (coverage, the fitness; similarity and hit rate).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from evolve.datasets.beam import load_taskset
from evolve.datasets.types import TaskSet
from evolve.executor import evaluate
from evolve.worker import WorkerConfig

SEEDS = Path(__file__).resolve().parents[1] / "seeds"


@pytest.fixture(scope="module")
def scores(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    valid = load_taskset(data_dir, "valid")
    conv = min(valid.conversations, key=lambda c: c.n_chars)
    questions = tuple(q for q in valid.questions if q.conversation_id == conv.id)
    tasks = TaskSet("beam", "valid-one", (conv,), questions)
    config = WorkerConfig(cache_dir=str(tmp_path_factory.mktemp("cache")), task_model=None)
    return {
        seed: evaluate(SEEDS / f"{seed}.py", tasks, config, jobs=1).scores["overall"]
        for seed in ("simple", "dense", "hybrid")
    }


@pytest.mark.parametrize("seed", ["dense", "hybrid"])
@pytest.mark.parametrize(
    "metric", ["evidence_coverage", "evidence_similarity", "evidence_hit_rate"]
)
def test_ranked_seed_beats_simple(scores: dict[str, dict], seed: str, metric: str):
    assert scores[seed][metric] > scores["simple"][metric], scores
