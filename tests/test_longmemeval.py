"""LongMemEval: the fixture through loader, split rule and judge scorer (no LongMemEval data
ships here; tests/fixtures/longmemeval/ follows the released format, docs/benchmarks.md §3.1)."""

from __future__ import annotations

import json
import re
import runpy
from collections import Counter
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from evolve.benches.registry import bench
from evolve.datasets import longmemeval as lme
from evolve.datasets.types import DataError, Question, TaskSet
from evolve.models.llm import Message, ModelConfig, Models
from evolve.models.testing import ScriptedLLM
from evolve.scoring import longmemeval as judge
from evolve.scoring.answers import prompt_sha256

FIXTURES = Path(__file__).resolve().parent / "fixtures"
FIXTURE_DIR = FIXTURES / "longmemeval"
ISO = re.compile(r"^\d{4}-\d{2}-\d{2}$")
ABSTENTION = {"fx02_abs", "fx10_abs", "fx14_abs"}
TYPE_OF = {
    "fx01": "single-session-user",
    "fx02_abs": "single-session-user",
    "fx03": "single-session-user",
    "fx04": "single-session-assistant",
    "fx05": "single-session-assistant",
    "fx06": "single-session-preference",
    "fx07": "single-session-preference",
    "fx08": "temporal-reasoning",
    "fx09": "temporal-reasoning",
    "fx10_abs": "temporal-reasoning",
    "fx11": "knowledge-update",
    "fx12": "knowledge-update",
    "fx13": "multi-session",
    "fx14_abs": "multi-session",
}


@pytest.fixture(scope="module")
def variants() -> dict[str, TaskSet]:
    return {v: lme.load_taskset(FIXTURES, "all" if v == "s" else f"all:{v}") for v in lme.VARIANTS}


def _one_line_error(call: Callable[[], object], *needles: str) -> str:
    with pytest.raises(DataError) as info:
        call()
    message = str(info.value)
    assert "\n" not in message, message
    for needle in needles:
        assert needle in message, (needle, message)
    return message


def _write(root: Path, name: str, instances: Any) -> Path:
    path = root / "longmemeval" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(instances), encoding="utf-8")
    return path


def _minimal(qid: str, qtype: str) -> dict[str, Any]:
    """A one-session instance: enough for the split rule at release scale."""
    return {
        "question_id": qid,
        "question_type": qtype,
        "question": "q?",
        "answer": "a",
        "question_date": "2023/05/30 (Tue) 23:40",
        "haystack_session_ids": [f"answer_{qid}"],
        "haystack_dates": ["2023/05/20 (Sat) 02:21"],
        "haystack_sessions": [[{"role": "user", "content": "x", "has_answer": True}]],
        "answer_session_ids": [f"answer_{qid}"],
    }


# ---------------------------------------------------------------- fixture and loader


def test_fixture_files_are_what_the_generator_writes() -> None:
    generated = runpy.run_path(str(FIXTURE_DIR / "generate.py"))["files"]()
    assert sorted(generated) == sorted(p.name for p in FIXTURE_DIR.glob("*.json"))
    for name, text in generated.items():
        assert (FIXTURE_DIR / name).read_text(encoding="utf-8") == text, name


def test_every_variant_loads_one_haystack_per_question(variants: dict[str, TaskSet]) -> None:
    for variant, tasks in variants.items():
        assert tasks.bench == "longmemeval"
        assert [q.id for q in tasks.questions] == list(TYPE_OF)  # file order
        for conv, q in zip(tasks.conversations, tasks.questions, strict=True):
            assert conv.id == q.conversation_id == f"longmemeval/{variant}/{q.id}"
            assert conv.meta["variant"] == q.meta["variant"] == variant
            assert conv.meta["file"] == f"longmemeval_{variant}.json"
            ids = [m.id for s in conv.sessions for m in s.messages]
            assert len(ids) == len(set(ids))
            for s in conv.sessions:
                assert s.date is not None and ISO.match(s.date)
                assert [m.id for m in s.messages] == [f"{s.session_id}:{t}" for t in range(2)]
            dates = [s.date or "" for s in conv.sessions]
            assert dates == sorted(dates)
            assert set(conv.meta["session_dates"]) == {s.session_id for s in conv.sessions}
            assert bool(q.evidence_ids) is (q.id not in ABSTENTION)
            assert set(q.evidence_ids) <= set(conv.messages())
    lengths = {v: [len(c.sessions) for c in t.conversations] for v, t in variants.items()}
    assert all(2 <= n <= 4 for n in lengths["s"])
    assert [n + 1 for n in lengths["s"]] == lengths["m"]
    assert all(1 <= n <= 2 for n in lengths["oracle"])


