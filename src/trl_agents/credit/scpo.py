"""SCPO advantages: positive step rewards for failed episodes that make progress along a successful sibling, then
GiGPO.

SCPO (Xu, Chen, Li, Hu 2026, arXiv 2606.25852). Evidence: the abstract [P] and a digest of the paper [S]
("a reranker scores each failed step against the successful sibling's steps; reward positive only when the match
moves further along the sibling; added to GiGPO's step rewards; no effect when no sibling succeeded"); parameters
are our design [D]. The steps of docs/methods/scpo.md#equations:

    s*        = the shortest successful episode of the group (ties: higher return, then content)   step 1 [D]
    S[t, j]   = score(f_t, s*) ∈ [0, 1], one score per step j of s*  (pluggable scorer)           step 2 [S]
    p_t       = max{ j : S[t, j] ≥ τ },  −1 if none (and for invalid steps)                       step 3 [D]
    P_t       = max(P_{t−1}, p_t),  P_{−1} = −1                           progress frontier       step 3 [D]
    r̃_t       = c·(P_t − P_{t−1})/|s*|,  c = κ·R(s*)                      new progress only        step 4 [P]+[D]
    r'_t      = r_t + r̃_t          for failed episodes only; successful ones keep r_t              step 5 [P]
    A         = GiGPO(r')          A^E + ω·A^S on the shaped rewards ("episode_and_step"), or
              = A^E(r) + ω·A^S(r') the shaping only in the step-level returns ("step")            step 5 [S]

The design's c = 0.5·r_success is κ = 0.5 times the return of the chosen sibling (docs/methods/scpo.md#our-choices).
The total shaping of a failed episode is c·(P_T + 1)/|s*| ≤ c (a failure that retraces the whole sibling earns at
most κ of its return). A group without a success, or without a failure, gets exactly the GiGPO advantages.

Scorers (step 2): `score(failed_step, sibling) -> one value in [0, 1] per step of the sibling`, any callable;
built-in, by name (`get_scorer`): "lexical" (default: token-overlap Dice of observation and canonical action),
"difflib" (character `SequenceMatcher` ratio; ~80x slower than "lexical" on ALFWorld-sized observations, for short
texts) and "exact" (same state and same canonical action). The paper's cross-encoder reranker plugs in as a
callable; the built-ins keep caches, so keep one instance for a run (the trainer does).
"""

from __future__ import annotations

import abc
import dataclasses
import difflib
import math
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..names import did_you_mean
from ..trajectory import Group, Step, Trajectory
from .base import (StepAdvantages, Stats, anchor_key, canonical_action, check_choice, check_group, group_totals,
                   register_estimator)
from .gigpo import GiGPOParams, gigpo_group

Scorer = Callable[[Step, Trajectory], Sequence[float]]
"""`scorer(failed_step, successful_sibling)`: how far along the sibling the step is, one score in [0, 1] per
sibling step (the reranker relevance of the failed step to each sibling step)."""

SIBLING_CHOICES = ("shortest", "highest_return")
SHAPING_LEVELS = ("episode_and_step", "step")
SCPO_METRICS = ("shaped_group_fraction", "mean_progress", "mean_shaping_return", "matched_step_fraction",
                "mean_anchor_group_size")
SCORERS: dict[str, Callable[..., Scorer]] = {}


def register_scorer(name: str) -> Callable[[Callable[..., Scorer]], Callable[..., Scorer]]:
    """Decorator: register a scorer factory (a class or a function returning a scorer) under `name`."""

    def decorator(factory: Callable[..., Scorer]) -> Callable[..., Scorer]:
        if name in SCORERS and SCORERS[name] is not factory:
            raise ValueError(f"an SCPO scorer named {name!r} is already registered")
        SCORERS[name] = factory
        return factory

    return decorator


def get_scorer(scorer: str | Scorer, **options) -> Scorer:
    """A scorer instance: the built-in registered as `scorer` (built with `options`), or `scorer` itself when it is
    a callable.

    >>> get_scorer("lexcal")
    Traceback (most recent call last):
    ...
    ValueError: Unknown SCPO scorer 'lexcal'. Known: difflib, exact, lexical. Did you mean 'lexical'?
    """
    if callable(scorer):
        return scorer
    if scorer not in SCORERS:
        known = sorted(SCORERS)
        hint = did_you_mean(scorer, known)
        raise ValueError(f"Unknown SCPO scorer {scorer!r}. Known: {', '.join(known)}.{hint}")
    return SCORERS[scorer](**options)


