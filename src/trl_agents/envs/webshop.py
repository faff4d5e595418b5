"""WebShop-lite: a WebShop-like shopping environment on a synthetic catalogue, and a client for a real WebShop server.

WebShop (Yao et al., 2022) asks an agent to buy a product matching an instruction such as "i need a sulfate free
shampoo with scent: lavender, and size: 16 fl oz, and price lower than 30.00 dollars" by searching a store and
clicking through its pages. Its product data is not available offline (see `envs/webshop/README.md`), so
`webshop-lite` is **WebShop-like, not WebShop**: a seeded synthetic catalogue (departments, product types,
attributes, options, prices) indexed with BM25, the same pages as text (search, results, item, description/features
sub-pages), the same action syntax (`search[query]`, `click[button]`) and WebShop's reward formula (attributes,
options, price, product type) on `click[buy now]`. `webshop` is a client for the original WebShop site served by
its Flask app (`web_agent_site/app.py`), for users who run that server themselves.

Example:
    >>> from trl_agents.envs import make_env
    >>> env = make_env("webshop-lite", num_products=200)
    >>> print(env.reset({"seed": 2}))
    WebShop [SEP] Search
    Available actions: search[<your query>]
    >>> print(env.task_description())
    Instruction: i am looking for a shampoo that is sulfate free with scent: citrus, and size: 8 fl oz, and price lower than 50.00 dollars
    >>> plan = env.expert_plan(); plan
    ['search[shampoo sulfate free]', 'click[b0uvxlgjne]', 'click[citrus]', 'click[8 fl oz]', 'click[buy now]']
    >>> for action in plan:
    ...     observation, reward, done, info = env.step(action)
    >>> reward, done, info["success"]
    (1.0, True, True)
"""

from __future__ import annotations

import difflib
import random
import re
import string
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field, replace
from functools import lru_cache
from html.parser import HTMLParser
from typing import Any, ClassVar

from .base import INFO_SUCCESS, INFO_VALID, AgentEnv, VerifierAtom
from .bm25 import BM25Index, require_bm25s
from .parsing import extract_answer
from .registry import register_env
from .validation import check_int

# ---- WebShop's constants (web_agent_site/engine/engine.py and goal.py) ----------------------------------------------

SEARCH_RETURN_N = 50  # results kept per search
PRODUCT_WINDOW = 10  # results per page
PRICE_RANGE = [10.0 * i for i in range(1, 100)]  # price bounds of the instructions
EXACT_MATCH_OPTIONS = ("size",)  # option names matched exactly (the others fuzzily)
FUZZY_MATCH_THRESHOLD = 85  # token_set_ratio above which an attribute/option counts as matched

# Buttons, lowercased as WebShop's text environment lowercases every clickable.
BACK_TO_SEARCH = "back to search"
PREV_PAGE = "< prev"
NEXT_PAGE = "next >"
BUY_NOW = "buy now"
SUB_PAGES = ("description", "features")
SEARCH_PLACEHOLDER = "search[<your query>]"

_ACTION = re.compile(r"\b(search|click)\s*\[([^\[\]]*)\]", re.IGNORECASE)

INSTRUCTIONS = (
    "You are shopping in a web store. Buy the product that the instruction describes.\n"
    "Each turn you see the current page (texts separated by [SEP]) and the actions available on it. Reply with "
    "exactly one action:\n"
    "- search[your query] on the search page, to search the store;\n"
    "- click[button] to click a button of the page: a product ID on the results page, next > or < prev to turn "
    "pages, an option value (a size, a colour, ...) on a product page, description or features to read more, "
    "back to search, or buy now.\n"
    "Open a product, click the options the instruction asks for, then click[buy now]. Buying ends the episode; the "
    "score says how well the product's type, attributes, options and price match the instruction."
)


# ---- pages as text ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ShopPage:
    """One page of the store as text: what the agent sees and what it can click.

    Args:
        kind: `"search"`, `"results"`, `"item"`, `"sub"` (description/features) or `"done"`.
        segments: The visible texts in page order (WebShop's text mode joins them with ` [SEP] `).
        clickables: The button texts that `click[...]` accepts, lowercased, in page order.
    """

    kind: str
    segments: tuple[str, ...]
    clickables: tuple[str, ...] = ()

    @property
    def has_search_bar(self) -> bool:
        return self.kind == "search"

    def admissible_actions(self) -> list[str]:
        if self.kind == "done":
            return []
        actions = [SEARCH_PLACEHOLDER] if self.has_search_bar else []
        return actions + [f"click[{c}]" for c in self.clickables]

    def render(self) -> str:
        """`seg1 [SEP] seg2 ...` and, on a second line, the available actions (none once the episode is over)."""
        text = " [SEP] ".join(self.segments)
        actions = self.admissible_actions()
        return f"{text}\nAvailable actions: {', '.join(actions)}" if actions else text


def parse_action(text: str) -> tuple[str, str] | None:
    """Parse `search[query]` or `click[button]` from a model's raw output.

    The answer region is found by `extract_answer` (the last `<action>`/``` block, else the text without `<think>`
    blocks); it must hold exactly one action. The action name is case-insensitive; the argument is lowercased with
    its whitespace collapsed (WebShop lowercases action arguments).

    Returns:
        `("search", query)` or `("click", button)`, or None when there is no action or several.

    Example:
        >>> parse_action("<think>the cheaper one</think><action>Click[ B0ABC ]</action>")
        ('click', 'b0abc')
        >>> parse_action("click[buy now] or click[< prev]") is None
        True
    """
    if not isinstance(text, str):
        return None
    found = _ACTION.findall(extract_answer(text))
    if len(found) != 1:
        return None
    name, argument = found[0]
    return name.lower(), " ".join(argument.lower().split())


# ---- WebShop's reward -------------------------------------------------------------------------------------------------


def _full_process(text: str) -> str:
    """Lowercase and replace everything but letters and digits with spaces (what thefuzz does before comparing)."""
    return " ".join("".join(ch if ch.isalnum() else " " for ch in text.lower()).split())


def _ratio(a: str, b: str) -> int:
    if not a or not b:
        return 0
    return round(100 * difflib.SequenceMatcher(None, a, b).ratio())


def token_set_ratio(a: str, b: str) -> int:
    """Fuzzy similarity of two phrases in [0, 100], ignoring word order and repeated words.

    The token-set ratio of thefuzz (which WebShop's reward uses), computed with difflib's `SequenceMatcher` (thefuzz's
    pure-Python backend): the best ratio among the shared words and each phrase's words sorted after them, so a
    phrase whose words are a subset of the other's scores 100.

    Example:
        >>> token_set_ratio("long lasting", "Long-lasting formula"), token_set_ratio("gluten free", "sugar free")
        (100, 57)
    """
    tokens_a, tokens_b = set(_full_process(a).split()), set(_full_process(b).split())
    if not tokens_a or not tokens_b:
        return 0
    shared = " ".join(sorted(tokens_a & tokens_b))
    only_a = " ".join(sorted(tokens_a - tokens_b))
    only_b = " ".join(sorted(tokens_b - tokens_a))
    combined_a = f"{shared} {only_a}".strip()
    combined_b = f"{shared} {only_b}".strip()
    return max(_ratio(shared, combined_a), _ratio(shared, combined_b), _ratio(combined_a, combined_b))


