"""VICT (verifier-instrumented credit tracing, docs/methods/vict.md): credit math, abstention, invariants,
real verifier atoms from searchqa / webshop-lite, the trainer end to end, and its configs.

Expected values are written out with their arithmetic in comments; they are not recomputed with the code under test.
"""

from __future__ import annotations

import copy
import doctest
import glob
import os
import random

import pytest
import torch
from datasets import Dataset
from helpers import all_finite, assert_close, group_credit, group_of

from trl_agents.credit import get_estimator, stat_means
from trl_agents.credit import vict as credit_vict
from trl_agents.credit.vict import (
    ABSTAIN_REASONS,
    Trace,
    VICTParams,
    redistribute,
    trace_proof_edges,
    vict_advantages,
)
from trl_agents.envs import make_env
from trl_agents.envs.base import VerifierAtom
from trl_agents.testing import tiny_training_config
from trl_agents.trainers import vict as trainer_vict
from trl_agents.trainers.vict import VICTConfig, VICTTrainer
from trl_agents.trajectory import RolloutBatch, Step, Trajectory


def vict_with_stats(group, **params):
    """VICT on one group with `VICTParams(**params)`: (advantages, its stats), the stats read back from their totals
    and counts: the counts "trajectories", "abstained", "credited_steps", "traced_steps", "abstain/<reason>" and the
    rates "abstention_rate", "mean_credited_steps", "credited_step_fraction"."""
    (advantages,), stats = vict_advantages([group], VICTParams(**params))
    (abstained, trajectories), (credited, traced_steps) = stats["abstention_rate"], stats["credited_step_fraction"]
    counts = {"trajectories": trajectories, "abstained": abstained, "credited_steps": credited,
              "traced_steps": traced_steps, **{f"abstain/{r}": stats[f"abstain/{r}"][0] for r in ABSTAIN_REASONS}}
    return advantages, {**stat_means(stats), **counts}

TOL = 1e-4
CONFIG_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "..", "configs")


def atom(name, status="sat", witness=None, depends=()):
    return {"name": name, "status": status, "witness_step": witness, "depends_on": list(depends)}


def episode(num_steps, reward, success, atoms, invalid=()):
    """A trajectory of `num_steps` steps, `reward` at the last one, `atoms` in the last step's info."""
    steps = [Step(observation=f"s{t}", action_text="act", valid=t not in invalid) for t in range(num_steps)]
    if steps:
        steps[-1].reward = float(reward)
        steps[-1].done = True
        if atoms is not None:
            steps[-1].signals["verifier_atoms"] = atoms
    return Trajectory(task={"task_id": "t"}, steps=steps, success=success)


# The hand-computed case of docs/methods/vict.md: T = 4; success with core {k1 (t=1), k2 (t=3, depends on k1)}; failure with a
# violated atom witnessed at t=2. Returns (2, 0) with scale="none" give A = (+1, −1): mean 1, deviations ±1.
K1 = atom("k1", "sat", 1)
K2 = atom("k2", "sat", 3, ["k1"])
VIOLATED = atom("k2", "unsat", 2, ["k1"])


def spec_group(success_atoms=(K1, K2)):
    return group_of(episode(4, 2.0, True, list(success_atoms)), episode(4, 0.0, False, [K1, VIOLATED]))


# ---------------------------------------------------------------- (a) hand-computed cases


def test_spec_case_success_and_failure():
    # success: E = {1, 3}, A·T/|E| = 1·4/2 = 2 on steps 1 and 3; failure: E = {2}, −1·4/1 = −4 on step 2
    assert group_credit("vict", spec_group(), scale_rewards="none") == [[0.0, 2.0, 0.0, 2.0], [0.0, 0.0, -4.0, 0.0]]


def test_spec_case_dependency_before_atom_abstains():
    # k2 witnessed at t=0, before its dependency k1 (t=1): the edge is not dependency-valid -> broadcast [1, 1, 1, 1]
    early = atom("k2", "sat", 0, ["k1"])
    advantages, stats = vict_with_stats(spec_group((K1, early)), scale_rewards="none")
    assert advantages == [[1.0, 1.0, 1.0, 1.0], [0.0, 0.0, -4.0, 0.0]]
    assert stats["abstain/order"] == 1 and stats["abstained"] == 1 and stats["abstention_rate"] == 0.5
    assert stats["mean_credited_steps"] == 1.0  # only the failure is traced, with |E| = 1


