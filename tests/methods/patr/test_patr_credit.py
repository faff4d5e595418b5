"""PATR's math: GRPO over a tree's leaves with pruned leaves as failures (trl_agents/credit/patr.py), the solver
progress score and the scorer adapters (trl_agents/judges.py) and the tree's pure bookkeeping
(trl_agents/rollout/topologies/patr.py), on hand-computed cases."""

from __future__ import annotations

import math

import pytest
from helpers import all_finite, assert_close, group_credit, group_credit_and_stats, group_of

from trl_agents.credit import get_estimator
from trl_agents.credit.patr import leaf_return, patr_advantages
from trl_agents.judges import (
    CallableJudge,
    CallableScorer,
    JudgeScorer,
    SolverProgressScorer,
    coerce_q,
    judge_messages,
    judge_q,
    solver_progress,
)
from trl_agents.rollout.topologies.patr import PRUNED, choose_expansions, degenerate_reason, spread, update_streak
from trl_agents.trajectory import Step, Trajectory

INF = math.inf


def tree(returns, pruned=(), invalid_owned=None):
    """A root s0 → s1 → s2 and forks: leaf 1 forked at step 1 from leaf 0, leaf 2 at step 2 from leaf 1, leaf 3
    at step 2 from leaf 0. `returns[i]` is the reward of leaf i's last step; leaves in `pruned` carry the mark."""
    root = [Step("s0", "a"), Step("s1", "b"), Step("s2", "c", reward=returns[0])]
    leaves = [Trajectory(task={}, steps=root, episode_id=0)]
    one = root[:1] + [Step("s1", "x"), Step("s2'", "y", reward=returns[1])]
    leaves.append(Trajectory(task={}, steps=one, episode_id=1, parent_id=0, fork_step=1))
    leaves.append(Trajectory(task={}, steps=one[:2] + [Step("s2'", "z", reward=returns[2])], episode_id=2,
                             parent_id=1, fork_step=2))
    leaves.append(Trajectory(task={}, steps=root[:2] + [Step("s2", "w", reward=returns[3])], episode_id=3,
                             parent_id=0, fork_step=2))
    for i in pruned:
        leaves[i].steps[-1].signals[PRUNED] = "low_score"
    if invalid_owned is not None:
        leaves[invalid_owned[0]].steps[invalid_owned[1]].valid = False
    return group_of(*leaves)


def test_grpo_over_the_leaves_with_a_pruned_failure():
    # Leaf returns [1, 0, 1, 1], leaf 3 pruned ⇒ R = [1, 0, 1, 0]: mean 0.5, Bessel std sqrt(4·0.25/3) = 0.57735.
    # A = ±0.5 / (0.57735 + 1e-4) = ±0.86588 on every step of each leaf's path.
    group = tree([1.0, 0.0, 1.0, 1.0], pruned=(3,))
    advantages, stats = group_credit_and_stats("patr", group)
    a = 0.5 / (math.sqrt(1 / 3) + 1e-4)
    assert_close(advantages, [[a] * 3, [-a] * 3, [a] * 3, [-a] * 3])
    assert stats["num_leaves"] == 4 and stats["pruned_fraction"] == 0.25 and stats["num_forks"] == 3
    assert stats["mean_fork_step"] == pytest.approx(5 / 3)  # forks at steps 1, 2, 2
    # The pruned leaf's own reward (1) is replaced by the pruned return; with pruned_return=1 nothing is pruned.
    assert leaf_return(group.trajectories[3]) == 0.0 and leaf_return(group.trajectories[3], 1.0) == 1.0
    assert_close(group_credit("patr", group, patr_pruned_return=1.0)[1:2], [[-0.75 / (0.5 + 1e-4)] * 3])  # R = [1,0,1,1]: σ = 0.5
    # Registered estimator; Dr. GRPO scale: centred only.
    assert get_estimator("patr").function is patr_advantages
    assert_close(group_credit("patr", group, scale_rewards="none"), [[0.5] * 3, [-0.5] * 3, [0.5] * 3, [-0.5] * 3])


