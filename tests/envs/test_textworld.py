"""Tests of the TextWorld adapter: locally generated games (compiled once per session), commands, rewards,
snapshots by `env.copy()`, state keys from TextWorld's facts, expert plans and splits."""

import hashlib
import shutil
import sys
from pathlib import Path

import pytest

from trl_agents.envs import cache_dir, make_env
from trl_agents.envs.checks import check_env
from trl_agents.envs.textworld import TextWorld, clean_feedback, generate_game, resolve_settings

# Coin collector level 5: five rooms in a chain, the coin at the far end (expert plan of 5 commands).
COIN = {"challenge": "tw-coin_collector", "seed": 3, "level": 5}
# A small cooking game: two ingredients, one to find, containers to open, food to cut (max score > 1).
COOKING = {"challenge": "tw-cooking", "seed": 2, "recipe": 2, "take": 1, "open": True, "cut": True}


@pytest.fixture(scope="module")
def env():
    """One env for the module; its first reset compiles the coin game (cached for every later use)."""
    instance = TextWorld()
    instance.reset(COIN)
    yield instance
    instance.close()


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_games_are_cached_byte_identical_and_inform_stays_in_the_cache(env, tmp_path, monkeypatch):
    first = env.game_file_for(COIN)
    assert first.parent == cache_dir("textworld", "games") and first.with_suffix(".json").is_file()
    assert env.game_file_for(dict(COIN)) == first  # the second call reads the cache
    assert env.game_file_for({**COIN, "env": "textworld", "task_id": "x"}) == first  # other row keys don't matter
    assert env.game_file_for({**COIN, "seed": 4}) != first
    # Inform 7 wrote its ~/Inform folder into the cache, not into HOME.
    assert (cache_dir("textworld", "inform-home") / "Inform").is_dir()
    assert not (Path.home() / "Inform").exists()
    # Generating the same game into an empty cache gives the same bytes.
    monkeypatch.setenv("TRL_AGENTS_CACHE", str(tmp_path))
    again = TextWorld().game_file_for(COIN)
    assert again.parent == tmp_path / "textworld" / "games" and again.name == first.name
    assert sha(again) == sha(first)
    assert not list((tmp_path / "textworld" / "tmp").iterdir())  # scratch folders are removed


def test_same_task_same_episode(env):
    other = TextWorld()
    try:
        assert other.reset(COIN) == env.reset(COIN)
        for command in env.optimal_plan():
            assert other.step(command) == env.step(command)
    finally:
        other.close()


def test_expert_plan_wins_with_normalized_reward(env):
    observation = env.reset(COIN)
    assert "Valid commands:" in observation and "You are carrying nothing." in observation
    assert "coin" in env.task_description()
    plan = env.optimal_plan()
    assert len(plan) == 5 and plan[-1] == "take coin"
    total = 0.0
    for index, command in enumerate(plan):
        assert command in env.admissible_actions()
        observation, reward, done, info = env.step(command)
        total += reward
        assert info["valid"] and done == (index == len(plan) - 1)
    assert info["success"] and total == 1.0 and info["score"] == info["max_score"] == 1
    assert "*** The End ***" in observation and "Valid commands" not in observation
    assert env.optimal_plan() == []
    with pytest.raises(RuntimeError, match="over"):
        env.step("look")


def test_cooking_game_raw_score_reward_and_detours():
    env = TextWorld(reward="score")
    try:
        env.reset(COOKING)
        plan = env.optimal_plan()
        assert plan and plan[-1] == "eat meal"
        # A detour (drop an ingredient the recipe needs) is undone by the tracker's plan, which still wins.
        assert "slice red onion with knife" in plan and "drop red onion" in env.admissible_actions()
        env.step("drop red onion")
        replanned = env.optimal_plan()
        assert "take red onion" in replanned and replanned[-1] == "eat meal"
        total = 0.0
        for command in replanned:
            *_, reward, done, info = env.step(command)
            total += reward
        assert done and info["success"] and total == info["max_score"] > 1
    finally:
        env.close()


