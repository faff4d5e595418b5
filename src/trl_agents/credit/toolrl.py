"""Tool-RL collapse fixes: the math of the supervisory signals of "Why Multi-Step Tool-Use RL Collapses and How
Supervisory Signals Fix It" (Hao et al. 2026, arXiv 2606.26027; docs/methods/toolrl.md).

The paper is an analysis: multi-turn tool-use GRPO collapses when the probabilities of a few control tokens (the
tool-call delimiters, end of turn) spike, and supervision with ground-truth (GT) actions stabilises it. The pieces
here are pure functions; the trainer (`trainers/toolrl.py`) and the control-token monitor
(`callbacks/control_tokens.py`) use them. The group composition (OPS, HBG: of the G rollouts of a task, k_gt are
teacher-forced on the GT action of every turn, k_hint sample with a hint in the system prompt, and G − k_gt − k_hint
are ordinary; `group_composition`) and the hint text (`plan_hint`) are the `supervised` topology's
(`rollout/topologies/supervised.py`).

* LUFFY-style shaping of the off-policy (teacher-forced) tokens: f = π_θ / (π_θ + γ), γ = 0.1, and, as the released
  actor (`compute_token_on_off_policy_loss`) does, the pessimistic PPO form max(−A·f, −A·clip(f, 1 − ε_low,
  1 + ε_high)) (`shaped_off_policy_ratio`, `off_policy_token_loss`); on-policy tokens keep the clipped PPO/GRPO loss.
  The released actor's dual clip min(·, −A·c) for A < 0 never binds here: clip(f) ≤ 1 < c.
* The task selection of ETS: the tasks that had at least one zero-reward rollout (`zero_reward_tasks`).

Numerical guards: π_θ = exp(log π_θ) with log π_θ clamped to ≤ 0 (f in [0, 1/(1+γ)], never NaN or inf); γ must be
> 0 (f = 1 for every token at γ = 0 would carry no gradient); masked positions may hold NaN log-probs and give 0
loss.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from ..trajectory import Group, task_id

def shaped_off_policy_ratio(
    logps: torch.Tensor, gamma: float = 0.1, clip: tuple[float, float] | None = None
) -> torch.Tensor:
    """LUFFY's policy shaping of off-policy tokens, f = π_θ / (π_θ + γ), optionally clamped to `clip`.

    The gradient of f w.r.t. log π is γ·π / (π + γ)²: largest at π = γ, so low-probability GT tokens (which a plain
    importance ratio would never reach) still get pushed up, and certain ones (π → 1) stop mattering.

    >>> logps = torch.log(torch.tensor([0.1, 0.4, 0.9]))
    >>> shaped_off_policy_ratio(logps)                       # 0.1/0.2, 0.4/0.5, 0.9/1.0
    tensor([0.5000, 0.8000, 0.9000])
    >>> shaped_off_policy_ratio(logps, clip=(0.8, 1.2))      # the released actor's clamp to [1 − ε, 1 + ε]
    tensor([0.8000, 0.8000, 0.9000])
    """
    if not gamma > 0:
        raise ValueError(f"toolrl_luffy_gamma must be > 0 (LUFFY: 0.1), got {gamma}")
    prob = torch.exp(torch.nan_to_num(logps, nan=0.0).clamp(max=0.0))  # π in (0, 1]; NaN (masked) -> 1
    ratio = prob / (prob + gamma)
    if clip is not None:
        ratio = ratio.clamp(min=clip[0], max=clip[1])
    return ratio


def off_policy_token_loss(
    logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    gamma: float = 0.1,
    clip: tuple[float, float] | None = None,
) -> torch.Tensor:
    """Per-token loss on the off-policy tokens (`mask` 1), 0 elsewhere (same shape as `logps`): −A·f(π_θ) without
    `clip`; with `clip` the released actor's pessimistic max(−A·f, −A·clip(f)). With A > 0 and f below the clip the
    max keeps −A·f, so unlikely ground-truth tokens still get LUFFY's push, ∂loss/∂log π = −A·γπ/(π + γ)²; with
    A < 0 it keeps −A·clip(f) there (no gradient).

    `advantages` is (B,) (one per row) or (B, T). Aggregate it like the policy loss (a token mean in the released
    actor: masked_mean over on- and off-policy tokens together).

    >>> logps = torch.log(torch.tensor([[0.1, 0.4, 0.9]]))
    >>> off_policy_token_loss(logps, torch.tensor([2.0]), torch.tensor([[1, 1, 0]]))   # −2·0.5, −2·0.8, masked
    tensor([[-1.0000, -1.6000,  0.0000]])
    >>> off_policy_token_loss(logps, torch.tensor([2.0]), torch.ones(1, 3), clip=(0.8, 1.2))  # max(−2f, −2·clip(f))
    tensor([[-1.0000, -1.6000, -1.8000]])
    >>> off_policy_token_loss(logps, torch.tensor([-2.0]), torch.ones(1, 3), clip=(0.8, 1.2))  # A < 0: 2·max(f, .8)
    tensor([[1.6000, 1.6000, 1.8000]])
    """
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1).expand_as(logps)
    loss = -advantages * shaped_off_policy_ratio(logps, gamma)  # −A·f
    if clip is not None:
        loss = torch.maximum(loss, -advantages * shaped_off_policy_ratio(logps, gamma, clip))  # max(−A·f, −A·clip(f))
    return torch.where(mask.bool(), loss, torch.zeros_like(loss))


def zero_reward_tasks(groups: Iterable[Group], threshold: float = 0.0) -> dict[str, dict]:
    """ETS's selection: {task id: task row} of the groups with at least one rollout whose return is <= `threshold`
    (the paper: a rollout scored 0). Supervised rollouts (teacher-forced or hinted, `step.info["supervision"]`) and
    failed episodes are not looked at; a group with no ordinary rollout selects nothing.

    >>> from trl_agents.trajectory import Step, Trajectory
    >>> ok = Group({"seed": 1}, [Trajectory({"seed": 1}, [Step("o", "a", reward=1.0)])] * 2)
    >>> bad = Group({"seed": 2}, [Trajectory({"seed": 2}, [Step("o", "a", reward=r)]) for r in (1.0, 0.0)])
    >>> sorted(zero_reward_tasks([ok, bad]).values(), key=str)
    [{'seed': 2}]
    """
    selected = {}
    for group in groups:
        returns = [t.episode_return for t in group.trajectories if not t.failed and not is_supervised(t)]
        if any(r <= threshold for r in returns):
            selected[task_id(group.task)] = dict(group.task)
    return selected


def is_supervised(trajectory) -> bool:
    """Whether an episode was teacher-forced or hinted (its steps carry `info["supervision"]`)."""
    return any(step.info.get("supervision") for step in trajectory.owned_steps)
