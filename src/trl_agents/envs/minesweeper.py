"""Minesweeper: seeded no-guess boards, CAST's text board, and a deterministic peek-free solver.

A board is generated from the task seed: a first click is drawn, the mines are placed outside the 3x3 zone around it,
the first click is revealed (flooding zeros), and the layout is kept only when the solver below clears it from there
without ever guessing (CAST's boards, docs/methods/cast.md#the-games, with a no-guess guarantee). Boards can also be given explicitly as CAST's
data holds them (mine positions + first click).

The solver (CAST's, docs/methods/cast.md#the-solvers) reads only what a player sees: the revealed numbers and the total number of mines. It
combines constraint propagation, subset reasoning and exact enumeration of the frontier with the global mine count,
and plays a fixed policy: reveal the most informative provably safe cell, else reveal the cell least likely to be a
mine. `solver_value()` is CAST's K(s), the number of actions that policy needs from the current state, where the true
layout is used only to play out the reveals.

Example:
    >>> from trl_agents.envs.minesweeper import Minesweeper
    >>> env = Minesweeper()
    >>> print(env.reset({"rows": 3, "cols": 4, "mines": [[0, 3], [2, 3]], "first_click": [1, 0]}))
    Here is the current board layout:
        0  1  2  3
     0  0  0  1  .
     1  0  0  2  .
     2  0  0  1  .
    >>> env.solver_value(), env.optimal_plan()
    (1, ['reveal 1 3'])
    >>> env.step("```reveal 1 3```")[1:3]
    (1.0, True)
"""

from __future__ import annotations

import math
import random
import re
from collections import defaultdict
from collections.abc import Iterable
from fractions import Fraction
from functools import lru_cache
from typing import Any, ClassVar, NamedTuple

from .base import INFO_SUCCESS, INFO_VALID, AgentEnv
from .parsing import extract_answer
from .registry import register_env
from .validation import check_int

# Symbols of the rendered board (CAST's minesweeper_env).
UNREVEALED, FLAG, MINE = ".", "F", "*"

# Keys of a seeded task row that override the constructor's generation settings for that task.
_TASK_KEYS = ("rows", "cols", "num_mines", "no_guess")
MIN_SIDE, MAX_SIDE = 3, 10  # our choice: the exact enumeration stays fast up to 10 x 10 (CAST plays 6x6 and 7x7)
_MAX_ENUMERATION_NODES = 2_000_000  # safety cap of one frontier component's enumeration (never reached up to 10x10)

# "reveal 2 3", "Reveal 2, 3", "flag (0, 4)": the verb, then two integers separated by spaces and/or one comma.
_ACTION = re.compile(r"\b(reveal|flag)\s*[\s(]\s*(\d+)\s*(?:,|\s)\s*(\d+)\s*\)?", re.IGNORECASE)
INVALID_ACTION_HELP = "Reply with one action: reveal R C or flag R C (zero-indexed row and column)."


@lru_cache(maxsize=64)
def _neighbours(rows: int, cols: int) -> tuple[tuple[int, ...], ...]:
    """The 8-neighbourhood of every cell index `r * cols + c`."""
    result = []
    for r in range(rows):
        for c in range(cols):
            result.append(
                tuple(
                    (r + dr) * cols + c + dc
                    for dr in (-1, 0, 1)
                    for dc in (-1, 0, 1)
                    if (dr or dc) and 0 <= r + dr < rows and 0 <= c + dc < cols
                )
            )
    return tuple(result)


# ---- the solver (peek-free: it sees revealed numbers and the mine count only) ---------------------------------------


class Analysis(NamedTuple):
    """What the revealed numbers prove about the unrevealed cells.

    Attributes:
        safe: Unrevealed cells that are safe in every layout consistent with the numbers and the mine count.
        mines: Unrevealed cells that are mines in every such layout.
        probabilities: Exact mine probability of every other unrevealed cell (uniform over consistent layouts),
            filled only when `safe` is empty (the policy needs them only to guess).
    """

    safe: frozenset[int]
    mines: frozenset[int]
    probabilities: dict[int, Fraction]


