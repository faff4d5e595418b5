"""Evaluate a policy on an environment split, and keep the results as files of the run.

`evaluate_policy` plays the tasks with the same rollout engine and prompts as training (one batched generation call
per turn), greedy by default, and summarises: success rate, mean return, mean episode length, valid-action rate. With
sampling and `num_samples = n > 1` it also reports the unbiased pass@k of Chen et al. (2021) for k = 1, 2, 4, ... and
n. Its turn budget `max_turns` may exceed the training one: CANOPY (arXiv 2609.01245) trains at 50 turns and
evaluates at 100 ("test-time budget transfer"), and `train_max_turns` records the training budget so that the result
says which it was.

`write_eval_result` stores one evaluation as `RUN_DIR/eval/{name}.json` (the format `trl-agents push` turns into the
model card's `model-index`), `read_eval_results` reads them all back.

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

import contextlib
import json
import os
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from .envs import get_env_class
from .fileio import atomic_write
from .metrics import mean_pass_at_k
from .rollout import EnvPool, PromptRenderer, RolloutEngine, SamplingParams, TransformersGenerator
from .rollout.generators import Generator
from .rollout.prompts import prompt_length_limit
from .trajectory import RolloutBatch

EVAL_DIR = "eval"
# The metrics of an evaluation (plus `pass_at_k` for sampled evaluations): what `write_eval_result` stores under
# "metrics" and what the model card shows.
EVAL_METRICS = ("success_rate", "episode_return", "episode_length", "valid_action_rate")
# The settings of an evaluation, copied from the `evaluate_policy` result into its record.
EVAL_SETTINGS = (
    "env", "split", "num_tasks", "num_episodes", "greedy", "temperature", "num_samples", "max_turns", "train_max_turns",
)
# The fields of an eval result file, in the order they are written.
EVAL_RESULT_FIELDS = ("name", *EVAL_SETTINGS, "metrics", "model", "config_hash", "created", "trl_agents_version")


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
    train_max_turns: int | None = None,
    history_length: int = 2,
    row_format: str = "step",
    system_prompt: str | None = None,
    max_new_tokens: int = 32,
    max_prompt_length: int | None = None,
    greedy: bool = True,
    temperature: float = 1.0,
    num_samples: int = 1,
    seed: int | None = None,
    batch_size: int | None = None,
    generator: Generator | None = None,
    env_pool: EnvPool | None = None,
    chat_template_kwargs: dict[str, Any] | None = None,
    show_progress: bool = False,
    return_rollout: bool = False,
    rollout_schedule: str = "lockstep",
    deterministic_sampling: bool | None = None,
) -> dict[str, Any]:
    """Run the policy on `tasks` (or on `num_tasks` tasks of the env's `split`) and summarise.

    Args:
        model: The policy (ignored when `generator` is given).
        tokenizer: Its tokenizer, with a chat template.
        env: Registered environment name.
        tasks: Task rows to play; by default `num_tasks` rows of `split`.
        max_turns: Turn budget of an episode at evaluation; it may exceed the training budget (CANOPY evaluates
            at twice it).
        train_max_turns: The training turn budget, recorded in the result (and in its file name when it differs
            from `max_turns`); None when unknown.
        max_prompt_length: Longest prompt in tokens (an episode whose prompt cannot fit fails); None = the model's
            context length minus `max_new_tokens`, as in training (`prompt_length_limit`).
        greedy: Greedy decoding; False samples at `temperature`.
        num_samples: Episodes per task (needs sampling when > 1); reports pass@k.
        seed: With sampling, draw from torch's generator seeded with `seed`, in a forked state: two models evaluated
            with one seed start from the same random numbers (paired comparisons) and the caller's draws are left
            as they were. None samples from the global generator as it stands.
        env_pool: Runs the environments (e.g. `EnvPool(backend="process", step_timeout=60)` for slow or fragile
            ones); by default a pool of local environments, closed at the end.
        show_progress: Show a live progress bar of the episodes on stderr.
        return_rollout: Also return the `RolloutBatch` under `"rollout"`.
        rollout_schedule: `"lockstep"` or `"free"` (each episode advances alone: for environments whose steps are
            slow and vary; `RolloutEngine(schedule=)`, docs/async.md). With `"free"`, sampling takes one seed per
            request (from `seed`, 0 when None) if the generator supports it.
        deterministic_sampling: Sample every request from its own seed, a hash of (`seed`, task, episode, turn)
            (`RolloutEngine(deterministic_sampling=)`): an episode's draws do not depend on the requests it shares a
            batch with. None: on under `"free"` when the generator supports it, off under `"lockstep"`.

    Returns:
        A flat dict: `env`, `split`, `num_tasks`, `num_episodes`, `greedy`, `temperature`, `num_samples`,
        `max_turns`, `train_max_turns`, the metrics `success_rate`, `episode_return`, `episode_length`,
        `valid_action_rate`, `failed_episodes`, and `pass_at_k` for the k of `pass_at_k_values(num_samples)` when
        `num_samples > 1`. `to_eval_result` turns it into the record `write_eval_result` stores.
    """
    env_kwargs = dict(env_kwargs or {})
    if tasks is None:
        tasks = get_env_class(env).task_split(split, num_tasks, **env_kwargs)
    tasks = [dict(task, env=task.get("env", env)) for task in tasks]
    if greedy and num_samples > 1:
        raise ValueError("num_samples > 1 needs sampling (greedy=False): greedy episodes of a task are identical")
    progress = None
    if show_progress:
        from .rollout.progress import RolloutProgress

        progress = RolloutProgress(f"eval {env}")
    # None: the model's context minus max_new_tokens, as in training (`prompt_length_limit`).
    limit, origin = prompt_length_limit(max_prompt_length, model, max_new_tokens)
    engine = RolloutEngine(
        generator or TransformersGenerator(model, tokenizer, batch_size=batch_size),
        PromptRenderer(tokenizer, history_length, limit, chat_template_kwargs, max_prompt_length_origin=origin),
        max_turns=max_turns,
        sampling=SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, greedy=greedy),
        row_format=row_format,
        env_pool=env_pool or EnvPool(env_kwargs=env_kwargs, default_env=env),
        system_prompt=system_prompt,
        on_turn=progress.update if progress else None,
        schedule=rollout_schedule,
        deterministic_sampling=deterministic_sampling,
        seed=0 if seed is None else seed,
    )
    try:
        with progress.track() if progress else contextlib.nullcontext(), _seeded(None if greedy else seed):
            batch = engine.run(tasks, num_generations=num_samples)
    finally:
        if env_pool is None:  # ours: stop its workers
            engine.env_pool.close()
    result = {
        "env": env,
        "split": split,
        "greedy": greedy,
        "temperature": temperature,
        "num_samples": num_samples,
        "max_turns": max_turns,
        "train_max_turns": train_max_turns,
        **summarize(batch),
    }
    if return_rollout:
        result["rollout"] = batch
    return result


@contextlib.contextmanager
def _seeded(seed: int | None):
    """torch's generators (CPU and every GPU) seeded with `seed` inside, restored on exit; nothing when None."""
    if seed is None:
        yield
        return
    import torch

    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


def summarize(batch: RolloutBatch) -> dict[str, Any]:
    """Success rate, mean return, mean length and valid-action rate of a rollout (failed episodes count as
    unsuccessful and are also reported separately), and pass@k when tasks have several episodes."""
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
    result.update(mean_pass_at_k([[t.success for t in g.trajectories] for g in batch.groups if g.trajectories]))
    return result


# ---- result files ---------------------------------------------------------------------------------------------------


def eval_result_name(env: str, split: str, greedy: bool, max_turns: int, train_max_turns: int | None = None) -> str:
    """The name (and file name, without `.json`) of an evaluation: `{env}-{split}-{greedy|sampled}`, plus
    `-t{max_turns}` when the turn budget differs from the training one (our choice: the name then tells the
    evaluations of one run apart).

    Example:
        >>> eval_result_name("sokoban", "eval", greedy=True, max_turns=30, train_max_turns=15)
        'sokoban-eval-greedy-t30'
    """
    name = f"{env}-{split}-{'greedy' if greedy else 'sampled'}"
    if train_max_turns is not None and max_turns != train_max_turns:
        name += f"-t{max_turns}"
    return name


def to_eval_result(
    result: dict[str, Any], *, model: str, config_hash: str | None = None, name: str | None = None
) -> dict[str, Any]:
    """The record of one evaluation that `write_eval_result` stores, from an `evaluate_policy` result.

    Args:
        result: What `evaluate_policy` returned.
        model: The run directory or Hub id of the evaluated model.
        config_hash: `config_hash` of the run's `run_info.json`; by default read from `model` when it is a run
            directory that has one.
        name: By default `eval_result_name(...)` of the settings.
    """
    from . import __version__

    if config_hash is None:
        config_hash = run_config_hash(model)
    missing = [key for key in (*EVAL_SETTINGS, *EVAL_METRICS) if key not in result]
    if missing:
        raise ValueError(f"to_eval_result: the result lacks {', '.join(missing)}; pass what evaluate_policy returned")
    metrics = {key: result[key] for key in EVAL_METRICS}
    metrics.update({key: value for key, value in result.items() if key.startswith("pass_at_")})
    return {
        "name": name or eval_result_name(
            result["env"], result["split"], result["greedy"], result["max_turns"], result["train_max_turns"]
        ),
        **{key: result[key] for key in EVAL_SETTINGS},
        "metrics": metrics,
        "model": str(model),
        "config_hash": config_hash,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "trl_agents_version": __version__,
    }


def write_eval_result(run_dir: str | os.PathLike, result: dict[str, Any]) -> str:
    """Write one evaluation record (see `to_eval_result`) to `run_dir/eval/{result['name']}.json` and return the
    path. The file is written under a temporary name and renamed, so a reader never sees half of it; an evaluation of
    the same name is replaced.

    Example:
        >>> import tempfile
        >>> run_dir = tempfile.mkdtemp()
        >>> result = {"env": "frozenlake", "split": "eval", "num_tasks": 2, "num_episodes": 2, "greedy": True,
        ...           "temperature": 1.0, "num_samples": 1, "max_turns": 20, "train_max_turns": 10,
        ...           "success_rate": 0.5, "episode_return": 0.5, "episode_length": 7.5, "valid_action_rate": 1.0}
        >>> path = write_eval_result(run_dir, to_eval_result(result, model=run_dir))
        >>> os.path.basename(path), read_eval_results(run_dir)[0]["metrics"]["success_rate"]
        ('frozenlake-eval-greedy-t20.json', 0.5)
    """
    missing = [key for key in EVAL_RESULT_FIELDS if key not in result]
    if missing:
        raise ValueError(
            f"write_eval_result: the result lacks {', '.join(missing)}. Pass the record of "
            "`to_eval_result(evaluate_policy(...), model=...)`, not the flat result of `evaluate_policy`."
        )
    name = str(result["name"])
    if not name or name.startswith(".") or os.sep in name or (os.altsep and os.altsep in name):
        raise ValueError(f"write_eval_result: name {name!r} must be a file name (no path separator, no leading '.')")
    return atomic_write(os.path.join(os.fspath(run_dir), EVAL_DIR, f"{name}.json"), json.dumps(result, indent=2))


def free_eval_name(run_dir: str | os.PathLike, name: str) -> str:
    """`name` if the run has no evaluation record of that name, else the first free `{name}-2`, `{name}-3`, ...

    >>> import tempfile
    >>> free_eval_name(tempfile.mkdtemp(), "frozenlake-eval-greedy")
    'frozenlake-eval-greedy'
    """
    taken = {os.path.basename(path)[: -len(".json")] for path in eval_result_paths(run_dir)}
    candidate, number = name, 1
    while candidate in taken:
        number += 1
        candidate = f"{name}-{number}"
    return candidate


def eval_result_paths(run_dir: str | os.PathLike) -> list[str]:
    """The evaluation record files of a run, `run_dir/eval/*.json`, sorted by name ([] when there is none);
    hidden files (the temporary ones of unfinished writes) are left out."""
    directory = os.path.join(os.fspath(run_dir), EVAL_DIR)
    if not os.path.isdir(directory):
        return []
    return [os.path.join(directory, name) for name in sorted(os.listdir(directory))
            if name.endswith(".json") and not name.startswith(".")]


def read_eval_results(run_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """Every evaluation record under `run_dir/eval/`, sorted by name ([] when there is none)."""
    results = []
    for path in eval_result_paths(run_dir):
        try:
            with open(path) as handle:
                results.append(json.load(handle))
        except json.JSONDecodeError as err:
            raise ValueError(f"{path} is not a valid eval result (JSON error: {err}); delete or rewrite it") from err
    return results


def run_config_hash(run_dir: str | os.PathLike) -> str | None:
    """`config_hash` of `run_dir/run_info.json`, or None when `run_dir` is no local run directory with one."""
    from .records import read_run_info  # (datasets is imported there: only when needed)

    return read_run_info(run_dir, missing_ok=True).get("config_hash")
