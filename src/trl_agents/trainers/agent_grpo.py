"""`AgentGRPOConfig` + `AgentGRPOTrainer`: TRL's `GRPOTrainer` for multi-turn agents in environments.

The only changes w.r.t. `GRPOTrainer`:

* dataset rows are tasks (`{"env": "sokoban", "seed": 3}`), not prompts; each task runs a group of episodes;
* `_generate_and_score_completions` runs the multi-turn rollout (`RolloutEngine`, driven by the configured
  topology), computes the signals the trainer declares (`trl_agents.signals`), asks `compute_advantages(groups)` for
  one advantage per step, and returns step rows (or conversation rows with an env mask) with (B, T) advantages; old
  and reference log-probs are computed exactly as TRL does;
* `_prepare_inputs` splits the rows into micro-batches without dropping any (the number of rows varies);
* `_compute_loss` weighs TRL's loss by `policy_loss_weight` and adds `compute_auxiliary_loss(model, inputs,
  per_token_logps)` (the policy's log-probs that TRL's loss computed, reused), scaled for gradient accumulation as
  TRL scales its own loss;
* `_get_per_token_logps_and_entropies` runs TRL's own over groups of rows of similar length, each trimmed of its
  padding (`length_grouped_forwards`; the same values up to float noise, over fewer padded tokens);
* `_save` also writes `agent_config.json` and `save_extra_state(output_dir)`; `train(resume_from_checkpoint=...)`
  first calls `load_extra_state(checkpoint)`.

Method variants are thin subclasses: they declare their methods (`methods`, the registry reads them), the signals
and capabilities they need (`signals`, `required_env_capabilities`), and override public hooks only —
`compute_advantages`, `compute_auxiliary_loss`, `policy_loss_weight`, `build_topology`, `signal_options`,
`save_extra_state` / `load_extra_state` (see `trainers/gigpo.py`). TRL's private methods are overridden here and
nowhere else (`tests/test_trl_contract.py` pins what they rely on).

Example:
    ```python
    from datasets import Dataset
    from trl_agents import AgentGRPOConfig, AgentGRPOTrainer
    from trl_agents.envs import get_env_class

    tasks = Dataset.from_list(get_env_class("sokoban").task_split("train", 256))
    config = AgentGRPOConfig(output_dir="sokoban-grpo", max_turns=15, max_completion_length=64)
    trainer = AgentGRPOTrainer(model="Qwen/Qwen2.5-0.5B-Instruct", args=config, train_dataset=tasks)
    trainer.train()
    ```
"""

from __future__ import annotations

import contextlib
import inspect
import json
import logging
import math
import os
import time
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import torch
from accelerate.utils import gather_object
from datasets import Dataset, IterableDataset
from huggingface_hub import ModelCard
from transformers import TrainerCallback, TrainerState
from transformers.trainer_utils import get_last_checkpoint
from trl import GRPOConfig, GRPOTrainer
from trl.extras.profiling import profiling_context
from trl.models import unwrap_model_for_generation
from trl.trainer.utils import nanmax, nanmin, pad, shuffle_sequence_dict

from ..credit import get_estimator
from ..credit.base import check_choice
from ..envs import get_env_class
from ..fileio import atomic_write
from ..records import TRAJECTORIES_DIR, TrajectoryWriter, build_run_info, supersede_shards, write_run_info
from ..rollout import EnvPool, PromptRenderer, RolloutEngine, RolloutProgress, SamplingParams, TransformersGenerator
from ..rollout.engine import ROW_FORMATS
from ..rollout.env_pool import check_execution_settings
from ..rollout.generators import GENERATION_BACKENDS, Generator, shaping_options
from ..rollout.rows import (
    TrainingRows,
    build_rows,
    length_groups,
    prompt_signal_keys,
    split_rows,
    step_values,
    token_signal_key,
)
from ..rollout.topologies import TOPOLOGIES, IndependentTopology, Topology, get_topology
from ..rollout.vllm import VLLMGenerator
from ..signals import (
    DEFAULT_TEMPLATE,
    TEACHER_KINDS,
    ModelSignalContext,
    get_signal,
    required_capabilities,
    resolve_signals,
)
from ..signals.views import check_source, check_template
from ..trajectory import Group, RolloutBatch, Trajectory
from .registry import MethodInfo

logger = logging.getLogger(__name__)

ADVANTAGE_ESTIMATORS = ("grpo", "rloo")
# Rollout metrics logged as totals over processes (not means), and those logged as the largest on any process.
TOTAL_METRICS = ("train_rows", "rollout/generated_tokens", "rollout/env_steps", "rollout/episodes",
                 "rollout/dropped_groups")
MAX_ROLLOUT_STATS = ("rollout/generation_calls",)
ROLLOUT_TOTALS = "rollout_totals.json"  # in every checkpoint: AgentGRPOTrainer.rollout_totals
EMPTY_ROLLOUTS_LIMIT = 3  # training rollouts in a row with nothing to train on before the run stops (a broken env)
CREDIT_STATISTICS = ("trajectories", "step_rows")
# EnvPool argument -> AgentGRPOConfig field, so that a bad setting is reported under the field's name.
ENV_EXECUTION_FIELDS = {
    "backend": "env_backend",
    "num_workers": "env_workers",
    "step_timeout": "env_step_timeout",
    "reset_timeout": "env_reset_timeout",
    "ray_address": "ray_address",
}