def test_redistribute_spec_numbers_and_floor():
    assert redistribute(1.0, 4, [1, 3]) == [0.0, 2.0, 0.0, 2.0]
    assert redistribute(-1.0, 4, [2]) == [0.0, 0.0, -4.0, 0.0]
    # ρ = 0.5: off-edge 1·0.5 = 0.5; on-edge 1·(0.5 + 0.5·4/2) = 1.5
    assert redistribute(1.0, 4, [1, 3], edge_share=0.5) == [0.5, 1.5, 0.5, 1.5]
    assert redistribute(1.0, 4, [1, 3], edge_share=0.0) == [1.0, 1.0, 1.0, 1.0]  # ρ = 0 is GRPO's broadcast
    assert redistribute(0.7, 2, []) == [0.7, 0.7]


def test_grpo_zscore_advantage_is_redistributed():
    # R = (1, 0, 0, 1): mean 0.5, Bessel std 0.57735, A = ±0.5/(0.57735 + 1e-4) = ±0.86588.
    # Success (T=3, E={0, 2}): 0.86588·3/2 = 1.29882 on steps 0 and 2. Failure (T=2, E={1}): −0.86588·2 = −1.73176.
    # No atoms recorded: broadcast ±0.86588.
    success_atoms = [atom("a", "sat", 0), atom("b", "sat", 2, ["a"])]
    failure_atoms = [atom("a", "sat", 0), atom("b", "unsat", 1, ["a"])]
    group = group_of(
        episode(3, 1.0, True, success_atoms),
        episode(2, 0.0, False, failure_atoms),
        episode(2, 0.0, False, None),
        episode(1, 1.0, True, None),
    )
    assert_close(group_credit("vict", group), [[1.29882, 0.0, 1.29882], [0.0, -1.73176], [-0.86588] * 2, [0.86588]])


def test_invalid_penalty_stays_on_its_step_after_redistribution():
    # spec group, step 0 of the success invalid: [0 − 0.1, 2, 0, 2]; the abstaining version: [1 − 0.1, 1, 1, 1]
    group = group_of(episode(4, 2.0, True, [K1, K2], invalid={0}), episode(4, 0.0, False, [K1, VIOLATED]))
    assert_close(group_credit("vict", group, scale_rewards="none", invalid_action_penalty=0.1), [[-0.1, 2, 0, 2], [0, 0, -4, 0]])


def test_shared_witness_step_counts_once():
    # ALFWorld look_at_obj_in_light: toggled and in_light can share a witness. E = {1, 2} (not {1, 2, 2}):
    # A = 1 (returns (2, 0), scale none), T = 4: 4/2 = 2 on steps 1 and 2.
    atoms = [atom("holding", "sat", 1), atom("toggled", "sat", 2), atom("in_light", "sat", 2, ["holding", "toggled"])]
    group = group_of(episode(4, 2.0, True, atoms), episode(4, 0.0, False, None))
    assert group_credit("vict", group, scale_rewards="none")[0] == [0.0, 2.0, 2.0, 0.0]


def test_failure_core_options():
    # Failure, atoms in dependency order a (sat, t0) -> b (unsat, t1) -> c (unsat, t2), T = 4, A = −1.
    atoms = [atom("a", "sat", 0), atom("b", "unsat", 1, ["a"]), atom("c", "unsat", 2, ["b"])]
    assert trace_proof_edges(atoms, 4, False) == Trace(core=("b",), edge_steps=(1,))  # greedy: the first unsat
    assert trace_proof_edges(atoms, 4, False, failure_core="all_unsat") == Trace(core=("b", "c"), edge_steps=(1, 2))
    assert trace_proof_edges(atoms, 4, False, failure_core="none").abstain == "failure_not_traced"
    group = group_of(episode(4, 2.0, True, None), episode(4, 0.0, False, atoms))
    assert group_credit("vict", group, scale_rewards="none")[1] == [0.0, -4.0, 0.0, 0.0]  # −1·4/1
    assert group_credit("vict", group, scale_rewards="none", failure_core="all_unsat")[1] == [0.0, -2.0, -2.0, 0.0]  # −1·4/2
    assert group_credit("vict", group, scale_rewards="none", failure_core="none")[1] == [-1.0] * 4


