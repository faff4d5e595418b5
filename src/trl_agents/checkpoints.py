"""What a run writes next to a checkpoint besides TRL's files, and which checkpoint a run resumes from.

* `agent_config.json` (`save_agent_config` / `load_agent_config`): how the agent sees its environment (environment,
  system prompt, history window, turn budget), so that `trl-agents eval` and the Hub card run a checkpoint as trained.
* `rollout_totals.json` (`save_rollout_totals` / `load_rollout_totals`): what the training rollouts generated so far
  (for `max_generated_tokens`).
* `resolve_checkpoint`: `resume_from_checkpoint` as a path (True = the last complete `checkpoint-*` of `output_dir`),
  its files checked first (`check_checkpoint`: one line naming a truncated or corrupt file and the fix).
* `finished_message`: the one line said when a checkpoint already reached the end of training (nothing to resume).

A checkpoint is complete once transformers wrote its `trainer_state.json`: `Trainer._save_checkpoint` writes the
model (or adapter), then the optimizer, scheduler, scaler and RNG state, and `trainer_state.json` last. A save
interrupted by a kill, a preemption or a full disk leaves a folder without it (or with a truncated one), or without
weights: `resume_from_checkpoint=true` skips such a folder with a warning naming it.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import shutil
import zipfile
from typing import Any

from .fileio import atomic_write

logger = logging.getLogger(__name__)

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


class CheckpointError(ValueError):
    """A checkpoint that cannot be resumed from (a file of it truncated or corrupt, nothing complete to resume): the
    message names the file and the fix. A ValueError, so `trl-agents` prints it as one line."""


class DiskFullError(OSError, ValueError):
    """The disk filled up while the run wrote its files (a checkpoint, a trajectory shard): the message names the
    folder. An OSError (errno ENOSPC) and a ValueError, so `trl-agents` prints it as one line."""

    def __init__(self, message: str):
        super().__init__(message)
        self.errno = errno.ENOSPC


TRAINER_STATE = "trainer_state.json"
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
_NOT_WEIGHTS = ("training_args.bin",)


def _weights(path: str) -> list[str]:
    """The weight files of a checkpoint folder (model or adapter, safetensors or .bin, sharded or not; a sub-folder
    of another adapter; FSDP's and DeepSpeed's folders), as paths."""
    found = []
    for name in sorted(os.listdir(path)):
        full = os.path.join(path, name)
        if os.path.isdir(full):
            if name.startswith(("pytorch_model_fsdp", "global_step")):
                found.append(full)
            elif os.path.isfile(os.path.join(full, "adapter_model.safetensors")):
                found.append(os.path.join(full, "adapter_model.safetensors"))
        elif name.endswith((".safetensors", ".bin")) and name not in _NOT_WEIGHTS:
            found.append(full)
    return found


def incomplete_reason(path: str) -> str | None:
    """Why `path` is not a complete checkpoint (the signs of an interrupted save), or None when it is one.

    >>> import tempfile
    >>> incomplete_reason(tempfile.mkdtemp())
    'it has no trainer_state.json'
    """
    state = os.path.join(path, TRAINER_STATE)
    if not os.path.isfile(state):
        return f"it has no {TRAINER_STATE}"
    try:
        with open(state) as handle:
            json.load(handle)
    except (ValueError, UnicodeDecodeError):
        return f"its {TRAINER_STATE} is truncated or corrupt"
    if not _weights(path):
        return "it has no model weights"
    return None


def checkpoint_step(path: str) -> int:
    """The global step a checkpoint was saved at (its trainer_state.json)."""
    with open(os.path.join(path, TRAINER_STATE)) as handle:
        return int(json.load(handle).get("global_step", 0))


def _checkpoints(output_dir: str) -> list[str]:
    """The `checkpoint-N` folders of `output_dir`, the last step first."""
    if not os.path.isdir(output_dir):
        return []
    found = [(int(match.group(1)), name) for name in os.listdir(output_dir)
             if (match := _CHECKPOINT.match(name)) and os.path.isdir(os.path.join(output_dir, name))]
    return [os.path.join(output_dir, name) for _, name in sorted(found, reverse=True)]


def _earlier(path: str) -> str:
    """How to resume instead of from the broken checkpoint `path`: the complete checkpoint before it, if any."""
    parent, name = os.path.split(os.path.normpath(path))
    match = _CHECKPOINT.match(name)
    for candidate in _checkpoints(parent):
        step = int(_CHECKPOINT.match(os.path.basename(candidate)).group(1))
        if match and step < int(match.group(1)) and incomplete_reason(candidate) is None:
            return f"--resume_from_checkpoint {candidate}"
    return "none is left: start again without --resume_from_checkpoint"


def _label(path: str, name: str) -> str:
    """`checkpoint-3/optimizer.pt`: a file named with its checkpoint folder."""
    return os.path.join(os.path.basename(os.path.normpath(path)), name)


def _corrupt(path: str, file: str, detail: str) -> CheckpointError:
    return CheckpointError(
        f"{_label(path, os.path.relpath(file, path))} is corrupt or truncated ({detail}): resume from an earlier "
        f"checkpoint ({_earlier(path)})"
    )


def _check_safetensors(file: str) -> str | None:
    """What is wrong with a safetensors file's header, or None: it must parse and its tensors must end where the
    file ends (a truncated file does not)."""
    size = os.path.getsize(file)
    with open(file, "rb") as handle:
        head = handle.read(8)
        if len(head) < 8:
            return f"{size} bytes, no header"
        length = int.from_bytes(head, "little")
        if length > size - 8:
            return f"its header claims {length} bytes, the file has {size}"
        try:
            header = json.loads(handle.read(length))
        except (ValueError, UnicodeDecodeError):
            return "its header does not parse"
    if not isinstance(header, dict):
        return "its header does not parse"
    try:
        end = max((int(entry["data_offsets"][1]) for key, entry in header.items() if key != "__metadata__"),
                  default=0)
    except (KeyError, TypeError, ValueError, IndexError):
        return "its header does not parse"
    if 8 + length + end != size:
        return f"its tensors end at byte {8 + length + end}, the file has {size}"
    return None


def _check_torch_file(file: str) -> str | None:
    """What is wrong with a `torch.save` file (a zip archive), or None: its directory must read (a truncated or
    garbled file fails) and hold the pickle."""
    try:
        with zipfile.ZipFile(file) as archive:
            names = archive.namelist()
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as err:
        return f"not a readable torch archive: {err}"
    if not any(name.endswith("data.pkl") for name in names):
        return "a zip archive without the torch pickle"
    return None


def check_checkpoint(path: str) -> None:
    """Check what can be checked cheaply before resuming from `path`: `trainer_state.json` parses, each safetensors
    header reads and matches the file's size, each torch file (`optimizer.pt`, `scheduler.pt`, `rng_state*.pth`,
    `*.bin` weights) is a readable archive. Raises a one-line `CheckpointError` naming the file and the fix (an earlier
    checkpoint), instead of the loaders' tracebacks at resume time."""
    state = os.path.join(path, TRAINER_STATE)
    try:
        with open(state) as handle:
            json.load(handle)
    except (ValueError, UnicodeDecodeError) as err:
        raise _corrupt(path, state, f"{err}") from None
    files = [os.path.join(path, name) for name in sorted(os.listdir(path))]
    files += [file for folder in _weights(path) if os.path.isdir(folder) for file in
              (os.path.join(folder, name) for name in sorted(os.listdir(folder)))]
    files += [file for file in _weights(path) if os.path.isfile(file)]
    for file in dict.fromkeys(files):
        name = os.path.basename(file)
        if not os.path.isfile(file) or name in _NOT_WEIGHTS:
            continue
        if name.endswith(".safetensors"):
            problem = _check_safetensors(file)
        elif name.endswith((".pt", ".pth", ".bin")):
            problem = _check_torch_file(file)
        else:
            continue
        if problem is not None:
            raise _corrupt(path, file, problem)