@pytest.mark.parametrize("command", ["dance", "", "go to the moon", "take coin and run", "<action></action>"])
def test_invalid_commands_change_nothing(env, command):
    env.reset(COIN)
    key, admissible = env.state_key(), env.admissible_actions()
    observation, reward, done, info = env.step(command)
    assert info["valid"] is False and info["success"] is False and reward == 0.0 and not done
    assert observation.startswith("Invalid command") and "Valid commands: " + ", ".join(admissible) in observation
    assert env.state_key() == key and env.admissible_actions() == admissible
    # the game itself never saw the command: the expert plan still wins in exactly its length
    for expert_command in env.optimal_plan():
        *_, done, info = env.step(expert_command)
    assert done and info["success"]


def test_commands_are_parsed_from_model_output(env):
    env.reset(COIN)
    first = env.optimal_plan()[0]
    _, _, _, info = env.step(f"<think>the coin is far</think><action>{first.upper()}.</action>")
    assert info["valid"] and info["action"] == first


def test_state_key_is_the_world_state(env):
    env.reset(COIN)
    start = env.state_key()
    command = env.optimal_plan()[0]
    back = {"go north": "go south", "go south": "go north", "go east": "go west", "go west": "go east"}[command]
    env.step("look")  # a turn passes, the world does not change
    assert env.state_key() == start
    env.step(command)
    assert env.state_key() != start
    env.step(back)
    assert env.state_key() == start


def test_snapshot_restore_across_games(env):
    env.reset(COIN)
    plan = env.optimal_plan()
    env.step(plan[0])
    snapshot = env.snapshot()
    key = env.state_key()
    future = [env.step(command) for command in plan[1:]]
    assert future[-1][2] and future[-1][3]["success"]
    env.reset(COOKING)  # another game in between
    env.restore(snapshot)
    assert env.state_key() == key and env.optimal_plan() == plan[1:]
    assert [env.step(command) for command in plan[1:]] == future
    env.restore(snapshot)  # a snapshot can be restored again
    assert env.state_key() == key
    assert env.reset(COIN) == TextWorld().reset(COIN)  # and the env still resets normally


def test_check_env_contract():
    report = check_env(TextWorld, COIN)
    assert set(report) == {"step_outputs", "determinism", "bad_action", "info_keys", "snapshot_restore",
                           "expert_episode"}


def test_observation_modes(env):
    full = env.reset(COIN)
    feedback_env = TextWorld(observation="feedback", show_admissible=False)
    try:
        feedback = feedback_env.reset(COIN)
        assert "Valid commands" not in feedback and "You are carrying" not in feedback
        assert feedback.startswith(feedback_env.task_description()[:40])  # the intro text, banner removed
        command = feedback_env.optimal_plan()[0]
        response = feedback_env.step(command)[0]
        assert response.startswith("-=") and "You are carrying" not in response
        assert "Valid commands:" in feedback_env.step("xyzzy")[0]  # listed after an invalid command anyway
    finally:
        feedback_env.close()
    assert full.startswith("-=")  # full mode starts with the room, the goal is the task description
    assert "TEXTWORLD" not in full and "$$" not in full


def test_clean_feedback():
    raw = (
        "\n\n  ____\n |  $$\n\nYou win!\n\n\n\n*** The End ***\nWould you like to RESTART, RESTORE a saved game, "
        "QUIT or UNDO the last command?\n>     -= Kitchen =-1/5"
    )
    assert clean_feedback(raw) == "You win!\n\n*** The End ***"


def test_user_game_file(env, tmp_path):
    source = env.game_file_for(COIN)
    target = tmp_path / "my_game.z8"
    shutil.copy(source, target)
    shutil.copy(source.with_suffix(".json"), target.with_suffix(".json"))
    assert env.reset({"game_file": str(target)}) == env.reset(COIN)
    with pytest.raises(ValueError, match="Glulx"):
        env.reset({"game_file": str(tmp_path / "old.ulx")})
    with pytest.raises(ValueError, match="does not exist"):
        env.reset({"game_file": str(tmp_path / "missing.z8")})
    target.with_suffix(".json").unlink()
    with pytest.raises(ValueError, match=r"\.json"):
        env.reset({"game_file": str(target)})


