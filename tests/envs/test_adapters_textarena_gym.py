"""The TextArena and gymnasium adapters: offline games, roles, the string-reward guard, random-state isolation,
action parsing, snapshots and one training iteration each."""

from __future__ import annotations

import random
import sys

import pytest

from trl_agents.envs import make_env
from trl_agents.envs.checks import check_env

pytest.importorskip("textarena")
pytest.importorskip("gymnasium")

from trl_agents.envs.adapters.gymnasium import GymnasiumEnv, ansi_to_text
from trl_agents.envs.adapters.textarena import TextArenaEnv, TextArenaGameUnavailable, _numeric_reward

# ---- TextArena -----------------------------------------------------------------------------------------------------

HANOI_SOLUTION = ["[A C]", "[A B]", "[C B]", "[A C]", "[B A]", "[B C]", "[A C]"]

# Games verified to run offline here (README table), with moves that are valid from seed 0.
OFFLINE_GAMES = {
    "TowerOfHanoi-v0": HANOI_SOLUTION,
    "FrozenLake-v0": ["[right]", "[down]", "[right]", "[down]"],
    "Minesweeper-v0": ["[3 3]", "[0 0]", "[7 0]"],
    "Mastermind-v0": ["[1 2 3 4]", "[2 3 4 5]", "[3 4 5 6]"],
    "GuessTheNumber-v0": ["[10]", "[5]", "[15]"],
    "LightsOut-v0": ["[0 0]", "[1 1]", "[2 2]"],
    "FifteenPuzzle-v0": ["[left]", "[down]", "[right]", "[up]"],
    "RushHour-v0": ["[A+]", "[A-]", "[B+]"],
    "Cryptarithm-v0": ["[S 9]", "[E 5]", "[N 6]"],
    "2048-v0": ["[up]", "[left]", "[down]", "[right]"],  # random tile spawns: exercises the seeded random state
    "TicTacToe-v0": ["[0]", "[3]", "[1]", "[4]", "[2]"],
    "SimpleNegotiation-v0": ["Hi there", "[Offer: 1 Wheat -> 1 Ore]", "[Deny]", "Bye"],
}


@pytest.mark.parametrize("game", sorted(OFFLINE_GAMES))
def test_textarena_games_pass_check_env(game):
    actions = OFFLINE_GAMES[game]
    # In SimpleNegotiation any talk is a valid message; an offer of resources nobody has is not.
    bad = "[Offer: 1000 Gold -> 1 Wheat]" if game == "SimpleNegotiation-v0" else "this is definitely not an action ~~~"
    expert = HANOI_SOLUTION if game == "TowerOfHanoi-v0" else ()
    report = check_env(
        lambda: TextArenaEnv(game=game), {"seed": 0}, actions=actions, expert_actions=expert, bad_action=bad
    )
    assert {"determinism", "bad_action", "info_keys", "snapshot_restore"} <= set(report)
    env = TextArenaEnv(game=game)
    env.reset({"seed": 0})
    for action in actions:
        _, reward, done, info = env.step(action)
        assert info["valid"] is True and isinstance(reward, float)
        if done:
            break


def test_seeds_change_the_game():
    env = TextArenaEnv(game="LightsOut-v0")
    assert env.reset({"seed": 1}) != env.reset({"seed": 2})
    assert env.reset({"seed": 1}) == TextArenaEnv().reset({"game": "LightsOut-v0", "seed": 1})


def test_tower_of_hanoi_expert_and_observations():
    env = make_env("textarena", game="TowerOfHanoi-v0")
    observation = env.reset({"seed": 0})
    assert observation.startswith("Current Board:") and "Tower of Hanoi with 3 disks" in env.task_description()
    assert env.roles == () and env.current_role() == "" and not env.supports("roles")
    for i, action in enumerate(HANOI_SOLUTION):
        observation, reward, done, info = env.step(f"<think>move</think> {action}")
        assert info["valid"] and done == (i == len(HANOI_SOLUTION) - 1)
    assert reward == 1.0 and info["success"] is True
    assert "C: [3, 2, 1]" in observation and "Game over." in observation
    with pytest.raises(RuntimeError):
        env.step("[A B]")


def test_answers_without_brackets_are_wrapped_as_textarena_does():
    env = TextArenaEnv(game="TowerOfHanoi-v0")
    env.reset({"seed": 0})
    _, _, _, info = env.step("```\nA C\n```")
    assert info["action"] == "[A C]" and info["valid"]


