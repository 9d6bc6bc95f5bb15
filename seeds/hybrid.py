"""Hybrid seed: dense + lexical (BM25) fusion with tunable retrieval choices.

Indexing splits each unit into chunks of about CHUNK_CHARS characters and embeds every chunk
once; the BM25 index over the same chunks is rebuilt lazily, at the first retrieval after new
units arrive. Retrieval scores each chunk by DENSE_WEIGHT * cosine + LEXICAL_WEIGHT * BM25
(scaled to 0-1 by the query's best chunk), gives each unit its best chunk's score times its
role weight, keeps the TOP_K best units at or above MIN_SCORE, optionally re-orders them by
maximal marginal relevance (MMR_LAMBDA < 1), adds NEIGHBOURS adjacent units of the same session
after each hit, and packs the result within the character budget.

Every module-level number or boolean below is a tunable constant; the comment gives its range.
The offline proposer mutates them within those ranges.
"""

from dataclasses import dataclass

import bm25s
import numpy as np
import Stemmer

OUT_CHAR_BUDGET = 16000  # fixed by the environment; the executor enforces it as well

DENSE_WEIGHT = 0.7  # weight of cosine similarity in the fused score (range 0.0-1.0)
LEXICAL_WEIGHT = 0.3  # weight of the scaled BM25 score (range 0.0-1.0)
USER_WEIGHT = 1.0  # multiplier for units said by the user (range 0.5-1.5)
ASSISTANT_WEIGHT = 0.9  # multiplier for units said by the assistant (range 0.5-1.5)
TOP_K = 80  # most units kept per query (range 5-500)
MIN_SCORE = 0.15  # fused-score floor for a unit to be kept (range 0.0-0.8)
MMR_LAMBDA = 1.0  # relevance vs diversity in MMR; 1.0 turns MMR off (range 0.3-1.0)
NEIGHBOURS = 0  # adjacent units of the same session added after each hit (range 0-3)
CHUNK_CHARS = 600  # chunk size for scoring long units (range 200-4000)
DATE_PREFIX = True  # prefix each returned unit with its date (bool)

EXTRACTION_INSTRUCTION = (
    "Read the conversation session and write down what a personal assistant must remember "
    "to answer later questions about the user: facts, numbers, names, dates, decisions, "
    "preferences, instructions and plans. Write one memory unit per fact, self-contained "
    "(resolve pronouns), in the user's own terms. Set role to who said it (user or assistant) "
    "and message_ids to the ids of the messages it comes from."
)

PLANNING_INSTRUCTION = (
    "Rewrite the question as a search query that names the facts, entities and time "
    "expressions needed to answer it."
)

ANSWER_INSTRUCTION = (
    "Answer the question using only the retrieved memories, which are dated. Be direct and "
    "concise; for questions about time, reason from the dates. If the memories do not contain "
    "the answer, say that the information is not available."
)


@dataclass
class MemoryUnit:
    content: str
    date: str | None = None
    role: str | None = None
    message_ids: list[str] | None = None


@dataclass
class Query:
    text: str


_stemmer = Stemmer.Stemmer("english")


