"""Deal or No Deal: two roles split a pool of books, hats and balls by free-text negotiation (Lewis et al., 2017).

Each role privately values the three item types (values are whole numbers; the whole pool is worth 10 to each
role). Turns alternate; each turn the acting role writes one message, which may carry a structured move:
`[Propose: book=1, hat=2, ball=0]` (the items *the writer keeps*; the other role gets the rest) or `[Accept]` (take
the other role's latest proposal, which ends the game with a deal). Without a deal after `max_turns` messages both
get nothing. Instances come from OpenSpiel's `bargaining` game (its 1000 built-in instances, `{"instance": k}`) or
from our seeded sampler with the same generation scheme (`{"seed": s}`); see `envs/dealnodeal/README.md`.

Example (the same policy plays both roles, `opponent="self"`):
    >>> from trl_agents.envs.dealnodeal import DealOrNoDeal
    >>> env = DealOrNoDeal()
    >>> task = {"pool": [1, 2, 3], "values": {"alice": [8, 1, 0], "bob": [4, 0, 2]}}
    >>> print(env.reset(task).splitlines()[1])
    Pool: book=1, hat=2, ball=3
    >>> env.current_role()
    'alice'
    >>> _ = env.step("I need the book. [Propose: book=1, hat=2, ball=0]")
    >>> env.current_role()
    'bob'
    >>> _, reward, done, info = env.step("Fine, I take the balls. [Accept]")
    >>> done, info["success"], info["role_rewards"]
    (True, True, {'alice': 1.0, 'bob': 0.6})
"""

from __future__ import annotations

import itertools
import math
import numbers
import random
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, ClassVar

from .base import INFO_ROLE_REWARDS, INFO_SUCCESS, INFO_VALID, AgentEnv
from .dialogue import AlternatingRoles, Message
from .parsing import extract_answer
from .registry import register_env
from .validation import check_int

ITEMS: tuple[str, ...] = ("book", "hat", "ball")
ROLES: tuple[str, ...] = ("alice", "bob")  # alice is OpenSpiel's player 0 and always speaks first
Split = tuple[int, int, int]  # counts of (book, hat, ball) one role keeps

# OpenSpiel's bargaining instance scheme (bargaining_instance_generator.cc): 1-7 of each item, 5-7 items in all,
# per-item values 0-10 with each role's whole pool worth exactly 10, every item valuable to at least one role and
# some item valuable to both.
POOL_MIN_ITEMS, POOL_MAX_ITEMS, TOTAL_VALUE = 5, 7, 10
NUM_OPENSPIEL_INSTANCES = 1000

_ITEM_NAMES = {"book": 0, "books": 0, "hat": 1, "hats": 1, "ball": 2, "balls": 2, "basketball": 2, "basketballs": 2}
_MOVE_START = re.compile(r"\[\s*(propose|accept)\b", re.IGNORECASE)
_PROPOSE = re.compile(r"\[\s*propose\s*:?([^\[\]]*)\]", re.IGNORECASE)
_ACCEPT = re.compile(r"\[\s*accept\s*\]", re.IGNORECASE)
_ITEM_COUNT = re.compile(r"([a-z]+)\s*[=:]\s*(\d+)", re.IGNORECASE)
_SEPARATORS = re.compile(r"[\s,;]*")

MOVE_FORMAT = "[Propose: book=X, hat=Y, ball=Z] (the items you keep), [Accept], or plain talk"


# ---- instances -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DealInstance:
    """One negotiation: the pool and each role's private per-item values.

    Args:
        pool: Count of each item type, in the order of `ITEMS` (book, hat, ball).
        values: Per-item values of each role, in the order of `ROLES` (alice, bob).
        source: Where it came from (`"openspiel:17"`, `"seed:5"` or `"custom"`).
    """

    pool: Split
    values: tuple[Split, Split]
    source: str = "custom"

    def utility(self, role_index: int, split: Split) -> int:
        """What `split` (the items this role keeps) is worth to the role."""
        return sum(count * value for count, value in zip(split, self.values[role_index]))

    def max_utility(self, role_index: int) -> int:
        """What the whole pool is worth to the role (10 for OpenSpiel and sampled instances)."""
        return self.utility(role_index, self.pool)

    def complement(self, split: Split) -> Split:
        """The items the other role gets when one role keeps `split`."""
        return tuple(total - kept for total, kept in zip(self.pool, split))  # type: ignore[return-value]

    def splits(self) -> list[Split]:
        """Every way of choosing the items one role keeps (0..count of each type), in lexicographic order."""
        return [tuple(s) for s in itertools.product(*(range(count + 1) for count in self.pool))]  # type: ignore[misc]