def test_sokoban_solved_by_our_solver():
    """TextArena's Sokoban boards use our symbols (plus √ for a box on a target): our A* plan solves them."""
    from trl_agents.envs.sokoban import solve

    env = TextArenaEnv(game="Sokoban-v0")
    observation = env.reset({"seed": 0})
    grid = "\n".join(line for line in observation.splitlines() if line.startswith("#")).replace("√", "*")
    plan = solve(grid)
    assert plan
    for action in plan:
        _, reward, done, info = env.step(f"[{action}]")
        assert info["valid"]
    assert done and reward == 1.0 and info["success"] is True


def test_invalid_moves_follow_textarena_rules():
    env = TextArenaEnv(game="TowerOfHanoi-v0")
    env.reset({"seed": 0})
    board = env.step("[A C]")[0].split("\n\n")[-1]
    observation, reward, done, info = env.step("[B C]")  # tower B is empty
    assert info["valid"] is False and not done and reward == 0.0
    assert "invalid move" in observation and observation.endswith(board)  # feedback, then the unchanged board
    _, reward, done, info = env.step("[B C]")  # TextArena's default error allowance is 1: the second one loses
    assert done and info["valid"] is False and info["success"] is False and "Invalid Move" in info["reason"]

    tolerant = TextArenaEnv(game="TowerOfHanoi-v0", error_allowance=1000)
    tolerant.reset({"seed": 0})
    for _ in range(10):
        observation, _, done, info = tolerant.step("[B C]")
        assert not done and info["valid"] is False
    assert observation.endswith("A: [3, 2, 1]\nB: []\nC: []\n.")


def test_string_reward_guard_on_countdown():
    """Countdown passes its arguments to set_invalid_move in the wrong order: the losing 'reward' is a string."""
    env = TextArenaEnv(game="Countdown-v0")
    env.reset({"seed": 0})
    _, reward, done, info = env.step("[9 9 +]")
    assert not done and info["valid"] is False and reward == 0.0
    _, reward, done, info = env.step("not a move")
    assert done and type(reward) is float and reward == 0.0
    assert info["valid"] is False and info["success"] is False and "non-numeric reward" in info["reward_error"]


@pytest.mark.parametrize(
    "value,expected", [(1, 1.0), (0.25, 0.25), (True, 1.0), ("0.5", 0.5), ("Invalid action format", None), (None, None)]
)
def test_numeric_reward(value, expected):
    assert _numeric_reward(value) == expected


def test_random_state_is_private_and_episodes_interleave():
    """2048 spawns random tiles: interleaved episodes must match solo ones, and the caller's random stays put."""
    moves = ["[up]", "[left]", "[down]", "[right]"] * 3

    def solo(seed):
        env = TextArenaEnv(game="2048-v0")
        return [env.reset({"seed": seed})] + [env.step(m)[0] for m in moves]

    expected_a, expected_b = solo(1), solo(2)
    random.seed(1234)
    untouched = [random.random() for _ in range(3)]
    random.seed(1234)
    a, b = TextArenaEnv(game="2048-v0"), TextArenaEnv(game="2048-v0")
    got_a, got_b = [a.reset({"seed": 1})], [b.reset({"seed": 2})]
    for move in moves:
        got_a.append(a.step(move)[0])
        random.random()  # the trainer drawing random numbers between steps
        got_b.append(b.step(move)[0])
    assert got_a == expected_a and got_b == expected_b
    random.seed(1234)
    assert [random.random() for _ in range(3)] == untouched


def test_two_player_roles_and_role_rewards():
    env = TextArenaEnv(game="TicTacToe-v0")
    assert env.roles == ("player_0", "player_1") and env.supports("roles")
    observation = env.reset({"seed": 0})
    assert observation.startswith("You are Player 0") and env.task_description() == ""
    roles = []
    for move in ["[0]", "[3]", "[1]", "[4]", "[2]"]:
        roles.append(env.current_role())
        observation, reward, done, info = env.step(move)
        assert info["role"] == roles[-1]
        if not done:
            assert observation.startswith(f"You are Player {1 - int(roles[-1][-1])}")  # the next player's view
    assert roles == ["player_0", "player_1", "player_0", "player_1", "player_0"]
    assert done and reward == 1.0 and info["success"] is True
    assert info["role_rewards"] == {"player_0": 1.0, "player_1": -1.0}