def test_greedy_core_follows_dependency_order_not_list_order():
    # The verifier lists c before its dependency b: dependency order is a, b, c, so b is the greedy core.
    atoms = [atom("c", "unsat", 3, ["b"]), atom("a", "sat", 0), atom("b", "unsat", 2, ["a"])]
    assert trace_proof_edges(atoms, 4, False).core == ("b",)
    # Ties (independent unsat atoms) keep the verifier's order.
    tied = [atom("a", "sat", 0), atom("y", "unsat", 2, ["a"]), atom("x", "unsat", 1, ["a"])]
    assert trace_proof_edges(tied, 4, False).core == ("y",)


def test_verifier_atom_objects_and_single_candidate_lists_are_accepted():
    atoms = [VerifierAtom("k1", "sat", 1), VerifierAtom("k2", "sat", 3, ["k1"])]
    assert trace_proof_edges(atoms, 4, True) == Trace(core=("k1", "k2"), edge_steps=(1, 3))
    listed = [atom("k1", "sat", [1, 1]), atom("k2", "sat", [3], ["k1"])]
    assert trace_proof_edges(listed, 4, True).edge_steps == (1, 3)


# ---------------------------------------------------------------- (b) abstention, one case per reason

ABSTAIN_CASES = {
    # reason: (atoms, T, success)
    "no_atoms": [(None, 4, True), ([], 4, False)],
    "ambiguous": [
        ([atom("k1", "sat", 1), atom("k1", "sat", 2)], 4, True),  # one name, two atoms
        ([atom("k1", "sat", 0), atom("k2", "sat", [1, 2], ["k1"])], 4, True),  # two candidate witnesses
        ([atom("k1", "sat", [0, 1]), atom("k2", "unsat", 2, ["k1"])], 4, False),  # ... of the core's dependency
    ],
    "dangling_edge": [([atom("k1", "sat", 1, ["ghost"])], 4, True)],
    "cycle": [
        ([atom("k1", "sat", 1, ["k2"]), atom("k2", "sat", 2, ["k1"])], 4, True),
        ([atom("k1", "unsat", 1, ["k1"])], 4, False),  # self-loop
    ],
    "inconsistent": [
        ([atom("k1", "sat", 1), atom("k2", "unsat", 2, ["k1"])], 4, True),  # success with an unsat atom
        ([atom("k1", "sat", 1), atom("k2", "sat", 2, ["k1"])], 4, False),  # failure with every atom sat
    ],
    "unknown": [
        ([atom("k1", "sat", 1), atom("k2", "unknown", None, ["k1"])], 4, True),  # success core atom unknown
        ([atom("k1", "unknown"), atom("k2", "unsat", 2, ["k1"])], 4, False),  # first non-sat atom is unknown
    ],
    "missing_witness": [
        ([atom("k1", "sat", None), atom("k2", "sat", 2, ["k1"])], 4, True),  # core atom without witness
        ([atom("k1", "sat", 1), atom("k2", "unsat", None, ["k1"])], 4, False),  # violated atom, no witness
        ([atom("k1", "sat", []), atom("k2", "unsat", 2, ["k1"])], 4, False),  # its dependency has none
        ([atom("k0", "sat"), atom("k1", "sat", 1, ["k0"]), atom("k2", "unsat", 2, ["k1"])], 4, False),  # transitive
    ],
    "out_of_range": [
        ([atom("k1", "sat", 1), atom("k2", "sat", 4, ["k1"])], 4, True),  # witness = T
        ([atom("k1", "sat", -1), atom("k2", "sat", 2, ["k1"])], 4, True),
    ],
    "order": [
        ([atom("k1", "sat", 3), atom("k2", "unsat", 2, ["k1"])], 4, False),
        # below the core: k1 (t=1) depends on k0 (t=3), although k1 -> k2 itself is in order
        ([atom("k0", "sat", 3), atom("k1", "sat", 1, ["k0"]), atom("k2", "unsat", 3, ["k1"])], 4, False),
    ],
}