def test_questions_types_capabilities_and_dates(variants: dict[str, TaskSet]) -> None:
    tasks = variants["s"]
    by_id = {q.id: q for q in tasks.questions}
    for qid, q in by_id.items():
        assert q.ability == TYPE_OF[qid]
        expected = "A" if qid in ABSTENTION else lme.TYPE_CAPABILITY[TYPE_OF[qid]]
        assert q.capability == expected
        assert q.meta["abstention"] is (qid in ABSTENTION)
        assert q.question_date is not None and ISO.match(q.question_date)
    assert Counter(q.capability for q in tasks.questions) == {
        "F": 4,
        "P": 2,
        "T": 4,
        "M": 1,
        "A": 3,
    }
    fx01 = by_id["fx01"]
    assert (fx01.question_date, fx01.meta["question_date_raw"]) == (
        "2023-05-30",
        "2023/05/30 (Tue) 23:40",
    )
    assert fx01.gold == "Business Administration" and fx01.rubric == ()
    assert by_id["fx11"].gold == "20" and by_id["fx13"].gold == "3"  # int answers cast
    assert by_id["fx06"].rubric == (by_id["fx06"].gold,)  # preference: the gold is a rubric
    assert by_id["fx08"].meta["answer_session_ids"] == ["answer_fx08_b", "answer_fx08_a"]
    conv = tasks.conversations[0]
    assert conv.sessions[1].session_id == "answer_fx01"
    assert conv.meta["session_dates"]["answer_fx01"] == "2023/05/22 (Mon) 10:05"
    assert conv.sessions[1].messages[0].content.startswith("I graduated with a degree")


def test_evidence_marked_fallback_and_abstention(variants: dict[str, TaskSet]) -> None:
    by_id = {q.id: q for q in variants["s"].questions}
    assert by_id["fx01"].evidence_ids == ("answer_fx01:0",)
    assert by_id["fx04"].evidence_ids == ("answer_fx04:1",)  # an assistant turn
    assert by_id["fx08"].evidence_ids == ("answer_fx08_a:0", "answer_fx08_b:0")
    assert by_id["fx01"].meta["evidence_source"] == "has_answer"
    assert by_id["fx03"].evidence_ids == ("answer_fx03:0", "answer_fx03:1")  # nothing marked
    assert by_id["fx03"].meta["evidence_source"] == "answer_session_ids"
    for qid in ABSTENTION:
        assert by_id[qid].evidence_ids == ()
        assert by_id[qid].meta["evidence_source"] == "none (abstention)"
    assert by_id["fx10_abs"].meta["marked_evidence_ids"] == ["answer_fx10:0"]


def test_repeated_session_ids_and_unsorted_oracle(variants: dict[str, TaskSet]) -> None:
    fx05 = next(c for c in variants["s"].conversations if c.meta["question_id"] == "fx05")
    assert [s.session_id for s in fx05.sessions] == [
        "sharegpt_f03",
        "answer_fx05",
        "sharegpt_f03#2",
    ]
    assert fx05.meta["duplicate_sessions"] == [["sharegpt_f03", "sharegpt_f03#2"]]
    assert fx05.sessions[2].messages[0].id == "sharegpt_f03#2:0"
    oracle = {c.meta["question_id"]: c for c in variants["oracle"].conversations}
    assert [s.session_id for s in oracle["fx08"].sessions] == ["answer_fx08_a", "answer_fx08_b"]
    assert oracle["fx08"].meta["reordered_by_date"] is True
    assert "reordered_by_date" not in oracle["fx09"].meta
    assert all("reordered_by_date" not in c.meta for c in variants["s"].conversations)


