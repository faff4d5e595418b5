"""`AgentGRPOConfig`: the configuration of `AgentGRPOTrainer` (as TRL keeps `GRPOConfig` in `grpo_config.py`).

Every `GRPOConfig` field, plus the agent/environment fields; `__post_init__` checks them once, so that a bad setting
is a one-line error naming the field before anything starts. Helpers that configs and other modules share live here
too: `as_dict` (dict-valued options from the command line), `cpu_only`, `check_field_types`, `check_generator`.
"""

from __future__ import annotations

import json
import logging
import typing
import warnings
from dataclasses import dataclass, field, fields
from typing import Any

import torch
from trl import GRPOConfig

from ..names import check_choice
from ..rollout.engine import ROLLOUT_SCHEDULES, ROW_FORMATS
from ..rollout.env_pool import check_execution_settings
from ..rollout.decoding import shaping_options
from ..rollout.generators import GENERATION_BACKENDS, Generator
from ..rollout.topologies import TOPOLOGIES
from ..signals import DEFAULT_TEMPLATE, TEACHER_KINDS
from ..signals.views import check_source, check_template
from ..training.loss import IMPORTANCE_SAMPLING_MODES

logger = logging.getLogger(__name__)

ADVANTAGE_ESTIMATORS = ("grpo", "rloo")
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
        max_prompt_length (`int` or `None`, *optional*): Longest prompt in tokens; step prompts drop old history to
            fit, conversations stop there, and an episode whose prompt cannot fit fails. None = the model's context
            length (`max_position_embeddings`) minus `max_completion_length` (our default).
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
        rollout_schedule (`str`, *optional*, defaults to `"lockstep"`): How episodes advance: `"lockstep"`,
            `"task"` or `"free"` (per-episode scheduling, `trl_agents.rollout.scheduler`).
        deterministic_sampling (`bool` or `None`, *optional*): A sampling seed per generation request (None: on
            under per-episode scheduling).
        generation_window (`float` or `None`, *optional*): Per-episode scheduling: the longest a request waits for
            others to join its generation call; None = the measured fixed cost of a call.
        max_staleness (`int`, *optional*, defaults to `0`): 0 = each rollout is generated by the weights it trains;
            1 = one-step-off (the next rollout generates while this one trains; `training.one_step_off`).
        behaviour_weight_mode (`str`, *optional*, defaults to `"token_truncate"`): How the behaviour weight
            π_prox/μ of a stale rollout enters TRL's loss (TRL's importance-sampling modes).
        behaviour_weight_cap (`float`, *optional*, defaults to `2.0`): C of the behaviour weight (upper bound).
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
        "conversation that outgrows it ends there (truncated); an episode whose prompt cannot fit even so (a step "
        "prompt without history, a conversation's first prompt) fails with an error naming its length and the bound, "
        "and the run goes on. None = the model's context length (config.max_position_embeddings) minus "
        "max_completion_length: our default, so that an environment's huge observation never reaches generation "
        "whole (e.g. 32768 - 256 = 32512 tokens for Qwen2.5-0.5B-Instruct)."},
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
        "starts a local Ray instance listening on 127.0.0.1 only, unless Ray is already initialised or RAY_ADDRESS "
        "names a cluster. With several training processes, start one "
        "cluster (`ray start --head`) and use 'auto', so that they share it. trl-agents must be installed on every "
        "node."},
    )
    rollout_schedule: str = field(
        default="lockstep",
        metadata={"help": "How the episodes of a rollout advance. 'lockstep': turn by turn, every active episode's "
        "turn in one generation call, each turn waiting for the slowest environment call (near-optimal for fast "
        "envs: the built-in puzzles). 'free': each episode advances alone (its reset, generation requests and steps "
        "as they come; generation micro-batched, or one request per turn to a vLLM server), for envs whose steps "
        "take long and vary (tools, sandboxes, services). 'task': a turn barrier per task. A topology runs under the "
        "stricter of this and its own class (PATR: 'task'; 3SPO: lockstep). Give environments room to overlap: "
        "env_workers >= episodes per rollout, or env_backend 'process'/'ray'. See docs/async.md."},
    )
    deterministic_sampling: bool | None = field(
        default=None,
        metadata={"help": "Give every generation request its own seed, a hash of (seed, rollout, task, episode, "
        "turn), so what a turn samples does not depend on which requests share its generation call: rollouts are "
        "reproducible under any schedule. None (our choice): on under 'free'/'task' scheduling, off under lockstep "
        "(sampling from the global random state, as before). Needs the 'generate' or 'static' generation backend, or "
        "vLLM server mode."},
    )
    generation_window: float | None = field(
        default=None,
        metadata={"help": "Per-episode scheduling with the built-in generator: the longest a generation request "
        "waits for others to join its call while environment calls are still running (seconds). None (our choice): "
        "the fixed cost of one generation call, measured during the rollout, which keeps small calls from paying "
        "that cost again and again when it is large (docs/async.md)."},
    )
    max_staleness: int = field(
        default=0,
        metadata={"help": "How many weight updates a trained rollout may lag the weights it trains. 0: generate, "
        "then train on it (on-policy). 1: one-step-off: at step s the trainer takes the rollout that the weights of "
        "step s-1 generated, hands the weights of step s to the generator (nothing is in flight then), starts the "
        "next rollout in the background and trains, so rollout and update overlap. Nothing is dropped for "
        "staleness; TRL's loss corrects with the behaviour weight (behaviour_weight_mode / _cap). A vLLM server "
        "generates while the trainer trains; the built-in generator uses a copy of the trained weights (frozen "
        "ones, e.g. a LoRA base, are shared; refused when the copy does not fit). Methods that need on-policy data "
        "refuse 1 (`trl-agents methods`). See docs/async.md."},
    )
    behaviour_weight_mode: str = field(
        default="token_truncate",
        metadata={"help": "With max_staleness=1: how the behaviour weight π_prox/μ (the trainer's recomputed "
        "log-probs over the sampler's) multiplies TRL's per-token loss, in TRL's importance-sampling modes: "
        "'token_truncate' (min(w, C) per token; our default, as AReaL and verl's typical practice), 'token_mask', "
        "'sequence_truncate' or 'sequence_mask' (TRL's default for vLLM). docs/async.md#one-step-off."},
    )
    behaviour_weight_cap: float = field(
        default=2.0,
        metadata={"help": "C of the behaviour weight with max_staleness=1: the truncation bound (or, in mask modes, "
        "the largest weight kept). Our default 2 (verl suggests 1.5-5). The share of trained tokens above it is "
        "logged as async/is_truncated_frac."},
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
        "each trimmed of the padding none of its rows needs (`training.forward.length_groups`): the same log-probs, "
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
        check_choice("rollout_schedule", self.rollout_schedule, ROLLOUT_SCHEDULES)
        if self.generation_window is not None and not self.generation_window >= 0:
            raise ValueError(f"generation_window must be a number of seconds >= 0 or None (measured), got "
                             f"{self.generation_window!r}")
        if self.max_staleness not in (0, 1):
            raise ValueError(f"max_staleness must be 0 (on-policy) or 1 (one-step-off), got {self.max_staleness!r}")
        check_choice("behaviour_weight_mode", self.behaviour_weight_mode, IMPORTANCE_SAMPLING_MODES)
        if not self.behaviour_weight_cap >= 1.0:
            raise ValueError(f"behaviour_weight_cap must be >= 1 (e.g. 2.0), got {self.behaviour_weight_cap!r}")
        if self.rollout_schedule != "lockstep" and self.env_backend == "thread" and self.env_workers == 1:
            logger.warning("rollout_schedule=%r with env_backend='thread' and env_workers=1 runs one environment call "
                           "at a time: set env_workers to the episodes per rollout (or env_backend='process') so that "
                           "episodes overlap their environment calls.", self.rollout_schedule)
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
        carry_checkpointing_names(self)
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



# transformers 5.24 renamed TrainingArguments' `gradient_checkpointing(_kwargs)` to `activation_checkpointing(_kwargs)`
# and warns whenever the old name is set. TRL 1.16 sets the old name (True by default) and documents it, and so do our
# configs, so every run would print a FutureWarning the user can do nothing about.
CHECKPOINTING_NAMES = (
    ("gradient_checkpointing", "activation_checkpointing"),
    ("gradient_checkpointing_kwargs", "activation_checkpointing_kwargs"),
)
# TRL 1.16 reads the renamed model property `is_gradient_checkpointing` on every generation (trl.models.utils):
# the same warning, about TRL's code, not the user's.
warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)


def carry_checkpointing_names(args) -> None:
    """Copy `gradient_checkpointing(_kwargs)` onto `activation_checkpointing(_kwargs)` where this transformers has the
    new names and the new one is unset, before `TrainingArguments.__post_init__` resolves the alias (which then keeps
    the two equal, without a warning). Either name works; the new one wins when both are given."""
    for old, new in CHECKPOINTING_NAMES:
        if hasattr(args, new) and getattr(args, new) is None and getattr(args, old) is not None:
            setattr(args, new, getattr(args, old))


def checkpointing_setting(enabled: bool) -> dict[str, bool]:
    """The keyword that turns activation (gradient) checkpointing on or off under this transformers: for configs built
    outside `AgentGRPOConfig` (the warm start's `SFTConfig`)."""
    from transformers import TrainingArguments

    names = {f.name for f in fields(TrainingArguments)}
    return {"activation_checkpointing" if "activation_checkpointing" in names else "gradient_checkpointing": enabled}


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



def check_generator(generator: Generator | None, args: AgentGRPOConfig) -> None:
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

