"""Dense seed: a flat dense-retrieval baseline.

Indexing embeds every unit once; retrieval ranks all units by cosine similarity to the query,
keeps those at or above MIN_SCORE (at most TOP_K) and packs date-prefixed units in relevance
order within the character budget. Work per query is one matrix-vector product.
"""

from dataclasses import dataclass

import numpy as np

OUT_CHAR_BUDGET = 16000  # fixed by the environment; the executor enforces it as well
TOP_K = 200  # most units considered per query (range 10-1000)
MIN_SCORE = 0.25  # cosine floor for a unit to be returned (range 0.0-0.6)
SEPARATOR = "\n\n"

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
        self.blocks: list[str] = []
        self.matrix = np.zeros((0, backend.dim), dtype=np.float32)  # rows [0, len(blocks)) live

    def index(self, units, segment):
        if not units:
            return None
        vectors = self.backend.embed([u.content for u in units])
        self.matrix = append_rows(self.matrix, len(self.blocks), vectors)
        self.blocks.extend(render(u) for u in units)
        return None

    def retrieve(self, query):
        if not self.blocks:
            return ""
        scores = self.matrix[: len(self.blocks)] @ self.backend.embed([query.text])[0]
        k = min(TOP_K, len(scores))
        top = np.argpartition(-scores, k - 1)[:k]
        order = top[np.argsort(-scores[top], kind="stable")]
        chosen = [self.blocks[i] for i in order if scores[i] >= MIN_SCORE]
        return pack(chosen, OUT_CHAR_BUDGET)


def append_rows(matrix: np.ndarray, used: int, rows: np.ndarray) -> np.ndarray:
    """``matrix`` with ``rows`` written after its first ``used`` rows; when full it is replaced
    by one twice as large, so appending n rows in batches costs O(n) in all."""
    end = used + len(rows)
    if end > len(matrix):
        grown = np.zeros((max(end, 2 * len(matrix)), matrix.shape[1]), dtype=np.float32)
        grown[:used] = matrix[:used]
        matrix = grown
    matrix[used:end] = rows
    return matrix


def render(unit: MemoryUnit) -> str:
    return f"[{unit.date}] {unit.content}" if unit.date else unit.content


def pack(blocks: list[str], budget: int) -> str:
    """Greedy fill in the given order: keep each block that still fits, skip the rest."""
    out: list[str] = []
    used = 0
    for block in blocks:
        cost = len(block) + (len(SEPARATOR) if out else 0)
        if used + cost <= budget:
            out.append(block)
            used += cost
    if not out and blocks:
        return blocks[0][:budget]
    return SEPARATOR.join(out)
