"""3SPO advantages: a step reward from historical state scores, centred among the steps taken from the same state.

3SPO (State-Score-Supervised Policy Optimization, arXiv 2606.09961), with the formulas of the README and
`gigpo/core_3spo.py` of `genalyu/3SPO` (docs/methods/3spo.md#equations), in a TRL port without environment
branching (the "siblings" of a step are the steps of the group's G independent episodes taken from the same state):

    h(s)       = state identity (`step.state_key`, or the observation text when the env has none)
    N(s), N⁺(s)  visits of s by finished episodes, and by successful ones (each state counted once per episode);
    t          = 1 + number of finished episodes counted          (the persistent `StateScoreTable`)
    SR(s)      = N⁺(s) / (N(s) + ε)                                ε = 1e-6
    λ(t)       = α·log t                                            α = 50
    S(s)       = exp(−λ(t)·SR(s)) · 1{N(s) − N⁺(s) < ξ  ∨  SR(s) > ζ};  S(s) = 1 if N(s) = 0      Eq. 1 (ξ=10, ζ=0.1)
    ω(s)       = 0.5·exp(−ω_k·N(s))                                 ω_k = 0.1
    R_{i,t}    = ω(s_t)·1[h(s_t) ≠ h(s_{t+1})] + (0.5 − ω(s_t))·(S(s_t) − S(s_{t+1})) + 0.5·R_success(s_{t+1})   Eq. 2
    ρ_{i,t}    = R_{i,t} − λ_inv·[invalid]                           invalid-action penalty (verl-agent, 0.1)
    A_{i,t}    = (ρ_{i,t} − μ_c)/F  over the steps c of the group with the same h(s_t) (GiGPO `step_norm_reward`,
                 F = 1: `remove_std=True`, the code default; F = σ_c + ε otherwise); a singleton gives 0
    A_{i,t}   += w_E·A^E_i  optional episode-level GRPO term (the code uses R_3SPO only: w_E = 0)

The table (`StateScoreTable`: N, N⁺, t, S(s), ω(s)), R_3SPO of one transition (`transition_reward`) and the state
identities (`state_identity`, `next_state`) are shared with the `state_score` topology and live there
(`rollout/topologies/state_score.py`); this file holds the credit. Scores are read from the table as it stood before
this batch; the trainer updates it with the batch afterwards. Eq. 3, the adaptive number of rollouts

    n(s)       = ceil(G_max·S(s))        0: truncate; 1: continue; ≥ 2: branch n siblings from s     (`allocated_rollouts`)

drives the `state_score` topology (`rollout/topologies/state_score.py`: ranked backtracking over trees of forked
episodes). On trees (forked episodes share their prefix `Step` objects) every distinct step is one sibling of its
state, counted once, and its advantage goes to the trajectory that owns it (0 on the other paths through it), so the
rows' sum over paths trains it with exactly its A (docs/topologies.md, "How rows train shared steps").

The state after an episode's last action, s_{t+1}, is looked up in the table like any other state, as the 3SPO code
does (`compute_3spo_step_reward` scores the next anchor observation from its global table): its key is the
`state_key` signal's `after` value (the trainer records it: `env.state_key()` after every step), or, for an
environment without state keys, the observation the action returned (h(s) is the observation text there). Only
where neither is recorded (groups built by hand, records from an older run) does it fall back to a state of the
group that an episode acted from with that observation, and otherwise to R_novel = 1[valid] and S(s_{t+1}) := S(s_t)
(`terminal_score="current"`) or 1 (`"unseen"`).

Guards: an unseen state scores 1 and ω = 0.5 (no division by a zero count: SR has ε); a state alone in its sibling
set (a singleton) gets A = 0; an empty group gives empty lists; `mean_std_norm` divides by σ + ε (all-equal
siblings: 0, never NaN); the score's exp(−λ·SR) underflows to 0.0, never to NaN or inf.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from ..rollout.topologies.state_score import TERMINAL_SCORES, StateScoreTable, next_state, state_identity
from ..trajectory import Group
from .base import (CreditParams, Stats, StepAdvantages, check_choice, check_group, check_positive, episode_advantages,
                   group_totals, mean_std, normalize, register_estimator, runtime_field)

MODES = ("mean_norm", "mean_std_norm")
SSPO_STATS = ("mean_step_reward", "mean_state_score", "low_score_fraction", "novel_fraction", "singleton_fraction")


def observation_states(group: Group) -> dict[str, Hashable]:
    """Observation -> h(s) of every state an episode of `group` acted from (the first recorded): how the state
    after a last action is recognised from its `next_observation`."""
    index: dict[str, Hashable] = {}
    for trajectory in group.trajectories:
        for step in trajectory.steps:
            index.setdefault(step.observation, state_identity(step))
    return index


@dataclass(frozen=True, kw_only=True)
class SSPOParams(CreditParams):
    """Settings of `sspo_advantages` (config fields of `SSPOConfig`).

    Attributes:
        sspo_mode: "mean_norm" (A = ρ − μ_c; 3SPO `remove_std=True`, its default) or "mean_std_norm" (/(σ_c + ε)).
        episode_advantage_w: w_E, weight of an added episode-level GRPO advantage over the n returns, normalised like
            `sspo_mode` (0: the 3SPO code, R_3SPO only; an option for a port without branching,
            docs/methods/3spo.md#our-choices).
        invalid_action_penalty: λ, subtracted from the step reward of invalid steps before centring (verl-agent 0.1).
        state_scores: Run-time input: the state statistics before this batch (the trainer's `StateScoreTable`; read,
            never changed); None: an empty table, every state unseen.
        terminal_score: Only for trajectories that recorded neither the `state_key` signal nor (without state keys)
            the next observation: S of the unknown state after an episode's last action, "current" (S(s_t), no
            score change) or "unseen" (1). Not a config field.
        eps: ε of `mean_std_norm` (3SPO / GiGPO: 1e-6); not a config field.
    """

    sspo_mode: str = "mean_norm"
    episode_advantage_w: float = 0.0
    state_scores: StateScoreTable | None = runtime_field(compare=False, repr=False)
    terminal_score: str = runtime_field("current")
    eps: float = runtime_field(1e-6)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_choice("mode", self.sspo_mode, MODES)
        check_choice("terminal_score", self.terminal_score, TERMINAL_SCORES)
        if not math.isfinite(self.episode_advantage_w):
            raise ValueError(f"episode_weight must be finite, got {self.episode_advantage_w}")
        check_positive("eps", self.eps)


@register_estimator("3spo", SSPOParams)
def sspo_advantages(groups: Sequence[Group], params: SSPOParams) -> tuple[list[StepAdvantages], Stats]:
    """3SPO advantages of every step of every group, plus diagnostics. Reads the table, never changes it.

    Returns:
        (advantages, stats): per group, one list per trajectory with one advantage per step; stats over the groups
        with steps: "mean_step_reward" (mean R_3SPO), "mean_state_score" (mean S(s_t) over steps),
        "low_score_fraction" (steps with S(s_t) < 0.01), "novel_fraction" (steps with R_novel = 1),
        "singleton_fraction" (same-state groups with one step: their A is 0 before w_E).

    Example (empty table: every S = 1, ω = 0.5, so R = 0.5·R_novel + 0.5·R_success; all four steps act from s0):
        >>> from trl_agents.trajectory import Group, Step, Trajectory
        >>> won = Trajectory(task={}, steps=[Step("s0", "right")], success=True)
        >>> lost = Trajectory(task={}, steps=[Step("s0", "jump", valid=False)])
        >>> sspo_advantages([Group(task={}, trajectories=[won, lost])], SSPOParams(invalid_action_penalty=0.0))[0]
        [[[0.5], [-0.5]]]
    """
    table = params.state_scores if params.state_scores is not None else StateScoreTable()
    advantages, with_steps = [], []
    for group in groups:
        group_advantages, group_stats = _sspo_group(group, table, params)
        advantages.append(group_advantages)
        if any(traj.steps for traj in group.trajectories):
            with_steps.append(group_stats)
    return advantages, group_totals(with_steps, SSPO_STATS)


def sspo_step_rewards(
    group: Group, table: StateScoreTable, terminal_score: str = "current"
) -> tuple[list[list[float]], dict[str, float]]:
    """R_3SPO(s_t, s_{t+1}) of every step (Eq. 2), from the table's current scores, plus the inputs' averages.
    s_{t+1} after an episode's last action: `next_state`; `terminal_score` applies only where it is not recorded
    (see the module docstring)."""
    check_choice("terminal_score", terminal_score, TERMINAL_SCORES)
    task_id = group.task_id
    looked_up: dict[Hashable, tuple[float, float]] = {}  # h(s) -> (S(s), ω(s)), once per distinct state
    observed = observation_states(group)
    rewards, scores, novel = [], [], []
    for traj in group.trajectories:
        states = [state_identity(step) for step in traj.steps]
        for state in states:
            try:
                if state not in looked_up:
                    key = table.key(state, task_id)
                    looked_up[state] = (table.score_of_key(key), table.omega_of_key(key))
            except TypeError as err:
                raise ValueError(f"3SPO state keys must be hashable: {err}") from None
        current = [looked_up[s][0] for s in states]  # S(s_t)
        row = []
        for t, (step, state) in enumerate(zip(traj.steps, states, strict=True)):
            omega = looked_up[state][1]
            if t < len(states) - 1:
                is_novel, next_score, success = float(states[t + 1] != state), current[t + 1], 0.0
            else:
                success = float(traj.success)
                known = next_state(step, observed)
                if known is not None:  # s_{t+1} looked up in the table, as any state
                    is_novel, next_score = float(known != state), table.score(known, task_id)
                else:  # nothing recorded: novel unless the action was invalid; S(s_{t+1}) := S(s_t) or 1
                    next_score = current[t] if terminal_score == "current" else 1.0
                    is_novel = float(step.valid)
            row.append(omega * is_novel + (0.5 - omega) * (current[t] - next_score) + 0.5 * success)
            novel.append(is_novel)
        rewards.append(row)
        scores += current
    stats = {
        "mean_state_score": sum(scores) / len(scores) if scores else 0.0,
        "low_score_fraction": sum(s < 0.01 for s in scores) / len(scores) if scores else 0.0,
        "novel_fraction": sum(novel) / len(novel) if novel else 0.0,
    }
    return rewards, stats


def _sspo_group(group: Group, table: StateScoreTable, params: SSPOParams) -> tuple[StepAdvantages, dict[str, float]]:
    """3SPO on one group: its advantages and its diagnostics (zeros for a group without steps)."""
    check_group(group)
    scale = params.sspo_mode == "mean_std_norm"
    invalid_penalty, episode_weight, eps = params.invalid_action_penalty, params.episode_advantage_w, params.eps

    # Eq. 2, then ρ = R − λ·[invalid]; every distinct step once (a tree's shared steps: in their first, owning,
    # trajectory; the other paths through them get 0, so the rows' sum over paths trains them with their A).
    rewards, stats = sspo_step_rewards(group, table, params.terminal_score)
    flat, states, position = [], [], {}  # position: (trajectory, step) -> index into flat, distinct steps only
    seen: set[int] = set()
    for i, (traj, row) in enumerate(zip(group.trajectories, rewards, strict=True)):
        for t, (step, reward) in enumerate(zip(traj.steps, row, strict=True)):
            if id(step) in seen:
                continue
            seen.add(id(step))
            position[i, t] = len(flat)
            flat.append(reward - invalid_penalty if not step.valid else reward)
            states.append(state_identity(step))

    # Siblings: the steps of the group taken from the same state; A = (ρ − μ_c)/F, a singleton gets 0.
    siblings: dict[Hashable, list[int]] = {}
    for index, state in enumerate(states):
        siblings.setdefault(state, []).append(index)
    step_advantages = [0.0] * len(flat)
    singletons = 0
    for rows in siblings.values():
        if len(rows) == 1:
            singletons += 1
            continue
        values = [flat[r] for r in rows]
        mean, std = mean_std(values)
        for r, a in zip(rows, normalize(values, mean, std, scale=scale, eps=eps), strict=True):
            step_advantages[r] = a

    # Optional episode-level term w_E·A^E (λ already enters through ρ, so none here).
    episode = (
        episode_advantages(group, scale=scale, statistic="trajectories", invalid_penalty=0.0, eps=eps)
        if episode_weight
        else [[0.0] * len(traj.steps) for traj in group.trajectories]
    )
    advantages: StepAdvantages = []
    for i, episode_row in enumerate(episode):
        advantages.append([
            episode_weight * a_e + (step_advantages[position[i, t]] if (i, t) in position else 0.0)
            for t, a_e in enumerate(episode_row)
        ])

    stats = {
        "mean_step_reward": sum(r for row in rewards for r in row) / len(flat) if flat else 0.0,
        **stats,
        "singleton_fraction": singletons / len(siblings) if siblings else 0.0,
    }
    return advantages, stats
