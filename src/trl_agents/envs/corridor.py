"""Corridor: the credit test-bed. A long row of rooms; one door of each room leads on, the others send you back.

Every task is a seeded corridor of `rooms` rooms. Each room shows a sign (one of eight direction words) and `doors`
doors, labelled a, b, c, ...; a fixed code (`door_of`, the same in every corridor) says which door a sign points to.
That door leads to the next room; every other door sends the player back `setback` rooms. Passing the last room
opens the vault: reward 1, the only reward.
The player has `rooms + slack` moves; an episode that runs out of moves ends with reward 0. So:

* the horizon is long (at least `rooms` turns, 20 by default) and the reward is sparse and terminal;
* a wrong door costs nothing at once: its price (the moves needed to walk back) is paid only at the end, when the
  moves run out, many turns later, and only if the other rooms also cost moves;
* a room looks the same every time it is reached (no move counter in the observation), within an episode after a
  setback and across the episodes of a group, which all play the same corridor: anchor-state methods have states
  to group;
* `doors` (choices per room), `setback`, `slack` and `rooms` set the difficulty.

The environment's README (`envs/corridor/README.md`) argues why outcome-only credit should be measurably worse
here and gives a signal-to-noise estimate (`credit_snr` below computes it).

Example:
    >>> from trl_agents.envs import make_env
    >>> env = make_env("corridor", rooms=3, doors=2)
    >>> print(env.reset({"seed": 0}))
    room 1 of 3
    sign: up
    doors: a b
    >>> env.optimal_plan(), env.solver_value()      # "up" is the 5th word: door 4 mod 2 = a
    (['a', 'a', 'b'], 3)
    >>> env.step("b")[1:3], env.state_key()      # a wrong door in room 1: sent back, but not below room 1
    ((0.0, False), 0)
    >>> env.step("a")[1:3], env.state_key()
    ((0.0, False), 1)
"""

from __future__ import annotations

import math
import random
import re
import statistics
from functools import lru_cache
from typing import Any, ClassVar

from .base import INFO_SUCCESS, INFO_VALID, AgentEnv
from .parsing import extract_answer
from .registry import register_env
from .validation import check_int

WORDS: tuple[str, ...] = ("north", "south", "east", "west", "up", "down", "left", "right")
LABELS = "abcdefgh"
_LABEL = re.compile(r"(?<![a-z])([a-h])(?![a-z])")
SETTINGS = ("rooms", "doors", "setback", "slack")  # constructor arguments a task row may override


def door_of(sign: str, doors: int) -> str:
    """The door a sign points to: the fixed code of every corridor, `WORDS[i]` -> `LABELS[i % doors]` (with 3
    doors: north, west, left -> a; south, up, right -> b; east, down -> c)."""
    return LABELS[WORDS.index(sign) % doors]


@lru_cache(maxsize=4096)
def generate_corridor(seed: int, rooms: int) -> tuple[str, ...]:
    """The signs of task `seed`'s rooms, drawn from `random.Random(f"corridor/{seed}/{rooms}")`."""
    rng = random.Random(f"corridor/{seed}/{rooms}")
    return tuple(rng.choice(WORDS) for _ in range(rooms))


def _check_settings(rooms: Any, doors: Any, setback: Any, slack: Any) -> dict[str, int]:
    return {
        "rooms": check_int("rooms", rooms, 1, 1000),
        "doors": check_int("doors", doors, 2, len(WORDS)),
        "setback": check_int("setback", setback, 0, 1000),
        "slack": check_int("slack", slack, 0, 10_000),
    }


