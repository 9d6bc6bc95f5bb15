"""evolve/evolution/tpe.py: the optuna (TPE) constant proposer — seeded, derived from the run
folder (so a resume and a replayed round propose the same child), train scores only,
integration searching only where the two programs differ, and ``--offline-search random``."""

from __future__ import annotations

import hashlib
import math
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from optuna.distributions import IntDistribution

from evolve.cli.main import build_parser
from evolve.cli.runconfig import run_config
from evolve.config import RunConfig, stored_config
from evolve.evolution.constants import REBUILD, ConstantProposer, rebuild_names, tunables
from evolve.evolution.proposer import CandidateView, Proposal, Request
from evolve.evolution.store import CandidateMeta, RunStore
from evolve.evolution.tpe import STARTUP, SUBSPACE, TPEProposer
from evolve.evolution.wiring import constant_proposer
from sandbox.fingerprint import changed_components

SEEDS = Path(__file__).resolve().parents[1] / "seeds"
HYBRID = (SEEDS / "hybrid.py").read_text()


def values(source: str) -> dict[str, object]:
    return {t.name: t.value for t in tunables(source)}


def objective(source: str) -> float:
    """A synthetic train fitness: best at TOP_K 200, DENSE_WEIGHT 0.9, RETURN_CHUNK on."""
    v = values(source)
    assert isinstance(v["TOP_K"], int) and isinstance(v["DENSE_WEIGHT"], float)
    return 1 - abs(math.log(v["TOP_K"] / 200)) / 5 - abs(v["DENSE_WEIGHT"] - 0.9) - (
        0.2 * (not v["RETURN_CHUNK"]))  # fmt: skip


def scores(
    train: float, valid: float = 0.5, f: float | None = None
) -> dict[str, dict[str, object]]:
    """Score blocks: overall train fitness ``train``, capability F's ``f`` (default: the same)."""
    return {"train": {"overall": {"fitness": train},
                      "by_capability": {"F": {"fitness": train if f is None else f}}},
            "valid": {"overall": {"fitness": valid}}}  # fmt: skip


def file(store: RunStore, source: str, parents: list[str], value: float | None) -> CandidateMeta:
    """Add a candidate; evaluate it (train objective ``value``) unless ``value`` is None."""
    meta = store.add_candidate(source, parents=parents, stage="seed" if not parents else
                               "refinement", capability=None, message="m")  # fmt: skip
    if value is not None:
        store.update(meta.id, status="evaluated", scores=scores(value))
    return store.get(meta.id)


def view(store: RunStore, meta: CandidateMeta) -> CandidateView:
    return CandidateView(meta.id, store.source(meta.id), {"train": meta.scores["train"]})


def request(store: RunStore, round_no: int, *, skip: frozenset[str] = frozenset(),
            target: str | None = None, child: int = 0,
            siblings: frozenset[str] = frozenset()) -> Request:  # fmt: skip
    """The loop's request: the parent is the best evaluated candidate on train, and ``known``
    leaves out the ids in ``skip`` (a replayed round's own children) but holds ``siblings``."""
    held = [c for c in store.candidates() if c.status != "proposed" and c.id not in skip]
    best = max((c for c in held if c.status == "evaluated"),
               key=lambda c: c.scores["train"].overall.fitness or 0.0)  # fmt: skip
    return Request("refinement", round_no, view(store, best), target, child=child,
                   known=frozenset(c.source_sha256 for c in held) | siblings,
                   siblings=siblings)  # fmt: skip


def new_run(root: Path, name: str) -> RunStore:
    store = RunStore.create(root, {"config": {}}, run_id=name)
    file(store, HYBRID, [], objective(HYBRID))
    return store


def evolve(store: RunStore, proposer: TPEProposer, rounds: range) -> list[Proposal]:
    out = []
    for r in rounds:
        req = request(store, r)
        child = proposer.propose(req)
        assert child.source is not None
        assert child.message.startswith("optuna: " if r >= STARTUP - 1 else "random: ")
        assert hashlib.sha256(child.source.encode()).hexdigest() not in req.known
        assert changed_components(req.parent.source, child.source)
        file(store, child.source, [req.parent.id], objective(child.source))
        out.append(child)
    return out


