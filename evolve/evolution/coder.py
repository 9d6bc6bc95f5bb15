"""The LLM coder: a proposer asking a coding model (role ``coder``) for a patch (docs/design.md §4).

Owns the coder's prompt (:func:`system_prompt`, :func:`render_request`), the reply format and
its parser (:func:`apply_reply`: search/replace blocks plus a one-line message, whole-file
fallback) and :class:`CoderProposer`.

Reply format (told to the model in the system prompt)::

    MESSAGE: <one line saying what the change does>
    <<<<<<< SEARCH
    <lines copied exactly from the program>
    =======
    <their replacement>
    >>>>>>> REPLACE

Invariants:

- Blocks apply in order, each to the text left by the ones before; a SEARCH text must occur
  exactly once (else the reply is refused with the reason, which becomes repair feedback). A
  reply with no block is used whole when it holds one fenced Python program defining
  ``class Memory``; anything else is refused.
- History-guided diagnosis (docs/design.md §4): when there are cases, the model first writes a short
  diagnosis (purpose ``<stage>/diagnose``) from the cases and the history of earlier revisions of
  the target capability, then patches with its diagnosis in view. Integration shows both
  sides' changes against their common ancestor and paired differential cases.
- A repair continues the same conversation: the model sees its own reply and the error, and
  its new blocks apply to the program its last reply produced (or to the parent when that reply
  did not apply).
- Every call goes through :class:`~evolve.models.llm.LLMClient` (counted under role ``coder``,
  purpose ``<stage>/propose`` or ``<stage>/repair``; cached by request). A failed call raises
  :class:`~evolve.models.llm.LLMError`: a coder that cannot be reached stops the run, it is
  not a bad proposal.
- The prompt holds only the parent's train scores and failing train cases, the specialists'
  sources and scores, and the run's history — never valid cases or anything from test.
"""

from __future__ import annotations

import difflib
import re
from typing import Any

from contract import spec
from evolve.datasets.types import CAPABILITIES, CAPABILITY_NAMES, GROUPS, group_title
from evolve.evaluation.report import Diagnostics, MetricRow, ScoreBlock
from evolve.evolution.candidate import TRAIN
from evolve.evolution.proposer import CandidateView, Proposal, Request
from evolve.models.llm import LLMClient, Message
from evolve.scoring import fmt_score
from evolve.scoring.fitness import KEY as FITNESS_KEY
from evolve.scoring.fitness import Fitness
from evolve.scoring.retrieval import METRICS
from sandbox.printable import printable
from sandbox.static import ALLOWED_IMPORTS

MAX_TOKENS = 8_192  # default reply limit of a coder model: a reply may be a whole program
DIAGNOSIS_TOKENS = 400
DIFF_CHARS = 6_000  # per side of an integration diff

_BLOCK = re.compile(
    r"^<{5,9} ?SEARCH[ \t]*\r?\n(.*?)^={5,9}[ \t]*\r?\n(.*?)^>{5,9} ?REPLACE[ \t]*$",
    re.DOTALL | re.MULTILINE,
)
_FENCE = re.compile(r"```(?:python|py)?[ \t]*\r?\n(.*?)^```", re.DOTALL | re.MULTILINE)
_MESSAGE = re.compile(r"^\s*MESSAGE:\s*(.+)$", re.MULTILINE | re.IGNORECASE)
_ROLE = re.compile(r":(?:func|class|data|mod|meth):`~?([^`]+)`")


class PatchError(ValueError):
    """A reply that cannot be turned into a program; the text says why, for the model."""


