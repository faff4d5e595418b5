"""TeleSales: a salesperson and a customer negotiate a vehicle purchase over the phone, in free text with moves.

A two-role dialogue environment LIKE the Vehicle TeleSales task of IB-RL (arXiv 2608.06735), whose data is not
public: this is our own seeded, offline game with a scripted rubric reward, not the paper's data or its judge.
Each task (`{"seed": s}`) samples a catalogue of 6 vehicles, which only the salesperson sees (with each one's list
price and lowest allowed price), and a customer profile, which only the customer sees (hard needs: seats and fuel,
a budget, and a hidden priority feature). The salesperson speaks first; the roles alternate. Moves:

- salesperson: `[Ask: seats, fuel, budget, priority]` (the customer's true answers are shown to the salesperson at
  once), `[Recommend: <model>]` (shows the model's specs to the customer), `[Offer: <model> at <price>]`;
- customer: `[Accept]` (buys the standing offer: the game ends with a sale), `[Reject]` (declines it),
  `[Counter: <price>]` (names a price for the offered model).

Rubric (our choice, see `envs/telesales/README.md`): a *good sale* is a sale of a vehicle meeting the customer's
seats and fuel needs at a price within its budget. With `margin = (price - lowest) / (list - lowest)`:
salesperson `0.5 + 0.5 * margin`, customer `0.6 + 0.2 * [priority feature] + 0.2 * (1 - margin)`; both 0 without a
good sale. Both lie in [0, 1].

Example (the same policy plays both roles, `opponent="self"`):
    >>> from trl_agents.envs.telesales import TeleSales
    >>> env = TeleSales()
    >>> print(env.reset({"seed": 0}).splitlines()[0])
    You are the salesperson; a customer is calling about a vehicle.
    >>> env.current_role()
    'salesperson'
    >>> _ = env.step("Hello! What do you need? [Ask: seats, fuel, budget, priority]")
    >>> env.current_role()
    'customer'
    >>> plan = env.optimal_plan()  # the scripted pair's dialogue from here
    >>> for message in plan:
    ...     _, reward, done, info = env.step(message)
    >>> done, info["success"], info["role"]
    (True, True, 'customer')
"""

from __future__ import annotations

import math
import numbers
import random
import re
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from .base import INFO_ROLE_REWARDS, INFO_SUCCESS, INFO_VALID, AgentEnv
from .dialogue import AlternatingRoles, Message
from .parsing import extract_answer
from .registry import register_env
from .validation import check_int

ROLES: tuple[str, ...] = ("salesperson", "customer")  # the salesperson always speaks first
SALESPERSON, CUSTOMER = 0, 1
ATTRIBUTES: tuple[str, ...] = ("seats", "fuel", "budget", "priority")  # what the salesperson may ask about
FUELS: tuple[str, ...] = ("petrol", "diesel", "hybrid", "electric")
FEATURES: tuple[str, ...] = ("safety", "comfort", "tech", "cargo", "economy")
SEAT_CHOICES: tuple[int, ...] = (2, 5, 5, 7)  # sampled uniformly: 5 seats is the common case
MODEL_NAMES: tuple[str, ...] = ("Aster", "Brio", "Corvo", "Dune", "Ember", "Fjord", "Gale", "Haven")
CATALOGUE_SIZE = 6
PRICE_STEP = 500  # every sampled price is a multiple of 500
SEAT_PREMIUM = {2: 0, 5: 3000, 7: 10000}  # sampled list price: 16000 + seat and fuel premiums + 0..8000
FUEL_PREMIUM = {"petrol": 0, "diesel": 2000, "hybrid": 5000, "electric": 9000}
FLOOR_FRACTION = 0.85  # sampled lowest price: 85% of list, rounded down to the price step
TOUGH_FRACTION = 0.92  # the tough scripted customer pays at most 92% of list
STYLES: tuple[str, ...] = ("easy", "tough")

# Rubric weights (our choice): salesperson 0.5 + 0.5 * margin; customer 0.6 + 0.2 * priority + 0.2 * (1 - margin).
SALE_BASE, SALE_MARGIN_WEIGHT = 0.5, 0.5
CUSTOMER_BASE, CUSTOMER_PRIORITY_WEIGHT, CUSTOMER_SAVING_WEIGHT = 0.6, 0.2, 0.2

