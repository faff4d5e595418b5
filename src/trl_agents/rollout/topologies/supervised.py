"""`supervised`: groups that mix ordinary rollouts with ground-truth-supervised ones (Tool-RL collapse fixes,
arXiv 2606.26027; docs/methods/toolrl.md).

Of the `num_generations` episodes of a task, `replace_num` are teacher-forced on the ground-truth (GT) action of
every turn (off-policy supervision, OPS: `Launch(forced_actions=...)`, the environment is stepped with the GT
actions and rewarded as usual), `hint_num` sample from a prompt whose system message carries a hint
(hint-based guidance, HBG: `Launch(hint=...)`, the recorded prompt is the hint-free one), and the others are
ordinary. With `replace_num = hint_num = 0` it is the independent topology.

The GT of a task comes from its environment (`ground_truth_turns`): reset on the task row, then at every turn the
first action of the solver's `optimal_plan()` or, without a solver, of `expert_plan()` (Search-QA), replayed until
the episode ends. A task without GT (no plan) gets ordinary rollouts in place of its supervised ones
(`topology/no_ground_truth_fraction`). Hints come from a task column (`hint_column`) when given, else from the GT
plan with `plan_hint`'s template. Plans are cached per task. The composition (`group_composition`) and the hint
(`plan_hint`) are pure functions of this module; the Tool-RL loss and task selection are `trl_agents.credit.toolrl`.
Its schedule is "free": every episode is launched in `begin` and nothing is asked afterwards, so no episode waits for
another.

Example:
    >>> from trl_agents.rollout.topologies import get_topology
    >>> topology = get_topology("supervised", replace_num=1, hint_num=1, env_name="searchqa",
    ...                         env_kwargs={"num_entities": 300})
    >>> requests = topology.begin([{"seed": 0, "hops": 2}], num_generations=4)
    >>> [(r.count, r.forced_actions, r.hint is not None) for r in requests]  # doctest: +NORMALIZE_WHITESPACE
    [(2, None, False), (1, ('search[Meshar Vohais born]', 'search[Kibelburg mayor]', 'answer[Geadrurd Quoutaird]'),
      False), (1, None, True)]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...envs.base import has_plans, plan_of
from ...trajectory import task_id
from .base import Launch, Request, RolloutView, Topology


# ---- the group composition and the hint (pure) -----------------------------------------------------------------------


DEFAULT_HINT_TEMPLATE = (
    "A note that may help (you need not follow it): a good sequence of tool calls for this task is {plan}."
)
"""Our choice of HBG hint wording (the paper's hints are LLM-written summaries of the GT tool-call pattern)."""


def group_composition(num_generations: int, replace_num: int = 0, hint_num: int = 0) -> tuple[int, int, int]:
    """(ordinary, teacher-forced, hinted) rollouts of a group of `num_generations`.

    The paper's OPS forces 1 of 8 rollouts, HBG hints 2 of 8; at least one rollout stays ordinary (on-policy).

    >>> group_composition(8, replace_num=1)           # OPS: 7 sampled + 1 on the GT actions
    (7, 1, 0)
    >>> group_composition(8, replace_num=1, hint_num=2)  # both: 8 − 1 − 2 = 5 ordinary
    (5, 1, 2)
    >>> group_composition(8, replace_num=8)
    Traceback (most recent call last):
    ...
    ValueError: toolrl_replace_num + toolrl_hint_num must leave at least one ordinary rollout of num_generations=8, got 8 + 0
    """
    for name, value in (("toolrl_replace_num", replace_num), ("toolrl_hint_num", hint_num)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
    if replace_num + hint_num > num_generations - 1:
        raise ValueError(
            f"toolrl_replace_num + toolrl_hint_num must leave at least one ordinary rollout of "
            f"num_generations={num_generations}, got {replace_num} + {hint_num}"
        )
    return num_generations - replace_num - hint_num, replace_num, hint_num


def plan_hint(plan: Sequence[str], template: str = DEFAULT_HINT_TEMPLATE) -> str:
    """The HBG hint of a task from its GT plan (our template; `{plan}` is replaced by the actions joined by " then ").

    >>> plan_hint(["search[Meshar Vohais born]", "answer[Kibelburg]"])
    'A note that may help (you need not follow it): a good sequence of tool calls for this task is search[Meshar Vohais born] then answer[Kibelburg].'
    """
    actions = [str(a) for a in plan if str(a).strip()]
    if not actions:
        raise ValueError("a hint needs a non-empty ground-truth plan (the environment returned no actions)")
    if "{plan}" not in template:
        raise ValueError(f"toolrl_hint_template must contain '{{plan}}', got {template!r}")
    return template.replace("{plan}", " then ".join(actions))




def ground_truth_turns(
    task: dict[str, Any], env_name: str | None = None, env_kwargs: dict[str, Any] | None = None, max_turns: int = 50
) -> dict[str, Any] | None:
    """The GT episode of a task: `{"system", "task_text", "turns": [(observation, action), ...]}`, or None when the
    environment has no GT for it.

    The environment (`task["env"]`, else `env_name`) is reset on the task row; at every turn the GT action is the
    first action of the environment's plan from the current state (`envs.base.plan_of`: `optimal_plan()` where it has
    a solver, else `expert_plan()`); the episode is replayed with it until done or `max_turns`. A ValueError says so when the
    environment has neither.
    """
    from ...envs import make_env

    name = task.get("env", env_name)
    if name is None:
        raise ValueError("ground truth needs an environment: the task row has no 'env' and no env_name was given")
    env = make_env(name, **(env_kwargs or {}))
    try:
        if not has_plans(type(env)):
            raise ValueError(
                f"environment {name!r} has no ground-truth actions (neither expert_plan() nor optimal_plan()): "
                "turn off the ground-truth switches (toolrl_replace_num, toolrl_sft_every, plan hints) for it"
            )
        observation = env.reset(dict(task))
        episode = {"system": env.instructions, "tools": env.tools, "task_text": env.task_description(), "turns": []}
        for _ in range(max_turns):
            plan = plan_of(env)
            if not plan:
                break
            action = str(plan[0])
            episode["turns"].append((observation, action))
            observation, _, done, _ = env.step(action)
            if done:
                break
        return episode if episode["turns"] else None
    finally:
        env.close()


class SupervisedTopology(Topology):
    """G − k_gt − k_hint ordinary episodes, k_gt teacher-forced on the GT actions, k_hint hinted, per task.

    Args:
        replace_num: k_gt, teacher-forced episodes per task (OPS; the paper: 1 of 8).
        hint_num: k_hint, hinted episodes per task (HBG; the paper: 2 of 8).
        env_name, env_kwargs: How to build a task's environment for its GT (as the trainer's).
        max_turns: Turns of the GT replay (the trainer's `max_turns`).
        hint_column: Task column holding the hint text (the paper's offline LLM-written hints); None: from the plan.
        hint_template: Template of plan hints (`{plan}`: the GT actions).
    """

    name = "supervised"
    schedule = "free"

    def __init__(
        self,
        replace_num: int = 0,
        hint_num: int = 0,
        env_name: str | None = None,
        env_kwargs: dict[str, Any] | None = None,
        max_turns: int = 50,
        hint_column: str | None = None,
        hint_template: str = DEFAULT_HINT_TEMPLATE,
    ):
        for field, value in (("replace_num", replace_num), ("hint_num", hint_num)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{field} must be an integer >= 0, got {value!r}")
        if "{plan}" not in hint_template:
            raise ValueError(f"hint_template must contain '{{plan}}', got {hint_template!r}")
        self.replace_num, self.hint_num = replace_num, hint_num
        self.env_name, self.env_kwargs, self.max_turns = env_name, dict(env_kwargs or {}), max_turns
        self.hint_column, self.hint_template = hint_column, hint_template
        self._cache: dict[str, dict[str, Any] | None] = {}
        self._missing = 0
        self._tasks = 0

    def ground_truth(self, task: dict[str, Any]) -> dict[str, Any] | None:
        """`ground_truth_turns` of a task, cached by task id."""
        key = task_id(task)
        if key not in self._cache:
            self._cache[key] = ground_truth_turns(task, self.env_name, self.env_kwargs, self.max_turns)
        return self._cache[key]

    def plan(self, task: dict[str, Any]) -> tuple[str, ...] | None:
        episode = self.ground_truth(task)
        return None if episode is None else tuple(action for _, action in episode["turns"])

    def hint(self, task: dict[str, Any]) -> str | None:
        if self.hint_column is not None:
            text = task.get(self.hint_column)
            return str(text) if text not in (None, "") else None
        plan = self.plan(task)
        return None if plan is None else plan_hint(plan, self.hint_template)

    def begin(self, tasks: Sequence[dict[str, Any]], num_generations: int) -> list[Request]:
        ordinary, forced, hinted = group_composition(num_generations, self.replace_num, self.hint_num)
        self._missing, self._tasks = 0, len(tasks)
        requests: list[Request] = []
        for index, task in enumerate(tasks):
            plan = self.plan(task) if forced else None
            hint = self.hint(task) if hinted else None
            missing = (forced and plan is None) or (hinted and hint is None)
            self._missing += bool(missing)
            extra = (forced if plan is None else 0) + (hinted if hint is None else 0)
            requests.append(Launch(index, ordinary + extra))
            if forced and plan is not None:
                requests.append(Launch(index, forced, forced_actions=plan))
            if hinted and hint is not None:
                requests.append(Launch(index, hinted, hint=hint))
        return requests

    def stats(self, view: RolloutView) -> dict[str, float]:
        if not self._tasks or not (self.replace_num or self.hint_num):
            return {}
        return {"no_ground_truth_fraction": self._missing / self._tasks}
