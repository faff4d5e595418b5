"""Search-QA: multi-hop questions over a seeded knowledge base of fictional entities, answered with a BM25 search tool.

No offline corpus pairs questions with retrievable evidence (see `envs/searchqa/README.md`), so the environment
builds its own: a seeded knowledge base of fictional people, cities, countries, organisations and books, linked by
functional relations (born in, works for, founded by, headquartered in, mayor of, capital of, written by, ...), one
short document per entity stating its facts, and questions composed along the relation graph ("In which city was
the founder of Quillmark Industries born?"). Each hop needs the document of the entity reached so far, so the agent
has to search, read the passage, and search again with what it learned (Search-R1's setting, on fictional facts
that no model has memorised).

Actions: `search[query]` returns the top-k passages of a real BM25 index (`bm25s`); `answer[text]` ends the episode.
Reward: exact match after SQuAD normalisation (lowercase, no punctuation or articles), or token F1.

Example:
    >>> from trl_agents.envs import make_env
    >>> env = make_env("searchqa", num_entities=300)
    >>> print(env.reset({"seed": 0, "hops": 2}))
    No documents retrieved yet.
    >>> env.task_description()
    'Question: Who is the mayor of the birthplace of Meshar Vohais?'
    >>> plan = env.expert_plan(); plan
    ['search[Meshar Vohais born]', 'search[Kibelburg mayor]', 'answer[Geadrurd Quoutaird]']
    >>> print(env.step(plan[0])[0])  # doctest: +ELLIPSIS
    Last search returned: D0255, D0002, D0003 (3 new)
    Retrieved documents:
    [D0255] Meshar Vohais is a painter born in Kibelburg in 1973. Meshar Vohais works for Wuguthgate Press.
    [D0002] ...
    >>> env.step(plan[1])[1:3], env.step(plan[2])[1:3]
    ((0.0, False), (1.0, True))
"""

from __future__ import annotations

import numbers
import random
import re
import string
from collections import Counter
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any, ClassVar

from .base import INFO_SUCCESS, INFO_VALID, AgentEnv, VerifierAtom
from .bm25 import BM25Index, require_bm25s
from .parsing import extract_answer
from .registry import register_env
from .validation import check_int

_ACTION = re.compile(r"\b(search|answer)\s*\[([^\[\]]*)\]", re.IGNORECASE)

INSTRUCTIONS = (
    "You answer a question about fictional people, places, organisations and books by searching a document "
    "collection. Each turn, reply with exactly one action:\n"
    "- search[query] returns the most relevant documents for your query;\n"
    "- answer[text] gives your final answer and ends the episode.\n"
    "The facts are fictional, so look them up: a question may need several searches, each using what the previous "
    "documents told you. Answer with the name or year only."
)


# ---- answers ---------------------------------------------------------------------------------------------------------


def normalize_answer(text: str) -> str:
    """SQuAD's normalisation: lowercase, drop punctuation and the articles a/an/the, collapse whitespace.

    Example:
        >>> normalize_answer("  The Lantern of  Veshmar!")
        'lantern of veshmar'
    """
    text = "".join(ch for ch in text.lower() if ch not in string.punctuation)
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def exact_match(prediction: str, gold: str) -> bool:
    return normalize_answer(prediction) == normalize_answer(gold)


