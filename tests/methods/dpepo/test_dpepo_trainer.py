"""DPEPO: the `parallel` environment (parser, rewards, OR success, histories, snapshots), its parallel-format solver
demonstrations (warm start), the trainer's rules and logs, and 2-step end-to-end training on the tiny model.

The weight and advantage arithmetic is in tests/methods/dpepo/test_dpepo_credit.py.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys

import pytest
import torch
import yaml

from trl_agents.envs import get_env_class, make_env
from trl_agents.envs.parallel import ParallelEnv, parse_parallel_actions, render_parallel_answer
from trl_agents.records import load_trajectories
from trl_agents.testing import tiny_training_config
from trl_agents.trainers import METHODS
from trl_agents.trainers.dpepo import DPEPOConfig, DPEPOTrainer
from trl_agents.warmstart import solver_demonstrations

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
MOVES = ["up", "down", "left", "right"]
LAYOUT = "SG\nFF"  # one move right solves it; down then down stays in the bottom row


# ---------------------------------------------------------------- the parser


def test_parser_on_well_formed_partial_and_garbage_answers():
    well_formed = ("<think>copy 1 goes right, copy 2 explores</think>\n<parallel>\n<env_1> go to desk 1 </env_1>\n"
                   "<env_2>open drawer 2</env_2>\n</parallel>")
    assert parse_parallel_actions(well_formed) == [(1, "go to desk 1"), (2, "open drawer 2")]
    # Partial: the second block is cut off (max length reached): only the complete one counts.
    assert parse_parallel_actions("<parallel><env_1>go to desk 1</env_1><env_2>open dra") == [(1, "go to desk 1")]
    # No <parallel> block needed (neither does the released parser); tags inside a closed <think> do not count.
    assert parse_parallel_actions("<think>or <env_1>look</env_1>?</think><env_3>look</env_3>") == [(3, "look")]
    # Garbage: no action at all.
    for garbage in ("", "right", "<env_1>right", "</env_1>right<env_1>", "<env_x>up</env_x>", None, 42):
        assert parse_parallel_actions(garbage) == [], garbage
    # A repeated number: the first block wins ("tag"); "order" numbers blocks as written, as released.
    assert parse_parallel_actions("<env_2>a</env_2><env_2>b</env_2>") == [(2, "a")]
    assert parse_parallel_actions("<env_2>a</env_2><env_2>b</env_2>", number_by="order") == [(1, "a"), (2, "b")]
    assert parse_parallel_actions("<ENV_1>Up</ENV_1>") == [(1, "Up")]
    with pytest.raises(ValueError, match="number_by"):
        parse_parallel_actions("<env_1>a</env_1>", number_by="name")


# ---------------------------------------------------------------- the environment


def test_reward_is_the_best_copy_and_any_success_ends_the_episode():
    env = ParallelEnv(inner="frozenlake", num_envs=4)
    first = env.reset({"layout": LAYOUT})
    assert first.startswith("Observation (the same in all 4 environments):") and first.endswith(
        "You may act in up to 4 environments this turn, numbered 1 to 4.")
    observation, reward, done, info = env.step(render_parallel_answer([(1, "down"), (3, "left"), (9, "up")]))
    assert (reward, done, info["success"], info["valid"]) == (0.0, False, False, True)
    assert info["env_actions"] == [[1, "down"], [3, "left"], [9, "up"]] and info["applied"] == [1, 3]
    assert info["num_envs"] == 4 and info["invalid_count"] == 0
    assert "Environment 9 does not exist: use environments 1 to 4." in observation
    assert "In environment 1:\nAction: down\nObservation: S G\nP F" in observation
    # Copy 2 (never acted in) solves it in one move: reward = max(0, 1) = 1, and the whole episode ends.
    _, reward, done, info = env.step(render_parallel_answer([(1, "down"), (2, "right")]))
    assert (reward, done, info["success"]) == (1.0, True, True)
    assert info["env_rewards"] == [[1, 0.0], [2, 1.0]]


def test_histories_prompts_and_ended_copies():
    env = ParallelEnv(inner="frozenlake", num_envs=2, max_history=1)
    env.reset({"layout": "SFF\nHFF\nFFG"})
    env.step("<env_1>down</env_1><env_2>right</env_2>")  # copy 1 falls into the hole: ended, not solved
    observation, reward, done, info = env.step("<env_1>up</env_1><env_2>right</env_2>")
    assert not done and info["applied"] == [2]  # the ended copy is not stepped
    assert "Environment 1 has ended: act in another one." in observation
    assert "Ended without success: environment 1." in observation
    # Turn 0 is history now: "Action 1 / Observation 1" per copy; turn 1's action is the last turn.
    assert "In environment 2:\nAction 1: right\nObservation 1: S P F" in observation
    assert "Your last turn:\nIn environment 2:\nAction: right\nObservation: S F P" in observation
    observation, _, done, info = env.step("<think>hm</think>")  # nothing parsable
    assert info["env_actions"] == [] and not info["valid"] and "acted in no environment" in observation
    assert "Action 1: right" not in observation and "Action 2: right" in observation  # max_history = 1
    _, _, done, info = env.step("<env_2>down</env_2>")
    _, reward, done, info = env.step("<env_2>down</env_2>")
    assert (reward, done, info["success"]) == (1.0, True, True)
    # Every copy ended without success: the episode ends, failed.
    env.reset({"layout": "SH\nHG"})
    _, reward, done, info = env.step("<env_1>right</env_1><env_2>down</env_2>")
    assert (reward, done, info["success"]) == (0.0, True, False)


def test_invalid_sub_actions_are_counted():
    env = ParallelEnv(inner="frozenlake", num_envs=3)
    env.reset({"layout": LAYOUT})
    _, _, _, info = env.step("<env_1>jump</env_1><env_2>down</env_2><env_3>fly</env_3>")
    assert info["invalid_count"] == 2 and info["env_valid"] == [[1, False], [2, True], [3, False]] and info["valid"]


def test_snapshots_restore_every_copy_and_the_history():
    env = ParallelEnv(inner="frozenlake", num_envs=2)
    env.reset({"layout": "SFF\nFFF\nFFG"})
    env.step("<env_1>down</env_1>")
    snapshot, key = env.snapshot(), env.state_key()
    after = env.step("<env_1>right</env_1><env_2>down</env_2>")
    env.step("<env_2>right</env_2>")
    env.restore(snapshot)
    assert env.state_key() == key == ((1, 0), (0, 0))
    assert env.step("<env_1>right</env_1><env_2>down</env_2>") == after
    # Copy 1 at (1, 1) is 2 moves from the goal, copy 2 at (1, 0) 3: the parallel episode needs min = 2.
    assert env.supports("snapshot") and not env.supports("verify") and env.solver_value() == 2
    assert "optimal_plan" in ParallelEnv.capabilities()


def test_construction_errors_and_task_split():
    with pytest.raises(ValueError, match="cannot wrap itself"):
        ParallelEnv(inner="parallel")
    with pytest.raises(ValueError, match="num_envs"):
        ParallelEnv(num_envs=0)
    with pytest.raises(ValueError, match="explore_actions"):
        ParallelEnv(explore_actions="up")
    with pytest.raises(ValueError, match="Bad arguments"):
        make_env("parallel", inner="frozenlake", size_of_lake=3)  # an inner argument the inner env does not take
    rows = get_env_class("parallel").task_split("train", 3, inner="frozenlake", num_envs=2)
    assert [r["env"] for r in rows] == ["parallel"] * 3 and all("seed" in r for r in rows)
    assert "You act in 4 parallel copies" in make_env("parallel").instructions


# ---------------------------------------------------------------- demonstrations (the warm start)


def test_parallel_demonstrations_solve_every_task_and_explore_in_the_other_copies():
    kwargs = {"inner": "frozenlake", "num_envs": 2, "explore_actions": MOVES}
    tasks = get_env_class("parallel").task_split("train", 12, **kwargs)
    env = make_env("parallel", **kwargs)
    for task in tasks:
        env.reset(task)
        plan = env.optimal_plan()
        assert env.state_key() == ((0, 0), (0, 0))  # planning moved nothing
        for answer in plan:
            actions = parse_parallel_actions(answer)
            assert len({a for _, a in actions}) == len(actions)  # the copies never repeat each other
            _, _, done, info = env.step(answer)
        assert done and info["success"], task
    rows = solver_demonstrations("parallel", tasks[:2], env_kwargs=kwargs, history_length=0)
    first = rows[0]
    assert first["prompt"][0]["content"].endswith("solved in any one copy.")  # the format in the system message
    assert first["prompt"][1]["content"].startswith("Observation (the same in all 2 environments):")
    assert len(parse_parallel_actions(first["completion"][0]["content"])) == 2  # both copies act
    # Without other actions to try (no admissible list, no explore_actions) only the solver's copy acts.
    alone = make_env("parallel", inner="frozenlake", num_envs=2)
    alone.reset(tasks[0])
    assert all(len(parse_parallel_actions(a)) == 1 for a in alone.optimal_plan())


# ---------------------------------------------------------------- the trainer


def dpepo_config(tmp_path, **overrides):
    values = {"env_name": "parallel", "env_kwargs": {"inner": "frozenlake", "num_envs": 2}, "max_turns": 3,
              "num_generations": 2, "per_device_train_batch_size": 4, **overrides}
    return tiny_training_config(DPEPOConfig, tmp_path / "dpepo", **values)


def test_config_rules_and_registry(tmp_path):
    config = dpepo_config(tmp_path)
    assert (config.dpepo_depth_alpha, config.dpepo_depth_gamma, config.dpepo_width_beta, config.dpepo_width_omega,
            config.dpepo_invalid_psi, config.dpepo_no_action_weight) == (0.8, 0.95, 0.95, 0.8, 0.95, 0.5)
    assert (config.history_length, config.invalid_action_penalty, config.topology) == (0, 0.0, "independent")
    with pytest.raises(ValueError, match="history_length must be 0"):
        dpepo_config(tmp_path, history_length=2)
    with pytest.raises(ValueError, match="env_name='parallel'"):
        dpepo_config(tmp_path, env_name="frozenlake")
    with pytest.raises(ValueError, match="dpepo_width_omega must be in"):
        dpepo_config(tmp_path, dpepo_width_omega=1.5)
    with pytest.raises(ValueError, match="dpepo_weight_formula must be one of"):
        dpepo_config(tmp_path, dpepo_weight_formula="webshop")
    with pytest.raises(ValueError, match="topology must be 'independent'"):
        dpepo_config(tmp_path, topology="adaptive", topology_kwargs={"max_group_size": 4})
    assert METHODS["dpepo"].trainer_class is DPEPOTrainer and METHODS["dpepo"].topology == "independent"


def test_methods_command_lists_dpepo():
    out = subprocess.run([sys.executable, "-m", "trl_agents.cli", "methods"], capture_output=True, text=True,
                         check=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}).stdout
    blocks = {block.split()[0]: block for block in re.split(r"\n(?=\S)", out.strip())}
    block = blocks["dpepo"]
    assert "DPEPOTrainer" in block and "arXiv 2604.24320" in block and "docs/methods/dpepo.md" in block
    assert "topology: independent" in block and "parallel environment" in block


def mixed_policy(prompt_ids, call, row, size):
    """Per task: episode 0 moves right in both copies (solved at turn 0); episode 1 moves down in copy 1, then says
    nothing, then moves down in copy 1 again (3 turns, not solved). Every rollout has 3 generation calls."""
    turn = call % 3
    if turn == 0:
        return ("<parallel><env_1>right</env_1><env_2>right</env_2></parallel>" if row % 2 == 0 else
                "<parallel><env_1>down</env_1></parallel>")
    return "<think>hmm</think>" if turn == 1 else "<parallel><env_1>down</env_1></parallel>"


TASKS = [{"env": "parallel", "layout": LAYOUT, "task_id": f"t{i}"} for i in range(2)]


def test_advantages_of_a_scripted_rollout_follow_the_hand_numbers(tiny_model, tokenizer, scripted, tmp_path):
    # Episode 0: C_width = 1 (both copies move right), empty histories: W = (0.8¹ + 1)/2 = 0.9.
    # Episode 1: turn 0 W = 1 (one action, no history); turn 1 nothing parsable: W = 0.5; turn 2 copy 1's history
    # is [down]: C_depth = 1, no earlier transition: W_env = (0.8 + 1 + 1)/3 = 0.933333, W = (1 + 0.933333)/2 = 0.9667.
    # Step-row scores [1, 0, 0, 0]: μ = 0.25, Bessel σ = sqrt((0.75² + 3·0.25²)/3) = 0.5: z = +1.5 / −0.5.
    trainer = DPEPOTrainer(model=tiny_model, args=dpepo_config(tmp_path, max_steps=1), processing_class=tokenizer,
                           train_dataset=TASKS, generator=scripted(mixed_policy))
    trainer.train()
    rows = load_trajectories(str(tmp_path / "dpepo"))
    for group_index in (0, 1):
        episodes = {}
        for r in rows:
            if r["group_index"] == group_index:
                episodes.setdefault(r["episode_id"], []).append(r["advantage"])
        sigma = 0.5 + 1e-6
        solved = next(v for v in episodes.values() if len(v) == 1)
        failed = next(v for v in episodes.values() if len(v) == 3)
        assert solved == pytest.approx([0.75 / sigma * 0.9])  # 1.35: shrunk by W
        assert failed == pytest.approx([-0.25 / sigma * (2 - w) for w in (1.0, 0.5, 0.9667)])  # −0.5, −0.75, −0.517
    log = next(h for h in trainer.state.log_history if "dpepo/mean_weight" in h)
    assert log["dpepo/mean_weight"] == pytest.approx((0.9 + 1.0 + 0.5 + 0.9667) / 4)
    assert log["dpepo/no_action_fraction"] == pytest.approx(0.25)
    assert log["dpepo/mean_envs_per_step"] == pytest.approx((2 + 1 + 0 + 1) / 4)
    assert log["dpepo/amplified_fraction"] == pytest.approx(0.5)  # the failure's W < 1 turns: 0.5 and 0.9667
    # Without the weight (dpepo_diversity_weight=False) the same rollout trains with the plain z: 1.5 and −0.5.
    plain = DPEPOTrainer(model=tiny_model, args=dpepo_config(tmp_path / "plain", max_steps=1,
                                                             dpepo_diversity_weight=False),
                         processing_class=tokenizer, train_dataset=TASKS, generator=scripted(mixed_policy))
    plain.train()
    values = sorted(r["advantage"] for r in load_trajectories(str(tmp_path / "plain" / "dpepo")))
    assert values == pytest.approx([-0.5 / (1 + 2e-6)] * 6 + [1.5 / (1 + 2e-6)] * 2)


@pytest.mark.slow
def test_dpepo_trains_two_steps(tiny_model, tokenizer, scripted, tmp_path):
    # Two optimizer steps of the tiny model on the mixed rollouts above (the untrained tiny model's own samples never
    # parse, so its groups would all tie); the sampled-generation path runs in test_tiny_config_runs.
    trainer = DPEPOTrainer(model=tiny_model, args=dpepo_config(tmp_path), train_dataset=TASKS,
                           processing_class=tokenizer, generator=scripted(mixed_policy))
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    assert trainer.state.global_step == 2
    assert any(not torch.equal(p.detach(), before[n]) for n, p in trainer.model.named_parameters())
    logs = [h for h in trainer.state.log_history if "dpepo/mean_weight" in h]
    assert len(logs) == 2 and all(math.isfinite(h["loss"]) and h["env/success_rate"] == 0.5 for h in logs)


@pytest.mark.slow
def test_tiny_config_runs(tmp_path):
    # The tiny CPU config through the CLI: the tiny model, a warm start on parallel demonstrations, 2 DPEPO steps.
    from trl_agents.cli import main

    path = os.path.join(ROOT, "configs", "dpepo_frozenlake_tiny.yaml")
    main(["train", "--config", path, "--output_dir", str(tmp_path), "--max_steps", "2", "--disable_tqdm", "true"])
    assert os.path.exists(tmp_path / "eval_results.json")
    rows = load_trajectories(str(tmp_path))
    assert len(rows) > 0 and all(r["env"] == "parallel" for r in rows)


# ---------------------------------------------------------------- configs


@pytest.mark.parametrize("name", ["dpepo_alfworld.yaml", "dpepo_scienceworld.yaml", "dpepo_frozenlake_tiny.yaml"])
def test_configs_load(name):
    from trl import ModelConfig, TrlParser

    from trl_agents.run import RunArguments

    path = os.path.join(ROOT, "configs", name)
    with open(path) as handle:
        assert yaml.safe_load(handle)["method"] == "dpepo"
    _, config, _ = TrlParser((RunArguments, DPEPOConfig, ModelConfig)).parse_args_and_config(["--config", path])
    assert config.env_name == "parallel" and config.env_kwargs["num_envs"] in (2, 4)
    if "scienceworld" in name:
        assert config.dpepo_weight_formula == "scienceworld_released" and config.env_kwargs["inner"] == "scienceworld"