def test_two_player_invalid_move_keeps_the_turn():
    env = TextArenaEnv(game="TicTacToe-v0")
    env.reset({"seed": 0})
    env.step("[4]")
    observation, _, done, info = env.step("[4]")  # occupied
    assert info["valid"] is False and not done and env.current_role() == "player_1"
    assert "cell 4 is already occupied" in observation


def test_full_observation_mode_keeps_the_dialogue():
    env = TextArenaEnv(game="SimpleNegotiation-v0", observation="full")
    first = env.reset({"seed": 0})
    env.step("Hello, I need ore.")
    observation = env.step("I have plenty of wheat.")[0]  # player 0's view: everything since the reset
    assert observation.startswith(first)
    assert observation.index("[Player 0] [Hello, I need ore.]") < observation.index("[Player 1] [I have plenty")
    latest = TextArenaEnv(game="SimpleNegotiation-v0")
    latest.reset({"seed": 0})
    latest.step("Hello, I need ore.")
    observation = latest.step("I have plenty of wheat.")[0]
    assert "[Player 1] [I have plenty of wheat.]" in observation and "Hello, I need ore" not in observation


def test_textarena_snapshot_is_reusable():
    env = TextArenaEnv(game="2048-v0")
    env.reset({"seed": 5})
    env.step("[up]")
    saved = env.snapshot()
    first = [env.step(m)[0] for m in ["[left]", "[down]"]]
    for _ in range(2):
        env.restore(saved)
        assert [env.step(m)[0] for m in ["[left]", "[down]"]] == first


def test_unknown_and_unavailable_games(monkeypatch):
    with pytest.raises(ValueError, match="Did you mean 'Sokoban-v0'"):
        TextArenaEnv(game="Sokobn-v0")
    monkeypatch.delenv("OPENROUTER_API_KEY", raising=False)
    with pytest.raises(TextArenaGameUnavailable, match="OpenRouter"):
        TextArenaEnv(game="GuessWho-v0")
    with pytest.raises(TextArenaGameUnavailable, match="blue_book.txt"):
        TextArenaEnv(game="UsedCarNegotiation-v0")
    import importlib.util

    if importlib.util.find_spec("gym") is None:
        with pytest.raises(TextArenaGameUnavailable, match="'gym' package"):
            TextArenaEnv(game="BabyAiText-v0")
    if sys.version_info < (3, 12):
        with pytest.raises(TextArenaGameUnavailable, match="Python 3.12"):
            TextArenaEnv(game="Chess-v0")
    import nltk

    try:
        nltk.data.find("corpora/words")
    except LookupError:  # the usual offline case: the word list was never downloaded
        with pytest.raises(TextArenaGameUnavailable, match="NLTK data 'words'"):
            TextArenaEnv().reset({"game": "Hangman-v0", "seed": 0})


def test_missing_packages_give_install_hints(monkeypatch):
    monkeypatch.setitem(sys.modules, "textarena", None)  # as if it were not installed
    monkeypatch.setitem(sys.modules, "gymnasium", None)
    with pytest.raises(ImportError, match=r"pip install \"trl-agents\[envs\]\""):
        TextArenaEnv(game="TowerOfHanoi-v0")
    with pytest.raises(ImportError, match=r"pip install \"trl-agents\[envs\]\""):
        GymnasiumEnv(env_id="FrozenLake-v1")


@pytest.mark.parametrize(
    "kwargs,name",
    [
        ({"game": 3}, "game"),
        ({"game_kwargs": "size=3"}, "game_kwargs"),
        ({"observation": "board"}, "observation"),
        ({"error_allowance": -1}, "error_allowance"),
        ({"num_players": 0}, "num_players"),
        ({"bracket_actions": "yes"}, "bracket_actions"),
        ({"max_action_chars": 0}, "max_action_chars"),
    ],
)
def test_textarena_bad_arguments(kwargs, name):
    with pytest.raises(ValueError, match=name):
        TextArenaEnv(**kwargs)


def test_textarena_bad_task_rows_and_splits():
    with pytest.raises(ValueError, match="needs a 'game'"):
        TextArenaEnv().reset({"seed": 0})
    with pytest.raises(ValueError, match="integer 'seed'"):
        TextArenaEnv(game="TowerOfHanoi-v0").reset({"seed": "0"})
    rows = TextArenaEnv.task_split("eval", 2, game="Minesweeper-v0")
    assert rows[0] == {
        "env": "textarena",
        "task_id": "textarena-Minesweeper-v0-eval-1000000",
        "game": "Minesweeper-v0",
        "seed": 1_000_000,
    }
    with pytest.raises(ValueError, match="needs the game id"):
        TextArenaEnv.task_split("train")