SALESPERSON_MOVES = frozenset({"ask", "recommend", "offer", "talk"})
CUSTOMER_MOVES = frozenset({"accept", "reject", "counter", "talk"})
_MOVE_START = re.compile(r"\[\s*(ask|recommend|offer|accept|reject|counter)\b", re.IGNORECASE)
_MOVE_TAG = re.compile(r"\[\s*(ask|recommend|offer|accept|reject|counter)\s*:?([^\[\]]*)\]", re.IGNORECASE)
_PRICE = re.compile(r"\$?\s*(\d{1,3}(?:,\d{3})+|\d+)(?:\s*(?:dollars|usd))?", re.IGNORECASE)
_OFFER_BODY = re.compile(r"([a-z]+)\s*(?:at|for|@|,|:|-)?\s*(.*)", re.IGNORECASE)
_ATTRIBUTE_NAMES = {"seats": "seats", "seat": "seats", "fuel": "fuel", "budget": "budget", "priority": "priority",
                    "priorities": "priority"}

MOVE_FORMAT = {
    SALESPERSON: "[Ask: seats, fuel, budget, priority], [Recommend: <model>], [Offer: <model> at <price>] or talk",
    CUSTOMER: "[Accept], [Reject], [Counter: <price>] or talk",
}


# ---- instances -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Vehicle:
    """One catalogue entry (what the salesperson sees): prices are whole dollars, `floor_price <= list_price`."""

    name: str
    seats: int
    fuel: str
    features: tuple[str, ...]
    list_price: int
    floor_price: int

    def specs(self) -> str:
        """`"7 seats, hybrid, safety+cargo"`."""
        return f"{self.seats} seats, {self.fuel}, {'+'.join(self.features)}"


@dataclass(frozen=True)
class Customer:
    """The customer's private profile: hard needs (`min_seats`, `fuel`, `"any"` for no preference), the `budget`
    (whole dollars) and the hidden `priority` feature."""

    min_seats: int
    fuel: str
    budget: int
    priority: str

    def need_problem(self, vehicle: Vehicle) -> str | None:
        """Why `vehicle` breaks the seats or fuel need, or None when it meets both."""
        if vehicle.seats < self.min_seats:
            return f"it has {vehicle.seats} seats and I need at least {self.min_seats}"
        if self.fuel != "any" and vehicle.fuel != self.fuel:
            return f"it is {vehicle.fuel} and I want {self.fuel}"
        return None

    def answer(self, attribute: str) -> str:
        """The truthful answer to `[Ask: attribute]`."""
        return {
            "seats": f"at least {self.min_seats} seats",
            "fuel": "any fuel" if self.fuel == "any" else f"{self.fuel} only",
            "budget": f"budget {self.budget}",
            "priority": f"cares most about {self.priority}",
        }[attribute]

    def tell(self, attribute: str) -> str:
        """The same answer in the customer's words (the scripted customer's talk)."""
        return {
            "seats": f"I need at least {self.min_seats} seats.",
            "fuel": "Any fuel is fine." if self.fuel == "any" else f"It must be {self.fuel}.",
            "budget": f"My budget is {self.budget}.",
            "priority": f"I care most about {self.priority}.",
        }[attribute]


@dataclass(frozen=True)
class SalesInstance:
    """One call: the catalogue (salesperson's view) and the customer's profile (customer's view)."""

    catalogue: tuple[Vehicle, ...]
    customer: Customer
    source: str = "custom"

    def vehicle(self, name: str) -> Vehicle | None:
        """The catalogue entry called `name` (case-insensitive), or None."""
        return next((v for v in self.catalogue if v.name.lower() == name.lower()), None)

    def is_good_sale(self, name: str, price: int) -> bool:
        """A sale of `name` at `price` meets the customer's seats and fuel needs and its budget."""
        vehicle = self.vehicle(name)
        return vehicle is not None and self.customer.need_problem(vehicle) is None and price <= self.customer.budget

    def rubric(self, sale: tuple[str, int] | None) -> dict[str, float]:
        """Each role's reward for the outcome (`(model, price)` of the sale, or None): see the module docstring.

        >>> instance = SalesInstance((Vehicle("Aster", 7, "hybrid", ("cargo", "safety"), 30000, 26000),),
        ...                          Customer(7, "any", 29000, "safety"))
        >>> instance.rubric(("Aster", 29000))  # margin = (29000 - 26000) / (30000 - 26000) = 0.75
        {'salesperson': 0.875, 'customer': 0.85}
        >>> instance.rubric(("Aster", 30000))  # over the budget: no good sale
        {'salesperson': 0.0, 'customer': 0.0}
        """
        if sale is None or not self.is_good_sale(*sale):
            return {role: 0.0 for role in ROLES}
        vehicle, price = self.vehicle(sale[0]), sale[1]
        margin = margin_of(vehicle, price)
        has_priority = float(self.customer.priority in vehicle.features)
        salesperson = SALE_BASE + SALE_MARGIN_WEIGHT * margin  # 0.5 + 0.5 * margin
        customer = CUSTOMER_BASE + CUSTOMER_PRIORITY_WEIGHT * has_priority + CUSTOMER_SAVING_WEIGHT * (1 - margin)
        return {"salesperson": round(salesperson, 6), "customer": round(customer, 6)}  # no 0.8500000000000001


