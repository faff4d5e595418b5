"""IB-RL advantages: two roles, each with its own reward, its own GRPO advantages and its own action mask.

IB-RL (isolated bilateral RL; Wang, Cai, Hu, Huang, Wang, Li, Lin 2026, arXiv 2608.06735; docs/methods/ib_rl.md).
Two roles (a salesperson and a customer, two negotiators) play G joint dialogues of one scenario, each with its own
policy (its own LoRA adapter). Each role r is scored by its own objective, r^r_i for dialogue i (in a two-role
environment: `info["role_rewards"][r]` on the last step), and is trained only on its own turns:

    m^r_k     = [role(token k) = r]                                    action mask of role r (the other role's turns
                                                                       are context for it, like env observations)
    A^r_i     = (R^r_i − mean_j R^r_j) / (std_j R^r_j + ε)              GRPO over the G dialogues, role r's reward
                                                                       only (std: Bessel; ε = 1e-4 as TRL);
                                                                       "none": A^r_i = R^r_i − mean_j R^r_j
    A_{i,t}   = A^{role(t)}_i − λ·[invalid_{i,t}]                      each step gets its acting role's advantage

No advantage is shared between the roles and no critic is centralised: the two sets of A^r are computed from two
reward vectors that never meet, and the action masks keep each role's loss on its own tokens.

Numerical guards: a group of one dialogue, or a role whose G rewards are all equal (all failed, all agreed on the
same split), gets A^r = 0 exactly (deviations are taken from the first value, so float noise in the mean cannot
leak through a tiny std); the ε keeps a small but nonzero std finite; a role that acted in no turn of a dialogue
gets its A^r nowhere (nothing to mask in); a dialogue without `role_rewards` (cut by the trainer's turn budget before
the environment ended it) scores 0 for every role, as a negotiation without a deal does; an empty group gives [].

Example (the hand case of docs/methods/ib_rl.md: two dialogues, role "a" won the first, role "b" the second):
    >>> from trl_agents.trajectory import Group, Step, Trajectory
    >>> def dialogue(r_a, r_b):
    ...     roles = ["a", "a", "b", "b", "a"]
    ...     steps = [Step("o", "x", info={"role": role}) for role in roles]
    ...     steps[-1].info["role_rewards"] = {"a": r_a, "b": r_b}
    ...     return Trajectory(task={}, steps=steps)
    >>> group = Group(task={}, trajectories=[dialogue(1.0, 0.0), dialogue(0.0, 1.0)])
    >>> role_masks(["a", "a", "b", "b", "a"], ("a", "b"))
    {'a': [1, 1, 0, 0, 1], 'b': [0, 0, 1, 1, 0]}
    >>> (values,), stats = ib_rl_advantages([group], IBRLParams(ib_rl_roles=("a", "b"), eps=0.0))
    >>> [[round(v, 4) for v in row] for row in values]  # A^a = [+0.7071, −0.7071], A^b = [−0.7071, +0.7071]
    [[0.7071, 0.7071, -0.7071, -0.7071, 0.7071], [-0.7071, -0.7071, 0.7071, 0.7071, -0.7071]]
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..trajectory import Group, Step, Trajectory
from .base import CreditParams, StepAdvantages, Stats, check_choice, check_group, register_estimator, runtime_field

ROLE_KEY = "role"  # step.info key of the acting role (envs.base.INFO_ROLE)
ROLE_REWARDS_KEY = "role_rewards"  # last step's info: role -> reward (envs.base.INFO_ROLE_REWARDS)
SCALES = ("group", "none")
IB_RL_STATS = ("reward_mean", "advantage_std", "zero_std", "turns")  # per role r: "{r}/<name>"


def role_masks(token_roles: Sequence[str], roles: Sequence[str]) -> dict[str, list[int]]:
    """The action mask of each role over a sequence of tokens labelled with the role that wrote them.

    >>> role_masks(["A", "A", "B", "B", "A"], ("A", "B"))
    {'A': [1, 1, 0, 0, 1], 'B': [0, 0, 1, 1, 0]}

    Raises:
        ValueError: for a token whose role is not one of `roles`.
    """
    unknown = sorted({r for r in token_roles if r not in roles})
    if unknown:
        raise ValueError(f"tokens labelled with roles {unknown} that are not among {list(roles)}")
    return {role: [int(r == role) for r in token_roles] for role in roles}


def group_advantages(rewards: Sequence[float], *, scale: str = "group", eps: float = 1e-4) -> list[float]:
    """GRPO advantages of one role over the G dialogues of a scenario (0 for G < 2 or equal rewards).

    >>> [round(a, 4) for a in group_advantages([1.0, 0.0], eps=0.0)]  # mean 0.5, std 0.7071: ±0.5 / 0.7071
    [0.7071, -0.7071]
    >>> group_advantages([0.3, 0.3, 0.3]), group_advantages([1.0])
    ([0.0, 0.0, 0.0], [0.0])
    """
    check_choice("scale", scale, SCALES)
    if not (math.isfinite(eps) and eps >= 0):
        raise ValueError(f"eps must be a finite number >= 0, got {eps}")
    n = len(rewards)
    if n < 2:
        return [0.0] * n
    deviations = [float(r) - float(rewards[0]) for r in rewards]  # exact zeros when all rewards are equal
    if all(d == 0.0 for d in deviations):
        return [0.0] * n
    mean = sum(deviations) / n
    centred = [d - mean for d in deviations]  # R_i − mean_j R_j
    if scale == "none":
        return centred
    std = math.sqrt(sum(c * c for c in centred) / (n - 1))  # Bessel, as TRL
    return [c / (std + eps) for c in centred]  # A = (R − μ) / (σ + ε)


def step_role(step: Step) -> str:
    """The role that took `step` (`step.info["role"]`; "" when the environment does not say)."""
    return str(step.info.get(ROLE_KEY, ""))


def dialogue_rewards(trajectory: Trajectory, roles: Sequence[str]) -> dict[str, float]:
    """Each role's reward for one dialogue: `role_rewards` of its last step; 0 for every role without them (a
    dialogue the turn budget cut before the environment ended it)."""
    found: Mapping[str, float] = {}
    for step in reversed(trajectory.steps):
        if ROLE_REWARDS_KEY in step.info:
            found = step.info[ROLE_REWARDS_KEY] or {}
            break
    rewards = {}
    for role in roles:
        value = float(found.get(role, 0.0))
        if not math.isfinite(value):
            raise ValueError(f"role {role!r} has a non-finite reward {value} in episode {trajectory.episode_id}")
        rewards[role] = value
    return rewards


def infer_roles(group: Group) -> tuple[str, ...]:
    """The roles that act in `group`, in order of first appearance."""
    return tuple(dict.fromkeys(step_role(s) for t in group.trajectories for s in t.steps if step_role(s)))


@dataclass(frozen=True, kw_only=True)
class IBRLParams(CreditParams):
    """Settings of `ib_rl_advantages` (config fields of `IBRLConfig`).

    Attributes:
        ib_rl_roles: The roles (None: those acting in each group, in order of first appearance).
        scale_rewards: "group": z-scored (GRPO); "none": centred only (Dr. GRPO).
        invalid_action_penalty: λ, subtracted on the steps the environment rejected (of whichever role; default 0
            here).
        eps: ε added to the std (TRL: 1e-4); not a config field.
    """

    invalid_action_penalty: float = 0.0
    ib_rl_roles: Sequence[str] | None = None
    scale_rewards: str = "group"
    eps: float = runtime_field(1e-4)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_choice("scale", self.scale_rewards, SCALES)
        if not (math.isfinite(self.eps) and self.eps >= 0):
            raise ValueError(f"eps must be a finite number >= 0, got {self.eps}")


@register_estimator("ib_rl", IBRLParams)
def ib_rl_advantages(groups: Sequence[Group], params: IBRLParams) -> tuple[list[StepAdvantages], Stats]:
    """Per-role GRPO advantages over the dialogues of each scenario; each step gets its acting role's value.

    Args:
        groups: The healthy dialogues of each scenario (independent episodes; trees are not supported).
        params: `IBRLParams`.

    Returns:
        (advantages, stats): per group, one value per step of each dialogue; stats per role r, per group then
        averaged over the groups (that have role r): `{r}/reward_mean` (mean R^r), `{r}/advantage_std` (std of A^r
        over the dialogues, population), `{r}/zero_std` (1 when role r's rewards carry no signal), `{r}/turns`
        (steps taken by r, summed over the dialogues).

    Raises:
        ValueError: for a step without a role, or with a role not in `ib_rl_roles`; a tree group.
    """
    roles = params.ib_rl_roles or ()
    advantages: list[StepAdvantages] = []
    stats: Stats = {f"{r}/{k}": (0.0, 0) for r in roles for k in IB_RL_STATS}  # the same names on every process
    for group in groups:
        values, group_stats = _ib_rl_group(group, params)
        advantages.append(values)
        for name, value in group_stats.items():
            total, count = stats.get(name, (0.0, 0))
            stats[name] = (total + value, count + 1)
    return advantages, stats


def _ib_rl_group(group: Group, params: IBRLParams) -> tuple[StepAdvantages, dict[str, float]]:
    """IB-RL on one group: its advantages and its per-role diagnostics."""
    check_group(group)
    roles, scale, eps = params.ib_rl_roles, params.scale_rewards, params.eps
    invalid_penalty = params.invalid_action_penalty
    if group.is_tree:
        raise ValueError("IB-RL scores independent joint dialogues; a tree group (forked episodes) is not supported")
    roles = tuple(roles) if roles is not None else infer_roles(group)
    trajectories = group.trajectories
    rewards = [dialogue_rewards(t, roles) for t in trajectories]
    per_role = {r: group_advantages([w[r] for w in rewards], scale=scale, eps=eps) for r in roles}
    values: StepAdvantages = []
    turns = dict.fromkeys(roles, 0)
    for i, trajectory in enumerate(trajectories):
        row = []
        for step in trajectory.steps:
            role = step_role(step)
            if role not in per_role:
                raise ValueError(
                    f"a step of episode {trajectory.episode_id} was taken by role {role!r}, not one of {list(roles)}: "
                    "IB-RL needs environments that name the acting role in info['role'] (capability 'roles')"
                )
            turns[role] += 1
            value = per_role[role][i]  # A^{role(t)}_i
            row.append(value - invalid_penalty if not step.valid else value)
        values.append(row)
    stats: dict[str, float] = {}
    n = len(trajectories)
    for r in roles:
        column = [w[r] for w in rewards]
        adv = per_role[r]
        mean_adv = sum(adv) / n if n else 0.0
        stats[f"{r}/reward_mean"] = sum(column) / n if n else 0.0
        stats[f"{r}/advantage_std"] = math.sqrt(sum((a - mean_adv) ** 2 for a in adv) / n) if n else 0.0
        stats[f"{r}/zero_std"] = float(n > 0 and all(c == column[0] for c in column))
        stats[f"{r}/turns"] = float(turns[r])
    return values, stats
