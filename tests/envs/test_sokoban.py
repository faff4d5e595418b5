"""Tests of the Sokoban environment: generation, rules, the exact solver, deadlocks and splits."""

import math
import time

import pytest

from trl_agents.envs import make_env
from trl_agents.envs.parsing import INVALID_DIRECTION_FEEDBACK
from trl_agents.envs.sokoban import Sokoban, SokobanPuzzle, solve

# Hand-written puzzles and their optimal lengths, worked out by hand:
# - CORRIDOR: three pushes to the right.
# - DETOUR: the player is on the wrong side of the box. Pushing left puts the box into the corner (lost), so the
#   player walks around through the lower row (down, left, left, up = 4 moves) and pushes right twice: 6 moves.
# - TWO_BOXES: push the top box right twice (2), walk back left, left, down to (2, 1) (3), push the lower box right
#   twice (2): 7 moves. Doing the lower box first costs 8 (the top box blocks the short way back).
# - FROZEN_PAIR: two boxes side by side against the top wall can never move: lost from the start.
CORRIDOR = """
# # # # # # #
# P X _ _ O #
# # # # # # #
"""
DETOUR = """
# # # # # #
# _ X P O #
# _ _ _ _ #
# # # # # #
"""
TWO_BOXES = """
# # # # # #
# P X _ O #
# _ X _ O #
# # # # # #
"""
FROZEN_PAIR = """
# # # # # #
# O X X O #
# _ _ P _ #
# # # # # #
"""
HAND_WRITTEN = [(CORRIDOR, 3), (DETOUR, 6), (TWO_BOXES, 7)]


def layout_task(text):
    return {"layout": text}


# ---- generation -----------------------------------------------------------------------------------------------------


def test_same_seed_same_puzzle():
    first, second = Sokoban(), Sokoban(num_boxes=1)
    for seed in (0, 1, 17, 1_000_003):
        assert first.reset({"seed": seed}) == second.reset({"seed": seed})
        assert first.state_key() == second.state_key()
    # Replaying actions gives the same observations too.
    first.reset({"seed": 5})
    second.reset({"seed": 5})
    for action in ["up", "left", "left", "down", "right", "up"]:
        assert first.step(action)[0] == second.step(action)[0]


def test_different_seeds_different_puzzles():
    env = Sokoban()
    puzzles = {env.reset({"seed": seed}) for seed in range(30)}
    assert len(puzzles) >= 28


def test_generated_puzzles_are_valid():
    env = Sokoban(num_boxes=2)
    for seed in range(20):
        observation = env.reset({"seed": seed})
        rows = observation.split("\n")
        assert len(rows) == 6 and all(len(row.split(" ")) == 6 for row in rows)
        assert rows[0] == rows[-1] == "# # # # # #"  # border walls
        assert observation.count("X") + observation.count("*") == 2
        assert observation.count("P") + observation.count("S") == 1
        value = env.solver_value()
        assert 1 <= value < math.inf  # solvable and not already solved


def test_length_filter_and_rectangular_size():
    env = Sokoban(size=(6, 7), min_solution_length=8, max_solution_length=10)
    for seed in range(10):
        observation = env.reset({"seed": seed})
        assert 8 <= env.solver_value() <= 10
        assert len(observation.split("\n")) == 6 and len(observation.split("\n")[0].split(" ")) == 7


def test_task_overrides_constructor_settings():
    env = Sokoban()
    observation = env.reset({"seed": 3, "size": 7, "num_boxes": 2})
    assert len(observation.split("\n")) == 7
    assert observation.count("X") + observation.count("*") == 2
    assert observation == Sokoban(size=7, num_boxes=2).reset({"seed": 3})


def test_reset_is_fast():
    env = Sokoban()
    start = time.perf_counter()
    for seed in range(50_000, 50_100):
        env.reset({"seed": seed})
    assert (time.perf_counter() - start) / 100 < 0.02  # a few ms at most (well under 1 ms measured)


# ---- rules -------------------------------------------------------------------------------------------------------


def test_rendering_symbols():
    # S player on target, X box, * box on target, O target, _ empty, # wall.
    puzzle = "# # # # # #\n# S X _ * #\n# X O _ _ #\n# # # # # #"
    assert SokobanPuzzle.from_text(puzzle).render() == puzzle
    env = Sokoban()
    assert env.reset(layout_task(puzzle)) == puzzle
    assert env.step("right")[0] == "# # # # # #\n# O P X * #\n# X O _ _ #\n# # # # # #"
    # Spaces are optional in hand-written layouts.
    assert env.reset(layout_task("#####\n#PXO#\n#####")) == "# # # # #\n# P X O #\n# # # # #"