@register_env
class Corridor(AgentEnv):
    """Rooms whose right door leads on while wrong doors send you back (the credit test-bed), with an exact solver.

    A task row is `{"seed": s}`; it may also set `rooms`, `doors`, `setback` or `slack`, which then override the
    constructor's values for that task.

    Args:
        rooms: Rooms to pass (the horizon is at least this many turns).
        doors: Doors per room (2 to 8); one leads on.
        setback: Rooms a wrong door sends the player back (never below the first room).
        slack: Moves allowed beyond `rooms`; the episode ends unsolved when they are spent.
    """

    name = "corridor"
    task_keys = ("seed",)
    instructions = (
        "You walk down a corridor of rooms to a vault. Each room has a sign and some doors a, b, c, ... The sign "
        "points to the door that leads to the next room; any other door sends you back. Your moves are limited. "
        "Answer with the letter of one door."
    )
    SPLIT_SEED_START: ClassVar[dict[str, int]] = {"train": 0, "eval": 1_000_000}
    SPLIT_DEFAULT_COUNT: ClassVar[dict[str, int]] = {"train": 3000, "eval": 1000}

    def __init__(self, rooms: int = 20, doors: int = 3, setback: int = 2, slack: int = 6):
        self._settings = _check_settings(rooms, doors, setback, slack)
        self._layout: tuple[str, ...] | None = None
        self._room = 0
        self._moves_left = 0
        self._done = False
        self._setback = self._settings["setback"]
        self._doors = self._settings["doors"]

    # ---- episode -----------------------------------------------------------------------------------------------

    def reset(self, task: dict[str, Any]) -> str:
        """Load the task's corridor (`{"seed": s}`) and return the first room."""
        if task.get("seed") is None:
            raise ValueError(f"A corridor task needs a 'seed', got keys {sorted(task)}")
        settings = dict(self._settings)
        settings.update({k: task[k] for k in settings if task.get(k) is not None})
        settings = _check_settings(**settings)
        self._layout = generate_corridor(check_int("seed", task["seed"], 0), settings["rooms"])
        self._doors = settings["doors"]
        self._setback = settings["setback"]
        self._room = 0
        self._moves_left = settings["rooms"] + settings["slack"]
        self._done = False
        return self.render()

    def step(self, action_text: str) -> tuple[str, float, bool, dict[str, Any]]:
        layout = self._require_layout()
        if self._done:
            raise RuntimeError("The episode is over; call reset() first")
        labels = set(_LABEL.findall(extract_answer(action_text).lower())) & set(LABELS[: self._doors])
        if len(labels) != 1:  # no door letter, or several: the move is not made and costs nothing
            info = {INFO_VALID: False, INFO_SUCCESS: False, "action": None, "correct": None, "room": self._room}
            feedback = f"Invalid answer. Reply with one door letter: {', '.join(LABELS[: self._doors])}."
            return f"{feedback}\n{self.render()}", 0.0, False, info
        label = labels.pop()
        correct = label == self._correct_label(self._room)
        room_before = self._room
        self._moves_left -= 1
        self._room = self._room + 1 if correct else max(self._room - self._setback, 0)
        success = self._room == len(layout)
        self._done = success or self._moves_left == 0
        info = {INFO_VALID: True, INFO_SUCCESS: success, "action": label, "correct": correct, "room": room_before}
        if success:
            return self.render(), 1.0, True, info
        if self._done:
            return "You are out of moves.\n" + self.render(), 0.0, True, info
        return self.render(), 0.0, False, info

    def render(self) -> str:
        """The current room: its number, its sign and its doors (no move counter: a room always looks the same)."""
        layout = self._require_layout()
        if self._room == len(layout):
            return "The vault opens."
        doors = " ".join(LABELS[: self._doors])
        return f"room {self._room + 1} of {len(layout)}\nsign: {layout[self._room]}\ndoors: {doors}"

    def admissible_actions(self) -> list[str]:
        self._require_layout()
        return list(LABELS[: self._doors])

    def _require_layout(self) -> tuple[str, ...]:
        if self._layout is None:
            raise RuntimeError("Call reset(task) before using the environment")
        return self._layout

    # ---- solver and capabilities -------------------------------------------------------------------------------

    def _correct_label(self, room: int) -> str:
        return door_of(self._require_layout()[room], self._doors)

    def solver_value(self) -> float:
        """Moves the solver still needs: the rooms left, or `math.inf` when fewer moves than that remain."""
        rooms_left = len(self._require_layout()) - self._room
        return rooms_left if rooms_left <= self._moves_left else math.inf

    def optimal_plan(self) -> list[str] | None:
        """The matching door of every room from here on; None when the moves left cannot reach the vault."""
        if math.isinf(self.solver_value()):
            return None
        return [self._correct_label(room) for room in range(self._room, len(self._require_layout()))]

    def privileged_context(self) -> str:
        """What a teacher is told and the policy is not: the door that leads on from the current room."""
        if self._room == len(self._require_layout()):
            return "The vault is open."
        return f"The door that leads on is {self._correct_label(self._room)}."

    def state_key(self) -> int:
        """The room index: a room is the same state whenever it is reached (moves left are not part of it)."""
        self._require_layout()
        return self._room

    def snapshot(self) -> tuple:
        return (self._layout, self._room, self._moves_left, self._done, self._setback, self._doors)

    def restore(self, snapshot: tuple) -> None:
        self._layout, self._room, self._moves_left, self._done, self._setback, self._doors = snapshot

    # ---- splits ------------------------------------------------------------------------------------------------

    @classmethod
    def task_split(cls, split: str, count: int | None = None, **env_kwargs: Any) -> list[dict[str, Any]]:
        """Seeded rows: train seeds from 0, eval seeds from 1_000_000 (disjoint corridors). Settings among
        `env_kwargs` are checked and copied into the rows."""
        cls(**env_kwargs)  # validates the settings now rather than at the first reset
        extra = {k: v for k, v in env_kwargs.items() if k in SETTINGS}
        return cls.seeded_split(split, count, **extra)