def test_task_game_kwargs_override():
    env = TextArenaEnv(game="TowerOfHanoi-v0")
    observation = env.reset({"seed": 0, "game_kwargs": {"num_disks": 4}})
    assert "A: [4, 3, 2, 1]" in observation
    # Rows read back from a dataset hold None for the keys other rows have.
    assert "A: [3, 2, 1]" in env.reset({"game": None, "seed": 0, "game_kwargs": None})


# ---- gymnasium -----------------------------------------------------------------------------------------------------

FROZEN_PATH = ["down", "down", "right", "right", "down", "right"]  # the default 4x4 map, no slipping
CLIFF_PATH = ["up"] + ["right"] * 11 + ["down"]


def frozenlake(**kwargs):
    return GymnasiumEnv(env_id="FrozenLake-v1", env_kwargs={"is_slippery": False}, **kwargs)


def test_gymnasium_frozenlake_check_env():
    report = check_env(frozenlake, {"seed": 0}, expert_actions=FROZEN_PATH)
    assert set(report) == {"step_outputs", "determinism", "bad_action", "info_keys", "snapshot_restore",
                           "expert_episode"}


def test_gymnasium_slippery_frozenlake_is_seeded():
    actions = ["right", "down", "2", "1", "down", "right"] * 3
    check_env(lambda: GymnasiumEnv(env_id="FrozenLake-v1"), {"seed": 3}, actions=actions, expert_actions=())
    env = GymnasiumEnv(env_id="FrozenLake-v1")
    runs = []
    for seed in (0, 0, 1, 2, 3):
        run = [env.reset({"seed": seed})]
        for _ in range(4):
            observation, _, done, _ = env.step("right")
            run.append(observation)
            if done:
                break
        runs.append(run)
    assert runs[0] == runs[1] and len({tuple(r) for r in runs}) > 1  # same seed, same slips; seeds differ


def test_gymnasium_cliffwalking_check_env_and_rewards():
    report = check_env(lambda: GymnasiumEnv(), {"env_id": "CliffWalking-v1", "seed": 0}, expert_actions=CLIFF_PATH)
    assert "expert_episode" in report
    env = GymnasiumEnv(env_id="CliffWalking-v1")
    start = env.reset({"seed": 0})
    assert start.splitlines()[-1].startswith("x  C  C")
    observation, reward, done, info = env.step("right")  # into the cliff: -100, back to the start, not over
    assert reward == -100.0 and not done and observation == start
    total = 0.0
    env.reset({"seed": 0})
    for action in CLIFF_PATH:
        _, reward, done, info = env.step(action)
        total += reward
    assert done and info["success"] and total == -13.0


def test_gymnasium_frozenlake_text_and_parsing():
    env = frozenlake()
    assert env.reset({"seed": 0}) == "PFFF\nFHFH\nFFFH\nHFFG"
    assert "left (0), down (1), right (2), up (3)" in env.task_description()
    assert env.admissible_actions() == ["left", "down", "right", "up"]
    assert env.step("I go Right.")[3]["action"] == "right"
    assert env.step("<action>1</action>")[3]["action"] == "down"
    assert env.state_key() == 5  # row 1, col 1: the hole
    env.reset({"seed": 0})
    for bad in ["up or down", "north", "7", ""]:
        observation, reward, done, info = env.step(bad)
        assert info["valid"] is False and reward == 0.0 and not done and env.state_key() == 0
        assert observation.startswith("Invalid action. Reply with exactly one of: left, down, right, up")
    _, reward, done, info = env.step("down")
    _, reward, done, info = env.step("right")  # the hole at (1, 1)
    assert done and reward == 0.0 and info["success"] is False and info["terminated"]


def test_ansi_to_text():
    assert ansi_to_text("  (Left)\n\x1b[41mS\x1b[0mFF\nF\x1b[41mH\x1b[0mG\n") == "PFF\nFPG"
    assert ansi_to_text("\x1b[41mS\x1b[0mF", highlight_char=None) == "SF"
    assert ansi_to_text("|\x1b[35mY\x1b[0m|\x1b[34;1mB\x1b[0m:|\x1b[43m \x1b[0m|") == "|Y|B:|P|"


