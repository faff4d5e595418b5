"""Tool-RL collapse fixes: GRPO for multi-turn tool use with a control-token collapse monitor and ground-truth
supervision switches (Hao et al. 2026, "Why Multi-Step Tool-Use RL Collapses and How Supervisory Signals Fix It",
arXiv 2606.26027; docs/methods/toolrl.md).

The changes w.r.t. `AgentGRPOTrainer`, each a config switch (all off except the monitor):

1. **Control-token monitor** (`toolrl_monitor`, on): a `ControlTokenMonitor` (`callbacks/control_tokens.py`) logs
   the sampling probability and the share of the action-format control tokens and the parsable-action rate of every
   rollout, warns on a spike / drop against a running baseline and, with `toolrl_monitor_action`, stops training or
   starts an SFT repair phase (switch 2).
2. **Interleaved SFT on ground-truth demonstrations (ETS)** (`toolrl_sft_every` > 0): every `toolrl_sft_every`
   training steps, the tasks that had at least one zero-reward ordinary rollout in the last `toolrl_sft_window`
   training rollouts are replayed with their ground truth (GT: `expert_plan()` / `optimal_plan()`), one
   (prompt, action) example per turn rendered exactly as the RL step prompts, and the live model is fine-tuned on
   them (`toolrl_sft_epochs` epochs at `toolrl_sft_learning_rate`, a fresh AdamW); RL then continues from these
   weights with its own optimizer state.
3. **Off-policy GT supervision (OPS)** (`toolrl_replace_num` > 0): in every group, that many rollouts are teacher
   forced on the GT action of every turn (the `supervised` topology; the environment is stepped with them and
   rewarded as usual). Loss on their tokens: TRL's (`toolrl_off_policy_loss="vanilla"`, the released launcher), or
   LUFFY's shaping (`"luffy"`): the released actor's max(−A·f, −A·clip(f, 1−ε_low, 1+ε_high)), f = π_θ/(π_θ+γ), the
   clipped ratio loss unchanged on the other tokens.
4. **Hint guidance (HBG)** (`toolrl_hint_num` > 0): that many rollouts per group sample with a hint after the system
   prompt (a dataset column, `toolrl_hint_column`, or our template over the GT plan); the trained prompt is the
   hint-free one (off-policy tokens, TRL's loss).

Advantages are GRPO's over the whole group (supervised rollouts included, as in the released code). Logs `toolrl/*`
(success rate of each kind of rollout, SFT phases, LUFFY ratio) and `control/*` (the monitor).

Example:
    ```python
    from datasets import Dataset
    from trl_agents.envs import get_env_class
    from trl_agents.trainers.toolrl import ToolRLConfig, ToolRLTrainer

    tasks = Dataset.from_list(get_env_class("searchqa").task_split("train", 5000))
    config = ToolRLConfig(output_dir="searchqa-toolrl", env_name="searchqa", max_turns=6, num_generations=8,
                          toolrl_replace_num=1, toolrl_sft_every=50)
    ToolRLTrainer(model="Qwen/Qwen2.5-1.5B-Instruct", args=config, train_dataset=tasks).train()
    ```
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from transformers import TrainerCallback

from ..callbacks.control_tokens import SEARCHQA_CONTROL_TOKENS, SIGNS, ControlTokenMonitor
from ..names import check_choice
from ..credit.toolrl import (
    off_policy_token_loss,
    shaped_off_policy_ratio,
    zero_reward_tasks,
)
from ..envs import get_env_class
from ..envs.base import has_plans
from ..training.batch import token_signal_key
from ..rollout.topologies.supervised import DEFAULT_HINT_TEMPLATE, SupervisedTopology, group_composition
from ..signals.base import SIGNALS, ModelSignal, register_signal
from ..trajectory import Group, first_occurrences
from .agent_grpo import AgentGRPOConfig, AgentGRPOTrainer
from .agent_grpo_config import as_dict
from ..training.batch import loss_mask
from .registry import MethodInfo

logger = logging.getLogger(__name__)

FORCED_SIGNAL = "toolrl_forced"
STATE_FILE = "toolrl_state.json"
OFF_POLICY_LOSSES = ("vanilla", "luffy")
MONITOR_ACTIONS = ("warn", "stop", "repair")
KINDS = ("ordinary", "forced", "hinted")


def rollout_kind(trajectory) -> str:
    """'forced', 'hinted' or 'ordinary' (from the `supervision` mark of its steps)."""
    for step in trajectory.owned_steps:
        mark = step.info.get("supervision")
        if mark:
            return str(mark)
    return "ordinary"


class ForcedTokenSignal(ModelSignal):
    """1.0 on the action tokens of teacher-forced steps, 0.0 elsewhere (no forward): lets the loss find them."""

    name = FORCED_SIGNAL
    description = "1 on the tokens of teacher-forced (ground-truth) steps, else 0 (no forward)"
    recorded = False  # the `supervision` mark in step.info already says it
    layout = "tokens"

    def compute(self, groups: Sequence[Group], context) -> None:
        for trajectory, indices in first_occurrences(groups):
            for i in indices:
                step = trajectory.steps[i]
                forced = 1.0 if step.info.get("supervision") == "forced" else 0.0
                step.signals[self.name] = [forced] * len(step.action_ids)


if FORCED_SIGNAL not in SIGNALS:
    register_signal(FORCED_SIGNAL, ForcedTokenSignal)


@dataclass
class ToolRLConfig(AgentGRPOConfig):
    r"""
    Configuration of [`ToolRLTrainer`]: every [`AgentGRPOConfig`] field plus the Tool-RL switches (docs/methods/
    toolrl.md). `num_generations` is G, the group size including the supervised rollouts.
    """

    toolrl_replace_num: int = field(
        default=0,
        metadata={"help": "OPS: rollouts per group teacher-forced on the ground-truth action of every turn (the paper: "
        "1 of 8; 0 = off)."},
    )
    toolrl_off_policy_loss: str = field(
        default="vanilla",
        metadata={"help": "Loss on the teacher-forced tokens: 'vanilla' (TRL's clipped loss, as the released launcher "
        "runs OPS) or 'luffy' (max(−A·f, −A·clip(f)) with f = π/(π+γ), the actor's sft_replace option)."},
    )
    toolrl_luffy_gamma: float = field(
        default=0.1, metadata={"help": "γ of LUFFY's shaping f = π/(π+γ) (0.1 in the released actor)."}
    )
    toolrl_luffy_clip: bool = field(
        default=True,
        metadata={"help": "The released actor's pessimistic clip: loss max(−A·f, −A·clip(f, 1 − epsilon, 1 + "
        "epsilon_high)), so a ground-truth token with A > 0 keeps LUFFY's push at any π and one with A < 0 stops "
        "being pushed down once f < 1 − epsilon; False: LUFFY's plain −A·f."},
    )
    toolrl_hint_num: int = field(
        default=0,
        metadata={"help": "HBG: rollouts per group sampled with a hint after the system prompt, trained on the "
        "hint-free prompt (the paper: 2 of 8; 0 = off)."},
    )
    toolrl_hint_column: str | None = field(
        default=None,
        metadata={"help": "Dataset column holding each task's hint (the paper's offline LLM-written hints); None: "
        "built from the ground-truth plan with toolrl_hint_template (our choice)."},
    )
    toolrl_hint_template: str = field(
        default=DEFAULT_HINT_TEMPLATE,
        metadata={"help": "Template of plan hints, '{plan}' is replaced by the ground-truth actions joined by ' then ' "
        "(our choice of wording)."},
    )
    toolrl_sft_every: int = field(
        default=0,
        metadata={"help": "ETS: run an SFT phase on ground-truth demonstrations every this many training steps (the "
        "paper: rounds of 50 steps; 0 = off). No phase after the last step."},
    )
    toolrl_sft_window: int = field(
        default=10,
        metadata={"help": "ETS: the tasks with a zero-reward ordinary rollout in the last this many training rollouts "
        "are demonstrated (the paper: the reward records of the last 10 RL steps)."},
    )
    toolrl_sft_learning_rate: float = field(
        default=1e-5, metadata={"help": "Learning rate of the SFT phases (the paper's SFT: 1e-5)."}
    )
    toolrl_sft_epochs: int = field(default=3, metadata={"help": "Epochs of an SFT phase (the paper's SFT: 3)."})
    toolrl_sft_batch_size: int = field(
        default=128,
        metadata={"help": "Examples per SFT optimizer step (the paper's SFT: 128), accumulated over micro-batches of "
        "per_device_train_batch_size."},
    )
    toolrl_sft_max_examples: int | None = field(
        default=None,
        metadata={"help": "Cap on the examples of one SFT phase (a seeded sample; None = all; our choice)."},
    )
    toolrl_monitor: bool = field(
        default=True, metadata={"help": "Attach the ControlTokenMonitor (our choice: on; it adds no forward)."}
    )
    toolrl_control_tokens: list[str] = field(
        default_factory=lambda: list(SEARCHQA_CONTROL_TOKENS),
        metadata={"help": "Control-token strings the monitor tracks (our choice for Search-QA: search, answer, [, ]; "
        "the paper instruments '{\"', '<tool_call>' and '<|im_end|>' on BFCL)."},
    )
    toolrl_control_include_eos: bool = field(
        default=True, metadata={"help": "Count the end-of-turn token ids as control tokens (our choice)."}
    )
    toolrl_monitor_prob_jump: float = field(
        default=0.25,
        metadata={"help": "Monitor: a control_prob_spike when the control tokens' mean probability rises this much above "
        "its running baseline (our choice)."},
    )
    toolrl_monitor_share_ratio: float = field(
        default=2.0,
        metadata={"help": "Monitor: a control_share_spike when the control tokens' share of the generated tokens "
        "reaches this multiple of its baseline (our choice)."},
    )
    toolrl_monitor_valid_ratio: float = field(
        default=0.7,
        metadata={"help": "Monitor: a valid_action_drop when the parsable-action rate falls to this fraction of its "
        "baseline (our choice, as EchoTrapMonitor)."},
    )
    toolrl_monitor_baseline: int = field(
        default=3, metadata={"help": "Monitor: rollouts in the running baseline (our choice)."}
    )
    toolrl_monitor_patience: int = field(
        default=1, metadata={"help": "Monitor: rollouts in a row a sign must hold before it is reported (our choice)."}
    )
    toolrl_monitor_action: str = field(
        default="warn",
        metadata={"help": "What a reported sign does: 'warn' (log only), 'stop' (stop training) or 'repair' (an SFT "
        "phase on ground-truth demonstrations right away; our choice, the paper's §4.6 direction)."},
    )
    topology: str = field(
        default="supervised",
        metadata={"help": "Tool-RL mixes ordinary and supervised rollouts in a group: 'supervised'."},
    )

    def __post_init__(self):
        super().__post_init__()
        check_choice("toolrl_off_policy_loss", self.toolrl_off_policy_loss, OFF_POLICY_LOSSES)
        check_choice("toolrl_monitor_action", self.toolrl_monitor_action, MONITOR_ACTIONS)
        group_composition(self.num_generations, self.toolrl_replace_num, self.toolrl_hint_num)
        if self.topology != "supervised":
            raise ValueError(f"Tool-RL runs on the 'supervised' topology, got topology={self.topology!r}")
        if not (math.isfinite(self.toolrl_luffy_gamma) and self.toolrl_luffy_gamma > 0):
            raise ValueError(f"toolrl_luffy_gamma must be a finite number > 0 (LUFFY: 0.1), got {self.toolrl_luffy_gamma}")
        for name in ("toolrl_sft_every", "toolrl_sft_window", "toolrl_sft_epochs", "toolrl_sft_batch_size",
                     "toolrl_monitor_baseline", "toolrl_monitor_patience"):
            low = 0 if name == "toolrl_sft_every" else 1
            if getattr(self, name) < low:
                raise ValueError(f"{name} must be >= {low}, got {getattr(self, name)}")
        if self.toolrl_sft_max_examples is not None and self.toolrl_sft_max_examples < 1:
            raise ValueError(f"toolrl_sft_max_examples must be >= 1 or None, got {self.toolrl_sft_max_examples}")
        if not (math.isfinite(self.toolrl_sft_learning_rate) and self.toolrl_sft_learning_rate > 0):
            raise ValueError(f"toolrl_sft_learning_rate must be > 0 (the paper: 1e-5), got {self.toolrl_sft_learning_rate}")
        for name in ("toolrl_monitor_prob_jump", "toolrl_monitor_share_ratio", "toolrl_monitor_valid_ratio"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {value}")
        if "{plan}" not in self.toolrl_hint_template:
            raise ValueError(f"toolrl_hint_template must contain '{{plan}}', got {self.toolrl_hint_template!r}")
        if self.toolrl_monitor_action != "warn" and not self.toolrl_monitor:
            raise ValueError(f"toolrl_monitor_action={self.toolrl_monitor_action!r} needs toolrl_monitor=True")
        if self.row_format != "step" and (self.toolrl_hint_num or self.uses_sft):
            raise ValueError("toolrl_hint_num and the SFT phases (toolrl_sft_every, toolrl_monitor_action='repair') "
                             "need row_format='step': hints are left out of the trained prompt, demonstrations are "
                             "rendered as step prompts")

    @property
    def uses_sft(self) -> bool:
        return self.toolrl_sft_every > 0 or self.toolrl_monitor_action == "repair"

    @property
    def uses_luffy(self) -> bool:
        return self.toolrl_off_policy_loss == "luffy" and self.toolrl_replace_num > 0


class ToolRLTrainer(AgentGRPOTrainer):
    """Tool-RL on `AgentGRPOTrainer` (see the module docstring).

    Logs `toolrl/<kind>_success` and `toolrl/<kind>_return` for kind in ordinary, forced, hinted (where the group
    has them), `toolrl/sft_phases`, `toolrl/sft_tasks`, `toolrl/sft_examples`, `toolrl/sft_loss_first`,
    `toolrl/sft_loss_last` (at a phase), `toolrl/luffy_ratio` (LUFFY), and the monitor's `control/*`.
    """

    _tag_names: ClassVar[list[str]] = ["trl", "trl-agents", "toolrl"]
    _name = "ToolRL"
    config_class = ToolRLConfig
    methods = (
        MethodInfo("toolrl", "arXiv 2606.26027", "trl_agents.credit.toolrl",
                   max_staleness=0,
                   staleness_reason=("its LUFFY shaping of forced tokens and its ratio of 1 at the first update "
                                     "assume on-policy generation"),
                   title="Tool-RL collapse fixes",
                   hook="topology (supervised) + loss_advantages + compute_auxiliary_loss + callbacks (monitor, SFT)",
                   inputs=("episode returns", "ground-truth actions (expert_plan / optimal_plan)",
                           "sampling log-probs of control tokens"),
                   tests=("tests/methods/toolrl/",)),
    )

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        config = self.args
        if config.toolrl_replace_num or config.uses_sft or (config.toolrl_hint_num and config.toolrl_hint_column is None):
            for env_name in self._env_names():
                if not has_plans(get_env_class(env_name)):
                    raise ValueError(
                        f"environment {env_name!r} has no ground-truth actions (expert_plan() or optimal_plan()), "
                        "which toolrl_replace_num, the SFT phases and plan hints need: turn them off, or name a "
                        "hint column (toolrl_hint_column)"
                    )
        columns = getattr(self.train_dataset, "column_names", None)
        if config.toolrl_hint_num and config.toolrl_hint_column and columns is not None \
                and config.toolrl_hint_column not in columns:
            raise ValueError(f"toolrl_hint_column={config.toolrl_hint_column!r} is not a column of the training data "
                             f"(columns: {', '.join(columns)})")
        self._window: deque[tuple[dict[str, dict], dict[str, dict]]] = deque(maxlen=config.toolrl_sft_window)
        self._repair_requested = False
        self.sft_phases = 0
        self.sft_history: list[dict[str, Any]] = []
        self.monitor: ControlTokenMonitor | None = None
        if config.toolrl_monitor:
            on_alert = [self._request_repair] if config.toolrl_monitor_action == "repair" else []
            self.monitor = ControlTokenMonitor(
                self,
                control_tokens=config.toolrl_control_tokens,
                include_eos=config.toolrl_control_include_eos,
                baseline_logs=config.toolrl_monitor_baseline,
                prob_jump=config.toolrl_monitor_prob_jump,
                share_ratio=config.toolrl_monitor_share_ratio,
                valid_ratio=config.toolrl_monitor_valid_ratio,
                patience=config.toolrl_monitor_patience,
                stop_on=SIGNS if config.toolrl_monitor_action == "stop" else (),
                on_alert=on_alert,
            )
            self.add_callback(self.monitor)
        if config.uses_sft:
            self.add_callback(_InterleavedSFT(self))  # after the monitor: a repair it asks for runs at the same step

    def _env_names(self) -> list[str]:
        columns = getattr(self.train_dataset, "column_names", None) or []
        if "env" in columns:
            return sorted({str(name) for name in self.train_dataset["env"]})
        return [self.args.env_name] if self.args.env_name else []

    # ---- what the method needs ----------------------------------------------------------------------------------

    @classmethod
    def topology_options(cls, args: Any) -> dict[str, Any]:
        return {"replace_num": args.toolrl_replace_num, "hint_num": args.toolrl_hint_num,
                "env_name": args.env_name, "env_kwargs": as_dict(args.env_kwargs, "env_kwargs"),
                "max_turns": args.max_turns, "hint_column": args.toolrl_hint_column,
                "hint_template": args.toolrl_hint_template}

    @classmethod
    def signal_names(cls, args: Any) -> tuple[str, ...]:
        luffy = args.toolrl_off_policy_loss == "luffy" and args.toolrl_replace_num > 0
        return (FORCED_SIGNAL,) if luffy else ()

    @classmethod
    def training_signal_names(cls, args: Any) -> tuple[str, ...]:
        return cls.signal_names(args)

    # ---- credit: GRPO over the whole group, with per-kind diagnostics -------------------------------------------

    def compute_advantages(self, groups: list[Group]) -> list[list[list[float]]]:
        advantages = super().compute_advantages(groups)
        totals: dict[str, tuple[float, float]] = {}
        for kind in KINDS:
            episodes = [t for g in groups for t in g.trajectories if rollout_kind(t) == kind]
            totals[f"toolrl/{kind}_success"] = (float(sum(t.success for t in episodes)), float(len(episodes)))
            totals[f"toolrl/{kind}_return"] = (float(sum(t.episode_return for t in episodes)), float(len(episodes)))
        self.log_global_means(totals)
        if self.model.training:
            failed = zero_reward_tasks(groups)
            seen = {g.task_id: dict(g.task) for g in groups}
            self._window.append((failed, seen))
        return advantages

    # ---- LUFFY on the teacher-forced tokens ---------------------------------------------------------------------

    def _forced_mask(self, inputs: dict[str, Any]) -> torch.Tensor | None:
        values = inputs.get(token_signal_key(FORCED_SIGNAL))
        if values is None or not self.args.uses_luffy:
            return None
        return (torch.nan_to_num(values, nan=0.0) > 0.5) & loss_mask(inputs).bool()

    def loss_advantages(self, inputs: dict[str, Any], per_token_logps: torch.Tensor) -> torch.Tensor | None:
        forced = self._forced_mask(inputs)
        if forced is None:
            return None
        advantages = inputs["advantages"]
        if advantages.dim() == 1:
            advantages = advantages.unsqueeze(1).expand_as(per_token_logps)
        return torch.where(forced, torch.zeros_like(advantages), advantages)  # their loss is the auxiliary term

    def compute_auxiliary_loss(self, model, inputs: dict[str, Any], per_token_logps):
        forced = self._forced_mask(inputs)
        if forced is None or per_token_logps is None:
            return None
        clip = (1.0 - self.epsilon_low, 1.0 + self.epsilon_high) if self.args.toolrl_luffy_clip else None
        gamma = self.args.toolrl_luffy_gamma
        loss = off_policy_token_loss(per_token_logps, inputs["advantages"], forced, gamma, clip)
        self.log_token_means({"toolrl/luffy_ratio": shaped_off_policy_ratio(per_token_logps.detach(), gamma)},
                             forced)  # f = π/(π + γ), before the clip
        return self.batch_token_mean(loss, forced, inputs)

    # ---- resume: the ETS window, the phase count and the monitor's baselines ------------------------------------

    def save_extra_state(self, output_dir: str) -> None:
        state = {"window": [[failed, seen] for failed, seen in self._window], "sft_phases": self.sft_phases,
                 "monitor": None}
        if self.monitor is not None:
            state["monitor"] = {"baselines": self.monitor.baselines, "streaks": self.monitor.streaks,
                                "warned": sorted(self.monitor.warned)}
        with open(os.path.join(output_dir, STATE_FILE), "w") as handle:
            json.dump(state, handle, indent=2, default=str)

    def load_extra_state(self, checkpoint_dir: str) -> None:
        path = os.path.join(checkpoint_dir, STATE_FILE)
        if not os.path.isfile(path):
            return
        with open(path) as handle:
            state = json.load(handle)
        self._window.clear()
        for failed, seen in state.get("window", []):
            self._window.append((failed, seen))
        self.sft_phases = int(state.get("sft_phases", 0))
        monitor = state.get("monitor")
        if self.monitor is not None and monitor:
            self.monitor.baselines = {name: list(monitor["baselines"].get(name, [])) for name in self.monitor.baselines}
            self.monitor.streaks = {sign: int(monitor["streaks"].get(sign, 0)) for sign in self.monitor.streaks}
            self.monitor.warned = set(monitor.get("warned", []))

    # ---- ETS: SFT phases on ground-truth demonstrations ---------------------------------------------------------

    def _request_repair(self, signs: list[str], step: int | None) -> None:
        logger.warning("Tool-RL: collapse sign(s) %s at step %s: an SFT repair phase runs now.", ", ".join(signs), step)
        self._repair_requested = True

    def selected_tasks(self, repair: bool = False) -> dict[str, dict]:
        """The tasks of the next SFT phase: those with a zero-reward ordinary rollout in the window (for a repair
        with none: every task of the window; our choice), the same on every process (union over processes)."""
        failed: dict[str, dict] = {}
        seen: dict[str, dict] = {}
        for part_failed, part_seen in self._window:
            failed.update(part_failed)
            seen.update(part_seen)
        local = failed or (seen if repair else {})
        if self.accelerator.num_processes > 1:
            from accelerate.utils import gather_object

            merged: dict[str, dict] = {}
            for part in gather_object([local]):
                merged.update(part)
            local = merged
        return dict(sorted(local.items()))

    def demonstrations(self, tasks: dict[str, dict]) -> list[tuple[list[int], list[int]]]:
        """(prompt ids, action ids + EOS) of every turn of the GT episode of every task, the prompt rendered exactly
        as the RL step prompts (system prompt, task text, history window, observation)."""
        topology = self.rollout_topology
        tokenizer = self.text_tokenizer
        examples = []
        for task in tasks.values():
            episode = topology.ground_truth(task) if isinstance(topology, SupervisedTopology) else None
            if episode is None:
                continue
            system = self.args.system_prompt if self.args.system_prompt is not None else episode["system"]
            history: list[tuple[str, str]] = []
            for observation, action in episode["turns"]:
                prompt_ids, _ = self.renderer.step_prompt(system, episode["task_text"], history, observation,
                                                          episode.get("tools", ()))
                action_ids = tokenizer.encode(action, add_special_tokens=False) + [tokenizer.eos_token_id]
                examples.append((list(prompt_ids), action_ids))
                history.append((observation, action))
        return examples

    def run_sft_phase(self, repair: bool = False) -> dict[str, float]:
        """One SFT phase on the live model (see the module docstring); returns its diagnostics."""
        args = self.args
        tasks = self.selected_tasks(repair)
        examples = self.demonstrations(tasks)
        rng = random.Random(args.seed + self.sft_phases)
        if args.toolrl_sft_max_examples is not None and len(examples) > args.toolrl_sft_max_examples:
            examples = rng.sample(examples, args.toolrl_sft_max_examples)
        self.sft_phases += 1
        info = {"tasks": float(len(tasks)), "examples": float(len(examples)), "loss_first": math.nan,
                "loss_last": math.nan, "repair": float(repair)}
        if examples:
            losses = sft_steps(self.accelerator.unwrap_model(self.model), examples, rng=rng,
                               epochs=args.toolrl_sft_epochs, batch_size=args.toolrl_sft_batch_size,
                               micro_batch_size=max(args.per_device_train_batch_size, 1),
                               learning_rate=args.toolrl_sft_learning_rate,
                               pad_token_id=self.text_tokenizer.pad_token_id or 0)
            info["loss_first"], info["loss_last"] = losses[0], losses[-1]
        self.sft_history.append({"step": self.state.global_step, **info})
        logger.info("Tool-RL SFT phase %d at step %d: %d tasks, %d examples, loss %.4f -> %.4f", self.sft_phases,
                    self.state.global_step, len(tasks), len(examples), info["loss_first"], info["loss_last"])
        self.log_metric("toolrl/sft_phases", float(self.sft_phases))
        for name in ("tasks", "examples", "loss_first", "loss_last"):
            if math.isfinite(info[name]):
                self.log_metric(f"toolrl/sft_{name}", info[name])
        return info


def sft_steps(
    model,
    examples: list[tuple[list[int], list[int]]],
    *,
    rng: random.Random,
    epochs: int,
    batch_size: int,
    micro_batch_size: int,
    learning_rate: float,
    pad_token_id: int,
) -> list[float]:
    """Fine-tune `model` in place on (prompt ids, completion ids) pairs: the token-mean cross-entropy of the
    completions, `epochs` passes in a seeded order, one fresh AdamW step per `batch_size` examples (accumulated over
    micro-batches). Returns the mean loss of every epoch. Gradients are cleared afterwards."""
    parameters = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(parameters, lr=learning_rate, weight_decay=0.0)
    device = next(model.parameters()).device
    epoch_losses = []
    try:
        for _ in range(epochs):
            order = list(range(len(examples)))
            rng.shuffle(order)
            total, tokens = 0.0, 0
            for start in range(0, len(order), batch_size):
                batch = [examples[i] for i in order[start:start + batch_size]]
                batch_tokens = sum(len(c) for _, c in batch)
                optimizer.zero_grad(set_to_none=True)
                for micro in range(0, len(batch), micro_batch_size):
                    rows = batch[micro:micro + micro_batch_size]
                    width = max(len(p) + len(c) for p, c in rows)
                    ids = torch.full((len(rows), width), pad_token_id, dtype=torch.long)
                    labels = torch.full((len(rows), width), -100, dtype=torch.long)
                    attention = torch.zeros((len(rows), width), dtype=torch.long)
                    for r, (prompt, completion) in enumerate(rows):  # right padding
                        sequence = list(prompt) + list(completion)
                        ids[r, : len(sequence)] = torch.tensor(sequence)
                        labels[r, len(prompt): len(sequence)] = torch.tensor(completion)
                        attention[r, : len(sequence)] = 1
                    ids, labels, attention = ids.to(device), labels.to(device), attention.to(device)
                    logits = model(input_ids=ids, attention_mask=attention).logits[:, :-1].float()
                    loss_sum = torch.nn.functional.cross_entropy(
                        logits.reshape(-1, logits.size(-1)), labels[:, 1:].reshape(-1), ignore_index=-100,
                        reduction="sum")
                    (loss_sum / batch_tokens).backward()
                    total += float(loss_sum.detach())
                optimizer.step()
                tokens += batch_tokens
            epoch_losses.append(total / max(tokens, 1))
    finally:
        optimizer.zero_grad(set_to_none=True)
        model.zero_grad(set_to_none=True)
        del optimizer
    return epoch_losses


class _InterleavedSFT(TrainerCallback):
    """Runs the trainer's SFT phases between RL steps: every `toolrl_sft_every` steps, and when the monitor asked for
    a repair; never after the last step."""

    def __init__(self, trainer: ToolRLTrainer):
        self.trainer = trainer

    def on_step_end(self, args, state, control, **kwargs):
        trainer = self.trainer
        every = trainer.args.toolrl_sft_every
        last = state.global_step >= state.max_steps  # no RL step follows: a phase would change nothing trained
        scheduled = every > 0 and state.global_step % every == 0
        repair, trainer._repair_requested = trainer._repair_requested, False
        if (scheduled or repair) and not last and not control.should_training_stop:
            trainer.run_sft_phase(repair=repair and not scheduled)
        return control
