"""Tests of the ALFWorld environment: the ALFWorld-style generator, play through TextWorld's PDDL engine, the expert,
verify() atoms, replay snapshots, the official-data adapter and splits.

One game per task type is generated once per module (seed 0, ALFRED's training rooms) and one env instance is shared,
so the whole file runs in well under a minute.
"""

import json
import math
import os
import shutil
import sys
from pathlib import Path

import pytest

from trl_agents.envs import alfworld_gen as gen
from trl_agents.envs.alfworld import ALFWorld
from trl_agents.envs.cache import cache_dir
from trl_agents.envs.checks import check_env

# Not pytest.importorskip: importing alfworld before the env sets ALFWORLD_DATA would create ~/.cache/alfworld.
if ALFWorld.missing_requirements():
    pytest.skip(f"needs {ALFWorld.missing_requirements()}", allow_module_level=True)

TASK_TYPES = gen.TASK_TYPES


@pytest.fixture(scope="module")
def games():
    """task type -> folder of the generated seed-0 game (game.tw-pddl + traj_data.json)."""
    return {task_type: gen.generate_game(0, task_type) for task_type in TASK_TYPES}


@pytest.fixture(scope="module")
def env(games):
    environment = ALFWorld()
    yield environment
    environment.close()


def task(task_type, seed=0):
    return {"seed": seed, "task_type": task_type}


def play(env, actions):
    return [env.step(action) for action in actions]


# ---- generation ------------------------------------------------------------------------------------------------------


def test_generated_games_are_official_format_and_cached(games):
    for task_type, folder in games.items():
        game = json.loads((folder / "game.tw-pddl").read_text())
        traj = json.loads((folder / "traj_data.json").read_text())
        assert set(game) == {"pddl_domain", "grammar", "pddl_problem", "solvable", "walkthrough"}
        assert game["solvable"] is True and len(game["walkthrough"]) >= 3
        assert "UNKNOWN GOAL" not in game["grammar"] and "(:domain alfred)" in game["pddl_problem"]
        assert traj["task_type"] == task_type
        assert traj["pddl_params"]["object_target"] and traj["scene"]["floor_plan"].startswith("FloorPlan")
        if task_type == "look_at_obj_in_light":
            assert traj["pddl_params"]["toggle_target"] in ("DeskLamp", "FloorLamp")
        else:
            assert traj["pddl_params"]["parent_target"]
        # under cache_dir, keyed by (seed, task type); a second call reads the cache instead of generating again
        assert cache_dir("alfworld") in folder.parents
        stamp = (folder / "game.tw-pddl").stat().st_mtime_ns
        assert gen.generate_game(0, task_type) == folder
        assert (folder / "game.tw-pddl").stat().st_mtime_ns == stamp
    # the six task types come from rooms where ALFRED allows them
    scenes = {t: json.loads((f / "traj_data.json").read_text())["scene"]["scene_num"] for t, f in games.items()}
    assert scenes["pick_heat_then_place_in_recep"] <= 30 and scenes["pick_cool_then_place_in_recep"] <= 30
    assert 200 < scenes["look_at_obj_in_light"] < 400


def test_generation_is_deterministic_across_cache_folders(monkeypatch, tmp_path):
    contents = []
    for name in ("first", "second"):
        monkeypatch.setenv("TRL_AGENTS_CACHE", str(tmp_path / name))
        folder = gen.generate_game(7, "pick_and_place_simple", floor_plans="unseen")
        assert str(folder).startswith(str(tmp_path / name))
        contents.append(((folder / "game.tw-pddl").read_text(), (folder / "traj_data.json").read_text()))
    assert contents[0] == contents[1]
    other = gen.generate_game(8, "pick_and_place_simple", floor_plans="unseen")
    assert (other / "game.tw-pddl").read_text() != contents[0][0]


def test_every_task_type_has_rooms_in_both_floor_plan_sets():
    for floor_plans in gen.FLOOR_PLAN_SETS:
        scenes = [gen.load_scene(n) for n in gen.floor_plan_numbers(floor_plans)]
        for task_type in TASK_TYPES:
            assert any(gen.task_candidates(scene, task_type) for scene in scenes), (floor_plans, task_type)
    assert not set(gen.floor_plan_numbers("train")) & set(gen.floor_plan_numbers("unseen"))