_LOADED_STATE = ("optimizer", "scheduler", "scaler", "rng_state")  # the torch files transformers loads on resume


def find_corrupt_file(path: str) -> CheckpointError | None:
    """After a resume from `path` failed while loading it: the one-line error naming the file that does not load
    (`check_checkpoint`'s checks, then each torch state file loaded as transformers loads it, `weights_only`), or
    None when every file loads (the failure is not a corrupt file). Slower than `check_checkpoint`: for the error
    path."""
    import torch
    from transformers.trainer_pt_utils import safe_globals  # the numpy types of rng_state.pth, as transformers loads it

    try:
        check_checkpoint(path)
    except CheckpointError as err:
        return err
    for name in sorted(os.listdir(path)):
        file = os.path.join(path, name)
        if name.startswith(_LOADED_STATE) and name.endswith((".pt", ".pth")) and os.path.isfile(file):
            try:
                with safe_globals():
                    torch.load(file, map_location="cpu", weights_only=True, mmap=True)
            except Exception as err:  # noqa: BLE001 - any failure to load it names it
                text = re.sub(r"\x1b\[[0-9;]*m", "", str(err))  # (torch's message has terminal bold)
                detail = next((line.strip() for line in text.splitlines() if line.strip()), "")
                detail = detail.split(". ")[0].rstrip(".")[:160]
                return _corrupt(path, file, f"{type(err).__name__}: {detail}" if detail else type(err).__name__)
    return None


