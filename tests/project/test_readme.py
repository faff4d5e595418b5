"""The README's environment example runs as written."""

from __future__ import annotations

import os
import re

README = os.path.join(os.path.dirname(__file__), "..", "..", "README.md")


def test_custom_environment_example():
    text = open(README).read()
    block = next(b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "class GuessNumber" in b)
    namespace: dict = {}
    exec(block, namespace)  # noqa: S102 — our own README
    from trl_agents.envs import make_env

    env = make_env("guess-number")
    assert env.reset({"secret": 42}) == "Make a guess."
    assert env.step("50")[0] == "Lower." and env.step("x")[3] == {"valid": False}
    assert env.step("42")[1:3] == (1.0, True)


def test_check_env_example():
    text = open(README).read()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    namespace: dict = {}
    exec(next(b for b in blocks if "class GuessNumber" in b), namespace)  # noqa: S102
    exec(next(b for b in blocks if "check_env(GuessNumber" in b), namespace)  # noqa: S102
