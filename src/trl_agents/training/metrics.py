"""Stage 7, metrics and records: what a rollout logs, and how an episode reads as text
(docs/concepts/training_loop.md#metrics-and-records).

* `rollout_stats`: the rollout and credit metrics of this process as (total, count) pairs (reduced over processes by
  `reduce_rollout_stats`: means, totals, maxima, TRL's `reward` / `reward_std`);
* `completion_entries`: one entry of TRL's completions table per episode (`episode_prompt`, `episode_transcript`);
* the transcript of an episode (`episode_transcript`), the one episode-to-text renderer of the project;
* `ProcessMetrics`: the trainer's metric helpers (`log_metric`, `log_global_means`, `log_token_means`, ...), reduced
  over processes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

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


def log_completions(logs: dict[str, Any], entries: list[tuple[str, str, float, float, bool, int]]) -> None:
    """Append `completion_entries` (of every process) to TRL's completions table `logs`, with `success` and `turns`
    columns."""
    for prompt, completion, episode_return, advantage, success, turns in entries:
        logs["prompt"].append(prompt)
        logs["completion"].append(completion)
        logs["rewards"]["environment_return"].append(episode_return)
        logs["advantages"].append(advantage)
        logs["extra"]["success"].append(success)
        logs["extra"]["turns"].append(turns)


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


class ProcessMetrics:
    """The metric helpers every trainer has (a mixin of `AgentGRPOTrainer`): log a value, or reduce (total, count)
    pairs over the processes in one all-reduce and log their ratio. The trainer provides `metric_store()` (the lists
    of this logging step's values by name, for the current mode), `accelerator` and `last_rollout`."""

    def log_metric(self, name: str, value: float) -> None:
        """Log `value` under `name` for this logging step, as this process sees it (no reduction over processes;
        use `log_global_means` for that)."""
        self.metric_store()[name].append(float(value))

    def log_token_means(self, values: dict[str, torch.Tensor], mask: torch.Tensor) -> None:
        """Log the mean of each (B, T) tensor of `values` over the `mask`ed tokens of this micro-batch on every
        process (one all-reduce; call it from the loss, which every process runs the same number of times)."""
        keep = mask.bool()
        self.log_global_means({
            name: (float(torch.where(keep, v.detach(), torch.zeros_like(v)).sum()), float(keep.sum()))
            for name, v in values.items()
        })

    def log_rollout_cost_per_task(self, prefix: str, groups: list[Group]) -> None:
        """Log the last training rollout's generated tokens and env steps per task, as `<prefix>/..._per_task`
        (topology methods: what their trees cost against G independent episodes)."""
        batch_stats = self.last_rollout.stats if self.last_rollout is not None else {}
        tasks = max(len(groups), 1)
        self.log_global_means({
            f"{prefix}/generated_tokens_per_task": (batch_stats.get("generated_tokens", 0.0), tasks),
            f"{prefix}/env_steps_per_task": (batch_stats.get("env_steps", 0.0), tasks),
        })

    def log_global_means(self, ratios: dict[str, tuple[float, float]]) -> None:
        """Log each metric of `ratios` (name -> (total, count) on this process) as Σ total / Σ count over all
        processes, skipped where Σ count is 0. One all-reduce for all of them, so every process must call it with
        the same names, whether or not it has anything to count."""
        names = sorted(ratios)
        flat = self.sum_over_processes([value for name in names for value in ratios[name]]) if names else []
        metrics = self.metric_store()
        for index, name in enumerate(names):
            total, count = flat[2 * index], flat[2 * index + 1]
            if count > 0:
                metrics[name].append(total / count)

    def log_global_totals(self, totals: dict[str, float]) -> None:
        """Log each metric of `totals` (name -> this process's amount) as its sum over all processes (e.g. counts of
        events in the generation batch). A collective, as `log_global_means`."""
        share = 1.0 / self.accelerator.num_processes  # Σ share over the processes is 1: the mean is the sum
        self.log_global_means({name: (float(value), share) for name, value in totals.items()})

    def sum_over_processes(self, values: Sequence[float]) -> list[float]:
        """`values` (floats) summed elementwise over all processes, in one all-reduce (as is with one process). Every
        process must call it at the same point with as many values."""
        values = [float(v) for v in values]
        if self.accelerator.num_processes == 1:
            return values
        summed = torch.tensor(values, dtype=torch.float64, device=self.accelerator.device)
        return self.accelerator.reduce(summed, reduction="sum").tolist()

    def max_over_processes(self, value: float) -> float:
        """The largest of `value` over all processes, in one all-reduce (as is with one process). Every process must
        call it at the same point."""
        if self.accelerator.num_processes == 1:
            return float(value)
        local = torch.tensor([float(value)], dtype=torch.float64, device=self.accelerator.device)
        return float(self.accelerator.gather(local).max())