STAGE_TASKS = {
    "cold_start": "Cold start: fix the broadest weaknesses of the current program. Look at "
    "every capability's scores and the failing cases, find what the pipeline gets wrong in "
    "general (what is stored, how it is indexed, how the question becomes a query, what is "
    "retrieved and how it is packed), and fix that.",
    "refinement": "Capability refinement: improve capability {target} ({name}) of the current "
    "program. The failing cases below are its worst train questions for {target}. Diagnose why "
    "the evidence was not retrieved and change the program so that it is, without hurting the "
    "other capabilities.",
    "integration": "Integration: the current program is the best overall; the specialist "
    "below is the best program for capability {target} ({name}). Merge what makes the "
    "specialist strong on {target} into the current program while keeping what makes the "
    "current program strong elsewhere; where the two conflict, decide per question (for "
    "example from the query) which mechanism applies.",
}

REPLY_FORMAT = """Reply with one line `MESSAGE: <what your change does, in one line>`, then one
or more edit blocks:

<<<<<<< SEARCH
<lines copied exactly from the current program, enough to occur only once>
=======
<the lines that replace them>
>>>>>>> REPLACE

Blocks apply in order. To rewrite the program entirely, reply instead with the MESSAGE line and
the whole new program in one ```python fenced block."""

DIAGNOSE = """Before changing anything, diagnose. From the cases and the history above, say in
at most 200 words: which component (extraction, indexing, planning, retrieval, packing of the
retrieved text) loses the evidence, why, and what change should fix it without hurting other
capabilities. Do not write code yet."""

REPAIR = """Your last reply could not be used:

{error}

Fix this and reply again in the same format. Your edit blocks now apply to {base}."""


def _contract() -> str:
    doc = spec.__doc__ or ""
    body = doc.split("\n\n", 1)[1] if "\n\n" in doc else doc
    return _ROLE.sub(lambda m: m[1].rsplit(".", 1)[-1], body).replace("``", "`").strip()


def system_prompt(fitness: Fitness) -> str:
    """What the coder always knows: the job, the fitness in force (:meth:`Fitness.objective`),
    the contract, the sandbox rules, the reply format."""
    modules = ", ".join(sorted(ALLOWED_IMPORTS))
    return f"""You improve memory programs for long-horizon LLM agents. A memory program reads a
long conversation (100K to 10M tokens) session by session, stores memory units, and for each
question returns at most {spec.OUT_CHAR_BUDGET:,} characters of retrieved text from which an
answer model must answer.

How programs are scored: {fitness.objective()}

The contract (contract version {spec.CONTRACT_VERSION}):

{_contract()}

Sandbox rules: the program runs in a sandbox. It may import only: {modules}. No file, network,
process or introspection access (open, exec, eval, getattr, __dict__, os, sys ... are refused);
keep all state in Memory attributes. Indexing and retrieval must stay fast and near-linear:
about 2,000 units and several queries must finish in seconds on one core.

Keep the module-level constants readable (a `# (range a-b)` comment declares a tunable's range).
Change what the diagnosis calls for; keep everything else as it is.

{REPLY_FORMAT}"""


def _score_table(scores: dict[str, ScoreBlock], split: str) -> str:
    block = scores.get(split, ScoreBlock())
    rows = [(None, block.overall), *((c, block.by_capability.get(c)) for c in GROUPS)]
    shown = (FITNESS_KEY, *METRICS)  # the fitness in force first, then the retrieval metrics
    lines = [f"| capability | n | {' | '.join(m.replace('_', ' ') for m in shown)} |",
             "|" + "---|" * (len(shown) + 2)]  # fmt: skip
    for cap, row in rows:
        if row is None or not row.as_scores():
            continue
        label = "overall" if cap is None else group_title(cap)
        values = [fmt_score(row.metric(m)) for m in shown]
        lines.append(f"| {label} | {row.n} | {' | '.join(values)} |")
    return "\n".join(lines)


