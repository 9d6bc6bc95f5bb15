"""LoCoMo: the loader on the shipped sample (conv-26), splits, error paths, and both scorers."""

from __future__ import annotations

import copy
import json
import math
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from evolve.benches.registry import bench
from evolve.datasets import locomo
from evolve.datasets.types import CAPABILITIES, DataError, Question, TaskSet
from evolve.models.testing import ScriptedLLM
from evolve.scoring import locomo as scoring
from evolve.scoring.answers import prompt_sha256

ISO = re.compile(r"^\d{4}-\d{2}-\d{2}$")


@pytest.fixture(scope="module")
def raw_sample(data_dir: Path) -> dict[str, Any]:
    data = json.loads((data_dir / "locomo" / "locomo-sample.json").read_text(encoding="utf-8"))
    assert isinstance(data, list) and len(data) == 1
    sample: dict[str, Any] = data[0]
    return sample


@pytest.fixture(scope="module")
def tasks(data_dir: Path) -> TaskSet:
    return locomo.load_taskset(data_dir, "all")


def _write(root: Path, data: Any, name: str = "locomo-sample.json") -> Path:
    (root / "locomo").mkdir(parents=True, exist_ok=True)
    path = root / "locomo" / name
    path.write_text(data if isinstance(data, str) else json.dumps(data), encoding="utf-8")
    return root


# ---------------------------------------------------------------- loader on the sample


def test_sample_sessions_messages_and_dates(tasks: TaskSet, raw_sample: dict[str, Any]) -> None:
    conv_raw = raw_sample["conversation"]
    present = [k for k, v in conv_raw.items() if re.match(r"^session_\d+$", k)]
    assert tasks.bench == "locomo" and len(tasks.conversations) == 1
    conv = tasks.conversations[0]
    assert conv.id == "locomo/conv-26"
    assert len(conv.sessions) == len(present) == 19  # date keys run to 35
    assert [s.session_id for s in conv.sessions] == [str(n) for n in range(1, 20)]
    assert all(s.date and ISO.match(s.date) for s in conv.sessions)
    assert conv.sessions[0].date == "2023-05-08"
    assert conv.meta["session_dates"]["1"] == "1:56 pm on 8 May, 2023"
    assert set(conv.meta["session_dates"]) == {s.session_id for s in conv.sessions}
    assert conv.meta["data_file"] == "locomo-sample.json"
    assert conv.meta["speakers"] == ["Caroline", "Melanie"]
    n_turns = sum(len(conv_raw[k]) for k in present)
    messages = conv.messages()
    assert len(messages) == n_turns
    assert {m.role for _, m in messages.values()} == {"Caroline", "Melanie"}
    image = messages["D1:5"][1]
    assert image.content.endswith(
        " [image: a photo of a dog walking past a wall with a painting of a woman]"
    )
    n_images = sum("blip_caption" in t for k in present for t in conv_raw[k])
    assert sum("[image: " in m.content for _, m in messages.values()) == n_images == 116
    assert messages["D1:3"][1].content == raw_sample["conversation"]["session_1"][2]["text"]


def test_sample_questions(tasks: TaskSet) -> None:
    qs = tasks.questions
    assert len(qs) == 199
    assert Counter(q.meta["category"] for q in qs) == {4: 70, 5: 47, 2: 37, 1: 32, 3: 13}
    for q in qs:
        category = q.meta["category"]
        assert q.ability == locomo.CATEGORY_ABILITY[category]
        assert q.capability == locomo.CATEGORY_CAPABILITY[category] in CAPABILITIES
        assert locomo.category_of(q) == category
        assert q.conversation_id == "locomo/conv-26" and q.question_date is None
        assert isinstance(q.gold, str) and q.gold
        assert "dropped_evidence" not in q.meta
    assert [q.id for q in qs[:2]] == ["locomo/conv-26/0", "locomo/conv-26/1"]
    assert Counter(q.capability for q in qs) == {"F": 83, "T": 37, "M": 32, "A": 47}
    by_text = {q.question: q for q in qs}
    assert by_text["When did Melanie paint a sunrise?"].gold == "2022"  # int answer
    assert by_text["How many children does Melanie have?"].gold == "3"
    trap = by_text["What did Caroline realize after her charity race?"]
    assert trap.gold == locomo.NOT_MENTIONED
    assert trap.meta["adversarial_answer"] == "self-care is important"
    both = by_text["Is Oscar Melanie's pet?"]  # one of the two items with both answers
    assert both.meta["adversarial_answer"] == "Yes" and both.meta["answer"] == "No"
    assert both.gold == locomo.NOT_MENTIONED


