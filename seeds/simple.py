"""Simple seed: the paper's deliberately simple starting point.

Extraction keeps one dated unit per salient statement; indexing appends units in input order;
retrieval returns their concatenation truncated to the budget, with no query-dependent ranking.
It leaves the whole search space open to evolution.
"""

from dataclasses import dataclass

OUT_CHAR_BUDGET = 16000  # fixed by the environment; the executor enforces it as well

EXTRACTION_INSTRUCTION = (
    "Read the conversation session and write down what a personal assistant must remember "
    "to answer later questions about the user: facts, numbers, names, dates, decisions, "
    "preferences, instructions and plans. Write one memory unit per fact, self-contained "
    "(resolve pronouns), in the user's own terms, with the session date."
)

PLANNING_INSTRUCTION = (
    "Rewrite the question as a search query that names the facts needed to answer it."
)

ANSWER_INSTRUCTION = (
    "Answer the question using only the retrieved memories. Be direct and concise. If the "
    "memories do not contain the answer, say that the information is not available."
)


@dataclass
class MemoryUnit:
    content: str
    date: str | None = None


@dataclass
class Query:
    text: str


class Memory:
    def __init__(self, backend):
        self.backend = backend
        self.units: list[MemoryUnit] = []

    def index(self, units, segment):
        self.units.extend(units)

    def retrieve(self, query):
        text = "\n\n".join(render(u) for u in self.units)
        return text[:OUT_CHAR_BUDGET]


def render(unit: MemoryUnit) -> str:
    return f"[{unit.date}] {unit.content}" if unit.date else unit.content