class _TextScorer(abc.ABC):
    """Similarity of the (observation, canonical action) pair: (1 − w)·sim(observations) + w·sim(actions).

    Caches: the similarity of every pair of texts seen (bounded), and, for the sibling of the latest call, the row
    of similarities of each failed-step text to the sibling's texts (the failed steps of a group are scored against
    the same sibling one after the other). A sibling is recognised by identity: do not mutate it between calls.
    """

    def __init__(self, action_weight: float = 0.5):
        if not (math.isfinite(action_weight) and 0.0 <= action_weight <= 1.0):
            raise ValueError(f"action_weight must be in [0, 1], got {action_weight}")
        self.action_weight = action_weight
        self._pairs: dict[tuple[str, str], float] = {}
        self._sibling: Trajectory | None = None
        self._sibling_texts: dict[str, list[str]] = {}
        self._rows: dict[tuple[str, str], list[float]] = {}
        self._combined: dict[tuple[str, str], list[float]] = {}

    @abc.abstractmethod
    def similarity(self, first: str, second: str) -> float:
        """Similarity in [0, 1] of two texts (1 for identical texts)."""

    def _row(self, kind: str, text: str) -> list[float]:
        row = self._rows.get((kind, text))
        if row is None:
            if len(self._pairs) > 1_000_000:  # a scorer lives through a whole training run: bound its memory
                self._pairs.clear()
            row = []
            for other in self._sibling_texts[kind]:
                value = self._pairs.get((text, other))
                if value is None:
                    value = self._pairs[(text, other)] = self.similarity(text, other)
                row.append(value)
            self._rows[(kind, text)] = row
        return row

    def __call__(self, step: Step, sibling: Trajectory) -> list[float]:
        if sibling is not self._sibling:
            self._sibling = sibling
            self._sibling_texts = {
                "observation": [other.observation for other in sibling.steps],
                "action": [canonical_action(other) for other in sibling.steps],
            }
            self._rows, self._combined = {}, {}
        key = (step.observation, canonical_action(step))
        combined = self._combined.get(key)
        if combined is None:
            w = self.action_weight
            observations, actions = self._row("observation", key[0]), self._row("action", key[1])
            combined = self._combined[key] = [(1.0 - w) * o + w * a for o, a in zip(observations, actions, strict=True)]
        return list(combined)


@register_scorer("lexical")
class LexicalScorer(_TextScorer):
    """Token-overlap (Dice) similarity 2·|a ∩ b|/(|a| + |b|) over the multisets of lower-cased word and punctuation
    tokens, of the observations and of the canonical actions, mixed with weight `action_weight` (our choice,
    docs/methods/scpo.md step 2: a cheap offline stand-in for the paper's reranker).

    >>> scorer = LexicalScorer()
    >>> sibling = Trajectory(task={}, steps=[Step("You see a mug.", "take mug"), Step("You hold a mug.", "go to sink")])
    >>> [round(s, 3) for s in scorer(Step("You see a mug.", "Take  MUG"), sibling)]  # 0.5·(2·4/10) + 0.5·0
    [1.0, 0.4]
    """

    def __init__(self, action_weight: float = 0.5):
        super().__init__(action_weight)
        self._bags: dict[str, frozenset] = {}

    def _bag(self, text: str) -> frozenset:
        """The token multiset as a set of (token, occurrence) pairs: set intersection = multiset intersection."""
        bag = self._bags.get(text)
        if bag is None:
            if len(self._bags) > 100_000:
                self._bags.clear()
            counts = Counter(re.findall(r"\w+|[^\w\s]", text.lower()))
            bag = self._bags[text] = frozenset((token, k) for token, count in counts.items() for k in range(count))
        return bag

    def similarity(self, first: str, second: str) -> float:
        a, b = self._bag(first), self._bag(second)
        total = len(a) + len(b)
        if total == 0:
            return 1.0  # two empty texts are identical
        return 2.0 * len(a & b) / total


@register_scorer("difflib")
class DifflibScorer(_TextScorer):
    """Character similarity `difflib.SequenceMatcher(None, a, b).ratio()` of the observations and of the canonical
    actions, mixed with weight `action_weight` (our choice; order-aware, slower than "lexical").

    >>> sibling = Trajectory(task={}, steps=[Step("abcd", "up")])
    >>> DifflibScorer()(Step("abce", "up"), sibling)
    [0.875]
    """

    def similarity(self, first: str, second: str) -> float:
        return difflib.SequenceMatcher(None, first, second, autojunk=False).ratio()