def test_proposals_are_deterministic_under_a_seed(tmp_path: Path) -> None:
    store = new_run(tmp_path, "r")
    evolve(store, TPEProposer(3, store.root), range(STARTUP))
    req = request(store, STARTUP)
    first = TPEProposer(3, store.root).propose(req)
    assert TPEProposer(3, store.root).propose(req) == first
    assert TPEProposer(4, store.root).propose(req).source != first.source
    assert TPEProposer(3, store.root).propose(request(store, STARTUP, child=1)) != first


def test_a_fresh_proposer_continues_the_stored_study(tmp_path: Path) -> None:
    rounds = STARTUP + 6
    whole = new_run(tmp_path, "whole")
    straight = evolve(whole, TPEProposer(1, whole.root), range(rounds))
    resumed = new_run(tmp_path, "resumed")
    before = evolve(resumed, TPEProposer(1, resumed.root), range(rounds - 4))
    after = evolve(resumed, TPEProposer(1, resumed.root), range(rounds - 4, rounds))
    assert [p.source for p in before + after] == [p.source for p in straight]
    # The study is the run's: the same request over other told values proposes otherwise.
    flipped = RunStore.create(tmp_path, {"config": {}}, run_id="flipped")
    for c in whole.candidates():
        file(flipped, whole.source(c.id), c.parents, -(c.scores["train"].overall.fitness or 0.0))
    reqs = [request(whole, rounds, child=k) for k in range(4)]  # 4 subspaces, 3 tunables each
    moved = [TPEProposer(1, whole.root).propose(req).source for req in reqs]
    assert [TPEProposer(1, flipped.root).propose(req).source for req in reqs] != moved


def test_a_replayed_round_proposes_the_same_child(tmp_path: Path) -> None:
    store = new_run(tmp_path, "r")
    evolve(store, TPEProposer(2, store.root), range(STARTUP + 2))
    round_no = STARTUP + 2
    asked = TPEProposer(2, store.root).propose(request(store, round_no))
    assert asked.source is not None
    killed = file(store, asked.source, [asked.parents[0]], None)  # filed, killed before judged
    assert TPEProposer(2, store.root).propose(request(store, round_no)) == asked
    # killed after its evaluation was filed: the replay's request leaves the round's own child
    # out (the loop's rule), and so does the study
    store.update(killed.id, status="evaluated", scores=scores(5.0))
    skip = frozenset({killed.id})
    assert TPEProposer(2, store.root).propose(request(store, round_no, skip=skip)) == asked


def test_a_replayed_round_proposes_the_same_second_child(tmp_path: Path) -> None:
    """K children per round: child 1 is asked while child 0 is only proposed (its sha known as
    a sibling); replayed after both were judged, child 0's score stays out of the study."""
    store = new_run(tmp_path, "r")
    evolve(store, TPEProposer(2, store.root), range(STARTUP + 2))
    round_no = STARTUP + 2
    first = TPEProposer(2, store.root).propose(request(store, round_no))
    assert first.source is not None
    sibling = file(store, first.source, [first.parents[0]], None)
    siblings = frozenset({sibling.source_sha256})
    second = TPEProposer(2, store.root).propose(request(store, round_no, child=1,
                                                        siblings=siblings))  # fmt: skip
    assert second.source not in (None, first.source)
    store.update(sibling.id, status="evaluated", scores=scores(5.0))
    replay = request(store, round_no, child=1, skip=frozenset({sibling.id}), siblings=siblings)
    assert TPEProposer(2, store.root).propose(replay) == second


def test_only_train_scores_and_the_target_steer_it(tmp_path: Path) -> None:
    base = new_run(tmp_path, "base")
    evolve(base, TPEProposer(5, base.root), range(STARTUP + 3))
    reqs = [
        request(base, STARTUP + 3, target="F", child=k) for k in range(8)
    ]  # 8 subspaces: some hold a tunable the history moved
    proposals = [TPEProposer(5, base.root).propose(req) for req in reqs]

    def rescored(name: str, make: Callable[[float], dict[str, dict[str, object]]]) -> list[str]:
        store = RunStore(shutil.copytree(base.root, tmp_path / name))
        for c in store.candidates():
            store.update(c.id, scores=make(c.scores["train"].overall.fitness or 0.0))
        return [TPEProposer(5, store.root).propose(req).source for req in reqs]

    sources = [p.source for p in proposals]
    assert rescored("valid", lambda t: scores(t, valid=-t)) == sources  # valid never read
    # refinement's objective is the target's train fitness, not the overall one
    assert rescored("target", lambda t: scores(t, f=-t)) != sources
    assert rescored("overall", lambda t: scores(-t, f=t)) == sources


