"""PRISM seed: a typed memory graph searched by intent-routed minimum-cost paths.

After PRISM (Pareto-efficient retrieval over intent-aware structured memory). Indexing builds a
graph with four node layers: Entity (a named anchor shared across chunks), FacetPoint (one
atomic fact), Facet (a theme grouping the facet points of one chunk) and Episode (the chunk,
the unit handed to the answer model). Edges: belongs_to (Entity -> FacetPoint -> Facet ->
Episode; an Entity is the facet point's related entity), involves_entity (Entity -> Facet
shortcut for every entity a facet's points mention), temporal (the chronological chain of
Episodes, and between FacetPoints that carry an explicit time, each to the nearest ones
strictly before and after it), evolution
(facet points of the same related entity: the entity's latest earlier facet point -> its
earliest one in a new episode, and its facet points inside one episode in time order) and
causal (every CAUSAL_INTERVAL new episodes one LLM call reads the CAUSAL_WINDOW latest episode
summaries and returns cause/effect pairs; those below CAUSAL_MIN_CONFIDENCE are dropped).
Semantic edges belong to PRISM's schema but are off in its published configuration and no
path template crosses them, so this program does not build them. An entity is merged with an
existing one on an exact name match, else when their name embeddings have cosine >=
ENTITY_MERGE_SIM; a facet is merged with a facet of the same episode at theme cosine >=
FACET_MERGE_SIM.

Retrieval runs PRISM's four modules in order:
- N4 intent routing: keyword triggers (temporal, causal) -> similarity to prototype questions
  (commit when the best prototype's cosine exceeds PROTO_THRESHOLD and beats the best of every
  other intent by PROTO_MARGIN) -> one LLM call scoring temporal, causal, multi_hop and
  entity_centric in [0, 1] (kept at >= INTENT_SCORE_MIN; multi_hop suppresses entity_centric);
  no intent means "general".
- N2 query-sensitive edge costs: a relation edge costs EDGE_BASE_COST, times TEMPORAL_DISCOUNT
  (temporal edges) and EVOLUTION_DISCOUNT (evolution edges) under the temporal intent, times
  CAUSAL_DISCOUNT (causal edges) under the causal intent, and times MULTI_HOP_DISCOUNT
  (evolution and causal edges) under multi_hop; belongs_to and involves_entity cost
  BELONGS_TO_COST. Every edge crossed adds HOP_COST.
- N1 hierarchical bundle search: the ANCHOR_K nodes of each layer nearest to the query (cosine
  distance) start eight path templates, five belongs_to backbones (Ep; Fc -> Ep; FP -> Fc ->
  Ep; En -> FP -> Fc -> Ep; En -> Fc -> Ep) and three bridges that cross one temporal, causal
  or evolution edge before re-entering the hierarchy (a -> v -> Ep). A path that starts at an
  Episode anchor without crossing an edge pays DIRECT_EPISODE_PENALTY. Each episode scores its
  cheapest path (ties: its best facet point's cosine); the BUNDLE_K cheapest form the bundle.
- N3 evidence compression: one LLM call rates each bundle episode 0-10 from its first
  RERANK_SUMMARY_CHARS characters and keeps the RERANK_M best; skipped when the bundle has at
  most RERANK_M episodes.
The chosen episodes are serialised in rank order, each under a header with its date and
session, with its lines (summary and facts, or messages) picked best-first round-robin across
episodes within the character budget and shown in source order, each cut at LINE_CHARS.

Offline (no task LLM; backend.complete raises): extraction yields one unit per message, its
`summary` the message ("role: text"), date, role and message id set and the structured lists
empty. The program then groups EPISODE_UNITS consecutive messages of a session into an
Episode, makes each message a Facet (theme: the message) and cuts it into FacetPoints of about
FACT_CHARS characters; entities are capitalised names, dates, money and percentages, and words
repeated within a facet point; a facet point's time is an explicit date in its text. Lost
offline: LLM summaries, typed entities and atomic facts (facts are
message pieces, episodes show the raw messages), resolved relative times, causal edges, the
LLM tier of intent routing (falls through to "general") and the N3 rerank (the whole bundle
of BUNDLE_K episodes is packed instead). With an LLM every call goes through backend.complete,
at most backend.max_complete_calls per index or retrieve call (causal passes beyond that are
skipped); a failed or refused call (BackendError) degrades as offline for the rest of the
call.

Parameter sheet. "here" is this program's default ("ours": chosen here, not taken from PRISM);
"paper" is the PRISM text with its Appendix C ("n/s": not stated in the copy available here,
which lacks Table 5 and the body of sections 3.4-3.6); "code" is PRISM's public code (package
`mmem`, read in a public code index; its example configuration says its values are Table 5's).
| constant | here | paper | code |
| ENTITY_MERGE_SIM | 0.90 | 0.90 | 0.90 |
| FACET_MERGE_SIM | 0.85, same episode | 0.85, same episode | 0.85, any stored facet |
| CAUSAL_INTERVAL | 5 episodes | every 5 chunks | 5 |
| CAUSAL_WINDOW | 5 latest episodes | 5 most recent episodes | not checked |
| CAUSAL_MIN_CONFIDENCE | 0.7 | 0.7 | 0.7 |
| ANCHOR_K | 30 per layer | n/s | 30 (wide_search_top_k) |
| BUNDLE_K | 10 | K = 10 | 10 |
| RERANK_M | 5 | M = 5 | 5 (rerank_top_n) |
| RERANK_SUMMARY_CHARS | 400 | 400 | not checked |
| HOP_COST | 0.05 | n/s | 0.05 |
| BELONGS_TO_COST | 0.02 | n/s | 0.02 |
| EDGE_BASE_COST | 0.9 | n/s | 0.9 (edge_miss_cost) |
| DIRECT_EPISODE_PENALTY | 0.3 | n/s | 0.3 |
| TEMPORAL_DISCOUNT | 0.5 | n/s | 0.5 |
| CAUSAL_DISCOUNT | 0.5 | n/s | 0.5 |
| EVOLUTION_DISCOUNT | 0.7 under temporal | n/s | 0.7 under temporal |
| MULTI_HOP_DISCOUNT | 0.7 (ours) | n/s | none |
| PROTO_THRESHOLD | 0.55 | theta_proto, n/s | 0.55 |
| PROTO_MARGIN | 0.10 | 0.10 | 0.10 |
| INTENT_SCORE_MIN | 0.5 (ours) | thresholded, n/s | not checked |
| intent cascade | all three tiers | N4 is an optional extension | keyword tier by default |
| triggers, prototypes | 18 + 14; 8 per intent (ours) | 18 + 14; 46 | not checked |
| EPISODE_UNITS | 4 messages (offline chunking, ours) | chunking n/s | not checked |
| FACT_CHARS | 600 (offline facet points, ours) | n/s | not checked |
| MAX_ENTITIES_PER_POINT | 8 (ours) | n/s | not checked |
| LINE_CHARS | 600 (ours) | n/s | not checked |
| RELATION_PATHS, QUERY_SENSITIVE_COST | on, on | N1, N2 on | on, on |
| RERANK | on | N3 on | on in the example config; off in config.py |
In the code a relation edge that is itself a vector hit costs its distance to the query and
only the others cost edge_miss_cost; edges keep no embeddings here, so every relation edge costs
EDGE_BASE_COST before discounts.

Every module-level number or boolean below is a tunable constant; the comment gives its range.
"""

