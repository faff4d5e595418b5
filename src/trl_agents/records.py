"""Records of a training run: `run_info.json` and the trajectory dataset (one row per step), written during training.

A run directory (a trainer's `output_dir`) holds `run_info.json` (what ran: method, environment, base model, every
config field and their hash, versions; written at the start of `train()`) and `trajectories/`, one parquet shard per
rollout and process, `shard-{rollout:06d}-rank{rank:02d}.parquet`. A shard is written under a hidden temporary name,
synced to disk and renamed, so readers never see a partial one and a crash loses nothing already written; a resumed
run numbers its shards after the last complete one.

Schema of the trajectory dataset (`TRAJECTORY_FEATURES`): one row per step of every episode, in rollout order.

| column | type | meaning |
|---|---|---|
| `run_id` | string | The run: created with the run directory's first `run_info.json` and kept by resumed runs. |
| `config_hash` | string | Hash of the run's config (`run_info.json`), so rows of different configs never mix silently. |
| `method` | string | Registered method name (`trl-agents methods`), e.g. `"gigpo"`. |
| `env` | string | Environment of the task (its `env` field, else the run's environment). |
| `rollout` | int64 | Index of the rollout (generation batch) in the run, counted per process from 0. |
| `rank` | int64 | Process that ran the episode (`accelerate` process index). |
| `global_step` | int64 | Optimizer steps completed when the rollout was generated. |
| `group_id` | string | The group (one task's G episodes), unique in the run: `"{rollout}-{rank}-{group_index}"`. |
| `episode_uid` | string | The episode, unique in the run: `"{group_id}-{episode_id}"`. |
| `task` | string | The task row, as JSON (`json.loads` gives back the dict `reset` received). |
| `task_id` | string | The task's `task_id` field, else its canonical JSON. |
| `group_index` | int64 | Index of the group in its rollout. |
| `episode_id` | int64 | Index of the episode in its group (0..G-1). |
| `step` | int64 | Turn index in the episode; -1 for an episode that failed before its first step (one row). |
| `role` | string | The acting role in two-agent environments (`info["role"]`), else `"agent"`. |
| `branch_id` | string? | Tree topologies (e.g. `branching`): the episode the step belongs to (its `episode_id`). Null for independent episodes. |
| `parent_id` | string? | Tree topologies: the `branch_id` this episode forked from (null for a root or no branching). |
| `fork_step` | int64 | Tree topologies: the episode's first own step; its steps before it are its parent's rows (recorded once). 0 otherwise. |
| `observation` | string | The observation shown right before the action (without history). |
| `next_observation` | string? | The observation the environment returned after the action (the next row's `observation`, or the terminal one after the last step); null for a failed step. |
| `action_text` | string | The decoded model output of the turn. |
| `action` | string | The action as the environment understood it: its `info["action"]` when it reports one, else the action region of the reply, normalised (`credit.base.canonical_action`). |
| `reward` | float64 | Environment reward of the step. |
| `done` | bool | The environment ended the episode after this step. |
| `valid` | bool | The environment accepted the action. |
| `state_key` | string? | Canonical state before the action (`repr`), when the environment has `state_key`. |
| `info` | string | The step's `info` dict, as JSON; `policy_version` is the optimizer step whose weights sampled it. |
| `signals` | string | The step's JSON-able signals (`step.signals`: solver values, verifier atoms, teacher log-probs, ...), as JSON; `{}` when none. |
| `episode_return` | float64 | Undiscounted return of the episode (same on every row of the episode). |
| `success` | bool | The episode solved its task (same on every row of the episode). |
| `error` | string? | Infrastructure failure of the episode (crash, timeout); such episodes are never trained on. |
| `advantage` | float64? | The step's advantage in training (mean over tokens for per-token credit); null for failed episodes. |
| `prompt_ids` | list<int32> | Tokens the policy was conditioned on (step format: this turn's prompt; conversation format: the whole conversation so far). |
| `action_ids` | list<int32> | Tokens the policy generated (the loss-bearing tokens). |
| `action_logprobs` | list<float32> | Sampling log-probabilities of `action_ids`. |
| `env_ids` | list<int32> | Conversation format: the tokens appended after the action (never trained on); empty in step format. |
| `prompt` | list<message> | The messages the policy saw this turn (`{"role", "content"}`: system, user, ...), as rendered (`step_chat`); empty for a failed episode. |
| `completion` | list<message> | The policy's reply, `[{"role": "assistant", "content": action_text}]`: with `prompt`, TRL's conversational prompt-completion format. |
| `tools` | string? | The JSON schemas of the tools the environment offered (`AgentEnv.tools`), as a JSON list, which the chat template rendered into the prompt; null for environments without tools. TRL's `SFTTrainer` reads this column. |

An episode is the rows sharing `episode_uid` (and `run_id`), ordered by `step`; a group, the rows sharing `group_id`.
`prompt_ids`, `action_ids`, `action_logprobs` and `env_ids` are for replay (`sft_examples` rebuilds training rows
from them token for token, so the replayed model must use the recording policy's tokenizer); the text columns, rewards
and advantages are for analysis. `RolloutBatch.from_rows` rebuilds the `Group`s and `Trajectory`s of one rollout.
After a crash, `train(resume_from_checkpoint=...)` continues at the checkpoint's step: the shards of rollouts generated
after it (`global_step` ≥ the checkpoint's) are moved, unread, into `trajectories/superseded/resume-...`
(`supersede_shards`; kept, never deleted), so the dataset holds every step once, as an uninterrupted run would.

Example:
    >>> import os, tempfile
    >>> from trl_agents.records import TrajectoryWriter, load_trajectories
    >>> from trl_agents.trajectory import Group, RolloutBatch, Step, Trajectory
    >>> episode = Trajectory({"env": "frozenlake", "seed": 1}, [Step("P . G", "right", [5, 6], [7], [-0.5], 1.0, True)])
    >>> run_dir = tempfile.mkdtemp()
    >>> writer = TrajectoryWriter(f"{run_dir}/trajectories", run_info={"run_id": "demo", "config_hash": "0" * 16,
    ...                                                                 "method": "grpo", "env": "frozenlake"})
    >>> path = writer.write(RolloutBatch([Group(episode.task, [episode])]), {(0, 0): [0.7]}, global_step=0)
    >>> os.path.basename(path)
    'shard-000000-rank00.parquet'
    >>> row = load_trajectories(run_dir)[0]
    >>> row["episode_uid"], row["action"], row["advantage"], row["action_ids"]
    ('0-0-0-0', 'right', 0.7, [7])
"""