def test_every_abstain_reason_has_a_case():
    assert set(ABSTAIN_CASES) | {"failure_not_traced"} == set(ABSTAIN_REASONS)


@pytest.mark.parametrize(
    ("reason", "atoms", "num_steps", "success"),
    [(reason, *case) for reason, cases in ABSTAIN_CASES.items() for case in cases],
)
def test_abstain_reason_and_broadcast_fallback(reason, atoms, num_steps, success):
    assert trace_proof_edges(atoms, num_steps, success) == Trace(abstain=reason)
    # In a group, the abstaining trajectory gets GRPO's broadcast credit: A = +1 (success) or −1 (failure).
    other = episode(num_steps, 0.0 if success else 2.0, not success, [atom("x", "unsat" if success else "sat", 0)])
    traj = episode(num_steps, 2.0 if success else 0.0, success, atoms)
    advantages, stats = vict_with_stats(group_of(traj, other), scale_rewards="none")
    assert advantages[0] == [1.0 if success else -1.0] * num_steps
    assert stats[f"abstain/{reason}"] == 1 and stats["abstained"] == 1  # `other` is traced


def test_credit_of_a_failure_goes_to_the_violated_atom_only():
    # The sat atoms below the greedy core are checked (witness, order) but get no share of the negative credit.
    atoms = [atom("k0", "sat", 0), atom("k1", "sat", 1, ["k0"]), atom("k2", "unsat", 3, ["k1"])]
    assert trace_proof_edges(atoms, 4, False) == Trace(core=("k2",), edge_steps=(3,))


def test_unknown_atom_outside_the_greedy_core_does_not_abstain():
    # The first unsat atom decides the failure; an unknown atom after it in dependency order is not in the core.
    atoms = [atom("a", "sat", 0), atom("b", "unsat", 1, ["a"]), atom("c", "unknown", None, ["b"])]
    assert trace_proof_edges(atoms, 3, False) == Trace(core=("b",), edge_steps=(1,))
    assert trace_proof_edges(atoms, 3, False, failure_core="all_unsat").abstain == "unknown"


def test_malformed_atoms_raise():
    for bad, match in [
        ({"status": "sat"}, "no name"),
        (atom("k", "maybe", 1), "status"),
        (atom("k", "sat", 1.0), "witness_step"),
        (atom("k", "sat", True), "witness_step"),
        ({"name": "k", "status": "sat", "witness_step": 1, "depends_on": "k0"}, "depends_on"),
    ]:
        with pytest.raises(ValueError, match=match):
            trace_proof_edges([bad], 4, True)


def test_bad_arguments_are_rejected():
    group = spec_group()
    with pytest.raises(ValueError, match="scale"):
        group_credit("vict", group, scale_rewards="batch")
    with pytest.raises(ValueError, match="failure_core"):
        group_credit("vict", group, failure_core="all")
    for share in (-0.1, 1.5, float("nan")):
        with pytest.raises(ValueError, match="edge_share"):
            group_credit("vict", group, edge_share=share)
    with pytest.raises(ValueError, match="eps"):
        group_credit("vict", group, eps=0.0)
    with pytest.raises(ValueError, match="non-finite"):
        group_credit("vict", group_of(episode(2, float("nan"), True, None)))
    with pytest.raises(ValueError, match="edge steps"):
        redistribute(1.0, 3, [3])


# ---------------------------------------------------------------- (c) invariants


def random_group(rng, size=6, with_invalid=True):
    """Random trajectories with random atoms: some traced, some abstaining for various reasons."""
    trajectories = []
    for _ in range(size):
        num_steps = rng.randint(1, 6)
        success = rng.random() < 0.5
        names = [f"k{j}" for j in range(rng.randint(0, 4))]
        atoms = []
        for j, name in enumerate(names):
            status = "sat" if success or rng.random() < 0.5 else rng.choice(["unsat", "unsat", "unknown"])
            witness = rng.choice([None, *range(num_steps + 1)]) if rng.random() < 0.3 else min(j, num_steps - 1)
            atoms.append(atom(name, status, witness, names[j - 1 : j]))
        invalid = {t for t in range(num_steps) if with_invalid and rng.random() < 0.2}
        reward = (1.0 if success else 0.0) + rng.choice([0.0, 0.5])
        trajectories.append(episode(num_steps, reward, success, atoms or None, invalid))
    return group_of(*trajectories)


