"""AriadneMem seed: a gated, coarsened memory graph with bridge discovery and path mining.

After "AriadneMem: Threading the Maze of Lifelong Memory for LLM Agents" (docs/design.md §7).

Phase I, indexing (``Memory.index``, once per session, in history order):

1. Clock. Each message gets a time in hours: its session's ISO date at 00:00 plus
   MESSAGE_MINUTES per message in session order. A session never starts before the previous
   one ended (same-day sessions follow each other); an undated session starts
   SESSION_GAP_HOURS after the previous one. Facts show only their date; the minutes order
   messages and measure the gating window.
2. Entropy-aware gating. Messages pass in windows of EXTRACTION_WINDOW. Each is embedded as
   ``role: content`` and compared with memory as it stood before its window; it is dropped when
   its nearest node has cosine > GATE_REDUNDANCY and lies less than GATE_HOURS away in time.
3. Atomic extraction. With a task LLM, each window's passing messages become atomic entries
   through one ``backend.complete`` call (EXTRACTION_INSTRUCTION; at most
   ``backend.max_complete_calls`` per session). A window without an LLM, past that budget, or
   with an unusable reply falls back to the executor's units for its messages, matched by
   ``message_ids``: a unit whose messages were all gated is dropped; a unit naming no message of
   the session joins the last window. The executor extracts with EXTRACTION_INSTRUCTION as well
   (per 24,000-character window), so with an LLM its units are the fallback.
4. Conflict-aware coarsening. Each entry meets its nearest node: cosine ``sim`` and keyword
   overlap ``ovlp = |K_new & K_old| / max(1, |K_new|)``. Merge when sim > COARSEN_SIMILARITY
   and ovlp > COARSEN_OVERLAP (the entry is dropped; the node takes its time and date and counts
   a repeat); Link when sim > COARSEN_SIMILARITY and ovlp <= COARSEN_OVERLAP (both kept, an
   update edge old -> new; ours: only when the two have the same speaker or one has none, since
   offline an answer resembles its question); otherwise Add.

Entities (plus the location) and keywords come from the unit's fields when extraction filled
them, else from its text: entities are runs of capitalised words or acronyms that do not open a
sentence, unless every word also occurs in lower case (in the text or anywhere in memory);
keywords are the most frequent content words. A unit's time is its ``timestamp`` when that
parses as an ISO date or date-time, else its message's time.

Phase II, retrieval (``Memory.retrieve``):

1. Hybrid recall: the top K_SEM nodes by cosine (scaled by ENTITY_PENALTY for nodes that share
   none of the question's entities, when memory knows any of them) united with the top K_LEX by
   BM25 (bm25s) are the terminals. Each brings up to STATE_NEIGHBOURS nodes joined to it by
   update edges (newer first), so old and new states arrive together.
2. Base graph: an edge from the earlier to the later of two nodes that share an entity or lie
   less than EDGE_HOURS apart; update edges keep their direction.
3. Bridge discovery (Steiner approximation): terminal pairs in different components whose times
   are BRIDGE_MIN_HOURS to BRIDGE_MAX_HOURS apart, most relevant first, at most BRIDGE_PAIRS,
   each taken only while it still joins two components. A pair's query is its entities and
   keywords (all queries embedded in one call); among the BRIDGE_TOP nearest nodes outside the
   graph, the best whose time lies between the pair's becomes the bridge: a -> b -> c.
4. Path mining: depth-first search for directed paths of 1 to MAX_HOPS edges (time never runs
   back), at most DFS_STEPS extensions; ranked by mean node relevance plus PATH_HOP_BONUS per
   hop and PATH_EDGE_BONUS per entity, bridge or update edge; the best PATHS_SHOWN not contained
   in a better one are kept.
5. Node budget: path nodes first, then terminals, then the other graph nodes, by relevance, at
   most NODE_BUDGET_MAX; fewer than NODE_BUDGET_MIN are topped up with the next dense hits.
6. Topology-aware serialisation: a legend, the paths (``F2 --alice--> F5 --bridge--> F9``),
   then the facts in time order, one paragraph each (``[F5 | 2024-03-03 | updates F2] text``),
   each cut at FACT_CHARS; facts leave from the lowest priority up until the text fits the
   16,000-character budget. The executor then makes the one answer call (ANSWER_INSTRUCTION).

Parameter sheet. "Paper" is the AriadneMem paper; "code" is its public repository as the design
notes describe it (only where it differs; the repository itself was not available to check).

=================================  ===================  ======================  ===============
parameter (constant)               paper                code                    default here
=================================  ===================  ======================  ===============
λ_red (GATE_REDUNDANCY)            0.6 (§4.1)           same                    0.6
δ_short (GATE_HOURS)               1 h (§2.2, "e.g.")   same                    1 h
window (EXTRACTION_WINDOW)         20 messages (§4.1)   40 (CODE_...)           20, paper
λ_coal (COARSEN_SIMILARITY)        0.7 (§4.1)           0.6 (CODE_...)          0.7, paper
λ_ovlp (COARSEN_OVERLAP)           not given            not given               0.9, ours
Link action (LINK_UPDATES)         yes (Eq. 6)          absent: Merge or Add    on, paper
k_sem (K_SEM)                      20 (§4.1, Table 4)   25 (CODE_K_SEM)         20, paper
k_lex (K_LEX)                      5 (§4.1, Table 4)    same                    5
entity downweight (ENTITY_PENALTY) yes, no value        same                    0.9, ours
δ_time (EDGE_HOURS)                6 h (§2.3)           same                    6 h
bridge gap (BRIDGE_MIN/MAX_HOURS)  1-168 h (§2.3)       same                    1-168 h
bridge candidates (BRIDGE_TOP)     top 5 dense (§2.3)   same                    5
path length (MAX_HOPS)             L = 3 hops (§2.3)    same                    3
node budget (NODE_BUDGET_MIN/MAX)  8-25 nodes (§2.3)    same                    8-25
=================================  ===================  ======================  ===============

PUBLIC_CODE_VALUES = True takes the code's window, λ_coal and k_sem and turns Link off (a Link
case becomes an Add without an edge). The remaining constants (clock, scopes, bridge pair
budget, DFS budget, path ranking, state neighbours, FACT_CHARS) are this program's choices.

Bounded work (indexing stays linear in the history): gating and coarsening each take one matrix
product per window against at most NN_SCOPE of the newest nodes, the nodes recent merges
refreshed and, for coarsening, the newest ENTITY_CANDIDATES nodes of each entity the window
mentions (an update further back than that is Added, not Linked); each index call adds its
new nodes' terms to BM25 postings. Retrieval takes one dense pass, one BM25 pass over the query
terms' postings, one batched bridge embedding and product, and a DFS capped at DFS_STEPS.

Offline (``backend.complete`` raises): everything above runs on the executor's
one-unit-per-message records: gating, coarsening (Merge and Link between messages), hybrid
recall, graph, bridges, paths, serialisation. Lost: atomic, self-contained restatements (a node
is a whole message, pronouns and relative times unresolved), extracted entities, keywords,
locations and event times (the heuristics and the session date stand in), and the answer. A
message-to-message cosine runs higher than the paper's message-to-entry one, so offline the
gate drops about a quarter of BEAM's messages, evidence among them; GATE_REDUNDANCY = 1.0 turns
it off but for exact repeats. BEAM's sessions lie weeks apart, beyond the 168-hour bridge
window, so bridges seldom form there.
Not implemented in either mode: the paper's fast paths (counters cached during ingestion, regex
lookup of metadata attributes); every question takes the general path. The paper's answer rule
(iv) asks for JSON; here the answer is plain text, as the executor hands the reply to the
scorers unchanged.
"""