def test_sample_evidence(tasks: TaskSet) -> None:
    messages = tasks.conversations[0].messages()
    for q in tasks.questions:
        assert all(e in messages for e in q.evidence_ids), q.id
        assert len(set(q.evidence_ids)) == len(q.evidence_ids)
    packed = tasks.questions[37]  # upstream evidence ["D8:6; D9:17"]
    assert packed.evidence_ids == ("D8:6", "D9:17")
    assert packed.meta["evidence_repairs"] == [["D8:6; D9:17", ["D8:6", "D9:17"]]]
    assert sum("evidence_repairs" in q.meta for q in tasks.questions) == 1
    assert sum(not q.evidence_ids for q in tasks.questions) == 2  # upstream empty lists


def test_malformed_evidence_is_repaired_or_dropped(
    raw_sample: dict[str, Any], tmp_path: Path
) -> None:
    sample = copy.deepcopy(raw_sample)
    sample["qa"][0]["evidence"] = ["D1:3", "D99:1", "D", "D:1:05", "D2:1 D2:2,D1:3", 7]
    q = locomo.load_taskset(_write(tmp_path, [sample]), "all").questions[0]
    assert q.evidence_ids == ("D1:3", "D1:5", "D2:1", "D2:2")
    assert q.meta["dropped_evidence"] == ["D99:1", "D", 7]
    assert q.meta["evidence_repairs"] == [
        ["D:1:05", ["D1:5"]],
        ["D2:1 D2:2,D1:3", ["D2:1", "D2:2", "D1:3"]],
    ]


def test_dates_and_full_file_preference(raw_sample: dict[str, Any], tmp_path: Path) -> None:
    assert locomo.normalise_date("12:09 am on 13 September, 2023") == "2023-09-13"
    assert locomo.normalise_date("8 Sept 2023") == "2023-09-08"
    assert locomo.normalise_date("sometime in spring") == "sometime in spring"
    assert locomo.normalise_date("1:00 pm on 31 February, 2023") == "1:00 pm on 31 February, 2023"
    sample = copy.deepcopy(raw_sample)
    del sample["conversation"]["session_2_date_time"]
    sample["conversation"]["session_3_date_time"] = "the next day"
    _write(tmp_path, [raw_sample])
    _write(tmp_path, [sample], "locomo10.json")  # preferred over the sample file
    conv = locomo.load_taskset(tmp_path, "all").conversations[0]
    assert conv.meta["data_file"] == "locomo10.json"
    assert [s.date for s in conv.sessions[:3]] == ["2023-05-08", None, "the next day"]
    assert "2" not in conv.meta["session_dates"]


def test_registry_loads_locomo(data_dir: Path) -> None:
    tasks = bench("locomo").load_taskset(data_dir, "all")
    assert tasks.bench == "locomo" and len(tasks.questions) == 199


# ---------------------------------------------------------------- splits


def test_splits_file_is_the_seeded_rule(data_dir: Path) -> None:
    text = locomo.DEFAULT_SPLITS_FILE.read_text(encoding="utf-8")
    data = json.loads(text)
    assert text == locomo.render_splits(locomo.build_splits(data_dir, data["seed"]))
    splits = {name: data["splits"][name]["samples"] for name in locomo.SPLIT_NAMES}
    assert [len(splits[n]) for n in ("train", "valid", "test")] == [3, 2, 5]
    assert sorted(s for ids in splits.values() for s in ids) == list(locomo.OFFICIAL_SAMPLES)
    assert "conv-26" in splits["test"]
    assert data["sample_counts"]["conv-26"]["n_questions"] == 199
    assert all(data["splits"][n]["counts"] is None for n in locomo.SPLIT_NAMES)


