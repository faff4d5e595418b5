"""BPO (sibling leave-one-out credit on rollout trees) against hand-computed numbers, the sum rule, and edge cases.

Trees are built as the branching topology builds them: a child's `steps[:fork_step]` are its parent's very `Step`
objects. The expected values are written out with their arithmetic in comments, not recomputed with the code under
test. Under the sum rule a shared step is trained once with the sum of the values every path through it gives it;
`summed` computes that sum by Step identity.
"""

from __future__ import annotations

import doctest
import random

import pytest
from helpers import all_finite, assert_close, group_credit, group_credit_and_stats, group_of

from trl_agents.credit import bpo as credit_bpo
from trl_agents.credit import get_estimator
from trl_agents.credit.bpo import (
    SiblingSet,
    bpo_advantages,
    leave_one_out,
    sibling_sets,
)
from trl_agents.trajectory import Group, Step, Trajectory


def step(observation: str, reward: float = 0.0, valid: bool = True) -> Step:
    return Step(observation=observation, action_text="act", reward=float(reward), valid=valid)


def root(episode_id: int, *steps: Step) -> Trajectory:
    """A backbone (or independent) episode."""
    return Trajectory(task={"task_id": "t"}, steps=list(steps), episode_id=episode_id)


def fork(parent: Trajectory, episode_id: int, fork_step: int, *own: Step) -> Trajectory:
    """A child that shares the parent's first `fork_step` Step objects and then takes its own steps."""
    return Trajectory(
        task={"task_id": "t"},
        steps=parent.steps[:fork_step] + list(own),
        episode_id=episode_id,
        parent_id=parent.episode_id,
        fork_step=fork_step,
    )


def summed(group: Group, advantages) -> dict[int, float]:
    """The value each Step object is trained with under the sum rule: the sum over every path containing it."""
    totals: dict[int, float] = {}
    for traj, row in zip(group.trajectories, advantages, strict=True):
        for s, value in zip(traj.steps, row, strict=True):
            totals[id(s)] = totals.get(id(s), 0.0) + value
    return totals


# ---------------------------------------------------------------- the spec case: K = 4 siblings at b = 2
# Backbone 0: s0 -> s1 -> s2 (reward 1 on s2), R0 = 1. Children 1, 2, 3 fork from it at b = 2 (share s0, s1) and take
# one step of their own with rewards 0, 0, 1: returns R = [1, 0, 0, 1].
# Leave-one-out: A0 = 1 − (0 + 0 + 1)/3 = +0.6667,  A1 = 0 − (1 + 0 + 1)/3 = −0.6667,  A2 = −0.6667,  A3 = +0.6667
# (sum 0). One backbone: backbone term 0. The shared prefix s0, s1 gets nothing from the set: the paper's prefix
# propagation, λ^d·A_i per path (λ = 0.95: ±0.6333 at d = 1, ±0.6017 at d = 2), sums to
# 0.6017 − 0.6017 − 0.6017 + 0.6017 = 0 over the four paths, which is what the shared step would be trained with.
def spec_tree() -> Group:
    backbone = root(0, step("s0"), step("s1"), step("s2", 1))
    children = [fork(backbone, i, 2, step(f"s2'{i}", r)) for i, r in ((1, 0), (2, 0), (3, 1))]
    return group_of(backbone, *children)


SPEC_EXPECTED = [
    [0.0, 0.0, 0.6667],
    [0.0, 0.0, -0.6667],
    [0.0, 0.0, -0.6667],
    [0.0, 0.0, 0.6667],
]


def test_spec_case_sibling_leave_one_out():
    group = spec_tree()
    assert sibling_sets(group) == [SiblingSet(parent_id=0, fork_step=2, members=(0, 1, 2, 3))]
    assert_close(group_credit("bpo", group), SPEC_EXPECTED)


