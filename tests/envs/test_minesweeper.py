"""Tests of the Minesweeper environment: rendering, rules, the peek-free solver and K(s), no-guess generation, splits."""

import itertools
import math
import random
import time
from fractions import Fraction

import pytest

from trl_agents.envs import make_env
from trl_agents.envs.checks import check_env
from trl_agents.envs.minesweeper import (
    Minesweeper,
    MinesweeperBoard,
    _neighbours,
    _propagate,
    analyze,
    board_for,
    generate_board,
    parse_action,
)

# 3 x 4, mines at (0, 3) and (2, 3), first click (1, 0). The flood opens columns 0-2; column 3 stays closed.
# (0, 2) = 1 and (2, 2) = 1 each see two closed cells, (1, 2) = 2 sees all three: subset reasoning proves (0, 3) and
# (2, 3) are mines and (1, 3) is safe, so K = 1.
SMALL = {"rows": 3, "cols": 4, "mines": [[0, 3], [2, 3]], "first_click": [1, 0]}
SMALL_BOARD = """Here is the current board layout:
    0  1  2  3
 0  0  0  1  .
 1  0  0  2  .
 2  0  0  1  ."""
# 4 x 4, mines at (0, 3) and (3, 3), first click (3, 0): the solver needs two reveals, (1, 3) then (2, 3).
TWO_STEPS = {"rows": 4, "cols": 4, "mines": [[0, 3], [3, 3]], "first_click": [3, 0]}


def play(env, actions):
    return [env.step(a) for a in actions]


# ---- rendering and rules -------------------------------------------------------------------------------------------


def test_rendering_matches_cast_layout():
    env = Minesweeper()
    assert env.reset(SMALL) == SMALL_BOARD
    # Header: three spaces, then each column index right-aligned in 2 characters, separated by one space; rows: the
    # index in 2 characters, then each cell as " x " (no trailing spaces).
    env.step("flag 1 3")
    assert env.render().splitlines()[3] == " 1  0  0  2  F"
    env = Minesweeper(rows=10, cols=10, num_mines=10)
    lines = env.reset({"seed": 3}).splitlines()
    assert lines[1] == "    0  1  2  3  4  5  6  7  8  9"
    assert all(line.startswith(f"{r:2d} ") and len(line) == 32 for r, line in enumerate(lines[2:]))


def test_reveal_floods_zeros_and_wins():
    env = Minesweeper()
    env.reset(TWO_STEPS)
    assert env.render().splitlines()[2:] == [" 0  0  0  1  .", " 1  0  0  1  .", " 2  0  0  1  .", " 3  0  0  1  ."]
    observation, reward, done, info = env.step("reveal 1 3")
    assert (reward, done, info["valid"], info["success"], info["opened"]) == (0.0, False, True, False, 1)
    assert observation.splitlines()[3] == " 1  0  0  1  1"
    observation, reward, done, info = env.step("<action>reveal 2 3</action>")
    assert (reward, done, info["success"], info["safe_left"]) == (1.0, True, True, 0)
    with pytest.raises(RuntimeError, match="reset"):
        env.step("reveal 0 0")


def test_zero_flood_reveals_a_region():
    env = Minesweeper()
    # 5 x 5 with mines on the right column only: clicking (4, 0) opens the 0-region and the numbers around it.
    env.reset({"rows": 5, "cols": 5, "mines": [[0, 4], [2, 4], [4, 4]], "first_click": [4, 0]})
    assert env.render().splitlines()[2:] == [
        " 0  0  0  0  1  .",
        " 1  0  0  0  2  .",
        " 2  0  0  0  1  .",
        " 3  0  0  0  2  .",
        " 4  0  0  0  1  .",
    ]


def test_mine_hit_ends_the_game():
    env = Minesweeper()
    env.reset(SMALL)
    observation, reward, done, info = env.step("reveal 0 3")
    assert (reward, done, info["valid"], info["success"], info["mine_hit"]) == (0.0, True, True, False, True)
    assert observation.splitlines()[2] == " 0  0  0  1  *"
    assert env.solver_value() == math.inf and env.optimal_plan() is None


