"""SCPO: progress along a successful sibling as step rewards for failed episodes, then GiGPO (Xu et al. 2026,
arXiv 2606.25852).

The only change w.r.t. `AgentGRPOTrainer` is `compute_advantages`: in every group with a success, each step of a
failed episode is scored against the steps of one successful sibling; a step that moves the failed episode further
along the sibling than before earns r̃_t = c·(new progress)/|s*|, and GiGPO runs on the shaped rewards (math in
`trl_agents/credit/scpo.py`; docs: docs/methods/scpo.md). The scorer is pluggable: a built-in by name
(`scpo_scorer`: "lexical", "difflib", "exact", or one registered with `trl_agents.credit.scpo.register_scorer`),
or any callable `scorer(failed_step, successful_sibling) -> [score in [0, 1] per sibling step]` passed to the
trainer (e.g. a cross-encoder reranker, as in the paper).

Example:
    ```python
    from datasets import Dataset
    from trl_agents.envs import get_env_class
    from trl_agents.trainers.scpo import SCPOConfig, SCPOTrainer

    tasks = Dataset.from_list(get_env_class("alfworld").task_split("train", 256))
    config = SCPOConfig(output_dir="alfworld-scpo", max_turns=50, max_completion_length=512)
    SCPOTrainer(model="Qwen/Qwen2.5-1.5B-Instruct", args=config, train_dataset=tasks).train()
    # your own scorer: SCPOTrainer(..., scorer=lambda step, sibling: [...])
    ```
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..names import check_choice
from ..credit.scpo import SCORERS, SHAPING_LEVELS, SIBLING_CHOICES, Scorer, get_scorer
from ..trajectory import Group
from .gigpo import GiGPOConfig, GiGPOTrainer
from .registry import MethodInfo


@dataclass
class SCPOConfig(GiGPOConfig):
    r"""
    Configuration of [`SCPOTrainer`]: every [`GiGPOConfig`] field (the estimator SCPO shapes) plus SCPO's
    (docs/methods/scpo.md).

    Args:
        scpo_scorer (`str`, *optional*, defaults to `"lexical"`): Built-in scorer of failed steps against the sibling.
        progress_threshold (`float`, *optional*, defaults to `0.8`): τ, the score at which a sibling step matches.
        progress_coef (`float`, *optional*, defaults to `0.5`): κ, total shaping of a fully retraced sibling relative
            to its return.
        sibling (`str`, *optional*, defaults to `"shortest"`): Which successful episode failed ones follow.
        shaping_level (`str`, *optional*, defaults to `"episode_and_step"`): Where the shaped rewards enter GiGPO.
        scorer_action_weight (`float`, *optional*, defaults to `0.5`): Weight of the action in the text scorers.
    """

    scpo_scorer: str = field(
        default="lexical",
        metadata={"help": "Scorer of each failed step against every step of the successful sibling, in [0, 1]: "
        "'lexical' (token-overlap Dice of observation and canonical action; our choice, a cheap offline stand-in "
        "for the paper's cross-encoder reranker, docs/methods/scpo.md step 2 [S]), 'difflib' (character "
        "SequenceMatcher ratio; ~80x slower on long observations), 'exact' (same state_key and canonical action; "
        "for envs with state keys, e.g. Sokoban) or a name registered with "
        "trl_agents.credit.scpo.register_scorer. A callable passed to SCPOTrainer(scorer=...) overrides it."},
    )
    progress_threshold: float = field(
        default=0.8,
        metadata={"help": "τ: a failed step matches sibling step j when its score is >= τ; its progress index is "
        "the last matched j (our choice: 0.8, docs/methods/scpo.md step 3 [D])."},
    )
    progress_coef: float = field(
        default=0.5,
        metadata={"help": "κ: new progress earns r̃ = κ·R(s*)·(P_t − P_{t−1})/|s*|, so a failed episode earns at "
        "most κ times the sibling's return (c = 0.5·r_success with r_success = the sibling's return; our choice, "
        "docs/methods/scpo.md step 4 [D])."},
    )
    sibling: str = field(
        default="shortest",
        metadata={"help": "Successful sibling s* that failed episodes are compared with: 'shortest' (fewest steps, "
        "then highest return; docs/methods/scpo.md step 1 [D]) or 'highest_return' (then fewest steps). Ties: "
        "smallest content, independent of episode order. Our choice."},
    )
    shaping_level: str = field(
        default="episode_and_step",
        metadata={"help": "'episode_and_step': GiGPO runs on the shaped rewards r' = r + r̃, which also enter the "
        "episode return of A^E (docs/methods/scpo.md step 5: the shaped rewards replace r before GiGPO); "
        "'step': only GiGPO's step-level returns are shaped, A^E stays the outcome advantage (the "
        "digest's 'added to GiGPO's step rewards' [S]). Our choice."},
    )
    scorer_action_weight: float = field(
        default=0.5,
        metadata={"help": "Weight w of the action in the text scorers: score = (1 − w)·sim(observations) + "
        "w·sim(canonical actions) (our choice, docs/methods/scpo.md step 2: text = observation + action)."},
    )

    def __post_init__(self):
        super().__post_init__()
        if self.scpo_scorer not in SCORERS:
            raise ValueError(
                f"scpo_scorer must be one of {', '.join(map(repr, sorted(SCORERS)))} (or register yours with "
                f"trl_agents.credit.scpo.register_scorer, or pass a callable to SCPOTrainer(scorer=...)); "
                f"got {self.scpo_scorer!r}"
            )
        if not (math.isfinite(self.progress_threshold) and 0.0 < self.progress_threshold <= 1.0):
            raise ValueError(f"progress_threshold must be in (0, 1], got {self.progress_threshold}")
        if not (math.isfinite(self.progress_coef) and self.progress_coef >= 0.0):
            raise ValueError(f"progress_coef must be finite and >= 0 (0 = plain GiGPO), got {self.progress_coef}")
        check_choice("sibling", self.sibling, SIBLING_CHOICES)
        check_choice("shaping_level", self.shaping_level, SHAPING_LEVELS)
        if not (math.isfinite(self.scorer_action_weight) and 0.0 <= self.scorer_action_weight <= 1.0):
            raise ValueError(f"scorer_action_weight must be in [0, 1], got {self.scorer_action_weight}")


class SCPOTrainer(GiGPOTrainer):
    """SCPO on GiGPO: `compute_advantages` shapes the rewards of failed episodes before GiGPO's advantages.

    Args:
        scorer: Optional callable `scorer(failed_step, successful_sibling) -> one score in [0, 1] per sibling step`;
            it replaces the built-in named by `args.scpo_scorer`. Every other argument is `AgentGRPOTrainer`'s.
    """

    _tag_names = ["trl", "trl-agents", "scpo"]
    _name = "SCPO"
    config_class = SCPOConfig
    methods = (
        MethodInfo("scpo", "arXiv 2606.25852", "trl_agents.credit.scpo", max_staleness=1, title="SCPO",
                   inputs=("episode returns", "success labels", "step rewards",
                           "step observations + canonical actions (scorer)",
                           "state keys (observation text when the env has none)"),
                   tests=("tests/methods/scpo/",)),
    )

    def __init__(self, *positional, scorer: Scorer | None = None, **keywords):
        if scorer is not None and not callable(scorer):
            raise TypeError(f"scorer must be callable (failed_step, sibling) -> scores, got {type(scorer).__name__}")
        super().__init__(*positional, **keywords)
        # One scorer for the whole run, so the built-in text scorers keep their similarity caches across rollouts.
        self.scorer = scorer if scorer is not None else get_scorer(
            self.args.scpo_scorer, action_weight=self.args.scorer_action_weight
        )

    def compute_advantages(self, groups: list[Group]) -> list[list[list[float]]]:
        return self.estimate("scpo", groups, scpo_scorer=self.scorer)