@lru_cache(maxsize=1)
def _openspiel_instances() -> tuple[DealInstance, ...]:
    try:
        import pyspiel
    except ImportError as err:
        raise ImportError(
            'Deal-or-No-Deal task rows with an "instance" need OpenSpiel\'s built-in instances: '
            'pip install "trl-agents[envs]" (or open-spiel), or use {"seed": s} rows from our sampler.'
        ) from err
    game = pyspiel.load_game("bargaining")
    root = game.new_initial_state()
    instances = []
    for index in range(NUM_OPENSPIEL_INSTANCES):  # the chance outcome k of the root deals instance k
        instance = root.child(index).instance()
        values = tuple(tuple(int(v) for v in row) for row in instance.values)
        instances.append(DealInstance(tuple(int(c) for c in instance.pool), values, f"openspiel:{index}"))
    return tuple(instances)


def openspiel_instance(index: int) -> DealInstance:
    """Instance `index` (0-999) of OpenSpiel's `bargaining` game (its built-in list, Apache-2.0)."""
    return _openspiel_instances()[index]


@lru_cache(maxsize=1)
def _valid_instances() -> tuple[tuple[Split, Split, Split], ...]:
    """Every (pool, alice values, bob values) the OpenSpiel scheme accepts, in a fixed order (5,793 of them).

    OpenSpiel draws pools and values uniformly and rejects invalid draws, so what it accepts is uniform over this
    set; choosing uniformly from it reproduces the scheme exactly.
    """
    found = []
    for pool in itertools.product(range(1, POOL_MAX_ITEMS + 1), repeat=len(ITEMS)):
        if not POOL_MIN_ITEMS <= sum(pool) <= POOL_MAX_ITEMS:
            continue
        vectors = [
            v
            for v in itertools.product(range(TOTAL_VALUE + 1), repeat=len(ITEMS))
            if sum(c * x for c, x in zip(pool, v)) == TOTAL_VALUE
        ]
        for first, second in itertools.product(vectors, repeat=2):
            valued_by_someone = all(a or b for a, b in zip(first, second))
            valued_by_both = any(a and b for a, b in zip(first, second))
            if valued_by_someone and valued_by_both:
                found.append((pool, first, second))
    return tuple(found)


def sample_instance(seed: int) -> DealInstance:
    """A seeded instance drawn uniformly from the OpenSpiel scheme (works without OpenSpiel installed)."""
    pool, first, second = random.Random(f"dealnodeal/{seed}").choice(_valid_instances())
    return DealInstance(pool, (first, second), f"seed:{seed}")


# ---- moves ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Move:
    """A parsed message: `kind` is `"propose"`, `"accept"` or `"talk"`; `split` is set for proposals; `talk` is the
    message text without the move tag."""

    kind: str
    talk: str
    split: Split | None = None


def format_split(split: Split) -> str:
    """`(1, 2, 0)` -> `"book=1, hat=2, ball=0"`."""
    return ", ".join(f"{item}={count}" for item, count in zip(ITEMS, split))


def format_move(move: Move) -> str:
    """The canonical move tag (`[Propose: ...]`, `[Accept]`), empty for talk."""
    if move.kind == "propose":
        return f"[Propose: {format_split(move.split)}]"
    return "[Accept]" if move.kind == "accept" else ""


