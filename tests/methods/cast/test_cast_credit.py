"""CAST (solver-teacher credit) against hand-computed numbers, its boundary rules on the real games, and end to end.

The expected values are written out with their arithmetic in comments (the formulas of docs/methods/cast.md#equations); they
are not recomputed with the code under test.
"""

from __future__ import annotations

import doctest
import json
import math
import os
import random

import pytest
import torch
import yaml
from datasets import Dataset

from trl_agents.credit import cast as credit_cast
from trl_agents.credit import stat_means
from trl_agents.credit.cast import (
    CASTParams,
    cast_advantages,
    outcome_advantages,
    shaping_moments,
    solver_advantages,
)
from trl_agents.envs import AgentEnv, get_env_class, make_env, register_env
from trl_agents.rollout import PromptRenderer, RolloutEngine, SamplingParams
from trl_agents.testing import tiny_training_config
from trl_agents.trainers import METHODS
from trl_agents.trainers import cast as trainer_cast
from trl_agents.trainers.cast import CASTConfig, CASTTrainer
from trl_agents.trajectory import Group, Step, Trajectory


def cast_with_stats(groups, **params):
    """CAST on a batch of groups with `CASTParams(**params)`: (advantages, the value of each stat)."""
    advantages, stats = cast_advantages(groups, CASTParams(**params))
    return advantages, stat_means(stats)


def cast(groups, **params):
    """CAST's advantages of a batch of groups (see `cast_with_stats`)."""
    return cast_with_stats(groups, **params)[0]


INF = math.inf
TOL = 1e-6
CONFIGS = os.path.join(os.path.dirname(__file__), "..", "..", "..", "configs")


def turn(before: float, after: float, reward: float = 0.0, valid: bool = True, **info) -> Step:
    return Step("s", "a", reward=reward, valid=valid, info=info, signals={"solver_value": (before, after)})


def episode(*steps: Step, success: bool = False) -> Trajectory:
    return Trajectory(task={"task_id": "t"}, steps=list(steps), success=success)


def group_of(*trajectories: Trajectory, task_id: str = "t") -> Group:
    return Group(task={"task_id": task_id}, trajectories=list(trajectories))


def assert_close(actual, expected, tol=TOL):
    assert [[len(row) for row in g] for g in actual] == [[len(row) for row in g] for g in expected], actual
    for group_a, group_e in zip(actual, expected, strict=True):
        for row_a, row_e in zip(group_a, group_e, strict=True):
            for a, e in zip(row_a, row_e, strict=True):
                assert a == pytest.approx(e, abs=tol), (actual, expected)


def all_finite(advantages) -> bool:
    return all(math.isfinite(a) for group in advantages for row in group for a in row)


# ---------------------------------------------------------------- the hand-computed batch (two groups, shortest_path)
# Group 1 (puzzle with N(s_0) = 3):
#   A: 3 -> 2 -> 1 -> 0, solved (R = 1)            Ã = [1, 1, 1]
#   B: invalid action (3 -> 3), then a fatal move (3 -> INF), R = 0      Ã = [0, -3]
# Group 2 (puzzle with N(s_0) = 2), both fail (zero reward variance):
#   C: 2 -> 1 -> 2                                  Ã = [1, -1]
#   D: fatal 2 -> INF, then dead INF -> INF         Ã = [-2, 0]
# g = asinh: asinh(1) = 0.8813736, asinh(3) = 1.8184465, asinh(2) = 1.4436355.
# RMS over the 9 turns of the batch (zeros included):
#   Σ g² = 5 x 0.7768194 + 3.3067475 + 2.0840834 = 9.2749279;  / 9 = 1.0305475;  RMS = 1.0151589
#   h(±1) = ±0.8682125, h(-3) = -1.7912925, h(-2) = -1.4220784
# Outcome: group 1 R = [1, 0], mean 0.5, Bessel std sqrt(0.5) = 0.7071068 -> A = ±0.7071068; group 2: std 0 -> 0.
# α = 0.1:
#   A: 0.7071068 + 0.0868212 = 0.7939280 (each step)
#   B: -0.7071068 + 0 = -0.7071068;  -0.7071068 - 0.1791292 = -0.8862360
#   C: +0.0868212, -0.0868212          D: -0.1422078, 0
def hand_batch() -> list[Group]:
    return [
        group_of(
            episode(turn(3, 2), turn(2, 1), turn(1, 0, reward=1.0), success=True),
            episode(turn(3, 3, valid=False), turn(3, INF)),
            task_id="g1",
        ),
        group_of(episode(turn(2, 1), turn(1, 2)), episode(turn(2, INF), turn(INF, INF)), task_id="g2"),
    ]


