"""`info_gain`: a tree per task grown under a leaf budget, expanding the nodes whose tool observation raised the
policy's likelihood of the gold answer the most (IGRPO, arXiv 2607.06223; docs/methods/igrpo.md).

A node is the state right after a tool observation (on Search-QA, after a `search[...]` step; the node rule, the
gains and the selection are the pure functions of this module, the leaf weights and advantages are
`trl_agents.credit.igrpo`). Round 1 launches `num_generations` root episodes per task, with an
environment snapshot before every action. Every time a task has no active episode (schedule "free": a task's rounds
read only its own tree and draw from its own random stream, so each task grows alone; in lockstep, every time no
episode is active, all tasks at once):

1. the gold-answer likelihood p(a* | h) of every node not scored yet, of the task(s) being decided, in ONE batched
   no-grad forward (the model signal `gold_likelihood`, through `RolloutView.compute_signal`); a fork's first own
   step is the node it forked from and takes its parent's value (same prompt), so a node is scored once;
2. for every such task with fewer than `leaf_budget` episodes: its frontier (the nodes of its tree, each once, not
   suppressed, with a snapshot) gets informativeness I(n) = p(n) − p(previous node on the path, or the root);
   `expansions_per_round` times, a node is drawn with probability softmax(I/T_I) (seeded) and expanded into
   `expansion_factor` new children (forks from the snapshot of that state; each samples its own next action and
   plays to the end), the last expansion trimmed to the budget;
3. every candidate of that round with I ≤ 0 gets a strike (I > 0 clears them); `suppress_after` consecutive strikes
   suppress the node for the rest of the rollout.

A task whose frontier is empty (no node yet, e.g. every episode answered at once, or all suppressed) spends the
round on `expansion_factor` fresh root episodes instead. The rollout ends when every task has `leaf_budget`
episodes (leaves: each episode is one root-to-leaf path; infrastructure-failed ones count, they cost compute); the
last call scores the nodes of the last round, so that every node on every path carries its likelihood for credit.

A *node* is recorded as step j of a trajectory whose step j − 1 was a valid action the episode went on after
(`is_node_step`); the node's history h_j is step j's prompt. The root (step 0's prompt: the question, nothing
retrieved) is the reference state. With a* the gold answer (as the action `answer[a*]`, K tokens), [D] below the
abstract (docs/methods/igrpo.md):

    p(h)      = exp( 1/K · Σ_k log π_θ(a*_k | h, a*_<k) )                  gold-answer likelihood (IGPO)
    I(n)      = p(h_n) − p(h_parent(n))                                    information gain of node n
                parent(n): the previous node on the path, the root for the first one
    P(pick n) = softmax_n( I(n) / T_I )  over the frontier (T_I = 0.1)     budgeted expansion
    strikes   = consecutive expansion rounds at which n was a candidate with I(n) ≤ 0; 2 strikes: suppressed

Softmaxes subtract the maximum (no overflow for any finite gain or temperature); non-finite likelihoods raise a
ValueError.

Example (the acceptance case: a frontier with gains [0.3, 0.0, −0.1] at T_I = 0.1):
    >>> from trl_agents.rollout.topologies import get_topology
    >>> topology = get_topology("info_gain", leaf_budget=6, expansion_factor=2)
    >>> topology.begin([{"seed": 0}], num_generations=2)
    [Launch(task_index=0, count=2)]
    >>> [round(p, 4) for p in selection_probabilities([0.3, 0.0, -0.1], temperature=0.1)]
    [0.9362, 0.0466, 0.0171]
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from itertools import pairwise
from typing import Any

from ...trajectory import Group, Step, Trajectory
from .base import Fork, Launch, Request, RolloutView, Topology, task_random

GOLD_LIKELIHOOD = "gold_likelihood"
"""The model signal holding p(a* | step prompt) on the node steps (`trainers/igrpo.py` registers it)."""


# ---- nodes and their information gain (pure) -------------------------------------------------------------------------


def gold_likelihood(logps: Sequence[float]) -> float:
    """p = exp(mean_k log π(a*_k | h, a*_<k)), the geometric-mean token probability of the gold answer (IGPO).
    0.0 for no tokens (no evidence for the answer).

    >>> round(gold_likelihood([math.log(0.5), math.log(0.125)]), 4)  # exp((ln 0.5 + ln 0.125)/2) = sqrt(1/16)
    0.25
    """
    if not len(logps):
        return 0.0
    return math.exp(sum(float(v) for v in logps) / len(logps))


def is_node_step(step: Step) -> bool:
    """Whether the state after `step` is a node: the action was valid and the episode went on (a tool call whose
    observation follows; on Search-QA every such step is a `search[...]`; `answer[...]` ends the episode)."""
    return bool(step.valid) and not step.done


def node_indices(trajectory: Trajectory, is_node: Callable[[Step], bool] = is_node_step) -> list[int]:
    """The steps j of `trajectory` whose prompt is a node's history: 0 (the root) and every j ≥ 1 whose step j − 1
    is a node step. The state after the last step has no recorded prompt, so it is not a node.

    >>> steps = [Step("o0", "search[a]"), Step("o1", "jump", valid=False), Step("o2", "search[b]"),
    ...          Step("o3", "answer[x]", done=True)]
    >>> node_indices(Trajectory(task={}, steps=steps))  # after the two searches: steps 1 and 3
    [0, 1, 3]
    """
    if not trajectory.steps:
        return []
    return [0] + [j for j in range(1, len(trajectory.steps)) if is_node(trajectory.steps[j - 1])]


def node_likelihood(step: Step, signal: str = GOLD_LIKELIHOOD) -> float:
    """The gold-answer likelihood recorded on a node step (`step.signals[signal]`), checked finite."""
    if signal not in step.signals:
        raise ValueError(
            f"IGRPO needs step.signals[{signal!r}] on every node step (the gold-answer likelihood after a tool "
            "observation): run the 'info_gain' topology, which computes it mid-rollout."
        )
    value = float(step.signals[signal])
    if not math.isfinite(value):
        raise ValueError(f"step.signals[{signal!r}] must be a finite likelihood, got {value}")
    return value


def path_information(
    trajectory: Trajectory, signal: str = GOLD_LIKELIHOOD, is_node: Callable[[Step], bool] = is_node_step
) -> list[tuple[int, float]]:
    """(j, I) for every non-root node of the path: I = p(h_j) − p(previous node on the path, or the root).

    >>> steps = [Step("o0", "search[a]", signals={"gold_likelihood": 0.1}),
    ...          Step("o1", "search[b]", signals={"gold_likelihood": 0.4}),
    ...          Step("o2", "answer[x]", done=True, signals={"gold_likelihood": 0.3})]
    >>> [(j, round(i, 4)) for j, i in path_information(Trajectory(task={}, steps=steps))]  # 0.4 − 0.1, 0.3 − 0.4
    [(1, 0.3), (2, -0.1)]
    """
    nodes = node_indices(trajectory, is_node)
    steps = trajectory.steps
    return [(j, node_likelihood(steps[j], signal) - node_likelihood(steps[previous], signal))
            for previous, j in pairwise(nodes)]


# ---- budgeted expansion ------------------------------------------------------------------------------------------


def softmax(values: Sequence[float], temperature: float) -> list[float]:
    """softmax(v / T) with the maximum subtracted (no overflow); [] for no values.

    >>> softmax([1000.0, 1000.0], temperature=0.1)
    [0.5, 0.5]
    """
    check_temperature(temperature)
    if not len(values):
        return []
    scaled = [float(v) / temperature for v in values]
    if not all(math.isfinite(v) for v in scaled):
        raise ValueError(f"softmax needs finite values, got {list(values)} at temperature {temperature}")
    top = max(scaled)
    exps = [math.exp(v - top) for v in scaled]  # the largest term is exp(0) = 1: the sum is in [1, n]
    total = sum(exps)
    return [e / total for e in exps]


def selection_probabilities(gains: Sequence[float], temperature: float = 0.1) -> list[float]:
    """P(pick n) = softmax(I(n)/T_I) over the frontier's gains.

    >>> [round(p, 4) for p in selection_probabilities([0.3, 0.0, -0.1])]  # e^3, e^0, e^-1 over 21.4534
    [0.9362, 0.0466, 0.0171]
    """
    return softmax(gains, temperature)


def sample_index(probabilities: Sequence[float], u: float) -> int:
    """The index whose cumulative-probability interval holds u ∈ [0, 1) (inverse CDF; the last index absorbs
    rounding).

    >>> sample_index([0.9362, 0.0466, 0.0171], 0.95), sample_index([0.9362, 0.0466, 0.0171], 0.1)
    (1, 0)
    """
    if not len(probabilities):
        raise ValueError("sample_index needs at least one probability")
    running = 0.0
    for index, p in enumerate(probabilities):
        running += p
        if u < running:
            return index
    return len(probabilities) - 1


def update_strikes(strikes: int, gain: float, suppress_after: int = 2) -> tuple[int, bool]:
    """One expansion round for a frontier candidate: (new strike count, suppressed). A round with I ≤ 0 adds a
    strike, a round with I > 0 clears them; `suppress_after` consecutive strikes suppress the node for good.

    >>> update_strikes(0, 0.0), update_strikes(1, -0.2), update_strikes(1, 0.05)
    ((1, False), (2, True), (0, False))
    """
    if suppress_after < 1:
        raise ValueError(f"suppress_after must be >= 1, got {suppress_after}")
    strikes = strikes + 1 if gain <= 0.0 else 0
    return strikes, strikes >= suppress_after


def check_temperature(temperature: float) -> None:
    if isinstance(temperature, bool) or not (isinstance(temperature, (int, float)) and math.isfinite(temperature)
                                             and temperature > 0):
        raise ValueError(f"the information-gain temperature T_I must be a finite number > 0, got {temperature!r}")


# ---- the topology ----------------------------------------------------------------------------------------------------


class InfoGainTopology(Topology):
    """Roots, then rounds of information-gain-driven expansions until each task has `leaf_budget` leaves.

    Args:
        leaf_budget: B, episodes (leaves) per task, roots included (>= num_generations).
        expansion_factor: k, new children of an expanded node (>= 1; 2 in IGRPO's design).
        temperature: T_I of the selection softmax (0.1).
        suppress_after: Consecutive rounds with I ≤ 0 after which a node is never picked again (2).
        expansions_per_round: Nodes drawn per task and round (with replacement; a node drawn twice gets 2k children).
        seed: Seed of the selection's draws (each task's draws are seeded by the seed, the rollout's number and the
            task, whatever other tasks the rollout holds).
        is_node: Which steps lead to a node (`is_node_step`: a valid step the episode went on after).
    """

    name = "info_gain"
    schedule = "free"
    needs_snapshots = True
    required_capabilities = ("snapshot",)
    model_signals = (GOLD_LIKELIHOOD,)

    def __init__(
        self,
        leaf_budget: int = 8,
        expansion_factor: int = 2,
        temperature: float = 0.1,
        suppress_after: int = 2,
        expansions_per_round: int = 1,
        seed: int = 0,
        is_node: Callable[[Step], bool] = is_node_step,
    ):
        for field, value in (("leaf_budget", leaf_budget), ("expansion_factor", expansion_factor),
                             ("suppress_after", suppress_after), ("expansions_per_round", expansions_per_round)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{field} must be an integer >= 1, got {value!r}")
        check_temperature(temperature)
        self.leaf_budget = leaf_budget
        self.expansion_factor = expansion_factor
        self.temperature = float(temperature)
        self.suppress_after = suppress_after
        self.expansions_per_round = expansions_per_round
        self.is_node = is_node
        self.seed = seed
        self._rollouts = 0  # rollouts begun: with the task, it seeds the task's draws
        self._rngs: list[random.Random] = []
        self._reset(0)

    def _reset(self, num_tasks: int) -> None:
        self._rounds = [0] * num_tasks  # rounds per task: 1 for its roots, +1 for every round it is asked for more
        self._strikes: list[dict[int, int]] = [{} for _ in range(num_tasks)]  # node key -> consecutive strikes
        self._suppressed: list[set[int]] = [set() for _ in range(num_tasks)]
        self._candidates: list[set[int]] = [set() for _ in range(num_tasks)]  # nodes that were ever in a frontier
        self._expansions = [0] * num_tasks
        self._root_launches = [0] * num_tasks
        self._scored = [0] * num_tasks  # node steps whose likelihood was computed (not copied)
        self.signal_calls = 0

    def begin(self, tasks: Sequence[dict[str, Any]], num_generations: int) -> list[Request]:
        if num_generations > self.leaf_budget:
            raise ValueError(
                f"num_generations={num_generations} root episodes per task exceed leaf_budget={self.leaf_budget}: "
                "raise the budget or lower num_generations."
            )
        self._reset(len(tasks))
        # One generator per task, seeded by (seed, rollout, task): a task's draws do not depend on the other tasks of
        # the rollout, so a tree is the same however tasks are split between processes.
        self._rngs = [task_random(self.seed, self._rollouts, task) for task in tasks]
        self._rollouts += 1
        self._rounds = [1] * len(tasks)
        return [Launch(index, num_generations) for index in range(len(tasks))]

    @property
    def rounds(self) -> int:
        """Rounds played: the most of any task (in lockstep, the number of idle calls that asked for more, + 1)."""
        return max(self._rounds, default=0)

    def when_idle(self, view: RolloutView, task_index: int | None = None) -> list[Request]:
        """Score the new nodes of the task(s) (all for None, else `task_index` alone), then one expansion round for
        each of them below its leaf budget."""
        indices = view.task_indices(task_index)
        self.score_nodes(view, task_index)
        requests: list[Request] = []
        for index in indices:
            group = view.groups[index]
            room = self.leaf_budget - len(group.trajectories)
            if room > 0:
                requests.extend(self.expand(index, group, room))
                self._rounds[index] += 1
        return requests

    # ---- 1. the likelihood of the gold answer at every new node ----------------------------------------------------

    def score_nodes(self, view: RolloutView, task_index: int | None = None) -> None:
        """Give every node step of every healthy episode of the task(s) (all for None, else `task_index`) its
        `gold_likelihood`: copied from the parent for a fork's first own step (the same state), else in one
        `compute_signal` call for those tasks. The call is made at every idle call, with no trajectory when nothing
        is new, so that every process enters the model's context as often as the others (a DeepSpeed ZeRO-3 gather
        is collective; in lockstep, idle moments are in step across processes)."""
        pending: list[Trajectory] = []
        for index in view.task_indices(task_index):
            group = view.groups[index]
            missing: set[int] = set()
            for trajectory in group.trajectories:
                if trajectory.failed:
                    continue
                _copy_from_parent(group, trajectory)
                steps = [trajectory.steps[j] for j in node_indices(trajectory, self.is_node)]
                new = {id(step) for step in steps if GOLD_LIKELIHOOD not in step.signals}
                if new:
                    pending.append(trajectory)
                    missing |= new
            self._scored[index] += len(missing)
        view.compute_signal(GOLD_LIKELIHOOD, pending)
        self.signal_calls += 1
        for trajectory in pending:
            for j in node_indices(trajectory, self.is_node):
                node_likelihood(trajectory.steps[j])  # raises when the signal left a node without a value

    # ---- 2. and 3. selection, expansion, suppression ---------------------------------------------------------------

    def frontier(self, index: int, group: Group) -> list[tuple[int, Trajectory, int, float]]:
        """(node key, a trajectory through it, its step j, I) for every expandable node of the task's tree, each once
        (first trajectory in creation order), in creation order; suppressed nodes left out."""
        nodes, seen = [], set()
        for trajectory in group.trajectories:
            if trajectory.failed:
                continue
            indices = node_indices(trajectory, self.is_node)
            for previous, j in pairwise(indices):
                key = id(trajectory.steps[j - 1])  # the node: the state after step j − 1 (shared by its subtree)
                if key in seen or key in self._suppressed[index] or trajectory.steps[j].snapshot is None:
                    continue
                seen.add(key)
                gain = node_likelihood(trajectory.steps[j]) - node_likelihood(trajectory.steps[previous])
                nodes.append((key, trajectory, j, gain))
        return nodes

    def expand(self, index: int, group: Group, room: int) -> list[Request]:
        """The requests of one expansion round of task `index` with `room` leaves left in its budget."""
        nodes = self.frontier(index, group)
        if not nodes:  # nothing to expand: fresh roots
            count = min(self.expansion_factor, room)
            self._root_launches[index] += count
            return [Launch(index, count)]
        probabilities = selection_probabilities([gain for *_, gain in nodes], self.temperature)
        children: dict[int, int] = {}
        for _ in range(self.expansions_per_round):
            if room <= 0:
                break
            pick = sample_index(probabilities, self._rngs[index].random())
            count = min(self.expansion_factor, room)
            children[pick] = children.get(pick, 0) + count
            room -= count
            self._expansions[index] += 1
        for key, _, _, gain in nodes:  # the round is over for every candidate: strikes for I ≤ 0
            self._candidates[index].add(key)
            strikes, suppressed = update_strikes(self._strikes[index].get(key, 0), gain, self.suppress_after)
            self._strikes[index][key] = strikes
            if suppressed:
                self._suppressed[index].add(key)
        return [Fork(index, nodes[pick][1].episode_id, nodes[pick][2], count) for pick, count in
                sorted(children.items())]

    def stats(self, view: RolloutView) -> dict[str, float]:
        """Means over this process's tasks: leaves, expansions, root launches (empty frontiers), scored nodes per
        task, the suppressed fraction of the nodes that were candidates, the mean I over the scored nodes; and the
        rounds played (`rounds`: the largest on any process)."""
        groups = view.groups
        if not groups:
            return {}
        tasks = len(groups)
        gains, fractions = [], []
        for index, group in enumerate(groups):
            seen = set()
            for trajectory in group.trajectories:
                if trajectory.failed:
                    continue
                indices = node_indices(trajectory, self.is_node)
                for previous, j in pairwise(indices):
                    key = id(trajectory.steps[j - 1])
                    steps = trajectory.steps
                    if key in seen or GOLD_LIKELIHOOD not in steps[j].signals:
                        continue
                    seen.add(key)
                    gains.append(node_likelihood(steps[j]) - node_likelihood(steps[previous]))
            candidates = self._candidates[index] if index < len(self._candidates) else set()
            suppressed = self._suppressed[index] if index < len(self._suppressed) else set()
            fractions.append(len(suppressed) / len(candidates) if candidates else 0.0)
        return {
            "leaves_per_task": sum(len(group.trajectories) for group in groups) / tasks,
            "expansions_per_task": sum(self._expansions) / tasks,
            "root_launches_per_task": sum(self._root_launches) / tasks,
            "scored_nodes_per_task": sum(self._scored) / tasks,
            "suppressed_fraction": sum(fractions) / tasks,
            "mean_info_gain": sum(gains) / len(gains) if gains else 0.0,
            "rounds": float(self.rounds),
        }


def _copy_from_parent(group: Group, trajectory: Trajectory) -> None:
    """A fork's first own step starts from the state its parent's step `fork_step` started from (same prompt): it
    takes the parent's likelihood instead of a forward of its own."""
    if trajectory.parent_id is None or trajectory.fork_step >= len(trajectory.steps):
        return
    own = trajectory.steps[trajectory.fork_step]
    if GOLD_LIKELIHOOD in own.signals:
        return
    try:
        parent = group.trajectory(trajectory.parent_id)
    except KeyError:
        return
    if trajectory.fork_step < len(parent.steps):
        source = parent.steps[trajectory.fork_step]
        if GOLD_LIKELIHOOD in source.signals and list(source.prompt_ids) == list(own.prompt_ids):
            own.signals[GOLD_LIKELIHOOD] = source.signals[GOLD_LIKELIHOOD]
