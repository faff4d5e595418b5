"""`parallel`: K copies of any environment on the same task, driven by one answer per turn (DPEPO's paradigm).

The agent answers `<think>…</think><parallel><env_1>action</env_1><env_3>other action</env_3></parallel>`: one
action for each copy it chooses to act in (any subset of 1..K). Every copy starts from the same task and then
changes only through its own actions. The wrapper steps the copies named in the answer with their action (the inner
environment parses it as usual), and returns:

* reward: the best reward among the copies acted in this turn (0 for a turn without any action);
* done: as soon as one copy solves the task (the parallel episode succeeds, "OR" success), or once every copy has
  ended without solving it;
* observation: the initial observation, each copy's earlier actions and observations ("Action n / Observation n"),
  and, for each copy acted in last turn, its action, observation and (when the inner environment lists them) its
  admissible actions, ending with how many copies the agent may use. The wrapper shows its own history, so train
  with `history_length: 0`.
* info: `env_actions` ([[i, action], ...] as parsed, in written order), `applied` (the copies actually stepped),
  `env_rewards`, `env_valid`, `invalid_count` (stepped sub-actions the inner environment rejected), `num_envs` —
  what DPEPO's diversity weight is computed from (`trl_agents.credit.dpepo`).

An action for a copy outside 1..K, or for a copy that has ended, is not applied (the next observation says so).
Snapshots hold the K inner snapshots (when the inner environment has them); `optimal_plan` renders solver
demonstrations in the parallel format (the solver's action in one copy, other admissible or `explore_actions` in the
others), so `trl_agents.warmstart.solver_demonstrations("parallel", ...)` gives a warm start for the format.

Example:
    >>> env = ParallelEnv(inner="frozenlake", num_envs=2)
    >>> first = env.reset({"layout": "SF\\nFG"})
    >>> observation, reward, done, info = env.step("<think>try both</think><parallel><env_1>right</env_1>"
    ...                                            "<env_2>down</env_2></parallel>")
    >>> info["env_actions"], info["applied"], reward, done
    ([[1, 'right'], [2, 'down']], [1, 2], 0.0, False)
    >>> observation, reward, done, info = env.step("<parallel><env_2>right</env_2></parallel>")
    >>> reward, done, info["success"]  # copy 2 reached the goal
    (1.0, True, True)
    >>> parse_parallel_actions("<env_1> up </env_1><env_5>left</env_5><env_1>down</env_1>")  # first one wins
    [(1, 'up'), (5, 'left')]
"""

from __future__ import annotations

import copy
import random
import re
from collections.abc import Hashable, Sequence
from typing import Any

from .base import INFO_SUCCESS, INFO_VALID, AgentEnv
from .registry import get_env_class, make_env, register_env

NUMBERING = ("tag", "order")

FORMAT_INSTRUCTIONS = (
    "You act in {k} parallel copies of this environment, numbered 1 to {k}. They all start in the same state; after "
    "that each copy changes only through the actions you take in it. Each turn, first reason inside "
    "<think>...</think>, then act in any of the copies you choose, inside <parallel>...</parallel>, with each "
    "action written as the rules above ask and wrapped in its copy's tag, for example:\n"
    "<parallel><env_1>first action</env_1><env_2>another action</env_2></parallel>\n"
    "The task is solved as soon as it is solved in any one copy."
)
"""Our wording, appended to the inner environment's instructions (the released prompt is ALFWorld-specific)."""

_ENV_BLOCK = re.compile(r"<env_(\d+)>(.*?)</env_\d+>", re.IGNORECASE | re.DOTALL)
_THINK = re.compile(r"<think>.*?</think>", re.IGNORECASE | re.DOTALL)