def test_shared_steps_sum_to_zero_over_all_leaves_and_get_the_subtree_sum():
    # Rows train a shared step with the sum of the values of the leaves through it. Step 0 is on all 4 leaves:
    # Σ A = 0. Step 1 of the root (s1 → "b") is on leaves 0 and 3: a + (−a) = 0 here; with returns [1, 0, 0, 1]
    # (no prune): A = [a, −a, −a, a], leaves 0 and 3 give step 1 of the root 2a, leaf 1's own step 1 (shared with
    # leaf 2) gets −2a.
    group = tree([1.0, 0.0, 0.0, 1.0])
    adv = group_credit("patr", group)
    a = adv[0][0]
    assert a == pytest.approx(0.5 / (math.sqrt(1 / 3) + 1e-4))
    assert sum(row[0] for row in adv) == pytest.approx(0.0, abs=1e-12)
    assert adv[0][1] + adv[3][1] == pytest.approx(2 * a) and adv[1][1] + adv[2][1] == pytest.approx(-2 * a)


def test_invalid_penalty_is_charged_once_by_the_owner():
    # Step 1 of leaf 1 is invalid and shared with leaf 2 (forked at step 2): only leaf 1 (its owner) subtracts 0.1.
    group = tree([1.0, 1.0, 1.0, 1.0], invalid_owned=(1, 1))
    adv = group_credit("patr", group, invalid_action_penalty=0.1)
    assert adv[1] == [0.0, -0.1, 0.0] and adv[2] == [0.0, 0.0, 0.0]


def test_edge_groups_are_finite():
    assert group_credit_and_stats("patr", group_of()) == ([], {"num_leaves": 0.0, "pruned_fraction": 0.0,
                                                           "zero_signal": 0.0, "num_forks": 0.0,
                                                           "mean_fork_step": 0.0, "success_rate": 0.0})
    single = group_of(Trajectory(task={}, steps=[Step("s", "a", reward=1.0)]))
    assert group_credit("patr", single) == [[0.0]]  # one leaf: no baseline, no signal
    failed = tree([0.0, 0.0, 0.0, 0.0], pruned=(0, 1, 2, 3))  # all failed and pruned
    adv, stats = group_credit_and_stats("patr", failed)
    assert all_finite(adv) and all(a == 0.0 for row in adv for a in row) and stats["zero_signal"] == 1.0
    tiny = tree([1.0, 1.0 + 1e-12, 1.0, 1.0])  # a tiny std: bounded by ε
    assert all_finite(group_credit("patr", tiny))
    with pytest.raises(ValueError, match="non-finite reward"):
        group_credit("patr", tree([math.nan, 0.0, 0.0, 0.0]))
    with pytest.raises(ValueError, match="pruned_return must be finite"):
        group_credit("patr", tree([1.0, 0.0, 0.0, 0.0]), patr_pruned_return=math.inf)
    with pytest.raises(ValueError, match="scale must be one of"):
        group_credit("patr", tree([1.0, 0.0, 0.0, 0.0]), scale_rewards="batch")


def solver_path(*values, horizon=10):
    """A trajectory whose steps carry solver_value (N(s_t), N(s_t+1)) for the given N(s_0), N(s_1), ..."""
    return Trajectory(task={}, steps=[Step(f"s{i}", "m", signals={"solver_value": (values[i], values[i + 1])})
                                      for i in range(len(values) - 1)])


def test_solver_progress_slack_and_distance():
    # slack: q = clip((T − t − N(s_t)) / (T − N(s_0)), 0, 1), T = 10, N(s_0) = 6: 4 spare turns.
    assert solver_progress(solver_path(6, 5), 10) == 1.0  # (10 − 1 − 5) / 4 = 1: optimal
    assert solver_progress(solver_path(6, 6), 10) == 0.75  # a bump: (10 − 1 − 6) / 4
    assert solver_progress(solver_path(6, 7), 10) == 0.5  # a step away: (10 − 1 − 7) / 4
    assert solver_progress(solver_path(6, 7, 8, 9), 10) == 0.0  # (10 − 3 − 9) / 4 < 0 ⇒ 0: cannot succeed any more
    assert solver_progress(solver_path(6, 5, 4, 3, 2, 1, 0), 10) == 1.0  # solved optimally
    assert solver_progress(solver_path(6, INF), 10) == 0.0  # unsolvable (e.g. a Sokoban deadlock)
    assert solver_progress(solver_path(12, 11), 10) == 0.0  # more moves needed than turns: T − N(s_0) < 0
    # No spare turn (T = N(s_0) = 6): 1 while every step is optimal, 0 after the first wasted one.
    assert solver_progress(solver_path(6, 5), 6) == 1.0 and solver_progress(solver_path(6, 6), 6) == 0.0
    assert solver_progress(solver_path(0, 0), 10) == 1.0  # already solved
    # distance: q = clip(1 − N(s_t)/N(s_0), 0, 1)
    assert solver_progress(solver_path(4, 3), 10, "distance") == 0.25  # 1 − 3/4
    assert solver_progress(solver_path(4, 5), 10, "distance") == 0.0  # 1 − 5/4 < 0
    assert solver_progress(Trajectory(task={}, steps=[Step("s", "a")]), 10) is None  # no signal: no score
    assert solver_progress(Trajectory(task={}), 10) is None
    assert SolverProgressScorer(10)([solver_path(6, 6), solver_path(6, 5)]) == [0.75, 1.0]
    with pytest.raises(ValueError, match="horizon"):
        SolverProgressScorer(0)
    with pytest.raises(ValueError, match="mode must be one of"):
        solver_progress(solver_path(6, 5), 10, "ratio")