def test_flags_toggle_and_block_reveals():
    env = Minesweeper()
    env.reset(SMALL)
    key = env.state_key()
    _, reward, done, info = env.step("flag 1 3")
    assert info["valid"] and info["action"] == "flag 1 3" and info["flags"] == 1 and (reward, done) == (0.0, False)
    observation, _, _, info = env.step("reveal 1 3")  # a flagged cell cannot be opened
    assert info["valid"] is False and "flagged" in observation.splitlines()[0]
    env.step("FLAG 1 3")  # toggles back
    assert env.state_key() == key
    observation, _, _, info = env.step("flag 0 0")  # flagging an open cell is invalid
    assert info["valid"] is False and "already revealed" in observation.splitlines()[0]


@pytest.mark.parametrize(
    "action,message",
    [
        ("dig here", "Reply with one action: reveal R C or flag R C"),
        ("reveal 3 0", "outside the 3x4 board"),
        ("flag 0 9", "outside the 3x4 board"),
        ("reveal 1 1", "already revealed"),
        ("reveal 0 3 or flag 2 3", "Reply with one action"),
    ],
)
def test_invalid_actions_leave_the_state_unchanged(action, message):
    env = Minesweeper()
    before = env.reset(SMALL)
    key = env.state_key()
    observation, reward, done, info = env.step(action)
    assert info["valid"] is False and info["action"] is None and info["success"] is False
    assert (reward, done) == (0.0, False)
    assert message in observation.splitlines()[0] and observation.endswith(before)
    assert env.state_key() == key


@pytest.mark.parametrize(
    "text,parsed",
    [
        ("reveal 2 3", ("reveal", 2, 3)),
        ("Reveal 2, 3", ("reveal", 2, 3)),
        ("REVEAL  2 ,3", ("reveal", 2, 3)),
        ("flag (0,4)", ("flag", 0, 4)),
        ("I will reveal 1 2 now.", ("reveal", 1, 2)),
        ("<think>maybe reveal 1 1</think>```reveal 2 3```", ("reveal", 2, 3)),
        ("<think>flag 0 0 is wrong</think> reveal 4 5", ("reveal", 4, 5)),
        ("```\nflag 3 2\n```", ("flag", 3, 2)),
        ("reveal 1 1 and reveal 1 1", ("reveal", 1, 1)),  # the same action twice is not ambiguous
        ("reveal 1 1 or flag 2 2", None),
        ("reveal 2", None),
        ("reveal23", None),
        ("open 1 1", None),
        ("", None),
        (None, None),
    ],
)
def test_parse_action(text, parsed):
    assert parse_action(text) == parsed


# ---- solver --------------------------------------------------------------------------------------------------------


def test_solver_on_hand_made_boards():
    env = Minesweeper()
    env.reset(SMALL)
    assert env.solver_value() == 1 and env.optimal_plan() == ["reveal 1 3"]
    env.reset(TWO_STEPS)
    # (0, 2) = 1 sees (0, 3), (1, 3); (1, 2) = 1 sees (0, 3), (1, 3), (2, 3): (2, 3) is safe, and symmetrically
    # (1, 3); then (0, 3) and (3, 3) are mines. Both safe cells have one closed neighbour that is not a known mine,
    # so the tie goes to the first in row-major order.
    assert env.solver_value() == 2 and env.optimal_plan() == ["reveal 1 3", "reveal 2 3"]


def test_forced_guess_that_hits_a_mine_makes_k_infinite():
    # Seed 1's first layout (kept with no_guess=False): the solver runs out of proofs and its guess hits a mine.
    env = Minesweeper(no_guess=False, max_generation_attempts=1)
    env.reset({"seed": 1})
    rollout = env.board.rollout(env.board.initial_revealed)
    assert rollout.guessed and not rollout.won
    assert env.solver_value() == math.inf and env.optimal_plan() is None
    _, _, done, info = env.step("reveal 0 3")  # the game itself goes on: (0, 3) is safe
    assert info["valid"] and not done and env.solver_value() >= 0


def _brute_force_probabilities(rows, cols, num_mines, visible):
    neighbours = _neighbours(rows, cols)
    unknown = [i for i in range(rows * cols) if i not in visible]
    counts, total = dict.fromkeys(unknown, 0), 0
    for mines in itertools.combinations(unknown, num_mines):
        chosen = set(mines)
        if all(sum(n in chosen for n in neighbours[cell]) == number for cell, number in visible.items()):
            total += 1
            for m in mines:
                counts[m] += 1
    return {cell: Fraction(counts[cell], total) for cell in unknown}


