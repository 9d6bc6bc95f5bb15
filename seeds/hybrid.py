"""Hybrid seed: dense + lexical (BM25) fusion with tunable retrieval choices.

Indexing splits each unit into chunks of about CHUNK_CHARS characters (consecutive chunks
sharing CHUNK_OVERLAP characters), embeds every chunk once and adds its stemmed terms to
postings (term -> the chunks holding it and how often), which only grow; retrieval reads them
to score BM25 (Lucene's variant, k1 1.5, b 0.75, the figures of a bm25s index built over the
same chunks) without changing the memory, in time proportional to the query terms' postings.
Retrieval
optionally expands the query with its RARE_TERMS rarest words (fewest chunks hold them),
scores each chunk by DENSE_WEIGHT * cosine + LEXICAL_WEIGHT * BM25 (scaled to 0-1 by the
query's best chunk), gives each unit its best chunk's score times its role weight plus a
recency prior (RECENCY_WEIGHT times the unit's position, 0 for the first unit and 1 for the
last).

What counts as relevant reads that score alone: the hits are the TOP_K best units at or above
MIN_SCORE and at or above RELATIVE_FLOOR times the query's best unit score. Length never
decides which units are hits, only the order they are packed in: by the score less what the
hit's length costs, so that in a fixed budget one long hit no longer displaces several short
ones, while a short unit that is not a hit is never packed for being short. Two costs add up:
BUDGET_COST times the share of the budget the unit's characters take (linear: a 150-character
turn costs 1 % of what a 15,000-character reply does, so among short hits the score decides),
and LENGTH_PENALTY times the natural log of the unit's characters (at least SHORT_CHARS: among
hits that short, the score alone decides). The hits are then optionally re-ordered by
maximal marginal relevance (MMR_LAMBDA < 1; its relevance is that packing order's key, so
diversity adjusts the costs' order rather than undoing it), at most SESSION_CAP of them kept
per session, NEIGHBOURS adjacent units of the same session added after each hit, and the
result packed within the character budget in that order (a block that does not fit is
skipped, the next tried); CHRONOLOGICAL then lists what fitted in the order the units were
indexed. A hit returns its whole unit, or with RETURN_CHUNK its best chunk with CHUNK_CONTEXT
characters of the unit on either side.

Every module-level number or boolean below is a tunable constant; the comment gives its range.
The constant proposer searches them within those ranges, but for DATE_PREFIX and CHRONOLOGICAL,
marked ``(format)``: the offline fitness reads which evidence reached the context, not the
dates or the order a reader gets it in. The defaults are the seed's original behaviour (no
expansion, no prior, no relative floor, no length cost, no cap, no overlap, whole units by
relevance).
"""

import math
import re
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
DATE_PREFIX = True  # prefix each returned unit with its date (bool) (format)
RETURN_CHUNK = False  # a hit returns its best chunk (with context), not its whole unit (bool)
CHUNK_CONTEXT = 150  # unit characters kept each side of a returned chunk (range 0-1000)
CHRONOLOGICAL = False  # list the packed units in indexing order, not by relevance (bool) (format)
SESSION_CAP = 0  # most hits kept per session; 0 = no cap (range 0-40)
CHUNK_OVERLAP = 0  # characters shared by consecutive chunks, at most half a chunk (range 0-300)
RARE_TERMS = 0  # the query's rarest words appended to it; 0 = no expansion (range 0-8)
RECENCY_WEIGHT = 0.0  # score bonus of the last unit, linear in position from 0 (range 0.0-0.3)
RELATIVE_FLOOR = 0.0  # hits score at least this share of the query's best unit (range 0.0-0.9)
SHORT_CHARS = 0  # a hit this short or shorter packs as if this long (range 0-2000)
LENGTH_PENALTY = 0.0  # pack hits by score minus this times ln(unit characters) (range 0.0-0.5)
BUDGET_COST = 0.0  # pack hits by score minus this times their share of the budget (range 0.0-4.0)

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


def _terms(texts):
    """Each text's stemmed terms, English stop words left out (bm25s's tokenizer)."""
    return bm25s.tokenize(
        texts, stopwords="en", stemmer=_stemmer, return_ids=False, show_progress=False
    )


