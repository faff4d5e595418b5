"""Stage 7, metrics and records: what a rollout logs, and how an episode reads as text
(docs/concepts/training_loop.md#metrics-and-records).

* `rollout_stats`: the rollout and credit metrics of this process as (total, count) pairs (reduced over processes by
  `reduce_rollout_stats`: means, totals, maxima, TRL's `reward` / `reward_std`);
* `completion_entries`: one entry of TRL's completions table per episode (`episode_prompt`, `episode_transcript`);
* the transcript of an episode (`episode_transcript`), the one episode-to-text renderer of the project.
"""

from __future__ import annotations

import math

import torch

from ..trajectory import Group, RolloutBatch, Trajectory
from .rows import TrainingRows
# Rollout metrics logged as totals over processes (not means), and those logged as the largest on any process.
TOTAL_METRICS = ("train_rows", "rollout/generated_tokens", "rollout/env_steps", "rollout/episodes",
                 "rollout/dropped_groups")
MAX_ROLLOUT_STATS = ("rollout/generation_calls",)


def rollout_stats(batch: RolloutBatch, healthy: list[Group], step_advantages: dict, rows: TrainingRows,
                  max_turns: int) -> tuple[dict[str, tuple[float, float]], dict[str, float], list[float], int]:
    """(metrics as name -> (total, count) on this process, metrics logged as the largest on any process, the
    returns of the healthy episodes, the padded-free tokens of the rows)."""
    trajectories = [t for group in healthy for t in group.trajectories]
    steps = [s for t in trajectories for s in t.owned_steps]  # a tree's shared steps count once
    zero_advantage, zero_std, num_groups = 0, 0, 0
    by_turn = [[0.0, 0] for _ in range(max_turns)]
    for group_index, group in enumerate(healthy):
        if not group.trajectories:
            continue
        per_episode = [step_advantages[(group_index, t.episode_id)] for t in group.trajectories]
        num_groups += 1
        zero_advantage += all(abs(v) < 1e-8 for values in per_episode for v in values)
        zero_std += len({t.episode_return for t in group.trajectories}) <= 1
        for trajectory, values in zip(group.trajectories, per_episode, strict=True):
            for turn, value in enumerate(values, start=trajectory.fork_step):
                if turn < len(by_turn):
                    by_turn[turn][0] += value
                    by_turn[turn][1] += 1
    local = {
        "env/success_rate": (sum(t.success for t in trajectories), len(trajectories)),
        "env/episode_length": (sum(t.num_steps for t in trajectories), len(trajectories)),
        "env/episode_return": (sum(t.episode_return for t in trajectories), len(trajectories)),
        "env/valid_action_rate": (sum(s.valid for s in steps), len(steps)),
        "env/failed_episode_rate": (sum(t.failed for t in batch.trajectories), len(batch.trajectories)),
        "credit/zero_advantage_group_fraction": (zero_advantage, num_groups),
        "frac_reward_zero_std": (zero_std, num_groups),
        "train_rows": (len(rows), 1),
        **{f"credit/advantage_by_turn/{turn}": tuple(pair) for turn, pair in enumerate(by_turn)},
    }
    # The rollout's cost (totals over processes) and the topology's numbers (means over the tasks of every
    # process; maxima and round counts: the largest on any process).
    maxima = {}
    for name, value in batch.stats.items():
        key = name if "/" in name else f"rollout/{name}"
        if key in MAX_ROLLOUT_STATS or key.startswith("topology/max_") or key == "topology/rounds":
            maxima[key] = value
        else:
            local[key] = (value, 1) if key in TOTAL_METRICS else (value * len(batch.groups), len(batch.groups))
    returns = [t.episode_return for t in trajectories]
    tokens = sum(len(p) + len(c) for p, c in zip(rows.prompt_ids, rows.completion_ids, strict=True))
    return local, maxima, returns, tokens