def _comb(n: int, k: int) -> int:
    return math.comb(n, k) if 0 <= k <= n else 0


def _convolve(distributions: Iterable[dict[int, int]]) -> dict[int, int]:
    """Distribution of the total mine count of independent parts (weights = numbers of layouts)."""
    total = {0: 1}
    for dist in distributions:
        combined: dict[int, int] = defaultdict(int)
        for t, w in total.items():
            for k, v in dist.items():
                combined[t + k] += w * v
        total = dict(combined)
    return total


def _propagate(
    constraints: dict[frozenset[int], int], unknown: set[int], num_mines: int
) -> tuple[set[int], set[int], dict[frozenset[int], int]]:
    """Single-constraint propagation, subset reasoning and the global count, to a fixpoint.

    Returns the proven safe cells, the proven mines and the remaining constraints over undetermined cells.
    """
    safe: set[int] = set()
    mines: set[int] = set()
    while True:
        changed = False
        reduced: dict[frozenset[int], int] = {}
        for cells, count in constraints.items():
            live = cells - safe - mines
            need = count - len(cells & mines)
            if not live:
                continue
            if need == 0:
                safe |= live
                changed = True
            elif need == len(live):
                mines |= live
                changed = True
            else:
                reduced[live] = need
        if not changed:
            # Subset reasoning: A ⊂ B means the cells B \ A hold exactly need(B) - need(A) mines.
            items = list(reduced.items())
            for a, need_a in items:
                for b, need_b in items:
                    if len(a) < len(b) and a < b:
                        rest, extra = b - a, need_b - need_a
                        if extra == 0 and not rest <= safe:
                            safe |= rest
                            changed = True
                        elif extra == len(rest) and not rest <= mines:
                            mines |= rest
                            changed = True
        if not changed:
            # The global count: no mines left means every undetermined cell is safe, and vice versa.
            undetermined = unknown - safe - mines
            left = num_mines - len(mines)
            if undetermined and left == 0:
                safe |= undetermined
                changed = True
            elif undetermined and left == len(undetermined):
                mines |= undetermined
                changed = True
        if not changed:
            return safe, mines, reduced


def _enumerate_component(
    group_sizes: list[int], group_constraints: list[list[int]], needs: list[int]
) -> tuple[dict[int, int], list[dict[int, int]]]:
    """All mine assignments of one frontier component, by groups of interchangeable cells.

    Cells that lie in exactly the same constraints form a group; a group of size s holding k mines stands for
    C(s, k) layouts. Returns `(layouts by total mines, per group: mines-weighted layouts by total mines)`.
    """
    num_groups = len(group_sizes)
    need = list(needs)
    capacity = [0] * len(needs)
    for g, cons in enumerate(group_constraints):
        for c in cons:
            capacity[c] += group_sizes[g]
    assignment = [0] * num_groups
    by_total: dict[int, int] = defaultdict(int)
    group_mines: list[dict[int, int]] = [defaultdict(int) for _ in range(num_groups)]
    nodes = 0

    def assign(g: int, total: int, weight: int) -> None:
        nonlocal nodes
        nodes += 1
        if nodes > _MAX_ENUMERATION_NODES:
            raise RuntimeError("Minesweeper frontier too large to enumerate exactly; use a smaller board")
        if g == num_groups:  # every constraint is met exactly: capacity 0 and need 0 were enforced on the way
            by_total[total] += weight
            for h in range(num_groups):
                if assignment[h]:
                    group_mines[h][total] += weight * assignment[h]
            return
        size, cons = group_sizes[g], group_constraints[g]
        for c in cons:
            capacity[c] -= size
        for k in range(size + 1):
            # After this group, each of its constraints must still be satisfiable by the groups left.
            if any(need[c] < k for c in cons):
                break
            if all(need[c] - k <= capacity[c] for c in cons):
                for c in cons:
                    need[c] -= k
                assignment[g] = k
                assign(g + 1, total + k, weight * math.comb(size, k))
                for c in cons:
                    need[c] += k
        assignment[g] = 0
        for c in cons:
            capacity[c] += size

    assign(0, 0, 1)
    return dict(by_total), [dict(d) for d in group_mines]


