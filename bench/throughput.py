"""Benchmark: model-call throughput of one evaluation against the fake model server.

Evaluates a program on BEAM-100K valid with the task model and the judge both served by
:class:`~evolve.models.fake_server.FakeModelServer` at a fixed latency, from cold stage and LLM
caches (the embedding cache is warmed by the first run and copied to the others), at each
concurrency (``EvalSetup.llm_concurrency``): requests the server saw, wall time, the ratio
of the wall time to the ideal (requests × latency / concurrency; the goal is ≤ 1.3× at 16), the
server's maximum of requests in flight, and the time split of ``meta.time``. Then the same
evaluation at the highest concurrency with injected faults (``--faults``, 30 % by default): it
must complete, the server's fault counts are printed, and its scores must equal the
fault-free run's.

    python bench/throughput.py --data-dir ../shared/data                  # the full version
    python bench/throughput.py --conversations 1 --latency 0.05 --concurrency 1 4  # a minute
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import tempfile
import time
from pathlib import Path

from evolve.datasets.beam import load_taskset
from evolve.datasets.types import TaskSet
from evolve.environment import folder
from evolve.evaluation.executor import EvalError, run_eval
from evolve.evaluation.report import EvalReport
from evolve.evaluation.setup import EvalSetup
from evolve.models.clients import llm_client
from evolve.models.fake_server import FakeModelServer, FaultPlan, ServerStats, parse_rates
from evolve.models.llm import LLMError, ModelConfig, Models
from evolve.models.usage import fault_text

ROOT = Path(__file__).resolve().parents[1]
FAULTS = "429:0.1,500:0.1,truncate:0.05,garbage:0.05"


def first(tasks: TaskSet, n: int | None) -> TaskSet:
    """Only the first ``n`` conversations of ``tasks`` (all when None)."""
    keep = tasks.conversations[:n]
    ids = {c.id for c in keep}
    return TaskSet(tasks.bench, tasks.split, keep,
                   tuple(q for q in tasks.questions if q.conversation_id in ids))  # fmt: skip


def one_run(
    args: argparse.Namespace, tasks: TaskSet, concurrency: int, faults: FaultPlan, warm: Path
) -> tuple[EvalReport, ServerStats, float]:
    """One evaluation from cold stage and LLM caches against a fresh server."""
    cache = Path(tempfile.mkdtemp(prefix="prismem-throughput-"))
    if warm.exists():
        shutil.copy(warm, cache / warm.name)
    with FakeModelServer(latency_s=args.latency, faults=faults) as server:
        model = ModelConfig(model="openai/fake", api_base=server.base_url, max_tokens=256)
        setup = EvalSetup(cache_dir=str(cache), task_model=model, embedder=args.embedder,
                              llm_concurrency=concurrency)  # fmt: skip
        # the judge shares the workers' call log, so it shares their one limit
        judge = llm_client(Models(judge=model), log_path=cache / "llm-calls.sqlite",
                           cache_path=cache / "llm-cache.sqlite",
                           concurrency=concurrency)  # fmt: skip
        start = time.perf_counter()
        report = run_eval(args.program, tasks, setup, jobs=args.jobs, judge=judge)
        wall = time.perf_counter() - start
        stats = server.stats()
    if not warm.exists() and (cache / warm.name).exists():
        shutil.copy(cache / warm.name, warm)
    shutil.rmtree(cache, ignore_errors=True)
    return report, stats, wall


def line(label: str, report: EvalReport, stats: ServerStats, wall: float, ideal: float) -> str:
    split = report.meta.time
    return (f"{label:>16}: {stats.requests:5d} requests  {wall:8.1f} s  {wall / ideal:5.2f}x ideal "
            f"({ideal:.1f} s)  max in flight {stats.max_in_flight:3d}  errors "
            f"{report.meta.errors}  model wait {split['model_wait']:.1f} s, sandbox "
            f"{split['sandbox']:.1f} s, local {split['local']:.1f} s, judging "
            f"{split['judging']:.1f} s")  # fmt: skip


def throughput(args: argparse.Namespace) -> bool:
    tasks = first(load_taskset(args.data_dir, args.split), args.conversations)
    print(f"{len(tasks.questions)} questions in {len(tasks.conversations)} conversations "
          f"({args.split}), latency {args.latency} s, jobs {args.jobs}")  # fmt: skip
    warm = Path(tempfile.mkdtemp(prefix="prismem-embed-")) / "embeddings.sqlite"
    clean: EvalReport | None = None
    for n in args.concurrency:
        report, stats, wall = one_run(args, tasks, n, FaultPlan(), warm)
        print(line(f"concurrency {n}", report, stats, wall, stats.requests * args.latency / n))
        clean = report
    assert clean is not None
    if args.faults == "none":  # the fault-free runs only
        shutil.rmtree(warm.parent, ignore_errors=True)
        return True
    n = max(args.concurrency)
    plan = FaultPlan(rates=parse_rates(args.faults), retry_after=args.latency, seed=1)
    report, stats, wall = one_run(args, tasks, n, plan, warm)
    answered = stats.answered or 1
    print(line(f"faults at {n}", report, stats, wall, answered * args.latency / n))
    injected = {k: v for k, v in stats.faults.items() if v}
    same = report.scores == clean.scores
    print(f"{'':>16}  faults injected {sum(injected.values())} of {stats.requests} requests "
          f"{injected}; scores equal the fault-free run's: {'yes' if same else 'NO'}")  # fmt: skip
    for role, tally in sorted(report.usage.items()):  # what the call log counted
        print(f"{'':>16}  counted for {role}: {fault_text(tally) or 'no faults'}")
    shutil.rmtree(warm.parent, ignore_errors=True)
    return same


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=Path(folder("DATA") or ""))
    parser.add_argument("--program", type=Path, default=ROOT / "seeds" / "hybrid.py")
    parser.add_argument("--split", default="valid")
    parser.add_argument("--conversations", type=int, default=None, help="only the first N")
    parser.add_argument("--latency", type=float, default=1.0, help="seconds per reply")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument(
        "--faults", default=FAULTS, help=f"fault rates (default {FAULTS}; none: no faults run)"
    )
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--embedder", choices=("minilm", "hashing"), default="minilm")
    args = parser.parse_args()
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    )
    try:
        same = throughput(args)
    except (OSError, ValueError, EvalError, LLMError) as exc:  # bad input; a call lost for good
        raise SystemExit(f"throughput: {exc}") from None
    raise SystemExit(0 if same else 1)


if __name__ == "__main__":
    main()
