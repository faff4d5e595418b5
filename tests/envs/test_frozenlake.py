"""Tests of the FrozenLake environment: generation, rules, BFS solver, slippery ice and layout-disjoint splits."""

import math
import time

import pytest

from trl_agents.envs import make_env
from trl_agents.envs.frozenlake import EVAL_LAYOUT_BUCKET, FrozenLake, generate_layout, layout_bucket
from trl_agents.envs.parsing import INVALID_DIRECTION_FEEDBACK

OPEN_4X4 = "SFFF\nFFFF\nFFFF\nFFFG"
# A map whose only path snakes through the rows.
SNAKE = """
S F F F
H H H F
F F F F
F H H H
F F F G
"""


def test_same_seed_same_map():
    first, second = FrozenLake(), FrozenLake()
    for seed in (0, 3, 999_999):
        assert first.reset({"seed": seed}) == second.reset({"seed": seed})
    assert generate_layout(5) == generate_layout(5, 4, 0.3)


def test_different_seeds_different_maps():
    env = FrozenLake()
    assert len({env.reset({"seed": seed}) for seed in range(30)}) >= 20


def test_generated_maps_are_solvable_and_well_formed():
    env = FrozenLake(size=5, hole_prob=0.4)
    for seed in range(50):
        observation = env.reset({"seed": seed})
        rows = observation.split("\n")
        assert len(rows) == 5 and all(len(row.split(" ")) == 5 for row in rows)
        assert rows[0].startswith("P") and rows[-1].endswith("G")
        assert env.solver_value() < math.inf


def test_rendering_and_start_symbol():
    env = FrozenLake()
    assert env.reset({"layout": "SFH\nFFF\nHFG"}) == "P F H\nF F F\nH F G"
    observation, reward, done, info = env.step("right")
    assert observation == "S P H\nF F F\nH F G"
    assert info == {"valid": True, "success": False, "action": "right", "moved": True, "slipped": False, "hole": False}
    assert reward == 0.0 and not done


def test_invalid_action_leaves_state_unchanged():
    env = FrozenLake()
    before = env.reset({"seed": 1})
    observation, reward, done, info = env.step("up or down")
    assert info["valid"] is False and info["success"] is False and info["moved"] is False
    assert reward == 0.0 and not done and env.state_key() == (0, 0)
    assert observation == f"{INVALID_DIRECTION_FEEDBACK}\n{before}"


def test_move_off_grid_is_valid_but_ineffective():
    env = FrozenLake()
    before = env.reset({"layout": OPEN_4X4})
    observation, _, done, info = env.step("up")
    assert info["valid"] is True and info["moved"] is False and not done and observation == before


def test_bfs_distance_is_manhattan_without_holes():
    env = FrozenLake()
    env.reset({"layout": OPEN_4X4})
    # Walk a snake over the whole map and compare at every cell.
    for action in ["right", "right", "right", "down", "left", "left", "left", "down", "right", "right"]:
        r, c = env.state_key()
        assert env.solver_value() == (3 - r) + (3 - c)
        env.step(action)
    assert env.solver_value() == 2  # at (2, 2)


def test_detour_distance_and_plan():
    env = FrozenLake()
    env.reset({"layout": SNAKE})
    # The only path: 3 right, 2 down, 3 left, 2 down, 3 right = 13 moves (Manhattan distance is 7).
    assert env.solver_value() == 13
    assert env.optimal_plan() == ["right"] * 3 + ["down"] * 2 + ["left"] * 3 + ["down"] * 2 + ["right"] * 3


def test_optimal_plan_reaches_goal():
    env = FrozenLake()
    for seed in range(20):
        env.reset({"seed": seed})
        plan = env.optimal_plan()
        assert len(plan) == env.solver_value()
        values = [env.solver_value()]
        for i, action in enumerate(plan):
            _, reward, done, info = env.step(action)
            values.append(env.solver_value())
            assert done == (i == len(plan) - 1)
        assert reward == 1.0 and info["success"] is True
        assert values == list(range(len(plan), -1, -1))


def test_plan_tie_break_is_deterministic():
    env = FrozenLake()
    env.reset({"layout": OPEN_4X4})
    assert env.optimal_plan() == ["down", "down", "down", "right", "right", "right"]  # order: up, down, left, right


