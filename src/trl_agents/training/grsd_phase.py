"""Stage 2, signals, for GRSD (arXiv 2607.28076; docs/methods/grsd.md): the reflections, their judge, the guidance
and the student's scores, between the rollout and credit (`GRSDTrainer.compute_signals` runs it in training only).

`GRSDPhase.run(groups, ...)` on the healthy episodes of a training rollout, in this order (the generations are batched
calls of the trainer's own generator, vLLM when enabled, on every process):

1. Stage A, reflections: the policy writes a short reflection on every episode (`reflection_messages`: the task, its
   outcome, its turns cut to `grsd_obs_chars` / `grsd_action_chars`, at most `grsd_max_history_turns` turns and
   fewer when the prompt would pass `grsd_reflection_max_prompt_tokens`), in ONE sampled generation.
2. The judge scores every non-empty reflection 0–3 (`judge_messages`, our rubric; an empty one scores 0 without a
   call); a None is an invalid judgement, counted. Each group's scores become the reflections' advantages
   (`distill.grsd.reflection_advantages`), kept with the prompt and reflection ids for the loss (`Reflections`).
3. Stage B, guidance: for every group with a success and a failure, ONE greedy generation summarises its reflections
   into guidance (`guidance_messages`), written on the first step of its episodes (`GUIDANCE`); an empty guidance
   leaves the group plain GRPO. Then the teacher scores the groups with guidance (`score_teacher`: the trainer's
   declared `teacher_logprobs` signal, whose privileged view reads the guidance, `guidance_source`) and, with
   `grsd_student_logprobs="rescore"`, the policy scores the same turns under its plain prompt (`score_students`:
   `STUDENT`).

The phase writes `step.signals` (JSON-able, so they land in the trajectory records: `REFLECTION` and `JUDGE_SCORE` on
each episode's last step, `GUIDANCE` on the first step, `STUDENT` on every step of the groups with guidance) and
returns what the loss trains on (`Reflections`; `reflection_share` is the part each micro-batch trains) and what the
trainer logs. The prompts are our own words (docs/methods/grsd.md, "Our choices"). `episode_history` is GRSD's own
rendering of an episode (observation and action per turn, cut with " [...]"); it differs from the completions table's
transcript (`training.metrics.episode_transcript`: actions and the observations after them, rewards, how the episode
ended), so both stay.

Example:
    >>> from trl_agents.trajectory import Step, Trajectory
    >>> steps = [Step("S . G", "right", next_observation=". S G")]
    >>> print(episode_history(Trajectory(task={}, steps=steps)))
    Turn 1 observation: S . G
    Turn 1 action: right
    Final observation: . S G
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..distill.grsd import group_has_mix, reflection_advantages
from ..judges import Messages
from ..rollout.generators import SamplingParams
from ..signals.model import assign, score_units, scoring_units
from ..trajectory import Group, Trajectory

SCORE_LOW, SCORE_HIGH = 0, 3  # the judge's scale (JUDGE_RUBRIC)
# Keys of `step.signals` the phase writes (JSON-able, so they land in the trajectory records): the guidance of a
# mixed group (on the first step of each of its episodes), each episode's reflection and judge score (on its last
# step), and the student's log-probs of the turns of mixed groups.
GUIDANCE = "grsd_guidance"
REFLECTION = "grsd_reflection"
JUDGE_SCORE = "grsd_judge_score"
STUDENT = "grsd_student_logprobs"


# ---- the phase ------------------------------------------------------------------------------------------------------


@dataclass
class Reflections:
    """What the reflection loss trains on after a rollout: one (prompt ids, reflection ids, advantage) per non-empty
    reflection of this process, and the reflection tokens of the generation batch summed over every process (the
    loss's token-mean denominator)."""

    batch: list[tuple[list[int], list[int], float]] = field(default_factory=list)
    tokens: float = 0.0


@dataclass
class GRSDSignals:
    """The result of `GRSDPhase.run`: the reflections for the loss, the groups that got guidance, and the metrics
    to log (`totals`: summed over processes; `means`: name -> (total, count), averaged over processes)."""

    reflections: Reflections
    with_guidance: list[Group]
    totals: dict[str, float]
    means: dict[str, tuple[float, float]]


class GRSDPhase:
    """GRSD's reflection, judge and guidance pipeline (module docstring), over the trainer's generator.

    Args:
        args: The `GRSDConfig` (`grsd_*` fields).
        renderer: The trainer's `PromptRenderer` (a chat as prompt ids, with the policy's chat template).
        tokenizer: The policy's tokenizer (generated ids as text).
        generator: The trainer's generator (`generate(prompts, sampling)`).
        sampling_params: `sampling_params() -> SamplingParams`, the trainer's sampling settings; each call sets its
            own token budget and whether it is greedy.
    """

    def __init__(self, args: Any, renderer: Any, tokenizer: Any, generator: Any,
                 sampling_params: Callable[[], SamplingParams]):
        self.args, self.renderer, self.tokenizer, self.generator = args, renderer, tokenizer, generator
        self.sampling_params = sampling_params

    def sampling(self, max_new_tokens: int, greedy: bool) -> SamplingParams:
        """The trainer's sampling with a budget of `max_new_tokens` tokens, greedy or not."""
        sampling = self.sampling_params()
        sampling.max_new_tokens = max_new_tokens
        sampling.greedy = greedy
        return sampling

    def generate_texts(self, prompts: list[list[int]], max_new_tokens: int, greedy: bool) -> tuple[list, list[str]]:
        """(completion ids, their stripped texts) of one batched generation (called on every process, also with no
        prompt, as a collective generator needs)."""
        out = self.generator.generate(prompts, self.sampling(max_new_tokens, greedy))
        return out.completion_ids, [self.tokenizer.decode(ids, skip_special_tokens=True).strip()
                                    for ids in out.completion_ids]

    def policy_answers(self, prompts: list[Messages]) -> list[str]:
        """The policy as the judge: one greedy batched generation of at most `grsd_judge_max_tokens` tokens."""
        ids = [self.renderer.messages_ids(messages) for messages in prompts]
        out = self.generator.generate(ids, self.sampling(self.args.grsd_judge_max_tokens, greedy=True))
        return [self.tokenizer.decode(c, skip_special_tokens=True) for c in out.completion_ids]

    def reflection_prompt(self, trajectory: Trajectory) -> tuple[list[int], int]:
        """The reflection prompt's ids and the turns it shows: at most `grsd_max_history_turns`, fewer (the first
        ones) when the prompt would be longer than `grsd_reflection_max_prompt_tokens`."""
        args = self.args
        limit, turns = args.grsd_reflection_max_prompt_tokens, args.grsd_max_history_turns
        while True:
            ids = self.renderer.messages_ids(reflection_messages(trajectory, args, turns))
            if limit is None or len(ids) <= limit or turns <= 1:
                return ids, turns
            turns = max(1, min(turns - 1, turns * limit // len(ids)))

    def run(
        self,
        groups: list[Group],
        judge: Callable[[list[Messages]], Sequence[float | None]],
        score_teacher: Callable[[list[Group]], None],
        score_students: Callable[[list[Group]], None],
        sum_over_processes: Callable[[Sequence[float]], list[float]],
    ) -> GRSDSignals:
        """The pipeline on the healthy episodes `groups` of a training rollout (module docstring).

        `judge(chats) -> scores`; `score_teacher(groups)`: the trainer's declared teacher signal on the groups with
        guidance; `score_students(groups)`: the policy's log-probs under the plain prompt (`STUDENT`; called with
        `grsd_student_logprobs="rescore"` only); `sum_over_processes(values)`: the trainer's all-reduce.
        """
        args = self.args
        episodes = [(g, t) for g, group in enumerate(groups) for t in group.trajectories if t.steps]

        start = time.perf_counter()  # Stage A: one batched generation for every episode
        prompts, shown = [], []
        for _, trajectory in episodes:
            ids, turns = self.reflection_prompt(trajectory)
            prompts.append(ids)
            shown.append(turns)
        completions, texts = self.generate_texts(prompts, args.grsd_reflection_max_tokens, greedy=False)
        reflection_seconds = time.perf_counter() - start

        start = time.perf_counter()  # the judge: empty reflections score 0 without a call (as the reference)
        asked = [i for i, text in enumerate(texts) if text]
        answers = judge([judge_messages(episodes[i][1], texts[i], args, shown[i]) for i in asked])
        if len(answers) != len(asked):
            raise ValueError(f"the judge returned {len(answers)} scores for {len(asked)} reflections")
        scores: list[float | None] = [0.0] * len(texts)
        for i, score in zip(asked, answers, strict=True):
            scores[i] = score
        judge_seconds = time.perf_counter() - start
        invalid = sum(s is None for s in scores)

        reflections = Reflections()
        by_group: dict[int, list[int]] = {}
        for index, (g, trajectory) in enumerate(episodes):
            by_group.setdefault(g, []).append(index)
            trajectory.steps[-1].signals[REFLECTION] = texts[index]
            trajectory.steps[-1].signals[JUDGE_SCORE] = scores[index]
        for members in by_group.values():
            for index, advantage in zip(members, reflection_advantages([scores[i] for i in members]), strict=True):
                if completions[index]:
                    reflections.batch.append((prompts[index], list(completions[index]), advantage))

        start = time.perf_counter()  # Stage B: one batched (greedy) generation for the mixed groups
        mixed = [g for g, group in enumerate(groups) if group_has_mix([t.success for t in group.trajectories])]
        guidance_prompts = [
            self.renderer.messages_ids(
                guidance_messages(groups[g], [(episodes[i][1], texts[i]) for i in by_group.get(g, [])])
            )
            for g in mixed
        ]
        _, guidance = self.generate_texts(guidance_prompts, args.grsd_guidance_max_tokens, greedy=True)
        with_guidance = []
        for g, text in zip(mixed, guidance, strict=True):
            if text:  # an empty guidance gives the teacher nothing: the group stays plain GRPO (our choice)
                for trajectory in groups[g].trajectories:
                    if trajectory.steps:
                        trajectory.steps[0].signals[GUIDANCE] = text
                with_guidance.append(groups[g])
        guidance_seconds = time.perf_counter() - start

        score_teacher(with_guidance)  # teacher log-probs under the guidance, on the mixed groups only
        if args.grsd_student_logprobs == "rescore":
            score_students(with_guidance)

        # the loss divides by the reflection tokens of every process
        [reflections.tokens] = sum_over_processes([sum(len(ids) for _, ids, _ in reflections.batch)])
        valid = [s for s in scores if s is not None]
        return GRSDSignals(
            reflections=reflections,
            with_guidance=with_guidance,
            totals={"grsd/invalid_judgements": invalid, "grsd/mixed_groups": len(with_guidance)},
            means={
                "grsd/mean_judge_score": (sum(valid), len(valid)),
                "grsd/reflection_tokens": (reflections.tokens, 1),
                "grsd/reflection_seconds": (reflection_seconds, 1),
                "grsd/judge_seconds": (judge_seconds, 1),
                "grsd/guidance_seconds": (guidance_seconds, 1),
            },
        )


@torch.no_grad()
def score_students(groups: list[Group], context: Any, no_grad_forwards: Callable) -> None:
    """ℓ_stu's tokens: the policy's log-probs of each turn of `groups` under its own prompt (`STUDENT`), in the
    trainer's signal context (`ModelSignalContext`) and no-grad forwards (`no_grad_forwards()`)."""
    units = scoring_units(groups, context.row_format)
    with no_grad_forwards(), context.model_context() as model:
        scored = score_units(model, units, pad_token_id=context.pad_token_id, temperature=context.temperature,
                             max_rows=context.max_rows_per_forward, max_tokens=context.max_tokens_per_forward)
    assign(units, [logps for logps, _ in scored], STUDENT)


def reflection_share(batch: list, index: int, chunks: int) -> list:
    """The reflections micro-batch `index` of `chunks` trains: contiguous, as even as possible (the first
    len % chunks shares one longer).

    >>> [reflection_share(list(range(5)), k, 2) for k in range(2)]
    [[0, 1, 2], [3, 4]]
    """
    size, extra = divmod(len(batch), chunks)
    start = index * size + min(index, extra)
    return batch[start : start + size + (index < extra)]


def guidance_source(trajectory: Trajectory, index: int) -> str:
    """The privileged text of the teacher's view: the guidance of the episode's group (on its first step)."""
    return str(trajectory.steps[0].signals.get(GUIDANCE, "")) if trajectory.steps else ""


# ---- our prompts ----------------------------------------------------------------------------------------------------


def _cut(text: str | None, limit: int) -> str:
    text = "" if text is None else str(text)
    return text if len(text) <= limit else text[:limit] + " [...]"


def task_text(trajectory: Trajectory) -> str:
    """The task as the prompts state it: the environment's task text, else the system message and the first
    observation stand for it."""
    if trajectory.task_text.strip():
        return trajectory.task_text.strip()
    parts = trajectory.steps[0].prompt_parts if trajectory.steps else None
    system = parts.system.strip() if parts is not None else ""
    return system or "(stated in the first observation)"


def episode_history(trajectory: Trajectory, obs_chars: int = 400, action_chars: int = 600, max_turns: int = 50) -> str:
    """The episode turn by turn (at most `max_turns` turns): each observation cut to `obs_chars` characters, each
    action to `action_chars`, and the observation that followed the last shown action.

    >>> from trl_agents.trajectory import Step, Trajectory
    >>> steps = [Step("S . G", "right", next_observation=". S G"), Step(". S G", "right", next_observation="done")]
    >>> print(episode_history(Trajectory(task={}, steps=steps), obs_chars=3))
    Turn 1 observation: S . [...]
    Turn 1 action: right
    Turn 2 observation: . S [...]
    Turn 2 action: right
    Final observation: don [...]
    """
    steps = trajectory.steps[:max_turns]
    lines = []
    for number, step in enumerate(steps, start=1):
        lines.append(f"Turn {number} observation: {_cut(step.observation, obs_chars)}")
        lines.append(f"Turn {number} action: {_cut(step.action_text.strip(), action_chars)}")
    if steps and steps[-1].next_observation:
        lines.append(f"Final observation: {_cut(steps[-1].next_observation, obs_chars)}")
    if len(trajectory.steps) > max_turns:
        lines.append(f"({len(trajectory.steps) - max_turns} later turns not shown)")
    return "\n".join(lines)


def _outcome(trajectory: Trajectory) -> str:
    return "SUCCEEDED" if trajectory.success else "FAILED"


REFLECTION_SYSTEM = ("You study one episode of an agent acting in an environment and state, briefly, what it teaches "
                     "about solving the task.")
REFLECTION_INSTRUCTIONS = (
    "Write exactly 3 numbered points, one sentence each, about the actions above. If the episode SUCCEEDED, name the "
    "decisions that made it succeed. If it FAILED, name what went wrong and what the agent should have done instead. "
    "Output only the 3 points."
)
JUDGE_SYSTEM = "You grade reflections on agent episodes. You answer with a single digit."
JUDGE_RUBRIC = (
    "Grade the reflection from 0 to 3:\n"
    "3 = correct about what decided the outcome, specific to these actions, and useful for the next attempt;\n"
    "2 = mostly correct and specific, with a gap or a vague point;\n"
    "1 = generic, vague, or partly wrong;\n"
    "0 = wrong, off-topic, empty, or at odds with the outcome.\n"
    "Answer with the digit only."
)
GUIDANCE_SYSTEM = ("You turn reflections on several attempts at the same task into short guidance for the next "
                   "attempt.")
GUIDANCE_INSTRUCTIONS = (
    "Write guidance for a new attempt at this task in exactly two parts and nothing else:\n"
    "What to do:\n- 3 to 5 short bullets taken from the successful attempts\n"
    "Mistakes to avoid:\n- 3 to 5 short bullets taken from the failed attempts"
)


def reflection_messages(trajectory: Trajectory, args: Any, max_turns: int | None = None) -> Messages:
    """Stage A's chat for one episode (our prompt): task, outcome, turn-by-turn history (at most `max_turns` turns,
    default `grsd_max_history_turns`), instructions."""
    turns = args.grsd_max_history_turns if max_turns is None else max_turns
    history = episode_history(trajectory, args.grsd_obs_chars, args.grsd_action_chars, turns)
    user = (f"Task:\n{task_text(trajectory)}\n\nOutcome: this episode {_outcome(trajectory)}.\n\n"
            f"Episode, turn by turn:\n{history}\n\n{REFLECTION_INSTRUCTIONS}")
    return [{"role": "system", "content": REFLECTION_SYSTEM}, {"role": "user", "content": user}]


def judge_messages(trajectory: Trajectory, reflection: str, args: Any, max_turns: int | None = None) -> Messages:
    """The judge's chat for one reflection (our rubric): the episode as the reflection saw it, the reflection."""
    turns = args.grsd_max_history_turns if max_turns is None else max_turns
    history = episode_history(trajectory, args.grsd_obs_chars, args.grsd_action_chars, turns)
    user = (f"Task:\n{task_text(trajectory)}\n\nOutcome: this episode {_outcome(trajectory)}.\n\n"
            f"Episode, turn by turn:\n{history}\n\nReflection to grade:\n{reflection}\n\n{JUDGE_RUBRIC}")
    return [{"role": "system", "content": JUDGE_SYSTEM}, {"role": "user", "content": user}]


def guidance_messages(group: Group, reflections: list[tuple[Trajectory, str]]) -> Messages:
    """Stage B's chat for one mixed group (our prompt): the reflections of its successes and of its failures."""

    def block(items: list[str]) -> str:
        return "\n\n".join(f"[Attempt {k}]\n{text}" for k, text in enumerate(items, start=1)) or "(none)"

    good = [text for trajectory, text in reflections if trajectory.success and text]
    bad = [text for trajectory, text in reflections if not trajectory.success and text]
    task = task_text(group.trajectories[0]) if group.trajectories else ""
    user = (f"Task:\n{task}\n\nReflections on attempts that succeeded:\n{block(good)}\n\n"
            f"Reflections on attempts that failed:\n{block(bad)}\n\n{GUIDANCE_INSTRUCTIONS}")
    return [{"role": "system", "content": GUIDANCE_SYSTEM}, {"role": "user", "content": user}]
