"""What a run writes next to a checkpoint besides TRL's files, and which checkpoint a run resumes from.

* `agent_config.json` (`save_agent_config` / `load_agent_config`): how the agent sees its environment (environment,
  system prompt, history window, turn budget), so that `trl-agents eval` and the Hub card run a checkpoint as trained.
* `rollout_totals.json` (`save_rollout_totals` / `load_rollout_totals`): what the training rollouts generated so far
  (for `max_generated_tokens`).
* `resolve_checkpoint`: `resume_from_checkpoint` as a path (True = the last `checkpoint-*` of `output_dir`).
"""

from __future__ import annotations

import json
import os
from typing import Any

from transformers.trainer_utils import get_last_checkpoint

from .fileio import atomic_write

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



def save_agent_config(config: Any, directory: str) -> None:
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



ROLLOUT_TOTALS = "rollout_totals.json"  # in every checkpoint: AgentGRPOTrainer.rollout_totals


def save_rollout_totals(totals: dict[str, float], directory: str) -> None:
    """Write the running totals of the training rollouts (generated tokens, env steps, episodes) next to a
    checkpoint, crash-safe."""
    atomic_write(os.path.join(directory, ROLLOUT_TOTALS), json.dumps(totals, indent=2))


def load_rollout_totals(checkpoint: str) -> dict[str, float]:
    """What `save_rollout_totals` wrote in `checkpoint` ({} for a checkpoint without it)."""
    path = os.path.join(checkpoint, ROLLOUT_TOTALS)
    if not os.path.isfile(path):
        return {}
    with open(path) as handle:
        return json.load(handle)


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

