"""LLMZero's outer loop (arXiv 2606.18388; docs/methods/llmzero.md): a tree search over training strategies.

`run_search(run, config, model_args, search)` runs around any method's config, the same three objects
`trl-agents train` parses (`RunArguments`, the method's config, TRL's `ModelConfig`), plus the controller's settings
(`trl_agents.strategy.SearchArguments`; `LLMZeroConfig` carries them itself):

1. the root stage: `stage_steps` RL steps with the config as given (the base model, tiny model or warm start as
   `run_training` builds it), evaluated on the held-out split before and after;
2. repeatedly, until `search_budget` stages are spent: select by UCB (or best-first) — an unvisited child first —
   and either train that child for `stage_steps` from its parent's checkpoint with its parameters, or, at a trained
   node without children yet, diagnose its metrics into pathologies and ask the proposer for `children_per_node`
   coordinated transitions, made legal by `constrain` (capacity parameters never decrease along a path);
3. `SEARCH_TREE` (`search_tree.json` in the search directory) is rewritten after every change: a killed search
   started again with the same settings continues where it stopped (a stage killed halfway is trained again).

Every stage is a `run_training` call with `output_dir = <search_dir>/nodes/<id>`, so a node's checkpoint, metrics,
trajectories and evaluations are those of a normal run. The proposer is `RuleProposer` by default, `LLMProposer`
(an OpenAI-compatible endpoint, through `trl_agents.judges.EndpointJudge`) with `proposer: llm` and `proposer_url`,
or any callable passed to `run_search(..., proposer=fn)`.

Example:
    ```python
    from trl import ModelConfig
    from trl_agents.run import RunArguments
    from trl_agents.search import run_search
    from trl_agents.trainers.llmzero import LLMZeroConfig

    run = RunArguments(method="llmzero", tiny_model=True, num_train_tasks=64, num_eval_tasks=8)
    config = LLMZeroConfig("outputs/search", env_name="frozenlake", per_device_train_batch_size=4,
                           num_generations=2, max_completion_length=3, stage_steps=2, search_budget=3)
    tree = run_search(run, config, ModelConfig())
    ```
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import shutil
import time
from collections.abc import Callable, Mapping
from typing import Any

from .fileio import atomic_write
from .judges import EndpointJudge, JudgeUnavailable
from .strategy import (
    BOUNDS,
    RuleProposer,
    SearchArguments,
    SearchTree,
    constrain,
    diagnose,
    proposals_from_text,
    summarise,
)

SEARCH_TREE = "search_tree.json"


def search_arguments(config: Any, search: SearchArguments | None = None) -> SearchArguments:
    """The controller settings: `search` when given, else the config's own (an `LLMZeroConfig`)."""
    if search is not None:
        return search
    if isinstance(config, SearchArguments):
        return config
    raise ValueError(f"{type(config).__name__} has no search settings: pass a SearchArguments (or use method llmzero)")


def param_value(config: Any, name: str) -> Any:
    """A searched parameter's current value (`epsilon_high` None means `epsilon`, as in TRL)."""
    value = getattr(config, name)
    if name == "epsilon_high" and value is None:
        value = config.epsilon
    return value


def stage_config(config: Any, params: Mapping[str, Any], **overrides: Any) -> Any:
    """A new config of the same class: `config`'s values with `params` and `overrides` on top, validated again by
    the class (`__post_init__`). Derived values are re-derived (TRL's `generation_batch_size`), so changing
    `num_generations` is checked against the batch size."""
    values = {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.init}
    values["generation_batch_size"] = None  # re-derived from per_device_train_batch_size × steps_per_generation
    values["resume_from_checkpoint"] = None
    values.update(params)
    values.update(overrides)
    return type(config)(**values)


