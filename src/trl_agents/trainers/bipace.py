"""BiPACE: Bisimulation-Guided Policy Optimization + Action Counterfactual Estimation (arXiv 2606.25556).

The only change w.r.t. `AgentGRPOTrainer` is `compute_advantages`: GiGPO's episode advantage plus a step advantage
among steps whose prompts the policy represents alike (cosine clusters of a late hidden layer), comparing the
returns of the peers that took the same action with the cluster's mean, `A = A^ep + w·(Q̂ − V̂)` (math in
`trl_agents/credit/bipace.py`; docs: docs/methods/bipace.md).

The hidden states are the `hidden_states` model signal (`trl_agents.signals`), which the trainer declares; where
they come from is `hidden_state_source`:

* `"rollout"` (default): captured during the rollout itself. With the trainer's own `TransformersGenerator`, every
  turn's `model.generate` starts with a prefill forward over the step prompts; forward hooks on the backbone and on
  the chosen decoder layer keep one pooled vector per prompt from that pass. No extra forward pass. Prompts the hooks
  did not see (an external generator such as a vLLM server) fall back to the extra forward below.
* `"forward"`: one extra no-grad forward over the step prompts (prompts only, not the actions), stopped right after
  the chosen layer: the paper's way (README: 11.3 % of a step for the hidden-state pass).

Example:
    ```python
    from datasets import Dataset
    from trl_agents.envs import get_env_class
    from trl_agents.trainers.bipace import BiPACEConfig, BiPACETrainer

    tasks = Dataset.from_list(get_env_class("alfworld").task_split("train", 256))
    config = BiPACEConfig(output_dir="alfworld-bipace", max_turns=50, hidden_layer=-12, cluster_epsilon=0.05)
    BiPACETrainer(model="Qwen/Qwen2.5-1.5B-Instruct", args=config, train_dataset=tasks).train()
    ```
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from ..names import check_choice
from ..signals.model import HIDDEN_STATE_SOURCES, POOLINGS, decoder_layers
from ..trajectory import Group
from .agent_grpo import AgentGRPOConfig, AgentGRPOTrainer
from .registry import MethodInfo


@dataclass
class BiPACEConfig(AgentGRPOConfig):
    r"""
    Configuration of [`BiPACETrainer`]: every [`AgentGRPOConfig`] field plus BiPACE's (docs/methods/bipace.md).

    Args:
        gamma (`float`, *optional*, defaults to `0.95`): Discount of the step returns (GiGPO Eq. 5).
        step_advantage_w (`float`, *optional*, defaults to `1.0`): w, weight of the PACE step advantage.
        hidden_layer (`int`, *optional*, defaults to `-12`): Decoder layer whose output represents a state
            (README: −12 for Qwen2.5-1.5B, −8 for 7B).
        cluster_epsilon (`float`, *optional*, defaults to `0.05`): ε, cosine-distance radius of a cluster (README:
            0.05 for 1.5B, 0.10 for 7B).
        pace_estimator (`str`, *optional*, defaults to `"q_style"`): `"q_style"` or `"diff_peer"`.
        action_key (`str`, *optional*, defaults to `"action_tag"`): `"action_tag"` or `"first_tokens"`.
        pooling (`str`, *optional*, defaults to `"last_token"`): Which prompt positions make the state vector.
        centroid (`str`, *optional*, defaults to `"mean"`): Cluster centroid: running mean or first member.
        episode_mode (`str`, *optional*, defaults to `"mean_norm"`): Normalisation of the episode advantage.
        episode_statistic (`str`, *optional*, defaults to `"step_rows"`): Population of its mean/std.
        hidden_state_source (`str`, *optional*, defaults to `"rollout"`): Capture during the rollout, or an extra
            forward pass.
    """

    gamma: float = field(
        default=0.95,
        metadata={"help": "Discount γ of the step returns R_t = Σ γ^(k−t) r_k (GiGPO Eq. 5). Not restated by the "
        "paper; BiPACE builds on verl-agent GiGPO, whose scripts use 0.95: our choice, docs/methods/bipace.md, 'Our choices'."},
    )
    step_advantage_w: float = field(
        default=1.0,
        metadata={"help": "w, weight of the PACE step advantage in A = A^ep + w·Â^S (GiGPO's step_advantage_w, "
        "default 1; docs/methods/bipace.md, 'Defaults')."},
    )
    hidden_layer: int = field(
        default=-12,
        metadata={"help": "Decoder layer whose output is the state representation f_θ(s), as a Python index into "
        "the model's decoder layers (−8 = output of the 8th layer from the top = hidden_states[−8] of "
        "output_hidden_states). README: −12 for Qwen2.5-1.5B, −8 for Qwen2.5-7B (docs/methods/bipace.md, 'Defaults')."},
    )
    cluster_epsilon: float = field(
        default=0.05,
        metadata={"help": "ε: a step joins the nearest cluster centroid when its cosine distance 1 − ⟨φ, c⟩ is at "
        "most ε, else it opens a new cluster. README: 0.05 for 1.5B, 0.10 for 7B (docs/methods/bipace.md, 'Defaults')."},
    )
    pace_estimator: str = field(
        default="q_style",
        metadata={"help": "'q_style': Â^S = mean return of the cluster peers that took the same action − cluster "
        "mean (README default, 'strongest'); 'diff_peer': own return − mean return of the peers that took another "
        "action (docs/methods/bipace.md#equations)."},
    )
    action_key: str = field(
        default="action_tag",
        metadata={"help": "Action key of PACE. 'action_tag': the environment's canonical action (info['action']) "
        "when it reports one, else the <action>…</action> body (extract_answer), lower-cased, whitespace collapsed "
        "(README default action_tag; the info['action'] preference is our choice); 'first_tokens': the first 8 "
        "action tokens (README first-token) (docs/methods/bipace.md, 'Our choices')."},
    )
    pooling: str = field(
        default="last_token",
        metadata={"help": "State vector from the layer's output: 'last_token', the last prompt token (the position "
        "that predicts the first action token), or 'mean' over all prompt tokens. Not specified by the paper: our "
        "choice, docs/methods/bipace.md, 'Our choices'."},
    )
    centroid: str = field(
        default="mean",
        metadata={"help": "Cluster centroid: 'mean', the re-normalised running mean of the members' unit vectors, "
        "or 'first', the first member's. Not specified by the paper: our choice, docs/methods/bipace.md, 'Our choices'."},
    )
    episode_mode: str = field(
        default="mean_norm",
        metadata={"help": "Episode advantage A^ep as GiGPO's: 'mean_norm' (R − μ) or 'mean_std_norm' ((R − μ)/(σ + "
        "1e-6); verl-agent's ALFWorld script). The step advantage is never std-normalised. Not restated by the "
        "paper: our choice, docs/methods/bipace.md, 'Our choices'."},
    )
    episode_statistic: str = field(
        default="step_rows",
        metadata={"help": "Population of A^ep's mean/std: 'step_rows' (verl-agent GiGPO, compute_mean_std_cross_steps) "
        "or 'trajectories' (GiGPO paper Eq. 3). Not restated by the paper: our choice, docs/methods/bipace.md, 'Our choices' (docs/concepts/verl_agent_conventions.md#cross-step-statistics)."},
    )
    hidden_state_source: str = field(
        default="rollout",
        metadata={"help": "'rollout': keep the hidden states of the prefill forward that the trainer's generator "
        "already runs on every step prompt (no extra pass; prompts it did not see, e.g. with a vLLM generator, fall "
        "back to 'forward'); 'forward': one extra no-grad forward over the step prompts, cut after hidden_layer "
        "(the paper's way, README: 11.3 % of a step). Our choice, docs/methods/bipace.md, 'Our choices'."},
    )

    def __post_init__(self):
        super().__post_init__()
        check_choice("pace_estimator", self.pace_estimator, ("q_style", "diff_peer"))
        check_choice("action_key", self.action_key, ("action_tag", "first_tokens"))
        check_choice("pooling", self.pooling, POOLINGS)
        check_choice("centroid", self.centroid, ("mean", "first"))
        check_choice("episode_mode", self.episode_mode, ("mean_norm", "mean_std_norm"))
        check_choice("episode_statistic", self.episode_statistic, ("step_rows", "trajectories"))
        check_choice("hidden_state_source", self.hidden_state_source, HIDDEN_STATE_SOURCES)
        if not 0.0 <= self.cluster_epsilon <= 2.0:
            raise ValueError(
                f"cluster_epsilon must be a cosine distance in [0, 2], got {self.cluster_epsilon} (README: 0.05 for "
                "Qwen2.5-1.5B, 0.10 for 7B)"
            )
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"gamma must be in [0, 1], got {self.gamma} (GiGPO/BiPACE: 0.95)")
        if not math.isfinite(self.step_advantage_w):
            raise ValueError(f"step_advantage_w must be finite, got {self.step_advantage_w}")


class BiPACETrainer(AgentGRPOTrainer):
    """BiPACE on `AgentGRPOTrainer`: the only change is `compute_advantages` (see the module docstring).

    Needs no environment capability: the clusters come from the policy's own hidden states, the action keys from
    the replies (or `info["action"]`). Logs `bipace/*`: cluster sizes, singleton and mixed-action cluster fractions,
    the fraction of step prompts whose hidden state came from the rollout, and the seconds spent getting them.
    """

    _tag_names: ClassVar[list[str]] = ["trl", "trl-agents", "bipace"]
    _name = "BiPACE"
    config_class = BiPACEConfig
    methods = (
        MethodInfo("bipace", "arXiv 2606.25556", "trl_agents.credit.bipace", max_staleness=1, title="BiPACE",
                   inputs=("episode returns", "step rewards",
                           "policy hidden states of the step prompts (layer hidden_layer)",
                           "action keys (info['action'] or the <action> text)"),
                   tests=("tests/methods/bipace/",)),
    )

    signals = ("hidden_states",)

    @classmethod
    def signal_options(cls, args) -> dict[str, dict]:
        return {
            **super().signal_options(args),
            "hidden_states": {"layer": args.hidden_layer, "pooling": args.pooling, "source": args.hidden_state_source},
        }

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        _, layers = decoder_layers(self.accelerator.unwrap_model(self.model))
        if not -len(layers) <= self.args.hidden_layer < len(layers):
            raise ValueError(
                f"hidden_layer={self.args.hidden_layer} is out of range for a model with {len(layers)} decoder layers: "
                f"use a value in [{-len(layers)}, {len(layers) - 1}] (README: −12 for Qwen2.5-1.5B, −8 for 7B)."
            )

    def step_hidden_states(self, groups: list[Group]) -> list[torch.Tensor]:
        """One (num_steps, H) float32 matrix per group (rows trajectory by trajectory) from the `hidden_states`
        signal of its steps."""
        matrices = []
        for group in groups:
            rows = [step.signals["hidden_states"] for t in group.trajectories for step in t.steps]
            matrices.append(torch.stack(rows) if rows else torch.zeros((0, 0)))
        return matrices

    # ---- credit ----------------------------------------------------------------------------------------------------

    def compute_advantages(self, groups: list[Group]) -> list[list[list[float]]]:
        advantages = self.estimate("bipace", groups, hidden_states=self.step_hidden_states(groups))
        stats = self.model_signal("hidden_states").stats  # this process's
        self.log_metric("bipace/rollout_hidden_state_fraction", stats.get("rollout_fraction", 1.0))
        self.log_metric("bipace/hidden_state_seconds", stats.get("seconds", 0.0))
        return advantages
