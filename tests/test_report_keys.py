"""No score or report key is read by string outside ``evolve/evaluation/report.py``.

The records of :mod:`evolve.evaluation.report` (a candidate's score blocks and their rows, an
evaluation's report) are read by attribute everywhere else in ``evolve/``, so mypy checks every
read. This walks the syntax tree of every module of ``evolve/`` and fails on a read by a string
key named like one of those records' fields: ``x["key"]``, ``x.get("key")`` (``pop``,
``setdefault``) and ``"key" in x``. Field names that name other records' keys too (a run's
``bench``, a regex match's ``n``, a describe's ``judge``...) are left out (:data:`GENERIC`), and
so is the run manifest, a record of its own (its ``fitness`` is the mode a run selects on).
"""

from __future__ import annotations

import ast
from pathlib import Path

from evolve.evaluation.report import MetricRow, ReportMeta, ReportScores, ScoreBlock

EVOLVE = Path(__file__).resolve().parents[1] / "evolve"
OWNER = EVOLVE / "evaluation" / "report.py"  # the one module that reads them by key
GENERIC = {"n", "program", "bench", "split", "conversations", "mode", "models", "judge",
           "metrics", "seconds", "time", "traces"}  # fmt: skip
# each field's name, and its key on disk where that is another word (ScoreBlock.steps: "stages")
KEYS = {
    key
    for m in (ScoreBlock, MetricRow, ReportScores, ReportMeta)
    for name, f in m.model_fields.items()
    for key in (name, f.serialization_alias or name)
}
KEYS -= GENERIC
MANIFEST = "manifest"  # a read on ``manifest`` or ``<x>.manifest`` is the manifest's


def _receiver_is_manifest(node: ast.expr) -> bool:
    return (isinstance(node, ast.Name) and node.id == MANIFEST) or (
        isinstance(node, ast.Attribute) and node.attr == MANIFEST
    )


def key_reads(source: str) -> list[tuple[int, str]]:
    """(line, code) of every read of a score or report key by string in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        key, receiver = None, None
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            key, receiver = node.slice, node.value
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in ("get", "pop", "setdefault") and node.args):  # fmt: skip
            key, receiver = node.args[0], node.func.value
        elif (isinstance(node, ast.Compare) and len(node.ops) == 1
              and isinstance(node.ops[0], ast.In | ast.NotIn)):  # fmt: skip
            key, receiver = node.left, node.comparators[0]
        if (isinstance(key, ast.Constant) and key.value in KEYS and receiver is not None
                and not _receiver_is_manifest(receiver)):  # fmt: skip
            found.append((node.lineno, ast.unparse(node)))
    return found


def test_the_keys_are_the_records_fields():
    assert {"overall", "by_capability", "fitness", "questions", "errors", "headline", "ceiling",
            "stages", "steps", "by_type", "program_hash", "unjudged"} <= KEYS  # fmt: skip


def test_the_check_sees_each_kind_of_read():
    source = 'a = b["overall"]\nc = d.get("by_capability", {})\ne = "ceiling" in f\n'
    assert [line for line, _ in key_reads(source)] == [1, 2, 3]
    allowed = 'a = {"overall": 1}\nb["fitness"] = 2\nc = manifest.get("fitness")\n'
    assert key_reads(allowed + 'd = store.manifest["fitness"]\ne = x["evidence_coverage"]\n') == []


def test_no_score_or_report_key_is_read_by_string_outside_report_py():
    reads = [
        f"{path.relative_to(EVOLVE.parent)}:{line}: {code}"
        for path in sorted(EVOLVE.rglob("*.py"))
        if path != OWNER
        for line, code in key_reads(path.read_text(encoding="utf-8"))
    ]
    assert reads == [], "read these through evolve.evaluation.report's records:\n" + "\n".join(
        reads
    )
