"""`AgentGRPOTrainer`: TRL's `GRPOTrainer` for multi-turn agents in environments (its config, `AgentGRPOConfig`, is in
`agent_grpo_config.py`). This file is the TRL adapter: the class, its public hooks, and thin overrides of TRL's
private methods that call the stages of `trl_agents.training` in order.

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
and capabilities they need (`signals`, `required_env_capabilities`), and override public hooks only; every hook, its
stage, its default and the methods that override it are listed in docs/concepts/hooks.md (see `trainers/gigpo.py`
for a small example). TRL's private methods are overridden here and nowhere else, and TRL's private attributes are
read and written here only (`tests/test_trl_contract.py` pins what they rely on; `tests/test_method_registry.py`
enforces both).

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
import logging
import os
from collections.abc import Callable, Sequence
from typing import Any

import torch
from accelerate.utils import gather_object
from datasets import Dataset, IterableDataset
from huggingface_hub import ModelCard
from transformers import TrainerState
from trl import GRPOTrainer
from trl.extras.profiling import profiling_context
from trl.models import unwrap_model_for_generation
from trl.trainer.utils import shuffle_sequence_dict

from ..checkpoints import load_rollout_totals, resolve_checkpoint, save_agent_config, save_rollout_totals
from ..credit import get_estimator
from ..records import TRAJECTORIES_DIR, TrajectoryWriter, build_run_info, supersede_shards, write_run_info
from ..rollout import EnvPool, PromptRenderer, RolloutEngine, RolloutProgress, SamplingParams, TransformersGenerator
from ..rollout.generators import Generator
from ..rollout.topologies import IndependentTopology, Topology, get_topology
from ..rollout.vllm import VLLMGenerator
from ..signals import ModelSignal, ModelSignalContext, required_capabilities, resolve_signals
from ..training.batch import loss_mask, pad_rows, split_rows
from ..training.credit_phase import episode_step_values, filter_groups, trainable_groups
from ..training.forward import grouped_forward, no_gradient_checkpointing, row_forwards, rows_per_forward
from ..training.loss import (
    attribute_set,
    backward_in_parts,
    batch_token_mean,
    importance_sampling_metrics,
    importance_sampling_ratio,
    loss_chunks,
)
from ..training.metrics import completion_entries, reduce_rollout_stats, rollout_stats
from ..training.rows import TrainingRows, build_rows
from ..training.signal_phase import SignalPhase, TeacherUpdate, build_teacher
from ..training.tasks import (
    as_namespace,
    as_task_dataset,
    check_env_capabilities,
    check_privileged_field,
    environment_return,
    tasks_of,
)
from ..trajectory import Group, RolloutBatch, Trajectory
from .agent_grpo_config import AgentGRPOConfig, as_dict, check_generator
from .registry import MethodInfo

logger = logging.getLogger(__name__)

EMPTY_ROLLOUTS_LIMIT = 3  # training rollouts in a row with nothing to train on before the run stops (a broken env)

__all__ = ["AgentGRPOConfig", "AgentGRPOTrainer"]


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
        train_dataset = as_task_dataset(train_dataset, args, "train_dataset", required=True)
        eval_dataset = as_task_dataset(eval_dataset, args, "eval_dataset", required=False)
        for dataset in (train_dataset, eval_dataset):
            check_env_capabilities(dataset, args, self.required_capabilities(args), type(self).__name__)
            check_privileged_field(dataset, args, self.needs_teacher(args))
        check_generator(generator, args)
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
        """Resolve the declared signals (`training.signal_phase.SignalPhase`); build the topology, and the teacher
        when a teacher signal needs one."""
        args = self.args
        self.signal_phase = SignalPhase(self.signal_names(args), self.signal_options(args),
                                        self.training_signal_names(args), type(self).__name__)
        self.env_signals, self.model_signals = self.signal_phase.env_signals, self.signal_phase.model_signals
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
        teacher = None
        if self.needs_teacher(args):
            teacher = build_teacher(args, self.accelerator.unwrap_model(self.model), self._model_for_signals,
                                    self.ref_model)
            if teacher.kind == "ema":
                self.add_callback(TeacherUpdate(self, teacher))
        self.teacher = teacher
        self.signal_context = self.signal_phase.context = ModelSignalContext(
            model_context=self._model_for_signals,
            renderer=self.renderer,
            row_format=args.row_format,
            pad_token_id=self._tokenizer.pad_token_id if self._tokenizer.pad_token_id is not None else 0,
            temperature=self.temperature,
            max_rows_per_forward=max(args.per_device_train_batch_size, 1),
            max_tokens_per_forward=args.max_tokens_per_forward,
            teacher=teacher,
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
    def _all_signals(cls, args: Any) -> tuple[list, list, Topology]:
        """(environment signals, model signals, topology) with `args`: the declared signals, the environment signals
        they need, and the model signals the topology computes mid-rollout."""
        args = as_namespace(args)
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

    @classmethod
    def required_capabilities(cls, args: Any) -> tuple[str, ...]:
        """Environment capabilities checked at start-up: the trainer's own, its signals' and its topology's."""
        env_signals, model_signals, topology = cls._all_signals(args)
        return tuple(dict.fromkeys([
            *cls.required_env_capabilities,
            *required_capabilities([*env_signals, *model_signals]),
            *topology.required_capabilities,
        ]))

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
        steps = self.args.steps_per_generation if self.model.training else None
        return batch_token_mean(values, mask, inputs["num_items_in_batch"], self.accelerator.num_processes, steps)

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
        timings = self.signal_phase.compute(groups, self._no_grad_forwards)
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
        with self._model_for_signals() as model, self.signal_phase.captures(model):
            yield model

    def _no_grad_forwards(self):
        """The context of no-grad forwards over the policy (signals, old and reference log-probs): no gradient
        checkpointing."""
        return no_gradient_checkpointing(self.model, self.args.gradient_checkpointing_kwargs)

    def _signal_for_topology(self, name: str, trajectories: list[Trajectory]) -> None:
        """A model signal a topology needs mid-rollout (e.g. entropies to rank branch points), on `trajectories`."""
        self.signal_phase.for_topology(name, trajectories, self._no_grad_forwards)

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
        mode = "train" if self.model.training else "eval"
        num_generations = self.num_generations if mode == "train" else self.num_generations_eval
        tasks = tasks_of(inputs, num_generations)  # stage 1: tasks

        self._sync_generator_weights()
        self.signal_phase.reset()
        with self.rollout_progress.track() if self.rollout_progress else contextlib.nullcontext():
            self.signal_phase.capturing = True
            try:
                batch = self._engine().run(tasks, num_generations)  # the rollout
            finally:
                self.signal_phase.capturing = False
        self.last_rollout = batch
        if self.rollout_topology.needs_snapshots:  # forks are done: environment copies would only hold memory
            for trajectory in batch.trajectories:
                for step in trajectory.owned_steps:
                    step.snapshot = None
        healthy, dropped = trainable_groups(batch.groups, self.args.min_healthy_episodes)
        self.compute_signals(healthy)  # stage 2: signals
        advantages = self.compute_advantages(healthy)  # stage 3: credit
        trained, trained_advantages = healthy, advantages
        if mode == "train":
            trained, trained_advantages = filter_groups(healthy, advantages, self.group_filters)
        rows = build_rows(trained, trained_advantages, self.args.row_format, self.signal_phase.training_layouts)  # 4
        batch.stats["dropped_groups"] = dropped
        self._check_trainable(batch, rows, dropped)
        output = pad_rows(rows, num_chunks=self.args.steps_per_generation if mode == "train" else 1,  # stage 5
                          pad_token_id=self._tokenizer.pad_token_id, conversation=self.args.row_format == "conversation",
                          accelerator=self.accelerator)
        self._add_old_and_ref_logps(output)  # stages 6-7: the loss's inputs
        step_advantages = episode_step_values(batch, healthy, advantages)
        self._log_rollout(batch, healthy, step_advantages, rows, mode)  # stage 8: metrics and records
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
        with torch.no_grad(), self._no_grad_forwards():
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
        forwarded in groups of similar length (`training.forward`: `row_forwards`, `grouped_forward`): each group is cut to the
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
        pieces = None if as_trl else row_forwards(attention_mask, logits_to_keep, batch_size, self.accelerator)
        if pieces is None:
            return parent(model, input_ids, attention_mask, logits_to_keep, batch_size=batch_size,
                          compute_entropy=compute_entropy, compute_aux_loss=compute_aux_loss, **kwargs)
        return grouped_forward(parent, model, input_ids, attention_mask, logits_to_keep, pieces, compute_entropy)

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
        for name, value in importance_sampling_metrics(old, sampled, ratio, mask, self.accelerator.gather).items():
            self._metrics[mode][name].append(value)

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

        def chunk_loss(index, part):
            self.loss_chunk = (index, len(chunks))
            return self._chunk_loss(model, *part)

        try:
            return backward_in_parts(chunks, chunk_loss, self.accelerator, model, backward)
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
                attribute_set(self, "use_vllm", True) if raise_flag else contextlib.nullcontext(),
                attribute_set(self, "epsilon_low", bounds[0]) if bounds is not None else contextlib.nullcontext(),
                attribute_set(self, "epsilon_high", bounds[1]) if bounds is not None else contextlib.nullcontext(),
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
            self.rollout_totals.update(load_rollout_totals(checkpoint))
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
            save_rollout_totals(self.rollout_totals, output_dir or self.args.output_dir)
            self.save_extra_state(output_dir or self.args.output_dir)

    # ---- metrics and records --------------------------------------------------------------------------------------

    def _log_rollout(
        self, batch: RolloutBatch, healthy: list[Group], step_advantages: dict, rows: TrainingRows, mode: str
    ) -> None:
        """Rollout and credit metrics (reduced over processes: `training.metrics`), the running totals of the
        training rollouts (and the stop at `max_generated_tokens`), and one completions-table entry per episode."""
        local, maxima, returns, tokens = rollout_stats(batch, healthy, step_advantages, rows, self.args.max_turns)
        values, largest, reward, tokens = reduce_rollout_stats(local, maxima, returns, tokens, self.accelerator)
        for name, value in {**values, **largest, **reward}.items():
            self._metrics[mode][name].append(value)
        if mode == "train":
            self.state.num_input_tokens_seen += int(tokens)
            for key in self.rollout_totals:
                if f"rollout/{key}" in values:
                    self.rollout_totals[key] += values[f"rollout/{key}"]
            budget = self.args.max_generated_tokens
            if budget is not None and self.rollout_totals["generated_tokens"] >= budget:
                self.control.should_training_stop = True  # after this optimizer step (the Trainer's loop checks it)
        self._metrics[mode]["num_tokens"] = [self.state.num_input_tokens_seen]
        if self.log_completions:
            self._log_episodes(batch, step_advantages)

    def _log_episodes(self, batch: RolloutBatch, step_advantages: dict) -> None:
        """One entry of TRL's completions table per episode, from every process (`training.metrics.
        completion_entries`), plus `success` and `turns` columns."""
        for prompt, completion, episode_return, advantage, success, turns in gather_object(
            completion_entries(batch, step_advantages)
        ):
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
                unrecorded_signals=self.signal_phase.unrecorded,
            )
        self._trajectory_writer.write(batch, step_advantages, self.state.global_step)


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
