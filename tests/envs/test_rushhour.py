"""Tests of the Rush Hour environment: boards, rendering, slide rules, the exact distance table, generation, splits."""

import math
import random
import time

import pytest

from trl_agents.envs import make_env
from trl_agents.envs.checks import check_env
from trl_agents.envs.rushhour import RushHour, distance_table, parse_action, parse_board


def board(*rows):
    assert len(rows) == 6 and all(len(r) == 6 for r in rows)
    return "".join(rows)


# Hand-written boards and their optimal number of moves (one slide of any distance = one move), by reasoning:
# - FREE: nothing in front of A: A+4.
# - BLOCKED: the truck B covers (2, 4) and is at the top, so it must go down 3 to leave row 2, then A+4: 2 moves.
# - CHAIN3: B covers rows 1-3 of column 4; up 1 still covers row 2, so B must go down 2, but C covers (5, 4). C+1 still
#   covers column 4, so C must go left first: C-1, B+2, A+4 = 3 moves (none can be skipped).
# - CHAIN4: as CHAIN3, but D stands left of C in column 2, so C cannot go left until D goes up 1 (up 2 would put D on
#   A's row): D-1, C-1, B+2, A+4 = 4 moves.
# - WALLED: a wall under the car B, so B must go up: B-1, A+4 = 2 moves ("." for empty cells is accepted too).
FREE = board("oooooo", "oooooo", "AAoooo", "oooooo", "oooooo", "oooooo")
BLOCKED = board("ooooBo", "ooooBo", "AAooBo", "oooooo", "oooooo", "oooooo")
CHAIN3 = board("oooooo", "ooooBo", "AAooBo", "ooooBo", "oooooo", "oooCCo")
CHAIN4 = board("oooooo", "ooooBo", "AAooBo", "ooooBo", "ooDooo", "ooDCCo")
WALLED = board("......", "....B.", "AA..B.", "....x.", "......", "......")
HAND_WRITTEN = [
    (FREE, ["A+4"]),
    (BLOCKED, ["B+3", "A+4"]),
    (CHAIN3, ["C-1", "B+2", "A+4"]),
    (CHAIN4, ["D-1", "C-1", "B+2", "A+4"]),
    (WALLED, ["B-1", "A+4"]),
]
# The first board of CAST's in-distribution test split (docs/methods/cast.md, "The games").
CAST_BOARD = "oEEEoooDDDBooAAoBoooooBoGGoCFFoooCoo"
CAST_OBSERVATION = """Grid:
. E E E . .
. D D D B .
. A A . B . >
. . . . B .
G G . C F F
. . . C . .

Coordinates:
Board size: 6 rows x 6 cols (zero-indexed; exit at row 2, right edge).
A (red car): horizontal, cells [(2,1), (2,2)]
B: vertical, cells [(1,4), (2,4), (3,4)]
C: vertical, cells [(4,3), (5,3)]
D: horizontal, cells [(1,1), (1,2), (1,3)]
E: horizontal, cells [(0,1), (0,2), (0,3)]
F: horizontal, cells [(4,4), (4,5)]
G: horizontal, cells [(4,0), (4,1)]"""


# ---- an independent reference solver on board strings ------------------------------------------------------------