def test_invalid_action_leaves_state_unchanged():
    env = Sokoban()
    before = env.reset({"seed": 0})
    key = env.state_key()
    observation, reward, done, info = env.step("jump over the box")
    assert info["valid"] is False and info["success"] is False and info["moved"] is False
    assert reward == 0.0 and done is False
    assert env.state_key() == key
    assert observation == f"{INVALID_DIRECTION_FEEDBACK}\n{before}"


def test_blocked_moves_are_valid_but_ineffective():
    env = Sokoban()
    env.reset(layout_task(DETOUR))
    observation, reward, done, info = env.step("up")  # wall
    assert info["valid"] is True and info["moved"] is False and not done and reward == 0.0
    assert observation == SokobanPuzzle.from_text(DETOUR).render()
    env.reset(layout_task(TWO_BOXES))
    env.step("down")  # player to (2, 1)
    _, _, _, info = env.step("up")  # walks back: fine
    assert info["moved"] is True
    env.reset(layout_task("# # # # # #\n# P X X O #\n# _ _ _ O #\n# # # # # #"))
    _, _, _, info = env.step("right")  # two boxes in a row cannot be pushed
    assert info["valid"] is True and info["moved"] is False and info["pushed"] is False


def test_binary_and_shaped_rewards():
    env = Sokoban()
    env.reset(layout_task(CORRIDOR))
    rewards = [env.step("right")[1] for _ in range(3)]
    assert rewards == [0.0, 0.0, 1.0]

    env = Sokoban(reward="shaped")
    env.reset(layout_task(TWO_BOXES))
    steps = [env.step(a) for a in ["right", "right", "left", "left", "down", "right", "right"]]
    rewards = [round(s[1], 6) for s in steps]
    # -0.1 per move, +1 when the first box lands on its target, +1 and +10 for the last box (solved).
    assert rewards == [-0.1, 0.9, -0.1, -0.1, -0.1, -0.1, 10.9]
    assert steps[-1][2] is True and steps[-1][3]["success"] is True
    env.reset(layout_task("# # # # # #\n# P * _ _ #\n# # # # # #"))
    # Pushing a box off its target costs 1: "P * _" -> "_ P X".
    assert round(env.step("right")[1], 6) == -1.1


def test_info_keys_every_step():
    env = Sokoban()
    env.reset(layout_task(TWO_BOXES))
    for action in ["right", "nonsense", "up", "right"]:
        _, _, _, info = env.step(action)
        assert {"valid", "success", "moved", "deadlock", "boxes_on_target"} <= set(info)
    assert info["boxes_on_target"] == 1


def test_step_after_done_raises():
    env = Sokoban()
    env.reset(layout_task(CORRIDOR))
    for _ in range(3):
        env.step("right")
    with pytest.raises(RuntimeError):
        env.step("right")


# ---- solver ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("layout,length", HAND_WRITTEN)
def test_solver_is_optimal_on_hand_written_puzzles(layout, length):
    plan = solve(layout)
    assert plan is not None and len(plan) == length
    env = Sokoban()
    env.reset(layout_task(layout))
    assert env.solver_value() == length
    assert env.optimal_plan() == plan


@pytest.mark.parametrize("layout,length", HAND_WRITTEN)
def test_optimal_plan_solves_in_exactly_that_many_steps(layout, length):
    env = Sokoban()
    env.reset(layout_task(layout))
    plan = env.optimal_plan()
    for i, action in enumerate(plan):
        _, reward, done, info = env.step(action)
        assert info["valid"] and done == (i == length - 1)
    assert reward == 1.0 and info["success"] is True


def test_solver_value_decreases_by_one_along_optimal_plan():
    env = Sokoban(num_boxes=2)
    for seed in range(5):
        env.reset({"seed": seed})
        plan = env.optimal_plan()
        values = [env.solver_value()]
        for action in plan:
            env.step(action)
            values.append(env.solver_value())
        assert values == list(range(len(plan), -1, -1))


def test_corner_push_is_a_deadlock():
    env = Sokoban()
    env.reset(layout_task(DETOUR))
    assert not env.is_deadlocked() and env.solver_value() == 6
    observation, reward, done, info = env.step("left")  # box into the top-left corner, not a target
    assert observation.split("\n")[1] == "# X P _ O #"
    assert info["deadlock"] is True and env.is_deadlocked()
    assert env.solver_value() == math.inf and env.optimal_plan() is None
    assert not done and reward == 0.0  # the episode goes on by default

    env = Sokoban(end_on_deadlock=True)
    env.reset(layout_task(DETOUR))
    _, reward, done, info = env.step("left")
    assert done is True and info["success"] is False and reward == 0.0


