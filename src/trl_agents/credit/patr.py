"""PATR: GRPO over the B leaves of a process-scorer guided rollout tree, the scorers, and the tree's bookkeeping.

PATR (process-scorer guided adaptive tree rollout; Li, Li, Zhang, …, Shang 2026, arXiv 2607.15610;
docs/methods/patr.md). A budget of B leaves per task; a frontier of partial trajectories started from n₀ roots. After
every turn a process scorer gives each active partial trajectory h a score q(h) ∈ [0, 1]; the best-scored ones are
expanded into b children (forks from an environment snapshot, the prefix shared), the middle ones go on with one
child, and a path is pruned only when it is degenerate; a pruned path is kept in the group as a failed leaf. The
tree's leaves are then trained with standard GRPO on the task reward:

    R_ℓ   = episode return of leaf ℓ's root-to-leaf path;  R_ℓ = r_prune (0) when ℓ was pruned        [P, S]
    A_ℓ   = (R_ℓ − mean_ℓ' R_ℓ') / (std_ℓ' R_ℓ' + ε)   over the B leaves, Bessel std, ε = 1e-4      [P: GRPO]
    A_ℓ,t = A_ℓ on every step t of ℓ's path − λ_inv·[step t invalid and owned by ℓ]                 [D]

Tree rows train a shared step once with the sum of the A_ℓ of the leaves through it (docs/topologies.md), which is
what training every leaf's path as its own sequence gives at importance ratio 1 ("shared-prefix tokens once per
leaf"). Since Σ_ℓ A_ℓ = 0, a step shared by every leaf of the tree (the root's first steps) gets 0 net.

Scores (`q ∈ [0, 1]`, None = no score: the node neither expands nor counts towards pruning):

    solver, "slack" (default, [D]):  q = clip((T − t − N(s_t)) / (T − N(s_0)), 0, 1)
    solver, "distance" ([D]):        q = clip(1 − N(s_t) / N(s_0), 0, 1)
    judge on a 0..3 scale:           q = (score − low) / (high − low)
    reward model (sequence classifier): q = sigmoid(logit) (one label) or softmax(logits)[last]

with N the solver's exact cost-to-go (`solver_value` signal: `Transition(N(s_t), N(s_t+1))` on every step), t the
turns played and T the turn budget. "slack" is the share of the initial spare turns T − N(s_0) still left: 1 while
every step was optimal, 0 once the task can no longer be solved in the turns that remain (N = inf, or T < N(s_0),
give 0; without spare turns, T = N(s_0), q is 1 while the path is still optimal). A solved state (N(s_t) = 0)
scores 1 in both.

Degenerate paths ([D] thresholds): q < τ_prune for m consecutive scored turns; the last `repeat_limit` actions the
same text in the same observation (stuck in a loop); or m consecutive actions the environment rejected (tool errors).

Guards: an empty group gives []; a single leaf, or leaves with equal returns, give 0 (no NaN: the std of fewer than
two values is 0 and equal values are centred exactly); non-finite rewards and scores are refused (scores: None).

Example (B = 4 leaves, one of them pruned; the returns 1, 0, 1 and the pruned 0):
    >>> from trl_agents.trajectory import Group, Step, Trajectory
    >>> root = [Step("s0", "a")]
    >>> leaves = [Trajectory(task={}, steps=root + [Step("s1", "b", reward=r)], episode_id=i,
    ...                      parent_id=None if i == 0 else 0, fork_step=0 if i == 0 else 1)
    ...           for i, r in enumerate((1.0, 0.0, 1.0, 0.0))]
    >>> leaves[3].steps[-1].signals[PRUNED] = "low_score"
    >>> [round(a[0], 4) for a in patr_advantages(Group(task={}, trajectories=leaves))]  # mean 0.5, std 0.5774
    [0.8659, -0.8659, 0.8659, -0.8659]
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from ..trajectory import Group, Trajectory
from .base import StepAdvantages, check_choice, check_group, mean_std, normalize, register_estimator

SCORE = "patr_score"  # step.signals[SCORE]: q of the partial trajectory that ends with this step
PRUNED = "patr_pruned"  # step.signals[PRUNED] on a pruned path's last step: why it was pruned
PROGRESS_MODES = ("slack", "distance")
PRUNE_REASONS = ("low_score", "repeated_action", "invalid_actions")

Scorer = Callable[[list[Trajectory]], Sequence[float | None]]


# ---- scores -------------------------------------------------------------------------------------------------------


def solver_progress(trajectory: Trajectory, horizon: int, mode: str = "slack") -> float | None:
    """q(h) from the `solver_value` signal of the steps of `trajectory` (its full path); None without the signal.

    Args:
        trajectory: A partial (or finished) trajectory whose steps carry `signals["solver_value"]`.
        horizon: T, the turn budget of an episode (`max_turns`).
        mode: "slack": q = clip((T − t − N(s_t)) / (T − N(s_0)), 0, 1); "distance": q = clip(1 − N(s_t)/N(s_0), 0, 1).

    >>> from trl_agents.trajectory import Step, Trajectory
    >>> def path(*values):  # N(s_0), N(s_1), ...
    ...     return Trajectory(task={}, steps=[Step("s", "a", signals={"solver_value": (values[i], values[i + 1])})
    ...                                       for i in range(len(values) - 1)])
    >>> solver_progress(path(6, 5, 4), horizon=10)  # optimal so far: (10 − 2 − 4) / (10 − 6) = 1
    1.0
    >>> solver_progress(path(6, 6, 7), horizon=10)  # a bump and a step away: (10 − 2 − 7) / 4 = 0.25
    0.25
    >>> round(solver_progress(path(6, 5, 4), horizon=10, mode="distance"), 4)  # 1 − 4/6
    0.3333
    >>> solver_progress(path(6, float("inf")), horizon=10)  # unsolvable now
    0.0
    """
    check_choice("mode", mode, PROGRESS_MODES)
    if not trajectory.steps:
        return None
    first, last = trajectory.steps[0].signals.get("solver_value"), trajectory.steps[-1].signals.get("solver_value")
    if first is None or last is None:
        return None
    start, now = float(first[0]), float(last[1])
    if math.isnan(start) or math.isnan(now):
        return None
    if math.isinf(now) or math.isinf(start):
        return 0.0
    if now <= 0:
        return 1.0  # solved
    if mode == "distance":
        if start <= 0:
            return 0.0  # started solved and left it
        return min(max(1.0 - now / start, 0.0), 1.0)  # q = clip(1 − N(s_t)/N(s_0), 0, 1)
    slack0 = horizon - start  # T − N(s_0): spare turns at the start
    slack = horizon - len(trajectory.steps) - now  # T − t − N(s_t)
    if slack0 <= 0:  # no spare turn: 1 while a perfect path is still on track, 0 once it is not (or never was)
        return 1.0 if slack >= 0 else 0.0
    return min(max(slack / slack0, 0.0), 1.0)


def judge_q(score: float | None, low: float = 0, high: float = 3) -> float | None:
    """A judge's score on [low, high] as q ∈ [0, 1]: (score − low)/(high − low); None stays None.

    >>> [judge_q(s) for s in (0, 2, 3, None)]
    [0.0, 0.6666666666666666, 1.0, None]
    """
    if score is None:
        return None
    return coerce_q((float(score) - low) / (high - low))


def coerce_q(value: Any) -> float | None:
    """A scorer's answer as q: a finite number clipped to [0, 1], else None.

    >>> [coerce_q(v) for v in (0.5, 1.7, -1, float("nan"), "0.3", None, True)]
    [0.5, 1.0, 0.0, None, None, None, None]
    """
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return min(max(float(value), 0.0), 1.0)


def node_transcript(trajectory: Trajectory, max_turns_shown: int = 8, max_chars: int = 400) -> str:
    """The partial trajectory as text for a judge or reward model: the task, the first observation, then the last
    `max_turns_shown` turns (action, then the observation it led to).

    >>> from trl_agents.trajectory import Step, Trajectory
    >>> steps = [Step("P . G", "right", next_observation=". P G")]
    >>> print(node_transcript(Trajectory(task={}, steps=steps, task_text="Reach G.")))
    Task: Reach G.
    Observation 1: P . G
    Action 1: right
    Observation 2: . P G
    """

    def cut(text: Any) -> str:
        text = str(text if text is not None else "").strip()
        return text if len(text) <= max_chars else text[: max_chars - 3] + "..."

    lines = [f"Task: {cut(trajectory.task_text)}"] if trajectory.task_text else []
    steps = trajectory.steps
    if steps:
        lines.append(f"Observation 1: {cut(steps[0].observation)}")
    start = max(0, len(steps) - max_turns_shown)
    if start:
        lines.append(f"... ({start} earlier turns)")
    for t in range(start, len(steps)):
        step = steps[t]
        lines.append(f"Action {t + 1}: {cut(step.action_text)}" + ("" if step.valid else " [rejected]"))
        if step.next_observation is not None:
            lines.append(f"Observation {t + 2}: {cut(step.next_observation)}")
    return "\n".join(lines)


JUDGE_SYSTEM = ("You evaluate an agent that is partway through a task. Judge only whether its trajectory so far is "
                "making progress toward solving the task.")
JUDGE_QUESTION = ("Is this trajectory making progress toward solving the task? Answer with one number: 0 (stuck, "
                  "looping or off track), 1 (little progress), 2 (some progress), 3 (clearly on track to solve it).")


def judge_messages(trajectory: Trajectory) -> list[dict[str, str]]:
    """The judge's chat for one partial trajectory (our rubric: the 0-3 scale of the repository's judges)."""
    return [{"role": "system", "content": JUDGE_SYSTEM},
            {"role": "user", "content": f"{node_transcript(trajectory)}\n\n{JUDGE_QUESTION}"}]


class SolverProgressScorer:
    """q from the environment's solver (`solver_progress`), offline: the trainer records the `solver_value` signal.

    Args:
        horizon: T, the turn budget (`max_turns`).
        mode: "slack" or "distance" (`PROGRESS_MODES`).
    """

    kind = "solver"

    def __init__(self, horizon: int, mode: str = "slack"):
        check_choice("mode", mode, PROGRESS_MODES)
        if isinstance(horizon, bool) or not isinstance(horizon, int) or horizon < 1:
            raise ValueError(f"horizon must be an integer >= 1 (max_turns), got {horizon!r}")
        self.horizon, self.mode = horizon, mode

    def __call__(self, trajectories: list[Trajectory]) -> list[float | None]:
        return [solver_progress(t, self.horizon, self.mode) for t in trajectories]


class CallableScorer:
    """A user's function `fn(trajectories) -> scores` (one number in [0, 1] or None per partial trajectory), its
    answers checked (`coerce_q`: non-numbers and non-finite values are None, numbers are clipped to [0, 1])."""

    kind = "callable"

    def __init__(self, fn: Scorer):
        if not callable(fn):
            raise TypeError(f"a PATR scorer must be callable (trajectories -> scores), got {type(fn).__name__}")
        self.fn = fn

    def __call__(self, trajectories: list[Trajectory]) -> list[float | None]:
        answers = list(self.fn(list(trajectories))) if trajectories else []
        if len(answers) != len(trajectories):
            raise ValueError(f"the PATR scorer returned {len(answers)} scores for {len(trajectories)} trajectories")
        return [coerce_q(a) for a in answers]


class JudgeScorer:
    """A judge of `trl_agents.judges` (EndpointJudge, LocalJudge, CallableJudge) as a scorer: one chat per partial
    trajectory (`judge_messages`), its 0-3 score mapped to [0, 1] (`judge_q`); an unusable answer is None."""

    kind = "judge"

    def __init__(self, judge: Callable[[list], Sequence[float | None]], low: int = 0, high: int = 3):
        if not callable(judge):
            raise TypeError(f"a judge must be callable (prompts -> scores), got {type(judge).__name__}")
        self.judge, self.low, self.high = judge, low, high

    def __call__(self, trajectories: list[Trajectory]) -> list[float | None]:
        if not trajectories:
            return []
        scores = list(self.judge([judge_messages(t) for t in trajectories]))
        if len(scores) != len(trajectories):
            raise ValueError(f"the judge returned {len(scores)} scores for {len(trajectories)} trajectories")
        return [judge_q(s, self.low, self.high) for s in scores]


class RewardModelScorer:
    """A process reward model run locally: a transformers sequence classifier over `node_transcript`, q = sigmoid of
    its one logit (or the last label's softmax probability with several labels).

    Args:
        model: A path or Hub id (loaded with `AutoModelForSequenceClassification`; `JudgeUnavailable` when that
            fails), or a loaded classifier.
        tokenizer: Its tokenizer (loaded from `model` when None).
        max_length: Tokens of a transcript kept (its end: the latest turns).
        batch_size: Transcripts per forward.
    """

    kind = "reward_model"

    def __init__(self, model: Any, tokenizer: Any = None, *, max_length: int = 1024, batch_size: int = 8):
        if isinstance(model, str):
            from transformers import AutoModelForSequenceClassification

            from ..judges import load_pretrained

            model, tokenizer = load_pretrained(model, tokenizer, AutoModelForSequenceClassification,
                                               "the reward model", kind="sequence-classification model")
        if tokenizer is None:
            raise ValueError("RewardModelScorer needs the tokenizer of a loaded model")
        self.model, self.tokenizer = model.eval(), tokenizer
        self.max_length, self.batch_size = int(max_length), max(1, int(batch_size))
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.pad_token_id = 0 if pad is None else pad
        if getattr(self.model.config, "pad_token_id", None) is None:
            self.model.config.pad_token_id = self.pad_token_id  # sequence classifiers find the last token by it

    def __call__(self, trajectories: list[Trajectory]) -> list[float | None]:
        import torch

        device = next(self.model.parameters()).device
        out: list[float | None] = []
        for start in range(0, len(trajectories), self.batch_size):
            texts = [node_transcript(t) for t in trajectories[start : start + self.batch_size]]
            ids = [self.tokenizer(text, add_special_tokens=True)["input_ids"][-self.max_length :] for text in texts]
            width = max(len(i) for i in ids)
            # Right padding: the classifier reads the last non-pad token.
            input_ids = torch.tensor([i + [self.pad_token_id] * (width - len(i)) for i in ids], device=device)
            mask = torch.tensor([[1] * len(i) + [0] * (width - len(i)) for i in ids], device=device)
            with torch.no_grad():
                logits = self.model(input_ids=input_ids, attention_mask=mask).logits.float()
            values = torch.sigmoid(logits[:, 0]) if logits.shape[-1] == 1 else torch.softmax(logits, -1)[:, -1]
            out += [coerce_q(float(v)) for v in values]
        return out


# ---- the tree's bookkeeping (pure) --------------------------------------------------------------------------------


def update_streak(streak: int, q: float | None, tau_prune: float) -> int:
    """Consecutive scored turns with q < τ_prune: +1 on a low score, 0 on any other score, unchanged on None.

    >>> [update_streak(1, q, 0.2) for q in (0.1, 0.2, None)]
    [2, 0, 1]
    """
    if q is None:
        return streak
    return streak + 1 if q < tau_prune else 0


def degenerate_reason(trajectory: Trajectory, low_streak: int, patience: int, repeat_limit: int) -> str | None:
    """Why a path is degenerate (pruned), or None: "low_score" (q < τ_prune for `patience` consecutive turns),
    "repeated_action" (its last `repeat_limit` actions the same text in the same observation; 0 turns the rule off)
    or "invalid_actions" (its last `patience` actions rejected by the environment).

    >>> from trl_agents.trajectory import Step, Trajectory
    >>> loop = Trajectory(task={}, steps=[Step("o", "up")] * 3)
    >>> degenerate_reason(loop, 0, 2, 3), degenerate_reason(loop, 2, 2, 3), degenerate_reason(loop, 0, 2, 0)
    ('repeated_action', 'low_score', None)
    >>> degenerate_reason(Trajectory(task={}, steps=[Step("o", "x", valid=False), Step("p", "y", valid=False)]), 0, 2, 3)
    'invalid_actions'
    """
    if low_streak >= patience:
        return "low_score"
    steps = trajectory.steps
    if repeat_limit >= 2 and len(steps) >= repeat_limit:
        last = steps[-repeat_limit:]
        if all(" ".join(s.action_text.split()) == " ".join(last[0].action_text.split())
               and s.observation == last[0].observation for s in last):
            return "repeated_action"
    if len(steps) >= patience and all(not s.valid for s in steps[-patience:]):
        return "invalid_actions"
    return None


def choose_expansions(nodes: Sequence[tuple[float | None, int]], tau_expand: float, top_k: int) -> list[int]:
    """The nodes to expand: those with q ≥ τ_exp, best first (ties: the lower id), at most `top_k`.

    Args:
        nodes: (q, node id) of the candidates (q None: not scored, never expanded).

    >>> choose_expansions([(0.7, 0), (0.9, 1), (0.3, 2), (None, 3), (0.9, 4)], 0.6, 2)
    [1, 4]
    """
    ranked = sorted((-q, node) for q, node in nodes if q is not None and q >= tau_expand)
    return [node for _, node in ranked[:top_k]]


def spread(count: int, slots: int) -> list[int]:
    """`count` new leaves over `slots` nodes, round robin, best node first.

    >>> spread(5, 2), spread(1, 3), spread(0, 2)
    ([3, 2], [1, 0, 0], [0, 0])
    """
    return [count // slots + (i < count % slots) for i in range(slots)] if slots else []


# ---- GRPO over the leaves -----------------------------------------------------------------------------------------


def leaf_return(trajectory: Trajectory, pruned_return: float = 0.0) -> float:
    """R_ℓ: the path's return, or `pruned_return` when the path was pruned (its last step carries `PRUNED`)."""
    if trajectory.steps and trajectory.steps[-1].signals.get(PRUNED):
        return float(pruned_return)
    return trajectory.episode_return


@register_estimator("patr")
def patr_advantages(
    group: Group, *, scale: str = "group", pruned_return: float = 0.0, invalid_penalty: float = 0.0,
    eps: float = 1e-4,
) -> StepAdvantages:
    """PATR advantages for every step of every leaf path of `group`; see `patr_advantages_with_stats`."""
    return patr_advantages_with_stats(group, scale=scale, pruned_return=pruned_return,
                                      invalid_penalty=invalid_penalty, eps=eps)[0]


def patr_advantages_with_stats(
    group: Group, *, scale: str = "group", pruned_return: float = 0.0, invalid_penalty: float = 0.0,
    eps: float = 1e-4,
) -> tuple[StepAdvantages, dict[str, float]]:
    """GRPO over the leaves of one task's tree (module docstring), plus diagnostics.

    Args:
        group: The healthy leaves of one task (each trajectory a root-to-leaf path; `parent_id` / `fork_step`).
        scale: "group": z-score (GRPO, TRL's `scale_rewards="group"`); "none": centred only (Dr. GRPO).
        pruned_return: R of a pruned leaf (PATR: failures are kept with reward 0).
        invalid_penalty: λ_inv, subtracted on invalid steps by the leaf that owns them (t ≥ fork_step) only, so a
            shared invalid step is charged once.
        eps: ε added to the std (TRL: 1e-4).

    Returns:
        (advantages, stats): one value per step of each leaf's full path; {"num_leaves", "pruned_fraction",
        "zero_signal" (1 when every leaf returned the same), "num_forks", "mean_fork_step" (over forked leaves),
        "success_rate"}; all 0 for an empty group.
    """
    check_choice("scale", scale, ("group", "none"))
    check_group(group, invalid_penalty)
    if not math.isfinite(pruned_return):
        raise ValueError(f"pruned_return must be finite, got {pruned_return}")
    if eps <= 0:
        raise ValueError(f"eps must be > 0, got {eps}")
    leaves = group.trajectories
    returns = [leaf_return(t, pruned_return) for t in leaves]
    mean, std = mean_std(returns)  # Bessel std; 0 for one leaf; exact 0 deviations for equal returns
    values = normalize(returns, mean, std, scale=scale == "group", eps=eps)  # A_ℓ = (R_ℓ − μ)/(σ + ε)
    advantages = []
    for a, leaf in zip(values, leaves, strict=True):
        path = [a] * len(leaf.steps)  # A_ℓ on every step of the path, shared prefix included
        for t in range(leaf.fork_step, len(path)):
            if not leaf.steps[t].valid:
                path[t] -= invalid_penalty  # charged by the owner only
        advantages.append(path)
    forks = [t for t in leaves if t.parent_id is not None]
    pruned = sum(bool(t.steps and t.steps[-1].signals.get(PRUNED)) for t in leaves)
    stats = {
        "num_leaves": float(len(leaves)),
        "pruned_fraction": pruned / len(leaves) if leaves else 0.0,
        "zero_signal": float(bool(leaves) and all(r == returns[0] for r in returns)),
        "num_forks": float(len(forks)),
        "mean_fork_step": sum(t.fork_step for t in forks) / len(forks) if forks else 0.0,
        "success_rate": sum(t.success for t in leaves) / len(leaves) if leaves else 0.0,
    }
    return advantages, stats