def _reference_slides(text):
    """Every board one slide away, computed on the 36-character string directly."""
    for label in sorted(set(text) - set("o.x")):
        cells = [i for i, ch in enumerate(text) if ch == label]
        step = 1 if cells[1] - cells[0] == 1 else 6
        for direction in (step, -step):
            moved = list(text)
            front = cells[-1] if direction > 0 else cells[0]
            current = list(cells)
            while True:
                target = front + direction
                if not 0 <= target < 36 or text[target] not in "o." or (step == 1 and target // 6 != front // 6):
                    break
                tail = current[0] if direction > 0 else current[-1]
                moved[tail], moved[target] = "o", label
                current = [c + direction for c in current]
                front = target
                yield "".join(moved)


def reference_distance(text):
    """Fewest slides until A covers (2, 4) and (2, 5), by plain breadth-first search (inf when unsolvable)."""
    seen, frontier, depth = {text}, [text], 0
    while frontier:
        if any(b[16] == b[17] == "A" for b in frontier):
            return depth
        following = []
        for b in frontier:
            for nb in _reference_slides(b):
                if nb not in seen:
                    seen.add(nb)
                    following.append(nb)
        frontier, depth = following, depth + 1
    return math.inf


# ---- rendering and rules -------------------------------------------------------------------------------------------


def test_rendering_matches_cast():
    env = RushHour()
    assert env.reset({"board_config": CAST_BOARD}) == CAST_OBSERVATION
    assert env.board == CAST_BOARD
    assert env.reset({"board": WALLED}).splitlines()[4] == ". . . . x ."
    assert env.render().endswith("B: vertical, cells [(1,4), (2,4)]\nWalls: [(3,4)]")


@pytest.mark.parametrize(
    "text,parsed",
    [
        ("A+2", ("A", 2)),
        ("a+2", ("A", 2)),
        ("```B-1```", ("B", -1)),
        ("[C+]", ("C", 1)),
        ("[B-3]", ("B", -3)),
        ("B + 3", ("B", 3)),
        ("<action>D-2</action>", ("D", -2)),
        ("<think>A+1 fails</think>A+3", ("A", 3)),
        ("move A+2", None),  # the whole answer must be one move (CAST's fullmatch)
        ("A+2 B-1", None),
        ("A+0", None),
        ("A2", None),
        ("AB+1", None),
        ("", None),
        (None, None),
    ],
)
def test_parse_action(text, parsed):
    assert parse_action(text) == parsed


def test_slides_blocked_and_overshooting_are_valid_no_ops():
    env = RushHour()
    start = env.reset({"board": CHAIN3})
    key = env.state_key()
    for action in ("A+3", "B+2", "C+2", "B-5"):  # into B; into C; past the edge; past the edge
        observation, reward, done, info = env.step(action)
        assert info["valid"] is True and info["moved"] is False and info["action"] == action
        assert (observation, reward, done) == (start, 0.0, False) and env.state_key() == key
    observation, _, _, info = env.step("```A+2```")
    assert info["moved"] and observation.splitlines()[3] == ". . A A B . >"
    _, _, _, info = env.step("A-1")
    assert info["moved"] and env.board[12:18] == "oAAoBo"


@pytest.mark.parametrize(
    "action,message",
    [
        ("slide the red car", "Reply with one move"),
        ("Z+1", "there is no vehicle Z. Vehicles: A, B, C"),
        ("x+1", "there is no vehicle X"),
        ("A+0", "Reply with one move"),
    ],
)
def test_invalid_actions_leave_the_state_unchanged(action, message):
    env = RushHour()
    before = env.reset({"board": CHAIN3})
    key = env.state_key()
    observation, reward, done, info = env.step(action)
    assert info["valid"] is False and info["action"] is None and info["success"] is False
    assert (reward, done) == (0.0, False) and env.state_key() == key
    assert message in observation.splitlines()[0] and observation.endswith(before)


def test_solving_ends_the_episode():
    env = RushHour()
    env.reset({"board": BLOCKED})
    _, reward, done, info = env.step("B+3")
    assert (reward, done, info["success"]) == (0.0, False, False)
    observation, reward, done, info = env.step("A+4")
    assert (reward, done, info["success"]) == (1.0, True, True)
    assert observation.splitlines()[3] == ". . . . A A >"
    assert env.solver_value() == 0 and env.optimal_plan() == []
    with pytest.raises(RuntimeError, match="reset"):
        env.step("A-1")


# ---- the exact solver --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text,plan", HAND_WRITTEN)
def test_optimal_lengths_on_hand_written_boards(text, plan):
    env = RushHour()
    env.reset({"board": text})
    assert env.solver_value() == len(plan) == reference_distance(text)
    assert env.optimal_plan() == plan


@pytest.mark.parametrize(
    "task",
    [
        {"board": CHAIN4},
        {"board": CAST_BOARD},
        {"seed": 4},
        {"seed": 2_000_001, "num_vehicles": 9, "min_moves": 7, "max_moves": 9},
    ],
)
def test_solver_value_decreases_by_one_along_the_plan(task):
    env = RushHour()
    env.reset(task)
    plan = env.optimal_plan()
    values = [env.solver_value()]
    assert len(plan) == values[0]
    for i, action in enumerate(plan):
        _, reward, done, info = env.step(action)
        assert info["valid"] and info["moved"] and done == (i == len(plan) - 1)
        values.append(env.solver_value())
    assert values == list(range(len(plan), -1, -1))
    assert reward == 1.0 and info["success"]


def test_table_matches_reference_bfs_along_random_play():
    """The table's N(s) equals a plain BFS on board strings, on the CAST board and generated ones, for the start and
    for states reached by random slides (some moving away from the goal)."""
    rng = random.Random(0)
    env = RushHour()
    assert reference_distance(CAST_BOARD) == 6
    for task in ({"board": CAST_BOARD}, {"seed": 11}, {"seed": 1_000_002}):
        env.reset(task)
        for _ in range(4):
            assert env.solver_value() == reference_distance(env.board)
            moves = [m for m in env._table.layout.moves(env._state)]
            v, d, _ = rng.choice(moves)
            _, _, done, _ = env.step(f"{env._table.layout.labels[v]}{d:+d}")
            if done:
                break


def test_max_states_cap():
    with pytest.raises(ValueError, match="max_states=10"):
        RushHour(max_states=10).reset({"board": CAST_BOARD})
    table = distance_table(CAST_BOARD)  # cached now: the cap still applies to a smaller budget
    assert table.num_states > 10
    with pytest.raises(ValueError, match="max_states=10"):
        RushHour(max_states=10).reset({"board": CAST_BOARD})


# ---- generation ----------------------------------------------------------------------------------------------------


def test_same_seed_same_puzzle():
    first, second = RushHour(), RushHour()
    for seed in (0, 1_000_000):
        assert first.reset({"seed": seed}) == second.reset({"seed": seed})
    first.reset({"seed": 3})
    second.reset({"seed": 3})
    for action in ["A+1", "B-1", "C+2", "D-1", "E+1"]:
        assert first.step(action) == second.step(action)
    assert len({RushHour().reset({"seed": seed}) for seed in range(10)}) >= 9


@pytest.mark.parametrize(
    "settings,seeds",
    [({}, range(20, 28)), ({"num_vehicles": 9, "min_moves": 7, "max_moves": 9}, range(2_000_010, 2_000_014))],
)
def test_generated_puzzles_meet_the_settings(settings, seeds):
    env = RushHour(**settings)
    low, high = settings.get("min_moves", 6), settings.get("max_moves", 8)
    for seed in seeds:
        env.reset({"seed": seed})
        text = env.board
        layout, _ = parse_board(text)
        assert len(layout.labels) == settings.get("num_vehicles", 7) and "x" not in text
        assert low <= env.solver_value() <= high
        # No vehicle but A lies horizontally on the exit row (CAST's generator invariant).
        assert all(not (h and line == 2) for h, line in zip(layout.horizontal[1:], layout.lines[1:]))


def test_walls_and_impossible_settings():
    env = RushHour(num_walls=2)
    env.reset({"seed": 5})
    assert env.board.count("x") == 2 and "x" not in env.board[12:18] and 6 <= env.solver_value() <= 8
    with pytest.raises(ValueError, match="No Rush Hour puzzle found for seed 0 in 5 attempts"):
        RushHour(num_vehicles=1, min_moves=2, max_moves=3, max_generation_attempts=5).reset({"seed": 0})


def test_generation_latency():
    env = RushHour(num_vehicles=9, min_moves=7, max_moves=9)
    start = time.perf_counter()
    for seed in range(3_000_000, 3_000_005):  # fresh seeds of unseen difficulty: generation + exact table
        env.reset({"seed": seed})
    assert (time.perf_counter() - start) / 5 < 1.5  # about 0.2 s measured on one core


# ---- capabilities, splits, arguments ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "split,index", [("train", 0), ("train", 3), ("eval", 0), ("eval", 1), ("unseen", 0), ("unseen", 2)]
)
def test_check_env_on_splits(split, index):
    task = RushHour.task_split(split, index + 1)[index]
    report = check_env(lambda: make_env("rushhour"), task)
    assert {"determinism", "bad_action", "info_keys", "snapshot_restore", "expert_episode"} <= set(report)