import bisect
import json
import re
from collections import Counter
from dataclasses import dataclass, field
from datetime import date

import numpy as np

OUT_CHAR_BUDGET = 16000  # fixed by the environment; the executor enforces it as well

# Graph construction
EPISODE_UNITS = 4  # offline: consecutive message units per Episode (range 1-20)
FACT_CHARS = 600  # offline: size of a FacetPoint cut from a message (range 200-3000)
MAX_ENTITIES_PER_POINT = 8  # entities kept per facet point (range 1-20)
ENTITY_MERGE_SIM = 0.90  # name-embedding cosine that merges two entities (range 0.8-1.0)
FACET_MERGE_SIM = 0.85  # theme cosine that merges facets of one episode (range 0.7-1.0)
CAUSAL_INTERVAL = 5  # new episodes between causal-induction calls (range 1-20)
CAUSAL_WINDOW = 5  # latest episodes shown to one causal-induction call (range 2-20)
CAUSAL_MIN_CONFIDENCE = 0.7  # causal pairs below this are dropped (range 0.0-1.0)

# N4 intent routing
PROTO_THRESHOLD = 0.55  # best prototype cosine needed to commit an intent (range 0.3-0.9)
PROTO_MARGIN = 0.10  # lead of the best intent's prototype over the next intent (range 0.0-0.3)
INTENT_SCORE_MIN = 0.5  # LLM intent score that counts as present (range 0.1-0.9)

# N2 edge costs
EDGE_BASE_COST = 0.9  # cost of a temporal, causal or evolution edge (range 0.1-2.0)
BELONGS_TO_COST = 0.02  # cost of a belongs_to or involves_entity edge (range 0.0-0.2)
HOP_COST = 0.05  # added for every edge a path crosses (range 0.0-0.5)
DIRECT_EPISODE_PENALTY = 0.3  # added to a path that starts at an Episode (range 0.0-1.0)
QUERY_SENSITIVE_COST = True  # apply the intent discounts below (bool)
TEMPORAL_DISCOUNT = 0.5  # temporal edges under the temporal intent (range 0.1-1.0)
CAUSAL_DISCOUNT = 0.5  # causal edges under the causal intent (range 0.1-1.0)
EVOLUTION_DISCOUNT = 0.7  # evolution edges under the temporal intent (range 0.1-1.0)
MULTI_HOP_DISCOUNT = 0.7  # evolution and causal edges under multi_hop (range 0.1-1.0)

# N1 bundle search
ANCHOR_K = 30  # query anchors taken from each node layer (range 5-200)
BUNDLE_K = 10  # episodes in the candidate bundle (range 1-50)
RELATION_PATHS = True  # search the three relation-bridge templates (bool)

# N3 evidence compression and serialisation
RERANK = True  # let the LLM rerank the bundle when it is larger than RERANK_M (bool)
RERANK_M = 5  # episodes kept after the rerank (range 1-20)
RERANK_SUMMARY_CHARS = 400  # characters of each episode shown to the reranker (range 100-2000)
LINE_CHARS = 600  # longest line (message, summary or fact) returned (range 200-8000)

EXTRACTION_INSTRUCTION = (
    "Cut the conversation session into chunks of a few consecutive turns that belong together "
    "and write one memory unit per chunk. summary: a concise but complete account of every "
    "event and fact in the chunk, with the names, dates, places, objects and quantities. "
    "date: the session date (YYYY-MM-DD). role: who said most of it (user or assistant). "
    "message_ids: the ids of the chunk's messages. entities: every named person, "
    "organisation, place, concept, event or specific item (book, food, tool, pet, activity) "
    'as "name | type", type one of person, organization, place, concept, event, other, with '
    "the name as written in the text. facet_points: every distinct atomic fact, specific and "
    'concrete (not "the user likes pottery" but "the user made a cup in pottery class"), as '
    '"fact | related entity name or empty | time expression or empty"; prefer more facts to '
    'fewer. facets: themes grouping the facts, as "theme | comma-separated zero-based indices '
    'of facet_points". temporal_info: every time reference as "subject | time expression | '
    'YYYY-MM-DD or empty | before, after, during or at"; resolve relative times such as '
    "yesterday or last week against the session date. Use only what the text supports; leave "
    "a list empty when nothing fits."
)