def parse_move(text: str, pool: Split) -> Move | str:
    """Parse one message; returns a `Move`, or a string saying what is wrong with it.

    The message is the answer region of the completion (`extract_answer`: the last `<action>`/``` block, else the
    text without `<think>` blocks). It holds at most one move tag, case-insensitive: `[Propose: book=1, hat=2,
    ball=0]` names every item type exactly once (`books`/`hats`/`balls`/`basketball` and `:` instead of `=` are
    accepted) with counts the pool has; `[Accept]` has nothing inside. Any other text is talk.

    Example:
        >>> parse_move("ok [propose: hats=2, book=1, ball=0]", (1, 2, 3))
        Move(kind='propose', talk='ok', split=(1, 2, 0))
        >>> parse_move("[Propose: book=2, hat=0, ball=0]", (1, 2, 3))
        'The proposal keeps 2 books but the pool has only 1.'
    """
    message = " ".join(extract_answer(text).split())
    if not message:
        return f"The message is empty. Write a message with {MOVE_FORMAT}."
    starts = _MOVE_START.findall(message)
    proposals, accepts = list(_PROPOSE.finditer(message)), list(_ACCEPT.finditer(message))
    if len(starts) > 1:
        return "A message may hold only one move: one [Propose: ...] or one [Accept]."
    if len(starts) == 1 and len(proposals) + len(accepts) != 1:
        return f"Malformed move tag. Write exactly {MOVE_FORMAT}."
    if not starts:
        return Move("talk", message)
    match = (proposals or accepts)[0]
    talk = " ".join((message[: match.start()] + " " + message[match.end() :]).split())
    if accepts:
        return Move("accept", talk)
    body = match.group(1)
    counts: dict[int, int] = {}
    for name, number in _ITEM_COUNT.findall(body):
        index = _ITEM_NAMES.get(name.lower())
        if index is None:
            return f"Unknown item {name!r} in the proposal; the items are book, hat and ball."
        if index in counts:
            return f"The proposal names {ITEMS[index]} twice; name each item exactly once."
        counts[index] = int(number)
    leftover = _SEPARATORS.sub("", _ITEM_COUNT.sub("", body))
    if leftover or len(counts) != len(ITEMS):
        return (
            "Malformed proposal: name every item exactly once with the count you keep, "
            "e.g. [Propose: book=1, hat=0, ball=2]."
        )
    split = tuple(counts[i] for i in range(len(ITEMS)))
    for item, kept, available in zip(ITEMS, split, pool):
        if kept > available:
            return f"The proposal keeps {kept} {item}s but the pool has only {available}."
    return Move("propose", talk, split)  # type: ignore[arg-type]


# ---- the scripted partner ------------------------------------------------------------------------------------------


def _demand(instance: DealInstance, role_index: int, threshold: float) -> int:
    """The least utility the scripted partner accepts: `threshold` of its whole-pool value, rounded up."""
    return math.ceil(threshold * instance.max_utility(role_index) - 1e-9)


@lru_cache(maxsize=4096)
def scripted_proposal(instance: DealInstance, role_index: int, threshold: float) -> Split:
    """The scripted partner's offer: among the splits worth at least its demand to it, the one that keeps the fewest
    items (it concedes what it values least), then the most valuable to it, then the first in order."""
    demand = _demand(instance, role_index, threshold)
    candidates = [s for s in instance.splits() if instance.utility(role_index, s) >= demand]
    return min(candidates, key=lambda s: (sum(s), -instance.utility(role_index, s), s))


def scripted_reply(
    instance: DealInstance, role_index: int, proposal: tuple[int, Split] | None, threshold: float
) -> Move:
    """The scripted partner's message: accept the other role's standing proposal when it leaves the partner at least
    `threshold` of its whole-pool value, otherwise (re)state its own offer. Deterministic."""
    if proposal is not None and proposal[0] != role_index:
        offered = instance.complement(proposal[1])
        if instance.utility(role_index, offered) >= _demand(instance, role_index, threshold):
            return Move("accept", "That works for me.")
    split = scripted_proposal(instance, role_index, threshold)
    return Move("propose", f"I would like to keep {format_split(split)}; you get the rest.", split)


