"""GRSD: Group-Reflective Self-Distillation on GRPO (arXiv 2607.28076; docs/methods/grsd.md).

What changes w.r.t. `AgentGRPOTrainer`, after each training rollout (math in `trl_agents/distill/grsd.py`; the
reflection, judge and guidance pipeline and our prompts in `trl_agents/training/grsd_phase.py`, the signal phase
`compute_signals` runs):

1. Stage A, reflections (`compute_signals`): the policy writes a short reflection on every healthy episode (its
   task, its outcome SUCCEEDED/FAILED, its turns with observations cut to `grsd_obs_chars` characters, at most
   `grsd_max_history_turns` turns), in ONE batched call of the trainer's own generator (vLLM when enabled).
2. A judge scores each reflection 0–3 (`grsd_judge`: the policy itself by default, an OpenAI-compatible endpoint,
   a local transformers model, or a callable passed as `judge=`). An answer without a score on the scale, a timeout
   or an error is an INVALID judgement: counted (`grsd/invalid_judgements`), its reflection kept in the reflection
   loss with advantage 0 (as the reference does), training goes on.
3. The reflection GRPO term (`compute_auxiliary_loss`): −α·token-mean(A^refl·log π_θ(reflection tokens)), the
   judge scores z-scored within each group; every micro-batch of the generation batch forwards its share of the
   reflections, so that the sum over micro-batches and processes is the token mean over all of them.
4. Stage B, guidance (`compute_signals`): for groups with a success and a failure, the policy (no gradient)
   summarises the group's reflections into guidance (one batched call); the teacher (`teacher`, the current policy)
   then scores every step of those groups with the guidance before the step prompt (the `teacher_logprobs` signal
   under a privileged view whose source is the guidance), and the policy scores them under the plain prompt.
5. Turn-level modulation (`compute_advantages`): the GRPO advantage of each step row of a mixed group becomes
   A·max(1 + λ·clip(g, ±g_max), 0.1), g from the teacher–student gap of the turn; other groups keep A.

Example:
    ```python
    from datasets import Dataset
    from trl_agents.envs import get_env_class
    from trl_agents.trainers.grsd import GRSDConfig, GRSDTrainer

    tasks = Dataset.from_list(get_env_class("alfworld").task_split("train", 512))
    config = GRSDConfig(output_dir="alfworld-grsd", max_turns=50, grsd_judge="endpoint",
                        grsd_judge_url="http://localhost:8001")  # e.g. `vllm serve Qwen/Qwen2.5-7B-Instruct`
    GRSDTrainer(model="Qwen/Qwen3-1.7B", args=config, train_dataset=tasks).train()
    ```
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from ..names import check_choice
from ..distill.grsd import (
    modulated_advantages,
    reflection_token_terms,
    turn_logprob_gap,
    turn_modulation,
    warmdown_lambda,
)
from ..judges import EndpointJudge, GeneratorJudge, LocalJudge, as_judge
from ..trajectory import Group
from ..training.forward import no_gradient_checkpointing, sequence_logps
from ..training.grsd_phase import (
    GUIDANCE,
    SCORE_HIGH,
    SCORE_LOW,
    STUDENT,
    GRSDPhase,
    guidance_source,
    reflection_share,
    score_students,
)
from .agent_grpo import AgentGRPOConfig, AgentGRPOTrainer
from .registry import MethodInfo

JUDGES = ("policy", "endpoint", "local")
JUDGE_APIS = ("chat", "completions")
STUDENT_SOURCES = ("rescore", "behaviour")
TEACHER = "teacher_logprobs"
# The reference code's teacher prompt: the guidance, under this heading, before the student's own user message.
GRSD_TEMPLATE = "[Privileged Skill Information]\n{context}\n\n{prompt}"


@dataclass
class GRSDConfig(AgentGRPOConfig):
    r"""
    Configuration of [`GRSDTrainer`]: every [`AgentGRPOConfig`] field plus GRSD's (docs/methods/grsd.md).

    Args:
        grsd_lambda (`float`, defaults to `0.5`): λ of the modulation A·max(1 + λ·ĝ, 0.1).
        grsd_eta (`float`, defaults to `0.0`): η, dead zone on the normalised signal.
        grsd_g_max (`float`, defaults to `0.2`): clip of the signal g.
        grsd_gap_floor (`float`, defaults to `0.0`): smallest mean |e| a group's gaps are scaled by (0 = reference).
        grsd_warmdown_steps (`int`, defaults to `0`): linear warm-down of λ to 0 (0 = off).
        grsd_reflect_coef (`float`, defaults to `0.01`): α, weight of the reflection GRPO term.
        grsd_judge (`str`, defaults to `"policy"`): `"policy"`, `"endpoint"` or `"local"`.
    """

    grsd_lambda: float = field(
        default=0.5, metadata={"help": "λ of the turn-level modulation Â = A·max(1 + λ·ĝ, 0.1) (GRSD launcher: 0.5)."}
    )
    grsd_eta: float = field(
        default=0.0, metadata={"help": "η: |normalised signal| <= η gives no modulation (GRSD launcher: 0)."}
    )
    grsd_g_max: float = field(
        default=0.2,
        metadata={"help": "Clip of the normalised signal g to ±g_max (GRSD launcher: 0.2; the reference function's "
        "default is 3.0)."},
    )
    grsd_gap_floor: float = field(
        default=0.0,
        metadata={"help": "Smallest mean |e| a group's gaps are divided by in ν = e/(max(mean|e|, floor) + 1e-6). 0 = "
        "the reference: every mixed group's gaps are rescaled to unit mean, so gaps at noise level (|δ| ≈ 1e-6, e.g. "
        "a bf16 forward) get the full ±λ·g_max modulation; e.g. 0.01 leaves such groups almost unmodulated and real "
        "gaps unchanged. Our guard, docs/methods/grsd.md."},
    )
    grsd_warmdown_steps: int = field(
        default=0,
        metadata={"help": "Linear warm-down of λ to 0 over this many optimizer steps (GRSD's optional schedule); 0 = "
        "off, λ throughout (the launcher's setting)."},
    )
    grsd_reflect_coef: float = field(
        default=0.01,
        metadata={"help": "α, weight of the reflection GRPO term −α·token-mean(A_refl·log π) (GRSD reflect_loss_coef: "
        "0.01); 0 = no reflection update (reflections are still written for the guidance)."},
    )
    grsd_student_logprobs: str = field(
        default="rescore",
        metadata={"help": "Student side ℓ_stu of the teacher–student gap: 'rescore' (the policy scores each turn of a "
        "mixed group under its plain prompt, one no-grad forward, as verl recomputes old log-probs) or 'behaviour' "
        "(the sampling log-probs the generator recorded; no forward, but vLLM's numerics differ from the "
        "teacher's). Our choice: 'rescore'."},
    )
    grsd_obs_chars: int = field(
        default=400,
        metadata={"help": "Observations in the reflection prompt are cut to this many characters (GRSD: 400)."},
    )
    grsd_action_chars: int = field(
        default=600, metadata={"help": "Actions in the reflection prompt are cut to this many characters (GRSD: 600)."}
    )
    grsd_max_history_turns: int = field(
        default=50, metadata={"help": "At most this many turns of an episode in its reflection prompt (GRSD: 50)."}
    )
    grsd_reflection_max_prompt_tokens: int | None = field(
        default=8096,
        metadata={"help": "Longest reflection prompt in tokens (GRSD: REFLECT_MAX_PROMPT_LENGTH=8096): a longer one "
        "shows fewer turns (the first ones) until it fits. None = no limit."},
    )
    grsd_reflection_max_tokens: int = field(
        default=256,
        metadata={"help": "Token budget of one reflection (3 short points). Our choice: 256 (the paper does not give "
        "the policy's reflection budget)."},
    )
    grsd_guidance_max_tokens: int = field(
        default=512,
        metadata={"help": "Token budget of a group's guidance (two short bullet lists), generated greedily. Our "
        "choice: "
        "512 and greedy decoding (the reference's external-LLM variant builds its guidance at temperature 0)."},
    )
    grsd_judge: str = field(
        default="policy",
        metadata={"help": "Who scores the reflections 0-3: 'policy' (the policy itself with our rubric prompt, greedy, "
        "through the trainer's generator: no extra model; our choice of default, the paper uses gpt-4o-mini), "
        "'endpoint' (an OpenAI-compatible server at grsd_judge_url, e.g. `vllm serve`), 'local' (a transformers "
        "model at grsd_judge_model). A callable passed as GRSDTrainer(judge=...) replaces all three."},
    )
    grsd_judge_url: str | None = field(
        default=None,
        metadata={"help": "Base URL of the endpoint judge, e.g. http://localhost:8001 (probed with GET /v1/models "
        "when the trainer is built)."},
    )
    grsd_judge_model: str | None = field(
        default=None,
        metadata={"help": "'endpoint': the served model's name (None = the first one the server lists); 'local': the "
        "model's path or Hub id (required)."},
    )
    grsd_judge_api: str = field(
        default="chat",
        metadata={"help": "Route of the endpoint judge: 'chat' (/v1/chat/completions) or 'completions' "
        "(/v1/completions with the chat as plain text)."},
    )
    grsd_judge_timeout: float = field(
        default=60.0,
        metadata={"help": "Seconds one endpoint judgement may take; past it the judgement is invalid (GRSD: 60)."},
    )
    grsd_judge_max_tokens: int = field(
        default=16, metadata={"help": "Token budget of one judgement (GRSD: 16; the score is its first number)."}
    )
    grsd_judge_workers: int = field(
        default=16, metadata={"help": "Endpoint judgements sent at once (GRSD: 16 concurrent requests)."}
    )
    privileged_template: str = field(
        default=GRSD_TEMPLATE,
        metadata={"help": "How the group's guidance enters the teacher's user message (GRSD's teacher prompt: the "
        "guidance under '[Privileged Skill Information]', then the student's prompt)."},
    )

    def __post_init__(self):
        super().__post_init__()
        for name, lowest, strict in (("grsd_lambda", 0.0, False), ("grsd_eta", 0.0, False),
                                     ("grsd_g_max", 0.0, True), ("grsd_reflect_coef", 0.0, False),
                                     ("grsd_gap_floor", 0.0, False),
                                     ("grsd_judge_timeout", 0.0, True)):
            value = getattr(self, name)
            if not (math.isfinite(value) and (value > lowest if strict else value >= lowest)):
                raise ValueError(f"{name} must be a finite number {'>' if strict else '>='} {lowest:g}, got {value}")
        for name in ("grsd_obs_chars", "grsd_action_chars", "grsd_max_history_turns", "grsd_reflection_max_tokens",
                     "grsd_guidance_max_tokens", "grsd_judge_max_tokens", "grsd_judge_workers"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.grsd_reflection_max_prompt_tokens is not None and self.grsd_reflection_max_prompt_tokens < 1:
            raise ValueError("grsd_reflection_max_prompt_tokens must be >= 1 or None (no limit), got "
                             f"{self.grsd_reflection_max_prompt_tokens}")
        if self.grsd_warmdown_steps < 0:
            raise ValueError(f"grsd_warmdown_steps must be >= 0 (0 = off), got {self.grsd_warmdown_steps}")
        check_choice("grsd_judge", self.grsd_judge, JUDGES)
        check_choice("grsd_judge_api", self.grsd_judge_api, JUDGE_APIS)
        check_choice("grsd_student_logprobs", self.grsd_student_logprobs, STUDENT_SOURCES)
        if self.grsd_judge == "endpoint" and not self.grsd_judge_url:
            raise ValueError("grsd_judge='endpoint' needs grsd_judge_url (e.g. http://localhost:8001, a `vllm serve` "
                             "server); or use grsd_judge='policy'")
        if self.grsd_judge == "local" and not self.grsd_judge_model:
            raise ValueError("grsd_judge='local' needs grsd_judge_model (a model path or Hub id)")
        if self.privileged_source != "env":
            raise ValueError(f"privileged_source={self.privileged_source!r} is not used by GRSD, whose teacher reads "
                             "the group's guidance: leave privileged_source at its default")
        if self.num_iterations != 1 and self.grsd_reflect_coef > 0:
            raise ValueError(f"num_iterations={self.num_iterations}: GRSD's reflection term is an on-policy update "
                             "(one pass, ratio 1); set num_iterations=1 or grsd_reflect_coef=0")


class GRSDTrainer(AgentGRPOTrainer):
    """GRSD on `AgentGRPOTrainer` (see the module docstring): `compute_signals` (reflections, judge, guidance,
    teacher and student scores), `compute_advantages` (the modulation) and `compute_auxiliary_loss` (the reflection
    term).

    Args:
        judge: Optional callable `judge(prompts) -> scores`: one chat (a list of messages) per reflection, one answer
            per chat (a number on 0-3, a text whose first number is the score, or None); it replaces `grsd_judge`.
            Every other argument is `AgentGRPOTrainer`'s.

    Logs `grsd/mixed_groups` (groups with guidance, total over processes), `grsd/mean_judge_score` (over valid
    judgements), `grsd/invalid_judgements` (total), `grsd/reflect_loss` (token mean of −A·log π over each
    micro-batch's reflections, before α), `grsd/mean_modulation` (mean factor over the step rows of mixed groups),
    `grsd/skill_gap` (mean δ), and `grsd/reflection_seconds`, `grsd/judge_seconds`, `grsd/guidance_seconds`.
    """

    _tag_names: ClassVar[list[str]] = ["trl", "trl-agents", "grsd"]
    _name = "GRSD"
    config_class = GRSDConfig
    methods = (
        MethodInfo("grsd", "arXiv 2607.28076", "trl_agents.distill.grsd", max_staleness=1, title="GRSD",
                   hook="compute_advantages + compute_auxiliary_loss",
                   inputs=("episode returns", "success labels", "policy reflections scored by a judge",
                           "teacher log-probs of the sampled actions under the group's guidance"),
                   tests=("tests/methods/grsd/",)),
    )
    signals = (TEACHER,)
    training_signals = ()

    def __init__(self, model, args: GRSDConfig | None = None, *rest, judge=None, **keywords):
        if judge is not None and not callable(judge):
            raise TypeError(f"judge must be callable (prompts -> scores), got {type(judge).__name__}")
        # An external judge is set up (probed, loaded) before the model: a bad URL stops the run right here.
        external = None
        if judge is None and isinstance(args, GRSDConfig) and args.grsd_judge != "policy":
            external = build_judge(args)
        super().__init__(model, args, *rest, **keywords)
        self.grsd_phase = GRSDPhase(self.args, self.renderer, self.text_tokenizer, self.generator, self.sampling_params)
        if judge is not None:
            self.judge = as_judge(judge, SCORE_LOW, SCORE_HIGH)
        elif external is not None:
            self.judge = external
        elif self.args.grsd_judge != "policy":
            self.judge = build_judge(self.args)
        else:
            self.judge = GeneratorJudge(self.grsd_phase.policy_answers, low=SCORE_LOW, high=SCORE_HIGH)
        if isinstance(self.judge, LocalJudge):  # loaded on the CPU: judge next to the policy
            self.judge.model = self.judge.model.to(self.accelerator.device)
        self._reflection_batch: list[tuple[list[int], list[int], float]] = []
        self._reflection_tokens = 0.0  # reflection tokens of the generation batch, over every process

    @classmethod
    def staleness_refusal(cls, args: Any) -> str | None:
        """GRSD's reflection term is an on-policy surrogate (ratio 1): one-step-off only without it."""
        if getattr(args, "grsd_reflect_coef", 0.0) > 0:
            return ("GRSD's reflection term is an on-policy surrogate (its ratio is 1 only on the policy's own "
                    "samples): set grsd_reflect_coef=0 to train one-step-off without it")
        return super().staleness_refusal(args)

    @classmethod
    def signal_options(cls, args: Any) -> dict[str, dict[str, Any]]:
        view = {"source": guidance_source, "template": args.privileged_template}
        return {TEACHER: view, "teacher_prompt": view}

    # ---- after the rollout: reflections, judge, guidance, teacher and student scores --------------------------------

    def compute_signals(self, groups: list[Group]) -> None:
        """GRSD's signal phase (`training.grsd_phase.GRSDPhase.run`) in training; evaluation is plain GRPO, nothing
        generated."""
        self._reflection_batch = []
        self._reflection_tokens = 0.0
        if not self.model.training:
            return
        students = functools.partial(score_students, context=self.signal_context, no_grad_forwards=functools.partial(
            no_gradient_checkpointing, self.model, self.args.gradient_checkpointing_kwargs))
        result = self.grsd_phase.run(groups, self.judge, score_teacher=super().compute_signals,
                                     score_students=students, sum_over_processes=self.sum_over_processes)
        self._reflection_batch, self._reflection_tokens = result.reflections.batch, result.reflections.tokens
        self.log_global_totals(result.totals)
        self.log_global_means(result.means)

    # ---- credit: GRPO, modulated on mixed groups --------------------------------------------------------------------

    def compute_advantages(self, groups: list[Group]) -> list[list[list[float]]]:
        base = super().compute_advantages(groups)
        args = self.args
        lam = warmdown_lambda(args.grsd_lambda, self.state.global_step, args.grsd_warmdown_steps)
        factors, gaps = [], []
        out = []
        for group, group_advantages in zip(groups, base, strict=True):
            if not any(t.steps and GUIDANCE in t.steps[0].signals for t in group.trajectories):  # not mixed
                out.append(group_advantages)
                continue
            rows, flat, deltas = [], [], []
            for i, trajectory in enumerate(group.trajectories):
                for t, step in enumerate(trajectory.steps):
                    student = step.signals.get(STUDENT) if args.grsd_student_logprobs == "rescore" else \
                        step.action_logprobs
                    rows.append((i, t))
                    flat.append(float(group_advantages[i][t]))
                    deltas.append(turn_logprob_gap(step.signals.get(TEACHER), student))
            options = {"lam": lam, "eta": args.grsd_eta, "g_max": args.grsd_g_max, "floor": args.grsd_gap_floor}
            modulated = modulated_advantages(flat, deltas, True, **options)
            factors += turn_modulation(flat, deltas, **options)
            gaps += [d for d in deltas if d is not None]
            new = [list(map(float, row)) for row in group_advantages]
            for (i, t), value in zip(rows, modulated, strict=True):
                new[i][t] = value
            out.append(new)
        self.log_global_means({
            "grsd/mean_modulation": (sum(factors), len(factors)),
            "grsd/skill_gap": (sum(gaps), len(gaps)),
            "grsd/lambda": (lam, 1),
        })
        return out

    # ---- loss: the reflection GRPO term ---------------------------------------------------------------------------

    def compute_auxiliary_loss(self, model, inputs: dict[str, Any], per_token_logps):
        args = self.args
        if not self.model.training or args.grsd_reflect_coef == 0 or self._reflection_tokens <= 0:
            return None
        if self.loss_chunk[0] != 0:  # a micro-batch split by max_tokens_per_forward: its share goes with chunk 0
            return None
        chunks = args.steps_per_generation
        # GRSD needs num_iterations == 1, so generations come every `chunks` micro-batches.
        share = reflection_share(self._reflection_batch, self.micro_batch_index, chunks)
        multi = self.accelerator.num_processes > 1
        if not share and not multi:
            self.log_global_means({"grsd/reflect_loss": (0.0, 0)})
            return None
        # Every process forwards in every micro-batch (a stand-in row weighted 0 where it has no reflection), so that
        # sharded models (FSDP, ZeRO-3) see the same collectives on every process.
        rows = share or [(self._reflection_batch[0][0] if self._reflection_batch else [0], [0], 0.0)]
        logps, mask = sequence_logps(model, [p for p, _, _ in rows], [c for _, c, _ in rows],
                                     self.text_tokenizer.pad_token_id or 0, self.temperature)
        advantages = torch.tensor([a for _, _, a in rows], device=logps.device, dtype=logps.dtype)
        if not share:
            mask = torch.zeros_like(mask)
        terms = reflection_token_terms(logps, advantages)
        kept = torch.where(mask.bool(), terms, torch.zeros_like(terms))
        self.log_global_means({"grsd/reflect_loss": (float(kept.detach().sum()), float(mask.sum()))})
        # token mean over the generation batch: Σ(this share) / (reflection tokens / processes / micro-batches), in
        # compute_auxiliary_loss's convention (before the division by the accumulation steps), as batch_token_mean
        normalizer = self._reflection_tokens / self.accelerator.num_processes / chunks
        return args.grsd_reflect_coef * kept.sum() / normalizer


def build_judge(args: GRSDConfig):
    """The judge `args` name ('endpoint': probed now; 'local': loaded now). `JudgeUnavailable` (a ValueError with a
    one-line message) when it cannot be reached or loaded."""
    if args.grsd_judge == "endpoint":
        judge = EndpointJudge(args.grsd_judge_url, args.grsd_judge_model, api=args.grsd_judge_api,
                              timeout=args.grsd_judge_timeout, max_tokens=args.grsd_judge_max_tokens,
                              workers=args.grsd_judge_workers, low=SCORE_LOW, high=SCORE_HIGH)
        judge.probe(timeout=min(5.0, args.grsd_judge_timeout))
        return judge
    if args.grsd_judge == "local":
        return LocalJudge(args.grsd_judge_model, max_tokens=args.grsd_judge_max_tokens, low=SCORE_LOW, high=SCORE_HIGH)
    raise ValueError(f"grsd_judge={args.grsd_judge!r} has no external judge to build")