def check_searched_fields(config: Any, search: SearchArguments) -> None:
    names = {f.name for f in dataclasses.fields(config)}
    for field_name in ("capacity_params", "regularisation_params"):
        for name in getattr(search, field_name):
            if name not in names:
                from .names import did_you_mean

                raise ValueError(f"{field_name}: {name!r} is not a field of {type(config).__name__}."
                                 f"{did_you_mean(name, sorted(names))}")
            value = param_value(config, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                message = f"{field_name}: {name!r} is {value!r}, not a number; search numeric fields only"
                raise ValueError(message)  # noqa: TRY004 (the CLI reports ValueErrors in one line)


class LLMProposer:
    """Transitions proposed by a language model behind an OpenAI-compatible endpoint (`vllm serve`, any service
    speaking /v1/chat/completions), through `EndpointJudge`'s HTTP code (temperature 0, a timeout, `probe()`, and its
    retries: a 429, 5xx or dropped connection is tried again, up to 4 times with exponential backoff).

    The model sees the node's parameters, stage summary, pathologies, scores and the path from the root, and the
    rules (capacity never decreases, the bounds); it answers a JSON list of {"changes": {...}, "rationale": "..."}.
    An answer without such a list, or a failed request, falls back to `fallback` (the rule proposer), and says so
    in the proposals' `proposer` field.
    """

    def __init__(self, url: str, model: str | None = None, *, timeout: float = 120.0, max_tokens: int = 1024,
                 api_key: str | None = None, fallback: Callable | None = None):
        self.endpoint = EndpointJudge(url, model, timeout=timeout, max_tokens=max_tokens, workers=1, api_key=api_key)
        self.fallback = fallback or RuleProposer()

    def probe(self) -> list[str]:
        try:
            return self.endpoint.probe()
        except JudgeUnavailable as err:
            raise JudgeUnavailable(str(err).replace("the judge endpoint", "the proposer endpoint", 1)) from None

    @staticmethod
    def messages(context: Mapping[str, Any]) -> list[dict[str, str]]:
        rules = (
            "You tune the hyper-parameters of a multi-stage GRPO (RL) training run of an LLM agent. Each stage trains "
            "from the previous stage's checkpoint. Propose coordinated multi-parameter transitions for the next "
            "stage. Rules: capacity parameters never decrease along a path; regularisation parameters may move "
            "either way; only change the listed parameters, within the bounds. Answer with a JSON list of exactly "
            f"{context['k']} objects {{\"changes\": {{parameter: new value}}, \"rationale\": \"...\"}} and nothing "
            "else."
        )
        shown = {key: context[key] for key in ("params", "summary", "pathologies", "score", "score_before", "path",
                                               "capacity", "regularisation", "bounds") if key in context}
        return [{"role": "system", "content": rules},
                {"role": "user", "content": json.dumps(shown, indent=1, default=str)}]

    def __call__(self, context: Mapping[str, Any]) -> list[dict[str, Any]]:
        text = self.endpoint.answers([self.messages(context)])[0]
        proposals = proposals_from_text(text)
        if proposals:
            return [{**p, "proposer": "llm"} for p in proposals]
        reason = self.endpoint.last_errors[0] if self.endpoint.last_errors else "no JSON list of proposals"
        return [{**p, "proposer": f"rules (llm fallback: {reason[:120]})"} for p in self.fallback(context)]


def make_proposer(search: SearchArguments) -> Callable:
    if search.proposer == "llm":
        proposer = LLMProposer(search.proposer_url, search.proposer_model, timeout=search.proposer_timeout,
                               max_tokens=search.proposer_max_tokens)
        proposer.probe()  # a one-line error now rather than after the root stage
        return proposer
    return RuleProposer()


def proposer_context(tree: SearchTree, node: Mapping[str, Any], search: SearchArguments) -> dict[str, Any]:
    searched = [*search.capacity_params, *search.regularisation_params]
    return {
        "node": node["id"],
        "params": dict(node["params"]),
        "summary": dict(node.get("summary") or {}),
        "pathologies": list(node.get("pathologies") or []),
        "score": node.get("score"),
        "score_before": node.get("score_before"),
        "path": [{"params": n["params"], "score": n.get("score"), "rationale": n["transition"].get("rationale", "")}
                 for n in tree.path(node["id"])],
        "k": search.children_per_node,
        "capacity": list(search.capacity_params),
        "regularisation": list(search.regularisation_params),
        "bounds": {name: BOUNDS[name] for name in searched if name in BOUNDS},
    }


def train_stage(run: Any, config: Any, model_args: Any, search: SearchArguments, node: Mapping[str, Any],
                parent: Mapping[str, Any] | None) -> dict[str, Any]:
    """Train one stage with `run_training`: the root from the run's model, a child from its parent's checkpoint,
    `stage_steps` RL steps with the node's parameters; return its score, metrics summary and pathologies."""
    from .run import run_training

    node_dir = node["checkpoint"]
    if os.path.isdir(node_dir):
        shutil.rmtree(node_dir)  # a stage killed halfway: trained again from its parent
    stage = stage_config(config, node["params"], output_dir=node_dir, max_steps=search.stage_steps)
    stage_run, stage_model = run, model_args
    if parent is not None:  # the parent's final checkpoint (model + tokenizer) is the model of this stage
        stage_run = dataclasses.replace(run, tiny_model=False, warm_start_steps=0, warm_start_dataset=None)
        stage_model = copy.copy(model_args)
        stage_model.model_name_or_path = parent["checkpoint"]
        stage_model.model_revision = None
    results = run_training(stage_run, stage, stage_model)
    with open(os.path.join(node_dir, "metrics.json")) as handle:
        history = json.load(handle).get("rl", [])
    summary = summarise(history, max_completion_length=stage.max_completion_length)
    score = results["eval_after_rl"][search.search_metric]
    score_before = results["eval_before_rl"][search.search_metric]
    return {"score": score, "score_before": score_before, "summary": summary,
            "pathologies": diagnose(summary, score=score, score_before=score_before, params=node["params"]),
            "rl_steps": results["rl_steps"], "seconds": results["total_seconds"]}


def _save(tree: SearchTree, path: str, meta: Mapping[str, Any]) -> None:
    atomic_write(path, json.dumps({**meta, **tree.to_dict()}, indent=1, default=str))


def _say(message: str, config: Any) -> None:
    if getattr(config, "process_index", 0) == 0:
        print(f"[trl-agents] search: {message}", flush=True)


def run_search(
    run: Any,
    config: Any,
    model_args: Any,
    search: SearchArguments | None = None,
    *,
    proposer: Callable | None = None,
    stage_runner: Callable | None = None,
) -> dict[str, Any]:
    """Run (or resume) the search (see the module docstring); return `search_tree.json`'s content with `best`
    (the best trained node) and `best_path` (its path from the root).

    `proposer(context) -> proposals` replaces the configured one; `stage_runner(node, parent) -> result` replaces
    `train_stage` (tests: no model).
    """
    search = search_arguments(config, search)
    check_searched_fields(config, search)
    if getattr(model_args, "use_peft", False):
        raise ValueError("use_peft: the search trains each stage from its parent's full checkpoint; train without "
                         "LoRA (or merge the adapter into the model first)")
    searched = [*search.capacity_params, *search.regularisation_params]
    directory = search.search_dir or config.output_dir
    path = os.path.join(directory, SEARCH_TREE)
    root_params = {name: param_value(config, name) for name in searched}
    meta = {"method": run.method, "env": config.env_name, "stage_steps": search.stage_steps,
            "search_metric": search.search_metric}
    if os.path.isfile(path):
        with open(path) as handle:
            stored = json.load(handle)
        tree = SearchTree.from_dict(stored)
        same = {k: stored.get(k) for k in meta} == meta and tree.nodes and tree.nodes[0]["params"] == root_params
        if not same:
            raise ValueError(f"{path} was written by a search with other settings (method, env, stage_steps, "
                             "search_metric or root parameters): choose another output_dir/search_dir, or delete it")
        tree.backup = search.search_backup
        for node in tree.nodes:
            if node["status"] == "running":
                node["status"] = "proposed"  # killed halfway: trained again
        _say(f"resuming {path}: {tree.trained()} of {search.search_budget} stages done", config)
    else:
        tree = SearchTree(backup=search.search_backup)
        tree.add(root_params, transition={"rationale": "root: the config as given"})
    for node in tree.nodes:
        node.setdefault("checkpoint", os.path.join(directory, "nodes", f"{node['id']:03d}"))
    os.makedirs(directory, exist_ok=True)
    _save(tree, path, meta)
    proposer = proposer or make_proposer(search)
    if stage_runner is None:
        def stage_runner(node, parent):
            return train_stage(run, config, model_args, search, node, parent)

    while tree.trained() < search.search_budget:
        action = tree.select(search.ucb_c, search.search_selection)
        if action is None:
            _say("nothing left to expand (every proposal was refused or failed)", config)
            break
        kind, node_id = action
        node = tree.nodes[node_id]
        if kind == "expand":
            _expand(tree, node, search, config, proposer, directory)
            _save(tree, path, meta)
            continue
        parent = None if node["parent"] is None else tree.nodes[node["parent"]]
        node["status"] = "running"
        _save(tree, path, meta)
        started = time.monotonic()
        try:
            result = stage_runner(node, parent)
        except (ValueError, RuntimeError, OSError) as err:
            if parent is None:  # the config as given does not train: the user's error, as it is
                node["status"] = "proposed"
                _save(tree, path, meta)
                raise
            node.update(status="failed", error=f"{type(err).__name__}: {str(err).splitlines()[0][:300]}")
            _say(f"stage {tree.trained()}/{search.search_budget}: node {node_id} failed ({node['error']})", config)
        else:
            node.update(result)
            node["status"] = "done"
            node.setdefault("seconds", time.monotonic() - started)
            names = ", ".join(p["name"] for p in node["pathologies"]) or "none"
            _say(f"stage {tree.trained()}/{search.search_budget}: node {node_id} (parent {node['parent']}, depth "
                 f"{node['depth']}) {search.search_metric} {node['score']:.3f} (from {node['score_before']:.3f}); "
                 f"pathologies: {names}", config)
        _save(tree, path, meta)
    best = tree.best()
    summary = {**meta, **tree.to_dict(), "best": best,
               "best_path": [n["id"] for n in tree.path(best["id"])] if best else []}
    if best is not None:
        steps = " -> ".join(f"{n['id']}" for n in tree.path(best["id"]))
        _say(f"best node {best['id']} ({search.search_metric} {best['score']:.3f}), path {steps}; {path}", config)
    return summary


def _expand(tree: SearchTree, node: dict[str, Any], search: SearchArguments, config: Any, proposer: Callable,
            directory: str) -> None:
    """Ask the proposer for the node's children; keep the legal, buildable, distinct ones (notes on the rest)."""
    context = proposer_context(tree, node, search)
    try:
        proposals = list(proposer(context))
    except (ValueError, OSError, KeyError, TypeError) as err:
        node["proposal_notes"] = [f"the proposer failed ({type(err).__name__}: {err}); the rule proposer stood in"]
        proposals = [{**p, "proposer": "rules (fallback)"} for p in RuleProposer()(context)]
    notes = list(node.get("proposal_notes", []))
    seen = []
    for proposal in proposals:
        if len(seen) == search.children_per_node:
            break
        changes = proposal.get("changes") if isinstance(proposal, Mapping) else None
        if not isinstance(changes, Mapping):
            notes.append(f"ignored a proposal without a 'changes' mapping: {proposal!r:.120}")
            continue
        params, why = constrain(node["params"], changes, capacity=search.capacity_params,
                                regularisation=search.regularisation_params)
        if params in seen:
            notes.append(f"dropped a duplicate proposal ({proposal.get('rationale', '')})")
            continue
        try:
            stage_config(config, params, output_dir=os.path.join(directory, "nodes", "check"))
        except (ValueError, TypeError) as err:
            notes.append(f"dropped {dict(changes)}: the config refuses it ({str(err).splitlines()[0][:200]})")
            continue
        seen.append(params)
        child = tree.add(params, parent=node["id"], transition={
            "changes": {k: v for k, v in params.items() if v != node["params"].get(k)},
            "rationale": str(proposal.get("rationale", "")), "proposer": proposal.get("proposer", "rules"),
            "notes": why, "pathologies": [p["name"] for p in node.get("pathologies", [])]})
        child["checkpoint"] = os.path.join(directory, "nodes", f"{child['id']:03d}")
    node["expanded"] = True
    node["proposal_notes"] = notes