HAND = [
    [[0.7939280, 0.7939280, 0.7939280], [-0.7071068, -0.8862360]],
    [[0.0868212, -0.0868212], [-0.1422078, 0.0]],
]


def test_hand_computed_batch():
    advantages, stats = cast_with_stats(hand_batch(), cast_alpha=0.1)
    assert_close(advantages, HAND)
    assert stats["rms"] == pytest.approx(1.0151589, abs=TOL)
    # Ã = [1,1,1 | 0,-3 | 1,-1 | -2,0]: sum -2, mean -2/9; 7 of 9 nonzero. Valid turns: 8; dead: D1; fatal: B1, D0.
    assert stats["solver_advantage_mean"] == pytest.approx(-2 / 9)
    assert stats["nonzero_solver_fraction"] == pytest.approx(7 / 9)
    assert stats["dead_step_fraction"] == pytest.approx(1 / 8)
    assert stats["fatal_step_fraction"] == pytest.approx(2 / 8)
    assert stats["zero_variance_group_fraction"] == 0.5


def test_hand_computed_solver_advantages_and_outcome():
    g1, g2 = hand_batch()
    assert solver_advantages(g1) == [[1.0, 1.0, 1.0], [0.0, -3.0]]
    assert solver_advantages(g2) == [[1.0, -1.0], [-2.0, 0.0]]
    assert outcome_advantages(g1) == pytest.approx([0.7071068, -0.7071068], abs=TOL)
    assert outcome_advantages(g2) == [0.0, 0.0]
    # Σ g² and the number of turns, the inputs of RMS (summed over processes by the trainer).
    assert shaping_moments([solver_advantages(g1), solver_advantages(g2)]) == pytest.approx((9.2749279, 9.0))


def test_ablations_identity_and_no_norm():
    # identity + none: A = A_i + 0.1·Ã:  A: 0.7071068 + 0.1;  B: -0.7071068, -0.7071068 - 0.3;  C: ±0.1;  D: -0.2, 0
    advantages = cast(hand_batch(), cast_transform="identity", cast_norm="none")
    assert_close(advantages, [[[0.8071068] * 3, [-0.7071068, -1.0071068]], [[0.1, -0.1], [-0.2, 0.0]]])
    # signed_log + none: g(1) = log 2 = 0.6931472, g(-3) = -log 4 = -1.3862944, g(-2) = -log 3 = -1.0986123
    advantages = cast(hand_batch(), cast_transform="signed_log", cast_norm="none")
    expected = [
        [[0.7071068 + 0.0693147] * 3, [-0.7071068, -0.7071068 - 0.1386294]],
        [[0.0693147, -0.0693147], [-0.1098612, 0.0]],
    ]
    assert_close(advantages, expected)
    # identity + rms: RMS = sqrt((5 x 1 + 9 + 4) / 9) = sqrt(2) -> h(1) = 0.7071068; A: 0.7071068 + 0.0707107
    advantages = cast(hand_batch(), cast_transform="identity")
    assert advantages[0][0][0] == pytest.approx(0.7778175, abs=TOL)