PLANNING_INSTRUCTION = (
    "Rewrite the question as a search query that names the facts, entities and time "
    "expressions needed to answer it; keep the question's own wording where it is specific."
)

ANSWER_INSTRUCTION = (
    "Answer the question from the retrieved memory episodes, each headed by its date. Be "
    "specific and quote concrete details (names, dates, objects, places). For questions about "
    "time, compute absolute dates from the episode dates and relative expressions (yesterday, "
    "last week); when several similar events exist, tell them apart by their dates. If the "
    "episodes hold only part of the answer, give the best answer they support; say that the "
    "information is not available only when nothing relevant is there."
)


@dataclass
class MemoryUnit:
    summary: str
    date: str | None = None
    role: str | None = None
    message_ids: list[str] | None = None
    entities: list[str] = field(default_factory=list)
    facet_points: list[str] = field(default_factory=list)
    facets: list[str] = field(default_factory=list)
    temporal_info: list[str] = field(default_factory=list)


@dataclass
class Query:
    text: str


INTENTS = ("temporal", "causal", "multi_hop", "entity_centric")
TRIGGERS = {
    "temporal": (
        "when", "before", "after", "during", "how long", "what year", "what month",
        "what date", "which day", "first time", "last time", "earlier", "later", "recently",
        "since", "until", "in what order", "order in which",
    ),
    "causal": (
        "why", "because", "cause", "caused", "causes", "reason", "led to", "lead to",
        "leads to", "due to", "result of", "as a result", "consequence", "so that",
    ),
}  # fmt: skip
PROTOTYPES = {
    "temporal": (
        "When did this happen?",
        "What happened before that?",
        "How long ago did I start doing it?",
        "In what order did these events take place?",
        "On what date was the meeting?",
        "Which of the two came first?",
        "How much time passed between the two events?",
        "What did I do right after the trip?",
    ),
    "causal": (
        "Why did I decide to change my plans?",
        "What caused the problem?",
        "What was the reason for the delay?",
        "What led to this outcome?",
        "How did that decision affect the project?",
        "What motivated my choice?",
        "What happened as a consequence of missing the deadline?",
        "Why did the approach fail?",
    ),
    "multi_hop": (
        "How has my view on this changed across our conversations?",
        "Based on everything I told you, what would I most likely prefer?",
        "How many times did I mention this in total across sessions?",
        "How does the first topic relate to the second one?",
        "Putting together what I said earlier and later, what is the overall trend?",
        "Summarise everything we discussed about this topic.",
        "What do these separate events have in common?",
        "Given my past choices, what should I do next?",
    ),
    "entity_centric": (
        "Who is my manager?",
        "Where does my sister live?",
        "What is the name of my dog?",
        "What is my job title?",
        "What does the tool I use do?",
        "Which company do I work for?",
        "How much did the item I bought cost?",
        "What is my friend's favourite food?",
    ),
}

STOPWORDS = frozenset(
    """a about above after again against all also am an and any are as at be because been
    before being below between both but by can could did do does doing done down during each
    even every few for from further get got had has have having he her here hers him his how
    however i if in into is it its just let like made make many may me might more most much
    must my no nor not now of off on once one only or other our out over own same she should
    so some still such than that the their them then there these they this those through to
    too two under until up use used using very want was way we well were what when where
    which while who whom why will with would yes yet you your yours user assistant""".split()
)
WEEKDAYS = "monday tuesday wednesday thursday friday saturday sunday".split()
MONTHS = {
    m: i + 1
    for i, m in enumerate(
        "january february march april may june july august september october november "
        "december".split()
    )
}
NOT_NAMES = STOPWORDS | set(MONTHS) | set(WEEKDAYS)  # capitalised words that are not names
_MONTH = r"(January|February|March|April|May|June|July|August|September|October|November|December)"
ISO_DATE = re.compile(r"\b(\d{4})-(\d{2})-(\d{2})\b")
MONTH_DAY_YEAR = re.compile(_MONTH + r"\s+(\d{1,2})(?:st|nd|rd|th)?,?\s+(\d{4})\b")
DAY_MONTH_YEAR = re.compile(r"\b(\d{1,2})(?:st|nd|rd|th)?\s+" + _MONTH + r",?\s+(\d{4})\b")
NAME = re.compile(r"\b[A-Z][a-zA-Z0-9]+(?:[ -][A-Z][a-zA-Z0-9]+)*")
AMOUNT = re.compile(r"[$€£]\s?\d[\d,]*(?:\.\d+)?|\b\d+(?:\.\d+)?\s?(?:%|percent\b)")
WORD = re.compile(r"[a-z][a-z0-9]+(?:['-][a-z0-9]+)*")
SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n+")


@dataclass(eq=False)
class Episode:
    key: tuple[int, int]  # chronological position: (day ordinal or -1, insertion sequence)
    day: str
    session: str
    summary: str  # the chunk summary ("" offline)
    lines: list[str]  # what the answer model may see, in source order
    facets: list[int] = field(default_factory=list)


@dataclass(eq=False)
class Facet:
    episode: int
    theme: str
    line: int  # the episode line the facet is (a message offline), or -1
    points: list[int] = field(default_factory=list)