def test_unparseable_dates_keep_their_text_and_file_order(tmp_path: Path) -> None:
    inst = _minimal("q1", "multi-session")
    inst["haystack_session_ids"] = ["b", "a"]
    inst["haystack_dates"] = ["2023/05/21 (Sun) 10:00", "sometime in May"]
    inst["haystack_sessions"] = [[{"role": "user", "content": "x"}]] * 2
    inst["question_date"] = "later"
    _write(tmp_path, "longmemeval_s.json", [inst])
    tasks = lme.load_taskset(tmp_path, "all")
    assert [(s.session_id, s.date) for s in tasks.conversations[0].sessions] == [
        ("b", "2023-05-21"),
        ("a", "sometime in May"),
    ]
    assert tasks.questions[0].question_date == "later"
    assert lme.parse_date("2023/02/30 (Thu) 10:00") == ("2023/02/30 (Thu) 10:00", None)


def test_file_lookup_order_and_missing_files(tmp_path: Path) -> None:
    _one_line_error(lambda: lme.load_taskset(tmp_path, "all"), "longmemeval_s.json", "or")
    message = _one_line_error(lambda: lme.data_file(tmp_path, "m"), "longmemeval_m_cleaned.json")
    assert str(tmp_path / "longmemeval" / "longmemeval_m.json") in message
    _one_line_error(lambda: lme.data_file(tmp_path, "oracle"), "longmemeval_oracle.json")
    _one_line_error(lambda: lme.load_taskset(tmp_path, "all:xl"), "all:xl")
    _one_line_error(lambda: lme.load_taskset(FIXTURES, "holdout"), "holdout", "all:oracle")
    cleaned = _write(tmp_path, "longmemeval_s_cleaned.json", [_minimal("c1", "multi-session")])
    assert lme.data_file(tmp_path, "s") == cleaned
    assert lme.load_taskset(tmp_path, "all").conversations[0].meta["file"] == cleaned.name
    plain = _write(tmp_path, "longmemeval_s.json", [_minimal("p1", "multi-session")])
    assert lme.data_file(tmp_path, "s") == plain
    assert [q.id for q in lme.load_taskset(tmp_path, "all:s").questions] == ["p1"]


def test_registry_loads_longmemeval() -> None:
    tasks = bench("longmemeval").load_taskset(FIXTURES, "all:oracle")
    assert tasks.split == "all:oracle" and len(tasks.questions) == 14
    assert bench("longmemeval").default_split == "valid"
    assert bench("longmemeval").load_taskset(FIXTURES).split == "valid"


# ---------------------------------------------------------------- splits


def test_split_rule_file_is_what_the_code_writes() -> None:
    text = lme.DEFAULT_SPLITS_FILE.read_text(encoding="utf-8")
    assert text == lme.render_rule(json.loads(text)["seed"])
    rule = lme.read_rule()
    assert {n: (e["variant"], e["n_questions"]) for n, e in rule["splits"].items()} == {
        "train": ("s", 60),
        "valid": ("s", 60),
        "test": ("m", 200),
    }
    assert sum(rule["release_per_type"].values()) == rule["release_questions"] == 500


def test_release_scale_split_is_exact_stratified_disjoint_and_seeded(tmp_path: Path) -> None:
    rule = lme.read_rule()
    instances = [
        _minimal(f"q{t}{i:03d}" + ("_abs" if i % 17 == 0 else ""), qtype)
        for t, (qtype, n) in enumerate(lme.RELEASE_PER_TYPE.items())
        for i in range(n)
    ]
    for name in ("longmemeval_s.json", "longmemeval_m.json"):
        _write(tmp_path, name, instances)
    type_of = {inst["question_id"]: inst["question_type"] for inst in instances}
    ids = {split: lme.split_ids(tmp_path, split) for split in lme.SPLIT_NAMES}
    for split, chosen in ids.items():
        entry = rule["splits"][split]
        assert len(chosen) == len(set(chosen)) == entry["n_questions"]
        assert Counter(type_of[q] for q in chosen) == entry["release_per_type"]
    assert not set(ids["train"]) & set(ids["valid"])
    assert not (set(ids["train"]) | set(ids["valid"])) & set(ids["test"])
    # deterministic, independent of file order, and driven by the seed
    _write(tmp_path, "longmemeval_s.json", instances[::-1])
    assert lme.split_ids(tmp_path, "train") == ids["train"]
    assert lme.plan(rule, type_of)["train"] == ids["train"]
    assert lme.plan({**rule, "seed": 1}, type_of)["train"] != ids["train"]
    tasks = lme.load_taskset(tmp_path, "test")
    assert [q.id for q in tasks.questions] == sorted(ids["test"])  # file order, here sorted
    assert all(q.meta["variant"] == "m" for q in tasks.questions)
    assert all("split_scaled" not in c.meta for c in tasks.conversations)