def test_zero_sum_caveat_shared_prefix_sums_to_zero():
    # Under the sum rule s0 and s1 (on all four paths) would get Σ_i λ^d·A_i = λ^d·(0.6667 − 0.6667 − 0.6667 + 0.6667)
    # = 0 from prefix propagation, for any λ: it is not computed, and no field sets λ. Each branch step is on one path
    # only and keeps its A_i.
    group = spec_tree()
    totals = summed(group, group_credit("bpo", group))
    backbone = group.trajectories[0]
    assert totals[id(backbone.steps[0])] == 0.0 and totals[id(backbone.steps[1])] == 0.0
    branch_steps = [traj.steps[2] for traj in group.trajectories]
    assert [round(totals[id(s)], 4) for s in branch_steps] == [0.6667, -0.6667, -0.6667, 0.6667]
    paper = [[0.95**2 * a, 0.95 * a] for a in (2 / 3, -2 / 3, -2 / 3, 2 / 3)]  # the per-path prefix values
    assert [round(v, 4) for v in paper[0]] == [0.6017, 0.6333]
    assert sum(row[0] for row in paper) == pytest.approx(0.0, abs=1e-15)
    assert sum(row[1] for row in paper) == pytest.approx(0.0, abs=1e-15)


# ---------------------------------------------------------------- a backbone with two branch points
# Backbone 0: s0 s1 s2 s3, reward 1 on s3, R0 = 1.
#   Set (0, b=1): backbone + child 1 (shares s0; own steps 1, 2; R1 = 0):        A0 = 1 − 0 = +1,  A1 = −1
#   Set (0, b=3): backbone + children 2, 3 (share s0 s1 s2; one own step; R2 = 0, R3 = 1):
#                 A0 = 1 − (0 + 1)/2 = +0.5,  A2 = 0 − (1 + 1)/2 = −1,  A3 = 1 − (1 + 0)/2 = +0.5
# Backbone path (both sets add up, each from its branch point on): t=0: 0;  t=1, 2: set1 1;  t=3: 1 + 0.5 = 1.5
# Child 1 (3 steps): [0, −1, −1];  child 2 (4 steps): [0, 0, 0, −1];  child 3: [0, 0, 0, 0.5]
def two_branch_tree() -> Group:
    backbone = root(0, step("s0"), step("s1"), step("s2"), step("s3", 1))
    return group_of(
        backbone,
        fork(backbone, 1, 1, step("x1"), step("x2", 0)),
        fork(backbone, 2, 3, step("y3", 0)),
        fork(backbone, 3, 3, step("z3", 1)),
    )


def test_backbone_with_two_branch_points_adds_up():
    group = two_branch_tree()
    assert [(s.fork_step, s.members) for s in sibling_sets(group)] == [(1, (0, 1)), (3, (0, 2, 3))]
    expected = [
        [0.0, 1.0, 1.0, 1.5],
        [0.0, -1.0, -1.0],
        [0.0, 0.0, 0.0, -1.0],
        [0.0, 0.0, 0.0, 0.5],
    ]
    assert_close(group_credit("bpo", group), expected)


def test_two_branch_points_sum_rule():
    # Backbone s0 (on all 4 paths): 0
    # Backbone s1 (paths 0, 2, 3):  1 + 0 + 0 = 1.0   (= A0 of set 1: the branch comparison at b=1)
    # Backbone s2 (paths 0, 2, 3):  1.0;  s3 (path 0 only): 1.5
    # (The same totals as with the paper's prefix propagation at λ = 0.5, whose per-path values cancel:
    # s1: 1.125 − 0.25 + 0.125 = 1.0.)
    group = two_branch_tree()
    totals = summed(group, group_credit("bpo", group))
    s0, s1, s2, s3 = group.trajectories[0].steps
    assert totals[id(s0)] == 0.0
    assert totals[id(s1)] == pytest.approx(1.0)
    assert totals[id(s2)] == pytest.approx(1.0)
    assert totals[id(s3)] == pytest.approx(1.5)


# ---------------------------------------------------------------- nested fork: a child forked from a child
# Backbone 0: s0 s1 s2, R0 = 0.  Child 1 forks from 0 at b=1 (shares s0; own a1, a2 with reward 1 on a2), R1 = 1.
# Grandchild 2 forks from child 1 at b=2 (shares s0 and a1; own g2), R2 = 0.
#   Set (0, 1): [0, 1] returns [0, 1] -> A0 = −1, A1 = +1
#   Set (1, 2): [1, 2] returns [1, 0] -> A1 = +1, A2 = −1
# Path 0:  [0, −1, −1]
# Path 1:  set (0,1) from t=1: [0, 1, 1];  set (1,2) from t=2: [0, 0, 1]           -> [0, 1, 2]
# Path 2:  set (1,2) from t=2: [0, 0, −1]
def nested_tree() -> Group:
    backbone = root(0, step("s0"), step("s1"), step("s2", 0))
    child = fork(backbone, 1, 1, step("a1"), step("a2", 1))
    grandchild = fork(child, 2, 2, step("g2", 0))
    return group_of(backbone, child, grandchild)