def _mentions(phrase: str, text: str) -> bool:
    """Whether `phrase` occurs in `text` as whole words (our choice: WebShop tests raw substrings, so "red" would be
    found in "covered"; word boundaries avoid such accidental matches)."""
    phrase = phrase.lower().strip()
    return bool(phrase) and re.search(rf"(?<!\w){re.escape(phrase)}(?!\w)", text.lower()) is not None


@dataclass(frozen=True)
class Product:
    """A catalogue product (the fields of WebShop's product records that the pages and the reward use).

    Args:
        asin: Product ID (10 characters, `B0` + 8 letters/digits, as Amazon's).
        title: Product title.
        query: The product type's search query (WebShop: the query the product was scraped under).
        category_path: Department › subcategory › type, e.g. `("beauty & personal care", "hair care", "shampoo")`.
        nouns: The title's nouns, for the product-type check. WebShop tags the nouns and proper nouns of the title
            with spaCy; a synthetic title is built from known parts, so ours are its product-type words (our
            choice: the brand is left out, so that a product of another type from the same brand does not pass
            for the right type, and no two product types share a word).
        price: Price in dollars.
        attributes: Attribute phrases (e.g. `"sulfate free"`).
        options: `((option name, (values...)), ...)`, e.g. `(("color", ("black", "red")), ("size", ("small",)))`.
        description: Text of the description sub-page.
        features: Bullet points of the features sub-page.
    """

    asin: str
    title: str
    query: str
    category_path: tuple[str, ...]
    nouns: tuple[str, ...]
    price: float
    attributes: tuple[str, ...]
    options: tuple[tuple[str, tuple[str, ...]], ...]
    description: str
    features: tuple[str, ...]

    @property
    def price_text(self) -> str:
        return f"${self.price:.2f}"

    def option_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.options)

    def option_of(self, value: str) -> str | None:
        """The option name that offers `value` (values are unique within a product), or None."""
        for name, values in self.options:
            if value in values:
                return name
        return None

    def text(self) -> str:
        """Title, features and description: where WebShop looks for attributes/options not listed explicitly."""
        return " ".join([self.title, *self.features, self.description])


@dataclass(frozen=True)
class Goal:
    """What an instruction asks for (WebShop's goal records).

    Args:
        asin: The product the instruction was written from (one of possibly several that satisfy it).
        instruction: The instruction text.
        query: The target's product-type query.
        category_path: The target's category path.
        nouns: The target title's nouns (`Product.nouns`).
        attributes: Required attribute phrases.
        options: `((option name, value), ...)` to select.
        price_upper: Price bound in dollars (1e6 when the instruction states none).
    """

    asin: str
    instruction: str
    query: str
    category_path: tuple[str, ...]
    nouns: tuple[str, ...]
    attributes: tuple[str, ...]
    options: tuple[tuple[str, str], ...]
    price_upper: float


def type_reward(product: Product, goal: Goal) -> dict[str, Any]:
    """WebShop's product-type factor `r_type` (goal.py `get_type_reward`).

    1.0 when the product shares the goal's query, at least two levels of its category path, or more than 20% of its
    title nouns; 0.5 when none of these holds; then 0.1 when the noun overlap is under 10%, and 0.0 when it is zero
    (so a product with no noun in common gets nothing whatever its category).
    """
    query_match = product.query == goal.query
    category_match = len(set(product.category_path) & set(goal.category_path)) >= 2
    goal_nouns = set(goal.nouns)
    title_score = len(set(product.nouns) & goal_nouns) / len(goal_nouns) if goal_nouns else 0.2
    r_type = 1.0
    if not (query_match or category_match or title_score > 0.2):
        r_type = 0.5
    if title_score < 0.1:
        r_type = 0.1
    if title_score == 0.0:
        r_type = 0.0
    return {"r_type": r_type, "query_match": query_match, "category_match": category_match, "title_score": title_score}


def attribute_matches(product: Product, goal: Goal) -> list[bool]:
    """Per goal attribute: listed by the product (token-set ratio > 85) or mentioned in its title/features/
    description (goal.py `get_attribute_reward`)."""
    text = product.text()
    return [
        any(token_set_ratio(p, g) > FUZZY_MATCH_THRESHOLD for p in product.attributes) or _mentions(g, text)
        for g in goal.attributes
    ]


def option_matches(product: Product, goal: Goal, chosen: dict[str, str]) -> dict[str, bool]:
    """Per chosen option (name -> value): matched by a goal option value (exactly for `size`, by token-set ratio > 85
    otherwise) or mentioned in the product's text (goal.py `get_option_reward`). WebShop also normalises colour
    synonyms; our colours are canonical already."""
    goal_values = [value for _, value in goal.options]
    text = product.text()
    matched = {}
    for name, value in chosen.items():
        if name.lower() in EXACT_MATCH_OPTIONS:
            hit = value in goal_values
        else:
            hit = any(token_set_ratio(g, value) > FUZZY_MATCH_THRESHOLD for g in goal_values)
        matched[name] = hit or _mentions(value, text)
    return matched


def webshop_reward(product: Product, goal: Goal, chosen: dict[str, str]) -> tuple[float, dict[str, Any]]:
    """WebShop's score of buying `product` with options `chosen` for `goal` (goal.py `get_reward`):

        (attributes matched + chosen options matched + [price <= bound]) / (#attributes + #goal options + 1) * r_type

    Returns the score in [0, 1] and its parts (`r_type`, `r_att`, `r_option`, `r_price`, counts, `title_score`, ...).

    Example (one of two attributes, one of two options, price within the bound, same product type):
        >>> goal = Goal("B0", "...", "shampoo", ("beauty", "hair", "shampoo"), ("lumora", "shampoo"),
        ...             ("sulfate free", "vegan"), (("scent", "lavender"), ("size", "16 fl oz")), 30.0)
        >>> product = Product("B1", "Kestra Shampoo", "shampoo", ("beauty", "hair", "shampoo"), ("kestra", "shampoo"),
        ...                   12.5, ("sulfate free",), (("scent", ("lavender", "rose")), ("size", ("8 fl oz",))), "", ())
        >>> webshop_reward(product, goal, {"scent": "lavender", "size": "8 fl oz"})[0]
        0.6
    """
    type_info = type_reward(product, goal)
    attributes = attribute_matches(product, goal)
    options = option_matches(product, goal, chosen)
    price_ok = product.price <= goal.price_upper
    num_attributes, num_options = sum(attributes), sum(options.values())
    denominator = len(goal.attributes) + len(goal.options) + 1
    score = (num_attributes + num_options + float(price_ok)) / denominator * type_info["r_type"]
    details = {
        **type_info,
        "r_att": num_attributes / len(goal.attributes) if goal.attributes else None,
        "r_option": num_options / len(goal.options) if goal.options else None,
        "r_price": price_ok,
        "num_attribute_matches": num_attributes,
        "num_option_matches": num_options,
        "attribute_matches": attributes,
        "option_matches": options,
    }
    return score, details


# ---- the synthetic catalogue ------------------------------------------------------------------------------------------

