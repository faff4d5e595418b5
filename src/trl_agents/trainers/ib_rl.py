"""IB-RL: isolated bilateral RL of two co-evolving roles (arXiv 2608.06735; docs/methods/ib_rl.md).

The changes w.r.t. `AgentGRPOTrainer`:

* two parameter sets: the model gets one LoRA adapter per role of the environment (`ib_rl_lora_*`; the adapter
  names are the role names, e.g. `alice` and `bob` in Deal-or-No-Deal), on one shared frozen base;
* joint rollouts: a role-routing generator (`RoleRoutedGenerator`, `routes_by_role = True`) sends the prompts of each
  role to that role's adapter within each turn's one generation call, so every role samples with its own policy;
* fully independent advantages (`compute_advantages`, math in `trl_agents.credit.ib_rl`): per role, GRPO over the G
  joint dialogues of a scenario of that role's own reward (`info["role_rewards"]`), and each step gets its acting
  role's value;
* action masks and update paths (`compute_loss`): the rows of each role (`acting_role`, a per-token signal laid into
  the batch) are forwarded with that role's adapter only, so a role's loss reaches only its own parameters;
* separate optimizers and schedulers (`create_optimizer`, `create_scheduler`): one AdamW and one learning-rate
  schedule per trained role, each role's gradients clipped by their own norm (a global norm would couple the roles;
  `ib_rl_max_grad_norm`); both are saved in checkpoints and restored by `train(resume_from_checkpoint=...)`.

`ib_rl_train_roles` names the roles that learn (default: all): `["alice"]` trains alice against a bob frozen at its
warm start (the fixed-counterpart control of `benchmarks/ib_rl.py`).

Example:
    ```python
    from trl_agents.envs import get_env_class
    from trl_agents.trainers.ib_rl import IBRLConfig, IBRLTrainer

    tasks = get_env_class("dealnodeal").task_split("train", 256, source="sampled")
    config = IBRLConfig(output_dir="dnd-ibrl", env_name="dealnodeal", max_turns=10, num_generations=8)
    IBRLTrainer(model="Qwen/Qwen2.5-7B-Instruct", args=config, train_dataset=tasks).train()
    ```
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from ..names import check_choice
from ..credit.ib_rl import SCALES, step_role
from ..envs import get_env_class
from ..rollout.generators import GenerationOutput
from ..training.batch import token_signal_key
from ..signals import ModelSignal, register_signal
from ..trajectory import Group
from .agent_grpo import AgentGRPOConfig, AgentGRPOTrainer
from .registry import MethodInfo

ACTING_ROLE = "acting_role"  # the per-token signal: index of the role that wrote each action token
LOSS_TYPES = ("dapo", "cispo")  # losses normalised by a count over the whole generation batch: additive over rows


# ---- the acting role of every action token, laid into the training batch ------------------------------------------


class ActingRole(ModelSignal):
    """`step.signals["acting_role"]`: the index (in `roles`) of the role that took the step, once per action token
    (-1 for a role not in `roles`). No forward pass: it only carries `info["role"]` into the training batch, where
    `IBRLTrainer.compute_loss` splits each micro-batch by role."""

    name = ACTING_ROLE
    description = "index of the role that took the step, per action token (IB-RL's action masks)"
    recorded = False  # info["role"] is in the records already

    def __init__(self, roles: Sequence[str] = ()):
        self.roles = tuple(roles)

    def compute(self, groups, context) -> None:
        index = {role: float(k) for k, role in enumerate(self.roles)}
        for group in groups:
            for trajectory in group.trajectories:
                for step in trajectory.steps:
                    step.signals[self.name] = [index.get(step_role(step), -1.0)] * len(step.action_ids)


register_signal(ACTING_ROLE, ActingRole)


# ---- generation: each role's prompts to its own adapter ------------------------------------------------------------


class RoleRoutedGenerator:
    """A generator that sends each prompt to the generator of its acting role (`routes_by_role = True`: the engine
    passes `roles=[...]`, one per prompt), entering that role's context around the call (e.g. activating its LoRA
    adapter). One call per role per turn; completions come back in the prompts' order. It takes per-request `seeds`
    (`per_request_seeds`) when every role's generator does, and hands each role its prompts' seeds.

    Args:
        generators: role -> generator (the same object for every role when the roles are adapters of one model; a
            different one to play a role with another model, e.g. a held-out counterpart).
        contexts: role -> a callable returning a context manager entered around that role's call (None: none).
        default_role: The role of prompts that come without roles.

    Example:
        >>> class Echo:
        ...     def __init__(self, token): self.token = token
        ...     def generate(self, prompts, sampling): return GenerationOutput([[self.token]] * len(prompts),
        ...                                                                    [[0.0]] * len(prompts))
        >>> router = RoleRoutedGenerator({"a": Echo(1), "b": Echo(2)})
        >>> router.generate([[5], [6], [7]], None, roles=["a", "b", "a"]).completion_ids
        [[1], [2], [1]]
    """

    routes_by_role = True

    def __init__(
        self,
        generators: Mapping[str, Any],
        contexts: Mapping[str, Callable[[], contextlib.AbstractContextManager]] | None = None,
        default_role: str | None = None,
    ):
        if not generators:
            raise ValueError("RoleRoutedGenerator needs at least one role's generator")
        self.generators = dict(generators)
        self.contexts = dict(contexts or {})
        self.default_role = default_role if default_role is not None else next(iter(self.generators))
        first = next(iter(self.generators.values()))
        if hasattr(first, "eos_token_ids"):  # (the engine falls back to the tokenizer's otherwise)
            self.eos_token_ids = first.eos_token_ids

    @property
    def per_request_seeds(self) -> bool:
        return all(getattr(generator, "per_request_seeds", False) for generator in self.generators.values())

    def generate(
        self, prompts, sampling, roles: Sequence[str] | None = None, seeds: Sequence[int] | None = None
    ) -> GenerationOutput:
        roles = list(roles) if roles is not None else [self.default_role] * len(prompts)
        if len(roles) != len(prompts):
            raise ValueError(f"got {len(roles)} roles for {len(prompts)} prompts")
        if seeds is not None and len(seeds) != len(prompts):
            raise ValueError(f"got {len(seeds)} seeds for {len(prompts)} prompts")
        completion_ids: list = [None] * len(prompts)
        logprobs: list = [None] * len(prompts)
        for role in dict.fromkeys(roles):
            if role not in self.generators:
                raise ValueError(f"no generator for role {role!r}; roles routed: {sorted(self.generators)}")
            rows = [i for i, r in enumerate(roles) if r == role]
            context = self.contexts.get(role)
            with context() if context is not None else contextlib.nullcontext():
                role_prompts = [prompts[i] for i in rows]
                if seeds is None:
                    out = self.generators[role].generate(role_prompts, sampling)
                else:
                    out = self.generators[role].generate(role_prompts, sampling, seeds=[seeds[i] for i in rows])
            for i, ids, lps in zip(rows, out.completion_ids, out.logprobs, strict=True):
                completion_ids[i], logprobs[i] = ids, lps
        return GenerationOutput(completion_ids, logprobs)


# ---- one optimizer and one schedule per role -----------------------------------------------------------------------


class RoleOptimizer:
    """One optimizer per role behind the `Trainer`'s single optimizer interface: `step()` clips each role's gradients
    by their own norm (`max_grad_norm`, 0 = measure only) and steps each role's optimizer; `state_dict()` holds
    every role's state, by role. `last_grad_norms` are the norms before clipping of the last step."""

    def __init__(self, optimizers: Mapping[str, torch.optim.Optimizer], max_grad_norm: float = 0.0,
                 on_step: Callable[[dict[str, float]], None] | None = None):
        self.optimizers = dict(optimizers)
        self.max_grad_norm = float(max_grad_norm)
        self.on_step = on_step
        self.last_grad_norms: dict[str, float] = {}

    @property
    def param_groups(self) -> list[dict]:
        return [g for o in self.optimizers.values() for g in o.param_groups]

    @property
    def state(self) -> dict:
        return {p: s for o in self.optimizers.values() for p, s in o.state.items()}

    def zero_grad(self, set_to_none: bool = True) -> None:
        for optimizer in self.optimizers.values():
            optimizer.zero_grad(set_to_none=set_to_none)

    def step(self, closure=None):
        if closure is not None:
            raise ValueError("RoleOptimizer.step takes no closure")
        norms = {}
        for role, optimizer in self.optimizers.items():
            params = [p for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
            limit = self.max_grad_norm if self.max_grad_norm > 0 else math.inf
            norms[role] = float(torch.nn.utils.clip_grad_norm_(params, limit)) if params else 0.0  # this role only
            optimizer.step()
        self.last_grad_norms = norms
        if self.on_step is not None:
            self.on_step(norms)

    def state_dict(self) -> dict[str, Any]:
        return {role: optimizer.state_dict() for role, optimizer in self.optimizers.items()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        missing = sorted(set(self.optimizers) - set(state))
        if missing:
            raise ValueError(f"the optimizer state has no entry for the roles {missing} (found {sorted(state)})")
        for role, optimizer in self.optimizers.items():
            optimizer.load_state_dict(state[role])


class RoleScheduler:
    """One learning-rate schedule per role, stepped together; `get_last_lr()` lists every role's rates in role
    order (the `Trainer` logs the first as `learning_rate`)."""

    def __init__(self, schedulers: Mapping[str, Any]):
        self.schedulers = dict(schedulers)

    def step(self) -> None:
        for scheduler in self.schedulers.values():
            scheduler.step()

    def get_last_lr(self) -> list[float]:
        return [lr for s in self.schedulers.values() for lr in s.get_last_lr()]

    def state_dict(self) -> dict[str, Any]:
        return {role: s.state_dict() for role, s in self.schedulers.items()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        for role, scheduler in self.schedulers.items():
            scheduler.load_state_dict(state[role])


# ---- config --------------------------------------------------------------------------------------------------------


@dataclass
class IBRLConfig(AgentGRPOConfig):
    r"""
    Configuration of [`IBRLTrainer`]: every [`AgentGRPOConfig`] field plus IB-RL's. `num_generations` is G, the joint
    dialogues per scenario; `learning_rate` and the scheduler fields apply to each role's own optimizer.

    Args:
        ib_rl_roles (`list[str]` or `None`): The roles, one LoRA adapter each (None: the environment's `roles`).
        ib_rl_train_roles (`list[str]` or `None`): The roles that learn (None: all).
        ib_rl_role_learning_rates (`dict` or `None`): Per-role learning rates (None: `learning_rate` for all).
        ib_rl_lora_r (`int`, defaults to `16`), ib_rl_lora_alpha (`int`, defaults to `32`), ib_rl_lora_dropout
            (`float`, defaults to `0.0`), ib_rl_lora_target_modules (`str`, defaults to `"all-linear"`): each
            role's adapter.
        ib_rl_max_grad_norm (`float` or `None`): Per-role gradient clipping (None: `max_grad_norm`).
    """

    history_length: int = field(
        default=0,
        metadata={"help": "Past (observation, action) pairs in step prompts: 0 for IB-RL (validated), since the "
        "history of a joint dialogue holds the other role's private observations; the environment's observation "
        "carries the dialogue."},
    )
    ib_rl_roles: list[str] | None = field(
        default=None,
        metadata={"help": "The two (or more) roles, one LoRA adapter each, named after them (None: the environment's "
        "`roles`, e.g. alice and bob in dealnodeal)."},
    )
    ib_rl_train_roles: list[str] | None = field(
        default=None,
        metadata={"help": "The roles whose adapters learn (None: every role, IB-RL's co-evolution). A subset trains "
        "against the others frozen at their start: our choice, for the fixed-counterpart control "
        "(docs/methods/ib_rl.md)."},
    )
    ib_rl_role_learning_rates: dict | str | None = field(
        default=None,
        metadata={"help": "Learning rate of each role's own optimizer, e.g. {'alice': 1e-5, 'bob': 5e-6} (a JSON string "
        "on the command line); None: `learning_rate` for every role. Our choice: the paper gives separate "
        "optimizers, not their settings."},
    )
    ib_rl_lora_r: int = field(
        default=16, metadata={"help": "LoRA rank of each role's adapter (our choice: the paper's adapter settings "
        "are not known to us)."},
    )
    ib_rl_lora_alpha: int = field(default=32, metadata={"help": "LoRA alpha of each role's adapter (our choice)."})
    ib_rl_lora_dropout: float = field(default=0.0, metadata={"help": "LoRA dropout of each role's adapter."})
    ib_rl_lora_target_modules: str = field(
        default="all-linear",
        metadata={"help": "Modules each role's adapter wraps: 'all-linear' (our choice) or comma-separated module "
        "names, e.g. 'q_proj,v_proj'."},
    )
    ib_rl_max_grad_norm: float | None = field(
        default=None,
        metadata={"help": "Each role's gradients are clipped to this norm by themselves (None: `max_grad_norm`, "
        "which is then set to 0 so that the Trainer's global clipping, which would couple the roles, is off). Our "
        "choice (docs/methods/ib_rl.md)."},
    )

    def __post_init__(self):
        super().__post_init__()
        for name in ("ib_rl_roles", "ib_rl_train_roles", "ib_rl_role_learning_rates"):
            value = getattr(self, name)
            if isinstance(value, str) and value.strip().startswith(("[", "{")):
                setattr(self, name, json.loads(value))  # from the command line
        if self.topology != "independent":
            raise ValueError(f"IB-RL plays independent joint dialogues: topology must be 'independent', got "
                             f"{self.topology!r}")
        if self.row_format != "step":
            raise ValueError(f"IB-RL trains step rows (one acting role per row): row_format must be 'step', got "
                             f"{self.row_format!r}")
        if self.history_length != 0:
            raise ValueError(f"history_length must be 0 for IB-RL (got {self.history_length}): a step prompt's history "
                             "would show a role the other role's private observations; the observation carries the "
                             "dialogue")
        if self.beta != 0.0:
            raise ValueError(f"beta must be 0.0 for IB-RL (got {self.beta}): each role's adapter has no reference "
                             "copy (IB-RL has no KL term)")
        if self.num_iterations != 1 or self.gradient_accumulation_steps % self.steps_per_generation != 0:
            raise ValueError("IB-RL needs num_iterations=1 and steps_per_generation dividing "
                             "gradient_accumulation_steps (got "
                             f"{self.num_iterations}, {self.steps_per_generation}, {self.gradient_accumulation_steps}): "
                             "old log-probs would be computed with one adapter for both roles")
        if self.use_vllm:
            raise ValueError("use_vllm must be False for IB-RL: the role-routing generator switches LoRA adapters "
                             "of the training model")
        check_choice("loss_type", self.loss_type, LOSS_TYPES)
        check_choice("scale_rewards", self.scale_rewards, SCALES)
        if self.ib_rl_lora_r < 1 or self.ib_rl_lora_alpha <= 0:
            raise ValueError(f"ib_rl_lora_r must be >= 1 and ib_rl_lora_alpha > 0, got {self.ib_rl_lora_r}, "
                             f"{self.ib_rl_lora_alpha}")
        if not 0.0 <= self.ib_rl_lora_dropout < 1.0:
            raise ValueError(f"ib_rl_lora_dropout must be in [0, 1), got {self.ib_rl_lora_dropout}")
        if self.ib_rl_roles is None and self.env_name is not None:
            roles = get_env_class(self.env_name).roles
            if len(roles) < 2:
                raise ValueError(f"IB-RL needs an environment with two roles; {self.env_name!r} has {list(roles)}")
            self.ib_rl_roles = list(roles)
        if self.ib_rl_roles is not None:
            self.ib_rl_roles = [str(r) for r in self.ib_rl_roles]
            if len(self.ib_rl_roles) < 2 or len(set(self.ib_rl_roles)) != len(self.ib_rl_roles):
                raise ValueError(f"ib_rl_roles must name two or more distinct roles, got {self.ib_rl_roles}")
        if self.ib_rl_train_roles is not None:
            self.ib_rl_train_roles = [str(r) for r in self.ib_rl_train_roles]
            if not self.ib_rl_train_roles:
                raise ValueError("ib_rl_train_roles must name at least one role (None trains every role)")
            unknown = [r for r in self.ib_rl_train_roles if self.ib_rl_roles is not None and r not in self.ib_rl_roles]
            if unknown:
                raise ValueError(f"ib_rl_train_roles names {unknown}, not among ib_rl_roles={self.ib_rl_roles}")
        if self.ib_rl_role_learning_rates is not None:
            rates = self.ib_rl_role_learning_rates
            if not isinstance(rates, dict) or not all(
                    isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in rates.values()):
                raise ValueError(f"ib_rl_role_learning_rates must map roles to positive numbers, got {rates!r}")
        if self.ib_rl_max_grad_norm is None:
            self.ib_rl_max_grad_norm = float(self.max_grad_norm or 0.0)
        if not (math.isfinite(self.ib_rl_max_grad_norm) and self.ib_rl_max_grad_norm >= 0):
            raise ValueError(f"ib_rl_max_grad_norm must be >= 0 (0: no clipping), got {self.ib_rl_max_grad_norm}")
        self.max_grad_norm = 0.0  # the Trainer's global clipping, which would couple the roles, is off


# ---- trainer -------------------------------------------------------------------------------------------------------


class IBRLTrainer(AgentGRPOTrainer):
    """IB-RL on `AgentGRPOTrainer` (see the module docstring): one LoRA adapter, optimizer and schedule per role.

    Logs per role r: `ib_rl/{r}/reward_mean`, `ib_rl/{r}/advantage_std`, `ib_rl/{r}/zero_std` (groups whose
    rewards for r are all equal), `ib_rl/{r}/turns` (turns per dialogue group), `ib_rl/{r}/loss`,
    `ib_rl/{r}/grad_norm` (before clipping) and `ib_rl/{r}/learning_rate`.
    """

    _tag_names: ClassVar[list[str]] = ["trl", "trl-agents", "ib-rl"]
    _name = "IBRL"
    config_class = IBRLConfig
    required_env_capabilities = ("roles",)
    signals = (ACTING_ROLE,)
    training_signals = (ACTING_ROLE,)
    methods = (
        MethodInfo("ib_rl", "arXiv 2608.06735", "trl_agents.credit.ib_rl",
                   max_staleness=0,
                   staleness_reason=("its old log-probs would come from one adapter for both roles; each role's "
                                     "update must see its own samples"),
                   title="IB-RL",
                   hook="compute_advantages + compute_loss (one LoRA adapter, optimizer and scheduler per role)",
                   inputs=("each role's reward (info['role_rewards'])", "the acting role of each step (info['role'])"),
                   tests=("tests/methods/ib_rl/",)),
    )

    def __init__(self, model, args: IBRLConfig | None = None, train_dataset=None, eval_dataset=None,
                 processing_class=None, callbacks=None, optimizers=(None, None), peft_config=None, generator=None,
                 env_pool=None):
        if args is None:
            args = self.default_args(model)
        if isinstance(args, IBRLConfig):
            args.ib_rl_roles = list(_resolve_roles(args, train_dataset))
        if peft_config is not None:
            raise ValueError("IBRLTrainer builds one LoRA adapter per role from the ib_rl_lora_* fields; pass no "
                             "peft_config")
        if isinstance(args, IBRLConfig):
            model = _with_role_adapters(model, args)
        super().__init__(model=model, args=args, train_dataset=train_dataset, eval_dataset=eval_dataset,
                         processing_class=processing_class, callbacks=callbacks, optimizers=optimizers,
                         generator=generator, env_pool=env_pool)
        self.roles = tuple(self.args.ib_rl_roles)
        self.train_roles = tuple(self.args.ib_rl_train_roles or self.roles)
        unknown = [r for r in self.train_roles if r not in self.roles]
        if unknown:
            raise ValueError(f"ib_rl_train_roles names {unknown}, not among the roles {list(self.roles)}")
        self.peft_model = self.accelerator.unwrap_model(self.model)
        self.role_parameters = {role: [p for n, p in self.peft_model.named_parameters() if _owned_by(n, role)]
                                for role in self.roles}
        for role, params in self.role_parameters.items():
            if not params:
                raise ValueError(f"the model has no LoRA parameters of the adapter {role!r}")
        self.active_role: str | None = None
        self.activate_role(self.train_roles[0])
        if not getattr(self.generator, "routes_by_role", False):
            generators = dict.fromkeys(self.roles, self.generator)
            contexts = {role: (lambda role=role: self.role_context(role)) for role in self.roles}
            self.generator = RoleRoutedGenerator(generators, contexts, default_role=self.roles[0])

    # ---- adapters ------------------------------------------------------------------------------------------------

    def activate_role(self, role: str) -> None:
        """Make `role`'s adapter the active one (forwards and generation use it); the trained roles' parameters keep
        requiring gradients (PEFT's `set_adapter` would freeze the inactive ones), the frozen roles' never do."""
        self.peft_model.set_adapter(role)
        for name, params in self.role_parameters.items():
            trainable = name in self.train_roles
            for p in params:
                p.requires_grad_(trainable)
        self.active_role = role

    @contextlib.contextmanager
    def role_context(self, role: str):
        self.activate_role(role)
        yield

    @classmethod
    def signal_options(cls, args: Any) -> dict[str, dict[str, Any]]:
        options = super().signal_options(args)
        options[ACTING_ROLE] = {"roles": tuple(getattr(args, "ib_rl_roles", None) or ())}
        return options

    # ---- credit --------------------------------------------------------------------------------------------------

    def compute_advantages(self, groups: list[Group]) -> list[list[list[float]]]:
        return self.estimate("ib_rl", groups)

    # ---- loss: each role's rows through its own adapter ----------------------------------------------------------

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """TRL's loss on each trained role's rows of the micro-batch with that role's adapter active, summed. In
        training, every role's loss but the last is back-propagated here (with the scaling the Trainer gives the
        returned loss), while its adapter is active, and the last role's is returned (with the earlier values added
        as a constant) for the Trainer's backward; its adapter stays active for that backward (gradient
        checkpointing recomputes the forward with the active adapter)."""
        codes = inputs[token_signal_key(ACTING_ROLE)]
        row_roles = torch.nan_to_num(codes, nan=-1.0).max(dim=1).values  # one role per step row
        parts = [(k, role) for k, role in enumerate(self.roles)
                 if role in self.train_roles and bool((row_roles == k).any())]
        if not parts:  # nothing of a trained role here: a zero loss with a graph (masked copy of the micro-batch)
            self.activate_role(self.train_roles[0])
            empty = dict(inputs, completion_mask=torch.zeros_like(inputs["completion_mask"]))
            return super().compute_loss(model, empty, return_outputs, num_items_in_batch) * 0.0
        backward = model.training and torch.is_grad_enabled()
        scale = 1.0
        if (not self.model_accepts_loss_kwargs or num_items_in_batch is None) and self.compute_loss_func is None:
            scale = 1.0 / self.current_gradient_accumulation_steps  # what Trainer.training_step does before backward
        done = torch.zeros((), device=self.accelerator.device)
        loss = done
        for index, (k, role) in enumerate(parts):
            self.activate_role(role)
            loss = super().compute_loss(model, _rows(inputs, row_roles == k), return_outputs, num_items_in_batch)
            self.log_metric(f"ib_rl/{role}/loss", float(loss.detach()))
            if index < len(parts) - 1:
                if backward:
                    with self.accelerator.no_sync(model):
                        self.accelerator.backward(loss * scale)
                done = done + loss.detach()
        return loss + done

    # ---- optimizers and schedules --------------------------------------------------------------------------------

    def _role_learning_rate(self, role: str) -> float:
        rates = self.args.ib_rl_role_learning_rates or {}
        return float(rates.get(role, self.args.learning_rate))

    def create_optimizer(self, model=None):
        """One AdamW per trained role over its adapter's parameters (`RoleOptimizer`)."""
        if self.optimizer is None:
            args = self.args
            optimizers = {
                role: torch.optim.AdamW(self.role_parameters[role], lr=self._role_learning_rate(role),
                                        betas=(args.adam_beta1, args.adam_beta2), eps=args.adam_epsilon,
                                        weight_decay=args.weight_decay)
                for role in self.train_roles
            }
            self.optimizer = RoleOptimizer(optimizers, max_grad_norm=args.ib_rl_max_grad_norm,
                                           on_step=self._log_optimizer_step)
        return self.optimizer

    def create_scheduler(self, num_training_steps: int, optimizer=None):
        """One schedule per role's optimizer (`lr_scheduler_type` and warm-up of the config; `RoleScheduler`)."""
        if self.lr_scheduler is None:
            from transformers import get_scheduler

            args = self.args
            optimizer = optimizer if optimizer is not None else self.optimizer
            self.install_lr_scheduler(RoleScheduler({
                role: get_scheduler(args.lr_scheduler_type, optimizer=role_optimizer,
                                    num_warmup_steps=args.get_warmup_steps(num_training_steps),
                                    num_training_steps=num_training_steps,
                                    scheduler_specific_kwargs=args.lr_scheduler_kwargs)
                for role, role_optimizer in optimizer.optimizers.items()
            }))
        return self.lr_scheduler

    def _log_optimizer_step(self, norms: dict[str, float]) -> None:
        for role, norm in norms.items():
            self.log_metric(f"ib_rl/{role}/grad_norm", norm)
            self.log_metric(f"ib_rl/{role}/learning_rate", self.optimizer.optimizers[role].param_groups[0]["lr"])


def _rows(inputs: dict[str, Any], keep: torch.Tensor) -> dict[str, Any]:
    """The rows `keep` (a (B,) bool tensor) of a micro-batch; scalars (`num_items_in_batch`) as they are."""
    size = keep.numel()
    chosen = keep.nonzero().flatten()
    out = {}
    for key, value in inputs.items():
        if torch.is_tensor(value) and value.ndim > 0 and value.shape[0] == size:
            out[key] = value.index_select(0, chosen.to(value.device))
        elif isinstance(value, list) and len(value) == size:
            out[key] = [v for v, k in zip(value, keep.tolist(), strict=True) if k]
        else:
            out[key] = value
    return out


def _owned_by(parameter_name: str, role: str) -> bool:
    """Whether a parameter belongs to the LoRA adapter named `role` (`...lora_A.<role>.weight`)."""
    parts = parameter_name.split(".")
    return "lora_" in parameter_name and role in parts


def _resolve_roles(args: IBRLConfig, dataset) -> tuple[str, ...]:
    """The roles: `ib_rl_roles`, else those of the environment of the config or of the dataset's rows (one
    environment, with two or more roles)."""
    if args.ib_rl_roles:
        return tuple(args.ib_rl_roles)
    names = set()
    if dataset is not None:
        rows = dataset if isinstance(dataset, list) else None
        if rows is not None:
            names = {row.get("env") for row in rows if isinstance(row, dict)}
        elif "env" in getattr(dataset, "column_names", []):
            names = set(dataset["env"])
    names.discard(None)
    if not names and args.env_name is not None:
        names = {args.env_name}
    role_sets = {get_env_class(name).roles for name in names}
    if len(role_sets) != 1:
        raise ValueError("IB-RL needs the roles: set ib_rl_roles, or train on one two-role environment (env_name or "
                         f"the rows' env); found environments {sorted(names, key=str)}")
    roles = role_sets.pop()
    if len(roles) < 2:
        raise ValueError(f"IB-RL needs an environment with two roles; {sorted(names)} has {list(roles)}")
    return tuple(roles)


def _with_role_adapters(model, args: IBRLConfig):
    """`model` (a name, a path or a model) with one LoRA adapter per role, named after the role. A PEFT model that
    already has them (a checkpoint of this trainer) is used as it is."""
    from peft import LoraConfig, PeftModel, get_peft_model

    roles = list(args.ib_rl_roles)
    if isinstance(model, PeftModel):
        missing = [r for r in roles if r not in model.peft_config]
        if missing:
            raise ValueError(f"the PEFT model has adapters {sorted(model.peft_config)} but IB-RL needs one per role: "
                             f"missing {missing}")
        return model
    if isinstance(model, str):
        from trl.trainer.utils import create_model_from_path

        model = create_model_from_path(model, **(args.model_init_kwargs or {}))
    targets = args.ib_rl_lora_target_modules
    if isinstance(targets, str) and targets != "all-linear":
        targets = [name.strip() for name in targets.split(",") if name.strip()]
    config = LoraConfig(r=args.ib_rl_lora_r, lora_alpha=args.ib_rl_lora_alpha, lora_dropout=args.ib_rl_lora_dropout,
                        target_modules=targets, task_type="CAUSAL_LM")
    peft_model = get_peft_model(model, config, adapter_name=roles[0])
    for role in roles[1:]:
        peft_model.add_adapter(role, config)
    return peft_model