def test_alpha_scales_only_the_solver_term():
    # α = 0: pure GRPO outcome advantage (no ε): ±0.7071068 for group 1, 0 for group 2.
    assert_close(cast(hand_batch(), cast_alpha=0.0), [[[0.7071068] * 3, [-0.7071068] * 2], [[0.0] * 2] * 2])
    # α = 0.3: C0 = 0.3 x 0.8682125 = 0.2604637
    assert cast(hand_batch(), cast_alpha=0.3)[1][0][0] == pytest.approx(0.2604637, abs=TOL)


def test_rms_is_a_statistic_of_the_whole_batch():
    # Group 1 alone: Σ g² = 3 x 0.7768194 + 3.3067475 = 5.6372057 over 5 turns, RMS = sqrt(1.1274411) = 1.0618103;
    # A0 = 0.7071068 + 0.1 x 0.8813736 / 1.0618103 = 0.7071068 + 0.0830066 = 0.7901134 (0.7939280 within the batch).
    alone = cast(hand_batch()[:1])
    assert alone[0][0][0] == pytest.approx(0.7901134, abs=TOL)
    # A reducer that reports other moments (as an all-reduce over processes would) sets the scale:
    # moments (4, 4) -> RMS 1 -> A0 = 0.7071068 + 0.0881374
    reduced = cast(hand_batch()[:1], sum_over_processes=lambda local: [4.0, 4.0])
    assert reduced[0][0][0] == pytest.approx(0.7952442, abs=TOL)


def test_invalid_penalty_is_subtracted_after_the_rest():
    # λ = 0.5 on B0 (invalid): -0.7071068 - 0.5 = -1.2071068; nothing else changes.
    advantages = cast(hand_batch(), invalid_action_penalty=0.5)
    expected = [[row[:] for row in g] for g in HAND]
    expected[0][1][0] = -1.2071068
    assert_close(advantages, expected)


def test_near_zero_std_gives_zero_outcome_advantage():
    # Returns 1 and 1 + 1e-9: std 7.1e-10 < 1e-6 -> A_i = 0 (CAST), not ±0.7071 as an unthresholded z-score.
    group = group_of(episode(turn(1, 1, reward=1.0)), episode(turn(1, 1, reward=1.0 + 1e-9)))
    assert outcome_advantages(group) == [0.0, 0.0]


# ---------------------------------------------------------------- Minesweeper rules (K = the solver's reveals)


@pytest.mark.parametrize(
    ("before", "after", "info", "expected"),
    [
        (3, 2, {}, 1.0),  # ordinary reveal: K_before - K_after
        (3, 4, {}, -1.0),  # flag on a safe cell: +1 unflag cost
        (5, 2, {}, 3.0),  # a flood-filling reveal
        (3, INF, {}, -3.0),  # into an unsolvable state: -K_before
        (INF, INF, {}, 0.0),  # already unsolvable: 0
        (INF, 4, {}, 4.0),  # "rescue": +K_after (the shortest_path rule gives 0 here)
        (2, 0, {"success": True}, 2.0),  # win: K_before
        (2, 7, {"success": True}, 2.0),  # win: K(s_t+1) := 0 whatever was recorded
        (INF, 0, {"success": True, "safe_cells": 29}, 29.0),  # "rescue win": the board's safe cells
        (4, INF, {"mine_hit": True}, -4.0),  # mine hit: -K_before
        (INF, INF, {"mine_hit": True}, 0.0),  # mine hit from an unsolvable state: 0
        (4, 1, {"mine_hit": True}, -4.0),  # mine hit: K(s_t+1) := INF whatever was recorded
    ],
)
def test_minesweeper_rules(before, after, info, expected):
    group = group_of(episode(turn(before, after, **info)))
    assert solver_advantages(group, "minesweeper") == [[expected]]


def test_shortest_path_rules_differ_from_minesweeper_only_at_rescues():
    group = group_of(episode(turn(INF, 4), turn(4, 3), turn(3, INF), turn(INF, INF)))
    assert solver_advantages(group, "shortest_path") == [[0.0, 1.0, -3.0, 0.0]]
    assert solver_advantages(group, "minesweeper") == [[4.0, 1.0, -3.0, 0.0]]


