"""`AgentGRPOTrainer`: TRL's `GRPOTrainer` for multi-turn agents in environments. This file is the TRL adapter: the
class, its public hooks, and thin overrides of TRL's private methods that call the stages of `trl_agents.training`
in order (docs/concepts/training_loop.md); the config is in `agent_grpo_config.py`.

What changes w.r.t. `GRPOTrainer`: dataset rows are tasks (`{"env": "sokoban", "seed": 3}`), each running a group of
episodes; `_generate_and_score_completions` runs the multi-turn rollout, the declared signals, `compute_advantages`
(one advantage per step) and returns step (or conversation) rows with (B, T) advantages, old and reference log-probs
computed as TRL does; `_prepare_inputs` splits the rows without dropping any; `_compute_loss` weighs TRL's loss by
`policy_loss_weight`, adds `compute_auxiliary_loss` and runs over-budget micro-batches in row chunks;
`_get_per_token_logps_and_entropies` forwards rows in groups of similar length; `_save` also writes
`agent_config.json`, `rollout_totals.json` and `save_extra_state`.

Method variants are thin subclasses: they declare their methods (`methods`), the signals and capabilities they need
and override public hooks only. Every hook, its stage, its default and the methods that override it: docs/concepts/
hooks.md (`trainers/gigpo.py` is a small example). TRL's private names are overridden, read and written in this file
only (`tests/training/test_trl_contract.py` pins them; `tests/project/test_method_registry.py` enforces it).

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
import copy
import functools
import inspect
import logging
import os
import shutil
from collections.abc import Callable
from typing import Any

import torch
from accelerate.utils import gather_object
from datasets import Dataset, IterableDataset
from huggingface_hub import ModelCard
from transformers import TrainerCallback
from trl import GRPOTrainer
from trl.extras.profiling import profiling_context
from trl.models import unwrap_model_for_generation
from trl.trainer.utils import shuffle_sequence_dict

from ..checkpoints import (
    DiskFullError,
    checkpoint_step,
    find_corrupt_file,
    finished_message,
    incomplete_reason,
    is_disk_full,
    load_rollout_totals,
    resolve_checkpoint,
    save_agent_config,
    save_rollout_totals,
)
from ..credit import get_estimator
from ..records import TRAJECTORIES_DIR, TrajectoryWriter, build_run_info, write_run_info
from ..rollout import EnvPool, PromptRenderer, RolloutEngine, RolloutProgress, SamplingParams, TransformersGenerator
from ..rollout.generators import Generator
from ..rollout.prompts import prompt_length_limit
from ..rollout.topologies import IndependentTopology, Topology, get_topology
from ..rollout.vllm import VLLMGenerator
from ..signals import ModelSignal, ModelSignalContext
from ..training.batch import pad_rows, split_rows
from ..training.credit_phase import EmptyRollouts, episode_step_values, filter_groups, trainable_groups
from ..training.forward import forward_rows, grouped_forward, no_gradient_checkpointing, reference_model, row_forwards
from ..training.loss import add_importance_sampling_ratio, attribute_set, backward_in_parts, batch_token_mean
from ..training.loss import common_width, loss_chunks
from ..training.one_step_off import BehaviourSnapshot, OneStepOff, check_version, stamp_version, tasks_key
from ..training.metrics import ProcessMetrics, completion_entries, log_completions, reduce_rollout_stats, rollout_stats
from ..training.rows import TrainingRows, build_rows
from ..training.signal_phase import SignalPhase, TeacherUpdate, build_teacher, required_capabilities
from ..training.tasks import (
    as_namespace,
    as_task_dataset,
    check_env_capabilities,
    check_privileged_field,
    check_topology,
    environment_return,
    tasks_of,
)
from ..trajectory import Group, RolloutBatch, Trajectory
from .agent_grpo_config import AgentGRPOConfig, as_dict, check_generator
from .registry import Method, MethodInfo, declared_method, matching_info

logger = logging.getLogger(__name__)

__all__ = ["AgentGRPOConfig", "AgentGRPOTrainer"]


class AgentGRPOTrainer(ProcessMetrics, GRPOTrainer):
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
        quantization_config (`transformers.BitsAndBytesConfig`, *optional*): Load the model (given by name) quantized,
            as `GRPOTrainer` does; with `peft_config`, QLoRA. Needs a CUDA GPU and `bitsandbytes`.
        generator ([`~trl_agents.rollout.Generator`], *optional*): Replaces the built-in generation: transformers
            `generate`, or vLLM with `use_vllm=True` (then TRL's `vllm_generation` wrapped in a `VLLMGenerator`).
        env_pool ([`~trl_agents.rollout.EnvPool`], *optional*): Where environment instances come from.
    """

    _tag_names = ["trl", "trl-agents", "agent-grpo"]
    _name = "AgentGRPO"
    config_class = AgentGRPOConfig
    methods = (
        MethodInfo("grpo", "arXiv 2402.03300", "trl_agents.credit.grpo", max_staleness=1, title="GRPO",
                   defaults={"advantage_estimator": "grpo"},
                   tests=("tests/credit/test_credit.py", "tests/training/test_trainer.py")),
        MethodInfo("dr_grpo", "arXiv 2503.20783", "trl_agents.credit.grpo", max_staleness=1, title="Dr. GRPO",
                   defaults={"advantage_estimator": "grpo", "scale_rewards": "none", "loss_type": "dr_grpo"},
                   tests=("tests/credit/test_credit.py",)),
        MethodInfo("rloo", "arXiv 2402.14740", "trl_agents.credit.rloo", max_staleness=1, title="RLOO",
                   defaults={"advantage_estimator": "rloo"}, tests=("tests/credit/test_credit.py",)),
    )

    @property
    def method(self) -> Method | None:
        """The registered method this trainer runs (its class's declaration whose `defaults` the config matches:
        `dr_grpo` over `grpo`), None for a user subclass; `run_info.json` and the model card read it."""
        return declared_method(self)

    # What a method needs (docs/concepts/hooks.md): environment capabilities checked at start-up beyond its signals'
    # and topology's; the signals it declares (docs/signals.md); which of them go into the training batch.
    required_env_capabilities: tuple[str, ...] = ()
    signals: tuple[str, ...] = ()
    training_signals: tuple[str, ...] = ()
    # Whether `compute_advantages` is written for trees of episodes (a shared step is trained once, with the sum of
    # its paths' values; an estimator blind to trees would count its penalty once per path): BPO sets it.
    supports_trees: bool = False

    @classmethod
    def default_args(cls, model) -> AgentGRPOConfig:
        """The config of a trainer built without one: its config class named `<model name>-<trainer name>`."""
        model_name = model if isinstance(model, str) else model.config._name_or_path or "model"
        return cls.config_class(f"{str(model_name).split('/')[-1]}-{cls._name}")

    @classmethod
    def card_metadata(cls) -> dict[str, Any]:
        """TRL's class-level metadata of the trainer: its Hub tags (`_tag_names`), the paper TRL's card cites."""
        return {"tags": list(cls._tag_names), "paper": dict(getattr(cls, "_paper", None) or {})}

    @property
    def text_tokenizer(self):
        """The tokenizer of the processing class (TRL's `_tokenizer`)."""
        return self._tokenizer

    @property
    def micro_batch_index(self) -> int:
        """Which micro-batch of its generation batch the loss is computing (TRL's `_step` counter)."""
        return self._step % self.args.steps_per_generation

    def log_values(self, values: dict[str, float]) -> None:
        """Send `values` (e.g. a held-out evaluation) to the `report_to` trackers and the log history at the current
        step, as they are: `Trainer.log`, without GRPOTrainer's averaging of the step metrics into them or its
        completions table."""
        from transformers import Trainer

        if values:
            Trainer.log(self, dict(values))

    def install_lr_scheduler(self, scheduler):
        """Make `scheduler` the learning-rate schedule as `Trainer.create_scheduler` does (a later `train()` builds a
        new one): for a `create_scheduler` that builds its own (IB-RL: one per role)."""
        self.lr_scheduler = scheduler
        self._created_lr_scheduler = True
        return scheduler

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
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
        quantization_config=None,
    ):
        config_class = self.config_class
        if args is None:
            args = self.default_args(model)
        elif not isinstance(args, config_class):
            raise TypeError(
                f"{type(self).__name__} needs a {config_class.__name__}, got {type(args).__name__}. Convert a "
                f"GRPOConfig with `{config_class.__name__}.from_grpo_config(grpo_config, max_turns=...)`."
            )
        if args.max_staleness > 0 and (refusal := self.staleness_refusal(args)) is not None:
            raise ValueError(f"{type(self).__name__}: max_staleness={args.max_staleness} is refused: {refusal}; set "
                             "max_staleness=0")
        train_dataset = as_task_dataset(train_dataset, args, "train_dataset", required=True)
        eval_dataset = as_task_dataset(eval_dataset, args, "eval_dataset", required=False)
        for dataset in (train_dataset, eval_dataset):
            check_env_capabilities(dataset, args, required_capabilities(type(self), args), type(self).__name__)
            check_privileged_field(dataset, args, self.needs_teacher(args))
        check_generator(generator, args)
        super().__init__(model=model, reward_funcs=[environment_return], args=args, train_dataset=train_dataset,
                         eval_dataset=eval_dataset, processing_class=processing_class, callbacks=callbacks,
                         optimizers=optimizers, peft_config=peft_config, quantization_config=quantization_config)
        # The prompt bound: `max_prompt_length`, else the model's context minus `max_completion_length` (our choice).
        prompt_limit, prompt_limit_origin = prompt_length_limit(args.max_prompt_length, self.model,
                                                                args.max_completion_length)
        self.renderer = PromptRenderer(self._tokenizer, history_length=args.history_length,
                                       max_prompt_length=prompt_limit, chat_template_kwargs=self.chat_template_kwargs,
                                       max_prompt_length_origin=prompt_limit_origin)
        if generator is None and args.use_vllm:
            generator = VLLMGenerator(self.vllm_generation, eos_token_ids=self.eos_token_ids)
        self.generator = generator or TransformersGenerator(
            tokenizer=self._tokenizer, eos_token_ids=self.eos_token_ids, model_context=self._model_for_generation,
            backend=args.generation_backend, continuous_batching_config=as_dict(
                args.transformers_continuous_batching_config, "transformers_continuous_batching_config"),
        )
        self._last_loaded_step = -1  # TRL's tag: the step whose weights the generator holds (-1: not synced yet)
        self._rollouts_at_step: tuple[tuple[str, int] | None, int] = (None, 0)  # (mode, step), rollouts there - 1
        self.env_pool = env_pool or EnvPool.from_config(args)
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
        self.empty_rollouts = EmptyRollouts()  # stops a run whose rollouts leave nothing to train on, 3 in a row
        self._setup_signals()
        # One-step-off (max_staleness=1): the rollout in flight, and what generates it (training.one_step_off).
        self.one_step_off: OneStepOff | None = None
        self._behaviour_generator: Generator | None = None
        self._behaviour_renderer: PromptRenderer | None = None
        self._behaviour_snapshot: BehaviourSnapshot | None = None
        self._behaviour_version = -1  # the step whose weights the behaviour generator holds
        self._last_take_step: int | None = None  # the step that took the last rollout (a prefetched one's version)
        if args.max_staleness > 0:
            self._setup_one_step_off(built_in_generator=generator is None and not args.use_vllm)

    @classmethod
    def staleness_refusal(cls, args: Any) -> str | None:
        """Why this trainer cannot train on one-step-off rollouts with `args` (None: it can): its method declares
        `max_staleness=0` (`MethodInfo.staleness_reason`), or its topology computes model signals mid-rollout, which
        would read the weights being trained (docs/async.md#one-step-off)."""
        info = matching_info(cls, args, inherited=True)
        if info is not None and (info.max_staleness or 0) < args.max_staleness:
            reason = info.staleness_reason or "it does not declare the staleness it accepts (MethodInfo.max_staleness)"
            return f"{info.title or info.name} needs on-policy data: {reason}"
        names = cls.make_topology(args).model_signals
        if names:
            return (f"the {args.topology!r} topology computes model signals mid-rollout ({', '.join(names)}), which "
                    "would read the weights being trained")
        return None

    def _setup_one_step_off(self, built_in_generator: bool) -> None:
        """What generates while the policy trains: a vLLM server, or a generator given to the trainer, as they are
        (their `sync_weights` hands them each step's weights); the built-in generator on a copy of the weights
        (`BehaviourSnapshot`, refused when it does not fit)."""
        if (self.is_fsdp_enabled or self.is_deepspeed_enabled) and self.accelerator.num_processes > 1:
            raise ValueError("max_staleness=1 does not run with a policy sharded over processes (FSDP, DeepSpeed): "
                             "its forwards are collectives that a background rollout would interleave with training; "
                             "use DDP with a vLLM server, or max_staleness=0")
        if self.use_vllm and self.args.vllm_mode == "colocate":
            raise ValueError("max_staleness=1 needs the generator to run beside training: vllm_mode='colocate' shares "
                             "the training processes and their GPU memory; use vllm_mode='server', or max_staleness=0")
        if getattr(self.generator, "collective", False) and (
                self.args.rollout_schedule == "lockstep" or not getattr(self.generator, "request_level", False)):
            raise ValueError("max_staleness=1 with several processes needs generation without collectives: set "
                             "rollout_schedule='free' (one request per turn to the vLLM server), or max_staleness=0")
        # The rollout thread renders and decodes with its own copy of the tokenizer: a fast tokenizer is not safe to
        # use from two threads at once, and the trainer's thread renders too (teacher views, judges).
        self._behaviour_renderer = copy.copy(self.renderer)
        self._behaviour_renderer.tokenizer = copy.deepcopy(self._tokenizer)
        if built_in_generator:
            self._behaviour_snapshot = BehaviourSnapshot(self.accelerator.unwrap_model(self.model))
            self._behaviour_generator = TransformersGenerator(
                tokenizer=self._behaviour_renderer.tokenizer, eos_token_ids=self.eos_token_ids,
                model_context=self._behaviour_snapshot.context, backend=self.args.generation_backend,
                continuous_batching_config=as_dict(self.args.transformers_continuous_batching_config,
                                                   "transformers_continuous_batching_config"),
            )
        else:
            self._behaviour_generator = self.generator
        self.one_step_off = OneStepOff(self._background_rollout)

    def _setup_signals(self) -> None:
        """Resolve the declared signals (`training.signal_phase.SignalPhase`); build the topology, and the teacher
        when a teacher signal needs one."""
        args = self.args
        self.signal_phase = SignalPhase(self.signal_names(args), self.signal_options(args),
                                        self.training_signal_names(args), type(self).__name__)
        self.env_signals, self.model_signals = self.signal_phase.env_signals, self.signal_phase.model_signals
        self.rollout_topology = self.build_topology()
        check_topology(self.rollout_topology, args, self.supports_trees, self.needs_teacher(args), type(self).__name__)
        teacher = None
        if self.needs_teacher(args):
            teacher = build_teacher(args, self.accelerator.unwrap_model(self.model), self._model_for_signals,
                                    self.ref_model)
            if teacher.kind == "ema":
                self.add_callback(TeacherUpdate(self, teacher))
        self.teacher = teacher
        self.signal_context = self.signal_phase.context = ModelSignalContext(
            model_context=self._model_for_signals, renderer=self.renderer, row_format=args.row_format,
            pad_token_id=self._tokenizer.pad_token_id if self._tokenizer.pad_token_id is not None else 0,
            temperature=self.temperature, max_rows_per_forward=max(args.per_device_train_batch_size, 1),
            max_tokens_per_forward=args.max_tokens_per_forward, teacher=teacher,
        )

    def model_signal(self, name: str) -> ModelSignal:
        """The model signal `name` this trainer computes (declared, or asked for by its topology), e.g. to read
        what it kept from the last rollout (BiPACE's hidden-state statistics)."""
        return self.signal_phase.signal(name)

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
    def needs_teacher(cls, args: Any) -> bool:
        """Whether the trainer scores with a teacher (`args.teacher`): when it declares teacher log-probs or a
        teacher prompt (a loss that runs the teacher itself)."""
        return bool({"teacher_logprobs", "teacher_prompt"} & set(cls.signal_names(args)))

    @classmethod
    def topology_options(cls, args: Any) -> dict[str, Any]:
        """Options of the topology: the config's `topology_kwargs`. Method trainers build them from their own
        fields (e.g. BPO's branch points and factor)."""
        return dict(as_namespace(args).topology_kwargs or {})

    @classmethod
    def make_topology(cls, args: Any) -> Topology:
        """A new topology for one rollout: `args.topology` built with `topology_options(args)`."""
        args = as_namespace(args)
        options = cls.topology_options(args)
        try:
            return get_topology(args.topology, **options)
        except (TypeError, ValueError) as err:  # a missing, unknown or bad option
            raise ValueError(
                f"topology={args.topology!r} cannot be built from topology_kwargs={options!r}: {err}. See "
                "docs/topologies.md for its options (e.g. {'max_group_size': 32} for 'adaptive')."
            ) from None

    # ---- hooks for method variants -------------------------------------------------------------------------------

    def compute_advantages(self, groups: list[Group]) -> list[list[list[float]]]:
        """One advantage per step (or per action token) of every trajectory of the healthy `groups`,
        `advantages[g][i][t]`; the default is the `advantage_estimator` (GRPO or RLOO)."""
        return self.estimate(self.args.advantage_estimator, groups)

    def compute_auxiliary_loss(
        self, model, inputs: dict[str, Any], per_token_logps: torch.Tensor | None
    ) -> torch.Tensor | None:
        """An extra loss term of this micro-batch `inputs` (None: none), from the policy's log-probs TRL's loss just
        computed (`per_token_logps`, with their graph; None when `policy_loss_weight` is 0), before the division by
        the accumulation steps (docs/concepts/hooks.md)."""
        return None

    def batch_token_mean(self, values: torch.Tensor, mask: torch.Tensor, inputs: dict[str, Any]) -> torch.Tensor:
        """An auxiliary loss aggregated as TRL's "dapo" loss: the token mean over the whole generation batch of every
        process, in `compute_auxiliary_loss`'s convention (`training.loss.batch_token_mean`)."""
        steps = self.args.steps_per_generation if self.model.training else None
        return batch_token_mean(values, mask, inputs["num_items_in_batch"], self.accelerator.num_processes, steps)

    def loss_advantages(self, inputs: dict[str, Any], per_token_logps: torch.Tensor) -> torch.Tensor | None:
        """Per-token advantages (B, T) for TRL's policy loss of this micro-batch, from the log-probs its forward just
        computed (use them detached); None keeps `inputs["advantages"]` (APPO's future-KL scaling)."""
        return None

    def clip_bounds(self, inputs: dict[str, Any]) -> tuple[Any, Any] | None:
        """(ε_low, ε_high) of TRL's clipped ratio for this micro-batch, floats or (B, 1) tensors, instead of
        `epsilon_low` / `epsilon_high`; None keeps them (EPPO's per-task bounds)."""
        return None

    @property
    def policy_loss_weight(self) -> float:
        """Weight of TRL's policy loss in the total loss (1). 0 skips it (and its forward) altogether: a method whose
        whole objective is its auxiliary loss (OPSD without RL)."""
        return 1.0

    def build_topology(self) -> Topology:
        """The training rollouts' topology, built once (its `begin` starts each rollout afresh); evaluation rollouts
        always run the independent topology, so that eval metrics are per-episode rates."""
        return self.make_topology(self.args)

    def save_extra_state(self, output_dir: str) -> None:
        """Write method state that must survive a resume (3SPO's state-score table) into a checkpoint's folder."""

    def load_extra_state(self, checkpoint_dir: str) -> None:
        """Read what `save_extra_state` wrote, on every process, before a resumed training starts."""

    def compute_signals(self, groups: list[Group]) -> None:
        """The model signals the trainer declares, on the healthy episodes of a rollout (after the rollout, before
        credit): values land in `step.signals[name]`; each signal's seconds are logged as `signals/<name>_seconds`."""
        timings = self.signal_phase.compute(groups, self._no_grad_forwards)
        if timings:
            self.log_global_means(timings)

    def estimate(self, name: str, groups: list[Group], *, prefix: str | None = None, **runtime: Any) -> list:
        """The advantages of the credit estimator registered as `name` on `groups` (what `compute_advantages`
        returns), its params read off the config (`XParams.from_config(self.args, **runtime)`, with run-time inputs
        such as a state-score table); its stats are logged as `<prefix or name>/<stat>` over all processes, so every
        process calls it at the same point."""
        estimator = get_estimator(name)
        params = estimator.from_config(self.args, sum_over_processes=self.sum_over_processes, **runtime)
        advantages, stats = estimator(groups, params)
        self.log_global_means({f"{prefix or name}/{stat}": value for stat, value in estimator.logged(stats).items()})
        return advantages

    def metric_store(self) -> dict[str, list[float]]:
        """This logging step's metric values by name, for the current mode (TRL's `_metrics`; `ProcessMetrics`)."""
        return self._metrics["train" if self.model.training else "eval"]

    # ---- rollout and scoring --------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _model_for_signals(self):
        """The policy, unwrapped for no-grad forwards (DeepSpeed ZeRO-3 gathers it as for generation)."""
        with (
            unwrap_model_for_generation(self.model_wrapped, self.accelerator,
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
        with self._model_for_signals() as model, self.signal_phase.captures(model):
            yield model

    def _no_grad_forwards(self):
        """No-grad forwards over the policy (signals, old and reference log-probs): no gradient checkpointing."""
        return no_gradient_checkpointing(self.model, self.args.gradient_checkpointing_kwargs)

    def _signal_for_topology(self, name: str, trajectories: list[Trajectory]) -> None:
        """A model signal a topology needs mid-rollout (e.g. entropies to rank branch points), on `trajectories`."""
        self.signal_phase.for_topology(name, trajectories, self._no_grad_forwards)

    def sampling_params(self) -> SamplingParams:
        """How the policy samples its turns (TRL's generation settings of the config)."""
        return SamplingParams(max_new_tokens=self.max_completion_length, temperature=self.temperature,
                              top_p=self.top_p, top_k=self.top_k or 0, min_p=self.min_p,
                              repetition_penalty=self.repetition_penalty)

    def _engine(self, generator: Generator | None = None, renderer: PromptRenderer | None = None) -> RolloutEngine:
        generator, renderer = generator or self.generator, renderer or self.renderer
        deterministic = self.args.deterministic_sampling
        if deterministic is None and self.args.max_staleness > 0 and getattr(generator, "per_request_seeds", False):
            deterministic = True  # (the rollout thread must not draw from the global random state training uses)
        return RolloutEngine(
            generator, renderer, max_turns=self.args.max_turns, sampling=self.sampling_params(),
            row_format=self.args.row_format, env_pool=self.env_pool, system_prompt=self.args.system_prompt,
            signals=self.env_signals, topology=self.rollout_topology if self.model.training else IndependentTopology(),
            signal_fn=self._signal_for_topology,
            on_turn=self.rollout_progress.update if self.rollout_progress else None,
            schedule=self.args.rollout_schedule, deterministic_sampling=deterministic,
            seed=self.args.seed, generation_window=self.args.generation_window,
            sharded_model=(self.is_fsdp_enabled or self.is_deepspeed_enabled)
            and self.accelerator.num_processes > 1,
        )

    def _rollout_index(self, mode: str) -> str:
        """The rollout's key in the request seeds: (mode, optimizer step, rollouts since that step), so a resumed run
        samples its rollouts with the seeds the uninterrupted run used."""
        step = self.state.global_step
        count = self._rollouts_at_step[1] + 1 if self._rollouts_at_step[0] == (mode, step) else 0
        self._rollouts_at_step = ((mode, step), count)
        return f"{mode}:{step}:{count}"

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
        weights (whether TRL built it with `use_vllm` or the user passed it) and the correction is on; or rollouts
        may lag the policy (`max_staleness=1`: the behaviour weight, always)."""
        return (bool(getattr(self.generator, "samples_off_policy", False)) and self.vllm_importance_sampling_correction
                ) or self.args.max_staleness > 0

    @property
    def _generate_every(self) -> int:
        """Micro-steps between two generations (TRL's): a generation batch feeds `steps_per_generation` micro-batches,
        `num_iterations` times."""
        return self.args.steps_per_generation * self.num_iterations

    @property
    def _misaligned(self) -> bool:
        """A generation batch is trained over more than one optimizer step (generation and optimisation misaligned,
        or later passes of `num_iterations` in later steps): its micro-batches meet different weights."""
        return self.args.gradient_accumulation_steps % self._generate_every != 0

    @property
    def _defers_behaviour_weight(self) -> bool:
        """Under `max_staleness=1`, when every micro-batch of a generation batch is trained at the weights it was
        scored at (not `_misaligned`), the proximal policy π_prox of the behaviour weight π_prox/μ is the policy the
        loss's own forward evaluates: the weight is computed there (`_add_behaviour_weight`), from its detached
        log-probs, instead of by one more forward over the rollout. The same values up to float noise
        (tests/training/test_one_step_off.py), a forward pass fewer per step (docs/async.md#one-step-off)."""
        return self.args.max_staleness > 0 and not self._misaligned and self.policy_loss_weight != 0.0

    def _add_importance_sampling_ratio(self, output: dict[str, Any], mode: str) -> None:
        """TRL's vLLM importance-sampling correction into `output` from its `old_per_token_logps`, its `sampling/`
        metrics logged (under max_staleness=1 the behaviour weight π_prox/μ, with its share of changed tokens as
        async/is_truncated_frac)."""
        for name, value in add_importance_sampling_ratio(
            output, *self._importance_sampling_settings(), self.accelerator.gather,
            changed_name="async/is_truncated_frac" if self.args.max_staleness > 0 else None,
        ).items():
            self._metrics[mode][name].append(value)

    def _add_behaviour_weight(self, inputs: dict[str, Any], per_token_logps: torch.Tensor) -> None:
        """`_defers_behaviour_weight`: π_prox from the loss forward's log-probs (detached; TRL's loss takes the same
        values as its old log-probs when none are given), and the behaviour weight from them, into `inputs` before
        TRL's loss reads it. Metrics per micro-batch (or loss chunk), averaged over the step."""
        inputs["old_per_token_logps"] = per_token_logps.detach()
        self._add_importance_sampling_ratio(inputs, "train" if self.model.training else "eval")

    def _importance_sampling_settings(self) -> tuple[str, float | None, float | None]:
        """(mode, C_min, C_max) of the correction: the behaviour weight's under `max_staleness=1`, else TRL's."""
        if self.args.max_staleness > 0:
            return self.args.behaviour_weight_mode, None, self.args.behaviour_weight_cap
        return self.vllm_importance_sampling_mode, self.vllm_importance_sampling_clip_min, \
            self.vllm_importance_sampling_clip_max

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        mode = "train" if self.model.training else "eval"
        num_generations = self.num_generations if mode == "train" else self.num_generations_eval
        tasks = tasks_of(inputs, num_generations)  # stage 1: tasks
        if mode == "train" and self.one_step_off is not None:
            batch = self._one_step_off_rollout(tasks, num_generations)
        else:
            if self.one_step_off is not None:  # (an evaluation waits for the rollout in flight: they share the envs)
                self.one_step_off.drain()
            batch = self._roll_out(tasks, num_generations, self._rollout_index(mode))
            stamp_version(batch, self.state.global_step)  # (generated by the weights it trains: lag 0)
        return self._score_rollout(batch, mode)

    def _roll_out(self, tasks: list[dict[str, Any]], num_generations: int, rollout_index: str) -> RolloutBatch:
        """The rollout of `tasks` by the current policy (weights synced first), the model signals observing it."""
        self._sync_generator_weights()
        self.signal_phase.reset()
        with self.rollout_progress.track() if self.rollout_progress else contextlib.nullcontext():
            self.signal_phase.capturing = True
            try:
                batch = self._engine().run(tasks, num_generations, rollout_index=rollout_index)
            finally:
                self.signal_phase.capturing = False
        self._drop_snapshots(batch)
        return batch

    def _background_rollout(self, tasks: list[dict[str, Any]], rollout_index: str) -> RolloutBatch:
        """A one-step-off rollout, on the rollout thread: the behaviour generator, no model signal observing it (its
        environment snapshots dropped at once: a checkpoint may store the rollout)."""
        with self.rollout_progress.track() if self.rollout_progress else contextlib.nullcontext():
            engine = self._engine(self._behaviour_generator, self._behaviour_renderer)
            batch = engine.run(tasks, self.num_generations, rollout_index=rollout_index)
        self._drop_snapshots(batch)
        return batch

    def _drop_snapshots(self, batch: RolloutBatch) -> None:
        """After a rollout (in place or in the background), before anything keeps it."""
        if self.rollout_topology.needs_snapshots:  # forks are done: environment copies would only hold memory
            for trajectory in batch.trajectories:
                for step in trajectory.owned_steps:
                    step.snapshot = None

    def _one_step_off_rollout(self, tasks: list[dict[str, Any]], num_generations: int) -> RolloutBatch:
        """One-step-off (training.one_step_off): take the rollout prefetched for `tasks` (or generate it now, lag 0),
        hand the current weights to the behaviour generator, start the next generation batch's rollout, and return
        this one, its version checked."""
        oso, step = self.one_step_off, self.state.global_step
        rollout_index = self._rollout_index("train")
        taken = oso.take(tasks_key(tasks))
        if taken is None:  # the first rollout, the first of an epoch, or one set aside: the current policy, now
            batch = self._roll_out(tasks, num_generations, rollout_index)
            stamp_version(batch, step)
            expected, lag = step, 0
        else:  # started when the previous rollout was taken, with the weights of that step: lag 1
            batch, expected, lag = taken.batch, self._last_take_step, 1
            self.signal_phase.reset()
        check_version(batch, expected, step)
        self._last_take_step = step
        metrics = self._metrics["train"]
        metrics["async/staleness"].append(float(step - expected))  # in optimizer steps
        metrics["async/lag_rollouts"].append(float(lag))
        self._launch_next_rollout(batch, num_generations, taken.finished_at if taken is not None else None)
        for name, value in oso.timings().items():
            metrics[name].append(value)
        return batch

    def _launch_next_rollout(self, batch: RolloutBatch, num_generations: int, idle_since: float | None) -> None:
        """Start the next generation batch's rollout in the background with the current weights, unless it is not in
        sight (the epoch ends first) or training ends first (`max_steps`, or `max_generated_tokens` reached with
        `batch`: the stop comes after this optimizer step, so a rollout for a later step would never be trained)."""
        args, step, generate_every = self.args, self.state.global_step, self._generate_every
        upcoming = self.one_step_off.lookahead.peek(generate_every)
        position = self._step % args.gradient_accumulation_steps + generate_every  # micro-steps into this step
        next_step = step + position // args.gradient_accumulation_steps
        ends_first = self.state.max_steps > 0 and next_step >= self.state.max_steps
        if args.max_staleness == 0 or upcoming is None or ends_first:
            return  # (staleness 0 runs through this machinery too, generating every rollout in place: the tests)
        if args.max_generated_tokens is not None and next_step > step:
            # The same total `_log_rollout` will compare with the budget once `batch` is scored (over processes).
            local = torch.tensor([batch.stats.get("generated_tokens", 0.0)], dtype=torch.float64,
                                 device=self.accelerator.device)
            if self._token_budget_spent(self.accelerator.reduce(local, reduction="sum").item()):
                return
        if self._behaviour_snapshot is not None:
            if self._behaviour_version != step:
                with profiling_context(self, "sync_weights"):
                    self._behaviour_snapshot.sync(self.accelerator.unwrap_model(self.model))
                self._behaviour_version = step
        else:
            self._sync_generator_weights()
        count = (position % args.gradient_accumulation_steps) // generate_every  # rollouts at next_step before it
        tasks = tasks_of(upcoming, num_generations)
        self.one_step_off.launch(tasks, tasks_key(tasks), step, f"train:{next_step}:{count}", idle_since)

    def _token_budget_spent(self, pending: float = 0.0) -> bool:
        """Whether the training rollouts' generated tokens (summed over processes), plus `pending` not yet counted,
        reach `max_generated_tokens` (never without a budget)."""
        budget = self.args.max_generated_tokens
        return budget is not None and self.rollout_totals["generated_tokens"] + pending >= budget

    def _score_rollout(self, batch: RolloutBatch, mode: str) -> dict[str, Any]:
        """Stages 2 to 8 on a finished rollout: signals, credit, rows, the padded batch with its old and reference
        log-probs, metrics and records."""
        self.last_rollout = batch
        healthy, dropped = trainable_groups(batch.groups, self.args.min_healthy_episodes)
        self.compute_signals(healthy)  # stage 2: signals
        advantages = self.compute_advantages(healthy)  # stage 3: credit
        trained, trained_advantages = healthy, advantages
        if mode == "train":
            trained, trained_advantages = filter_groups(healthy, advantages, self.group_filters)
        rows = build_rows(trained, trained_advantages, self.args.row_format, self.signal_phase.training_layouts)  # 4
        batch.stats["dropped_groups"] = dropped
        self.empty_rollouts.check(batch, len(rows), dropped, self.args.min_healthy_episodes, self.state.global_step,
                                  training=mode == "train")
        output = pad_rows(rows, num_chunks=self.args.steps_per_generation if mode == "train" else 1,  # stage 5
                          pad_token_id=self._tokenizer.pad_token_id, conversation=self.args.row_format == "conversation",
                          accelerator=self.accelerator)
        self._add_old_and_ref_logps(output)  # stages 6-7: the loss's inputs
        step_advantages = episode_step_values(batch, healthy, advantages)
        self._log_rollout(batch, healthy, step_advantages, rows, mode)  # stage 8: metrics and records
        if self.args.save_trajectories and mode == "train":
            self._save_trajectories(batch, step_advantages)
        return output

    def _add_old_and_ref_logps(self, output: dict[str, Any]) -> None:
        """Old and reference per-token log-probs, computed under the same conditions as in `GRPOTrainer` (none when
        `policy_loss_weight` is 0: only TRL's policy loss reads them)."""
        if self.policy_loss_weight == 0.0:
            return
        args, mode = self.args, "train" if self.model.training else "eval"
        # Generation and optimisation are misaligned (or several passes reuse the rollout): keep the behaviour
        # policy's log-probs for the importance ratio. Otherwise the ratio is exactly 1 and TRL skips this, unless an
        # inference engine sampled the rollout: then they also give the engine-vs-trainer correction.
        rows = args.per_device_train_batch_size if mode == "train" else args.per_device_eval_batch_size
        forward = functools.partial(forward_rows, self._get_per_token_logps_and_entropies, output, rows,
                                    args.max_tokens_per_forward)
        with torch.no_grad(), self._no_grad_forwards():
            if not self._defers_behaviour_weight:  # (else the loss's own forward gives them: `_add_behaviour_weight`)
                if self._misaligned or self._corrects_off_policy_sampling:
                    output["old_per_token_logps"] = forward(self.model)
                if self._corrects_off_policy_sampling:
                    self._add_importance_sampling_ratio(output, mode)
            if self.beta != 0.0:
                with reference_model(self.model, self.ref_model, self.accelerator) as ref_model:
                    output["ref_per_token_logps"] = forward(ref_model)

    def _get_per_token_logps_and_entropies(
        self, model, input_ids, attention_mask, logits_to_keep, batch_size=None, compute_entropy=False,
        compute_aux_loss=False, **kwargs,
    ):
        """TRL's per-token log-probs (and entropies), with the rows forwarded in groups of similar length, each cut
        to the columns its rows use (`training.forward.row_forwards` / `grouped_forward` explain why the values are
        the same up to float noise); TRL's own forward for multimodal inputs, MoE auxiliary losses, FSDP, DeepSpeed
        and `length_grouped_forwards=False`."""
        parent = super()._get_per_token_logps_and_entropies
        as_trl = (
            not self.args.length_grouped_forwards
            or compute_aux_loss
            or any(value is not None for value in kwargs.values())
            or self.is_fsdp_enabled
            or self.is_deepspeed_enabled
        )
        pieces = None if as_trl else row_forwards(attention_mask, logits_to_keep, batch_size, self.accelerator)
        if pieces is None:
            return parent(model, input_ids, attention_mask, logits_to_keep, batch_size=batch_size,
                          compute_entropy=compute_entropy, compute_aux_loss=compute_aux_loss, **kwargs)
        return grouped_forward(parent, model, input_ids, attention_mask, logits_to_keep, pieces, compute_entropy)

    def get_batch_samples(self, epoch_iterator, num_batches, device):
        """`Trainer.get_batch_samples`; under one-step-off it also holds the next generation batch, pulled from the
        epoch's iterator one generation early (`training.one_step_off.Lookahead`), so its rollout can start while
        this one trains."""
        if self.one_step_off is None:
            return super().get_batch_samples(epoch_iterator, num_batches, device)
        batch = self.one_step_off.lookahead.pull(epoch_iterator, num_batches, self._generate_every)
        return super().get_batch_samples(iter(batch), num_batches, device)

    def _prepare_inputs(self, generation_batch):
        # As GRPOTrainer._prepare_inputs, with `split_rows` instead of `split_tensor_dict` (which drops rows).
        if not self.model.training:
            return self._generate_and_score_completions(generation_batch)
        if self.one_step_off is not None:
            self.one_step_off.lookahead.consume()  # (this micro-batch leaves the look-ahead's stream)
        if self._step % self._generate_every == 0 or self._buffered_inputs is None:
            output = shuffle_sequence_dict(self._generate_and_score_completions(generation_batch))
            self._buffered_inputs = split_rows(output, self.args.steps_per_generation)
        return self._buffered_inputs[self._step % self.args.steps_per_generation]

    def _compute_loss(self, model, inputs):
        """TRL's loss (weighted by `policy_loss_weight`) plus `compute_auxiliary_loss`, in row chunks over
        `max_tokens_per_forward` (`training.loss.backward_in_parts`); `self.loss_chunk` is (index, count) of the
        chunk being computed."""
        budget = self.args.max_tokens_per_forward
        chunks = loss_chunks(inputs, budget, self.loss_type, width=common_width(inputs, budget, self.accelerator))
        if len(chunks) == 1:
            return self._chunk_loss(model, inputs, 1.0)
        backward = model.training and torch.is_grad_enabled() and not self.is_deepspeed_enabled

        def chunk_loss(index, part):
            self.loss_chunk = (index, len(chunks))
            return self._chunk_loss(model, *part)

        try:
            return backward_in_parts(chunks, chunk_loss, self.accelerator, model, backward)
        finally:
            self.loss_chunk = (0, 1)

    loss_chunk: tuple[int, int] = (0, 1)
    loss_entropies: torch.Tensor | None = None  # (B, T) entropies of TRL's loss, while compute_auxiliary_loss runs

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
                attribute_set(self, "use_vllm", True) if raise_flag else contextlib.nullcontext(),
                attribute_set(self, "vllm_importance_sampling_correction", True) if self.args.max_staleness > 0
                else contextlib.nullcontext(),
                attribute_set(self, "epsilon_low", bounds[0]) if bounds is not None else contextlib.nullcontext(),
                attribute_set(self, "epsilon_high", bounds[1]) if bounds is not None else contextlib.nullcontext(),
                _capturing_policy_logps(self, captured, loss_inputs,
                                        self._add_behaviour_weight if self._defers_behaviour_weight else None),
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
        """`Trainer.train`, made safe to stop and to resume:

        * `output_dir` is locked while it runs (`runlock.hold_output_dir`): a second run into it is refused;
        * resuming (a path, or True for the last complete checkpoint: `resolve_checkpoint`) checks the checkpoint's
          files first (one line naming a broken one); a checkpoint already at the end of training is a one-line
          ValueError (nothing to do, nothing changed); `load_extra_state` runs, and the trajectory shards after the
          checkpoint are moved aside (they are generated again) once the checkpoint has loaded, and put back when the
          resume fails before its first rollout is recorded (`callbacks.preemption.ResumeBookkeeping`);
        * SIGTERM lets the current step finish, saves a checkpoint and ends with `TrainingStopped`, a SystemExit
          (`callbacks.preemption.StopOnSignal`);
        * a full disk is a one-line `DiskFullError` naming the folder (an incomplete checkpoint it left is removed), and
          a checkpoint file that fails to load a `CheckpointError` naming it;
        * `run_info.json` is written first; the environments' workers are stopped at the end, even when training
          fails."""
        import sys
        from signal import Signals

        from accelerate.utils import broadcast_object_list

        from ..callbacks.preemption import ResumeBookkeeping, StopOnSignal, TrainingStopped
        from ..runlock import hold_output_dir

        checkpoint = resolve_checkpoint(resume_from_checkpoint, self.args.output_dir)
        if checkpoint is not None and (done := finished_message(checkpoint, self.args)) is not None:
            raise ValueError(done)
        main = self.is_world_process_zero()
        with hold_output_dir(self.args.output_dir, main_process=main, distributed=self.accelerator.num_processes > 1):
            if checkpoint is not None:
                self.rollout_totals.update(load_rollout_totals(checkpoint))
                self.load_extra_state(checkpoint)
                if self.one_step_off is not None:  # the rollout in flight when it was saved: trained first
                    self.one_step_off.load(checkpoint, self.accelerator.process_index)
                    if self.one_step_off.pending is not None:
                        self._last_take_step = self.one_step_off.pending.version
            self.run_info = broadcast_object_list([write_run_info(self) if main else None])[0]
            self._trajectory_writer = None  # a new writer resumes after the shards already in output_dir
            self.stopped_by_signal = None
            stop = StopOnSignal(self)
            resume = ResumeBookkeeping(os.path.join(self.args.output_dir, TRAJECTORIES_DIR),
                                       None if checkpoint is None else checkpoint_step(checkpoint), main)
            self.add_callback(stop)
            self.add_callback(resume)  # (after `stop`, which may ask for a save at a step's end)
            pending = PendingRolloutSaver(self) if self.one_step_off is not None else None
            if pending is not None:
                self.add_callback(pending)
            budget = GeneratedTokenBudget(self) if self.args.max_generated_tokens is not None else None
            if budget is not None:
                self.add_callback(budget)
            stop.install()
            try:
                output = super().train(checkpoint, *args, **kwargs)
            except BaseException as err:  # (Ctrl-C included: the shards go back too)
                if self._trajectory_writer is None:  # the resume did not start: its shards go back
                    resume.restore()
                for callback in self.callback_handler.callbacks:  # (else the bar prints after the error's line)
                    if getattr(callback, "training_bar", None) is not None:
                        callback.training_bar.close()
                        callback.training_bar = None
                translated = self._translated_error(err, checkpoint, resume.started) if isinstance(
                    err, Exception) else None
                if translated is None:
                    raise
                raise translated from err
            finally:
                stop.uninstall()
                self.remove_callback(stop)
                self.remove_callback(resume)
                if pending is not None:
                    self.remove_callback(pending)
                    self.one_step_off.close()
                if budget is not None:
                    self.remove_callback(budget)
                self.env_pool.close()
        if stop.stopped_at is not None:
            saved = os.path.join(self.args.output_dir, f"checkpoint-{stop.stopped_at}")
            message = (f"stopped by {self.stopped_by_signal} at step {stop.stopped_at} of {self.state.max_steps}: "
                       f"saved {saved}; resume with --resume_from_checkpoint true")
            if main:
                print(f"[trl-agents] {message}", file=sys.stderr, flush=True)
            raise TrainingStopped(message, stop.received, stop.stopped_at, saved)
        if stop.received is not None:
            logger.warning("%s came after the last step: training is complete, its final outputs follow.",
                           Signals(stop.received).name)
        return output

    def _translated_error(self, err: Exception, checkpoint: str | None, started: bool) -> Exception | None:
        """The one-line error for `err`, raised by `Trainer.train`: a full disk (`DiskFullError`, naming the folder;
        the incomplete checkpoint it left is removed), or, when a resume failed before its first step, the
        checkpoint file that does not load (`CheckpointError`); None for anything else (raised as it is)."""
        output_dir = self.args.output_dir
        if is_disk_full(err, output_dir):
            folder = os.path.join(output_dir, f"checkpoint-{self.state.global_step}")
            what = "the run's files"
            if os.path.isdir(folder) and incomplete_reason(folder) is not None:
                what = f"{folder} (removed: it was incomplete)"
                if self.is_world_process_zero():
                    shutil.rmtree(folder, ignore_errors=True)
            return DiskFullError(
                f"the disk holding output_dir {output_dir!r} is full (no space left on device) while writing {what}: "
                "free space there or pass an --output_dir on a larger disk, then resume with --resume_from_checkpoint "
                "true"
            )
        if checkpoint is not None and not started:
            return find_corrupt_file(checkpoint)
        return None

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

    def push_to_hub(self, commit_message: str | None = "End of training", blocking: bool = True,
                    token: str | None = None, revision: str | None = None, private: bool | None = None, **kwargs):
        """Publish `output_dir` as `trl-agents push` does (`trl_agents.hub.push_run`), instead of uploading the whole
        folder: the model or adapter, the card with the eval results found in `output_dir/eval/`, the trajectories as
        the dataset `{hub_model_id}-trajectories`, never the side folders (`warm-start/`, `base-model/`,
        `trajectories/`). Called by `save_model` when `push_to_hub=True` (`trl-agents train` calls it once its
        evaluations are written). Blocking (`blocking` is accepted for `Trainer`'s signature); `private` (transformers
        >= 5.18's argument) overrides `hub_private_repo` for a new repo. Returns the commit URL on the main process,
        None on the others."""
        from ..hub import DEFAULT_COMMIT_MESSAGE, push_run

        token = token if token is not None else self.args.hub_token
        if self.hub_model_id is None:
            self.init_hf_repo(token=token)
        self.save_model(_internal_call=True)
        if not self.is_world_process_zero():
            return None
        self._finish_current_push()  # a checkpoint push still uploading
        private = bool(self.args.hub_private_repo if private is None else private)
        urls = push_run(self.args.output_dir, self.hub_model_id, token=token, private=private,
                        push_trajectories=self.args.save_trajectories, revision=revision or self.args.hub_revision,
                        commit_message=commit_message or DEFAULT_COMMIT_MESSAGE)
        return urls["commit"]

    def _push_from_checkpoint(self, checkpoint_folder: str) -> None:
        """`Trainer`'s push of a checkpoint during training (`hub_strategy`), but the repo's root receives only the
        checkpoint's model files (`trl_agents.hub.checkpoint_files`), not the whole `output_dir` (trajectories,
        `warm-start/` and `base-model/` weights); with `hub_strategy` "checkpoint" / "all_checkpoints" the whole
        checkpoint also goes to `last-checkpoint/` / `checkpoint-N/`, for resuming."""
        from transformers.utils.hub import PushInProgress

        from ..hub import push_checkpoint

        strategy = getattr(self.args.hub_strategy, "value", self.args.hub_strategy)  # (a HubStrategy or a string)
        if not self.is_world_process_zero() or strategy == "end":
            return
        in_progress = getattr(self, "push_in_progress", None)  # (Trainer sets it once pushing starts)
        if not self.args.hub_always_push and in_progress is not None and not in_progress.is_done():
            return  # the last push is still uploading
        self.callback_handler.on_push_begin(self.args, self.state, self.control)
        folder = {"checkpoint": "last-checkpoint", "all_checkpoints": os.path.basename(checkpoint_folder)}.get(strategy)
        jobs = push_checkpoint(checkpoint_folder, self.hub_model_id,
                               f"Training in progress, step {self.state.global_step}", token=self.args.hub_token,
                               revision=self.args.hub_revision, checkpoint_path=folder)
        if in_progress is None or in_progress.is_done():
            self.push_in_progress = PushInProgress(jobs)
        else:
            in_progress.jobs.extend(jobs)

    def _save(self, output_dir: str | None = None, state_dict=None) -> None:
        """Save as `Trainer` does, plus `agent_config.json`: how the agent is prompted (environment, system prompt,
        history window, turn budget), so `trl-agents eval` and `load_agent_config` can run the checkpoint as trained;
        `rollout_totals.json` (what the training rollouts generated so far, for `max_generated_tokens`); and the
        method's `save_extra_state`. `Trainer._save` pickles the args into `training_args.bin` (of the run and of
        every checkpoint), so their `*_token` fields (`hub_token`) are None while it runs: no token reaches a file
        that `trl-agents push` uploads (`TrainingArguments.to_dict` masks the same fields in JSON)."""
        from dataclasses import fields

        tokens = {field.name: getattr(self.args, field.name) for field in fields(self.args)
                  if field.name.endswith("_token")}
        try:
            for name in tokens:
                setattr(self.args, name, None)
            super()._save(output_dir, state_dict)
        finally:
            for name, value in tokens.items():
                setattr(self.args, name, value)
        if self.args.should_save:
            save_agent_config(self.args, output_dir or self.args.output_dir)
            save_rollout_totals(self.rollout_totals, output_dir or self.args.output_dir)
            self.save_extra_state(output_dir or self.args.output_dir)

    # ---- metrics and records --------------------------------------------------------------------------------------

    def _log_rollout(
        self, batch: RolloutBatch, healthy: list[Group], step_advantages: dict, rows: TrainingRows, mode: str
    ) -> None:
        """Rollout and credit metrics (reduced over processes: `training.metrics`), the running totals of the
        training rollouts (which `GeneratedTokenBudget` compares with `max_generated_tokens` at the step's end), and one
        completions-table entry per episode."""
        local, maxima, returns, tokens = rollout_stats(batch, healthy, step_advantages, rows, self.args.max_turns)
        values, largest, reward, tokens = reduce_rollout_stats(local, maxima, returns, tokens, self.accelerator)
        for name, value in {**values, **largest, **reward}.items():
            self._metrics[mode][name].append(value)
        if mode == "train":
            self.state.num_input_tokens_seen += int(tokens)
            for key in self.rollout_totals:
                if f"rollout/{key}" in values:
                    self.rollout_totals[key] += values[f"rollout/{key}"]
        self._metrics[mode]["num_tokens"] = [self.state.num_input_tokens_seen]
        if self.log_completions:  # TRL's completions table, one entry per episode of every process
            log_completions(self._logs, gather_object(completion_entries(batch, step_advantages)))

    def _save_trajectories(self, batch: RolloutBatch, step_advantages: dict) -> None:
        """Append this rollout to output_dir/trajectories as one crash-safe parquet shard (`TrajectoryWriter`), one row
        per step with its advantage (None for failed episodes). The writer is created on the first rollout of each
        `train()`, so a resumed run numbers its shards after the existing ones."""
        if self._trajectory_writer is None:
            self._trajectory_writer = TrajectoryWriter(
                os.path.join(self.args.output_dir, TRAJECTORIES_DIR),
                run_info=self.run_info or build_run_info(self),
                rank=self.accelerator.process_index,
                unrecorded_signals=self.signal_phase.unrecorded,
            )
        self._trajectory_writer.write(batch, step_advantages, self.state.global_step)


class GeneratedTokenBudget(TrainerCallback):
    """`max_generated_tokens`: stop at the end of the optimizer step whose rollouts brought the training rollouts'
    generated tokens (summed over processes, the same on every process) to the budget. At a step's end, not when the
    rollout is scored: the Trainer leaves its micro-batch loop as soon as the flag is up, which under gradient
    accumulation would drop the step's remaining micro-batches and its optimizer step."""

    def __init__(self, trainer: AgentGRPOTrainer):
        self.trainer = trainer

    def on_step_end(self, args, state, control, **kwargs):
        if self.trainer._token_budget_spent():
            control.should_training_stop = True


class PendingRolloutSaver(TrainerCallback):
    """One-step-off: every checkpoint (on every process) holds the rollout in flight, drained, with its version."""

    def __init__(self, trainer: AgentGRPOTrainer):
        self.trainer = trainer

    def on_save(self, args, state, control, **kwargs):
        folder = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
        if os.path.isdir(folder):
            self.trainer.one_step_off.save(folder, self.trainer.accelerator.process_index)


@contextlib.contextmanager
def _capturing_policy_logps(trainer: GRPOTrainer, store: dict[str, torch.Tensor], inputs: dict | None = None,
                            behaviour_weight: Callable[[dict, torch.Tensor], None] | None = None):
    """Keep the per-token log-probs (with their graph) that TRL's `_compute_loss` gets from its one call of
    `_get_per_token_logps_and_entropies` on the policy, so that an auxiliary loss reuses them (no second forward),
    and its per-token entropies (detached: `loss_entropies`);
    and, when the trainer overrides `loss_advantages`, put its advantages into `inputs` (the dict the loss reads
    next) right after that forward; and `behaviour_weight(inputs, log-probs)` there too, when given."""
    original = trainer._get_per_token_logps_and_entropies
    rescale = inputs is not None and type(trainer).loss_advantages is not AgentGRPOTrainer.loss_advantages

    def keep(*args, **kwargs):
        out = original(*args, **kwargs)
        store["per_token_logps"] = out[0]
        if out[1] is not None:
            store["entropies"] = out[1].detach()
        if behaviour_weight is not None and inputs is not None:
            behaviour_weight(inputs, out[0])
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