def analyze(rows: int, cols: int, num_mines: int, visible: dict[int, int]) -> Analysis:
    """Prove what can be proved about the unrevealed cells from the revealed numbers and the mine count.

    Args:
        rows, cols: Board size.
        num_mines: Total number of mines (public information).
        visible: Revealed cell index (`r * cols + c`) -> its number. Nothing else about the layout is read.
    """
    neighbours = _neighbours(rows, cols)
    unknown = {i for i in range(rows * cols) if i not in visible}
    constraints: dict[frozenset[int], int] = {}
    for cell, number in visible.items():
        cells = frozenset(n for n in neighbours[cell] if n not in visible)
        if cells:
            constraints[cells] = number
    safe, mines, reduced = _propagate(constraints, unknown, num_mines)
    if safe:
        return Analysis(frozenset(safe), frozenset(mines), {})

    # Exact enumeration: frontier components are independent except through the global mine count.
    frontier = set().union(*reduced) if reduced else set()
    interior = unknown - safe - mines - frontier
    parent = {cell: cell for cell in frontier}

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for cells in reduced:
        first, *others = sorted(cells)
        for other in others:
            parent[find(other)] = find(first)
    components: dict[int, list[frozenset[int]]] = defaultdict(list)
    for cells in sorted(reduced, key=sorted):
        components[find(min(cells))].append(cells)

    parts = []  # (groups of cells, layouts by total, per group mines-weighted layouts by total)
    for _, cons in sorted(components.items()):
        signature: dict[int, list[int]] = defaultdict(list)
        for index, cells in enumerate(cons):
            for cell in cells:
                signature[cell].append(index)
        groups: dict[tuple[int, ...], list[int]] = defaultdict(list)
        for cell in sorted(signature):
            groups[tuple(signature[cell])].append(cell)
        group_keys = list(groups)
        by_total, group_mines = _enumerate_component(
            [len(groups[key]) for key in group_keys], [list(key) for key in group_keys], [reduced[c] for c in cons]
        )
        parts.append(([groups[key] for key in group_keys], by_total, group_mines))

    left = num_mines - len(mines)
    n_interior = len(interior)
    boundary = _convolve(part[1] for part in parts)
    normaliser = sum(w * _comb(n_interior, left - t) for t, w in boundary.items())
    if normaliser == 0:
        raise ValueError("The revealed numbers are inconsistent with the mine count")
    probabilities: dict[int, Fraction] = {}
    proven_safe, proven_mines = set(safe), set(mines)
    for j, (groups, _, group_mines) in enumerate(parts):
        rest = _convolve(part[1] for i, part in enumerate(parts) if i != j)
        factor = {
            k: sum(w * _comb(n_interior, left - k - t) for t, w in rest.items())
            for k in range(sum(len(g) for g in groups) + 1)
        }
        for cells, weighted in zip(groups, group_mines):
            numerator = sum(w * factor[k] for k, w in weighted.items())
            p = Fraction(numerator, len(cells) * normaliser)
            for cell in cells:
                probabilities[cell] = p
            if p == 0:
                proven_safe.update(cells)
            elif p == 1:
                proven_mines.update(cells)
    if n_interior:
        expected = sum(w * _comb(n_interior, left - t) * (left - t) for t, w in boundary.items())
        p = Fraction(expected, n_interior * normaliser)
        for cell in interior:
            probabilities[cell] = p
        if p == 0:
            proven_safe |= interior
        elif p == 1:
            proven_mines |= interior
    for cell in proven_safe | proven_mines:
        probabilities.pop(cell, None)
    return Analysis(frozenset(proven_safe), frozenset(proven_mines), probabilities)


def _informativeness(cell: int, neighbours: tuple[tuple[int, ...], ...], visible: dict[int, int], mines) -> int:
    """Our "most informative" score: how many unrevealed, not-known-mine neighbours the reveal will tell about."""
    return sum(1 for n in neighbours[cell] if n not in visible and n not in mines)