@dataclass(eq=False)
class FacetPoint:
    facet: int
    episode: int
    line: int  # the episode line showing this fact
    time: int | None  # day ordinal of an explicit time, if any
    entities: list[int] = field(default_factory=list)  # the related entity first


@dataclass(eq=False)
class Entity:
    name: str
    kind: str
    points: list[int] = field(default_factory=list)  # belongs_to: facet points it relates to
    facets: list[int] = field(default_factory=list)  # involves_entity: facets mentioning it
    last_point: int = -1  # its latest facet point, where the next evolution edge starts
    last_key: tuple[int, int] = (-1, -1)


class Layer:
    """The embeddings of one node layer, appended per batch into a buffer that doubles when
    full (O(n) for n rows in all), read as a view of its filled rows."""

    def __init__(self, dim: int) -> None:
        self.buffer = np.zeros((0, dim), dtype=np.float32)
        self.size = 0

    def add(self, rows: np.ndarray) -> None:
        end = self.size + len(rows)
        if end > len(self.buffer):
            grown = np.zeros((max(end, 2 * len(self.buffer)), self.buffer.shape[1]), np.float32)
            grown[: self.size] = self.buffer[: self.size]
            self.buffer = grown
        self.buffer[self.size : end] = rows
        self.size = end

    def matrix(self) -> np.ndarray:
        return self.buffer[: self.size]


class Calls:
    """The LLM calls one index or retrieve call may still make."""

    def __init__(self, left: int) -> None:
        self.left = left


