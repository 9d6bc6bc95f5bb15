"""A run seen from outside: JSON-ready summaries of runs, candidates and their ancestry.

Used by the inspect commands (:mod:`evolve.cli.inspect`) and by exports (:mod:`.export`). Nothing
here writes to a run. Everything is derived from the store on each call — best overall and
specialists come from :func:`~evolve.evolution.archive.archive` (the loop's own selection),
spend from the call log — so a summary can never disagree with the run it describes. Fitness is
always :func:`~evolve.evolution.archive.fitness` (the loop's selection signal: the run's fitness
mode, :func:`fitness_mode`) and ``None`` where a candidate has no score on that split; the
retrieval fitness (evidence coverage) with its ceiling (:func:`split_ceiling`: the gold
evidence packed into the budget), similarity and hit rate stay beside it as diagnostics.
Damaged candidates are left out as the store leaves them out (an ancestor that does not load
ends its branch). :func:`evaluation` describes an ``evolve eval`` folder. :func:`transfer` is
the best's fitness on valid and on each guard set beside the seed's and the ceiling (where a
program gained and where it lost), the one table ``run``, ``status``, ``programs``, ``report``,
``export`` and ``freeze`` all show (:func:`transfer_lines` as text).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

from evolve.config import STAGES
from evolve.datasets.guards import KEY_PREFIX as GUARD_PREFIX
from evolve.datasets.types import CAPABILITIES, CAPABILITY_NAMES
from evolve.evolution.archive import Archive, archive, fitness, guard_keys
from evolve.evolution.budget import read_spend
from evolve.evolution.cascade import saved_seconds
from evolve.evolution.store import STATUSES, CandidateMeta, DamagedFile, RunNotFound, RunStore
from evolve.models import damaged, why
from evolve.scoring import fmt_score
from evolve.scoring.ceiling import KEY as CEILING_KEY
from evolve.scoring.fitness import mode_of, retrieval_fitness


def local_time(ts: float | None) -> str | None:
    return None if ts is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def scores(block: dict[str, Any] | None) -> dict[str, float | None]:
    """Fitness (the run's mode), retrieval fitness (evidence coverage) and its ceiling, evidence
    similarity and hit rate of one score block (None where missing)."""
    block = block or {}
    return {
        "fitness": fitness(block) if block else None,
        "retrieval_fitness": retrieval_fitness(block) if block else None,
        "ceiling": block.get(CEILING_KEY),
        "similarity": block.get("evidence_similarity"),
        "hit_rate": block.get("evidence_hit_rate"),
    }


def fitness_mode(manifest: dict[str, Any]) -> dict[str, Any]:
    """The fitness a run selects on, as its manifest records it (runs from before modes were
    recorded selected on ``retrieval``)."""
    return manifest.get("fitness") or {"name": mode_of(None), "version": None}


def split_fitness(
    meta: CandidateMeta, split: str = "valid", cap: str | None = None
) -> float | None:
    """Fitness on a split, overall or on one capability; None when not scored there."""
    block = meta.scores.get(split)
    if not block:
        return None
    part = block["overall"] if cap is None else block["by_capability"].get(cap)
    return None if part is None else fitness(part)


def split_ceiling(
    meta: CandidateMeta, split: str = "valid", cap: str | None = None
) -> float | None:
    """The coverage ceiling of a split (overall or one capability) as the candidate's
    evaluation recorded it; None where it was not scored there or before ceilings were kept."""
    part = (meta.scores.get(split) or {}).get("overall" if cap is None else "by_capability")
    if cap is not None:
        part = (part or {}).get(cap)
    value = (part or {}).get(CEILING_KEY)
    return float(value) if isinstance(value, int | float) else None


def ancestry(store: RunStore, candidate_id: str) -> list[CandidateMeta]:
    """The candidate and all its ancestors, each once, breadth first (parents in stored order),
    ending with the seed. A crossover has two parents, so this walks a DAG, not a chain. An
    ancestor whose file is damaged is reported and left out."""
    order: list[CandidateMeta] = []
    seen: set[str] = set()
    todo = [candidate_id]
    while todo:
        ref = todo.pop(0)
        try:
            meta = store.get(ref)
        except DamagedFile as exc:
            if ref == candidate_id:
                raise
            damaged(f"{exc}: ancestor skipped")
            continue
        if meta.id not in seen:
            seen.add(meta.id)
            order.append(meta)
            todo += [p for p in meta.parents if p not in seen]
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
        "fitness": fitness_mode(manifest),
        "best": {"id": best.id, **scores(best.scores["valid"]["overall"])} if best else None,
        "transfer": transfer(candidates, kept),
        "diagnostics": best.scores["train"].get("diagnostics") if best else None,
        "specialists": {
            cap: {"id": m.id, "name": CAPABILITY_NAMES[cap],
                  "valid_fitness": split_fitness(m, cap=cap)}
            for cap, m in kept.specialists.items()
        },
        "candidates": len(candidates),
        "by_status": {s: counts[s] for s in STATUSES},
        "cascade_saved_seconds": saved_seconds(candidates),
        "spend": read_spend(store.root).as_json(),
        "frozen": [{"id": c.id, "test": scores(c.scores.get("test", {}).get("overall"))}
                   for c in candidates if c.frozen],
    }  # fmt: skip


def transfer(
    candidates: list[CandidateMeta], kept: Archive | None = None, of: CandidateMeta | None = None
) -> dict[str, Any] | None:
    """The best's (or ``of``'s) and the seed's fitness on valid and on each of the run's guards,
    with the ceiling (the seed's record: the gold evidence packed into the budget) and the
    candidates a guard held back; None before anything is evaluated. ``kept``: the archive, if
    at hand."""
    kept = kept or archive(candidates)
    best = of or kept.best
    if best is None:
        return None
    seed = next((c for c in candidates if c.stage == "seed" and c.status == "evaluated"), best)
    rows = []
    for key in ["valid", *guard_keys(candidates)]:
        mine, theirs = split_fitness(best, key), split_fitness(seed, key)
        rows.append({"split": key.removeprefix(GUARD_PREFIX), "guard": key != "valid",
                     "seed": theirs, "program": mine,
                     "delta": None if mine is None or theirs is None else mine - theirs,
                     "ceiling": split_ceiling(seed, key)})  # fmt: skip
    held = [c for c in candidates if kept.held_back(c.id)]
    role = "best" if kept.best is not None and best.id == kept.best.id else "candidate"
    reasons = {c.id: [str(g.reason) for g in kept.held_back(c.id)] for c in held}
    return {"program": best.id, "role": role, "seed": seed.id, "rows": rows, "held_back": reasons}


def transfer_lines(t: dict[str, Any] | None) -> list[str]:
    """:func:`transfer` as plain text lines (empty when there is nothing yet)."""
    if t is None:
        return []
    who = t["role"]
    lines = [f"{who} {t['program']} against seed {t['seed']} (fitness; of a possible: the "
             "ceiling):"]  # fmt: skip
    for r in t["rows"]:
        delta = "" if r["delta"] is None else f" ({r['delta'] * 100:+.1f} pp)"
        label = f"guard {r['split']}" if r["guard"] else "valid"
        lines.append(f"  {label}: seed {fmt_score(r['seed'])}, {who} {fmt_score(r['program'])}"
                     f"{delta} of a possible {fmt_score(r['ceiling'])}")  # fmt: skip
    if not any(r["guard"] for r in t["rows"]):
        lines.append("  no guard sets: nothing outside valid was checked")
    n = len(t["held_back"])
    if n:
        lines.append(f"  {n} candidate{'s' * (n != 1)} won valid but a guard held "
                     f"{'them' if n != 1 else 'it'} back (evolve programs shows why)")  # fmt: skip
    return lines


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
        "guards": [
            {k: g[k] for k in ("guard", "role", "passed", "fitness", "holder_fitness", "reason")}
            for g in meta.guards
        ],  # fmt: skip
    }


def evaluation(folder: Path) -> dict[str, Any] | None:
    """What an ``evolve eval`` folder (``report.json`` and ``questions.jsonl``, no manifest)
    holds: its meta and overall scores; None for any other folder. DamagedFile if the report
    does not load."""
    path = folder / "report.json"
    if (folder / "manifest.json").exists() or not path.is_file():
        return None
    try:
        report = json.loads(path.read_bytes())
        meta, overall = report["meta"], report["scores"]["overall"]
        keys = ("program", "bench", "split", "mode", "questions", "conversations", "errors")
        return {"evaluation": folder.name, **{k: meta[k] for k in keys},
                "fitness": fitness(overall) if overall else None, "overall": overall,
                "report": str(path)}  # fmt: skip
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise DamagedFile(f"evaluation report {path} is damaged ({why(exc)})") from None


def describe_evaluation(e: dict[str, Any]) -> str:
    """One paragraph on an evaluation folder, for ``evolve status``."""
    score = fmt_score(e["fitness"])
    return (
        f"{e['evaluation']} is an evaluation folder (evolve eval), not an evolution run: "
        f"program {e['program']} on {e['bench']} {e['split']} ({e['mode']}), "
        f"{e['questions']} questions in {e['conversations']} conversations, {e['errors']} "
        f"failed; fitness {score}. Report: {e['report']}"
    )