def test_nested_fork():
    group = nested_tree()
    assert sibling_sets(group) == [
        SiblingSet(parent_id=0, fork_step=1, members=(0, 1)),
        SiblingSet(parent_id=1, fork_step=2, members=(1, 2)),
    ]
    advantages = group_credit("bpo", group)
    assert_close(advantages, [[0.0, -1.0, -1.0], [0.0, 1.0, 2.0], [0.0, 0.0, -1.0]])
    # Sum rule: s0 (3 paths): 0;  a1 (paths 1, 2): 1 + 0 = 1.0 (A1 of set (0, 1)).
    totals = summed(group, advantages)
    child = group.trajectories[1]
    assert totals[id(child.steps[0])] == 0.0
    assert totals[id(child.steps[1])] == pytest.approx(1.0)


# ---------------------------------------------------------------- several backbones: the backbone term
# Roots 0 (s0 s1, R0 = 1) and 1 (R1 = 0); child 2 forks from root 0 at b=1 (R2 = 0).
#   Backbone term over roots [1, 0]: A^B = +1, −1 (x ω_B) on every step of each root's path.
#   Set (0, 1): [0, 2] returns [1, 0] -> +1, −1.
# Root 0: t=0: 1 (A^B);  t=1: 1 + 1 = 2.     Root 1: [−1, −1].     Child 2: t=0: 0;  t=1: −1.
def two_backbones() -> Group:
    first = root(0, step("s0"), step("s1", 1))
    second = root(1, step("s0"), step("t1", 0))
    return group_of(first, second, fork(first, 2, 1, step("u1", 0)))


def test_backbone_term_among_roots():
    assert_close(group_credit("bpo", two_backbones()), [[1.0, 2.0], [-1.0, -1.0], [0.0, -1.0]])
    # ω_B = 0.5 halves the backbone term only: root 0 [0.5, 1 + 0.5], root 1 [−0.5, −0.5].
    advantages = group_credit("bpo", two_backbones(), bpo_backbone_weight=0.5)
    assert_close(advantages, [[0.5, 1.5], [-0.5, -0.5], [0.0, -1.0]])
    # Sum rule at root 0's s0 (paths 0, 2): 1 + 0 = 1.0 = A^B: the backbone comparison reaches the prefix.
    group = two_backbones()
    totals = summed(group, group_credit("bpo", group))
    assert totals[id(group.trajectories[0].steps[0])] == pytest.approx(1.0)


def test_independent_group_reduces_to_the_backbone_term():
    # No branch: every episode is a root, no sibling set. BPO = ω_B x RLOO:
    # R = [1, 0, 0, 1] -> 1 − (0 + 0 + 1)/3 = +0.6667, 0 − (1 + 0 + 1)/3 = −0.6667, on every step.
    group = group_of(*(root(0, step("s0"), step("s1", r)) for r in (1, 0, 0, 1)))  # ids all 0: not a tree
    advantages, stats = group_credit_and_stats("bpo", group)
    assert_close(advantages, [[0.6667, 0.6667], [-0.6667, -0.6667], [-0.6667, -0.6667], [0.6667, 0.6667]])
    assert advantages == group_credit("rloo", group, invalid_action_penalty=0.0)
    assert stats["num_sibling_sets"] == 0 and stats["num_backbones"] == 4 and stats["num_branches"] == 0
    # ω_B = 0.5: ±0.3333;  ω_B = 0: nothing left.
    assert_close(group_credit("bpo", group, bpo_backbone_weight=0.5), [[0.3333] * 2, [-0.3333] * 2, [-0.3333] * 2, [0.3333] * 2])
    assert group_credit("bpo", group, bpo_backbone_weight=0.0) == [[0.0, 0.0]] * 4
    # With the penalty it is RLOO's broadcast exactly: R = [1, 0] -> ±1, then −0.1 on B's invalid step.
    penalised = group_of(root(0, step("s0"), step("s1", 1)), root(1, step("s0"), step("s1", 0, valid=False)))
    assert_close(group_credit("bpo", penalised, invalid_action_penalty=0.1), [[1.0, 1.0], [-1.0, -1.1]])
    assert group_credit("bpo", penalised, invalid_action_penalty=0.1) == group_credit("rloo", penalised, invalid_action_penalty=0.1)