class Memory:
    def __init__(self, backend):
        self.backend = backend
        self.episodes: list[Episode] = []
        self.facets: list[Facet] = []
        self.points: list[FacetPoint] = []
        self.entities: list[Entity] = []
        self.entity_ids: dict[str, int] = {}  # normalised name (and merged aliases) -> entity
        self.layers = {name: Layer(backend.dim) for name in ("episode", "facet", "point", "entity")}
        self.chain: list[tuple[tuple[int, int], int]] = []  # temporal: episodes by time
        self.timed: list[tuple[int, int]] = []  # temporal: (day, facet point) by time
        self.evolution: dict[int, list[int]] = {}  # facet point -> facet points, both ways
        self.causal: dict[int, list[int]] = {}  # episode -> episodes, both ways
        self.since_causal = 0  # new episodes since the last causal-induction pass
        self.prototypes: np.ndarray | None = None  # prototype question embeddings, from index

    # -- indexing ----------------------------------------------------------------------

    def index(self, units, segment):
        calls = Calls(self.backend.max_complete_calls)
        specs = episode_specs(units, segment)
        if not specs:
            return None
        if self.prototypes is None:
            self.prototypes = self.backend.embed([p for i in INTENTS for p in PROTOTYPES[i]])
        texts: dict[str, int] = {}  # every text embedded in this batch -> its row
        for spec in specs:
            for item in ([spec["summary"]] if spec["summary"] else []) + [
                f["theme"] for f in spec["facets"]
            ]:
                texts.setdefault(item, len(texts))
            for f in spec["facets"]:
                for p in f["points"]:
                    texts.setdefault(p["text"], len(texts))
        vectors = self.backend.embed(list(texts))
        names = self._resolve_entities(specs)
        for spec in specs:
            self._add_episode(spec, vectors, texts, names)
            self.since_causal += 1
            if self.since_causal >= CAUSAL_INTERVAL:
                self.since_causal = 0
                self._induce_causal(calls)
        return None

    def _resolve_entities(self, specs: list[dict]) -> dict[str, int]:
        """Entity id for every entity key of the batch: exact name, else embedding merge."""
        kinds: dict[str, tuple[str, str]] = {}  # new key -> (display name, kind)
        for spec in specs:
            for f in spec["facets"]:
                for p in f["points"]:
                    for name, kind in p["entities"]:
                        key = entity_key(name)
                        if key and key not in self.entity_ids:
                            kinds.setdefault(key, (name, kind))
        if kinds:
            keys = list(kinds)
            vecs = self.backend.embed([kinds[k][0] for k in keys])
            old = self.layers["entity"].matrix()
            best = np.full(len(keys), -1.0)
            match = np.full(len(keys), -1)
            if len(old):
                sims = vecs @ old.T
                match = sims.argmax(axis=1)
                best = sims[np.arange(len(keys)), match]
            twins = (vecs @ vecs.T) >= ENTITY_MERGE_SIM  # merges among the batch's new names
            created: list[int] = []  # rows of `keys` that became new entities
            is_new = np.zeros(len(keys), dtype=bool)
            for i, key in enumerate(keys):
                if best[i] >= ENTITY_MERGE_SIM:
                    self.entity_ids[key] = int(match[i])
                    continue
                twin = np.flatnonzero(twins[i, :i] & is_new[:i])
                if len(twin):
                    self.entity_ids[key] = self.entity_ids[keys[int(twin[0])]]
                    continue
                is_new[i] = True
                self.entity_ids[key] = len(self.entities)
                self.entities.append(Entity(*kinds[key]))
                created.append(i)
            self.layers["entity"].add(vecs[created])
        return self.entity_ids

    def _add_episode(self, spec: dict, vectors: np.ndarray, rows: dict, names: dict) -> None:
        ep_id = len(self.episodes)
        day = spec["day"]
        ordinal = day_ordinal(day)
        key = (ordinal if ordinal is not None else -1, ep_id)
        episode = Episode(key, day, spec["session"], spec["summary"], spec["lines"])
        self.episodes.append(episode)
        bisect.insort(self.chain, (key, ep_id))
        kept: list[int] = []  # facet ids of this episode, for the within-episode merge
        theme_vecs = []
        for f in spec["facets"]:
            vec = vectors[rows[f["theme"]]]
            sims = [float(vec @ v) for v in theme_vecs]
            if sims and max(sims) >= FACET_MERGE_SIM:
                facet_id = kept[int(np.argmax(sims))]
            else:
                facet_id = len(self.facets)
                self.facets.append(Facet(ep_id, f["theme"], f["line"]))
                self.layers["facet"].add(vec[None, :])
                episode.facets.append(facet_id)
                kept.append(facet_id)
                theme_vecs.append(vec)
            for p in f["points"]:
                self._add_point(p, facet_id, ep_id, vectors[rows[p["text"]]], names)
        if spec["summary"]:
            ep_vec = vectors[rows[spec["summary"]]]
        else:
            mean = np.mean(theme_vecs, axis=0)
            ep_vec = mean / max(float(np.linalg.norm(mean)), 1e-9)
        self.layers["episode"].add(ep_vec[None, :])
        self._link_evolution(ep_id, key)

    def _add_point(self, p: dict, facet_id: int, ep_id: int, vec: np.ndarray, names: dict):
        point_id = len(self.points)
        keys = [entity_key(name) for name, _ in p["entities"]]
        ids = list(dict.fromkeys(names[k] for k in keys if k in names))
        point = FacetPoint(facet_id, ep_id, p["line"], day_ordinal(p["time"]), ids)
        self.points.append(point)
        self.facets[facet_id].points.append(point_id)
        self.layers["point"].add(vec[None, :])
        if ids:
            self.entities[ids[0]].points.append(point_id)
        for entity_id in ids:
            mentions = self.entities[entity_id].facets
            if not mentions or mentions[-1] != facet_id:
                mentions.append(facet_id)
        if point.time is not None:
            bisect.insort(self.timed, (point.time, point_id))

    def _link_evolution(self, ep_id: int, key: tuple[int, int]) -> None:
        """Evolution edges for the facet points of a new episode, per related entity."""
        by_entity: dict[int, list[int]] = {}
        for facet_id in self.episodes[ep_id].facets:
            for point_id in self.facets[facet_id].points:
                point = self.points[point_id]
                if point.entities:
                    by_entity.setdefault(point.entities[0], []).append(point_id)
        for entity_id, point_ids in by_entity.items():
            entity = self.entities[entity_id]
            point_ids.sort(key=lambda i: (self.points[i].time or key[0], i))
            previous = entity.last_point
            for point_id in point_ids:
                if previous >= 0:
                    self.evolution.setdefault(previous, []).append(point_id)
                    self.evolution.setdefault(point_id, []).append(previous)
                previous = point_id
            if key >= entity.last_key:
                entity.last_point, entity.last_key = point_ids[-1], key

    def _induce_causal(self, calls: Calls) -> None:
        window = list(range(max(0, len(self.episodes) - CAUSAL_WINDOW), len(self.episodes)))
        if len(window) < 2:
            return
        events = "\n".join(f"E{i}: {self._brief(i, RERANK_SUMMARY_CHARS)}" for i in window)
        reply = self._ask(causal_prompt(events), 400, calls)
        data = parse_json(reply or "", "{")
        pairs = data.get("causal_pairs") if isinstance(data, dict) else None
        for pair in pairs if isinstance(pairs, list) else []:
            if not isinstance(pair, dict):
                continue
            cause, effect = episode_ref(pair.get("cause_id")), episode_ref(pair.get("effect_id"))
            confidence = pair.get("confidence")
            if (
                cause in window
                and effect in window
                and cause != effect
                and isinstance(confidence, int | float)
                and confidence >= CAUSAL_MIN_CONFIDENCE
                and effect not in self.causal.get(cause, [])
            ):
                self.causal.setdefault(cause, []).append(effect)
                self.causal.setdefault(effect, []).append(cause)

    # -- retrieval -----------------------------------------------------------------------

    def retrieve(self, query):
        if not self.episodes:
            return ""
        calls = Calls(self.backend.max_complete_calls)
        qvec = self.backend.embed([query.text])[0]
        intents = self._route(query.text, qvec, calls)
        sims = {name: layer.matrix() @ qvec for name, layer in self.layers.items()}
        bundle = self._bundle(sims, edge_costs(intents))
        chosen = self._rerank(query.text, bundle, calls)
        return self._pack(chosen, sims)[:OUT_CHAR_BUDGET]

    def _route(self, text: str, qvec: np.ndarray, calls: Calls) -> set[str]:
        """N4: keyword triggers, then prototype similarity, then the LLM's intent scores."""
        lowered = " " + re.sub(r"[^a-z0-9']+", " ", text.lower()) + " "
        hits = {i for i, words in TRIGGERS.items() if any(f" {w} " in lowered for w in words)}
        if hits:
            return hits
        prototypes = self.prototypes
        if prototypes is None:  # a memory that indexed nothing
            prototypes = self.backend.embed([p for i in INTENTS for p in PROTOTYPES[i]])
        sims = prototypes @ qvec
        best, start = [], 0
        for intent in INTENTS:
            best.append(float(sims[start : start + len(PROTOTYPES[intent])].max()))
            start += len(PROTOTYPES[intent])
        order = sorted(range(len(INTENTS)), key=lambda i: -best[i])
        if best[order[0]] > PROTO_THRESHOLD and best[order[0]] - best[order[1]] > PROTO_MARGIN:
            return {INTENTS[order[0]]}
        data = parse_json(self._ask(intent_prompt(text), 60, calls) or "", "{")
        if not isinstance(data, dict):
            return set()
        chosen = {
            i
            for i in INTENTS
            if isinstance(data.get(i), int | float) and data[i] >= INTENT_SCORE_MIN
        }
        if "multi_hop" in chosen:
            chosen.discard("entity_centric")
        return chosen

    def _bundle(self, sims: dict[str, np.ndarray], costs: dict[str, float]) -> list[int]:
        """N1: every episode's cheapest path from a query anchor; the BUNDLE_K cheapest."""
        cost: dict[int, float] = {}

        def reach(ep: int, value: float) -> None:
            if value < cost.get(ep, np.inf):
                cost[ep] = value

        link = costs["belongs_to"] + HOP_COST  # one belongs_to or involves_entity edge
        episode_anchors = anchors(sims["episode"])
        for ep, d in episode_anchors:
            reach(ep, d + DIRECT_EPISODE_PENALTY)  # Ep
        for facet_id, d in anchors(sims["facet"]):
            reach(self.facets[facet_id].episode, d + link)  # Fc -> Ep
        point_anchors = anchors(sims["point"])
        for point_id, d in point_anchors:
            reach(self.points[point_id].episode, d + 2 * link)  # FP -> Fc -> Ep
        for entity_id, d in anchors(sims["entity"]):
            entity = self.entities[entity_id]
            for point_id in entity.points:
                reach(self.points[point_id].episode, d + 3 * link)  # En -> FP -> Fc -> Ep
            for facet_id in entity.facets:
                reach(self.facets[facet_id].episode, d + 2 * link)  # En -> Fc -> Ep
        if RELATION_PATHS:
            self._bridges(reach, point_anchors, episode_anchors, costs, link)
        best_point = np.full(len(self.episodes), -1.0)
        np.maximum.at(best_point, [p.episode for p in self.points], sims["point"])
        ranked = sorted(cost, key=lambda ep: (cost[ep], -best_point[ep]))
        return ranked[:BUNDLE_K]

    def _bridges(self, reach, point_anchors, episode_anchors, costs, link) -> None:
        """The three relation-bridge templates: anchor -> temporal/causal/evolution -> v -> Ep."""
        temporal, evolution = costs["temporal"] + HOP_COST, costs["evolution"] + HOP_COST
        for point_id, d in point_anchors:
            point = self.points[point_id]
            if point.time is not None:  # the nearest facet points strictly before and after
                before = bisect.bisect_left(self.timed, (point.time, -1)) - 1
                after = bisect.bisect_left(self.timed, (point.time + 1, -1))
                for j in (before, after):
                    if 0 <= j < len(self.timed):
                        other = self.timed[j][1]
                        reach(self.points[other].episode, d + temporal + 2 * link)
            for other in self.evolution.get(point_id, []):
                reach(self.points[other].episode, d + evolution + 2 * link)
        for ep, d in episode_anchors:
            at = bisect.bisect_left(self.chain, (self.episodes[ep].key, ep))
            for j in (at - 1, at + 1):
                if 0 <= j < len(self.chain):
                    reach(self.chain[j][1], d + temporal)
            for other in self.causal.get(ep, []):
                reach(other, d + costs["causal"] + HOP_COST)

    def _rerank(self, question: str, bundle: list[int], calls: Calls) -> list[int]:
        """N3: the LLM rates each episode 0-10; the RERANK_M best are kept, in rated order."""
        if not RERANK or len(bundle) <= RERANK_M:
            return bundle
        snippets = "\n".join(
            f"[{i}] {self._brief(ep, RERANK_SUMMARY_CHARS)}" for i, ep in enumerate(bundle)
        )
        data = parse_json(self._ask(rerank_prompt(question, snippets), 300, calls) or "", "[")
        if not isinstance(data, list):
            return bundle
        rated: dict[int, float] = {}
        for item in data:
            if isinstance(item, dict):
                index, value = item.get("index"), item.get("score")
                if isinstance(index, int) and 0 <= index < len(bundle):
                    if isinstance(value, int | float):
                        rated[index] = float(value)
        if not rated:
            return bundle
        order = sorted(range(len(bundle)), key=lambda i: -rated.get(i, -1.0))
        return [bundle[i] for i in order[:RERANK_M]]

    def _pack(self, chosen: list[int], sims: dict[str, np.ndarray]) -> str:
        """Lines of the chosen episodes, best-first round-robin, shown per episode in order."""
        queues, headers, picked = {}, {}, {}
        for rank, ep in enumerate(chosen):
            episode = self.episodes[ep]
            relevance = np.full(len(episode.lines), -1.0)
            if episode.summary:
                relevance[0] = sims["episode"][ep]
            for facet_id in episode.facets:
                facet = self.facets[facet_id]
                if facet.line >= 0:
                    relevance[facet.line] = max(relevance[facet.line], sims["facet"][facet_id])
                for point_id in facet.points:
                    line = self.points[point_id].line
                    relevance[line] = max(relevance[line], sims["point"][point_id])
            queues[ep] = [int(i) for i in np.argsort(-relevance, kind="stable")]
            when = f"{episode.day}, " if episode.day else ""
            headers[ep] = f"## Episode {rank + 1} ({when}session {episode.session})"
            picked[ep] = []
        used, progress = 0, True
        while progress:
            progress = False
            for ep in chosen:
                queue = queues[ep]
                while queue:
                    line = queue.pop(0)
                    cost = len(cut(self.episodes[ep].lines[line], LINE_CHARS)) + 2
                    cost += 0 if picked[ep] else len(headers[ep]) + 1
                    if used + cost <= OUT_CHAR_BUDGET:
                        picked[ep].append(line)
                        used += cost
                        progress = True
                        break
        blocks = []
        for ep in chosen:
            if picked[ep]:
                lines = [cut(self.episodes[ep].lines[i], LINE_CHARS) for i in sorted(picked[ep])]
                blocks.append(headers[ep] + "\n" + "\n\n".join(lines))
        return "\n\n".join(blocks)

    # -- helpers -------------------------------------------------------------------------

    def _brief(self, ep: int, size: int) -> str:
        episode = self.episodes[ep]
        text = episode.summary or " ".join(episode.lines)
        return f"({episode.day}) {text[:size]}" if episode.day else text[:size]

    def _ask(self, prompt: str, max_tokens: int, calls: Calls) -> str | None:
        """One call counted in ``calls``, or None when they are spent or no LLM answers."""
        if calls.left <= 0:
            return None
        calls.left -= 1
        try:
            return self.backend.complete(prompt, max_tokens)
        except RuntimeError:  # BackendError: no task LLM, or its budget is spent
            calls.left = 0
            return None