class Memory:
    def __init__(self, backend):
        self.backend = backend
        self.units: list[MemoryUnit] = []
        self.sessions: list[str] = []  # session id per unit
        self.chunk_unit: list[int] = []  # unit index per chunk
        self.chunk_spans: list[tuple[int, int]] = []  # character span of each chunk in its unit
        self.chunk_texts: list[str] = []
        self.vectors = np.zeros((0, backend.dim), dtype=np.float32)  # rows of chunk_texts, spare
        self.postings: dict[str, tuple[list[int], list[int]]] = {}  # term -> chunks, counts
        self.chunk_terms: list[int] = []  # number of terms per chunk (BM25's document length)
        self.term_total = 0  # their sum

    def index(self, units, segment):
        texts = []
        for unit in units:
            for start, end in chunk_spans(unit.content, CHUNK_CHARS, CHUNK_OVERLAP):
                self.chunk_unit.append(len(self.units))
                self.chunk_spans.append((start, end))
                texts.append(unit.content[start:end])
            self.units.append(unit)
            self.sessions.append(segment.session_id)
        if texts:
            vectors = self.backend.embed(texts)
            self.vectors = append_rows(self.vectors, len(self.chunk_texts), vectors)
            self._post(texts)
            self.chunk_texts.extend(texts)
        return None

    def _post(self, texts):
        """Add the new chunks' stemmed terms to the postings, chunk after chunk."""
        first = len(self.chunk_texts)
        for offset, terms in enumerate(_terms(texts)):
            counts = {}
            for term in terms:
                counts[term] = counts.get(term, 0) + 1
            for term, count in counts.items():
                chunks, tfs = self.postings.setdefault(term, ([], []))
                chunks.append(first + offset)
                tfs.append(count)
            self.chunk_terms.append(len(terms))
            self.term_total += len(terms)

    def retrieve(self, query):
        if not self.units:
            return ""
        text = self._expand(query.text) if RARE_TERMS > 0 else query.text
        qvec = self.backend.embed([text])[0]
        chunk_scores = DENSE_WEIGHT * (self.vectors[: len(self.chunk_texts)] @ qvec)
        if LEXICAL_WEIGHT > 0:
            lex = self._bm25(_terms([text])[0])
            top = float(lex.max()) if len(lex) else 0.0
            if top > 0:
                chunk_scores = chunk_scores + LEXICAL_WEIGHT * (lex / top)
        unit_scores = np.full(len(self.units), -np.inf, dtype=np.float64)
        np.maximum.at(unit_scores, np.asarray(self.chunk_unit), chunk_scores)
        unit_scores *= np.array([role_weight(u.role) for u in self.units])
        if RECENCY_WEIGHT > 0 and len(self.units) > 1:
            unit_scores += RECENCY_WEIGHT * np.linspace(0.0, 1.0, len(self.units))
        hits = self._relevant(unit_scores)
        key = unit_scores
        if LENGTH_PENALTY > 0 or BUDGET_COST > 0:
            key = self._packing_key(hits, unit_scores)
            hits = sorted(hits, key=lambda i: -key[i])  # stable: ties keep the score's order
        if MMR_LAMBDA < 1.0 and len(hits) > 1:
            hits = self._mmr(hits, key)
        if SESSION_CAP > 0:
            hits = self._capped(hits)
        order = self._with_neighbours(hits)
        best = self._best_chunks(chunk_scores) if RETURN_CHUNK else {}
        blocks = [self._render(i, best.get(i)) for i in order]
        kept = fit(blocks, OUT_CHAR_BUDGET)
        if not kept:
            return blocks[0][:OUT_CHAR_BUDGET] if blocks else ""
        if CHRONOLOGICAL:
            kept.sort(key=lambda k: order[k])
        return "\n\n".join(blocks[k] for k in kept)

    def _relevant(self, unit_scores):
        """The hits, best first: the TOP_K best units by score among those at or above
        MIN_SCORE and at or above RELATIVE_FLOOR times the best unit's score."""
        floor = MIN_SCORE
        top = float(unit_scores.max())
        if RELATIVE_FLOOR > 0 and top > 0:
            floor = max(floor, RELATIVE_FLOOR * top)
        rank = np.where(unit_scores >= floor, unit_scores, -np.inf)
        k = min(TOP_K, len(rank))
        best = np.argpartition(-rank, k - 1)[:k]
        best = best[np.argsort(-rank[best], kind="stable")]
        return [int(i) for i in best if unit_scores[i] >= floor]

    def _packing_key(self, hits, unit_scores):
        """Per unit, the key hits are packed by (a unit that is not a hit keeps its score): a
        hit's score less BUDGET_COST * the share of the budget its characters take (at most 1)
        and less LENGTH_PENALTY * ln(characters), a hit shorter than SHORT_CHARS counted as
        SHORT_CHARS long there (among such hits, score decides)."""
        chars = np.array([max(len(self.units[i].content), 1) for i in hits], dtype=np.float64)
        share = np.minimum(chars / OUT_CHAR_BUDGET, 1.0)
        key = np.array(unit_scores, dtype=np.float64)
        key[hits] = unit_scores[hits] - BUDGET_COST * share
        key[hits] -= LENGTH_PENALTY * np.log(np.maximum(chars, SHORT_CHARS))
        return key

    def _bm25(self, terms):
        """Each chunk's BM25 score for the query's terms (a term named twice counts twice; one
        no chunk holds adds nothing), float32 as bm25s computes it."""
        n = len(self.chunk_texts)
        scores = np.zeros(n, dtype=np.float32)
        if not terms or not self.postings:
            return scores
        average = self.term_total / n
        for term in terms:
            posting = self.postings.get(term)
            if posting is None:
                continue
            chunks = np.asarray(posting[0], dtype=np.int64)
            tf = np.asarray(posting[1], dtype=np.float64)
            held = len(posting[0])
            idf = float(np.float32(math.log(1 + (n - held + 0.5) / (held + 0.5))))
            lengths = np.asarray([self.chunk_terms[i] for i in posting[0]], dtype=np.float64)
            norm = 1.5 * ((1 - 0.75) + 0.75 * lengths / average)
            np.add.at(scores, chunks, (idf * (tf / (norm + tf))).astype(np.float32))
        return scores

    def _expand(self, text):
        """The query with its RARE_TERMS rarest indexed words appended (fewest chunks first)."""
        rare = {}
        for word in re.findall(r"[A-Za-z0-9]+", text):
            posting = self.postings.get(_stemmer.stemWord(word.lower()))
            if posting is not None:
                rare.setdefault(word.lower(), len(posting[0]))
        picked = sorted(rare, key=lambda w: rare[w])[:RARE_TERMS]
        return f"{text} {' '.join(picked)}" if picked else text

    def _capped(self, hits):
        """The hits in order, at most SESSION_CAP from any one session."""
        out, count = [], {}
        for i in hits:
            session = self.sessions[i]
            if count.get(session, 0) < SESSION_CAP:
                count[session] = count.get(session, 0) + 1
                out.append(i)
        return out

    def _best_chunks(self, chunk_scores):
        """Unit index -> the index of its best-scoring chunk."""
        best = {}
        for c, u in enumerate(self.chunk_unit):
            if u not in best or chunk_scores[c] > chunk_scores[best[u]]:
                best[u] = c
        return best

    def _mmr(self, hits, key):
        """The hits re-ordered by maximal marginal relevance: MMR_LAMBDA * relevance less
        (1 - MMR_LAMBDA) * the max cosine to a hit already chosen (first chunks), relevance
        read from ``key`` (the packing key when a length cost is set, so diversity adjusts the
        cost's order rather than undoing it)."""
        first_chunk = {}
        for c, u in enumerate(self.chunk_unit):
            first_chunk.setdefault(u, c)
        vecs = self.vectors[[first_chunk[u] for u in hits]]
        relevance = key[hits]
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

    def _render(self, i, chunk=None):
        unit = self.units[i]
        text = unit.content
        if chunk is not None:
            start, end = self.chunk_spans[chunk]
            text = text[max(start - CHUNK_CONTEXT, 0) : end + CHUNK_CONTEXT]
        return f"[{unit.date}] {text}" if DATE_PREFIX and unit.date else text


