"""ADRS: TVA-gated teacher scores added to GRPO's advantage (arXiv 2608.03223; docs/methods/adrs.md).

The change w.r.t. `AgentGRPOTrainer` is `compute_advantages`: every action token gets GRPO's z-score of its row plus
a teacher term built from the teacher's log-prob of the token (centred within its step, standardised), gated by the
group's Teacher Value Advantage σ(τ·TVA) and switched on only inside a window of training steps (math in
`trl_agents/distill/adrs.py`). The teacher is the current policy under a privileged view of the step (the
`teacher_logprobs` signal, `teacher="current"`, `privileged_source="env"`: the environment's
`privileged_context()`, standing in for ADRS's skills text), scored once after each rollout. No loss term is added;
optionally (`adrs_entropy_coef_active`) TRL's entropy bonus coefficient is raised while the teacher term is on, as
the released launchers do.

Logged per rollout: `adrs/tva` and `adrs/gate` (means over groups), `adrs/eta_eff` (the scheduled coefficient),
`adrs/teacher_term_abs_mean` (mean |teacher term| over action tokens), `adrs/teacher_groups` (fraction of groups
that got a teacher term), `adrs/clip_fraction` (released variant: fraction of a term-bearing group's tokens whose
term was clipped) and `adrs/entropy_coef` when the entropy schedule is on.

Example:
    ```python
    from datasets import Dataset
    from trl_agents.envs import get_env_class
    from trl_agents.trainers.adrs import ADRSConfig, ADRSTrainer

    tasks = Dataset.from_list(get_env_class("alfworld").task_split("train", 512))
    config = ADRSConfig(output_dir="alfworld-adrs", max_turns=50, adrs_eta=0.02, entropy_coef=0.001,
                        adrs_entropy_coef_active=0.01)
    ADRSTrainer(model="Qwen/Qwen2.5-3B-Instruct", args=config, train_dataset=tasks).train()
    ```
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

from ..names import check_choice
from ..distill.adrs import ADRS_UNITS, ADRS_VARIANTS, NORMALIZE_MODES, adrs_eta_schedule
from ..trajectory import Group
from .agent_grpo import AgentGRPOConfig, AgentGRPOTrainer
from .registry import MethodInfo


@dataclass
class ADRSConfig(AgentGRPOConfig):
    r"""
    Configuration of [`ADRSTrainer`]: every [`AgentGRPOConfig`] field plus ADRS's (docs/methods/adrs.md).

    GRPO's part is fixed by ADRS: the z-score (`scale_rewards="group"`) with ε = 1e-6, over the rows `adrs_unit`
    chooses (`credit_statistic` is not read), and the invalid-action penalty on the row's score.

    Args:
        adrs_variant (`str`, *optional*, defaults to `"released"`): `"released"` (fix5) or `"paper"`.
        adrs_eta (`float`, *optional*, defaults to `0.02`): η.
        adrs_warmup_steps (`int`, *optional*, defaults to `20`): Steps of pure GRPO before the teacher term.
        adrs_active_steps (`int` or `None`, *optional*, defaults to `50`): Steps with the teacher term; None = all.
        adrs_tva_tau (`float`, *optional*, defaults to `2.0`): τ of the gate σ(τ·TVA).
        adrs_tva_temperature (`float`, *optional*, defaults to `1.0`): T_α of α = σ((c − mean c)/T_α).
        adrs_normalize_mode (`str`, *optional*, defaults to `"per_seq"`): `"per_seq"` or `"global"` std of r̂.
        adrs_clip (`float`, *optional*, defaults to `0.2`): Bound of the released teacher term (0 = none).
        adrs_adaptive_clip (`bool`, *optional*, defaults to `True`): Scale the bound by min(1, σ_g/median σ).
        adrs_unit (`str`, *optional*, defaults to `"auto"`): Rows of the statistics: `"step"`, `"episode"`, `"auto"`.
        adrs_std_eps (`float`, *optional*, defaults to `1e-6`): ε of GRPO's z-score and the "σ_g ≈ 0" threshold.
        adrs_entropy_coef_active (`float` or `None`, *optional*): `entropy_coef` while the teacher term is on.
    """

    adrs_variant: str = field(
        default="released",
        metadata={"help": "'released': what the reference's fix5 launchers optimise, A = z + clip(η_eff·ẑ^T, ±c_g) "
        "with ẑ^T the within-group standardisation of η·m·r̂; 'paper': the paper's text, A = z + η_eff·m·r̂ (no "
        "restandardisation, no clip, every group). docs/methods/adrs.md#equations."},
    )
    adrs_eta: float = field(
        default=0.02,
        metadata={"help": "η, the teacher term's coefficient (fix5 launchers: 0.02; the paper's Table 2 runs used 0.1 "
        "for ALFWorld, Qwen3 and Search-7B)."},
    )
    adrs_warmup_steps: int = field(
        default=20,
        metadata={"help": "Training steps of pure GRPO before the teacher term starts: η_eff = 0 while step <= this "
        "(1-based steps; reference wn_warmup_steps: 20)."},
    )
    adrs_active_steps: int | None = field(
        default=50,
        metadata={"help": "Training steps with η_eff = η after the warm-up, then 0 again (reference "
        "wn_active_steps: 50). None: η until the end."},
    )
    adrs_tva_tau: float = field(
        default=2.0, metadata={"help": "τ of the TVA gate m = σ(τ·TVA) (reference tva_tau: 2.0)."}
    )
    adrs_tva_temperature: float = field(
        default=1.0,
        metadata={"help": "T_α of the rows' alignment α = σ((c − mean_batch c)/T_α) (reference tva_temperature: 1.0)."},
    )
    adrs_normalize_mode: str = field(
        default="per_seq",
        metadata={"help": "Std that scales the centred teacher scores r̂: 'per_seq' (the row's own tokens, fix5) or "
        "'global' (all tokens of the batch, the reference's function default)."},
    )
    adrs_clip: float = field(
        default=0.2,
        metadata={"help": "c, the bound of the released variant's teacher term clip(η_eff·ẑ^T, ±c_g) (reference "
        "wn_clip: 0.2); 0 = no clipping."},
    )
    adrs_adaptive_clip: bool = field(
        default=True,
        metadata={"help": "c_g = c·min(1, σ_g/median σ over the batch's groups), so that a group whose returns barely "
        "differ lets the teacher move it less (reference wn_adaptive_clip: on)."},
    )
    adrs_unit: str = field(
        default="auto",
        metadata={"help": "What a row of ADRS's statistics is: 'step' (each step, verl-agent's layout: GRPO's mean "
        "and std over the group's step rows, TVA over steps), 'episode' (each trajectory) or 'auto' (step for "
        "row_format='step', episode for 'conversation'). Our choice (the reference only has step rows)."},
    )
    adrs_std_eps: float = field(
        default=1e-6,
        metadata={"help": "ε of GRPO's z-score (R − μ)/(σ + ε), also the σ below which a group gets no teacher term "
        "(reference: verl's 1e-6). With 1e-6 a return difference of 1e-5 inside a group becomes advantages of ±0.6 "
        "and switches the teacher term on; TRL's 1e-4 gives ±0.047 and leaves it off (docs/methods/adrs.md)."},
    )
    adrs_entropy_coef_active: float | None = field(
        default=None,
        metadata={"help": "TRL's entropy_coef while η_eff > 0, entropy_coef itself otherwise (fix5 "
        "ENT_COEFF_ACTIVE: 0.01 ALFWorld and Search, 0.003 Qwen3-1.7B, 0 WebShop-3B; base 0.001). None = no "
        "schedule."},
    )

    def __post_init__(self):
        super().__post_init__()
        check_choice("adrs_variant", self.adrs_variant, ADRS_VARIANTS)
        check_choice("adrs_normalize_mode", self.adrs_normalize_mode, NORMALIZE_MODES)
        check_choice("adrs_unit", self.adrs_unit, (*ADRS_UNITS, "auto"))
        for name in ("adrs_eta", "adrs_clip"):
            value = getattr(self, name)
            if isinstance(value, bool) or not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        if not (math.isfinite(self.adrs_std_eps) and self.adrs_std_eps > 0):
            raise ValueError(f"adrs_std_eps must be a finite number > 0 (reference: 1e-6), got {self.adrs_std_eps}")
        for name in ("adrs_tva_tau", "adrs_tva_temperature"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number > 0 (reference: τ = 2, T_α = 1), got {value!r}")
        if isinstance(self.adrs_warmup_steps, bool) or not isinstance(self.adrs_warmup_steps, int) or \
                self.adrs_warmup_steps < 0:
            raise ValueError(f"adrs_warmup_steps must be an int >= 0 (reference: 20), got {self.adrs_warmup_steps!r}")
        if self.adrs_active_steps is not None and (
            isinstance(self.adrs_active_steps, bool) or not isinstance(self.adrs_active_steps, int)
            or self.adrs_active_steps < 0
        ):
            raise ValueError(
                f"adrs_active_steps must be an int >= 0 or None (no end; reference: 50), got {self.adrs_active_steps!r}"
            )
        if self.scale_rewards != "group":
            raise ValueError(
                f"scale_rewards={self.scale_rewards!r} is not supported by ADRS: its advantage is GRPO's z-score. Set "
                "scale_rewards='group'."
            )
        active = self.adrs_entropy_coef_active
        if active is not None:
            if not (math.isfinite(active) and active >= 0):
                raise ValueError(f"adrs_entropy_coef_active must be a finite number >= 0 or None, got {active!r}")
            if self.use_adaptive_entropy:
                raise ValueError(
                    "adrs_entropy_coef_active schedules entropy_coef, which use_adaptive_entropy=True also moves: "
                    "set one of them (adrs_entropy_coef_active=None or use_adaptive_entropy=False)."
                )
            if self.entropy_coef == 0 and active != 0:
                raise ValueError(
                    "adrs_entropy_coef_active needs entropy_coef != 0 (TRL adds the entropy bonus only when it starts "
                    "non-zero): set entropy_coef to the base coefficient (fix5: 0.001) or adrs_entropy_coef_active=None."
                )

    def _advantage_estimators(self) -> tuple[str, ...]:
        return ("grpo",)  # ADRS adds its teacher term to GRPO's z-score

    @property
    def resolved_adrs_unit(self) -> str:
        """`adrs_unit`, with "auto" resolved from `row_format`."""
        if self.adrs_unit != "auto":
            return self.adrs_unit
        return "step" if self.row_format == "step" else "episode"


class ADRSTrainer(AgentGRPOTrainer):
    """ADRS on `AgentGRPOTrainer`: the change is `compute_advantages` (see the module docstring)."""

    _tag_names: ClassVar[list[str]] = ["trl", "trl-agents", "adrs"]
    _name = "ADRS"
    config_class = ADRSConfig
    methods = (
        MethodInfo("adrs", "arXiv 2608.03223", "trl_agents.distill.adrs", max_staleness=1, title="ADRS",
                   hook="compute_advantages",
                   inputs=("episode returns", "teacher log-probs of the sampled actions under a privileged view"),
                   tests=("tests/methods/adrs/",)),
    )
    signals = ("teacher_logprobs",)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._base_entropy_coef = self.args.entropy_coef

    def compute_advantages(self, groups: list[Group]) -> list[list[list[float]]]:
        args = self.args
        step = self.state.global_step + 1  # the optimizer step these rollouts train (verl's 1-based global_steps)
        eta_eff = adrs_eta_schedule(step, args.adrs_eta, args.adrs_warmup_steps, args.adrs_active_steps)
        advantages = self.estimate(
            "adrs", groups, eta_eff=eta_eff, adrs_unit=args.resolved_adrs_unit,
            gather=self._gather_values if self.accelerator.num_processes > 1 else None,
        )
        if args.adrs_entropy_coef_active is not None:
            if self.model.training:  # TRL reads self.entropy_coef in the loss of the steps these rollouts feed
                self.entropy_coef = args.adrs_entropy_coef_active if eta_eff > 0 else self._base_entropy_coef
            self.log_global_means({"adrs/entropy_coef": (float(self.entropy_coef), 1.0)})
        return advantages

    def _gather_values(self, values: list[float]) -> list[float]:
        """`values` of every process, concatenated in process order (the batch statistics of ADRS: mean_batch c, the
        median group σ, the "global" std; every process computes credit at the same point, so the calls line up)."""
        from accelerate.utils import gather_object

        return [value for part in gather_object([list(values)]) for value in part]