def test_integration_searches_only_where_the_programs_differ(tmp_path: Path) -> None:
    store = new_run(tmp_path, "r")
    partner_source = (HYBRID.replace("TOP_K = 80", "TOP_K = 160")
                      .replace("MIN_SCORE = 0.15", "MIN_SCORE = 0.35")
                      .replace("DATE_PREFIX = True", "DATE_PREFIX = False"))  # fmt: skip
    seed = store.candidates()[0]
    partner = file(store, partner_source, [seed.id], 0.1)
    for i in range(1, STARTUP):  # trials inside the span, so TPE (not the fallback) proposes
        between = (HYBRID.replace("TOP_K = 80", f"TOP_K = {80 + 10 * i}")
                   .replace("MIN_SCORE = 0.15", f"MIN_SCORE = {0.15 + 0.03 * i:.2f}"))  # fmt: skip
        file(store, between, [seed.id], 0.1 * i)
    for round_no in range(12):
        req = Request("integration", round_no, view(store, seed), None,
                      specialists=(view(store, partner),),
                      known=frozenset(c.source_sha256 for c in store.candidates()))  # fmt: skip
        child = TPEProposer(0, store.root).propose(req)
        assert child.source is not None and child.parents == (seed.id, partner.id)
        # the partner's DATE_PREFIX differs too, but a format choice is never searched
        assert set(child.changes) <= {"TOP_K", "MIN_SCORE"} and child.changes
        got = values(child.source)
        assert isinstance(got["TOP_K"], int) and 80 <= got["TOP_K"] <= 160
        assert isinstance(got["MIN_SCORE"], float) and 0.15 <= got["MIN_SCORE"] <= 0.35
        assert "crossover with" in child.message


def test_random_search_stays_available(tmp_path: Path) -> None:
    cfg = RunConfig(data_dir="d", seed_program="s", cache_dir="c")
    assert cfg.offline_search == "optuna"
    assert type(constant_proposer(cfg, tmp_path)) is TPEProposer
    plain = constant_proposer(cfg.replace(offline_search="random"), tmp_path)
    assert type(plain) is ConstantProposer
    proposal = plain.propose(Request("refinement", 0, CandidateView("c0", HYBRID, {}), "F"))
    assert proposal.message.startswith("random: ")
    with pytest.raises(ValueError):
        cfg.replace(offline_search="grid")


def test_the_flag_reaches_therun_config(data_dir: Path, tmp_path: Path) -> None:
    argv = ["run", "--data-dir", str(data_dir), "--cache-dir", str(tmp_path)]
    for extra, expected in (([], "optuna"), (["--offline-search", "random"], "random")):
        args = build_parser().parse_args([*argv, *extra])
        assert run_config(args).offline_search == expected
    # --search-seed seeds the proposer (a run repeated with another seed searches otherwise)
    for extra, seed in (([], 0), (["--search-seed", "7"], 7)):
        config = run_config(build_parser().parse_args([*argv, *extra]))
        assert config.rng_seed == seed and constant_proposer(config, tmp_path).seed == seed


def rebuilds(parent: str, child: str) -> bool:
    return bool(set(changed_components(parent, child)) & set(REBUILD))