# fmt: off
# Option value pools: (option name, values). Values are lowercase and unique within any product type.
_VALUES: dict[str, tuple[str, tuple[str, ...]]] = {
    "color": ("color", ("black", "white", "navy blue", "grey", "red", "olive green", "beige", "pink", "brown")),
    "clothing": ("size", ("small", "medium", "large", "x-large", "xx-large")),
    "shoe": ("size", ("7", "7.5", "8", "8.5", "9", "9.5", "10", "11", "12")),
    "bedding": ("size", ("twin", "full", "queen", "king")),
    "volume": ("size", ("4 fl oz", "8 fl oz", "16 fl oz", "32 fl oz")),
    "pack": ("size", ("pack of 4", "pack of 6", "pack of 12", "pack of 24")),
    "length": ("size", ("3 ft", "6 ft", "10 ft")),
    "weight": ("size", ("5 lb", "10 lb", "15 lb", "25 lb")),
    "capacity": ("size", ("12 oz", "20 oz", "32 oz", "40 oz")),
    "pan": ("size", ("8 inch", "10 inch", "12 inch")),
    "tent": ("size", ("2 person", "4 person", "6 person")),
    "scent": ("scent", ("lavender", "coconut", "citrus", "eucalyptus", "rose", "unscented")),
    "flavor": ("flavor", ("chocolate", "peanut butter", "sea salt", "vanilla", "mixed berry", "caramel")),
    "pet flavor": ("flavor", ("chicken", "beef", "salmon", "lamb")),
}

# department -> subcategory -> (attribute pool, [(product type, option pools, (min price, max price)), ...])
_DEPARTMENTS: dict[str, dict[str, tuple[tuple[str, ...], list[tuple[str, tuple[str, ...], tuple[float, float]]]]]] = {
    "beauty & personal care": {
        "hair care": (
            ("paraben free", "sulfate free", "cruelty free", "for dry hair", "argan oil", "tea tree", "vegan",
             "color safe"),
            [("shampoo", ("scent", "volume"), (6, 35)), ("conditioner", ("scent", "volume"), (6, 35)),
             ("hair oil", ("scent", "volume"), (8, 40))],
        ),
        "skin care": (
            ("for sensitive skin", "oil free", "alcohol free", "dermatologist tested", "natural ingredients",
             "long lasting", "cruelty free", "hyaluronic acid"),
            [("face moisturizer", ("volume",), (9, 60)), ("sunscreen", ("volume",), (7, 30)),
             ("body wash", ("scent", "volume"), (5, 25))],
        ),
    },
    "clothing, shoes & jewelry": {
        "men's clothing": (
            ("machine wash", "slim fit", "relaxed fit", "long sleeve", "short sleeve", "cotton blend",
             "moisture wicking", "button closure"),
            [("t-shirt", ("color", "clothing"), (9, 35)), ("polo", ("color", "clothing"), (15, 60)),
             ("sweatshirt", ("color", "clothing"), (18, 60))],
        ),
        "women's clothing": (
            ("machine wash", "high waist", "stretch fabric", "with pockets", "quick drying", "breathable",
             "tummy control", "soft fabric"),
            [("dress", ("color", "clothing"), (18, 90)), ("leggings", ("color", "clothing"), (12, 45)),
             ("cardigan", ("color", "clothing"), (20, 75))],
        ),
        "shoes": (
            ("rubber sole", "non slip", "breathable", "lace up", "arch support", "memory foam", "waterproof",
             "lightweight"),
            [("running shoes", ("color", "shoe"), (35, 140)), ("sneakers", ("color", "shoe"), (30, 120)),
             ("hiking boots", ("color", "shoe"), (50, 180))],
        ),
    },
    "grocery & gourmet food": {
        "snacks": (
            ("gluten free", "non gmo", "keto friendly", "low sugar", "high protein", "plant based",
             "individually wrapped", "kosher"),
            [("protein bar", ("flavor", "pack"), (8, 40)), ("trail mix", ("flavor", "pack"), (6, 30)),
             ("granola", ("flavor", "pack"), (5, 28))],
        ),
        "beverages": (
            ("organic", "non gmo", "sugar free", "low calorie", "caffeine free", "no artificial flavors", "kosher",
             "dairy free"),
            [("green tea", ("pack",), (4, 25)), ("cold brew", ("flavor", "pack"), (8, 40)),
             ("seltzer", ("flavor", "pack"), (5, 30))],
        ),
    },
    "electronics": {
        "audio": (
            ("noise cancelling", "water resistant", "long battery life", "built in microphone", "hands free",
             "touch control", "bluetooth 5", "deep bass"),
            [("wireless earbuds", ("color",), (20, 150)), ("bluetooth speaker", ("color",), (18, 120)),
             ("over ear headphones", ("color",), (25, 200))],
        ),
        "accessories": (
            ("fast charging", "usb c", "compact design", "lightweight", "travel friendly", "led indicator",
             "overcharge protection", "dual port"),
            [("wall charger", ("color",), (8, 35)), ("charging cable", ("color", "length"), (5, 25)),
             ("power bank", ("color",), (15, 60))],
        ),
    },
    "home & kitchen": {
        "furniture": (
            ("easy assembly", "solid wood", "space saving", "ergonomic design", "lumbar support", "metal frame",
             "easy to clean", "adjustable height"),
            [("office chair", ("color",), (60, 300)), ("bookshelf", ("color",), (40, 200)),
             ("side table", ("color",), (25, 120))],
        ),
        "kitchen": (
            ("dishwasher safe", "non stick", "stainless steel", "heat resistant", "easy to clean", "induction ready",
             "bpa free", "microwave safe"),
            [("frying pan", ("pan",), (15, 80)), ("coffee mug", ("color", "capacity"), (8, 30)),
             ("knife set", ("color",), (25, 150))],
        ),
        "bedding": (
            ("hypoallergenic", "machine washable", "wrinkle free", "soft microfiber", "cooling", "deep pocket",
             "egyptian cotton", "all season"),
            [("bed sheets", ("color", "bedding"), (20, 90)), ("comforter", ("color", "bedding"), (35, 150)),
             ("pillow", ("bedding",), (12, 60))],
        ),
    },
    "sports & outdoors": {
        "fitness": (
            ("non slip", "extra thick", "eco friendly", "portable", "durable", "carrying strap", "anti tear",
             "quick adjust"),
            [("yoga mat", ("color",), (15, 70)), ("adjustable dumbbells", ("weight",), (40, 250)),
             ("resistance bands", ("color",), (8, 35))],
        ),
        "outdoor recreation": (
            ("waterproof", "lightweight", "insulated", "leak proof", "bpa free", "easy setup", "durable",
             "uv protection"),
            [("water bottle", ("color", "capacity"), (10, 45)), ("camping tent", ("color", "tent"), (50, 300)),
             ("backpack", ("color",), (30, 150))],
        ),
    },
    "pet supplies": {
        "pet food": (
            ("grain free", "high protein", "natural ingredients", "vet recommended", "for senior pets",
             "no artificial flavors", "made in usa", "limited ingredient"),
            [("dog kibble", ("pet flavor", "weight"), (15, 80)), ("cat food", ("pet flavor", "weight"), (12, 60)),
             ("pet treats", ("pet flavor", "pack"), (6, 30))],
        ),
        "dog walking": (
            ("reflective", "durable", "padded handle", "adjustable", "for small breeds", "for large breeds",
             "quick release", "waterproof"),
            [("leash", ("color", "length"), (8, 30)), ("collar", ("color", "clothing"), (6, 25)),
             ("harness", ("color", "clothing"), (12, 45))],
        ),
    },
}

# fmt: on

_BRAND_ONSETS = (
    "b",
    "br",
    "c",
    "d",
    "f",
    "g",
    "k",
    "kl",
    "l",
    "m",
    "n",
    "p",
    "pr",
    "r",
    "s",
    "st",
    "t",
    "tr",
    "v",
    "z",
)
_BRAND_VOWELS = ("a", "e", "i", "o", "u", "ai", "ea", "io")
_BRAND_CODAS = ("", "n", "r", "s", "x", "l", "m", "th")
_GENERIC_FEATURES = (
    "Backed by a one year warranty",
    "Ships in recyclable packaging",
    "Designed for everyday use",
    "Trusted by thousands of customers",
    "Quality checked before shipping",
)