def test_invalid_actions_get_zero_solver_advantage_under_both_rules():
    group = group_of(episode(turn(3, 5, valid=False), turn(INF, 2, valid=False, success=True)))
    assert solver_advantages(group, "shortest_path") == [[0.0, 0.0]]
    assert solver_advantages(group, "minesweeper") == [[0.0, 0.0]]


def test_rescue_win_needs_the_safe_cells_the_environment_reports():
    # The env contract (AgentEnv.solver_semantics = "minesweeper"): every step reports the board's safe cells;
    # credit never decodes an environment's state keys.
    step = turn(INF, 0, success=True, opened=2)
    step.state_key = (0b1011, 0)
    with pytest.raises(ValueError, match="safe_cells"):
        solver_advantages(group_of(episode(step)), "minesweeper")
    env = make_env("minesweeper", rows=3, cols=4, num_mines=2)
    env.reset({"rows": 3, "cols": 4, "mines": [[0, 3], [2, 3]], "first_click": [1, 0]})
    assert env.step("flag 0 3")[3]["safe_cells"] == 10  # 3 x 4 cells - 2 mines
    assert type(env).solver_semantics == "minesweeper" and get_env_class("sokoban").solver_semantics == "shortest_path"


def _engine(tokenizer, scripted, policy, max_turns):
    return RolloutEngine(
        scripted(policy),
        PromptRenderer(tokenizer, history_length=0),
        max_turns=max_turns,
        sampling=SamplingParams(max_new_tokens=8),
        signals=("solver_value",),
    )


def test_minesweeper_rules_on_the_real_game(tokenizer, scripted):
    # The board of the Minesweeper docstring: mines at (0,3) and (2,3), (1,3) is the last safe cell, K = 1.
    #   episode 0: reveal 0 3 -> mine hit: -K = -1
    #   episode 1: reveal 1 3 -> win: +K = +1
    #   episode 2: flag 1 3 (a safe cell: K 1 -> 2, Ã = -1); reveal 1 3 (flagged: invalid, 0);
    #              flag 1 3 (unflag: K 2 -> 1, +1); reveal 1 3 (win, +1)
    task = {"env": "minesweeper", "rows": 3, "cols": 4, "mines": [[0, 3], [2, 3]], "first_click": [1, 0]}
    first = ["reveal 0 3", "reveal 1 3", "flag 1 3"]
    later = ["reveal 1 3", "flag 1 3", "reveal 1 3"]

    def policy(prompt_ids, call, row, batch_size):
        return first[row] if call == 0 else later[call - 1]

    batch = _engine(tokenizer, scripted, policy, max_turns=6).run([task], num_generations=3)
    group = batch.groups[0]
    assert [t.success for t in group.trajectories] == [False, True, True]
    assert solver_advantages(group, "minesweeper") == [[-1.0], [1.0], [-1.0, 0.0, 1.0, 1.0]]
    # The recorded values: inf after the mine hit, 0 after a win.
    assert group.trajectories[0].steps[0].signals["solver_value"].after == INF
    assert group.trajectories[1].steps[0].signals["solver_value"].after == 0.0


def test_sokoban_solver_advantages_follow_the_recorded_values(tokenizer, scripted):
    # "# P _ X O #": pushing right twice solves it (N: 2 -> 1 -> 0). "left" walks into the wall (valid, N unchanged).
    task = {"env": "sokoban", "layout": "# # # # # #\n# P _ X O #\n# # # # # #"}
    plans = [["right", "right"], ["left", "right", "right"], ["jump", "right", "right"]]

    def policy(prompt_ids, call, row, batch_size):
        plan = plans[row] if batch_size == 3 else plans[1 + row] if batch_size == 2 else plans[-1]
        return plan[call] if call < len(plan) else "up"

    batch = _engine(tokenizer, scripted, policy, max_turns=3).run([task], num_generations=3)
    group = batch.groups[0]
    values = [[tuple(s.signals["solver_value"]) for s in t.steps] for t in group.trajectories]
    # N(s_0) = 2: one step right, then the push. The wall bump is valid but leaves N; "jump" is invalid.
    assert values == [[(2, 1), (1, 0)], [(2, 2), (2, 1), (1, 0)], [(2, 2), (2, 1), (1, 0)]]
    assert [[s.valid for s in t.steps] for t in group.trajectories] == [[True] * 2, [True] * 3, [False, True, True]]
    assert solver_advantages(group) == [[1.0, 1.0], [0.0, 1.0, 1.0], [0.0, 1.0, 1.0]]
    assert all(t.success for t in group.trajectories)


