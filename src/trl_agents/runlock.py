"""One run at a time per output folder: two runs writing one `output_dir` would overwrite each other's trajectory
shards, checkpoints and final files without a word.

`hold_output_dir(output_dir)` takes an exclusive `fcntl.flock` on `output_dir/.trl-agents.lock` for as long as the
run lasts (`trl-agents train`'s whole job, evaluations included, and every `AgentGRPOTrainer.train()`), and writes
the holder's pid, host and start time into it. A second run into the folder is refused with one line naming the
folder and that process (`OutputDirInUse`, a ValueError). The lock is the kernel's: it ends with the process that
holds it, however it ends (SIGKILL included), so the lock file a killed run leaves behind is stale and the next run
takes it over. A clean end removes the file.

* Re-entrant within a process: `trl-agents train` holds it and its trainer's `train()` takes it again.
* Under `accelerate launch` only the main process takes it (`main_process=False` elsewhere); with `distributed=True`
  every process learns whether it got it, so a refused launch stops on every rank.
* Forked children (environment workers) do not keep it: their copy of the descriptor is closed after the fork.
* A filesystem that cannot lock (some network mounts) gets a warning, and the run goes on unlocked.

Example:
    >>> import tempfile
    >>> folder = tempfile.mkdtemp()
    >>> with hold_output_dir(folder):
    ...     with hold_output_dir(folder):  # the same process may take it again
    ...         pass
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Iterator

logger = logging.getLogger(__name__)

LOCK_NAME = ".trl-agents.lock"


class OutputDirInUse(ValueError):
    """Another process holds the output folder's lock: the message names the folder and that process. A ValueError, so
    `trl-agents` prints it as one line."""


_held: dict[str, list] = {}  # real path of output_dir -> [descriptor, depth]
_guard = threading.Lock()


def _close_in_child() -> None:
    for entry in _held.values():  # the parent's lock stays: it belongs to the parent's descriptor too
        with contextlib.suppress(OSError):
            os.close(entry[0])
    _held.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_in_child)


def _holder(path: str) -> dict:
    try:
        with open(path) as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return {}


def _describe(holder: dict) -> str:
    if not holder.get("pid"):
        return "a process that is starting"
    return f"pid {holder['pid']} on {holder.get('host', '?')}, since {holder.get('started', '?')}"


def acquire(output_dir: str) -> str | None:
    """Take the lock on `output_dir` (created when missing) for this process; return its key for `release`, or None
    when the filesystem cannot lock. Raises `OutputDirInUse` when another process holds it."""
    os.makedirs(output_dir, exist_ok=True)
    key = os.path.realpath(output_dir)
    with _guard:
        if key in _held:
            _held[key][1] += 1
            return key
        path = os.path.join(key, LOCK_NAME)
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise OutputDirInUse(
                    f"output_dir {output_dir!r} is in use by another run ({_describe(_holder(path))}; lock file "
                    f"{path}): wait for it to end, or pass another --output_dir"
                ) from None
            except OSError as err:
                os.close(fd)
                if err.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                    logger.warning("Cannot lock output_dir %r (%s): nothing stops a second run from writing into it "
                                   "at the same time.", output_dir, err)
                    return None
                raise
            # A holder that was releasing may have removed the file between our open and our lock: lock the new one.
            try:
                current = os.stat(path)
            except FileNotFoundError:
                current = None
            if current is not None and os.path.samestat(os.fstat(fd), current):
                break
            os.close(fd)
        previous = _holder(path)
        if previous.get("pid"):
            logger.warning("Taking over output_dir %r from a run that ended without releasing it (%s).", output_dir,
                           _describe(previous))
        info = {"pid": os.getpid(), "host": socket.gethostname(),
                "started": time.strftime("%Y-%m-%d %H:%M:%S %z")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
        _held[key] = [fd, 1]
        return key


def release(key: str | None) -> None:
    """Release what `acquire` returned (the lock file is removed by its last holder)."""
    if key is None:
        return
    with _guard:
        entry = _held.get(key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] > 0:
            return
        del _held[key]
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(key, LOCK_NAME))  # while still locked: a waiting run re-checks the path
        os.close(entry[0])


@contextlib.contextmanager
def hold_output_dir(output_dir: str, *, main_process: bool = True, distributed: bool = False) -> Iterator[None]:
    """Hold the lock on `output_dir` for the block (see the module docstring). `main_process`: this process takes it
    (False on the other processes of a launch); `distributed`: share the outcome with every process of the launch."""
    key, refused = None, None
    if main_process:
        try:
            key = acquire(output_dir)
        except OutputDirInUse as err:
            refused = str(err)
    if distributed:
        from accelerate.utils import broadcast_object_list

        refused = broadcast_object_list([refused])[0]
    if refused is not None:
        raise OutputDirInUse(refused)
    try:
        yield
    finally:
        release(key)