def test_gymnasium_custom_text_and_actions_on_taxi():
    """Taxi's ANSI colours carry the passenger and destination, so it gets its own text through the callables."""

    def taxi_text(observation, env):
        row, col, passenger, destination = env.unwrapped.decode(observation)
        where = "in the taxi" if passenger == 4 else "RGYB"[passenger]
        return f"taxi at row {row}, col {col}; passenger: {where}; destination: {'RGYB'[destination]}"

    moves = {"s": 0, "n": 1, "e": 2, "w": 3, "pick": 4, "drop": 5}
    env = GymnasiumEnv(
        env_id="Taxi-v4",
        observation_to_text=taxi_text,
        text_to_action=lambda answer, env: moves.get(answer.strip().lower()),
        is_success=lambda reward, terminated, truncated, info: terminated and reward == 20,
    )
    observation = env.reset({"seed": 0})
    assert observation == "taxi at row 3, col 0; passenger: B; destination: Y"
    observation, reward, _, info = env.step("n")
    assert info["valid"] and reward == -1.0 and observation.startswith("taxi at row 2, col 0")
    observation, _, _, info = env.step("north")
    assert info["valid"] is False and "could not be turned into an action" in observation
    assert env.admissible_actions() is None
    check_env(
        lambda: GymnasiumEnv(
            env_id="Taxi-v4", observation_to_text=taxi_text, text_to_action=lambda a, e: moves.get(a.strip().lower())
        ),
        {"seed": 4},
        actions=["s", "n", "e", "w", "pick", "drop", "s", "s"],
        expert_actions=(),
    )


@pytest.mark.parametrize(
    "kwargs,name",
    [
        ({"env_id": 1}, "env_id"),
        ({"env_kwargs": ["is_slippery"]}, "env_kwargs"),
        ({"action_names": ["left", "LEFT"]}, "distinct"),
        ({"action_names": "left"}, "action_names"),
        ({"observation_to_text": "ansi"}, "observation_to_text"),
        ({"highlight_char": "PP"}, "highlight_char"),
    ],
)
def test_gymnasium_bad_arguments(kwargs, name):
    with pytest.raises(ValueError, match=name):
        GymnasiumEnv(**kwargs)


def test_gymnasium_bad_task_rows_and_envs():
    with pytest.raises(ValueError, match="needs an 'env_id'"):
        GymnasiumEnv().reset({"seed": 0})
    with pytest.raises(ValueError, match="integer 'seed'"):
        frozenlake().reset({"seed": None})
    with pytest.raises(ValueError, match="cannot make 'FrozenLak-v1'"):
        GymnasiumEnv(env_id="FrozenLak-v1").reset({"seed": 0})
    with pytest.raises(ValueError, match="4 actions"):
        GymnasiumEnv(env_id="FrozenLake-v1", action_names=["a", "b"]).reset({"seed": 0})
    with pytest.raises(ValueError, match="text_to_action"):
        GymnasiumEnv(env_id="Pendulum-v1", observation_to_text=lambda o, e: str(o)).reset({"seed": 0})
    with pytest.raises(ValueError, match="render_mode='ansi'"):
        GymnasiumEnv(env_id="FrozenLake-v1", env_kwargs={"render_mode": "rgb_array"}).reset({"seed": 0})


def test_gymnasium_task_split():
    rows = GymnasiumEnv.task_split("train", 2, env_id="FrozenLake-v1", env_kwargs={"is_slippery": False})
    assert rows[1] == {
        "env": "gymnasium",
        "task_id": "gymnasium-FrozenLake-v1-train-1",
        "env_id": "FrozenLake-v1",
        "seed": 1,
        "env_kwargs": {"is_slippery": False},
    }
    assert "env_kwargs" not in GymnasiumEnv.task_split("eval", 1, env_id="CliffWalking-v1")[0]
    env = GymnasiumEnv()
    assert env.reset(rows[0]) == "PFFF\nFHFH\nFFFH\nHFFG"
    assert frozenlake().reset({"env_id": None, "seed": 0, "env_kwargs": None}) == "PFFF\nFHFH\nFFFH\nHFFG"
    with pytest.raises(ValueError, match="needs the env id"):
        GymnasiumEnv.task_split("train")


# ---- training ------------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_one_training_iteration_textarena(train_one_iteration):
    train_one_iteration("textarena", [{"seed": 0}, {"seed": 1}], env_kwargs={"game": "TowerOfHanoi-v0"})


@pytest.mark.slow
def test_one_training_iteration_gymnasium(train_one_iteration):
    train_one_iteration(
        "gymnasium",
        [{"seed": 0}, {"seed": 1}],
        env_kwargs={"env_id": "FrozenLake-v1", "env_kwargs": {"is_slippery": False}},
    )