def test_largest_remainder_allocation() -> None:
    counts = dict(lme.RELEASE_PER_TYPE)
    seats = lme.allocate(60, counts, dict(counts))
    # quotas 8.4, 6.72, 3.6, 15.96, 9.36, 15.96: floors sum to 56, the four largest remainders
    # (15.96 twice, 6.72, 3.6) take the other 4 seats
    assert seats == {
        "single-session-user": 8,
        "single-session-assistant": 7,
        "single-session-preference": 4,
        "temporal-reasoning": 16,
        "knowledge-update": 9,
        "multi-session": 16,
    }
    assert lme.allocate(2, {"b": 1, "a": 1, "c": 1}, {"b": 1, "a": 1, "c": 1}) == {
        "b": 1,
        "a": 1,
        "c": 0,
    }  # ties go to the alphabetically first types
    # a type without room passes its seat on; no room at all is an error
    assert lme.allocate(2, {"a": 3, "b": 1}, {"a": 1, "b": 1}) == {"a": 1, "b": 1}
    with pytest.raises(DataError, match="used up"):
        lme.allocate(3, {"a": 3, "b": 1}, {"a": 1, "b": 1})


def test_fixture_splits_scale_down(variants: dict[str, TaskSet]) -> None:
    splits = {name: lme.load_taskset(FIXTURES, name) for name in lme.SPLIT_NAMES}
    # round_half_up(size * 14 / 500): train 1.68 -> 2, valid 1.68 -> 2, test 5.6 -> 6
    assert {n: len(t.questions) for n, t in splits.items()} == {"train": 2, "valid": 2, "test": 6}
    for name, tasks in splits.items():
        assert tasks.split == name
        assert [c.id for c in tasks.conversations] == [q.conversation_id for q in tasks.questions]
        note = tasks.conversations[0].meta["split_scaled"]
        assert note.startswith(f"{name}: {len(tasks.questions)} of ") and "14 of" in note
    # seats follow the type counts: 3 single-session-user and 3 temporal-reasoning items lead
    train_types = Counter(TYPE_OF[q.id] for q in splits["train"].questions)
    assert train_types == {"single-session-user": 1, "temporal-reasoning": 1}
    assert Counter(TYPE_OF[q.id] for q in splits["test"].questions) == dict.fromkeys(lme.TYPES, 1)
    ids = {n: {q.id for q in t.questions} for n, t in splits.items()}
    assert not ids["train"] & ids["valid"] and not (ids["train"] | ids["valid"]) & ids["test"]
    assert splits["test"].conversations[0].id.startswith("longmemeval/m/")
    again = lme.load_taskset(FIXTURES, "train")
    assert [q.id for q in again.questions] == [q.id for q in splits["train"].questions]


def test_too_few_questions_and_bad_rule(tmp_path: Path) -> None:
    _write(tmp_path, "longmemeval_s.json", [_minimal(f"q{i}", "multi-session") for i in range(4)])
    _one_line_error(
        lambda: lme.load_taskset(tmp_path, "train"), "4 questions", "'train'", "at least 5"
    )
    _write(tmp_path, "longmemeval_s.json", [_minimal(f"q{i}", "multi-session") for i in range(5)])
    assert len(lme.split_ids(tmp_path, "train")) == 1
    _one_line_error(lambda: lme.split_ids(tmp_path, "test"), "longmemeval_m.json")
    bad = tmp_path / "rule.json"
    bad.write_text(json.dumps({"seed": "zero", "splits": {}}))
    _one_line_error(lambda: lme.load_taskset(tmp_path, "train", bad), str(bad), "'seed'")
    rule = lme.build_rule()
    del rule["splits"]["valid"]
    bad.write_text(json.dumps(rule))
    _one_line_error(lambda: lme.split_ids(tmp_path, "valid", bad), "no split 'valid'")


# ---------------------------------------------------------------- malformed files


_DROP = object()


def _mutate(key: str, value: Any) -> Callable[[list[Any]], Any]:
    def apply(data: list[Any]) -> Any:
        if value is _DROP:
            del data[3][key]
        else:
            data[3][key] = value
        return data

    return apply