@pytest.mark.parametrize("scale", ["group", "none"])
@pytest.mark.parametrize("edge_share", [1.0, 0.3])
def test_sums_match_grpo_broadcast(scale, edge_share):
    # Σ_t A_{i,t} = T_i·A_i − λ·#invalid_i = GRPO's row sum, per trajectory, whether traced or not; so the group total
    # is unchanged too. Rewards (the terminal reward included) are not touched.
    rng = random.Random(0)
    traced = 0
    for _ in range(50):
        group = random_group(rng)
        before = copy.deepcopy(group)
        advantages, stats = vict_with_stats(group, scale_rewards=scale, edge_share=edge_share, invalid_action_penalty=0.1)
        broadcast = group_credit("grpo", group, scale_rewards=scale, invalid_action_penalty=0.1)
        for row, reference in zip(advantages, broadcast, strict=True):
            assert sum(row) == pytest.approx(sum(reference), abs=1e-9)
        assert sum(map(sum, advantages)) == pytest.approx(sum(map(sum, broadcast)), abs=1e-9)
        assert group == before
        traced += stats["trajectories"] - stats["abstained"]
    assert traced > 20  # the property was checked on redistributed trajectories, not only on broadcasts


def test_mean_over_steps_is_the_episode_advantage():
    # Without invalid steps, the mean of A_{i,t} over t is A_i (GRPO's value on every step).
    rng = random.Random(1)
    for _ in range(20):
        group = random_group(rng, with_invalid=False)
        for row, reference in zip(group_credit("vict", group), group_credit("grpo", group), strict=True):
            assert sum(row) / len(row) == pytest.approx(reference[0], abs=1e-9)


def test_no_atoms_or_zero_share_is_exactly_grpo():
    rng = random.Random(2)
    for _ in range(10):
        group = random_group(rng)
        assert group_credit("vict", group, edge_share=0.0) == group_credit("grpo", group)
        for traj in group.trajectories:
            traj.steps[-1].signals.pop("verifier_atoms", None)
        assert group_credit("vict", group) == group_credit("grpo", group)


def test_traced_credit_lands_only_on_edge_steps():
    rng = random.Random(3)
    for _ in range(30):
        group = random_group(rng, with_invalid=False)
        advantages = group_credit("vict", group, scale_rewards="none")
        for traj, row in zip(group.trajectories, advantages, strict=True):
            trace = trace_proof_edges(traj.steps[-1].signals.get("verifier_atoms"), len(traj.steps), traj.success)
            if trace.abstain is None:
                assert all(a == 0.0 for t, a in enumerate(row) if t not in trace.edge_steps)


# ---------------------------------------------------------------- (d) structural properties


@pytest.mark.parametrize("failure_core", ["greedy", "all_unsat", "none"])
def test_permuting_trajectories_permutes_advantages(failure_core):
    group = random_group(random.Random(4), size=7)
    order = [3, 0, 6, 5, 1, 4, 2]
    advantages = group_credit("vict", group, failure_core=failure_core)
    permuted = group_credit("vict", group_of(*(group.trajectories[i] for i in order)), failure_core=failure_core)
    assert permuted == [advantages[i] for i in order]


def test_all_equal_rewards_give_zero_except_the_penalty():
    # Every A_i is 0, so redistribution moves nothing; only invalid steps carry −λ.
    atoms = [atom("k1", "sat", 0), atom("k2", "sat", 1, ["k1"])]
    group = group_of(episode(2, 1.0, True, atoms), episode(3, 1.0, True, atoms, invalid={2}))
    assert group_credit("vict", group) == [[0.0, 0.0], [0.0, 0.0, -0.1]]