def margin_of(vehicle: Vehicle, price: int) -> float:
    """`(price - floor) / (list - floor)` clipped to [0, 1]; 1 when list == floor (no room to negotiate)."""
    room = vehicle.list_price - vehicle.floor_price
    if room <= 0:
        return 1.0
    return min(max((price - vehicle.floor_price) / room, 0.0), 1.0)


def _round_down(price: float) -> int:
    return math.floor(price / PRICE_STEP + 1e-9) * PRICE_STEP


def _list_price(seats: int, fuel: str, rng: random.Random) -> int:
    base = 16000 + SEAT_PREMIUM[seats] + FUEL_PREMIUM[fuel]
    return base + PRICE_STEP * rng.randrange(17)  # + 0..8000


def sample_instance(seed: int) -> SalesInstance:
    """A seeded call (`random.Random(f"telesales/{seed}")`): 6 vehicles and a profile that at least one vehicle
    fits (it meets the needs and its lowest price is within the budget), so a good sale always exists."""
    rng = random.Random(f"telesales/{seed}")
    min_seats = rng.choice(SEAT_CHOICES)
    fuel = rng.choice(FUELS + ("any", "any"))
    priority = rng.choice(FEATURES)
    names = sorted(rng.sample(MODEL_NAMES, CATALOGUE_SIZE))
    target = rng.randrange(CATALOGUE_SIZE)  # this vehicle is made to fit the customer
    catalogue = []
    for i, name in enumerate(names):
        seats, vehicle_fuel = rng.choice(SEAT_CHOICES), rng.choice(FUELS)
        if i == target:
            seats = max(seats, min_seats)
            vehicle_fuel = vehicle_fuel if fuel == "any" else fuel
        features = tuple(sorted(rng.sample(FEATURES, 2)))
        list_price = _list_price(seats, vehicle_fuel, rng)
        floor_price = _round_down(FLOOR_FRACTION * list_price)
        catalogue.append(Vehicle(name, seats, vehicle_fuel, features, list_price, floor_price))
    fit = catalogue[target]
    top = _round_down(1.1 * fit.list_price)
    budget = fit.floor_price + PRICE_STEP * rng.randint(0, (top - fit.floor_price) // PRICE_STEP)
    return SalesInstance(tuple(catalogue), Customer(min_seats, fuel, budget, priority), f"seed:{seed}")


# ---- moves ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Move:
    """A parsed message: `kind` is `ask`, `recommend`, `offer`, `accept`, `reject`, `counter` or `talk`; `talk` is
    the text without the move tag; `model`/`price`/`attributes` are set for the moves that carry them (a counter's
    `model` is filled in when it is applied: the offered model)."""

    kind: str
    talk: str
    model: str | None = None
    price: int | None = None
    attributes: tuple[str, ...] = ()


def format_move(move: Move) -> str:
    """The canonical move tag, empty for talk."""
    if move.kind == "ask":
        return f"[Ask: {', '.join(move.attributes)}]"
    if move.kind == "recommend":
        return f"[Recommend: {move.model}]"
    if move.kind == "offer":
        return f"[Offer: {move.model} at {move.price}]"
    if move.kind == "counter":
        return f"[Counter: {move.price}]"
    return {"accept": "[Accept]", "reject": "[Reject]"}.get(move.kind, "")


def _message(move: Move) -> str:
    return " ".join(part for part in (move.talk, format_move(move)) if part)


def _parse_price(text: str) -> int | None:
    match = _PRICE.fullmatch(text.strip())
    return None if match is None else int(match.group(1).replace(",", ""))


def parse_move(text: str, instance: SalesInstance) -> Move | str:
    """Parse one message; returns a `Move`, or a string saying what is wrong with it.

    The message is the answer region of the completion (`extract_answer`), whitespace collapsed. It holds at most
    one move tag, case-insensitive. Prices are whole dollars (`23500`, `$23,500`). Which role may use which move is
    checked by `step`, not here.

    Example:
        >>> instance = sample_instance(0)
        >>> parse_move("Great choice. [offer: aster for $27,000]", instance)
        Move(kind='offer', talk='Great choice.', model='Aster', price=27000, attributes=())
        >>> parse_move("[Ask: colour]", instance)
        "Unknown question 'colour'; ask about seats, fuel, budget or priority."
    """
    message = " ".join(extract_answer(text).split())
    if not message:
        return "The message is empty. Write a short message, optionally with one move."
    starts, tags = _MOVE_START.findall(message), list(_MOVE_TAG.finditer(message))
    if len(starts) > 1:
        return "A message may hold only one move tag."
    if len(starts) == 1 and len(tags) != 1:
        return "Malformed move tag: close it with ] and put nothing else in brackets."
    if not starts:
        return Move("talk", message)
    tag = tags[0]
    kind, body = tag.group(1).lower(), tag.group(2).strip()
    talk = " ".join((message[: tag.start()] + " " + message[tag.end() :]).split())
    if kind in ("accept", "reject"):
        return f"[{kind.capitalize()}] takes nothing inside the brackets." if body else Move(kind, talk)
    if kind == "ask":
        attributes: list[str] = []
        for word in (w for w in re.split(r"[\s,;/]+|\band\b", body) if w):
            attribute = _ATTRIBUTE_NAMES.get(word.lower())
            if attribute is None:
                return f"Unknown question {word!r}; ask about seats, fuel, budget or priority."
            if attribute not in attributes:
                attributes.append(attribute)
        if not attributes:
            return "Say what you ask about, e.g. [Ask: seats, fuel, budget, priority]."
        return Move("ask", talk, attributes=tuple(a for a in ATTRIBUTES if a in attributes))
    if kind == "counter":
        price = _parse_price(body)
        if price is None or price <= 0:
            return "Malformed counter: write [Counter: <price>] with a whole-dollar price, e.g. [Counter: 24000]."
        return Move("counter", talk, price=price)
    match = _OFFER_BODY.fullmatch(body)
    vehicle = None if match is None else instance.vehicle(match.group(1))
    if vehicle is None:
        names = ", ".join(v.name for v in instance.catalogue)
        return f"Unknown model {body.split(' ')[0] if body else ''!r}; the catalogue has {names}."
    if kind == "recommend":
        if match.group(2).strip():
            return "Malformed recommendation: write [Recommend: <model>] with the model name only."
        return Move("recommend", talk, model=vehicle.name)
    price = _parse_price(match.group(2))
    if price is None:
        return f"Malformed offer: write [Offer: {vehicle.name} at <price>] with a whole-dollar price."
    return Move("offer", talk, model=vehicle.name, price=price)


# ---- the scripted roles --------------------------------------------------------------------------------------------


def acceptable_price(instance: SalesInstance, vehicle: Vehicle, style: str) -> int:
    """The most the scripted customer pays for `vehicle`: its budget (`"easy"`), or also at most 92% of list,
    rounded down to 500 (`"tough"`)."""
    budget = instance.customer.budget
    return budget if style == "easy" else min(budget, _round_down(TOUGH_FRACTION * vehicle.list_price))


def scripted_customer(instance: SalesInstance, game: _Game, style: str = "easy") -> Move:
    """The scripted customer's message: reject an offer that breaks its seats/fuel needs, accept one at or below
    `acceptable_price`, counter once per model at that price, and reject a model it already countered. Without an
    offer it states what was asked (truthfully) or asks for one. Deterministic."""
    customer = instance.customer
    if game.offer is None:
        last = game.messages[-1].move if game.messages else None
        if last is not None and last.kind == "ask":
            return Move("talk", " ".join(customer.tell(a) for a in last.attributes))
        if last is not None and last.kind == "recommend":
            problem = customer.need_problem(instance.vehicle(last.model))
            return Move("talk", f"The {last.model} will not do: {problem}." if problem else "Sounds good. What price?")
        return Move("talk", "Hello, I am looking for a vehicle. What can you offer?")
    name, price = game.offer
    vehicle = instance.vehicle(name)
    problem = customer.need_problem(vehicle)
    if problem is not None:
        return Move("reject", f"No thanks: {problem}.")
    target = acceptable_price(instance, vehicle, style)
    if price <= target:
        return Move("accept", "Deal, I will take it.")
    if any(m.move.kind == "counter" and m.move.model == name for m in game.messages):
        return Move("reject", f"That is still too much for the {name}.")
    return Move("counter", f"That is too much for me. I can pay {target}.", price=target)


def scripted_salesperson(instance: SalesInstance, game: _Game) -> Move:
    """The scripted salesperson (honest: it uses only what the customer revealed): ask every question not yet
    asked, meet a counter at or above the lowest price, else offer the fitting vehicle (needs met, lowest price
    within budget, not rejected, no counter below its lowest price) with the customer's priority feature first,
    then the highest margin, at min(list, budget). Deterministic."""
    missing = tuple(a for a in ATTRIBUTES if a not in game.asked)
    if missing:
        return Move("ask", "Happy to help! What do you need?", attributes=missing)
    customer = instance.customer
    excluded = set(game.rejected)
    for m in game.messages:
        if m.move.kind == "counter" and m.move.price < instance.vehicle(m.move.model).floor_price:
            excluded.add(m.move.model)
    if game.counter is not None and game.counter[0] not in excluded:
        name, price = game.counter
        price = min(price, instance.vehicle(name).list_price)  # a counter above list is met at list
        return Move("offer", "Alright, you have a deal at that price.", model=name, price=price)
    candidates = [
        v for v in instance.catalogue
        if customer.need_problem(v) is None and v.floor_price <= customer.budget and v.name not in excluded
    ]
    if not candidates:
        return Move("talk", "Sorry, nothing in stock fits your needs.")
    best = min(
        candidates,
        key=lambda v: (customer.priority not in v.features, -margin_of(v, min(v.list_price, customer.budget)), v.name),
    )
    price = min(best.list_price, customer.budget)
    return Move("offer", f"The {best.name} fits you well.", model=best.name, price=price)


# ---- the environment -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Line(Message):
    roles: ClassVar[tuple[str, ...]] = ROLES

    def tag(self) -> str:
        return format_move(self.move)


@dataclass(frozen=True)
class _Game:
    """Everything that changes during a call (immutable, so a snapshot is a reference)."""

    messages: tuple[_Line, ...] = ()
    asked: frozenset[str] = frozenset()
    shown: tuple[str, ...] = ()  # models recommended or offered, in order (their specs are shown to the customer)
    offer: tuple[str, int] | None = None  # the standing offer (model, price)
    counter: tuple[str, int] | None = None  # the customer's counter to the standing offer
    rejected: frozenset[str] = frozenset()
    outcome: str | None = None  # None while running, then "sale" or "no_sale"
    sale: tuple[str, int] | None = None

    @property
    def turn(self) -> int:
        return len(self.messages)


@register_env
class TeleSales(AlternatingRoles, AgentEnv):
    """A vehicle telesales call between `salesperson` and `customer` (LIKE IB-RL's Vehicle TeleSales; our data).

    A task row is `{"seed": s}` (our sampler) or a hand-written `{"catalogue": [{"name", "seats", "fuel",
    "features", "list_price", "floor_price"}, ...], "customer": {"min_seats", "fuel", "budget", "priority"}}`. The
    salesperson always speaks first.

    Args:
        opponent: `"self"`: the policy plays both roles in turn (`current_role()` alternates, each observation is
            the acting role's private view). `"scripted"`: a deterministic rule-based partner (`scripted_customer`
            or `scripted_salesperson`) plays the other role inside `step()`.
        agent_role: The policy's role against the scripted partner (default `"salesperson"`); only with
            `opponent="scripted"`.
        customer_style: The scripted customer's style (our choice): `"easy"` accepts any fitting offer within its
            budget; `"tough"` also wants at least 8% off list and counters once. It plays the customer against a
            policy salesperson and in `optimal_plan()`; pick the other style for a held-out evaluation counterpart.
        max_turns: Messages (both roles, talk included) before the call ends without a sale (our choice: 10).
        self_play_reward: With `opponent="self"`, the single reward of the final step (our choice): `"mean"` of both
            roles' rubric rewards, or `"acting"` (the role that took the last step). `info["role_rewards"]` always
            holds both.
        max_message_chars: Talk longer than this is cut in the dialogue both roles see (moves are never cut).
    """

    name = "telesales"
    roles = ROLES
    task_keys = ("seed", "catalogue")
    instructions = (
        "A customer phones a car dealer. One player is the salesperson, the other the customer; each sees only its "
        "own side. Each turn, write one short message with at most one move.\n"
        "Salesperson moves: [Ask: seats, fuel, budget, priority] (the customer's true answers are shown to you), "
        "[Recommend: <model>], [Offer: <model> at <price>] (between the model's lowest and list price).\n"
        "Customer moves: [Accept] (buy the standing offer), [Reject], [Counter: <price>].\n"
        "A sale scores only if the car has enough seats, the right fuel and fits the budget. The salesperson "
        "scores more the higher the price; the customer more for its priority feature and a lower price."
    )

    SPLIT_SEED_START: ClassVar[dict[str, int]] = {"train": 0, "validation": 1_000_000, "eval": 1_000_000,
                                                 "test": 2_000_000}
    SPLIT_DEFAULT_COUNT: ClassVar[dict[str, int]] = {"train": 1000, "validation": 200, "eval": 200, "test": 200}

    def __init__(
        self,
        opponent: str = "self",
        agent_role: str | None = None,
        customer_style: str = "easy",
        max_turns: int = 10,
        self_play_reward: str = "mean",
        max_message_chars: int = 200,
    ):
        if opponent not in ("self", "scripted"):
            raise ValueError(f"`opponent` must be 'self' or 'scripted', got {opponent!r}")
        if agent_role is not None and opponent != "scripted":
            raise ValueError("`agent_role` only applies with opponent='scripted' (self-play plays both roles)")
        agent_role = "salesperson" if agent_role is None else agent_role
        if agent_role not in ROLES:
            raise ValueError(f"`agent_role` must be one of {ROLES}, got {agent_role!r}")
        if customer_style not in STYLES:
            raise ValueError(f"`customer_style` must be one of {STYLES}, got {customer_style!r}")
        if self_play_reward not in ("mean", "acting"):
            raise ValueError(f"`self_play_reward` must be 'mean' or 'acting', got {self_play_reward!r}")
        self.opponent = opponent
        self.agent_role = agent_role
        self.customer_style = customer_style
        self.max_turns = check_int("max_turns", max_turns, 2)  # an offer and its acceptance
        self.self_play_reward = self_play_reward
        self.max_message_chars = check_int("max_message_chars", max_message_chars, 0)
        self._instance: SalesInstance | None = None
        self._game = _Game()

    # ---- episode ---------------------------------------------------------------------------------------------------

    def reset(self, task: dict[str, Any]) -> str:
        """Load the task's call and return the first observation (from the view of the role to act)."""
        self._instance = instance_from_task(task)
        self._game = _Game()
        if self.opponent == "scripted" and self._agent_index() != SALESPERSON:
            self._game = self._partner_turn(self._game)  # the scripted salesperson opens
        return self.render()

    def step(self, action_text: str) -> tuple[str, float, bool, dict[str, Any]]:
        instance = self._require_instance()
        if self._game.outcome is not None:
            raise RuntimeError("The call is over; call reset() first")
        acting = self._acting_index()
        move = parse_move(action_text, instance)
        if isinstance(move, Move):
            move = self._check_move(acting, move)
        if not isinstance(move, Move):  # nothing changes: the same role writes again
            return self._invalid_message(acting, move)
        game = self._apply(self._game, acting, move)
        info: dict[str, Any] = {
            INFO_VALID: True,
            "role": ROLES[acting],
            "move": move.kind,
            "action": game.messages[-1].text(self.max_message_chars),  # the engine's history shows this
        }
        if self.opponent == "scripted" and game.outcome is None:
            game = self._partner_turn(game)
            info["partner_message"] = game.messages[-1].line(self.max_message_chars)
        self._game = game
        info[INFO_SUCCESS] = game.sale is not None and instance.is_good_sale(*game.sale)
        info["turn"] = game.turn
        if game.outcome is None:
            return self.render(), 0.0, False, info
        role_rewards = instance.rubric(game.sale)
        info[INFO_ROLE_REWARDS] = role_rewards
        info["sale"] = None if game.sale is None else {"model": game.sale[0], "price": game.sale[1]}
        last = game.messages[-1].role_index  # the scripted partner may have taken the last step
        return self.render(), self._final_reward(role_rewards, last), True, info

    def _check_move(self, acting: int, move: Move) -> Move | str:
        """Role and state rules: which role may make the move now (a string says why not)."""
        game, instance = self._game, self._instance
        if acting == SALESPERSON and move.kind not in SALESPERSON_MOVES:
            return f"Only the customer can {move.kind}; you are the salesperson: {MOVE_FORMAT[SALESPERSON]}."
        if acting == CUSTOMER and move.kind not in CUSTOMER_MOVES:
            return f"Only the salesperson can {move.kind}; you are the customer: {MOVE_FORMAT[CUSTOMER]}."
        if move.kind == "offer":
            vehicle = instance.vehicle(move.model)
            if not vehicle.floor_price <= move.price <= vehicle.list_price:
                return (
                    f"The {vehicle.name} can be offered between {vehicle.floor_price} (lowest) and "
                    f"{vehicle.list_price} (list); you offered {move.price}."
                )
        if move.kind in ("accept", "reject", "counter"):
            if game.offer is None:
                return f"There is no offer to {move.kind}; wait for the salesperson's [Offer: ...]."
            if move.kind == "counter":
                return replace(move, model=game.offer[0])
        return move

    def _apply(self, game: _Game, role_index: int, move: Move) -> _Game:
        messages = game.messages + (_Line(role_index, move),)
        changes: dict[str, Any] = {"messages": messages}
        if move.kind == "ask":
            changes["asked"] = game.asked | set(move.attributes)
        elif move.kind in ("recommend", "offer") and move.model not in game.shown:
            changes["shown"] = game.shown + (move.model,)
        if move.kind == "offer":
            changes.update(offer=(move.model, move.price), counter=None)
        elif move.kind == "counter":
            changes["counter"] = (move.model, move.price)
        elif move.kind == "reject":
            changes.update(offer=None, counter=None, rejected=game.rejected | {game.offer[0]})
        elif move.kind == "accept":
            changes.update(outcome="sale", sale=game.offer)
        if "outcome" not in changes and len(messages) >= self.max_turns:
            changes["outcome"] = "no_sale"
        return replace(game, **changes)

    def _scripted_move(self, game: _Game, role_index: int) -> Move:
        if role_index == SALESPERSON:
            return scripted_salesperson(self._instance, game)
        move = scripted_customer(self._instance, game, self.customer_style)
        return replace(move, model=game.offer[0]) if move.kind == "counter" else move

    def _partner_turn(self, game: _Game) -> _Game:
        partner = 1 - self._agent_index()
        return self._apply(game, partner, self._scripted_move(game, partner))

    # ---- roles and rewards -----------------------------------------------------------------------------------------

    def role_rewards(self) -> dict[str, float]:
        """Each role's rubric reward for the call so far (0 for both until a good sale)."""
        return self._require_instance().rubric(self._game.sale)

    # ---- observations ----------------------------------------------------------------------------------------------

    def render(self, role: str | None = None) -> str:
        """The private view of `role` (default: the role to act): the salesperson sees the catalogue with lowest
        prices and what the customer revealed; the customer sees its profile and the models shown to it."""
        instance, game = self._require_instance(), self._game
        index = ROLES.index(role) if role is not None else self._acting_index()
        if self.opponent == "scripted" and role is None:
            index = self._agent_index()
        if index == SALESPERSON:
            lines = ["You are the salesperson; a customer is calling about a vehicle.", "Catalogue (list / lowest):"]
            lines += [f"  {v.name}: {v.specs()}, {v.list_price} / {v.floor_price}" for v in instance.catalogue]
            known = [instance.customer.answer(a) for a in ATTRIBUTES if a in game.asked]
            lines.append("Customer: " + ("; ".join(known) if known else "nothing known yet (use [Ask: ...])") + ".")
        else:
            c = instance.customer
            fuel = "any fuel" if c.fuel == "any" else f"{c.fuel} fuel"
            lines = [
                "You are the customer, calling a car dealer.",
                (
                    f"You need at least {c.min_seats} seats and {fuel}; budget {c.budget}; "
                    f"you care most about {c.priority}."
                ),
            ]
            for name in game.shown:
                v = instance.vehicle(name)
                lines.append(f"  {v.name}: {v.specs()}, list {v.list_price}")
        lines.append("Dialogue so far:")
        lines += [f"  {m.line(self.max_message_chars)}" for m in game.messages] or ["  (nothing yet)"]
        if game.outcome == "sale":
            rewards = instance.rubric(game.sale)
            lines.append(f"Sold: the {game.sale[0]} at {game.sale[1]} (your score {rewards[ROLES[index]]:.2f}).")
        elif game.outcome == "no_sale":
            lines.append("The call ended without a sale: both score 0.")
        else:
            if game.offer is None:
                lines.append("No offer on the table.")
            else:
                name, price = game.offer
                text = f"Standing offer: {name} at {price}"
                if game.counter is not None:
                    text += f"; the customer countered {game.counter[1]}"
                if index == CUSTOMER:
                    problem = instance.customer.need_problem(instance.vehicle(name))
                    fit = problem or ("over your budget" if price > instance.customer.budget else "fits you")
                    text += f" ({fit}). [Accept], [Reject] or [Counter: <price>]"
                lines.append(text + ".")
            lines.append(f"Messages left: {self.max_turns - game.turn}. Your turn, {ROLES[index]}.")
        return "\n".join(lines)

    def _require_instance(self) -> SalesInstance:
        if self._instance is None:
            raise RuntimeError("Call reset(task) before using the environment")
        return self._instance

    @property
    def instance(self) -> SalesInstance:
        """The current call (catalogue and customer profile)."""
        return self._require_instance()

    # ---- capabilities ----------------------------------------------------------------------------------------------

    def snapshot(self) -> tuple[SalesInstance | None, _Game]:
        return (self._instance, self._game)

    def restore(self, snapshot: tuple[SalesInstance | None, _Game]) -> None:
        self._instance, self._game = snapshot

    def state_key(self) -> tuple:
        """The call and every move so far without the talk (our choice: same moves, different wording, same key)."""
        instance, game = self._require_instance(), self._game
        moves = tuple((m.role_index, m.move.kind, m.move.model, m.move.price, m.move.attributes) for m in game.messages)
        return (instance.catalogue, instance.customer, moves, game.outcome)

    def privileged_context(self) -> str:
        """The other role's private side: for the salesperson the customer's profile (and, against the scripted
        customer, the most it pays); for the customer the dealer's lowest prices."""
        instance = self._require_instance()
        index = self._agent_index() if self.opponent == "scripted" else self._acting_index()
        if index == CUSTOMER:
            prices = ", ".join(f"{v.name} {v.floor_price}" for v in instance.catalogue)
            return f"The dealer's lowest prices: {prices}."
        c = instance.customer
        text = (
            f"The customer needs at least {c.min_seats} seats, "
            f"{'any fuel' if c.fuel == 'any' else c.fuel + ' fuel'}, budget {c.budget}, and cares most about "
            f"{c.priority}."
        )
        if self.opponent == "scripted":
            most = ", ".join(
                f"{v.name} {acceptable_price(instance, v, self.customer_style)}"
                for v in instance.catalogue
                if c.need_problem(v) is None
            )
            text += f" The most it pays for a fitting model: {most or 'none fits'}."
        return text

    def optimal_plan(self) -> list[str] | None:
        """The scripted pair's dialogue from here (the policy's messages only; both roles' in self-play, the
        customer played in `customer_style`), or None when it does not end in a good sale. It is an honest
        demonstration (the salesperson asks before offering), not the shortest one: good for an SFT warm start."""
        instance, game = self._require_instance(), self._game
        if game.outcome is not None:
            return [] if game.sale is not None and instance.is_good_sale(*game.sale) else None
        plan = []
        while game.outcome is None:
            acting = game.turn % len(ROLES)
            move = self._scripted_move(game, acting)
            if self.opponent == "self" or acting == self._agent_index():
                plan.append(_message(move))
            game = self._apply(game, acting, move)
        return plan if game.sale is not None and instance.is_good_sale(*game.sale) else None

    # ---- splits ----------------------------------------------------------------------------------------------------

    @classmethod
    def task_split(cls, split: str, count: int | None = None, **env_kwargs: Any) -> list[dict[str, Any]]:
        """Seeded rows `{"env": "telesales", "seed": s, "task_id"}`: `train` from seed 0, `validation` (alias
        `eval`) from 1,000,000, `test` from 2,000,000 (disjoint while `count` <= 1,000,000)."""
        cls(**env_kwargs)  # validate the environment arguments now
        return cls.seeded_split(split, count)


# ---- task rows -----------------------------------------------------------------------------------------------------


def instance_from_task(task: dict[str, Any]) -> SalesInstance:
    """The call a task row names: a hand-written `catalogue` + `customer`, else `seed` (our sampler)."""
    if task.get("catalogue") is not None:
        return _custom_instance(task["catalogue"], task.get("customer"))
    if task.get("seed") is not None:
        seed = task["seed"]
        if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
            raise ValueError(f"Task field 'seed' must be an integer, got {seed!r}")
        return sample_instance(int(seed))
    raise ValueError(f"A TeleSales task needs a 'seed' or a 'catalogue' with a 'customer'; got keys {sorted(task)}")


def _field(row: Any, key: str, where: str) -> Any:
    if not isinstance(row, dict) or key not in row:
        raise ValueError(f"Task field {where!r} must be a dict with {key!r}, got {row!r}"[:200])
    return row[key]


def _positive(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
        raise ValueError(f"Task field {where!r} must be a positive integer, got {value!r}")
    return int(value)


def _custom_instance(catalogue: Any, customer: Any) -> SalesInstance:
    if not isinstance(catalogue, (list, tuple)) or not catalogue:
        raise ValueError(f"Task field 'catalogue' must be a non-empty list of vehicles, got {catalogue!r}"[:200])
    vehicles = []
    for i, row in enumerate(catalogue):
        where = f"catalogue[{i}]"
        name = _field(row, "name", where)
        if not isinstance(name, str) or not name.isalpha():
            raise ValueError(f"Task field '{where}.name' must be one word of letters, got {name!r}")
        fuel, features = _field(row, "fuel", where), _field(row, "features", where)
        if fuel not in FUELS:
            raise ValueError(f"Task field '{where}.fuel' must be one of {FUELS}, got {fuel!r}")
        if not isinstance(features, (list, tuple)) or any(f not in FEATURES for f in features):
            raise ValueError(f"Task field '{where}.features' must list features from {FEATURES}, got {features!r}")
        list_price = _positive(_field(row, "list_price", where), f"{where}.list_price")
        floor_price = _positive(_field(row, "floor_price", where), f"{where}.floor_price")
        if floor_price > list_price:
            raise ValueError(f"Task field '{where}.floor_price' must be <= its list_price, got {floor_price}")
        seats = _positive(_field(row, "seats", where), f"{where}.seats")
        vehicles.append(Vehicle(name, seats, fuel, tuple(features), list_price, floor_price))
    if len({v.name.lower() for v in vehicles}) != len(vehicles):
        raise ValueError("Task field 'catalogue' must not repeat a model name")
    fuel, priority = _field(customer, "fuel", "customer"), _field(customer, "priority", "customer")
    if fuel not in FUELS + ("any",):
        raise ValueError(f"Task field 'customer.fuel' must be 'any' or one of {FUELS}, got {fuel!r}")
    if priority not in FEATURES:
        raise ValueError(f"Task field 'customer.priority' must be one of {FEATURES}, got {priority!r}")
    profile = Customer(
        _positive(_field(customer, "min_seats", "customer"), "customer.min_seats"),
        fuel,
        _positive(_field(customer, "budget", "customer"), "customer.budget"),
        priority,
    )
    return SalesInstance(tuple(vehicles), profile, "custom")
