"""`ControlTokenMonitor`: watch any trl-agents run for the format collapse of multi-turn tool-use RL.

"Why Multi-Step Tool-Use RL Collapses and How Supervisory Signals Fix It" (arXiv 2606.26027; docs/methods/toolrl.md)
finds that GRPO on multi-turn tool use can collapse abruptly: the tool-call structure breaks while the underlying
capability is intact, and the collapse goes with probability spikes of a few **control tokens** (the tool-call
delimiters and the end-of-turn token). The monitor logs, after every training rollout (`trainer.last_rollout`),
over the ordinary (not teacher-forced or hinted) steps of every process:

| metric (logged as `control/<name>`) | what |
|---|---|
| `prob` | mean sampling probability exp(log π) of the sampled control tokens |
| `token_share` | control tokens / generated tokens |
| `valid_action_rate` | share of steps whose action the environment parsed and accepted (`step.valid`) |
| `alert` | 1 when a collapse sign was reported at this step, else 0 |

A token is a control token when its text, stripped of whitespace, is one of `control_tokens` (strings; for
Search-QA our choice is `search`, `answer`, `[`, `]`), or when it is an end-of-turn id (`include_eos`). Each
metric is compared with a running baseline, the mean of its last `baseline_logs` values that raised no alarm
(at least that many are needed first). The signs (`SIGNS`):

* `control_prob_spike`: `prob` >= baseline + `prob_jump`;
* `control_share_spike`: `token_share` >= `share_ratio` × baseline;
* `valid_action_drop`: `valid_action_rate` <= `valid_ratio` × baseline.

A sign that holds for `patience` rollouts in a row is reported: a warning naming the sign and the step (once per
sign; every report goes to `alerts`), `control.should_training_stop` when the sign is in `stop_on`, and every
`on_alert(signs, step)` callable is called (the Tool-RL trainer uses this to start an SFT repair phase on
ground-truth demonstrations). Detection runs in `on_step_end` on values summed over processes, so every process
takes the same decision. `EchoTrapMonitor` (`callbacks/collapse.py`) watches the other collapse (echo trap); the
two can run together.

Example:
    ```python
    from trl_agents.callbacks import ControlTokenMonitor

    trainer = AgentGRPOTrainer(model=..., args=config, train_dataset=tasks)
    trainer.add_callback(ControlTokenMonitor(trainer, control_tokens=("search", "answer", "[", "]"),
                                             stop_on=("valid_action_drop",)))
    ```
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from transformers import TrainerCallback

from ..trajectory import Group, first_occurrences

logger = logging.getLogger(__name__)

SEARCHQA_CONTROL_TOKENS = ("search", "answer", "[", "]")  # our choice for Search-QA's search[...] / answer[...]
METRICS = ("prob", "token_share", "valid_action_rate")
SIGNS = ("control_prob_spike", "control_share_spike", "valid_action_drop")
SIGN_METRIC = dict(zip(SIGNS, METRICS, strict=True))
ADVICE = {
    "control_prob_spike": "the sampling probability of the action-format control tokens jumped (the paper's sign of "
                          "an imminent format collapse): lower the learning rate, or add ground-truth supervision "
                          "(toolrl_sft_every, toolrl_replace_num)",
    "control_share_spike": "control tokens take a much larger share of the generated tokens (delimiters or "
                           "end-of-turn emitted out of place)",
    "valid_action_drop": "the share of parsable actions fell: the tool-call format is breaking down",
}


class ControlTokens:
    """Which token ids are control tokens, decided once per id (decoded with `tokenizer`) and cached."""

    def __init__(self, tokenizer: Any, strings: Iterable[str], eos_token_ids: Iterable[int] = ()):
        self.tokenizer = tokenizer
        self.strings = {str(s).strip() for s in strings if str(s).strip()}
        self.eos = {int(t) for t in eos_token_ids}
        self._known: dict[int, bool] = {}

    def __contains__(self, token_id: int) -> bool:
        token_id = int(token_id)
        if token_id not in self._known:
            text = self.tokenizer.decode([token_id]).strip() if self.tokenizer is not None else ""
            self._known[token_id] = token_id in self.eos or text in self.strings
        return self._known[token_id]


def control_totals(groups: Sequence[Group], control: Any) -> dict[str, tuple[float, float]]:
    """(total, count) of each of `METRICS` over `groups`: each step once (trees share steps), supervised steps
    (`step.info["supervision"]`) left out; a token without a finite sampling log-prob is left out of `prob`.

    >>> from trl_agents.trajectory import Step, Trajectory
    >>> step = Step("o", "x", action_ids=[7, 1, 2], action_logprobs=[math.log(0.5), -1.0, math.log(0.9)])
    >>> bad = Step("o", "?", action_ids=[5, 2], action_logprobs=[-2.0, math.log(0.7)], valid=False)
    >>> totals = control_totals([Group({}, [Trajectory({}, [step, bad])])], control={7, 2})
    >>> {k: (round(t, 4), c) for k, (t, c) in totals.items()}   # prob: (0.5 + 0.9 + 0.7) / 3 = 0.7
    {'prob': (2.1, 3), 'token_share': (3, 5), 'valid_action_rate': (1, 2)}
    """
    prob, probs, controls, tokens, valid, steps = 0.0, 0, 0, 0, 0, 0
    for trajectory, indices in first_occurrences([g for g in groups if g.trajectories]):
        for index in indices:
            step = trajectory.steps[index]
            if step.info.get("supervision"):
                continue
            steps += 1
            valid += bool(step.valid)
            logprobs = list(step.action_logprobs or ())
            for position, token in enumerate(step.action_ids):
                tokens += 1
                if token not in control:
                    continue
                controls += 1
                logprob = logprobs[position] if position < len(logprobs) else None
                if logprob is not None and math.isfinite(logprob):
                    prob += math.exp(min(logprob, 0.0))
                    probs += 1
    return {"prob": (prob, probs), "token_share": (controls, tokens), "valid_action_rate": (valid, steps)}


class ControlTokenMonitor(TrainerCallback):
    """Control-token collapse monitor (see the module docstring) for any trl-agents trainer.

    Args:
        trainer: The trainer whose `last_rollout` is read (may be set later with `bind(trainer)`).
        control_tokens: Control-token strings (our choice for Search-QA: `SEARCHQA_CONTROL_TOKENS`).
        include_eos: Count the end-of-turn ids (the trainer's `eos_token_ids`, else the tokenizer's EOS).
        tokenizer: Decodes token ids (default: the trainer's processing class).
        baseline_logs: Values in the running baseline (3).
        prob_jump: `control_prob_spike` at `prob` >= baseline + prob_jump (0.25).
        share_ratio: `control_share_spike` at `token_share` >= share_ratio × baseline (2.0).
        valid_ratio: `valid_action_drop` at `valid_action_rate` <= valid_ratio × baseline (0.7).
        patience: Consecutive rollouts a sign must hold before it is reported (1).
        stop_on: Signs (names of `SIGNS`) that also stop training.
        on_alert: Callables `f(signs, step)` called at every report.
    """

    def __init__(
        self,
        trainer: Any = None,
        *,
        control_tokens: Sequence[str] = SEARCHQA_CONTROL_TOKENS,
        include_eos: bool = True,
        tokenizer: Any = None,
        baseline_logs: int = 3,
        prob_jump: float = 0.25,
        share_ratio: float = 2.0,
        valid_ratio: float = 0.7,
        patience: int = 1,
        stop_on: Sequence[str] = (),
        on_alert: Sequence[Callable[[list[str], int | None], None]] = (),
    ):
        unknown = sorted(set(stop_on) - set(SIGNS))
        if unknown:
            raise ValueError(f"stop_on names unknown signs {unknown}; known: {', '.join(SIGNS)}")
        if baseline_logs < 1 or patience < 1:
            raise ValueError(f"baseline_logs and patience must be >= 1, got {baseline_logs} and {patience}")
        for name, value in (("prob_jump", prob_jump), ("share_ratio", share_ratio), ("valid_ratio", valid_ratio)):
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
        self.control_tokens, self.include_eos, self.tokenizer = tuple(control_tokens), include_eos, tokenizer
        self.baseline_logs, self.prob_jump, self.share_ratio = baseline_logs, prob_jump, share_ratio
        self.valid_ratio, self.patience, self.stop_on = valid_ratio, patience, tuple(stop_on)
        self.on_alert = list(on_alert)
        self.trainer = None
        self.control: ControlTokens | None = None
        self.baselines: dict[str, list[float]] = {name: [] for name in METRICS}  # values that raised no alarm
        self.streaks: dict[str, int] = dict.fromkeys(SIGNS, 0)
        self.alerts: list[dict[str, Any]] = []
        self.warned: set[str] = set()
        self.history: list[dict[str, Any]] = []
        self._seen: int | None = None
        self.verbose = True
        if trainer is not None:
            self.bind(trainer)

    def bind(self, trainer: Any) -> ControlTokenMonitor:
        """Attach to `trainer` (its tokenizer and end-of-turn ids decide the control tokens)."""
        self.trainer = trainer
        tokenizer = self.tokenizer or getattr(trainer, "processing_class", None)
        tokenizer = getattr(tokenizer, "tokenizer", tokenizer)  # a processor wraps its tokenizer
        eos = ()
        if self.include_eos:
            eos = getattr(trainer, "eos_token_ids", None) or [getattr(tokenizer, "eos_token_id", None)]
            eos = [t for t in eos if t is not None]
        self.control = ControlTokens(tokenizer, self.control_tokens, eos)
        return self

    # ---- observations ------------------------------------------------------------------------------------------

    def observe_rollout(self, rollout: Any) -> dict[str, float]:
        """The metrics of a `RolloutBatch` (summed over processes when the trainer can); a metric with nothing to
        count is left out."""
        if self.control is None:
            raise RuntimeError("ControlTokenMonitor is not bound to a trainer or tokenizer: call bind(trainer)")
        totals = control_totals([group.healthy() for group in rollout.groups], self.control)
        sum_over_processes = getattr(self.trainer, "sum_over_processes", None)
        if sum_over_processes is not None:
            flat = sum_over_processes([v for name in METRICS for v in totals[name]])
            totals = {name: (flat[2 * i], flat[2 * i + 1]) for i, name in enumerate(METRICS)}
        return {name: total / count for name, (total, count) in totals.items() if count > 0}

    def holds(self, sign: str, value: float, baseline: float) -> bool:
        """Whether `sign` holds for `value` against `baseline` (the rules of the module docstring)."""
        if sign == "control_prob_spike":
            return value >= baseline + self.prob_jump
        if sign == "control_share_spike":
            return baseline > 0 and value >= self.share_ratio * baseline
        return baseline > 0 and value <= self.valid_ratio * baseline

    def check(self, values: dict[str, float], step: int | None = None) -> list[str]:
        """Fold one rollout's `values` (names of METRICS) into the baselines and streaks; return the signs reported
        now (held for `patience` rollouts in a row)."""
        holding = []
        for sign in SIGNS:
            metric = SIGN_METRIC[sign]
            value = values.get(metric)
            if value is None or not math.isfinite(value):
                continue
            earlier = self.baselines[metric][-self.baseline_logs:]
            if len(earlier) >= self.baseline_logs and self.holds(sign, value, sum(earlier) / len(earlier)):
                holding.append(sign)
            else:
                self.baselines[metric].append(value)  # an alarming value never enters the baseline
        reported = []
        for sign in SIGNS:
            self.streaks[sign] = self.streaks[sign] + 1 if sign in holding else 0
            if self.streaks[sign] >= self.patience:
                reported.append(sign)
                metric = SIGN_METRIC[sign]
                self.alerts.append({"step": step, "sign": sign, "value": values.get(metric)})
                if sign not in self.warned:
                    self.warned.add(sign)
                    if self.verbose:
                        logger.warning("control-token collapse sign at step %s: %s (%s = %.4g; %s).", step, sign,
                                       metric, values.get(metric), ADVICE[sign])
        self.history.append({"step": step, **values, "signs": reported})
        return reported

    # ---- callback events ---------------------------------------------------------------------------------------

    def on_step_end(self, args, state, control, **kwargs):
        rollout = getattr(self.trainer, "last_rollout", None)
        if rollout is None or id(rollout) == self._seen:
            return control
        self._seen = id(rollout)  # a rollout serves several optimizer steps when steps_per_generation > 1
        values = self.observe_rollout(rollout)
        self.verbose = state.is_world_process_zero
        reported = self.check(values, state.global_step)
        log_metric = getattr(self.trainer, "log_metric", None)
        if log_metric is not None:
            for name, value in values.items():
                log_metric(f"control/{name}", value)
            log_metric("control/alert", float(bool(reported)))
        if reported:
            for callback in self.on_alert:
                callback(reported, state.global_step)
            if any(sign in self.stop_on for sign in reported):
                control.should_training_stop = True
        return control