from __future__ import annotations

import datetime
import hashlib
import json
import logging
import os
import re
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from datasets import Dataset, Features, List, Value

from .credit.base import canonical_action
from .envs.base import INFO_ROLE
from .fileio import atomic_write
from .trajectory import RolloutBatch

logger = logging.getLogger(__name__)

RUN_INFO_NAME = "run_info.json"
TRAJECTORIES_DIR = "trajectories"
DEFAULT_ROLE = "agent"
SHARD_PATTERN = re.compile(r"^shard-(\d{6,})-rank(\d{2,})\.parquet$")
# The temporary name `atomic_write` gives a shard while writing it; one left behind is an interrupted write.
TEMPORARY_PATTERN = re.compile(r"^\.shard-(\d{6,})-rank(\d{2,})\.parquet(?:\.\d+\.\d+)?\.tmp$")

_string, _int, _float, _bool = Value("string"), Value("int64"), Value("float64"), Value("bool")
TRAJECTORY_FEATURES = Features(
    {
        "run_id": _string,
        "config_hash": _string,
        "method": _string,
        "env": _string,
        "rollout": _int,
        "rank": _int,
        "global_step": _int,
        "group_id": _string,
        "episode_uid": _string,
        "task": _string,
        "task_id": _string,
        "group_index": _int,
        "episode_id": _int,
        "step": _int,
        "role": _string,
        "branch_id": _string,
        "parent_id": _string,
        "fork_step": _int,
        "observation": _string,
        "next_observation": _string,
        "action_text": _string,
        "action": _string,
        "reward": _float,
        "done": _bool,
        "valid": _bool,
        "state_key": _string,
        "info": _string,
        "signals": _string,
        "episode_return": _float,
        "success": _bool,
        "error": _string,
        "advantage": _float,
        # Token ids fit int32 for any vocabulary; halving the largest columns is our choice.
        "prompt_ids": List(Value("int32")),
        "action_ids": List(Value("int32")),
        "action_logprobs": List(Value("float32")),
        "env_ids": List(Value("int32")),
        # The step as a chat, TRL's conversational prompt-completion format (SFT-ready: `SFTTrainer` trains on the
        # completion only).
        "prompt": List({"role": _string, "content": _string}),
        "completion": List({"role": _string, "content": _string}),
        "tools": _string,
    }
)
"""The `datasets.Features` of a trajectory dataset (the module docstring documents every column)."""

