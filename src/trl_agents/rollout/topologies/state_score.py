"""`state_score`: 3SPO's adaptive rollout allocation with ranked backtracking (arXiv 2606.09961, Eq. 3;
docs/methods/3spo.md).

Each task runs a depth-first search over its environment, all tasks in lock-step (one generation call per turn). Its
schedule is "global": the decisions of every task read and update one state-score table shared by all tasks (the
rollout's copy, with the episodes finished so far), so tasks are decided together after every global turn:

1. The followed episode (the *head*) acts from state s. Then n(s) = ⌈G_max·S(s)⌉ (Eq. 3, S from the state-score
   table, `StateScoreTable.num_rollouts`):
   * n = 0: truncate — the head ends there (it counts as a finished trajectory);
   * n = 1: continue — the head plays on;
   * n ≥ 2: branch — the head is held and n − 1 siblings are forked from the snapshot before its action; they sample
     their own action at s in the next turn, so that n actions from s exist, the head's included.
2. Once the siblings have acted, all n are ranked by R_3SPO(s, s') (Eq. 2, `transition_reward`; ties: creation
   order). Siblings whose action was already followed from s in this search (the per-state explored-action sets),
   or repeats of a better-ranked sibling's action, are skipped. The best remaining sibling is followed (it becomes
   the head; its action joins the explored set of s), the other remaining ones are pushed on the task's frontier
   stack, held where they are (worst first, so the top is the next best). With nothing remaining: backtrack.
3. When the head's episode ends, the search counts it as a finished trajectory and updates its statistics (the
   rollout's copy of the table: N(s) += 1, N⁺(s) += success, t += 1), then pops the frontier: the sibling on top
   continues from the state its action reached (the last decision point); a popped sibling whose action already
   ended its episode counts as finished at once.
4. A task's search stops at `max_samples` finished trajectories (or an empty frontier). Siblings still on its
   frontier end with the rollout, unfinished: they are trained as siblings (their action from the decision point
   has its R_3SPO) but are *not* finished trajectories, so the trainer does not count them in the table
   (`uncounted`).

Decisions read the trainer's persistent table (`table`, set by `SSPOTrainer`) plus the episodes this rollout has
finished so far, on a copy: the trainer's table itself is updated after the rollout's credit (the credit reads it as
it stood before the batch). R_3SPO of a sibling needs h(s'), the state its action reached: the key the `state_key`
signal recorded after the action (`SSPOTrainer` declares it), scored from the table as the 3SPO code does
(`next_state`); without that signal, s' is recognised by its observation among the states this task's
episodes acted from in this rollout, and otherwise follows `terminal_score` (S(s') := S(s) for "current", 1 for
"unseen"). The explored-action
sets live for one rollout and one task (the 3SPO code keeps one global set, which would leave nothing to explore
after a few rollouts); an action is the environment's parsed action (`info["action"]`) or the stripped text.

Cost: every decision point with n ≥ 2 adds n − 1 episodes (environments) and one turn. With α = 50 the score is
almost binary (docs/methods/3spo.md): unseen and rarely failed states branch G_max ways, states that ever led to a
success continue (n = 1), states that failed ξ times and never succeeded truncate.

Example (a stub table where every state scores 0.3: n = ⌈8·0.3⌉ = 3):
    >>> from trl_agents.rollout.topologies import get_topology
    >>> topology = get_topology("state_score", g_max=8, max_samples=4)
    >>> topology.begin([{"env": "frozenlake", "seed": 0}], num_generations=8)
    [Launch(task_index=0, count=1)]
"""

from __future__ import annotations

import json
import math
from collections.abc import Collection, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...fileio import atomic_write
from ...trajectory import Group, Step, Trajectory
from .base import Fork, Hold, Launch, Request, RolloutView, Stop, Topology

SCOPES = ("task", "global")
TERMINAL_SCORES = ("current", "unseen")
TABLE_FORMAT = "trl-agents/3spo-state-scores/v1"


