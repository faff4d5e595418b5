"""FrozenLake: a small seeded grid world (gymnasium's FrozenLake rules) rendered as compact text.

The player starts top-left and must reach the goal bottom-right without stepping into a hole. Maps are random
(each cell but start and goal is a hole with probability `hole_prob`), regenerated from the task seed until a path
exists. The held-out split contains only map layouts that never occur in the training split.

Example:
    >>> from trl_agents.envs import make_env
    >>> env = make_env("frozenlake")
    >>> print(env.reset({"layout": "SFH\\nFFF\\nHFG"}))
    P F H
    F F F
    H F G
    >>> env.solver_value(), env.optimal_plan()
    (4, ['down', 'right', 'down', 'right'])
"""

from __future__ import annotations

import hashlib
import math
import numbers
import random
from collections import deque
from functools import lru_cache
from typing import Any, ClassVar

from .base import INFO_SUCCESS, INFO_VALID, AgentEnv
from .parsing import DIRECTIONS, INVALID_DIRECTION_FEEDBACK, parse_direction
from .registry import register_env
from .validation import check_int, check_text

Layout = tuple[str, ...]  # one string per row, letters S F H G (gymnasium's map format)
Cell = tuple[int, int]

START, FROZEN, HOLE, GOAL, PLAYER = "S", "F", "H", "G", "P"
_OFFSETS: dict[str, Cell] = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}
# gymnasium's slippery ice: the intended direction or one of the two perpendicular ones, 1/3 each.
_PERPENDICULAR = {"up": ("left", "right"), "down": ("right", "left"), "left": ("down", "up"), "right": ("up", "down")}

_TASK_KEYS = ("size", "hole_prob", "slippery")
_MAX_GENERATION_ATTEMPTS = 10_000
NUM_LAYOUT_BUCKETS = 10
EVAL_LAYOUT_BUCKET = 0


# ---- maps --------------------------------------------------------------------------------------------------------


def parse_layout(text: str) -> Layout:
    """Parse a map such as `"SFFF\\nFHFH\\nFFFH\\nHFFG"` (spaces between cells are optional)."""
    rows = tuple(line.replace(" ", "").replace("\t", "") for line in text.strip("\n").splitlines())
    rows = tuple(row for row in rows if row)
    if not rows or len({len(row) for row in rows}) != 1:
        raise ValueError(f"FrozenLake layout must be a non-empty rectangle of cells, got:\n{text}")
    letters = "".join(rows)
    if set(letters) - {START, FROZEN, HOLE, GOAL}:
        raise ValueError(f"FrozenLake layout may only use S F H G, got {sorted(set(letters))}")
    if letters.count(START) != 1 or letters.count(GOAL) != 1:
        raise ValueError("FrozenLake layout needs exactly one start S and one goal G")
    return rows


def _find(layout: Layout, letter: str) -> Cell:
    for r, row in enumerate(layout):
        if letter in row:
            return r, row.index(letter)
    raise ValueError(f"{letter!r} not in layout")


@lru_cache(maxsize=65_536)
def goal_distances(layout: Layout) -> dict[Cell, int]:
    """Shortest number of moves from every cell that can reach the goal (BFS from the goal; holes are blocked)."""
    goal = _find(layout, GOAL)
    dist = {goal: 0}
    queue = deque([goal])
    while queue:
        r, c = queue.popleft()
        for dr, dc in _OFFSETS.values():
            nr, nc = r + dr, c + dc
            if 0 <= nr < len(layout) and 0 <= nc < len(layout[0]) and layout[nr][nc] != HOLE and (nr, nc) not in dist:
                dist[(nr, nc)] = dist[(r, c)] + 1
                queue.append((nr, nc))
    return dist


@lru_cache(maxsize=65_536)
def generate_layout(seed: int, size: int = 4, hole_prob: float = 0.3) -> Layout:
    """The map of `seed`: start top-left, goal bottom-right, other cells holes with probability `hole_prob`.
    Attempt k draws from `random.Random(f"frozenlake/{seed}/{k}")` until the goal is reachable."""
    for attempt in range(_MAX_GENERATION_ATTEMPTS):
        rng = random.Random(f"frozenlake/{seed}/{attempt}")
        cells = [HOLE if rng.random() < hole_prob else FROZEN for _ in range(size * size)]
        cells[0], cells[-1] = START, GOAL
        layout = tuple("".join(cells[r * size : (r + 1) * size]) for r in range(size))
        if (0, 0) in goal_distances(layout):
            return layout
    raise RuntimeError(f"No solvable FrozenLake map for seed {seed} with size={size}, hole_prob={hole_prob}")


def layout_bucket(layout: Layout) -> int:
    """Stable bucket in [0, NUM_LAYOUT_BUCKETS) of a layout (SHA-256 of its text): bucket 0 is held out for eval."""
    digest = hashlib.sha256("\n".join(layout).encode()).digest()
    return int.from_bytes(digest[:8], "big") % NUM_LAYOUT_BUCKETS