def _case(n: int, case: dict[str, Any]) -> str:
    scores = ", ".join(f"{k.replace('_', ' ')} {v:.2f}" for k, v in case["scores"].items())
    sources = case.get("evidence_source") or []
    units = case.get("units_for_evidence") or []
    evidence = []
    for i, e in enumerate(case["evidence"]):
        lines = [f"- Evidence {i + 1}: {e}"]
        if i < len(sources):
            lines.append(f"  Its session (excerpt):\n{sources[i]}")
        if i < len(units):
            shown = "\n".join(f"    * {u}" for u in units[i]) or "    (none)"
            lines.append(f"  Units the program extracted from that session (best first):\n{shown}")
        evidence.append("\n".join(lines))
    parts = [
        f"### Case {n}: {case['capability']} / {case['ability']} ({scores})",
        f"Question: {case['question']}",
        f"Reference answer: {case['reference_answer']}",
        "Evidence messages the answer depends on:\n" + ("\n".join(evidence) or "- (none)"),
        f"Query plan: {case['query']}",
        f"Retrieved ({case['retrieved_chars']:,} chars; excerpt):\n{case['retrieved']}",
    ]
    if case.get("answer"):
        parts.append(f"Predicted answer: {case['answer']}")
    if case.get("error"):
        parts.append(f"Error: {case['error']}")
    return "\n".join(parts)


def _history(request: Request) -> str:
    if not request.history:
        return "(none yet)"
    lines = []
    for h in request.history:
        result = h.status
        if h.train_delta is not None:
            effects = ", ".join(f"{c} {d:+.3f}" for c, d in sorted(h.by_capability.items()))
            result += f"; train fitness {h.train_delta:+.3f} vs its parent ({effects})"
        target = f" {h.capability}" if h.capability else ""
        lines.append(f"- {h.id} {h.stage}{target}: {h.message} -> {result}")
    return "\n".join(lines)