# ---- the state-score table (Eq. 1-3) and the transition reward (Eq. 2), shared with the credit -----------------------


def state_identity(step: Step) -> Hashable:
    """h(s_t): the step's `state_key`, or its observation text when the environment has no state keys."""
    return step.state_key if step.state_key is not None else step.observation


@dataclass
class StateScoreTable:
    """The persistent visit statistics of 3SPO and the scores derived from them (Eq. 1-3).

    Keys are strings: `repr(h(s))` with `scope="global"` (states shared across tasks, as the 3SPO code hashes the
    anchor observation), or `json.dumps([task_id, repr(h(s))])` with `scope="task"`. `repr` must be deterministic
    for the environment's state keys (tuples, ints and strings are).

    Args:
        alpha: α of λ(t) = α·log t.
        xi, zeta: ξ and ζ of the indicator 1{N_fail < ξ ∨ SR > ζ}.
        omega_k: ω_k of ω(N) = 0.5·exp(−ω_k·N).
        eps: ε of SR = N⁺ / (N + ε).
        scope: "task" or "global" (see above).
        counts: key -> [N(s), N⁺(s)].
        t: 1 + the number of finished episodes counted. Saved with the table: the 3SPO code recomputes it on load as
            1 + Σ_s N(s), which disagrees with its own increment of 1 per episode; we keep the per-episode counter.

    Example:
        >>> from trl_agents.trajectory import Group, Step, Trajectory
        >>> table = StateScoreTable(alpha=1.0, scope="global")
        >>> won = Trajectory(task={}, steps=[Step("s0", "a"), Step("s1", "b")], success=True)
        >>> lost = Trajectory(task={}, steps=[Step("s0", "a"), Step("s2", "c")])
        >>> table.update([Group(task={}, trajectories=[won, lost])])
        2
        >>> table.visits("s0"), table.successes("s0"), table.t
        (2, 1, 3)
        >>> round(table.score("s0"), 4), round(table.score("s2"), 4), table.score("never seen")  # exp(-log 3 · SR)
        (0.5774, 1.0, 1.0)
    """

    alpha: float = 50.0
    xi: float = 10.0
    zeta: float = 0.1
    omega_k: float = 0.1
    eps: float = 1e-6
    scope: str = "task"
    counts: dict[str, list[int]] = field(default_factory=dict)
    t: int = 1

    def __post_init__(self):
        if self.scope not in SCOPES:
            raise ValueError(f"scope must be one of {', '.join(map(repr, SCOPES))}, got {self.scope!r}")
        for name in ("alpha", "xi", "zeta", "omega_k"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value}")
        if not self.eps > 0:
            raise ValueError(f"eps must be > 0, got {self.eps}")
        if not (isinstance(self.t, int) and self.t >= 1):
            raise ValueError(f"t must be an int >= 1, got {self.t!r}")

    # ---- lookups ---------------------------------------------------------------------------------------------------

    def key(self, state: Hashable, task_id: str | None = None) -> str:
        """The table key of state h(s) (of task `task_id` when the scope is "task")."""
        if self.scope == "global":
            return repr(state)
        if task_id is None:
            raise ValueError("a table with scope='task' needs the task_id of the state")
        return json.dumps([task_id, repr(state)])

    def visits(self, state: Hashable, task_id: str | None = None) -> int:
        """N(s): finished episodes that visited s."""
        return self.counts.get(self.key(state, task_id), (0, 0))[0]

    def successes(self, state: Hashable, task_id: str | None = None) -> int:
        """N⁺(s): successful finished episodes that visited s."""
        return self.counts.get(self.key(state, task_id), (0, 0))[1]

    def score(self, state: Hashable, task_id: str | None = None) -> float:
        """S(s), Eq. 1: 1 for an unseen state, else exp(−α·log t·SR(s)) when N_fail(s) < ξ or SR(s) > ζ, else 0."""
        return self.score_of_key(self.key(state, task_id))

    def omega(self, state: Hashable, task_id: str | None = None) -> float:
        """ω(N(s)) = 0.5·exp(−ω_k·N(s)), the weight of the novelty term of Eq. 2."""
        return self.omega_of_key(self.key(state, task_id))

    def score_of_key(self, key: str) -> float:
        """S(s) of a table key (see `score`)."""
        visits, wins = self.counts.get(key, (0, 0))
        if visits == 0:
            return 1.0
        rate = wins / (visits + self.eps)  # SR(s)
        if not (visits - wins < self.xi or rate > self.zeta):
            return 0.0
        return math.exp(-self.alpha * math.log(self.t) * rate)

    def omega_of_key(self, key: str) -> float:
        """ω(N(s)) of a table key (see `omega`)."""
        return 0.5 * math.exp(-self.omega_k * self.counts.get(key, (0, 0))[0])

    def num_rollouts(self, state: Hashable, task_id: str | None = None, g_max: int = 8) -> int:
        """n(s) = ceil(G_max·S(s)), Eq. 3: siblings to branch from s (0: truncate; 1: continue without update)."""
        return allocated_rollouts(self.score(state, task_id), g_max)

    def copy(self) -> StateScoreTable:
        """An independent copy (same hyperparameters, copied statistics)."""
        return StateScoreTable(alpha=self.alpha, xi=self.xi, zeta=self.zeta, omega_k=self.omega_k, eps=self.eps,
                               scope=self.scope, counts={k: list(v) for k, v in self.counts.items()}, t=self.t)

    # ---- updates ---------------------------------------------------------------------------------------------------

    def episode_record(
        self, trajectory: Trajectory, task_id: str, cache: dict[Hashable, str] | None = None
    ) -> tuple[list[str], bool]:
        """(distinct keys of the states the episode acted from, success): what `update` counts for one episode.
        `cache` (state -> key, for one task) saves recomputing keys of states shared by episodes."""
        cache = {} if cache is None else cache
        keys = []
        for state in dict.fromkeys(state_identity(step) for step in trajectory.steps):
            key = cache.get(state)
            if key is None:
                key = cache[state] = self.key(state, task_id)
            keys.append(key)
        return keys, bool(trajectory.success)

    def group_records(self, group: Group, skip: Collection[int] = ()) -> list[tuple[list[str], bool]]:
        """`episode_record` of every episode of `group` that has steps, except the trajectories whose `id()` is in
        `skip` (e.g. the unfinished siblings a `state_score` search left on its frontier)."""
        task_id, cache = group.task_id, {}
        return [
            self.episode_record(traj, task_id, cache) for traj in group.trajectories
            if traj.steps and not traj.failed and id(traj) not in skip
        ]

    def update(self, groups: Iterable[Group]) -> int:
        """Count every episode with at least one step: N(s) += 1 (and N⁺(s) += 1 if it succeeded) for each distinct
        state it acted from, t += 1 per episode (3SPO `update_statistics`). Returns the number of episodes counted."""
        return self.update_records([record for group in groups for record in self.group_records(group)])

    def update_records(self, records: Iterable[tuple[Sequence[str], bool]]) -> int:
        """`update` from `episode_record`s (e.g. gathered from several processes)."""
        count = 0
        for keys, success in records:
            for key in keys:
                entry = self.counts.setdefault(key, [0, 0])
                entry[0] += 1
                entry[1] += int(bool(success))
            self.t += 1
            count += 1
        return count

    # ---- persistence -----------------------------------------------------------------------------------------------

    def to_dict(self) -> dict:
        return {
            "format": TABLE_FORMAT,
            "scope": self.scope,
            "t": self.t,
            "hyperparameters": {"alpha": self.alpha, "xi": self.xi, "zeta": self.zeta, "omega_k": self.omega_k,
                                "eps": self.eps},
            "counts": self.counts,
        }

    def save(self, path: str) -> None:
        """Write the table as JSON (via a temporary file, so a crash never leaves half a table)."""
        atomic_write(path, json.dumps(self.to_dict()))

    def load_counts(self, path: str) -> None:
        """Replace the statistics (counts and t) by those saved at `path`; the hyperparameters stay this table's."""
        with open(path) as handle:
            data = json.load(handle)
        if data.get("format") != TABLE_FORMAT:
            raise ValueError(f"{path} is not a 3SPO state-score table (format {data.get('format')!r})")
        if data["scope"] != self.scope:
            raise ValueError(
                f"{path} holds a table with scope={data['scope']!r} but this run uses scope={self.scope!r}; its "
                "keys cannot be reused. Set state_scope to the saved value or start from an empty table."
            )
        self.counts = {str(k): [int(v[0]), int(v[1])] for k, v in data["counts"].items()}
        self.t = int(data["t"])