def token_f1(prediction: str, gold: str) -> float:
    """Token-level F1 between normalised answers (SQuAD's F1).

    Example:
        >>> token_f1("Port Zandria city", "port zandria")  # precision 2/3, recall 1
        0.8
    """
    predicted, expected = normalize_answer(prediction).split(), normalize_answer(gold).split()
    common = sum((Counter(predicted) & Counter(expected)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(predicted), common / len(expected)
    return 2 * precision * recall / (precision + recall)


def parse_action(text: str) -> tuple[str, str] | None:
    """Parse `search[query]` or `answer[text]` from a model's raw output (the answer region of `extract_answer`,
    which must hold exactly one action). Returns `(name, argument)` with the argument stripped, or None.

    Example:
        >>> parse_action("<think>first hop</think> Search[ founder of Quillmark ]")
        ('search', 'founder of Quillmark')
        >>> parse_action("answer Port Zandria") is None
        True
    """
    if not isinstance(text, str):
        return None
    found = _ACTION.findall(extract_answer(text))
    if len(found) != 1:
        return None
    name, argument = found[0]
    return name.lower(), " ".join(argument.split())


# ---- the knowledge base ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Relation:
    """A functional relation of the knowledge base (each entity of `domain` has exactly one value).

    Args:
        name: Identifier, e.g. `"born_in"`.
        domain: Entity type it starts from.
        range: Entity type it leads to, or `"year"` for a literal.
        question: The question asking for the value of `{x}`.
        phrase: A noun phrase for the value of `{x}` (used to nest hops); None for literals, which end a chain.
        fact: The fact as a sentence, `{x}` and `{y}` filled in (for the privileged reasoning chain).
        keyword: Words the expert adds to the entity's name when searching for this hop.
    """

    name: str
    domain: str
    range: str
    question: str
    phrase: str | None
    fact: str
    keyword: str


# fmt: off
RELATIONS: tuple[Relation, ...] = (
    Relation("born_in", "person", "city", "In which city was {x} born?", "the birthplace of {x}",
             "{x} was born in {y}.", "born"),
    Relation("employer", "person", "organisation", "Which organisation does {x} work for?", "the employer of {x}",
             "{x} works for {y}.", "works for"),
    Relation("birth_year", "person", "year", "In which year was {x} born?", None, "{x} was born in {y}.", "born"),
    Relation("founder", "organisation", "person", "Who founded {x}?", "the founder of {x}",
             "{x} was founded by {y}.", "founded by"),
    Relation("headquarters", "organisation", "city", "In which city is {x} headquartered?",
             "the city where {x} is headquartered", "{x} is headquartered in {y}.", "headquartered"),
    Relation("founded_year", "organisation", "year", "In which year was {x} founded?", None,
             "{x} was founded in {y}.", "founded"),
    Relation("country", "city", "country", "In which country is {x}?", "the country where {x} lies",
             "{x} is a city in {y}.", "city in"),
    Relation("mayor", "city", "person", "Who is the mayor of {x}?", "the mayor of {x}",
             "The mayor of {x} is {y}.", "mayor"),
    Relation("capital", "country", "city", "What is the capital of {x}?", "the capital of {x}",
             "The capital of {x} is {y}.", "capital"),
    Relation("author", "book", "person", "Who wrote {x}?", "the author of {x}", "{x} was written by {y}.",
             "written by"),
    Relation("publisher", "book", "organisation", "Which company published {x}?", "the publisher of {x}",
             "{x} was published by {y}.", "published by"),
    Relation("publication_year", "book", "year", "In which year was {x} published?", None,
             "{x} was published in {y}.", "published"),
)
# fmt: on
_RELATIONS_BY_NAME = {r.name: r for r in RELATIONS}

# Share of each entity type in the knowledge base (countries and cities are few, so most questions reach them).
_TYPE_SHARES = (("country", 0.02), ("city", 0.13), ("organisation", 0.15), ("book", 0.15), ("person", 0.55))

# fmt: off
_ONSETS = ("b", "br", "c", "d", "dr", "f", "g", "gr", "h", "k", "l", "m", "n", "p", "qu", "r", "s", "sh", "t",
           "th", "v", "w", "z")
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ea", "ou")
_CODAS = ("", "", "n", "r", "l", "s", "m", "th", "rd", "nd")
_CITY_SUFFIXES = ("ford", "haven", "burg", "mouth", "ton", "vale", "stead", "wick", "more", "beck")
_COUNTRY_SUFFIXES = ("ia", "land", "ora", "stan", "mark", "enne")
# Organisation name endings and the sector their documents state.
_ORG_KINDS = {"Industries": "manufacturing", "Labs": "research", "Group": "holding", "Systems": "software",
              "Foods": "food", "Motors": "automotive", "Press": "publishing", "Bank": "banking", "Studios": "film",
              "Works": "engineering"}
_BOOK_NOUNS = ("Lantern", "Orchard", "River", "Crown", "Mirror", "Garden", "Voyage", "Letters", "Silence", "Harbor",
               "Winter", "Tower", "Compass", "Ashes", "Feather", "Bridge", "Storm", "Weaver")
_BOOK_GENRES = ("novel", "poetry collection", "memoir", "play", "short story collection", "travel book")
_OCCUPATIONS = ("painter", "engineer", "physician", "architect", "historian", "composer", "sculptor", "economist",
                "chemist", "journalist", "pilot", "botanist")

# fmt: on


def _word(rng: random.Random, syllables: int) -> str:
    return "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(syllables)) + rng.choice(_CODAS)


def _entity_name(rng: random.Random, kind: str) -> str:
    if kind == "person":
        return f"{_word(rng, 2).capitalize()} {_word(rng, rng.randint(2, 3)).capitalize()}"
    if kind == "city":
        root = _word(rng, rng.randint(1, 2))
        return rng.choice((f"Port {root.capitalize()}", f"{root}{rng.choice(_CITY_SUFFIXES)}".capitalize()))
    if kind == "country":
        return f"{_word(rng, 2)}{rng.choice(_COUNTRY_SUFFIXES)}".capitalize()
    if kind == "organisation":
        return (
            f"{_word(rng, 2).capitalize()}{rng.choice(('', 'field', 'mark', 'gate'))} {rng.choice(sorted(_ORG_KINDS))}"
        )
    return f"The {rng.choice(_BOOK_NOUNS)} of {_word(rng, 2).capitalize()}"


@dataclass(frozen=True)
class Entity:
    """One entity: its type, name, facts (relation name -> entity index or year) and document text."""

    kind: str
    name: str
    facts: tuple[tuple[str, int], ...]
    text: str


@dataclass(frozen=True)
class Question:
    """A multi-hop question with its gold chain.

    Args:
        text: The question.
        answer: The gold answer (an entity name or a year).
        chain: Entity indices visited, from the question's entity to the answer's (the last is -1 for a year).
        relations: Relation names of the hops.
        supporting_docs: Document index per hop (the document of the entity each hop starts from).
        queries: The expert's search query per hop.
    """

    text: str
    answer: str
    chain: tuple[int, ...]
    relations: tuple[str, ...]
    supporting_docs: tuple[int, ...]
    queries: tuple[str, ...]

    @property
    def hops(self) -> int:
        return len(self.relations)


@dataclass
class KnowledgeBase:
    """The entities, their documents, a BM25 index over them, and seeded questions.

    Build it with `get_knowledge_base(kb_seed, num_entities)` (cached per process).
    """

    kb_seed: int
    entities: list[Entity]
    index: BM25Index
    _questions: dict[tuple[int, int], Question] = field(default_factory=dict, repr=False)

    def doc_id(self, index: int) -> str:
        return f"D{index:0{max(4, len(str(len(self.entities) - 1)))}d}"

    def passage(self, index: int) -> str:
        return f"[{self.doc_id(index)}] {self.entities[index].text}"

    def search(self, query: str, k: int) -> list[int]:
        return self.index.search(query, k)

    def value(self, entity: int, relation: str) -> int:
        return dict(self.entities[entity].facts)[relation]

    def value_text(self, entity: int, relation: str) -> str:
        value = self.value(entity, relation)
        return str(value) if _RELATIONS_BY_NAME[relation].range == "year" else self.entities[value].name

    def question(self, seed: int, hops: int) -> Question:
        """The question of task (`seed`, `hops`); deterministic."""
        key = (seed, hops)
        if key not in self._questions:
            self._questions[key] = _make_question(self, seed, hops)
        return self._questions[key]


def _build_entities(kb_seed: int, num_entities: int) -> list[Entity]:
    rng = random.Random(f"searchqa/kb/{kb_seed}/{num_entities}")
    counts = {kind: max(2, int(num_entities * share)) for kind, share in _TYPE_SHARES}
    counts["person"] = max(2, num_entities - sum(c for k, c in counts.items() if k != "person"))
    kinds = [kind for kind, _ in _TYPE_SHARES for _ in range(counts[kind])]
    rng.shuffle(kinds)  # interleave types so document ids say nothing about the type
    names: list[str] = []
    used: set[str] = set()
    for kind in kinds:
        name = _entity_name(rng, kind)
        while name.lower() in used:
            name = _entity_name(rng, kind)
        used.add(name.lower())
        names.append(name)
    by_kind: dict[str, list[int]] = {kind: [] for kind, _ in _TYPE_SHARES}
    for i, kind in enumerate(kinds):
        by_kind[kind].append(i)
    facts: list[dict[str, int]] = [{} for _ in kinds]
    countries, cities = by_kind["country"], by_kind["city"]
    for position, city in enumerate(cities):  # every country gets at least one city
        facts[city]["country"] = countries[position] if position < len(countries) else rng.choice(countries)
        facts[city]["mayor"] = rng.choice(by_kind["person"])
    for country in countries:
        facts[country]["capital"] = rng.choice([c for c in cities if facts[c]["country"] == country])
    for person in by_kind["person"]:
        facts[person].update(
            born_in=rng.choice(cities), employer=rng.choice(by_kind["organisation"]), birth_year=rng.randint(1920, 2000)
        )
    for organisation in by_kind["organisation"]:
        facts[organisation].update(
            founder=rng.choice(by_kind["person"]), headquarters=rng.choice(cities), founded_year=rng.randint(1850, 2015)
        )
    for book in by_kind["book"]:
        facts[book].update(
            author=rng.choice(by_kind["person"]),
            publisher=rng.choice(by_kind["organisation"]),
            publication_year=rng.randint(1900, 2023),
        )
    entities = []
    for i, kind in enumerate(kinds):
        f, name = facts[i], names[i]
        if kind == "person":
            occupation = rng.choice(_OCCUPATIONS)
            text = (
                f"{name} is {'an' if occupation[0] in 'aeiou' else 'a'} {occupation} born in {names[f['born_in']]} in {f['birth_year']}. "
                f"{name} works for {names[f['employer']]}."
            )
        elif kind == "organisation":
            text = (
                f"{name} is a {_ORG_KINDS[name.split()[-1]]} company founded by {names[f['founder']]} in "
                f"{f['founded_year']}. {name} is headquartered in {names[f['headquarters']]}."
            )
        elif kind == "city":
            text = f"{name} is a city in {names[f['country']]}. The mayor of {name} is {names[f['mayor']]}."
        elif kind == "country":
            text = f"{name} is a country. The capital of {name} is {names[f['capital']]}."
        else:
            text = (
                f"{name} is a {rng.choice(_BOOK_GENRES)} written by {names[f['author']]}. It was published by "
                f"{names[f['publisher']]} in {f['publication_year']}."
            )
        entities.append(Entity(kind, name, tuple(sorted(f.items())), text))
    return entities


_MAX_QUESTION_ATTEMPTS = 1000


def _make_question(kb: KnowledgeBase, seed: int, hops: int) -> Question:
    """Walk `hops` relations from a random entity (no entity twice; a year only as the last hop), and keep the walk
    only if the expert's query for every hop ranks that hop's document first, so the question is answerable with any
    `top_k`."""
    entities = kb.entities
    for attempt in range(_MAX_QUESTION_ATTEMPTS):
        rng = random.Random(f"searchqa/question/{kb.kb_seed}/{len(entities)}/{seed}/{hops}/{attempt}")
        chain, relations = [rng.randrange(len(entities))], []
        for hop in range(hops):
            kind = entities[chain[-1]].kind
            choices = [r for r in RELATIONS if r.domain == kind and (r.range != "year" or hop == hops - 1)]
            relation = rng.choice(choices)
            value = kb.value(chain[-1], relation.name)
            if relation.range != "year" and value in chain:
                break
            relations.append(relation)
            chain.append(-1 if relation.range == "year" else value)
        if len(relations) != hops:
            continue
        queries = tuple(f"{entities[e].name} {r.keyword}" for e, r in zip(chain, relations))
        if any(kb.search(q, 1) != [e] for q, e in zip(queries, chain)):
            continue
        phrase = entities[chain[0]].name
        for relation in relations[:-1]:
            phrase = relation.phrase.format(x=phrase)
        text = relations[-1].question.format(x=phrase)
        return Question(
            text=text[0].upper() + text[1:],
            answer=kb.value_text(chain[-2], relations[-1].name),
            chain=tuple(chain),
            relations=tuple(r.name for r in relations),
            supporting_docs=tuple(chain[:-1]),
            queries=queries,
        )
    raise RuntimeError(f"No {hops}-hop question found for seed {seed} in {_MAX_QUESTION_ATTEMPTS} attempts")


@lru_cache(maxsize=4)
def get_knowledge_base(kb_seed: int = 0, num_entities: int = 2000) -> KnowledgeBase:
    """The knowledge base of `kb_seed` with `num_entities` entities (one document each), built once per process."""
    entities = _build_entities(kb_seed, num_entities)
    return KnowledgeBase(kb_seed, entities, BM25Index([e.text for e in entities]))


# ---- the environment -------------------------------------------------------------------------------------------------


def _check_hops(hops: Any) -> tuple[int, int]:
    pair = (hops, hops) if isinstance(hops, numbers.Integral) and not isinstance(hops, bool) else hops
    if not isinstance(pair, (tuple, list)) or len(pair) != 2:
        raise ValueError(f"`hops` must be an int or a (min, max) pair, e.g. (1, 3), got {hops!r}")
    low, high = check_int("hops (min)", pair[0], 1), check_int("hops (max)", pair[1], 1)
    if low > high or high > MAX_HOPS:
        raise ValueError(f"`hops` must satisfy 1 <= min <= max <= {MAX_HOPS}, got {hops!r}")
    return low, high


MAX_HOPS = 4


@dataclass(frozen=True)
class _QAState:
    """What changes during an episode (immutable: a snapshot is the object itself)."""

    retrieved: tuple[int, ...] = ()  # documents retrieved so far, in the order first seen
    last_results: tuple[int, ...] | None = None  # None before the first search
    last_new: int = 0  # documents the last search retrieved for the first time
    answer: str | None = None
    steps: int = 0
    log: tuple[tuple, ...] = ()  # ("search", step, query, results) and ("answer", step, text)


@register_env
class SearchQA(AgentEnv):
    """Multi-hop question answering with a BM25 search tool over a seeded knowledge base of fictional entities.

    A task row is `{"seed": s}` (hop count drawn from the env's `hops` range with the seed) or `{"seed": s, "hops":
    h}`. A row may also set `kb_seed` and `num_entities`, which then override the constructor's values.

    Args:
        num_entities: Knowledge-base size (one document per entity).
        kb_seed: Seed of the knowledge base; questions are seeded per task on top of it.
        hops: Hop count of seeded questions, an int or a `(min, max)` range (at most 4).
        top_k: Passages returned per search (Search-R1 and verl-agent use 3).
        reward: `"em"` (default, our choice): 1.0 for an exact match after normalisation, else 0.0; `"f1"`: the
            token F1 of the answer (1.0 on an exact match). Success is the exact match either way.
        observation: `"all"` (default, our choice: history-free): the observation lists every document retrieved so
            far, in the order first retrieved, after a line naming the last search's results; `"last"`: only the
            last search's passages (Search-R1's `<information>` block; earlier ones are in the prompt history).
    """

    name = "searchqa"
    requires = ("bm25s",)
    task_keys = ("seed",)
    instructions = INSTRUCTIONS

    SPLIT_SEED_START: ClassVar[dict[str, int]] = {"train": 0, "eval": 1_000_000, "unseen": 2_000_000}
    SPLIT_DEFAULT_COUNT: ClassVar[dict[str, int]] = {"train": 5000, "eval": 200, "unseen": 200}
    SPLIT_TASK_SETTINGS: ClassVar[dict[str, dict[str, Any]]] = {"unseen": {"hops": MAX_HOPS}}

    def __init__(
        self,
        num_entities: int = 2000,
        kb_seed: int = 0,
        hops: int | tuple[int, int] = (1, 3),
        top_k: int = 3,
        reward: str = "em",
        observation: str = "all",
    ):
        require_bm25s()
        self.num_entities = check_int("num_entities", num_entities, 20)
        self.kb_seed = check_int("kb_seed", kb_seed, 0)
        self.hops = _check_hops(hops)
        self.top_k = check_int("top_k", top_k, 1)
        if reward not in ("em", "f1"):
            raise ValueError(f"`reward` must be 'em' (exact match) or 'f1' (token F1), got {reward!r}")
        if observation not in ("all", "last"):
            raise ValueError(f"`observation` must be 'all' (every retrieved document) or 'last', got {observation!r}")
        self.reward = reward
        self.observation = observation
        self._kb: KnowledgeBase | None = None
        self._question: Question | None = None
        self._state = _QAState()

    # ---- episode ---------------------------------------------------------------------------------------------------

    def reset(self, task: dict[str, Any]) -> str:
        """Load the question of the task row and return the first observation (nothing retrieved yet)."""
        if task.get("seed") is None:
            raise ValueError(f"A searchqa task needs a 'seed', got keys {sorted(task)}")
        seed = check_int("seed", task["seed"], 0)
        num_entities = check_int("num_entities", task.get("num_entities", self.num_entities), 20)
        kb_seed = check_int("kb_seed", task.get("kb_seed", self.kb_seed), 0)
        if task.get("hops") is not None:
            hops = check_int("hops", task["hops"], 1)
            if hops > MAX_HOPS:
                raise ValueError(f"A task row's 'hops' must be at most {MAX_HOPS}, got {hops}")
        else:
            low, high = self.hops
            hops = random.Random(f"searchqa/hops/{seed}").randint(low, high)
        self._kb = get_knowledge_base(kb_seed, num_entities)
        self._question = self._kb.question(seed, hops)
        self._state = _QAState()
        return self.render()

    def task_description(self) -> str:
        return f"Question: {self._require_question().text}"

    def step(self, action_text: str) -> tuple[str, float, bool, dict[str, Any]]:
        question = self._require_question()
        state = self._state
        if state.answer is not None:
            raise RuntimeError("The episode is over; call reset() first")
        parsed = parse_action(action_text)
        step = state.steps
        if parsed is None or not parsed[1]:
            self._state = replace(state, steps=step + 1)
            reason = (
                "reply with exactly one action, search[query] or answer[text]."
                if parsed is None
                else f"the {parsed[0]} text is empty; write {parsed[0]}[...] with something inside the brackets."
            )
            info = {INFO_VALID: False, INFO_SUCCESS: False, "action": None}
            return f"Invalid action: {reason}\n{self.render()}", 0.0, False, info
        kind, argument = parsed
        if kind == "search":
            results = tuple(self._kb.search(argument, self.top_k))
            new = tuple(d for d in results if d not in state.retrieved)
            self._state = replace(
                state,
                retrieved=state.retrieved + new,
                last_results=results,
                last_new=len(new),
                steps=step + 1,
                log=state.log + (("search", step, argument, results),),
            )
            info = {
                INFO_VALID: True,
                INFO_SUCCESS: False,
                "action": f"search[{argument}]",
                "results": [self._kb.doc_id(d) for d in results],
            }
            return self.render(), 0.0, False, info
        em = exact_match(argument, question.answer)
        f1 = token_f1(argument, question.answer)
        self._state = replace(state, answer=argument, steps=step + 1, log=state.log + (("answer", step, argument),))
        reward = float(em) if self.reward == "em" else (1.0 if em else f1)
        info = {
            INFO_VALID: True,
            INFO_SUCCESS: em,
            "action": f"answer[{argument}]",
            "em": em,
            "f1": f1,
            "gold": question.answer,
        }
        return self.render(), reward, True, info

    def render(self) -> str:
        """The current observation (without feedback)."""
        self._require_question()
        state, kb = self._state, self._kb
        if state.answer is not None:
            verdict = "correct" if exact_match(state.answer, self._question.answer) else "incorrect"
            return f"You answered: {state.answer} ({verdict})."
        if state.last_results is None:
            return "No documents retrieved yet."
        if self.observation == "last":
            if not state.last_results:
                return "Search results: no document matches this query."
            return "Search results:\n" + "\n".join(kb.passage(d) for d in state.last_results)
        names = ", ".join(kb.doc_id(d) for d in state.last_results) or "nothing"
        header = f"Last search returned: {names} ({state.last_new} new)"
        if not state.retrieved:
            return header
        return f"{header}\nRetrieved documents:\n" + "\n".join(kb.passage(d) for d in state.retrieved)

    def _require_question(self) -> Question:
        if self._question is None:
            raise RuntimeError("Call reset(task) before using the environment")
        return self._question

    @property
    def question(self) -> Question:
        """The current question with its gold chain."""
        return self._require_question()

    @property
    def knowledge_base(self) -> KnowledgeBase:
        self._require_question()
        return self._kb

    # ---- expert ----------------------------------------------------------------------------------------------------

    def expert_plan(self) -> list[str] | None:
        """One search per hop not yet retrieved (the entity's name and a relation keyword, which ranks the hop's
        document first), then the gold answer; None once answered. Not declared as `optimal_plan`: answering at once
        would be shorter, and a plan that skips the evidence is not what an expert demonstration is for."""
        question = self._require_question()
        if self._state.answer is not None:
            return None
        retrieved = set(self._state.retrieved)
        searches = [f"search[{q}]" for q, d in zip(question.queries, question.supporting_docs) if d not in retrieved]
        return searches + [f"answer[{question.answer}]"]

    # ---- capabilities ----------------------------------------------------------------------------------------------

    def snapshot(self) -> tuple:
        return (self._kb, self._question, self._state)

    def restore(self, snapshot: tuple) -> None:
        self._kb, self._question, self._state = snapshot

    def state_key(self) -> tuple:
        """`(retrieved doc ids in order first seen, the last search's doc ids and how many were new, answer)`: what
        the observation and the verifier depend on (our choice: no turn counter, so equal evidence at different turns is one state)."""
        state = self._state
        return (state.retrieved, state.last_results, state.last_new, state.answer)

    def privileged_context(self) -> str:
        """The reasoning chain: the supporting document and fact of every hop, and the answer."""
        question, kb = self._require_question(), self._kb
        lines = ["Reasoning chain:"]
        for hop, (entity, relation) in enumerate(zip(question.chain, question.relations), start=1):
            fact = _RELATIONS_BY_NAME[relation].fact.format(
                x=kb.entities[entity].name, y=kb.value_text(entity, relation)
            )
            lines.append(f"{hop}. [{kb.doc_id(entity)}] {fact[0].upper() + fact[1:]}")
        lines.append(f"Answer: {question.answer}")
        return "\n".join(lines)

    def verify(self) -> list[VerifierAtom]:
        """One `retrieved:<doc id>` atom per hop (its supporting document appeared in a search's results; witness:
        the first such search; depends on the previous hop's atom), then `answered_correctly` (exact match; witness:
        the answer step, also when wrong; depends on every hop)."""
        question, kb, state = self._require_question(), self._kb, self._state
        first_seen: dict[int, int] = {}
        answer_step = None
        for event in state.log:
            if event[0] == "search":
                for d in event[3]:
                    first_seen.setdefault(d, event[1])
            else:
                answer_step = event[1]
        atoms, names = [], []
        for doc in question.supporting_docs:
            name = f"retrieved:{kb.doc_id(doc)}"
            step = first_seen.get(doc)
            atoms.append(VerifierAtom(name, "sat" if step is not None else "unsat", step, names[-1:]))
            names.append(name)
        correct = state.answer is not None and exact_match(state.answer, question.answer)
        atoms.append(VerifierAtom("answered_correctly", "sat" if correct else "unsat", answer_step, list(names)))
        return atoms

    # ---- splits ----------------------------------------------------------------------------------------------------

    @classmethod
    def task_split(cls, split: str, count: int | None = None, **env_kwargs: Any) -> list[dict[str, Any]]:
        """Seeded rows on one knowledge base: `"train"` (seeds from 0) and `"eval"` (from 1_000_000) with the env's
        hop range, and `"unseen"` (from 2_000_000) with 4-hop questions, longer than any train question by default.
        `num_entities` and `kb_seed` among `env_kwargs` are copied into the rows."""
        cls(**env_kwargs)
        settings = {k: env_kwargs[k] for k in ("num_entities", "kb_seed") if k in env_kwargs}
        settings.update(cls.SPLIT_TASK_SETTINGS.get(split, {}))
        return cls.seeded_split(split, count, **settings)
