"""The Dark Room study's arms: next-observation prediction as a reward, or as an auxiliary loss (arXiv 2607.21273;
docs/methods/dark_room.md).

The agent plays an environment wrapped by `predict` (`trl_agents.envs.prediction`): it answers
`<action>...</action><predict>...</predict>`, the environment receives only the action. After each rollout the
trainer scores every prediction against the observation that followed, acc_t = sim(pred_t, o_{t+1})
(`step.signals["prediction_accuracy"]`), and trains one arm (`dark_room_arm`):

* `"reward"` — (a) the reward channel: potential-based shaping F_t = γ·Φ_{t+1} − Φ_t on Φ = prediction accuracy,
  R' = R + c·Σ_t F_t, credited by the RL estimator; (b) is this arm with `scale_rewards="none"` instead of `"group"`;
* `"aux"` — (c) the auxiliary channel: EnvRL's SP loss, cross-entropy on the gold o_{t+1} (no shaping);
* `"placebo"` — (d) the same loss with the targets permuted across the rollout's steps;
* `"baseline"` — plain RL; predictions are scored and logged, nothing trains on them.

A `DarkRoomMonitor` (trl_agents.callbacks) is attached (`dark_room_monitor`): `dark_room/*` metrics (prediction
accuracy, success, length vs horizon, all-fail fraction, the dense share of the advantage) and one warning per
collapse condition. Math in `trl_agents/distill/dark_room.py`.

Example:
    ```python
    from datasets import Dataset
    from trl_agents.envs import get_env_class
    from trl_agents.trainers.dark_room import DarkRoomConfig, DarkRoomTrainer

    tasks = Dataset.from_list(get_env_class("predict").task_split("train", 512, inner="alfworld"))
    config = DarkRoomConfig(output_dir="alfworld-dark-room", env_kwargs={"inner": "alfworld"}, max_turns=50,
                            dark_room_arm="reward", prediction_coef=0.1, scale_rewards="none")
    DarkRoomTrainer(model="Qwen/Qwen3-1.7B", args=config, train_dataset=tasks).train()
    ```
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ..names import check_choice
from ..distill.dark_room import (
    ACCURACY_SIGNAL,
    POTENTIALS,
    SHAPING_SIGNAL,
    SIMILARITIES,
    shaped_group,
    shaping_terms,
    step_accuracies,
)
from ..distill.envrl import next_observation
from ..envs.prediction import PREDICTION_TAG, extract_prediction
from ..trajectory import Group
from .envrl import EnvRLConfig, EnvRLTrainer
from .registry import MethodInfo

ARMS = ("reward", "aux", "placebo", "baseline")


@dataclass
class DarkRoomConfig(EnvRLConfig):
    r"""
    Configuration of [`DarkRoomTrainer`]: every [`EnvRLConfig`] field (the auxiliary arms use its SP loss) plus the
    study's (docs/methods/dark_room.md).

    Args:
        dark_room_arm (`str`, *optional*, defaults to `"reward"`): `"reward"`, `"aux"`, `"placebo"` or `"baseline"`.
        prediction_coef (`float`, *optional*, defaults to `1.0`): c, the shaping coefficient of the reward arm.
        prediction_gamma (`float`, *optional*, defaults to `1.0`): γ of F_t = γ·Φ_{t+1} − Φ_t.
        prediction_potential (`str`, *optional*, defaults to `"mean_accuracy"`): Φ.
        prediction_similarity (`str`, *optional*, defaults to `"ratio"`): sim(pred, o).
        prediction_tag (`str`, *optional*, defaults to `"predict"`): The tag holding the prediction.
        dark_room_monitor (`bool`, *optional*, defaults to `True`): Attach the collapse monitor.
    """

    dark_room_arm: str = field(
        default="reward",
        metadata={"help": "'reward': prediction accuracy shaped into the reward (the failing recipe; with "
        "scale_rewards='none' the no-std fix); 'aux': SP cross-entropy on the gold next observation (the fix that "
        "works); 'placebo': SP on targets shuffled across steps; 'baseline': plain RL (predictions only logged)."},
    )
    prediction_coef: float = field(
        default=1.0,
        metadata={"help": "c, the shaping coefficient: R' = R + c·Σ_t F_t (reward arm). Our choice: 1 (the study "
        "shows z-scored advantages of all-fail groups do not depend on c)."},
    )
    prediction_gamma: float = field(
        default=1.0,
        metadata={"help": "γ of the shaping F_t = γ·Φ_{t+1} − Φ_t, in [0, 1]. Our choice: 1, so that Σ_t F_t = Φ_T, "
        "the episode's mean prediction accuracy with prediction_potential='mean_accuracy'."},
    )
    prediction_potential: str = field(
        default="mean_accuracy",
        metadata={"help": "Φ of a state: 'mean_accuracy' (Φ_{t+1} = mean of acc_0..acc_t, Φ_0 = 0) or "
        "'last_accuracy' (Φ_{t+1} = acc_t: how well the state reached was predicted). Our choice: the paper only "
        "says Φ = prediction accuracy."},
    )
    prediction_similarity: str = field(
        default="ratio",
        metadata={"help": "sim(pred, o_{t+1}) in [0, 1] on lower-cased, whitespace-collapsed text: 'ratio' "
        "(difflib character ratio), 'token_f1' or 'exact'. Our choice; a missing prediction scores 0."},
    )
    prediction_tag: str = field(
        default=PREDICTION_TAG,
        metadata={"help": "Name of the tag holding the prediction, <predict>...</predict> (our output format; the "
        "`predict` environment wrapper uses the same default)."},
    )
    dark_room_monitor: bool = field(
        default=True, metadata={"help": "Attach a DarkRoomMonitor: dark_room/* metrics and collapse warnings."}
    )
    # The auxiliary arms train SP alone, at a constant weight (our choices; EnvRL's ID loss and decay stay available).
    envrl_sp_coef: float = field(
        default=0.1,
        metadata={"help": "λ of the SP loss in the 'aux' and 'placebo' arms (our choice: 0.1, EnvRL's 7B value)."},
    )
    envrl_id_coef: float = field(
        default=0.0,
        metadata={"help": "λ₀ of EnvRL's inverse-dynamics loss (our choice: 0, the study uses SP alone)."},
    )
    envrl_schedule: str = field(
        default="constant",
        metadata={"help": "Schedule of the auxiliary weights (our choice: 'constant'; EnvRL's 'cosine', 'linear')."},
    )

    def __post_init__(self):
        super().__post_init__()
        check_choice("dark_room_arm", self.dark_room_arm, ARMS)
        check_choice("prediction_potential", self.prediction_potential, POTENTIALS)
        check_choice("prediction_similarity", self.prediction_similarity, SIMILARITIES)
        if not (isinstance(self.prediction_coef, int | float) and math.isfinite(self.prediction_coef)):
            raise ValueError(f"prediction_coef must be a finite number (c of R' = R + c·ΣF), got {self.prediction_coef!r}")
        if not (math.isfinite(self.prediction_gamma) and 0.0 <= self.prediction_gamma <= 1.0):
            raise ValueError(f"prediction_gamma must be in [0, 1] (our default 1.0), got {self.prediction_gamma}")
        if self.dark_room_arm in ("aux", "placebo") and self.envrl_sp_coef <= 0:
            raise ValueError(f"dark_room_arm={self.dark_room_arm!r} trains the SP loss: set envrl_sp_coef > 0 "
                             "(default 0.1)")


class DarkRoomTrainer(EnvRLTrainer):
    """The Dark Room study's arms on `AgentGRPOTrainer` (see the module docstring).

    Logs `dark_room/prediction_rate` (steps with a prediction), `dark_room/step_accuracy` (mean acc_t over the steps
    with an o_{t+1}), `dark_room/shaping_return` (mean c·Σ_t F_t per episode, reward arm) and, through the monitor,
    the `dark_room/*` collapse diagnostics; the SP arms log EnvRL's `envrl/*`.
    """

    _tag_names: ClassVar[list[str]] = ["trl", "trl-agents", "dark-room"]
    _name = "DarkRoom"
    config_class = DarkRoomConfig
    methods = (
        MethodInfo("dark_room", "arXiv 2607.21273", "trl_agents.distill.dark_room", max_staleness=1, title="Dark Room",
                   hook="compute_advantages + compute_auxiliary_loss",
                   inputs=("episode returns",
                           "next-observation predictions (<predict> blocks) and the observations that followed"),
                   tests=("tests/methods/dark_room/",)),
    )

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.args.dark_room_monitor:
            from ..callbacks.dark_room import DarkRoomMonitor

            self.add_callback(DarkRoomMonitor(self))

    @classmethod
    def sp_enabled(cls, args: Any) -> bool:
        return args.dark_room_arm in ("aux", "placebo") and args.envrl_sp_coef > 0

    @classmethod
    def sp_targets(cls, args: Any) -> str:
        return "shuffled" if args.dark_room_arm == "placebo" else "gold"

    def coefficients(self) -> tuple[float, float]:
        sp, id_ = super().coefficients()
        return (sp if self.sp_enabled(self.args) else 0.0), id_

    def compute_advantages(self, groups: list[Group]) -> list[list[list[float]]]:
        args = self.args
        predicted, scored, accuracy_sum, shaping_returns = 0, 0, 0.0, []
        shaped_groups = []
        for group in groups:
            terms = []
            for trajectory in group.trajectories:
                accuracies = step_accuracies(trajectory, similarity=args.prediction_similarity,
                                             tag=args.prediction_tag, next_observation=next_observation)
                for step, acc in zip(trajectory.steps, accuracies, strict=True):
                    step.signals[ACCURACY_SIGNAL] = acc
                    predicted += extract_prediction(step.action_text, args.prediction_tag) is not None
                    if acc is not None:
                        scored += 1
                        accuracy_sum += acc
                row = shaping_terms([a or 0.0 for a in accuracies], args.prediction_gamma, args.prediction_potential)
                terms.append(row)
                if args.dark_room_arm == "reward":
                    for step, f in zip(trajectory.steps, row, strict=True):
                        step.signals[SHAPING_SIGNAL] = args.prediction_coef * f  # c·F_t
                    shaping_returns.append(args.prediction_coef * sum(row))
            shaped_groups.append(shaped_group(group, terms, args.prediction_coef) if args.dark_room_arm == "reward"
                                 else group)
        num_steps = sum(len(t.steps) for g in groups for t in g.trajectories)
        self.log_global_means({
            "dark_room/prediction_rate": (predicted, num_steps),
            "dark_room/step_accuracy": (accuracy_sum, scored),
            "dark_room/shaping_return": (sum(shaping_returns), len(shaping_returns)),
        })
        # The RL estimator sees R' = R + c·ΣF (reward arm) or R; the recorded episodes keep the environment's rewards.
        return super().compute_advantages(shaped_groups)