def allocated_rollouts(score: float, g_max: int = 8) -> int:
    """n = ceil(G_max·S), Eq. 3: 0 truncates, 1 continues, n ≥ 2 branches n siblings.

    >>> [allocated_rollouts(s, 8) for s in (1.0, 0.3, 0.01, 0.0)]  # ⌈8⌉, ⌈2.4⌉, ⌈0.08⌉, ⌈0⌉
    [8, 3, 1, 0]
    """
    return math.ceil(g_max * score)


def transition_reward(
    table: StateScoreTable,
    state: Hashable,
    next_state: Hashable | None,
    success: bool,
    task_id: str | None = None,
    *,
    valid: bool = True,
    terminal_score: str = "current",
) -> float:
    """R_3SPO(s_t, s_{t+1}) of one transition (Eq. 2); `next_state` None: s_{t+1} unknown, so R_novel = 1[valid] and
    S(s_{t+1}) := S(s_t) ("current") or 1 ("unseen").

    >>> table = StateScoreTable(scope="global")  # empty: S = 1, ω = 0.5 everywhere
    >>> transition_reward(table, "s0", "s1", False), transition_reward(table, "s0", "s0", False)
    (0.5, 0.0)
    >>> transition_reward(table, "s0", None, True)  # 0.5·1[valid] + 0 + 0.5·success
    1.0
    """
    key = table.key(state, task_id)
    score, omega = table.score_of_key(key), table.omega_of_key(key)
    if next_state is None:
        is_novel = float(valid)
        next_score = score if terminal_score == "current" else 1.0
    else:
        is_novel = float(next_state != state)
        next_score = table.score(next_state, task_id)
    return omega * is_novel + (0.5 - omega) * (score - next_score) + 0.5 * float(success)