def test_singleton_empty_and_zero_step_groups():
    assert group_credit("vict", group_of()) == []
    _, stats = vict_with_stats(group_of())
    assert stats["trajectories"] == 0 and stats["abstention_rate"] == 0.0 and stats["mean_credited_steps"] == 0.0
    assert group_credit("vict", group_of(Trajectory(task={}))) == [[]]
    single = group_credit("vict", group_of(episode(4, 1.0, True, [K1, K2])))
    assert single == [[0.0, 0.0, 0.0, 0.0]] and all_finite(single)  # A = 0 for a group of one
    mixed = group_credit("vict", group_of(Trajectory(task={}), episode(4, 2.0, True, [K1, K2]), episode(4, 0.0, False, None)))
    assert [len(row) for row in mixed] == [0, 4, 4] and all_finite(mixed)


def test_length_one_trajectories():
    # T = 1, E = {0}: A·1/1 = A, the broadcast value.
    group = group_of(episode(1, 1.0, True, [atom("k", "sat", 0)]), episode(1, 0.0, False, [atom("k", "unsat", 0)]))
    assert group_credit("vict", group, scale_rewards="none") == [[0.5], [-0.5]]


def test_all_invalid_actions():
    # Nothing parsed: no atom has a witness -> abstain, broadcast minus λ on every step; returns (0, 0) -> A = 0.
    atoms = [atom("k1", "unsat"), atom("k2", "unsat", None, ["k1"])]
    group = group_of(*(episode(3, 0.0, False, atoms, invalid={0, 1, 2}) for _ in range(3)))
    advantages, stats = vict_with_stats(group)
    assert advantages == [[-0.1, -0.1, -0.1]] * 3 and all_finite(advantages)
    assert stats["abstention_rate"] == 1.0 and stats["abstain/missing_witness"] == 3


def test_registry():
    assert get_estimator("vict").function is vict_advantages


@pytest.mark.parametrize("module", [credit_vict, trainer_vict])
def test_docstring_examples(module):
    result = doctest.testmod(module)
    assert result.failed == 0


# ---------------------------------------------------------------- (e) real verifier atoms


SEARCHQA_KWARGS = {"num_entities": 300}
SEARCHQA_TASK = {"env": "searchqa", "seed": 0, "hops": 2}  # "Who is the mayor of the birthplace of Meshar Vohais?"


def searchqa_plans():
    env = make_env("searchqa", **SEARCHQA_KWARGS)
    env.reset(SEARCHQA_TASK)
    hop1, hop2, gold = env.expert_plan()
    nothing = "search[zzz]"  # matches no document: a valid step that reveals nothing
    return [
        [nothing, hop1, hop2, gold],  # success with a detour: atoms witnessed at 1, 2, 3
        [hop1, hop2, nothing, "answer[Nobody]"],  # evidence found, wrong answer at step 3
        [nothing, hop1, nothing, "answer[Nobody]"],  # hop 2 never retrieved: no witness -> abstain
        [hop2, hop1, nothing, gold],  # hop 2's document before hop 1's: dependency order violated -> abstain
    ]


def test_searchqa_episodes_through_the_engine_credit_the_witness_steps(scripted, tokenizer):
    from trl_agents.rollout import PromptRenderer, RolloutEngine, SamplingParams
    from trl_agents.rollout.engine import EnvPool

    plans = searchqa_plans()
    generator = scripted(lambda prompt, call, row, size: plans[row][call])
    engine = RolloutEngine(
        generator, PromptRenderer(tokenizer), max_turns=4, sampling=SamplingParams(max_new_tokens=16),
        env_pool=EnvPool(env_kwargs=SEARCHQA_KWARGS), signals=("verifier_atoms",),
    )
    batch = engine.run([SEARCHQA_TASK], num_generations=4)
    group = batch.groups[0]
    assert [t.num_steps for t in group.trajectories] == [4, 4, 4, 4]
    assert [t.success for t in group.trajectories] == [True, False, False, True]
    assert all("verifier_atoms" in t.steps[-1].signals for t in group.trajectories)

    traces = [trace_proof_edges(t.steps[-1].signals["verifier_atoms"], 4, t.success) for t in group.trajectories]
    assert traces[0].edge_steps == (1, 2, 3) and traces[0].core[-1] == "answered_correctly"
    assert traces[1] == Trace(core=("answered_correctly",), edge_steps=(3,))
    assert [traces[2].abstain, traces[3].abstain] == ["missing_witness", "order"]

    # R = (1, 0, 0, 1), scale none: A = (0.5, −0.5, −0.5, 0.5).
    # Expert with detour: 0.5·4/3 = 0.6667 on the witness steps 1-3, 0 on the detour; wrong answer: −0.5·4 = −2 on
    # the answer step; the two abstaining episodes keep ±0.5 everywhere.
    expected = [[0.0, 2 / 3, 2 / 3, 2 / 3], [0.0, 0.0, 0.0, -2.0], [-0.5] * 4, [0.5] * 4]
    assert_close(group_credit("vict", group, scale_rewards="none"), expected)
    # The atoms survive the flat row format (JSON in `info`), as in saved trajectories.
    reloaded = RolloutBatch.from_rows(batch.to_rows()).groups[0]
    assert_close(group_credit("vict", reloaded, scale_rewards="none"), expected)