TRAJECTORY_SCHEMA: pa.Schema = TRAJECTORY_FEATURES.arrow_schema
"""The pyarrow schema of the shards, with the features in its metadata so that `datasets` reads them back typed."""


# ---- run_info.json ----------------------------------------------------------------------------------------------


def build_run_info(trainer) -> dict[str, Any]:
    """What a trainer runs, as `run_info.json` records it (without writing it; `run_id` and `created` are new).

    Keys: `run_id`, `method` (the trainer's registered method, else its class name), `method_card` (what a model card
    shows about the method: `Method.card_info()`, {} for a user subclass), `env`, `model` (the model the trainer
    loaded: a Hub id or a path), `base_model` (the Hub id that model descends from, `hub_base_model`; None for a model
    built locally), `config` (every config field, JSON-safe, tokens
    masked as `TrainingArguments.to_dict` masks them), `config_hash` (sha256 of the canonical JSON of `config`, first
    16 hex digits), `trl_agents_version`, `trl_version`, `created` (ISO time, UTC).
    """
    import trl

    from . import __version__

    config = json.loads(json.dumps(trainer.args.to_dict(), default=str))
    method = trainer.method  # the registered method it runs (None for a user subclass)
    created = datetime.datetime.now(datetime.UTC)
    return {
        "run_id": f"{created:%Y%m%d-%H%M%S}-{uuid.uuid4().hex[:8]}",
        "method": method_name(trainer),
        "method_card": method.card_info() if method is not None else {},
        "env": _env_name(trainer),
        "model": _base_model(trainer),
        "base_model": hub_base_model(_base_model(trainer)),
        "config": config,
        "config_hash": config_hash(config),
        "trl_agents_version": __version__,
        "trl_version": trl.__version__,
        "created": created.isoformat(timespec="seconds"),
    }


UNHASHED_FIELDS = ("resume_from_checkpoint",)
"""Config fields that say how a run is started, not what it computes: left out of `config_hash`, so a resumed run
keeps its hash."""