def test_scorer_adapters():
    # A judge's 0..3 score ↦ q = score/3; an unusable answer is None.
    assert [judge_q(s) for s in (0, 1, 3, None)] == [0.0, 1 / 3, 1.0, None]
    seen = []

    def judge_fn(prompts):
        seen.extend(prompts)
        return ["Score: 2", "no idea"]

    scorer = JudgeScorer(CallableJudge(judge_fn))
    nodes = [solver_path(3, 2), solver_path(3, 4)]
    assert scorer(nodes) == [2 / 3, None]
    assert seen[0][0]["role"] == "system" and "making progress" in seen[0][1]["content"]
    assert seen[0] == judge_messages(nodes[0]) and scorer([]) == []
    # A user's callable: numbers clipped to [0, 1], anything else None; the count is checked.
    assert CallableScorer(lambda ts: [0.4, 7, float("nan")])(nodes + nodes[:1]) == [0.4, 1.0, None]
    assert [coerce_q(v) for v in ("0.5", None, True, -3)] == [None, None, None, 0.0]
    with pytest.raises(ValueError, match="returned 1 scores for 2 trajectories"):
        CallableScorer(lambda ts: [0.5])(nodes)
    with pytest.raises(TypeError, match="must be callable"):
        CallableScorer(0.5)


def test_reward_model_scorer_on_the_tiny_model(tiny_model_dir):
    # A process reward model: the tiny causal LM's weights under a fresh one-label classification head; q = sigmoid.
    from trl_agents.judges import RewardModelScorer

    scorer = RewardModelScorer(tiny_model_dir, max_length=64, batch_size=2)
    scores = scorer([solver_path(3, 2), solver_path(3, 4), solver_path(3, 2, 1)])
    assert len(scores) == 3 and all(s is not None and 0.0 < s < 1.0 for s in scores)
    assert scorer([solver_path(3, 2)]) == [pytest.approx(scores[0], abs=1e-5)]  # batched = alone (right padding)


def test_streaks_degenerate_paths_and_expansion_choice():
    # q < τ_prune = 0.2 counts; a score ≥ τ_prune resets; None (no score) leaves the streak as it is.
    streak = 0
    for q in (0.1, None, 0.19):
        streak = update_streak(streak, q, 0.2)
    assert streak == 2 and update_streak(streak, 0.2, 0.2) == 0
    ok = Trajectory(task={}, steps=[Step("o1", "up"), Step("o2", "up"), Step("o3", "up")])  # moving: not a loop
    stuck = Trajectory(task={}, steps=[Step("o", "up "), Step("o", " up"), Step("o", "up")])
    assert degenerate_reason(ok, 1, 2, 3) is None and degenerate_reason(ok, 2, 2, 3) == "low_score"
    assert degenerate_reason(stuck, 0, 2, 3) == "repeated_action" and degenerate_reason(stuck, 0, 2, 0) is None
    rejected = Trajectory(task={}, steps=[Step("o", "a"), Step("o1", "?", valid=False), Step("o2", "!", valid=False)])
    assert degenerate_reason(rejected, 0, 2, 3) == "invalid_actions" and degenerate_reason(rejected, 0, 3, 3) is None
    # Expansion: q ≥ τ_exp = 0.6, best first, ties by the lower id, top-k.
    nodes = [(0.6, 3), (0.59, 1), (0.95, 2), (None, 0), (0.95, 5)]
    assert choose_expansions(nodes, 0.6, 1) == [2] and choose_expansions(nodes, 0.6, 5) == [2, 5, 3]
    assert choose_expansions([(0.5, 0)], 0.6, 1) == []
    assert spread(3, 2) == [2, 1] and spread(2, 2) == [1, 1]