@register_scorer("exact")
class ExactScorer:
    """1 when the failed step acted from the same state as the sibling step (`state_key`, the observation when there
    is none) with the same canonical action, else 0 (our choice: exact progress for environments with state keys).

    >>> sibling = Trajectory(task={}, steps=[Step("a", "up", state_key=1), Step("b", "left", state_key=2)])
    >>> ExactScorer()(Step("b, seen differently", "Left", state_key=2), sibling)
    [0.0, 1.0]
    """

    def __init__(self, action_weight: float | None = None):
        del action_weight  # accepted so that every built-in takes the same options; unused here
        self._sibling: Trajectory | None = None
        self._keys: list[tuple] = []

    def __call__(self, step: Step, sibling: Trajectory) -> list[float]:
        if sibling is not self._sibling:  # (recognised by identity, as in the text scorers)
            self._sibling = sibling
            self._keys = [(anchor_key(other, "state_key"), canonical_action(other)) for other in sibling.steps]
        key = (anchor_key(step, "state_key"), canonical_action(step))
        return [1.0 if other == key else 0.0 for other in self._keys]


def progress_increments(matches: Sequence[int]) -> list[int]:
    """New progress P_t − P_{t−1} of each step along the sibling, from the matched indices p_t (−1: no match).

    docs/methods/scpo.md#hand-computed-case: p = [0, 1, 1, −1, 2] -> frontier [0, 1, 1, 1, 2] -> new progress
    [1, 1, 0, 0, 1].
        >>> progress_increments([0, 1, 1, -1, 2])
        [1, 1, 0, 0, 1]
    """
    frontier, increments = -1, []
    for p in matches:
        new_frontier = max(frontier, p)
        increments.append(new_frontier - frontier)
        frontier = new_frontier
    return increments


def choose_sibling(group: Group, sibling: str = "shortest") -> Trajectory | None:
    """The successful episode that failed ones are compared with, or None when no episode succeeded.

    "shortest": fewest steps, then highest return; "highest_return": highest return, then fewest steps. Remaining
    ties go to the smallest (observation, canonical action) sequence, so the choice does not depend on the order of
    the episodes.
    """
    check_choice("sibling", sibling, SIBLING_CHOICES)
    successes = [traj for traj in group.trajectories if traj.success and traj.steps]
    if not successes:
        return None

    def content(traj: Trajectory) -> tuple:
        return tuple((step.observation, canonical_action(step)) for step in traj.steps)

    if sibling == "shortest":
        return min(successes, key=lambda traj: (traj.num_steps, -traj.episode_return, content(traj)))
    return min(successes, key=lambda traj: (-traj.episode_return, traj.num_steps, content(traj)))


def _check_progress_settings(threshold: float, progress_coef: float, sibling: str) -> None:
    if not (math.isfinite(threshold) and 0.0 < threshold <= 1.0):
        raise ValueError(f"threshold must be in (0, 1], got {threshold}")
    if not (math.isfinite(progress_coef) and progress_coef >= 0.0):
        raise ValueError(f"progress_coef must be finite and >= 0, got {progress_coef}")
    check_choice("sibling", sibling, SIBLING_CHOICES)