# ---------------------------------------------------------------- invalid-action penalty, charged once


def test_invalid_penalty_counted_once_by_the_owner():
    # The spec tree with the backbone's s0 invalid and child 1's own step invalid, λ_inv = 0.1.
    backbone = root(0, step("s0", valid=False), step("s1"), step("s2", 1))
    children = [fork(backbone, i, 2, step(f"s2'{i}", r, valid=i != 1)) for i, r in ((1, 0), (2, 0), (3, 1))]
    group = group_of(backbone, *children)
    advantages = group_credit("bpo", group, invalid_action_penalty=0.1)
    # s0 is owned by the backbone: only path 0 subtracts 0.1 (0 − 0.1 = −0.1); the children's copies do not.
    # Child 1's own s2'1: −0.6667 − 0.1 = −0.7667.
    expected = [row[:] for row in SPEC_EXPECTED]
    expected[0][0] = -0.1
    expected[1][2] = -0.6667 - 0.1
    assert_close(advantages, expected)
    # Sum rule: s0 is trained with 0 − 0.1 = −0.1 (once), not 0 − 4 x 0.1.
    assert summed(group, advantages)[id(backbone.steps[0])] == pytest.approx(-0.1)


# ---------------------------------------------------------------- no signal, edge cases, properties


@pytest.mark.parametrize("reward", [0.0, 1.0, 0.3])
def test_all_equal_returns_give_zero(reward):
    backbone = root(0, step("s0"), step("s1"), step("s2", reward))
    other = root(1, step("s0"), step("t1", reward))
    group = group_of(
        backbone, other, fork(backbone, 2, 1, step("x1", reward)), fork(backbone, 3, 2, step("y2", reward))
    )
    advantages, stats = group_credit_and_stats("bpo", group)
    assert advantages == [[0.0, 0.0, 0.0], [0.0, 0.0], [0.0, 0.0], [0.0, 0.0, 0.0]]
    assert stats["zero_advantage_set_fraction"] == 1.0


def test_stats():
    _, stats = group_credit_and_stats("bpo", two_branch_tree())
    # Sets (b=1, K=2) and (b=3, K=3): mean K 2.5, mean b 2; |A| over 5 memberships: (1 + 1 + 0.5 + 1 + 0.5)/5 = 0.8
    assert stats == {
        "num_sibling_sets": 2,
        "mean_siblings": 2.5,
        "zero_advantage_set_fraction": 0.0,
        "mean_fork_step": 2.0,
        "mean_abs_sibling_advantage": pytest.approx(0.8),
        "num_backbones": 1,
        "num_branches": 3,
    }
    assert group_credit_and_stats("bpo", group_of()) == (
        [],
        {
            "num_sibling_sets": 0,
            "mean_siblings": 0.0,
            "zero_advantage_set_fraction": 0.0,
            "mean_fork_step": 0.0,
            "mean_abs_sibling_advantage": 0.0,
            "num_backbones": 0,
            "num_branches": 0,
        },
    )


def test_edge_groups_are_finite():
    assert group_credit("bpo", group_of()) == []
    # Singleton: one backbone, nothing to compare with.
    assert group_credit("bpo", group_of(root(0, step("s0"), step("s1", 1)))) == [[0.0, 0.0]]
    # Zero-step trajectories.
    assert group_credit("bpo", group_of(Trajectory(task={}))) == [[]]
    # Length-1 paths: a child forked at step 0 shares nothing: ±1 on the single step (1 − 0, 0 − 1).
    one = root(0, step("s0", 1))
    assert group_credit("bpo", group_of(one, fork(one, 1, 0, step("s0'", 0)))) == [[1.0], [-1.0]]
    # All steps invalid, on a tree: finite, and each owner pays 0.1 once on its own steps.
    backbone = root(0, step("s0", valid=False), step("s1", 1, valid=False))
    group = group_of(backbone, fork(backbone, 1, 1, step("x1", 0, valid=False)))
    # Set (0, 1): ±1 from step 1. Path 0: [0 − 0.1, 1 − 0.1]; path 1: [0 (not owned), −1 − 0.1].
    advantages = group_credit("bpo", group, invalid_action_penalty=0.1)
    assert all_finite(advantages)
    assert_close(advantages, [[-0.1, 0.9], [0.0, -1.1]])