# ---- the environment -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Message(Message):
    roles: ClassVar[tuple[str, ...]] = ROLES

    def tag(self) -> str:
        return format_move(self.move)


@dataclass(frozen=True)
class _Game:
    """Everything that changes during an episode (immutable, so a snapshot is just a reference)."""

    messages: tuple[_Message, ...] = ()
    proposal: tuple[int, Split] | None = None  # (role index, split that role keeps) of the latest proposal
    outcome: str | None = None  # None while running, then "deal" or "no_deal"
    deal: tuple[int, Split] | None = None  # the accepted proposal

    @property
    def turn(self) -> int:
        return len(self.messages)


@register_env
class DealOrNoDeal(AlternatingRoles, AgentEnv):
    """Deal-or-No-Deal negotiation between `alice` and `bob`, in free text with structured moves.

    A task row is `{"instance": k}` (OpenSpiel's built-in instance k, 0-999; needs `open-spiel`), `{"seed": s}` (our
    sampler, same scheme, no dependency) or `{"pool": [books, hats, balls], "values": {"alice": [...], "bob":
    [...]}}` (a hand-written instance). Alice always speaks first.

    Args:
        opponent: `"self"`: the policy plays both roles in turn (`current_role()` alternates, each observation is
            the acting role's private view). `"scripted"`: a deterministic rule-based partner plays the other role
            inside `step()`, so the policy only ever plays `agent_role`. The partner accepts a proposal leaving it
            at least `partner_threshold` of its whole-pool value, and otherwise offers the split worth at least that
            much to it that keeps the fewest items (`scripted_reply`).
        agent_role: The role the policy plays against the scripted partner (default `"alice"`); only with
            `opponent="scripted"`.
        max_turns: Messages (both roles, talk included) before the game ends without a deal; 10 as in OpenSpiel's
            `bargaining` (our choice: every message counts, not only offers).
        normalize_rewards: Divide each role's utility by what the whole pool is worth to it (10 on the standard
            instances), so rewards lie in [0, 1] (our choice; `False` gives raw points).
        self_play_reward: With `opponent="self"`, the single reward of the final step (our choice, see the README):
            `"mean"` (default: the mean of both roles' rewards, a cooperative return for one shared policy) or
            `"acting"` (the reward of the role that took the final step). Every role's own reward is always in
            `info["role_rewards"]`.
        partner_threshold: The scripted partner's acceptance threshold, a fraction of its whole-pool value.
        max_message_chars: Talk longer than this is cut in the dialogue both roles see (moves are never cut).
    """

    name = "dealnodeal"
    roles = ROLES
    task_keys = ("instance", "seed", "pool")
    instructions = (
        "You are negotiating how to divide a pool of books, hats and balls with another player. Each of you values "
        "the items differently and knows only your own values. Your score is the total value of the items you end "
        "up with.\n"
        "Each turn, write one short message. To make an offer, include [Propose: book=X, hat=Y, ball=Z] with the "
        "number of each item YOU would keep; the other player gets the rest. To agree to the other player's latest "
        "offer, include [Accept]. A message may also be plain talk. At most one offer or accept per message.\n"
        "The game ends when an offer is accepted. If no offer is accepted within the message limit, both players "
        "score 0."
    )

    SPLIT_INSTANCE_RANGES: ClassVar[dict[str, range]] = {"train": range(800), "eval": range(800, 1000)}
    SPLIT_SEED_START: ClassVar[dict[str, int]] = {"train": 0, "eval": 1_000_000}
    SPLIT_DEFAULT_COUNT: ClassVar[dict[str, int]] = {"train": 800, "eval": 200}

    def __init__(
        self,
        opponent: str = "self",
        agent_role: str | None = None,
        max_turns: int = 10,
        normalize_rewards: bool = True,
        self_play_reward: str = "mean",
        partner_threshold: float = 0.6,
        max_message_chars: int = 300,
    ):
        if opponent not in ("self", "scripted"):
            raise ValueError(f"`opponent` must be 'self' or 'scripted', got {opponent!r}")
        if agent_role is not None and opponent != "scripted":
            raise ValueError("`agent_role` only applies with opponent='scripted' (self-play plays both roles)")
        agent_role = "alice" if agent_role is None else agent_role
        if agent_role not in ROLES:
            raise ValueError(f"`agent_role` must be one of {ROLES}, got {agent_role!r}")
        if self_play_reward not in ("mean", "acting"):
            raise ValueError(f"`self_play_reward` must be 'mean' or 'acting', got {self_play_reward!r}")
        if normalize_rewards not in (True, False):
            raise ValueError(f"`normalize_rewards` must be a bool, got {normalize_rewards!r}")
        if isinstance(partner_threshold, bool) or not isinstance(partner_threshold, numbers.Real):
            raise ValueError(f"`partner_threshold` must be a number in [0, 1], got {partner_threshold!r}")
        if not 0.0 <= partner_threshold <= 1.0:
            raise ValueError(f"`partner_threshold` must be in [0, 1], got {partner_threshold!r}")
        self.opponent = opponent
        self.agent_role = agent_role
        self.max_turns = check_int("max_turns", max_turns, 2)  # an offer and its acceptance
        self.normalize_rewards = normalize_rewards
        self.self_play_reward = self_play_reward
        self.partner_threshold = float(partner_threshold)
        self.max_message_chars = check_int("max_message_chars", max_message_chars, 0)
        self._instance: DealInstance | None = None
        self._game = _Game()

    # ---- episode ---------------------------------------------------------------------------------------------------

    def reset(self, task: dict[str, Any]) -> str:
        """Load the task's instance and return the first observation (from the view of the role to act)."""
        self._instance = instance_from_task(task)
        self._game = _Game()
        if self.opponent == "scripted" and self._acting_index() != self._agent_index():
            self._game = self._partner_turn(self._game)  # the partner opens
        return self.render()

    def step(self, action_text: str) -> tuple[str, float, bool, dict[str, Any]]:
        instance = self._require_instance()
        if self._game.outcome is not None:
            raise RuntimeError("The negotiation is over; call reset() first")
        acting = self._acting_index()
        move = parse_move(action_text, instance.pool)
        if isinstance(move, Move) and move.kind == "accept":
            move = self._check_accept(acting) or move
        if not isinstance(move, Move):  # nothing changes: the same role writes again
            return self._invalid_message(acting, move)
        game = self._apply(self._game, acting, move)
        info: dict[str, Any] = {
            INFO_VALID: True,
            "role": ROLES[acting],
            "move": move.kind,
            "action": _Message(acting, move).text(self.max_message_chars),  # the engine's history shows this
        }
        if self.opponent == "scripted" and game.outcome is None:
            game = self._partner_turn(game)
            info["partner_message"] = game.messages[-1].line(self.max_message_chars)
        self._game = game
        info[INFO_SUCCESS] = game.outcome == "deal"
        info["turn"] = game.turn
        if game.outcome is None:
            return self.render(), 0.0, False, info
        role_rewards = self.role_rewards()
        info[INFO_ROLE_REWARDS] = role_rewards
        info["utilities"] = self.utilities()
        info["deal"] = None if game.deal is None else self._deal_dict(game.deal)
        last = game.messages[-1].role_index  # the scripted partner may have taken the last step
        return self.render(), self._final_reward(role_rewards, last), True, info

    def _check_accept(self, acting: int) -> str | None:
        proposal = self._game.proposal
        if proposal is None:
            return "There is no proposal to accept yet; make one with [Propose: book=X, hat=Y, ball=Z]."
        if proposal[0] == acting:
            return "The latest proposal is your own; wait for an answer or propose something else."
        return None

    def _apply(self, game: _Game, role_index: int, move: Move) -> _Game:
        messages = game.messages + (_Message(role_index, move),)
        proposal, outcome, deal = game.proposal, None, None
        if move.kind == "propose":
            proposal = (role_index, move.split)
        elif move.kind == "accept":
            outcome, deal = "deal", game.proposal
        if outcome is None and len(messages) >= self.max_turns:
            outcome = "no_deal"
        return _Game(messages, proposal, outcome, deal)

    def _partner_turn(self, game: _Game) -> _Game:
        partner = 1 - self._agent_index()
        return self._apply(
            game, partner, scripted_reply(self._instance, partner, game.proposal, self.partner_threshold)
        )

    # ---- roles and rewards -----------------------------------------------------------------------------------------

    def utilities(self) -> dict[str, int]:
        """Each role's points: the value of the items it gets in the deal, 0 for everyone without a deal."""
        instance = self._require_instance()
        if self._game.deal is None:
            return {role: 0 for role in ROLES}
        proposer, kept = self._game.deal
        shares = {proposer: kept, 1 - proposer: instance.complement(kept)}
        return {role: instance.utility(i, shares[i]) for i, role in enumerate(ROLES)}

    def role_rewards(self) -> dict[str, float]:
        """Each role's reward (utility, divided by its whole-pool value when `normalize_rewards`)."""
        points = self.utilities()
        return self._normalized({i: points[role] for i, role in enumerate(ROLES)})

    def _normalized(self, points: dict[int, int]) -> dict[str, float]:
        instance = self._require_instance()
        scale = {i: instance.max_utility(i) if self.normalize_rewards else 1 for i in points}
        return {ROLES[i]: points[i] / scale[i] for i in sorted(points)}

    def _deal_dict(self, deal: tuple[int, Split]) -> dict[str, dict[str, int]]:
        proposer, kept = deal
        shares = {proposer: kept, 1 - proposer: self._instance.complement(kept)}
        return {ROLES[i]: dict(zip(ITEMS, shares[i])) for i in range(len(ROLES))}

    # ---- observations ----------------------------------------------------------------------------------------------

    def render(self, role: str | None = None) -> str:
        """The private view of `role` (default: the role to act): pool, its own values, the dialogue, the standing
        proposal and the messages left. Only the other role's values are hidden."""
        instance = self._require_instance()
        index = ROLES.index(role) if role is not None else self._acting_index()
        if self.opponent == "scripted" and role is None:
            index = self._agent_index()
        me, other = ROLES[index].capitalize(), ROLES[1 - index].capitalize()
        game = self._game
        lines = [
            f"You are {me}, negotiating with {other}.",
            f"Pool: {format_split(instance.pool)}",
            (
                f"Your values per item: {format_split(instance.values[index])} (the whole pool is worth "
                f"{instance.max_utility(index)} to you; {other}'s values are private)."
            ),
            "Dialogue so far:",
        ]
        lines += [f"  {m.line(self.max_message_chars)}" for m in game.messages] or ["  (nothing yet)"]
        if game.outcome == "deal":
            mine = self._deal_dict(game.deal)[ROLES[index]]
            points = self.utilities()[ROLES[index]]
            lines.append(f"Deal reached: you get {format_split(tuple(mine.values()))}, worth {points} to you.")
        elif game.outcome == "no_deal":
            lines.append("No deal was reached: both score 0.")
        else:
            if game.proposal is None:
                lines.append("No proposal on the table yet.")
            elif game.proposal[0] == index:
                lines.append(
                    f"Standing proposal (yours): you keep {format_split(game.proposal[1])}; {other} gets the rest."
                )
            else:
                mine = instance.complement(game.proposal[1])
                lines.append(
                    f"Standing proposal ({other}'s): you would get {format_split(mine)}, worth "
                    f"{instance.utility(index, mine)} to you. [Accept] takes it."
                )
            lines.append(f"Messages left (both players): {self.max_turns - game.turn}. Your turn, {me}.")
        return "\n".join(lines)

    def _require_instance(self) -> DealInstance:
        if self._instance is None:
            raise RuntimeError("Call reset(task) before using the environment")
        return self._instance

    @property
    def instance(self) -> DealInstance:
        """The current instance (pool and both roles' values)."""
        return self._require_instance()

    def admissible_actions(self) -> list[str]:
        """Every structured move the acting role may make now: each proposal, and `[Accept]` when the other role's
        proposal stands (talk is always admissible too)."""
        instance = self._require_instance()
        moves = [format_move(Move("propose", "", s)) for s in instance.splits()]
        if self._game.outcome is None and self._check_accept(self._acting_index()) is None:
            moves.append("[Accept]")
        return moves

    # ---- capabilities ----------------------------------------------------------------------------------------------

    def snapshot(self) -> tuple[DealInstance | None, _Game]:
        return (self._instance, self._game)

    def restore(self, snapshot: tuple[DealInstance | None, _Game]) -> None:
        self._instance, self._game = snapshot

    def state_key(self) -> tuple:
        """`(pool, values, messages so far, standing proposal, outcome)`: the game state without the talk (our
        choice: two dialogues with the same moves and different wording share a key)."""
        instance = self._require_instance()
        game = self._game
        return (instance.pool, instance.values, game.turn, game.proposal, game.outcome)

    def privileged_context(self) -> str:
        """The other role's private values (and, against the scripted partner, its acceptance rule): a teacher's
        view of the negotiation."""
        instance = self._require_instance()
        index = self._agent_index() if self.opponent == "scripted" else self._acting_index()
        other = 1 - index
        name = ROLES[other].capitalize()
        text = (
            f"{name}'s private values per item: {format_split(instance.values[other])} (the whole pool is worth "
            f"{instance.max_utility(other)} to {name})."
        )
        if self.opponent == "scripted":
            demand = _demand(instance, other, self.partner_threshold)
            offer = scripted_proposal(instance, other, self.partner_threshold)
            text += (
                f" {name} accepts any proposal that leaves it at least {demand} points, and otherwise offers "
                f"[Propose: {format_split(offer)}] (the items {name} keeps)."
            )
        return text

    def optimal_plan(self) -> list[str] | None:
        """The shortest messages to the best deal for the policy from here (None when no deal is reachable).

        Against the scripted partner: the proposal worth most to `agent_role` that the partner accepts (or
        `[Accept]` when the partner's standing offer is worth at least as much). In self-play: the proposal with the
        highest final reward (`self_play_reward`) followed by `[Accept]`, or `[Accept]` alone when accepting the
        standing proposal already gives that reward.
        """
        instance = self._require_instance()
        game = self._game
        if game.outcome is not None:
            return [] if game.outcome == "deal" else None
        acting, other = self._acting_index(), 1 - self._acting_index()
        candidates = instance.splits()
        if self.opponent == "scripted":  # only what the partner accepts ends the game
            demand = _demand(instance, other, self.partner_threshold)
            candidates = [s for s in candidates if instance.utility(other, instance.complement(s)) >= demand]
        # The other role's acceptance ends the game, so it takes the final step.
        best = min(candidates, key=lambda s: (-self._deal_reward(acting, s, last=other), sum(s), s))
        plan = [format_move(Move("propose", "", best))] + ([] if self.opponent == "scripted" else ["[Accept]"])
        if self.max_turns - game.turn < 2:
            plan = None  # no message would be left for the acceptance
        if game.proposal is not None and game.proposal[0] == other:
            standing = self._deal_reward(other, game.proposal[1], last=acting)
            if plan is None or standing >= self._deal_reward(acting, best, last=other):
                return ["[Accept]"]
        return plan

    def _deal_reward(self, proposer: int, kept: Split, last: int) -> float:
        """The policy's final reward if the proposal (`proposer` keeps `kept`) is accepted, `last` accepting."""
        instance = self._instance
        points = {
            proposer: instance.utility(proposer, kept),
            1 - proposer: instance.utility(1 - proposer, instance.complement(kept)),
        }
        return self._final_reward(self._normalized(points), last)

    # ---- splits ----------------------------------------------------------------------------------------------------

    @classmethod
    def task_split(
        cls, split: str, count: int | None = None, source: str = "auto", **env_kwargs: Any
    ) -> list[dict[str, Any]]:
        """Task rows of a split. `source="openspiel"`: OpenSpiel's instances, `"train"` = 0-799 and `"eval"` =
        800-999 (`{"instance": k}` rows). `source="sampled"`: our sampler, seeds from 0 (train) and 1,000,000 (eval).
        `source="auto"` (default) uses OpenSpiel when `open-spiel` is importable, else the sampler."""
        if split not in cls.SPLIT_SEED_START:
            raise ValueError(f"Unknown Deal-or-No-Deal split {split!r}; choose one of {sorted(cls.SPLIT_SEED_START)}")
        if source not in ("auto", "openspiel", "sampled"):
            raise ValueError(f"`source` must be 'auto', 'openspiel' or 'sampled', got {source!r}")
        cls(**env_kwargs)  # validate the environment arguments now
        if source == "auto":
            source = "openspiel" if _openspiel_available() else "sampled"
        count = cls.SPLIT_DEFAULT_COUNT[split] if count is None else check_int("count", count, 0)
        if source == "openspiel":
            indices = cls.SPLIT_INSTANCE_RANGES[split]
            if count > len(indices):
                raise ValueError(
                    f"`count`={count} exceeds the {len(indices)} OpenSpiel instances of the {split!r} split; "
                    "ask for fewer or use source='sampled' (unlimited seeded instances of the same scheme)"
                )
            return [{"env": cls.name, "task_id": f"{cls.name}-{split}-{k}", "instance": k} for k in indices[:count]]
        if count > 1_000_000:
            raise ValueError("`count` must be <= 1_000_000 so that split seed ranges stay disjoint")
        start = cls.SPLIT_SEED_START[split]
        return [
            {"env": cls.name, "task_id": f"{cls.name}-{split}-seed{s}", "seed": s} for s in range(start, start + count)
        ]