def _turn_without_content(data: list[Any]) -> list[Any]:
    del data[3]["haystack_sessions"][1][0]["content"]
    return data


def _repeat_id(data: list[Any]) -> list[Any]:
    data[3]["question_id"] = data[1]["question_id"]
    return data


@pytest.mark.parametrize(
    ("mutate", "needles"),
    [
        (lambda data: {"instances": data}, ["expected a list of instances"]),
        (lambda data: [*data, "x"], ["instance [14] is str"]),
        (_mutate("question_id", _DROP), ["instance [3]", "'question_id'"]),
        (_repeat_id, ["instance [3]", "repeats question_id 'fx02_abs'"]),
        (_mutate("question_type", "abstention"), ["instance [3] fx04", "'abstention'"]),
        (_mutate("answer", None), ["instance [3] fx04", "'answer'"]),
        (_mutate("answer", True), ["instance [3] fx04", "'answer'"]),
        (_mutate("question", 5), ["instance [3] fx04", "'question'"]),
        (_mutate("answer_session_ids", _DROP), ["instance [3] fx04", "'answer_session_ids'"]),
        (_mutate("haystack_dates", ["2023/04/02 (Sun) 16:40"]), ["fx04", "must match"]),
        (_mutate("haystack_sessions", [{}, [], []]), ["fx04", "session [0] is not a list"]),
        (_turn_without_content, ["fx04", "session [1] turn [0]", "'content'"]),
    ],
)
def test_malformed_files_name_the_file_and_instance(
    tmp_path: Path, mutate: Callable[[list[Any]], Any], needles: list[str]
) -> None:
    data = json.loads((FIXTURE_DIR / "longmemeval_s.json").read_text(encoding="utf-8"))
    path = _write(tmp_path, "longmemeval_s.json", mutate(data))
    _one_line_error(lambda: lme.load_taskset(tmp_path, "all"), str(path), *needles)


def test_invalid_json_is_a_one_line_error(tmp_path: Path) -> None:
    path = tmp_path / "longmemeval" / "longmemeval_oracle.json"
    path.parent.mkdir()
    path.write_text("[{", encoding="utf-8")
    _one_line_error(lambda: lme.load_taskset(tmp_path, "all:oracle"), str(path), "not valid JSON")


# ---------------------------------------------------------------- scorer

ANSWER_MARKER = "only part of what the reference answer requires"  # every answer prompt
PROMPT_MARKERS = {  # what each other template adds
    "temporal-reasoning": "off by one",
    "knowledge-update": "outdated information",
    "single-session-preference": "need not cover every point of the rubric",
    "abstention": "cannot be answered",
}
ANSWER_PROMPTS = ("default", "temporal-reasoning", "knowledge-update")
OWN_PROMPT = ("temporal-reasoning", "knowledge-update", "single-session-preference")
EXPECTED_PROMPT = {
    qid: "abstention" if qid in ABSTENTION else qtype if qtype in OWN_PROMPT else "default"
    for qid, qtype in TYPE_OF.items()
}


def _prompt(call: tuple[str, str, list[Message]]) -> str:
    return str(call[2][-1]["content"])


def test_each_type_gets_its_prompt(variants: dict[str, TaskSet]) -> None:
    llm = ScriptedLLM(lambda role, purpose, messages: "Yes.")
    scorer = judge.Scorer(llm)
    for q in variants["s"].questions:
        judged = scorer.score(q, f"response to {q.id}")
        assert judged.scores["judge_correct"] == 1.0
        assert judged.detail == {"prompt": EXPECTED_PROMPT[q.id], "reply": "Yes."}
        role, stage, _ = llm.transport_calls[-1]
        assert (role, stage) == ("judge", "longmemeval/judge")
        prompt = _prompt(llm.transport_calls[-1])
        assert q.question in prompt and q.gold in prompt and f"response to {q.id}" in prompt
        for name, marker in PROMPT_MARKERS.items():
            assert (marker in prompt) is (name == EXPECTED_PROMPT[q.id]), (q.id, name)
        assert (ANSWER_MARKER in prompt) is (EXPECTED_PROMPT[q.id] in ANSWER_PROMPTS), q.id
        assert prompt.rstrip().endswith("Reply with yes or no only.")
    usage = llm.usage_summary()
    assert set(usage) == {"judge"} and usage["judge"]["calls"] == 14