def _brand_names(rng: random.Random, count: int) -> list[str]:
    names: set[str] = set()
    while len(names) < count:
        syllables = rng.randint(2, 3)
        word = "".join(rng.choice(_BRAND_ONSETS) + rng.choice(_BRAND_VOWELS) for _ in range(syllables))
        names.add((word + rng.choice(_BRAND_CODAS)).capitalize())
    return sorted(names)


def _asin(rng: random.Random) -> str:
    return "B0" + "".join(rng.choice(string.ascii_uppercase + string.digits) for _ in range(8))


def _article(word: str) -> str:
    return "an" if word[:1] in "aeiou" else "a"


@dataclass
class Catalogue:
    """A generated catalogue: products, a BM25 index over them, and seeded goals.

    Build it with `get_catalogue(catalogue_seed, num_products)` (cached per process).
    """

    catalogue_seed: int
    products: list[Product]
    by_asin: dict[str, Product]
    index: BM25Index
    _goals: dict[int, tuple[Goal, str]] = field(default_factory=dict, repr=False)

    def search(self, query: str, k: int = SEARCH_RETURN_N) -> list[str]:
        """ASINs of the top `k` products for `query`, best first (WebShop keeps the top 50)."""
        return [self.products[i].asin for i in self.index.search(query, k)]

    def goal(self, seed: int) -> Goal:
        """The goal of task `seed` (deterministic)."""
        return self._goal_and_query(seed)[0]

    def expert_query(self, seed: int) -> str:
        """A search query that lists the goal's product on the first results page."""
        return self._goal_and_query(seed)[1]

    def _goal_and_query(self, seed: int) -> tuple[Goal, str]:
        if seed not in self._goals:
            self._goals[seed] = _make_goal(self, seed)
        return self._goals[seed]


def _build_products(catalogue_seed: int, num_products: int) -> list[Product]:
    rng = random.Random(f"webshop-lite/catalogue/{catalogue_seed}")
    product_types = [
        (department, attributes, subcategory, kind, pools, prices)
        for department, subcategories in _DEPARTMENTS.items()
        for subcategory, (attributes, kinds) in subcategories.items()
        for kind, pools, prices in kinds
    ]
    brands = _brand_names(rng, 400)
    products, asins = [], set()
    for i in range(num_products):
        # Round-robin over the types keeps every type present even in small catalogues.
        department, attribute_pool, subcategory, kind, pools, (low, high) = product_types[i % len(product_types)]
        asin = _asin(rng)
        while asin in asins:
            asin = _asin(rng)
        asins.add(asin)
        brand = rng.choice(brands)
        attributes = tuple(rng.sample(attribute_pool, rng.randint(3, 4)))
        options = []
        for pool in pools:
            name, values = _VALUES[pool]
            offered = set(rng.sample(values, rng.randint(2, len(values))))
            options.append((name, tuple(v for v in values if v in offered)))
        in_title = attributes[:2]
        title = f"{brand} {in_title[0].title()} {kind.title()}, {in_title[1].title()}"
        description = (
            f"The {brand} {kind} is {attributes[0]} and {attributes[1]}. "
            f"{rng.choice(_GENERIC_FEATURES)}, it suits gifts and daily routines alike."
        )
        features = tuple(a.capitalize() for a in attributes) + tuple(rng.sample(_GENERIC_FEATURES, 2))
        products.append(
            Product(
                asin=asin,
                title=title,
                query=kind,
                category_path=(department, subcategory, kind),
                nouns=tuple(kind.replace("-", " ").split()),
                price=round(rng.uniform(low, high), 2),
                attributes=attributes,
                options=tuple(options),
                description=description,
                features=features,
            )
        )
    return products


def _make_goal(catalogue: Catalogue, seed: int) -> tuple[Goal, str]:
    """A WebShop-style instruction for task `seed`: a target product, 1-3 of its attributes, one value per option,
    and a price bound drawn like WebShop's (the larger of two of the four multiples of $10 above the price)."""
    rng = random.Random(f"webshop-lite/goal/{catalogue.catalogue_seed}/{len(catalogue.products)}/{seed}")
    product = rng.choice(catalogue.products)
    attributes = tuple(rng.sample(product.attributes, rng.randint(1, min(3, len(product.attributes)))))
    options = tuple((name, rng.choice(values)) for name, values in product.options)
    bounds = [p for p in PRICE_RANGE if p > product.price][:4]
    if len(bounds) >= 2:
        price_upper = max(rng.sample(bounds, 2))
        price_text = f", and price lower than {price_upper:.2f} dollars"
    else:
        price_upper, price_text = 1_000_000.0, ""
    kind = product.query
    listed = " and ".join(attributes)
    template = rng.randrange(3)
    if template == 0:
        text = f"i need {_article(attributes[0])} {attributes[0]} {kind}" + (
            f" that is {' and '.join(attributes[1:])}" if len(attributes) > 1 else ""
        )
    elif template == 1:
        text = f"i am looking for {_article(kind)} {kind} that is {listed}"
    else:
        text = f"i want to buy {_article(kind)} {kind} which is {listed}"
    if options:
        text += " with " + ", and ".join(f"{name}: {value}" for name, value in options)
    goal = Goal(
        asin=product.asin,
        instruction=text + price_text,
        query=product.query,
        category_path=product.category_path,
        nouns=product.nouns,
        attributes=attributes,
        options=options,
        price_upper=price_upper,
    )
    # The expert's query: the instruction's key words when they list the target on page 1, else its title (which
    # lists it on page 1 for every goal we checked: 2000 seeds each at 200 to 10,000 products).
    query = f"{kind} {' '.join(attributes)}"
    if product.asin not in catalogue.search(query, PRODUCT_WINDOW):
        query = _full_process(product.title)
        if product.asin not in catalogue.search(query):
            raise RuntimeError(f"webshop-lite: no search query lists the target of seed {seed}; please report this")
    return goal, query


@lru_cache(maxsize=4)
def get_catalogue(catalogue_seed: int = 0, num_products: int = 3000) -> Catalogue:
    """The catalogue of `catalogue_seed` with `num_products` products, built once per process (a few thousand
    products and their BM25 index take well under a second)."""
    products = _build_products(catalogue_seed, num_products)
    documents = [f"{p.title}. {' '.join(p.features)}. {p.description}" for p in products]
    return Catalogue(catalogue_seed, products, {p.asin: p for p in products}, BM25Index(documents))


# ---- the pages of WebShop-lite ------------------------------------------------------------------------------------------


def results_page(catalogue: Catalogue, results: tuple[str, ...], page: int) -> ShopPage:
    """Page `page` (from 1) of search results."""
    segments, clickables = ["Back to Search", f"Page {page} (Total results: {len(results)})"], [BACK_TO_SEARCH]
    if page > 1:
        segments.append("< Prev")
        clickables.append(PREV_PAGE)
    if page * PRODUCT_WINDOW < len(results):
        segments.append("Next >")
        clickables.append(NEXT_PAGE)
    for asin in results[(page - 1) * PRODUCT_WINDOW : page * PRODUCT_WINDOW]:
        product = catalogue.by_asin[asin]
        segments += [asin, product.title, product.price_text]
        clickables.append(asin.lower())
    return ShopPage("results", tuple(segments), tuple(clickables))