class Memory:
    def __init__(self, backend):
        self.backend = backend
        self.units: list[MemoryUnit] = []
        self.sessions: list[str] = []  # session id per unit
        self.chunk_unit: list[int] = []  # unit index per chunk
        self.chunk_texts: list[str] = []
        self.parts: list[np.ndarray] = []  # chunk embeddings not yet stacked
        self.vectors = np.zeros((0, backend.dim), dtype=np.float32)
        self.lexical = None  # BM25 over chunk_texts, rebuilt lazily

    def index(self, units, segment):
        texts = []
        for unit in units:
            for chunk in split_chunks(unit.content, CHUNK_CHARS):
                self.chunk_unit.append(len(self.units))
                texts.append(chunk)
            self.units.append(unit)
            self.sessions.append(segment.session_id)
        if texts:
            self.chunk_texts.extend(texts)
            self.parts.append(self.backend.embed(texts))
            self.lexical = None
        return None

    def retrieve(self, query):
        if not self.units:
            return ""
        self._refresh()
        qvec = self.backend.embed([query.text])[0]
        chunk_scores = DENSE_WEIGHT * (self.vectors @ qvec)
        if LEXICAL_WEIGHT > 0:
            tokens = bm25s.tokenize(
                [query.text],
                stopwords="en",
                stemmer=_stemmer,
                return_ids=False,
                show_progress=False,
            )[0]
            lex = self.lexical.get_scores(tokens) if tokens else np.zeros(len(self.chunk_texts))
            top = float(lex.max()) if len(lex) else 0.0
            if top > 0:
                chunk_scores = chunk_scores + LEXICAL_WEIGHT * (lex / top)
        unit_scores = np.full(len(self.units), -np.inf, dtype=np.float64)
        np.maximum.at(unit_scores, np.asarray(self.chunk_unit), chunk_scores)
        unit_scores *= np.array([role_weight(u.role) for u in self.units])
        k = min(TOP_K, len(unit_scores))
        best = np.argpartition(-unit_scores, k - 1)[:k]
        best = best[np.argsort(-unit_scores[best], kind="stable")]
        hits = [int(i) for i in best if unit_scores[i] >= MIN_SCORE]
        if MMR_LAMBDA < 1.0 and len(hits) > 1:
            hits = self._mmr(hits, unit_scores)
        return pack([self._render(i) for i in self._with_neighbours(hits)], OUT_CHAR_BUDGET)

    def _refresh(self):
        if self.parts:
            self.vectors = np.vstack([self.vectors, *self.parts])
            self.parts = []
        if self.lexical is None and LEXICAL_WEIGHT > 0:
            tokens = bm25s.tokenize(
                self.chunk_texts, stopwords="en", stemmer=_stemmer, show_progress=False
            )
            self.lexical = bm25s.BM25()
            self.lexical.index(tokens, show_progress=False)

    def _mmr(self, hits, unit_scores):
        first_chunk = {}
        for c, u in enumerate(self.chunk_unit):
            first_chunk.setdefault(u, c)
        vecs = self.vectors[[first_chunk[u] for u in hits]]
        relevance = unit_scores[hits]
        chosen, rest = [0], list(range(1, len(hits)))
        max_sim = vecs @ vecs[0]
        while rest:
            gains = [MMR_LAMBDA * relevance[j] - (1 - MMR_LAMBDA) * max_sim[j] for j in rest]
            pick = rest.pop(int(np.argmax(gains)))
            chosen.append(pick)
            max_sim = np.maximum(max_sim, vecs @ vecs[pick])
        return [hits[j] for j in chosen]

    def _with_neighbours(self, hits):
        out, seen = [], set()
        for i in hits:
            for j in range(i - NEIGHBOURS, i + NEIGHBOURS + 1):
                if (
                    0 <= j < len(self.units)
                    and j not in seen
                    and self.sessions[j] == self.sessions[i]
                ):
                    seen.add(j)
                    out.append(j)
        return out

    def _render(self, i):
        unit = self.units[i]
        return f"[{unit.date}] {unit.content}" if DATE_PREFIX and unit.date else unit.content


def role_weight(role):
    if role == "user":
        return USER_WEIGHT
    if role == "assistant":
        return ASSISTANT_WEIGHT
    return 1.0


def split_chunks(text, size):
    """Consecutive pieces of about ``size`` characters, cut at whitespace when possible."""
    if len(text) <= size:
        return [text]
    chunks, start = [], 0
    while start < len(text):
        end = min(start + size, len(text))
        if end < len(text):
            cut = text.rfind(" ", start + size // 2, end)
            end = cut if cut > start else end
        chunks.append(text[start:end])
        start = end
    return chunks


def pack(blocks, budget):
    """Greedy fill in the given order: keep each block that still fits, skip the rest."""
    out, used = [], 0
    for block in blocks:
        cost = len(block) + (2 if out else 0)
        if used + cost <= budget:
            out.append(block)
            used += cost
    if not out and blocks:
        return blocks[0][:budget]
    return "\n\n".join(out)
