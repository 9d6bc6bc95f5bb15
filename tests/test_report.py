"""The records of ``evolve/evaluation/report.py`` write back the JSON they were read from.

A candidate's record carries a checksum of its JSON, so a score block that gained a key (a
default) or lost one (a bench's metric) on the way through the typed records would make every
stored candidate read as damaged.
"""

from __future__ import annotations

import json
from pathlib import Path

from evolve.evaluation.report import (
    TEST_FIELDS,
    EvalReport,
    FitnessMode,
    MetricRow,
    ReportMeta,
    ReportScores,
    ScoreBlock,
)
from evolve.evolution.candidate import meta_checksum, read_meta

FIXTURE = Path(__file__).parent / "fixtures" / "before41" / "run"


def test_stored_candidates_are_written_back_byte_for_byte():
    paths = sorted(FIXTURE.glob("*/candidates/*.json"))
    assert len(paths) == 5
    for path in paths:
        meta = read_meta(path)  # checks the stored checksum against the typed record's JSON
        assert meta.model_dump_json(indent=2).encode() == path.read_bytes(), path.name
        assert meta.checksum == meta_checksum(meta)


def test_a_block_keeps_what_it_was_given_and_no_more():
    older = {"overall": {"n": 2, "evidence_similarity": 0.5}, "errors": 0, "extra": [1]}
    block = ScoreBlock.model_validate(older)
    assert block.model_dump() == older  # no default added, the unknown key kept
    assert block.overall.fitness is None and block.overall.metric("evidence_similarity") == 0.5
    assert block.row("F") is None and block.questions == {}
    routed = block.model_copy(update={"routing": {"beats_routing": True}})
    assert list(routed.model_dump()) == ["overall", "errors", "routing", "extra"]
    assert json.loads(ScoreBlock.model_validate_json(json.dumps(older)).model_dump_json()) == older


def test_a_block_has_the_stored_keys_in_order_and_a_test_block_its_fields_only():
    meta = ReportMeta(program="p.py", bench="beam", split="valid", conversations=1, questions=1,
                      mode="online", errors=0, fitness=FitnessMode(name="retrieval"))  # fmt: skip
    scores = ReportScores(overall=MetricRow(n=1, fitness=0.5), by_capability={}, by_type={})
    report = EvalReport(meta, scores, steps={}, usage={}, work={}, traces=[])
    assert list(ScoreBlock.of(report, {"q": 0.5}).model_dump()) == [
        "fitness", "overall", "by_capability", "headline", "errors", "unjudged", "questions",
        "question_capabilities", "diagnostics", "stages",
    ]  # fmt: skip
    test = ScoreBlock.test_block(report).model_dump()
    assert list(test) == list(TEST_FIELDS) and test["overall"] == {"n": 1, "fitness": 0.5}


def test_step_counters_are_steps_in_code_and_stages_on_disk():
    counts = {"index": {"computed": 1, "reused": 0}}
    block = ScoreBlock(steps=counts)
    assert block.model_dump() == {"stages": counts} == block.model_dump(by_alias=True)
    assert json.loads(block.model_dump_json()) == {"stages": counts}
    assert ScoreBlock.model_validate({"stages": counts}).steps == counts
    meta = ReportMeta(program="p.py", bench="beam", split="valid", conversations=1, questions=1,
                      mode="offline", errors=0)  # fmt: skip
    report = EvalReport(meta, ReportScores(overall=MetricRow(n=1)), counts, {}, {}, [])
    assert list(report.as_json()) == ["meta", "scores", "stages", "usage", "work"]
    assert ScoreBlock.of(report, {}).model_dump()["stages"] == counts