def progress_rewards(
    group: Group,
    scorer: str | Scorer = "lexical",
    *,
    threshold: float = 0.8,
    progress_coef: float = 0.5,
    sibling: str = "shortest",
    action_weight: float = 0.5,
) -> tuple[StepAdvantages, dict[str, float]]:
    """Steps 1-4: the shaping reward r̃_t of every step (0 for successful episodes), and diagnostics.

    Args:
        group: The healthy trajectories of one task.
        scorer: A built-in scorer name or a callable `scorer(failed_step, sibling) -> [S[t, j] for j]`.
        threshold: τ: a sibling step j is matched when S[t, j] ≥ τ.
        progress_coef: κ: the shaping of a whole sibling retraced is c = κ·R(s*).
        sibling: Which successful episode: "shortest" (our default) or "highest_return".
        action_weight: Weight of the action similarity in the built-in text scorers.

    Returns:
        (shaping, stats): one r̃_t per step, and {"shaped": 1 when the group has a successful sibling and a failed
        episode, "failed_episodes": their number, "mean_progress": mean over failed episodes of (P_T + 1)/|s*|,
        "mean_shaping_return": mean Σ_t r̃_t over failed episodes, "matched_step_fraction": fraction of failed
        steps with a match}.

    Example (docs/methods/scpo.md#hand-computed-case: s* has 4 steps, the failed episode's matches are
    p = [0, 1, 1, −1, 2]):
        >>> sibling = Trajectory(task={}, steps=[Step(f"s{j}", "go") for j in range(3)] + [
        ...     Step("s3", "go", reward=1.0)], success=True)
        >>> failed = Trajectory(task={}, steps=[Step(o, "go") for o in ("s0", "s1", "s1", "x", "s2")])
        >>> def scorer(step, sib):
        ...     return [1.0 if step.observation == other.observation else 0.0 for other in sib.steps]
        >>> shaping, stats = progress_rewards(Group(task={}, trajectories=[sibling, failed]), scorer)
        >>> shaping  # c = 0.5 · R(s*) = 0.5; r̃ = c · [1, 1, 0, 0, 1] / 4
        [[0.0, 0.0, 0.0, 0.0], [0.125, 0.125, 0.0, 0.0, 0.125]]
        >>> stats["mean_progress"]
        0.75
    """
    _check_progress_settings(threshold, progress_coef, sibling)
    shaping = [[0.0] * traj.num_steps for traj in group.trajectories]
    failed = [i for i, traj in enumerate(group.trajectories) if not traj.success and traj.steps]
    best = choose_sibling(group, sibling)
    stats = {"shaped": 0.0, "failed_episodes": float(len(failed)), "mean_progress": 0.0,
             "mean_shaping_return": 0.0, "matched_step_fraction": 0.0}
    if best is None or not failed:
        return shaping, stats
    score = get_scorer(scorer, action_weight=action_weight) if isinstance(scorer, str) else scorer
    length = best.num_steps
    c = progress_coef * max(best.episode_return, 0.0)  # positive credit only (a non-positive "success" gives none)
    progress, matched, failed_steps, total = 0.0, 0, 0, 0.0
    for i in failed:
        matches = []
        for step in group.trajectories[i].steps:
            scores = [float(value) for value in score(step, best)]
            if len(scores) != length or not (0.0 <= min(scores) and max(scores) <= 1.0 and not math.isnan(sum(scores))):
                raise ValueError(
                    f"the SCPO scorer {scorer!r} must return one score in [0, 1] per step of the successful sibling "
                    f"({length} steps), got {scores}"
                )
            # p_t = the last matched sibling step; an invalid action changes nothing in the environment, so it never
            # makes progress (our choice).
            last = next((j for j in range(length - 1, -1, -1) if scores[j] >= threshold), -1)
            matches.append(last if step.valid else -1)
        increments = progress_increments(matches)
        shaping[i] = [c * inc / length for inc in increments]
        progress += (max(matches) + 1) / length
        matched += sum(m >= 0 for m in matches)
        failed_steps += len(matches)
        total += sum(shaping[i])
    stats.update(
        shaped=1.0,
        mean_progress=progress / len(failed),
        mean_shaping_return=total / len(failed),
        matched_step_fraction=matched / failed_steps,
    )
    return shaping, stats


def shaped_group(group: Group, shaping: StepAdvantages) -> Group:
    """A group whose step rewards are r'_t = r_t + r̃_t. The input is left untouched: shaped steps are copies, the
    others (and whole unshaped trajectories) are shared with it."""
    trajectories = []
    for traj, row in zip(group.trajectories, shaping, strict=True):
        if any(row):
            steps = [dataclasses.replace(step, reward=step.reward + extra) if extra else step
                     for step, extra in zip(traj.steps, row, strict=True)]
            traj = dataclasses.replace(traj, steps=steps)
        trajectories.append(traj)
    return Group(task=group.task, trajectories=trajectories)


@dataclass(frozen=True, kw_only=True)
class SCPOParams(GiGPOParams):
    """Settings of `scpo_advantages` (config fields of `SCPOConfig`): GiGPO's (`GiGPOParams`, the estimator SCPO
    shapes) plus SCPO's.

    Attributes:
        scpo_scorer: A built-in scorer name (`get_scorer`) or a callable `scorer(failed_step, sibling) -> [S[t, j]
            for j]`; the trainer gives its one scorer instance for the run at run time (built-in scorers keep
            caches).
        progress_threshold, progress_coef, sibling, scorer_action_weight: Steps 1-4, see `progress_rewards`
            (`threshold`, `progress_coef`, `sibling`, `action_weight`).
        shaping_level: "episode_and_step": GiGPO on the shaped rewards (step 5: they replace r_t, so they also enter
            the episode return of A^E); "step": only the step-level returns of A^S are shaped, A^E stays the outcome
            advantage (the digest's "added to GiGPO's step rewards").
    """

    scpo_scorer: str | Scorer = "lexical"
    progress_threshold: float = 0.8
    progress_coef: float = 0.5
    sibling: str = "shortest"
    shaping_level: str = "episode_and_step"
    scorer_action_weight: float = 0.5

    def __post_init__(self) -> None:
        super().__post_init__()
        check_choice("shaping_level", self.shaping_level, SHAPING_LEVELS)
        _check_progress_settings(self.progress_threshold, self.progress_coef, self.sibling)
        if not (math.isfinite(self.scorer_action_weight) and 0.0 <= self.scorer_action_weight <= 1.0):
            raise ValueError(f"action_weight must be in [0, 1], got {self.scorer_action_weight}")
        if not callable(self.scpo_scorer) and self.scpo_scorer not in SCORERS:
            get_scorer(self.scpo_scorer)  # raises, naming the known scorers