# ---- argument checks ---------------------------------------------------------------------------------------------


def _check_settings(size: Any, hole_prob: Any, slippery: Any) -> dict[str, Any]:
    if isinstance(size, bool) or not isinstance(size, numbers.Integral) or size < 2:
        raise ValueError(f"`size` must be an integer >= 2, got {size!r}")
    if isinstance(hole_prob, bool) or not isinstance(hole_prob, numbers.Real) or not 0.0 <= hole_prob < 1.0:
        raise ValueError(f"`hole_prob` must be a number in [0, 1), got {hole_prob!r}")
    if not isinstance(slippery, (bool, numbers.Integral)) or slippery not in (0, 1):
        raise ValueError(f"`slippery` must be a bool, got {slippery!r}")
    return {"size": int(size), "hole_prob": float(hole_prob), "slippery": bool(slippery)}


# ---- the environment ---------------------------------------------------------------------------------------------


@register_env
class FrozenLake(AgentEnv):
    """FrozenLake on seeded random maps, with a BFS solver.

    A task row is `{"seed": s}` (a generated map) or `{"layout": "SFF\\nFHF\\nFFG"}` (a hand-written map, gymnasium
    letters, spaces optional; the seed, if given, still drives slipping). A row may also set `size`, `hole_prob` or
    `slippery`, which then override the constructor's values for that task; other keys are ignored.

    Args:
        size: Side of the square map.
        hole_prob: Probability that a cell other than start and goal is a hole.
        slippery: gymnasium's slippery ice: the move goes in the intended direction with probability 1/3 and in each
            perpendicular direction with 1/3. The draws depend only on the task seed and the move number, so an
            episode is reproducible (and `restore` + `step` replays it exactly).
    """

    name = "frozenlake"
    task_keys = ("seed", "layout")
    instructions = (
        "You are on a frozen lake. Walk from your position P to the goal G without stepping into a hole H.\n"
        "Symbols: P you, F frozen ice, H hole, G goal, S start.\n"
        "Each turn you move one cell; a move off the grid does nothing. Stepping into a hole ends the game.\n"
        "Answer with exactly one word: up, down, left or right."
    )

    # Seed ranges of the built-in splits: train [0, 1e6) without eval-bucket layouts, eval [1e6, 2e6) with only them.
    SPLIT_SEED_START: ClassVar[dict[str, int]] = {"train": 0, "eval": 1_000_000}
    SPLIT_DEFAULT_COUNT: ClassVar[dict[str, int]] = {"train": 3000, "eval": 1000}

    def __init__(self, size: int = 4, hole_prob: float = 0.3, slippery: bool = False):
        self._settings = _check_settings(size, hole_prob, slippery)
        self._layout: Layout | None = None
        self._pos: Cell = (0, 0)
        self._seed = 0
        self._slippery = self._settings["slippery"]
        self._moves = 0  # number of valid moves so far: indexes the slip draws
        self._done = False

    # ---- episode ---------------------------------------------------------------------------------------------------

    def reset(self, task: dict[str, Any]) -> str:
        """Load the task's map (`{"seed": s}` or `{"layout": text}`) and return the grid."""
        settings = dict(self._settings)
        settings.update({k: task[k] for k in _TASK_KEYS if task.get(k) is not None})
        settings = _check_settings(**settings)
        seed = check_int("seed", task["seed"], 0) if task.get("seed") is not None else 0
        if task.get("layout") is not None:
            self._layout = parse_layout(check_text("layout", task["layout"]))
        elif task.get("seed") is not None:
            self._layout = generate_layout(seed, settings["size"], settings["hole_prob"])
        else:
            raise ValueError(f"A FrozenLake task needs a 'seed' or a 'layout', got keys {sorted(task)}")
        self._seed = seed
        self._slippery = settings["slippery"]
        self._pos = _find(self._layout, START)
        self._moves = 0
        self._done = False
        return self.render()

    def task_description(self) -> str:
        return "The ice is slippery: a move may go sideways instead." if self._slippery else ""

    def step(self, action_text: str) -> tuple[str, float, bool, dict[str, Any]]:
        layout = self._require_layout()
        if self._done:
            raise RuntimeError("The episode is over; call reset() first")
        direction = parse_direction(action_text)
        if direction is None:
            info = {
                INFO_VALID: False,
                INFO_SUCCESS: False,
                "action": None,
                "moved": False,
                "slipped": False,
                "hole": False,
            }
            return f"{INVALID_DIRECTION_FEEDBACK}\n{self.render()}", 0.0, False, info
        taken = self._slip(direction) if self._slippery else direction
        self._moves += 1
        dr, dc = _OFFSETS[taken]
        r, c = self._pos[0] + dr, self._pos[1] + dc
        moved = 0 <= r < len(layout) and 0 <= c < len(layout[0])
        if moved:
            self._pos = (r, c)
        cell = layout[self._pos[0]][self._pos[1]]
        success = cell == GOAL
        self._done = success or cell == HOLE
        info = {
            INFO_VALID: True,
            INFO_SUCCESS: success,
            "action": direction,
            "moved": moved,
            "slipped": taken != direction,
            "hole": cell == HOLE,
        }
        return self.render(), 1.0 if success else 0.0, self._done, info

    def _slip(self, direction: str) -> str:
        # One fresh generator per move, seeded by (task seed, move number): reproducible without storing RNG state.
        draw = random.Random(f"frozenlake-slip/{self._seed}/{self._moves}").randrange(3)
        return direction if draw == 0 else _PERPENDICULAR[direction][draw - 1]

    def render(self) -> str:
        """The current grid: one row per line, cells separated by spaces, `P` where the player is."""
        layout = self._require_layout()
        lines = []
        for r, row in enumerate(layout):
            lines.append(" ".join(PLAYER if (r, c) == self._pos else letter for c, letter in enumerate(row)))
        return "\n".join(lines)

    def _require_layout(self) -> Layout:
        if self._layout is None:
            raise RuntimeError("Call reset(task) before using the environment")
        return self._layout

    @property
    def layout(self) -> Layout:
        """The current map, one string per row (gymnasium letters)."""
        return self._require_layout()

    # ---- solver ----------------------------------------------------------------------------------------------------

    def solver_value(self) -> float:
        """Fewest moves from the current cell to the goal on deterministic ice (0 at the goal, `math.inf` in a hole).
        With `slippery=True` this is still the deterministic distance, a lower bound on the expected moves."""
        layout = self._require_layout()
        return goal_distances(layout).get(self._pos, math.inf)

    def optimal_plan(self) -> list[str] | None:
        """A shortest action list to the goal (ties broken in the order up, down, left, right); None in a hole."""
        layout = self._require_layout()
        dist = goal_distances(layout)
        if self._pos not in dist:
            return None
        plan, (r, c) = [], self._pos
        while dist[(r, c)] > 0:
            for direction in DIRECTIONS:
                dr, dc = _OFFSETS[direction]
                if dist.get((r + dr, c + dc), math.inf) == dist[(r, c)] - 1:
                    plan.append(direction)
                    r, c = r + dr, c + dc
                    break
        return plan

    # ---- capabilities ----------------------------------------------------------------------------------------------

    def snapshot(self) -> tuple:
        return (self._layout, self._pos, self._seed, self._slippery, self._moves, self._done)

    def restore(self, snapshot: tuple) -> None:
        self._layout, self._pos, self._seed, self._slippery, self._moves, self._done = snapshot

    def state_key(self) -> Cell:
        self._require_layout()
        return self._pos

    # ---- splits ----------------------------------------------------------------------------------------------------

    @classmethod
    def task_split(cls, split: str, count: int | None = None, **env_kwargs: Any) -> list[dict[str, Any]]:
        """Seeded task rows whose layouts are split by `layout_bucket`: `"train"` takes seeds from 0 upward whose
        layout is not in the eval bucket, `"eval"` takes seeds from 1_000_000 upward whose layout is. So no eval
        layout ever occurs in train. `size`, `hole_prob` and `slippery` among `env_kwargs` shape the maps and are
        copied into the rows."""
        if split not in cls.SPLIT_SEED_START:
            raise ValueError(f"Unknown FrozenLake split {split!r}; choose one of {sorted(cls.SPLIT_SEED_START)}")
        settings = cls(**env_kwargs)._settings  # validates every argument now rather than at the first reset
        if count is None:
            count = cls.SPLIT_DEFAULT_COUNT[split]
        if isinstance(count, bool) or not isinstance(count, numbers.Integral) or count < 0:
            raise ValueError(f"`count` must be an integer >= 0, got {count!r}")
        seeds = _split_seeds(split, int(count), settings["size"], settings["hole_prob"])
        extra = {k: v for k, v in env_kwargs.items() if k in _TASK_KEYS}
        return [{"env": cls.name, "seed": seed, "task_id": f"{cls.name}-{split}-{seed}", **extra} for seed in seeds]


@lru_cache(maxsize=64)
def _split_seeds(split: str, count: int, size: int, hole_prob: float) -> tuple[int, ...]:
    start = FrozenLake.SPLIT_SEED_START[split]
    want_eval = split == "eval"
    seeds: list[int] = []
    for seed in range(start, start + 1_000_000):
        if len(seeds) == count:
            return tuple(seeds)
        if (layout_bucket(generate_layout(seed, size, hole_prob)) == EVAL_LAYOUT_BUCKET) == want_eval:
            seeds.append(seed)
        elif not seeds and seed - start >= 10_000:
            break  # too few distinct layouts at these settings to fill both sides of the split
    if len(seeds) == count:
        return tuple(seeds)
    raise ValueError(
        f"Only {len(seeds)} of {count} {split!r} FrozenLake tasks found with size={size}, hole_prob={hole_prob}: "
        "these settings have too few distinct layouts for a layout-disjoint split."
    )
