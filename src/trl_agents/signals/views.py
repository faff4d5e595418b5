"""Privileged views: the prompt a teacher sees for a recorded step, with the student's own action ids after it.

A view takes the inputs the step's prompt was rendered from (`Step.prompt_parts`: system, task, history window,
observation), adds privileged text, and renders it with the same chat template; the teacher then scores the very
action ids the student generated, token for token (`signals.model.TeacherLogprobs`). Sources of the privileged text:

* `"env"`: `env.privileged_context()` before the step (the `privileged_context` environment signal: ALFWorld's
  expert plan, Search-QA's gold answer and evidence, WebShop-lite's target product, TextCraft's recipe tree, ...);
* `"task:<field>"`: a field of the task row (e.g. `"task:answer"` for a dataset that carries the gold answer);
* `"future"`: the observations that followed the step in its own episode (hindsight);
* a callable `source(trajectory, step_index) -> str`.

In step format every step gets its own teacher prompt. In conversation format a whole episode is one row, so the
teacher prompt is the episode's first prompt with the privileged text of its first step (our choice: the text of
later steps cannot be inserted into a prompt that precedes them without re-rendering the whole conversation).

Example:
    >>> from trl_agents.rollout.prompts import PromptRenderer
    >>> from trl_agents.signals.views import PrivilegedView
    >>> from trl_agents.testing import build_tiny_tokenizer
    >>> from trl_agents.trajectory import PromptParts, Step, Trajectory
    >>> renderer = PromptRenderer(build_tiny_tokenizer())
    >>> step = Step("P F G", "right", prompt_parts=PromptParts("Reach G.", "", (), "P F G"),
    ...             signals={"privileged_context": "Go right twice."})
    >>> view = PrivilegedView(renderer, source="env")
    >>> view.user_message(Trajectory(task={}, steps=[step]), 0)
    'Privileged information for this task:\\nGo right twice.\\n\\nP F G'
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..trajectory import Trajectory

PrivilegedSource = str | Callable[[Trajectory, int], str]
SOURCES = ("env", "task:<field>", "future")
DEFAULT_TEMPLATE = "Privileged information for this task:\n{context}\n\n{prompt}"
"""Our choice (as SDAR's skills prompt, the privileged text comes first): `{context}` is the privileged text and
`{prompt}` the user message the student saw."""


class PrivilegedView:
    """Renders teacher prompts for recorded steps.

    Args:
        renderer: The trainer's `PromptRenderer` (rollout/prompts.py; same chat template and template kwargs as the rollout).
        source: Where the privileged text comes from (see the module docstring).
        template: How the privileged text and the student's user message combine (`{context}`, `{prompt}`).
        row_format: `"step"` or `"conversation"`, as the rollout.
    """

    def __init__(
        self,
        renderer: Any,
        source: PrivilegedSource = "env",
        template: str = DEFAULT_TEMPLATE,
        row_format: str = "step",
    ):
        check_source(source)
        check_template(template)
        self.renderer = renderer
        self.source = source
        self.template = template
        self.row_format = row_format

    def context(self, trajectory: Trajectory, index: int) -> str:
        """The privileged text for step `index` of `trajectory`."""
        step = trajectory.steps[index]
        if callable(self.source):
            return str(self.source(trajectory, index))
        if self.source == "env":
            if "privileged_context" not in step.signals:
                raise ValueError(
                    "A privileged view with source 'env' needs step.signals['privileged_context']: declare the "
                    "'privileged_context' signal (teacher_logprobs does) on an environment with that capability."
                )
            return str(step.signals["privileged_context"])
        if self.source == "future":
            return "\n".join(later.observation for later in trajectory.steps[index + 1 :])
        field = self.source.split(":", 1)[1]
        if field not in trajectory.task:
            raise ValueError(f"privileged_source {self.source!r}: the task row has no field {field!r}")
        return str(trajectory.task[field])

    def user_message(self, trajectory: Trajectory, index: int) -> str:
        """The teacher's user message for step `index` (conversation format: the episode's first message)."""
        from ..rollout.prompts import PromptRenderer  # (rollout imports signals)

        parts = self._parts(trajectory, index)
        if self.row_format == "conversation":
            prompt = PromptRenderer.conversation_user_message(parts.task, parts.observation)
        else:
            prompt = PromptRenderer.step_user_message(parts.task, parts.history, parts.observation)
        return self.template.format(context=self.context(trajectory, index), prompt=prompt)

    def prompt_ids(self, trajectory: Trajectory, index: int) -> list[int]:
        """Token ids of the teacher prompt for step `index` (step format), or for the episode (conversation format:
        pass its first step); the student's action ids follow it unchanged."""
        parts = self._parts(trajectory, index)
        messages = [{"role": "system", "content": parts.system}] if parts.system else []
        messages.append({"role": "user", "content": self.user_message(trajectory, index)})
        return self.renderer.messages_ids(messages, parts.tools)

    @staticmethod
    def _parts(trajectory: Trajectory, index: int):
        parts = trajectory.steps[index].prompt_parts
        if parts is None:
            raise ValueError(
                "A privileged view needs the step's prompt_parts (recorded by the rollout engine); steps rebuilt from "
                "records have none."
            )
        return parts


def check_template(template: str) -> None:
    """Raise a one-line ValueError naming `privileged_template` unless it formats with exactly `{context}` and
    `{prompt}` (other fields, or stray braces, would fail only after a whole rollout)."""
    if "{context}" not in template or "{prompt}" not in template:
        raise ValueError(f"privileged_template must contain '{{context}}' and '{{prompt}}', got {template!r}")
    try:
        template.format(context="", prompt="")
    except (KeyError, IndexError, ValueError) as err:
        raise ValueError(
            f"privileged_template must format with only {{context}} and {{prompt}} (double other braces: '{{{{'), "
            f"got {template!r}: {type(err).__name__}: {err}"
        ) from None


def check_source(source: PrivilegedSource) -> None:
    """Raise a ValueError naming the allowed sources when `source` is not one."""
    if callable(source) or source in ("env", "future") or (isinstance(source, str) and source.startswith("task:")
                                                           and len(source) > len("task:")):
        return
    raise ValueError(
        f"privileged_source must be 'env', 'future', 'task:<field>' or a callable (trajectory, step) -> str, "
        f"got {source!r}"
    )