@register_estimator("scpo", SCPOParams, metrics=SCPO_METRICS)
def scpo_advantages(groups: Sequence[Group], params: SCPOParams) -> tuple[list[StepAdvantages], Stats]:
    """SCPO advantages (progress shaping, then GiGPO) for every step of every trajectory of every group.

    Returns:
        (advantages, stats): per group, one list per trajectory with one advantage per step; stats:
        "shaped_group_fraction" (over the groups with trajectories: those with a success and a failure, which get
        shaped), "mean_progress", "mean_shaping_return", "matched_step_fraction" (`progress_rewards`, over the shaped
        groups), "num_anchor_groups" and "mean_anchor_group_size" (GiGPO's, over the groups with anchor states). A
        trainer logs all but "num_anchor_groups".

    Example: B failed but retraced the first of the two steps of the successful A (exact scorer, c = 0.5·1):
        >>> from trl_agents.trajectory import Group, Step, Trajectory
        >>> a = Trajectory(task={}, steps=[Step("s0", "up"), Step("s1", "up", reward=1.0)], success=True)
        >>> b = Trajectory(task={}, steps=[Step("s0", "up"), Step("s1", "down")])
        >>> group = Group(task={}, trajectories=[a, b])
        >>> progress_rewards(group, "exact")[0]
        [[0.0, 0.0], [0.25, 0.0]]
        >>> (advantages,), _ = scpo_advantages([group], SCPOParams(scpo_scorer="exact", gamma=1.0))
        >>> [[round(x, 4) for x in row] for row in advantages]
        [[0.75, 0.875], [-0.75, -0.875]]
    """
    scorer = get_scorer(params.scpo_scorer, action_weight=params.scorer_action_weight)  # one instance: its caches
    advantages, with_trajectories = [], []
    for group in groups:
        group_advantages, group_stats = _scpo_group(group, scorer, params)
        advantages.append(group_advantages)
        if group.trajectories:
            with_trajectories.append(group_stats)
    shaped = [s for s in with_trajectories if s["shaped_group_fraction"]]
    with_anchors = [s for s in with_trajectories if s["num_anchor_groups"]]
    return advantages, {
        **group_totals(with_trajectories, ("shaped_group_fraction",)),
        **group_totals(shaped, ("mean_progress", "mean_shaping_return", "matched_step_fraction")),
        **group_totals(with_anchors, ("num_anchor_groups", "mean_anchor_group_size")),
    }


def _scpo_group(group: Group, scorer: Scorer, params: SCPOParams) -> tuple[StepAdvantages, dict[str, float]]:
    """SCPO on one group: its advantages, and its diagnostics (`progress_rewards`'s, "shaped" as
    "shaped_group_fraction", plus GiGPO's anchor stats)."""
    check_group(group)
    shaping, stats = progress_rewards(
        group, scorer, threshold=params.progress_threshold, progress_coef=params.progress_coef,
        sibling=params.sibling, action_weight=params.scorer_action_weight,
    )
    shaped = shaped_group(group, shaping)
    if params.shaping_level == "episode_and_step" or not stats["shaped"]:
        advantages, anchor_stats = gigpo_group(shaped, params)
    else:
        # A^E(r) + ω·A^S(r'), where A^S(r') = GiGPO(r', ω=1) − GiGPO(r', ω=0) and A^E(r) = GiGPO(r, ω=0).
        outcome, _ = gigpo_group(group, params, omega=0.0)
        both, anchor_stats = gigpo_group(shaped, params, omega=1.0)
        episode_only, _ = gigpo_group(shaped, params, omega=0.0)
        omega = params.step_advantage_w
        advantages = [
            [a_e + omega * (a - a_e_shaped) for a_e, a, a_e_shaped in zip(*rows, strict=True)]
            for rows in zip(outcome, both, episode_only, strict=True)
        ]
    return advantages, {**stats, "shaped_group_fraction": stats["shaped"], **anchor_stats}