STATE_KEY_SIGNAL = "state_key"  # the env signal Transition(key(s_t), key(s_t+1)) (trl_agents.signals.env)


def next_state(step: Step, observed: dict[str, Hashable] | None = None) -> Hashable | None:
    """h(s_{t+1}) of an episode's last `step`: the `state_key` signal's `after` key; for an environment without
    state keys, the returned observation; else (nothing recorded) the state that some episode of the group acted
    from with that observation (`observed`, `credit.sspo.observation_states`); None when unknown.

    >>> from trl_agents.signals import Transition
    >>> step = Step("o", "a", state_key=(0, 1))
    >>> step.signals["state_key"] = Transition((0, 1), (0, 2))
    >>> next_state(step), next_state(Step("o", "a", next_observation="o2")), next_state(Step("o", "a", state_key=1))
    ((0, 2), 'o2', None)
    """
    recorded = step.signals.get(STATE_KEY_SIGNAL)
    if recorded is not None:
        after = recorded[1]
        return tuple(after) if isinstance(after, list) else after  # a tuple key reloaded from the records
    if step.state_key is None:
        return step.next_observation
    if observed is not None and step.next_observation is not None:
        return observed.get(step.next_observation)
    return None


# ---- the topology ----------------------------------------------------------------------------------------------------


@dataclass
class _Decision:
    """A branching in progress: the head acted at step `step` from `state`; `members` (episode ids, the head
    first) are the n siblings from that state."""

    state: Hashable
    step: int
    members: list[int]