@pytest.mark.parametrize(
    "task, field",
    [
        ({}, "seed"),
        ({"challenge": "tw-coin_collector", "seed": -1}, "seed"),
        ({"challenge": "tw-coin_collector", "seed": "3"}, "seed"),
        ({"challenge": "coin", "seed": 1}, "challenge"),
        ({"challenge": "tw-coin_collector", "seed": 1, "level": "5"}, "level"),
        ({"challenge": "tw-simple", "seed": 1, "rewards": "lots"}, "rewards"),
        ({"challenge": "tw-cooking", "seed": 1, "go": 5}, "go"),
        ({"challenge": "tw-cooking", "seed": 1, "cut": "yes"}, "cut"),
        ({"challenge": "custom", "seed": 1, "world_size": 0}, "world_size"),
        ({"game_file": 3}, "game_file"),
    ],
)
def test_bad_task_rows(env, task, field):
    with pytest.raises(ValueError, match=field):
        env.reset(task)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"challenge": "zork"}, "challenge"),
        ({"challenge_settings": {"levle": 3}}, "levle"),
        ({"challenge_settings": [1]}, "challenge_settings"),
        ({"reward": "dense"}, "reward"),
        ({"observation": "pixels"}, "observation"),
        ({"show_admissible": "no"}, "show_admissible"),
    ],
)
def test_bad_constructor_arguments(kwargs, field):
    with pytest.raises(ValueError, match=field):
        TextWorld(**kwargs)


def test_rows_without_challenge_use_the_constructor_settings(env):
    constructed = TextWorld(challenge="coin_collector", challenge_settings={"level": 5})
    try:
        assert constructed.game_file_for({"seed": 3}) == env.game_file_for(COIN)
        # a row naming another challenge does not inherit coin-collector settings
        assert resolve_settings("tw-simple", {"seed": 3})["rewards"] == "dense"
    finally:
        constructed.close()


def test_task_split_settings_and_no_generation():
    games = cache_dir("textworld", "games")
    before = sorted(games.iterdir())
    train = TextWorld.task_split("train", 3)
    assert [row["seed"] for row in train] == [0, 1, 2]
    assert train[0] == {
        "env": "textworld",
        "task_id": "textworld-tw-coin_collector-train-0",
        "challenge": "tw-coin_collector",
        "seed": 0,
        "level": 5,
    }
    assert [row["seed"] for row in TextWorld.task_split("eval", 2)] == [1_000_000, 1_000_001]
    unseen = TextWorld.task_split("unseen", 1, challenge_settings={"level": 20})[0]
    assert unseen["seed"] == 2_000_000 and unseen["level"] == 30
    cooking = {
        split: TextWorld.task_split(split, 1, challenge="tw-cooking")[0]["split"]
        for split in ("train", "eval", "unseen")
    }
    assert cooking == {"train": "train", "eval": "valid", "unseen": "test"}
    assert TextWorld.task_split("unseen", 1, challenge="tw-simple")[0]["test"] is True
    custom = TextWorld.task_split("unseen", 1, challenge="custom")[0]
    assert (custom["quest_length"], custom["world_size"]) == (8, 10)
    assert sorted(games.iterdir()) == before
    with pytest.raises(ValueError, match="split"):
        TextWorld.task_split("test")
    with pytest.raises(ValueError, match="reward"):
        TextWorld.task_split("train", 2, reward="x")


def test_registered_with_capabilities():
    env = make_env("textworld")
    assert isinstance(env, TextWorld)
    assert sorted(env.capabilities()) == ["optimal_plan", "restore", "snapshot", "state_key"]


def test_missing_package_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "textworld", None)
    with pytest.raises(ImportError, match=r'pip install "trl-agents\[envs\]"'):
        TextWorld()
    with pytest.raises(ImportError, match=r"trl-agents\[envs\]"):
        generate_game("tw-coin_collector", 1, {"level": 1})


@pytest.mark.slow
def test_one_training_iteration(env, train_one_iteration):
    train_one_iteration("textworld", [COIN], max_turns=2)