def config_hash(config: Mapping[str, Any]) -> str:
    """First 16 hex digits of the sha256 of the canonical JSON (sorted keys, no spaces) of a config dict, without the
    `UNHASHED_FIELDS`.

    >>> config_hash({"b": 1, "a": [2.0, None]}) == config_hash({"a": [2.0, None], "b": 1})
    True
    >>> config_hash({"a": 1, "resume_from_checkpoint": "out/checkpoint-3"}) == config_hash({"a": 1})
    True
    """
    config = {key: value for key, value in config.items() if key not in UNHASHED_FIELDS}
    canonical = json.dumps(config, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def write_run_info(trainer) -> dict[str, Any]:
    """Write `output_dir/run_info.json` for `trainer` and return it (call it on the main process).

    A run directory is one run: when it already has a `run_info.json` (a resumed or continued run), its `run_id` and
    `created` are kept, and the config fields (and hash) are updated to the ones running now.
    """
    info = build_run_info(trainer)
    previous = read_run_info(trainer.args.output_dir, missing_ok=True)
    info.update({key: previous[key] for key in ("run_id", "created") if key in previous})
    atomic_write(os.path.join(trainer.args.output_dir, RUN_INFO_NAME), json.dumps(info, indent=2))
    return info


def read_run_info(run_dir: str | os.PathLike, *, missing_ok: bool = False) -> dict[str, Any]:
    """The `run_info.json` of a run directory.

    Args:
        run_dir: The run directory (a trainer's `output_dir`).
        missing_ok: Return {} when there is no `run_info.json` (e.g. a Hub id or a run of an older version) instead
            of raising `FileNotFoundError`.

    Example:
        >>> import tempfile
        >>> read_run_info(tempfile.mkdtemp(), missing_ok=True)
        {}
    """
    path = os.path.join(run_dir, RUN_INFO_NAME)
    if not os.path.isfile(path):
        if missing_ok:
            return {}
        raise FileNotFoundError(
            f"{run_dir!r} has no {RUN_INFO_NAME}: it is written by AgentGRPOTrainer.train() (trl-agents >= 0.1) "
            "into the trainer's output_dir; pass a run directory."
        )
    with open(path) as handle:
        return json.load(handle)


def method_name(trainer) -> str:
    """The registered method `trainer` runs (`trainer.method`), else its class name (a user subclass)."""
    method = trainer.method
    return method.name if method is not None else type(trainer).__name__


def _env_name(trainer) -> str | None:
    """The config's `env_name`, else the one environment of the training tasks (None when they mix several)."""
    if trainer.args.env_name is not None:
        return trainer.args.env_name
    dataset = trainer.train_dataset
    if isinstance(dataset, Dataset) and "env" in dataset.column_names:
        names = set(dataset["env"])
        if len(names) == 1:
            return str(names.pop())
    return None


def _base_model(trainer) -> str | None:
    model = trainer.accelerator.unwrap_model(trainer.model)
    return getattr(getattr(model, "config", None), "_name_or_path", None) or None


def is_hub_id(name: str) -> bool:
    """Whether a model reference is a Hub repo id (`org/name`, not an existing local path), as a card's `base_model`
    needs.

    >>> is_hub_id("Qwen/Qwen2.5-0.5B-Instruct"), is_hub_id("outputs/run/warm-start/"), is_hub_id("gpt2")
    (True, False, False)
    """
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return "/" in name and not os.path.exists(name)


def hub_base_model(name: str | None, _depth: int = 0) -> str | None:
    r"""The Hub model id that the model at `name` descends from: `name` itself when it is a Hub id; for a local folder,
    the `base_model` of its model card (`README.md`: TRL's trainers write one, and so does `trl-agents train` for its
    warm start) or the base of its LoRA adapter (`adapter_config.json`), followed through local folders. None for a
    model built locally (the tiny model) or a folder that names no base.

    >>> import json, pathlib, tempfile
    >>> folder = tempfile.mkdtemp()
    >>> _ = pathlib.Path(folder, "README.md").write_text("---\nbase_model: org/name\n---\n# Warm start\n")
    >>> hub_base_model(folder), hub_base_model("org/name"), hub_base_model(tempfile.mkdtemp())
    ('org/name', 'org/name', None)
    """
    if not name or _depth > 8:
        return None
    if is_hub_id(name):
        return name
    if not os.path.isdir(name):
        return None
    readme, adapter = os.path.join(name, "README.md"), os.path.join(name, "adapter_config.json")
    parents: list[Any] = []
    if os.path.isfile(readme):
        from huggingface_hub import metadata_load

        base = (metadata_load(readme) or {}).get("base_model")
        parents += base if isinstance(base, list) else [base]
    if os.path.isfile(adapter):
        with open(adapter) as handle:
            parents.append(json.load(handle).get("base_model_name_or_path"))
    for parent in parents:
        if isinstance(parent, str) and os.path.abspath(parent) != os.path.abspath(name):
            found = hub_base_model(parent, _depth + 1)
            if found:
                return found
    return None


# ---- trajectory shards ------------------------------------------------------------------------------------------


class TrajectoryWriter:
    """Append rollouts to a trajectory dataset on disk, one parquet shard per rollout, crash-safe.

    Each shard is written to a hidden `.{name}.{pid}.{thread}.tmp` in the same directory, synced to disk, then atomically renamed to
    `shard-{rollout:06d}-rank{rank:02d}.parquet` (`fileio.atomic_write`). On creation, the writer removes this rank's
    temporary files left by a crash and numbers its shards after the highest existing one of its rank, so a resumed
    run never overwrites what an earlier one wrote.

    Args:
        directory: The shards' folder (a run's `output_dir/trajectories`); created on the first write.
        run_info: The run's `run_info.json` content; `run_id`, `config_hash`, `method` and `env` go into every row.
        rank: This process's index; processes write their own shards.
        unrecorded_signals: Signals left out of the `signals` column (e.g. teacher prompts: long and derivable).

    Example:
        >>> import tempfile
        >>> writer = TrajectoryWriter(tempfile.mkdtemp(), run_info={"run_id": "demo", "config_hash": "0" * 16})
        >>> writer.next_rollout
        0
    """

    def __init__(
        self, directory: str, *, run_info: Mapping[str, Any], rank: int = 0, unrecorded_signals: Sequence[str] = ()
    ):
        self.directory = directory
        self.run_info = dict(run_info)
        self.rank = rank
        self.unrecorded_signals = tuple(unrecorded_signals)
        self.next_rollout = self._resume()

    def _resume(self) -> int:
        """Remove this rank's interrupted writes; the index after this rank's last complete shard."""
        if not os.path.isdir(self.directory):
            return 0
        last = -1
        for name in sorted(os.listdir(self.directory)):
            temporary = TEMPORARY_PATTERN.match(name)
            if temporary and int(temporary.group(2)) == self.rank:
                os.remove(os.path.join(self.directory, name))
                logger.warning(
                    "Removed %s: the write of this trajectory shard was interrupted (the run crashed). The shards "
                    "before it are complete; this one's rollout is lost.", os.path.join(self.directory, name)
                )
            shard = SHARD_PATTERN.match(name)
            if shard and int(shard.group(2)) == self.rank:
                last = max(last, int(shard.group(1)))
        return last + 1

    def write(
        self,
        batch: RolloutBatch,
        advantages: Mapping[tuple[int, int], Sequence[float]] | None = None,
        global_step: int = 0,
    ) -> str:
        """Write `batch` as the next shard and return its path.

        Args:
            batch: The rollout, every episode included (failed ones too).
            advantages: (group index, episode id) -> one advantage per step the episode owns (all its steps,
                unless it forked from a parent), None for a step that was not trained; episodes missing from it get
                null on every step.
            global_step: Optimizer steps completed when the rollout was generated.
        """
        rollout = self.next_rollout
        rows = self.rows(batch, advantages or {}, rollout=rollout, global_step=global_step)
        table = pa.Table.from_pylist(rows, schema=TRAJECTORY_SCHEMA)
        name = f"shard-{rollout:06d}-rank{self.rank:02d}.parquet"
        path = atomic_write(os.path.join(self.directory, name), lambda handle: pq.write_table(table, handle))
        self.next_rollout = rollout + 1
        return path

    def rows(
        self,
        batch: RolloutBatch,
        advantages: Mapping[tuple[int, int], Sequence[float]],
        *,
        rollout: int,
        global_step: int,
    ) -> list[dict[str, Any]]:
        """The shard rows of `batch`: `RolloutBatch.to_rows()` plus the run's and the rollout's columns."""
        from .rollout.prompts import tools_column
        columns = ("group_id", "episode_uid", "env", "role", "action", "advantage", "prompt", "completion", "tools")
        conversation = (self.run_info.get("config") or {}).get("row_format") == "conversation"
        extra: dict[str, list[Any]] = {name: [] for name in columns}
        for group_index, group in enumerate(batch.groups):
            group_id = f"{rollout}-{self.rank}-{group_index}"
            for trajectory in group.trajectories:
                values = advantages.get((group_index, trajectory.episode_id))
                for index, step in enumerate(trajectory.owned_steps or [None]):  # to_rows' order, one row per step
                    extra["group_id"].append(group_id)
                    extra["episode_uid"].append(f"{group_id}-{trajectory.episode_id}")
                    env = trajectory.task.get("env") or self.run_info.get("env")
                    extra["env"].append(None if env is None else str(env))
                    role = step.info.get(INFO_ROLE) if step is not None and isinstance(step.info, dict) else None
                    extra["role"].append(role if isinstance(role, str) and role else DEFAULT_ROLE)
                    extra["action"].append("" if step is None else canonical_action(step))
                    value = values[index] if values and step is not None else None
                    extra["advantage"].append(None if value is None else float(value))
                    prompt, completion = step_chat(trajectory, trajectory.fork_step + index, conversation)
                    extra["prompt"].append(prompt)
                    extra["completion"].append(completion)
                    parts = step.prompt_parts if step is not None else None
                    extra["tools"].append(tools_column(parts.tools) if parts is not None and parts.tools else None)
        common = {
            "run_id": self.run_info.get("run_id"),
            "config_hash": self.run_info.get("config_hash"),
            "method": self.run_info.get("method"),
            "rollout": rollout,
            "rank": self.rank,
            "global_step": global_step,
        }
        return [{**common, **row} for row in batch.to_rows(extra, skip_signals=self.unrecorded_signals)]


def step_chat(trajectory, index: int, conversation: bool = False) -> tuple[list[dict], list[dict]]:
    """The chat of step `index` of `trajectory` as the policy saw it, in TRL's conversational prompt-completion format:
    (prompt messages, [the assistant's reply]); ([], []) for a step without a recorded prompt (a failed episode, or a
    step rebuilt from rows). Step rows: the prompt `PromptRenderer.step_messages` rendered (system, task, history window,
    observation). Conversation rows (`conversation=True`): the episode's chat so far (system, task and first
    observation, then each earlier reply and the observation that followed it).

    >>> from trl_agents.trajectory import PromptParts, Step, Trajectory
    >>> step = Step("P F G", "right", prompt_parts=PromptParts("Reach G.", "", (), "P F G"))
    >>> prompt, completion = step_chat(Trajectory(task={}, steps=[step]), 0)
    >>> [m["role"] for m in prompt], completion
    (['system', 'user'], [{'role': 'assistant', 'content': 'right'}])
    """
    from .rollout.prompts import PromptRenderer

    steps = trajectory.steps
    if index >= len(steps) or steps[index].prompt_parts is None:
        return [], []
    step, parts = steps[index], steps[index].prompt_parts
    if not conversation:
        prompt = PromptRenderer.step_messages(parts.system, parts.task, parts.history, parts.observation)
    else:
        prompt = [{"role": "system", "content": parts.system}] if parts.system else []
        prompt.append({"role": "user", "content": PromptRenderer.conversation_user_message(parts.task,
                                                                                           parts.observation)})
        for turn in range(1, index + 1):
            prompt.append({"role": "assistant", "content": steps[turn - 1].action_text})
            prompt.append({"role": "user", "content": steps[turn].observation})
    return prompt, [{"role": "assistant", "content": step.action_text}]


def supersede_shards(directory: str, global_step: int) -> list[str]:
    """Move the shards of rollouts generated at `global_step` or later out of the dataset, into a new folder
    `directory/superseded/resume-{global_step}-{time}/` (kept, not deleted), and remove interrupted writes; return
    the moved paths. A run resumed from the checkpoint of step `global_step` generates those rollouts again, so
    leaving them would record their steps twice.

    >>> import tempfile
    >>> supersede_shards(tempfile.mkdtemp(), 3)
    []
    """
    if not os.path.isdir(directory):
        return []
    for name in os.listdir(directory):
        if TEMPORARY_PATTERN.match(name):
            os.remove(os.path.join(directory, name))
    later = []
    for path in shard_files(directory):
        steps = pq.read_table(path, columns=["global_step"]).column("global_step").to_pylist()
        if steps and max(steps) >= global_step:
            later.append(path)
    if not later:
        return []
    target = os.path.join(directory, "superseded", f"resume-{global_step}-{time.strftime('%Y%m%d-%H%M%S')}")
    os.makedirs(target, exist_ok=True)
    moved = []
    for path in later:
        moved.append(os.path.join(target, os.path.basename(path)))
        os.replace(path, moved[-1])
    logger.warning(
        "Resuming at step %d: moved %d trajectory shard(s) of rollouts generated after that checkpoint to %s (the "
        "resumed run generates them again).", global_step, len(moved), target
    )
    return moved


def shard_files(directory: str) -> list[str]:
    """The complete shards of a trajectories folder, in (rollout, rank) order (temporary files excluded)."""
    found = []
    for name in os.listdir(directory):
        match = SHARD_PATTERN.match(name)
        if match:
            found.append(((int(match.group(1)), int(match.group(2))), os.path.join(directory, name)))
    return [path for _, path in sorted(found)]


# ---- loading and replay -----------------------------------------------------------------------------------------


def load_trajectories(source: str, split: str = "train") -> Dataset:
    """Load a trajectory dataset: from a run directory, its `trajectories/` folder, one shard, or the Hub.

    Args:
        source: A run directory (a trainer's `output_dir`), its `trajectories/` folder, a `.parquet` shard, or
            anything `datasets.load_dataset` accepts (a Hub dataset repo id such as `"user/sokoban-gigpo-traj"`, a
            local dataset folder).
        split: The split to load from the Hub (or a local dataset folder).

    Returns:
        A `datasets.Dataset` with one row per step, in (rollout, rank, step) order for local shards (read into
        memory; incomplete shards of a running or crashed run are not read).

    Example:
        ```python
        from trl_agents.records import load_trajectories

        steps = load_trajectories("outputs/sokoban-gigpo")  # or "user/sokoban-gigpo-trajectories"
        solved = steps.filter(lambda row: row["success"])
        ```
    """
    source = os.fspath(source)
    if os.path.isfile(source):
        files = [source]
    elif os.path.isdir(os.path.join(source, TRAJECTORIES_DIR)):
        files = shard_files(os.path.join(source, TRAJECTORIES_DIR))
        if not files:
            raise ValueError(
                f"{os.path.join(source, TRAJECTORIES_DIR)!r} holds no complete trajectory shard "
                "(shard-*-rank*.parquet): the run wrote none yet, or ran with save_trajectories=False."
            )
    elif os.path.isdir(source) and shard_files(source):
        files = shard_files(source)
    else:
        from datasets import load_dataset

        return load_dataset(source, split=split)
    # Read into memory rather than through `load_dataset("parquet")`, which would first copy every shard into the
    # datasets cache (our choice: the shards are already local and columnar).
    return Dataset(pa.concat_tables([pq.read_table(path) for path in files]))


def sft_examples(
    dataset: Dataset | str,
    tokenizer=None,
    *,
    only_successful: bool = True,
    min_return: float | None = None,
    row_format: str = "step",
) -> Dataset:
    """Replay recorded trajectories into supervised examples for TRL's `SFTTrainer` (an SFT warm start).

    Episodes that failed (`error`), and unless `only_successful=False` those that did not solve their task, are left
    out, as are episodes whose return is below `min_return`. Rejected (invalid) actions are never trained on.

    Args:
        dataset: Trajectory rows (`load_trajectories` output), or a source `load_trajectories` accepts.
        tokenizer: None: token-exact examples, `{"input_ids", "assistant_masks"}` (SFTTrainer's pre-tokenized
            format: trained only where the mask is 1), exactly the tokens the policy saw and generated; the model
            must use the recording policy's tokenizer. A tokenizer: decoded `{"prompt", "completion"}` text pairs
            (step format only), which SFTTrainer tokenizes again.
        only_successful: Keep only episodes that solved their task.
        min_return: Keep only episodes with at least this return.
        row_format: `"step"`: one example per valid step (prompt = the recorded prompt, completion = the action).
            `"conversation"`: one example per episode, the whole recorded conversation with every valid action
            trained on (trajectories recorded with `row_format="conversation"` only).

    Example:
        ```python
        from trl_agents.records import sft_examples
        from trl_agents.warmstart import warm_start

        examples = sft_examples("outputs/sokoban-gigpo")  # successful episodes of a run, token for token
        warm_start(model, tokenizer, examples, output_dir="warm-start", max_steps=200)
        ```
    """
    if row_format not in ("step", "conversation"):
        raise ValueError(f"row_format must be 'step' or 'conversation', got {row_format!r}")
    if row_format == "conversation" and tokenizer is not None:
        raise ValueError(
            "row_format='conversation' replays tokens only (decoded text cannot keep the environment's turns out of "
            "the loss): pass tokenizer=None."
        )
    if isinstance(dataset, (str, os.PathLike)):
        dataset = load_trajectories(dataset)
    needed = ["run_id", "episode_uid", "step", "valid", "success", "error", "episode_return", "prompt_ids",
              "action_ids", "env_ids"]
    missing = [name for name in needed if name not in dataset.column_names]
    if missing:
        raise ValueError(
            f"Not a trl-agents trajectory dataset: it lacks the columns {', '.join(missing)} "
            "(see trl_agents.records for the schema)."
        )
    episodes: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in dataset.select_columns(needed):
        kept = (
            row["error"] is None
            and row["step"] >= 0
            and (row["success"] or not only_successful)
            and (min_return is None or row["episode_return"] >= min_return)
        )
        if kept:
            episodes.setdefault((row["run_id"], row["episode_uid"]), []).append(row)
    examples = []
    for steps in episodes.values():
        steps.sort(key=lambda row: row["step"])
        if row_format == "conversation":
            examples.append(_conversation_example(steps))
            continue
        for row in steps:
            if row["valid"] and row["action_ids"]:
                examples.append(_step_example(row, tokenizer))
    examples = [example for example in examples if example is not None]
    if not examples:
        columns = ("input_ids", "assistant_masks") if tokenizer is None else ("prompt", "completion")
        return Dataset.from_dict({name: [] for name in columns})
    return Dataset.from_list(examples)


def _step_example(row: dict[str, Any], tokenizer) -> dict[str, Any]:
    prompt, action = row["prompt_ids"], row["action_ids"]
    if tokenizer is not None:
        return {"prompt": tokenizer.decode(prompt), "completion": tokenizer.decode(action)}
    return {"input_ids": prompt + action, "assistant_masks": [0] * len(prompt) + [1] * len(action)}


def _conversation_example(steps: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The episode's conversation: each step's prompt is the previous one extended by its action and environment
    tokens; valid actions are trained on, invalid ones and environment turns are context."""
    input_ids = list(steps[0]["prompt_ids"])
    mask = [0] * len(input_ids)
    for row in steps:
        if row["prompt_ids"] != input_ids:
            raise ValueError(
                f"Episode {row['episode_uid']!r} was not recorded in conversation format (step {row['step']}'s "
                "prompt does not extend the previous turn): replay it with row_format='step'."
            )
        train = 1 if row["valid"] else 0
        input_ids += row["action_ids"] + row["env_ids"]
        mask += [train] * len(row["action_ids"]) + [0] * len(row["env_ids"])
    return {"input_ids": input_ids, "assistant_masks": mask} if any(mask) else None