import json
import re
from dataclasses import dataclass
from datetime import datetime
from itertools import pairwise

import bm25s
import numpy as np
import Stemmer

OUT_CHAR_BUDGET = 16000  # fixed by the environment; the executor enforces it as well

PUBLIC_CODE_VALUES = False  # use the public code's values where they differ from the paper (bool)

# Phase I: gating, extraction, coarsening
GATE_REDUNDANCY = 0.6  # λ_red: cosine above which a recent near neighbour gates (range 0.3-1.0)
GATE_HOURS = 1.0  # δ_short: gating applies to neighbours this recent (range 0.0-24.0)
EXTRACTION_WINDOW = 20  # messages per extraction window, paper (range 5-60)
CODE_EXTRACTION_WINDOW = 40  # messages per extraction window, public code (range 5-80)
WINDOW_EXTRACTION = True  # re-extract each gated window with the task LLM when there is one (bool)
EXTRACTION_MAX_TOKENS = 2048  # reply budget of one extraction call (range 512-4096)
EXTRACTION_PROMPT_CHARS = 60000  # longest extraction prompt; the rest is cut (range 8000-120000)
COARSEN_SIMILARITY = 0.7  # λ_coal, paper (range 0.5-0.95)
CODE_COARSEN_SIMILARITY = 0.6  # λ_coal, public code (range 0.5-0.95)
COARSEN_OVERLAP = 0.9  # λ_ovlp: keyword overlap above which a similar entry merges (range 0.3-1.0)
LINK_UPDATES = True  # Link similar entries with differing keywords as updates (bool)
NN_SCOPE = 256  # newest nodes searched by gating and coarsening (range 32-2048)
ENTITY_CANDIDATES = 16  # newest nodes per mentioned entity added to coarsening (range 0-128)
MESSAGE_MINUTES = 1.0  # clock step between consecutive messages (range 0.1-30.0)
SESSION_GAP_HOURS = 24.0  # clock step before an undated session (range 1.0-168.0)
KEYWORDS_PER_UNIT = 12  # keywords derived from a unit's text (range 4-40)
ENTITIES_PER_UNIT = 8  # entities derived from a unit's text (range 2-20)