def test_analyze_matches_brute_force_enumeration():
    """Proven safe cells and mines are right, and when propagation proves nothing the exact enumeration's safe
    cells, mines and probabilities equal a brute-force count over all layouts consistent with the numbers and the
    mine count (random partial states of small boards)."""
    rng = random.Random(0)
    checked = enumerated = proven_by_enumeration = 0
    while checked < 150:
        rows, cols = rng.choice([(3, 4), (4, 4), (4, 5)])
        num_mines = rng.randint(2, 5)
        mines = frozenset(rng.sample(range(rows * cols), num_mines))
        safe = [i for i in range(rows * cols) if i not in mines]
        board = MinesweeperBoard(rows, cols, mines, safe[0])
        revealed = 0
        for cell in rng.sample(safe, rng.randint(1, len(safe) - 1)):
            revealed = board.flood(revealed, 0, cell)
            if rng.random() < 0.35:
                break
        if board.is_cleared(revealed):
            continue
        visible = board.visible(revealed)
        truth = _brute_force_probabilities(rows, cols, num_mines, visible)
        analysis = analyze(rows, cols, num_mines, visible)
        assert all(truth[c] == 0 for c in analysis.safe) and all(truth[c] == 1 for c in analysis.mines)
        propagated_safe, _, _ = _propagate(*_constraints(rows, cols, visible), num_mines)
        if not propagated_safe:  # the exact enumeration ran: it must be complete
            enumerated += 1
            assert set(analysis.safe) == {c for c, p in truth.items() if p == 0}
            assert set(analysis.mines) == {c for c, p in truth.items() if p == 1}
            assert analysis.probabilities == {c: p for c, p in truth.items() if 0 < p < 1}
            proven_by_enumeration += bool(analysis.safe)
        checked += 1
    assert enumerated >= 20 and proven_by_enumeration >= 1  # both enumeration outcomes were exercised


def _constraints(rows, cols, visible):
    neighbours = _neighbours(rows, cols)
    unknown = {i for i in range(rows * cols) if i not in visible}
    constraints = {}
    for cell, number in visible.items():
        cells = frozenset(n for n in neighbours[cell] if n not in visible)
        if cells:
            constraints[cells] = number
    return constraints, unknown


def test_solver_is_peek_free():
    """Two layouts that show the same numbers get the same solver decision: swap a mine and a safe cell that no
    open cell touches."""
    env = Minesweeper()
    for seed in range(20):
        env.reset({"seed": seed})
        board = env.board
        revealed = board.initial_revealed
        seen = {n for i in range(board.rows * board.cols) if revealed >> i & 1 for n in (i, *board.neighbours[i])}
        hidden_mines = sorted(m for m in board.mines if m not in seen)
        hidden_safe = sorted(i for i in range(board.rows * board.cols) if i not in seen and i not in board.mines)
        if not hidden_mines or not hidden_safe:
            continue
        mines = (board.mines - {hidden_mines[0]}) | {hidden_safe[0]}
        other = board_for(board.rows, board.cols, mines, board.first_click)
        assert other.initial_revealed == revealed and other.visible(revealed) == board.visible(revealed)
        twin = Minesweeper()
        twin.reset(
            {
                "rows": board.rows,
                "cols": board.cols,
                "mines": [list(board.cell(m)) for m in mines],
                "first_click": list(board.cell(board.first_click)),
            }
        )
        assert twin.render() == env.render()
        assert twin.board.rollout(revealed).reveals[0] == board.rollout(revealed).reveals[0]
        return
    pytest.fail("no board with a hidden mine and a hidden safe cell among 20 seeds")


@pytest.mark.parametrize(
    "task", [{"seed": s} for s in (0, 5, 1_000_001)] + [{"seed": 2_000_003, "rows": 7, "cols": 7, "num_mines": 10}]
)
def test_solver_value_decreases_by_one_along_the_plan(task):
    env = Minesweeper()
    env.reset(task)
    plan = env.optimal_plan()
    values = [env.solver_value()]
    assert len(plan) == values[0] >= 1
    for i, action in enumerate(plan):
        _, reward, done, info = env.step(action)
        assert info["valid"] and done == (i == len(plan) - 1)
        values.append(env.solver_value())
    assert values == list(range(len(plan), -1, -1))
    assert reward == 1.0 and info["success"]


