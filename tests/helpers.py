"""Plain helpers shared by test modules: `from helpers import free_port, checkout_env, assert_close` (pytest's default import mode
puts this folder on sys.path, as for `envs_for_pools`)."""

from __future__ import annotations

import math
import os
import socket
from collections.abc import Mapping
from pathlib import Path

import trl_agents

# The folder holding the trl_agents under test (this checkout's `src`), whatever the installed one is.
PACKAGE_PARENT = str(Path(trl_agents.__file__).resolve().parents[1])


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on (free when this returns; tests may run side by side)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def checkout_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """`env` (default: this process's environment) for a subprocess that must import the trl_agents under test: its
    package folder goes first on PYTHONPATH."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join(path for path in (PACKAGE_PARENT, env.get("PYTHONPATH")) if path)
    return env


def assert_close(actual, expected, tol: float = 1e-4) -> None:
    """Advantages `actual` (one list per trajectory) equal `expected` within `tol`, row lengths included."""
    import pytest

    assert [len(row) for row in actual] == [len(row) for row in expected], actual
    for row_a, row_e in zip(actual, expected, strict=True):
        for a, e in zip(row_a, row_e, strict=True):
            assert a == pytest.approx(e, abs=tol), (actual, expected)


def all_finite(advantages) -> bool:
    """No NaN or infinity in advantages (one list per trajectory)."""
    return all(math.isfinite(a) for row in advantages for a in row)


def group_of(*trajectories):
    """The group of `trajectories`, all of task "t" (the hand-computed credit cases)."""
    from trl_agents.trajectory import Group

    return Group(task={"task_id": "t"}, trajectories=list(trajectories))


def train_and_check_moved(trainer, steps: int = 2) -> list[dict]:
    """Train `trainer` (configured for `steps` optimizer steps), assert that it ran them and that some parameter
    moved; return the per-step log entries (those with `env/success_rate`)."""
    import torch

    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    assert trainer.state.global_step == steps
    assert any(not torch.equal(p.detach(), before[n]) for n, p in trainer.model.named_parameters()), "no parameter moved"
    logs = [h for h in trainer.state.log_history if "env/success_rate" in h]
    assert len(logs) == steps
    return logs


def dying_shard_writer(shard: int, exit_code: int = 17) -> str:
    """Python source, to run before a training script in a subprocess, that makes the parquet writer die halfway
    through the `shard`-th shard it writes (1-based): half the bytes written, then `os._exit(exit_code)`, as a crash
    in the middle of a write."""
    return f"""
import io, os
import pyarrow.parquet as pq
real_write_table, shards = pq.write_table, []

def write_then_die(table, where, **kwargs):
    shards.append(where)
    if len(shards) < {shard}:
        return real_write_table(table, where, **kwargs)
    buffer = io.BytesIO()
    real_write_table(table, buffer, **kwargs)
    where.write(buffer.getvalue()[: len(buffer.getvalue()) // 2])
    where.flush()
    os._exit({exit_code})

pq.write_table = write_then_die
"""
