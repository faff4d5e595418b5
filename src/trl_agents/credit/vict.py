"""VICT advantages: an episode's group-relative advantage moved onto the steps that witnessed its verifier atoms.

VICT (Li, Zhang, Zhang, Huang, Ma 2026, "verifier-instrumented credit tracing", arXiv 2608.28128; no code released),
as specified in docs/methods/vict.md ([P] skeleton, [D] concrete rule). The environment's instrumented verifier
(`AgentEnv.verify()`, recorded by the rollout engine as the last step's `"verifier_atoms"` signal, `step.signals["verifier_atoms"]`) returns atoms k
with a status (sat / unsat / unknown), a witness step w_k (the step that produced or revealed the fact) and
dependency edges (a DAG). With T_i the number of steps of episode i:

    A_i        = (R_i − mean_j R_j)/(std_j R_j + ε)   or   R_i − mean_j R_j          group-relative (GRPO) advantage
    C_i        = core(atoms_i, success_i)                                              step 2
                 success: every atom (the success predicate is their conjunction, so all of them are needed);
                 failure, "greedy": the first atom in dependency order that is not sat (the first unsat atom
                 decides a conjunction); "all_unsat": every unsat atom; "none": failures are not traced
    (t → k)    valid ⇔ k ∈ C_i, w_k = t, and w_d ≤ t for every dependency d of k      step 3
                 (checked along every edge below the core: each transitive dependency needs a witness, no later
                 than the atoms that depend on it)
    abstain    ⇔ a core atom unknown; a core atom or one it depends on without witness, with several, or with one
                 outside [0, T_i); an edge that is not dependency-valid; a dependency on a missing atom or a cycle;
                 no atoms; atoms that contradict the episode's success flag                step 4
    E_i        = {w_k : k ∈ C_i}                                                       edge steps
    A_{i,t}    = A_i·[(1 − ρ) + ρ·T_i·1[t ∈ E_i]/|E_i|] − λ·[invalid_{i,t}]            step 5 (mass-preserving)
    A_{i,t}    = A_i − λ·[invalid_{i,t}]                                               abstained: GRPO's broadcast

Whether a trajectory is traced or not, Σ_t A_{i,t} = T_i·A_i − λ·#invalid_i, GRPO's total: rewards, returns and the
group statistics are unchanged; only where the credit lands moves. ρ = 1 (our default, docs/methods/vict.md#our-choices) puts all of it on
the edge steps; 1 − ρ stays broadcast. The invalid-action penalty stays on its own step, as in GRPO.

Example (the hand-computed case of docs/methods/vict.md, A = +1 and −1):
    >>> from trl_agents.trajectory import Group, Step, Trajectory
    >>> def episode(reward, success, atoms):
    ...     steps = [Step("s", "a") for _ in range(4)]
    ...     steps[-1].reward, steps[-1].signals["verifier_atoms"] = reward, atoms
    ...     return Trajectory(task={}, steps=steps, success=success)
    >>> k1 = {"name": "k1", "status": "sat", "witness_step": 1, "depends_on": []}
    >>> k2 = {"name": "k2", "status": "sat", "witness_step": 3, "depends_on": ["k1"]}
    >>> violated = {"name": "k2", "status": "unsat", "witness_step": 2, "depends_on": ["k1"]}
    >>> group = Group(task={}, trajectories=[episode(2.0, True, [k1, k2]), episode(0.0, False, [k1, violated])])
    >>> params = VICTParams(scale_rewards="none")
    >>> vict_advantages([group], params)[0]
    [[[0.0, 2.0, 0.0, 2.0], [0.0, 0.0, -4.0, 0.0]]]
    >>> early = {**k2, "witness_step": 0}  # k2 witnessed before its dependency k1: abstain, broadcast
    >>> group = Group(task={}, trajectories=[episode(2.0, True, [k1, early]), episode(0.0, False, [k1, violated])])
    >>> vict_advantages([group], params)[0]
    [[[1.0, 1.0, 1.0, 1.0], [0.0, 0.0, -4.0, 0.0]]]
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..trajectory import Group
from .base import (CreditParams, Stats, StepAdvantages, check_choice, check_group, check_positive, mean_std, normalize,
                   register_estimator, runtime_field)

ATOM_STATUSES = ("sat", "unsat", "unknown")
FAILURE_CORES = ("greedy", "all_unsat", "none")
ABSTAIN_REASONS = (
    "no_atoms",  # the last step carries no verifier atoms (or an empty list)
    "ambiguous",  # two atoms share a name, or an atom names several candidate witness steps
    "dangling_edge",  # an atom depends on a name that is not among the atoms
    "cycle",  # the dependency edges are not a DAG
    "inconsistent",  # success with an unsat atom, or a failure whose atoms are all sat
    "unknown",  # a core atom (for greedy failures: the first non-sat atom in dependency order) is unknown
    "missing_witness",  # a core atom, or an atom it depends on (transitively), has no witness step
    "out_of_range",  # a witness step outside [0, T)
    "order",  # below the core, a dependency witnessed after its dependent: the edge is not dependency-valid
    "failure_not_traced",  # failure_core="none": failed episodes keep the broadcast credit
)
VERIFIER_ATOMS_KEY = "verifier_atoms"


@dataclass(frozen=True)
class Trace:
    """What VICT found in one trajectory's atoms: the core, its edge steps, or why it abstained.

    Args:
        core: Names of the core atoms (empty when abstaining).
        edge_steps: The distinct witness steps of the core, ascending (E_i; empty when abstaining).
        abstain: None when the edges are valid, else one of `ABSTAIN_REASONS`.
    """

    core: tuple[str, ...] = ()
    edge_steps: tuple[int, ...] = ()
    abstain: str | None = None


@dataclass(frozen=True)
class _Atom:
    name: str
    status: str
    witnesses: tuple[int, ...]  # candidate witness steps: () none, (w,) one, more: ambiguous
    depends_on: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class VICTParams(CreditParams):
    """Settings of `vict_advantages` (config fields of `VICTConfig`).

    Attributes:
        scale_rewards: "group": A_i = (R_i − μ)/(σ + ε) over the n episode returns (GRPO, Bessel std); "none": R_i − μ.
        edge_share: ρ ∈ [0, 1], the share of A_i moved onto the edge steps; 1 − ρ stays on every step
            (docs/methods/vict.md step 5, ρ = 1 by default).
        failure_core: Core of a failed episode: "greedy" (the first non-sat atom in dependency order, ties in the
            verifier's order; abstain if it is unknown), "all_unsat" (every unsat atom; abstain on any unknown atom),
            or "none" (failed episodes keep the broadcast credit).
        invalid_action_penalty: λ, subtracted on the steps whose action was invalid (after the redistribution).
        eps: ε added to the std (TRL: 1e-4); not a config field.
    """

    scale_rewards: str = "group"
    edge_share: float = 1.0
    failure_core: str = "greedy"
    eps: float = runtime_field(1e-4)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_choice("scale", self.scale_rewards, ("group", "none"))
        check_choice("failure_core", self.failure_core, FAILURE_CORES)
        check_positive("eps", self.eps)
        if not (math.isfinite(self.edge_share) and 0.0 <= self.edge_share <= 1.0):
            raise ValueError(f"edge_share (ρ) must be in [0, 1], got {self.edge_share}")


@register_estimator("vict", VICTParams)
def vict_advantages(groups: Sequence[Group], params: VICTParams) -> tuple[list[StepAdvantages], Stats]:
    """VICT advantages for every step of every trajectory of every group.

    Each trajectory's last step holds its verifier atoms in `signals["verifier_atoms"]` (dicts or `VerifierAtom`s with
    `name`, `status`, `witness_step`, `depends_on`).

    Returns:
        (advantages, stats): per group, one list per trajectory with one advantage per step; stats over the
        trajectories with at least one step: "abstention_rate" (abstained / trajectories), "mean_credited_steps"
        (Σ|E_i| / traced trajectories), "credited_step_fraction" (Σ|E_i| / Σ T_i over the traced ones) and
        "abstain/<reason>" (trajectories abstaining for that reason / trajectories) for every reason of
        `ABSTAIN_REASONS`.
    """
    counts = dict.fromkeys(["trajectories", "abstained", "credited_steps", "traced_steps",
                            *(f"abstain/{reason}" for reason in ABSTAIN_REASONS)], 0)
    advantages = [_vict_group(group, params, counts) for group in groups]
    trajectories, traced = counts["trajectories"], counts["trajectories"] - counts["abstained"]
    return advantages, {
        "abstention_rate": (counts["abstained"], trajectories),
        "mean_credited_steps": (counts["credited_steps"], traced),
        "credited_step_fraction": (counts["credited_steps"], counts["traced_steps"]),
        **{f"abstain/{reason}": (counts[f"abstain/{reason}"], trajectories) for reason in ABSTAIN_REASONS},
    }


def _vict_group(group: Group, params: VICTParams, stats: dict[str, int]) -> StepAdvantages:
    """VICT on one group; adds its counts (trajectories, abstained, credited and traced steps, abstentions per reason)
    to `stats`."""
    check_group(group)

    # Group-relative advantage A_i of each episode (GRPO over the n episode returns).
    returns = [traj.episode_return for traj in group.trajectories]
    mean, std = mean_std(returns)
    episode = normalize(returns, mean, std, scale=params.scale_rewards == "group", eps=params.eps)

    advantages: StepAdvantages = []
    for a_i, traj in zip(episode, group.trajectories, strict=True):
        steps = traj.steps
        if not steps:
            advantages.append([])
            continue
        # Steps 1-4: trace the core atoms to their witness steps along dependency-valid edges, or abstain.
        trace = trace_proof_edges(
            steps[-1].signals.get(VERIFIER_ATOMS_KEY), len(steps), traj.success, failure_core=params.failure_core
        )
        # Step 5: mass-preserving redistribution along the edges (broadcast when abstaining), then λ locally.
        row = redistribute(a_i, len(steps), trace.edge_steps, params.edge_share)
        penalty = params.invalid_action_penalty
        advantages.append([a - penalty if not step.valid else a for a, step in zip(row, steps, strict=True)])
        stats["trajectories"] += 1
        if trace.abstain is not None:
            stats["abstained"] += 1
            stats[f"abstain/{trace.abstain}"] += 1
        else:
            stats["credited_steps"] += len(trace.edge_steps)
            stats["traced_steps"] += len(steps)
    return advantages


def redistribute(advantage: float, num_steps: int, edge_steps: Sequence[int], edge_share: float = 1.0) -> list[float]:
    """A_t = A·[(1 − ρ) + ρ·T·1[t ∈ E]/|E|] for t < T (docs/methods/vict.md step 5); with no edge steps, A on every step.

    The T values always sum to T·A (what GRPO's broadcast gives the episode).

    >>> redistribute(1.0, 4, [1, 3])
    [0.0, 2.0, 0.0, 2.0]
    >>> redistribute(-1.0, 4, [2], edge_share=0.5)
    [-0.5, -0.5, -2.5, -0.5]
    >>> redistribute(1.0, 3, [])
    [1.0, 1.0, 1.0]
    """
    edges = set(edge_steps)
    if not edges:
        return [advantage] * num_steps
    if any(not 0 <= t < num_steps for t in edges):
        raise ValueError(f"edge steps {sorted(edges)} must lie in [0, {num_steps})")
    # (+ 0.0 turns the −0.0 of a negative advantage times ρ = 1 into 0.0.)
    on_edge = advantage * ((1.0 - edge_share) + edge_share * num_steps / len(edges)) + 0.0
    off_edge = advantage * (1.0 - edge_share) + 0.0
    return [on_edge if t in edges else off_edge for t in range(num_steps)]


def trace_proof_edges(
    atoms: Sequence[Any] | None, num_steps: int, success: bool, *, failure_core: str = "greedy"
) -> Trace:
    """The core atoms of one trajectory and their edge steps, or the reason to abstain (docs/methods/vict.md, steps 1-4).

    The first problem found names the reason. Checks run in this order: atoms present, unique names, dependencies
    among the atoms, no cycle; the core (success flag consistent with the statuses, no unknown core atom); then one
    witness in range for each atom of the core and below it, in dependency order; last, the order of the edges.

    Args:
        atoms: The verifier atoms of the finished episode (dicts or `VerifierAtom`s); None when none were recorded.
            `witness_step` is an int, None, or a list of candidate steps (more than one distinct: ambiguous).
        num_steps: T, the number of steps of the trajectory (witness steps index them, invalid steps included).
        success: Whether the episode succeeded (selects the success or the failure core).
        failure_core: "greedy", "all_unsat" or "none" (see `VICTParams.failure_core`).

    Example (success: both atoms are the core; their witnesses, in dependency order, are the edges):
        >>> atoms = [{"name": "k1", "status": "sat", "witness_step": 1},
        ...          {"name": "k2", "status": "sat", "witness_step": 3, "depends_on": ["k1"]}]
        >>> trace_proof_edges(atoms, 4, success=True)
        Trace(core=('k1', 'k2'), edge_steps=(1, 3), abstain=None)
        >>> trace_proof_edges(atoms, 3, success=True).abstain
        'out_of_range'
    """
    check_choice("failure_core", failure_core, FAILURE_CORES)
    if not atoms:
        return Trace(abstain="no_atoms")
    parsed = [_parse_atom(raw, index) for index, raw in enumerate(atoms)]
    by_name = {atom.name: atom for atom in parsed}
    if len(by_name) != len(parsed):
        return Trace(abstain="ambiguous")
    if any(d not in by_name for atom in parsed for d in atom.depends_on):
        return Trace(abstain="dangling_edge")
    order = _dependency_order(parsed)
    if order is None:
        return Trace(abstain="cycle")

    # Step 2: the core. Success: every atom (all must be sat). Failure: per `failure_core`.
    if success:
        if any(atom.status == "unsat" for atom in parsed):
            return Trace(abstain="inconsistent")
        if any(atom.status == "unknown" for atom in parsed):
            return Trace(abstain="unknown")
        core = order
    elif failure_core == "none":
        return Trace(abstain="failure_not_traced")
    elif failure_core == "greedy":
        first = next((atom for atom in order if atom.status != "sat"), None)
        if first is None:
            return Trace(abstain="inconsistent")
        if first.status == "unknown":
            return Trace(abstain="unknown")
        core = [first]
    else:  # all_unsat
        if any(atom.status == "unknown" for atom in parsed):
            return Trace(abstain="unknown")
        core = [atom for atom in order if atom.status == "unsat"]
        if not core:
            return Trace(abstain="inconsistent")

    # Steps 3-4: the core atoms and everything they depend on (transitively) need one witness step in range, and
    # every dependency edge among them must be dependency-valid: w_d ≤ w_k. Only the core's witnesses get credit.
    support = {atom.name for atom in core}
    pending = [atom.name for atom in core]
    while pending:
        for name in by_name[pending.pop()].depends_on:
            if name not in support:
                support.add(name)
                pending.append(name)
    witness = {}
    for atom in order:  # dependency order: the first problem found is the earliest in the proof
        if atom.name in support:
            t, problem = _witness(atom, num_steps)
            if problem:
                return Trace(abstain=problem)
            witness[atom.name] = t
    for name, t in witness.items():
        if any(witness[d] > t for d in by_name[name].depends_on):
            return Trace(abstain="order")
    edge_steps = sorted({witness[atom.name] for atom in core})
    return Trace(core=tuple(atom.name for atom in core), edge_steps=tuple(edge_steps))


def _witness(atom: _Atom, num_steps: int) -> tuple[int, str | None]:
    """(witness step, None), or (-1, reason) when the atom has none, several, or one outside [0, T)."""
    if not atom.witnesses:
        return -1, "missing_witness"
    if len(atom.witnesses) > 1:
        return -1, "ambiguous"
    (t,) = atom.witnesses
    if not 0 <= t < num_steps:
        return -1, "out_of_range"
    return t, None


def _dependency_order(atoms: list[_Atom]) -> list[_Atom] | None:
    """Atoms in dependency order (Kahn's algorithm; among ready atoms the verifier's order first); None on a cycle."""
    index = {atom.name: i for i, atom in enumerate(atoms)}
    waiting = [len(set(atom.depends_on)) for atom in atoms]
    dependents: list[list[int]] = [[] for _ in atoms]
    for i, atom in enumerate(atoms):
        for name in set(atom.depends_on):
            dependents[index[name]].append(i)
    ready = [i for i, count in enumerate(waiting) if count == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(atoms[i])
        for j in dependents[i]:
            waiting[j] -= 1
            if waiting[j] == 0:
                heapq.heappush(ready, j)
    return order if len(order) == len(atoms) else None


def _parse_atom(raw: Any, index: int) -> _Atom:
    """Read one atom (a dict as the rollout engine records it, or a `VerifierAtom`); malformed ones raise."""

    def get(name: str, default: Any = None) -> Any:
        if isinstance(raw, Mapping):
            return raw.get(name, default)
        return getattr(raw, name, default)

    name, status = get("name"), get("status")
    contract = "(see trl_agents.envs.base.VerifierAtom: name, status, witness_step, depends_on)"
    if not isinstance(name, str) or not name:
        raise ValueError(f"verifier atom {index} has no name: {raw!r} {contract}")
    if status not in ATOM_STATUSES:
        raise ValueError(f"verifier atom {name!r} has status {status!r}; expected one of {ATOM_STATUSES} {contract}")
    witness = get("witness_step")
    if witness is None:
        witnesses: tuple[int, ...] = ()
    elif _is_step(witness):
        witnesses = (int(witness),)
    elif isinstance(witness, (list, tuple)) and all(_is_step(w) for w in witness):
        witnesses = tuple(sorted({int(w) for w in witness}))
    else:
        raise ValueError(
            f"verifier atom {name!r} has witness_step {witness!r}; expected a step index, None or a list of "
            f"candidate indices {contract}"
        )
    depends_on = get("depends_on") or ()
    if isinstance(depends_on, str) or not all(isinstance(d, str) for d in depends_on):
        raise ValueError(f"verifier atom {name!r} has depends_on {depends_on!r}; expected a list of names {contract}")
    return _Atom(name, status, witnesses, tuple(depends_on))


def _is_step(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