# ---- task rows and argument checks ---------------------------------------------------------------------------------


def instance_from_task(task: dict[str, Any]) -> DealInstance:
    """The instance a task row names: `pool`+`values` (hand-written), else `instance` (OpenSpiel), else `seed`."""
    if task.get("pool") is not None:
        return _custom_instance(task["pool"], task.get("values"))
    if task.get("instance") is not None:
        index = task["instance"]
        if isinstance(index, bool) or not isinstance(index, numbers.Integral):
            raise ValueError(f"Task field 'instance' must be an integer in [0, 999], got {index!r}")
        if not 0 <= index < NUM_OPENSPIEL_INSTANCES:
            raise ValueError(f"Task field 'instance' must be in [0, 999] (OpenSpiel has 1000 instances), got {index}")
        return openspiel_instance(int(index))
    if task.get("seed") is not None:
        seed = task["seed"]
        if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
            raise ValueError(f"Task field 'seed' must be an integer, got {seed!r}")
        return sample_instance(int(seed))
    raise ValueError(
        "A Deal-or-No-Deal task needs an 'instance' (OpenSpiel, 0-999), a 'seed' (our sampler) or a 'pool' with "
        f"'values'; got keys {sorted(task)}"
    )


def _custom_instance(pool: Any, values: Any) -> DealInstance:
    def counts(name: str, value: Any) -> Split:
        if not isinstance(value, (list, tuple)) or len(value) != len(ITEMS):
            raise ValueError(f"Task field {name!r} must list 3 counts (book, hat, ball), got {value!r}")
        for v in value:
            if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 0:
                raise ValueError(f"Task field {name!r} must hold non-negative integers, got {value!r}")
        return tuple(int(v) for v in value)  # type: ignore[return-value]

    pool = counts("pool", pool)
    if sum(pool) == 0:
        raise ValueError("Task field 'pool' must hold at least one item")
    if not isinstance(values, dict) or set(values) != set(ROLES):
        raise ValueError(f"Task field 'values' must map each of {ROLES} to 3 per-item values, got {values!r}")
    rows = tuple(counts(f"values[{role!r}]", values[role]) for role in ROLES)
    instance = DealInstance(pool, rows, "custom")  # type: ignore[arg-type]
    for i, role in enumerate(ROLES):
        if instance.max_utility(i) <= 0:
            raise ValueError(f"The pool must be worth something to {role}: its values {rows[i]} give 0")
    return instance


def _openspiel_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("pyspiel") is not None

