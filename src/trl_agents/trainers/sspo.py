"""3SPO: State-Score-Supervised Policy Optimization (arXiv 2606.09961), registered as method "3spo".

The changes w.r.t. `AgentGRPOTrainer`: `compute_advantages` gives each step the 3SPO step reward (novelty, change
of the historical state score, success), centred among the group's steps taken from the same state (math in
`trl_agents/credit/sspo.py`); and the trainer keeps a persistent table of state-visit statistics
(`trainer.state_scores`, a `StateScoreTable`), updated from every training rollout, written as
`state_scores.json` with every checkpoint and read back by `train(resume_from_checkpoint=...)`.

3SPO's adaptive rollout allocation (branching n(s) = ceil(G_max·S(s)) siblings from visited states) needs a
branching rollout; the table exposes it as `trainer.state_scores.num_rollouts(state, task_id)` for one, and until then
the siblings of a step are the steps of the G independent episodes taken from the same state
(docs/methods/3spo.md#what-it-does).

The table's API: `score(state, task_id)` (S(s), Eq. 1), `omega(state, task_id)`, `visits(state, task_id)`,
`successes(state, task_id)`, `num_rollouts(state, task_id, g_max)` (Eq. 3), `update(groups)`, `save(path)`,
`load_counts(path)`; `state` is a step's `state_key` (or its observation when the env has none) and `task_id` a
`Group.task_id`.

Example:
    ```python
    from datasets import Dataset
    from trl_agents.envs import get_env_class
    from trl_agents.trainers.sspo import SSPOConfig, SSPOTrainer

    tasks = Dataset.from_list(get_env_class("alfworld").task_split("train", 512))
    config = SSPOConfig(output_dir="alfworld-3spo", env_name="alfworld", max_turns=50)
    trainer = SSPOTrainer(model="Qwen/Qwen2.5-1.5B-Instruct", args=config, train_dataset=tasks)
    trainer.train()
    group = trainer.last_rollout.groups[0]  # S(s) of a state of the last rollout:
    trainer.state_scores.score(group.trajectories[0].steps[0].state_key, group.task_id)
    ```
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass, field
from typing import ClassVar

from ..credit.base import check_choice
from ..credit.sspo import MODES, SCOPES, TERMINAL_SCORES, StateScoreTable, sspo_advantages_with_stats
from ..trajectory import Group
from .agent_grpo import AgentGRPOConfig, AgentGRPOTrainer
from .registry import MethodInfo

logger = logging.getLogger(__name__)

STATE_SCORES_NAME = "state_scores.json"
STAT_NAMES = ("mean_step_reward", "mean_state_score", "low_score_fraction", "novel_fraction", "singleton_fraction")


@dataclass
class SSPOConfig(AgentGRPOConfig):
    r"""
    Configuration of [`SSPOTrainer`] (3SPO): every [`AgentGRPOConfig`] field plus 3SPO's.

    Args:
        score_alpha (`float`, *optional*, defaults to `50.0`): α of λ(t) = α·log t in the state score.
        score_xi (`float`, *optional*, defaults to `10.0`): ξ, failure count below which a state keeps its score.
        score_zeta (`float`, *optional*, defaults to `0.1`): ζ, success rate above which a state keeps its score.
        omega_k (`float`, *optional*, defaults to `0.1`): ω_k of the novelty weight ω(N) = 0.5·exp(−ω_k·N).
        score_eps (`float`, *optional*, defaults to `1e-6`): ε of the success rate N⁺/(N + ε).
        state_scope (`str`, *optional*, defaults to `"task"`): Whether state statistics are per task or global.
        sspo_mode (`str`, *optional*, defaults to `"mean_norm"`): Centring only, or centring and std scaling.
        episode_advantage_w (`float`, *optional*, defaults to `0.0`): Weight of an added episode-level advantage.
        terminal_score (`str`, *optional*, defaults to `"current"`): Score of the unrecorded final state.
    """

    score_alpha: float = field(
        default=50.0,
        metadata={"help": "α in λ(t) = α·log t, S(s) = exp(−λ(t)·SR(s)) (3SPO README/launcher: 50; the code's "
        "StateScoreManager default is 1.0). docs/methods/3spo.md, 'Defaults'."},
    )
    score_xi: float = field(
        default=10.0,
        metadata={"help": "ξ: a state keeps a nonzero score while it has fewer than ξ failed visits or its success "
        "rate exceeds ζ (3SPO: 10)."},
    )
    score_zeta: float = field(default=0.1, metadata={"help": "ζ: success-rate threshold of the score (3SPO: 0.1)."})
    omega_k: float = field(
        default=0.1, metadata={"help": "ω_k of the novelty weight ω(N) = 0.5·exp(−ω_k·N(s_t)) (3SPO: 0.1)."}
    )
    score_eps: float = field(default=1e-6, metadata={"help": "ε of the success rate N⁺/(N + ε) (3SPO: 1e-6)."})
    state_scope: str = field(
        default="task",
        metadata={"help": "'task': statistics per (task, state) — our choice (docs/methods/3spo.md, 'Our choices'): the "
        "library's state keys are task-local (a Sokoban key is a player and box position, shared by different "
        "rooms); 'global': one entry per state key across tasks, as the 3SPO code hashes the anchor observation "
        "text (right for ALFWorld, whose key is that text)."},
    )
    sspo_mode: str = field(
        default="mean_norm",
        metadata={"help": "'mean_norm': A = R − mean over the same-state steps (3SPO remove_std=True, its "
        "default); 'mean_std_norm': divided by their std + 1e-6."},
    )
    episode_advantage_w: float = field(
        default=0.0,
        metadata={"help": "Weight of an episode-level GRPO advantage added to every step (normalised like "
        "sspo_mode). 0 = the 3SPO code (R_3SPO only, it already holds 0.5·success); docs/methods/3spo.md, 'Our choices', "
        "lists adding it as an option."},
    )

    terminal_score: str = field(
        default="current",
        metadata={"help": "S of the state after an episode's last action, which the rollout does not record: "
        "'current' (S(s_t): no score change on the last step) or 'unseen' (1, as the table never counts it). Our "
        "choice (docs/methods/3spo.md, 'Our choices'; the 3SPO code observes that state)."},
    )

    def __post_init__(self):
        super().__post_init__()
        check_choice("state_scope", self.state_scope, SCOPES)
        check_choice("terminal_score", self.terminal_score, TERMINAL_SCORES)
        check_choice("sspo_mode", self.sspo_mode, MODES)
        for name in ("score_alpha", "score_xi", "score_zeta", "omega_k"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value}")
        if not self.score_eps > 0:
            raise ValueError(f"score_eps must be > 0 (3SPO: 1e-6), got {self.score_eps}")
        if not math.isfinite(self.episode_advantage_w):
            raise ValueError(f"episode_advantage_w must be finite, got {self.episode_advantage_w}")


class SSPOTrainer(AgentGRPOTrainer):
    """3SPO on `AgentGRPOTrainer` (see the module docstring): step credit from the persistent `state_scores` table.

    Logged diagnostics: `3spo/mean_step_reward`, `3spo/mean_state_score`, `3spo/low_score_fraction` (steps with
    S < 0.01: with α = 50 the score is almost binary, docs/methods/3spo.md), `3spo/novel_fraction`, `3spo/singleton_fraction`,
    `3spo/table_size` (states in the table) and `3spo/episodes_counted` (t − 1).
    """

    _tag_names: ClassVar[list[str]] = ["trl", "trl-agents", "3spo"]
    _name = "3SPO"
    _config_class = SSPOConfig
    methods = (
        MethodInfo("3spo", "arXiv 2606.09961", "trl_agents.credit.sspo", title="3SPO",
                   inputs=("success flags", "state keys (observation text when the env has none)",
                           "persistent state-visit table"),
                   tests=("tests/test_credit_3spo.py",)),
    )
    required_env_capabilities = ("state_key",)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        config = self.args
        self.state_scores = StateScoreTable(
            alpha=config.score_alpha,
            xi=config.score_xi,
            zeta=config.score_zeta,
            omega_k=config.omega_k,
            eps=config.score_eps,
            scope=config.state_scope,
        )

    def compute_advantages(self, groups: list[Group]) -> list[list[list[float]]]:
        args = self.args
        advantages, stats_with_steps = [], []
        for group in groups:
            group_advantages, stats = sspo_advantages_with_stats(
                group,
                table=self.state_scores,
                mode=args.sspo_mode,
                episode_weight=args.episode_advantage_w,
                terminal_score=args.terminal_score,
                invalid_penalty=args.invalid_action_penalty,
            )
            advantages.append(group_advantages)
            if any(traj.steps for traj in group.trajectories):
                stats_with_steps.append(stats)
        mode = "train" if self.model.training else "eval"
        if mode == "train":  # scores of this batch came from the table before it; now add the batch
            self._update_state_scores(groups)
        self.log_mean_metrics("3spo", stats_with_steps, STAT_NAMES)
        self.log_metric("3spo/table_size", len(self.state_scores.counts))
        self.log_metric("3spo/episodes_counted", self.state_scores.t - 1)
        return advantages

    def _update_state_scores(self, groups: list[Group]) -> None:
        """Add the episodes of this rollout, from every process, so that all processes keep the same table."""
        table = self.state_scores
        records = [record for group in groups for record in table.group_records(group)]
        if self.accelerator.num_processes > 1:
            from accelerate.utils import gather_object

            records = gather_object(records)
        table.update_records(records)

    # ---- checkpoints ----------------------------------------------------------------------------------------------

    def save_extra_state(self, output_dir: str) -> None:
        """The state-score table, next to every checkpoint (`state_scores.json`)."""
        self.state_scores.save(os.path.join(output_dir, STATE_SCORES_NAME))

    def load_extra_state(self, checkpoint_dir: str) -> None:
        """The state-score table of the checkpoint `train(resume_from_checkpoint=...)` resumes from."""
        if not self.load_state_scores(checkpoint_dir):
            logger.warning(
                "Checkpoint %s has no %s: 3SPO resumes with an empty state-score table.", checkpoint_dir,
                STATE_SCORES_NAME,
            )

    def load_state_scores(self, directory: str) -> bool:
        """Replace the table's statistics by those saved in `directory` (a checkpoint); False when it has none."""
        path = os.path.join(directory, STATE_SCORES_NAME)
        if not os.path.isfile(path):
            return False
        self.state_scores.load_counts(path)
        return True
