"""The training job behind `trl-agents train`: model, optional warm start, evaluation, RL, evaluation, outputs.

`run_training` is the whole pipeline for one (method, environment) config:

1. load the model (a Hub id or local path, as TRL's scripts do: `attn_implementation`, `trust_remote_code`,
   `dtype`, 4/8-bit quantization), or build the tiny offline model (`tiny_model: true`, unless a model is named);
2. optionally warm-start it with SFT on solver demonstrations, or on the recorded steps of a trajectory dataset
   (`warm_start_dataset`: an earlier run's directory or a Hub dataset; stopping at a validation success target);
   under LoRA (`use_peft`) the warm start trains the adapter that RL then continues;
3. evaluate on the held-out split;
4. train with the method's trainer (optionally within a wall-clock budget);
5. evaluate again and write, under `output_dir`: the final checkpoint, `trajectories/*.parquet`, `metrics.json`,
   `eval_results.json` (both evaluations), `eval/{name}.json` (the one after RL, see `write_eval_result`) and
   `learning_curve.png`; then, with `push_to_hub`, publish it all (`trl_agents.hub.push_run`).

The held-out success before and after RL (and the warm start's summary) also go to the `report_to` trackers, as
`eval_before_rl/*` and `eval_after_rl/*` (shown as `eval/before_rl/*`, `eval/after_rl/*` by wandb and trackio) and
`warm_start/*`. The base model's Hub id is kept through every stage
(`run_info.json`'s `base_model`, the card's `base_model`, a LoRA adapter's base), also after a warm start.

Under `accelerate launch` (several processes) every process runs this function: the main process alone builds the
tiny model, saves the warm-started model and writes the outputs (the others wait for it, then load what it saved),
and every process evaluates the same held-out tasks, which keeps sharded models (FSDP, ZeRO-3) in step.

Example:
    ```python
    from trl_agents.run import RunArguments, run_training
    from trl_agents import GiGPOConfig
    from trl import ModelConfig

    run = RunArguments(method="gigpo", tiny_model=True, num_train_tasks=64, num_eval_tasks=32)
    config = GiGPOConfig("outputs/demo", env_name="frozenlake", max_steps=2, per_device_train_batch_size=8,
                         num_generations=4, max_completion_length=4)
    results = run_training(run, config, ModelConfig())
    ```
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from transformers import TrainerCallback

from .callbacks import TimeBudgetCallback
from .callbacks.console import use_compact_console
from .envs import get_env_class
from .evaluation import evaluate_policy, to_eval_result, write_eval_result
from .fileio import atomic_write
from .trainers import get_method
from .checkpoints import finished_message, resolve_checkpoint
from .runlock import hold_output_dir
from .trainers.agent_grpo_config import as_dict

logger = logging.getLogger(__name__)

EVAL_BEFORE_RL = "eval_before_rl.json"
"""The held-out evaluation before RL, written when it runs: a resumed run reports it instead of evaluating again."""


@dataclass
class RunArguments:
    """What `trl-agents train` runs around the trainer (the trainer's own settings live in the method config)."""

    method: str = field(default="grpo", metadata={"help": "Method name (`trl-agents methods` lists them)."})
    tiny_model: bool = field(
        default=False,
        metadata={"help": "Build a tiny Qwen2-style model and a tokenizer trained on the environment's text, "
        "offline, instead of loading `model_name_or_path` (tests, quickstart)."},
    )
    tiny_model_kwargs: dict | str | None = field(
        default=None,
        metadata={"help": "Size of the tiny model: hidden_size, num_layers, num_heads, num_kv_heads, "
        "intermediate_size, vocab_size (JSON on the command line)."},
    )
    dataset_name: str | None = field(
        default=None,
        metadata={"help": "Take the tasks from this dataset (a Hub id or a local folder, `datasets.load_dataset`) "
        "instead of the environment's splits: rows name the environment (`env` column, else `env_name`) and the "
        "fields its `reset` needs, as `task_split` builds them (TRL scripts' `--dataset_name`)."},
    )
    dataset_config: str | None = field(default=None, metadata={"help": "Configuration (subset) of `dataset_name`."})
    dataset_train_split: str = field(default="train", metadata={"help": "Split of `dataset_name` to train on."})
    dataset_test_split: str | None = field(
        default=None,
        metadata={"help": "Split of `dataset_name` evaluated before and after RL (None = the environment's "
        "`eval_split`)."},
    )
    train_split: str = field(default="train", metadata={"help": "Environment split the training tasks come from."})
    num_train_tasks: int | None = field(default=None, metadata={"help": "Number of training tasks (None = all)."})
    eval_split: str = field(default="eval", metadata={"help": "Held-out split evaluated before and after RL."})
    num_eval_tasks: int | None = field(default=200, metadata={"help": "Number of held-out tasks (None = all)."})
    eval_max_turns: int | None = field(
        default=None,
        metadata={"help": "Turn budget at evaluation (None = the training `max_turns`). CANOPY evaluates at twice "
        "its training budget (100 turns for 50)."},
    )
    eval_temperature: float | None = field(
        default=None,
        metadata={"help": "Decoding of the held-out (and warm-start validation) episodes: None = greedy; a number = "
        "sampling at that temperature, i.e. the success rate of the policy RL trains (the evidence test-bed's "
        "setting, envs/corridor/README.md)."},
    )
    warm_start_steps: int = field(
        default=0,
        metadata={"help": "Maximum SFT steps before RL, on solver demonstrations or `warm_start_dataset` (0 = no warm "
        "start)."},
    )
    warm_start_dataset: str | None = field(
        default=None,
        metadata={"help": "Warm-start on the recorded steps of a trajectory dataset instead of solver demonstrations: "
        "a run directory, its trajectories/ folder, a parquet shard or a Hub dataset id (`load_trajectories`). Its "
        "prompts and actions are replayed token for token (`sft_examples`), so the model must use the tokenizer of "
        "the policy that recorded them."},
    )
    warm_start_successful_only: bool = field(
        default=True,
        metadata={"help": "With `warm_start_dataset`: replay only the episodes that solved their task."},
    )
    warm_start_learning_rate: float = field(
        default=1e-3,
        metadata={"help": "Learning rate of the warm start (full fine-tuning of the tiny model; under LoRA, of the "
        "adapter)."},
    )
    warm_start_batch_size: int = field(default=64, metadata={"help": "Batch size of the warm start."})
    warm_start_tasks: int = field(default=2000, metadata={"help": "Training tasks whose solver plans are demos."})
    warm_start_eval_every: int = field(default=10, metadata={"help": "Validate the warm start every N steps."})
    warm_start_target_success: float | None = field(
        default=None,
        metadata={"help": "Stop the warm start once greedy validation success reaches this (None = run all steps). "
        "A medium start leaves RL both successes to learn from and room to improve (docs/concepts/warm_start.md)."},
    )
    warm_start_min_steps: int = field(
        default=0,
        metadata={"help": "Do not stop the warm start before this many steps, even at the target (a model can reach "
        "the target early through a shortcut, before it reads the observation)."},
    )
    warm_start_val_tasks: int = field(
        default=200, metadata={"help": "Training-split tasks, unused as demonstrations, that validate the warm start."}
    )
    time_budget: float | None = field(
        default=None, metadata={"help": "Stop RL after this many seconds of training (None = max_steps/epochs)."}
    )
    compact_console: bool = field(
        default=True,
        metadata={"help": "Print one short line per logging step (step, success, return, loss, step time) instead of "
        "the whole metrics dict; every metric still goes to `report_to` and metrics.json."},
    )
    echo_trap_monitor: bool = field(
        default=False,
        metadata={"help": "Attach an EchoTrapMonitor (trl_agents.callbacks.collapse): collapse/* metrics and warnings "
        "when in-group reward std, entropy, valid actions collapse or the gradient norm spikes "
        "(docs/concepts/monitors.md)."},
    )
    echo_trap_filter_top_fraction: float | None = field(
        default=None,
        metadata={"help": "With echo_trap_monitor: train only on this fraction of the groups, the highest in-group "
        "reward std first (RAGEN's filter, 0.25 in its code); None = no filtering."},
    )
    control_token_monitor: bool = field(
        default=False,
        metadata={"help": "Attach a ControlTokenMonitor (trl_agents.callbacks.control_tokens): control/* metrics and "
        "warnings when the action-format control tokens spike or the parsable-action rate drops (arXiv 2606.26027; "
        "docs/methods/toolrl.md). The toolrl method attaches its own."},
    )


def run_training(run: RunArguments, config, model_args) -> dict[str, Any]:
    """Run the whole job (see the module docstring) and return the results written to `eval_results.json`.

    `output_dir` is locked from the moment it is created to the end of the job, evaluations included
    (`runlock.hold_output_dir`): a second run into it is refused with one line. Resuming a checkpoint that already
    reached the end of training says so in one line and changes nothing (it returns the run's recorded results)."""
    with contextlib.ExitStack() as job:
        return _run_training(run, config, model_args, job)


def _run_training(run: RunArguments, config, model_args, job: contextlib.ExitStack) -> dict[str, Any]:
    from transformers import set_seed

    started = time.monotonic()
    method = get_method(run.method)
    if not isinstance(config, method.config_class):
        raise TypeError(f"method {run.method!r} needs a {method.config_class.__name__}, got {type(config).__name__}")
    if config.env_name is None:
        raise ValueError("Set `env_name` (the environment to train on), e.g. --env_name sokoban")
    if run.warm_start_dataset and run.warm_start_steps <= 0:
        raise ValueError(
            f"warm_start_dataset={run.warm_start_dataset!r} is set but warm_start_steps={run.warm_start_steps}: set "
            "--warm_start_steps to the number of SFT steps to run on it."
        )
    env_cls = get_env_class(config.env_name)
    if os.path.exists(config.output_dir) and not os.path.isdir(config.output_dir):
        raise ValueError(f"output_dir {config.output_dir!r} is a file: choose a folder for the run's outputs")
    set_seed(config.seed)
    # TrainingArguments joins the processes of `accelerate launch` lazily, on first use of its device: do it now, so
    # that `process_index` and `main_process_first` below see them.
    _ = config.device

    # Resuming (`--resume_from_checkpoint PATH`, or `true` for the last checkpoint of output_dir) continues the run
    # at the checkpoint's step: no second warm start (the checkpoint holds the weights), the first evaluation is the
    # one the run recorded.
    checkpoint = resolve_checkpoint(config.resume_from_checkpoint, config.output_dir)
    if checkpoint is not None and (done := finished_message(checkpoint, config)) is not None:
        if config.process_index == 0:
            print(f"[trl-agents] {done}")
        recorded = os.path.join(config.output_dir, "eval_results.json")
        if not os.path.isfile(recorded):
            return {}
        with open(recorded) as handle:
            return json.load(handle)
    train_tasks, eval_tasks = _tasks(run, config, env_cls)
    peft_config, quantization = _peft_config(model_args), _quantization_config(model_args)
    os.makedirs(config.output_dir, exist_ok=True)  # (only once the settings are known to be good)
    job.enter_context(hold_output_dir(config.output_dir, main_process=config.process_index == 0,
                                      distributed=config.world_size > 1))
    model, tokenizer, model_ref = _load_model(run, config, model_args, quantization)

    results: dict[str, Any] = {"method": run.method, "env": config.env_name, "seed": config.seed}
    metrics: dict[str, Any] = {}
    warm_started = os.path.join(config.output_dir, "warm-start")
    if checkpoint is not None and run.warm_start_steps > 0 and os.path.isdir(warm_started):
        if peft_config is not None:  # the warm-started adapter; the checkpoint then restores the trained one
            from peft import PeftModel

            model_ref, peft_config = PeftModel.from_pretrained(model, warm_started, is_trainable=True), None
        else:
            model_ref = warm_started  # the architecture and tokenizer the checkpoint was trained from
        if config.process_index == 0:
            print(f"[trl-agents] resuming from {checkpoint}: warm start skipped")
    elif run.warm_start_steps > 0:
        model_ref, metrics["warm_start"] = _warm_start(run, config, model, tokenizer, train_tasks, peft_config,
                                                       model_args.model_name_or_path)
        if not isinstance(model_ref, str):
            peft_config = None  # RL continues the warm start's adapter (TRL keeps a frozen copy as reference)
    del model

    # Full fine-tuning: a path or Hub id, never an in-memory model (TRL re-creates the reference model, beta > 0,
    # from it). LoRA after a warm start: the warm-started adapter, in memory (the reference is a frozen copy of it).
    callbacks = [TimeBudgetCallback(run.time_budget)] if run.time_budget else []
    trainer = method.trainer_class(
        model=model_ref,
        args=config,
        train_dataset=train_tasks,
        processing_class=tokenizer,
        callbacks=callbacks,
        peft_config=peft_config,
        quantization_config=quantization if isinstance(model_ref, str) else None,
    )
    if run.compact_console:
        use_compact_console(trainer)
    if run.echo_trap_monitor or run.echo_trap_filter_top_fraction is not None:
        from .callbacks.collapse import EchoTrapMonitor

        trainer.add_callback(EchoTrapMonitor(trainer, filter_top_fraction=run.echo_trap_filter_top_fraction))
    if run.control_token_monitor:
        from .callbacks.control_tokens import ControlTokenMonitor

        if not any(isinstance(callback, ControlTokenMonitor) for callback in trainer.callback_handler.callbacks):
            trainer.add_callback(ControlTokenMonitor(trainer))
    evaluate = _evaluator(run, config, tokenizer, eval_tasks)
    main_process = config.process_index == 0
    before_path = os.path.join(config.output_dir, EVAL_BEFORE_RL)
    if checkpoint is not None and os.path.isfile(before_path):
        with open(before_path) as handle:
            results["eval_before_rl"] = json.load(handle)
    else:
        results["eval_before_rl"] = evaluate(trainer.model)
        if main_process:  # kept for a resumed run, which starts from a checkpoint, not from this model
            atomic_write(before_path, json.dumps(results["eval_before_rl"], indent=2, default=str))
    if main_process:
        _print_eval("after warm start" if run.warm_start_steps > 0 else "before RL", results["eval_before_rl"])
    # To the report_to trackers: the warm start's curve and the evaluation before RL now, the one after RL from
    # inside train() (before the trackers close their run).
    trainer.log_values({**_tracked("warm_start", metrics.get("warm_start", {}).get("summary", {})),
                        **_tracked("eval_before_rl", results["eval_before_rl"])})
    after = _EvaluationAtTheEnd(trainer, evaluate)
    trainer.callback_handler.callbacks.insert(0, after)  # first, so its log reaches the trackers before they close
    rl_started = time.monotonic()
    trainer.train(resume_from_checkpoint=checkpoint)
    results["rl_seconds"] = time.monotonic() - rl_started - after.seconds
    results["rl_steps"] = trainer.state.global_step
    results["rl_rollout_totals"] = dict(trainer.rollout_totals)  # generated tokens, env steps, episodes
    results["eval_after_rl"] = after.result if after.result is not None else evaluate(trainer.model)
    gain = results["eval_after_rl"]["success_rate"] - results["eval_before_rl"]["success_rate"]
    results["success_gain_points"] = 100 * gain
    results["total_seconds"] = time.monotonic() - started
    results["run_arguments"] = asdict(run)
    metrics["rl"] = trainer.state.log_history
    # Saved by every process (a sharded model is gathered to save it). TRL's push at save time would publish the run
    # before its evaluation and curve are written: it comes last, below.
    push, config.push_to_hub = config.push_to_hub, False
    try:
        trainer.save_model(config.output_dir)
    finally:
        config.push_to_hub = push
    if main_process:
        _print_eval("after RL", results["eval_after_rl"])
        print(f"[trl-agents] held-out success gain from RL: {100 * gain:+.1f} points "
              f"({results['rl_steps']} RL steps, {results['total_seconds']:.0f} s in total)")
        atomic_write(os.path.join(config.output_dir, "metrics.json"), json.dumps(metrics, indent=2, default=str))
        atomic_write(os.path.join(config.output_dir, "eval_results.json"), json.dumps(results, indent=2, default=str))
        write_eval_result(config.output_dir, to_eval_result(results["eval_after_rl"], model=config.output_dir))
        plot_learning_curve(metrics, results, os.path.join(config.output_dir, "learning_curve.png"),
                            greedy=run.eval_temperature is None)
    if push:
        pushed = trainer.push_to_hub(commit_message="trl-agents train: model, card, eval results")
        if main_process:
            print(f"[trl-agents] pushed to {pushed}")
    if main_process:
        print(f"[trl-agents] outputs in {os.path.abspath(config.output_dir)}"
              + ("" if push else f"; publish them with `trl-agents push {config.output_dir} --repo YOU/NAME`"))
    return results


class _EvaluationAtTheEnd(TrainerCallback):
    """Runs the evaluation after RL when training ends, and logs it (`eval_after_rl/*`) while the trackers' run is
    still open (trackio closes it at train end): put it first among the trainer's callbacks."""

    def __init__(self, trainer, evaluate):
        self.trainer, self.evaluate = trainer, evaluate
        self.result: dict[str, Any] | None = None
        self.seconds = 0.0

    def on_train_end(self, args, state, control, **kwargs):
        if getattr(self.trainer, "stopped_by_signal", None):  # stopped early (preempted): no time for it, no result
            return
        started = time.monotonic()
        self.result = self.evaluate(self.trainer.model)
        self.seconds = time.monotonic() - started
        self.trainer.log_values(_tracked("eval_after_rl", self.result))


def _tracked(prefix: str, values: dict[str, Any]) -> dict[str, float]:
    """The numbers of `values` as tracker metrics `prefix/name`: an evaluation's metrics (success rate, return,
    length, valid actions, pass@k; not its settings), or the warm start's summary.

    >>> _tracked("eval_before_rl", {"success_rate": 0.5, "max_turns": 8, "env": "sokoban", "greedy": True})
    {'eval_before_rl/success_rate': 0.5}
    """
    from .evaluation import EVAL_METRICS

    evaluation = "success_rate" in values
    return {f"{prefix}/{key}": float(value) for key, value in values.items()
            if isinstance(value, int | float) and not isinstance(value, bool)
            and (not evaluation or key in EVAL_METRICS or key.startswith("pass_at_"))}


def _tasks(run: RunArguments, config, env_cls) -> tuple[Any, Any]:
    """(training tasks, held-out tasks): from `dataset_name` (a Hub id or a local folder) when set, else from the
    environment's splits."""
    if run.dataset_name:
        from datasets import load_dataset

        try:
            dataset = load_dataset(run.dataset_name, run.dataset_config)
        except (FileNotFoundError, ValueError, OSError) as err:
            problem = str(err).splitlines()[0] if str(err) else type(err).__name__
            raise ValueError(f"dataset_name={run.dataset_name!r}: cannot load it ({problem})") from None
        from .names import check_choice

        check_choice("dataset_train_split", run.dataset_train_split, sorted(dataset))
        if run.dataset_test_split is not None:
            check_choice("dataset_test_split", run.dataset_test_split, sorted(dataset))
        train_tasks = dataset[run.dataset_train_split]
        if run.num_train_tasks is not None:
            train_tasks = train_tasks.select(range(min(run.num_train_tasks, len(train_tasks))))
        if run.dataset_test_split is not None:
            eval_tasks = dataset[run.dataset_test_split]
            eval_tasks = [dict(row) for row in eval_tasks.select(range(min(run.num_eval_tasks or len(eval_tasks),
                                                                            len(eval_tasks))))]
        else:
            eval_tasks = env_cls.task_split(run.eval_split, run.num_eval_tasks, **config.env_kwargs)
    else:
        train_tasks = env_cls.task_split(run.train_split, run.num_train_tasks, **config.env_kwargs)
        eval_tasks = env_cls.task_split(run.eval_split, run.num_eval_tasks, **config.env_kwargs)
    if not len(train_tasks):
        source = f"dataset {run.dataset_name!r}" if run.dataset_name else f"{config.env_name!r}"
        raise ValueError(
            f"the training split of {source} has no tasks (num_train_tasks={run.num_train_tasks}): choose another "
            "split or a positive num_train_tasks"
        )
    return train_tasks, eval_tasks


def _load_model(run: RunArguments, config, model_args, quantization=None):
    """(model or None, tokenizer, path or Hub id). The tiny offline model is built and saved under output_dir; a Hub
    or local model is loaded here only when the warm start needs its weights (the trainer loads it otherwise), with
    the settings TRL's scripts pass (`model_init_kwargs`: revision, dtype, attn_implementation, trust_remote_code,
    and a k-bit device map when quantized)."""
    from transformers import AutoModelForCausalLM

    from .loading import load_tokenizer

    name = model_args.model_name_or_path
    if run.tiny_model and name:
        if config.process_index == 0:
            print(f"[trl-agents] training {name}: the config's tiny_model: true is ignored for a named model")
    elif run.tiny_model:
        from .testing import build_tiny_model, build_tiny_tokenizer, env_corpus

        path = os.path.join(config.output_dir, "base-model")
        with config.main_process_first(local=False, desc="build the tiny model"):  # the others load it then
            if config.process_index > 0:
                return AutoModelForCausalLM.from_pretrained(path), load_tokenizer(path), path
            sizes = as_dict(run.tiny_model_kwargs, "tiny_model_kwargs")
            vocab_size = sizes.pop("vocab_size", 512)
            corpus = env_corpus(config.env_name, seed=config.seed, **config.env_kwargs)
            if config.system_prompt:
                corpus.append(config.system_prompt)
            tokenizer = build_tiny_tokenizer(corpus, vocab_size=vocab_size)
            model = build_tiny_model(tokenizer, seed=config.seed, **sizes)
            model.save_pretrained(path)
            tokenizer.save_pretrained(path)
            return model, tokenizer, path
    if not name:
        raise ValueError("Set `model_name_or_path` (a Hub model id or a local path), or `tiny_model: true`.")
    with _loading(name):
        tokenizer = load_tokenizer(name, revision=model_args.model_revision, padding_side="left",
                                   trust_remote_code=config.trust_remote_code)
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError(
            f"The tokenizer of {name!r} has no chat template, and trl-agents renders every turn as a chat. Use an "
            "instruct model, or save a tokenizer with a chat template next to the model."
        )
    init_kwargs = {"revision": model_args.model_revision, "dtype": model_args.dtype or "auto",
                   "trust_remote_code": config.trust_remote_code}
    if model_args.attn_implementation is not None:
        init_kwargs["attn_implementation"] = model_args.attn_implementation
    if quantization is not None:
        from trl import get_kbit_device_map

        init_kwargs["device_map"] = get_kbit_device_map()
    config.model_init_kwargs = {**init_kwargs, **(config.model_init_kwargs or {})}  # how the trainer loads it
    model = None
    with _loading(name):
        if run.warm_start_steps > 0:
            model = AutoModelForCausalLM.from_pretrained(name, **config.model_init_kwargs,
                                                         quantization_config=quantization)
        else:  # the trainer loads the weights: their config now, so that an unreachable model is named here
            from transformers import AutoConfig

            AutoConfig.from_pretrained(name, revision=model_args.model_revision,
                                       trust_remote_code=config.trust_remote_code)
    return model, tokenizer, name


@contextlib.contextmanager
def _loading(name: str):
    """Turn a model or tokenizer that cannot be loaded (a Hub id offline, private, gated or misspelled; a missing
    folder) into a one-line ValueError naming `model_name_or_path`, the cause and the fix, instead of transformers'
    tracebacks."""
    from huggingface_hub.errors import HFValidationError

    try:
        yield
    except (OSError, HFValidationError) as err:
        hub_id = re.fullmatch(r"[\w-][\w.-]*(/[\w.-]+)?", name) is not None
        if not hub_id and not os.path.exists(os.path.expanduser(name)):
            raise ValueError(f"model_name_or_path {name!r}: no such folder (pass a local model folder or a Hub model "
                             "id)") from None
        cause = next((line.strip() for line in str(err).splitlines() if line.strip()), type(err).__name__)
        offline = " or unset HF_HUB_OFFLINE to download it" if os.environ.get("HF_HUB_OFFLINE", "").lower() in (
            "1", "true", "yes", "on") else ""
        raise ValueError(
            f"model_name_or_path {name!r}: cannot load it ({cause}). Check the Hub id or local path; for a private "
            f"or gated model run `hf auth login` (or set HF_TOKEN){offline}."
        ) from None


def _peft_config(model_args):
    if not getattr(model_args, "use_peft", False):
        return None
    from trl import get_peft_config

    return get_peft_config(model_args)


def _quantization_config(model_args):
    """TRL's `get_quantization_config` (`--load_in_4bit` / `--load_in_8bit`), or a one-line error where it cannot
    work: no CUDA GPU, no bitsandbytes, or no adapter to train (a quantized model trains through LoRA: QLoRA)."""
    if not (model_args.load_in_4bit or model_args.load_in_8bit):
        return None
    import importlib.util

    import torch
    from trl import get_quantization_config

    flag = "--load_in_4bit" if model_args.load_in_4bit else "--load_in_8bit"
    if not torch.cuda.is_available():
        raise ValueError(f"{flag} loads the model quantized with bitsandbytes, which needs a CUDA GPU, and this "
                         f"machine has none: remove {flag}, or run on a GPU machine.")
    if importlib.util.find_spec("bitsandbytes") is None:
        raise ValueError(f"{flag} needs bitsandbytes: pip install bitsandbytes")
    if not model_args.use_peft:
        raise ValueError(f"{flag} trains a quantized model, which is only possible through an adapter: add "
                         "--use_peft true (QLoRA).")
    return get_quantization_config(model_args)


def _warm_start(run: RunArguments, config, model, tokenizer, train_tasks, peft_config=None, base_model=None):
    """SFT of `model` before RL; returns (what RL trains: the saved model's path, or under LoRA the warm-started
    `PeftModel` itself, summary). The saved folder's card names `base_model`, so the run keeps the Hub id."""
    from .warmstart import SuccessStopper, solver_demonstrations, warm_start

    demo_tasks = train_tasks[: run.warm_start_tasks]
    val_tasks = train_tasks[run.warm_start_tasks : run.warm_start_tasks + run.warm_start_val_tasks]
    if run.warm_start_target_success is not None and not val_tasks:
        raise ValueError(
            "warm_start_target_success needs validation tasks: num_train_tasks must exceed warm_start_tasks "
            f"(got {len(train_tasks)} tasks, {run.warm_start_tasks} used as demonstrations)."
        )
    if run.warm_start_dataset:
        examples = _replayed_examples(run, config, tokenizer)
        source = f"steps replayed from {run.warm_start_dataset}"
    else:
        examples = solver_demonstrations(
            config.env_name,
            demo_tasks,
            env_kwargs=config.env_kwargs,
            history_length=config.history_length,
            system_prompt=config.system_prompt,
        )
        source = "solver demonstrations"
    validate = _evaluator(run, config, tokenizer, val_tasks)
    stopper = SuccessStopper(lambda: validate(model)["success_rate"], run.warm_start_eval_every,
                             run.warm_start_target_success, run.warm_start_min_steps)
    trainer = warm_start(
        model,
        tokenizer,
        examples,
        output_dir=os.path.join(config.output_dir, "warm-start"),
        max_steps=run.warm_start_steps,
        learning_rate=run.warm_start_learning_rate,
        batch_size=run.warm_start_batch_size,
        seed=config.seed,
        callbacks=[stopper] if val_tasks else [],
        peft_config=peft_config,
        report_to=config.report_to,
        run_name=f"{config.run_name}-warm-start" if config.run_name else None,
    )
    if peft_config is not None:
        model = trainer.accelerator.unwrap_model(trainer.model)  # the PeftModel the warm start trained
    if stopper.history and config.process_index == 0:
        step, success = stopper.history[-1]
        print(f"[trl-agents] warm start: {len(examples)} {source}, stopped at step {step} with "
              f"validation success {success:.3f} (target {run.warm_start_target_success})")
    path = os.path.join(config.output_dir, "warm-start")
    with config.main_process_first(local=False, desc="save the warm-started model"):  # the trainers load it then
        if config.process_index == 0:
            model.save_pretrained(path)
            tokenizer.save_pretrained(path)
            _write_provenance(path, base_model)
    losses = [(entry["step"], entry["loss"]) for entry in trainer.state.log_history if "loss" in entry]
    summary = {"steps": trainer.state.global_step, "examples": len(examples)}
    if losses:
        summary["final_loss"] = losses[-1][1]
    if stopper.history:
        summary["validation_success"] = stopper.history[-1][1]
    warm = {"examples": len(examples), "source": source, "loss": losses, "validation_success": stopper.history,
            "summary": summary}
    return (path if peft_config is None else model), warm


def _write_provenance(folder: str, base_model: str | None) -> None:
    """A model card in `folder` naming the Hub model it was fine-tuned from (`hub_base_model` follows it), when that
    is a Hub id."""
    from .records import hub_base_model

    base = hub_base_model(base_model)
    if base is None:
        return
    from huggingface_hub import ModelCard, ModelCardData

    data = ModelCardData(base_model=base, library_name="transformers", tags=["trl-agents", "warm-start"])
    ModelCard(f"---\n{data.to_yaml()}\n---\n\nThe warm start (SFT) of a trl-agents run, from {base}.\n").save(
        os.path.join(folder, "README.md"))


def _replayed_examples(run: RunArguments, config, tokenizer):
    """SFT examples replayed token for token from `run.warm_start_dataset`, checked against the model's tokenizer."""
    from .records import load_trajectories, sft_examples

    examples = sft_examples(
        load_trajectories(run.warm_start_dataset),
        only_successful=run.warm_start_successful_only,
        row_format=config.row_format,
    )
    if len(examples) == 0:
        hint = " in successful episodes (replay every episode with --warm_start_successful_only false)"
        raise ValueError(
            f"warm_start_dataset={run.warm_start_dataset!r} has no valid steps to replay"
            f"{hint if run.warm_start_successful_only else ''}."
        )
    largest = max(max(ids) for ids in examples["input_ids"])
    if largest >= len(tokenizer):
        raise ValueError(
            f"warm_start_dataset={run.warm_start_dataset!r} holds token id {largest}, beyond the vocabulary of the "
            f"model's tokenizer ({len(tokenizer)} tokens): it was recorded by a policy with another tokenizer, and "
            "its steps are replayed token for token. Warm-start a model that shares that tokenizer."
        )
    return examples


def _evaluator(run: RunArguments, config, tokenizer, tasks):
    def evaluate(model) -> dict[str, Any]:
        return evaluate_policy(
            model,
            tokenizer,
            config.env_name,
            tasks=tasks,
            split=run.eval_split,
            env_kwargs=config.env_kwargs,
            max_turns=run.eval_max_turns or config.max_turns,
            train_max_turns=config.max_turns,
            history_length=config.history_length,
            row_format=config.row_format,
            system_prompt=config.system_prompt,
            max_new_tokens=config.max_completion_length,
            max_prompt_length=config.max_prompt_length,
            greedy=run.eval_temperature is None,
            temperature=1.0 if run.eval_temperature is None else run.eval_temperature,
            seed=config.seed,  # sampled evaluation: every model of a seed draws the same numbers (paired)
            chat_template_kwargs=config.chat_template_kwargs,
            show_progress=config.process_index == 0 and not config.disable_tqdm,
        )

    return evaluate


def _print_eval(label: str, result: dict[str, Any]) -> None:
    print(
        f"[trl-agents] held-out success {label}: {result['success_rate']:.3f} on {result['num_tasks']} tasks "
        f"(mean length {result['episode_length']:.2f}, valid actions {result['valid_action_rate']:.3f})"
    )


def plot_learning_curve(metrics: dict[str, Any], results: dict[str, Any], path: str, greedy: bool = True) -> None:
    """Training success per RL step (sampled rollouts) with the held-out success before and after RL (`greedy`:
    how the held-out episodes were decoded, for the legend)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    history = [h for h in metrics.get("rl", []) if "env/success_rate" in h]
    figure, axis = plt.subplots(figsize=(7, 4))
    if history:
        steps = [h["step"] for h in history]
        success = [h["env/success_rate"] for h in history]
        axis.plot(steps, success, color="tab:blue", alpha=0.35, label="training rollouts (sampled)")
        window = max(len(success) // 15, 1)
        smooth = [sum(success[max(0, i - window + 1) : i + 1]) / len(success[max(0, i - window + 1) : i + 1])
                  for i in range(len(success))]
        axis.plot(steps, smooth, color="tab:blue", label=f"training, moving mean ({window})")
        end = steps[-1]
    else:
        end = 1
    before, after = results["eval_before_rl"]["success_rate"], results["eval_after_rl"]["success_rate"]
    axis.scatter([0, end], [before, after], color="tab:red", zorder=3,
                 label=f"held-out ({'greedy' if greedy else 'sampled'})")
    axis.annotate(f"{before:.3f}", (0, before), textcoords="offset points", xytext=(5, 5))
    axis.annotate(f"{after:.3f}", (end, after), textcoords="offset points", xytext=(-30, 5))
    axis.set_xlabel("RL step")
    axis.xaxis.set_major_locator(MaxNLocator(integer=True))  # whole steps, also for a short run
    axis.set_ylabel("success rate")
    axis.set_ylim(0, 1)
    axis.set_title(f"{results['method']} on {results['env']} (seed {results['seed']})")
    axis.legend(loc="best")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
