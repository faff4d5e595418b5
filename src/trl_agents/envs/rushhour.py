"""Rush Hour: slide the red car out of a 6x6 parking lot, with seeded puzzles and an exact distance table.

Vehicles (length 2 or 3) slide along their own row or column; one slide of any distance is one move. The red car `A`
sits on row 2 and leaves through the exit on the right edge: the puzzle is solved when its rightmost cell reaches
column 5. Boards are CAST's 36-character strings (`o` empty, `x` wall, letters vehicles, row-major), or generated
from a seed by reverse scrambling of a solved position.

The solver is exact (CAST's `table` backend, docs/methods/cast.md#the-solvers): a breadth-first search enumerates
every state reachable from the start, then a multi-source BFS from all solved states gives the optimal number of
moves N(s) of each of them. The table is cached per board, so `solver_value()` and `optimal_plan()` are lookups.

Example:
    >>> from trl_agents.envs.rushhour import RushHour
    >>> env = RushHour()
    >>> print(env.reset({"board": "ooooBoooooBoAAooBooooooooooooooooooo"}))
    Grid:
    . . . . B .
    . . . . B .
    A A . . B . >
    . . . . . .
    . . . . . .
    . . . . . .
    <BLANKLINE>
    Coordinates:
    Board size: 6 rows x 6 cols (zero-indexed; exit at row 2, right edge).
    A (red car): horizontal, cells [(2,0), (2,1)]
    B: vertical, cells [(0,4), (1,4), (2,4)]
    >>> env.solver_value(), env.optimal_plan()
    (2, ['B+3', 'A+4'])
"""

from __future__ import annotations

import math
import random
import re
import threading
from collections import OrderedDict
from functools import lru_cache
from typing import Any, ClassVar

from .base import INFO_SUCCESS, INFO_VALID, AgentEnv
from .parsing import extract_answer
from .registry import register_env
from .validation import check_int

SIZE = 6  # the board is 6 x 6 (CAST, Fogleman's database)
EXIT_ROW = 2
RED = "A"
EMPTY_SYMBOLS = ("o", ".")
WALL = "x"
_BITS = 3  # bits per vehicle offset in a packed state (offsets 0..4 on a 6-wide board)

# CAST's grammar: "A+2", "b-1", "[A+]" (1 step), spaces allowed; the whole answer must be one move (fullmatch).
_ACTION = re.compile(r"\[?\s*([A-Za-z])\s*([+-])\s*(\d*)\s*\]?")
INVALID_ACTION_HELP = (
    "Reply with one move: a vehicle letter, + or -, and a number of cells, e.g. A+2 (+ is right for horizontal "
    "vehicles and down for vertical ones)."
)

# Keys of a seeded task row that override the constructor's generation settings for that task.
_TASK_KEYS = ("num_vehicles", "min_moves", "max_moves", "num_walls")
_TABLE_CACHE_SIZE = 256


# ---- boards ---------------------------------------------------------------------------------------------------------


def _line_slides(length: int, offset: int, line: int) -> tuple[int, ...]:
    """Legal signed slides of a vehicle of `length` at `offset` on a 6-cell line whose occupied cells (the vehicle's
    own included) are the bits of `line`: forward distances ascending, then backward ones."""
    others = line & ~(((1 << length) - 1) << offset)
    slides = []
    d = 1
    while offset + length - 1 + d < SIZE and not others >> (offset + length - 1 + d) & 1:
        slides.append(d)
        d += 1
    d = -1
    while offset + d >= 0 and not others >> (offset + d) & 1:
        slides.append(d)
        d -= 1
    return tuple(slides)


# _SLIDES[length][offset][line]: `_line_slides` for every case, precomputed (the solver's inner loop indexes it).
_SLIDES = {
    length: tuple(tuple(_line_slides(length, o, line) for line in range(64)) for o in range(SIZE - length + 1))
    for length in (2, 3)
}


