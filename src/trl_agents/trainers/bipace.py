"""BiPACE: Bisimulation-Guided Policy Optimization + Action Counterfactual Estimation (arXiv 2606.25556).

The only change w.r.t. `AgentGRPOTrainer` is `compute_advantages`: GiGPO's episode advantage plus a step advantage
among steps whose prompts the policy represents alike (cosine clusters of a late hidden layer), comparing the
returns of the peers that took the same action with the cluster's mean, `A = A^ep + w·(Q̂ − V̂)` (math in
`trl_agents/credit/bipace.py`; spec: /work/shared/research/methods_with_code.md §4).

Where the hidden states come from (`hidden_state_source`):

* `"rollout"` (default): captured during the rollout itself. With the trainer's own `TransformersGenerator`, every
  turn's `model.generate` starts with a prefill forward over the step prompts; forward hooks on the backbone and on
  the chosen decoder layer keep one pooled vector per prompt from that pass. No extra forward pass. Prompts the hooks
  did not see (an external generator such as a vLLM server) fall back to the extra forward below.
* `"forward"`: one extra no-grad forward over the step prompts (prompts only, not the actions), stopped right after
  the chosen layer: the paper's way (README: 11.3 % of a step for the hidden-state pass).

TRL's old-logprob pass cannot serve: it runs after `compute_advantages` (and only when generation and optimisation
are misaligned).

Example:
    ```python
    from datasets import Dataset
    from trl_agents.envs import get_env_class
    from trl_agents.trainers.bipace import BiPACEConfig, BiPACETrainer

    tasks = Dataset.from_list(get_env_class("alfworld").task_split("train", 256))
    config = BiPACEConfig(output_dir="alfworld-bipace", max_turns=50, hidden_layer=-12, cluster_epsilon=0.05)
    BiPACETrainer(model="Qwen/Qwen2.5-1.5B-Instruct", args=config, train_dataset=tasks).train()
    ```
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from ..credit.base import check_choice
from ..credit.bipace import bipace_advantages_with_stats
from ..trajectory import Group
from .agent_grpo import AgentGRPOConfig, AgentGRPOTrainer

HIDDEN_STATE_SOURCES = ("rollout", "forward")
POOLINGS = ("last_token", "mean")


@dataclass
class BiPACEConfig(AgentGRPOConfig):
    r"""
    Configuration of [`BiPACETrainer`]: every [`AgentGRPOConfig`] field plus BiPACE's (methods_with_code.md §4).

    Args:
        gamma (`float`, *optional*, defaults to `0.95`): Discount of the step returns (GiGPO Eq. 5).
        step_advantage_w (`float`, *optional*, defaults to `1.0`): w, weight of the PACE step advantage.
        hidden_layer (`int`, *optional*, defaults to `-12`): Decoder layer whose output represents a state
            (README: −12 for Qwen2.5-1.5B, −8 for 7B).
        cluster_epsilon (`float`, *optional*, defaults to `0.05`): ε, cosine-distance radius of a cluster (README:
            0.05 for 1.5B, 0.10 for 7B).
        pace_estimator (`str`, *optional*, defaults to `"q_style"`): `"q_style"` or `"diff_peer"`.
        action_key (`str`, *optional*, defaults to `"action_tag"`): `"action_tag"` or `"first_tokens"`.
        pooling (`str`, *optional*, defaults to `"last_token"`): Which prompt positions make the state vector.
        centroid (`str`, *optional*, defaults to `"mean"`): Cluster centroid: running mean or first member.
        episode_mode (`str`, *optional*, defaults to `"mean_norm"`): Normalisation of the episode advantage.
        episode_statistic (`str`, *optional*, defaults to `"step_rows"`): Population of its mean/std.
        hidden_state_source (`str`, *optional*, defaults to `"rollout"`): Capture during the rollout, or an extra
            forward pass.
    """

    gamma: float = field(
        default=0.95,
        metadata={"help": "Discount γ of the step returns R_t = Σ γ^(k−t) r_k (GiGPO Eq. 5). Not restated by the "
        "paper; BiPACE builds on verl-agent GiGPO, whose scripts use 0.95: our choice, methods_with_code.md §4.5."},
    )
    step_advantage_w: float = field(
        default=1.0,
        metadata={"help": "w, weight of the PACE step advantage in A = A^ep + w·Â^S (GiGPO's step_advantage_w, "
        "default 1; methods_with_code.md §4.1, §4.5)."},
    )
    hidden_layer: int = field(
        default=-12,
        metadata={"help": "Decoder layer whose output is the state representation f_θ(s), as a Python index into "
        "the model's decoder layers (−8 = output of the 8th layer from the top = hidden_states[−8] of "
        "output_hidden_states). README: −12 for Qwen2.5-1.5B, −8 for Qwen2.5-7B (methods_with_code.md §4.2)."},
    )
    cluster_epsilon: float = field(
        default=0.05,
        metadata={"help": "ε: a step joins the nearest cluster centroid when its cosine distance 1 − ⟨φ, c⟩ is at "
        "most ε, else it opens a new cluster. README: 0.05 for 1.5B, 0.10 for 7B (methods_with_code.md §4.2)."},
    )
    pace_estimator: str = field(
        default="q_style",
        metadata={"help": "'q_style': Â^S = mean return of the cluster peers that took the same action − cluster "
        "mean (README default, 'strongest'); 'diff_peer': own return − mean return of the peers that took another "
        "action (methods_with_code.md §4.1)."},
    )
    action_key: str = field(
        default="action_tag",
        metadata={"help": "Action key of PACE. 'action_tag': the environment's canonical action (info['action']) "
        "when it reports one, else the <action>…</action> body (extract_answer), lower-cased, whitespace collapsed "
        "(README default action_tag; the info['action'] preference is our choice); 'first_tokens': the first 8 "
        "action tokens (README first-token) (methods_with_code.md §4.1, §10)."},
    )
    pooling: str = field(
        default="last_token",
        metadata={"help": "State vector from the layer's output: 'last_token', the last prompt token (the position "
        "that predicts the first action token), or 'mean' over all prompt tokens. Not specified by the paper: our "
        "choice, methods_with_code.md §4.5."},
    )
    centroid: str = field(
        default="mean",
        metadata={"help": "Cluster centroid: 'mean', the re-normalised running mean of the members' unit vectors, "
        "or 'first', the first member's. Not specified by the paper: our choice, methods_with_code.md §4.5."},
    )
    episode_mode: str = field(
        default="mean_norm",
        metadata={"help": "Episode advantage A^ep as GiGPO's: 'mean_norm' (R − μ) or 'mean_std_norm' ((R − μ)/(σ + "
        "1e-6); verl-agent's ALFWorld script). The step advantage is never std-normalised. Not restated by the "
        "paper: our choice, methods_with_code.md §4.5."},
    )
    episode_statistic: str = field(
        default="step_rows",
        metadata={"help": "Population of A^ep's mean/std: 'step_rows' (verl-agent GiGPO, compute_mean_std_cross_steps) "
        "or 'trajectories' (GiGPO paper Eq. 3). Not restated by the paper: our choice, methods_with_code.md §1, §4."},
    )
    hidden_state_source: str = field(
        default="rollout",
        metadata={"help": "'rollout': keep the hidden states of the prefill forward that the trainer's generator "
        "already runs on every step prompt (no extra pass; prompts it did not see, e.g. with a vLLM generator, fall "
        "back to 'forward'); 'forward': one extra no-grad forward over the step prompts, cut after hidden_layer "
        "(the paper's way, README: 11.3 % of a step). Our choice, methods_with_code.md §4.3."},
    )

    def __post_init__(self):
        super().__post_init__()
        check_choice("pace_estimator", self.pace_estimator, ("q_style", "diff_peer"))
        check_choice("action_key", self.action_key, ("action_tag", "first_tokens"))
        check_choice("pooling", self.pooling, POOLINGS)
        check_choice("centroid", self.centroid, ("mean", "first"))
        check_choice("episode_mode", self.episode_mode, ("mean_norm", "mean_std_norm"))
        check_choice("episode_statistic", self.episode_statistic, ("step_rows", "trajectories"))
        check_choice("hidden_state_source", self.hidden_state_source, HIDDEN_STATE_SOURCES)
        if not 0.0 <= self.cluster_epsilon <= 2.0:
            raise ValueError(
                f"cluster_epsilon must be a cosine distance in [0, 2], got {self.cluster_epsilon} (README: 0.05 for "
                "Qwen2.5-1.5B, 0.10 for 7B)"
            )
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"gamma must be in [0, 1], got {self.gamma} (GiGPO/BiPACE: 0.95)")
        if not math.isfinite(self.step_advantage_w):
            raise ValueError(f"step_advantage_w must be finite, got {self.step_advantage_w}")


class _StopForward(Exception):
    """Raised by the layer hook of the extra forward: nothing above `hidden_layer` is needed."""


def decoder_layers(model) -> tuple[torch.nn.Module, torch.nn.ModuleList]:
    """(backbone, its decoder layers) of a causal LM, a PEFT-wrapped one included."""
    if hasattr(model, "get_base_model"):  # PEFT
        model = model.get_base_model()
    backbone = model.get_decoder() if hasattr(model, "get_decoder") else getattr(model, "model", model)
    for name in ("layers", "h", "blocks"):
        layers = getattr(backbone, name, None)
        if isinstance(layers, torch.nn.ModuleList) and len(layers):
            return backbone, layers
    raise ValueError(
        f"BiPACE could not find the decoder layers of {type(model).__name__} (looked for .layers, .h, .blocks on "
        f"{type(backbone).__name__}); hidden_layer needs a decoder-only transformers model."
    )


def pool_hidden(hidden: torch.Tensor, mask: torch.Tensor, pooling: str) -> torch.Tensor:
    """(B, S, H) layer output + (B, S) attention mask -> (B, H) float32 state vectors (on the layer's device).

    "last_token": the last position the mask keeps (left or right padding); "mean": the mean over kept positions.

    >>> hidden, mask = torch.arange(12.0).reshape(1, 3, 4), torch.tensor([[0, 1, 1]])  # one left-padded prompt
    >>> pool_hidden(hidden, mask, "last_token").tolist(), pool_hidden(hidden, mask, "mean").tolist()
    ([[8.0, 9.0, 10.0, 11.0]], [[6.0, 7.0, 8.0, 9.0]])
    """
    mask = mask.to(hidden.device)
    if pooling == "last_token":
        positions = torch.arange(mask.size(1), device=mask.device).expand_as(mask)
        last = torch.where(mask.bool(), positions, torch.zeros_like(positions)).amax(dim=1)
        vectors = hidden[torch.arange(hidden.size(0), device=hidden.device), last].float()
    else:  # a masked sum as one (B, 1, S) x (B, S, H) product (accumulated in float32 on GPUs), then the mean
        weights = mask.to(hidden.dtype).unsqueeze(1)
        vectors = (weights @ hidden).squeeze(1).float() / mask.sum(dim=1, keepdim=True).clamp(min=1).float()
    return vectors.detach()


class _PrefillRecorder:
    """Forward hooks that keep, for every prompt of a generation prefill, the pooled output of one decoder layer.

    A backbone call counts as a prefill when it sees whole sequences: 2-D `input_ids` and `attention_mask` of the
    same shape and an empty KV cache (the decode steps that follow see one new token). Vectors are keyed by the
    prompt's token ids (the unmasked ones), which are exactly the `Step.prompt_ids` the rollout records.
    """

    def __init__(self, layer_index: int, pooling: str):
        self.layer_index = layer_index
        self.pooling = pooling
        self.vectors: dict[tuple[int, ...], torch.Tensor] = {}
        self._inputs: tuple[torch.Tensor, torch.Tensor] | None = None

    @contextlib.contextmanager
    def recording(self, model):
        backbone, layers = decoder_layers(model)
        handles = [
            backbone.register_forward_pre_hook(self._see_inputs, with_kwargs=True),
            layers[self.layer_index].register_forward_hook(self._keep_output),
        ]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()
            self._inputs = None

    def _see_inputs(self, module, args, kwargs):
        input_ids = kwargs.get("input_ids", args[0] if args else None)
        mask = kwargs.get("attention_mask")
        cache = kwargs.get("past_key_values")
        if torch.is_tensor(input_ids) and torch.is_tensor(mask) and mask.dim() == 2 == input_ids.dim():
            # A static-cache prefill (generation_backend="static") passes the mask of the whole cache; the prompt's
            # columns come first.
            mask = mask[:, : input_ids.shape[1]]
        whole = (
            torch.is_tensor(input_ids)
            and torch.is_tensor(mask)
            and input_ids.dim() == 2
            and mask.shape == input_ids.shape
            and (cache is None or not hasattr(cache, "get_seq_length") or cache.get_seq_length() == 0)
        )
        self._inputs = (input_ids, mask) if whole else None

    def _keep_output(self, module, args, output):
        if self._inputs is None:
            return
        input_ids, mask = self._inputs
        self._inputs = None
        hidden = output[0] if isinstance(output, tuple) else output
        vectors = pool_hidden(hidden, mask, self.pooling)
        for ids, keep, vector in zip(input_ids.tolist(), mask.bool().tolist(), vectors, strict=True):
            self.vectors.setdefault(tuple(t for t, k in zip(ids, keep, strict=True) if k), vector)

    def take(self) -> dict[tuple[int, ...], torch.Tensor]:
        vectors, self.vectors = self.vectors, {}
        return vectors


class BiPACETrainer(AgentGRPOTrainer):
    """BiPACE on `AgentGRPOTrainer`: the only change is `compute_advantages` (see the module docstring).

    Needs no environment capability: the clusters come from the policy's own hidden states, the action keys from
    the replies (or `info["action"]`). Logs `bipace/*`: cluster sizes, singleton and mixed-action cluster fractions,
    the fraction of step prompts whose hidden state came from the rollout, and the seconds spent getting them.
    """

    _tag_names: ClassVar[list[str]] = ["trl", "trl-agents", "bipace"]
    _name = "BiPACE"
    _config_class = BiPACEConfig

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        _, layers = decoder_layers(self.accelerator.unwrap_model(self.model))
        if not -len(layers) <= self.args.hidden_layer < len(layers):
            raise ValueError(
                f"hidden_layer={self.args.hidden_layer} is out of range for a model with {len(layers)} decoder layers: "
                f"use a value in [{-len(layers)}, {len(layers) - 1}] (README: −12 for Qwen2.5-1.5B, −8 for 7B)."
            )
        self._prefill = _PrefillRecorder(self.args.hidden_layer, self.args.pooling)
        self._recording = False  # on only inside the rollout, so the extra forward is never recorded

    # ---- hidden states ---------------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _model_for_generation(self):
        # The model context of the trainer's own generator: record the prefill of every generation call.
        with super()._model_for_generation() as model:
            if self._recording and self.args.hidden_state_source == "rollout":
                with self._prefill.recording(model):
                    yield model
            else:
                yield model

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        self._prefill.take()  # nothing left over from an interrupted rollout
        self._recording = True
        try:
            return super()._generate_and_score_completions(inputs)
        finally:
            self._recording = False
            self._prefill.take()

    def step_hidden_states(self, groups: list[Group]) -> tuple[list[torch.Tensor], float]:
        """One (num_steps, H) float32 matrix per group (on the model's device), rows trajectory by trajectory; and
        the fraction of distinct step prompts whose vector came from the rollout (the others took the extra
        forward)."""
        self._recording = False  # the rollout is over: stop recording before any further forward
        recorded = self._prefill.take()
        keys = []
        for group in groups:
            for trajectory in group.trajectories:
                for step in trajectory.steps:
                    if not step.prompt_ids:
                        raise ValueError("BiPACE needs every step's prompt_ids to compute its hidden state")
                    keys.append(tuple(step.prompt_ids))
        distinct = list(dict.fromkeys(keys))
        missing = [key for key in distinct if key not in recorded]
        vectors = {key: recorded[key] for key in distinct if key in recorded}
        if missing:
            vectors.update(zip(missing, self._forward_hidden_states(missing), strict=True))
        matrices, offset = [], 0
        for group in groups:
            count = sum(t.num_steps for t in group.trajectories)
            rows = [vectors[key] for key in keys[offset : offset + count]]
            matrices.append(torch.stack(rows) if rows else torch.zeros((0, 0)))
            offset += count
        return matrices, (1.0 - len(missing) / len(distinct)) if distinct else 1.0

    def _forward_hidden_states(self, prompts: list[tuple[int, ...]]) -> list[torch.Tensor]:
        """The extra no-grad forward: pooled `hidden_layer` outputs of `prompts`, cut right after that layer."""
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))  # similar lengths share a batch
        batch_size = max(self.args.per_device_train_batch_size, 1)
        pad_id = self._tokenizer.pad_token_id if self._tokenizer.pad_token_id is not None else 0
        results: list[torch.Tensor | None] = [None] * len(prompts)
        captured: list[torch.Tensor] = []

        def keep_and_stop(module, args, output):
            captured.append(output[0] if isinstance(output, tuple) else output)
            raise _StopForward

        with torch.no_grad(), super()._model_for_generation() as model:
            backbone, layers = decoder_layers(model)
            device = next(model.parameters()).device
            handle = layers[self.args.hidden_layer].register_forward_hook(keep_and_stop)
            was_training = model.training
            model.eval()  # as during generation: no dropout
            try:
                for start in range(0, len(order), batch_size):
                    chunk = order[start : start + batch_size]
                    width = max(len(prompts[i]) for i in chunk)
                    input_ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)
                    mask = torch.zeros((len(chunk), width), dtype=torch.long)
                    for row, index in enumerate(chunk):  # left padding, as the generator pads
                        input_ids[row, width - len(prompts[index]) :] = torch.tensor(prompts[index])
                        mask[row, width - len(prompts[index]) :] = 1
                    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)  # as `generate` computes them
                    captured.clear()
                    with contextlib.suppress(_StopForward):
                        backbone(
                            input_ids=input_ids.to(device),
                            attention_mask=mask.to(device),
                            position_ids=positions.to(device),
                            use_cache=False,
                        )
                    for index, vector in zip(chunk, pool_hidden(captured[0], mask, self.args.pooling), strict=True):
                        results[index] = vector
            finally:
                handle.remove()
                model.train(was_training)
        return results

    # ---- credit ----------------------------------------------------------------------------------------------------

    def compute_advantages(self, groups: list[Group]) -> list[list[list[float]]]:
        args = self.args
        start = time.perf_counter()
        hidden_states, rollout_fraction = self.step_hidden_states(groups)
        seconds = time.perf_counter() - start
        advantages, with_clusters = [], []
        for group, matrix in zip(groups, hidden_states, strict=True):
            group_advantages, stats = bipace_advantages_with_stats(
                group,
                hidden_states=matrix,
                epsilon=args.cluster_epsilon,
                gamma=args.gamma,
                omega=args.step_advantage_w,
                estimator=args.pace_estimator,
                action_key=args.action_key,
                centroid=args.centroid,
                episode_mode=args.episode_mode,
                statistic=args.episode_statistic,
                invalid_penalty=args.invalid_action_penalty,
            )
            advantages.append(group_advantages)
            if stats["num_clusters"]:
                with_clusters.append(
                    {"mean_cluster_size": stats["mean_cluster_size"],
                     "singleton_cluster_fraction": stats["singleton_fraction"],
                     "mixed_action_cluster_fraction": stats["mixed_action_fraction"]}
                )
        self.log_mean_metrics("bipace", with_clusters, ("mean_cluster_size", "singleton_cluster_fraction",
                                                        "mixed_action_cluster_fraction"))
        metrics = self._metrics["train" if self.model.training else "eval"]  # these two: this process's
        metrics["bipace/rollout_hidden_state_fraction"].append(rollout_fraction)
        metrics["bipace/hidden_state_seconds"].append(seconds)
        return advantages
