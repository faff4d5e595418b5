"""Evaluate a policy on an environment split: success rate, return, episode length, valid-action rate.

Evaluation uses the same rollout engine and prompts as training (one batched generation call per turn), greedy by
default. With `num_samples > 1` and sampling it also reports pass@k (the fraction of tasks solved at least once).

Example:
    >>> from trl_agents.evaluation import evaluate_policy
    >>> from trl_agents.testing import build_tiny_tokenizer, build_tiny_model
    >>> tokenizer = build_tiny_tokenizer()
    >>> result = evaluate_policy(build_tiny_model(tokenizer), tokenizer, "frozenlake", split="eval", num_tasks=4,
    ...                          max_turns=2, max_new_tokens=3)
    >>> result["num_tasks"], 0.0 <= result["success_rate"] <= 1.0
    (4, True)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .envs import get_env_class
from .rollout import EnvPool, PromptRenderer, RolloutEngine, SamplingParams, TransformersGenerator
from .rollout.generators import Generator
from .trajectory import RolloutBatch


def evaluate_policy(
    model: Any,
    tokenizer: Any,
    env: str,
    *,
    tasks: Sequence[dict[str, Any]] | None = None,
    split: str = "eval",
    num_tasks: int | None = None,
    env_kwargs: dict[str, Any] | None = None,
    max_turns: int = 10,
    history_length: int = 2,
    row_format: str = "step",
    system_prompt: str | None = None,
    max_new_tokens: int = 32,
    max_prompt_length: int | None = None,
    greedy: bool = True,
    temperature: float = 1.0,
    num_samples: int = 1,
    batch_size: int | None = None,
    generator: Generator | None = None,
    env_pool: EnvPool | None = None,
    chat_template_kwargs: dict[str, Any] | None = None,
    return_rollout: bool = False,
) -> dict[str, Any]:
    """Run the policy on `tasks` (or on `num_tasks` tasks of the env's `split`) and summarise.

    Returns a dict with `success_rate`, `episode_return`, `episode_length`, `valid_action_rate`, `num_tasks`,
    `num_episodes`, `greedy`, `failed_episodes`, and `pass_at_{num_samples}` when `num_samples > 1`. With
    `return_rollout=True` the `RolloutBatch` is returned under `"rollout"`. `env_pool` runs the environments
    (e.g. `EnvPool(backend="process", step_timeout=60)` for slow or fragile ones); by default a pool of local
    environments, closed at the end.
    """
    env_kwargs = dict(env_kwargs or {})
    if tasks is None:
        tasks = get_env_class(env).task_split(split, num_tasks, **env_kwargs)
    tasks = [dict(task, env=task.get("env", env)) for task in tasks]
    if greedy and num_samples > 1:
        raise ValueError("num_samples > 1 needs sampling (greedy=False): greedy episodes of a task are identical")
    engine = RolloutEngine(
        generator or TransformersGenerator(model, tokenizer, batch_size=batch_size),
        PromptRenderer(tokenizer, history_length, max_prompt_length, chat_template_kwargs),
        max_turns=max_turns,
        sampling=SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, greedy=greedy),
        row_format=row_format,
        env_pool=env_pool or EnvPool(env_kwargs=env_kwargs, default_env=env),
        system_prompt=system_prompt,
    )
    try:
        batch = engine.run(tasks, num_generations=num_samples)
    finally:
        if env_pool is None:  # ours: stop its workers
            engine.env_pool.close()
    result = summarize(batch)
    result["greedy"] = greedy
    if return_rollout:
        result["rollout"] = batch
    return result


def summarize(batch: RolloutBatch) -> dict[str, Any]:
    """Success rate, mean return, mean length and valid-action rate of a rollout (failed episodes count as
    unsuccessful and are also reported separately)."""
    trajectories = batch.trajectories
    steps = [step for t in trajectories for step in t.steps]
    n = max(len(trajectories), 1)
    result = {
        "success_rate": sum(t.success for t in trajectories) / n,
        "episode_return": sum(t.episode_return for t in trajectories) / n,
        "episode_length": sum(t.num_steps for t in trajectories) / n,
        "valid_action_rate": sum(s.valid for s in steps) / max(len(steps), 1),
        "failed_episodes": sum(t.failed for t in trajectories),
        "num_tasks": len(batch.groups),
        "num_episodes": len(trajectories),
    }
    samples = max((len(g.trajectories) for g in batch.groups), default=1)
    if samples > 1:
        solved = sum(any(t.success for t in g.trajectories) for g in batch.groups)
        result[f"pass_at_{samples}"] = solved / max(len(batch.groups), 1)
    return result