# -- extraction side: units -> episode specs -----------------------------------------------


def episode_specs(units: list[MemoryUnit], segment) -> list[dict]:
    """One spec per Episode: structured units stand alone, plain ones are grouped."""
    specs, pending = [], []
    for unit in units:
        structured = structured_episode(unit, segment) if unit.facet_points else None
        if structured:
            if pending:
                specs.append(plain_episode(pending, segment))
                pending = []
            specs.append(structured)
        elif unit.summary.strip():
            pending.append(unit)
            if len(pending) >= EPISODE_UNITS:
                specs.append(plain_episode(pending, segment))
                pending = []
    if pending:
        specs.append(plain_episode(pending, segment))
    return specs


def plain_episode(units: list[MemoryUnit], segment) -> dict:
    """Offline units (one message each): a facet per message, facet points cut from it."""
    facets = []
    for line, unit in enumerate(units):
        points = [
            {"text": piece, "line": line, "time": first_date(piece),
             "entities": derive_entities(piece)}
            for piece in pieces(unit.summary, FACT_CHARS)
        ]  # fmt: skip
        facets.append({"theme": unit.summary, "line": line, "points": points})
    return {
        "day": segment.date or units[0].date or "",
        "session": segment.session_id,
        "summary": "",
        "lines": [unit.summary for unit in units],
        "facets": facets,
    }


