"""`trl-agents` command line: train | eval | push | envs | methods | search | configs | env.

    trl-agents train                                   # the embedded quickstart (configs/quickstart.yaml)
    trl-agents train --config configs/gigpo_sokoban.yaml --learning_rate 1e-6 --max_turns 20
    trl-agents train --config gigpo_sokoban_tiny       # a packaged config by name (`trl-agents configs` lists them)
    trl-agents eval --model_name_or_path outputs/quickstart --num_eval_tasks 1000   # prompts as trained
    trl-agents eval --model_name_or_path outputs/quickstart --vllm_server_url http://localhost:8000   # vllm serve
    trl-agents eval --model_name_or_path outputs/quickstart --modes greedy sampled --num_samples 8 --max_turns 20
    trl-agents push outputs/quickstart --repo my-user/quickstart-agent   # model, card, eval results, trajectories
    trl-agents envs                                    # registered environments and their capabilities
    trl-agents methods                                 # registered methods and their papers
    trl-agents search --config configs/llmzero_frozenlake_tiny.yaml --stages 3 --children 2   # LLMZero's search
    trl-agents configs                                 # the packaged training and accelerate configs
    trl-agents configs --path ddp                      # the absolute path of one (for accelerate's --config_file)
    trl-agents env                                     # the versions a bug report needs

`train` parses like TRL's scripts (`TrlParser`): `--config FILE` (YAML, flat keys; an `env:` mapping there sets
environment variables; or the name of a packaged config, when no such file exists) gives the defaults, `--key value`
overrides them. Keys belong to `RunArguments` (trl_agents.run), the method's config (e.g. `GiGPOConfig`, which
includes every `GRPOConfig` field) or TRL's `ModelConfig` (model_name_or_path, use_peft, lora_r, ...). `search` parses
the same keys plus the controller's (`trl_agents.strategy.SearchArguments`) and trains stages of the config's method
(docs/methods/llmzero.md). `trl-agents --help` lists the commands; docs/cli.md describes them.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from .names import did_you_mean

QUICKSTART = "quickstart.yaml"


def packaged_config(name: str) -> str:
    """Path of a YAML config shipped with the package (the repository's `configs/` folder)."""
    path = resources.files("trl_agents").joinpath("configs", name)
    if not path.is_file():
        raise FileNotFoundError(f"no packaged config named {name!r}")
    return str(path)


CONFIG_KINDS = {"training": ("configs",), "accelerate": ("configs", "accelerate")}
"""Where each kind of packaged config lies in the package: training configs (`trl-agents train --config NAME`) and
accelerate launch configs (`accelerate launch --config_file $(trl-agents configs --path NAME)`)."""


def packaged_configs(kind: str = "training") -> dict[str, str]:
    """Name (the file name without `.yaml`) -> absolute path of each packaged config of `kind`, sorted by name."""
    folder = resources.files("trl_agents").joinpath(*CONFIG_KINDS[kind])
    found = {entry.name[: -len(".yaml")]: os.path.abspath(str(entry)) for entry in folder.iterdir()
             if entry.name.endswith(".yaml") and entry.is_file()}
    return dict(sorted(found.items()))


def _config_name(value: str) -> str | None:
    """`value` as a packaged config's name (`gigpo_sokoban`, `gigpo_sokoban.yaml`), or None when it is a path."""
    if "/" in value or os.sep in value:
        return None
    for suffix in (".yaml", ".yml"):
        value = value.removesuffix(suffix)
    return value


def resolve_config(value: str, kinds: tuple[str, ...] = ("training",)) -> str:
    """The config file `value` names: a path when one exists (it always wins), else the packaged config of one of
    `kinds` with that name (with or without `.yaml`); else a one-line ValueError with the closest packaged name."""
    if os.path.isfile(value):
        return value
    name = _config_name(value)
    known = {n: path for kind in kinds for n, path in packaged_configs(kind).items()}
    if name is not None and name in known:
        return known[name]
    if name is None:
        raise ValueError(f"config file not found: {value}")
    raise ValueError(f"config file not found: {value} (no such file, nor a packaged config of that name)."
                     f"{did_you_mean(name, known)} `trl-agents configs` lists the packaged configs")


def _config_table() -> dict[str, tuple[str, str, str]]:
    """Name -> (method, env, model) of each packaged training config, read from its YAML."""
    table = {}
    for name, path in packaged_configs("training").items():
        config = _read_config(path)
        model = "tiny (built in)" if config.get("tiny_model") else str(config.get("model_name_or_path") or "-")
        table[name] = (str(config.get("method") or "grpo"), str(config.get("env_name") or "-"), model)
    return table


def _summary(path: str) -> str:
    """The first line of a config's header comment (each accelerate config's summary)."""
    with open(path) as handle:
        first = handle.readline().strip()
    return first.lstrip("#").strip() if first.startswith("#") else ""


def list_configs(argv: list[str] | None = None) -> None:
    """`trl-agents configs`: the packaged training configs (method, env, model) and accelerate launch configs;
    `trl-agents configs NAME` (or `--path NAME`): the absolute path of one, e.g. for accelerate's `--config_file`."""
    parser = argparse.ArgumentParser(prog="trl-agents configs", description=list_configs.__doc__)
    parser.add_argument("name", nargs="?", help="print the absolute path of this packaged config")
    parser.add_argument("--path", dest="path_of", metavar="NAME", help="the same: print this config's path")
    args = parser.parse_args(argv or [])
    name = args.path_of or args.name
    if name is not None:
        if _config_name(name) is None:
            raise ValueError(f"{name}: give a packaged config's name, not a path (`trl-agents configs` lists them)")
        print(resolve_config(_config_name(name), kinds=("training", "accelerate")))
        return
    table = _config_table()
    width = max(map(len, table)) + 2
    print("training configs (trl-agents train --config NAME, then --key value to override any setting):")
    print(f"  {'name':<{width}}{'method':<11}{'env':<17}model")
    for config, (method, env, model) in table.items():
        print(f"  {config:<{width}}{method:<11}{env:<17}{model}")
    accelerate = packaged_configs("accelerate")
    print("\naccelerate configs (accelerate launch --config_file $(trl-agents configs --path NAME) ...):")
    width = max(map(len, accelerate)) + 2
    for config, path in accelerate.items():
        print(f"  {config:<{width}}{_summary(path)}")


def _read_config(path: str) -> dict[str, Any]:
    """The YAML config file's mapping, or a one-line ValueError naming the file, line and column."""
    import yaml

    with open(path) as handle:
        try:
            loaded = yaml.safe_load(handle) or {}
        except yaml.YAMLError as err:
            mark = getattr(err, "problem_mark", None)
            where = f" line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
            problem = getattr(err, "problem", None) or str(err).splitlines()[0]
            raise ValueError(f"the config file {path} is not valid YAML:{where}: {problem}") from None
    if not isinstance(loaded, dict):
        raise ValueError(f"the config file {path} must be a mapping of keys to values, got a {type(loaded).__name__}")
    return loaded


def _option(argv: list[str], name: str) -> str | None:
    """The value of `--name VALUE` or `--name=VALUE` on the command line `argv` (the last one given), or None."""
    value = None
    for position, arg in enumerate(argv):
        if arg == f"--{name}":
            value = argv[position + 1] if position + 1 < len(argv) else ""
        elif arg.startswith(f"--{name}="):
            value = arg.split("=", 1)[1]
    return value


def _split_config(argv: list[str]) -> list[str]:
    """`--config=FILE` as `--config FILE`, the only spelling TRL's parser reads."""
    split = []
    for arg in argv:
        split += ["--config", arg.split("=", 1)[1]] if arg.startswith("--config=") else [arg]
    return split


def _method_of(argv: list[str], config: dict[str, Any]) -> str:
    """The `method` chosen on the command line or in the YAML file's `config` (it decides which config class
    parses)."""
    return _option(argv, "method") or config.get("method") or "grpo"


NOT_QUICKSTART = ("model_name_or_path", "env_name", "method", "dataset_name")
"""Settings that, given to `trl-agents train` without `--config`, say the run is not the quickstart (a tiny built-in
model on FrozenLake, whose prompts and env kwargs would silently apply): the command asks for a config instead."""


def _check_quickstart_overrides(argv: list[str]) -> None:
    """A one-line ValueError when `trl-agents train` has no `--config` but sets what the quickstart is made of (its
    model, environment or method), naming a packaged config that matches the environment and method when one does."""
    given = {name: _option(argv, name) for name in NOT_QUICKSTART if _option(argv, name) is not None}
    if not given or "-h" in argv or "--help" in argv:  # `train --method gigpo --help`: that method's options
        return
    flags = " and ".join(f"--{name}" for name in given)
    env, method, model = given.get("env_name"), given.get("method"), given.get("model_name_or_path")
    table = _config_table()
    exact = [name for name, (m, e, _) in table.items() if env in (None, e) and method in (None, m)]
    candidates = exact or [name for name, (m, e, _) in table.items() if e == env or m == method]

    def rank(name: str) -> tuple[bool, bool, bool, str]:  # the env, the method asked for (else grpo), a real model
        config_method, config_env, config_model = table[name]
        return (config_env != env, config_method != (method or "grpo"), config_model.startswith("tiny") == bool(model),
                name)

    example = ""
    if candidates and (env or method):
        closest = min(candidates, key=rank)
        example = f" (e.g. --config {closest})" if exact else (
            f" (none is packaged for {' on '.join(filter(None, (method, env)))}; the closest is {closest}: "
            f"{table[closest][0]} on {table[closest][1]})")
    raise ValueError(
        f"{flags} without --config: train would run the quickstart (a tiny built-in model on FrozenLake) with its "
        f"prompts and env settings. Add --config NAME{example}, a packaged config your flags then override "
        "(`trl-agents configs` lists them), or --config FILE, your own YAML"
    )


def train(argv: list[str]) -> dict[str, Any]:
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from .run import run_training

    argv = _split_config(argv)
    if "--config" not in argv:
        _check_quickstart_overrides(argv)
        argv = ["--config", packaged_config(QUICKSTART), *argv]
    method, (run_args, config, model_args) = _parse(argv, "train")
    outer_loop = getattr(method.trainer_class, "outer_loop", None)  # a controller (llmzero) names its outer loop
    if outer_loop is not None:
        return OUTER_LOOPS[outer_loop]()(run_args, config, model_args)
    return run_training(run_args, config, model_args)


def _strategy_search():
    from .search import run_search

    return run_search


OUTER_LOOPS = {"search": _strategy_search}
"""The outer loops a controller method may name in its trainer's `outer_loop` (resolved here, so that the trainer
needs nothing from the loop, which trains trainers): "search", LLMZero's strategy search (`search.run_search`)."""


def _parse(argv: list[str], command: str, extra: tuple = ()):
    """(method, parsed dataclasses) of `trl-agents COMMAND --config FILE ...`: RunArguments, the method's config,
    ModelConfig, then the `extra` dataclasses."""
    from trl import ModelConfig, TrlParser

    from .run import RunArguments
    from .trainers import get_method

    position = argv.index("--config") + 1
    if position >= len(argv):
        raise ValueError("--config needs a value: a YAML file, or a packaged config's name (`trl-agents configs`)")
    config_path = argv[position] = resolve_config(argv[position])
    file_config = _read_config(config_path)
    method = get_method(_method_of(argv, file_config))
    extra = tuple(c for c in extra if not issubclass(method.config_class, c))  # (LLMZeroConfig has them already)
    classes = (RunArguments, method.config_class, ModelConfig, *extra)
    parser = _quiet(TrlParser)(classes, prog=f"trl-agents {command}")
    parser.set_defaults(**method.defaults)  # what defines the method (e.g. rloo's estimator)
    _check_keys(parser, argv, config_path, file_config)
    parsed = parser.parse_args_and_config(argv)
    _check_method_fields(method, parsed[1], command)
    return method, parsed


def _check_method_fields(method, config, command: str) -> None:
    """A method defined by fixed field values (e.g. `grpo_opsd`: `sdar_gate_beta=0`) refuses a config or command line
    that sets one of them to something else, in one line naming the field: the run would be another method recorded
    under this one's name."""
    from .trainers import METHODS

    for name, fixed in method.defaults.items():
        value = getattr(config, name, fixed)
        if value == fixed:
            continue
        others = [m.name for m in METHODS.values() if m.trainer_class is method.trainer_class and m is not method
                  and all(getattr(config, k, v) == v for k, v in m.defaults.items())]
        instead = f", or use --method {others[0]}, which runs it" if others else ""
        raise SystemExit(
            f"trl-agents {command}: method {method.name!r} fixes {name}={fixed!r}, but the config or command line sets "
            f"{name}={value!r}: remove {name}{instead}"
        )


SEARCH_ALIASES = {"--stages": "--search_budget", "--children": "--children_per_node"}


def _alias(arg: str) -> str:
    """`--stages 3` / `--stages=3` as `--search_budget ...`, `--children` as `--children_per_node`."""
    key, equals, value = arg.partition("=")
    return SEARCH_ALIASES.get(key, key) + equals + value


def search(argv: list[str]) -> dict[str, Any]:
    """`trl-agents search --config CONFIG [--stages N] [--children K] [--stage_steps S] [--proposer llm
    --proposer_url URL] ...`: LLMZero's tree search over training strategies around the config's method, every
    stage a `trl-agents train` run from its parent's checkpoint (`trl_agents.search.run_search`); writes
    `search_tree.json` in output_dir, and continues it when started again with the same settings."""
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from .search import run_search
    from .strategy import SearchArguments

    argv = _split_config([_alias(arg) for arg in argv])
    if "--config" not in argv:
        if "-h" in argv or "--help" in argv:
            argv = ["--config", packaged_config(QUICKSTART), *argv]
        else:
            raise SystemExit("trl-agents search: give --config CONFIG (the YAML of the run the search starts from, "
                             "or a packaged config's name, e.g. llmzero_sokoban: `trl-agents configs` lists them)")
    _, parsed = _parse(argv, "search", extra=(SearchArguments,))
    run_args, config, model_args = parsed[:3]
    return run_search(run_args, config, model_args, parsed[3] if len(parsed) > 3 else None)


def _quiet(parser_class):
    """`parser_class` whose errors are one line (argparse prints the whole usage first: 240 lines for train)."""

    class Quiet(parser_class):
        def error(self, message):
            self.exit(2, f"{self.prog}: error: {message} (`{self.prog} --help` lists the options)\n")

    return Quiet


def _check_keys(parser, argv: list[str], config_path: str, file_config: dict[str, Any]) -> None:
    """Unknown keys, in the YAML file (`file_config`, read from `config_path`) or on the command line, as a one-line
    error proposing the closest known key (TRL's own message proposes `fail_with_unknown_args=False`, which the
    command line cannot set)."""
    from .names import did_you_mean

    known = {action.dest for action in parser._actions} | {"config", "env"}  # `env:` sets environment variables
    keys = [(key, f"the config file {config_path}") for key in file_config]
    keys += [(arg[2:].split("=", 1)[0].replace("-", "_"), "the command line") for arg in argv if arg.startswith("--")]
    for key, where in keys:
        if key not in known:
            raise ValueError(f"unknown key {key!r} in {where}.{did_you_mean(key, sorted(known))}")


@dataclass
class EvalArguments:
    """Arguments of `trl-agents eval`. Unset prompting fields come from the checkpoint's `agent_config.json`
    (written by every trl-agents checkpoint), so a model is evaluated the way it was trained."""

    model_name_or_path: str = field(metadata={"help": "Checkpoint directory or Hub model id."})
    env_name: str | None = field(default=None, metadata={"help": "Environment (default: the checkpoint's)."})
    env_kwargs: str | None = field(default=None, metadata={"help": "Environment constructor arguments (JSON)."})
    split: str = field(default="eval", metadata={"help": "Task split."})
    num_eval_tasks: int | None = field(default=None, metadata={"help": "Number of tasks (None = the whole split)."})
    max_turns: int | None = field(
        default=None,
        metadata={"help": "Turn budget of an episode (default: the checkpoint's training budget, or 10). A larger one "
        "tests whether the policy uses extra turns: CANOPY trains at 50 turns and evaluates at 100."},
    )
    history_length: int | None = field(default=None, metadata={"help": "History window (default: as trained, or 2)."})
    system_prompt: str | None = field(default=None, metadata={"help": "System message (default: as trained)."})
    max_new_tokens: int | None = field(default=None, metadata={"help": "Token budget of a turn (default: as trained)."})
    greedy: bool = field(default=True, metadata={"help": "Greedy decoding (False: sample at `temperature`)."})
    modes: list[str] | None = field(
        default=None,
        metadata={"help": "Decodings to evaluate, one result each: `--modes greedy sampled` runs both (greedy: one "
        "episode per task; sampled: `num_samples` at `temperature`). Overrides `--greedy`."},
    )
    temperature: float = field(
        default=1.0, metadata={"help": "Sampling temperature when not greedy (CANOPY evaluates at 0.6)."}
    )
    num_samples: int = field(
        default=1, metadata={"help": "Episodes per task when sampling; k > 1 reports pass@1, 2, 4, ..., k."}
    )
    output_dir: str | None = field(
        default=None,
        metadata={"help": "Run directory that receives each result as eval/{name}.json (default: the model's "
        "directory when it is local; a Hub model writes none unless this is set)."},
    )
    output_file: str | None = field(
        default=None, metadata={"help": "Also write the results here as JSON (one mode: its result; several: a list)."}
    )
    overwrite: bool = field(
        default=False,
        metadata={"help": "Replace an evaluation record of the same name in the run directory (e.g. the one training "
        "wrote). By default both are kept: this one gets the next free name, `{name}-2`, `{name}-3`, ..."},
    )
    progress: bool = field(default=True, metadata={"help": "Show a live progress bar of the episodes on stderr."})
    env_backend: str = field(
        default="thread", metadata={"help": "Where environments run: 'thread', 'process' or 'ray' (see training)."}
    )
    env_workers: int = field(default=1, metadata={"help": "Threads stepping environments at once ('thread')."})
    env_step_timeout: float | None = field(
        default=None, metadata={"help": "Seconds a turn may take in an environment before its episode fails."}
    )
    vllm_server_url: str | None = field(
        default=None,
        metadata={"help": "Generate with a running vLLM server that serves this checkpoint (e.g. "
        "http://localhost:8000, started with `vllm serve CHECKPOINT`) instead of loading the model here. Needs "
        "the `vllm` extra (`pip install '.[vllm]'` in a checkout)."},
    )


EVAL_FALLBACKS = {"max_turns": 10, "history_length": 2, "max_completion_length": 32}
EVAL_MODES = ("greedy", "sampled")


def evaluate(argv: list[str]) -> dict[str, Any] | list[dict[str, Any]]:
    """`trl-agents eval`: the checkpoint on its environment's split, in one or both decodings; returns (and prints)
    the result of each, written to `eval/{name}.json` of the run directory (see `EvalArguments.output_dir`)."""
    import json

    from transformers import AutoModelForCausalLM, HfArgumentParser

    from .evaluation import EVAL_DIR, evaluate_policy, free_eval_name, to_eval_result, write_eval_result
    from .loading import load_tokenizer
    from .rollout import EnvPool
    from .rollout.env_pool import check_execution_settings
    from .checkpoints import load_agent_config
    from .trainers.agent_grpo_config import ENV_EXECUTION_FIELDS, as_dict

    (args,) = _quiet(HfArgumentParser)(EvalArguments, prog="trl-agents eval").parse_args_into_dataclasses(argv)
    _check_model_path(args.model_name_or_path)
    check_execution_settings(args.env_backend, args.env_workers, args.env_step_timeout, None, None, ENV_EXECUTION_FIELDS)
    modes = args.modes or ["greedy" if args.greedy else "sampled"]
    unknown = sorted(set(modes) - set(EVAL_MODES))
    if unknown:
        raise ValueError(f"--modes: unknown {', '.join(unknown)}; choose among {', '.join(EVAL_MODES)}")
    if args.num_samples > 1 and "sampled" not in modes:
        raise ValueError("--num_samples > 1 needs sampling: add --greedy false (or --modes sampled)")
    agent_config = load_agent_config(args.model_name_or_path)
    trained = {**EVAL_FALLBACKS, **agent_config}

    def setting(value, name):
        return trained.get(name) if value is None else value

    env_name = setting(args.env_name, "env_name")
    if env_name is None:
        raise SystemExit("trl-agents eval: set --env_name (the checkpoint has no agent_config.json to read it from)")
    env_kwargs = as_dict(args.env_kwargs, "env_kwargs") if args.env_kwargs else trained.get("env_kwargs")
    run_dir = args.output_dir or (args.model_name_or_path if os.path.isdir(args.model_name_or_path) else None)
    try:
        tokenizer = load_tokenizer(args.model_name_or_path, padding_side="left")
    except OSError as err:  # a Hub id that cannot be fetched (offline, private, misspelled)
        raise ValueError(f"cannot load a tokenizer from --model_name_or_path {args.model_name_or_path!r}: "
                         f"{str(err).splitlines()[0]}") from None
    if args.vllm_server_url:
        from .rollout.vllm import VLLMClientGenerator

        model, generator = None, VLLMClientGenerator(args.vllm_server_url, [tokenizer.eos_token_id])
    else:
        model, generator = AutoModelForCausalLM.from_pretrained(args.model_name_or_path), None
    env_pool = EnvPool(
        env_kwargs=env_kwargs,
        default_env=env_name,
        backend=args.env_backend,
        num_workers=args.env_workers,
        step_timeout=args.env_step_timeout,
    )
    results = []
    try:
        for mode in modes:
            result = evaluate_policy(
                model,
                tokenizer,
                env_name,
                split=args.split,
                num_tasks=args.num_eval_tasks,
                env_kwargs=env_kwargs,
                max_turns=setting(args.max_turns, "max_turns"),
                train_max_turns=agent_config.get("max_turns"),
                history_length=setting(args.history_length, "history_length"),
                row_format=trained.get("row_format", "step"),
                system_prompt=setting(args.system_prompt, "system_prompt"),
                max_new_tokens=setting(args.max_new_tokens, "max_completion_length"),
                max_prompt_length=trained.get("max_prompt_length"),
                chat_template_kwargs=trained.get("chat_template_kwargs"),
                greedy=mode == "greedy",
                temperature=args.temperature,
                num_samples=1 if mode == "greedy" else args.num_samples,
                generator=generator,
                env_pool=env_pool,
                show_progress=args.progress,
            )
            results.append(result)
            if run_dir is not None:
                record = to_eval_result(result, model=args.model_name_or_path)
                taken = os.path.join(run_dir, EVAL_DIR, f"{record['name']}.json")
                if os.path.isfile(taken) and not args.overwrite:
                    record["name"] = free_eval_name(run_dir, record["name"])
                    print(f"[trl-agents] kept the earlier {taken} (--overwrite true replaces it)", file=sys.stderr)
                path = write_eval_result(run_dir, record)
                print(f"[trl-agents] {mode} evaluation written to {path}", file=sys.stderr)
    finally:
        env_pool.close()
    output = results[0] if len(results) == 1 else results
    print(json.dumps(output, indent=2))
    if args.output_file:
        with open(args.output_file, "w") as handle:
            json.dump(output, handle, indent=2)
    return output


def _check_model_path(name: str) -> None:
    """A one-line error for a local path that does not exist, before anything asks for the environment. A name
    shaped like a Hub id (`name` or `org/name`) that is not a local folder is left to the Hub."""
    hub_id = re.fullmatch(r"[\w-][\w.-]*(/[\w.-]+)?", name) is not None
    if not hub_id and not os.path.exists(os.path.expanduser(name)):
        raise ValueError(f"--model_name_or_path {name!r}: no such directory (pass a checkpoint folder or a Hub model id)")


def push(argv: list[str]) -> dict:
    """`trl-agents push RUN_DIR --repo USER/NAME`: the run's model (or LoRA adapter), model card, eval results and
    trajectories to the Hub (see `trl_agents.hub.push_run`); `trl-agents push RESULTS.parquet --repo USER/NAME`: a
    results table as a dataset (`trl_agents.hub.push_results`). Only the files a model repo documents go in: other
    files of RUN_DIR are skipped with a warning, and a link out of RUN_DIR is never followed. `--dry_run` lists what
    would be uploaded."""
    from .hub import DEFAULT_COMMIT_MESSAGE, push_results, push_run

    parser = argparse.ArgumentParser(prog="trl-agents push", description=push.__doc__)
    parser.add_argument("run_dir", help="output_dir of a training run (after trainer.save_model / trl-agents train), "
                        "or a results table (.parquet, e.g. benchmarks/results/evidence_runs.parquet) to push as a "
                        "dataset to --repo")
    parser.add_argument("--repo", required=True, help="model repo, USER/NAME or ORG/NAME (created if missing)")
    parser.add_argument("--dataset_repo", help="repo of the trajectory dataset (default: REPO-trajectories)")
    parser.add_argument("--private", action="store_true", help="create the repos private")
    parser.add_argument("--token", help="Hub token with write access (default: HF_TOKEN or `hf auth login`)")
    parser.add_argument("--no_trajectories", action="store_true", help="do not push RUN_DIR/trajectories")
    parser.add_argument("--commit_message", default=DEFAULT_COMMIT_MESSAGE, help="message of the model commit")
    parser.add_argument("--include", nargs="+", default=[], metavar="FOLDER",
                        help="sub-folders of RUN_DIR to push too (e.g. warm-start: the warm-started model); none by "
                        "default")
    parser.add_argument("--no_eval_tasks", action="store_true",
                        help="do not publish the evaluations' tasks as benchmark datasets (the scores then stay in the "
                        "card's model-index, without .eval_results/)")
    parser.add_argument("--dry_run", action="store_true",
                        help="print every file that would be uploaded to each repo (path in the repo, size) and "
                        "upload nothing (no network call, no token needed)")
    args = parser.parse_args(argv)
    if args.run_dir.endswith(".parquet"):
        urls = push_results(args.run_dir, args.repo, token=args.token, private=args.private, dry_run=args.dry_run)
        if args.dry_run:
            return print_push_plan(urls)
        print(f"results: {urls['dataset']}")
        return urls
    from .records import read_run_info
    from .trainers import METHODS

    recorded = read_run_info(args.run_dir, missing_ok=True)
    method = None if recorded.get("method_card") else METHODS.get(recorded.get("method") or "")  # an older run
    urls = push_run(  # its errors (bad input, no or refused token, unreachable Hub) are reported by `main`
        args.run_dir,
        args.repo,
        token=args.token,
        private=args.private,
        dataset_repo_id=args.dataset_repo,
        push_trajectories=not args.no_trajectories,
        commit_message=args.commit_message,
        method=method,
        push_eval_tasks=not args.no_eval_tasks,
        include_folders=args.include,
        dry_run=args.dry_run,
    )
    if args.dry_run:
        return print_push_plan(urls)
    print(f"model: {urls['model']}")
    if urls["dataset"]:
        print(f"trajectories: {urls['dataset']}")
    return urls


def print_push_plan(plan: dict) -> dict:
    """Print `push_run(..., dry_run=True)`'s plan: each repo, then its files (path in the repo, size). Returns it."""
    print("dry run: nothing was uploaded. A push would upload:")
    repos = [("model repo", plan["model"]), ("trajectory dataset" if plan["model"] else "dataset", plan["dataset"]),
             *(("benchmark dataset", repo) for repo in plan["benchmarks"])]
    for kind, repo in repos:
        if repo is None:
            continue
        print(f"{kind} {repo['repo_id']}:")
        for file in repo["files"]:
            size = f"{file['size']:,} bytes" if file["size"] is not None else "made by the push"
            print(f"  {file['path']}  ({size}; from {file['source']})")
    return plan


def list_envs(argv: list[str] | None = None) -> None:
    """`trl-agents envs`: every registered environment with its capabilities and what it needs;
    `trl-agents envs NAME`: one environment in detail (instructions, task keys, splits, README)."""
    from .envs import get_env_class
    from .envs import list_envs as registered

    parser = argparse.ArgumentParser(prog="trl-agents envs", description=list_envs.__doc__)
    parser.add_argument("name", nargs="?", help="show one environment in detail")
    args = parser.parse_args(argv or [])
    if args.name is None:
        print(f"{'name':<18} {'capabilities':<92} needs")
        for name, cls in registered().items():
            capabilities = ", ".join(sorted(cls.capabilities())) or "-"
            missing = cls.missing_requirements()
            needs = "-" if not cls.requires else ", ".join(cls.requires) + (
                f"  (missing: {', '.join(missing)}; pip install 'trl-agents[envs]')" if missing else ""
            )
            print(f"{name:<18} {capabilities:<92} {needs}")
        return
    cls = get_env_class(args.name)
    doc = (cls.__doc__ or "").strip().split("\n\n")[0]
    print(f"{cls.name}  ({cls.__module__}.{cls.__name__})")
    if doc:
        print(doc)
    print(f"capabilities: {', '.join(sorted(cls.capabilities())) or '-'}")
    if cls.roles:
        print(f"roles: {', '.join(cls.roles)}")
    print(f"task keys: {', '.join(cls.task_keys) or '-'}")
    print(f"requires: {', '.join(cls.requires) or '-'}" + (
        f" (missing: {', '.join(cls.missing_requirements())})" if cls.missing_requirements() else ""))
    splits = [split for split in ("train", "eval", "unseen") if _has_split(cls, split)]
    print(f"splits: {', '.join(splits) or '-'}")
    readme = _env_readme(cls)
    if readme is not None:  # a source checkout; an installed package has no envs/ folder to point to
        print(f"README: {readme} (in the source tree)")
    print("instructions shown to the policy:")
    print("  " + cls.instructions.replace("\n", "\n  "))


def _source_tree():
    """The repository root when trl-agents runs from a source checkout (`src/trl_agents/cli.py`)."""
    from pathlib import Path

    return Path(__file__).resolve().parents[2]


def _env_readme(cls) -> str | None:
    """`envs/<folder>/README.md` when the source tree has it, else None (a pip install has no `envs/` folder): the
    folder is named after the env, or after its module (webshop-lite lives in webshop.py and shares its README)."""
    repository = _source_tree()
    module = cls.__module__.rsplit(".", 1)[-1]
    for folder in (cls.name, cls.name.replace("-", "_"), module):
        if (repository / "envs" / folder / "README.md").is_file():
            return f"envs/{folder}/README.md"
    return None


def _has_split(cls, split: str) -> bool:
    try:
        return bool(cls.task_split(split, 1))
    except (NotImplementedError, ValueError, ImportError, FileNotFoundError, RuntimeError):
        return False


def list_methods() -> None:
    """`trl-agents methods`: every method with its trainer, paper, hook, inputs, signals, topology, required env
    capabilities, the staleness it accepts and docs page (all read from the trainer classes' declarations)."""
    from .trainers import METHODS

    for name, method in METHODS.items():
        defaults = ", ".join(f"{k}={v!r}" for k, v in method.defaults.items())
        print(f"{name:<12} {method.trainer_class.__name__:<20} {method.paper}  ({method.title}; {method.docs})")
        print(f"    hook: {method.hook}; inputs: {', '.join(method.inputs)}")
        print(f"    signals: {', '.join(method.signals) or 'none'}; topology: {method.topology}")
        print(f"    env capabilities: {', '.join(method.env_capabilities) or 'none'}" + (f"; sets {defaults}" if defaults else ""))
        staleness = method.info.max_staleness
        print(f"    max_staleness: {staleness}" + (f" (on-policy: {method.info.staleness_reason})" if staleness == 0
                                                  else " (one-step-off training accepted; docs/async.md#one-step-off)"))


ENV_PACKAGES = (("TRL", "trl"), ("transformers", "transformers"), ("PyTorch", "torch"), ("accelerate", "accelerate"),
                ("PEFT", "peft"), ("datasets", "datasets"), ("huggingface_hub", "huggingface_hub"), ("vLLM", "vllm"),
                ("DeepSpeed", "deepspeed"))
"""(label, distribution) of each package whose version `trl-agents env` reports."""


def report_env(argv: list[str] | None = None) -> None:
    """`trl-agents env`: the versions a bug report needs (platform, Python, trl-agents and the libraries it runs
    on, the accelerator) and whether a Hub token is set (yes or no; never the token)."""
    import platform
    from importlib import metadata

    from . import __version__

    argparse.ArgumentParser(prog="trl-agents env", description=report_env.__doc__).parse_args(argv or [])

    def version(distribution: str) -> str:
        try:
            return metadata.version(distribution)
        except metadata.PackageNotFoundError:
            return "not installed"

    lines = [("Platform", platform.platform()), ("Python", platform.python_version()), ("trl-agents", __version__)]
    for label, distribution in ENV_PACKAGES:
        lines.append((label, version(distribution)))
        if distribution == "torch" and lines[-1][1] != "not installed":
            lines.append(("CUDA available", _cuda_summary()))
    from huggingface_hub import get_token

    lines.append(("Hub token set", "yes" if get_token() else "no"))
    print("Copy-paste the following information when reporting an issue:\n")
    for label, value in lines:
        print(f"- {label}: {value}")


def _cuda_summary() -> str:
    """`yes (N x DEVICE NAME, CUDA V)` or `no`."""
    import torch

    if not torch.cuda.is_available():
        return "no"
    count = torch.cuda.device_count()
    return f"yes ({count} x {torch.cuda.get_device_name(0)}, CUDA {torch.version.cuda})"


COMMANDS = {
    "train": "train a model with a method on an environment (no --config: the CPU quickstart)",
    "eval": "evaluate a checkpoint on held-out tasks, with the prompts it was trained with",
    "push": "push a run (model, card, eval results, trajectories) or a results table to the Hub",
    "envs": "list the environments and their capabilities; `envs NAME` describes one",
    "methods": "list the methods with their papers, hooks, signals and docs",
    "search": "LLMZero's tree search over training strategies, from a config's method",
    "configs": "list the packaged training and accelerate configs; `configs NAME` prints one's path",
    "env": "print the versions to include in a bug report",
}
"""Each subcommand of `trl-agents` with the line `trl-agents --help` shows for it."""


def _help() -> str:
    """`trl-agents --help`: usage, what the tool does, and a line per subcommand."""
    commands = "\n".join(f"  {name:<9} {description}" for name, description in COMMANDS.items())
    return (
        "usage: trl-agents COMMAND [OPTIONS]   (`trl-agents COMMAND --help` lists a command's options)\n\n"
        "Train LLM agents on multi-turn environments with RL, on TRL.\n\n"
        f"commands:\n{commands}\n\n"
        "options:\n  -h, --help  show this message and exit\n  --version   print the version and exit\n"
    )


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = {"train": train, "eval": evaluate, "push": push, "envs": list_envs, "methods": list_methods,
                "search": search, "configs": list_configs, "env": report_env}
    if not argv or argv[0] in ("-h", "--help"):
        print(_help(), end="")
        raise SystemExit(2 if not argv else 0)
    if argv[0] == "--version":
        from . import __version__

        print(f"trl-agents {__version__}")
        return
    if argv[0] not in commands:
        raise SystemExit(f"trl-agents: error: unknown command {argv[0]!r}.{did_you_mean(argv[0], commands)} "
                         "(`trl-agents --help` lists the commands)")
    command, rest = argv[0], argv[1:]
    try:
        if command == "methods":
            argparse.ArgumentParser(
                prog="trl-agents methods",
                description="List every registered method: trainer, paper, hook, inputs, signals, topology, required "
                "environment capabilities and docs page.",
            ).parse_args(rest)
            commands[command]()
        else:
            commands[command](rest)
        sys.stdout.flush()  # here, so that a reader that stopped early (`| head`) is caught below
    except BrokenPipeError:  # a listing piped into `head`, which stopped reading: not an error of the command
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's flush at exit would raise again
        raise SystemExit(0) from None
    except (ValueError, PermissionError, ConnectionError) as err:
        # Our validation errors name the field and the fix, and the Hub's refused or missing token and unreachable
        # endpoint (`trl-agents push`) name the fix too; a traceback would only bury that. TRL_AGENTS_DEBUG=1 shows
        # it anyway.
        if os.environ.get("TRL_AGENTS_DEBUG"):
            raise
        raise SystemExit(f"trl-agents {command}: error: {err}") from None


if __name__ == "__main__":
    main()