def solver_choice(rows: int, cols: int, num_mines: int, visible: dict[int, int]) -> tuple[int, bool]:
    """The cell the solver reveals next and whether that is a guess.

    Policy (CAST's, docs/methods/cast.md#the-solvers): the provably safe cell with the most unrevealed neighbours; when no cell is provably safe,
    the cell with the lowest exact mine probability (ties: more unrevealed neighbours, then row-major order).
    Flagging the provable mines (CAST's second rule) changes nothing in this analysis, which re-derives them every
    time, so it is left out. Reads only `visible` (revealed numbers) and the mine count.
    """
    neighbours = _neighbours(rows, cols)
    analysis = analyze(rows, cols, num_mines, visible)
    if analysis.safe:
        return min(analysis.safe, key=lambda c: (-_informativeness(c, neighbours, visible, analysis.mines), c)), False
    candidates = analysis.probabilities
    if not candidates:
        raise ValueError("No unrevealed cell can be safe: the board is already cleared")
    choice = min(
        candidates, key=lambda c: (candidates[c], -_informativeness(c, neighbours, visible, analysis.mines), c)
    )
    return choice, True


# ---- boards --------------------------------------------------------------------------------------------------------


class SolverRollout(NamedTuple):
    """The solver played from a revealed set: its reveals in order, whether it ever guessed, and whether it won."""

    reveals: tuple[int, ...]
    guessed: bool
    won: bool


class MinesweeperBoard:
    """A mine layout with its first click (immutable). Cells are indices `r * cols + c`.

    Boards are shared by every env instance playing the same task (`board_for`), so the solver rollouts cached in
    `rollout()` are computed once per (board, revealed set).

    Args:
        rows, cols: Board size.
        mines: Mine cells.
        first_click: The cell revealed at the start (must be safe).
    """

    def __init__(self, rows: int, cols: int, mines: frozenset[int], first_click: int):
        self.rows, self.cols = rows, cols
        self.mines = mines
        self.first_click = first_click
        self.neighbours = _neighbours(rows, cols)
        self.numbers = tuple(
            -1 if i in mines else sum(n in mines for n in self.neighbours[i]) for i in range(rows * cols)
        )
        self.mine_mask = sum(1 << i for i in mines)
        self.safe_mask = ((1 << (rows * cols)) - 1) & ~self.mine_mask
        self.initial_revealed = self.flood(0, 0, first_click)
        self._rollouts: dict[int, SolverRollout] = {}

    def cell(self, index: int) -> tuple[int, int]:
        return divmod(index, self.cols)

    def flood(self, revealed: int, flags: int, cell: int) -> int:
        """Reveal `cell`; when it is a 0, reveal its neighbours too, recursively (flagged cells stay closed)."""
        revealed |= 1 << cell
        stack = [cell]
        while stack:
            current = stack.pop()
            if self.numbers[current] == 0:
                for n in self.neighbours[current]:
                    bit = 1 << n
                    if not (revealed | flags) & bit:
                        revealed |= bit
                        stack.append(n)
        return revealed

    def is_cleared(self, revealed: int) -> bool:
        return revealed & self.safe_mask == self.safe_mask

    def visible(self, revealed: int) -> dict[int, int]:
        """What a player sees: the number of every revealed safe cell."""
        return {i: self.numbers[i] for i in range(self.rows * self.cols) if revealed >> i & 1 and i not in self.mines}

    def rollout(self, revealed: int) -> SolverRollout:
        """Play the solver from `revealed` (agent flags are ignored) until it clears the board or hits a mine.

        The true layout only resolves each reveal (number shown, flood, or death); decisions see `visible()`. The
        result is cached for every revealed set along the way: the policy is deterministic and depends on the revealed
        set only, so each suffix of a rollout is the rollout from that point.
        """
        cached = self._rollouts.get(revealed)
        if cached is not None:
            return cached
        path: list[tuple[int, int, bool]] = []  # (revealed before, cell, guessed)
        current = revealed
        won = True
        while not self.is_cleared(current):
            cached = self._rollouts.get(current)
            if cached is not None:
                break
            cell, guess = solver_choice(self.rows, self.cols, len(self.mines), self.visible(current))
            path.append((current, cell, guess))
            if cell in self.mines:
                won = False
                break
            current = self.flood(current, 0, cell)
        tail = cached if cached is not None else SolverRollout((), False, won)
        if cached is None and not won:  # the last step of the path is the fatal guess
            before, cell, _ = path.pop()
            tail = SolverRollout((cell,), True, False)
            self._rollouts[before] = tail
        elif cached is None:
            self._rollouts[current] = tail
        for before, cell, guess in reversed(path):
            tail = SolverRollout((cell,) + tail.reveals, guess or tail.guessed, tail.won)
            self._rollouts[before] = tail
        return tail

    def render(self, revealed: int, flags: int) -> str:
        """CAST's board: a header of column indices, then one line per row; each cell is 3 characters wide.
        A revealed mine (the one that ended a lost game) shows as `*`. Lines carry no trailing spaces."""
        lines = ["   " + " ".join(f"{c:2d}" for c in range(self.cols))]
        for r in range(self.rows):
            cells = []
            for c in range(self.cols):
                i = r * self.cols + c
                if revealed >> i & 1:
                    cells.append(MINE if i in self.mines else str(self.numbers[i]))
                elif flags >> i & 1:
                    cells.append(FLAG)
                else:
                    cells.append(UNREVEALED)
            lines.append(f"{r:2d} " + "".join(f" {s} " for s in cells).rstrip())
        return "\n".join(lines)


