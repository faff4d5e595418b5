"""3SPO advantages: a step reward from historical state scores, centred among the steps taken from the same state.

3SPO (State-Score-Supervised Policy Optimization, arXiv 2606.09961), with the formulas of the README and
`gigpo/core_3spo.py` of `genalyu/3SPO` (docs/methods/3spo.md#equations), in a TRL port without environment
branching (the "siblings" of a step are the steps of the group's G independent episodes taken from the same state):

    h(s)       = state identity (`step.state_key`, or the observation text when the env has none)
    N(s), N⁺(s)  visits of s by finished episodes, and by successful ones (each state counted once per episode);
    t          = 1 + number of finished episodes counted          (the persistent `StateScoreTable`)
    SR(s)      = N⁺(s) / (N(s) + ε)                                ε = 1e-6
    λ(t)       = α·log t                                            α = 50
    S(s)       = exp(−λ(t)·SR(s)) · 1{N(s) − N⁺(s) < ξ  ∨  SR(s) > ζ};  S(s) = 1 if N(s) = 0      Eq. 1 (ξ=10, ζ=0.1)
    ω(s)       = 0.5·exp(−ω_k·N(s))                                 ω_k = 0.1
    R_{i,t}    = ω(s_t)·1[h(s_t) ≠ h(s_{t+1})] + (0.5 − ω(s_t))·(S(s_t) − S(s_{t+1})) + 0.5·R_success(s_{t+1})   Eq. 2
    ρ_{i,t}    = R_{i,t} − λ_inv·[invalid]                           invalid-action penalty (verl-agent, 0.1)
    A_{i,t}    = (ρ_{i,t} − μ_c)/F  over the steps c of the group with the same h(s_t) (GiGPO `step_norm_reward`,
                 F = 1: `remove_std=True`, the code default; F = σ_c + ε otherwise); a singleton gives 0
    A_{i,t}   += w_E·A^E_i  optional episode-level GRPO term (the code uses R_3SPO only: w_E = 0)

Scores are read from the table as it stood before this batch; the trainer updates it with the batch afterwards.
Eq. 3, the adaptive number of rollouts

    n(s)       = ceil(G_max·S(s))        0: truncate; 1: continue; ≥ 2: branch n siblings from s     (`allocated_rollouts`)

drives the `state_score` topology (`rollout/topologies/state_score.py`: ranked backtracking over trees of forked
episodes). On trees (forked episodes share their prefix `Step` objects) every distinct step is one sibling of its
state, counted once, and its advantage goes to the trajectory that owns it (0 on the other paths through it), so the
rows' sum over paths trains it with exactly its A (docs/topologies.md, "How rows train shared steps").

The state after an episode's last action, s_{t+1}, is looked up in the table like any other state, as the 3SPO code
does (`compute_3spo_step_reward` scores the next anchor observation from its global table): its key is the
`state_key` signal's `after` value (the trainer records it: `env.state_key()` after every step), or, for an
environment without state keys, the observation the action returned (h(s) is the observation text there). Only
where neither is recorded (groups built by hand, records from an older run) does it fall back to a state of the
group that an episode acted from with that observation, and otherwise to R_novel = 1[valid] and S(s_{t+1}) := S(s_t)
(`terminal_score="current"`) or 1 (`"unseen"`).

Guards: an unseen state scores 1 and ω = 0.5 (no division by a zero count: SR has ε); a state alone in its sibling
set (a singleton) gets A = 0; an empty group gives empty lists; `mean_std_norm` divides by σ + ε (all-equal
siblings: 0, never NaN); the score's exp(−λ·SR) underflows to 0.0, never to NaN or inf.
"""

from __future__ import annotations

import json
import math
from collections.abc import Collection, Hashable, Iterable, Sequence
from dataclasses import dataclass, field

from ..fileio import atomic_write
from ..trajectory import Group, Step, Trajectory
from .base import (
    StepAdvantages,
    check_choice,
    check_group,
    episode_advantages,
    mean_std,
    normalize,
    register_estimator,
)

MODES = ("mean_norm", "mean_std_norm")
SCOPES = ("task", "global")
TERMINAL_SCORES = ("current", "unseen")
TABLE_FORMAT = "trl-agents/3spo-state-scores/v1"


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
        check_choice("scope", self.scope, SCOPES)
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
    from with that observation (`observed`, `observation_states`); None when unknown.

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