@dataclass
class AgentGRPOConfig(GRPOConfig):
    r"""
    Configuration of [`AgentGRPOTrainer`]: every `GRPOConfig` field, plus the agent/environment fields below.

    Fields of `GRPOConfig` keep their meaning, with these agent readings: `num_generations` is G, the episodes per
    task; `per_device_train_batch_size × steps_per_generation` counts *episodes* per generation batch (a multiple of
    G, so whole groups stay on one process); `max_completion_length` is the token budget of one turn; `temperature`,
    `top_p`, `top_k` apply to every turn; `scale_rewards` chooses GRPO's z-score (`"group"`) or mean-only (`"none"`,
    Dr. GRPO) advantages.

    Args:
        env_name (`str` or `None`, *optional*): Environment for rows without an `env` column.
        env_kwargs (`dict`, *optional*): Constructor keyword arguments of the environments (e.g. `{"size": 6}`).
        max_turns (`int`, *optional*, defaults to `10`): Turn budget of an episode.
        history_length (`int`, *optional*, defaults to `2`): Past (observation, action) pairs in step prompts.
        row_format (`str`, *optional*, defaults to `"step"`): `"step"` or `"conversation"` (docs/concepts/training_loop.md#rows).
        system_prompt (`str` or `None`, *optional*): Replaces the environment's instructions as system message.
        max_prompt_length (`int` or `None`, *optional*): Longest prompt; step prompts drop old history to fit,
            conversations stop there.
        invalid_action_penalty (`float`, *optional*, defaults to `0.1`): Subtracted from the credit of steps whose
            action the environment rejected.
        advantage_estimator (`str`, *optional*, defaults to `"grpo"`): `"grpo"` or `"rloo"`.
        credit_statistic (`str`, *optional*, defaults to `"trajectories"`): Population of GRPO's group statistics.
        save_trajectories (`bool`, *optional*, defaults to `True`): Write every rollout to
            `output_dir/trajectories/shard-*.parquet` (schema: `trl_agents.records`).
        generation_backend (`str`, *optional*, defaults to `"auto"`): How the built-in transformers generator
            decodes: `"auto"`, `"generate"`, `"static"` or `"paged"` (see `TransformersGenerator`).
        env_backend (`str`, *optional*, defaults to `"thread"`): Where environments run: `"thread"`, `"process"` or
            `"ray"` (see [`~trl_agents.rollout.EnvPool`]).
        env_workers (`int`, *optional*, defaults to `1`): Threads that step the episodes of a turn at once
            (`"thread"` backend).
        env_step_timeout (`float` or `None`, *optional*): Seconds one episode's turn may take in its environment
            before the episode fails; None = no limit.
        env_reset_timeout (`float` or `None`, *optional*): The same for resets.
        ray_address (`str` or `None`, *optional*): Ray cluster of the `"ray"` backend; None = a local instance.
        topology (`str`, *optional*, defaults to `"independent"`): Which episodes a rollout runs (see
            [`~trl_agents.rollout.topologies`]): `"independent"`, `"adaptive"` or `"branching"`.
        topology_kwargs (`dict`, *optional*): Options of the topology (e.g. `{"max_group_size": 32}`).
        teacher (`str`, *optional*, defaults to `"current"`): The teacher of teacher signals: `"current"`, `"frozen"`
            (step 0) or `"ema"`.
        teacher_ema_decay (`float`, *optional*, defaults to `0.999`): d of the EMA teacher.
        privileged_source (`str`, *optional*, defaults to `"env"`): Where a privileged view's text comes from.
        privileged_template (`str`, *optional*): How the privileged text enters the teacher's prompt.
        max_tokens_per_forward (`int` or `None`, *optional*): Padded tokens per forward over training rows (loss,
            old/reference log-probs, model signals).
        length_grouped_forwards (`bool`, *optional*, defaults to `True`): Forward training rows in groups of similar
            length, each trimmed of its padding (the same values up to float noise); False = TRL's one forward.
    """

    env_name: str | None = field(
        default=None,
        metadata={"help": "Environment used for dataset rows that have no `env` column (e.g. 'sokoban'). (Not "
        "`env`: in TRL's YAML configs that key sets environment variables.)"},
    )
    env_kwargs: dict | str | None = field(
        default=None,
        metadata={"help": "Constructor keyword arguments of the environments, e.g. {'size': 6, 'num_boxes': 1} "
        "(a JSON string on the command line)."},
    )
    max_turns: int = field(default=10, metadata={"help": "Turn budget of an episode; longer episodes are truncated."})
    history_length: int = field(
        default=2,
        metadata={"help": "Number of past (observation, action) pairs shown in step-format prompts (verl-agent: 2)."},
    )
    row_format: str = field(
        default="step",
        metadata={"help": "'step': one training row per turn (prompt = task + history window + observation). "
        "'conversation': one row per episode, the whole chat, with environment tokens masked out of the loss."},
    )
    system_prompt: str | None = field(
        default=None,
        metadata={"help": "System message of every prompt; None uses the environment's own instructions."},
    )
    max_prompt_length: int | None = field(
        default=None,
        metadata={"help": "Longest prompt in tokens. Step prompts drop their oldest history entries to fit; a "
        "conversation that outgrows it ends there (truncated). None = no limit."},
    )
    invalid_action_penalty: float = field(
        default=0.1,
        metadata={"help": "Penalty λ for steps whose action the environment rejected (verl-agent default 0.1), "
        "applied by the credit estimator to that step only (docs/concepts/verl_agent_conventions.md, 'Invalid actions and their penalty')."},
    )
    min_healthy_episodes: int = field(
        default=2,
        metadata={"help": "A task group left with fewer healthy episodes than this by infrastructure failures (crashed "
        "or hung environments) is not trained on; such groups are counted as `rollout/dropped_groups`. With one "
        "episode there is nothing to compare it with, and verl-agent's rule for a population of one (mean 0, std 1) "
        "would train it with its raw return (R = 10 -> advantage 10); 1 restores that rule."},
    )
    max_generated_tokens: int | None = field(
        default=None,
        metadata={"help": "Stop training after the optimizer step whose rollout brought the tokens generated by "
        "training rollouts (summed over processes) to at least this many (None = no limit; `max_steps` still "
        "applies). For comparisons at equal generation compute: trees and adaptive groups spend tokens differently "
        "from G independent episodes. The running total is `trainer.rollout_totals` (kept in checkpoints)."},
    )
    advantage_estimator: str = field(
        default="grpo",
        metadata={"help": "Outcome credit of AgentGRPOTrainer: 'grpo' (z-score, or mean-only with "
        "scale_rewards='none') or 'rloo' (leave-one-out baseline). Method trainers (GiGPO, ...) override it."},
    )
    credit_statistic: str = field(
        default="trajectories",
        metadata={"help": "Population of GRPO's group mean/std: 'trajectories' (one return per episode, as in "
        "the GRPO paper) or 'step_rows' (every step row of the group, as verl-agent computes it)."},
    )
    save_trajectories: bool = field(
        default=True,
        metadata={"help": "Write every rollout (one row per step, with its advantage) to "
        "output_dir/trajectories/shard-{rollout}-rank{rank}.parquet, one crash-safe shard per rollout and process "
        "(schema and loading: trl_agents.records)."},
    )
    generation_backend: str = field(
        default="auto",
        metadata={"help": "How the built-in transformers generator decodes rollouts (not vLLM): 'generate' "
        "(`model.generate`); 'static' (a static KV cache whose decode steps replay CUDA graphs on a GPU: the same "
        "tokens as 'generate' for a seed, several times faster); 'paged' (transformers continuous batching, "
        "temperature-only sampling; TRL's `use_transformers_continuous_batching=True` selects it); 'auto' "
        "(our choice: 'static' on CUDA, falling back to 'generate' with a warning if it fails; 'generate' "
        "elsewhere)."},
    )
    env_backend: str = field(
        default="thread",
        metadata={"help": "Where environments run. 'thread': in the trainer process (on `env_workers` threads). "
        "'process': each in its own worker process, killed when it hangs past `env_step_timeout`; for envs that are "
        "slow in Python (threads share the GIL), can hang, or can crash. 'ray': each in a Ray actor, on a Ray "
        "cluster (`ray_address`), for envs that outgrow one machine (pip install 'trl-agents[ray]'). A hung or "
        "crashed environment fails its episode (excluded from training, kept in the saved trajectories)."},
    )
    env_workers: int = field(
        default=1,
        metadata={"help": "Threads that run the environment calls of one turn at once (env_backend='thread'). Our "
        "choice: 1 (one after the other on the trainer thread), since the built-in puzzles step in microseconds and "
        "threads would only add overhead; set it to the episodes per rollout for environments that wait (network, "
        "a JVM, sleeps). 'process' and 'ray' always step every environment at once."},
    )
    env_step_timeout: float | None = field(
        default=None,
        metadata={"help": "Seconds one episode's environment calls of a turn may take; past it the episode fails "
        "('step timed out after N s') and the rollout goes on (the 'process'/'ray' worker is killed; a thread "
        "cannot be, and is abandoned). Our choice: None (no limit) by default, so that environments keep running "
        "on the trainer thread; set one below your distributed timeout for environments that can hang."},
    )
    env_reset_timeout: float | None = field(
        default=None,
        metadata={"help": "Seconds one episode's reset may take (see env_step_timeout). None = no limit."},
    )
    ray_address: str | None = field(
        default=None,
        metadata={"help": "Address of the Ray cluster for env_backend='ray' (e.g. 'auto', 'ray://head:10001'); None "
        "starts a local Ray instance, unless Ray is already initialised. With several training processes, start one "
        "cluster (`ray start --head`) and use 'auto', so that they share it. trl-agents must be installed on every "
        "node."},
    )
    topology: str = field(
        default="independent",
        metadata={"help": "Which episodes a rollout runs (trl_agents.rollout.topologies): 'independent' (G episodes "
        "per task, GRPO's group), 'adaptive' (rounds of episodes per task until the group carries signal, up to a "
        "cap: CANOPY), 'branching' (G backbones, then forks from environment snapshots at their highest-entropy "
        "steps: BPO). Method trainers set their own."},
    )
    topology_kwargs: dict | str | None = field(
        default=None,
        metadata={"help": "Options of the topology, e.g. {'max_group_size': 32} for 'adaptive' or {'branch_factor': "
        "4} for 'branching' (a JSON string on the command line)."},
    )
    teacher: str = field(
        default="current",
        metadata={"help": "Who scores recorded actions under a privileged view (teacher signals, self-distillation): "
        "'current' (the policy as it is), 'frozen' (the step-0 policy: a LoRA run's base model with the adapter "
        "disabled, else TRL's reference model when beta > 0, else a frozen copy), or 'ema' (an exponential moving "
        "average of the policy, updated after every optimizer step). See docs/signals.md."},
    )
    teacher_ema_decay: float = field(
        default=0.999,
        metadata={"help": "d in θ_T ← d·θ_T + (1 − d)·θ for teacher='ema' (OPSD's EMA teacher, e.g. 0.999)."},
    )
    privileged_source: str = field(
        default="env",
        metadata={"help": "Where the privileged text of a teacher's view comes from: 'env' (env.privileged_context() "
        "before each step), 'task:<field>' (a field of the task row, e.g. 'task:answer'), or 'future' (the "
        "observations that followed the step). See docs/signals.md."},
    )
    privileged_template: str = field(
        default=DEFAULT_TEMPLATE,
        metadata={"help": "How the privileged text enters the teacher's user message: '{context}' is the text, "
        "'{prompt}' the student's own user message. Our choice: the text first, under a short heading (as the "
        "SDAR family prepends its skills); docs/signals.md."},
    )
    max_tokens_per_forward: int | None = field(
        default=None,
        metadata={"help": "Most padded tokens (rows × width) in one forward over training rows: the loss (a "
        "micro-batch over the budget is split into row chunks whose gradients accumulate inside the micro-step, "
        "the update unchanged), the old and reference log-probs, and the model signals (teacher log-probs, "
        "entropies, hidden states), which also run at most per_device_train_batch_size rows at a time. A row "
        "longer than the budget runs alone. None = rows only. Bounds memory on long episodes (step rows: "
        "16 tasks × 8 episodes × 50 turns is 6,400 rows per generation batch)."},
    )
    length_grouped_forwards: bool = field(
        default=True,
        metadata={"help": "Forward training rows (loss, old and reference log-probs) in groups of similar length, "
        "each trimmed of the padding none of its rows needs (`rollout.rows.length_groups`): the same log-probs, "
        "losses and gradients up to float noise, over fewer padded tokens (step rows of different turns differ in "
        "length). False = one forward per micro-batch, as TRL. Our choice; docs/concepts/training_loop.md."},
    )

    def __post_init__(self):
        # TRL defaults bf16 to True, which raises on a machine without a GPU; fall back to fp32 there.
        if cpu_only():
            if self.bf16 is None and not self.fp16:
                self.bf16 = False
            self.dataloader_pin_memory = False  # nothing to pin to; avoids a warning per dataloader
            self.use_cpu = True  # (see cpu_only)
        self.env_kwargs = as_dict(self.env_kwargs, "env_kwargs")
        self.topology_kwargs = as_dict(self.topology_kwargs, "topology_kwargs")
        check_field_types(self, self._agent_field_names())
        check_choice("topology", self.topology, tuple(TOPOLOGIES))
        check_choice("teacher", self.teacher, TEACHER_KINDS)
        check_source(self.privileged_source)
        if not 0.0 <= self.teacher_ema_decay < 1.0:
            raise ValueError(f"teacher_ema_decay must be in [0, 1), got {self.teacher_ema_decay} (e.g. 0.999)")
        check_template(self.privileged_template)
        if self.max_generated_tokens is not None and self.max_generated_tokens < 1:
            raise ValueError(f"max_generated_tokens must be >= 1 or None (no limit), got {self.max_generated_tokens}")
        if self.max_tokens_per_forward is not None and self.max_tokens_per_forward < 1:
            raise ValueError(f"max_tokens_per_forward must be >= 1 or None, got {self.max_tokens_per_forward}")
        check_choice("row_format", self.row_format, ROW_FORMATS)
        check_choice("advantage_estimator", self.advantage_estimator, self._advantage_estimators())
        check_choice("credit_statistic", self.credit_statistic, CREDIT_STATISTICS)
        check_choice("generation_backend", self.generation_backend, GENERATION_BACKENDS)
        check_execution_settings(
            self.env_backend, self.env_workers, self.env_step_timeout, self.env_reset_timeout, self.ray_address,
            names=ENV_EXECUTION_FIELDS,
        )
        if self.max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {self.max_turns}")
        if self.history_length < 0:
            raise ValueError(f"history_length must be >= 0, got {self.history_length}")
        if self.min_healthy_episodes < 1:
            raise ValueError(f"min_healthy_episodes must be >= 1 (2 = never train a lone episode), got "
                             f"{self.min_healthy_episodes}")
        if self.remove_unused_columns:
            raise ValueError(
                "remove_unused_columns=True would strip the task columns (env, seed, ...) that AgentGRPOTrainer "
                "needs; leave it False."
            )
        # Checked before TRL's __post_init__, which would divide by num_generations and word the batch-size error in
        # terms of `generation_batch_size`, a field agent users do not set.
        if isinstance(self.num_generations, int) and self.num_generations < 2:
            raise ValueError(
                f"num_generations must be >= 2 (episodes per task, compared with each other), got {self.num_generations}"
            )
        steps = self.steps_per_generation or self.gradient_accumulation_steps
        per_process = self.per_device_train_batch_size * steps
        if self.generation_batch_size is None and per_process % self.num_generations != 0:
            raise ValueError(
                f"per_device_train_batch_size × steps_per_generation = {per_process} episodes per process must be a "
                f"multiple of num_generations={self.num_generations}, so that the G episodes of a task run and are "
                "credited on one process. Adjust per_device_train_batch_size or gradient_accumulation_steps."
            )
        super().__post_init__()
        if self.scale_rewards not in ("group", "none"):
            raise ValueError(
                f"scale_rewards={self.scale_rewards!r} is not supported for agents: use 'group' (z-score within the "
                "task's G episodes) or 'none' (mean-only, Dr. GRPO)."
            )
        self._resolve_generation_backend()
        per_process = self.per_device_train_batch_size * self.steps_per_generation
        if per_process % self.num_generations != 0:
            raise ValueError(
                f"per_device_train_batch_size × steps_per_generation = {per_process} episodes per process must be a "
                f"multiple of num_generations={self.num_generations}, so that the G episodes of a task run and are "
                "credited on one process. Adjust per_device_train_batch_size or gradient_accumulation_steps."
            )

    def _resolve_generation_backend(self) -> None:
        """TRL's continuous-batching flag selects the "paged" backend, whose log-probs are ours only when sampling
        is shaped by temperature alone."""
        if self.use_transformers_continuous_batching:
            if self.generation_backend not in ("auto", "paged"):
                raise ValueError(
                    "use_transformers_continuous_batching=True selects generation_backend='paged', but "
                    f"generation_backend={self.generation_backend!r}: unset one of the two."
                )
            self.generation_backend = "paged"
        if self.generation_backend == "paged":
            shaping = shaping_options(self.top_p, self.top_k, self.min_p, self.repetition_penalty)
            if shaping:
                raise ValueError(
                    f"generation_backend='paged' (transformers continuous batching) samples with temperature only, "
                    f"but {', '.join(shaping)} is set: reset it, or use generation_backend='static' or 'generate'."
                )

    @classmethod
    def from_grpo_config(cls, grpo_config: GRPOConfig, **agent_fields: Any) -> AgentGRPOConfig:
        """This config class with every setting of an existing `GRPOConfig`, plus the agent fields given.

        Example:
            >>> from trl import GRPOConfig
            >>> grpo = GRPOConfig("out", learning_rate=3e-6, bf16=False, report_to="none")
            >>> AgentGRPOConfig.from_grpo_config(grpo, max_turns=20).learning_rate
            3e-06
        """
        values = {f.name: getattr(grpo_config, f.name) for f in fields(GRPOConfig) if f.init}
        values["generation_batch_size"] = None  # derived from steps_per_generation by __post_init__
        return cls(**values, **agent_fields)

    def _agent_field_names(self) -> list[str]:
        """Fields added by this class and its subclasses (those are type-checked here; TRL checks its own)."""
        base = {f.name for f in fields(GRPOConfig)}
        return [f.name for f in fields(self) if f.name not in base]

    def _advantage_estimators(self) -> tuple[str, ...]:
        return ADVANTAGE_ESTIMATORS


AGENT_CONFIG_NAME = "agent_config.json"
AGENT_CONFIG_FIELDS = (
    "env_name",
    "env_kwargs",
    "max_turns",
    "history_length",
    "row_format",
    "system_prompt",
    "max_prompt_length",
    "max_completion_length",
    "chat_template_kwargs",
)


def save_agent_config(config: AgentGRPOConfig, directory: str) -> None:
    """Write the settings that define how the agent sees its environment next to a checkpoint."""
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, AGENT_CONFIG_NAME), "w") as handle:
        json.dump({name: getattr(config, name) for name in AGENT_CONFIG_FIELDS}, handle, indent=2)


def load_agent_config(directory: str) -> dict[str, Any]:
    """The settings `save_agent_config` wrote next to a checkpoint: a local directory, or a Hub model repo (pushed
    with `trl-agents push` or TRL's `push_to_hub`). {} when there are none (e.g. a base model)."""
    if os.path.isdir(directory):
        path = os.path.join(directory, AGENT_CONFIG_NAME)
    else:
        from huggingface_hub import hf_hub_download
        from huggingface_hub.errors import EntryNotFoundError, HFValidationError, RepositoryNotFoundError

        try:
            path = hf_hub_download(directory, AGENT_CONFIG_NAME)
        except (EntryNotFoundError, HFValidationError, RepositoryNotFoundError):  # from_pretrained will tell
            return {}
    if not os.path.isfile(path):
        return {}
    with open(path) as handle:
        return json.load(handle)