def structured_episode(unit: MemoryUnit, segment) -> dict | None:
    """An LLM unit in PRISM's schema: summary, entities, facet points, facets, times; None
    when it has no usable facet point."""
    named = [fields(item, 2) for item in unit.entities]
    named = [(name, kind or "other") for name, kind in named if name]
    times = [fields(item, 4) for item in unit.temporal_info]
    points = []
    for item in unit.facet_points:
        text, related, when = fields(item, 3)
        if not text:
            continue
        lowered = text.lower()
        mentioned = [(n, k) for n, k in named if n.lower() in lowered and n != related]
        found = ([(related, "other")] if related else []) + mentioned
        found = found or derive_entities(text)
        time = when if day_ordinal(when) is not None else first_date(when or text)
        for subject, _, normal, _ in times:
            if time is None and subject and subject.lower() in lowered:
                time = normal if day_ordinal(normal) is not None else None
        points.append({"text": text, "line": len(points) + 1, "time": time,
                       "entities": found[:MAX_ENTITIES_PER_POINT]})  # fmt: skip
    if not points:
        return None
    claimed: set[int] = set()
    facets = []
    for item in unit.facets:
        theme, indices = fields(item, 2)
        members = [int(i) for i in re.findall(r"\d+", indices) if int(i) < len(points)]
        members = [i for i in dict.fromkeys(members) if i not in claimed]
        if theme and members:
            claimed.update(members)
            facets.append({"theme": theme, "line": -1, "points": [points[i] for i in members]})
    orphans = [p for i, p in enumerate(points) if i not in claimed]
    if orphans:
        facets.append({"theme": unit.summary or orphans[0]["text"], "line": -1, "points": orphans})
    return {
        "day": segment.date or unit.date or "",
        "session": segment.session_id,
        "summary": unit.summary or points[0]["text"],
        "lines": [unit.summary or points[0]["text"], *[p["text"] for p in points]],
        "facets": facets,
    }


def fields(item: str, n: int) -> list[str]:
    """A "a | b | c" list item as exactly n stripped parts ("null"/"none" become "")."""
    parts = [p.strip() for p in item.split("|")]
    parts = [("" if p.lower() in ("null", "none") else p) for p in parts]
    return (parts + [""] * n)[:n]


