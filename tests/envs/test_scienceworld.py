"""Tests of the ScienceWorld adapter: the fast step, ambiguity questions, scoring, gold-path expert plans, replay
snapshots, splits and the JVM's lifecycle. One module-scoped env keeps JVM starts few."""

import sys
import time

import pytest

from trl_agents.envs import make_env
from trl_agents.envs import scienceworld as sw
from trl_agents.envs.checks import check_env
from trl_agents.envs.replay import ReplaySnapshot
from trl_agents.envs.scienceworld import ScienceWorld, variation_splits

# find-living-thing, variation 0: the gold path has 10 commands (open doors, go outside, focus on an animal, carry it
# to the red box in the kitchen).
TASK = {"task_name": "find-living-thing", "variation": 0}


@pytest.fixture(scope="module")
def env():
    instance = ScienceWorld()
    instance.reset(TASK)
    yield instance
    instance.close()


def test_reset_observation_and_task(env):
    observation = env.reset(TASK)
    assert observation.startswith("This room is called the hallway.")
    assert "In your inventory, you see:" in observation
    assert env.task_description().startswith("Your task is to find a(n) living thing.")
    other = env.reset({"task_name": "boil", "variation": 3})  # the same JVM loads another task
    assert other != observation and "boil" in env.task_description()