def test_webshop_lite_verify_output_credits_the_witness_steps():
    env = make_env("webshop-lite", num_products=200)

    def play(actions):
        env.reset({"seed": 2})
        for action in actions:
            _, reward, done, info = env.step(action)
        assert done
        steps = [Step(observation="o", action_text=a) for a in actions]
        steps[-1].reward, steps[-1].signals["verifier_atoms"] = reward, [vars(a) for a in env.verify()]
        return Trajectory(task={"seed": 2}, steps=steps, success=info["success"])

    env.reset({"seed": 2})
    search, product, citrus, size, buy = env.expert_plan()
    detour = ["click[description]", "click[< prev]"]
    expert = play([search, product, *detour, citrus, size, buy])  # 7 steps; steps 2-3 witness nothing
    wrong = play([search, product, *detour, "click[lavender]", size, buy])  # wrong scent at step 4
    assert expert.success and not wrong.success
    assert trace_proof_edges(expert.steps[-1].signals["verifier_atoms"], 7, True).edge_steps == (0, 1, 4, 5, 6)
    assert trace_proof_edges(wrong.steps[-1].signals["verifier_atoms"], 7, False) == Trace(
        core=("option:scent",), edge_steps=(4,)
    )
    # Binary-like outcome with scale none on returns (1.0, 0.75): A = ±0.125.
    # Expert: 0.125·7/5 = 0.175 on steps 0, 1, 4, 5, 6. Wrong scent: −0.125·7 = −0.875 on step 4.
    assert_close(
        group_credit("vict", group_of(expert, wrong), scale_rewards="none"),
        [[0.175, 0.175, 0, 0, 0.175, 0.175, 0.175], [0, 0, 0, 0, -0.875, 0, 0]],
    )


# ---------------------------------------------------------------- trainer: config, capabilities, end to end


def make_config(tmp_path, **overrides):
    return tiny_training_config(
        VICTConfig, tmp_path / "out",
        **{"per_device_train_batch_size": 4, "max_completion_length": 16, **overrides},
    )


def test_config_rejects_bad_values(tmp_path):
    with pytest.raises(ValueError, match="edge_share"):
        make_config(tmp_path, edge_share=1.5)
    with pytest.raises(ValueError, match="failure_core"):
        make_config(tmp_path, failure_core="first")
    with pytest.raises(ValueError, match="credit_statistic='trajectories'"):
        make_config(tmp_path, credit_statistic="step_rows")
    with pytest.raises(ValueError, match="advantage_estimator"):
        make_config(tmp_path, advantage_estimator="rloo")


def test_env_without_verify_is_refused_at_start_up(tiny_model, tokenizer, tmp_path):
    with pytest.raises(ValueError, match=r"needs environments with verify.*'frozenlake'.*lacks verify.*searchqa"):
        VICTTrainer(model=tiny_model, args=make_config(tmp_path), train_dataset=[{"env": "frozenlake", "seed": 0}],
                    processing_class=tokenizer)
    assert VICTTrainer.signals == ("verifier_atoms",)