@lru_cache(maxsize=4096)
def board_for(rows: int, cols: int, mines: frozenset[int], first_click: int) -> MinesweeperBoard:
    """The shared board object of a layout (so cached solver rollouts are reused across env instances)."""
    return MinesweeperBoard(rows, cols, mines, first_click)


@lru_cache(maxsize=4096)
def generate_board(
    seed: int, rows: int, cols: int, num_mines: int, no_guess: bool, max_attempts: int
) -> MinesweeperBoard:
    """The board of `seed`: attempt k draws a first click and the mines (outside the 3x3 zone around the click) from
    `random.Random(f"minesweeper/{seed}/{k}")`. A board is kept when the first click does not already clear it and,
    with `no_guess`, when the solver clears it from the first click without guessing."""
    total = rows * cols
    for attempt in range(max_attempts):
        rng = random.Random(f"minesweeper/{seed}/{attempt}")
        first = rng.randrange(total)
        zone = {first, *_neighbours(rows, cols)[first]}
        candidates = [i for i in range(total) if i not in zone]
        mines = frozenset(rng.sample(candidates, num_mines))
        board = board_for(rows, cols, mines, first)
        if board.is_cleared(board.initial_revealed):
            continue
        if no_guess and board.rollout(board.initial_revealed).guessed:
            continue
        return board
    raise ValueError(
        f"No Minesweeper board found for seed {seed} in {max_attempts} attempts with rows={rows}, cols={cols}, "
        f"num_mines={num_mines}, no_guess={no_guess}. Use fewer mines, a bigger board, or no_guess=False."
    )


# ---- argument checks ---------------------------------------------------------------------------------------------


def _check_settings(rows: Any, cols: Any, num_mines: Any, no_guess: Any) -> dict[str, Any]:
    rows = check_int("rows", rows, MIN_SIDE, MAX_SIDE)
    cols = check_int("cols", cols, MIN_SIDE, MAX_SIDE)
    # At least one safe cell outside the 3x3 zone of the first click, so the first click never has to clear it all.
    num_mines = check_int("num_mines", num_mines, 1, rows * cols - 10)
    if no_guess not in (True, False):
        raise ValueError(f"`no_guess` must be a bool, got {no_guess!r}")
    return {"rows": rows, "cols": cols, "num_mines": num_mines, "no_guess": bool(no_guess)}


def _check_cell(name: str, value: Any, rows: int, cols: int) -> int:
    if isinstance(value, (str, bytes)) or not hasattr(value, "__len__") or len(value) != 2:
        raise ValueError(f"`{name}` must be a [row, col] pair, got {value!r}")
    r, c = (check_int(f"{name} (row)", value[0], 0, rows - 1), check_int(f"{name} (col)", value[1], 0, cols - 1))
    return r * cols + c