def reduce_rollout_stats(local: dict[str, tuple[float, float]], maxima: dict[str, float], returns: list[float],
                         tokens: int, accelerator) -> tuple[dict[str, float], dict[str, float], dict[str, float], float]:
    """`rollout_stats` over every process, in one all-reduce (and one gather for the maxima): (each metric as its
    mean over processes, or its total for `TOTAL_METRICS`; the maxima; TRL's `reward` and `reward_std` over every
    process's episodes, {} when there are none; the tokens of the rows of every process)."""
    names = sorted(local)
    stats = [local[n] for n in names] + [(sum(r * r for r in returns), len(returns)), (tokens, 1)]
    stats = torch.tensor(stats, dtype=torch.float64, device=accelerator.device)
    *totals, (squares, num_returns), (tokens, _) = accelerator.reduce(stats, reduction="sum").tolist()
    values = {}
    for name, (total, count) in zip(names, totals, strict=True):
        if count > 0:
            values[name] = total if name in TOTAL_METRICS else total / count
    largest = {}
    if maxima:
        names_max = sorted(maxima)
        gathered = torch.tensor([[maxima[n] for n in names_max]], dtype=torch.float64, device=accelerator.device)
        largest = dict(zip(names_max, accelerator.gather(gathered).max(dim=0).values.tolist(), strict=True))
    reward = {}
    if num_returns > 0:  # TRL's reward / reward_std columns, over the episodes of every process
        mean = totals[names.index("env/episode_return")][0] / num_returns
        variance = max(squares - num_returns * mean**2, 0.0) / max(num_returns - 1, 1)
        reward = {"reward": mean, "reward_std": math.sqrt(variance)}
    return values, largest, reward, tokens


def completion_entries(batch: RolloutBatch, step_advantages: dict) -> list[tuple[str, str, float, float, bool, int]]:
    """One entry of TRL's completions table per episode of this process: (prompt = the task and first observation,
    completion = the transcript of the whole episode, its return, the mean of its step advantages (0 for failed
    episodes, which are not trained on), success, turns)."""
    entries = []
    for group_index, group in enumerate(batch.groups):
        for trajectory in group.trajectories:
            values = [v for v in step_advantages.get((group_index, trajectory.episode_id), []) if v is not None]
            values = values or [0.0]
            entries.append((episode_prompt(trajectory), episode_transcript(trajectory), trajectory.episode_return,
                            sum(values) / len(values), trajectory.success, trajectory.num_steps))
    return entries


# How much of an episode a completions-table entry shows (our choice: enough to follow a puzzle, short enough for a
# console table): texts longer than TRANSCRIPT_TEXT_CHARS are cut, and of longer episodes the first and last
# TRANSCRIPT_TURNS // 2 turns are shown.
TRANSCRIPT_TEXT_CHARS = 300
TRANSCRIPT_TURNS = 12


def episode_prompt(trajectory: Trajectory) -> str:
    """What the policy was asked: the task text and the first observation."""
    first = trajectory.steps[0].observation if trajectory.steps else ""
    return "\n".join(_shorten(text) for text in (trajectory.task_text, first) if text)


def episode_transcript(trajectory: Trajectory) -> str:
    """The episode after its first observation, turn by turn: each action (with its reward when not 0, and whether
    the environment rejected it), the observation it led to, and how the episode ended.

    Example:
        >>> from trl_agents.trajectory import Step, Trajectory
        >>> steps = [Step("P F G", "right"), Step("F P G", "right", reward=1.0, done=True)]
        >>> print(episode_transcript(Trajectory(task={}, steps=steps, success=True)))
        Action 1: right
        Observation 2: F P G
        Action 2: right [reward 1]
        => solved in 2 turns
    """
    steps = trajectory.steps
    turns = []
    for index, step in enumerate(steps):
        marks = ([] if step.valid else ["invalid"]) + ([f"reward {step.reward:g}"] if step.reward else [])
        action = f"Action {index + 1}: {_shorten(step.action_text.strip())}"
        lines = [action + (f" [{', '.join(marks)}]" if marks else "")]
        if index + 1 < len(steps):
            observation = _shorten(steps[index + 1].observation)
            lines.append(f"Observation {index + 2}:" + ("\n" if "\n" in observation else " ") + observation)
        turns.append("\n".join(lines))
    if len(turns) > TRANSCRIPT_TURNS:
        half = TRANSCRIPT_TURNS // 2
        turns = [*turns[:half], f"... ({len(turns) - 2 * half} turns not shown) ...", *turns[-half:]]
    if trajectory.failed:
        ending = f"=> failed: {_shorten(trajectory.error)}"
    elif trajectory.success:
        ending = f"=> solved in {len(steps)} turns"
    elif steps and steps[-1].done:
        ending = f"=> ended unsolved after {len(steps)} turns"
    else:
        ending = f"=> unsolved when the episode stopped after {len(steps)} turns"
    return "\n".join([*turns, ending])


def _shorten(text: str) -> str:
    return text if len(text) <= TRANSCRIPT_TEXT_CHARS else text[: TRANSCRIPT_TEXT_CHARS - 1] + "…"