# ---------------------------------------------------------------- properties


def test_zero_variance_groups_still_get_the_solver_term():
    # All episodes fail (R = 0): the outcome advantage is 0, yet the good move (+1) and the bad move (-1) differ.
    batch = [group_of(episode(turn(2, 1)), episode(turn(2, 3)))]
    advantages = cast(batch)
    # RMS = asinh(1) -> h = ±1 -> A = ±0.1
    assert_close(advantages, [[[0.1], [-0.1]]])


def test_dead_state_steps_get_no_shaping():
    # Steps from an unsolvable state (INF -> INF, or INF -> finite under shortest_path) keep A = A_i exactly.
    batch = [group_of(episode(turn(1, 0, reward=1.0)), episode(turn(1, INF), turn(INF, INF), turn(INF, 3)))]
    advantages = cast(batch)
    a_i = outcome_advantages(batch[0])[1]
    assert advantages[0][1][1:] == [a_i, a_i]


@pytest.mark.parametrize("reward", [0.0, 1.0, 3.5])
def test_all_equal_rewards_leave_only_the_solver_term(reward):
    # Documented behaviour: equal returns -> A_i = 0, so A = α·h(Ã); with every Ã = 0 every advantage is exactly 0.
    flat = [group_of(*(episode(turn(2, 2), turn(2, 2, reward=reward)) for _ in range(4)))]
    assert cast(flat) == [[[0.0, 0.0]] * 4]
    moving = [group_of(episode(turn(2, 1, reward=reward)), episode(turn(2, 3, reward=reward)))]
    assert_close(cast(moving), [[[0.1], [-0.1]]])


@pytest.mark.parametrize("rule", ["shortest_path", "minesweeper"])
def test_permuting_trajectories_permutes_advantages(rule):
    rng = random.Random(0)
    values = [0, 1, 2, 3, INF]

    def random_episode():
        steps = [
            turn(rng.choice(values), rng.choice(values), reward=rng.choice([0.0, 1.0]), valid=rng.random() > 0.2)
            for _ in range(rng.randint(1, 5))
        ]
        return episode(*steps)

    trajectories = [random_episode() for _ in range(6)]
    other = group_of(random_episode(), random_episode(), task_id="other")
    order = [3, 0, 5, 1, 4, 2]
    base = cast([group_of(*trajectories), other], solver_rule=rule)
    permuted = cast([group_of(*(trajectories[i] for i in order)), other], solver_rule=rule)
    for row_p, row_b in zip(permuted[0], [base[0][i] for i in order], strict=True):
        assert row_p == pytest.approx(row_b, abs=1e-12)
    assert permuted[1] == base[1]


def test_edge_cases_give_finite_advantages():
    assert cast([]) == []
    assert cast([group_of()]) == [[]]
    assert cast([group_of(Trajectory(task={}))]) == [[[]]]
    # A group of one episode: A_i = 0, the solver term alone (RMS over its one turn: h = 1).
    assert_close(cast([group_of(episode(turn(2, 1)))]), [[[0.1]]])
    # Length-1 trajectories, a zero-step trajectory among them.
    mixed = cast([group_of(Trajectory(task={}), episode(turn(1, 0, reward=1.0)), episode(turn(1, INF)))])
    assert [len(row) for row in mixed[0]] == [0, 1, 1] and all_finite(mixed)
    # All actions invalid: every Ã = 0, RMS = 0 -> h = 0 / (0 + 1e-8) = 0, no NaN.
    invalid = [group_of(episode(turn(2, 2, valid=False)), episode(turn(2, 2, valid=False), turn(2, 2, valid=False)))]
    advantages, stats = cast_with_stats(invalid, invalid_action_penalty=0.1)
    assert advantages == [[[-0.1], [-0.1, -0.1]]] and stats["rms"] == 0.0
    # Only INF values (every state dead).
    dead = cast([group_of(episode(turn(INF, INF)), episode(turn(INF, INF)))])
    assert dead == [[[0.0], [0.0]]]