@pytest.mark.slow
def test_two_training_iterations_on_searchqa(tiny_model, tokenizer, scripted, tmp_path):
    # One one-hop task, 4 scripted episodes of 3 turns each (all stay active every turn, so the row index is the
    # episode): success with a detour, wrong answer, hop never retrieved, success after an invalid action.
    env = make_env("searchqa", **SEARCHQA_KWARGS)
    task = {"env": "searchqa", "seed": 1, "hops": 1}
    env.reset(task)
    hop, gold = env.expert_plan()
    plans = [["search[zzz]", hop, gold], [hop, "search[zzz]", "answer[Nobody]"],
             ["search[zzz]", "search[zzz]", "answer[Nobody]"], ["no action here", hop, gold]]
    generator = scripted(lambda prompt, call, row, size: plans[row][call % 3])
    config = make_config(tmp_path, env_kwargs=SEARCHQA_KWARGS)
    trainer = VICTTrainer(model=tiny_model, args=config, train_dataset=[task], processing_class=tokenizer,
                          generator=generator)
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    trainer.train()
    assert trainer.state.global_step == 2
    changed = [n for n, p in trainer.model.named_parameters() if not torch.equal(p.detach(), before[n])]
    assert changed, "no parameter moved"
    logs = [h for h in trainer.state.log_history if "vict/abstention_rate" in h]
    assert len(logs) == 2
    for log in logs:
        assert log["env/success_rate"] == 0.5 and log["env/episode_length"] == 3.0
        # 1 of 4 episodes abstains (hop never retrieved); traced |E|: 2 (steps 1, 2), 1 (answer), 2 (steps 1, 2)
        assert log["vict/abstention_rate"] == 0.25 and log["vict/abstain/missing_witness"] == 0.25
        assert log["vict/mean_credited_steps"] == pytest.approx(5 / 3)
        assert log["vict/credited_step_fraction"] == pytest.approx(5 / 9)
    # The saved rollout carries the redistributed advantages: R = (1, 0, 0, 1), z-score A = ±0.86588.
    files = sorted(glob.glob(os.path.join(config.output_dir, "trajectories", "*.parquet")))
    rows = Dataset.from_parquet(files[0]).sort(["episode_id", "step"])
    expected = [0.0, 1.29882, 1.29882, 0.0, 0.0, -2.59764] + [-0.86588] * 3 + [-0.1, 1.29882, 1.29882]
    assert rows["advantage"] == pytest.approx(expected, abs=TOL)


# ---------------------------------------------------------------- configs (registered locally for the test)


@pytest.fixture
def vict_method():
    from trl_agents.trainers import METHODS

    return METHODS["vict"]  # registered by VICTTrainer's own declaration


VICT_CONFIGS = sorted(glob.glob(os.path.join(CONFIG_DIR, "vict_*.yaml")))


def test_there_are_vict_configs():
    names = {os.path.basename(p) for p in VICT_CONFIGS}
    assert names == {"vict_alfworld.yaml", "vict_webshop.yaml", "vict_searchqa_tiny.yaml"}


@pytest.mark.parametrize("path", VICT_CONFIGS, ids=os.path.basename)
def test_config_parses(path, vict_method):
    import yaml
    from trl import ModelConfig, TrlParser

    from trl_agents.envs import get_env_class
    from trl_agents.run import RunArguments
    from trl_agents.trainers import get_method

    with open(path) as handle:
        method = get_method(yaml.safe_load(handle)["method"])
    assert method is vict_method
    run, config, model = TrlParser((RunArguments, method.config_class, ModelConfig)).parse_args_and_config(
        ["--config", path]
    )
    assert isinstance(config, VICTConfig) and (run.tiny_model or model.model_name_or_path)
    assert "verify" in get_env_class(config.env_name).capabilities()


@pytest.mark.slow
def test_tiny_searchqa_config_runs(vict_method, tmp_path):
    from trl_agents.cli import main

    path = os.path.join(CONFIG_DIR, "vict_searchqa_tiny.yaml")
    main(["train", "--config", path, "--output_dir", str(tmp_path), "--max_steps", "1", "--num_eval_tasks", "4",
          "--disable_tqdm", "true"])
    assert os.path.exists(tmp_path / "eval_results.json")
