"""Distributed evaluation: a local Ray instance on loopback gives exactly the local results.

Ray is the ``[ray]`` extra (installed by the README's test command). The instance is private to
this module: 2 CPUs, no dashboard, bound to 127.0.0.1, shut down at the end.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from evolve.datasets.beam import load_taskset
from evolve.datasets.slices import write_slice
from evolve.distributed import RayExecutor, make_backend
from evolve.executor import evaluate
from evolve.worker import WorkerConfig

SEEDS = Path(__file__).resolve().parents[1] / "seeds"
ray = pytest.importorskip("ray", reason="Ray is not installed: pip install -e '.[test]'")


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             _node_ip_address="127.0.0.1")  # fmt: skip
    try:
        yield
    finally:
        ray.shutdown()


def comparable(report: Any) -> list[dict[str, Any]]:
    keep = ("id", "retrieved", "scores", "error", "query")
    return [{k: getattr(t, k) for k in keep} for t in report.traces]


def test_ray_backend_matches_local(
    local_ray: None, data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = write_slice(data_dir, tmp_path / "data", messages=30, chars=600,
                            refs=[("100K", "1"), ("100K", "3"), ("100K", "4")])  # fmt: skip
    tasks = load_taskset(data, "all")
    program = SEEDS / "hybrid.py"

    def run(backend: str) -> Any:
        cfg = WorkerConfig(cache_dir=str(tmp_path / backend), task_model=None, embedder="hashing")
        return evaluate(program, tasks, cfg, backend=make_backend(backend, 2))

    tasks_sent: list[str] = []
    submit = RayExecutor.submit

    def counted(self: RayExecutor, fn: Any, /, *args: Any) -> Any:
        tasks_sent.append(args[2].id)  # run_conversation(source, path, conversation, ...)
        return submit(self, fn, *args)

    monkeypatch.setattr(RayExecutor, "submit", counted)
    local, distributed = run("local"), run("ray")
    assert sorted(tasks_sent) == sorted(c.id for c in tasks.conversations)  # one Ray task each
    assert comparable(distributed) == comparable(local)
    assert distributed.scores == local.scores
    assert distributed.stages == local.stages
    assert distributed.stages["index"]["computed"] == len(tasks.conversations)