_DISK_FULL = ("no space left on device", "disk quota exceeded", "storagefull", "os error 28", "unexpected pos",
              "file write failed")
_NEARLY_FULL = 16 * 2**20  # bytes free, below which a failed write is taken for a full disk


def is_disk_full(err: BaseException, folder: str | None = None) -> bool:
    """Whether `err` (or an error it was raised from) comes from a write that ran out of disk space: errno ENOSPC or
    EDQUOT, or the messages of torch's zip writer ("unexpected pos ...") and safetensors; or, for a write in `folder`
    whose error says nothing of it (torch's "basic_ios::clear: iostream error"), a RuntimeError or OSError while that
    disk has (almost) nothing free."""
    seen: set[int] = set()
    chain = err
    while chain is not None and id(chain) not in seen:
        seen.add(id(chain))
        if isinstance(chain, OSError) and chain.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", -1)):
            return True
        if any(sign in str(chain).lower() for sign in _DISK_FULL):
            return True
        chain = chain.__cause__ or chain.__context__
    if folder is None or not isinstance(err, RuntimeError | OSError):
        return False
    try:
        return shutil.disk_usage(folder).free < _NEARLY_FULL
    except OSError:
        return False


def resolve_checkpoint(resume_from_checkpoint: str | bool | None, output_dir: str) -> str | None:
    """The checkpoint directory a run resumes from: a path; True (or "true", as the command line spells it) = the last
    complete `checkpoint-*` of `output_dir` (an incomplete one, left by a save that was interrupted, is skipped with a
    warning naming it); None, False or "false" = none. The checkpoint's files are checked (`check_checkpoint`). A
    one-line error when there is nothing to resume or a file is broken.

    >>> resolve_checkpoint(None, "out") is None and resolve_checkpoint("false", "out") is None
    True
    """
    value = resume_from_checkpoint
    if isinstance(value, str) and value.strip().lower() in ("true", "false", "none", ""):
        value = {"true": True}.get(value.strip().lower())
    if value is None or value is False:
        return None
    if value is True:
        candidates = _checkpoints(output_dir)
        if not candidates:
            raise CheckpointError(
                f"resume_from_checkpoint=true, but output_dir {output_dir!r} has no checkpoint-* folder to resume "
                "from: pass a checkpoint path, or start without --resume_from_checkpoint."
            )
        for candidate in candidates:
            reason = incomplete_reason(candidate)
            if reason is None:
                check_checkpoint(candidate)
                return candidate
            logger.warning("Skipping %s: an incomplete checkpoint (%s; its save was interrupted): resuming from the "
                           "checkpoint before it.", candidate, reason)
        raise CheckpointError(
            f"resume_from_checkpoint=true, but no checkpoint-* folder of output_dir {output_dir!r} is complete (each "
            "save was interrupted): start again without --resume_from_checkpoint."
        )
    path = os.fspath(value)
    named = _CHECKPOINT.match(os.path.basename(os.path.normpath(path))) is not None
    if not os.path.isdir(path) or not (named or os.path.exists(os.path.join(path, TRAINER_STATE)) or _weights(path)):
        raise CheckpointError(
            f"resume_from_checkpoint={path!r} is not a checkpoint folder (it has no {TRAINER_STATE}): pass a "
            f"checkpoint-* folder of a run, or true for the last one of output_dir."
        )
    reason = incomplete_reason(path)
    if reason is not None and not reason.startswith(f"its {TRAINER_STATE}"):
        raise CheckpointError(
            f"resume_from_checkpoint={path!r} is an incomplete checkpoint ({reason}; its save was interrupted): "
            f"resume from an earlier checkpoint ({_earlier(path)})."
        )
    check_checkpoint(path)
    return path


def finished_message(checkpoint: str, args: Any) -> str | None:
    """The one line to say when `checkpoint` already reached the end of the training `args` ask for (`max_steps`, or
    the epochs of its own run), so that resuming it has nothing to train; None when steps are left."""
    with open(os.path.join(checkpoint, TRAINER_STATE)) as handle:
        state = json.load(handle)
    step = int(state.get("global_step", 0))
    if args.max_steps is not None and args.max_steps > 0:
        if step < args.max_steps:
            return None
        limit = f"max_steps={args.max_steps}"
    else:
        planned = int(state.get("max_steps") or 0)
        if not planned or step < planned or args.num_train_epochs > float(state.get("num_train_epochs") or 0):
            return None
        limit = f"num_train_epochs={args.num_train_epochs:g}"
    return (f"nothing to do: {checkpoint} is at step {step}, the end of training ({limit}); the run is finished and "
            f"was left unchanged (raise --max_steps to train further)")