def item_page(product: Product, chosen: dict[str, str]) -> ShopPage:
    """A product page: the options (chosen ones announced first, as WebShop's rich text mode does), title, price,
    the description/features buttons and buy now."""
    segments = [f"You have clicked {value}." for value in chosen.values()]
    segments += ["Back to Search", "< Prev"]
    clickables = [BACK_TO_SEARCH, PREV_PAGE]
    for name, values in product.options:
        segments.append(name)
        segments += values
        clickables += values
    segments += [product.title, f"Price: {product.price_text}", "Description", "Features", "Buy Now"]
    clickables += [*SUB_PAGES, BUY_NOW]
    return ShopPage("item", tuple(segments), tuple(clickables))


def sub_page(product: Product, name: str) -> ShopPage:
    """The description or features page of a product."""
    body = (product.description,) if name == "description" else product.features
    return ShopPage("sub", ("Back to Search", "< Prev", *body), (BACK_TO_SEARCH, PREV_PAGE))


SEARCH_PAGE = ShopPage("search", ("WebShop", "Search"))


def done_page(score: float) -> ShopPage:
    return ShopPage("done", ("Thank you for shopping with us!", "Your score (min 0.0, max 1.0)", f"{score}"))


# ---- argument checks ----------------------------------------------------------------------------------------------


def _check_reward(reward: Any) -> str:
    if reward not in ("score", "binary"):
        raise ValueError(
            f"`reward` must be 'score' (WebShop's graded score) or 'binary' (1.0 on success), got {reward!r}"
        )
    return reward


# ---- WebShop-lite ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _ShopState:
    """Everything that changes during an episode (immutable, so a snapshot is the object itself).

    `log` holds one entry per meaningful event, for `verify()`: `("search", step, results)`,
    `("product", step, asin)`, `("option", step, name, value)` and `("buy", step)`.
    """

    page: str = "search"
    results: tuple[str, ...] = ()
    page_number: int = 1
    asin: str | None = None
    chosen: tuple[tuple[str, str], ...] = ()
    sub_page: str | None = None
    score: float | None = None
    steps: int = 0
    log: tuple[tuple, ...] = ()


