"""PCSD: persistent-consistency weighted self-distillation as an auxiliary loss on GRPO (arXiv 2608.01837;
docs/methods/pcsd.md).

Like SDAR (`trainers/sdar.py`), the only change w.r.t. `AgentGRPOTrainer` is `compute_auxiliary_loss`: λ =
`pcsd_coef` times the token mean of w_t·(log π_T(y_t) − log π_θ(y_t)), where the weight w_t = σ(β·δ_t)·η_t replaces
SDAR's gate σ(β·Δ_t). δ_t mixes a short and a long decayed look-ahead mean of the teacher–student gap Δ inside the
turn (more of the long one where Δ varies), and η_t damps tokens after which the gap declines (math in
`trl_agents/distill/pcsd.py`). The teacher is the frozen step-0 policy under a privileged view of the step
(`teacher="frozen"`, as our sources describe PCSD; `privileged_source="env"`: the environment's
`privileged_context()`, standing in for the skills text), scored once after the rollout (the `teacher_logprobs`
signal); the student's log-probs are the ones TRL's loss computed (no second forward).

Example:
    ```python
    from datasets import Dataset
    from trl_agents.envs import get_env_class
    from trl_agents.trainers.pcsd import PCSDConfig, PCSDTrainer

    tasks = Dataset.from_list(get_env_class("alfworld").task_split("train", 512))
    config = PCSDConfig(output_dir="alfworld-pcsd", max_turns=50, pcsd_coef=0.01, teacher="frozen")
    PCSDTrainer(model="Qwen/Qwen2.5-3B-Instruct", args=config, train_dataset=tasks).train()
    ```
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from ..distill.pcsd import check_weight_options, pcsd_token_terms
from ..training.batch import token_signal_key
from .agent_grpo import AgentGRPOConfig, AgentGRPOTrainer
from ..training.batch import loss_mask
from ..training.forward import policy_logps
from .registry import MethodInfo


@dataclass
class PCSDConfig(AgentGRPOConfig):
    r"""
    Configuration of [`PCSDTrainer`]: every [`AgentGRPOConfig`] field plus PCSD's (docs/methods/pcsd.md).

    Args:
        pcsd_coef (`float`, *optional*, defaults to `0.01`): λ, weight of the weighted distillation term.
        pcsd_beta (`float`, *optional*, defaults to `5.0`): β of σ(β·δ).
        pcsd_short_window (`int`, *optional*, defaults to `1`): N_s.
        pcsd_long_window (`int`, *optional*, defaults to `8`): N_l.
        pcsd_decay (`float`, *optional*, defaults to `0.7`): ρ of the decayed window means.
        pcsd_var_offset (`float`, *optional*, defaults to `0.1`): v₀ of a = v/(v + v₀).
        pcsd_trend_coef (`float`, *optional*, defaults to `0.5`): γ_tr of the trend factor.
        pcsd_trend_scale (`float`, *optional*, defaults to `1.0`): Scale of the slope in the trend factor.
        pcsd_trend_saturate (`bool`, *optional*, defaults to `True`): A decline takes away at most γ_tr of w.
        pcsd_window (`str`, *optional*, defaults to `"lookahead"`): `"lookahead"` or `"causal"` windows.
        pcsd_mix (`str`, *optional*, defaults to `"variance"`): How a_t mixes the windows.
        teacher (`str`, *optional*, defaults to `"frozen"`): The step-0 policy.
    """

    pcsd_coef: float = field(
        default=0.01,
        metadata={"help": "λ, weight of the weighted distillation term on GRPO's loss (PCSD: 0.01; 0.005 and 0.05 "
        "did worse on ALFWorld, per secondary summaries of the paper)."},
    )
    pcsd_beta: float = field(
        default=5.0,
        metadata={"help": "β of σ(β·δ_t). Our choice: SDAR's gate_beta, 5.0 (the paper's sources give no value)."},
    )
    pcsd_short_window: int = field(
        default=1, metadata={"help": "N_s, tokens of the short window (PCSD: 1, so its mean is Δ_t itself)."}
    )
    pcsd_long_window: int = field(
        default=8, metadata={"help": "N_l, tokens of the long window (PCSD: 8); also the window of v_t and the slope."}
    )
    pcsd_decay: float = field(
        default=0.7,
        metadata={"help": "ρ in (0, 1]: window means weigh token t+k by ρ^|k| (1 = plain means, the '−decay' "
        "ablation). Our choice: 0.7 (the paper's sources name an exponential decay, not its rate)."},
    )
    pcsd_var_offset: float = field(
        default=0.1,
        metadata={"help": "v₀ > 0 of a_t = v_t/(v_t + v₀): the variance at which both windows weigh the same. Our "
        "choice: 0.1 (the sources say only 'continuous interpolation')."},
    )
    pcsd_trend_coef: float = field(
        default=0.5,
        metadata={"help": "γ_tr >= 0 of η_t = 1 − γ_tr·min(1, ReLU(−slope/scale)) (0 = no trend factor, the "
        "'−trend' ablation). Our choice: 0.5."},
    )
    pcsd_trend_scale: float = field(
        default=1.0,
        metadata={"help": "Scale > 0 dividing the window's OLS slope in η_t, in nats per token. Our choice: 1.0; a "
        "strong isolated spike of support (Δ = 5 then 0) reads as a decline of 5 nats per token at this scale "
        "(docs/methods/pcsd.md)."},
    )
    pcsd_trend_saturate: bool = field(
        default=True,
        metadata={"help": "Our guard (docs/methods/pcsd.md): a decline takes away at most the share γ_tr of a "
        "token's weight. False: η_t = clip(1 − γ_tr·ReLU(−slope/scale), 0, 1), where the weight falls as a spike "
        "of support grows and reaches 0 (a spike of 6.7 nats in a 4-token window; Δ = [5, 0] gives its first "
        "token 0 where SDAR gives 1)."},
    )
    pcsd_window: str = field(
        default="lookahead",
        metadata={"help": "Where the windows of token t lie inside its turn: 'lookahead' (t…t+N−1: the response is "
        "fixed, so later tokens may weigh t, and an isolated spike of support loses weight) or 'causal' "
        "(t−N+1…t). Our choice: 'lookahead'."},
    )
    pcsd_mix: str = field(
        default="variance",
        metadata={"help": "How δ_t mixes the windows: 'variance' (a_t = v_t/(v_t + v₀): low variance → the short "
        "window, high → the long one), 'short' (a = 0) or 'long' (a = 1; either is the '−adaptive aggregation' "
        "ablation). Our choice: the v/(v + v₀) form."},
    )
    teacher: str = field(
        default="frozen",
        metadata={"help": "The teacher: our sources describe PCSD's as a frozen snapshot of the policy shown the "
        "skills (the step-0 policy; a LoRA run's base model); 'current' is SDAR's released teacher, 'ema' a "
        "middle ground."},
    )

    def __post_init__(self):
        super().__post_init__()
        if not (isinstance(self.pcsd_coef, int | float) and self.pcsd_coef >= 0 and self.pcsd_coef < float("inf")):
            raise ValueError(f"pcsd_coef must be a finite number >= 0 (PCSD: 0.01), got {self.pcsd_coef!r}")
        try:
            check_weight_options(**self.pcsd_weight_options())
        except ValueError as err:
            raise ValueError(f"pcsd_{err}") from None

    def pcsd_weight_options(self) -> dict[str, Any]:
        """The options of `trl_agents.distill.pcsd.pcsd_weights` from the config."""
        return {
            "beta": self.pcsd_beta, "short_window": self.pcsd_short_window, "long_window": self.pcsd_long_window,
            "decay": self.pcsd_decay, "var_offset": self.pcsd_var_offset, "trend_coef": self.pcsd_trend_coef,
            "trend_scale": self.pcsd_trend_scale, "window": self.pcsd_window, "mix": self.pcsd_mix,
            "trend_saturate": self.pcsd_trend_saturate,
        }


class PCSDTrainer(AgentGRPOTrainer):
    """PCSD on `AgentGRPOTrainer`: the only change is `compute_auxiliary_loss` (see the module docstring).

    Logs `pcsd/loss` (the token mean of the weighted terms over each micro-batch of every process, before λ),
    `pcsd/mean_weight` (the mean w) and `pcsd/weight_above_half` (the fraction of tokens with w > 0.5; the paper's
    sources report 20–28 %), over the same tokens. The loss is the token mean over the whole generation batch
    (`batch_token_mean`).
    """

    _tag_names: ClassVar[list[str]] = ["trl", "trl-agents", "pcsd"]
    _name = "PCSD"
    config_class = PCSDConfig
    methods = (
        MethodInfo("pcsd", "arXiv 2608.01837", "trl_agents.distill.pcsd",
                   max_staleness=0,
                   staleness_reason=("the sampled-token self-distillation loss assumes the tokens were sampled by the "
                                     "policy it trains, and an auxiliary loss gets no importance correction"),
                   title="PCSD",
                   hook="compute_auxiliary_loss",
                   inputs=("episode returns", "teacher log-probs of the sampled actions under a privileged view",
                           "turn boundaries (the loss mask's runs)"),
                   tests=("tests/methods/adrs/", "tests/methods/pcsd/")),
    )
    signals = ("teacher_logprobs",)
    training_signals = ("teacher_logprobs",)

    def compute_auxiliary_loss(self, model, inputs: dict[str, Any], per_token_logps):
        student = per_token_logps if per_token_logps is not None else policy_logps(model, inputs, self.temperature)
        teacher = inputs[token_signal_key("teacher_logprobs")]
        mask = loss_mask(inputs)
        terms, weights = pcsd_token_terms(student, teacher, mask, **self.args.pcsd_weight_options())
        self.log_token_means(
            {"pcsd/loss": terms, "pcsd/mean_weight": weights, "pcsd/weight_above_half": (weights > 0.5).float()}, mask
        )
        # λ·agg(ℓ), agg = the token mean over the generation batch (as SDAR's token-mean loss)
        return self.args.pcsd_coef * self.batch_token_mean(terms, mask, inputs)