def pieces(text: str, size: int) -> list[str]:
    """Consecutive pieces of about ``size`` characters, cut after sentences when possible."""
    out, current = [], ""
    for sentence in SENTENCE_END.split(text):
        sentence = sentence.strip()
        while len(sentence) > size:  # a sentence longer than a piece: cut at a space
            cut_at = sentence.rfind(" ", size // 2, size)
            cut_at = cut_at if cut_at > 0 else size
            if current:
                out.append(current)
                current = ""
            out.append(sentence[:cut_at])
            sentence = sentence[cut_at:].strip()
        if not sentence:
            continue
        if current and len(current) + 1 + len(sentence) > size:
            out.append(current)
            current = sentence
        else:
            current = f"{current} {sentence}" if current else sentence
    if current:
        out.append(current)
    return out


def derive_entities(text: str) -> list[tuple[str, str]]:
    """Entities found by pattern: capitalised names (not a lone sentence-initial word),
    dates, money and percentages, then content words repeated in the text."""
    found: list[tuple[str, str]] = []
    for match in NAME.finditer(text):
        name = match.group(0)
        before = text[max(0, match.start() - 3) : match.start()].rstrip()
        starts = not before or before[-1] in ".!?:;\n#*->\"'(["
        lowered = name.lower()
        if (" " in name or "-" in name or not starts) and lowered not in NOT_NAMES:
            found.append((name, "name"))
    found += [(iso, "date") for iso in all_dates(text)]
    found += [(m.group(0).replace(" ", ""), "amount") for m in AMOUNT.finditer(text)]
    words = [w for w in WORD.findall(text.lower()) if len(w) > 3 and w not in STOPWORDS]
    counts = Counter(words)
    found += [(w, "keyword") for w, n in counts.most_common() if n > 1]
    unique = {entity_key(name): (name, kind) for name, kind in reversed(found)}
    ordered = list(dict.fromkeys(entity_key(name) for name, _ in found))
    return [unique[k] for k in ordered if k][:MAX_ENTITIES_PER_POINT]


def entity_key(name: str) -> str:
    return " ".join(re.sub(r"[^\w$€£%.\- ]+", " ", name.lower()).split()).strip(".-")


def all_dates(text: str) -> list[str]:
    """Explicit calendar dates in the text, as ISO strings."""
    found = [(int(y), int(m), int(d)) for y, m, d in ISO_DATE.findall(text)]
    found += [(int(y), MONTHS[m.lower()], int(d)) for m, d, y in MONTH_DAY_YEAR.findall(text)]
    found += [(int(y), MONTHS[m.lower()], int(d)) for d, m, y in DAY_MONTH_YEAR.findall(text)]
    out = []
    for y, m, d in found:
        if 1 <= m <= 12 and 1 <= d <= 31 and 1000 < y < 3000:
            try:
                out.append(date(y, m, d).isoformat())
            except ValueError:
                continue
    return list(dict.fromkeys(out))


def first_date(text: str | None) -> str | None:
    dates = all_dates(text or "")
    return dates[0] if dates else None


def day_ordinal(text: str | None) -> int | None:
    """The day number of an ISO date (YYYY-MM-DD, or its first 10 characters), else None."""
    try:
        return date.fromisoformat((text or "")[:10]).toordinal()
    except ValueError:
        return None


# -- retrieval helpers ----------------------------------------------------------------------


def anchors(sims: np.ndarray) -> list[tuple[int, float]]:
    """The ANCHOR_K nodes nearest to the query, with their cosine distance."""
    k = min(ANCHOR_K, len(sims))
    if k == 0:
        return []
    top = np.argpartition(-sims, k - 1)[:k]
    return [(int(i), 1.0 - float(sims[i])) for i in top]


def edge_costs(intents: set[str]) -> dict[str, float]:
    """N2: the cost of crossing each edge type for a query with these intents."""
    costs = {
        "belongs_to": BELONGS_TO_COST,
        "temporal": EDGE_BASE_COST,
        "causal": EDGE_BASE_COST,
        "evolution": EDGE_BASE_COST,
    }
    if not QUERY_SENSITIVE_COST:
        return costs
    if "temporal" in intents:
        costs["temporal"] *= TEMPORAL_DISCOUNT
        costs["evolution"] *= EVOLUTION_DISCOUNT
    if "causal" in intents:
        costs["causal"] *= CAUSAL_DISCOUNT
    if "multi_hop" in intents:
        costs["evolution"] *= MULTI_HOP_DISCOUNT
        costs["causal"] *= MULTI_HOP_DISCOUNT
    return costs


def cut(text: str, size: int) -> str:
    if len(text) <= size:
        return text
    at = text.rfind(" ", size // 2, size - 2)
    return text[: at if at > 0 else size - 2] + " …"


def episode_ref(value) -> int | None:
    """An episode id from the LLM's "E12" (or 12)."""
    match = re.fullmatch(r"\s*E?(\d+)\s*", str(value))
    return int(match.group(1)) if match else None


def parse_json(text: str, opener: str):
    """The first JSON object ("{") or array ("[") in an LLM reply, or None."""
    start = text.find(opener)
    end = text.rfind("}" if opener == "{" else "]")
    if start < 0 or end <= start:
        return None
    try:
        return json.loads(text[start : end + 1])
    except ValueError:
        return None


def intent_prompt(query: str) -> str:
    return (
        "You classify the intent of a question put to a memory system. Rate each of four "
        "intents from 0.0 to 1.0 independently; several may be high at once.\n"
        "- temporal: asks when something happened, how long it took, or the order of events.\n"
        "- causal: asks why something happened, its reasons, motives or consequences.\n"
        "- multi_hop: needs facts from several separate events or sessions combined, a trend "
        "over time, or an inference or prediction rather than one stored fact.\n"
        "- entity_centric: asks for one stored attribute of a named person, place or thing.\n"
        "Vague follow-ups (go on, tell me more) get 0.0 everywhere. Prefer the values 0.0, "
        "0.3, 0.6 and 0.9.\n"
        f"Question: {query}\n"
        'Reply with JSON only: {"temporal": x, "causal": x, "multi_hop": x, '
        '"entity_centric": x}'
    )


def rerank_prompt(question: str, snippets: str) -> str:
    return (
        "Rate from 0 to 10 how useful each memory snippet is for answering the question.\n"
        f"Question: {question}\nSnippets:\n{snippets}\n"
        'Reply with a JSON array only, one object per snippet: [{"index": 0, "score": 7}, ...]'
    )


def causal_prompt(events: str) -> str:
    return (
        "Here are consecutive episodes of a conversation, each with an id. Find the pairs "
        "where one episode plausibly caused or led to another, judging only from what the "
        "episodes say.\n"
        f"Episodes:\n{events}\n"
        'Reply with JSON only: {"causal_pairs": [{"cause_id": "E1", "effect_id": "E2", '
        '"description": "short reason", "confidence": 0.0-1.0}]}; use an empty list when no '
        "causal link is well supported."
    )
