"""OCSD: observation-calibrated self-distillation on GRPO's advantage (arXiv 2608.04788; docs/methods/ocsd.md).

The only change w.r.t. `AgentGRPOTrainer` is `compute_advantages`: GRPO's outcome advantage A of every step, then,
on the ⌈ρ·K_i⌉ steps of each trajectory with the highest mean behaviour NLL, a per-token modulation
Â_t = A·(1 + β·sgn(A)·tanh(e_t/2)) by the observation residual e_t = log π_F(y_t) − log π_A(y_t): the policy's own
log-prob of its action token under a replay view that shows the observation the environment returned after the
action (Full) minus that under the same view with a placeholder instead (Observation-Ablated). The residuals come
from the `ocsd_residual` model signal, computed after the rollout on the selected steps only, with the current
policy (math and signal in `trl_agents/distill/ocsd.py`). No loss term is added; step rows only.

Logged per rollout: `ocsd/selected_fraction` (selected steps / steps with action tokens), `ocsd/mean_abs_q` (mean
|q| over the selected steps' tokens), `ocsd/mean_residual` (mean finite e), `ocsd/nonfinite_residual_fraction`
(tokens whose e is not finite, hence q = 0), `ocsd/mean_abs_advantage_change` (mean |Â − A| over the selected
tokens); the signal's cost as `signals/ocsd_residual_seconds`.

Example:
    ```python
    from datasets import Dataset
    from trl_agents.envs import get_env_class
    from trl_agents.trainers.ocsd import OCSDConfig, OCSDTrainer

    tasks = Dataset.from_list(get_env_class("alfworld").task_split("train", 512))
    config = OCSDConfig(output_dir="alfworld-ocsd", max_turns=50, ocsd_beta=0.5, ocsd_select_fraction=0.2)
    OCSDTrainer(model="Qwen/Qwen3-4B", args=config, train_dataset=tasks).train()
    ```
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from ..distill.ocsd import (
    DEFAULT_PLACEHOLDER,
    DEFAULT_SCAFFOLD,
    DEFAULT_TERMINAL_TEXT,
    SIGNAL_NAME,
    check_beta,
    check_fraction,
    check_scaffold,
)
from ..trajectory import Group
from .agent_grpo import AgentGRPOConfig, AgentGRPOTrainer
from .registry import MethodInfo


@dataclass
class OCSDConfig(AgentGRPOConfig):
    r"""
    Configuration of [`OCSDTrainer`]: every [`AgentGRPOConfig`] field plus OCSD's (docs/methods/ocsd.md).

    The advantage OCSD modulates is GRPO's (`scale_rewards`, `credit_statistic`, `invalid_action_penalty` as in
    GRPO); the teacher of the replay views is `teacher` ("current" in the paper). Step rows only.

    Args:
        ocsd_beta (`float`, *optional*, defaults to `0.5`): β in Â = A·(1 + β·sgn(A)·q), in [0, 1).
        ocsd_select_fraction (`float`, *optional*, defaults to `0.2`): ρ, the share of each trajectory's steps
            that are scored.
        ocsd_scaffold (`str`, *optional*): The replay scaffold, with an `{observation}` slot.
        ocsd_placeholder (`str`, *optional*, defaults to `"[observation withheld]"`): The ablated view's
            observation.
        ocsd_terminal_text (`str`, *optional*, defaults to `"[episode ended]"`): o_{k+1} of a last step that has
            no terminal observation.
    """

    ocsd_beta: float = field(
        default=0.5,
        metadata={"help": "β in Â = A·(1 + β·sgn(A)·tanh(e/2)) on the selected steps, in [0, 1) so that Â keeps A's "
        "sign. The paper's value is not public: 0.5 is our choice (multiplier in (0.5, 1.5))."},
    )
    ocsd_select_fraction: float = field(
        default=0.2,
        metadata={"help": "ρ in (0, 1]: each trajectory's ⌈ρ·K⌉ steps (at least 1) with the largest mean behaviour "
        "NLL are scored under the two replay views (OCSD: the top 20% of steps within a trajectory). Ties go to "
        "the earlier step, steps without action tokens or finite log-probs are not eligible (our choice)."},
    )
    ocsd_scaffold: str = field(
        default=DEFAULT_SCAFFOLD,
        metadata={"help": "Replay scaffold appended after the step's user message in both views; '{observation}' is "
        "the next observation (Full) or ocsd_placeholder (Observation-Ablated), nothing else differs. The paper's "
        "text is not public: our choice (docs/methods/ocsd.md)."},
    )
    ocsd_placeholder: str = field(
        default=DEFAULT_PLACEHOLDER,
        metadata={"help": "The fixed text in the scaffold's '{observation}' slot of the Observation-Ablated view "
        "(the paper: 'a fixed placeholder'; the text is our choice)."},
    )
    ocsd_terminal_text: str = field(
        default=DEFAULT_TERMINAL_TEXT,
        metadata={"help": "o_{k+1} of an episode's last step when the environment returned no terminal observation "
        "(the terminal observation is used when there is one). Our choice."},
    )

    def __post_init__(self):
        super().__post_init__()
        check_beta(self.ocsd_beta)
        check_fraction(self.ocsd_select_fraction)
        check_scaffold(self.ocsd_scaffold)
        if self.row_format != "step":
            raise ValueError(
                f"row_format={self.row_format!r} is not supported by OCSD: its replay views rewrite one step's "
                "prompt. Set row_format='step'."
            )

    def _advantage_estimators(self) -> tuple[str, ...]:
        return ("grpo",)  # OCSD modulates GRPO's advantage


class OCSDTrainer(AgentGRPOTrainer):
    """OCSD on `AgentGRPOTrainer`: the only change is `compute_advantages` (see the module docstring)."""

    _tag_names: ClassVar[list[str]] = ["trl", "trl-agents", "ocsd"]
    _name = "OCSD"
    config_class = OCSDConfig
    methods = (
        MethodInfo("ocsd", "arXiv 2608.04788", "trl_agents.distill.ocsd", max_staleness=1, title="OCSD",
                   inputs=("episode returns", "behaviour log-probs of the sampled actions",
                           ("teacher log-probs of the selected steps' actions under Full / Observation-Ablated "
                            "replay views (next observation vs a placeholder)")),
                   tests=("tests/methods/ocsd/",)),
    )
    signals = (SIGNAL_NAME,)

    @classmethod
    def signal_options(cls, args: Any) -> dict[str, dict[str, Any]]:
        options = super().signal_options(args)
        options[SIGNAL_NAME] = {
            "select_fraction": args.ocsd_select_fraction,
            "scaffold": args.ocsd_scaffold,
            "placeholder": args.ocsd_placeholder,
            "terminal_text": args.ocsd_terminal_text,
        }
        return options

    @classmethod
    def needs_teacher(cls, args: Any) -> bool:
        return True  # the replay views are scored by `teacher` (OCSD: the current policy)

    def compute_advantages(self, groups: list[Group]) -> list[list[list[float]]]:
        return self.estimate("ocsd", groups)
