"""APPO: agentic procedural policy optimization (Wang et al. 2026, arXiv 2606.12384; docs/methods/appo.md).

The changes w.r.t. `AgentGRPOTrainer`:

* the `token_branching` topology: `num_generations` initial rollouts per task (n_init), then branches at their
  best tokens (branching score z(H)·z(Ω), falling back to z(H) when Ω says nothing) up to `appo_rollouts_per_task`
  episodes per task (n); a branch continues the rollout's own action tokens [0..t] with a fresh sample (the engine's
  token-prefix fork) and plays to the end;
* `compute_advantages`: the dual-group credit of the released code — an initial rollout's rewards are scaled on
  their tokens by M = 1 + (BS/BS_max)·0.9^{t_split − t} (averaged over its branches; BS_max the batch's largest split
  score), then returns are z-scored (population σ) inside the initial group and inside the branch group of the task;
  branches train nothing (advantage 0); an initial rollout's tokens up to a split point get A_o + the mean of its
  branches' advantages (math in `trl_agents/credit/appo.py`);
* `loss_advantages` (the future-KL scaling of the loss): Ã_t = A_t·(1 + b·f_t), f_t = clip(exp(FutureKL_t), 1, 1.2),
  from the per-token log-ratio between the policy being optimised and the rollout's old (or sampling) log-probs; a
  row with more than one dual-clipped negative-advantage token is dropped, and TRL's `delta` (two-sided clipping,
  = the dual clip for negative advantages) defaults to the dual-clip constant c = 3.

What the future-KL factor sees: with one optimizer pass per rollout (`num_iterations=1`, aligned batches) and no
sampler correction, TRL's old log-probs are the current ones, Δ ≡ 0 and f ≡ 1 (Ã = (1 + b)·A, a constant factor);
with `num_iterations > 1`, Δ is the drift since the rollout; with a vLLM generator and
`appo_future_kl_reference="sampler"`, Δ is the trainer-vs-engine log-ratio of the sampled tokens.

Example:
    ```python
    from datasets import Dataset
    from trl_agents.envs import get_env_class
    from trl_agents.trainers.appo import APPOConfig, APPOTrainer

    tasks = Dataset.from_list(get_env_class("searchqa").task_split("train", 512))
    config = APPOConfig(output_dir="searchqa-appo", max_turns=4, num_generations=8, appo_rollouts_per_task=16)
    APPOTrainer(model="Qwen/Qwen2.5-7B-Instruct", args=config, train_dataset=tasks).train()
    ```
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from ..credit.appo import decay_gamma, future_kl_advantages
from ..names import check_choice
from ..rollout.topologies import Topology
from ..rollout.topologies.appo import TOKEN_BRANCH_SCORES, punctuation_filter
from ..trajectory import Group
from .agent_grpo import AgentGRPOConfig, AgentGRPOTrainer
from ..training.batch import loss_mask
from .registry import MethodInfo

FUTURE_KL_REFERENCES = ("old", "sampler")


@dataclass
class APPOConfig(AgentGRPOConfig):
    r"""
    Configuration of [`APPOTrainer`]: every [`AgentGRPOConfig`] field plus APPO's. `num_generations` is n_init, the
    initial rollouts per task; `appo_rollouts_per_task` is n, the episodes per task in all.

    Args:
        appo_rollouts_per_task (`int`, *optional*, defaults to `16`): n (initial rollouts + branches + fill-ups).
        appo_branch_score (`str`, *optional*, defaults to `"bs"`): `"bs"` or `"entropy"` (ablation).
        appo_branch_gamma (`float`, *optional*, defaults to `1.0`): γ of Ω's future sum (branching).
        appo_future_decay_rate (`float`, *optional*, defaults to `64.0`): γ = 2^(−1/rate) of FutureKL (loss).
        appo_future_value_clip (`float`, *optional*, defaults to `0.2`): ε of Ω's clip.
        appo_omega_tolerance (`float`, *optional*, defaults to `1e-4`): Ω spread below which it says nothing.
        appo_fill_budget (`bool`, *optional*, defaults to `True`): Unused budget becomes new initial rollouts.
        appo_prefix_decay (`float`, *optional*, defaults to `0.9`): Decay of the reward scale M.
        appo_std_eps (`float`, *optional*, defaults to `1e-6`): ε of the dual-group z-scores.
        appo_future_kl (`bool`, *optional*, defaults to `True`): The future-KL scaling of the loss.
        appo_future_kl_weight (`float`, *optional*, defaults to `1.0`): b.
        appo_future_kl_clip (`float`, *optional*, defaults to `0.2`): ε_f of f's clip.
        appo_future_kl_high_only (`bool`, *optional*, defaults to `True`): f never below 1.
        appo_dual_clip (`float`, *optional*, defaults to `3.0`): c.
        appo_safety_ratio (`float`, *optional*, defaults to `4.0`): Ratio above which a negative token's f ≤ 1.
        appo_future_kl_reference (`str`, *optional*, defaults to `"old"`): Δ against TRL's old or the sampling
            log-probs.
        topology (`str`, *optional*, defaults to `"token_branching"`).
    """

    appo_rollouts_per_task: int = field(
        default=16,
        metadata={"help": "n, episodes per task in all: the num_generations initial rollouts (n_init, APPO: 8) plus "
        "the branches forked from them (plus fill-ups, appo_fill_budget). APPO: rollout.n = 16 with 8 initial."},
    )
    appo_branch_score: str = field(
        default="bs",
        metadata={"help": "How split tokens are ranked: 'bs' (z(H)·z(Ω), falling back to z(H) where Ω says nothing: "
        "an on-policy sampler, missing log-probs) or 'entropy' (z(H) always: the paper's BS→entropy ablation)."},
    )
    appo_branch_gamma: float = field(
        default=1.0,
        metadata={"help": "γ in (0, 1] of the future value's sum Ω_t = exp(Σ_{j≥t} γ^(j−t)·Δ_j) that ranks split "
        "points. APPO's released branching passes its algorithm.gamma, 1.0 in every launcher."},
    )
    appo_future_decay_rate: float = field(
        default=64.0,
        metadata={"help": "γ = 2^(−1/rate) of FutureKL's sum in the loss scaling; APPO: decay_rate 64."},
    )
    appo_future_value_clip: float = field(
        default=0.2, metadata={"help": "ε of the future value's clip to [1 − ε, 1 + ε] (APPO: the PPO ε, 0.2)."}
    )
    appo_omega_tolerance: float = field(
        default=1e-4,
        metadata={"help": "Ω whose spread over a rollout (population std) is below this is treated as constant and "
        "the score falls back to z(H). Our choice (docs/methods/appo.md): the paper only says it falls back when Ω "
        "is unavailable; a sampler with the current weights gives Ω = 1 up to float noise."},
    )
    appo_fill_budget: bool = field(
        default=True,
        metadata={"help": "Launch the budget that no eligible split point takes as new initial rollouts of the task "
        "(they join the initial group). Our choice (docs/methods/appo.md), after the ARPO/APPO rollout code's "
        "global resampling when branching cannot fill the budget."},
    )
    appo_prefix_decay: float = field(
        default=0.9,
        metadata={"help": "Decay of the reward scale M_t = 1 + (BS/BS_max)·decay^(t_split − t) on an initial "
        "rollout's rewards at or before a split point (APPO: reward_scale_discount 0.9)."},
    )
    appo_std_eps: float = field(
        default=1e-6,
        metadata={"help": "ε of the dual-group z-scores (R − μ)/(σ + ε), σ the population std (APPO's "
        "compute_appo_advantage). A group of one, or of equal returns, gets 0, as in the released code."},
    )
    appo_future_kl: bool = field(
        default=True,
        metadata={"help": "Scale the per-token advantages in the loss by 1 + b·f_t (APPO's loss_mode=future_kl)."},
    )
    appo_future_kl_weight: float = field(
        default=1.0, metadata={"help": "b in Ã_t = A_t·(1 + b·f_t) (APPO: future_kl_weight = 1.0)."}
    )
    appo_future_kl_clip: float = field(
        default=0.2, metadata={"help": "ε_f: f_t = clip(exp(FutureKL_t), 1 or 1 − ε_f, 1 + ε_f) (APPO: 0.2)."}
    )
    appo_future_kl_high_only: bool = field(
        default=True, metadata={"help": "f_t is clipped to [1, 1 + ε_f] (never below 1); APPO's scripts set it."}
    )
    appo_dual_clip: float = field(
        default=3.0,
        metadata={"help": "c: tokens with Δlogp > log c take no part in FutureKL; a row with more than one token with "
        "A < 0 and ratio > c is dropped from the loss; TRL's `delta` defaults to c (the dual clip of negative "
        "advantages). APPO: clip_ratio_c = 3."},
    )
    appo_safety_ratio: float = field(
        default=4.0,
        metadata={"help": "Negative-advantage tokens whose ratio exceeds this get f clamped into [0.8, 1] (APPO: 4)."},
    )
    appo_future_kl_reference: str = field(
        default="old",
        metadata={"help": "What Δlogp of FutureKL is taken against: 'old' (TRL's old log-probs: the drift since the "
        "rollout, 0 with one on-policy pass) or 'sampler' (the generator's sampling log-probs: the trainer-vs-vLLM "
        "gap). Our choice (docs/methods/appo.md): APPO's verl code uses its recomputed old log-probs ('old')."},
    )
    topology: str = field(
        default="token_branching",
        metadata={"help": "APPO forks branches at single tokens of its initial rollouts: 'token_branching'."},
    )

    def __post_init__(self):
        super().__post_init__()
        check_choice("appo_branch_score", self.appo_branch_score, TOKEN_BRANCH_SCORES)
        check_choice("appo_future_kl_reference", self.appo_future_kl_reference, FUTURE_KL_REFERENCES)
        if self.appo_rollouts_per_task < self.num_generations:
            raise ValueError(f"appo_rollouts_per_task must be >= num_generations (the initial rollouts, "
                             f"{self.num_generations}), got {self.appo_rollouts_per_task}")
        if not 0.0 < self.appo_branch_gamma <= 1.0:
            raise ValueError(f"appo_branch_gamma must be in (0, 1] (APPO: 1.0), got {self.appo_branch_gamma}")
        for name in ("appo_future_decay_rate", "appo_dual_clip", "appo_safety_ratio", "appo_omega_tolerance",
                     "appo_std_eps"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive number, got {value}")
        if self.appo_dual_clip <= 1.0:
            raise ValueError(f"appo_dual_clip must be > 1 (APPO: 3.0), got {self.appo_dual_clip}")
        for name in ("appo_future_value_clip", "appo_future_kl_clip"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name} must be in [0, 1) (APPO: 0.2), got {getattr(self, name)}")
        if not 0.0 <= self.appo_prefix_decay <= 1.0:
            raise ValueError(f"appo_prefix_decay must be in [0, 1] (APPO: 0.9), got {self.appo_prefix_decay}")
        if not (math.isfinite(self.appo_future_kl_weight) and self.appo_future_kl_weight >= 0):
            raise ValueError(f"appo_future_kl_weight must be a finite number >= 0, got {self.appo_future_kl_weight}")
        if self.topology != "token_branching":
            raise ValueError(f"APPO runs on the 'token_branching' topology, got topology={self.topology!r}")
        if self.delta is None:
            self.delta = self.appo_dual_clip  # TRL's two-sided clipping: the dual clip for negative advantages


class APPOTrainer(AgentGRPOTrainer):
    """APPO on `AgentGRPOTrainer` (see the module docstring): the token-branching topology, `compute_advantages`
    and `loss_advantages`.

    Logs `appo/init_rollouts`, `appo/branches`, `appo/branch_points`, `appo/init_success_rate`,
    `appo/branch_success_rate`, `appo/mean_reward_scale`, `appo/prefix_tokens` (per task), the topology's
    `topology/branches_per_task`, `topology/fill_rollouts_per_task`, `topology/omega_fallback_fraction`, and in the
    loss `appo/future_kl_factor` (mean 1 + b·f over trained tokens) and `appo/dropped_row_fraction`.
    """

    _tag_names: ClassVar[list[str]] = ["trl", "trl-agents", "appo"]
    _name = "APPO"
    config_class = APPOConfig
    supports_trees = True  # branches share their origin's steps; credit/appo.py gives them 0 on every step
    methods = (
        MethodInfo("appo", "arXiv 2606.12384", "trl_agents.credit.appo",
                   max_staleness=0,
                   staleness_reason=("its future-KL factor reads the drift between the policy and the sampler, which "
                                     "staleness changes, and its split points need the current policy's entropies "
                                     "mid-rollout"),
                   title="APPO",
                   hook="topology (token_branching) + compute_advantages + loss_advantages",
                   inputs=("episode returns", "per-token entropies and current-policy log-probs (split points)",
                           "sampling log-probs", "old log-probs (future-KL scaling)"),
                   tests=("tests/methods/appo/",)),
    )

    @classmethod
    def topology_options(cls, args: Any) -> dict[str, Any]:
        return {"rollouts_per_task": args.appo_rollouts_per_task, "score": args.appo_branch_score,
                "gamma": args.appo_branch_gamma, "value_clip": args.appo_future_value_clip,
                "omega_tolerance": args.appo_omega_tolerance, "fill_budget": args.appo_fill_budget}

    def build_topology(self) -> Topology:
        topology = super().build_topology()
        topology.skip_token = punctuation_filter(self.text_tokenizer)  # z-scores and split points skip punctuation
        return topology

    def compute_advantages(self, groups: list[Group]) -> list[list[list]]:
        points = list(getattr(self.rollout_topology, "branch_points", []))
        branch_ids = [{t.episode_id for t in g.trajectories if t.parent_id is not None} for g in groups]
        landed = [p.score for p in points if p.task_index < len(groups) and p.episode_id in branch_ids[p.task_index]]
        # BS_max over the whole batch, every process (the released code scales with the batch's largest score)
        score_max = self.max_over_processes(max(landed, default=0.0))
        own = [[p for p in points if p.task_index == index] for index in range(len(groups))]
        for group, group_points in zip(groups, own, strict=True):
            _check_branches(group, group_points)
        return self.estimate("appo", groups, branch_points=own, score_max=score_max)

    def loss_advantages(self, inputs: dict[str, Any], per_token_logps: torch.Tensor) -> torch.Tensor | None:
        args = self.args
        if not args.appo_future_kl:
            return None
        advantages = inputs["advantages"]
        if advantages.dim() == 1:
            advantages = advantages.unsqueeze(1).expand_as(per_token_logps)
        current = per_token_logps.detach()
        old = inputs.get("old_per_token_logps")
        old = current if old is None else old
        reference = inputs.get("sampling_per_token_logps") if args.appo_future_kl_reference == "sampler" else old
        reference = old if reference is None else reference
        mask = loss_mask(inputs)
        delta = torch.nan_to_num(current - reference, nan=0.0).clamp(-20.0, 20.0)
        ratio = torch.exp((current - old).clamp(-20.0, 20.0))  # TRL's token ratio (the one its clipping sees)
        scaled, weights, dropped = future_kl_advantages(
            advantages, delta, ratio, mask, gamma=decay_gamma(args.appo_future_decay_rate),
            weight=args.appo_future_kl_weight, clip_ratio=args.appo_future_kl_clip,
            high_only=args.appo_future_kl_high_only, dual_clip=args.appo_dual_clip,
            safety_ratio=args.appo_safety_ratio,
        )
        rows = (mask.sum(dim=1) > 0).float()
        self.log_token_means({"appo/future_kl_factor": 1.0 + args.appo_future_kl_weight * weights}, mask)
        self.log_global_means({"appo/dropped_row_fraction": (float((dropped.float() * rows).sum()),
                                                             float(rows.sum()))})
        return scaled


def _check_branches(group: Group, points) -> None:
    """Every branch of the group matches the split point recorded for its episode id (parent, step, token prefix)."""
    by_id = {p.episode_id: p for p in points}
    for trajectory in group.trajectories:
        if trajectory.parent_id is None:
            continue
        point = by_id.get(trajectory.episode_id)
        action = trajectory.steps[trajectory.fork_step].action_ids if len(trajectory.steps) > trajectory.fork_step \
            else []
        if (point is None or point.origin != trajectory.parent_id or point.step != trajectory.fork_step
                or tuple(action[: len(point.prefix)]) != point.prefix):
            raise RuntimeError(
                f"branch episode {trajectory.episode_id} does not match the split point the token_branching topology "
                f"recorded for it ({point}): the engine numbered the forks differently"
            )
