"""LoCoMo's answer scoring under its two published protocols (docs/benchmarks.md §4.3).

Owns :class:`Scorer` (the :class:`~evolve.scoring.answers.AnswerScorer` for ``locomo``), the
judge prompt (our own wording of the Mem0 paper's criteria) and the three token metrics.

Protocols and metrics (the two F1s differ; every report names which one it shows):

- **Official** (snap-research/LoCoMo ``task_eval/evaluation.py``) — ``f1_official``: answers are
  normalised (commas dropped, lower-cased, punctuation removed, the words a/an/the/and removed)
  and Porter-stemmed, then token F1 over multisets. Category 1: the gold and the answer are
  split on ``,`` and the score is the mean over gold parts of the best F1 over answer parts;
  category 3: the gold is cut at the first ``;``; categories 2 and 4: plain F1; category 5: 1
  when the answer contains "no information available" or "not mentioned" (any case), else 0.
  Stemming: the official code uses nltk's PorterStemmer; PyStemmer's ``porter`` is the same
  Porter (1980) algorithm (nltk's default mode adds a few extensions, e.g. "dying" -> "die", so
  rare words can stem differently), whereas PyStemmer's ``english`` is Porter2, which differs
  more (e.g. "generously": Porter "gener", Porter2 "generous").
- **Mem0 paper** (mem0ai/mem0 ``evaluation/metrics``), categories 1–4 only (``None`` for 5):
  ``judge_correct`` — an LLM judge's CORRECT/WRONG as 1.0/0.0, graded generously (same topic
  as the gold counts; a date in another format or as a relative reference to the same date
  counts); ``f1_set`` — F1 over *sets* of tokens, no stemming, tokenised as Mem0's
  ``simple_tokenize`` does (lower-case, ``. , ! ?`` become spaces, split on whitespace);
  ``bleu1`` — nltk ``sentence_bleu(weights=(1, 0, 0, 0), smoothing_function=method1)`` on
  lower-cased tokens. With one reference and weights (1, 0, 0, 0) that is exactly
  BP × p1: p1 = clipped unigram matches / answer tokens, BP = 1 when the answer is longer than
  the reference, else exp(1 − r/c); 0 when no unigram matches (nltk returns 0 before
  smoothing, and method1 only lifts zero 2–4-gram precisions, which have weight 0). The
  tokenisation approximates nltk's ``word_tokenize``: clitics (n't, 's, 're, 've, 'll, 'd, 'm)
  are split off, words keep inner ``- / ' .`` and digit-internal ``: ,``, every other
  punctuation mark is its own token (abbreviation periods are split, which nltk keeps).

Invariants: judge calls use role ``judge`` and purpose ``locomo/judge``; without a judge
``judge_correct`` is ``None`` and the token metrics are still computed. Aggregates are means
over questions (micro), per category and overall, as both reference scripts compute them.
"""

from __future__ import annotations

import math
import re
import string
from collections import Counter, defaultdict
from typing import Any

import Stemmer

from evolve.datasets.locomo import CATEGORY_ABILITY, category_of
from evolve.datasets.types import Question
from evolve.models.llm import LLMClient
from evolve.scoring.answers import Judged, prompt_sha256

VARIANTS = ("official", "mem0")
MEM0_CATEGORIES = (1, 2, 3, 4)
MEM0_METRICS = ("judge_correct", "f1_set", "bleu1")
ABSTAIN_MARKERS = ("no information available", "not mentioned")

JUDGE_PROMPT = """You check one answer to a question about a long chat between two people.

QUESTION: {question}
REFERENCE ANSWER: {gold}
ANSWER TO CHECK: {answer}

Decide whether the answer to check gets the reference answer right. Be lenient:
- Length, wording and extra detail do not matter. If the answer is about the same thing the
  reference names (the same topic, person, object, place or event), it is CORRECT.
- For questions about time, a date written in another format ("May 7th" for "7 May 2023") or
  a relative reference that points to the same date or period ("the Sunday before 8 May
  2023" for 7 May 2023) is CORRECT.
- It is WRONG when it names something different, gives another date or period, or does not
  give an answer (for example, says the information is unknown).

Reply with JSON only: {{"label": "CORRECT"}} or {{"label": "WRONG"}}"""