def observation_states(group: Group) -> dict[str, Hashable]:
    """Observation -> h(s) of every state an episode of `group` acted from (the first recorded): how the state
    after a last action is recognised from its `next_observation`."""
    index: dict[str, Hashable] = {}
    for trajectory in group.trajectories:
        for step in trajectory.steps:
            index.setdefault(step.observation, state_identity(step))
    return index


@register_estimator("3spo")
def sspo_advantages(
    group: Group,
    *,
    table: StateScoreTable | None = None,
    mode: str = "mean_norm",
    episode_weight: float = 0.0,
    terminal_score: str = "current",
    invalid_penalty: float = 0.1,
    eps: float = 1e-6,
) -> StepAdvantages:
    """3SPO advantages of every step of `group`; see `sspo_advantages_with_stats` for the arguments.

    Example (empty table: every S = 1, ω = 0.5, so R = 0.5·R_novel + 0.5·R_success; all four steps act from s0):
        >>> from trl_agents.trajectory import Group, Step, Trajectory
        >>> won = Trajectory(task={}, steps=[Step("s0", "right")], success=True)
        >>> lost = Trajectory(task={}, steps=[Step("s0", "jump", valid=False)])
        >>> sspo_advantages(Group(task={}, trajectories=[won, lost]), invalid_penalty=0.0)
        [[0.5], [-0.5]]
    """
    advantages, _ = sspo_advantages_with_stats(
        group,
        table=table,
        mode=mode,
        episode_weight=episode_weight,
        terminal_score=terminal_score,
        invalid_penalty=invalid_penalty,
        eps=eps,
    )
    return advantages


def sspo_step_rewards(
    group: Group, table: StateScoreTable, terminal_score: str = "current"
) -> tuple[list[list[float]], dict[str, float]]:
    """R_3SPO(s_t, s_{t+1}) of every step (Eq. 2), from the table's current scores, plus the inputs' averages.
    s_{t+1} after an episode's last action: `next_state`; `terminal_score` applies only where it is not recorded
    (see the module docstring)."""
    check_choice("terminal_score", terminal_score, TERMINAL_SCORES)
    task_id = group.task_id
    looked_up: dict[Hashable, tuple[float, float]] = {}  # h(s) -> (S(s), ω(s)), once per distinct state
    observed = observation_states(group)
    rewards, scores, novel = [], [], []
    for traj in group.trajectories:
        states = [state_identity(step) for step in traj.steps]
        for state in states:
            try:
                if state not in looked_up:
                    key = table.key(state, task_id)
                    looked_up[state] = (table.score_of_key(key), table.omega_of_key(key))
            except TypeError as err:
                raise ValueError(f"3SPO state keys must be hashable: {err}") from None
        current = [looked_up[s][0] for s in states]  # S(s_t)
        row = []
        for t, (step, state) in enumerate(zip(traj.steps, states, strict=True)):
            omega = looked_up[state][1]
            if t < len(states) - 1:
                is_novel, next_score, success = float(states[t + 1] != state), current[t + 1], 0.0
            else:
                success = float(traj.success)
                known = next_state(step, observed)
                if known is not None:  # s_{t+1} looked up in the table, as any state
                    is_novel, next_score = float(known != state), table.score(known, task_id)
                else:  # nothing recorded: novel unless the action was invalid; S(s_{t+1}) := S(s_t) or 1
                    next_score = current[t] if terminal_score == "current" else 1.0
                    is_novel = float(step.valid)
            row.append(omega * is_novel + (0.5 - omega) * (current[t] - next_score) + 0.5 * success)
            novel.append(is_novel)
        rewards.append(row)
        scores += current
    stats = {
        "mean_state_score": sum(scores) / len(scores) if scores else 0.0,
        "low_score_fraction": sum(s < 0.01 for s in scores) / len(scores) if scores else 0.0,
        "novel_fraction": sum(novel) / len(novel) if novel else 0.0,
    }
    return rewards, stats