def test_bad_inputs_are_rejected():
    batch = hand_batch()
    for field, value, name in [("cast_transform", "tanh", "transform"), ("cast_norm", "std", "norm"),
                               ("solver_rule", "dijkstra", "solver_rule")]:
        with pytest.raises(ValueError, match=name):
            cast(batch, **{field: value})
    with pytest.raises(ValueError, match="solver_rule has 1 entries for 2 groups"):
        cast(batch, solver_rule=["shortest_path"])
    for alpha in (-0.1, float("nan")):
        with pytest.raises(ValueError, match="alpha"):
            cast(batch, cast_alpha=alpha)
    with pytest.raises(ValueError, match="eps"):
        cast(batch, cast_eps=0.0)
    with pytest.raises(ValueError, match="'solver_value' signal"):
        cast([group_of(episode(Step("s", "a")))])
    with pytest.raises(ValueError, match="solver values must be"):
        cast([group_of(episode(turn(float("nan"), 1)))])
    with pytest.raises(ValueError, match="non-finite"):
        cast([group_of(episode(turn(1, 0, reward=float("nan"))))])


def test_config_validation(tmp_path):
    def config(**overrides):
        return CASTConfig(output_dir=str(tmp_path), report_to="none", **overrides)

    assert config().invalid_action_penalty == 0.0  # CAST has no invalid-action penalty
    for field, value in [("cast_transform", "tanh"), ("cast_norm", "std"), ("solver_rule", "bfs"),
                         ("cast_alpha", -1.0), ("cast_eps", 0.0)]:
        with pytest.raises(ValueError, match=field):
            config(**{field: value})


def test_docstring_examples():
    for module in (credit_cast, trainer_cast):
        assert doctest.testmod(module).failed == 0


# ---------------------------------------------------------------- configs (parsed with a local registration)


@pytest.fixture
def registered(monkeypatch):
    return METHODS["cast"]  # registered by CASTTrainer's own declaration


@pytest.mark.parametrize("name", ["cast_sokoban", "cast_minesweeper", "cast_rushhour", "cast_sokoban_tiny"])
def test_configs_parse(name, registered):
    from trl import ModelConfig, TrlParser

    from trl_agents.run import RunArguments

    path = os.path.join(CONFIGS, f"{name}.yaml")
    with open(path) as handle:
        assert yaml.safe_load(handle)["method"] == "cast"
    run, config, model = TrlParser((RunArguments, CASTConfig, ModelConfig)).parse_args_and_config(["--config", path])
    assert isinstance(config, CASTConfig) and config.env_name and (run.tiny_model or model.model_name_or_path)
    if not run.tiny_model:  # the paper setting: 16 tasks x 8 per rollout, two optimizer updates, no KL, α = 0.1
        assert config.generation_batch_size == 128 and config.num_generations == 8
        assert config.steps_per_generation == 2 * config.gradient_accumulation_steps
        assert config.beta == 0.0 and config.cast_alpha == 0.1 and config.row_format == "conversation"
        assert (config.epsilon, config.epsilon_high, config.delta) == (0.2, 0.28, 3.0)


# ---------------------------------------------------------------- trainer