JUDGE_SCHEMA = {
    "type": "object",
    "properties": {"label": {"type": "string", "enum": ["CORRECT", "WRONG"]}},
    "required": ["label"],
}

_stemmer = Stemmer.Stemmer("porter")
_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the|and)\b")
_CLITIC = re.compile(r"(\w)(n't|'s|'re|'ve|'ll|'d|'m)\b")
_BLEU_TOKEN = re.compile(r"n't|'(?:s|re|ve|ll|d|m)\b|\w+(?:(?:[-/'.]|(?<=\d)[:,](?=\d))\w+)*|\S")


# ---------------------------------------------------------------- official (LoCoMo)


def normalize_answer(text: str) -> str:
    """The official normalisation: commas dropped, lower case, no punctuation, no a/an/the/and."""
    text = "".join(ch for ch in text.replace(",", "").lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def token_f1(prediction: str, gold: str) -> float:
    """The official ``f1_score``: F1 over multisets of stemmed, normalised tokens."""
    pred = _stemmer.stemWords(normalize_answer(prediction).split())
    ref = _stemmer.stemWords(normalize_answer(gold).split())
    same = sum((Counter(pred) & Counter(ref)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred), same / len(ref)
    return 2 * precision * recall / (precision + recall)


def multi_answer_f1(prediction: str, gold: str) -> float:
    """The official ``f1`` (category 1): mean over gold parts of the best F1 over answer parts."""
    preds = [p.strip() for p in prediction.split(",")]
    golds = [g.strip() for g in gold.split(",")]
    return sum(max(token_f1(p, g) for p in preds) for g in golds) / len(golds)


def official_f1(category: int, prediction: str, gold: str) -> float:
    """``f1_official`` of one answer, by category (module docstring)."""
    if category == 5:
        low = prediction.lower()
        return 1.0 if any(marker in low for marker in ABSTAIN_MARKERS) else 0.0
    if category == 1:
        return multi_answer_f1(prediction, gold)
    if category == 3:
        gold = gold.split(";")[0].strip()
    return token_f1(prediction, gold)


# ---------------------------------------------------------------- Mem0 paper


def set_f1(prediction: str, gold: str) -> float:
    """Mem0's token F1: sets of ``simple_tokenize`` tokens, no stemming; 0 if either is empty
    (as Mem0's ``calculate_metrics`` returns for an empty answer)."""
    pred, ref = _simple_tokens(prediction), _simple_tokens(gold)
    common = len(pred & ref)
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(ref)
    return 2 * precision * recall / (precision + recall)


def _simple_tokens(text: str) -> set[str]:
    return set(re.sub(r"[.,!?]", " ", text.lower()).split())


def bleu_tokens(text: str) -> list[str]:
    """Lower-cased tokens approximating nltk's ``word_tokenize`` (module docstring)."""
    return _BLEU_TOKEN.findall(_CLITIC.sub(r"\1 \2", text.lower()))


def bleu1(prediction: str, gold: str) -> float:
    """nltk ``sentence_bleu([gold], prediction, weights=(1, 0, 0, 0), method1)`` = BP × p1."""
    hyp, ref = bleu_tokens(prediction), bleu_tokens(gold)
    ref_counts = Counter(ref)
    matches = sum(min(n, ref_counts[w]) for w, n in Counter(hyp).items())
    if matches == 0:
        return 0.0
    brevity = 1.0 if len(hyp) > len(ref) else math.exp(1 - len(ref) / len(hyp))
    return brevity * matches / len(hyp)


def _label(data: Any) -> str:
    """The judge's label (CORRECT or WRONG); ValueError otherwise, so the client asks again."""
    if not isinstance(data, dict) or not isinstance(data.get("label"), str):
        raise ValueError('expected a JSON object with a string "label"')
    label = data["label"].strip().upper()
    if label not in ("CORRECT", "WRONG"):
        raise ValueError(f'label {data["label"]!r} is neither "CORRECT" nor "WRONG"')
    return label


# ---------------------------------------------------------------- the scorer


def _by_category(rows: list[tuple[int, float]]) -> dict[int, list[float]]:
    per: dict[int, list[float]] = defaultdict(list)
    for category, value in rows:
        per[category].append(value)
    return per


def _overall(rows: list[tuple[int, float]], categories: tuple[int, ...]) -> float | None:
    """The mean over ``categories``' values, summed category by category (None: no value)."""
    per = _by_category(rows)
    values = [v for c in categories for v in per[c]]
    return sum(values) / len(values) if values else None


def _means(rows: list[tuple[int, float]], categories: tuple[int, ...]) -> dict[str, Any]:
    per = _by_category(rows)
    return {
        "by_category": {str(c): sum(per[c]) / len(per[c]) if per[c] else None for c in categories},
        "n_by_category": {str(c): len(per[c]) for c in categories},
        "overall": _overall(rows, categories),
        "n": sum(len(per[c]) for c in categories),
    }


class Scorer:
    """LoCoMo's official F1 and the Mem0 paper's J / F1 / BLEU-1; see the module docstring."""

    bench = "locomo"
    metrics = ("f1_official", "judge_correct", "f1_set", "bleu1")
    judge_metrics = ("judge_correct",)  # 0 when its reply never parses

    def __init__(self, judge: LLMClient | None) -> None:
        self.judge = judge if judge is not None and judge.available("judge") else None

    def score(self, question: Question, answer: str) -> Judged:
        category = category_of(question)
        gold = question.gold
        scores: dict[str, float | None] = dict.fromkeys(self.metrics)
        scores["f1_official"] = official_f1(category, answer, gold)
        detail: dict[str, Any] = {"category": category}
        if category in MEM0_CATEGORIES:
            scores["f1_set"] = set_f1(answer, gold)
            scores["bleu1"] = bleu1(answer, gold)
            if self.judge is not None:
                prompt = JUDGE_PROMPT.format(question=question.question, gold=gold, answer=answer)
                label = self.judge.complete_json(
                    "judge", "locomo/judge", prompt, JUDGE_SCHEMA, _label, max_tokens=100
                )
                scores["judge_correct"] = 1.0 if label == "CORRECT" else 0.0
                detail["label"] = label
        return Judged(scores, detail)

    def max_judge_calls(self, question: Question) -> int:
        return int(category_of(question) in MEM0_CATEGORIES)

    def summarize(self, rows: list[tuple[Question, dict[str, Any]]]) -> dict[str, Any]:
        """Means over questions per category and overall: ``official`` (``f1_official``, the
        stemmed multiset F1, categories 1–5, plus ``overall_1_4``) and ``mem0`` (J, set F1
        and BLEU-1, categories 1–4); a mean is None when nothing in it was scored."""
        values: dict[str, list[tuple[int, float]]] = defaultdict(list)
        for q, scores in rows:
            for metric in self.metrics:
                if scores.get(metric) is not None:
                    values[metric].append((category_of(q), float(scores[metric])))
        official = _means(values["f1_official"], tuple(CATEGORY_ABILITY))
        official["overall_1_4"] = _overall(values["f1_official"], MEM0_CATEGORIES)
        official["f1"] = "f1_official: Porter-stemmed multiset token F1 (snap-research/LoCoMo)"
        mem0: dict[str, Any] = {m: _means(values[m], MEM0_CATEGORIES) for m in MEM0_METRICS}
        mem0["f1"] = "f1_set: set token F1, no stemming (mem0 evaluation/metrics/utils.py)"
        return {"official": official, "mem0": mem0}

    def describe(self) -> dict[str, Any]:
        model = None
        if self.judge is not None and self.judge.models.judge is not None:
            model = self.judge.models.judge.model
        if model:
            note = (
                f"LoCoMo official f1_official (stemmed multiset F1) on categories 1-5; "
                f"Mem0-paper judge_correct (judge {model}), f1_set (set F1) and bleu1 on 1-4"
            )
        else:
            note = (
                "no judge was used: judge_correct is None; f1_official (stemmed multiset F1), "
                "f1_set (set F1, no stemming) and bleu1 are computed without an LLM"
            )
        return {
            "judge": model,
            "prompts": {"judge": prompt_sha256(JUDGE_PROMPT)},
            "variants": list(VARIANTS),
            "note": note,
        }