def test_wrongly_flagged_safe_cells_cost_one_each():
    env = Minesweeper()
    env.reset(TWO_STEPS)
    assert env.solver_value() == 2
    env.step("flag 0 3")  # a real mine: no cost
    assert env.solver_value() == 2 and env.optimal_plan() == ["reveal 1 3", "reveal 2 3"]
    env.step("flag 2 3")  # a safe cell: +1, and the plan removes the flag first
    assert env.solver_value() == 3
    plan = env.optimal_plan()
    assert plan == ["flag 2 3", "reveal 1 3", "reveal 2 3"]
    values = []
    for action in plan:
        env.step(action)
        values.append(env.solver_value())
    assert values == [2, 1, 0]


# ---- generation ----------------------------------------------------------------------------------------------------


def test_same_seed_same_board():
    first, second = Minesweeper(), Minesweeper()
    for seed in (0, 7, 1_000_000):
        assert first.reset({"seed": seed}) == second.reset({"seed": seed})
        assert first.board.mines == second.board.mines
    boards = {Minesweeper().reset({"seed": seed}) for seed in range(30)}
    assert len(boards) >= 28


@pytest.mark.parametrize("rows,cols,num_mines,start", [(6, 6, 7, 0), (7, 7, 10, 2_000_000)])
def test_generated_boards_are_no_guess_with_a_safe_zone(rows, cols, num_mines, start):
    env = Minesweeper(rows=rows, cols=cols, num_mines=num_mines)
    for seed in range(start, start + 25):
        env.reset({"seed": seed})
        board = env.board
        assert (board.rows, board.cols, len(board.mines)) == (rows, cols, num_mines)
        zone = {board.first_click, *board.neighbours[board.first_click]}
        assert not zone & board.mines
        rollout = board.rollout(board.initial_revealed)
        assert rollout.won and not rollout.guessed
        assert 1 <= env.solver_value() < math.inf


def test_guessing_boards_are_allowed_without_no_guess():
    # Seed 1's first layout needs a guess: with one attempt, no-guess generation gives up; without it, it is kept.
    with pytest.raises(ValueError, match="No Minesweeper board found for seed 1 in 1 attempts"):
        Minesweeper(max_generation_attempts=1).reset({"seed": 1})
    env = Minesweeper(no_guess=False, max_generation_attempts=1)
    env.reset({"seed": 1})
    assert env.board.rollout(env.board.initial_revealed).guessed


def test_reset_and_solver_latency():
    env = Minesweeper(rows=7, cols=7, num_mines=10)
    start = time.perf_counter()
    for seed in range(3_000_000, 3_000_020):  # fresh seeds: generation + no-guess check + K
        env.reset({"seed": seed})
        env.solver_value()
    assert (time.perf_counter() - start) / 20 < 0.1  # about 6 ms measured


# ---- capabilities, splits, arguments ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "split,index", [("train", 0), ("train", 3), ("eval", 0), ("eval", 1), ("unseen", 0), ("unseen", 2)]
)
def test_check_env_on_splits(split, index):
    task = Minesweeper.task_split(split, index + 1)[index]
    report = check_env(lambda: make_env("minesweeper"), task, bad_action="reveal nothing")
    assert {"determinism", "bad_action", "info_keys", "snapshot_restore", "expert_episode"} <= set(report)


def test_snapshot_restore_and_state_key():
    env = Minesweeper()
    env.reset({"seed": 4})
    plan = env.optimal_plan()
    env.step(plan[0])
    r, c = env.board.cell(min(env.board.mines))
    env.step(f"flag {r} {c}")  # a mine: the plan never opens it
    saved, key, observation = env.snapshot(), env.state_key(), env.render()
    future = [env.step(a) for a in plan[1:4]]
    env.restore(saved)
    assert env.state_key() == key and env.render() == observation
    assert [env.step(a) for a in plan[1:4]] == future
    env.reset({"seed": 9})
    env.restore(saved)  # a snapshot survives a reset to another board
    assert env.state_key() == key
    revealed, flags = key
    assert isinstance(revealed, int) and isinstance(flags, int) and flags.bit_count() == 1
    assert {"snapshot", "restore", "state_key", "solver_value", "optimal_plan"} <= Minesweeper.capabilities()