def test_gold_plan_completes_the_task(env):
    env.reset(TASK)
    plan = env.optimal_plan()
    assert len(plan) == 10 and plan[5].startswith("focus on ") and plan[-1].endswith("to red box")
    assert env.optimal_plan() == plan  # computing it left the episode where it was (the start)
    total, steps = 0.0, []
    for index, command in enumerate(plan):
        start = time.perf_counter()
        observation, reward, done, info = env.step(command)
        steps.append(time.perf_counter() - start)
        total += reward
        assert info["valid"] and done == (index == len(plan) - 1), (command, observation)
        if index == 3:
            assert env.optimal_plan() == plan[4:]  # the rest of the gold path from a state on it
    assert info["success"] and info["score"] == 100 and total == pytest.approx(1.0)
    assert env.optimal_plan() == []
    assert sorted(steps)[len(steps) // 2] < 0.1  # the fast path: no valid-action enumeration per step
    with pytest.raises(RuntimeError, match="over"):
        env.step("look around")


def test_off_the_gold_path_there_is_no_plan(env):
    env.reset(TASK)
    env.step("wait1")
    assert env.optimal_plan() is None


def test_unparsable_commands_change_nothing(env):
    env.reset(TASK)
    moves = env._simulator.server.getNumMoves()
    for command in ("", "dance wildly", "go north", "<action></action>"):
        key = env.state_key()
        observation, reward, done, info = env.step(command)
        assert info["valid"] is False and reward == 0.0 and not done and not info["success"]
        assert env.state_key() == key and env._simulator.server.getNumMoves() == moves
        assert "This room is called the hallway." in observation  # the full observation still shows the state


def test_ambiguous_commands_ask_for_a_number(env):
    env.reset(TASK)
    observation, _, _, info = env.step("open door")
    assert info["valid"] and observation.startswith("Ambiguous request")
    choices = info["choices"]
    assert len(choices) == 6 and all(choice.startswith("open door between") for choice in choices)
    assert env.admissible_actions() == [str(i) for i in range(6)]
    key = env.state_key()
    for answer in ("open door to kitchen", "6", "-1"):  # anything but a listed number: rejected, not sent
        observation, _, _, info = env.step(answer)
        assert not info["valid"] and observation.startswith("Answer with the number") and env.state_key() == key
    kitchen = choices.index("open door between kitchen and hallway")
    observation, reward, _, info = env.step(f"<action>{kitchen}</action>")
    assert info["valid"] and info["choices"] is None and observation.startswith("The door is now open.")
    assert reward > 0  # opening the door to the kitchen is the task's first subgoal


def test_failing_the_task_ends_the_episode(env):
    env.reset(TASK)
    _, reward, done, info = env.step("focus on picture")  # a picture is not a living thing
    assert done and info["valid"] and not info["success"]
    assert reward == pytest.approx(-1.0) and info["score"] == -100
    assert env.optimal_plan() is None


def test_replay_snapshot_restore(env):
    env.reset(TASK)
    plan = env.optimal_plan()
    for command in plan[:4]:
        env.step(command)
    snapshot = env.snapshot()
    assert isinstance(snapshot, ReplaySnapshot) and snapshot.actions == tuple(plan[:4])
    key = env.state_key()
    future = [env.step(command) for command in plan[4:]]
    env.reset({"task_name": "melt", "variation": 1})
    env.restore(snapshot)
    assert env.state_key() == key and env.optimal_plan() == plan[4:]
    assert [env.step(command) for command in plan[4:]] == future


def test_tasks_play_the_same_in_a_used_and_a_fresh_jvm(env):
    """The module's JVM has loaded many tasks; a fresh one has loaded none. Without DETERMINISTIC_JVM_OPTIONS the
    object order (and when this circuit's bulb lights up) depends on that history."""
    task = {"task_name": "power-component", "variation": 1}
    env.reset(task)
    plan = env.optimal_plan()
    fresh = ScienceWorld()
    try:
        used_run = [env.reset(task)] + [env.step(command) for command in plan]
        fresh_run = [fresh.reset(task)] + [fresh.step(command) for command in plan]
    finally:
        fresh.close()
    assert used_run == fresh_run and used_run[-1][3]["success"]


def test_jvm_without_the_option_restarts_per_task(monkeypatch):
    monkeypatch.setattr(sw, "DETERMINISTIC_JVM_OPTIONS", ("-XX:NoSuchOptionAnywhere",))
    instance = ScienceWorld()
    try:
        first = instance.reset(TASK)
        process = instance._simulator._gateway.java_process
        assert instance._fresh_jvm_per_task
        assert instance.reset(TASK) == first
        assert instance._simulator._gateway.java_process is not process and process.wait(timeout=30) is not None
    finally:
        instance.close()


def test_admissible_actions_on_demand(env):
    env.reset(TASK)
    actions = env.admissible_actions()
    assert "open door to kitchen" in actions and "look around" in actions and len(actions) > 100


def test_observation_modes_and_simplifications():
    easy = ScienceWorld(simplifications="easy", observation="feedback")
    try:
        observation = easy.reset(TASK)
        assert "A door to the kitchen (that is open)" in observation  # openDoors
        response = easy.step("teleport to kitchen")[0]  # teleportAction
        assert response == "You teleport to the kitchen." and "inventory" not in response
    finally:
        easy.close()


def test_check_env_contract():
    report = check_env(ScienceWorld, TASK)
    assert set(report) == {"step_outputs", "determinism", "bad_action", "info_keys", "snapshot_restore",
                           "expert_episode"}


@pytest.mark.parametrize(
    "task, field",
    [
        ({"variation": 0}, "task_name"),
        ({"task_name": "make-coffee", "variation": 0}, "task_name"),
        ({"task_name": "boil"}, "variation"),
        ({"task_name": "boil", "variation": -1}, "variation"),
        ({"task_name": "boil", "variation": "0"}, "variation"),
        ({"task_name": "boil", "variation": 30}, "variation"),
        ({"task_name": "boil", "variation": 0, "simplifications": "fly"}, "simplifications"),
        ({"task_name": "power-component", "variation": 0, "simplifications": "noElectricalAction"}, "noElectrical"),
    ],
)
def test_bad_task_rows(env, task, field):
    with pytest.raises(ValueError, match=field):
        env.reset(task)


def test_task_names_accept_ids(env):
    env.reset({"task_name": "1-1", "variation": 0})
    assert "boil" in env.task_description()


def test_bad_constructor_arguments():
    with pytest.raises(ValueError, match="simplifications"):
        ScienceWorld(simplifications="fast")
    with pytest.raises(ValueError, match="observation"):
        ScienceWorld(observation="pixels")


def test_task_split_uses_the_package_variation_splits():
    splits = variation_splits()
    assert len(splits) == 30 and splits["find-living-thing"]["train"][:2] == [0, 1]
    train = ScienceWorld.task_split("train", 35)
    assert train[0] == {"env": "scienceworld", "task_id": "scienceworld-boil-0", "task_name": "boil", "variation": 0}
    assert len({row["task_name"] for row in train}) == 30  # round robin: every task before any second variation
    assert train[30]["variation"] == splits[train[30]["task_name"]]["train"][1]
    rows = {split: ScienceWorld.task_split(split, tasks=["find-living-thing"]) for split in ("train", "eval", "unseen")}
    variations = {split: {row["variation"] for row in rows[split]} for split in rows}
    assert variations["eval"] == set(splits["find-living-thing"]["dev"])
    assert variations["unseen"] == set(splits["find-living-thing"]["test"])
    assert not (variations["train"] & variations["eval"]) and not (variations["train"] & variations["unseen"])
    assert sum(map(len, variations.values())) == 300
    easy = ScienceWorld.task_split("eval", 2, simplifications="easy")
    assert all(row["simplifications"] == "easy" for row in easy)
    with pytest.raises(ValueError, match="split"):
        ScienceWorld.task_split("dev")
    with pytest.raises(ValueError, match="'unseen' split"):
        ScienceWorld.task_split("test")
    with pytest.raises(ValueError, match="task_name"):
        ScienceWorld.task_split("train", tasks=["fly"])


def test_close_stops_the_jvm():
    instance = ScienceWorld()
    instance.reset(TASK)
    process = instance._simulator._gateway.java_process
    instance.close()
    assert process.wait(timeout=30) is not None
    assert instance.reset(TASK).startswith("This room is called the hallway.")  # a new JVM on the next reset
    instance.close()


def test_java_missing_or_too_old(monkeypatch):
    monkeypatch.setattr(sw, "java_major_version", lambda: None)
    with pytest.raises(RuntimeError, match="Java >= 11"):
        ScienceWorld()
    monkeypatch.setattr(sw, "java_major_version", lambda: 8)
    with pytest.raises(RuntimeError, match="found Java 8"):
        ScienceWorld()


def test_java_version_probe():
    assert sw.java_major_version() >= 11  # CI and this machine have Java 17


def test_registered_with_capabilities():
    assert make_env("scienceworld").__class__ is ScienceWorld
    assert sorted(ScienceWorld.capabilities()) == ["optimal_plan", "restore", "snapshot", "state_key"]


def test_missing_package_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "scienceworld", None)
    with pytest.raises(ImportError, match=r'pip install "trl-agents\[envs\]"'):
        ScienceWorld()


@pytest.mark.slow
def test_one_training_iteration(train_one_iteration):
    train_one_iteration("scienceworld", [TASK], max_turns=2)