def test_default_task_type_is_fixed_by_the_seed():
    chosen = {gen.default_task_type(seed) for seed in range(60)}
    assert chosen == set(TASK_TYPES)
    assert gen.default_task_type(5) == gen.default_task_type(5)


# ---- play -----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("task_type", TASK_TYPES)
def test_expert_plan_solves_every_task_type(env, games, task_type):
    observation = env.reset(task(task_type))
    assert observation.startswith("-= Welcome to TextWorld, ALFRED! =-")
    assert env.task_description().startswith("Your task is to: ") and env.task_description() in observation
    assert "Admissible actions: go to " in observation
    plan = env.optimal_plan()
    assert plan == json.loads((games[task_type] / "game.tw-pddl").read_text())["walkthrough"]
    assert env.solver_value() == len(plan)
    for i, action in enumerate(plan):
        assert action in env.admissible_actions()
        _, reward, done, info = env.step(action)
        assert info["valid"] and info["command"] == action and info["task_type"] == task_type
        assert done == (i == len(plan) - 1) and reward == (1.0 if done else 0.0)
    assert info["success"] is True and env.optimal_plan() == [] and env.solver_value() == 0
    with pytest.raises(RuntimeError):
        env.step(plan[-1])


@pytest.mark.parametrize("task_type", ["pick_heat_then_place_in_recep", "look_at_obj_in_light"])
def test_check_env_contract(games, task_type):
    report = check_env(ALFWorld, task(task_type))
    assert set(report) == {"step_outputs", "determinism", "bad_action", "info_keys", "snapshot_restore",
                           "expert_episode"}


def test_bad_action_is_invalid_and_changes_nothing(env):
    observation = env.reset(task("pick_and_place_simple"))
    key, admissible = env.state_key(), env.admissible_actions()
    for bad in ("fly to the moon", "go to countertop 99", "<think>hm</think>", ""):
        text, reward, done, info = env.step(bad)
        assert text.startswith("Nothing happens.") and "admissible action" in text
        assert info["valid"] is False and info["success"] is False and info["command"] is None
        assert reward == 0.0 and done is False
        assert env.state_key() == key and env.admissible_actions() == admissible
    assert "'fly to the moon' is not an admissible action" in env.step("fly to the moon")[0]
    # the state is intact: the expert plan from the start still wins
    plan = env.optimal_plan()
    assert play(env, plan)[-1][3]["success"] is True
    assert observation  # reset's observation was not empty


def test_actions_match_case_and_space_insensitively(env):
    env.reset(task("pick_and_place_simple"))
    first = env.optimal_plan()[0]  # e.g. "go to bed 1"
    messy = "  " + first.upper().replace(" ", "   ") + ". "
    _, _, _, info = env.step(f"<think>the object is there</think><action>{messy}</action>")
    assert info["valid"] is True and info["command"] == first
    assert env.state_key().startswith("You arrive at")


def test_state_key_is_the_current_observation(env):
    observation = env.reset(task("pick_cool_then_place_in_recep"))
    assert env.state_key() in observation and env.state_key().endswith(env.task_description())
    text, *_ = env.step(env.optimal_plan()[0])
    assert text.startswith(env.state_key()) and env.state_key().startswith("You arrive at")
    hidden = ALFWorld(show_admissible_actions=False)
    assert hidden.reset(task("pick_cool_then_place_in_recep")) == observation.split("\n\nAdmissible actions:")[0]
    assert "listed after each observation" in ALFWorld.instructions
    assert "listed after each observation" not in hidden.instructions
    hidden.close()


def test_snapshot_restore_replays_the_same_future(env):
    env.reset(task("pick_two_obj_and_place"))
    plan = env.optimal_plan()
    play(env, plan[:3] + ["nonsense"])
    snapshot, key = env.snapshot(), env.state_key()
    future = play(env, plan[3:])
    assert future[-1][2] is True
    env.restore(snapshot)
    assert env.state_key() == key and env.optimal_plan() == plan[3:]
    assert play(env, plan[3:]) == future
    # a snapshot survives a reset to another game
    env.reset(task("pick_and_place_simple"))
    env.restore(snapshot)
    assert env.state_key() == key


def test_expert_replans_after_a_detour(env):
    env.reset(task("pick_heat_then_place_in_recep"))
    plan = env.optimal_plan()
    detour = next(a for a in env.admissible_actions() if a.startswith("go to ") and a != plan[0])
    env.step(detour)
    # one step was spent: at least len(plan) - 1 remain, and going where the plan went first still works
    assert len(plan) - 1 <= env.solver_value() <= len(plan)
    values = [env.solver_value()]
    for action in env.optimal_plan():
        done = env.step(action)[2]
        values.append(env.solver_value())
    assert done and values == list(range(values[0], -1, -1))