def append_rows(matrix, used, rows):
    """``matrix`` with ``rows`` written after its first ``used`` rows; when full it is replaced
    by one twice as large, so appending n rows in batches costs O(n) in all."""
    end = used + len(rows)
    if end > len(matrix):
        grown = np.zeros((max(end, 2 * len(matrix)), matrix.shape[1]), dtype=np.float32)
        grown[:used] = matrix[:used]
        matrix = grown
    matrix[used:end] = rows
    return matrix


def role_weight(role):
    if role == "user":
        return USER_WEIGHT
    if role == "assistant":
        return ASSISTANT_WEIGHT
    return 1.0


def chunk_spans(text, size, overlap=0):
    """(start, end) of consecutive pieces of about ``size`` characters, cut at whitespace when
    possible; each starts ``overlap`` characters (at most half the previous piece) before the
    previous one ended."""
    if len(text) <= size:
        return [(0, len(text))]
    spans, start = [], 0
    while start < len(text):
        end = min(start + size, len(text))
        if end < len(text):
            cut = text.rfind(" ", start + size // 2, end)
            end = cut if cut > start else end
        spans.append((start, end))
        start = end - min(overlap, (end - start) // 2) if end < len(text) else end
    return spans


def fit(blocks, budget):
    """Greedy fill in the given order: indices of the blocks that still fit, skipping the rest
    (blank-line separators counted)."""
    kept, used = [], 0
    for k, block in enumerate(blocks):
        cost = len(block) + (2 if kept else 0)
        if used + cost <= budget:
            kept.append(k)
            used += cost
    return kept