def parse_parallel_actions(text: Any, number_by: str = "tag") -> list[tuple[int, str]]:
    """The (environment number, action) pairs of an answer, in written order, actions stripped.

    Every complete `<env_i>…</env_i>` block outside complete `<think>…</think>` blocks counts, inside or outside a
    `<parallel>` block (the released parser does not require it either); an unclosed block is not an action.
    `number_by="tag"` (our choice) reads i from the tag, and the first block of a number wins; `"order"` numbers
    the blocks 1, 2, ... in written order whatever their tags say, as the released parser does.

    >>> parse_parallel_actions("<think>maybe <env_2>x</env_2></think><parallel><env_2>open door</env_2>"
    ...                        "<env_4>look</env_4></parallel>")
    [(2, 'open door'), (4, 'look')]
    >>> parse_parallel_actions("<parallel><env_2>open door</env_2><env_4>look</env_4>", number_by="order")
    [(1, 'open door'), (2, 'look')]
    >>> parse_parallel_actions("<parallel><env_1>go to desk 1</env_1><env_2>go to"), parse_parallel_actions(None)
    ([(1, 'go to desk 1')], [])
    """
    if number_by not in NUMBERING:
        raise ValueError(f"number_by must be one of {', '.join(map(repr, NUMBERING))}, got {number_by!r}")
    if not isinstance(text, str):
        return []
    blocks = _ENV_BLOCK.findall(_THINK.sub(" ", text))
    if number_by == "order":
        return [(index + 1, action.strip()) for index, (_, action) in enumerate(blocks)]
    found: dict[int, str] = {}
    for number, action in blocks:
        found.setdefault(int(number), action.strip())
    return list(found.items())


def render_parallel_answer(actions: Sequence[tuple[int, str]], think: str = "") -> str:
    """An answer in the parallel format (what demonstrations are written as).

    >>> render_parallel_answer([(1, "up"), (2, "left")])
    '<parallel><env_1>up</env_1><env_2>left</env_2></parallel>'
    """
    body = "".join(f"<env_{env}>{action}</env_{env}>" for env, action in actions)
    return (f"<think>{think}</think>" if think else "") + f"<parallel>{body}</parallel>"