def test_snapshot_restore_and_state_key():
    env = RushHour()
    env.reset({"board": CAST_BOARD})
    assert env.state_key() == (13, 10, 27, 7, 1, 28, 24)  # top-left cell of A, B, ..., G (row * 6 + col)
    env.step("D-1")
    saved, key, observation = env.snapshot(), env.state_key(), env.render()
    actions = ["E-1", "C-4", "A+1", "F-2", "B+2", "A+2"]
    future = [env.step(a) for a in actions]
    assert future[-1][2] is True
    env.restore(saved)
    assert env.state_key() == key and env.render() == observation
    assert [env.step(a) for a in actions] == future
    env.reset({"board": FREE})
    env.restore(saved)  # a snapshot survives a reset to another board
    assert env.state_key() == key and env.solver_value() == 5
    assert {"snapshot", "restore", "state_key", "solver_value", "optimal_plan"} <= RushHour.capabilities()


def test_task_splits():
    train, evaluation = RushHour.task_split("train", 500), RushHour.task_split("eval", 500)
    assert train[0] == {"env": "rushhour", "seed": 0, "task_id": "rushhour-train-0"}
    assert evaluation[0]["seed"] == 1_000_000 and not {r["seed"] for r in train} & {r["seed"] for r in evaluation}
    unseen = RushHour.task_split("unseen", 2)
    assert unseen[1]["seed"] == 2_000_001
    assert (unseen[0]["num_vehicles"], unseen[0]["min_moves"], unseen[0]["max_moves"]) == (9, 7, 9)
    assert len(RushHour.task_split("unseen")) == 200
    rows = RushHour.task_split("train", 1, num_walls=1, max_states=50_000)
    assert rows[0]["num_walls"] == 1 and "max_states" not in rows[0]
    with pytest.raises(ValueError, match="split"):
        RushHour.task_split("hard")