@register_env
class CountdownEnv(AgentEnv):
    """A toy env with a solver: count down from `start` (task field, default 2); an answer containing the letter 'a'
    counts down by one, anything else leaves the count. Reward 1 when the count reaches 0. N(s) = the count."""

    name = "test-cast-countdown"
    instructions = "Say something with the letter a."
    task_keys = ("seed",)

    def reset(self, task):
        self.seed, self.count = task["seed"], task.get("start", 2)
        return f"Count {self.count} of task {self.seed}."

    def step(self, action_text):
        self.count -= "a" in action_text
        done = self.count == 0
        return f"Count {self.count} of task {self.seed}.", float(done), done, {"valid": True, "success": done}

    def solver_value(self):
        return float(self.count)

    def state_key(self):
        return (self.seed, self.count)

    @classmethod
    def task_split(cls, split, count=None, **env_kwargs):
        return [{"env": cls.name, "seed": i} for i in range(count or 8)]


def make_config(tmp_path, **overrides):
    return tiny_training_config(CASTConfig, tmp_path / "out", **overrides)


@pytest.mark.slow
@pytest.mark.parametrize("row_format", ["step", "conversation"])  # step rows: the tiny setting; conversation: paper
def test_two_training_steps(row_format, tiny_model, tokenizer, tmp_path):
    tasks = CountdownEnv.task_split("train", 8)
    config = make_config(tmp_path, row_format=row_format)
    trainer = CASTTrainer(model=tiny_model, args=config, train_dataset=tasks, processing_class=tokenizer)
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    trainer.train()
    assert trainer.state.global_step == 2
    changed = [n for n, p in trainer.model.named_parameters() if not torch.equal(p.detach(), before[n])]
    assert changed, "no parameter moved: advantages were all zero or the loss was disconnected"
    logs = [h for h in trainer.state.log_history if "env/success_rate" in h]
    assert len(logs) == 2
    for key in ["cast/rms", "cast/solver_advantage_mean", "cast/nonzero_solver_fraction", "cast/dead_step_fraction",
                "cast/fatal_step_fraction", "cast/zero_variance_group_fraction"]:
        assert key in logs[0], key
    assert max(h["cast/nonzero_solver_fraction"] for h in logs) > 0  # some 'a' answers moved the count down
    # The engine recorded N(s_t), N(s_t+1) for every step of the last rollout, and the rule was resolved.
    steps = [s for g in trainer.last_rollout.groups for t in g.trajectories for s in t.steps]
    assert steps and all(len(s.signals["solver_value"]) == 2 for s in steps)
    # ... and the trajectory records keep them, in the `signals` column: [N(s_t), N(s_t+1)] of every step.
    from trl_agents.records import load_trajectories

    rows = load_trajectories(str(tmp_path / "out"))
    values = [json.loads(r["signals"])["solver_value"] for r in rows if r["step"] >= 0]
    assert len(values) == len(rows) and all(len(v) == 2 for v in values)
    assert trainer.solver_rule_of(trainer.last_rollout.groups[0]) == "shortest_path"


@pytest.mark.slow
def test_one_step_on_minesweeper_resolves_the_minesweeper_rule(tiny_model, tokenizer, tmp_path):
    tasks = [{"env": "minesweeper", "seed": s, "rows": 4, "cols": 4, "num_mines": 2} for s in range(2)]
    config = make_config(tmp_path, max_steps=1, num_generations=2, per_device_train_batch_size=4, max_turns=2)
    trainer = CASTTrainer(model=tiny_model, args=config, train_dataset=Dataset.from_list(tasks),
                          processing_class=tokenizer)
    trainer.train()
    assert trainer.solver_rule_of(trainer.last_rollout.groups[0]) == "minesweeper"
    assert any("cast/rms" in h for h in trainer.state.log_history)


def test_env_without_a_solver_is_rejected_at_start_up(tiny_model, tokenizer, tmp_path):
    tasks = [{"env": "test-keyword", "seed": s} for s in range(8)]
    with pytest.raises(ValueError, match="CASTTrainer needs environments with solver_value.*'test-keyword'.*lacks"):
        CASTTrainer(model=tiny_model, args=make_config(tmp_path), train_dataset=tasks, processing_class=tokenizer)