def as_dict(value: dict | str | None, name: str) -> dict[str, Any]:
    """A dict-valued option given as a dict, a JSON object string (command line) or None (empty)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as err:
            raise ValueError(f"{name} must be a dict or a JSON object string, got {value!r}") from err
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise TypeError(f"{name} must be a dict or a JSON object string, got {value!r}")
    return dict(value)


def cpu_only() -> bool:
    """Whether this machine has no accelerator (CUDA or MPS). Training arguments then need `use_cpu=True`: without
    it, the processes of `accelerate launch` / torchrun each train alone instead of forming one gloo group."""
    has_mps = bool(getattr(torch.backends, "mps", None) and torch.backends.mps.is_available())
    return not (torch.cuda.is_available() or has_mps)


def check_field_types(config: Any, names: list[str]) -> None:
    """Raise a ValueError naming the field when a config value does not match the field's annotation."""
    hints = typing.get_type_hints(type(config))
    for name in names:
        expected = hints.get(name)
        value = getattr(config, name)
        if expected is None or _matches(value, expected):
            continue
        raise ValueError(
            f"{type(config).__name__}.{name} must be of type {_type_name(expected)}, got {value!r} "
            f"({type(value).__name__}). Fix the value of `{name}` in your config or command line."
        )


def _matches(value: Any, expected: Any) -> bool:
    origin = typing.get_origin(expected)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        return any(_matches(value, arg) for arg in typing.get_args(expected))
    if expected is type(None):
        return value is None
    if expected is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if expected is int:
        return isinstance(value, int) and not isinstance(value, bool)
    target = origin or expected
    return isinstance(target, type) and isinstance(value, target)


def _type_name(expected: Any) -> str:
    args = typing.get_args(expected)
    if args:
        return " | ".join(_type_name(a) for a in args)
    return getattr(expected, "__name__", str(expected))


def environment_return(completions: list, episode_return: list[float] | None = None, **kwargs) -> list[float]:
    """The environment is the reward source: each episode's undiscounted return Σ_t r_t.

    Registered with TRL as the trainer's reward function, so TRL's bookkeeping (`reward_func_names`, reward logs)
    names the reward after the environment. AgentGRPOTrainer reads returns from its own rollouts.
    """
    if episode_return is None:
        raise ValueError("environment_return needs the episode_return column produced by an agent rollout")
    return [float(r) for r in episode_return]