def test_expert_matches_alfworld_planner(env):
    """Cross-check: the full-knowledge expert's plans are as short as ALFWorld's PLANNER expert's (fast-downward's
    uniform-cost search), on games where the planner is quick."""
    for task_type in ("pick_and_place_simple", "look_at_obj_in_light", "pick_heat_then_place_in_recep"):
        env.reset(task(task_type))
        expert = env.optimal_plan()
        planner = gen.planner_plan(env._game)
        assert len(planner) == len(expert), (task_type, planner, expert)
        env.step(expert[0])
        assert len(gen.planner_plan(env._game)) == len(env.optimal_plan()) == len(expert) - 1


# ---- verify() -------------------------------------------------------------------------------------------------------

EXPECTED_ATOMS = {
    "pick_and_place_simple": ["holding", "in"],
    "look_at_obj_in_light": ["holding", "toggled", "in_light"],
    "pick_clean_then_place_in_recep": ["holding", "cleaned", "in"],
    "pick_heat_then_place_in_recep": ["holding", "heated", "in"],
    "pick_cool_then_place_in_recep": ["holding", "cooled", "in"],
    "pick_two_obj_and_place": ["holding", "in", "holding", "in"],
}


@pytest.mark.parametrize("task_type", TASK_TYPES)
def test_verify_atoms_along_the_expert_plan(env, task_type):
    env.reset(task(task_type))
    plan = env.optimal_plan()
    before = env.verify()
    assert [a.name.split("(")[0] for a in before] == EXPECTED_ATOMS[task_type]
    assert all(a.status == "unsat" and a.witness_step is None for a in before)

    play(env, ["not a command"] + plan)  # an invalid first step shifts every witness by one
    atoms = {a.name: a for a in env.verify()}
    assert all(a.status == "sat" and a.witness_step is not None for a in atoms.values()), atoms
    for atom in atoms.values():
        assert 1 <= atom.witness_step <= len(plan)
        command = env._actions[atom.witness_step]
        assert command is not None  # the witness is a step whose command was applied
        for dependency in atom.depends_on:
            assert atoms[dependency].witness_step <= atom.witness_step
            if task_type != "look_at_obj_in_light":  # chains: each step makes one atom true
                assert atoms[dependency].witness_step < atom.witness_step
    last = list(atoms.values())[-1]
    assert last.witness_step == len(plan)  # the winning step (index len(plan) after the invalid one)
    holding = next(a for a in atoms.values() if a.name.startswith("holding"))
    assert env._actions[holding.witness_step].startswith("take ")

    env.reset(task(task_type))
    play(env, plan[:-1])
    truncated = env.verify()
    assert truncated[-1].status == "unsat" and truncated[-1].witness_step is None
    assert truncated[0].status == "sat"


def test_verify_chain_stops_before_the_state_change(env):
    env.reset(task("pick_heat_then_place_in_recep"))
    plan = env.optimal_plan()
    heat = next(i for i, a in enumerate(plan) if a.startswith("heat "))
    play(env, plan[:heat])
    holding, heated, placed = env.verify()
    assert holding.status == "sat" and holding.witness_step == heat - 2  # take, then go to the microwave
    assert heated.status == "unsat" and placed.status == "unsat"
    # placing the object without heating it does not satisfy the goal atom
    goal_spot = plan[-1].split(" to ", 1)[1]
    env.step(f"go to {goal_spot}")
    env.step(plan[-1])
    assert env.verify()[-1].status == "unsat"


# ---- privileged context ----------------------------------------------------------------------------------------------


def test_privileged_context_has_positions_and_plan(env):
    env.reset(task("pick_clean_then_place_in_recep"))
    text = env.privileged_context()
    plan = env.optimal_plan()
    take = next(a for a in plan if a.startswith("take "))  # "take fork 1 from countertop 1"
    obj, source = take[len("take ") :].split(" from ")
    assert f"{obj} is in/on {source}" in text
    assert "Use: sinkbasin 1" in text and "; ".join(plan) in text
    assert f"Expert plan from here ({len(plan)} actions)" in text


# ---- the official-data adapter --------------------------------------------------------------------------------------