def test_frozen_pair_is_a_deadlock():
    env = Sokoban()
    env.reset(layout_task(FROZEN_PAIR))
    assert env.is_deadlocked() and env.solver_value() == math.inf
    assert solve(FROZEN_PAIR) is None


def test_deadlock_check_is_sound_on_random_play():
    import random

    rng = random.Random(0)
    env = Sokoban(num_boxes=2)
    for seed in range(15):
        env.reset({"seed": seed})
        for _ in range(12):
            if env.is_deadlocked():
                assert env.solver_value() == math.inf
            _, _, done, _ = env.step(rng.choice(["up", "down", "left", "right"]))
            if done:
                break


def test_solver_speed_two_boxes():
    env = Sokoban(num_boxes=2)
    env.reset({"seed": 123})
    start = time.perf_counter()
    plan = solve(env.puzzle)
    assert plan is not None and time.perf_counter() - start < 0.5


def test_node_limit_gives_none():
    assert solve(DETOUR, max_nodes=1) is None
    assert solve(CORRIDOR.replace("P X", "P *").replace("O #", "_ #")) == []  # already solved


# ---- capabilities --------------------------------------------------------------------------------------------------


def test_snapshot_restore_round_trip():
    env = Sokoban(num_boxes=2)
    env.reset({"seed": 42})
    env.step("left")
    saved, key, observation = env.snapshot(), env.state_key(), env.render()
    actions = ["up", "right", "down", "down", "left", "up"]
    original = [env.step(a) for a in actions]
    env.restore(saved)
    assert env.state_key() == key and env.render() == observation
    assert [env.step(a) for a in actions] == original
    # A snapshot survives a reset to another puzzle.
    env.reset({"seed": 7})
    env.restore(saved)
    assert env.state_key() == key


def test_state_key_and_capabilities():
    env = make_env("sokoban")
    env.reset(layout_task(TWO_BOXES))
    assert env.state_key() == ((1, 1), ((1, 2), (2, 2)))
    assert {"snapshot", "restore", "state_key", "solver_value", "optimal_plan"} <= Sokoban.capabilities()
    assert "Answer with exactly one word: up, down, left or right." in Sokoban.instructions


# ---- splits and arguments ------------------------------------------------------------------------------------------


def test_task_splits():
    start = time.perf_counter()
    train = Sokoban.task_split("train", 1000)
    evaluation = Sokoban.task_split("eval", 1000)
    assert time.perf_counter() - start < 0.5
    assert train[0] == {"env": "sokoban", "seed": 0, "task_id": "sokoban-train-0"}
    assert evaluation[0]["seed"] == 1_000_000
    assert not {r["seed"] for r in train} & {r["seed"] for r in evaluation}
    assert len(Sokoban.task_split("eval")) == 200
    unseen = Sokoban.task_split("unseen", 3)
    assert unseen[0]["size"] == 7 and unseen[0]["num_boxes"] == 2
    assert Sokoban.task_split("unseen", 1, num_boxes=3)[0]["num_boxes"] == 3
    # Generation settings travel with the rows; env-level settings do not.
    rows = Sokoban.task_split("train", 2, size=7, reward="shaped")
    assert rows[0]["size"] == 7 and "reward" not in rows[0]
    with pytest.raises(ValueError, match="split"):
        Sokoban.task_split("test")


@pytest.mark.parametrize(
    "kwargs,name",
    [
        ({"size": 3}, "size"),
        ({"size": (6, 6, 6)}, "size"),
        ({"num_boxes": 0}, "num_boxes"),
        ({"num_boxes": 9}, "num_boxes"),
        ({"search_depth": 0}, "search_depth"),
        ({"min_solution_length": 0}, "min_solution_length"),
        ({"min_solution_length": 5, "max_solution_length": 4}, "max_solution_length"),
        ({"reward": "dense"}, "reward"),
        ({"end_on_deadlock": "yes"}, "end_on_deadlock"),
        ({"max_solver_nodes": 0}, "max_solver_nodes"),
    ],
)
def test_bad_arguments(kwargs, name):
    with pytest.raises(ValueError, match=name):
        Sokoban(**kwargs)


def test_bad_layouts():
    env = Sokoban()
    with pytest.raises(ValueError, match="player"):
        env.reset(layout_task("# # # #\n# X O #\n# # # #"))
    with pytest.raises(ValueError, match="targets"):
        env.reset(layout_task("# # # # #\n# P X X #\n# _ O _ #\n# # # # #"))
    with pytest.raises(ValueError, match="seed"):
        env.reset({})
