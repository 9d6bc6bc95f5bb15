"""A run seen from outside: JSON-ready summaries of runs, candidates and their ancestry.

Used by the inspect commands (:mod:`evolve.cli_inspect`) and by exports (:mod:`.ship`). Nothing
here writes to a run. Everything is derived from the store on each call — best overall and
specialists come from :func:`~evolve.evolution.archive.archive` (the loop's own selection),
spend from the call log — so a summary can never disagree with the run it describes. Fitness is
always :func:`~evolve.evolution.archive.fitness`
(the loop's selection signal) and ``None`` where a candidate has no score on that split.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

from evolve.datasets.types import CAPABILITIES, CAPABILITY_NAMES
from evolve.evolution.archive import archive, fitness
from evolve.evolution.budget import read_spend
from evolve.evolution.loop import STAGES
from evolve.evolution.store import STATUSES, CandidateMeta, RunNotFound, RunStore


def local_time(ts: float | None) -> str | None:
    return None if ts is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def scores(block: dict[str, Any] | None) -> dict[str, float | None]:
    """Fitness, evidence similarity and hit rate of one score block (None where missing)."""
    block = block or {}
    return {
        "fitness": fitness(block) if block else None,
        "similarity": block.get("evidence_similarity"),
        "hit_rate": block.get("evidence_hit_rate"),
    }


def split_fitness(
    meta: CandidateMeta, split: str = "valid", cap: str | None = None
) -> float | None:
    """Fitness on a split, overall or on one capability; None when not scored there."""
    block = meta.scores.get(split)
    if not block:
        return None
    part = block["overall"] if cap is None else block["by_capability"].get(cap)
    return None if part is None else fitness(part)


def ancestry(store: RunStore, candidate_id: str) -> list[CandidateMeta]:
    """The candidate and all its ancestors, each once, breadth first (parents in stored order),
    ending with the seed. A crossover has two parents, so this walks a DAG, not a chain."""
    order: list[CandidateMeta] = []
    seen: set[str] = set()
    todo = [store.get(candidate_id)]
    while todo:
        meta = todo.pop(0)
        if meta.id not in seen:
            seen.add(meta.id)
            order.append(meta)
            todo += [store.get(p) for p in meta.parents if p not in seen]
    return order


def runs(runs_dir: Path) -> list[dict[str, Any]]:
    """One row per run, newest first: id, created (unix and local), candidates, best overall
    and its valid fitness (derived from the candidates, so current even mid-round)."""
    rows = []
    for run in RunStore.list_runs(runs_dir):
        try:
            best = archive(RunStore.open(runs_dir, run["id"]).candidates()).best
        except (RunNotFound, OSError, ValueError):  # removed or corrupted since it was listed
            best = None
        rows.append({"id": run["id"], "created": run["created"],
                     "created_local": local_time(run["created"]), "candidates": run["candidates"],
                     "best": best.id if best else None,
                     "best_valid_fitness": split_fitness(best) if best else None})  # fmt: skip
    return rows


def status(store: RunStore) -> dict[str, Any]:
    """Where a run stands. ``stage``: ``seed`` until the seed is evaluated, then the stage of the
    next round (``round``, 1-based) or ``finished``; ``rounds`` compares the state's counters
    with the manifest's plan (a resume with ``--rounds`` may have gone past the plan);
    ``stopped`` is why the run stopped where it stands (a budget cap), else None."""
    manifest, candidates = store.manifest, store.candidates()
    planned = manifest.get("config", {}).get("rounds", {})
    done = store.load_state().get("rounds", {})
    rounds = {s: {"done": done.get(s, 0), "planned": planned.get(s, 0)} for s in STAGES}
    stage = next((s for s in STAGES if rounds[s]["done"] < rounds[s]["planned"]), "finished")
    if not any(c.stage == "seed" and c.status == "evaluated" for c in candidates):
        stage = "seed"
    stops = [e["data"] for e in store.events("budget_stop")]  # logged by the loop at a cap
    stopped = None
    if stops and stage != "finished" and stops[-1].get("round") == sum(done.values()):
        stopped = stops[-1].get("reason")
    kept = archive(candidates)
    best = kept.best
    counts = Counter(c.status for c in candidates)
    return {
        "run": store.run_id,
        "created": manifest.get("created"),
        "created_local": local_time(manifest.get("created")),
        "config": manifest.get("config", {}),
        "stage": stage,
        "round": rounds[stage]["done"] + 1 if stage in rounds else None,
        "rounds": rounds,
        "stopped": stopped,
        "best": {"id": best.id, **scores(best.scores["valid"]["overall"])} if best else None,
        "diagnostics": best.scores["train"].get("diagnostics") if best else None,
        "specialists": {
            cap: {"id": m.id, "name": CAPABILITY_NAMES[cap],
                  "valid_fitness": split_fitness(m, cap=cap)}
            for cap, m in kept.specialists.items()
        },
        "candidates": len(candidates),
        "by_status": {s: counts[s] for s in STATUSES},
        "spend": read_spend(store.root).as_json(),
        "frozen": [{"id": c.id, "test": scores(c.scores.get("test", {}).get("overall"))}
                   for c in candidates if c.frozen],
    }  # fmt: skip


def candidate(meta: CandidateMeta) -> dict[str, Any]:
    """One candidate as a row: identity, story, and valid fitness overall and per capability."""
    return {
        "id": meta.id,
        "stage": meta.stage,
        "capability": meta.capability,
        "status": meta.status,
        "parents": meta.parents,
        "valid_fitness": split_fitness(meta),
        "by_capability": {cap: split_fitness(meta, cap=cap) for cap in CAPABILITIES},
        "frozen": meta.frozen,
        "message": meta.message,
    }