def test_parent_missing_from_the_group():
    # The backbone failed and was dropped: its two children still left the same state -> a set of their own.
    backbone = root(0, step("s0"), step("s1", 0))
    kids = [fork(backbone, 1, 1, step("x1", 1)), fork(backbone, 2, 1, step("y1", 0))]
    group = group_of(*kids)
    assert sibling_sets(group) == [SiblingSet(parent_id=0, fork_step=1, members=(1, 2))]
    assert_close(group_credit("bpo", group), [[0.0, 1.0], [0.0, -1.0]])  # ±1 from the branch point on
    # One child alone is no set: nothing but its penalty.
    assert sibling_sets(group_of(kids[0])) == []
    assert group_credit("bpo", group_of(kids[0])) == [[0.0, 0.0]]


def random_tree(rng: random.Random) -> list[Trajectory]:
    def own(n: int) -> list[Step]:
        return [step(f"o{rng.randrange(4)}", rng.choice([0, 0, 1]), rng.random() > 0.2) for _ in range(n)]

    trajectories = []
    for episode_id in range(10):
        candidates = [t for t in trajectories if t.steps]
        if episode_id < 2 or rng.random() < 0.3 or not candidates:
            trajectories.append(root(episode_id, *own(rng.randint(1, 4))))
        else:
            parent = rng.choice(candidates)
            b = rng.randrange(parent.fork_step, len(parent.steps))
            trajectories.append(fork(parent, episode_id, b, *own(rng.randint(1, 3))))
    return trajectories


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_permuting_episodes_does_not_change_any_path(seed):
    rng = random.Random(seed)
    trajectories = random_tree(rng)
    options = {"invalid_action_penalty": 0.1}
    reference = dict(zip((t.episode_id for t in trajectories), group_credit("bpo", group_of(*trajectories), **options)))
    order = list(range(len(trajectories)))
    rng.shuffle(order)
    shuffled = [trajectories[i] for i in order]
    permuted = dict(zip((t.episode_id for t in shuffled), group_credit("bpo", group_of(*shuffled), **options)))
    assert permuted == reference  # exactly: sets and roots are visited by episode id
    assert all_finite(list(reference.values()))


def test_leave_one_out():
    assert leave_one_out([]) == [] and leave_one_out([3.0]) == [0.0]
    assert_close([leave_one_out([1.0, 0.0, 0.0, 1.0])], [[0.6667, -0.6667, -0.6667, 0.6667]])
    assert leave_one_out([0.3, 0.3, 0.3]) == [0.0, 0.0, 0.0]


def test_bad_inputs_are_rejected():
    group = spec_tree()
    with pytest.raises(TypeError, match="prefix_decay"):  # prefix propagation is not a knob (the zero-sum caveat)
        group_credit("bpo", group, prefix_decay=0.95)
    for value in (-1.0, float("inf")):
        with pytest.raises(ValueError, match="backbone_weight"):
            group_credit("bpo", group, bpo_backbone_weight=value)
    with pytest.raises(ValueError, match="invalid_penalty"):
        group_credit("bpo", group, invalid_action_penalty=float("nan"))
    nan_group = spec_tree()
    nan_group.trajectories[3].steps[2].reward = float("nan")
    with pytest.raises(ValueError, match="non-finite reward"):
        group_credit("bpo", nan_group)
    duplicate = spec_tree()
    duplicate.trajectories[2].episode_id = 1
    with pytest.raises(ValueError, match="episode_id 1 appears twice"):
        group_credit("bpo", duplicate)
    beyond = spec_tree()
    beyond.trajectories[1].fork_step = 5
    with pytest.raises(ValueError, match="fork_step"):
        group_credit("bpo", beyond)
    selfish = spec_tree()
    selfish.trajectories[1].parent_id = 1
    with pytest.raises(ValueError, match="parent_id"):
        group_credit("bpo", selfish)


def test_registered_as_bpo():
    assert get_estimator("bpo").function is bpo_advantages


def test_docstring_examples():
    assert doctest.testmod(credit_bpo).failed == 0