# ---- the signal-to-noise estimate of the README -------------------------------------------------------------------


def credit_snr(
    accuracy: float = 0.9,
    rooms: int = 20,
    setback: int = 2,
    slack: int = 6,
    group_size: int = 8,
    gamma: float = 0.95,
    num_groups: int = 2000,
    seed: int = 0,
) -> dict[str, float]:
    """Monte-Carlo signal-to-noise of two estimates of one decision's value, for a policy that picks the matching
    door with probability `accuracy` in every room (doors beyond two are irrelevant here).

    For each group of `group_size` episodes on one corridor, the decision studied is every move made in the middle
    room (index `rooms // 2`). Two per-move advantages are formed:

    * outcome-only (GRPO): A = (R − mean_group R) / std_group R, R ∈ {0, 1} the episode's success, the same for
      every move of the episode;
    * anchor-state (GiGPO's step term): A = (G − mean G) / std G over all visits of the same room in the group,
      G = γ^(moves to the vault) when the episode succeeds, else 0.

    The signal is the mean advantage of a correct move minus that of a wrong one at the studied room; the noise is
    the pooled standard deviation of the advantages there. Returns `{"outcome_snr", "anchor_snr", "success_rate",
    "zero_advantage_outcome", "zero_advantage_anchor"}`, the last two the fractions of groups (outcome) and of
    room groups (anchor) whose advantages are all zero.
    """
    rng = random.Random(seed)
    room_studied = rooms // 2
    outcome: dict[bool, list[float]] = {True: [], False: []}
    anchor: dict[bool, list[float]] = {True: [], False: []}
    zero_outcome = zero_anchor = anchor_groups = 0
    successes = 0
    for _ in range(num_groups):
        episodes = []
        for _ in range(group_size):
            room, moves_left, visits = 0, rooms + slack, []
            while room < rooms and moves_left > 0:
                correct = rng.random() < accuracy
                visits.append((room, correct, moves_left))
                moves_left -= 1
                room = room + 1 if correct else max(room - setback, 0)
            success = room == rooms
            used = rooms + slack - moves_left
            # the return of each visit: gamma to the power of the moves from that visit to the vault
            returns = [gamma ** (used - (rooms + slack - left)) if success else 0.0 for _, _, left in visits]
            episodes.append((success, visits, returns))
        successes += sum(e[0] for e in episodes)
        rewards = [float(e[0]) for e in episodes]
        mean, std = statistics.fmean(rewards), statistics.pstdev(rewards)
        zero_outcome += std == 0
        by_room: dict[int, list[tuple[bool, float]]] = {}
        for (success, visits, returns), reward in zip(episodes, rewards):
            for (room, correct, _), ret in zip(visits, returns):
                by_room.setdefault(room, []).append((correct, ret))
                if room == room_studied:
                    outcome[correct].append((reward - mean) / std if std > 0 else 0.0)
        for room, entries in by_room.items():
            values = [ret for _, ret in entries]
            a_mean, a_std = statistics.fmean(values), statistics.pstdev(values)
            anchor_groups += 1
            zero_anchor += a_std == 0
            if room == room_studied:
                for correct, ret in entries:
                    anchor[correct].append((ret - a_mean) / a_std if a_std > 0 else 0.0)

    def snr(samples: dict[bool, list[float]]) -> float:
        if len(samples[True]) < 2 or len(samples[False]) < 2:
            return 0.0
        signal = statistics.fmean(samples[True]) - statistics.fmean(samples[False])
        pooled = statistics.pstdev(samples[True] + samples[False])
        return signal / pooled if pooled > 0 else 0.0

    return {
        "outcome_snr": snr(outcome),
        "anchor_snr": snr(anchor),
        "success_rate": successes / (num_groups * group_size),
        "zero_advantage_outcome": zero_outcome / num_groups,
        "zero_advantage_anchor": zero_anchor / max(anchor_groups, 1),
    }