def sspo_advantages_with_stats(
    group: Group,
    *,
    table: StateScoreTable | None = None,
    mode: str = "mean_norm",
    episode_weight: float = 0.0,
    terminal_score: str = "current",
    invalid_penalty: float = 0.1,
    eps: float = 1e-6,
) -> tuple[StepAdvantages, dict[str, float]]:
    """3SPO advantages plus diagnostics. Reads `table`, never changes it.

    Args:
        group: The healthy trajectories of one task.
        table: The state statistics before this batch (None: an empty table, every state unseen).
        mode: "mean_norm" (A = ρ − μ_c; 3SPO `remove_std=True`, its default) or "mean_std_norm" (/(σ_c + ε)).
        episode_weight: w_E, weight of an added episode-level GRPO advantage over the n returns, normalised like
            `mode` (0: the 3SPO code, R_3SPO only; an option for a port without branching,
            docs/methods/3spo.md#our-choices).
        terminal_score: Only for trajectories that recorded neither the `state_key` signal nor (without state keys)
            the next observation: S of the unknown state after an episode's last action, "current" (S(s_t), no
            score change) or "unseen" (1).
        invalid_penalty: λ, subtracted from the step reward of invalid steps before centring (verl-agent 0.1).
        eps: ε of `mean_std_norm` (3SPO / GiGPO: 1e-6).

    Returns:
        (advantages, stats): one list per trajectory with one advantage per step, and {"mean_step_reward": mean
        R_3SPO, "mean_state_score": mean S(s_t) over steps, "low_score_fraction": fraction of steps with
        S(s_t) < 0.01, "novel_fraction": fraction of steps with R_novel = 1, "singleton_fraction": fraction of
        same-state groups with one step (their A is 0 before w_E)}; zeros for a group without steps.
    """
    check_choice("mode", mode, MODES)
    check_group(group, invalid_penalty)
    if not math.isfinite(episode_weight):
        raise ValueError(f"episode_weight must be finite, got {episode_weight}")
    if not eps > 0:
        raise ValueError(f"eps must be > 0, got {eps}")
    table = table if table is not None else StateScoreTable()
    scale = mode == "mean_std_norm"

    # Eq. 2, then ρ = R − λ·[invalid]; every distinct step once (a tree's shared steps: in their first, owning,
    # trajectory; the other paths through them get 0, so the rows' sum over paths trains them with their A).
    rewards, stats = sspo_step_rewards(group, table, terminal_score)
    flat, states, position = [], [], {}  # position: (trajectory, step) -> index into flat, distinct steps only
    seen: set[int] = set()
    for i, (traj, row) in enumerate(zip(group.trajectories, rewards, strict=True)):
        for t, (step, reward) in enumerate(zip(traj.steps, row, strict=True)):
            if id(step) in seen:
                continue
            seen.add(id(step))
            position[i, t] = len(flat)
            flat.append(reward - invalid_penalty if not step.valid else reward)
            states.append(state_identity(step))

    # Siblings: the steps of the group taken from the same state; A = (ρ − μ_c)/F, a singleton gets 0.
    siblings: dict[Hashable, list[int]] = {}
    for index, state in enumerate(states):
        siblings.setdefault(state, []).append(index)
    step_advantages = [0.0] * len(flat)
    singletons = 0
    for rows in siblings.values():
        if len(rows) == 1:
            singletons += 1
            continue
        values = [flat[r] for r in rows]
        mean, std = mean_std(values)
        for r, a in zip(rows, normalize(values, mean, std, scale=scale, eps=eps), strict=True):
            step_advantages[r] = a

    # Optional episode-level term w_E·A^E (λ already enters through ρ, so none here).
    episode = (
        episode_advantages(group, scale=scale, statistic="trajectories", invalid_penalty=0.0, eps=eps)
        if episode_weight
        else [[0.0] * len(traj.steps) for traj in group.trajectories]
    )
    advantages: StepAdvantages = []
    for i, episode_row in enumerate(episode):
        advantages.append([
            episode_weight * a_e + (step_advantages[position[i, t]] if (i, t) in position else 0.0)
            for t, a_e in enumerate(episode_row)
        ])

    stats = {
        "mean_step_reward": sum(r for row in rewards for r in row) / len(flat) if flat else 0.0,
        **stats,
        "singleton_fraction": singletons / len(siblings) if siblings else 0.0,
    }
    return advantages, stats
