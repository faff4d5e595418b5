"""3SPO: State-Score-Supervised Policy Optimization (arXiv 2606.09961), registered as method "3spo".

The changes w.r.t. `AgentGRPOTrainer`: `compute_advantages` gives each step the 3SPO step reward (novelty, change
of the historical state score, success), centred among the group's steps taken from the same state (math in
`trl_agents/credit/sspo.py`); the `state_key` signal records the state each action reached, so that the state after
an episode's last action is looked up in the table like any other (as the 3SPO code does); and the trainer keeps a persistent table of state-visit statistics
(`trainer.state_scores`, a `StateScoreTable`), updated from every training rollout, written as
`state_scores.json` with every checkpoint and read back by `train(resume_from_checkpoint=...)`.

Rollouts (`sspo_allocation`): `"independent"` (the default) plays G independent episodes per task, and the siblings
of a step are the steps of those episodes taken from the same state; `"adaptive"` runs 3SPO's allocation, the
`state_score` topology (`rollout/topologies/state_score.py`): n(s) = ceil(G_max·S(s)) siblings forked from each
visited state with ranked backtracking, per task, up to `sspo_max_samples` finished trajectories; the siblings of a
step are then the steps forked from the same state (docs/methods/3spo.md#what-it-does). The trainer hands its table
to the topology; frontier siblings left unfinished are trained but not counted in the table.

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

from ..names import check_choice
from ..credit.sspo import MODES
from ..rollout.topologies.state_score import SCOPES, STATE_KEY_SIGNAL, StateScoreTable, StateScoreTopology
from ..trajectory import Group
from .agent_grpo import AgentGRPOConfig, AgentGRPOTrainer
from .registry import MethodInfo

logger = logging.getLogger(__name__)

STATE_SCORES_NAME = "state_scores.json"
ALLOCATIONS = ("independent", "adaptive")
ALLOCATION_TOPOLOGY = {"independent": "independent", "adaptive": StateScoreTopology.name}


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
        state_scope (`str`, *optional*, defaults to `"global"`): Whether state statistics are global or per task.
        sspo_mode (`str`, *optional*, defaults to `"mean_norm"`): Centring only, or centring and std scaling.
        episode_advantage_w (`float`, *optional*): Weight of an added episode-level advantage (None: 1.0 with
            independent episodes, 0.0 with the adaptive allocation).
        sspo_allocation (`str`, *optional*, defaults to `"independent"`): G independent episodes, or 3SPO's adaptive
            allocation with ranked backtracking (topology `"state_score"`).
        sspo_g_max (`int`, *optional*, defaults to `8`): G_max of n(s) = ceil(G_max·S(s)).
        sspo_max_samples (`int`, *optional*): Finished trajectories per task of the adaptive search (None: G).
        sspo_min_root_rollouts (`int`, *optional*, defaults to `2`): Actions at least from a task's initial state.
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
        default="global",
        metadata={"help": "'global': one entry per state key across tasks, as the 3SPO code keeps one table keyed by "
        "the anchor-observation hash (ALFWorld: that text; FrozenLake / Sokoban: a position, so the entry pools the "
        "maps that share it); 'task': statistics per (task, state), which only fill up when tasks recur (many epochs "
        "over few tasks): with thousands of tasks each seen about once, every state is unseen (S = 1, ω = 0.5) and "
        "the step reward reduces to 0.5·novelty + 0.5·success (docs/methods/3spo.md, 'Our choices')."},
    )
    sspo_mode: str = field(
        default="mean_norm",
        metadata={"help": "'mean_norm': A = R − mean over the same-state steps (3SPO remove_std=True, its "
        "default); 'mean_std_norm': divided by their std + 1e-6."},
    )
    episode_advantage_w: float | None = field(
        default=None,
        metadata={"help": "Weight of an episode-level GRPO advantage added to every step (normalised like "
        "sspo_mode). None = 1.0 with sspo_allocation='independent' and 0.0 with 'adaptive' — our choice "
        "(docs/methods/3spo.md, 'Our choices'): R_3SPO gives no credit to the steps before an outcome, and without "
        "branching nothing else does (FrozenLake benchmark, seed 0: −9.7 points with 0, +8.0 with 1). 0 = the 3SPO "
        "code (R_3SPO only, it already holds 0.5·success)."},
    )

    sspo_allocation: str = field(
        default="independent",
        metadata={"help": "'independent': num_generations independent episodes per task (the released 3SPO launcher's "
        "rollout: its training path never calls the DFS); 'adaptive': the paper's allocation, n(s) = ceil(G_max·S(s)) "
        "siblings forked from each visited state with ranked backtracking (topology 'state_score'; needs env "
        "snapshots). The default is our choice (docs/methods/3spo.md, 'Our choices')."},
    )
    sspo_g_max: int = field(
        default=8, metadata={"help": "G_max of Eq. 3, n(s) = ceil(G_max·S(s)) (3SPO: 8). Used by sspo_allocation="
        "'adaptive'."},
    )
    sspo_max_samples: int | None = field(
        default=None,
        metadata={"help": "Finished trajectories per task of the adaptive search (3SPO max_samples_per_prompt: 32); "
        "None = num_generations, so both allocations finish as many episodes per task — our choice "
        "(docs/methods/3spo.md, 'Our choices')."},
    )
    sspo_min_root_rollouts: int = field(
        default=2,
        metadata={"help": "The adaptive search takes at least this many actions from a task's initial state, whatever "
        "n(s_0) = ceil(G_max·S(s_0)) says: with α = 50 a start state that ever led to a success has S ≈ 0, and Eq. 3 "
        "alone would truncate the task's only episode after one action (a group of one, dropped by "
        "min_healthy_episodes). Our choice (docs/methods/3spo.md, 'Our choices'); 0 or 1 = Eq. 3 unchanged."},
    )

    def __post_init__(self):
        super().__post_init__()
        check_choice("sspo_allocation", self.sspo_allocation, ALLOCATIONS)
        if self.topology not in ("independent", ALLOCATION_TOPOLOGY[self.sspo_allocation]):
            raise ValueError(
                f"3SPO picks its topology from sspo_allocation ({self.sspo_allocation!r}), got topology="
                f"{self.topology!r}: set sspo_allocation='adaptive' for 'state_score' and leave topology unset"
            )
        self.topology = ALLOCATION_TOPOLOGY[self.sspo_allocation]
        if self.episode_advantage_w is None:
            self.episode_advantage_w = 1.0 if self.sspo_allocation == "independent" else 0.0
        if isinstance(self.sspo_g_max, bool) or not isinstance(self.sspo_g_max, int) or self.sspo_g_max < 1:
            raise ValueError(f"sspo_g_max must be an integer >= 1 (3SPO: 8), got {self.sspo_g_max!r}")
        if self.sspo_min_root_rollouts < 0:
            raise ValueError(f"sspo_min_root_rollouts must be >= 0, got {self.sspo_min_root_rollouts}")
        if self.sspo_max_samples is not None and self.sspo_max_samples < 1:
            raise ValueError(f"sspo_max_samples must be >= 1 or None (= num_generations), got {self.sspo_max_samples}")
        check_choice("state_scope", self.state_scope, SCOPES)
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
    config_class = SSPOConfig
    methods = (
        MethodInfo("3spo", "arXiv 2606.09961", "trl_agents.credit.sspo",
                   max_staleness=0,
                   staleness_reason=("its state-visit table is written by credit while the next rollout's allocation "
                                     "reads it"),
                   title="3SPO",
                   hook="compute_advantages (+ topology 'state_score' with sspo_allocation='adaptive')",
                   inputs=("success flags", "state keys (observation text when the env has none)",
                           "persistent state-visit table", "env snapshots (sspo_allocation='adaptive')"),
                   tests=("tests/methods/3spo/",)),
    )
    required_env_capabilities = ("state_key",)
    signals = (STATE_KEY_SIGNAL,)  # env.state_key() after every step: s_{t+1} after an episode's last action
    supports_trees = True  # credit/sspo.py counts a shared step once, in the trajectory that owns it

    @classmethod
    def topology_options(cls, args):
        """The `state_score` topology's options from the config's 3SPO fields (a config or a dict of values)."""
        get = args.get if isinstance(args, dict) else (lambda name, default=None: getattr(args, name, default))
        if get("topology", "independent") != StateScoreTopology.name:
            return super().topology_options(args)
        return {"g_max": get("sspo_g_max", 8), "max_samples": get("sspo_max_samples"),
                "min_root_rollouts": get("sspo_min_root_rollouts", 2)}

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
        if isinstance(self.rollout_topology, StateScoreTopology):  # its decisions read this table
            self.rollout_topology.table = self.state_scores

    def compute_advantages(self, groups: list[Group]) -> list[list[list[float]]]:
        advantages = self.estimate("3spo", groups, state_scores=self.state_scores)
        if self.model.training:  # scores of this batch came from the table before it; now add the batch
            self._update_state_scores(groups)
        self.log_metric("3spo/table_size", len(self.state_scores.counts))
        self.log_metric("3spo/episodes_counted", self.state_scores.t - 1)
        return advantages

    def _update_state_scores(self, groups: list[Group]) -> None:
        """Add the episodes of this rollout, from every process, so that all processes keep the same table."""
        table = self.state_scores
        topology = self.rollout_topology
        skip = topology.uncounted if isinstance(topology, StateScoreTopology) else ()  # unfinished frontier siblings
        records = [record for group in groups for record in table.group_records(group, skip)]
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