def board_from_task(task: dict[str, Any], rows: int, cols: int) -> MinesweeperBoard:
    """The board of an explicit task row `{"mines": [[r, c], ...], "first_click": [r, c], "rows": R, "cols": C}`
    (CAST's key `mine_positions` works too; `rows`/`cols` default to the env's)."""
    rows = check_int("rows", rows if task.get("rows") is None else task["rows"], MIN_SIDE, MAX_SIDE)
    cols = check_int("cols", cols if task.get("cols") is None else task["cols"], MIN_SIDE, MAX_SIDE)
    key = "mines" if task.get("mines") is not None else "mine_positions"
    listed = task[key]
    if isinstance(listed, (str, bytes)) or not hasattr(listed, "__iter__"):
        raise ValueError(f"`{key}` must be a list of [row, col] pairs, got {listed!r}")
    mines = [_check_cell(key, cell, rows, cols) for cell in listed]
    if len(set(mines)) != len(mines):
        raise ValueError(f"`{key}` lists a cell twice: {listed!r}")
    if task.get("first_click") is None:
        raise ValueError("An explicit Minesweeper task needs `first_click` ([row, col]) next to its mines")
    first = _check_cell("first_click", task["first_click"], rows, cols)
    if first in mines:
        raise ValueError(f"`first_click` {list(task['first_click'])} is a mine; the first click must be safe")
    if task.get("num_mines") is not None and int(task["num_mines"]) != len(mines):
        raise ValueError(f"`num_mines`={task['num_mines']} does not match the {len(mines)} cells in `{key}`")
    board = board_for(rows, cols, frozenset(mines), first)
    if board.is_cleared(board.initial_revealed):
        raise ValueError("The first click already clears this board: there is nothing left to play")
    return board


def parse_action(text: str) -> tuple[str, int, int] | None:
    """`("reveal" | "flag", row, col)` from a model's raw output, or None.

    The answer region is `extract_answer(text)` (last <action> or ``` block, else the text without <think>). It is
    valid when it names exactly one distinct action: the verb (any case) then two integers separated by spaces
    and/or a comma, optionally in parentheses: `reveal 2 3`, `Reveal 2, 3`, `flag (0,4)`. Our choice (the CAST
    parser takes the first match anywhere); "reveal 1 1 or flag 2 2" is rejected as ambiguous.
    """
    if not isinstance(text, str):
        return None
    found = {(m.group(1).lower(), int(m.group(2)), int(m.group(3))) for m in _ACTION.finditer(extract_answer(text))}
    return found.pop() if len(found) == 1 else None


# ---- the environment ---------------------------------------------------------------------------------------------


