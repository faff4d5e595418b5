"""Crash-safe file writes: a reader sees the old file or the whole new one, never a part of it.

Example:
    >>> import json, os, tempfile
    >>> from trl_agents.fileio import atomic_write
    >>> path = atomic_write(os.path.join(tempfile.mkdtemp(), "metrics.json"), json.dumps({"step": 1}))
    >>> json.loads(open(path).read())
    {'step': 1}
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import BinaryIO


def atomic_write(
    path: str | os.PathLike,
    data: str | bytes | Callable[[BinaryIO], None],
    *,
    fsync: bool = True,
) -> str:
    """Write `data` to `path` through a hidden temporary file in the same folder, renamed over `path` when complete.

    The temporary file is `.{name}.{pid}.{thread}.tmp`: hidden, so listings of finished files skip it, and the
    writer's own, so several processes or threads may write one path at once (two runs sharing an output_dir, a shared
    cache) and the last rename wins. A process killed mid-write leaves it behind, never a truncated `path`. The
    folder is created when missing.

    Args:
        path: The file to write (replaced when it exists).
        data: Text (written as UTF-8), bytes, or a function that writes into the open binary file, for writers that
            stream (e.g. `lambda handle: pq.write_table(table, handle)`).
        fsync: Sync the file to disk before the rename and the folder after it, so the write also survives a power
            loss, not only a crash of the process.

    Returns:
        `path`, as a string.
    """
    path = os.fspath(path)
    directory, name = os.path.split(path)
    directory = directory or "."
    os.makedirs(directory, exist_ok=True)
    temporary = os.path.join(directory, f".{name}.{os.getpid()}.{threading.get_ident()}.tmp")
    with open(temporary, "wb") as handle:
        if callable(data):
            data(handle)
        else:
            handle.write(data.encode() if isinstance(data, str) else data)
        if fsync:
            handle.flush()
            os.fsync(handle.fileno())  # the data is on disk before the name says the file is complete
    os.replace(temporary, path)
    if fsync:
        _fsync_directory(directory)  # ... and so is the rename
    return path


def _fsync_directory(directory: str) -> None:
    if not hasattr(os, "O_DIRECTORY"):  # Windows cannot open a directory; its rename is durable enough
        return
    descriptor = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