@register_env
class ParallelEnv(AgentEnv):
    """K copies of the inner environment `inner` (a registered name, built with the other keyword arguments) on the
    same task (module docstring). Task rows are the inner environment's, with `env="parallel"`:
    `ParallelEnv.task_split("train", 8, inner="frozenlake")`; in a config, `env_name: parallel` and
    `env_kwargs: {inner: alfworld, num_envs: 4, ...}`.

    Args:
        inner: Registry name of the wrapped environment.
        num_envs: K, the number of copies (4 in DPEPO).
        number_by: How `<env_i>` blocks map to copies: "tag" (i, our choice) or "order" (the k-th block acts in copy
            k, as the released parser does).
        list_admissible: Show each copy's admissible actions after its last observation, when the inner
            environment lists them (turn it off when the inner observations already show them, e.g. ALFWorld with
            `show_admissible_actions`).
        max_history: Earlier (action, observation) pairs shown per copy, the most recent ones; None = all (as
            released).
        explore_actions: For demonstrations (`optimal_plan`) of environments that do not list admissible actions:
            the actions the other copies may try (e.g. ["up", "down", "left", "right"]). None: the admissible actions
            when listed, else only the solver's copy acts.
        demo_seed: Seed of the choice of those other actions.
        **inner_kwargs: Constructor arguments of the inner environment.
    """

    name = "parallel"
    instructions = "An environment shown as text. " + FORMAT_INSTRUCTIONS.format(k=4)

    def __init__(self, inner: str = "frozenlake", num_envs: int = 4, number_by: str = "tag",
                 list_admissible: bool = True, max_history: int | None = None,
                 explore_actions: Sequence[str] | None = None, demo_seed: int = 0, **inner_kwargs: Any):
        if inner == self.name:
            raise ValueError("ParallelEnv cannot wrap itself: set `inner` to another environment's name")
        if isinstance(num_envs, bool) or not isinstance(num_envs, int) or not 1 <= num_envs <= 64:
            raise ValueError(f"`num_envs` must be an integer in [1, 64] (DPEPO: 4), got {num_envs!r}")
        if number_by not in NUMBERING:
            raise ValueError(f"`number_by` must be one of {', '.join(map(repr, NUMBERING))}, got {number_by!r}")
        if max_history is not None and (isinstance(max_history, bool) or not isinstance(max_history, int)
                                        or max_history < 0):
            raise ValueError(f"`max_history` must be None or an integer >= 0, got {max_history!r}")
        if explore_actions is not None and (isinstance(explore_actions, str)
                                            or not all(isinstance(a, str) for a in explore_actions)):
            raise ValueError(f"`explore_actions` must be a list of action strings, got {explore_actions!r}")
        self.copies = [make_env(inner, **inner_kwargs) for _ in range(num_envs)]
        if self.copies[0].roles:
            raise ValueError(f"ParallelEnv wraps single-agent environments; {inner!r} has roles {self.copies[0].roles}")
        self.num_envs = num_envs
        self.number_by = number_by
        self.list_admissible = bool(list_admissible)
        self.max_history = max_history
        self.explore_actions = list(explore_actions) if explore_actions is not None else None
        self.demo_seed = int(demo_seed)
        self.thread_safe = self.copies[0].thread_safe
        self.instructions = f"{self.copies[0].instructions}\n{FORMAT_INSTRUCTIONS.format(k=num_envs)}"
        self._state: dict[str, Any] | None = None

    # ---- episode ---------------------------------------------------------------------------------------------------

    def reset(self, task: dict[str, Any]) -> str:
        observations = [env.reset(dict(task)) for env in self.copies]
        if any(o != observations[0] for o in observations[1:]):
            raise ValueError("The copies of the inner environment started from different observations: its reset is "
                             "not deterministic given the task row, so they are not the same task")
        self._state = {
            "initial": observations[0],
            "history": {k: [] for k in range(1, self.num_envs + 1)},  # (action, observation) of earlier turns
            "last": [],  # [(k, action, observation, admissible)] of the last turn
            "notes": [],  # what the last turn asked for that was not applied
            "ended": {},  # k -> solved? for the copies whose episode is over
            "turn": 0,
        }
        return self.render()

    def step(self, action_text: str) -> tuple[str, float, bool, dict[str, Any]]:
        state = self._require_state()
        for k, action, observation, _ in state["last"]:  # the last turn becomes history now
            state["history"][k].append((action, observation))
        state["last"], state["notes"] = [], []
        parsed = parse_parallel_actions(action_text, self.number_by)
        applied, rewards, valid, env_rewards, env_valid, invalid, solved = [], [], [], [], [], 0, False
        for k, action in parsed:
            if not 1 <= k <= self.num_envs:
                state["notes"].append(f"Environment {k} does not exist: use environments 1 to {self.num_envs}.")
                rewards.append(0.0)
                continue
            if k in state["ended"]:
                state["notes"].append(f"Environment {k} has ended: act in another one.")
                rewards.append(0.0)
                continue
            env = self.copies[k - 1]
            observation, reward, done, info = env.step(action)
            info = info or {}
            ok = bool(info.get(INFO_VALID, True))
            applied.append(k)
            rewards.append(float(reward))
            env_rewards.append([k, float(reward)])
            env_valid.append([k, ok])
            valid.append(ok)
            invalid += not ok
            admissible = env.admissible_actions() if self.list_admissible and not done else None
            state["last"].append((k, action, observation, admissible))
            if done:
                state["ended"][k] = bool(info.get(INFO_SUCCESS, False))
                solved = solved or state["ended"][k]
        state["turn"] += 1
        done = solved or len(state["ended"]) == self.num_envs
        info = {
            INFO_VALID: any(valid),
            INFO_SUCCESS: solved,
            "env_actions": [[k, a] for k, a in parsed],
            "applied": applied,
            "env_rewards": env_rewards,
            "env_valid": env_valid,
            "invalid_count": invalid,
            "num_envs": self.num_envs,
        }
        return self.render(), (max(rewards) if rewards else 0.0), done, info

    def render(self) -> str:
        """The observation of the current turn (module docstring)."""
        state = self._require_state()
        k_max = self.num_envs
        if state["turn"] == 0:
            parts = [f"Observation (the same in all {k_max} environments):", state["initial"]]
            admissible = self.copies[0].admissible_actions() if self.list_admissible else None
            if admissible:
                parts.append(f"Admissible actions: {', '.join(admissible)}")
        else:
            parts = [f"Initial observation (the same in all {k_max} environments):", state["initial"]]
            earlier = []
            for k, entries in state["history"].items():
                shown = entries if self.max_history is None else entries[len(entries) - self.max_history:]
                if not shown or self.max_history == 0:
                    continue
                first = len(entries) - len(shown) + 1
                earlier.append(f"In environment {k}:")
                for n, (action, observation) in enumerate(shown, start=first):
                    earlier.append(f"Action {n}: {action}\nObservation {n}: {observation}")
            if earlier:
                parts += ["Your earlier actions and what followed:", *earlier]
            if state["last"] or state["notes"]:
                parts.append("Your last turn:")
            for k, action, observation, admissible in state["last"]:
                parts.append(f"In environment {k}:\nAction: {action}\nObservation: {observation}")
                if admissible:
                    parts.append(f"Admissible actions: {', '.join(admissible)}")
            parts += state["notes"]
            if not state["last"] and not state["notes"]:
                parts.append("Your last turn acted in no environment.")
            ended = sorted(k for k, ok in state["ended"].items() if not ok)
            if ended:
                parts.append(f"Ended without success: environment {', '.join(map(str, ended))}.")
        parts.append(f"You may act in up to {k_max} environments this turn, numbered 1 to {k_max}.")
        return "\n".join(parts)

    def _require_state(self) -> dict[str, Any]:
        if self._state is None:
            raise RuntimeError("Call reset(task) before using the environment")
        return self._state

    # ---- forwarded and combined capabilities ----------------------------------------------------------------------

    def supports(self, capability: str) -> bool:
        if capability in ("verify", "roles"):
            return False
        return self.copies[0].supports(capability)

    def task_description(self) -> str:
        return self.copies[0].task_description()

    def close(self) -> None:
        for env in self.copies:
            env.close()

    def snapshot(self) -> Any:
        return (tuple(env.snapshot() for env in self.copies), copy.deepcopy(self._require_state()))

    def restore(self, snapshot: Any) -> None:
        inner, state = snapshot
        for env, shot in zip(self.copies, inner, strict=True):
            env.restore(shot)
        self._state = copy.deepcopy(state)

    def state_key(self) -> Hashable:
        state = self._require_state()
        return tuple(None if k in state["ended"] else env.state_key()
                     for k, env in enumerate(self.copies, start=1))

    def solver_value(self) -> float:
        """The smallest cost-to-go among the copies still playing (0 once one has solved the task)."""
        state = self._require_state()
        if any(state["ended"].values()):
            return 0
        live = [env.solver_value() for k, env in enumerate(self.copies, start=1) if k not in state["ended"]]
        return min(live) if live else float("inf")

    def privileged_context(self) -> str:
        return self.copies[0].privileged_context()

    def optimal_plan(self) -> list[str] | None:
        """Solver demonstrations in the parallel format: the copy with the shortest inner plan follows it; each other
        copy still playing tries a different action (from its admissible actions, else `explore_actions`; none of
        them repeats the solver's action or another copy's), drawn with `demo_seed`. Played on the copies and
        undone (snapshots), so the answers replay exactly; without snapshots only the solver's copy acts. None when
        no copy can still solve the task."""
        state = self._require_state()
        plans = {k: env.optimal_plan() for k, env in enumerate(self.copies, start=1) if k not in state["ended"]}
        plans = {k: p for k, p in plans.items() if p is not None}
        if not plans:
            return None
        lead = min(plans, key=lambda k: (len(plans[k]), k))
        if not self.copies[0].supports("snapshot"):
            return [render_parallel_answer([(lead, action)]) for action in plans[lead]]
        rng = random.Random(f"parallel-demo/{self.demo_seed}")
        saved = self.snapshot()
        answers = []
        try:
            for action in plans[lead]:
                chosen = [(lead, action)]
                for k, env in enumerate(self.copies, start=1):
                    if k == lead or k in self._state["ended"]:
                        continue
                    options = env.admissible_actions() or self.explore_actions or []
                    taken = {a for _, a in chosen}
                    options = [a for a in options if a not in taken]
                    if options:
                        chosen.append((k, rng.choice(options)))
                chosen.sort()
                answer = render_parallel_answer(chosen)
                answers.append(answer)
                _, _, done, _ = self.step(answer)
                if done:
                    break
        finally:
            self.restore(saved)
        return answers

    @classmethod
    def task_split(cls, split: str, count: int | None = None, inner: str = "frozenlake", num_envs: int = 4,
                   number_by: str = "tag", list_admissible: bool = True, max_history: int | None = None,
                   explore_actions: Sequence[str] | None = None, demo_seed: int = 0,
                   **env_kwargs: Any) -> list[dict[str, Any]]:
        """The inner environment's split, each row naming this wrapper as its environment."""
        rows = get_env_class(inner).task_split(split, count, **env_kwargs)
        return [{**row, "env": cls.name} for row in rows]
