"""Publish a training run to the Hugging Face Hub: the model (or LoRA adapter), its card, eval results, trajectories.

`push_run(RUN_DIR, "user/name")` pushes what a trl-agents run wrote under its `output_dir`:

1. the trajectories (`RUN_DIR/trajectories/*.parquet`, one row per step) as the dataset repo `user/name-trajectories`
   (`datasets.Dataset.push_to_hub`), with a card that links back to the model;
2. in one commit to the model repo `user/name`: the documented top-level files of RUN_DIR (`PUSHED_FILES`: the
   final model, or the LoRA adapter as PEFT saved it; tokenizer; `agent_config.json`; `run_info.json`, the full
   config; `metrics.json`; `learning_curve.png`; `training_args.bin`, which holds no token), the raw eval results
   `eval/*.json`, the model card `README.md` rendered from
   `model_cards/model_card.md` (method, paper, environment, key settings, eval table and `model-index`, learning
   curve, links to the trajectories and the config), and the eval results in the Hub's `.eval_results/*.yaml` format.

3. the tasks each evaluation played, as a benchmark dataset `user/<env>-<split>-tasks` with an `eval.yaml`
   (`push_eval_tasks`), which the `.eval_results/*.yaml` entries name: the scores link to a dataset that exists, and
   the Hub lists them on that dataset's leaderboard once it allow-lists it as a benchmark.

Sub-folders (`checkpoint-*`, `base-model`, `warm-start`, `trajectories`) never go into the model repo. Any other
top-level file is skipped with a warning that names it, and nothing outside RUN_DIR is published: a link out of it
is skipped, or refused when it bears the name of a file to push. `push_run(..., dry_run=True)` (`trl-agents push
--dry_run`) returns the plan, every file for every repo, without any network call. Nothing is
written into RUN_DIR, so a failed push leaves the run as it was. A second push keeps what was edited on the Hub: the
card's metadata is merged (keys and tags added there stay), and a card body rewritten there is kept as it is.
During training, `AgentGRPOConfig(push_to_hub=True, hub_model_id="user/name")` pushes through the same function
(`AgentGRPOTrainer.push_to_hub`), and checkpoint pushes carry the model files only (`checkpoint_files`).

Example:
    ```python
    from trl_agents.hub import push_run

    urls = push_run("outputs/sokoban-gigpo", "my-user/qwen2.5-0.5b-sokoban-gigpo", private=True)
    print(urls["model"], urls["dataset"])
    ```
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from importlib import resources
from typing import Any

from huggingface_hub.utils import httpx  # the client's HTTP library: httpx (hub 1.x) or httpx2 (hub 2.x)
import yaml
from huggingface_hub import (
    CommitOperationAdd,
    DatasetCard,
    EvalResult,
    EvalResultEntry,
    HfApi,
    ModelCard,
    ModelCardData,
    RepoUrl,
    constants,
    eval_result_entries_to_yaml,
    get_token,
)
from huggingface_hub.errors import HfHubHTTPError, HFValidationError, OfflineModeIsEnabled
from huggingface_hub.utils import validate_repo_id

from .evaluation import EVAL_DIR, EVAL_METRICS, eval_result_paths, read_eval_results
from .records import (
    RUN_INFO_NAME,
    TRAJECTORIES_DIR,
    TRAJECTORY_FEATURES,
    hub_base_model,
    read_run_info,
    shard_files,
)

logger = logging.getLogger(__name__)

LEARNING_CURVE_NAME = "learning_curve.png"
DEFAULT_COMMIT_MESSAGE = "Upload trl-agents run"
CARD_MARKER = "<!-- trl-agents model card -->"
"""Marks a card body trl-agents rendered: a push re-renders such a body and keeps any other (edited on the Hub)."""
# Display names of `evaluation.EVAL_METRICS` (tests/io/test_hub.py checks that every metric has one).
METRIC_NAMES = {
    "success_rate": "Success rate",
    "episode_return": "Mean episode return",
    "episode_length": "Mean episode length",
    "valid_action_rate": "Valid-action rate",
}
# Settings shown in the card's training table when the run has them (the full config is linked).
KEY_SETTINGS = (
    "env_kwargs", "max_turns", "history_length", "row_format", "num_generations", "per_device_train_batch_size",
    "gradient_accumulation_steps", "steps_per_generation", "max_steps", "num_train_epochs", "learning_rate", "beta",
    "loss_type", "scale_rewards", "temperature", "max_completion_length", "max_prompt_length", "advantage_estimator",
    "invalid_action_penalty", "seed",
)
ADAPTER_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")
MODEL_WEIGHTS = (
    "model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json",
)
PUSHED_FILES = (
    # the model (weights, sharded or not, and configs) or the LoRA adapter, as save_pretrained writes them
    *MODEL_WEIGHTS, "model-*-of-*.safetensors", "pytorch_model-*-of-*.bin", "config.json", "generation_config.json",
    "adapter_config.json", *ADAPTER_WEIGHTS,
    # the tokenizer or processor
    "tokenizer.json", "tokenizer_config.json", "tokenizer.model", "special_tokens_map.json", "added_tokens.json",
    "chat_template.jinja", "chat_template.json", "vocab.json", "vocab.txt", "merges.txt", "spiece.model",
    "sentencepiece.bpe.model", "*.tiktoken", "preprocessor_config.json", "processor_config.json",
    # the run's records (training_args.bin holds no token: AgentGRPOTrainer._save)
    "agent_config.json", RUN_INFO_NAME, "metrics.json", "eval_results.json", "eval_before_rl.json",
    "rollout_totals.json", LEARNING_CURVE_NAME, "training_args.bin",
    # the methods' `save_extra_state` (3SPO, EPPO, ToolRL)
    "state_scores.json", "eppo_state.json", "toolrl_state.json",
)
"""The top-level files of RUN_DIR that `push_run` uploads (fnmatch patterns), with the custom-code modules that
`config.json` / `tokenizer_config.json` name in `auto_map`. Any other file is skipped, and named in a warning."""


def push_run(
    run_dir: str,
    repo_id: str,
    *,
    token: str | None = None,
    private: bool = False,
    dataset_repo_id: str | None = None,
    push_trajectories: bool = True,
    commit_message: str = DEFAULT_COMMIT_MESSAGE,
    method=None,
    push_eval_tasks: bool = True,
    revision: str | None = None,
    include_folders: Sequence[str] = (),
    dry_run: bool = False,
) -> dict[str, Any]:
    """Push a run directory to the Hub: model or adapter, card with eval results, and its trajectories as a dataset.

    Args:
        run_dir: The trainer's `output_dir` after `trainer.save_model()` (or `trl-agents train`).
        repo_id: Model repo, `user/name` or `org/name`; created when it does not exist.
        token: A Hub token with write access; by default `HF_TOKEN` or the one `hf auth login` stored.
        private: Create the repos private (existing repos keep their visibility).
        dataset_repo_id: Repo of the trajectories; default `f"{repo_id}-trajectories"`.
        push_trajectories: Push `RUN_DIR/trajectories/*.parquet` as a dataset (when there are any).
        commit_message: Message of the model repo's commit.
        method: The run's registered method, for a run that recorded no `method_card` (see `render_model_card`).
        push_eval_tasks: Publish the tasks of every evaluation as a benchmark dataset (`push_eval_tasks`) and name it
            in `.eval_results/`; False writes the scores into the card's `model-index` only.
        revision: Branch of the model repo to commit to (default: main; `hub_revision` during training).
        include_folders: Sub-folders of RUN_DIR to push as well, under the same path (e.g. `("warm-start",)`: the
            warm-started model); by default none is pushed.
        dry_run: Upload nothing, make no network call (no token needed): return the plan instead.

    Only the files the model repo documents go in (`PUSHED_FILES`, `eval/*.json`, the `include_folders`): any other
    top-level file is skipped and named in a warning. A file to push that is a link out of RUN_DIR is refused
    (ValueError), and a link of any other name is skipped: nothing outside RUN_DIR is published.

    Returns:
        `{"model": URL, "dataset": URL or None, "commit": URL}`; with `dry_run`, the plan: `{"model": REPO,
        "dataset": REPO or None, "benchmarks": [REPO, ...], "skipped": [(name, why), ...]}`, each REPO a
        `{"repo_id": id, "files": [{"path": path in repo, "size": bytes or None (made by the push), "source": what
        it is made from}, ...]}`.

    Raises:
        ValueError: a bad repo id, a RUN_DIR without a saved model, or a file to push that links out of RUN_DIR
            (before any network call).
        PermissionError: no token for the Hub, or the Hub refused it.
        ConnectionError: the Hub endpoint cannot be reached (or `HF_HUB_OFFLINE` is set).
    """
    files, skipped = _files_to_push(run_dir, include_folders)
    check_repo_id(repo_id, "--repo")
    folder = os.path.join(run_dir, TRAJECTORIES_DIR)
    shards = shard_files(folder) if push_trajectories and os.path.isdir(folder) else []
    for shard in shards:
        _refuse_outside(shard, run_dir)
    if dataset_repo_id is not None or shards:
        check_repo_id(dataset_repo_id or f"{repo_id}-trajectories", "--dataset_repo")
    if skipped:
        logger.warning("trl-agents push: skipped %d file(s) of %s that a push does not publish: %s. (`hf upload "
                       "REPO FILE` uploads one on purpose.)", len(skipped), run_dir,
                       "; ".join(f"{name} ({why})" for name, why in skipped))
    run_info, eval_results = read_run_info(run_dir, missing_ok=True), read_eval_results(run_dir)
    if dry_run:
        return _push_plan(run_dir, repo_id, files, shards, dataset_repo_id, run_info, eval_results, method,
                          push_eval_tasks, skipped)
    token = _token_or_error(token)
    api = HfApi(token=token)
    with _clear_hub_errors(api.endpoint, run_dir, has_token=token is not None):
        # First, as it checks the token and the endpoint. `name` alone gets the user's namespace.
        model_url = api.create_repo(repo_id, private=private, exist_ok=True)
        dataset_url = None
        if shards:
            dataset_repo_id = dataset_repo_id or f"{model_url.repo_id}-trajectories"
            dataset_url = _push_trajectories(api, shards, dataset_repo_id, model_url.repo_id, run_info, private)
        dataset_repo_id = dataset_url.repo_id if dataset_url else None
        namespace = model_url.repo_id.split("/")[0]
        benchmarks = _push_benchmarks(api, run_dir, eval_results, namespace, private) if push_eval_tasks else {}
        card = render_model_card(run_dir, model_url.repo_id, dataset_repo_id=dataset_repo_id, run_info=run_info,
                                 eval_results=eval_results, method=method, benchmarks=benchmarks)
        card = merge_with_pushed_card(card, _pushed_card(api, model_url.repo_id, revision))
        operations = [CommitOperationAdd(path_in_repo, path) for path_in_repo, path in files]
        operations.append(CommitOperationAdd("README.md", str(card).encode()))
        for name, entries in eval_result_files(eval_results, str(model_url), benchmarks).items():
            operations.append(CommitOperationAdd(f".eval_results/{name}.yaml", entries.encode()))
        commit = api.create_commit(model_url.repo_id, operations, commit_message=commit_message, revision=revision)
    return {"model": str(model_url), "dataset": str(dataset_url) if dataset_url else None, "commit": commit.commit_url}


def merge_with_pushed_card(card: ModelCard, pushed: ModelCard | None) -> ModelCard:
    r"""`card` (just rendered) merged with the card already on the Hub, so that a push keeps what was edited there:
    metadata keys the render does not set (license, language, ...) are kept, tags are the union, and a body without
    `CARD_MARKER` (rewritten on the Hub) replaces the rendered one.

    >>> pushed = ModelCard("---\nlicense: mit\ntags: [mine]\n---\nMy own words.")
    >>> merged = merge_with_pushed_card(ModelCard(f"---\ntags: [trl]\n---\n{CARD_MARKER}\nRendered."), pushed)
    >>> merged.data.license, merged.data.tags, merged.text.strip()
    ('mit', ['trl', 'mine'], 'My own words.')
    """
    if pushed is None:
        return card
    ours, theirs = card.data.to_dict(), pushed.data.to_dict()
    merged = {**theirs, **ours}
    tags = [*(ours.get("tags") or []), *(theirs.get("tags") or [])]
    if tags:
        merged["tags"] = list(dict.fromkeys(tags))
    body = card.text if CARD_MARKER in pushed.text or not pushed.text.strip() else pushed.text
    return ModelCard(f"---\n{yaml.safe_dump(merged, sort_keys=False, allow_unicode=True)}---\n{body}")


def _pushed_card(api, repo_id: str, revision: str | None) -> ModelCard | None:
    """The README.md card of the model repo, None when it has none (a new repo)."""
    from huggingface_hub.errors import EntryNotFoundError, RemoteEntryNotFoundError

    try:
        path = api.hf_hub_download(repo_id, "README.md", revision=revision)
    except (EntryNotFoundError, RemoteEntryNotFoundError):
        return None
    except HfHubHTTPError as err:
        if err.response is not None and err.response.status_code == 404:
            return None
        raise
    return ModelCard.load(path)


def render_model_card(
    run_dir: str,
    repo_id: str | None = None,
    *,
    dataset_repo_id: str | None = None,
    run_info: dict[str, Any] | None = None,
    eval_results: list[dict[str, Any]] | None = None,
    method=None,
    benchmarks: dict[str, str] | None = None,
) -> ModelCard:
    """The model card of a run, from `model_cards/model_card.md`, as a `huggingface_hub.ModelCard`.

    Args:
        run_dir: The run directory (reads `run_info.json`, `agent_config.json`, `eval/*.json`, adapter config).
        repo_id: The model's Hub id, for the usage snippet (default: the run directory's path).
        dataset_repo_id: The trajectory dataset to link and list under `datasets:`.
        run_info: The run's `run_info.json` content, when the caller read it already (default: read from run_dir).
        eval_results: The run's `read_eval_results`, when the caller read them already (default: read from run_dir).
        method: The run's registered method (a `trl_agents.trainers.Method`), for a run whose `run_info.json` has no
            `method_card` (the CLI passes it); default: the `method_card` the run recorded.
        benchmarks: The benchmark dataset of each evaluation (its name -> dataset id, `push_eval_tasks`), named as the
            `model-index` dataset.

    Example:
        >>> import json, pathlib, tempfile
        >>> run_dir = tempfile.mkdtemp()
        >>> run_info = {"method": "gigpo", "env": "sokoban", "model": "Qwen/Qwen2.5-0.5B-Instruct", "config": {}}
        >>> _ = pathlib.Path(run_dir, "run_info.json").write_text(json.dumps(run_info))
        >>> card = render_model_card(run_dir, "me/sokoban-gigpo")
        >>> card.data.base_model, card.data.tags
        ('Qwen/Qwen2.5-0.5B-Instruct', ['trl', 'trl-agents', 'gigpo', 'sokoban', 'reinforcement-learning'])
    """
    from .checkpoints import load_agent_config

    run_info = read_run_info(run_dir, missing_ok=True) if run_info is None else run_info
    results = read_eval_results(run_dir) if eval_results is None else eval_results
    agent_config = load_agent_config(run_dir)
    adapter_config = _adapter_config(run_dir)
    config = run_info.get("config") or {}
    method = method.card_info() if method is not None else run_info.get("method_card") or {}
    env = run_info.get("env") or agent_config.get("env_name")
    base_model = (run_info.get("base_model") or hub_base_model(run_info.get("model"))
                  or hub_base_model(adapter_config.get("base_model_name_or_path")))
    model_name = (repo_id or os.path.basename(os.path.abspath(run_dir))).split("/")[-1]
    tags = ["trl", "trl-agents", *method.get("tags", [])]
    tags += [t for t in (run_info.get("method"), env, "reinforcement-learning") if t]
    tags += ["lora"] if adapter_config else []
    data = ModelCardData(
        model_name=model_name,
        base_model=base_model,
        library_name="peft" if adapter_config else "transformers",
        pipeline_tag="text-generation",
        tags=list(dict.fromkeys(tags)),
        datasets=[dataset_repo_id] if dataset_repo_id else None,
        eval_results=eval_results_for_card(results, benchmarks) or None,
    )
    paper = method.get("paper")
    paper_id = paper.removeprefix("arXiv ").strip() if paper and paper.startswith("arXiv") else None
    trl_paper = method.get("citation") or {}
    versions = ", ".join(f"{name} {run_info[key]}" for name, key in (("trl-agents", "trl_agents_version"),
                                                                         ("TRL", "trl_version")) if run_info.get(key))
    template = resources.files("trl_agents").joinpath("model_cards", "model_card.md")
    return ModelCard.from_template(
        data,
        template_path=str(template),
        model_name=model_name,
        repo_id=repo_id or run_dir,
        endpoint=constants.ENDPOINT,
        method=run_info.get("method"),
        paper=paper,
        paper_url=f"https://arxiv.org/abs/{paper_id}" if paper_id else None,
        citation=trl_paper.get("citation") if paper_id and trl_paper.get("id") == paper_id else None,
        env=env,
        base_model=base_model,
        is_adapter=bool(adapter_config),
        eval_rows=[_eval_row(result) for result in results],
        pass_at_k=any(key.startswith("pass_at_") for result in results for key in result.get("metrics", {})),
        learning_curve=LEARNING_CURVE_NAME if os.path.isfile(os.path.join(run_dir, LEARNING_CURVE_NAME)) else None,
        config_rows=_key_settings(config, method),
        config_file=RUN_INFO_NAME if run_info else None,
        config_hash=run_info.get("config_hash"),
        versions=versions,
        version=run_info.get("trl_agents_version"),
        benchmarks=sorted(set((benchmarks or {}).values())),
        marker=CARD_MARKER,
        agent_config=bool(agent_config),
        dataset_repo_id=dataset_repo_id,
        dataset_url=f"{constants.ENDPOINT}/datasets/{dataset_repo_id}" if dataset_repo_id else None,
    )


def eval_results_for_card(results: list[dict[str, Any]], benchmarks: dict[str, str] | None = None) -> list[EvalResult]:
    """`huggingface_hub.EvalResult`s (the card's `model-index`): one per metric of every evaluation.

    Our choice of fields: task `reinforcement-learning`; dataset: the evaluation's benchmark dataset when it was
    published (`benchmarks`, `push_eval_tasks`), else the environment's name, on the evaluation's split, with the
    evaluation's name as dataset config (so that each evaluation is one `model-index` result) and the settings that
    make two evaluations comparable (`num_tasks`, `max_turns`, decoding) as dataset arguments.
    """
    card_results = []
    for result in results:
        env, split = result.get("env") or "unknown", result.get("split") or "eval"
        dataset = (benchmarks or {}).get(result.get("name")) or env
        arguments = {key: result[key] for key in ("num_tasks", "max_turns", "greedy", "num_samples") if key in result}
        for metric, value in result.get("metrics", {}).items():
            card_results.append(EvalResult(
                task_type="reinforcement-learning",
                task_name=f"Multi-turn agent ({env})",
                dataset_type=dataset,
                dataset_name=f"{env} {split} tasks",
                dataset_config=result.get("name"),
                dataset_split=split,
                dataset_args=arguments or None,
                metric_type=metric,
                metric_name=_metric_name(metric),
                metric_value=value,
            ))
    return card_results


def eval_result_files(results: list[dict[str, Any]], model_url: str | None = None,
                      benchmarks: dict[str, str] | None = None) -> dict[str, str]:
    """The Hub's `.eval_results/{name}.yaml` files of the evaluations published as benchmarks: name -> YAML text.

    An entry names a benchmark dataset (`benchmarks`: evaluation name -> dataset id, `push_eval_tasks`); an
    evaluation without one gets no file (its scores are in the card's `model-index`), as an entry naming a dataset
    that does not exist shows nowhere. One entry per metric; our choice: task id = the metric (a task of the
    benchmark's `eval.yaml`), the decoding and budget in `notes`, the evaluation time as `date`, the model repo as
    source.
    """
    files = {}
    for result in results:
        env, split = result.get("env") or "unknown", result.get("split") or "eval"
        benchmark = (benchmarks or {}).get(result.get("name"))
        if benchmark is None:
            continue
        notes = _eval_row(result)
        notes = f"{notes['decoding']}, {notes['num_tasks']} tasks, max {notes['max_turns']} turns"
        entries = [
            EvalResultEntry(
                dataset_id=benchmark,
                task_id=metric,
                value=value,
                date=result.get("created"),
                source_url=model_url,
                source_name="trl-agents eval" if model_url else None,
                notes=notes,
            )
            for metric, value in result.get("metrics", {}).items()
        ]
        files[result.get("name") or f"{env}-{split}"] = yaml.safe_dump(eval_result_entries_to_yaml(entries),
                                                                        sort_keys=False)
    return files


def check_repo_id(repo_id: str, argument: str) -> None:
    """A ValueError naming `argument` when `repo_id` is not a valid Hub repo id."""
    try:
        validate_repo_id(repo_id)
    except HFValidationError as err:
        raise ValueError(
            f"{argument} {repo_id!r} is not a valid Hub repo id: use 'user/name' or 'org/name' (letters, digits, "
            f"'-', '_', '.'; no '--' or '..'; at most 96 characters). ({err})"
        ) from None


# ---- push steps ----------------------------------------------------------------------------------------------------


def eval_tasks_repo_id(namespace: str, result: dict[str, Any], env_kwargs: dict[str, Any] | None = None) -> str:
    """The benchmark dataset of an evaluation's tasks: `{namespace}/{env}-{split}-tasks`, plus a hash of the
    environment's arguments when it has any (other arguments, other tasks).

    >>> eval_tasks_repo_id("me", {"env": "sokoban", "split": "eval"})
    'me/sokoban-eval-tasks'
    >>> eval_tasks_repo_id("me", {"env": "sokoban", "split": "eval"}, {"size": 5})
    'me/sokoban-eval-tasks-39a7ac56'
    """
    import hashlib

    name = f"{result.get('env') or 'unknown'}-{result.get('split') or 'eval'}-tasks"
    if env_kwargs:
        canonical = json.dumps(env_kwargs, sort_keys=True, separators=(",", ":"), default=str)
        name += "-" + hashlib.sha256(canonical.encode()).hexdigest()[:8]
    return f"{namespace}/{name}"


def push_eval_tasks(api, repo_id: str, result: dict[str, Any], env_kwargs: dict[str, Any] | None = None,
                    private: bool = False) -> RepoUrl:
    """Publish the tasks an evaluation played as the dataset `repo_id` (split `test`, one row per task, as
    `AgentEnv.task_split` builds them) with an `eval.yaml` that declares it a benchmark: one task per metric the
    evaluations report. The tasks of a split are a deterministic prefix, so the first `num_tasks` rows are exactly
    what an evaluation of `num_tasks` tasks played. The Hub shows a leaderboard on it once it allow-lists the
    dataset."""
    from datasets import Dataset

    from .envs import get_env_class

    env, split = result.get("env"), result.get("split") or "eval"
    tasks = get_env_class(env).task_split(split, result.get("num_tasks"), **(env_kwargs or {}))
    rows = Dataset.from_list([{"task": json.dumps(task, sort_keys=True, default=str)} for task in tasks])
    url = api.create_repo(repo_id, repo_type="dataset", private=private, exist_ok=True)
    rows.push_to_hub(url.repo_id, split="test", private=private, token=api.token, commit_message="Upload tasks")
    metrics = ["success_rate", "episode_return", "episode_length", "valid_action_rate"]
    metrics += sorted({key for key in result.get("metrics", {}) if key.startswith("pass_at_")})
    eval_yaml = {
        "name": f"trl-agents {env} ({split} split)",
        "description": f"Multi-turn episodes of the trl-agents environment {env!r} on the tasks of its {split!r} "
                       f"split (environment arguments: {json.dumps(env_kwargs or {}, sort_keys=True)}): a policy plays "
                       "each task (the `task` column, JSON) until the episode ends; `trl-agents eval` runs it.",
        "evaluation_framework": "trl-agents",
        "tasks": [{"id": metric, "config": "default", "split": "test"} for metric in metrics],
    }
    card = DatasetCard.load(url.repo_id, token=api.token)
    card.data.pretty_name = f"{env} {split} tasks (trl-agents)"
    card.data.tags = sorted({*(card.data.get("tags") or []), "trl-agents", "benchmark", "reinforcement-learning", env})
    card.data.task_categories = ["reinforcement-learning"]
    card.text = (f"\n# {env} {split} tasks\n\nThe tasks of the trl-agents environment `{env}` (split `{split}`), one "
                 "row per task, for evaluating agents: `trl-agents eval --model_name_or_path MODEL --env_name "
                 f"{env} --split {split}`. `eval.yaml` declares the benchmark's tasks (one per metric).\n")
    api.create_commit(url.repo_id, [
        CommitOperationAdd("eval.yaml", yaml.safe_dump(eval_yaml, sort_keys=False).encode()),
        CommitOperationAdd("README.md", str(card).encode()),
    ], repo_type="dataset", commit_message="Benchmark description (eval.yaml)")
    return url


def _push_benchmarks(api, run_dir: str, results: list[dict[str, Any]], namespace: str,
                     private: bool) -> dict[str, str]:
    """`push_eval_tasks` for every evaluation of the run whose environment is registered: name -> dataset id."""
    from .checkpoints import load_agent_config

    env_kwargs = load_agent_config(run_dir).get("env_kwargs") or {}
    return {name: push_eval_tasks(api, repo_id, result, env_kwargs, private).repo_id
            for name, (repo_id, result) in _benchmark_repos(run_dir, results, namespace).items()}


def _benchmark_repos(run_dir: str, results: list[dict[str, Any]],
                     namespace: str) -> dict[str, tuple[str, dict[str, Any]]]:
    """The evaluations of the run whose environment is registered: name -> (benchmark dataset id, eval result)."""
    from .checkpoints import load_agent_config
    from .envs import list_envs

    env_kwargs = load_agent_config(run_dir).get("env_kwargs") or {}
    return {result["name"]: (eval_tasks_repo_id(namespace, result, env_kwargs), result) for result in results
            if result.get("env") in list_envs() and result.get("name")}


def push_results(
    path: str,
    repo_id: str,
    *,
    token: str | None = None,
    private: bool = False,
    commit_message: str = "Upload trl-agents results",
    dry_run: bool = False,
) -> dict[str, Any]:
    """Push a results table (a parquet file, e.g. `benchmarks/results/evidence_runs.parquet`, one row per run) to the
    dataset repo `repo_id` as its `train` split (`datasets.Dataset.push_to_hub`).

    Returns `{"model": None, "dataset": URL, "commit": None}`. Raises ValueError for a path that is not a parquet
    file or a bad repo id (before any network call), and the errors of `push_run` for the token and the endpoint.
    With `dry_run`, uploads nothing and returns the plan, as `push_run` does: `{"model": None, "dataset": REPO,
    "benchmarks": [], "skipped": []}`.
    """
    from datasets import Dataset

    if not (os.path.isfile(path) and path.endswith(".parquet")):
        raise ValueError(f"{path!r} is not a parquet file: give a results table such as "
                         "benchmarks/results/evidence_runs.parquet (or a run directory to push a run).")
    check_repo_id(repo_id, "--repo")
    if dry_run:
        files = [{"path": "data/train-*.parquet", "size": None, "source": f"{path} ({os.path.getsize(path)} bytes)"},
                 {"path": "README.md", "size": None, "source": "the dataset card"}]
        return {"model": None, "dataset": {"repo_id": repo_id, "files": files}, "benchmarks": [], "skipped": []}
    token = _token_or_error(token)
    table = Dataset.from_parquet(path)
    api = HfApi(token=token)
    with _clear_hub_errors(api.endpoint, path, has_token=token is not None):
        url = api.create_repo(repo_id, repo_type="dataset", private=private, exist_ok=True)
        table.push_to_hub(url.repo_id, private=private, token=api.token, commit_message=commit_message)
    return {"model": None, "dataset": str(url), "commit": None}


def _files_to_push(run_dir: str, include_folders: Sequence[str] = ()) -> tuple[list[tuple[str, str]],
                                                                               list[tuple[str, str]]]:
    """((path in repo, local path) of the run's files to push, (name, why) of the top-level files skipped).

    Pushed: the top-level files `PUSHED_FILES` names (and the custom-code modules of `auto_map`), `eval/*.json`, and
    every file below the `include_folders`. Skipped without a word: our README (rendered), hidden files (the temporary
    ones of unfinished writes, `fileio.atomic_write`) and sub-folders; skipped with a warning: any other file, a link
    of another name, a `training_args.bin` that holds a token (saved before `AgentGRPOTrainer._save` masked it).
    ValueError when the run holds no saved model or adapter, a folder named is not one of its sub-folders, or a file
    to push is a link out of RUN_DIR."""
    from fnmatch import fnmatch

    if not os.path.isdir(run_dir):
        raise ValueError(f"RUN_DIR {run_dir!r} is not a directory: give the `output_dir` of a training run.")
    names = sorted(name for name in os.listdir(run_dir) if not name.startswith(".") and name != "README.md"
                   and not os.path.isdir(os.path.join(run_dir, name)))
    code = _custom_code_files(run_dir)
    kept, skipped = [], []
    for name in names:
        path = os.path.join(run_dir, name)
        if not any(fnmatch(name, pattern) for pattern in PUSHED_FILES) and name not in code:
            skipped.append((name, "a link out of RUN_DIR" if _outside(path, run_dir) else "not a file push publishes"))
        elif not os.path.isfile(path):
            skipped.append((name, "a broken link" if os.path.islink(path) else "not a regular file"))
        else:
            _refuse_outside(path, run_dir)
            found = _pickled_tokens(path) if name == "training_args.bin" else []
            if found is None or found:
                skipped.append((name, f"it holds {', '.join(found)} in clear, saved by an older trl-agents: "
                                      "delete it" if found else "not a torch.save of the training arguments"))
            else:
                kept.append(name)
    adapter = "adapter_config.json" in kept and set(kept) & set(ADAPTER_WEIGHTS)
    if not adapter and not ("config.json" in kept and set(kept) & set(MODEL_WEIGHTS)):
        raise ValueError(
            f"RUN_DIR {run_dir!r} holds no saved model: expected config.json + model weights, or adapter_config.json "
            "+ adapter weights (LoRA). Save one with `trainer.save_model()` (`trl-agents train` does)."
        )
    files = [(name, os.path.join(run_dir, name)) for name in kept]
    files += [(f"{EVAL_DIR}/{os.path.basename(path)}", path) for path in eval_result_paths(run_dir)]
    for folder in include_folders:
        top = os.path.normpath(os.path.join(run_dir, folder))
        if not os.path.isdir(top) or os.path.dirname(os.path.relpath(top, run_dir)) or folder in (".", ".."):
            found = sorted(n for n in os.listdir(run_dir) if os.path.isdir(os.path.join(run_dir, n)))
            raise ValueError(f"--include {folder!r} is not a folder of RUN_DIR {run_dir!r}: choose among "
                             f"{', '.join(found) or 'none'}")
        for root, _, names in os.walk(top):
            files += [(os.path.relpath(os.path.join(root, name), run_dir).replace(os.sep, "/"),
                       os.path.join(root, name)) for name in sorted(names) if not name.startswith(".")]
    for _, path in files:
        _refuse_outside(path, run_dir)
    return files, skipped


def _outside(path: str, run_dir: str) -> str | None:
    """The real path of `path` when it leads out of `run_dir` (a link, or a link on the way), else None."""
    real, root = os.path.realpath(path), os.path.realpath(run_dir)
    return None if os.path.commonpath([real, root]) == root else real


def _refuse_outside(path: str, run_dir: str) -> None:
    """ValueError when `path`, a file to push, is a link out of `run_dir`: a push publishes nothing from outside."""
    real = _outside(path, run_dir)
    if real is not None:
        raise ValueError(f"{path} is a link to {real}, outside RUN_DIR {run_dir!r}: a push uploads only files inside "
                         "the run; replace the link by a copy of the file, or remove it.")


def _custom_code_files(run_dir: str) -> set[str]:
    """The modules of a custom-code model or tokenizer (`trust_remote_code`) that its configs name in `auto_map`
    ("modeling_x.XModel" -> "modeling_x.py"); code in another repo ("org/repo--modeling_x.XModel") is not ours."""
    modules = set()
    for name in ("config.json", "tokenizer_config.json"):
        path = os.path.join(run_dir, name)
        if not os.path.isfile(path) or _outside(path, run_dir):
            continue
        try:
            with open(path) as handle:
                auto_map = json.load(handle).get("auto_map") or {}
        except (OSError, ValueError, AttributeError):
            continue
        for references in auto_map.values() if isinstance(auto_map, dict) else ():
            for reference in references if isinstance(references, list) else [references]:
                if isinstance(reference, str) and "--" not in reference and "." in reference:
                    modules.add(reference.rsplit(".", 1)[0] + ".py")
    return modules


def _pickled_tokens(path: str) -> list[str] | None:
    """The `*_token` fields that hold a value in `training_args.bin` (a `torch.save` of the training arguments), read
    from the pickle's opcodes without unpickling it; None when the file is not such a zip archive with one pickle."""
    import pickletools
    import zipfile

    try:
        with zipfile.ZipFile(path) as archive:
            [pickle] = [name for name in archive.namelist() if name.rsplit("/", 1)[-1] == "data.pkl"]
            ops = [(op.name, arg) for op, arg, _ in pickletools.genops(archive.read(pickle))]
    except (OSError, ValueError, zipfile.BadZipFile):
        return None
    memo = ("BINPUT", "LONG_BINPUT", "PUT", "MEMOIZE")
    found = []
    for index, (op, arg) in enumerate(ops):
        if "UNICODE" in op and isinstance(arg, str) and arg.endswith("_token"):  # a field name, then its value
            value = next((name for name, _ in ops[index + 1:] if name not in memo), None)
            if value != "NONE":
                found.append(arg)
    return found


def _push_plan(run_dir: str, repo_id: str, files: list[tuple[str, str]], shards: list[str],
               dataset_repo_id: str | None, run_info: dict[str, Any], eval_results: list[dict[str, Any]], method,
               push_eval_tasks: bool, skipped: list[tuple[str, str]]) -> dict[str, Any]:
    """What `push_run` would upload to each repo (`dry_run`), found without any network call: the model repo's files
    (the card as rendered now; the push merges it with the one on the Hub), the trajectory dataset and the benchmark
    datasets, made by the push (`size` None). A repo id without namespace stays so (the token's user is unknown)."""
    namespace = repo_id.split("/")[0] if "/" in repo_id else "<your user>"
    benchmark_repos = _benchmark_repos(run_dir, eval_results, namespace) if push_eval_tasks else {}
    benchmarks = {name: repo for name, (repo, _) in benchmark_repos.items()}
    dataset_repo_id = (dataset_repo_id or f"{repo_id}-trajectories") if shards else None
    card = render_model_card(run_dir, repo_id, dataset_repo_id=dataset_repo_id, run_info=run_info,
                             eval_results=eval_results, method=method, benchmarks=benchmarks)
    model = [{"path": path_in_repo, "size": os.path.getsize(path), "source": path} for path_in_repo, path in files]
    model.append({"path": "README.md", "size": len(str(card).encode()), "source": "the model card, rendered"})
    for name, entries in eval_result_files(eval_results, f"{constants.ENDPOINT}/{repo_id}", benchmarks).items():
        model.append({"path": f".eval_results/{name}.yaml", "size": len(entries.encode()),
                      "source": f"the scores of evaluation {name}"})
    dataset = None
    if shards:
        size = sum(os.path.getsize(shard) for shard in shards)
        dataset = {"repo_id": dataset_repo_id, "files": [
            {"path": "data/train-*.parquet", "size": None,
             "source": f"{len(shards)} trajectory shard(s) of {os.path.join(run_dir, TRAJECTORIES_DIR)} ({size} bytes)"},
            {"path": "sft/train-*.parquet", "size": None, "source": "the valid steps of successful episodes, if any"},
            {"path": "README.md", "size": None, "source": "the dataset card"},
        ]}
    return {
        "model": {"repo_id": repo_id, "files": model},
        "dataset": dataset,
        "benchmarks": [{"repo_id": repo, "files": [
            {"path": "data/test-*.parquet", "size": None,
             "source": f"the {result.get('num_tasks')} tasks of {result.get('env')}'s {result.get('split')!r} split"},
            {"path": "eval.yaml", "size": None, "source": "the benchmark's description"},
            {"path": "README.md", "size": None, "source": "the dataset card"},
        ]} for repo, result in benchmark_repos.values()],
        "skipped": skipped,
    }


def _push_trajectories(api, shards: list[str], dataset_repo_id: str, model_repo_id: str, run_info: dict[str, Any],
                       private: bool) -> RepoUrl:
    """Push the shards as one `train` split, then replace the card `datasets` wrote with ours (keeping its metadata).
    Returns the dataset's `RepoUrl`."""
    from datasets import Dataset

    # Every shard has the documented schema (records.TRAJECTORY_SCHEMA). Loaded through the datasets cache
    # (memory-mapped), so long runs need not fit in memory.
    steps = Dataset.from_parquet(shards, features=TRAJECTORY_FEATURES)
    url = api.create_repo(dataset_repo_id, repo_type="dataset", private=private, exist_ok=True)
    steps.push_to_hub(url.repo_id, private=private, token=api.token, commit_message="Upload trajectories")
    # The `sft` subset: the valid steps of successful episodes as TRL's conversational prompt-completion rows, so that
    # `trl sft --dataset_name REPO --dataset_config sft` trains on them as they are.
    sft = sft_rows(steps)
    if len(sft):
        sft.push_to_hub(url.repo_id, config_name="sft", private=private, token=api.token,
                        commit_message="Upload the SFT subset")
    pushed = DatasetCard.load(url.repo_id, token=api.token)
    data = pushed.data
    env, method = run_info.get("env"), run_info.get("method")
    data.pretty_name = f"{method or 'trl-agents'} trajectories on {env or 'agent environments'}"
    data.tags = sorted({*(data.get("tags") or []), "trl", "trl-agents", "trajectories", "reinforcement-learning",
                        *(name for name in (env, method) if name)})
    data.task_categories = sorted({*(data.get("task_categories") or []), "reinforcement-learning", "text-generation"})
    data.size_categories = [_size_category(len(steps))]
    data.license = data.get("license") or _base_license(api, run_info)
    card = DatasetCard.from_template(
        data,
        template_path=str(resources.files("trl_agents").joinpath("model_cards", "trajectories_card.md")),
        repo_id=url.repo_id,
        model_repo_id=model_repo_id,
        model_url=f"{constants.ENDPOINT}/{model_repo_id}",
        env=run_info.get("env"),
        method=run_info.get("method"),
        num_rows=len(steps),
        num_sft_rows=len(sft),
        num_shards=len(shards),
        columns=", ".join(f"`{name}`" for name in steps.column_names),
    )
    api.upload_file(path_or_fileobj=str(card).encode(), path_in_repo="README.md", repo_id=url.repo_id,
                    repo_type="dataset", commit_message="Trajectory dataset card")
    return url


TRAINING_STATE = ("optimizer.pt", "scheduler.pt", "scaler.pt", "trainer_state.json", "rng_state*.pth")
"""Files of a checkpoint that only resuming needs (`checkpoint_files` leaves them out of the repo's root)."""


def checkpoint_files(checkpoint_dir: str) -> list[str]:
    """The files of a checkpoint folder that a model repo's root gets during training: its top-level files (weights
    or adapter, config, tokenizer, `agent_config.json`, `run_info.json`), without the training state (`TRAINING_STATE`)
    or sub-folders, nor the README (PEFT writes its own card into a checkpoint; the run's card is pushed at the end).

    >>> import pathlib, tempfile
    >>> folder = tempfile.mkdtemp()
    >>> for name in ("model.safetensors", "config.json", "optimizer.pt", "rng_state_0.pth", "README.md"):
    ...     _ = pathlib.Path(folder, name).write_text("")
    >>> checkpoint_files(folder)
    ['config.json', 'model.safetensors']
    """
    from fnmatch import fnmatch

    names = [name for name in os.listdir(checkpoint_dir) if os.path.isfile(os.path.join(checkpoint_dir, name))]
    return sorted(name for name in names if not name.startswith((".", "_")) and name != "README.md"
                  and not any(fnmatch(name, pattern) for pattern in TRAINING_STATE))


def push_checkpoint(checkpoint_dir: str, repo_id: str, commit_message: str, *, token: str | None = None,
                    revision: str | None = None, checkpoint_path: str | None = None) -> list:
    """Upload a checkpoint during training, in the background: its `checkpoint_files` to the repo's root and, with
    `checkpoint_path` (e.g. "last-checkpoint"), the whole checkpoint under that folder. Returns the upload futures."""
    api = HfApi(token=token)
    jobs = [api.upload_folder(repo_id=repo_id, folder_path=checkpoint_dir,
                              allow_patterns=checkpoint_files(checkpoint_dir), commit_message=commit_message,
                              revision=revision, run_as_future=True)]
    if checkpoint_path:
        jobs.append(api.upload_folder(repo_id=repo_id, folder_path=checkpoint_dir, path_in_repo=checkpoint_path,
                                      commit_message=f"{commit_message}, checkpoint", revision=revision,
                                      run_as_future=True))
    return jobs


def sft_rows(steps):
    """The valid steps of successful episodes, as TRL's conversational prompt-completion rows (`prompt`,
    `completion`, and `tools` when the environment offered tools: SFTTrainer passes them to the chat template), from a
    trajectory dataset (`TRAJECTORY_FEATURES`): what imitation learns from. Steps recorded without their chat (empty
    `prompt`) are left out."""
    kept = steps.filter(lambda row: bool(row["success"]) and bool(row["valid"]) and row["step"] >= 0
                        and len(row["prompt"]) > 0)
    with_tools = "tools" in kept.column_names and any(value is not None for value in kept["tools"])
    return kept.select_columns(["prompt", "completion", *(["tools"] if with_tools else [])])


def _size_category(rows: int) -> str:
    """The Hub's `size_categories` value for a dataset of `rows` rows.

    >>> _size_category(502), _size_category(12_000)
    ('n<1K', '10K<n<100K')
    """
    for bound, name in ((1_000, "n<1K"), (10_000, "1K<n<10K"), (100_000, "10K<n<100K"), (1_000_000, "100K<n<1M")):
        if rows < bound:
            return name
    return "1M<n<10M" if rows < 10_000_000 else "n>10M"


def _base_license(api, run_info: dict[str, Any]) -> str | None:
    """The license of the run's base model on the Hub (the trajectories are its outputs), None when unknown."""
    base = run_info.get("base_model")
    if not base:
        return None
    try:
        return (api.model_info(base).card_data or {}).get("license")
    except (HfHubHTTPError, OSError, ValueError):
        return None


def _token_or_error(token: str | None) -> str | None:
    """The token to push with. Fails before any network call when the endpoint is the Hub itself and there is no
    token, or when offline mode is on; a self-hosted endpoint may accept anonymous pushes, and answers 401 if not."""
    token = token or get_token()
    if token is None and constants.ENDPOINT.rstrip("/") == "https://huggingface.co":
        raise PermissionError(
            "No Hugging Face token: run `hf auth login`, or pass --token / set HF_TOKEN (a token with write access: "
            "https://huggingface.co/settings/tokens)."
        )
    if constants.is_offline_mode():
        raise ConnectionError(
            "HF_HUB_OFFLINE is set, so nothing can be pushed: unset HF_HUB_OFFLINE (and TRANSFORMERS_OFFLINE) to push."
        )
    return token


@contextmanager
def _clear_hub_errors(endpoint: str, run_dir: str, has_token: bool) -> Iterator[None]:
    """Turn the Hub client's network and auth errors into one clear message naming the endpoint and the fix."""

    untouched = f"Nothing in {run_dir} was changed."
    try:
        yield
    except (httpx.TransportError, OfflineModeIsEnabled) as err:
        raise ConnectionError(
            f"Cannot reach the Hub at {endpoint} ({type(err).__name__}: {err}). Check the network connection, or "
            f"HF_ENDPOINT if you use a mirror. {untouched}"
        ) from err
    except HfHubHTTPError as err:
        status = err.response.status_code if err.response is not None else None
        if status == 401:
            problem = "refused the token" if has_token else "needs a token"
            raise PermissionError(
                f"The Hub at {endpoint} {problem} (401 Unauthorized): run `hf auth login`, or pass --token / set "
                f"HF_TOKEN to a token with write access. {untouched}"
            ) from err
        if status == 403:
            raise PermissionError(
                f"The Hub at {endpoint} refused the push (403 Forbidden): the token has no write access to this "
                f"namespace; use a write token, or a repo id under your user. {untouched}"
            ) from err
        raise


# ---- reading the run -----------------------------------------------------------------------------------------------


def _adapter_config(run_dir: str) -> dict[str, Any]:
    """PEFT's `adapter_config.json` of a LoRA run; {} for a full model."""
    path = os.path.join(run_dir, "adapter_config.json")
    if not os.path.isfile(path):
        return {}
    with open(path) as handle:
        return json.load(handle)


def _key_settings(config: dict[str, Any], method_card: dict[str, Any]) -> list[tuple[str, str]]:
    """(name, value) of the settings worth a glance: the common agent/GRPO ones, then the method's own fields."""
    names = [*KEY_SETTINGS, *method_card.get("settings", ())]  # (the method's own fields are not common ones)
    return [(name, _cell(config[name])) for name in names if config.get(name) not in (None, {}, "")]


def _cell(value: Any) -> str:
    """A value as a Markdown table cell: JSON for containers, one line, pipes escaped, long values shortened."""
    text = json.dumps(value) if isinstance(value, dict | list) else str(value)
    text = " ".join(text.split()).replace("|", "\\|")
    return text if len(text) <= 80 else text[:77] + "..."


def _eval_row(result: dict[str, Any]) -> dict[str, Any]:
    metrics = result.get("metrics", {})
    samples = result.get("num_samples", 1)
    decoding = "greedy" if result.get("greedy", True) else f"sampled (T={result.get('temperature', 1.0)})"

    def number(key: str) -> str:
        return f"{metrics[key]:.3f}" if isinstance(metrics.get(key), int | float) else "-"

    return {
        "name": result.get("name", "-"), "split": result.get("split", "-"), "num_tasks": result.get("num_tasks", "-"),
        "num_episodes": result.get("num_episodes", "-"), "max_turns": result.get("max_turns", "-"),
        "decoding": decoding + (f", {samples} samples" if samples > 1 else ""),
        **{key: number(key) for key in EVAL_METRICS}, "pass_at_k": number(f"pass_at_{samples}"),
    }


def _metric_name(metric: str) -> str:
    if metric.startswith("pass_at_"):
        return f"pass@{metric.removeprefix('pass_at_')}"
    return METRIC_NAMES.get(metric, metric)


__all__ = [
    "check_repo_id",
    "eval_result_files",
    "eval_results_for_card",
    "push_run",
    "render_model_card",
]