# Phase II: recall, graph, bridges, paths, serialisation
K_SEM = 20  # dense terminals, paper (range 5-100)
CODE_K_SEM = 25  # dense terminals, public code (range 5-100)
K_LEX = 5  # BM25 terminals (range 0-50)
ENTITY_PENALTY = 0.9  # dense-score factor for nodes missing the question's entities (range 0.5-1.0)
STATE_NEIGHBOURS = 2  # update-linked nodes each terminal brings along (range 0-6)
EDGE_HOURS = 6.0  # δ_time: nodes closer in time than this are connected (range 0.0-48.0)
BRIDGE_MIN_HOURS = 1.0  # smallest time gap of a pair worth bridging (range 0.0-24.0)
BRIDGE_MAX_HOURS = 168.0  # largest time gap of a pair worth bridging (range 24.0-2000.0)
BRIDGE_TOP = 5  # dense candidates considered per bridge query (range 1-20)
BRIDGE_PAIRS = 12  # most bridge queries per question (range 0-40)
MAX_HOPS = 3  # L: longest mined path, in edges (range 1-5)
DFS_STEPS = 4000  # most path extensions per question (range 200-20000)
PATH_HOP_BONUS = 0.05  # path score per hop (range 0.0-0.3)
PATH_EDGE_BONUS = 0.1  # path score per entity, bridge or update edge (range 0.0-0.5)
PATHS_SHOWN = 8  # most paths serialised (range 0-30)
NODE_BUDGET_MIN = 8  # fewest facts returned when memory has them (range 1-25)
NODE_BUDGET_MAX = 25  # most facts returned (range 8-200)
FACT_CHARS = 800  # longest text of one serialised fact (range 200-8000)

EXTRACTION_INSTRUCTION = (
    "Rewrite the conversation into atomic memory entries. Each entry states one fact, decision, "
    "preference, plan, event or state change as a lossless, self-contained sentence: replace "
    "pronouns with names, and turn relative times ('tomorrow', 'last week') into absolute dates "
    "using the message dates. Keep numbers, names, times and quantities exactly. When something "
    "changes (a meeting moved, a plan cancelled), write the new state as its own entry. Skip "
    "greetings and chit-chat. For each entry give: content (the sentence); keywords (3-8 "
    "salient words); entities (people, places, organisations, products and other named things); "
    "location, if any; timestamp (ISO date or date-time of the fact, if known); role (who said "
    "it: user or assistant); message_ids (the ids of the messages it comes from)."
)

PLANNING_INSTRUCTION = (
    "Copy the question unchanged into text. In keywords, list the names, entities, objects and "
    "time expressions the question is about (at most 8, as they would appear in a conversation)."
)

ANSWER_INSTRUCTION = (
    "Answer the question from the evidence graph below: dated facts in time order (F1 is the "
    "earliest) and reasoning paths that connect them ('A --x--> B' joins an earlier fact to a "
    "later one through a shared entity x, a bridge fact, an update, or closeness in time). Follow "
    "the paths to combine facts across sessions. Rules: (1) Length: answer a factual question in "
    "a short phrase or one sentence; answer a question asking for several items or an order with "
    "a list, one item per line. (2) Temporal fidelity: copy dates and times exactly as the facts "
    "give them, do not restate them relative to today; when a fact was updated, the latest state "
    "holds, and mention the earlier one only if asked about the change. (3) Aggregation: when "
    "asked how many, count the distinct matching facts and answer with the number first. "
    "(4) Format: reply with the answer only, without preamble. If the facts do not contain the "
    "answer, say that the information is not available."
)


@dataclass
class MemoryUnit:
    content: str
    date: str | None = None
    timestamp: str | None = None
    role: str | None = None
    keywords: list[str] | None = None
    entities: list[str] | None = None
    location: str | None = None
    message_ids: list[str] | None = None


@dataclass
class Query:
    text: str
    keywords: list[str] | None = None


@dataclass
class Fact:
    """An entry on its way into memory, with what coarsening and the graph need."""

    text: str
    stamp: str  # the date (or date-time) it shows
    time: float  # hours since 1970-01-01
    role: str
    keywords: list[str]
    entities: list[str]


_stemmer = Stemmer.Stemmer("english")


def _terms(texts):
    """Each text's stemmed terms, English stop words left out (bm25s's tokenizer)."""
    return bm25s.tokenize(
        texts, stopwords="en", stemmer=_stemmer, return_ids=False, show_progress=False
    )


_EPOCH = datetime(1970, 1, 1)
_STOPWORDS = frozenset(
    """a about above after again against all also am an and any are as at be because been before
    being below between both but by can could did do does doing done down during each even few
    for from further get got had has have having he her here hers herself him himself his how i
    if in into is it its itself just let like me more most my myself no nor not now of off on
    once only or other our ours ourselves out over own really same she should so some such than
    that the their theirs them themselves then there these they this those through to too under
    until up us use used using very want was way we well were what when where which while who
    whom why will with would yes you your yours yourself yourselves okay ok sure thanks thank
    please help need know think make one two""".split()
)
_TOKEN = re.compile(r"[A-Za-z0-9][A-Za-z0-9'’&+-]*|[.!?:;\n]")
_WORD = re.compile(r"[a-z0-9][a-z0-9'’&+-]*")
_LOWER = re.compile(r"(?<![\w'’])[a-z][a-z'’-]*")


