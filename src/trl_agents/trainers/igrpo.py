"""IGRPO: information-gain-based adaptive tree rollout (Zhang et al. 2026, arXiv 2607.06223; docs/methods/igrpo.md).

The changes w.r.t. `AgentGRPOTrainer`:

* the `info_gain` topology (`rollout/topologies/igrpo.py`): `num_generations` roots per question, then rounds in
  which a node (the state after a tool observation) is drawn with probability softmax(I/T_I) and expanded into
  `igrpo_expansion_factor` children, until the question has `igrpo_leaf_budget` leaves; nodes with I ≤ 0 for
  `igrpo_suppress_after` consecutive rounds are suppressed. I(n) = p(a*|h_n) − p(a*|h_parent), from
* the model signal `gold_likelihood` (registered here): p(a*|h) = exp(mean_k log π_θ(a*_k|h, a*_<k)), a
  teacher-forced no-grad forward of the action `answer[a*]` after each node's prompt, one batched forward per
  expansion round over all new nodes; the gold answer comes from `env.privileged_context()` (its "Answer:" line, on
  Search-QA) or a task field;
* `compute_advantages`: the teacher-weighted leaf advantage A_ℓ = L·w_ℓ·(R_ℓ − Σ w R)/(σ_w + ε), w_ℓ =
  softmax(Σ_{n∈path} I(n)/T_I) (math in `trl_agents/credit/igrpo.py`; the nodes, their gains and the selection in
  `trl_agents/rollout/topologies/igrpo.py`); equal gains give exactly GRPO.

Example:
    ```python
    from trl_agents.envs import get_env_class
    from trl_agents.trainers.igrpo import IGRPOConfig, IGRPOTrainer

    tasks = get_env_class("searchqa").task_split("train", 512)
    config = IGRPOConfig(output_dir="searchqa-igrpo", max_turns=6, num_generations=2, igrpo_leaf_budget=8)
    IGRPOTrainer(model="Qwen/Qwen2.5-3B-Instruct", args=config, train_dataset=tasks).train()
    ```
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ..rollout.topologies.igrpo import GOLD_LIKELIHOOD, gold_likelihood, is_node_step, node_indices
from ..signals import ModelSignal, register_signal
from ..signals.model import ScoringUnit, score_units
from ..trajectory import Group, Trajectory, first_occurrences
from .agent_grpo import AgentGRPOConfig, AgentGRPOTrainer
from .registry import MethodInfo

ANSWER_TEMPLATE = "answer[{answer}]"
AnswerSource = str | Callable[[Trajectory, int], str]


def answer_from_context(text: str) -> str:
    """The gold answer in a privileged context: the text after its last "Answer:" line (Search-QA's
    `privileged_context()` ends with one).

    >>> answer_from_context("Reasoning chain:\\n1. [D0255] Meshar Vohais was born in Kibelburg.\\nAnswer: Kibelburg")
    'Kibelburg'
    """
    for line in reversed(str(text).splitlines()):
        if line.strip().lower().startswith("answer:"):
            answer = line.split(":", 1)[1].strip()
            if answer:
                return answer
    raise ValueError(
        "IGRPO reads the gold answer from the 'Answer:' line of env.privileged_context(), and this context has none "
        f"({str(text)[:80]!r}...): use igrpo_answer_source='task:<field>' for a dataset that carries the answer."
    )


def check_answer_source(source: AnswerSource) -> None:
    if callable(source) or source == "env" or (isinstance(source, str) and source.startswith("task:")
                                               and len(source) > len("task:")):
        return
    raise ValueError(f"igrpo_answer_source must be 'env', 'task:<field>' or a callable (trajectory, step) -> str, "
                     f"got {source!r}")


def check_answer_template(template: str) -> None:
    try:
        ok = "{answer}" in template and template.format(answer="x") is not None
    except (KeyError, IndexError, ValueError):
        ok = False
    if not ok:
        raise ValueError(f"igrpo_answer_template must format with exactly {{answer}} (e.g. {ANSWER_TEMPLATE!r}), "
                         f"got {template!r}")


class GoldLikelihood(ModelSignal):
    """p(a* | h) = exp(mean log π_θ(a*_k | h, a*_<k)) on IGRPO's node steps (`topologies.igrpo.node_indices`): the root
    and every step whose previous step was a tool call the episode went on after; h is the step's recorded prompt,
    a* the action `template.format(answer=gold)`. Steps that already carry a value are skipped (the topology scores
    new nodes round by round); equal (prompt, answer) pairs are forwarded once. `stats` holds the last compute's
    `rows` (forwarded) and `nodes` (steps given a value)."""

    name = GOLD_LIKELIHOOD
    description = "likelihood of the gold answer after each tool observation (IGRPO's node informativeness)"
    recorded = True

    def __init__(self, source: AnswerSource = "env", template: str = ANSWER_TEMPLATE,
                 is_node: Callable = is_node_step):
        check_answer_source(source)
        check_answer_template(template)
        self.source, self.template, self.is_node = source, template, is_node
        self.stats: dict[str, float] = {}

    def requires(self) -> tuple[str, ...]:
        return ("privileged_context",) if self.source == "env" else ()

    def answer(self, trajectory: Trajectory, index: int) -> str:
        """The gold answer for step `index` of `trajectory`."""
        if callable(self.source):
            return str(self.source(trajectory, index))
        if self.source == "env":
            step = trajectory.steps[index]
            if "privileged_context" not in step.signals:
                raise ValueError(
                    "gold_likelihood with igrpo_answer_source='env' needs step.signals['privileged_context']: declare "
                    "the 'privileged_context' signal (IGRPOTrainer does) on an environment with that capability."
                )
            return answer_from_context(step.signals["privileged_context"])
        field_name = self.source.split(":", 1)[1]
        if field_name not in trajectory.task:
            raise ValueError(f"igrpo_answer_source={self.source!r}: the task row has no field {field_name!r}")
        return str(trajectory.task[field_name])

    def compute(self, groups: Sequence[Group], context) -> None:
        tokenizer = context.renderer.tokenizer
        units: list[ScoringUnit] = []
        unit_of: dict[tuple[tuple[int, ...], tuple[int, ...]], int] = {}
        owners, seen = [], set()
        for trajectory, _ in first_occurrences(groups):
            if trajectory.failed:
                continue
            for j in node_indices(trajectory, self.is_node):
                step = trajectory.steps[j]
                if self.name in step.signals or id(step) in seen:
                    continue
                seen.add(id(step))
                if not step.prompt_ids:
                    raise ValueError("gold_likelihood needs every node step's prompt_ids (recorded by the rollout)")
                answer_ids = tokenizer.encode(self.template.format(answer=self.answer(trajectory, j)),
                                              add_special_tokens=False)
                key = (tuple(step.prompt_ids), tuple(answer_ids))
                if key not in unit_of:
                    unit_of[key] = len(units)
                    units.append(ScoringUnit(list(step.prompt_ids), list(answer_ids), []))
                owners.append((step, unit_of[key]))
        self.stats = {"rows": float(len(units)), "nodes": float(len(owners))}
        # The context is entered even with nothing to score, as on the other processes (a ZeRO-3 gather is collective).
        with context.model_context() as model:
            scored = score_units(model, units, pad_token_id=context.pad_token_id, temperature=context.temperature,
                                 max_rows=context.max_rows_per_forward, max_tokens=context.max_tokens_per_forward)
        for step, unit in owners:
            step.signals[self.name] = gold_likelihood(scored[unit][0])  # exp(mean_k log π(a*_k | h, a*_<k))


register_signal(GOLD_LIKELIHOOD, GoldLikelihood)


@dataclass
class IGRPOConfig(AgentGRPOConfig):
    r"""
    Configuration of [`IGRPOTrainer`]: every [`AgentGRPOConfig`] field plus IGRPO's. `num_generations` is the
    number of root episodes per task; `igrpo_leaf_budget` the episodes (leaves) per task in all.

    Args:
        igrpo_leaf_budget (`int`, *optional*, defaults to `8`): B, leaves per task, roots included.
        igrpo_expansion_factor (`int`, *optional*, defaults to `2`): k, children per expansion.
        igrpo_temperature (`float`, *optional*, defaults to `0.1`): T_I of the selection and of the leaf weights.
        igrpo_suppress_after (`int`, *optional*, defaults to `2`): Rounds with I ≤ 0 before a node is suppressed.
        igrpo_expansions_per_round (`int`, *optional*, defaults to `1`): Nodes drawn per task and round.
        igrpo_answer_source (`str`, *optional*, defaults to `"env"`): Where the gold answer comes from.
        igrpo_answer_template (`str`, *optional*, defaults to `"answer[{answer}]"`): The scored gold action.
        num_generations (`int`, *optional*, defaults to `2`): Root episodes per task.
        topology (`str`, *optional*, defaults to `"info_gain"`).
    """

    igrpo_leaf_budget: int = field(
        default=8,
        metadata={"help": "B, the rollout budget: episodes (root-to-leaf paths) per question, roots included. 8 is "
        "our choice (docs/methods/igrpo.md): GRPO's usual group of 8 at the same leaf budget; the paper fixes a "
        "budget without a number we know."},
    )
    igrpo_expansion_factor: int = field(
        default=2, metadata={"help": "k, new children of an expanded node (the design's k = 2)."}
    )
    igrpo_temperature: float = field(
        default=0.1,
        metadata={"help": "T_I: nodes are drawn with probability softmax(I/T_I) and leaves weighted by "
        "softmax(Σ_path I/T_I) (the design's 0.1)."},
    )
    igrpo_suppress_after: int = field(
        default=2,
        metadata={"help": "A node that is a candidate with I ≤ 0 in this many consecutive expansion rounds is never "
        "picked again (the design's 2)."},
    )
    igrpo_expansions_per_round: int = field(
        default=1,
        metadata={"help": "Nodes drawn per question in each expansion round (with replacement), before the children "
        "are played out together. Our choice (docs/methods/igrpo.md): 1, one draw per gain update; more rounds cost "
        "more turns, not more generation calls per turn."},
    )
    igrpo_answer_source: str = field(
        default="env",
        metadata={"help": "Where the gold answer a* comes from: 'env' (the 'Answer:' line of "
        "env.privileged_context(), Search-QA) or 'task:<field>' (a dataset column). Our choice "
        "(docs/methods/igrpo.md): Search-QA builds its answer at reset, so the privileged context carries it."},
    )
    igrpo_answer_template: str = field(
        default=ANSWER_TEMPLATE,
        metadata={"help": "The action whose tokens are teacher-forced to measure p(a*|h): '{answer}' is replaced by "
        "a*. Our choice (docs/methods/igrpo.md): the environment's own answer action, so p is the probability of "
        "answering right now."},
    )
    num_generations: int = field(
        default=2,
        metadata={"help": "Root episodes per question (played first, then expanded up to igrpo_leaf_budget). Our "
        "choice (docs/methods/igrpo.md): 2 roots, 3 expansions of k = 2 with the default budget of 8."},
    )
    topology: str = field(
        default="info_gain", metadata={"help": "IGRPO grows an information-gain tree per question: 'info_gain'."}
    )

    def __post_init__(self):
        super().__post_init__()
        if self.topology != "info_gain":
            raise ValueError(f"IGRPO runs on the 'info_gain' topology, got topology={self.topology!r}")
        for name in ("igrpo_leaf_budget", "igrpo_expansion_factor", "igrpo_suppress_after",
                     "igrpo_expansions_per_round"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if self.igrpo_leaf_budget < self.num_generations:
            raise ValueError(f"igrpo_leaf_budget={self.igrpo_leaf_budget} must be >= num_generations="
                             f"{self.num_generations} (the roots are leaves too): raise the budget or lower the roots")
        if not (math.isfinite(self.igrpo_temperature) and self.igrpo_temperature > 0):
            raise ValueError(f"igrpo_temperature must be a finite number > 0 (IGRPO: 0.1), got "
                             f"{self.igrpo_temperature}")
        check_answer_source(self.igrpo_answer_source)
        check_answer_template(self.igrpo_answer_template)
        if self.credit_statistic != "trajectories":
            raise ValueError(f"IGRPO weights leaves (trajectories): set credit_statistic='trajectories', got "
                             f"{self.credit_statistic!r}")


class IGRPOTrainer(AgentGRPOTrainer):
    """IGRPO on `AgentGRPOTrainer` (see the module docstring): the info_gain topology, the gold_likelihood signal and
    `compute_advantages`.

    Logs `igrpo/num_leaves`, `igrpo/num_nodes`, `igrpo/mean_info_gain`, `igrpo/positive_gain_fraction`,
    `igrpo/mean_path_gain`, `igrpo/max_weight`, `igrpo/effective_leaf_fraction`, `igrpo/zero_advantage_group`, the
    topology's `topology/leaves_per_task`, `topology/expansions_per_task`, `topology/root_launches_per_task`,
    `topology/scored_nodes_per_task` (gold-likelihood rows), `topology/suppressed_fraction`,
    `topology/mean_info_gain`, `topology/rounds`, and `signals/gold_likelihood_seconds`.
    """

    _tag_names: ClassVar[list[str]] = ["trl", "trl-agents", "igrpo"]
    _name = "IGRPO"
    config_class = IGRPOConfig
    supports_trees = True  # one value per leaf on its whole path; shared steps get the sum (docs/methods/igrpo.md)
    methods = (
        MethodInfo("igrpo", "arXiv 2607.06223", "trl_agents.credit.igrpo",
                   max_staleness=0,
                   staleness_reason=("its tree grows on the current policy's gold-answer likelihood mid-rollout, "
                                     "which a one-step-off rollout cannot compute on the weights being trained"),
                   title="IGRPO",
                   hook="topology (info_gain) + compute_advantages",
                   inputs=("episode returns", "tree links (parent, fork step)",
                           "gold-answer likelihood after each tool observation (model signal gold_likelihood)"),
                   tests=("tests/methods/igrpo/",)),
    )

    @classmethod
    def signal_names(cls, args: Any) -> tuple[str, ...]:
        # The engine records the environment signals the trainer declares; the topology's gold_likelihood reads the
        # gold answer from privileged_context when the answer source is the environment.
        return ("privileged_context",) if getattr(args, "igrpo_answer_source", "env") == "env" else ()

    @classmethod
    def signal_options(cls, args: Any) -> dict[str, dict[str, Any]]:
        options = super().signal_options(args)
        options[GOLD_LIKELIHOOD] = {"source": args.igrpo_answer_source, "template": args.igrpo_answer_template}
        return options

    @classmethod
    def topology_options(cls, args: Any) -> dict[str, Any]:
        return {"leaf_budget": args.igrpo_leaf_budget, "expansion_factor": args.igrpo_expansion_factor,
                "temperature": args.igrpo_temperature, "suppress_after": args.igrpo_suppress_after,
                "expansions_per_round": args.igrpo_expansions_per_round, "seed": args.seed}

    def compute_advantages(self, groups: list[Group]) -> list[list[list[float]]]:
        if not self.model.training:
            # Evaluation rollouts run the independent topology (no tree, no node likelihoods): equal gains, i.e.
            # GRPO on the episodes, which is what IGRPO gives with uniform weights.
            return self.estimate("grpo", groups, credit_statistic="trajectories")
        return self.estimate("igrpo", groups)