class AgentGRPOTrainer(GRPOTrainer):
    """
    Trainer for multi-turn agents, extending TRL's [`~trl.GRPOTrainer`] (see the module docstring for what changes).

    Args:
        model (`str` or `PreTrainedModel` or `PeftModel`):
            A Hub model id or local path (loaded like `GRPOTrainer` does), or an instantiated model.
        args ([`AgentGRPOConfig`], *optional*):
            Configuration; defaults to `AgentGRPOConfig(f"{model_name}-AgentGRPO")`.
        train_dataset (`datasets.Dataset` or list of dicts):
            Task rows: each names an environment (`env` column or `args.env_name`) and the fields its `reset` needs
            (e.g. `seed`). `SomeEnv.task_split("train", n)` builds such rows.
        eval_dataset: Task rows for TRL's evaluation loop (optional).
        processing_class: Tokenizer with a chat template (loaded from the model when None).
        callbacks, optimizers: As in `transformers.Trainer`.
        peft_config (`peft.PeftConfig`, *optional*): Train a PEFT adapter (e.g. LoRA) instead of the full model.
        generator ([`~trl_agents.rollout.Generator`], *optional*): Replaces the built-in generation: transformers
            `generate`, or vLLM with `use_vllm=True` (then TRL's `vllm_generation` wrapped in a `VLLMGenerator`).
        env_pool ([`~trl_agents.rollout.EnvPool`], *optional*): Where environment instances come from.
    """

    _tag_names = ["trl", "trl-agents", "agent-grpo"]
    _name = "AgentGRPO"
    _config_class = AgentGRPOConfig
    methods = (
        MethodInfo("grpo", "arXiv 2402.03300", "trl_agents.credit.grpo", title="GRPO",
                   defaults={"advantage_estimator": "grpo"}, tests=("tests/test_credit.py", "tests/test_trainer.py")),
        MethodInfo("dr_grpo", "arXiv 2503.20783", "trl_agents.credit.grpo", title="Dr. GRPO",
                   defaults={"advantage_estimator": "grpo", "scale_rewards": "none", "loss_type": "dr_grpo"},
                   tests=("tests/test_credit.py",)),
        MethodInfo("rloo", "arXiv 2402.14740", "trl_agents.credit.rloo", title="RLOO",
                   defaults={"advantage_estimator": "rloo"}, tests=("tests/test_credit.py",)),
    )
    # What a method needs: environment capabilities checked at start-up (a clear error instead of a failure
    # mid-training), beyond those of its signals and topology; the signals it declares (trl_agents.signals: computed
    # between the rollout and credit, values in `step.signals[name]`); and which of them go into the training batch
    # (per-token ones as `signal/<name>` (B, T) tensors, prompt-shaped ones as `prompt_signal/<name>/ids|mask`).
    required_env_capabilities: tuple[str, ...] = ()
    signals: tuple[str, ...] = ()
    training_signals: tuple[str, ...] = ()
    # Whether `compute_advantages` is written for trees of episodes (a branching topology): shared steps are then
    # trained once with the sum of the paths' values, so an estimator that treats every path as independent would
    # count a shared step's penalty or anchor statistic once per path. Tree-aware trainers (BPO) set it.
    supports_trees: bool = False

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        # Hooks of earlier versions that nothing calls any more: say so at class creation, not never.
        if "prepare_signals" in vars(cls):
            raise TypeError(
                f"{cls.__name__}.prepare_signals is no longer called: declare model signals (`signals`, "
                "`training_signals`; trl_agents.signals) and read them in compute_auxiliary_loss (docs/signals.md)."
            )
        if "record_signals" in vars(cls):
            raise TypeError(
                f"{cls.__name__}.record_signals is gone: declare environment signals by name in `signals` (e.g. "
                "('solver_value',), ('verifier_atoms',); docs/signals.md)."
            )
        hook = vars(cls).get("compute_auxiliary_loss")
        if hook is not None and len(inspect.signature(hook).parameters) != 4:
            raise TypeError(
                f"{cls.__name__}.compute_auxiliary_loss must take (self, model, inputs, per_token_logps): the policy's "
                "log-probs of TRL's loss are passed to it (None when the policy loss is skipped)."
            )

    def __init__(
        self,
        model,
        args: AgentGRPOConfig | None = None,
        train_dataset: Dataset | IterableDataset | list[dict] | None = None,
        eval_dataset: Dataset | list[dict] | None = None,
        processing_class=None,
        callbacks=None,
        optimizers=(None, None),
        peft_config=None,
        generator: Generator | None = None,
        env_pool: EnvPool | None = None,
    ):
        config_class = self._config_class
        if args is None:
            model_name = model if isinstance(model, str) else model.config._name_or_path or "model"
            args = config_class(f"{str(model_name).split('/')[-1]}-{self._name}")
        elif not isinstance(args, config_class):
            raise TypeError(
                f"{type(self).__name__} needs a {config_class.__name__}, got {type(args).__name__}. Convert a "
                f"GRPOConfig with `{config_class.__name__}.from_grpo_config(grpo_config, max_turns=...)`."
            )
        train_dataset = _as_task_dataset(train_dataset, args, "train_dataset", required=True)
        eval_dataset = _as_task_dataset(eval_dataset, args, "eval_dataset", required=False)
        for dataset in (train_dataset, eval_dataset):
            self._check_env_capabilities(dataset, args)
            self._check_privileged_field(dataset, args)
        _check_generator(generator, args)
        super().__init__(
            model=model,
            reward_funcs=[environment_return],
            args=args,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            processing_class=processing_class,
            callbacks=callbacks,
            optimizers=optimizers,
            peft_config=peft_config,
        )
        self.renderer = PromptRenderer(
            self._tokenizer,
            history_length=args.history_length,
            max_prompt_length=args.max_prompt_length,
            chat_template_kwargs=self.chat_template_kwargs,
        )
        if generator is None and args.use_vllm:
            generator = VLLMGenerator(self.vllm_generation, eos_token_ids=self.eos_token_ids)
        self.generator = generator or TransformersGenerator(
            tokenizer=self._tokenizer,
            eos_token_ids=self.eos_token_ids,
            model_context=self._model_for_generation,
            backend=args.generation_backend,
            continuous_batching_config=as_dict(
                args.transformers_continuous_batching_config, "transformers_continuous_batching_config"
            ),
        )
        self._last_loaded_step = -1  # TRL's tag: the step whose weights the generator holds (-1: not synced yet)
        self.env_pool = env_pool or EnvPool(
            env_kwargs=args.env_kwargs, default_env=args.env_name, backend=args.env_backend,
            num_workers=args.env_workers, step_timeout=args.env_step_timeout, reset_timeout=args.env_reset_timeout,
            ray_address=args.ray_address,
        )
        self.last_rollout: RolloutBatch | None = None
        # Callables `keep(groups) -> list[bool]` applied to training rollouts after credit: a group they reject is not
        # trained on (its rows are left out), but still counts in the rollout's metrics (e.g. EchoTrapMonitor's
        # reward-variance filter, trl_agents.callbacks.collapse).
        self.group_filters: list[Callable[[list[Group]], list[bool]]] = []
        # What the training rollouts generated so far, summed over processes (kept in checkpoints: ROLLOUT_TOTALS).
        self.rollout_totals: dict[str, float] = {"generated_tokens": 0.0, "env_steps": 0.0, "episodes": 0.0}
        # Live episodes / turn / success display of each rollout, on the main process, unless progress bars are off.
        show_progress = self.accelerator.is_main_process and not args.disable_tqdm
        self.rollout_progress = RolloutProgress("rollout") if show_progress else None
        self.run_info: dict[str, Any] | None = None  # run_info.json of the current train() (see trl_agents.records)
        self._trajectory_writer: TrajectoryWriter | None = None
        self._setup_signals()

    def _setup_signals(self) -> None:
        """Resolve the declared signals; build the teacher when a teacher signal needs one."""
        args = self.args
        options = self.signal_options(args)
        self.env_signals, self.model_signals = resolve_signals(self.signal_names(args), options)
        self._signal_cache = {s.name: s for s in self.model_signals}  # topologies' mid-rollout signals join it
        layouts = {s.name: s.layout for s in self.model_signals}
        training = self.training_signal_names(args)
        unknown = [name for name in training if name not in layouts]
        if unknown:
            raise ValueError(f"{type(self).__name__}.training_signals names undeclared model signals: {unknown}")
        self._training_layouts = {name: layouts[name] for name in training}
        self.rollout_topology = self.build_topology()
        if self.rollout_topology.needs_snapshots and not self.supports_trees:
            raise ValueError(
                f"topology={args.topology!r} forks episodes that share their first steps, but "
                f"{type(self).__name__}'s credit is not written for trees (every path would count a shared step "
                "again): use a tree-aware method such as BPOTrainer (method 'bpo'), or topology='independent'."
            )
        if args.row_format == "conversation" and self.rollout_topology.needs_snapshots and self.needs_teacher(args):
            raise ValueError(
                "A privileged view of conversation rows rewrites an episode's first prompt, but a forked episode's row "
                "starts at its fork: use row_format='step' with tree topologies and teacher signals."
            )
        self._capturing = False  # on only while a rollout generates: model signals may observe its forwards
        self._topology_signal_seconds: dict[str, float] = {}
        teacher = None
        if self.needs_teacher(args):
            from ..signals.teachers import build_teacher

            if args.teacher == "frozen" and args.sync_ref_model:
                raise ValueError(
                    "teacher='frozen' scores with the step-0 policy, but sync_ref_model=True moves TRL's reference "
                    "model (which the frozen teacher reuses) towards the policy: set sync_ref_model=False, or "
                    "teacher='ema' for a teacher that follows the policy."
                )
            teacher = build_teacher(
                args.teacher, self.accelerator.unwrap_model(self.model), self._model_for_signals,
                reference=self.ref_model, ema_decay=args.teacher_ema_decay,
            )
            if teacher.kind == "ema":
                self.add_callback(_TeacherUpdate(self, teacher))
        self.teacher = teacher
        self.signal_context = ModelSignalContext(
            model_context=self._model_for_signals,
            renderer=self.renderer,
            row_format=args.row_format,
            pad_token_id=self._tokenizer.pad_token_id if self._tokenizer.pad_token_id is not None else 0,
            temperature=self.temperature,
            max_rows_per_forward=max(args.per_device_train_batch_size, 1),
            max_tokens_per_forward=args.max_tokens_per_forward,
            teacher=teacher,
        )

    # ---- what the method needs ------------------------------------------------------------------------------------

    @classmethod
    def signal_options(cls, args: Any) -> dict[str, dict[str, Any]]:
        """Options of the declared signals, from the config (`args` may be a config or any object with its fields):
        the teacher signals' privileged view. Subclasses add their own (e.g. BiPACE's hidden-state layer)."""
        view = {"source": args.privileged_source, "template": args.privileged_template}
        return {"teacher_logprobs": view, "teacher_prompt": view}

    @classmethod
    def signal_names(cls, args: Any) -> tuple[str, ...]:
        """The signals the trainer needs with `args`: its `signals` (a method whose signals depend on its config
        overrides this, e.g. OPSD's loss choice)."""
        return tuple(cls.signals)

    @classmethod
    def training_signal_names(cls, args: Any) -> tuple[str, ...]:
        """The signals laid into the training batch with `args`: its `training_signals`."""
        return tuple(cls.training_signals)

    @classmethod
    def _all_signals(cls, args: Any) -> tuple[list, list, Topology]:
        """(environment signals, model signals, topology) with `args`: the declared signals, the environment signals
        they need, and the model signals the topology computes mid-rollout."""
        args = _as_namespace(args)
        topology = cls.make_topology(args)
        env_signals, model_signals = resolve_signals(
            [*cls.signal_names(args), *topology.model_signals], cls.signal_options(args)
        )
        return env_signals, model_signals, topology

    @classmethod
    def declared_signals(cls, args: Any) -> tuple[str, ...]:
        """Every signal the trainer computes with `args`: the declared ones, the environment signals they need, and
        the model signals of the topology."""
        env_signals, model_signals, _ = cls._all_signals(args)
        return tuple(s.name for s in [*model_signals, *env_signals])

    @classmethod
    def needs_teacher(cls, args: Any) -> bool:
        """Whether the trainer scores with a teacher (`args.teacher`): when it declares teacher log-probs or a
        teacher prompt (a loss that runs the teacher itself)."""
        return bool({"teacher_logprobs", "teacher_prompt"} & set(cls.signal_names(args)))

    @classmethod
    def topology_options(cls, args: Any) -> dict[str, Any]:
        """Options of the topology: the config's `topology_kwargs`. Method trainers build them from their own
        fields (e.g. BPO's branch points and factor)."""
        return dict(_as_namespace(args).topology_kwargs or {})

    @classmethod
    def make_topology(cls, args: Any) -> Topology:
        """A new topology for one rollout: `args.topology` built with `topology_options(args)`."""
        args = _as_namespace(args)
        options = cls.topology_options(args)
        try:
            return get_topology(args.topology, **options)
        except (TypeError, ValueError) as err:  # a missing, unknown or bad option
            raise ValueError(
                f"topology={args.topology!r} cannot be built from topology_kwargs={options!r}: {err}. See "
                "docs/topologies.md for its options (e.g. {'max_group_size': 32} for 'adaptive')."
            ) from None

    @classmethod
    def required_capabilities(cls, args: Any) -> tuple[str, ...]:
        """Environment capabilities checked at start-up: the trainer's own, its signals' and its topology's."""
        env_signals, model_signals, topology = cls._all_signals(args)
        return tuple(dict.fromkeys([
            *cls.required_env_capabilities,
            *required_capabilities([*env_signals, *model_signals]),
            *topology.required_capabilities,
        ]))

    @classmethod
    def _check_privileged_field(cls, dataset, args: AgentGRPOConfig) -> None:
        """A teacher reading a task field (`privileged_source="task:<field>"`) needs that column in the dataset."""
        source = args.privileged_source
        if not (cls.needs_teacher(args) and isinstance(source, str) and source.startswith("task:")):
            return
        if dataset is None or isinstance(dataset, IterableDataset):
            return
        field_name = source.split(":", 1)[1]
        if field_name not in dataset.column_names:
            raise ValueError(
                f"privileged_source={source!r} reads the task field {field_name!r}, but the dataset's columns are "
                f"{', '.join(dataset.column_names)}: add the column or choose another privileged_source."
            )

    @classmethod
    def _check_env_capabilities(cls, dataset, args: AgentGRPOConfig) -> None:
        needed = cls.required_capabilities(args)
        if not needed or dataset is None or isinstance(dataset, IterableDataset):
            return
        env_names = set(dataset["env"]) if "env" in dataset.column_names else {args.env_name}
        for env_name in sorted(env_names, key=str):
            env_cls = get_env_class(env_name)
            missing = [c for c in needed if c not in env_cls.capabilities()]
            if missing:
                raise ValueError(
                    f"{cls.__name__} needs environments with {', '.join(needed)}, but "
                    f"{env_name!r} ({env_cls.__name__}) lacks {', '.join(missing)}. Environments that have them: "
                    f"{', '.join(_envs_with(needed)) or 'none registered'} "
                    "(`trl-agents envs` lists every environment's capabilities)."
                )

    # ---- hooks for method variants -------------------------------------------------------------------------------

    def compute_advantages(self, groups: list[Group]) -> list[list[list[float]]]:
        """One advantage per step (or per action token) for every trajectory of every group.

        `groups` hold only healthy episodes. Returns `advantages[g][i][t]`. The default is the configured outcome
        estimator (`advantage_estimator`: GRPO or RLOO); method trainers override this.
        """
        args = self.args
        if args.advantage_estimator == "grpo":
            params = {
                "scale": args.scale_rewards,
                "statistic": args.credit_statistic,
                "invalid_penalty": args.invalid_action_penalty,
            }
        else:
            params = {"invalid_penalty": args.invalid_action_penalty}
        estimator = get_estimator(args.advantage_estimator)
        return [estimator(group, **params) for group in groups]

    def compute_auxiliary_loss(
        self, model, inputs: dict[str, Any], per_token_logps: torch.Tensor | None
    ) -> torch.Tensor | None:
        """An extra loss term added to the policy loss (distillation, auxiliary objectives). None = no extra term.

        `inputs` is the micro-batch (with the `training_signals` the trainer declares, e.g. `signal/teacher_logprobs`
        (B, T)); `per_token_logps` are the policy's log-probs of the completion tokens that TRL's loss computed for
        it, with their graph (reuse them instead of a second forward), or None when the policy loss is skipped
        (`policy_loss_weight == 0`). Return the loss of this micro-batch as if there were no gradient accumulation;
        the trainer divides it by the number of accumulation steps, as TRL does with its own loss.
        """
        return None

    def log_token_means(self, values: dict[str, torch.Tensor], mask: torch.Tensor) -> None:
        """Log the mean of each (B, T) tensor of `values` over the `mask`ed tokens of this micro-batch on every
        process (one all-reduce; call it from the loss, which every process runs the same number of times)."""
        keep = mask.bool()
        self.log_global_means({
            name: (float(torch.where(keep, v.detach(), torch.zeros_like(v)).sum()), float(keep.sum()))
            for name, v in values.items()
        })

    def batch_token_mean(self, values: torch.Tensor, mask: torch.Tensor, inputs: dict[str, Any]) -> torch.Tensor:
        """An auxiliary loss aggregated as TRL's "dapo" loss: Σ values·mask over this micro-batch divided by the
        loss tokens of the whole generation batch on every process, so that over the micro-batches and processes
        of a generation batch it adds up to the token mean over all of them (exactly the same with one process or
        several, whatever the rows per micro-batch). Returned in `compute_auxiliary_loss`'s convention: before the
        trainer's division by the accumulation steps. Masked positions may hold NaN (they are not read)."""
        total = torch.where(mask.bool(), values, torch.zeros_like(values)).sum()
        normalizer = inputs["num_items_in_batch"].clamp(min=1.0) / self.accelerator.num_processes
        if self.model.training:
            normalizer = normalizer / self.args.steps_per_generation
        return total / normalizer

    def loss_advantages(self, inputs: dict[str, Any], per_token_logps: torch.Tensor) -> torch.Tensor | None:
        """Per-token advantages (B, T) for TRL's policy loss of this micro-batch, from the policy's log-probs that the
        loss has just computed (`per_token_logps`, with their graph: use them detached); None (the default) keeps
        `inputs["advantages"]`. Called inside TRL's loss, after its forward and before it reads the advantages, so a
        detached per-token factor c_t >= 0 gives min(ρ·c·A, clip(ρ)·c·A) = c·min(ρA, clip(ρ)A) (APPO's future-KL
        scaling)."""
        return None

    def clip_bounds(self, inputs: dict[str, Any]) -> tuple[Any, Any] | None:
        """(ε_low, ε_high) of TRL's clipped ratio for this micro-batch, floats or (B, 1) tensors (one bound per row,
        broadcast over its tokens), used instead of `epsilon_low` / `epsilon_high` for this loss call (also in TRL's
        clip-ratio metrics); None (the default) keeps TRL's scalar bounds. EPPO sets per-task bounds. The loss's
        per-token entropies are in `self.loss_entropies` while `compute_auxiliary_loss` runs."""
        return None

    @property
    def policy_loss_weight(self) -> float:
        """Weight of TRL's policy loss in the total loss (1). 0 skips it (and its forward) altogether: a method whose
        whole objective is its auxiliary loss (OPSD without RL)."""
        return 1.0

    def build_topology(self) -> Topology:
        """The training rollouts' topology (`make_topology(self.args)`), built once when the trainer starts and reused
        by every training rollout (its `begin` starts each one afresh). Evaluation rollouts always run the
        independent topology: G episodes per task, so that eval metrics are per-episode rates."""
        return self.make_topology(self.args)

    def save_extra_state(self, output_dir: str) -> None:
        """Write method state that must survive a resume (e.g. 3SPO's state-score table) into a checkpoint's
        `output_dir`; called on the process that saves, after the model."""

    def load_extra_state(self, checkpoint_dir: str) -> None:
        """Read what `save_extra_state` wrote, when `train(resume_from_checkpoint=...)` resumes from
        `checkpoint_dir` (on every process, before training starts)."""

    def compute_signals(self, groups: list[Group]) -> None:
        """The model signals the trainer declares, on the healthy episodes of a rollout (after the rollout, before
        credit): values land in `step.signals[name]`; each signal's seconds are logged as `signals/<name>_seconds`."""
        timings = {f"signals/{name}_seconds": (seconds, 1) for name, seconds in self._topology_signal_seconds.items()}
        self._topology_signal_seconds = {}  # (those the topology computed during this rollout)
        for signal in self.model_signals:
            start = time.perf_counter()
            with torch.no_grad(), _no_gradient_checkpointing(self):
                signal.compute(groups, self.signal_context)
            name = f"signals/{signal.name}_seconds"
            timings[name] = (timings.get(name, (0.0, 1))[0] + time.perf_counter() - start, 1)
        if timings:
            self.log_global_means(timings)

    def log_metric(self, name: str, value: float) -> None:
        """Log `value` under `name` for this logging step, as this process sees it (no reduction over processes;
        use `log_global_means` for that)."""
        self._metrics["train" if self.model.training else "eval"][name].append(float(value))

    def log_mean_metrics(self, prefix: str, stats: list[dict[str, float]], names: Sequence[str]) -> None:
        """Log the mean over `stats` (one dict of diagnostics per group, on every process) of each of `names` as
        `<prefix>/<name>`; nothing when no process has any. Method trainers use it for their credit diagnostics.
        Like `log_global_means`, every process must call it, with the same `names`."""
        self.log_global_means({f"{prefix}/{name}": (sum(s[name] for s in stats), len(stats)) for name in names})

    def advantages_with_stats(self, prefix: str, names: Sequence[str], groups: list[Group],
                              estimator: Callable[..., tuple[list, dict[str, float]]], **options: Any) -> list:
        """`estimator(group, **options)` -> (advantages, diagnostics) on every group: logs the mean of the
        diagnostics `names` as `<prefix>/<name>` (`log_mean_metrics`) and returns the advantages, one list per
        group (what `compute_advantages` returns)."""
        results = [estimator(group, **options) for group in groups]
        self.log_mean_metrics(prefix, [stats for _, stats in results], names)
        return [advantages for advantages, _ in results]

    def log_rollout_cost_per_task(self, prefix: str, groups: list[Group]) -> None:
        """Log the last training rollout's generated tokens and env steps per task, as `<prefix>/..._per_task`
        (topology methods: what their trees cost against G independent episodes)."""
        batch_stats = self.last_rollout.stats if self.last_rollout is not None else {}
        tasks = max(len(groups), 1)
        self.log_global_means({
            f"{prefix}/generated_tokens_per_task": (batch_stats.get("generated_tokens", 0.0), tasks),
            f"{prefix}/env_steps_per_task": (batch_stats.get("env_steps", 0.0), tasks),
        })

    def log_global_means(self, ratios: dict[str, tuple[float, float]]) -> None:
        """Log each metric of `ratios` (name -> (total, count) on this process) as Σ total / Σ count over all
        processes, skipped where Σ count is 0. One all-reduce for all of them, so every process must call it with
        the same names, whether or not it has anything to count."""
        names = sorted(ratios)
        flat = self.sum_over_processes([value for name in names for value in ratios[name]]) if names else []
        metrics = self._metrics["train" if self.model.training else "eval"]
        for index, name in enumerate(names):
            total, count = flat[2 * index], flat[2 * index + 1]
            if count > 0:
                metrics[name].append(total / count)

    def log_global_totals(self, totals: dict[str, float]) -> None:
        """Log each metric of `totals` (name -> this process's amount) as its sum over all processes (e.g. counts of
        events in the generation batch). A collective, as `log_global_means`."""
        share = 1.0 / self.accelerator.num_processes  # Σ share over the processes is 1: the mean is the sum
        self.log_global_means({name: (float(value), share) for name, value in totals.items()})

    def sum_over_processes(self, values: Sequence[float]) -> list[float]:
        """`values` (floats) summed elementwise over all processes, in one all-reduce (as is with one process). Every
        process must call it at the same point with as many values."""
        values = [float(v) for v in values]
        if self.accelerator.num_processes == 1:
            return values
        summed = torch.tensor(values, dtype=torch.float64, device=self.accelerator.device)
        return self.accelerator.reduce(summed, reduction="sum").tolist()

    def max_over_processes(self, value: float) -> float:
        """The largest of `value` over all processes, in one all-reduce (as is with one process). Every process must
        call it at the same point."""
        if self.accelerator.num_processes == 1:
            return float(value)
        local = torch.tensor([float(value)], dtype=torch.float64, device=self.accelerator.device)
        return float(self.accelerator.gather(local).max())

    # ---- rollout and scoring --------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _model_for_signals(self):
        """The policy, unwrapped for no-grad forwards (DeepSpeed ZeRO-3 gathers it as for generation)."""
        with (
            unwrap_model_for_generation(
                self.model_wrapped,
                self.accelerator,
                gather_deepspeed3_params=self.args.ds3_gather_for_generation,
                gradient_checkpointing_kwargs=self.args.gradient_checkpointing_kwargs,
            ) as unwrapped_model,
            self._dist.summon_full_params(self.model_wrapped, recurse=False),
        ):
            yield unwrapped_model

    @contextlib.contextmanager
    def _model_for_generation(self):
        """The model context of the built-in generator: the unwrapped policy, observed by the model signals that
        capture the rollout's own forwards (e.g. hidden states from the prefill) while a rollout generates."""
        with self._model_for_signals() as model, contextlib.ExitStack() as stack:
            if self._capturing:
                for signal in self.model_signals:
                    capture = signal.capture(model)
                    if capture is not None:
                        stack.enter_context(capture)
            yield model

    def _signal_for_topology(self, name: str, trajectories: list[Trajectory]) -> None:
        """A model signal a topology needs mid-rollout (e.g. entropies to rank branch points), on `trajectories`."""
        signal = self._signal_cache.get(name)
        if signal is None:
            signal = self._signal_cache[name] = get_signal(name, **self.signal_options(self.args).get(name, {}))
        capturing, self._capturing = self._capturing, False
        start = time.perf_counter()
        try:
            with torch.no_grad(), _no_gradient_checkpointing(self):
                signal.compute([Group(task={}, trajectories=list(trajectories))], self.signal_context)
        finally:
            self._capturing = capturing
            self._topology_signal_seconds[name] = self._topology_signal_seconds.get(name, 0.0) + (
                time.perf_counter() - start
            )

    def _sampling_params(self) -> SamplingParams:
        return SamplingParams(
            max_new_tokens=self.max_completion_length,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k or 0,
            min_p=self.min_p,
            repetition_penalty=self.repetition_penalty,
        )

    def _engine(self) -> RolloutEngine:
        return RolloutEngine(
            self.generator,
            self.renderer,
            max_turns=self.args.max_turns,
            sampling=self._sampling_params(),
            row_format=self.args.row_format,
            env_pool=self.env_pool,
            system_prompt=self.args.system_prompt,
            signals=self.env_signals,
            topology=self.rollout_topology if self.model.training else IndependentTopology(),
            signal_fn=self._signal_for_topology,
            on_turn=self.rollout_progress.update if self.rollout_progress else None,
        )

    def _sync_generator_weights(self) -> None:
        """Push the weights to an inference engine once per optimizer step, before the step's first rollout (TRL
        does the same with `_last_loaded_step`), in evaluation too: eval episodes must play the current policy."""
        sync_weights = getattr(self.generator, "sync_weights", None)
        if sync_weights is not None and self.state.global_step != self._last_loaded_step:
            with profiling_context(self, "sync_weights"):
                sync_weights()
            self._last_loaded_step = self.state.global_step

    @property
    def _corrects_off_policy_sampling(self) -> bool:
        """TRL's vLLM importance-sampling correction applies: the generator samples from an engine's copy of the
        weights (whether TRL built it with `use_vllm` or the user passed it) and the correction is on."""
        return bool(getattr(self.generator, "samples_off_policy", False)) and self.vllm_importance_sampling_correction

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        device = self.accelerator.device
        mode = "train" if self.model.training else "eval"
        num_generations = self.num_generations if mode == "train" else self.num_generations_eval
        tasks = _tasks_of(inputs, num_generations)

        self._sync_generator_weights()
        for signal in self.model_signals:
            signal.reset()
        with self.rollout_progress.track() if self.rollout_progress else contextlib.nullcontext():
            self._capturing = True
            try:
                batch = self._engine().run(tasks, num_generations)
            finally:
                self._capturing = False
        self.last_rollout = batch
        if self.rollout_topology.needs_snapshots:  # forks are done: environment copies would only hold memory
            for trajectory in batch.trajectories:
                for step in trajectory.owned_steps:
                    step.snapshot = None
        healthy, dropped = trainable_groups(batch.groups, self.args.min_healthy_episodes)
        self.compute_signals(healthy)
        advantages = self.compute_advantages(healthy)
        trained, trained_advantages = healthy, advantages
        if mode == "train":
            trained, trained_advantages = filter_groups(healthy, advantages, self.group_filters)
        rows = build_rows(trained, trained_advantages, self.args.row_format, self._training_layouts)
        batch.stats["dropped_groups"] = dropped
        self._check_trainable(batch, rows, dropped)
        output = self._pad_rows(rows, device)
        self._add_old_and_ref_logps(output)
        step_advantages = _step_advantages(batch, healthy, advantages)
        self._log_rollout(batch, healthy, step_advantages, rows, mode)
        if self.args.save_trajectories and mode == "train":
            self._save_trajectories(batch, step_advantages)
        return output

    def _check_trainable(self, batch: RolloutBatch, rows: TrainingRows, dropped: int) -> None:
        """A rollout that leaves nothing to train on (every episode failed, or its group was left with too few healthy
        ones) makes a step that updates nothing, with a warning, so that one bad rollout never stops training; three
        such rollouts in a row mean the environment itself is broken: a RuntimeError names its errors."""
        if len(rows) > 0 or not self.model.training:
            self._empty_rollouts = 0
            return
        self._empty_rollouts += 1
        errors = sorted({t.error for t in batch.trajectories if t.error})
        reason = (
            "every episode of this rollout failed"
            + (f" or was left alone in its group ({dropped} groups below min_healthy_episodes="
               f"{self.args.min_healthy_episodes})" if dropped else "")
            + ". First errors: " + ("; ".join(errors[:3]) or "none")
        )
        if self._empty_rollouts >= EMPTY_ROLLOUTS_LIMIT:
            raise RuntimeError(f"{self._empty_rollouts} rollouts in a row left nothing to train on: {reason}")
        logger.warning("Nothing to train on at step %d (this step updates nothing): %s", self.state.global_step + 1,
                       reason)

    def _pad_rows(self, rows: TrainingRows, device) -> dict[str, Any]:
        # Filler rows (copies of row 0 with a zero loss mask) make up for two things: a rollout with fewer rows
        # than micro-batches (e.g. most episodes crashed), so that every micro-batch is non-empty; and processes
        # whose rollouts gave different numbers of step rows, so that every process has as many rows in each
        # micro-batch: TRL's loss gathers per-row statistics (clip ratios) across processes, which needs equal
        # shapes. Fillers change neither the loss nor `num_items_in_batch`.
        num_chunks = self.args.steps_per_generation if self.model.training else 1
        num_rows = max(len(rows), num_chunks)
        if self.accelerator.num_processes > 1:
            num_rows = int(self.accelerator.gather(torch.tensor([num_rows], device=device)).max())
        fillers = num_rows - len(rows)
        loss_mask_rows = [1] * len(rows) + [0] * fillers
        pad_id = self._tokenizer.pad_token_id
        rows = rows.with_fillers(fillers, pad_id if pad_id is not None else 0)

        def padded(values, value, side, dtype):
            return pad([torch.tensor(v, dtype=dtype) for v in values], padding_value=value, padding_side=side).to(
                device
            )

        prompt_ids = padded(rows.prompt_ids, pad_id, "left", torch.long)
        prompt_mask = padded([[1] * len(p) for p in rows.prompt_ids], 0, "left", torch.long)
        completion_ids = padded(rows.completion_ids, pad_id, "right", torch.long)
        completion_mask = padded([[m] * len(c) for c, m in zip(rows.completion_ids, loss_mask_rows)], 0, "right", torch.long)
        output = {
            "prompt_ids": prompt_ids,
            "prompt_mask": prompt_mask,
            "completion_ids": completion_ids,
            "completion_mask": completion_mask,
            "advantages": padded(rows.advantages, 0.0, "right", torch.float32),
            "sampling_per_token_logps": padded(rows.sampling_logprobs, 0.0, "right", torch.float32),
        }
        for name, values in rows.token_signals.items():  # NaN where a token has no value (env tokens, padding)
            output[token_signal_key(name)] = padded(values, math.nan, "right", torch.float32)
        for name, values in rows.prompt_signals.items():
            ids_key, mask_key = prompt_signal_keys(name)
            output[ids_key] = padded(values, pad_id, "left", torch.long)
            output[mask_key] = padded([[1] * len(v) for v in values], 0, "left", torch.long)
        if self.args.row_format == "conversation":
            output["tool_mask"] = padded(rows.env_mask, 1, "right", torch.long)
        # Masked copies still count as context but never as loss tokens: make sure they carry no mask either way.
        output["num_items_in_batch"] = self.accelerator.gather(loss_mask(output).sum()).sum()
        return output

    def _add_old_and_ref_logps(self, output: dict[str, Any]) -> None:
        """Old and reference per-token log-probs, computed under the same conditions as in `GRPOTrainer` (none when
        `policy_loss_weight` is 0: only TRL's policy loss reads them)."""
        if self.policy_loss_weight == 0.0:
            return
        prompt_completion_ids = torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1)
        attention_mask = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
        logits_to_keep = output["completion_ids"].size(1)
        mode = "train" if self.model.training else "eval"
        batch_size = self.args.per_device_train_batch_size if mode == "train" else self.args.per_device_eval_batch_size
        batch_size = rows_per_forward(batch_size, prompt_completion_ids.size(1), self.args.max_tokens_per_forward)
        generate_every = self.args.steps_per_generation * self.num_iterations
        with torch.no_grad(), _no_gradient_checkpointing(self):
            # Generation and optimisation are misaligned (or several passes reuse the rollout): keep the behaviour
            # policy's log-probs for the importance ratio. Otherwise the ratio is exactly 1 and TRL skips this, unless
            # an inference engine sampled the rollout: then they also give the engine-vs-trainer correction.
            misaligned = self.args.gradient_accumulation_steps % generate_every != 0
            if misaligned or self._corrects_off_policy_sampling:
                output["old_per_token_logps"], _, _ = self._get_per_token_logps_and_entropies(
                    self.model, prompt_completion_ids, attention_mask, logits_to_keep, batch_size=batch_size
                )
            if self._corrects_off_policy_sampling:
                self._add_importance_sampling_ratio(output, mode)
            if self.beta != 0.0:
                if self.ref_model is not None:
                    ref_model = self.ref_model
                    adapter_context = contextlib.nullcontext()
                else:  # PEFT: the reference is the base model (adapter disabled) or the frozen "ref" adapter
                    from trl.trainer.utils import use_adapter

                    unwrapped = self.accelerator.unwrap_model(self.model)
                    ref_model = self.model
                    adapter_context = use_adapter(unwrapped, adapter_name="ref" if "ref" in unwrapped.peft_config else None)
                with adapter_context:
                    output["ref_per_token_logps"], _, _ = self._get_per_token_logps_and_entropies(
                        ref_model, prompt_completion_ids, attention_mask, logits_to_keep, batch_size=batch_size
                    )

    def _get_per_token_logps_and_entropies(
        self, model, input_ids, attention_mask, logits_to_keep, batch_size=None, compute_entropy=False,
        compute_aux_loss=False, **kwargs,
    ):
        """TRL's per-token log-probs (and entropies) of the last `logits_to_keep` tokens of each row, with the rows
        forwarded in groups of similar length (`length_groups`, `length_grouped_forwards`): each group is cut to the
        columns its rows use (the left padding of its prompts and the right padding of its completions go) and
        forwarded by TRL's own method, then every row's values are put back in place (0 on the trimmed completion
        columns, as TRL gives on padding). Step rows of different turns differ in length, and one forward pads
        them all to the longest; the values are the same up to float noise (the rows are independent, and their
        tokens only shift by the trimmed columns: rotary positions are relative; TRL's own micro-batch trimming
        shifts them the same way). TRL's forward as it is for multimodal inputs, MoE auxiliary losses, FSDP and
        DeepSpeed (which need the same number of forwards on every process); under DDP the processes cut as
        many forwards while gradients are recorded (every forward synchronises buffers)."""
        parent = super()._get_per_token_logps_and_entropies
        as_trl = (
            not self.args.length_grouped_forwards
            or compute_aux_loss
            or any(value is not None for value in kwargs.values())
            or self.is_fsdp_enabled
            or self.is_deepspeed_enabled
        )
        pieces = None if as_trl else self._row_forwards(attention_mask, logits_to_keep, batch_size)
        if pieces is None:
            return parent(model, input_ids, attention_mask, logits_to_keep, batch_size=batch_size,
                          compute_entropy=compute_entropy, compute_aux_loss=compute_aux_loss, **kwargs)
        logps, entropies = [], []
        for rows, start, end in pieces:
            index = torch.tensor(rows, device=input_ids.device)
            kept = end - (input_ids.size(1) - logits_to_keep)  # completion columns this forward keeps
            piece_logps, piece_entropies, _ = parent(
                model, input_ids[index, start:end], attention_mask[index, start:end], kept,
                compute_entropy=compute_entropy,
            )
            logps.append(torch.nn.functional.pad(piece_logps, (0, logits_to_keep - kept)))
            if compute_entropy:
                entropies.append(torch.nn.functional.pad(piece_entropies, (0, logits_to_keep - kept)))
        order = torch.tensor([row for rows, _, _ in pieces for row in rows], device=input_ids.device)
        back = torch.empty_like(order)
        back[order] = torch.arange(len(order), device=order.device)  # row r is at position back[r] of the pieces
        return torch.cat(logps)[back], torch.cat(entropies)[back] if compute_entropy else None, None

    def _row_forwards(self, attention_mask: torch.Tensor, logits_to_keep: int, batch_size: int | None):
        """The forwards of `_get_per_token_logps_and_entropies`: (rows, first column, end column) each, at most
        `batch_size` rows; None when one forward over every column is what the grouping gives."""
        num_rows, width = attention_mask.shape
        if num_rows < 2:
            return None
        prompt_width = width - logits_to_keep
        columns = torch.arange(width, device=attention_mask.device)
        present = attention_mask.bool()
        first = torch.where(present, columns, width).min(dim=1).values.clamp(max=prompt_width - 1).tolist()
        last = torch.where(present, columns, -1).max(dim=1).values.clamp(min=prompt_width).tolist()
        groups = length_groups([end + 1 - start for start, end in zip(first, last, strict=True)])
        step = batch_size or num_rows
        pieces = [group[i : i + step] for group in groups for i in range(0, len(group), step)]
        if self.accelerator.num_processes > 1 and torch.is_grad_enabled():
            # DDP synchronises buffers in every forward that records gradients: every process runs as many. The
            # processes hold as many rows (`_pad_rows`), so halving the largest pieces always gets there.
            target = int(self.accelerator.gather(torch.tensor([len(pieces)], device=attention_mask.device)).max())
            while len(pieces) < target:
                largest = max(range(len(pieces)), key=lambda i: len(pieces[i]))
                if len(pieces[largest]) < 2:
                    break
                rows = pieces.pop(largest)
                pieces[largest:largest] = [rows[: len(rows) // 2], rows[len(rows) // 2 :]]
        elif len(pieces) == 1 and min(first) == 0 and max(last) == width - 1:
            return None
        return [(rows, max(min(first[r] for r in rows), 0), max(last[r] for r in rows) + 1) for rows in pieces]

    def _add_importance_sampling_ratio(self, output: dict[str, Any], mode: str) -> None:
        """TRL's vLLM importance-sampling correction (grpo_trainer.py in TRL 1.16): the ratio between the trainer's
        and the engine's probability of the sampled tokens, per token or per row, truncated or masked, over the
        trained tokens only (environment tokens of conversation rows excluded); and TRL's `sampling/` metrics."""
        old, sampled = output["old_per_token_logps"], output["sampling_per_token_logps"]
        mask = loss_mask(output)
        ratio = importance_sampling_ratio(
            old,
            sampled,
            mask,
            self.vllm_importance_sampling_mode,
            self.vllm_importance_sampling_clip_min,
            self.vllm_importance_sampling_clip_max,
        )
        output["importance_sampling_ratio"] = ratio
        mask = mask.bool()
        delta = torch.abs(old - sampled)
        delta = delta[mask & ~torch.isnan(delta)]  # tokens vLLM could not score are left out, not counted as 0
        ratios = ratio.flatten() if ratio.shape[1] == 1 else ratio[mask]

        def gathered(values: torch.Tensor, statistic) -> torch.Tensor:  # one value per process
            return self.accelerator.gather(statistic(values) if values.numel() else torch.zeros((), device=old.device))

        metrics = self._metrics[mode]
        metrics["sampling/sampling_logp_difference/mean"].append(gathered(delta, torch.mean).mean().item())
        metrics["sampling/sampling_logp_difference/max"].append(gathered(delta, torch.max).max().item())
        metrics["sampling/importance_sampling_ratio/min"].append(nanmin(gathered(ratios, torch.min)).item())
        metrics["sampling/importance_sampling_ratio/mean"].append(gathered(ratios, torch.mean).nanmean().item())
        metrics["sampling/importance_sampling_ratio/max"].append(nanmax(gathered(ratios, torch.max)).item())

    def _prepare_inputs(self, generation_batch):
        # As GRPOTrainer._prepare_inputs, with `split_rows` instead of `split_tensor_dict` (which drops rows).
        if not self.model.training:
            return self._generate_and_score_completions(generation_batch)
        generate_every = self.args.steps_per_generation * self.num_iterations
        if self._step % generate_every == 0 or self._buffered_inputs is None:
            output = shuffle_sequence_dict(self._generate_and_score_completions(generation_batch))
            self._buffered_inputs = split_rows(output, self.args.steps_per_generation)
        return self._buffered_inputs[self._step % self.args.steps_per_generation]

    def _compute_loss(self, model, inputs):
        """TRL's loss (weighted by `policy_loss_weight`) plus `compute_auxiliary_loss`; a micro-batch over
        `max_tokens_per_forward` runs in row chunks (`loss_chunks`): in training, every chunk but the last is
        back-propagated here, without gradient synchronisation, and the last one's loss is returned for the
        trainer's backward (with the earlier chunks' values added as a constant), so the gradients add up to those
        of the whole micro-batch. `self.loss_chunk` is (index, count) of the chunk being computed."""
        budget = self.args.max_tokens_per_forward
        width = None
        if budget is not None and self.accelerator.num_processes > 1:
            # Every process must cut the same chunks: TRL's loss gathers per-row statistics in every call, and the
            # processes' micro-batches have as many rows (`_pad_rows`) but may be padded to different widths.
            local = inputs["prompt_ids"].size(1) + inputs["completion_ids"].size(1)
            width = int(self.accelerator.gather(torch.tensor([local], device=self.accelerator.device)).max())
        chunks = loss_chunks(inputs, budget, self.loss_type, width=width)
        if len(chunks) == 1:
            return self._chunk_loss(model, inputs, 1.0)
        backward = model.training and torch.is_grad_enabled() and not self.is_deepspeed_enabled
        done = torch.zeros((), device=self.accelerator.device)
        try:
            for index, (chunk, weight) in enumerate(chunks):
                self.loss_chunk = (index, len(chunks))
                last = index == len(chunks) - 1
                if backward and not last:
                    with self.accelerator.no_sync(model):  # the last chunk's backward synchronises them all
                        loss = self._chunk_loss(model, chunk, weight)
                        self.accelerator.backward(loss)
                    done = done + loss.detach()
                else:
                    loss = self._chunk_loss(model, chunk, weight)
                    if not last:
                        done = done + loss.detach()
            return loss + done
        finally:
            self.loss_chunk = (0, 1)

    loss_chunk: tuple[int, int] = (0, 1)
    loss_entropies: torch.Tensor | None = None  # (B, T) entropies of TRL's loss, while compute_auxiliary_loss runs
    _empty_rollouts = 0  # training rollouts in a row that left nothing to train on (`_check_trainable`)

    def _chunk_loss(self, model, inputs, chunk_weight: float):
        # TRL's loss multiplies by the importance-sampling ratio only `if self.use_vllm`. A vLLM generator passed in
        # (`generator=`) samples off-policy just the same, so the flag is raised for this call.
        weight = self.policy_loss_weight * chunk_weight  # a chunk's share of the micro-batch's policy loss
        captured: dict[str, torch.Tensor] = {}
        if weight != 0.0:
            raise_flag = self._corrects_off_policy_sampling and not self.use_vllm
            loss_inputs = dict(inputs)  # `loss_advantages` may replace its advantages (not the caller's batch)
            bounds = self.clip_bounds(inputs)
            with (
                _attribute_set(self, "use_vllm", True) if raise_flag else contextlib.nullcontext(),
                _attribute_set(self, "epsilon_low", bounds[0]) if bounds is not None else contextlib.nullcontext(),
                _attribute_set(self, "epsilon_high", bounds[1]) if bounds is not None else contextlib.nullcontext(),
                _capturing_policy_logps(self, captured, loss_inputs),
            ):
                loss = super()._compute_loss(model, loss_inputs)
            if weight != 1.0:
                loss = weight * loss
        else:
            loss = torch.zeros((), device=self.accelerator.device)
        self.loss_entropies = captured.get("entropies")  # TRL's per-token entropies of this micro-batch (detached)
        try:
            auxiliary = self.compute_auxiliary_loss(model, inputs, captured.get("per_token_logps"))
        finally:
            self.loss_entropies = None
        if auxiliary is not None:
            mode = "train" if self.model.training else "eval"
            normalizer = self.current_gradient_accumulation_steps if mode == "train" else 1.0
            loss = loss + auxiliary / normalizer
        return loss

    def train(self, resume_from_checkpoint: str | bool | None = None, *args, **kwargs):
        """`Trainer.train`, after writing `output_dir/run_info.json` (the main process writes it, every process gets
        its content for the trajectory records) and, when resuming (a checkpoint path, or True / "true" for the last
        one of `output_dir`: `resolve_checkpoint`), `load_extra_state(checkpoint)` and moving aside the trajectory
        shards of rollouts after the checkpoint (`records.supersede_shards`: they are generated again); then the
        environments' workers (processes, Ray actors, threads) are stopped, even when training fails; a later
        rollout (e.g. `evaluate()`) starts new ones."""
        from accelerate.utils import broadcast_object_list

        checkpoint = resolve_checkpoint(resume_from_checkpoint, self.args.output_dir)
        if checkpoint is not None:
            totals = os.path.join(checkpoint, ROLLOUT_TOTALS)
            if os.path.isfile(totals):
                with open(totals) as handle:
                    self.rollout_totals.update(json.load(handle))
            self.load_extra_state(checkpoint)
        if self.is_world_process_zero():
            if checkpoint is not None and self.args.save_trajectories:
                # Rollouts after the checkpoint are generated again: their earlier shards would repeat those steps.
                step = TrainerState.load_from_json(os.path.join(checkpoint, "trainer_state.json")).global_step
                supersede_shards(os.path.join(self.args.output_dir, TRAJECTORIES_DIR), step)
            info = write_run_info(self)
        self.run_info = broadcast_object_list([info if self.is_world_process_zero() else None])[0]
        self._trajectory_writer = None  # a new writer resumes after the shards already in output_dir
        try:
            return super().train(checkpoint, *args, **kwargs)
        finally:
            self.env_pool.close()

    # ---- checkpoints ----------------------------------------------------------------------------------------------

    def create_model_card(self, model_name=None, dataset_name=None, tags=None):
        """The card `push_to_hub` uploads: trl-agents' card (method and paper, environment, key settings, eval table,
        learning curve; `trl_agents.hub.render_model_card`) with TRL's tags added, instead of TRL's generic one."""
        super().create_model_card(model_name=model_name, dataset_name=dataset_name, tags=tags)
        if not self.is_world_process_zero():
            return
        from ..hub import render_model_card

        path = os.path.join(self.args.output_dir, "README.md")
        trl_tags = ModelCard.load(path).data.tags or [] if os.path.isfile(path) else []
        card = render_model_card(self.args.output_dir, self.hub_model_id)
        card.data.tags = list(dict.fromkeys([*(card.data.tags or []), *trl_tags]))
        card.save(path)

    def _save(self, output_dir: str | None = None, state_dict=None) -> None:
        """Save as `Trainer` does, plus `agent_config.json`: how the agent is prompted (environment, system prompt,
        history window, turn budget), so `trl-agents eval` and `load_agent_config` can run the checkpoint as trained;
        `rollout_totals.json` (what the training rollouts generated so far, for `max_generated_tokens`); and the
        method's `save_extra_state`."""
        super()._save(output_dir, state_dict)
        if self.args.should_save:
            save_agent_config(self.args, output_dir or self.args.output_dir)
            atomic_write(os.path.join(output_dir or self.args.output_dir, ROLLOUT_TOTALS),
                         json.dumps(self.rollout_totals, indent=2))
            self.save_extra_state(output_dir or self.args.output_dir)

    # ---- metrics and records --------------------------------------------------------------------------------------

    def _log_rollout(
        self, batch: RolloutBatch, healthy: list[Group], step_advantages: dict, rows: TrainingRows, mode: str
    ) -> None:
        """Rollout and credit metrics (reduced over processes), and one completions-table entry per episode."""
        trajectories = [t for group in healthy for t in group.trajectories]
        steps = [s for t in trajectories for s in t.owned_steps]  # a tree's shared steps count once
        zero_advantage, zero_std, num_groups = 0, 0, 0
        by_turn = [[0.0, 0] for _ in range(self.args.max_turns)]
        for group_index, group in enumerate(healthy):
            if not group.trajectories:
                continue
            per_episode = [step_advantages[(group_index, t.episode_id)] for t in group.trajectories]
            num_groups += 1
            zero_advantage += all(abs(v) < 1e-8 for values in per_episode for v in values)
            zero_std += len({t.episode_return for t in group.trajectories}) <= 1
            for trajectory, values in zip(group.trajectories, per_episode, strict=True):
                for turn, value in enumerate(values, start=trajectory.fork_step):
                    if turn < len(by_turn):
                        by_turn[turn][0] += value
                        by_turn[turn][1] += 1
        local = {
            "env/success_rate": (sum(t.success for t in trajectories), len(trajectories)),
            "env/episode_length": (sum(t.num_steps for t in trajectories), len(trajectories)),
            "env/episode_return": (sum(t.episode_return for t in trajectories), len(trajectories)),
            "env/valid_action_rate": (sum(s.valid for s in steps), len(steps)),
            "env/failed_episode_rate": (sum(t.failed for t in batch.trajectories), len(batch.trajectories)),
            "credit/zero_advantage_group_fraction": (zero_advantage, num_groups),
            "frac_reward_zero_std": (zero_std, num_groups),
            "train_rows": (len(rows), 1),
            **{f"credit/advantage_by_turn/{turn}": tuple(pair) for turn, pair in enumerate(by_turn)},
        }
        # The rollout's cost (totals over processes) and the topology's numbers (means over the tasks of every
        # process; maxima and round counts: the largest on any process, below).
        maxima = {}
        for name, value in batch.stats.items():
            key = name if "/" in name else f"rollout/{name}"
            if key in MAX_ROLLOUT_STATS or key.startswith("topology/max_") or key == "topology/rounds":
                maxima[key] = value
            else:
                local[key] = (value, 1) if key in TOTAL_METRICS else (value * len(batch.groups), len(batch.groups))
        returns = [t.episode_return for t in trajectories]
        tokens = sum(len(p) + len(c) for p, c in zip(rows.prompt_ids, rows.completion_ids, strict=True))
        names = sorted(local)
        # One all-reduce for all of it: the metrics, (Σ r², n) for reward_std, and the tokens of this rollout.
        stats = [local[n] for n in names] + [(sum(r * r for r in returns), len(returns)), (tokens, 1)]
        stats = torch.tensor(stats, dtype=torch.float64, device=self.accelerator.device)
        *totals, (squares, num_returns), (tokens, _) = self.accelerator.reduce(stats, reduction="sum").tolist()
        for name, (total, count) in zip(names, totals, strict=True):
            if count > 0:
                self._metrics[mode][name].append(total if name in TOTAL_METRICS else total / count)
        if maxima:
            names_max = sorted(maxima)
            values = torch.tensor([[maxima[n] for n in names_max]], dtype=torch.float64, device=self.accelerator.device)
            for name, value in zip(names_max, self.accelerator.gather(values).max(dim=0).values.tolist(), strict=True):
                self._metrics[mode][name].append(value)
        if num_returns > 0:  # TRL's reward / reward_std columns, over the episodes of every process
            mean = totals[names.index("env/episode_return")][0] / num_returns
            self._metrics[mode]["reward"].append(mean)
            variance = max(squares - num_returns * mean**2, 0.0) / max(num_returns - 1, 1)
            self._metrics[mode]["reward_std"].append(math.sqrt(variance))
        if mode == "train":
            self.state.num_input_tokens_seen += int(tokens)
            for key in self.rollout_totals:
                if f"rollout/{key}" in names:
                    self.rollout_totals[key] += totals[names.index(f"rollout/{key}")][0]
            budget = self.args.max_generated_tokens
            if budget is not None and self.rollout_totals["generated_tokens"] >= budget:
                self.control.should_training_stop = True  # after this optimizer step (the Trainer's loop checks it)
        self._metrics[mode]["num_tokens"] = [self.state.num_input_tokens_seen]
        if self.log_completions:
            self._log_episodes(batch, step_advantages)

    def _log_episodes(self, batch: RolloutBatch, step_advantages: dict) -> None:
        """One entry of TRL's completions table per episode, from every process: prompt = the task and first
        observation, completion = the transcript of the whole episode, reward = its return, advantage = the mean of
        its step advantages (0 for failed episodes, which are not trained on), plus `success` and `turns` columns."""
        entries = []
        for group_index, group in enumerate(batch.groups):
            for trajectory in group.trajectories:
                values = [v for v in step_advantages.get((group_index, trajectory.episode_id), []) if v is not None]
                values = values or [0.0]
                entries.append((episode_prompt(trajectory), episode_transcript(trajectory), trajectory.episode_return,
                                sum(values) / len(values), trajectory.success, trajectory.num_steps))
        for prompt, completion, episode_return, advantage, success, turns in gather_object(entries):
            self._logs["prompt"].append(prompt)
            self._logs["completion"].append(completion)
            self._logs["rewards"]["environment_return"].append(episode_return)
            self._logs["advantages"].append(advantage)
            self._logs["extra"]["success"].append(success)
            self._logs["extra"]["turns"].append(turns)

    def _save_trajectories(self, batch: RolloutBatch, step_advantages: dict) -> None:
        """Append this rollout to output_dir/trajectories as one crash-safe parquet shard (`TrajectoryWriter`), one row
        per step with its advantage (None for failed episodes). The writer is created on the first rollout of each
        `train()`, so a resumed run numbers its shards after the existing ones."""
        if self._trajectory_writer is None:
            self._trajectory_writer = TrajectoryWriter(
                os.path.join(self.args.output_dir, TRAJECTORIES_DIR),
                run_info=self.run_info or build_run_info(self),
                rank=self.accelerator.process_index,
                unrecorded_signals=[s.name for s in self._signal_cache.values() if not s.recorded],
            )
        self._trajectory_writer.write(batch, step_advantages, self.state.global_step)


# How much of an episode a completions-table entry shows (our choice: enough to follow a puzzle, short enough for a
# console table): texts longer than TRANSCRIPT_TEXT_CHARS are cut, and of longer episodes the first and last
# TRANSCRIPT_TURNS // 2 turns are shown.
TRANSCRIPT_TEXT_CHARS = 300
TRANSCRIPT_TURNS = 12


def episode_prompt(trajectory: Trajectory) -> str:
    """What the policy was asked: the task text and the first observation."""
    first = trajectory.steps[0].observation if trajectory.steps else ""
    return "\n".join(_shorten(text) for text in (trajectory.task_text, first) if text)


def episode_transcript(trajectory: Trajectory) -> str:
    """The episode after its first observation, turn by turn: each action (with its reward when not 0, and whether
    the environment rejected it), the observation it led to, and how the episode ended.

    Example:
        >>> from trl_agents.trajectory import Step, Trajectory
        >>> steps = [Step("P F G", "right"), Step("F P G", "right", reward=1.0, done=True)]
        >>> print(episode_transcript(Trajectory(task={}, steps=steps, success=True)))
        Action 1: right
        Observation 2: F P G
        Action 2: right [reward 1]
        => solved in 2 turns
    """
    steps = trajectory.steps
    turns = []
    for index, step in enumerate(steps):
        marks = ([] if step.valid else ["invalid"]) + ([f"reward {step.reward:g}"] if step.reward else [])
        action = f"Action {index + 1}: {_shorten(step.action_text.strip())}"
        lines = [action + (f" [{', '.join(marks)}]" if marks else "")]
        if index + 1 < len(steps):
            observation = _shorten(steps[index + 1].observation)
            lines.append(f"Observation {index + 2}:" + ("\n" if "\n" in observation else " ") + observation)
        turns.append("\n".join(lines))
    if len(turns) > TRANSCRIPT_TURNS:
        half = TRANSCRIPT_TURNS // 2
        turns = [*turns[:half], f"... ({len(turns) - 2 * half} turns not shown) ...", *turns[-half:]]
    if trajectory.failed:
        ending = f"=> failed: {_shorten(trajectory.error)}"
    elif trajectory.success:
        ending = f"=> solved in {len(steps)} turns"
    elif steps and steps[-1].done:
        ending = f"=> ended unsolved after {len(steps)} turns"
    else:
        ending = f"=> unsolved when the episode stopped after {len(steps)} turns"
    return "\n".join([*turns, ending])


def _shorten(text: str) -> str:
    return text if len(text) <= TRANSCRIPT_TEXT_CHARS else text[: TRANSCRIPT_TEXT_CHARS - 1] + "…"


def loss_mask(inputs: dict[str, Any]) -> torch.Tensor:
    """The trained tokens of a micro-batch: the completion mask without environment tokens (conversation rows)."""
    mask = inputs["completion_mask"]
    return mask * inputs["tool_mask"] if "tool_mask" in inputs else mask


def rows_per_forward(rows: int, width: int, max_tokens: int | None) -> int:
    """Rows of `width` padded tokens in one forward: at most `rows`, and at most `max_tokens` tokens (at least one
    row).

    >>> rows_per_forward(16, 100, None), rows_per_forward(16, 100, 450), rows_per_forward(16, 1000, 450)
    (16, 4, 1)
    """
    if max_tokens is None:
        return rows
    return max(1, min(rows, max_tokens // max(width, 1)))


# How TRL normalises each loss type over a micro-batch, so that row chunks of it add up to its loss: "global" loss
# types divide by the generation batch's token count (additive as they are), "rows" ones average over the rows
# (a chunk weighs its share of the rows), "tokens" over the loss tokens (its share of the tokens).
CHUNK_WEIGHTS = {"dapo": "global", "cispo": "global", "vespo": "global", "grpo": "rows", "sapo": "rows",
                 "dr_grpo": "rows", "luspo": "rows", "bnpo": "tokens"}


def loss_chunks(
    inputs: dict[str, Any], max_tokens: int | None, loss_type: str, width: int | None = None
) -> list[tuple[dict[str, Any], float]]:
    """A micro-batch's row chunks of at most `max_tokens` padded tokens each (rows × `width`, by default the
    micro-batch's own), with the weight of each in TRL's loss (`CHUNK_WEIGHTS`); one chunk of weight 1 when it
    fits. Tensors whose first dimension is the row count are cut; the rest (e.g. `num_items_in_batch`) is shared.

    >>> import torch
    >>> batch = {"prompt_ids": torch.zeros(5, 3), "completion_ids": torch.zeros(5, 2),
    ...          "completion_mask": torch.tensor([[1, 1]] * 4 + [[1, 0]]), "num_items_in_batch": torch.tensor(9)}
    >>> [(len(c["prompt_ids"]), round(w, 3)) for c, w in loss_chunks(batch, 20, "grpo")]  # 4 rows of 5 tokens
    [(4, 0.8), (1, 0.2)]
    >>> [round(w, 3) for _, w in loss_chunks(batch, 20, "bnpo")], [w for _, w in loss_chunks(batch, 20, "dapo")]
    ([0.889, 0.111], [1.0, 1.0])
    """
    rows = inputs["prompt_ids"].size(0)
    width = width or inputs["prompt_ids"].size(1) + inputs["completion_ids"].size(1)
    step = rows_per_forward(rows, width, max_tokens)
    if step >= rows:
        return [(inputs, 1.0)]
    kind = CHUNK_WEIGHTS.get(loss_type)
    if kind is None:
        raise ValueError(f"max_tokens_per_forward cannot split the loss of loss_type={loss_type!r}: use one of "
                         f"{', '.join(CHUNK_WEIGHTS)}, or max_tokens_per_forward=None")
    mask = loss_mask(inputs).float()
    tokens = float(mask.sum())
    chunks = []
    for start in range(0, rows, step):
        end = min(start + step, rows)
        chunk = {key: value[start:end] if torch.is_tensor(value) and value.dim() > 0 and value.size(0) == rows
                 else value for key, value in inputs.items()}
        if kind == "global":
            weight = 1.0
        elif kind == "rows":
            weight = (end - start) / rows
        else:
            weight = float(mask[start:end].sum()) / tokens if tokens > 0 else (end - start) / rows
        chunks.append((chunk, weight))
    return chunks


def trainable_groups(groups: Sequence[Group], min_healthy_episodes: int) -> tuple[list[Group], int]:
    """(each group's healthy episodes, or no episode when fewer than `min_healthy_episodes` are healthy; how many
    groups were emptied that way). Positions are kept: `result[g]` is `groups[g]`'s, as credit and records expect.

    >>> from trl_agents.trajectory import Group, Trajectory
    >>> group = Group({}, [Trajectory({}), Trajectory({}, error="step failed: timed out")])
    >>> kept, dropped = trainable_groups([group], 2)
    >>> len(kept[0].trajectories), dropped
    (0, 1)
    """
    kept, dropped = [], 0
    for group in groups:
        healthy = group.healthy()
        if 0 < len(healthy.trajectories) < min_healthy_episodes:
            healthy = Group(task=group.task, trajectories=[])
            dropped += 1
        kept.append(healthy)
    return kept, dropped


def filter_groups(groups: list[Group], advantages: list, filters: Sequence[Callable]) -> tuple[list[Group], list]:
    """(groups, advantages) with the groups some filter rejects emptied (no episode, no advantage), positions kept.

    >>> from trl_agents.trajectory import Group, Trajectory
    >>> kept, values = filter_groups([Group({}, [Trajectory({})]), Group({}, [Trajectory({})])], [[[1.0]], [[2.0]]],
    ...                              [lambda groups: [True, False]])
    >>> [len(g.trajectories) for g in kept], values
    ([1, 0], [[[1.0]], []])
    """
    for keep in filters:
        decisions = list(keep(groups))
        if len(decisions) != len(groups):
            raise ValueError(f"a group filter returned {len(decisions)} decisions for {len(groups)} groups")
        groups = [g if ok else Group(task=g.task, trajectories=[]) for g, ok in zip(groups, decisions, strict=True)]
        advantages = [a if ok else [] for a, ok in zip(advantages, decisions, strict=True)]
    return groups, advantages


def _step_advantages(batch: RolloutBatch, healthy: list[Group], advantages) -> dict[tuple[int, int], list]:
    """(group index, episode id) -> one scalar per step the episode owns (`owned_steps`): the advantage the step was
    trained with (the mean over tokens for per-token credit; for a step a tree shares, the sum its paths give it), or
    None for a step nobody trained (an infrastructure-failed episode's; a failed parent's shared steps still carry
    the value its healthy children trained them with). `healthy[g]` is `batch.groups[g].healthy()`."""
    trained = step_values(healthy, advantages)

    def scalar(value):
        if value is None:
            return None
        return float(value) if isinstance(value, (int, float)) else float(sum(value) / max(len(value), 1))

    return {
        (group_index, trajectory.episode_id): [scalar(trained.get(id(step))) for step in trajectory.owned_steps]
        for group_index, group in enumerate(batch.groups)
        for trajectory in group.trajectories
    }


def importance_sampling_ratio(
    old_logps: torch.Tensor,
    sampling_logps: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    clip_min: float | None,
    clip_max: float | None,
) -> torch.Tensor:
    """TRL 1.16's vLLM importance-sampling ratio exp(old - sampling) over the `mask`ed tokens.

    `token_*` modes give one ratio per token, (B, T); `sequence_*` modes one per row from the summed log-ratio, (B, 1).
    `*_truncate` clamps to [clip_min, clip_max]; `*_mask` zeroes ratios outside it (None = unbounded). A NaN sampling
    log-prob (the engine could not score the token) contributes a zero log-ratio, i.e. no correction.

    Example:
        >>> old, sampled = torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1.5, float("nan")]])
        >>> importance_sampling_ratio(old, sampled, torch.ones(1, 2), "token_truncate", None, 3.0)
        tensor([[1.6487, 1.0000]])
        >>> importance_sampling_ratio(old, sampled, torch.ones(1, 2), "sequence_mask", None, 1.5)
        tensor([[0.]])
    """
    log_ratio = torch.nan_to_num((old_logps - sampling_logps) * mask, nan=0.0)
    if mode.startswith("sequence_"):
        log_ratio = log_ratio.sum(dim=-1, keepdim=True)
    ratio = torch.exp(log_ratio)
    if mode in ("token_truncate", "sequence_truncate"):
        return torch.clamp(ratio, min=clip_min, max=clip_max)
    if mode in ("token_mask", "sequence_mask"):
        low = -math.inf if clip_min is None else clip_min
        high = math.inf if clip_max is None else clip_max
        return ratio.masked_fill((ratio < low) | (ratio > high), 0.0)
    raise ValueError(
        f"vllm_importance_sampling_mode must be one of 'token_truncate', 'token_mask', 'sequence_truncate', "
        f"'sequence_mask', got {mode!r}"
    )


def _check_generator(generator: Generator | None, args: AgentGRPOConfig) -> None:
    """Refuse generator settings that cannot both hold (before TRL connects to a vLLM server or starts an engine)."""
    if generator is not None and args.use_vllm:
        raise ValueError(
            "use_vllm=True makes the trainer build its own vLLM generator on TRL's engine (`trainer.vllm_generation`), "
            "which a `generator` argument would leave unused, holding GPU memory or a server connection. Pass "
            "either `generator=` or `use_vllm=True`, not both."
        )
    off_policy = bool(getattr(generator, "samples_off_policy", False)) and args.vllm_importance_sampling_correction
    per_token = args.vllm_importance_sampling_mode in ("token_truncate", "token_mask")
    if off_policy and args.loss_type == "vespo" and not per_token:
        raise ValueError(
            "loss_type='vespo' with an off-policy generator needs a per-token vllm_importance_sampling_mode "
            f"('token_truncate' or 'token_mask'), got {args.vllm_importance_sampling_mode!r} (TRL's rule for vLLM)."
        )


@contextlib.contextmanager
def _attribute_set(obj: Any, name: str, value: Any):
    """Set `obj.name = value` for the duration of the block."""
    previous = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, previous)


@contextlib.contextmanager
def _capturing_policy_logps(trainer: GRPOTrainer, store: dict[str, torch.Tensor], inputs: dict | None = None):
    """Keep the per-token log-probs (with their graph) that TRL's `_compute_loss` gets from its one call of
    `_get_per_token_logps_and_entropies` on the policy, so that an auxiliary loss reuses them (no second forward),
    and its per-token entropies (detached: `loss_entropies`);
    and, when the trainer overrides `loss_advantages`, put its advantages into `inputs` (the dict the loss reads
    next) right after that forward."""
    original = trainer._get_per_token_logps_and_entropies
    rescale = inputs is not None and type(trainer).loss_advantages is not AgentGRPOTrainer.loss_advantages

    def keep(*args, **kwargs):
        out = original(*args, **kwargs)
        store["per_token_logps"] = out[0]
        if out[1] is not None:
            store["entropies"] = out[1].detach()
        if rescale:
            advantages = trainer.loss_advantages(inputs, out[0])
            if advantages is not None:
                inputs["advantages"] = advantages
        return out

    trainer._get_per_token_logps_and_entropies = keep
    try:
        yield
    finally:
        del trainer._get_per_token_logps_and_entropies  # the instance attribute; the class's method shows again


class _TeacherUpdate(TrainerCallback):
    """Moves an EMA teacher towards the policy after every optimizer step."""

    def __init__(self, trainer: GRPOTrainer, teacher):
        self.trainer, self.teacher = trainer, teacher

    def on_step_end(self, args, state, control, **kwargs):
        self.teacher.update(self.trainer.accelerator.unwrap_model(self.trainer.model))


@contextlib.contextmanager
def _no_gradient_checkpointing(trainer: GRPOTrainer):
    from trl.models.utils import disable_gradient_checkpointing

    with disable_gradient_checkpointing(trainer.model, trainer.args.gradient_checkpointing_kwargs):
        yield


def resolve_checkpoint(resume_from_checkpoint: str | bool | None, output_dir: str) -> str | None:
    """The checkpoint directory a run resumes from: a path; True (or "true", as the command line spells it) = the last
    `checkpoint-*` of `output_dir`; None, False or "false" = none. A one-line error when there is nothing to resume.

    >>> resolve_checkpoint(None, "out") is None and resolve_checkpoint("false", "out") is None
    True
    """
    value = resume_from_checkpoint
    if isinstance(value, str) and value.strip().lower() in ("true", "false", "none", ""):
        value = {"true": True}.get(value.strip().lower())
    if value is None or value is False:
        return None
    if value is True:
        last = get_last_checkpoint(output_dir) if os.path.isdir(output_dir) else None
        if last is None:
            raise ValueError(
                f"resume_from_checkpoint=true, but output_dir {output_dir!r} has no checkpoint-* folder to resume "
                "from: pass a checkpoint path, or start without --resume_from_checkpoint."
            )
        return last
    path = os.fspath(value)
    if not os.path.isfile(os.path.join(path, "trainer_state.json")):
        raise ValueError(
            f"resume_from_checkpoint={path!r} is not a checkpoint folder (it has no trainer_state.json): pass a "
            f"checkpoint-* folder of a run, or true for the last one of output_dir."
        )
    return path


def _tasks_of(inputs: list[dict[str, Any]], num_generations: int) -> list[dict[str, Any]]:
    """The unique tasks of a generation batch: TRL's sampler repeats every row G times in a row."""
    if len(inputs) % num_generations != 0:
        raise ValueError(
            f"A batch of {len(inputs)} rows cannot hold whole groups of {num_generations} episodes per task."
        )
    tasks = []
    for start in range(0, len(inputs), num_generations):
        block = inputs[start : start + num_generations]
        if any(row != block[0] for row in block[1:]):
            raise RuntimeError(
                "The sampler did not hand over whole groups (G identical task rows in a row); check that "
                "per_device_train_batch_size × steps_per_generation is a multiple of num_generations."
            )
        tasks.append(dict(block[0]))
    return tasks


def _as_namespace(args: Any) -> Any:
    """A config, or a dict of config values (the registry's defaults), as an object with attribute access."""
    if isinstance(args, dict):
        import types

        return types.SimpleNamespace(**args)
    return args


def _envs_with(capabilities: tuple[str, ...]) -> list[str]:
    from ..envs import list_envs

    return [name for name, env_cls in list_envs().items() if set(capabilities) <= env_cls.capabilities()]


def _as_task_dataset(dataset, args: AgentGRPOConfig, name: str, required: bool):
    """Validate that a dataset holds task rows (and accept a plain list of dicts)."""
    if dataset is None:
        if required:
            raise ValueError(
                f"AgentGRPOTrainer needs a `{name}` of task rows, e.g. "
                "`Dataset.from_list(trl_agents.envs.get_env_class('sokoban').task_split('train', 1000))`."
            )
        return None
    if isinstance(dataset, list):
        if not dataset or not all(isinstance(row, dict) for row in dataset):
            raise ValueError(f"`{name}` must be a non-empty list of task dicts or a datasets.Dataset")
        dataset = Dataset.from_list(dataset)
    if isinstance(dataset, IterableDataset):
        return dataset  # validated lazily, row by row, by the rollout
    if len(dataset) == 0 and (required or not dataset.column_names):
        raise ValueError(f"`{name}` has no task rows: training on it would run 0 steps. Pass at least one task.")
    columns = set(dataset.column_names)
    if "env" not in columns and args.env_name is None:
        if "prompt" in columns:
            raise ValueError(
                f"`{name}` looks like a prompt dataset (it has a 'prompt' column). AgentGRPOTrainer's rows are tasks: "
                "an 'env' column (or the config field `env_name`) and the fields the environment's reset needs, e.g. "
                "{'env': 'sokoban', 'seed': 3}. Build them with `get_env_class(name).task_split('train', n)`."
            )
        raise ValueError(
            f"The rows of `{name}` have no task: they need an 'env' column naming a registered environment (or set "
            "the config field `env_name`) plus the fields its reset needs, e.g. {'env': 'sokoban', 'seed': 3}."
        )
    env_names = set(dataset["env"]) if "env" in columns else {args.env_name}
    for env_name in sorted(env_names, key=str):
        env_cls = get_env_class(env_name)  # clear error for unknown names
        if env_cls.task_keys and not columns.intersection(env_cls.task_keys):
            raise ValueError(
                f"The rows of `{name}` have no task for environment {env_name!r}: it needs a column among "
                f"{', '.join(map(repr, env_cls.task_keys))}. Build rows with `{env_cls.__name__}.task_split(split, n)`."
            )
    return dataset