def test_split_errors(data_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(DataError) as err:
        locomo.load_taskset(data_dir, "test")
    message = str(err.value)
    assert "\n" not in message
    assert "conv-41, conv-43, conv-47, conv-50" in message and "conv-26" not in message
    assert "only the sample file" in message
    with pytest.raises(DataError, match="unknown LoCoMo split 'holdout'"):
        locomo.load_taskset(data_dir, "holdout")
    with pytest.raises(DataError, match="no LoCoMo data"):
        locomo.load_taskset(tmp_path, "all")
    custom = tmp_path / "splits.json"
    custom.write_text(json.dumps({"splits": {"test": {"samples": ["conv-26"]}}}))
    assert len(locomo.load_taskset(data_dir, "test", custom).questions) == 199
    with pytest.raises(DataError, match="no sample list for split 'train'"):
        locomo.load_taskset(data_dir, "train", custom)


def _bad(sample: dict[str, Any], edit: str) -> Any:
    s = copy.deepcopy(sample)
    conv = s["conversation"]
    if edit == "not_a_list":
        return {"sample_id": "conv-26"}
    if edit == "sample_not_object":
        return ["conv-26"]
    if edit == "no_sample_id":
        del s["sample_id"]
    elif edit == "duplicate_sample":
        return [s, s]
    elif edit == "no_conversation":
        s["conversation"] = []
    elif edit == "no_speaker":
        del conv["speaker_b"]
    elif edit == "no_sessions":
        s["conversation"] = {k: v for k, v in conv.items() if not k.startswith("session_")}
    elif edit == "session_not_list":
        conv["session_3"] = {"turns": []}
    elif edit == "turn_without_text":
        del conv["session_2"][0]["text"]
    elif edit == "duplicate_dia_id":
        conv["session_2"][0]["dia_id"] = "D1:1"
    elif edit == "date_not_text":
        conv["session_1_date_time"] = 20230508
    elif edit == "qa_not_list":
        s["qa"] = {}
    elif edit == "bad_category":
        s["qa"][0]["category"] = 7
    elif edit == "missing_answer":
        del s["qa"][0]["answer"]
    elif edit == "list_answer":
        s["qa"][0]["answer"] = ["a", "b"]
    elif edit == "evidence_not_list":
        s["qa"][0]["evidence"] = "D1:3"
    return [s]


@pytest.mark.parametrize(
    "edit",
    ["not_a_list", "sample_not_object", "no_sample_id", "duplicate_sample", "no_conversation",
     "no_speaker", "no_sessions", "session_not_list", "turn_without_text", "duplicate_dia_id",
     "date_not_text", "qa_not_list", "bad_category", "missing_answer", "list_answer",
     "evidence_not_list", "bad_json"],
)  # fmt: skip
def test_malformed_files_raise_one_line(
    edit: str, raw_sample: dict[str, Any], tmp_path: Path
) -> None:
    data = "[{" if edit == "bad_json" else _bad(raw_sample, edit)
    root = _write(tmp_path, data)
    with pytest.raises(DataError) as err:
        locomo.load_taskset(root, "all")
    assert "\n" not in str(err.value)
    assert str(root / "locomo" / "locomo-sample.json") in str(err.value)


# ---------------------------------------------------------------- scorers


def _q(category: int, gold: str, question: str = "When?") -> Question:
    return Question(
        id=f"locomo/t/{category}",
        conversation_id="locomo/t",
        ability=locomo.CATEGORY_ABILITY[category],
        capability=locomo.CATEGORY_CAPABILITY[category],
        question=question,
        gold=gold,
    )


def test_official_f1_hand_computed() -> None:
    assert scoring.normalize_answer("The cat and a Dog, went!") == "cat dog went"
    # 6 predicted tokens, 3 gold, 3 shared: P 1/2, R 1 -> F1 2/3
    f1 = scoring.official_f1(4, "Caroline went to the LGBTQ support group", "LGBTQ support group")
    assert f1 == pytest.approx(2 / 3)
    # "on 7 may 2023" vs "7 may 2023": P 3/4, R 1 -> 6/7
    assert scoring.official_f1(2, "On 7 May 2023", "7 May 2023") == pytest.approx(6 / 7)
    # Porter stemming: painted/paint, sunrises/sunrise agree (the set F1 does not stem)
    assert scoring.official_f1(4, "painted sunrises", "paint a sunrise") == 1.0
    assert scoring.set_f1("painted sunrises", "paint a sunrise") == 0.0
    assert scoring.official_f1(4, "", "Sweden") == 0.0


def test_official_f1_category_rules() -> None:
    gold = "Pottery, camping, painting, swimming"
    # gold parts: pottery 1, camping 0, painting 1, swimming 0 -> 2/4
    assert scoring.official_f1(1, "pottery, painting", gold) == 0.5
    # one gold part "2" vs "2 times": P 1/2, R 1 -> 2/3
    assert scoring.official_f1(1, "2 times", "2") == pytest.approx(2 / 3)
    gold3 = "Yes; since she collects classic children's books"
    assert scoring.official_f1(3, "yes", gold3) == 1.0  # gold cut at ";"
    assert scoring.official_f1(4, "yes", gold3) < 1.0
    for answer, value in [("That is not mentioned in the conversation.", 1.0),
                          ("NO INFORMATION AVAILABLE", 1.0), ("Not Mentioned", 1.0),
                          ("Yes, self-care is important", 0.0), ("", 0.0)]:  # fmt: skip
        assert scoring.official_f1(5, answer, locomo.NOT_MENTIONED) == value, answer


def test_set_f1_and_bleu1_hand_computed() -> None:
    # {the, cat, sat} vs {the, cat, hat}: 2 shared -> P = R = 2/3
    assert scoring.set_f1("The cat sat.", "the cat, the hat!") == pytest.approx(2 / 3)
    assert scoring.set_f1("Sweden!", "sweden") == 1.0
    assert scoring.set_f1("", "sweden") == 0.0
    assert scoring.bleu_tokens("Caroline's friend didn't go, e.g. at 1:56 (3.5)") == [
        "caroline", "'s", "friend", "did", "n't", "go", ",", "e.g", ".", "at", "1:56",
        "(", "3.5", ")",
    ]  # fmt: skip
    # 6 tokens, clipped matches the×2 cat on mat = 5; c = r = 6 -> BP 1 -> 5/6
    assert scoring.bleu1("the cat sat on the mat", "the cat is on the mat") == pytest.approx(5 / 6)
    # 2 tokens, both match; c=2 < r=6 -> BP exp(1 - 6/2) = e^-2
    assert scoring.bleu1("The cat", "the cat is on the mat") == pytest.approx(math.exp(-2))
    # longer than the reference: BP 1; clipped matches 5 of 7
    got = scoring.bleu1("the cat sat on the mat today", "the cat is on the mat")
    assert got == pytest.approx(5 / 7)
    # clipping: "the" ×3 in the answer, once in the reference -> 1/3, BP 1 (3 > 2)
    assert scoring.bleu1("the the the", "the cat") == pytest.approx(1 / 3)
    assert scoring.bleu1("dog", "the cat") == 0.0 and scoring.bleu1("", "cat") == 0.0


def test_judge_path_with_scripted_llm() -> None:
    llm = ScriptedLLM(['{"label": "CORRECT"}', "I think so.", '{"label": "wrong"}'])
    scorer = bench("locomo").scorer(llm)
    assert isinstance(scorer, scoring.Scorer) and scorer.bench == "locomo"
    right = scorer.score(_q(2, "7 May 2023"), "the day before 8 May 2023")
    assert right.scores["judge_correct"] == 1.0 and right.detail["label"] == "CORRECT"
    wrong = scorer.score(_q(4, "Sweden"), "Norway")  # bad JSON first: repaired by the client
    assert wrong.scores["judge_correct"] == 0.0
    adversarial = scorer.score(_q(5, locomo.NOT_MENTIONED), "Not mentioned.")
    assert adversarial.scores == {"f1_official": 1.0, "judge_correct": None,
                                  "f1_set": None, "bleu1": None}  # fmt: skip
    assert len(llm.transport_calls) == 3  # category 5 is not judged
    assert {(role, stage) for role, stage, _ in llm.transport_calls} == {("judge", "locomo/judge")}
    prompt = llm.transport_calls[0][2][-1]["content"]
    assert "the day before 8 May 2023" in prompt and "7 May 2023" in prompt
    assert llm.usage_summary()["judge"]["calls"] == 3
    assert set(right.scores) == set(scorer.metrics)
    described = scorer.describe()
    assert described["judge"] == "scripted"
    assert described["prompts"] == {"judge": prompt_sha256(scoring.JUDGE_PROMPT)}
    assert described["variants"] == ["official", "mem0"]


def test_no_judge() -> None:
    scorer = scoring.Scorer(None)
    judged = scorer.score(_q(1, "Pottery, painting"), "pottery")
    assert judged.scores["judge_correct"] is None
    assert judged.scores["f1_official"] == 0.5
    assert judged.scores["f1_set"] == pytest.approx(2 / 3)  # {pottery} vs {pottery, painting}
    described = scorer.describe()
    assert described["judge"] is None and "no judge was used" in described["note"]


def test_summarize_per_category_and_overall() -> None:
    scorer = scoring.Scorer(None)
    rows: list[tuple[Question, dict[str, Any]]] = [
        (_q(1, "a"), {"f1_official": 1.0, "judge_correct": 1.0, "f1_set": 0.5, "bleu1": 0.2}),
        (_q(1, "a"), {"f1_official": 0.0, "judge_correct": 0.0, "f1_set": 0.5, "bleu1": 0.4}),
        (_q(4, "a"), {"f1_official": 0.5, "judge_correct": 1.0, "f1_set": 1.0, "bleu1": 0.6}),
        (_q(5, "x"), {"f1_official": 1.0, "judge_correct": None, "f1_set": None, "bleu1": None}),
    ]
    out = scorer.summarize(rows)
    official = out["official"]
    assert official["by_category"] == {"1": 0.5, "2": None, "3": None, "4": 0.5, "5": 1.0}
    assert official["overall"] == pytest.approx(2.5 / 4) and official["n"] == 4
    assert official["overall_1_4"] == pytest.approx(1.5 / 3)
    assert "stemmed" in official["f1"]
    mem0 = out["mem0"]
    assert mem0["judge_correct"]["by_category"] == {"1": 0.5, "2": None, "3": None, "4": 1.0}
    assert mem0["judge_correct"]["overall"] == pytest.approx(2 / 3)
    assert mem0["f1_set"]["overall"] == pytest.approx(2 / 3)
    assert mem0["bleu1"]["overall"] == pytest.approx(0.4)
    assert mem0["bleu1"]["n_by_category"] == {"1": 2, "2": 0, "3": 0, "4": 1}
    assert "no stemming" in mem0["f1"]
    assert scorer.summarize([])["mem0"]["judge_correct"]["overall"] is None


def test_questions_are_posed_as_the_official_qa_run_poses_them(
    tasks: TaskSet, data_dir: Path
) -> None:
    by_cat: dict[int, list[Any]] = {}
    for q in tasks.questions:
        by_cat.setdefault(q.meta["category"], []).append(q)
    assert all(q.posed.endswith("answer with an approximate date.") for q in by_cat[2])
    assert all(q.posed == q.question and "posed" not in q.meta for q in by_cat[4])
    choices = [q.posed for q in by_cat[5]]
    for q, text in zip(by_cat[5], choices, strict=True):
        assert "(a) " in text and "(b) " in text and "Not mentioned in the conversation" in text
        assert q.meta["adversarial_answer"] in text
    first = [t.split("(a) ")[1].startswith("Not mentioned") for t in choices]
    assert 0 < sum(first) < len(first)  # the order varies between questions ...
    again = locomo.load_taskset(data_dir, "all")  # ... and is the same on every load
    assert [q.posed for q in again.questions if q.meta["category"] == 5] == choices
