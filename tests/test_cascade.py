"""K children per round and the evaluation cascade: the minibatch screen stops a clearly worse
child and promotes a better one (whose full evaluation reuses the minibatch's stages), the K
children of a refinement round are spread over capabilities by the dependency-aware rule, and
a replayed round proposes the same children.

Offline, hashing embedder (deterministic, meaningless numbers), two train conversations.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import run_config

from evolve.evolution.annotate import Labels
from evolve.evolution.archive import archive
from evolve.evolution.cascade import minibatch, saved_seconds
from evolve.evolution.loop import Evolution
from evolve.evolution.selection import DependencyAware, RoundRobin, ranking, spread
from evolve.evolution.store import CandidateMeta, RunStore

ROOT = Path(__file__).resolve().parents[1]
HYBRID = (ROOT / "seeds" / "hybrid.py").read_text()
WEAK = HYBRID.replace("TOP_K = 80 ", "TOP_K = 1 ")  # one unit per question: clearly worse
# the runs here: conftest's run_config on two train conversations, a one-conversation minibatch
SCREENING = {"conversations": 2, "minibatch": 1,
             "rounds": dict.fromkeys(("cold_start", "refinement", "integration"), 0)}  # fmt: skip
pytestmark = pytest.mark.usefixtures("check_once")  # the runs here check the same programs


def add(store: RunStore, source: str, parents: list[str], stage: str) -> CandidateMeta:
    return store.add_candidate(source, parents=parents, stage=stage, capability=None,
                               message=stage)  # fmt: skip


@pytest.fixture(scope="module")
def screened(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> RunStore:
    """A run whose parents are the seed and the weak program, each fully evaluated; then the
    weak program's revision back to the seed is screened against the weak one (better) and a
    weak child against the seed (worse). A fresh cache, so stage counters mean something."""
    root = tmp_path_factory.mktemp("cascade")
    cfg = run_config(data_dir, root / "cache", **SCREENING)
    store = RunStore.create(root, {"config": cfg.as_json()}, run_id="screen")
    evolution = Evolution(store, cfg)
    seed = add(store, HYBRID, [], "seed")
    weak = add(store, WEAK, [], "seed")
    evolution.evaluator.judge_all([(seed, None), (weak, None)], None)
    worse = add(store, WEAK.replace("MIN_SCORE = 0.15 ", "MIN_SCORE = 0.2 "), [seed.id],
                "cold_start")  # fmt: skip
    better = add(store, HYBRID.replace("NEIGHBOURS = 0 ", "NEIGHBOURS = 1 "), [weak.id],
                 "cold_start")  # fmt: skip
    evolution.evaluator.judge_all([(worse, None)], store.get(seed.id))
    evolution.evaluator.judge_all([(better, None)], store.get(weak.id))
    return store


def test_the_cascade_stops_a_clearly_worse_child(screened: RunStore):
    seed, weak, worse, better = screened.candidates()
    assert worse.status == "stopped" and "worse than its parent" in worse.message
    assert worse.cascade is not None and worse.cascade["verdict"] == "stopped"
    assert worse.cascade["fitness"] < worse.cascade["parent_fitness"]
    assert set(worse.scores) == {"minibatch"}  # it cost nothing more
    assert worse.id not in {e["data"]["candidate"] for e in screened.events("evaluated")}
    kept = archive(screened.candidates())
    assert worse.id not in {kept.best.id if kept.best else None,
                            *(c.id for c in kept.specialists.values())}  # fmt: skip
    assert worse.seconds == worse.cascade["seconds"] > 0
    assert saved_seconds(screened.candidates()) == worse.cascade["saved_seconds"] > 0


def test_the_cascade_promotes_a_better_child_and_reuses_its_minibatch(screened: RunStore):
    seed, weak, worse, better = screened.candidates()
    assert better.status == "evaluated" and better.cascade is not None
    assert better.cascade["verdict"] == "promoted" and better.cascade["reason"] is None
    assert better.cascade["fitness"] > better.cascade["parent_fitness"]
    assert set(better.scores) == {"minibatch", "train", "valid"}
    batch = better.cascade["conversations"]
    assert len(batch) == 1 and better.cascade["questions"] > 0
    # the full train evaluation reused the minibatch's retrievals and computed only the rest
    mb = better.scores["minibatch"].steps["retrieve"]
    train = better.scores["train"].steps["retrieve"]
    assert mb["computed"] == better.cascade["questions"] and mb["reused"] == 0
    assert train["reused"] == better.cascade["questions"]
    every = len(better.scores["train"].question_capabilities)  # one per train question
    assert train["computed"] == every - train["reused"] > 0
    assert better.seconds > better.cascade["seconds"]  # minibatch and full, both counted
    phases = [(e["data"]["candidate"], e["data"]["phase"]) for e in screened.events("evaluating")]
    assert phases.count((better.id, "minibatch")) == phases.count((better.id, "full")) == 1


def test_the_minibatch_is_where_the_parent_fails_most(screened: RunStore, data_dir: Path):
    weak = screened.candidates()[1]
    cfg = run_config(data_dir, Path(screened.manifest["config"]["cache_dir"]), **SCREENING)
    train = Evolution(screened, cfg).tasks("train")
    per = weak.scores["train"].questions
    means = {c: [per[q.id] for q in qs if q.id in per] for c, qs in
             train.by_conversation().items()}  # fmt: skip
    worst = min(means, key=lambda c: (sum(means[c]) / len(means[c]), c))
    batch = minibatch(weak, train, 1)
    assert [c.id for c in batch.conversations] == [worst]
    assert {q.conversation_id for q in batch.questions} == {worst}
    assert len(minibatch(weak, train, 5).conversations) == len(train.conversations)


def test_spread_gives_the_weakest_most():
    ranked = ["M", "F", "T", "P", "A"]
    assert spread(ranked, 1) == ["M"]
    assert spread(ranked, 2) == ["M", "F"]
    assert spread(ranked, 4) == ["M", "M", "F", "T"]
    assert spread(ranked, 5) == ["M", "M", "M", "F", "T"]
    assert spread(["F"], 3) == ["F", "F", "F"]
    for k in range(1, 12):
        out = spread(ranked, k)
        assert len(out) == k and all(out.count("M") >= out.count(c) for c in ranked)


def _meta(number: int, per: dict[str, float], stage: str = "seed", **over: object) -> CandidateMeta:
    fields = {"id": f"c{number:04d}-0000000{number}", "number": number, "parents": [],
              "stage": stage, "capability": None, "message": "", "source_sha256": str(number),
              "status": "evaluated", "sandbox": None, "scores": {"train": {"questions": per}},
              "usage": {}, "seconds": 0.0, "created": 0.0}  # fmt: skip
    return CandidateMeta.model_validate({**fields, **over})


def test_refinement_children_follow_the_dependency_rule():
    labels = {f"{cap}{i}": Labels(cap, (), "x") for cap in "FTPMA" for i in range(4)}
    per = {q: {"F": 0.9, "T": 0.2, "P": 0.5, "M": 0.4, "A": 0.8}[q[0]] for q in labels}
    parent = _meta(0, per)
    assert ranking(per, labels) == ["T", "M", "P", "A", "F"]
    assert DependencyAware().targets(parent, [parent], labels, 0, 4) == [
        "T", "T", "M", "P"]  # fmt: skip
    # last round's T children did not raise T: T is stalled and goes last; M gained
    tried = [
        _meta(1, {**per, "T0": 0.1}, "refinement", capability="T", parents=[parent.id]),
        _meta(2, {**per, "M0": 0.9}, "refinement", capability="M", parents=[parent.id]),
    ]
    stalled = DependencyAware().targets(parent, [parent, *tried], labels, 1, 2)
    assert stalled == ["M", "P"]
    assert RoundRobin().targets(parent, [parent], labels, 1, 3) == ["M", "A", "F"]


def test_a_replayed_round_proposes_the_same_children(
    data_dir: Path, offline_cache: Path, tmp_path: Path
):
    """The K children's requests differ only by ``child`` and by their earlier siblings, and
    rebuilding a round (as a resume does) proposes the same sources."""
    one_round = {"cold_start": 0, "refinement": 1, "integration": 0}
    cfg = run_config(data_dir, offline_cache, minibatch=1, children=3, rounds=one_round)
    store = RunStore.create(tmp_path, {"config": cfg.as_json()}, run_id="replay")
    Evolution(store, cfg).run()
    first = [c.source_sha256 for c in store.candidates()[1:]]
    assert len(set(first)) == 3  # three distinct children
    targets = [c.capability for c in store.candidates()[1:]]
    seed = store.candidates()[0]
    assert targets == DependencyAware().targets(seed, [seed], Evolution(store, cfg).labels(), 0, 3)
    replay = Evolution(RunStore.open(tmp_path, "replay"), cfg)
    siblings: frozenset[str] = frozenset()
    again = []
    for i in range(3):
        request = replay.request("refinement", 0, 0, i, siblings)
        assert request.child == i and request.target == targets[i]
        proposal = replay.attempt(request)[0]
        assert proposal.source is not None
        sha = replay.store.add_candidate(proposal.source, parents=list(proposal.parents),
                                         stage="refinement", capability=request.target,
                                         message=proposal.message).source_sha256  # fmt: skip
        siblings |= {sha}
        again.append(sha)
    assert again == first
    assert len(store.candidates()) == 4  # nothing new was filed