@register_env
class WebShopLite(AgentEnv):
    """WebShop-like shopping on a seeded synthetic catalogue (not WebShop's data), with WebShop's pages, action
    syntax and reward.

    A task row is `{"seed": s}`: the goal of seed `s` in the env's catalogue. A row may also set `num_products` and
    `catalogue_seed`, which then override the constructor's values for that task (`task_split` copies them from its
    `env_kwargs`, so any instance plays the same tasks).

    Args:
        num_products: Catalogue size (products are spread evenly over 48 product types in 7 departments).
        catalogue_seed: Seed of the catalogue (products, prices, options); goals are seeded per task on top of it.
        reward: `"score"` (default): WebShop's graded score in [0, 1] on `click[buy now]`; `"binary"`: 1.0 only on
            success (score == 1, WebShop's success), else 0.0. Every other step gets 0.
    """

    name = "webshop-lite"
    requires = ("bm25s",)
    task_keys = ("seed",)
    instructions = INSTRUCTIONS

    SPLIT_SEED_START: ClassVar[dict[str, int]] = {"train": 0, "eval": 1_000_000}
    SPLIT_DEFAULT_COUNT: ClassVar[dict[str, int]] = {"train": 5000, "eval": 200}

    def __init__(self, num_products: int = 3000, catalogue_seed: int = 0, reward: str = "score"):
        require_bm25s()
        self.num_products = check_int("num_products", num_products, 1)
        self.catalogue_seed = check_int("catalogue_seed", catalogue_seed, 0)
        self.reward = _check_reward(reward)
        self._catalogue: Catalogue | None = None
        self._goal: Goal | None = None
        self._seed: int | None = None
        self._state = _ShopState()

    # ---- episode ---------------------------------------------------------------------------------------------------

    def reset(self, task: dict[str, Any]) -> str:
        """Start the task of `task["seed"]` on the search page."""
        if task.get("seed") is None:
            raise ValueError(f"A webshop-lite task needs a 'seed', got keys {sorted(task)}")
        seed = check_int("seed", task["seed"], 0)
        num_products = check_int("num_products", task.get("num_products", self.num_products), 1)
        catalogue_seed = check_int("catalogue_seed", task.get("catalogue_seed", self.catalogue_seed), 0)
        self._catalogue = get_catalogue(catalogue_seed, num_products)
        self._goal = self._catalogue.goal(seed)
        self._seed = seed
        self._state = _ShopState()
        return self.page().render()

    def task_description(self) -> str:
        return f"Instruction: {self._require_goal().instruction}"

    def step(self, action_text: str) -> tuple[str, float, bool, dict[str, Any]]:
        goal = self._require_goal()
        state = self._state
        if state.page == "done":
            raise RuntimeError("The episode is over; call reset() first")
        page = self.page()
        parsed = parse_action(action_text)
        error = self._check_action(parsed, page)
        if error is not None:
            self._state = replace(state, steps=state.steps + 1)
            info = {INFO_VALID: False, INFO_SUCCESS: False, "action": None, "page": state.page}
            return f"Invalid action: {error}\n{page.render()}", 0.0, False, info
        kind, argument = parsed
        self._state = self._transition(state, kind, argument)
        info = {INFO_VALID: True, INFO_SUCCESS: False, "action": f"{kind}[{argument}]", "page": self._state.page}
        reward, done = 0.0, self._state.page == "done"
        if done:
            product = self._catalogue.by_asin[state.asin]
            score, details = webshop_reward(product, goal, dict(state.chosen))
            self._state = replace(self._state, score=score)
            success = score == 1.0
            reward = score if self.reward == "score" else float(success)
            info.update({INFO_SUCCESS: success, "score": score, "asin": product.asin, "options": dict(state.chosen)})
            info.update({k: details[k] for k in ("r_type", "r_att", "r_option", "r_price", "title_score")})
        return self.page().render(), reward, done, info

    @staticmethod
    def _check_action(parsed: tuple[str, str] | None, page: ShopPage) -> str | None:
        """Why the action cannot be applied on `page`, or None when it can."""
        if parsed is None:
            return "reply with exactly one action, search[your query] or click[button]."
        kind, argument = parsed
        if kind == "search":
            if not page.has_search_bar:
                return "search[...] only works on the search page; click[back to search] first."
            if not argument:
                return "the search query is empty; write search[your query]."
            return None
        if argument not in page.clickables:
            return f"there is no button {argument!r} on this page; click one of: {', '.join(page.clickables)}."
        return None

    def _transition(self, state: _ShopState, kind: str, argument: str) -> _ShopState:
        step = state.steps
        state = replace(state, steps=step + 1)
        catalogue = self._catalogue
        if kind == "search":
            results = tuple(catalogue.search(argument))
            return replace(
                state,
                page="results",
                results=results,
                page_number=1,
                asin=None,
                chosen=(),
                log=state.log + (("search", step, results),),
            )
        if argument == BACK_TO_SEARCH:
            return replace(state, page="search", results=(), page_number=1, asin=None, chosen=(), sub_page=None)
        if state.page == "results":
            if argument == NEXT_PAGE:
                return replace(state, page_number=state.page_number + 1)
            if argument == PREV_PAGE:
                return replace(state, page_number=state.page_number - 1)
            asin = argument.upper()
            return replace(state, page="item", asin=asin, chosen=(), log=state.log + (("product", step, asin),))
        if state.page == "sub":  # only "< prev" is left: back to the product page, options kept
            return replace(state, page="item", sub_page=None)
        # item page
        if argument == PREV_PAGE:
            return replace(state, page="results", asin=None, chosen=())
        if argument in SUB_PAGES:
            return replace(state, page="sub", sub_page=argument)
        if argument == BUY_NOW:
            return replace(state, page="done", log=state.log + (("buy", step),))
        product = catalogue.by_asin[state.asin]
        name = product.option_of(argument)
        chosen = dict(state.chosen)
        chosen[name] = argument
        ordered = tuple((n, chosen[n]) for n in product.option_names() if n in chosen)
        return replace(state, chosen=ordered, log=state.log + (("option", step, name, argument),))

    def page(self) -> ShopPage:
        """The current page."""
        state = self._state
        catalogue = self._catalogue
        if state.page == "search":
            return SEARCH_PAGE
        if state.page == "results":
            return results_page(catalogue, state.results, state.page_number)
        if state.page == "item":
            return item_page(catalogue.by_asin[state.asin], dict(state.chosen))
        if state.page == "sub":
            return sub_page(catalogue.by_asin[state.asin], state.sub_page)
        return done_page(state.score)

    def admissible_actions(self) -> list[str]:
        self._require_goal()
        return self.page().admissible_actions()

    def _require_goal(self) -> Goal:
        if self._goal is None:
            raise RuntimeError("Call reset(task) before using the environment")
        return self._goal

    @property
    def goal(self) -> Goal:
        """The current task's goal."""
        return self._require_goal()

    @property
    def catalogue(self) -> Catalogue:
        """The current task's catalogue."""
        self._require_goal()
        return self._catalogue

    # ---- expert ------------------------------------------------------------------------------------------------------

    def expert_plan(self) -> list[str] | None:
        """Actions that buy the goal's product with its options from the current state (None once the episode is
        over). From the first page it is search (the instruction's key words, or the target's title when those do not
        list it on the first results page), click the target, click each option, buy now: the fewest actions
        possible. From other states it goes back to search when the target is not at hand, so it is not always
        shortest (hence no `optimal_plan` capability)."""
        goal = self._require_goal()
        state = self._state
        if state.page == "done":
            return None
        target = goal.asin.lower()
        finish = [f"click[{value}]" for name, value in goal.options if dict(state.chosen).get(name) != value]
        finish.append(f"click[{BUY_NOW}]")
        if state.page in ("item", "sub") and state.asin == goal.asin:
            return ([f"click[{PREV_PAGE}]"] if state.page == "sub" else []) + finish
        all_options = [f"click[{value}]" for _, value in goal.options] + [f"click[{BUY_NOW}]"]
        if state.page == "results" and target in self.page().clickables:
            return [f"click[{target}]"] + all_options
        query = self._catalogue.expert_query(self._seed)
        plan = [] if state.page == "search" else [f"click[{BACK_TO_SEARCH}]"]
        rank = self._catalogue.search(query).index(goal.asin)  # first page by construction; turn pages otherwise
        turns = [f"click[{NEXT_PAGE}]"] * (rank // PRODUCT_WINDOW)
        return plan + [f"search[{query}]", *turns, f"click[{target}]", *all_options]

    # ---- capabilities ----------------------------------------------------------------------------------------------

    def snapshot(self) -> tuple:
        return (self._catalogue, self._goal, self._seed, self._state)

    def restore(self, snapshot: tuple) -> None:
        self._catalogue, self._goal, self._seed, self._state = snapshot

    def state_key(self) -> tuple:
        """The current page: `("search",)`, `("results", results, page)`, `("item", asin, chosen options)`,
        `("sub", asin, sub page, chosen options)` or `("done", asin, chosen options)`."""
        state = self._state
        if state.page == "search":
            return ("search",)
        if state.page == "results":
            return ("results", state.results, state.page_number)
        if state.page == "sub":
            return ("sub", state.asin, state.sub_page, state.chosen)
        return (state.page, state.asin, state.chosen)

    def privileged_context(self) -> str:
        """The target product and how to buy it (a teacher's hint)."""
        goal = self._require_goal()
        product = self._catalogue.by_asin[goal.asin]
        options = ", ".join(f"{name}: {value}" for name, value in goal.options) or "none"
        return (
            f"Target product: {product.asin} - {product.title} ({product.price_text}). "
            f'Search for "{self._catalogue.expert_query(self._seed)}" to find it, open it, select the options '
            f"({options}), then click buy now."
        )

    def verify(self) -> list[VerifierAtom]:
        """The atoms of WebShop's success condition (score == 1) for the product bought, or the one open now.

        - `searched`: a search listed a product matching the goal's type and attributes (witness: the search the
          chosen product was found by when it matches, else the first such search);
        - `clicked_target_product` (needs `searched`): the chosen product matches the goal's type (`r_type` = 1) and
          every goal attribute: the target or an equivalent product (witness: the click that opened it; for a
          wrong product, the click that opened that one);
        - `option:<name>` per goal option (needs `clicked_target_product`): the value selected for that option
          matches the goal (witness: the click that selected it);
        - `price_ok` (needs `clicked_target_product`): the chosen product's price is within the bound (witness: the
          click that opened it);
        - `bought` (needs all the above): buy now was clicked (witness: that step).

        Every atom is `"sat"` or `"unsat"`; the score is 1 exactly when all are sat (WebShop's success).
        """
        goal = self._require_goal()
        state = self._state
        catalogue = self._catalogue
        chosen_asin, click_step, search_step = state.asin, None, None
        last_search = None
        for event in state.log:
            if event[0] == "search":
                last_search = event[1]
            elif event[0] == "product":
                click_step, search_step = event[1], last_search
        # The product opened last is the chosen one whether or not it is still on screen (it was bought, or the
        # agent went back): its click is the evidence either way.
        if chosen_asin is None and click_step is not None:
            chosen_asin = next(e[2] for e in reversed(state.log) if e[0] == "product")

        def matches(asin: str) -> bool:
            product = catalogue.by_asin[asin]
            return type_reward(product, goal)["r_type"] == 1.0 and all(attribute_matches(product, goal))

        product_ok = chosen_asin is not None and matches(chosen_asin)
        if product_ok:
            searched_step = search_step
        else:
            searched_step = next((e[1] for e in state.log if e[0] == "search" and any(map(matches, e[2]))), None)
        atoms = [VerifierAtom("searched", "sat" if searched_step is not None else "unsat", searched_step)]
        atoms.append(VerifierAtom("clicked_target_product", "sat" if product_ok else "unsat", click_step, ["searched"]))
        chosen = dict(state.chosen) if chosen_asin == state.asin else {}
        option_steps = {}
        for event in state.log:
            if event[0] == "product":
                option_steps = {}
            elif event[0] == "option":
                option_steps[event[2]] = event[1]
        product = catalogue.by_asin[chosen_asin] if chosen_asin is not None else None
        matched = option_matches(product, goal, chosen) if product is not None else {}
        for name, _value in goal.options:
            ok = product_ok and matched.get(name, False)
            atoms.append(
                VerifierAtom(
                    f"option:{name}", "sat" if ok else "unsat", option_steps.get(name), ["clicked_target_product"]
                )
            )
        price_ok = product is not None and product.price <= goal.price_upper
        atoms.append(
            VerifierAtom(
                "price_ok", "sat" if price_ok else "unsat", click_step if product else None, ["clicked_target_product"]
            )
        )
        buy_step = next((e[1] for e in state.log if e[0] == "buy"), None)
        atoms.append(
            VerifierAtom("bought", "sat" if buy_step is not None else "unsat", buy_step, [a.name for a in atoms])
        )
        return atoms

    # ---- splits ------------------------------------------------------------------------------------------------------

    @classmethod
    def task_split(cls, split: str, count: int | None = None, **env_kwargs: Any) -> list[dict[str, Any]]:
        """Seeded task rows: `"train"` (seeds from 0) and `"eval"` (seeds from 1_000_000), on the same catalogue.
        `num_products` and `catalogue_seed` among `env_kwargs` are copied into the rows."""
        cls(**env_kwargs)  # validate the arguments now
        settings = {k: env_kwargs[k] for k in ("num_products", "catalogue_seed") if k in env_kwargs}
        return cls.seeded_split(split, count, **settings)


# ---- the client of a real WebShop server -----------------------------------------------------------------------------

_VOID_TAGS = frozenset(
    ("area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr")
)
_INVISIBLE_TAGS = frozenset(("head", "script", "style", "title", "template", "noscript"))


@dataclass(frozen=True)
class _Click:
    method: str  # "GET" or "POST"
    url: str


@dataclass(frozen=True)
class _ServerPage:
    """A parsed page of the WebShop site."""

    url: str
    page: ShopPage
    targets: tuple[tuple[str, _Click], ...]  # clickable text -> request, in page order
    option_names: tuple[tuple[str, str], ...]  # option value -> option name (the radio group), on item pages
    instruction: str
    search_form: tuple[str, str] | None  # (form action URL, query field name) on the search page
    score: float | None


class _WebShopHtml(HTMLParser):
    """Reads a WebShop page the way its text environment does: visible texts in order (minus the instruction header),
    buttons and product links as clickables (by lowercased text), option radios by value, the search form, and the
    score of the done page."""

    def __init__(self, url: str):
        super().__init__(convert_charrefs=True)
        self.url = url
        self.stack: list[tuple[str, dict[str, str]]] = []
        self.segments: list[str] = []
        self.targets: dict[str, _Click] = {}
        self.instruction_parts: list[str] = []
        self.form: tuple[str, str] | None = None  # (method, action) of the enclosing form
        self.search_form: tuple[str, str] | None = None
        self.radios: dict[str, tuple[str, str, str]] = {}  # radio id -> (group name, value, data-url)
        self.option_names: dict[str, str] = {}  # option value (lowercased) -> group name
        self.score_texts: list[str] = []
        self._button_texts: list[str] | None = None
        self._button_click: _Click | None = None

    def _inside(self, predicate) -> bool:
        return any(predicate(tag, attrs) for tag, attrs in self.stack)

    def handle_starttag(self, tag: str, attrs_list: list[tuple[str, str | None]]) -> None:
        attrs = {k: (v or "") for k, v in attrs_list}
        if tag == "form":
            self.form = (attrs.get("method", "get").upper(), urllib.parse.urljoin(self.url, attrs.get("action", "")))
        elif tag == "input":
            if attrs.get("id") == "search_input" or attrs.get("name") == "search_query":
                if self.form is not None:
                    self.search_form = (self.form[1], attrs.get("name", "search_query"))
            elif attrs.get("type") == "radio":
                value = attrs.get("value", "")
                self.radios[attrs.get("id", "")] = (attrs.get("name", ""), value, attrs.get("data-url", ""))
                self.option_names.setdefault(value.lower(), attrs.get("name", "").lower())
        elif tag == "button":
            self._button_texts = []
            method, action = self.form if self.form is not None else ("GET", self.url)
            self._button_click = _Click(method, action)
        if tag not in _VOID_TAGS:
            self.stack.append((tag, attrs))

    def handle_startendtag(self, tag: str, attrs_list: list[tuple[str, str | None]]) -> None:
        self.handle_starttag(tag, attrs_list)
        if tag not in _VOID_TAGS:
            self.handle_endtag(tag)

    def handle_endtag(self, tag: str) -> None:
        if tag == "form":
            self.form = None
        if tag == "button" and self._button_texts is not None:
            text = " ".join(" ".join(self._button_texts).split()).lower()
            in_search_form = self.search_form is not None and self._button_click.url == self.search_form[0]
            if text and not in_search_form:  # the search form's button is search[...], not a click
                self.targets.setdefault(text, self._button_click)
            self._button_texts = None
        for i in range(len(self.stack) - 1, -1, -1):  # pop to the matching tag (tolerates unclosed tags)
            if self.stack[i][0] == tag:
                del self.stack[i:]
                break

    def handle_data(self, data: str) -> None:
        text = " ".join(data.split())
        if not text:
            return
        if self._inside(
            lambda t, a: t in _INVISIBLE_TAGS or "hidden" in a or "display:none" in a.get("style", "").replace(" ", "")
        ):
            return
        if self._inside(lambda t, a: a.get("id") == "reward"):
            self.score_texts.append(text)
        if self._inside(lambda t, a: a.get("id") == "instruction-text"):
            self.instruction_parts.append(text)
            return
        self.segments.append(text)
        if self._button_texts is not None:
            self._button_texts.append(text)
        link = next((a for t, a in reversed(self.stack) if t == "a" and "product-link" in a.get("class", "")), None)
        if link is not None:
            self.targets.setdefault(text.lower(), _Click("GET", urllib.parse.urljoin(self.url, link.get("href", ""))))
        label = next((a for t, a in reversed(self.stack) if t == "label"), None)
        if label is not None and label.get("for") in self.radios:
            _name, value, data_url = self.radios[label["for"]]
            self.targets.setdefault(value.lower(), _Click("GET", urllib.parse.urljoin(self.url, data_url)))


def _page_kind(url: str, has_search_form: bool) -> str:
    path = urllib.parse.urlparse(url).path
    for marker, kind in (
        ("/search_results/", "results"),
        ("/item_sub_page/", "sub"),
        ("/item_page/", "item"),
        ("/done/", "done"),
    ):
        if marker in path:
            return kind
    return "search" if has_search_form else "other"


def parse_webshop_html(url: str, text: str, chosen: dict[str, str] | None = None) -> _ServerPage:
    """Parse one page of the WebShop site into what the agent sees and can click.

    `chosen` are the option values selected so far on an item page: the site marks them only with JavaScript, so the
    client remembers its own clicks and announces them like WebShop's rich text mode ("You have clicked red.").
    """
    parser = _WebShopHtml(url)
    parser.feed(text)
    parser.close()
    kind = _page_kind(url, parser.search_form is not None)
    segments = list(parser.segments)
    if kind == "item" and chosen:
        lowered = [s.lower() for s in segments]
        values = sorted(chosen.values(), key=lambda v: lowered.index(v) if v in lowered else len(lowered))
        segments = [f"You have clicked {value}." for value in values] + segments
    instruction = " ".join(parser.instruction_parts)
    instruction = re.sub(r"^Instruction:\s*", "", instruction.split("Current Query:")[0]).strip()
    score = None
    if kind == "done":
        numbers_found = re.findall(r"-?\d+(?:\.\d+)?(?:e-?\d+)?", " ".join(parser.score_texts))
        score = float(numbers_found[-1]) if numbers_found else None
    targets = tuple(parser.targets.items())
    page = ShopPage(kind, tuple(segments), tuple(t for t, _ in targets))
    options = tuple(parser.option_names.items())
    return _ServerPage(url, page, targets, options, instruction, parser.search_form, score)


@register_env
class WebShopServer(AgentEnv):
    """A client for the original WebShop site (`web_agent_site/app.py`, run by the user), with WebShop-lite's
    observations and actions.

    Start the server in a WebShop checkout (`./run_dev.sh`, port 3000 by default), then
    `make_env("webshop", base_url="http://127.0.0.1:3000")`. A task row is `{"goal_index": i}`: the session
    `fixed_<i>` of the site, which plays its goal number `i` (WebShop's convention; verl-agent evaluates goals 0-499
    and trains on the rest). `{"session": name}` plays a named session instead (the site draws its goal at random).

    Each `search[...]` posts the search form and each `click[...]` follows the clicked button's form, the product
    link, or the option's URL, exactly as a browser would; the score is read from the done page. Snapshots copy the
    client's state (the current page), which is exact because the site keeps navigation state in its URLs.

    Args:
        base_url: Where the WebShop server listens.
        timeout: Seconds to wait for each request.
        session_prefix: Prepended to the session name (`<prefix>fixed_<i>`), to keep runs apart in the site's logs.
        reward: `"score"` (WebShop's score on buying) or `"binary"` (1.0 when the score is 1).
    """

    name = "webshop"
    task_keys = ("goal_index", "session")
    instructions = INSTRUCTIONS

    SPLIT_GOALS: ClassVar[dict[str, tuple[int, int]]] = {"eval": (0, 500), "train": (500, 1500)}

    def __init__(
        self,
        base_url: str = "http://127.0.0.1:3000",
        timeout: float = 30.0,
        session_prefix: str = "",
        reward: str = "score",
    ):
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise ValueError(f"`base_url` must be an http(s) URL such as 'http://127.0.0.1:3000', got {base_url!r}")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
            raise ValueError(f"`timeout` must be a positive number of seconds, got {timeout!r}")
        if not isinstance(session_prefix, str) or "/" in session_prefix or "_" in session_prefix:
            raise ValueError(f"`session_prefix` must be a string without '/' or '_', got {session_prefix!r}")
        self.base_url = base_url.rstrip("/")
        self.timeout = float(timeout)
        self.session_prefix = session_prefix
        self.reward = _check_reward(reward)
        self._page: _ServerPage | None = None
        self._chosen: tuple[tuple[str, str], ...] = ()

    # ---- HTTP ------------------------------------------------------------------------------------------------------

    def _fetch(self, click: _Click, form: dict[str, str] | None = None) -> tuple[str, str]:
        data = urllib.parse.urlencode(form or {}).encode() if click.method == "POST" else None
        request = urllib.request.Request(click.url, data=data, method=click.method)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:  # follows redirects
                return response.geturl(), response.read().decode("utf-8", errors="replace")
        except urllib.error.HTTPError as err:
            raise RuntimeError(f"The WebShop server answered {err.code} to {click.method} {click.url}") from err
        except (urllib.error.URLError, OSError) as err:
            raise ConnectionError(
                f"Cannot reach the WebShop server at {self.base_url} ({err}). Start it in a WebShop checkout "
                "(./run_dev.sh) or pass base_url= to make_env('webshop', ...)."
            ) from err

    def _load(self, click: _Click, form: dict[str, str] | None = None, chosen: dict[str, str] | None = None) -> None:
        url, text = self._fetch(click, form)
        self._page = parse_webshop_html(url, text, chosen)
        # Options live on the product's pages; leaving them (or opening another product) drops them, as on the site.
        kept = self._page.page.kind in ("item", "sub", "done")
        self._chosen = tuple(sorted((chosen or {}).items())) if kept else ()

    # ---- episode ---------------------------------------------------------------------------------------------------

    def reset(self, task: dict[str, Any]) -> str:
        """Open the task's session on the search page."""
        if task.get("session") is not None:
            session = str(task["session"])
        elif task.get("goal_index") is not None:
            session = f"{self.session_prefix}fixed_{check_int('goal_index', task['goal_index'], 0)}"
        else:
            raise ValueError(f"A webshop task needs a 'goal_index' (or a 'session'), got keys {sorted(task)}")
        self._load(_Click("GET", f"{self.base_url}/{urllib.parse.quote(session)}"))
        if self._page.page.kind != "search":
            raise RuntimeError(f"The WebShop server did not show a search page for session {session!r}")
        return self._page.page.render()

    def task_description(self) -> str:
        return f"Instruction: {self._require_page().instruction}"

    def step(self, action_text: str) -> tuple[str, float, bool, dict[str, Any]]:
        current = self._require_page()
        page = current.page
        if page.kind == "done":
            raise RuntimeError("The episode is over; call reset() first")
        parsed = parse_action(action_text)
        error = WebShopLite._check_action(parsed, page)
        if error is None and parsed[0] == "search" and current.search_form is None:
            error = "this page has no search form."
        if error is not None:
            info = {INFO_VALID: False, INFO_SUCCESS: False, "action": None, "page": page.kind}
            return f"Invalid action: {error}\n{page.render()}", 0.0, False, info
        kind, argument = parsed
        chosen = dict(self._chosen)
        if kind == "search":
            action, field_name = current.search_form
            self._load(_Click("POST", action), form={field_name: argument})
        else:
            option_names = dict(current.option_names)
            if page.kind == "item" and argument in option_names:
                chosen[option_names[argument]] = argument  # an option radio reloads the item page with it
            self._load(dict(current.targets)[argument], chosen=chosen)
        new_page = self._page.page
        info = {INFO_VALID: True, INFO_SUCCESS: False, "action": f"{kind}[{argument}]", "page": new_page.kind}
        reward, done = 0.0, new_page.kind == "done"
        if done:
            score = self._page.score
            if score is None:
                raise RuntimeError(f"The WebShop done page at {self._page.url} shows no score")
            success = score == 1.0
            reward = score if self.reward == "score" else float(success)
            info.update({INFO_SUCCESS: success, "score": score})
        return new_page.render(), reward, done, info

    def admissible_actions(self) -> list[str]:
        return self._require_page().page.admissible_actions()

    def _require_page(self) -> _ServerPage:
        if self._page is None:
            raise RuntimeError("Call reset(task) before using the environment")
        return self._page

    # ---- capabilities ----------------------------------------------------------------------------------------------

    def snapshot(self) -> tuple:
        return (self._page, self._chosen)

    def restore(self, snapshot: tuple) -> None:
        self._page, self._chosen = snapshot

    def state_key(self) -> tuple:
        """The current page's path and query (the site's navigation state) and the options chosen."""
        parts = urllib.parse.urlparse(self._require_page().url)
        return (parts.path, parts.query, self._chosen)

    @classmethod
    def task_split(cls, split: str, count: int | None = None, **env_kwargs: Any) -> list[dict[str, Any]]:
        """Goal indices of the site: `"eval"` goals 0-499 (WebShop's test goals) and `"train"` goals from 500 on
        (1000 by default; the site has more, ask for them with `count`)."""
        if split not in cls.SPLIT_GOALS:
            raise ValueError(f"Unknown webshop split {split!r}; choose one of {sorted(cls.SPLIT_GOALS)}")
        cls(**env_kwargs)
        start, stop = cls.SPLIT_GOALS[split]
        count = stop - start if count is None else check_int("count", count, 0)
        if split == "eval" and count > 500:
            raise ValueError("The eval split has WebShop's 500 test goals; ask for `count` <= 500")
        return [
            {"env": cls.name, "goal_index": i, "task_id": f"{cls.name}-{split}-{i}"}
            for i in range(start, start + count)
        ]