@pytest.mark.parametrize(
    "kwargs,name",
    [
        ({"num_vehicles": 0}, "num_vehicles"),
        ({"num_vehicles": 13}, "num_vehicles"),
        ({"num_vehicles": 7.0}, "num_vehicles"),
        ({"min_moves": 0}, "min_moves"),
        ({"min_moves": 5, "max_moves": 4}, "max_moves"),
        ({"num_walls": 7}, "num_walls"),
        ({"max_states": 0}, "max_states"),
        ({"max_generation_attempts": 0}, "max_generation_attempts"),
    ],
)
def test_bad_arguments(kwargs, name):
    with pytest.raises(ValueError, match=name):
        RushHour(**kwargs)


@pytest.mark.parametrize(
    "task,match",
    [
        ({}, "seed"),
        ({"seed": -1}, "seed"),
        ({"seed": 0, "min_moves": 0}, "min_moves"),
        ({"board": "oooAAo"}, "36 characters"),
        ({"board": FREE.replace("o", "?", 1)}, "Unknown Rush Hour board symbol '\\?'"),
        ({"board": FREE.replace("A", "B")}, "red car 'A'"),
        ({"board": board("oooooo", "Aooooo", "Aooooo", "oooooo", "oooooo", "oooooo")}, "must be horizontal"),
        ({"board": board("oooooo", "oooooo", "oooooo", "AAoooo", "oooooo", "oooooo")}, "row 2"),
        ({"board": board("oooooo", "oooooo", "AAAooo", "oooooo", "oooooo", "oooooo")}, "length 2"),
        ({"board": board("BBoooo", "Booooo", "AAoooo", "oooooo", "oooooo", "oooooo")}, "contiguous"),
        ({"board": board("BoBooo", "oooooo", "AAoooo", "oooooo", "oooooo", "oooooo")}, "contiguous"),
        ({"board": board("BBBBoo", "oooooo", "AAoooo", "oooooo", "oooooo", "oooooo")}, "length 2 or 3"),
        ({"board": board("Booooo", "oooooo", "AAoooo", "oooooo", "oooooo", "oooooo")}, "has 1 cells"),
        ({"board": board("oooooo", "oooooo", "AAooBB", "oooooo", "oooooo", "oooooo")}, "no solution"),
        ({"board": board("oooooo", "oooooo", "ooooAA", "oooooo", "oooooo", "oooooo")}, "already at the exit"),
    ],
)
def test_bad_tasks(task, match):
    with pytest.raises(ValueError, match=match):
        RushHour().reset(task)


def test_numpy_board_string_from_a_dataset():
    np = pytest.importorskip("numpy")
    assert RushHour().reset({"board_config": np.str_(CAST_BOARD), "min_moves_optimal": 6}) == CAST_OBSERVATION


@pytest.mark.slow
def test_one_training_iteration(train_one_iteration):
    tasks = RushHour.task_split("train", 2)
    trainer = train_one_iteration("rushhour", tasks, max_turns=2)
    assert trainer.state.global_step == 1