class Memory:
    def __init__(self, backend):
        self.backend = backend
        self.dim = backend.dim
        self.size = 0
        self.vectors = np.zeros((0, backend.dim), dtype=np.float32)  # rows [0, size) are live
        self.texts: list[str] = []
        self.stamps: list[str] = []  # what a fact shows as its date
        self.times: list[float] = []  # hours since 1970-01-01, for gating and edges
        self.roles: list[str] = []
        self.keywords: list[list[str]] = []
        self.entities: list[list[str]] = []
        self.repeats: list[int] = []  # duplicates merged into each node
        self.newer: dict[int, list[int]] = {}  # Link edges old -> new
        self.older: dict[int, list[int]] = {}  # the same edges, new -> old
        self.postings: dict[str, list[int]] = {}  # entity -> nodes that mention it
        self.refreshed: list[int] = []  # nodes whose time recent merges moved forward
        self.clock: float | None = None  # time of the latest message indexed
        self.vocabulary: set[str] = set()  # words memory has seen in lower case
        self.terms: dict[str, tuple[list[int], list[int]]] = {}  # BM25: term -> nodes, counts
        self.node_terms: list[int] = []  # terms per posted node (BM25's document length)
        self.term_total = 0  # their sum
        self.stats = {"gated": 0, "merged": 0, "linked": 0, "added": 0, "llm_windows": 0}

    # -- Phase I ----------------------------------------------------------------------------

    def index(self, units, segment):
        messages = list(segment.messages)
        times = self._message_times(segment)
        stamp = segment.date or f"session {segment.session_id}"
        texts = [f"{m.role}: {m.content}" for m in messages]
        message_vectors = self.backend.embed(texts) if texts else None
        position = {m.id: i for i, m in enumerate(messages)}
        step = variant(EXTRACTION_WINDOW, CODE_EXTRACTION_WINDOW)
        n_windows = max(1, -(-len(messages) // step))
        by_window: list[list] = [[] for _ in range(n_windows)]
        for unit in units:
            found = [position[i] for i in unit.message_ids or () if i in position]
            by_window[max(found) // step if found else n_windows - 1].append((unit, found))
        llm_calls = 0
        passed: list[bool] = []  # per message of the session, once its window is gated
        llm_ok = WINDOW_EXTRACTION
        for w in range(n_windows):
            lo, hi = w * step, min(len(messages), (w + 1) * step)
            if hi > lo:
                passed += self._gate(message_vectors[lo:hi], times[lo:hi])
            kept = [i for i in range(lo, hi) if passed[i]]
            entries = None
            if llm_ok and kept and llm_calls < self.backend.max_complete_calls:
                llm_calls += 1
                entries = self._extract(segment, [messages[i] for i in kept], position)
                llm_ok = entries is not None
            if entries:
                self.stats["llm_windows"] += 1
            else:
                entries = [
                    (unit, found)
                    for unit, found in by_window[w]
                    if not found or any(passed[i] for i in found)
                ]
            self._coarsen(entries, stamp, times, texts, message_vectors)
        self._post()
        return None

    def _post(self):
        """Add the stemmed terms of the nodes added since the last call to the BM25 postings
        (a node's text never changes: merges move only its time, stamp and count)."""
        first = len(self.node_terms)
        for offset, terms in enumerate(_terms(self.texts[first:]) if first < self.size else []):
            counts = {}
            for term in terms:
                counts[term] = counts.get(term, 0) + 1
            for term, count in counts.items():
                nodes, tfs = self.terms.setdefault(term, ([], []))
                nodes.append(first + offset)
                tfs.append(count)
            self.node_terms.append(len(terms))
            self.term_total += len(terms)

    def _message_times(self, segment):
        base = parse_hours(segment.date)
        step = MESSAGE_MINUTES / 60.0
        if self.clock is None:
            start = 0.0 if base is None else base
        elif base is None:
            start = self.clock + SESSION_GAP_HOURS
        else:
            start = max(base, self.clock + step)
        times = [start + i * step for i in range(len(segment.messages))]
        if times:
            self.clock = times[-1]
        elif self.clock is None:
            self.clock = start
        return times

    def _scope(self, extra=()):
        """Node ids searched for nearest neighbours: the newest NN_SCOPE, recent merges, extra."""
        lo = max(0, self.size - NN_SCOPE)
        others = sorted({i for i in (*self.refreshed, *extra) if i < lo})[-NN_SCOPE:]
        return np.array(others + list(range(lo, self.size)), dtype=np.int64)

    def _gate(self, vectors, times):
        """Per message: True when it passes entropy-aware gating against the current memory."""
        if self.size == 0:
            return [True] * len(times)
        scope = self._scope()
        sims = vectors @ self.vectors[scope].T
        best = sims.argmax(axis=1)
        out = []
        for row, col in enumerate(best):
            node = int(scope[col])
            redundant = sims[row, col] > GATE_REDUNDANCY
            recent = abs(times[row] - self.times[node]) < GATE_HOURS
            out.append(not (redundant and recent))
        self.stats["gated"] += out.count(False)
        return out

    def _extract(self, segment, messages, position):
        """Atomic entries for one window by the task LLM; None when no LLM answers."""
        lines = [f"[{m.id}] ({segment.date or 'undated'}) {m.role}: {m.content}" for m in messages]
        prompt = (
            f"{EXTRACTION_INSTRUCTION}\n\nReply with one JSON object "
            '{"units": [{"content": "...", "keywords": [], "entities": [], "location": null, '
            '"timestamp": null, "role": "user", "message_ids": []}]}.\n\n'
            f"Session {segment.session_id}:\n" + "\n".join(lines)
        )
        try:
            reply = self.backend.complete(
                prompt[:EXTRACTION_PROMPT_CHARS], max_tokens=EXTRACTION_MAX_TOKENS
            )
        except RuntimeError:  # BackendError: no task LLM, or this call's budget is spent
            return None
        window_ids = {m.id for m in messages}
        entries = []
        for item in parse_units(reply):
            ids = [i for i in as_strings(item.get("message_ids")) if i in window_ids]
            unit = MemoryUnit(
                content=as_text(item.get("content")),
                date=segment.date,
                timestamp=as_text(item.get("timestamp")) or None,
                role=as_text(item.get("role")) or None,
                keywords=as_strings(item.get("keywords")),
                entities=as_strings(item.get("entities")),
                location=as_text(item.get("location")) or None,
                message_ids=ids,
            )
            if unit.content:
                entries.append((unit, [position[i] for i in ids] or [position[messages[-1].id]]))
        return entries

    def _coarsen(self, entries, stamp, times, message_texts, message_vectors):
        """Merge, Link or Add each entry against its nearest node (vectorised per window)."""
        if not entries:
            return
        vectors = self._entry_vectors(entries, message_texts, message_vectors)
        facts = []
        for unit, found in entries:
            text = unit.content
            when = parse_hours(unit.timestamp)
            if when is None:
                when = times[max(found)] if found else (self.clock or 0.0)
            facts.append(
                Fact(
                    text=text,
                    stamp=unit.timestamp or unit.date or stamp,
                    time=when,
                    role=unit.role or "",
                    keywords=lowered(unit.keywords) or guess_keywords(text, KEYWORDS_PER_UNIT),
                    entities=lowered([*(unit.entities or ()), unit.location or ""])
                    or guess_entities(text, ENTITIES_PER_UNIT, self.vocabulary),
                )
            )
        mentioned = [
            n
            for f in facts
            for e in f.entities
            for n in self.postings.get(e, [])[-ENTITY_CANDIDATES:]
        ]
        scope = self._scope(mentioned) if self.size else np.zeros(0, dtype=np.int64)
        old_sims = vectors @ self.vectors[scope].T if len(scope) else None
        new_sims = vectors @ vectors.T
        threshold = variant(COARSEN_SIMILARITY, CODE_COARSEN_SIMILARITY)
        link = LINK_UPDATES and not PUBLIC_CODE_VALUES
        placed: list[int | None] = []  # node id of each entry added in this window
        for k, fact in enumerate(facts):
            best, best_sim = None, -1.0
            if old_sims is not None:
                col = int(old_sims[k].argmax())
                best, best_sim = int(scope[col]), float(old_sims[k, col])
            for j in range(k):
                if placed[j] is not None and new_sims[k, j] > best_sim:
                    best, best_sim = placed[j], float(new_sims[k, j])
            if best is not None and best_sim > threshold:
                if overlap(fact.keywords, self.keywords[best]) > COARSEN_OVERLAP:
                    self._merge(best, fact)
                    placed.append(None)
                    continue
                speakers = {fact.role, self.roles[best]} - {""}
                if link and len(speakers) < 2:
                    node = self._add(fact, vectors[k])
                    self.newer.setdefault(best, []).append(node)
                    self.older.setdefault(node, []).append(best)
                    self.stats["linked"] += 1
                    placed.append(node)
                    continue
            placed.append(self._add(fact, vectors[k]))
            self.stats["added"] += 1

    def _entry_vectors(self, entries, message_texts, message_vectors):
        """Embeddings of the entries; a unit that is its message verbatim reuses its vector."""
        rows = [
            found[0] if len(found) == 1 and message_texts[found[0]] == unit.content else None
            for unit, found in entries
        ]
        missing = [k for k, r in enumerate(rows) if r is None]
        out = np.zeros((len(entries), self.dim), dtype=np.float32)
        if missing:
            out[missing] = self.backend.embed([entries[k][0].content for k in missing])
        present = [k for k, r in enumerate(rows) if r is not None]
        if present:
            out[present] = message_vectors[[rows[k] for k in present]]
        return out

    def _merge(self, node, fact):
        self.times[node] = max(self.times[node], fact.time)
        self.stamps[node] = fact.stamp
        self.repeats[node] += 1
        self.refreshed = [*self.refreshed[-63:], node]
        self.stats["merged"] += 1

    def _add(self, fact, vector):
        node = self.size
        if node == len(self.vectors):
            grown = np.zeros((max(64, 2 * node), self.dim), dtype=np.float32)
            grown[:node] = self.vectors[:node]
            self.vectors = grown
        self.vectors[node] = vector
        self.size += 1
        self.texts.append(fact.text)
        self.stamps.append(fact.stamp)
        self.times.append(fact.time)
        self.roles.append(fact.role)
        self.keywords.append(fact.keywords)
        self.entities.append(fact.entities)
        self.vocabulary.update(_LOWER.findall(fact.text))
        self.repeats.append(0)
        for entity in fact.entities:
            self.postings.setdefault(entity, []).append(node)
        return node

    # -- Phase II ---------------------------------------------------------------------------

    def retrieve(self, query):
        if self.size == 0:
            return ""
        words = " ".join(query.keywords or ())
        qvec = self.backend.embed([query.text])[0]
        relevance = self.vectors[: self.size] @ qvec
        wanted = set(guess_entities(query.text, ENTITIES_PER_UNIT, self.vocabulary)) | {
            k for k in lowered(query.keywords) if k in self.postings
        }
        hits = {n for e in wanted for n in self.postings.get(e, ())}
        if hits and ENTITY_PENALTY < 1.0:
            aligned = np.zeros(self.size, dtype=bool)
            aligned[list(hits)] = True
            relevance = np.where(aligned, relevance, relevance * ENTITY_PENALTY)
        ranked = top_indices(relevance, self.size)
        terminals = [int(i) for i in ranked[: variant(K_SEM, CODE_K_SEM)]]
        for node in self._lexical_hits(f"{query.text} {words}"):
            if node not in terminals:
                terminals.append(node)
        graph = Graph(self, terminals, relevance)
        graph.discover_bridges()
        paths = graph.mine_paths()
        chosen = graph.budget(paths, ranked)
        return self._serialise(graph, chosen, [p for p in paths if set(p) <= set(chosen)])

    def _lexical_hits(self, text):
        """The K_LEX best nodes by BM25, best first (none that scores 0)."""
        if K_LEX <= 0 or not self.terms:
            return []
        scores = self._bm25(_terms([text])[0])
        return [int(i) for i in top_indices(scores, K_LEX) if scores[i] > 0]

    def _bm25(self, terms):
        """Each node's BM25 score for the query's terms (Lucene's variant, k1 1.5, b 0.75:
        float32, the scores of a bm25s index over every node's text), read from the postings
        ``index`` grows; a term named twice counts twice."""
        scores = np.zeros(self.size, dtype=np.float32)
        if not self.terms:
            return scores
        n, average = self.size, self.term_total / self.size
        for term in terms:
            posting = self.terms.get(term)
            if posting is None:
                continue
            held = len(posting[0])
            idf = float(np.float32(np.log(1 + (n - held + 0.5) / (held + 0.5))))
            lengths = np.asarray([self.node_terms[i] for i in posting[0]], dtype=np.float64)
            tf = np.asarray(posting[1], dtype=np.float64)
            norm = 1.5 * ((1 - 0.75) + 0.75 * lengths / average)
            np.add.at(scores, posting[0], (idf * (tf / (norm + tf))).astype(np.float32))
        return scores

    def _serialise(self, graph, chosen, paths):
        """The legend, the paths and the dated facts in time order, within the budget."""
        priority = list(chosen)
        while priority:
            order = sorted(priority, key=lambda n: (self.times[n], n))
            label = {n: f"F{i + 1}" for i, n in enumerate(order)}
            shown = [p for p in paths if all(n in label for n in p)]
            lines = [graph.render_path(p, label) for p in shown]
            head = f"Evidence graph: {plural(len(order), 'fact')} in time order (F1 earliest)"
            if lines:
                head += f" and {plural(len(lines), 'reasoning path')}:\n" + "\n".join(lines)
            blocks = [head] + [self._render(n, label, graph) for n in order]
            text = "\n\n".join(blocks)
            if len(text) <= OUT_CHAR_BUDGET:
                return text
            priority.pop()
        return ""

    def _render(self, node, label, graph):
        tags = [label[node], self.stamps[node]]
        role = self.roles[node]
        if role and not self.texts[node].startswith(f"{role}:"):
            tags.append(role)
        if node in graph.bridges:
            tags.append("bridge")
        tags += [f"updates {label[o]}" for o in self.older.get(node, ()) if o in label]
        tags += [f"updated by {label[n]}" for n in self.newer.get(node, ()) if n in label]
        if self.repeats[node]:
            tags.append(f"said {self.repeats[node] + 1} times")
        text = self.texts[node]
        if len(text) > FACT_CHARS:
            text = text[:FACT_CHARS].rstrip() + " …"
        return f"[{' | '.join(tags)}] {text}"


class Graph:
    """The query-specific evidence graph: terminals, state neighbours, bridges, edges."""

    def __init__(self, memory, terminals, relevance):
        self.memory = memory
        self.relevance = relevance
        self.terminals = terminals
        self.nodes = list(terminals)
        for node in terminals:
            linked = memory.newer.get(node, [])[-STATE_NEIGHBOURS:] + memory.older.get(node, [])
            for other in linked[:STATE_NEIGHBOURS]:
                if other not in self.nodes:
                    self.nodes.append(other)
        self.bridges: set[int] = set()
        self.edges: dict[tuple[int, int], str] = {}  # (earlier, later) -> label
        self.parent = {n: n for n in self.nodes}
        for i, a in enumerate(self.nodes):
            for b in self.nodes[i + 1 :]:
                label = self._base_label(a, b)
                if label:
                    self._connect(a, b, label)

    def _earlier(self, a, b):
        return (self.memory.times[a], a) <= (self.memory.times[b], b)

    def _base_label(self, a, b):
        m = self.memory
        if b in m.newer.get(a, ()) or a in m.newer.get(b, ()):
            return "update"
        shared = set(m.entities[a]) & set(m.entities[b])
        if shared:
            return min(shared, key=lambda e: (len(m.postings.get(e, ())), e))
        if abs(m.times[a] - m.times[b]) < EDGE_HOURS:
            return "then"
        return None

    def _connect(self, a, b, label):
        if b in self.memory.newer.get(a, ()):
            pair = (a, b)
        elif a in self.memory.newer.get(b, ()):
            pair = (b, a)
        else:
            pair = (a, b) if self._earlier(a, b) else (b, a)
        self.edges[pair] = label
        self.parent.setdefault(a, a)
        self.parent.setdefault(b, b)
        self._union(a, b)

    def _find(self, node):
        while self.parent[node] != node:
            self.parent[node] = self.parent[self.parent[node]]
            node = self.parent[node]
        return node

    def _union(self, a, b):
        self.parent[self._find(a)] = self._find(b)

    def discover_bridges(self):
        """Steiner approximation: one bridge node between disconnected terminal pairs."""
        m = self.memory
        roots = {n: self._find(n) for n in self.terminals}
        tentative = dict(roots)

        def root(n):
            while tentative[n] != n:
                n = tentative[n]
            return n

        for n in set(roots.values()):
            tentative.setdefault(n, n)
        pairs = []
        order = sorted(self.terminals, key=lambda n: -float(self.relevance[n]))
        for i, a in enumerate(order):
            for b in order[i + 1 :]:
                if len(pairs) >= BRIDGE_PAIRS:
                    break
                gap = abs(m.times[a] - m.times[b])
                if BRIDGE_MIN_HOURS <= gap <= BRIDGE_MAX_HOURS and root(a) != root(b):
                    tentative[root(a)] = root(b)
                    pairs.append((a, b))
        if not pairs:
            return
        texts = [
            " ".join(dict.fromkeys(m.entities[a] + m.entities[b] + m.keywords[a] + m.keywords[b]))
            for a, b in pairs
        ]
        sims = m.backend.embed(texts) @ m.vectors[: m.size].T
        sims[:, self.nodes] = -np.inf
        times = np.asarray(m.times)
        for (a, b), row in zip(pairs, sims, strict=True):
            lo, hi = sorted((m.times[a], m.times[b]))
            for cand in top_indices(row, BRIDGE_TOP):
                cand = int(cand)
                if np.isfinite(row[cand]) and lo <= times[cand] <= hi:
                    if cand not in self.bridges:
                        self.bridges.add(cand)
                        self.nodes.append(cand)
                    self._connect(a, cand, "bridge")
                    self._connect(cand, b, "bridge")
                    break

    def mine_paths(self):
        """Directed paths of 1..MAX_HOPS edges by bounded DFS, best first, none inside another."""
        rel = {n: float(self.relevance[n]) for n in self.nodes}
        succ: dict[int, list[int]] = {}
        for a, b in self.edges:
            succ.setdefault(a, []).append(b)
        for outs in succ.values():
            outs.sort(key=lambda n: -rel[n])
        found = []
        steps = 0
        for start in sorted(succ, key=lambda n: -rel[n]):
            stack = [[start]]
            while stack and steps < DFS_STEPS:
                path = stack.pop()
                if len(path) > 1:
                    found.append(path)
                if len(path) > MAX_HOPS:
                    continue
                for nxt in reversed(succ.get(path[-1], ())):
                    if nxt not in path:  # an update can point back in time: no cycles
                        steps += 1
                        stack.append([*path, nxt])
        scored = []
        for path in found:
            hops = len(path) - 1
            strong = sum(self.edges[(a, b)] != "then" for a, b in pairwise(path))
            score = sum(rel[n] for n in path) / len(path)
            scored.append((score + PATH_HOP_BONUS * hops + PATH_EDGE_BONUS * strong, path))
        scored.sort(key=lambda s: -s[0])
        kept: list[list[int]] = []
        for _, path in scored:
            if len(kept) >= PATHS_SHOWN:
                break
            if not any(set(path) <= set(k) for k in kept):
                kept.append(path)
        return kept

    def budget(self, paths, ranked):
        """Nodes on paths, then terminals, then the rest; NODE_BUDGET_MIN..NODE_BUDGET_MAX."""
        order = []
        for path in paths:
            order += path
        order += sorted(self.terminals, key=lambda n: -float(self.relevance[n]))
        order += sorted(self.nodes, key=lambda n: -float(self.relevance[n]))
        chosen = list(dict.fromkeys(order))[:NODE_BUDGET_MAX]
        for node in ranked:
            if len(chosen) >= min(NODE_BUDGET_MIN, self.memory.size):
                break
            if int(node) not in chosen:
                chosen.append(int(node))
        return chosen

    def render_path(self, path, label):
        parts = [label[path[0]]]
        for a, b in pairwise(path):
            parts.append(f"--{self.edges[(a, b)]}--> {label[b]}")
        return " ".join(parts)


def variant(paper_value, code_value):
    """The paper's value, or the public code's when PUBLIC_CODE_VALUES is set."""
    return code_value if PUBLIC_CODE_VALUES else paper_value


def parse_hours(text):
    """Hours since 1970-01-01 of an ISO date or date-time; None when it does not parse."""
    if not text:
        return None
    text = text.strip().replace("Z", "+00:00")
    for candidate in (text, text[:19], text[:10]):
        try:
            moment = datetime.fromisoformat(candidate)
        except ValueError:
            continue
        return (moment.replace(tzinfo=None) - _EPOCH).total_seconds() / 3600.0
    return None


def guess_entities(text, limit, common=frozenset()):
    """Capitalised words and acronyms that do not open a sentence, as lower-case phrases.

    A phrase whose every word also occurs in lower case (in ``text`` or in ``common``, the
    lower-case vocabulary of memory) is a common word in a heading or a formula, not a name."""
    phrases: list[str] = []
    phrase: list[str] = []
    opening = True
    for match in _TOKEN.finditer(text):
        token = match.group()
        if token in ".!?:;\n":
            opening = True
            phrase = flush(phrase, phrases)
            continue
        word = re.sub(r"['’]s$", "", token)
        base = re.split(r"['’]", word)[0]
        acronym = len(word) > 1 and word.isupper() and word.isalpha()
        if (
            len(base) > 1
            and base.lower() not in _STOPWORDS
            and ((word[0].isupper() and not opening) or acronym)
        ):
            phrase.append(word.lower())
        else:
            phrase = flush(phrase, phrases)
        opening = False
    flush(phrase, phrases)
    seen = set(_LOWER.findall(text))
    names = [p for p in phrases if any(w not in seen and w not in common for w in p.split())]
    return names[:limit]


def flush(phrase, phrases):
    if phrase:
        name = " ".join(phrase)
        if name not in phrases:
            phrases.append(name)
    return []


def guess_keywords(text, limit):
    """The most frequent content words, ties broken by first appearance."""
    counts: dict[str, int] = {}
    for word in _WORD.findall(text.lower()):
        word = re.sub(r"['’]s$", "", word)
        if word in _STOPWORDS or (len(word) < 3 and not any(c.isdigit() for c in word)):
            continue
        counts[word] = counts.get(word, 0) + 1
    ranked = sorted(counts, key=lambda w: -counts[w])  # stable: first appearance wins ties
    return ranked[:limit]


def plural(count, noun):
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def overlap(new, old):
    return len(set(new) & set(old)) / max(1, len(set(new)))


def lowered(values):
    return list(dict.fromkeys(v.strip().lower() for v in values or () if v.strip()))


def top_indices(scores, k):
    """Indices of the k highest scores, best first."""
    k = min(k, len(scores))
    if k <= 0:
        return np.zeros(0, dtype=np.int64)
    top = np.argpartition(-scores, k - 1)[:k]
    return top[np.argsort(-scores[top], kind="stable")]


def parse_units(reply):
    """The list of entry objects in an extraction reply; empty when it is not JSON."""
    start, end = reply.find("{"), reply.rfind("}")
    try:
        data = json.loads(reply[start : end + 1]) if start >= 0 else None
    except ValueError:
        return []
    items = data.get("units") if isinstance(data, dict) else None
    return [item for item in items if isinstance(item, dict)] if isinstance(items, list) else []


def as_text(value):
    return value.strip() if isinstance(value, str) else ""


def as_strings(value):
    return [v for v in value if isinstance(v, str) and v.strip()] if isinstance(value, list) else []