@register_env
class Minesweeper(AgentEnv):
    """Minesweeper with seeded no-guess boards, CAST's rendering and the solver value K(s).

    A task row is `{"seed": s}` (a generated board; the row may also set `rows`, `cols`, `num_mines`, `no_guess`,
    which override the constructor's values for that task) or an explicit board
    `{"mines": [[r, c], ...], "first_click": [r, c], "rows": R, "cols": C}` (CAST's `mine_positions` also works).

    Args:
        rows: Board height (3 to 10).
        cols: Board width (3 to 10).
        num_mines: Mines per board (at most rows * cols - 10, so the first click never clears the board by force).
        no_guess: Keep only boards the solver clears from the first click without guessing (our choice, following
            the brief; CAST's own boards are random layouts with a 3x3 safe zone).
        max_generation_attempts: Layouts tried per seed before giving up with a ValueError.
    """

    solver_semantics = "minesweeper"  # K(s) counts safe reveals; see AgentEnv.solver_semantics
    name = "minesweeper"
    task_keys = ("seed", "mines", "mine_positions")
    instructions = (
        "You are playing Minesweeper. Some cells of the board hide mines; open every cell that is not a mine.\n"
        "Board: rows and columns are numbered from 0 (row numbers on the left, column numbers on top). Symbols: "
        ". unopened cell, F your flag, 0-8 the number of mines among the (up to 8) neighbouring cells, * a mine.\n"
        "Opening a 0 also opens its neighbours. Opening a mine ends the game (lost); opening the last safe cell wins. "
        "Flags are only notes for yourself: they are not needed to win, and a flagged cell cannot be opened.\n"
        "Actions (one per turn): reveal R C to open the cell in row R, column C; flag R C to put or remove a flag.\n"
        "Answer with exactly one action inside a ``` block, for example ```reveal 3 2``` or ```flag 0 4```."
    )

    # Seed ranges of the built-in splits: train [0, 1e6), eval [1e6, 2e6), unseen [2e6, 3e6).
    SPLIT_SEED_START: ClassVar[dict[str, int]] = {"train": 0, "eval": 1_000_000, "unseen": 2_000_000}
    SPLIT_DEFAULT_COUNT: ClassVar[dict[str, int]] = {"train": 8000, "eval": 200, "unseen": 200}
    SPLIT_TASK_SETTINGS: ClassVar[dict[str, dict[str, Any]]] = {"unseen": {"rows": 7, "cols": 7, "num_mines": 10}}

    def __init__(
        self,
        rows: int = 6,
        cols: int = 6,
        num_mines: int = 7,
        no_guess: bool = True,
        max_generation_attempts: int = 2000,
    ):
        self._settings = _check_settings(rows, cols, num_mines, no_guess)
        self.max_generation_attempts = check_int("max_generation_attempts", max_generation_attempts, 1)
        self._board: MinesweeperBoard | None = None
        self._revealed = 0
        self._flags = 0
        self._done = False

    # ---- episode ---------------------------------------------------------------------------------------------------

    def reset(self, task: dict[str, Any]) -> str:
        """Load the task's board (seeded or explicit), reveal the first click, and return the board."""
        if task.get("mines") is not None or task.get("mine_positions") is not None:
            board = board_from_task(task, self._settings["rows"], self._settings["cols"])
        elif task.get("seed") is not None:
            settings = dict(self._settings)
            settings.update({k: task[k] for k in _TASK_KEYS if task.get(k) is not None})
            s = _check_settings(**settings)
            seed = check_int("seed", task["seed"], 0)
            board = generate_board(
                seed, s["rows"], s["cols"], s["num_mines"], s["no_guess"], self.max_generation_attempts
            )
        else:
            raise ValueError(f"A Minesweeper task needs a 'seed' or 'mines' + 'first_click', got keys {sorted(task)}")
        self._board = board
        self._revealed = board.initial_revealed
        self._flags = 0
        self._done = False
        return self.render()

    def step(self, action_text: str) -> tuple[str, float, bool, dict[str, Any]]:
        board = self._require_board()
        if self._done:
            raise RuntimeError("The episode is over; call reset() first")
        parsed = parse_action(action_text)
        if parsed is None:
            return self._invalid(f"Invalid action. {INVALID_ACTION_HELP}")
        kind, r, c = parsed
        if not (0 <= r < board.rows and 0 <= c < board.cols):
            return self._invalid(
                f"Invalid action: cell ({r}, {c}) is outside the {board.rows}x{board.cols} board "
                f"(rows 0-{board.rows - 1}, columns 0-{board.cols - 1})."
            )
        cell, bit = r * board.cols + c, 1 << (r * board.cols + c)
        if self._revealed & bit:
            return self._invalid(f"Invalid action: cell ({r}, {c}) is already revealed.")
        action = f"{kind} {r} {c}"
        if kind == "flag":
            self._flags ^= bit
            return self.render(), 0.0, False, self._info(True, action, mine_hit=False, opened=0)
        if self._flags & bit:
            return self._invalid(f"Invalid action: cell ({r}, {c}) is flagged; remove the flag (flag {r} {c}) first.")
        if cell in board.mines:
            self._revealed |= bit
            self._done = True
            return self.render(), 0.0, True, self._info(True, action, mine_hit=True, opened=0)
        before = self._revealed
        self._revealed = board.flood(self._revealed, self._flags, cell)
        info = self._info(True, action, mine_hit=False, opened=(self._revealed & ~before).bit_count())
        self._done = info[INFO_SUCCESS]
        return self.render(), 1.0 if self._done else 0.0, self._done, info

    def _invalid(self, feedback: str) -> tuple[str, float, bool, dict[str, Any]]:
        return f"{feedback}\n{self.render()}", 0.0, False, self._info(False, None, mine_hit=False, opened=0)

    def _info(self, valid: bool, action: str | None, mine_hit: bool, opened: int) -> dict[str, Any]:
        board = self._board
        return {
            INFO_VALID: valid,
            INFO_SUCCESS: not mine_hit and board.is_cleared(self._revealed),
            "action": action,
            "mine_hit": mine_hit,
            "opened": opened,  # cells this reveal opened (flood included)
            "safe_left": (board.safe_mask & ~self._revealed).bit_count(),
            "safe_cells": board.safe_mask.bit_count(),  # what CAST pays for a win the solver could not find
            "flags": self._flags.bit_count(),
        }

    def render(self) -> str:
        """The current observation: CAST's "Here is the current board layout:" and the board."""
        board = self._require_board()
        return "Here is the current board layout:\n" + board.render(self._revealed, self._flags)

    def _require_board(self) -> MinesweeperBoard:
        if self._board is None:
            raise RuntimeError("Call reset(task) before using the environment")
        return self._board

    @property
    def board(self) -> MinesweeperBoard:
        """The current layout (mines included: for tests and analysis, never shown to the policy)."""
        return self._require_board()

    # ---- solver ----------------------------------------------------------------------------------------------------

    def _lost(self) -> bool:
        return self._revealed & self._require_board().mine_mask != 0

    def _wrong_flags(self) -> list[int]:
        board = self._require_board()
        flags = self._flags & board.safe_mask & ~self._revealed
        return [i for i in range(board.rows * board.cols) if flags >> i & 1]

    def solver_value(self) -> float:
        """CAST's K(s): the solver's reveals needed to clear the board from here, plus one per flag on a safe cell
        (it must be removed before that cell can open). 0 when won; `math.inf` after a mine was hit, or when the
        solver's forced guess hits a mine. Not a proven optimum: CAST defines K by this solver."""
        board = self._require_board()
        if self._lost():
            return math.inf
        rollout = board.rollout(self._revealed)
        if not rollout.won:
            return math.inf
        return len(rollout.reveals) + len(self._wrong_flags())

    def optimal_plan(self) -> list[str] | None:
        """The solver's actions from here: first `flag R C` to remove every flag on a safe cell, then its reveals.
        Its length equals `solver_value()` (it is the solver's plan, not a proven shortest one); None when K is
        infinite. The solver's own flags are bookkeeping and are not part of the plan."""
        board = self._require_board()
        if self._lost():
            return None
        rollout = board.rollout(self._revealed)
        if not rollout.won:
            return None
        unflags = [f"flag {r} {c}" for r, c in map(board.cell, self._wrong_flags())]
        return unflags + [f"reveal {r} {c}" for r, c in map(board.cell, rollout.reveals)]

    # ---- capabilities ----------------------------------------------------------------------------------------------

    def snapshot(self) -> tuple:
        return (self._board, self._revealed, self._flags, self._done)

    def restore(self, snapshot: tuple) -> None:
        self._board, self._revealed, self._flags, self._done = snapshot

    def state_key(self) -> tuple[int, int]:
        """`(revealed mask, flag mask)`: bit `r * cols + c` of each int is the cell (r, c)."""
        self._require_board()
        return (self._revealed, self._flags)

    # ---- splits ----------------------------------------------------------------------------------------------------

    @classmethod
    def task_split(cls, split: str, count: int | None = None, **env_kwargs: Any) -> list[dict[str, Any]]:
        """Seeded task rows: `"train"` (seeds from 0) and `"eval"` (from 1_000_000) on the env's settings (default
        6x6, 7 mines), `"unseen"` (from 2_000_000) with 7x7 and 10 mines unless overridden (CAST's splits, docs/methods/cast.md#the-games). Generation
        settings among `env_kwargs` are copied into the rows; rows hold seeds only (no board is generated here)."""
        cls(**env_kwargs)  # validate every argument now rather than at the first reset
        settings = dict(cls.SPLIT_TASK_SETTINGS.get(split, {}))
        settings.update({k: v for k, v in env_kwargs.items() if k in _TASK_KEYS})
        return cls.seeded_split(split, count, **settings)