class RushHourLayout:
    """The static part of a board: vehicles (label, orientation, length, row or column) and walls.

    A state is one int packing every vehicle's offset along its line (its column if horizontal, its row if vertical),
    3 bits per vehicle in label order, so states hash fast and a slide is one addition. Occupancy is kept twice, as
    a row-major bitmask and as a column-major one, so the 6 cells of any vehicle's line are one shift and mask away.
    """

    def __init__(
        self,
        labels: tuple[str, ...],
        horizontal: tuple[bool, ...],
        lengths: tuple[int, ...],
        lines: tuple[int, ...],
        walls: frozenset[int],
    ):
        self.labels, self.horizontal, self.lengths, self.lines, self.walls = labels, horizontal, lengths, lines, walls
        self.max_offset = tuple(SIZE - n for n in lengths)
        self.index = {label: v for v, label in enumerate(labels)}
        # Row-major and column-major bitmasks of walls and of each vehicle at each offset.
        self.wall_rows = sum(1 << w for w in walls)
        self.wall_cols = sum(1 << ((w % SIZE) * SIZE + w // SIZE) for w in walls)
        self.row_masks = tuple(
            tuple(sum(1 << (r * SIZE + c) for r, c in self.cells(v, o)) for o in range(self.max_offset[v] + 1))
            for v in range(len(labels))
        )
        self.col_masks = tuple(
            tuple(sum(1 << (c * SIZE + r) for r, c in self.cells(v, o)) for o in range(self.max_offset[v] + 1))
            for v in range(len(labels))
        )

    def cells(self, v: int, offset: int) -> list[tuple[int, int]]:
        """The (row, col) cells of vehicle v at `offset`."""
        if self.horizontal[v]:
            return [(self.lines[v], offset + k) for k in range(self.lengths[v])]
        return [(offset + k, self.lines[v]) for k in range(self.lengths[v])]

    def offsets(self, state: int) -> list[int]:
        mask = (1 << _BITS) - 1
        return [(state >> (_BITS * v)) & mask for v in range(len(self.labels))]

    def pack(self, offsets: list[int]) -> int:
        return sum(o << (_BITS * v) for v, o in enumerate(offsets))

    def is_solved(self, state: int) -> bool:
        return state & ((1 << _BITS) - 1) == SIZE - self.lengths[0]  # vehicle 0 is the red car

    def occupancy(self, state: int) -> tuple[int, int]:
        """(row-major, column-major) occupancy bitmasks of a state."""
        rows, cols = self.wall_rows, self.wall_cols
        for v, o in enumerate(self.offsets(state)):
            rows |= self.row_masks[v][o]
            cols |= self.col_masks[v][o]
        return rows, cols

    def moves(self, state: int) -> list[tuple[int, int, int]]:
        """Every legal slide `(vehicle, signed cells, next state)`: vehicles in label order, forward (right/down)
        distances ascending, then backward ones. A slide is legal when every cell it passes through is free."""
        rows, cols = self.occupancy(state)
        result = []
        for v, o in enumerate(self.offsets(state)):
            line = (rows if self.horizontal[v] else cols) >> (self.lines[v] * SIZE) & 63
            for d in _SLIDES[self.lengths[v]][o][line]:
                result.append((v, d, state + (d << (_BITS * v))))
        return result

    def slide(self, state: int, v: int, d: int) -> int | None:
        """The state after sliding vehicle v by d cells, or None when the edge or anything on the way blocks it
        (all-or-nothing, as CAST)."""
        for move_v, move_d, after in self.moves(state):
            if move_v == v and move_d == d:
                return after
        return None

    def to_string(self, state: int) -> str:
        """CAST's 36-character board string (`o` empty, `x` wall, vehicle letters)."""
        grid = ["o"] * (SIZE * SIZE)
        for w in self.walls:
            grid[w] = WALL
        for v, o in enumerate(self.offsets(state)):
            for r, c in self.cells(v, o):
                grid[r * SIZE + c] = self.labels[v]
        return "".join(grid)

    def render(self, state: int) -> str:
        """CAST's `grid_coord` observation: the grid with `>` after the exit row, then every vehicle's cells."""
        grid = [["."] * SIZE for _ in range(SIZE)]
        for w in sorted(self.walls):
            grid[w // SIZE][w % SIZE] = WALL
        offsets = self.offsets(state)
        for v, o in enumerate(offsets):
            for r, c in self.cells(v, o):
                grid[r][c] = self.labels[v]
        rows = [" ".join(row) + (" >" if r == EXIT_ROW else "") for r, row in enumerate(grid)]
        lines = [f"Board size: {SIZE} rows x {SIZE} cols (zero-indexed; exit at row {EXIT_ROW}, right edge)."]
        for v, o in enumerate(offsets):
            tag = " (red car)" if v == 0 else ""
            orientation = "horizontal" if self.horizontal[v] else "vertical"
            cells = ", ".join(f"({r},{c})" for r, c in self.cells(v, o))
            lines.append(f"{self.labels[v]}{tag}: {orientation}, cells [{cells}]")
        if self.walls:
            lines.append("Walls: [" + ", ".join(f"({w // SIZE},{w % SIZE})" for w in sorted(self.walls)) + "]")
        return "Grid:\n" + "\n".join(rows) + "\n\nCoordinates:\n" + "\n".join(lines)


def parse_board(text: Any) -> tuple[RushHourLayout, int]:
    """Parse a 36-character board string into `(layout, state)`; raises ValueError saying what is wrong."""
    if not isinstance(text, str) or len(text) != SIZE * SIZE:
        raise ValueError(f"A Rush Hour board must be a string of {SIZE * SIZE} characters (row-major), got {text!r}")
    walls, cells = set(), {}
    for i, ch in enumerate(text):
        if ch in EMPTY_SYMBOLS:
            continue
        if ch == WALL:
            walls.add(i)
        elif "A" <= ch <= "Z":
            cells.setdefault(ch, []).append(i)
        else:
            raise ValueError(f"Unknown Rush Hour board symbol {ch!r} at index {i}; use o or . (empty), x (wall), A-Z")
    if RED not in cells:
        raise ValueError("A Rush Hour board needs the red car 'A' (horizontal, length 2, on row 2)")
    labels, horizontal, lengths, lines, offsets = [], [], [], [], []
    for label in sorted(cells):  # 'A' sorts first: vehicle 0 is the red car
        where = cells[label]
        if len(where) not in (2, 3):
            raise ValueError(f"Vehicle {label!r} has {len(where)} cells; vehicles have length 2 or 3")
        rows, cols = {i // SIZE for i in where}, {i % SIZE for i in where}
        if len(rows) == 1 and len(cols) == len(where) and max(cols) - min(cols) == len(where) - 1:
            is_horizontal = True
        elif len(cols) == 1 and len(rows) == len(where) and max(rows) - min(rows) == len(where) - 1:
            is_horizontal = False
        else:
            raise ValueError(f"Vehicle {label!r} must occupy contiguous cells of one row or one column")
        labels.append(label)
        horizontal.append(is_horizontal)
        lengths.append(len(where))
        lines.append(min(rows) if is_horizontal else min(cols))
        offsets.append(min(cols) if is_horizontal else min(rows))
    if not (horizontal[0] and lengths[0] == 2 and lines[0] == EXIT_ROW):
        raise ValueError("The red car 'A' must be horizontal, of length 2, on row 2 (the exit row)")
    layout = _layout(tuple(labels), tuple(horizontal), tuple(lengths), tuple(lines), frozenset(walls))
    return layout, layout.pack(offsets)


@lru_cache(maxsize=1024)
def _layout(labels, horizontal, lengths, lines, walls) -> RushHourLayout:
    return RushHourLayout(labels, horizontal, lengths, lines, walls)


# ---- the exact solver ------------------------------------------------------------------------------------------------


@lru_cache(maxsize=1)
def _slide_array():
    """`_SLIDES` as one numpy array [length - 2, offset, line, slot] of signed slides, 0-padded to 8 slots."""
    import numpy as np

    table = np.zeros((2, SIZE - 1, 64, 8), dtype=np.int64)
    for length in (2, 3):
        for offset in range(SIZE - length + 1):
            for line in range(64):
                slides = _SLIDES[length][offset][line]
                table[length - 2, offset, line, : len(slides)] = slides
    return table


class DistanceTable:
    """Exact optimal distances N(s) over the connected component of a start state (CAST's `table` backend).

    A breadth-first search enumerates the component, then a multi-source BFS from all its solved states gives N(s)
    (slides are reversible, so the move graph is undirected and distances to the solved set are BFS layers). Both
    searches expand a whole layer at once with numpy: every vehicle's offset, the occupancy of its row or column and
    its legal slides are array lookups, so even components of tens of thousands of states take milliseconds. States
    of the component from which no solved state is reachable get N = inf.

    Args:
        layout: The static board.
        start: A state of the component.
        max_states: Most states to enumerate; a bigger component raises a ValueError.
    """

    def __init__(self, layout: RushHourLayout, start: int, max_states: int):
        import numpy as np

        self.layout = layout
        num = len(layout.labels)
        shifts = (_BITS * np.arange(num, dtype=np.int64))[:, None]
        row_masks, col_masks = np.zeros((num, SIZE - 1), np.int64), np.zeros((num, SIZE - 1), np.int64)
        for v in range(num):
            row_masks[v, : len(layout.row_masks[v])] = layout.row_masks[v]
            col_masks[v, : len(layout.col_masks[v])] = layout.col_masks[v]
        horizontal = np.array(layout.horizontal)[:, None]
        line_shifts = (np.array(layout.lines, dtype=np.int64) * SIZE)[:, None]
        length_index = (np.array(layout.lengths) - 2)[:, None]
        vehicle_index = np.arange(num)[:, None]
        slides = _slide_array()

        def neighbours(states):  # every state one slide away from `states` (with repeats)
            offsets = (states[None, :] >> shifts) & 7  # [vehicle, state]
            rows = np.bitwise_or.reduce(row_masks[vehicle_index, offsets], axis=0) | layout.wall_rows
            cols = np.bitwise_or.reduce(col_masks[vehicle_index, offsets], axis=0) | layout.wall_cols
            lines = (np.where(horizontal, rows[None, :], cols[None, :]) >> line_shifts) & 63
            moves = slides[length_index, offsets, lines]  # [vehicle, state, slot]
            return (states[None, :, None] + (moves << shifts[:, :, None]))[moves != 0]

        # 1. The component, layer by layer. In an undirected graph a layer's neighbours lie in the previous layer,
        # the layer itself or the next one, so only the last two layers are needed to spot the new states.
        previous, current = np.empty(0, np.int64), np.array([start], np.int64)
        layers, total = [current], 1
        while current.size:
            reached = np.unique(neighbours(current))
            new = reached[
                ~(np.isin(reached, previous, assume_unique=True) | np.isin(reached, current, assume_unique=True))
            ]
            total += new.size
            if total > max_states:
                raise ValueError(
                    f"The Rush Hour state space of this board has more than max_states={max_states} states; "
                    "raise `max_states` to solve it"
                )
            previous, current = current, new
            layers.append(new)
        self.states = np.sort(np.concatenate(layers))
        # 2. Distances to the solved set: BFS layers from all solved states at once.
        distances = np.full(self.states.size, -1, dtype=np.int32)
        solved = (self.states & 7) == SIZE - layout.lengths[0]
        distances[solved] = 0
        frontier, depth = self.states[solved], 0
        while frontier.size:
            depth += 1
            reached = np.unique(neighbours(frontier))
            index = np.searchsorted(self.states, reached)
            fresh = distances[index] < 0
            distances[index[fresh]] = depth
            frontier = reached[fresh]
        self.distances = distances
        self.num_states = int(self.states.size)

    def value(self, state: int) -> float:
        """N(state), or inf when it is unsolvable or not in this component."""
        i = int(self.states.searchsorted(state))
        if i < self.num_states and int(self.states[i]) == state and self.distances[i] >= 0:
            return int(self.distances[i])
        return math.inf

    def distances_in(self, low: int, high: int) -> list[int]:
        """The distinct values of N in `[low, high]` that some state of the component has, ascending."""
        present = self.distances[(self.distances >= low) & (self.distances <= high)]
        return sorted(set(present.tolist()))

    def states_at(self, low: int, high: int) -> list[int]:
        """The states with `low <= N <= high`, in increasing packed order."""
        chosen = (self.distances >= low) & (self.distances <= high)
        return [int(s) for s in self.states[chosen]]

    def plan(self, state: int) -> list[tuple[int, int]] | None:
        """An optimal list of `(vehicle, signed cells)` slides: at each state the first legal slide (in
        `RushHourLayout.moves` order) to a state one move closer. None when no solved state is reachable."""
        remaining = self.value(state)
        if remaining == math.inf:
            return None
        plan = []
        while remaining > 0:
            remaining -= 1
            v, d, state = next(m for m in self.layout.moves(state) if self.value(m[2]) == remaining)
            plan.append((v, d))
        return plan


# Tables by board string: every state of a component maps to the same table (generation registers the puzzle). The
# lock makes look-up-and-update atomic for environments stepped on threads; tables are built outside it.
_TABLES: OrderedDict[str, DistanceTable] = OrderedDict()
_TABLES_LOCK = threading.Lock()


def distance_table(board: str, max_states: int = 1_000_000) -> DistanceTable:
    """The exact table of `board`'s component, cached per board string (the last 256 boards)."""
    with _TABLES_LOCK:
        table = _TABLES.get(board)
        if table is not None:
            _TABLES.move_to_end(board)
    if table is None:
        layout, state = parse_board(board)
        table = DistanceTable(layout, state, max_states)
        _remember(board, table)
    elif table.num_states > max_states:  # cached by a caller with a bigger budget: the cap still applies
        raise ValueError(
            f"The Rush Hour state space of this board has {table.num_states} states, more than "
            f"max_states={max_states}; raise `max_states` to solve it"
        )
    return table


def _remember(board: str, table: DistanceTable) -> None:
    with _TABLES_LOCK:
        _TABLES[board] = table
        _TABLES.move_to_end(board)
        while len(_TABLES) > _TABLE_CACHE_SIZE:
            _TABLES.popitem(last=False)


def format_move(label: str, d: int) -> str:
    return f"{label}{'+' if d > 0 else '-'}{abs(d)}"


# ---- generation --------------------------------------------------------------------------------------------------


@lru_cache(maxsize=4096)
def generate_board(
    seed: int, num_vehicles: int, min_moves: int, max_moves: int, num_walls: int, max_states: int, max_attempts: int
) -> str:
    """The board string of `seed`, by reverse scrambling.

    Attempt k draws from `random.Random(f"rushhour/{seed}/{k}")`: the red car at the exit (solved), then
    `num_vehicles - 1` vehicles (length 2 with probability 2/3, else 3; random orientation; no horizontal vehicle on
    the exit row, as in CAST's generator) and `num_walls` walls off the exit row, at random free places. The BFS of
    the distance table visits every state that sliding away from this solved position can reach (every state a
    random walk of slides could scramble it into), with its exact distance. One distance in `[min_moves,
    max_moves]` that some state has is drawn uniformly, then one state at that distance. An attempt without any
    state in the range is discarded.
    """
    for attempt in range(max_attempts):
        rng = random.Random(f"rushhour/{seed}/{attempt}")
        grid = ["o"] * (SIZE * SIZE)
        grid[EXIT_ROW * SIZE + SIZE - 2] = grid[EXIT_ROW * SIZE + SIZE - 1] = RED
        placed, tries = 1, 0
        while placed < num_vehicles and tries < 50 * num_vehicles:
            tries += 1
            length = rng.choice((2, 2, 3))
            if rng.random() < 0.5:
                row, col = rng.randrange(SIZE), rng.randrange(SIZE - length + 1)
                if row == EXIT_ROW:
                    continue
                cells = [row * SIZE + col + k for k in range(length)]
            else:
                row, col = rng.randrange(SIZE - length + 1), rng.randrange(SIZE)
                cells = [(row + k) * SIZE + col for k in range(length)]
            if any(grid[c] != "o" for c in cells):
                continue
            for c in cells:
                grid[c] = chr(ord(RED) + placed)
            placed += 1
        if placed < num_vehicles:
            continue
        free = [i for i in range(SIZE * SIZE) if grid[i] == "o" and i // SIZE != EXIT_ROW]
        if len(free) < num_walls:
            continue
        for w in rng.sample(free, num_walls):
            grid[w] = WALL
        layout, solved = parse_board("".join(grid))
        table = DistanceTable(layout, solved, max_states)
        distances = table.distances_in(min_moves, max_moves)
        if not distances:
            continue
        # Each distance present is equally likely: states at the low end of the range are far more numerous, and
        # drawing a state uniformly would make nearly all puzzles the easiest allowed (our choice).
        distance = rng.choice(distances)
        board = layout.to_string(rng.choice(table.states_at(distance, distance)))
        _remember(board, table)
        return board
    raise ValueError(
        f"No Rush Hour puzzle found for seed {seed} in {max_attempts} attempts with num_vehicles={num_vehicles}, "
        f"num_walls={num_walls}, optimal moves in [{min_moves}, {max_moves}]. Widen the range or change the vehicles."
    )


# ---- argument checks ---------------------------------------------------------------------------------------------


def _check_settings(num_vehicles: Any, min_moves: Any, max_moves: Any, num_walls: Any) -> dict[str, int]:
    num_vehicles = check_int("num_vehicles", num_vehicles, 1, 12)  # our cap: 12 vehicles already fill half the lot
    min_moves = check_int("min_moves", min_moves, 1)
    max_moves = check_int("max_moves", max_moves, min_moves)
    num_walls = check_int("num_walls", num_walls, 0, 6)
    return {"num_vehicles": num_vehicles, "min_moves": min_moves, "max_moves": max_moves, "num_walls": num_walls}


def parse_action(text: str) -> tuple[str, int] | None:
    """`(vehicle letter, signed cells)` from a model's raw output, or None.

    The answer region (`extract_answer`: last <action> or ``` block, else the text without <think>) must be exactly
    one move, as CAST's fullmatch parser: `A+2`, `b-1`, `[C+]` (1 cell), `B + 3`. Zero cells is not a move.
    """
    if not isinstance(text, str):
        return None
    match = _ACTION.fullmatch(extract_answer(text))
    if match is None:
        return None
    cells = int(match.group(3)) if match.group(3) else 1
    if cells == 0:
        return None
    return match.group(1).upper(), cells if match.group(2) == "+" else -cells


# ---- the environment ---------------------------------------------------------------------------------------------


@register_env
class RushHour(AgentEnv):
    """Rush Hour on CAST's boards or seeded puzzles, with the exact optimal distance N(s) of every state.

    A task row is `{"board": "oEEEoooDDDBooAAoBoooooBoGGoCFFoooCoo"}` (CAST's key `board_config` works too) or
    `{"seed": s}` (a generated puzzle; the row may also set `num_vehicles`, `min_moves`, `max_moves`, `num_walls`,
    which override the constructor's values for that task).

    Args:
        num_vehicles: Vehicles per generated puzzle, the red car included (CAST: 7 in-distribution, 9 unseen).
        min_moves: Fewest optimal moves of a generated puzzle.
        max_moves: Most optimal moves of a generated puzzle.
        num_walls: Wall cells of a generated puzzle (CAST's datasets have none).
        max_states: Cap on the states the exact solver enumerates per board (a bigger component raises).
        max_generation_attempts: Random placements tried per seed before giving up with a ValueError.
    """

    name = "rushhour"
    task_keys = ("seed", "board", "board_config")
    instructions = (
        "You are playing Rush Hour on a 6x6 parking lot. Get the red car A out through the exit on the right edge "
        "of row 2 (marked >).\n"
        "Grid symbols: . empty, x wall, letters are vehicles (each 2 or 3 cells long). Rows and columns are numbered "
        "from 0; the coordinates list gives every vehicle's cells.\n"
        "A vehicle only slides along its own direction: horizontal ones left and right, vertical ones up and down. It "
        "cannot pass through other vehicles, walls or the edge. The puzzle is solved when A reaches column 5.\n"
        "A move is the vehicle letter, + or -, and the number of cells: + is right (horizontal) or down (vertical), "
        "- is left or up. Example: A+2 slides A two cells right. A slide that is blocked anywhere on the way does "
        "not move at all. One slide of any distance counts as one move, so prefer one long slide to several short "
        "ones.\n"
        "Answer with exactly one move inside a ``` block, for example ```B-1```."
    )

    SPLIT_SEED_START: ClassVar[dict[str, int]] = {"train": 0, "eval": 1_000_000, "unseen": 2_000_000}
    SPLIT_DEFAULT_COUNT: ClassVar[dict[str, int]] = {"train": 8000, "eval": 200, "unseen": 200}
    SPLIT_TASK_SETTINGS: ClassVar[dict[str, dict[str, Any]]] = {
        "unseen": {"num_vehicles": 9, "min_moves": 7, "max_moves": 9}
    }

    def __init__(
        self,
        num_vehicles: int = 7,
        min_moves: int = 6,
        max_moves: int = 8,
        num_walls: int = 0,
        max_states: int = 1_000_000,
        max_generation_attempts: int = 500,
    ):
        self._settings = _check_settings(num_vehicles, min_moves, max_moves, num_walls)
        self.max_states = check_int("max_states", max_states, 1)
        self.max_generation_attempts = check_int("max_generation_attempts", max_generation_attempts, 1)
        self._table: DistanceTable | None = None
        self._state = 0
        self._done = False

    # ---- episode ---------------------------------------------------------------------------------------------------

    def reset(self, task: dict[str, Any]) -> str:
        """Load the task's board (`{"board": ...}` or `{"seed": s}`) and return the observation."""
        board = task.get("board") if task.get("board") is not None else task.get("board_config")
        if board is None:
            if task.get("seed") is None:
                raise ValueError(
                    f"A Rush Hour task needs a 'seed' or a 'board' (36 characters), got keys {sorted(task)}"
                )
            settings = dict(self._settings)
            settings.update({k: task[k] for k in _TASK_KEYS if task.get(k) is not None})
            s = _check_settings(**settings)
            board = generate_board(
                check_int("seed", task["seed"], 0),
                s["num_vehicles"],
                s["min_moves"],
                s["max_moves"],
                s["num_walls"],
                self.max_states,
                self.max_generation_attempts,
            )
        board = str(board)  # numpy strings from a parquet row
        layout, state = parse_board(board)
        table = distance_table(board, self.max_states)
        if layout.is_solved(state):
            raise ValueError(f"The red car is already at the exit in board {board!r}: there is nothing to play")
        if table.value(state) == math.inf:
            raise ValueError(f"Board {board!r} has no solution: no slide sequence brings the red car to the exit")
        self._table, self._state, self._done = table, state, False
        return self.render()

    def step(self, action_text: str) -> tuple[str, float, bool, dict[str, Any]]:
        table = self._require_table()
        layout = table.layout
        if self._done:
            raise RuntimeError("The episode is over; call reset() first")
        parsed = parse_action(action_text)
        if parsed is None:
            return self._invalid(f"Invalid action. {INVALID_ACTION_HELP}")
        label, d = parsed
        if label not in layout.index:
            return self._invalid(
                f"Invalid action: there is no vehicle {label}. Vehicles: {', '.join(layout.labels)}. {INVALID_ACTION_HELP}"
            )
        after = layout.slide(self._state, layout.index[label], d)
        moved = after is not None
        if moved:
            self._state = after
        success = layout.is_solved(self._state)
        self._done = success
        info = {INFO_VALID: True, INFO_SUCCESS: success, "action": format_move(label, d), "moved": moved}
        return self.render(), 1.0 if success else 0.0, success, info

    def _invalid(self, feedback: str) -> tuple[str, float, bool, dict[str, Any]]:
        info = {INFO_VALID: False, INFO_SUCCESS: False, "action": None, "moved": False}
        return f"{feedback}\n{self.render()}", 0.0, False, info

    def render(self) -> str:
        """The current observation (CAST's grid + coordinates rendering)."""
        table = self._require_table()
        return table.layout.render(self._state)

    @property
    def board(self) -> str:
        """The current position as a 36-character board string."""
        return self._require_table().layout.to_string(self._state)

    def _require_table(self) -> DistanceTable:
        if self._table is None:
            raise RuntimeError("Call reset(task) before using the environment")
        return self._table

    # ---- solver ----------------------------------------------------------------------------------------------------

    def solver_value(self) -> float:
        """Exact optimal number of moves (slides) to free the red car: 0 when solved (`math.inf` cannot happen for
        a state reached by playing, since every slide is reversible)."""
        return self._require_table().value(self._state)

    def optimal_plan(self) -> list[str] | None:
        """A shortest move list (`A+2` style) following strictly decreasing N; `[]` when solved."""
        table = self._require_table()
        plan = table.plan(self._state)
        if plan is None:
            return None
        return [format_move(table.layout.labels[v], d) for v, d in plan]

    # ---- capabilities ----------------------------------------------------------------------------------------------

    def snapshot(self) -> tuple:
        return (self._table, self._state, self._done)

    def restore(self, snapshot: tuple) -> None:
        self._table, self._state, self._done = snapshot

    def state_key(self) -> tuple[int, ...]:
        """The top-left cell index (`row * 6 + col`) of every vehicle, in label order (CAST's `memo_key`)."""
        layout = self._require_table().layout
        return tuple(
            r * SIZE + c for r, c in (layout.cells(v, o)[0] for v, o in enumerate(layout.offsets(self._state)))
        )

    # ---- splits ----------------------------------------------------------------------------------------------------

    @classmethod
    def task_split(cls, split: str, count: int | None = None, **env_kwargs: Any) -> list[dict[str, Any]]:
        """Seeded task rows: `"train"` (seeds from 0) and `"eval"` (from 1_000_000) with the env's settings (default
        7 vehicles, 6-8 optimal moves), `"unseen"` (from 2_000_000) with 9 vehicles and 7-9 moves unless overridden
        (CAST's splits, docs/methods/cast.md#the-games). Generation settings among `env_kwargs` are copied into the
        rows; rows hold seeds only."""
        env = cls(**env_kwargs)  # validate every argument now rather than at the first reset
        settings = dict(cls.SPLIT_TASK_SETTINGS.get(split, {}))
        settings.update({k: v for k, v in env_kwargs.items() if k in _TASK_KEYS})
        _check_settings(**{**env._settings, **settings})
        return cls.seeded_split(split, count, **settings)