def _diagnostics(table: Diagnostics) -> str:
    keys = ("d_ext", "d_idx", "d_ret", "unit_chars", "retrieved_chars")
    lines = ["| capability | d_ext | d_idx | d_ret | mean unit chars | mean retrieved chars |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for group, row in table.items():
        values = [
            fmt_score(row.get(k)) if row.get(k) is None or k.startswith("d_") else f"{row[k]:,.0f}"
            for k in keys
        ]
        lines.append(f"| {group} | {' | '.join(values)} |")
    return (
        "## Stage diagnostics of the current program (train)\n"
        "For each evidence message e: d_ext = best cosine between e and the units extracted "
        "from its session; d_idx = best cosine between e and what retrieval returns when e "
        "itself is the query; d_ret = the same for the real question. High d_ext but low "
        "d_idx points at indexing; high d_idx but low d_ret at planning or retrieval.\n"
        + "\n".join(lines)
    )


def _diff(old: CandidateView, new: CandidateView) -> str:
    lines = difflib.unified_diff(old.source.splitlines(), new.source.splitlines(),
                                 old.id, new.id, lineterm="", n=2)  # fmt: skip
    text = "\n".join(lines)
    return text if len(text) <= DIFF_CHARS else text[:DIFF_CHARS] + "\n... [diff cut]"


def _differential(n: int, case: dict[str, Any]) -> str:
    other = case["other"]
    return "\n".join([
        _case(n, case),
        f"Specialist's query plan: {other['query']}",
        f"Specialist retrieved ({other['retrieved_chars']:,} chars; excerpt):",
        other["retrieved"],
        "Specialist's scores: " + ", ".join(f"{k.replace('_', ' ')} {v:.2f}"
                                            for k, v in other["scores"].items()),
    ])  # fmt: skip


def _source(label: str, prog: CandidateView) -> str:
    return f"## {label} ({prog.id})\n```python\n{prog.source}\n```"


def render_request(
    request: Request,
    specialist: CandidateView | None = None,
    diagnosis: str | None = None,
    ask_diagnosis: bool = False,
) -> str:
    """The user message for one proposal (``ask_diagnosis``: for the diagnosis call instead;
    ``diagnosis``: the model's diagnosis, shown before the patch is asked for)."""
    target = request.target or (specialist and _specialty(request, specialist))
    task = STAGE_TASKS[request.stage].format(
        target=target, name=CAPABILITY_NAMES.get(target or "", "")
    )
    if request.stage == "integration" and specialist is None:
        task = STAGE_TASKS["cold_start"]  # nobody to merge with yet
    # What stays the same while the parent does comes first (program, its scores), what each
    # round changes last (task, cases, history): a provider's prompt cache, or a local server's
    # prefix reuse, then covers most of every later request about the same parent.
    parts = [
        _source("Current program", request.parent),
        f"## Scores of the current program on the train split\n"
        f"{_score_table(request.parent.scores, TRAIN)}",
    ]
    if request.diagnostics:
        parts.append(_diagnostics(request.diagnostics))
    if specialist is not None:
        parts.append(_source(f"Specialist for {target}", specialist))
        parts.append(f"## Specialist scores (train)\n{_score_table(specialist.scores, TRAIN)}")
        if request.ancestor is not None:
            parts.append(
                f"## What each side changed since their common ancestor {request.ancestor.id}\n"
                f"Current program:\n```diff\n{_diff(request.ancestor, request.parent)}\n```\n"
                f"Specialist:\n```diff\n{_diff(request.ancestor, specialist)}\n```"
            )
        if request.differential:
            cases = "\n\n".join(_differential(i, c) for i, c in enumerate(request.differential, 1))
            parts.append(f"## Paired cases: where one program beats the other (train)\n{cases}")
    parts.append(f"## Task\n{task}")
    if request.cases:
        cases = "\n\n".join(_case(i, c) for i, c in enumerate(request.cases, 1))
        parts.append(f"## Failing train cases\n{cases}")
    parts.append(f"## Earlier revisions in this run\n{_history(request)}")
    if diagnosis:
        parts.append(f"## Your diagnosis\n{diagnosis}")
    parts.append(REPLY_FORMAT if diagnosis is not None or not ask_diagnosis else DIAGNOSE)
    return "\n\n".join(parts)


def _specialty(request: Request, specialist: CandidateView) -> str | None:
    """The capability on which ``specialist`` beats the parent most (train)."""
    mine = specialist.scores.get(TRAIN, ScoreBlock()).by_capability
    theirs = request.parent.scores.get(TRAIN, ScoreBlock()).by_capability

    def gain(cap: str) -> float:
        a, b = mine.get(cap) or MetricRow(), theirs.get(cap) or MetricRow()
        return float(a.fitness or 0) - float(b.fitness or 0)

    return max(CAPABILITIES, key=gain) if mine else None


def apply_reply(base: str, reply: str) -> tuple[str, str]:
    """``(new source, message)`` from a coder reply; PatchError saying why it cannot apply."""
    found = _MESSAGE.search(reply)
    message = found[1].strip() if found else ""
    blocks = _BLOCK.findall(reply)
    if blocks:
        source = base
        for n, (search, replace) in enumerate(blocks, 1):
            source = _apply_block(source, search, replace, n)
    else:
        programs = [p for p in _FENCE.findall(reply) if "class Memory" in p]
        if len(programs) != 1:
            raise PatchError(
                "the reply has no SEARCH/REPLACE block and no single ```python block with a "
                "whole program (one defining class Memory); use the reply format"
            )
        source = programs[0]
    if source == base:
        raise PatchError("the edits leave the program unchanged; make a real change")
    if not message:
        rest = _FENCE.sub("", _BLOCK.sub("", reply))
        message = next((line.strip() for line in rest.splitlines() if line.strip()), "")
    message = printable(" ".join(message.split()), 160)  # the model's words reach terminals
    return source, f"coder: {message or 'unnamed change'}"


def _apply_block(source: str, search: str, replace: str, n: int) -> str:
    """Replace the one occurrence of ``search`` (the block's text up to its last newline, so a
    block may hold part of a line) by ``replace``."""
    search, replace = search.removesuffix("\n"), replace.removesuffix("\n")
    if not search.strip():
        raise PatchError(f"SEARCH block {n} is empty; copy the lines to replace")
    count = source.count(search)
    if count == 1:
        return source.replace(search, replace, 1)
    if count > 1:
        raise PatchError(
            f"SEARCH block {n} occurs {count} times in the program; include more lines so it "
            "occurs once"
        )
    # Tolerate trailing-whitespace differences, line by line, when that finds exactly one place.
    lines, wanted = source.splitlines(keepends=True), search.splitlines()
    stripped = [line.rstrip() for line in lines]
    target = [line.rstrip() for line in wanted]
    hits = [i for i in range(len(lines)) if stripped[i : i + len(target)] == target]
    if len(hits) == 1:
        i, j = hits[0], hits[0] + len(target)
        newline = "\n" if lines[j - 1].endswith("\n") else ""
        return "".join(lines[:i]) + replace + newline + "".join(lines[j:])
    first = next((line.strip() for line in wanted if line.strip()), "")
    raise PatchError(
        f"SEARCH block {n} does not match the program exactly (it starts with {first[:80]!r}); "
        "copy the lines verbatim from the program the block applies to"
    )


class CoderProposer:
    """Proposals from a coding LLM; see the module docstring."""

    name = "coder"
    builds_cases = True  # the model reads failing and differential cases

    def __init__(self, llm: LLMClient, fitness: Fitness, diagnose: bool = True) -> None:
        self.llm = llm
        self.fitness = fitness  # the run's, told to the model in the system prompt
        self.diagnose = diagnose

    def propose(self, request: Request) -> Proposal:
        specialist = None
        if request.stage == "integration" and request.specialists:
            specialist = request.specialists[0]  # this round's partner
        parents = (request.parent.id,) + ((specialist.id,) if specialist else ())
        diagnosis = None
        if self.diagnose and (request.cases or request.differential):
            ask = render_request(request, specialist, ask_diagnosis=True)
            diagnosis = self.llm.complete(
                "coder", f"{request.stage}/diagnose",
                [{"role": "system", "content": system_prompt(self.fitness)},
                 {"role": "user", "content": ask}],
                max_tokens=self._diagnosis_tokens(),
            ).text.strip()  # fmt: skip
        messages: list[Message] = [
            {"role": "system", "content": system_prompt(self.fitness)},
            {"role": "user", "content": render_request(request, specialist, diagnosis)},
        ]
        base = Proposal(None, "", parents)
        return self._ask(request, base, messages, "propose")

    def _diagnosis_tokens(self) -> int:
        """A diagnosis is short, and never longer than the coder's reply limit."""
        config = self.llm.models.coder
        return min(DIAGNOSIS_TOKENS, config.max_tokens) if config else DIAGNOSIS_TOKENS

    def repair(self, request: Request, failed: Proposal, error: str) -> Proposal | None:
        base = _base(request, failed)
        where = (
            "the current program, unchanged" if base == request.parent.source
            else "the program as your last applied edits left it"
        )  # fmt: skip
        note = {"role": "user", "content": REPAIR.format(error=error, base=where)}
        return self._ask(request, failed, [*failed.transcript, note], "repair")

    def _ask(
        self, request: Request, last: Proposal, messages: list[Message], kind: str
    ) -> Proposal:
        reply = self.llm.complete("coder", f"{request.stage}/{kind}", messages)
        transcript = (*messages, {"role": "assistant", "content": reply.text})
        base = _base(request, last)
        try:
            source, message = apply_reply(base, reply.text)
        except PatchError as exc:
            return Proposal(None, "coder: reply not applied", last.parents, error=str(exc),
                            transcript=transcript, base=base)  # fmt: skip
        return Proposal(source, message, last.parents, transcript=transcript, base=base)


def _base(request: Request, last: Proposal) -> str:
    """What the next edits apply to: the last program that came out, else the parent."""
    if last.source is not None:
        return last.source
    return last.base if last.base is not None else request.parent.source