def _official_tree(root: Path, games: dict) -> Path:
    """A folder laid out like `$ALFWORLD_DATA/json_2.1.1/...` holding copies of generated games."""
    train = root / "json_2.1.1" / "train"
    for task_type, folder in games.items():
        trial = train / f"{task_type}-x-None-y-1" / "trial_T0"
        shutil.copytree(folder, trial)
    # skipped like AlfredTWEnv does: sliced-object games, games marked unsolvable, games without a game file
    shutil.copytree(games["pick_and_place_simple"], train / "pick_and_place_simple-AppleSliced-None-z-1" / "trial_T1")
    unsolvable = train / "pick_and_place_simple-b-None-z-2" / "trial_T2"
    shutil.copytree(games["pick_and_place_simple"], unsolvable)
    data = json.loads((unsolvable / "game.tw-pddl").read_text())
    (unsolvable / "game.tw-pddl").write_text(json.dumps({**data, "solvable": False}))
    missing = train / "pick_and_place_simple-c-None-z-3" / "trial_T3"
    missing.mkdir(parents=True)
    shutil.copy(games["pick_and_place_simple"] / "traj_data.json", missing)
    (root / "json_2.1.1" / "valid_seen").mkdir()
    return root


def test_official_adapter_plays_games_from_a_data_folder(env, games, tmp_path):
    root = _official_tree(tmp_path / "alfworld_data", games)
    rows = ALFWorld.task_split("train", source="official", data_dir=root)
    assert len(rows) == len(TASK_TYPES)
    assert {row["task_type"] for row in rows} == set(TASK_TYPES)
    assert all(row["env"] == "alfworld" and Path(row["game_file"]).name == "game.tw-pddl" for row in rows)
    assert rows[0]["task_id"].startswith("alfworld-train-")
    assert ALFWorld.task_split("train", 2, source="official", data_dir=root) == rows[:2]
    assert ALFWorld.task_split("eval", source="official", data_dir=root) == []
    row = next(r for r in rows if r["task_type"] == "pick_cool_then_place_in_recep")
    observation = env.reset(row)
    assert observation == env.reset(task("pick_cool_then_place_in_recep"))  # the same game through both paths
    env.reset(row)
    *_, (_, reward, done, info) = play(env, env.optimal_plan())
    assert reward == 1.0 and done and info["success"]
    # $ALFWORLD_DATA is the default root
    os.environ["ALFWORLD_DATA"], saved = str(root), os.environ["ALFWORLD_DATA"]
    try:
        assert ALFWorld.task_split("train", source="official") == rows
    finally:
        os.environ["ALFWORLD_DATA"] = saved


def test_official_adapter_without_data_names_alfworld_download(tmp_path):
    with pytest.raises(FileNotFoundError, match="alfworld-download"):
        ALFWorld.task_split("unseen", source="official", data_dir=tmp_path)


def test_game_file_rows_need_traj_data(env, games, tmp_path):
    lonely = tmp_path / "game.tw-pddl"
    shutil.copy(games["pick_and_place_simple"] / "game.tw-pddl", lonely)
    with pytest.raises(ValueError, match="traj_data.json"):
        env.reset({"game_file": str(lonely)})
    with pytest.raises(ValueError, match="game_file"):
        env.reset({"game_file": str(tmp_path / "nothing.tw-pddl")})


def test_official_game_whose_object_is_missing(env, games, tmp_path):
    """A traj_data naming an object the room does not have: the game still plays; the expert and verify() say
    they cannot tell (no plan, unknown atoms) instead of failing."""
    folder = tmp_path / "odd"
    shutil.copytree(games["pick_heat_then_place_in_recep"], folder)
    traj = json.loads((folder / "traj_data.json").read_text())
    traj["pddl_params"]["object_target"] = "TeddyBear"
    (folder / "traj_data.json").write_text(json.dumps(traj))
    env.reset({"game_file": str(folder / "game.tw-pddl")})
    assert env.optimal_plan() is None and env.solver_value() == math.inf
    assert [(a.name, a.status) for a in env.verify()] == [
        ("holding(teddybear)", "unknown"),
        ("in(teddybear, sinkbasin)", "unknown"),
    ]
    assert "Every teddybear: none in this room." in env.privileged_context()
    traj["task_type"] = "pick_and_place_with_movable_recep"
    (folder / "traj_data.json").write_text(json.dumps(traj))
    with pytest.raises(ValueError, match="six task types"):
        env.reset({"game_file": str(folder / "game.tw-pddl")})