def test_hole_ends_episode():
    env = FrozenLake()
    env.reset({"layout": "SH\nFG"})
    observation, reward, done, info = env.step("right")
    assert done is True and reward == 0.0 and info["success"] is False and info["hole"] is True
    assert observation == "S P\nF G"
    assert env.solver_value() == math.inf and env.optimal_plan() is None
    with pytest.raises(RuntimeError):
        env.step("down")


def test_snapshot_restore_round_trip():
    env = FrozenLake(slippery=True)
    env.reset({"seed": 11})
    env.step("right")
    saved, key = env.snapshot(), env.state_key()
    actions = ["down", "right", "down", "right", "down", "right"]

    def play():
        out = []
        for action in actions:
            out.append(env.step(action))
            if out[-1][2]:
                break
        return out

    original = play()
    env.restore(saved)
    assert env.state_key() == key
    assert play() == original


def test_slippery_is_reproducible_per_seed():
    def trajectory(seed):
        env = FrozenLake(size=6, hole_prob=0.0, slippery=True)
        env.reset({"seed": seed})
        return [env.step(a)[3]["slipped"] for a in ["down", "right"] * 4]

    assert trajectory(3) == trajectory(3)
    runs = [trajectory(seed) for seed in range(10)]
    assert len({tuple(run) for run in runs}) > 1  # different seeds slip differently
    slipped = sum(sum(run) for run in runs) / sum(len(run) for run in runs)
    assert 0.4 < slipped < 0.9  # 2/3 expected
    assert FrozenLake(slippery=True).reset({"seed": 0}) == FrozenLake().reset({"seed": 0})


def test_slippery_task_description():
    env = FrozenLake(slippery=True)
    env.reset({"seed": 0})
    assert "slippery" in env.task_description()
    env.reset({"seed": 0, "slippery": False})
    assert env.task_description() == ""


def test_splits_are_layout_disjoint():
    start = time.perf_counter()
    evaluation = FrozenLake.task_split("eval", 1000)
    train = FrozenLake.task_split("train", 3000)
    assert time.perf_counter() - start < 2.0
    assert len(evaluation) == 1000 and len(train) == 3000
    assert train[0] == {"env": "frozenlake", "seed": 0, "task_id": "frozenlake-train-0"}
    assert all(row["seed"] >= 1_000_000 for row in evaluation)
    assert all(row["seed"] < 1_000_000 for row in train)
    train_layouts = {generate_layout(row["seed"]) for row in train}
    eval_layouts = {generate_layout(row["seed"]) for row in evaluation}
    assert not train_layouts & eval_layouts
    assert all(layout_bucket(layout) == EVAL_LAYOUT_BUCKET for layout in eval_layouts)
    assert FrozenLake.task_split("train", 5) == train[:5]


def test_split_settings_travel_with_rows():
    rows = FrozenLake.task_split("eval", 3, size=5, hole_prob=0.2)
    assert all(row["size"] == 5 and row["hole_prob"] == 0.2 for row in rows)
    env = FrozenLake()
    assert len(env.reset(rows[0]).split("\n")) == 5
    assert layout_bucket(env.layout) == EVAL_LAYOUT_BUCKET
    with pytest.raises(ValueError, match="split"):
        FrozenLake.task_split("test")
    with pytest.raises(ValueError, match="layouts"):
        FrozenLake.task_split("eval", 10, hole_prob=0.0)  # a single possible map


@pytest.mark.parametrize(
    "kwargs,name",
    [
        ({"size": 1}, "size"),
        ({"size": 4.5}, "size"),
        ({"hole_prob": 1.0}, "hole_prob"),
        ({"hole_prob": -0.1}, "hole_prob"),
        ({"slippery": "yes"}, "slippery"),
    ],
)
def test_bad_arguments(kwargs, name):
    with pytest.raises(ValueError, match=name):
        FrozenLake(**kwargs)


def test_registry_and_capabilities():
    env = make_env("frozenlake", size=4)
    env.reset({"seed": 0})
    assert {"snapshot", "restore", "state_key", "solver_value", "optimal_plan"} <= env.capabilities()
    assert "Answer with exactly one word: up, down, left or right." in FrozenLake.instructions
    with pytest.raises(ValueError, match="layout"):
        env.reset({"layout": "SFF\nFXF\nFFG"})
