"""Environments for the execution-backend tests, in a module of their own: worker processes and Ray actors import the
environment class by module and name, so it must live in an importable module (conftest.py is not one to re-run).

The action text decides how a step behaves, so a scripted policy picks which episode hangs or crashes:
`"hang"` blocks (until `RELEASE` is set, in this process), `"crash"` ends the process with `os._exit(3)` (worker
backends only: it would end the test run on the thread backend), `"raise"` raises, anything else is a normal step
that takes `delay` seconds. A task may name a `hang_marker` file: the first step of all episodes that creates it
hangs (one hanging episode per rollout whatever the policy says, for training runs with a sampled policy).
"""

from __future__ import annotations

import os
import threading
import time

from trl_agents.envs import AgentEnv, VerifierAtom, register_env
from trl_agents.envs.frozenlake import FrozenLake

RELEASE = threading.Event()  # set it to let hung steps of this process return


@register_env
class SleepyEnv(AgentEnv):
    name = "test-sleepy"
    instructions = "Say good things."
    task_keys = ("seed",)

    def __init__(self, delay: float = 0.0, hang_seconds: float = 600.0):
        self.delay = delay
        self.hang_seconds = hang_seconds
        self.pid = os.getpid()

    def reset(self, task):
        self.seed = task["seed"]
        self.length = task.get("length", 3)
        self.marker = task.get("hang_marker")
        self.turn = 0
        return f"Round 0 of task {self.seed}."

    def step(self, action_text):
        action = action_text.strip()
        if action == "hang" or self._claims_marker():
            RELEASE.wait(self.hang_seconds)
        elif action == "crash":
            os._exit(3)
        elif action == "raise":
            raise RuntimeError("the environment broke")
        time.sleep(self.delay)
        self.turn += 1
        reward = 1.0 if "good" in action else 0.0
        done = self.turn >= self.length
        info = {"valid": True, "success": done and reward > 0, "pid": os.getpid(), "lock": threading.Lock()}
        return f"Round {self.turn} of task {self.seed}.", reward, done, info

    def _claims_marker(self) -> bool:
        if not self.marker:
            return False
        try:
            os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            return False
        return True

    def state_key(self):
        return (self.seed, self.turn)

    def snapshot(self):
        return {"seed": self.seed, "turn": self.turn, "length": self.length}

    def restore(self, snapshot):
        self.seed, self.turn, self.length = snapshot["seed"], snapshot["turn"], snapshot["length"]


@register_env
class BrokenEnv(AgentEnv):
    """Its constructor fails: every episode that needs it fails at reset."""

    name = "test-unbuildable"

    def __init__(self):
        raise RuntimeError("cannot build this environment")

    def reset(self, task):
        return ""

    def step(self, action_text):
        return "", 0.0, True, {}


@register_env
class LoneEnv(SleepyEnv):
    """A SleepyEnv that may not be stepped on two threads at once: it records how many of its steps overlapped."""

    name = "test-lone"
    thread_safe = False
    active = 0
    most_active = 0
    _count_lock = threading.Lock()

    def step(self, action_text):
        cls = type(self)
        with cls._count_lock:
            cls.active += 1
            cls.most_active = max(cls.most_active, cls.active)
        try:
            return super().step(action_text)
        finally:
            with cls._count_lock:
                cls.active -= 1


@register_env
class VerifiedLake(FrozenLake):
    """FrozenLake with a one-atom `verify()` (at the goal or not): verifier atoms recorded through every backend."""

    name = "test-verified-lake"

    def verify(self):
        return [VerifierAtom("at_goal", "sat" if self.solver_value() == 0 else "unsat", None, [])]