def test_task_splits():
    train, evaluation = Minesweeper.task_split("train", 500), Minesweeper.task_split("eval", 500)
    assert train[0] == {"env": "minesweeper", "seed": 0, "task_id": "minesweeper-train-0"}
    assert evaluation[0]["seed"] == 1_000_000 and not {r["seed"] for r in train} & {r["seed"] for r in evaluation}
    unseen = Minesweeper.task_split("unseen", 2)
    assert unseen[0]["seed"] == 2_000_000 and (unseen[0]["rows"], unseen[0]["cols"], unseen[0]["num_mines"]) == (
        7,
        7,
        10,
    )
    assert len(Minesweeper.task_split("eval")) == 200
    rows = Minesweeper.task_split("train", 2, num_mines=5, max_generation_attempts=10)
    assert rows[0]["num_mines"] == 5 and "max_generation_attempts" not in rows[0]
    assert Minesweeper().reset(rows[0]) == Minesweeper(num_mines=5).reset({"seed": 0})
    with pytest.raises(ValueError, match="split"):
        Minesweeper.task_split("test")
    with pytest.raises(ValueError, match="num_mines"):
        Minesweeper.task_split("train", 2, num_mines=40)  # arguments are validated up front


@pytest.mark.parametrize(
    "kwargs,name",
    [
        ({"rows": 2}, "rows"),
        ({"cols": 11}, "cols"),
        ({"rows": 6.0}, "rows"),
        ({"num_mines": 0}, "num_mines"),
        ({"num_mines": 27}, "num_mines"),
        ({"no_guess": "yes"}, "no_guess"),
        ({"max_generation_attempts": 0}, "max_generation_attempts"),
    ],
)
def test_bad_arguments(kwargs, name):
    with pytest.raises(ValueError, match=name):
        Minesweeper(**kwargs)


@pytest.mark.parametrize(
    "task,match",
    [
        ({}, "seed"),
        ({"seed": -1}, "seed"),
        ({"seed": 0, "num_mines": 99}, "num_mines"),
        ({"mines": [[0, 4]], "first_click": [2, 0], "rows": 3, "cols": 4}, "mines"),
        ({"mines": [[0, 3], [0, 3]], "first_click": [2, 0], "rows": 3, "cols": 4}, "twice"),
        ({"mines": [[0, 3]], "rows": 3, "cols": 4}, "first_click"),
        ({"mines": [[0, 3]], "first_click": [0, 3], "rows": 3, "cols": 4}, "first click must be safe"),
        ({"mines": [[0, 3]], "first_click": [2, 0], "rows": 3, "cols": 4}, "already clears"),
        ({"mines": "0,3", "first_click": [2, 0], "rows": 3, "cols": 4}, "mines"),
        (
            {"mine_positions": [[0, 3], [2, 3]], "first_click": [1, 0], "rows": 3, "cols": 4, "num_mines": 3},
            "num_mines",
        ),
    ],
)
def test_bad_tasks(task, match):
    with pytest.raises(ValueError, match=match):
        Minesweeper().reset(task)


def test_cast_style_rows():
    # CAST's data rows: mine_positions + first_click (numpy arrays after a parquet round trip).
    np = pytest.importorskip("numpy")
    row = {
        "mine_positions": np.array([[0, 3], [2, 3]]),
        "first_click": np.array([1, 0]),
        "rows": np.int64(3),
        "cols": np.int64(4),
        "num_mines": 2,
        "seed": 17,
    }
    assert Minesweeper().reset(row) == SMALL_BOARD


def test_generate_board_is_cached_and_shared():
    board = generate_board(0, 6, 6, 7, True, 2000)
    env = Minesweeper()
    env.reset({"seed": 0})
    assert env.board is board  # env instances share the board and its cached solver rollouts


@pytest.mark.slow
def test_one_training_iteration(train_one_iteration):
    tasks = Minesweeper.task_split("train", 2)
    trainer = train_one_iteration("minesweeper", tasks, max_turns=2)
    assert trainer.state.global_step == 1