# ---- splits, arguments, side effects --------------------------------------------------------------------------------


def test_generated_splits():
    train, evaluation, unseen = (ALFWorld.task_split(s, 600) for s in ("train", "eval", "unseen"))
    assert train[0] == {
        "env": "alfworld",
        "task_id": "alfworld-train-0",
        "seed": 0,
        "task_type": "pick_and_place_simple",
    }
    seeds = [{row["seed"] for row in rows} for rows in (train, evaluation, unseen)]
    assert not (seeds[0] & seeds[1] or seeds[0] & seeds[2] or seeds[1] & seeds[2])
    assert all(sum(row["task_type"] == t for row in train) == 100 for t in TASK_TYPES)
    assert all(row["floor_plans"] == "unseen" for row in unseen) and "floor_plans" not in train[0]
    assert len(ALFWorld.task_split("eval")) == 140 and len(ALFWorld.task_split("unseen")) == 134
    assert ALFWorld.task_split("train", 1, num_distractor_types=3)[0]["num_distractor_types"] == 3
    with pytest.raises(ValueError, match="split"):
        ALFWorld.task_split("test")
    with pytest.raises(ValueError, match="count"):
        ALFWorld.task_split("train", -1)
    with pytest.raises(ValueError, match="source"):
        ALFWorld.task_split("train", 1, source="web")


def test_unseen_rows_use_held_out_rooms_and_distractors_change_the_room(env):
    row = ALFWorld.task_split("unseen", 1)[0]
    env.reset(row)
    traj = json.loads((Path(env._loaded[0]).parent / "traj_data.json").read_text())
    assert traj["scene"]["scene_num"] in gen.floor_plan_numbers("unseen")
    sparse = {**row, "num_distractor_types": 0}
    env.reset(sparse)
    traj = json.loads((Path(env._loaded[0]).parent / "traj_data.json").read_text())
    kinds = set(env._facts.object_type.values())
    assert kinds <= {traj["pddl_params"]["object_target"].lower(), "desklamp", "floorlamp"}
    assert "distractors0" in env._loaded[0]


@pytest.mark.parametrize(
    "row,field",
    [
        ({}, "seed"),
        ({"seed": -1}, "seed"),
        ({"seed": "zero"}, "seed"),
        ({"seed": 0, "task_type": "pick_three"}, "task_type"),
        ({"seed": 0, "floor_plans": "kitchens"}, "floor_plans"),
        ({"seed": 0, "num_distractor_types": 99}, "num_distractor_types"),
        ({"game_file": 5}, "game_file"),
    ],
)
def test_bad_task_rows(env, row, field):
    with pytest.raises(ValueError, match=field):
        env.reset(row)


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"show_admissible_actions": "yes"}, "show_admissible_actions"),
        ({"num_distractor_types": -1}, "num_distractor_types"),
        ({"max_solver_expansions": 0}, "max_solver_expansions"),
    ],
)
def test_bad_arguments(kwargs, field):
    with pytest.raises(ValueError, match=field):
        ALFWorld(**kwargs)


def test_nothing_written_outside_the_cache(env):
    home = Path(os.path.expanduser("~"))
    assert not (home / ".cache" / "alfworld").exists()  # alfworld's own default, created on import if unset
    data = Path(os.environ["ALFWORLD_DATA"])
    if home in data.parents:  # set by us (not by the user): inside our cache
        assert data == cache_dir("alfworld", "alfworld_data")
    # fast-downward's translator overwrites sys.argv; the env puts it back
    assert sys.argv[:1] != ["translate.py"]


def test_capabilities_and_registration():
    from trl_agents.envs import make_env

    assert {"snapshot", "restore", "state_key", "optimal_plan", "solver_value", "verify", "privileged_context"} <= (
        ALFWorld.capabilities()
    )
    assert ALFWorld.missing_requirements() == []
    instance = make_env("alfworld", num_distractor_types=2)
    assert isinstance(instance, ALFWorld) and instance.num_distractor_types == 2
    assert "<action>go to countertop 1</action>" in ALFWorld.instructions


@pytest.mark.slow
def test_one_training_iteration(train_one_iteration, games):
    trainer = train_one_iteration("alfworld", [task("pick_and_place_simple")], max_turns=2)
    assert trainer.state.global_step == 1
