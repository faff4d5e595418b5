"""Stage 1, tasks: dataset rows are tasks, not prompts (docs/concepts/training_loop.md#tasks).

A task row names an environment (an `env` column, or the config's `env_name`) and the fields its `reset` needs. This
module checks a dataset of task rows before training (`as_task_dataset`, and the environment capabilities and task
fields a method needs: `check_env_capabilities`, `check_privileged_field`), and turns TRL's generation batch (every
row repeated G times) back into its tasks (`tasks_of`). `environment_return` is the reward function TRL is given: the
environment is the reward source.
"""

from __future__ import annotations

from typing import Any

from datasets import Dataset, IterableDataset

from ..envs import get_env_class

def tasks_of(inputs: list[dict[str, Any]], num_generations: int) -> list[dict[str, Any]]:
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


def as_task_dataset(dataset, args: Any, name: str, required: bool):
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


def check_env_capabilities(dataset, args: Any, needed: tuple[str, ...], trainer_name: str) -> None:
    """Every environment of the dataset has the capabilities `needed` (a one-line error naming the environments that
    do, otherwise)."""
    if not needed or dataset is None or isinstance(dataset, IterableDataset):
        return
    env_names = set(dataset["env"]) if "env" in dataset.column_names else {args.env_name}
    for env_name in sorted(env_names, key=str):
        env_cls = get_env_class(env_name)
        missing = [c for c in needed if c not in env_cls.capabilities()]
        if missing:
            raise ValueError(
                f"{trainer_name} needs environments with {', '.join(needed)}, but "
                f"{env_name!r} ({env_cls.__name__}) lacks {', '.join(missing)}. Environments that have them: "
                f"{', '.join(envs_with(needed)) or 'none registered'} "
                "(`trl-agents envs` lists every environment's capabilities)."
            )


def check_privileged_field(dataset, args: Any, needs_teacher: bool) -> None:
    """A teacher reading a task field (`privileged_source="task:<field>"`) needs that column in the dataset."""
    source = args.privileged_source
    if not (needs_teacher and isinstance(source, str) and source.startswith("task:")):
        return
    if dataset is None or isinstance(dataset, IterableDataset):
        return
    field_name = source.split(":", 1)[1]
    if field_name not in dataset.column_names:
        raise ValueError(
            f"privileged_source={source!r} reads the task field {field_name!r}, but the dataset's columns are "
            f"{', '.join(dataset.column_names)}: add the column or choose another privileged_source."
        )


def check_topology(topology, args: Any, supports_trees: bool, needs_teacher: bool, trainer_name: str) -> None:
    """A topology that forks episodes needs credit written for trees, and step rows when a teacher reads a
    privileged view (a one-line ValueError naming the fix otherwise)."""
    if topology.needs_snapshots and not supports_trees:
        raise ValueError(
            f"topology={args.topology!r} forks episodes that share their first steps, but "
            f"{trainer_name}'s credit is not written for trees (every path would count a shared step "
            "again): use a tree-aware method such as BPOTrainer (method 'bpo'), or topology='independent'."
        )
    if args.row_format == "conversation" and topology.needs_snapshots and needs_teacher:
        raise ValueError(
            "A privileged view of conversation rows rewrites an episode's first prompt, but a forked episode's row "
            "starts at its fork: use row_format='step' with tree topologies and teacher signals."
        )


def envs_with(capabilities: tuple[str, ...]) -> list[str]:
    from ..envs import list_envs

    return [name for name, env_cls in list_envs().items() if set(capabilities) <= env_cls.capabilities()]


def as_namespace(args: Any) -> Any:
    """A config, or a dict of config values (the registry's defaults), as an object with attribute access."""
    if isinstance(args, dict):
        import types

        return types.SimpleNamespace(**args)
    return args


def environment_return(completions: list, episode_return: list[float] | None = None, **kwargs) -> list[float]:
    """The environment is the reward source: each episode's undiscounted return Σ_t r_t.

    Registered with TRL as the trainer's reward function, so TRL's bookkeeping (`reward_func_names`, reward logs)
    names the reward after the environment. AgentGRPOTrainer reads returns from its own rollouts.
    """
    if episode_return is None:
        raise ValueError("environment_return needs the episode_return column produced by an agent rollout")
    return [float(r) for r in episode_return]