@dataclass
class _Search:
    """One task's depth-first search."""

    head: int | None = None
    head_steps: int = 0  # the head's steps when it was (re)started: it acted once it has more
    decision: _Decision | None = None
    frontier: list[int] = field(default_factory=list)  # held siblings, the next best on top (last)
    explored: dict[Hashable, set[str]] = field(default_factory=dict)
    finished: int = 0
    done: bool = False
    decisions: int = 0
    branched: int = 0  # siblings forked
    truncated: int = 0  # heads ended by n = 0
    backtracks: int = 0  # frontier pops
    skipped: int = 0  # siblings skipped (action explored or repeated)


def action_of(trajectory: Trajectory, step: int) -> str:
    """The action an episode took at `step`: the environment's parsed action, else the stripped text."""
    recorded = trajectory.steps[step]
    return str(recorded.info.get("action") or recorded.action_text.strip())


class StateScoreTopology(Topology):
    """3SPO's adaptive allocation n(s) = ⌈G_max·S(s)⌉ with a ranked backtracking depth-first search per task (see
    the module docstring).

    Args:
        g_max: G_max of Eq. 3 (3SPO: 8).
        max_samples: Finished trajectories per task (3SPO `max_samples_per_prompt`: 32); None = the rollout's
            `num_generations`.
        terminal_score: S of a sibling's next state when it is not recorded nor recognised ("current" or "unseen",
            as the credit's `terminal_score`; with the trainer's `state_key` signal it never applies).
        table: The persistent state-score table (`SSPOTrainer` sets its own); None = an empty one.
        min_root_rollouts: At least this many actions from a task's initial state, whatever n(s_0) says (2: our
            choice, docs/methods/3spo.md#our-choices). With α = 50 a start state that has ever led to a success
            scores S ≈ 0, so Eq. 3 alone truncates the first episode after one action: a group of one, which credit
            cannot compare with anything (`min_healthy_episodes` drops it). 1 or 0 leave Eq. 3 unchanged there.
    """

    name = "state_score"
    needs_snapshots = True
    required_capabilities = ("snapshot",)

    def __init__(self, g_max: int = 8, max_samples: int | None = None, terminal_score: str = "current",
                 table: StateScoreTable | None = None, min_root_rollouts: int = 2):
        if isinstance(g_max, bool) or not isinstance(g_max, int) or g_max < 1:
            raise ValueError(f"g_max must be an integer >= 1 (3SPO: 8), got {g_max!r}")
        if max_samples is not None and (isinstance(max_samples, bool) or not isinstance(max_samples, int)
                                        or max_samples < 1):
            raise ValueError(f"max_samples must be an integer >= 1 or None (= num_generations), got {max_samples!r}")
        if isinstance(min_root_rollouts, bool) or not isinstance(min_root_rollouts, int) or min_root_rollouts < 0:
            raise ValueError(f"min_root_rollouts must be an integer >= 0, got {min_root_rollouts!r}")
        if terminal_score not in TERMINAL_SCORES:
            raise ValueError(f"terminal_score must be one of {TERMINAL_SCORES}, got {terminal_score!r}")
        self.g_max = g_max
        self.max_samples = max_samples
        self.terminal_score = terminal_score
        self.table = table
        self.min_root_rollouts = min_root_rollouts
        self.uncounted: set[int] = set()  # id() of the trajectories that did not finish (frontier leftovers)
        # What the search did, in order: ("decide", task, state, n), ("follow", task, episode), ("push", task,
        # episode), ("skip", task, episode), ("pop", task, episode), ("finish", task, episode), ("close", task).
        self.events: list[tuple] = []
        self._searches: list[_Search] = []
        self._local = StateScoreTable()
        self._budget = 1

    # ---- the protocol ----------------------------------------------------------------------------------------------

    def begin(self, tasks: Sequence[dict[str, Any]], num_generations: int) -> list[Request]:
        self._local = (self.table if self.table is not None else StateScoreTable()).copy()  # + this rollout's
        self._budget = self.max_samples or num_generations
        self._searches = [_Search(head=0) for _ in tasks]
        self.uncounted, self.events = set(), []
        return [Launch(index, 1) for index in range(len(tasks))]

    def after_turn(self, view: RolloutView, task_index: int | None = None) -> list[Request]:
        return self._advance(view, task_index)

    def when_idle(self, view: RolloutView, task_index: int | None = None) -> list[Request]:
        return self._advance(view, task_index)

    def stats(self, view: RolloutView) -> dict[str, float]:
        searches = self._searches
        count = max(len(searches), 1)  # the same keys on every process, even without tasks
        return {
            "leaves_per_task": sum(len(g.trajectories) for g in view.groups) / count,
            "finished_per_task": sum(s.finished for s in searches) / count,
            "decisions_per_task": sum(s.decisions for s in searches) / count,
            "branched_per_task": sum(s.branched for s in searches) / count,
            "truncated_per_task": sum(s.truncated for s in searches) / count,
            "backtracks_per_task": sum(s.backtracks for s in searches) / count,
            "skipped_per_task": sum(s.skipped for s in searches) / count,
        }

    # ---- the search ------------------------------------------------------------------------------------------------

    def _advance(self, view: RolloutView, task_index: int | None = None) -> list[Request]:
        """One step of the search of every task (the engine's lockstep calls: `task_index` None), or of one task."""
        requests: list[Request] = []
        indices = range(len(self._searches)) if task_index is None else view.task_indices(task_index)
        for index in indices:
            search = self._searches[index]
            if not search.done:
                self._advance_task(view, index, search, requests)
        return requests

    def _advance_task(self, view: RolloutView, index: int, search: _Search, requests: list[Request]) -> None:
        group = view.groups[index]
        if search.decision is not None:
            members = [group.trajectory(e) for e in search.decision.members]
            if any(view.is_active(t) and len(t.steps) <= search.decision.step for t in members):
                return  # some siblings have not acted yet
            self._rank(view, index, search, group, members, requests)
            return
        head = group.trajectory(search.head)
        if len(head.steps) <= search.head_steps:  # it has not acted since it was (re)started
            if not view.is_active(head):  # it ended without acting (a failed reset, a context overflow)
                self._finish(view, index, search, head, requests, counted=not head.failed)
            return
        if head.failed:
            self._finish(view, index, search, head, requests, counted=False)
            return
        step = len(head.steps) - 1
        state = state_identity(head.steps[step])
        n = self._local.num_rollouts(state, group.task_id, self.g_max)
        if step == 0 and head.parent_id is None:  # the initial state: never a group of one (min_root_rollouts)
            n = max(n, self.min_root_rollouts)
        self.events.append(("decide", index, state, n))
        search.decisions += 1
        if n == 0:  # truncate: the head ends here
            search.truncated += 1
            if view.is_active(head):
                requests.append(Stop(index, head.episode_id))
            self._finish(view, index, search, head, requests)
        elif n == 1:  # continue
            search.explored.setdefault(state, set()).add(action_of(head, step))
            if view.is_active(head):
                search.head_steps = len(head.steps)
            else:
                self._finish(view, index, search, head, requests)
        else:  # branch: n − 1 siblings of the head's action at s
            first = len(group.trajectories)
            search.decision = _Decision(state, step, [head.episode_id, *range(first, first + n - 1)])
            search.branched += n - 1
            if view.is_active(head):
                requests.append(Hold(index, head.episode_id))
            requests.append(Fork(index, head.episode_id, step, n - 1))

    def _rank(self, view, index, search, group, members, requests) -> None:
        decision = search.decision
        search.decision = None
        explored = search.explored.setdefault(decision.state, set())
        observed = _observation_index(group)
        scored = []
        for order, trajectory in enumerate(members):
            if trajectory.failed or len(trajectory.steps) <= decision.step:
                continue
            scored.append((-self._reward(group, trajectory, decision.step, observed), order, trajectory))
        kept, seen = [], set()
        for _, _, trajectory in sorted(scored, key=lambda item: item[:2]):
            action = action_of(trajectory, decision.step)
            if action in explored or action in seen:
                search.skipped += 1
                self.events.append(("skip", index, trajectory.episode_id))
                self._leave(view, index, trajectory, requests)
                continue
            seen.add(action)
            kept.append(trajectory)
        if not kept:
            self._pop(view, index, search, requests)
            return
        best, rest = kept[0], kept[1:]
        explored.add(action_of(best, decision.step))
        for trajectory in reversed(rest):  # held where they are (or already ended); the next best on top
            search.frontier.append(trajectory.episode_id)
            self.events.append(("push", index, trajectory.episode_id))
            if view.is_active(trajectory) and not view.is_held(trajectory):
                requests.append(Hold(index, trajectory.episode_id))
        self._follow(view, index, search, best, requests)

    def _reward(self, group: Group, trajectory: Trajectory, step: int, observed: dict[str, Hashable]) -> float:
        """R_3SPO of `trajectory`'s action at `step` from the rollout's table (next state: its next step's, else the
        one its action reached, `next_state`, else the `terminal_score` rule)."""
        recorded = trajectory.steps[step]
        if step + 1 < len(trajectory.steps):
            reached = state_identity(trajectory.steps[step + 1])
        else:
            reached = next_state(recorded, observed)
        success = bool(trajectory.success) and step == len(trajectory.steps) - 1
        return transition_reward(self._local, state_identity(recorded), reached, success, group.task_id,
                                 valid=recorded.valid, terminal_score=self.terminal_score)

    def _follow(self, view, index, search, trajectory, requests) -> None:
        """Make `trajectory` the head: resume it, or count it at once when its episode has ended."""
        search.head = trajectory.episode_id
        self.events.append(("follow", index, trajectory.episode_id))
        if view.is_active(trajectory):
            search.head_steps = len(trajectory.steps)
            if view.is_held(trajectory):
                requests.append(Hold(index, trajectory.episode_id, held=False))
            return
        self._finish(view, index, search, trajectory, requests, counted=not trajectory.failed)

    def _finish(self, view, index, search, trajectory, requests, counted: bool = True) -> None:
        """The head's episode ended: count it, update the rollout's statistics, backtrack."""
        search.finished += 1
        self.events.append(("finish", index, trajectory.episode_id))
        if counted and trajectory.steps:
            group = view.groups[index]
            self._local.update_records([self._local.episode_record(trajectory, group.task_id)])
        if search.finished >= self._budget:
            self._close(view, index, search, requests)
        else:
            self._pop(view, index, search, requests)

    def _pop(self, view, index, search, requests) -> None:
        if not search.frontier:
            self._close(view, index, search, requests)
            return
        search.backtracks += 1
        trajectory = view.groups[index].trajectory(search.frontier.pop())
        self.events.append(("pop", index, trajectory.episode_id))
        # Held right after its action at the decision point: its last step is that action.
        search.explored.setdefault(state_identity(trajectory.steps[-1]), set()).add(action_of(trajectory, -1))
        self._follow(view, index, search, trajectory, requests)

    def _close(self, view, index, search, requests) -> None:
        """The task's search is over: what is left on its frontier ends unfinished with the rollout."""
        search.done = True
        self.events.append(("close", index))
        while search.frontier:
            self._leave(view, index, view.groups[index].trajectory(search.frontier.pop()), requests)

    def _leave(self, view, index, trajectory, requests) -> None:
        """A sibling that is not followed (skipped, or left on the frontier): held until the rollout ends, not a
        finished trajectory of the search."""
        self.uncounted.add(id(trajectory))
        if view.is_active(trajectory) and not view.is_held(trajectory):
            requests.append(Hold(index, trajectory.episode_id))


def _observation_index(group: Group) -> dict[str, Hashable]:
    """Observation -> h(s) of every state an episode of the group acted from (the first one recorded)."""
    index: dict[str, Hashable] = {}
    for trajectory in group.trajectories:
        for step in trajectory.steps:
            index.setdefault(step.observation, state_identity(step))
    return index
