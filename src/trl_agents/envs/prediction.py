"""`predict`: any environment, with the agent predicting the next observation next to its action.

The agent answers `<action>...</action><predict>...</predict>`: its action, then the observation it expects the
environment to show next. The wrapper hands the inner environment the answer WITHOUT the prediction blocks (the
environment receives only the action, whatever its parser) and records the prediction in `info["prediction"]`
(None when there is none). It knows nothing of rewards built on the prediction: a trainer compares the prediction
with the observation that followed (the Dark Room study, docs/methods/dark_room.md).

Every other call (state keys, snapshots, solvers, privileged context) goes to the inner environment; `supports`
answers for it, so a capability the inner environment lacks is never called by the rollout.

Example:
    >>> env = PredictionEnv(inner="frozenlake")
    >>> first = env.reset({"seed": 0})
    >>> observation, reward, done, info = env.step("<action>left</action><predict>P F F F</predict>")
    >>> info["action"], info["prediction"], observation == first  # a move off the grid does nothing
    ('left', 'P F F F', True)
    >>> plan = env.optimal_plan()  # the solver's moves, each with the observation it leads to
    >>> plan[0].startswith("<action>right</action><predict>S P F F"), env.state_key() == (0, 0)  # not moved
    (True, True)
"""

from __future__ import annotations

import re
from collections.abc import Hashable
from typing import Any

from .base import AgentEnv
from .registry import get_env_class, make_env, register_env

PREDICTION_TAG = "predict"
FORMAT_INSTRUCTIONS = (
    "Answer format: put your answer inside <action>...</action>, then predict the observation the environment will "
    "show after it inside <{tag}>...</{tag}>, e.g. <action>your answer</action><{tag}>the next observation</{tag}>."
)
"""Our wording, appended to the inner environment's instructions."""


def _blocks(tag: str) -> re.Pattern:
    name = re.escape(tag)
    return re.compile(rf"<{name}>(.*?)(?:</{name}>|$)", re.IGNORECASE | re.DOTALL)


def extract_prediction(text: str, tag: str = PREDICTION_TAG) -> str | None:
    """The content of the last `<tag>...</tag>` block of `text`, stripped (an unclosed last block runs to the end);
    None when there is none.

    >>> extract_prediction("<action>up</action><predict> F P\\nF G </predict>")
    'F P\\nF G'
    >>> extract_prediction("up") is None, extract_prediction("<action>up</action><predict>F P")
    (True, 'F P')
    """
    if not isinstance(text, str):
        return None
    found = list(_blocks(tag).finditer(text))
    return found[-1].group(1).strip() if found else None


def strip_prediction(text: str, tag: str = PREDICTION_TAG) -> str:
    """`text` without its `<tag>...</tag>` blocks: what the inner environment parses.

    >>> strip_prediction("<action>up</action><predict>F P</predict>")
    '<action>up</action>'
    """
    if not isinstance(text, str):
        return text
    return _blocks(tag).sub("", text).strip()


@register_env
class PredictionEnv(AgentEnv):
    """The inner environment `inner` (a registered name, built with the other keyword arguments), its answers split
    into action and prediction (module docstring). Task rows are the inner environment's, with `env="predict"`:
    `PredictionEnv.task_split("train", 8, inner="frozenlake")`; in a config, `env_name: predict` and
    `env_kwargs: {inner: frozenlake, ...}`.

    Args:
        inner: Registry name of the wrapped environment.
        tag: Name of the prediction tag (`predict`: `<predict>...</predict>`).
        **inner_kwargs: Constructor arguments of the inner environment.
    """

    name = "predict"
    instructions = "An environment shown as text. " + FORMAT_INSTRUCTIONS.format(tag=PREDICTION_TAG)

    def __init__(self, inner: str = "frozenlake", tag: str = PREDICTION_TAG, **inner_kwargs: Any):
        if inner == self.name:
            raise ValueError("PredictionEnv cannot wrap itself: set `inner` to another environment's name")
        if not isinstance(tag, str) or not re.fullmatch(r"[A-Za-z_][\w-]*", tag):
            raise ValueError(f"`tag` must be a tag name such as 'predict', got {tag!r}")
        self.inner = make_env(inner, **inner_kwargs)
        self.tag = tag
        self.roles = self.inner.roles
        self.thread_safe = self.inner.thread_safe
        self.instructions = f"{self.inner.instructions}\n{FORMAT_INSTRUCTIONS.format(tag=tag)}"

    def reset(self, task: dict[str, Any]) -> str:
        return self.inner.reset(task)

    def step(self, action_text: str) -> tuple[str, float, bool, dict[str, Any]]:
        prediction = extract_prediction(action_text, self.tag)
        observation, reward, done, info = self.inner.step(strip_prediction(action_text, self.tag))
        info = dict(info or {})
        info["prediction"] = prediction
        return observation, reward, done, info

    def supports(self, capability: str) -> bool:
        return self.inner.supports(capability)

    def task_description(self) -> str:
        return self.inner.task_description()

    def admissible_actions(self) -> list[str] | None:
        return self.inner.admissible_actions()

    def current_role(self) -> str:
        return self.inner.current_role()

    def close(self) -> None:
        self.inner.close()

    # Forwarded capabilities: the class declares them all, `supports` answers for the inner environment.
    def snapshot(self) -> Any:
        return self.inner.snapshot()

    def restore(self, snapshot: Any) -> None:
        self.inner.restore(snapshot)

    def state_key(self) -> Hashable:
        return self.inner.state_key()

    def solver_value(self) -> float:
        return self.inner.solver_value()

    def optimal_plan(self) -> list[str] | None:
        """The inner solver's plan in this wrapper's answer format: `<action>a</action><predict>o</predict>` with
        the observation each action leads to (played on the inner environment, then restored), so that solver
        demonstrations (warm start) teach the format and exact predictions. Without snapshots: `<action>a</action>`
        alone (our choice: a plan must not move the environment)."""
        plan = self.inner.optimal_plan()
        if plan is None:
            return None
        if not self.inner.supports("snapshot"):
            return [f"<action>{action}</action>" for action in plan]
        snapshot = self.inner.snapshot()
        answers = []
        try:
            for action in plan:
                observation, _, done, _ = self.inner.step(action)
                answers.append(f"<action>{action}</action><{self.tag}>{observation}</{self.tag}>")
                if done:
                    break
        finally:
            self.inner.restore(snapshot)
        return answers

    def privileged_context(self) -> str:
        return self.inner.privileged_context()

    @classmethod
    def task_split(cls, split: str, count: int | None = None, inner: str = "frozenlake", tag: str = PREDICTION_TAG,
                   **env_kwargs: Any) -> list[dict[str, Any]]:
        """The inner environment's split, each row naming this wrapper as its environment."""
        rows = get_env_class(inner).task_split(split, count, **env_kwargs)
        return [{**row, "env": cls.name} for row in rows]
