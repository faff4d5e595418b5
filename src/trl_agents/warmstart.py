"""Supervised warm start on solver demonstrations, with TRL's `SFTTrainer`.

A model that never emits a valid action gets no learning signal from RL. For environments with a solver
(`optimal_plan` capability), `solver_demonstrations` replays optimal plans and records every turn as a
prompt-completion example rendered exactly as the RL prompts are (same system message, history window and
observation text), and `warm_start` fine-tunes on them. `SuccessStopper` evaluates greedy success every few steps
and stops once a target is reached: too strong a warm start leaves RL nothing to learn, too weak gives it no
successes to learn from (docs/concepts/warm_start.md, "Lessons").

Example:
    >>> from trl_agents.warmstart import solver_demonstrations
    >>> rows = solver_demonstrations("frozenlake", [{"seed": 1}], history_length=0)
    >>> rows[0]["completion"][0]["role"], rows[0]["completion"][0]["content"] in ("up", "down", "left", "right")
    ('assistant', True)
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from transformers import TrainerCallback

from .envs import get_env_class, make_env
from .envs.base import has_plans, plan_of
from .rollout.prompts import PromptRenderer, tools_column

if TYPE_CHECKING:
    from datasets import Dataset

logger = logging.getLogger(__name__)


def solver_demonstrations(
    env: str,
    tasks: Sequence[dict[str, Any]],
    *,
    env_kwargs: dict[str, Any] | None = None,
    history_length: int = 2,
    system_prompt: str | None = None,
) -> list[dict[str, Any]]:
    """One conversational prompt-completion example per turn of an optimal episode of every task.

    Args:
        env: Registered environment name; it must implement `optimal_plan()` (e.g. a BFS or A* solver) or, for
            environments whose plans are good but not shortest (Search-QA, WebShop), `expert_plan()`.
        tasks: Task rows (dicts with the fields `reset` needs).
        env_kwargs: Environment constructor arguments.
        history_length: History window of the prompts (use the RL setting).
        system_prompt: Overrides the environment's instructions (use the RL setting).
    """
    env_cls = get_env_class(env)
    if not has_plans(env_cls):
        raise ValueError(
            f"Environment {env!r} has no solver (`optimal_plan`) nor expert (`expert_plan`), so there are no "
            "demonstrations to warm-start on. Set warm_start_steps=0, or warm-start from a trajectory dataset "
            "instead (warm_start_dataset)."
        )
    instance = make_env(env, **(env_kwargs or {}))
    rows = []
    for task in tasks:
        observation = instance.reset(dict(task))
        system = instance.instructions if system_prompt is None else system_prompt
        task_text = instance.task_description()
        # An environment with tools: SFTTrainer passes the `tools` column to the chat template, as the rollout does.
        tools = {"tools": tools_column(instance.tools)} if instance.tools else {}
        history: list[tuple[str, str]] = []
        for action in plan_of(instance) or []:
            recent = history[-history_length:] if history_length > 0 else []
            rows.append(
                {
                    "prompt": PromptRenderer.step_messages(system, task_text, recent, observation),
                    "completion": [{"role": "assistant", "content": action}],
                    **tools,
                }
            )
            next_observation, _, done, _ = instance.step(action)
            history.append((observation, action))
            observation = next_observation
            if done:
                break
    instance.close()
    return rows


class SuccessStopper(TrainerCallback):
    """Evaluate every `every` steps with `evaluate()` (returns a success rate) and stop at `target` or above, but
    not before `min_steps`.

    The minimum matters: a tiny model can jump to the target early with a shortcut (e.g. always moving down or right
    on FrozenLake) before it has learned to read the observation, and RL then has little to build on.
    The measured curve is kept in `history` as (step, success) pairs. With several processes, every process
    evaluates (a sharded model needs all of them) and the main process's success rate decides for all.
    """

    def __init__(self, evaluate: Callable[[], float], every: int, target: float | None, min_steps: int = 0):
        self.evaluate = evaluate
        self.every = max(int(every), 1)
        self.target = target
        self.min_steps = min_steps
        self.history: list[tuple[int, float]] = []

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % self.every != 0:
            return control
        success = self.evaluate()
        if getattr(args, "world_size", 1) > 1:  # every process evaluates; all follow the main one (same stop step)
            from accelerate.utils import broadcast_object_list

            success = broadcast_object_list([success])[0]
        self.history.append((state.global_step, success))
        logger.info("warm start step %d: validation success %.3f", state.global_step, success)
        if self.target is not None and success >= self.target and state.global_step >= self.min_steps:
            control.should_training_stop = True
        return control


def warm_start(
    model: Any,
    tokenizer: Any,
    examples: list[dict[str, Any]] | Dataset,
    *,
    output_dir: str,
    max_steps: int,
    learning_rate: float = 1e-3,
    batch_size: int = 64,
    seed: int = 0,
    callbacks: list[TrainerCallback] | None = None,
    report_to: str | list[str] = "none",
    peft_config: Any = None,
    run_name: str | None = None,
):
    """Fine-tune `model` on `examples` with TRL's SFTTrainer; returns the trainer.

    `examples` are rows in a format SFTTrainer takes, as a list or a `datasets.Dataset`: prompt-completion chats
    (`solver_demonstrations`) or pre-tokenized rows (`trl_agents.records.sft_examples`, replayed trajectories).
    With `peft_config` (e.g. `peft.LoraConfig`) SFTTrainer trains an adapter instead of the whole model: the trained
    `PeftModel` is `trainer.model` (`model` itself stays the base). `report_to` and `run_name` go to the trackers.
    """
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    from .trainers.agent_grpo_config import checkpointing_setting, cpu_only

    config = SFTConfig(
        output_dir=output_dir,
        max_steps=max_steps,
        learning_rate=learning_rate,
        per_device_train_batch_size=batch_size,
        lr_scheduler_type="constant",
        warmup_steps=0,
        logging_steps=max(max_steps // 10, 1),
        save_strategy="no",
        report_to=report_to,
        run_name=run_name,
        seed=seed,
        # As AgentGRPOConfig does on a machine without an accelerator (see cpu_only).
        bf16=False if cpu_only() else None,
        dataloader_pin_memory=not cpu_only(),
        use_cpu=cpu_only(),
        **checkpointing_setting(False),
        dataset_num_proc=None,
        disable_tqdm=False,
    )
    trainer = SFTTrainer(
        model=model,
        args=config,
        train_dataset=examples if isinstance(examples, Dataset) else Dataset.from_list(examples),
        processing_class=tokenizer,
        callbacks=callbacks,
        peft_config=peft_config,
    )
    trainer.train()
    return trainer