@pytest.mark.parametrize(
    ("reply", "label"),
    [("Yes.", 1.0), ("yes", 1.0), ("YES, it is correct", 1.0), ("no", 0.0), ("No.", 0.0)],
)
def test_reply_parsing(reply: str, label: float, variants: dict[str, TaskSet]) -> None:
    scorer = judge.Scorer(ScriptedLLM([reply]))
    scores = scorer.score(variants["s"].questions[0], "Business Administration").scores
    assert scores["judge_correct"] == label


def test_summary_by_hand(variants: dict[str, TaskSet]) -> None:
    yes = {"fx01", "fx03", "fx04", "fx06", "fx07", "fx09", "fx10_abs", "fx11", "fx14_abs"}
    questions = list(variants["s"].questions)
    llm = ScriptedLLM(["Yes." if q.id in yes else "no" for q in questions])
    scorer = judge.Scorer(llm)
    rows: list[tuple[Question, dict[str, Any]]] = [
        (q, dict(scorer.score(q, "an answer").scores)) for q in questions
    ]
    rows.append((questions[0], {"judge_correct": None}))  # not judged: left out
    summary = scorer.summarize(rows)
    per_type = {t: Fraction(*v) for t, v in {
        "single-session-user": (2, 3),
        "single-session-assistant": (1, 2),
        "single-session-preference": (1, 1),
        "temporal-reasoning": (2, 3),
        "knowledge-update": (1, 2),
        "multi-session": (1, 2),
    }.items()}  # fmt: skip
    assert {t: v["accuracy"] for t, v in summary["per_type"].items()} == pytest.approx(
        {t: float(v) for t, v in per_type.items()}
    )
    assert [v["n"] for v in summary["per_type"].values()] == [3, 2, 2, 3, 2, 2]
    assert summary["overall_accuracy"] == pytest.approx(9 / 14)
    assert summary["task_averaged_accuracy"] == pytest.approx(23 / 36)
    assert float(sum(per_type.values()) / 6) == pytest.approx(23 / 36)
    assert summary["abstention_accuracy"] == pytest.approx(2 / 3)  # fx02 no, fx10 and fx14 yes
    assert (summary["n_judged"], summary["n_abstention"], summary["types_averaged"]) == (14, 3, 6)
    partial = scorer.summarize([r for r in rows[:5] if r[1]["judge_correct"] is not None])
    assert partial["types_averaged"] == 2  # single-session-user 2/3, -assistant 1/2
    assert partial["task_averaged_accuracy"] == pytest.approx((2 / 3 + 1 / 2) / 2)
    assert partial["per_type"]["multi-session"] == {"accuracy": None, "n": 0}


def test_no_judge(variants: dict[str, TaskSet]) -> None:
    task_only = ScriptedLLM(["Yes."], models=Models(task=ModelConfig(model="scripted")))
    for scorer in (judge.Scorer(None), bench("longmemeval").scorer(task_only)):
        q = variants["s"].questions[0]
        assert scorer.score(q, "Business Administration").scores["judge_correct"] is None
        summary = scorer.summarize([(q, {"judge_correct": None})])
        assert summary["overall_accuracy"] is None and summary["n_judged"] == 0
        assert summary["task_averaged_accuracy"] is None
        described = scorer.describe()
        assert described["judge"] is None and "no judge was used" in described["note"]
    assert task_only.transport_calls == []


def test_describe_and_registry() -> None:
    scorer = bench("longmemeval").scorer(ScriptedLLM(["Yes."]))
    assert isinstance(scorer, judge.Scorer) and scorer.metrics == ("judge_correct", "answer_f1")
    described = scorer.describe()
    assert described["judge"] == "scripted" and "no judge was used" not in described["note"]
    assert described["prompts"] == {n: prompt_sha256(t) for n, t in judge.PROMPTS.items()}
    assert set(described["prompts"]) == {"default", *PROMPT_MARKERS}
    assert described["variants"] == ["per-type-yes-no"]
    other = Question("x", "c", "summarization", "M", "q", "g")
    with pytest.raises(ValueError, match="not a LongMemEval type"):
        scorer.score(other, "a")