def test_without_index_moves_no_child_encodes_the_conversations_again(tmp_path: Path) -> None:
    """A move of a constant extraction or indexing reads costs a full re-encoding (103-216 s a
    child against 2-18 s in the default run): a run's default proposer never makes one."""
    assert rebuild_names(HYBRID) == {"CHUNK_CHARS", "CHUNK_OVERLAP"}
    store = new_run(tmp_path, "r")
    children = evolve(store, TPEProposer(1, store.root, index_moves=False), range(STARTUP + 6))
    assert not any(rebuilds(HYBRID, c.source or "") for c in children)
    fixed, free = ConstantProposer(0, index_moves=False), ConstantProposer(0)
    assert not any(rebuilds(HYBRID, fixed.mutate(HYBRID, None, r).source or "")
                   for r in range(60))  # fmt: skip
    assert any(rebuilds(HYBRID, free.mutate(HYBRID, None, r).source or "") for r in range(60))
    b = HYBRID.replace("CHUNK_CHARS = 600", "CHUNK_CHARS = 900")
    assert free.crossover(HYBRID, b, 0).changes == {"CHUNK_CHARS": (600, 900)}
    with pytest.raises(ValueError, match="no differing"):
        fixed.crossover(HYBRID, b, 0)
    both = b.replace("TOP_K = 80", "TOP_K = 120")
    assert all(set(fixed.crossover(HYBRID, both, r).changes or {}) == {"TOP_K"}
               for r in range(8))  # fmt: skip


def test_index_moves_are_off_unless_asked_and_old_runs_keep_them(
    data_dir: Path, tmp_path: Path
) -> None:
    argv = ["run", "--data-dir", str(data_dir), "--cache-dir", str(tmp_path)]
    for extra, expected in (([], False), (["--index-moves"], True)):
        config = run_config(build_parser().parse_args([*argv, *extra]))
        assert config.index_moves is expected
        assert constant_proposer(config, tmp_path).index_moves is expected
    old = RunConfig(data_dir="d", seed_program="s", cache_dir="c").as_json()
    del old["index_moves"]  # a run stored before the option moved them
    assert stored_config({"config": old}, "r").index_moves is True


def test_a_child_searches_a_few_tunables_the_targets_guided_first(tmp_path: Path) -> None:
    """TPE over all eighteen tunables with a dozen trials sampled almost uniformly: every
    such child of a BEAM run was far worse than its parent. A child moves few, the target
    capability's guided ones first."""
    store = new_run(tmp_path, "r")
    evolve(store, TPEProposer(2, store.root), range(STARTUP + 2))
    for k in range(4):
        changes = TPEProposer(2, store.root).propose(request(store, STARTUP + 2, target="P",
                                                             child=k)).changes  # fmt: skip
        assert changes is not None and 1 <= len(changes) <= SUBSPACE
        guided = {"USER_WEIGHT", "ASSISTANT_WEIGHT"}  # GUIDANCE["P"]
        assert set(changes) & guided or len(changes) < SUBSPACE, changes


def test_children_the_cascade_stopped_are_trials_at_their_estimated_value(tmp_path: Path) -> None:
    store = new_run(tmp_path, "r")
    seed = store.candidates()[0]
    train = seed.scores["train"].model_copy(update={
        "questions": {"q1": 0.8, "q2": 0.6, "q3": 0.5},
        "question_capabilities": {"q1": "F", "q2": "F", "q3": "T"}})  # fmt: skip
    store.update(seed.id, scores={**seed.scores, "train": train})
    child = store.add_candidate(HYBRID.replace("TOP_K = 80", "TOP_K = 40"), parents=[seed.id],
                                stage="refinement", capability="F", message="m")  # fmt: skip
    store.update(
        child.id,
        status="stopped",
        cascade={"parent": seed.id, "verdict": "stopped"},
        scores={"minibatch": {"questions": {"q1": 0.4, "q2": 0.4, "q3": 0.5}}},
    )
    space = {"TOP_K": IntDistribution(5, 500, log=True)}
    proposer, f = TPEProposer(0, store.root), objective(HYBRID)
    on_f = proposer._trials(request(store, 1, target="F"), space)  # F's two questions: -0.3
    assert [(p, round(v, 6)) for p, v in on_f] == [
        ({"TOP_K": 80}, round(f, 6)),
        ({"TOP_K": 40}, round(f - 0.3, 6)),
    ]
    overall = proposer._trials(request(store, 1), space)  # all three: -0.2
    assert [round(v, 6) for _, v in overall] == [round(f, 6), round(f - 0.2, 6)]
