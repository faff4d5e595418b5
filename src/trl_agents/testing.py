"""Offline tiny models for tests and the quickstart: a Qwen2-style model and a locally trained tokenizer.

Nothing here touches the Hub. The tokenizer is a byte-level BPE trained in a second on a small corpus (pass the
prompts your environment renders, so that grid cells and action words become single tokens), with the special
tokens of Qwen2.5 and TRL's own Qwen2.5 chat template, so it behaves like a real chat model's tokenizer:
`<|im_end|>` ends a turn (EOS), `<|endoftext|>` pads.

Example:
    >>> from trl_agents.testing import build_tiny_tokenizer, build_tiny_model
    >>> tokenizer = build_tiny_tokenizer(["up down left right"])
    >>> model = build_tiny_model(tokenizer, hidden_size=32, num_layers=1)
    >>> text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    >>> text.endswith("<|im_start|>assistant\\n")
    True
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from .envs import AgentEnv, register_env

PAD_TOKEN = "<|endoftext|>"
BOS_TURN_TOKEN = "<|im_start|>"
EOS_TOKEN = "<|im_end|>"
# Qwen adds these as non-special tokens, so decoding keeps them (docs/concepts/trl_internals.md, "token hygiene").
MARKUP_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>")

_BASE_CORPUS = (
    "system user assistant You are a helpful assistant.",
    "up down left right Up Down Left Right",
    "<action>up</action> <action>down</action> <action>left</action> <action>right</action>",
    "The quick brown fox jumps over the lazy dog. Answer with exactly one word.",
    "Observation Action Current observation Recent history Invalid action Reply with one of",
    "0 1 2 3 4 5 6 7 8 9 10 # _ O X * P S F H G .",
)


def chat_template() -> str:
    """TRL's Qwen2.5 chat template, byte for byte (TRL recognises it and can parse tool calls with it)."""
    from trl.chat_template_utils import qwen2_5_chat_template

    return qwen2_5_chat_template


def build_tiny_tokenizer(corpus: Iterable[str] = (), vocab_size: int = 1024):
    """Train a byte-level BPE tokenizer on `corpus` (plus a small built-in corpus) and wrap it for transformers.

    Args:
        corpus: Texts the model will see (rendered prompts and actions). Frequent words become single tokens.
        vocab_size: Target vocabulary size, special tokens included. Byte-level BPE always covers any text.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[PAD_TOKEN, BOS_TURN_TOKEN, EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator([*_BASE_CORPUS, *corpus], trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD_TOKEN,
        eos_token=EOS_TOKEN,
        padding_side="left",
        truncation_side="left",
    )
    tokenizer.add_tokens(list(MARKUP_TOKENS))
    tokenizer.chat_template = chat_template()
    return tokenizer


def build_tiny_model(
    tokenizer,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int | None = None,
    max_position_embeddings: int = 4096,
    seed: int = 0,
    architecture: str = "qwen2",
):
    """A randomly initialised Qwen2ForCausalLM sized for CPU tests (about 100k parameters by default);
    `architecture="qwen3"` builds a Qwen3ForCausalLM of the same size instead (the family of the larger shipped
    configs)."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

    from .names import check_choice

    check_choice("architecture", architecture, ("qwen2", "qwen3"))
    config_class, model_class = {"qwen2": (Qwen2Config, Qwen2ForCausalLM), "qwen3": (Qwen3Config, Qwen3ForCausalLM)}[
        architecture]
    config = config_class(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or 2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        **({"head_dim": hidden_size // num_heads} if architecture == "qwen3" else {}),
    )
    torch.manual_seed(seed)
    model = model_class(config)
    model.generation_config = GenerationConfig(
        eos_token_id=[tokenizer.eos_token_id],
        pad_token_id=tokenizer.pad_token_id,
        do_sample=True,
    )
    return model


def save_tiny_model(
    path: str | os.PathLike,
    corpus: Iterable[str] = (),
    vocab_size: int = 1024,
    **model_kwargs,
) -> str:
    """Build a tiny model + tokenizer and save both to `path`, which then loads like any Hub model id.

    A saved directory is what `AgentGRPOTrainer(model=path)` needs when `beta > 0` (TRL re-creates the
    reference model from the model's name or path).
    """
    tokenizer = build_tiny_tokenizer(corpus, vocab_size=vocab_size)
    model = build_tiny_model(tokenizer, **model_kwargs)
    path = os.fspath(path)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def env_corpus(env_name: str, num_tasks: int = 64, max_turns: int = 8, seed: int = 0, **env_kwargs) -> list[str]:
    """Texts an environment shows: instructions and observations of random-action episodes (a tokenizer corpus).

    For an environment with tools (`AgentEnv.tools`), the tool schemas, the task descriptions and the expert's
    episodes instead (random words are not tool calls), so that the calls a warm start teaches tokenize compactly."""
    import json
    import random

    from .envs import get_env_class, make_env
    from .envs.base import plan_of

    rng = random.Random(seed)
    env = make_env(env_name, **env_kwargs)
    texts = [env.instructions]
    tasks = get_env_class(env_name).task_split("train", num_tasks, **env_kwargs)
    if env.tools:
        texts += [json.dumps(tool) for tool in env.tools]
        for task in tasks:
            texts += [env.reset(task), env.task_description()]
            for action in (plan_of(env) or [])[:max_turns]:
                observation, _, done, _ = env.step(action)
                texts += [action, observation]
                if done:
                    break
        env.close()
        return texts
    for task in tasks:
        texts.append(env.reset(task))
        for _ in range(max_turns):
            observation, _, done, _ = env.step(rng.choice(["up", "down", "left", "right", "wait"]))
            texts.append(observation)
            if done:
                break
    return texts


# A CPU-sized training run: a few steps, a high learning rate (so that a tiny model visibly changes), nothing saved or
# reported. Tests and notebooks override what they exercise.
TINY_TRAINING_SETTINGS = {
    "max_steps": 2,
    "per_device_train_batch_size": 8,
    "gradient_accumulation_steps": 1,
    "num_generations": 4,
    "max_completion_length": 4,
    "max_turns": 3,
    "learning_rate": 1e-2,
    "logging_steps": 1,
    "report_to": "none",
    "save_strategy": "no",
    "gradient_checkpointing": False,
    "disable_tqdm": True,
    "seed": 0,
}


def tiny_training_config(config_class, output_dir, **overrides):
    """`config_class` (AgentGRPOConfig or a method's config) with `TINY_TRAINING_SETTINGS` and `overrides`.

    Example:
        >>> from trl_agents import AgentGRPOConfig
        >>> config = tiny_training_config(AgentGRPOConfig, "/tmp/tiny-run", max_turns=2)
        >>> config.max_steps, config.max_turns, config.num_generations
        (2, 2, 4)
    """
    return config_class(output_dir=str(output_dir), **{**TINY_TRAINING_SETTINGS, **overrides})


# ---- an environment that misbehaves on purpose (the fault matrix: tests/rollout/test_faults.py, benchmarks/faults.py) ----

FAULTS = ("raise", "hang", "exit", "nan_reward", "inf_reward", "str_reward", "none_observation", "list_info",
          "int_done")
"""What `FaultyEnv` does at its faulty step: raise, hang (until the pool's timeout), end its process (`exit`: kills a
`process`/`ray` worker; the trainer itself on the thread backend), or return outputs that break the env contract."""


@register_env
class FaultyEnv(AgentEnv):
    """A 3-turn toy task (reward 1 for an answer with the letter "a") whose task row may ask for a fault: `fault`
    (one of `FAULTS`) at turn `fault_step` (default 1) of the first episode that claims the task's `marker` file
    (created atomically: one episode per task and marker, on any backend, in any process).

    Example:
        >>> import os, tempfile
        >>> marker = os.path.join(tempfile.mkdtemp(), "m")
        >>> env = FaultyEnv()
        >>> env.reset({"seed": 0, "fault": "nan_reward", "marker": marker})
        'Round 0 of task 0.'
        >>> env.step("a")[1], env.step("a")[1]  # turn 0 is fine; turn 1 claims the marker
        (1.0, nan)
    """

    name = "test-faulty"
    instructions = "Say something with the letter a."
    task_keys = ("seed",)

    def reset(self, task):
        self.seed, self.turn = task["seed"], 0
        self.fault, self.fault_step, self.marker = task.get("fault"), task.get("fault_step", 1), task.get("marker")
        return f"Round 0 of task {self.seed}."

    def step(self, action_text):
        outputs = {"observation": f"Round {self.turn + 1} of task {self.seed}.",
                   "reward": 1.0 if "a" in action_text else 0.0, "done": self.turn + 1 >= 3}
        outputs["info"] = {"valid": True, "success": outputs["done"] and outputs["reward"] > 0}
        if self.fault and self.turn == self.fault_step and self._claim():
            outputs = self._misbehave(outputs)
        self.turn += 1
        return outputs["observation"], outputs["reward"], outputs["done"], outputs["info"]

    def _claim(self) -> bool:
        try:
            os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            return False
        return True

    def _misbehave(self, outputs):
        import time

        if self.fault == "raise":
            raise RuntimeError("injected fault")
        if self.fault == "hang":
            time.sleep(3600)
        if self.fault == "exit":
            os._exit(7)
        slot, value = {
            "nan_reward": ("reward", float("nan")), "inf_reward": ("reward", float("inf")),
            "str_reward": ("reward", "1.0"), "none_observation": ("observation", None),
            "list_info": ("info", ["valid"]), "int_done": ("done", 1),
        }[self.fault]
        return {**outputs, slot: value}

    def state_key(self):
        return (self.seed, self.turn)




# ---- a batch-invariant generator and a slow environment (per-episode scheduling: tests/rollout/test_scheduler.py,
# benchmarks/async_rollout.py) --------------------------------------------------------------------------------------


def _unit_hash(*parts) -> int:
    import hashlib

    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:8], "big")


class SeededScriptGenerator:
    """A `Generator` whose answer to a prompt depends only on (the prompt's token ids, its request seed): batch
    invariant, so any schedule that gives a turn the same prompt and seed gets the same action.

    The answer is `"<nonce> <action>"` closed with EOS, the action one of `actions` and the nonce a number, both
    chosen by a hash of (prompt, seed); its log-probs are also drawn from the hash. A call on b prompts sleeps
    `call_seconds + seconds_per_prompt * b` (a simulated model: 20 ms + 2 ms per sequence is the tiny model's regime
    on a CPU). `request_level=True` adds `submit(prompt_ids, sampling, seed=None)`: one request at a time, each costing
    `call_seconds + seconds_per_prompt`, concurrently on threads (a continuously batching server).

    Example:
        >>> from trl_agents.rollout import SamplingParams
        >>> tokenizer = build_tiny_tokenizer(["up down left right"])
        >>> generator = SeededScriptGenerator(tokenizer, ["```up```", "```down```"])
        >>> one = generator.generate([[5, 6], [7]], SamplingParams(), seeds=[1, 2])
        >>> two = generator.generate([[7], [9, 9], [5, 6]], SamplingParams(), seeds=[2, 3, 1])
        >>> one.completion_ids == [two.completion_ids[2], two.completion_ids[0]]
        True
    """

    per_request_seeds = True

    def __init__(self, tokenizer, actions, call_seconds: float = 0.0, seconds_per_prompt: float = 0.0,
                 request_level: bool = False):
        import threading

        self.tokenizer = tokenizer
        self.actions = list(actions)
        self.call_seconds, self.seconds_per_prompt = call_seconds, seconds_per_prompt
        self.eos_token_ids = [tokenizer.eos_token_id]
        self.calls: list[int] = []  # the batch size of every call (or 1 per request)
        self.busy_seconds = 0.0  # time spent "computing" (calls may overlap under request_level)
        self.request_level = request_level
        self._lock = threading.Lock()
        self._executor = None

    def _answer(self, prompt, seed):
        key = _unit_hash(tuple(prompt), seed)
        text = f"{key % 997} {self.actions[(key >> 16) % len(self.actions)]}"
        ids = self.tokenizer.encode(text, add_special_tokens=False) + [self.tokenizer.eos_token_id]
        logprobs = [-((key >> (20 + i)) % 1000 + 1) / 1000.0 for i in range(len(ids))]
        return ids, logprobs

    def generate(self, prompts, sampling, seeds=None, roles=None):
        import time

        from .rollout.generators import GenerationOutput

        seconds = self.call_seconds + self.seconds_per_prompt * len(prompts) if prompts else 0.0
        if seconds:
            time.sleep(seconds)
        with self._lock:
            self.calls.append(len(prompts))
            self.busy_seconds += seconds
        seeds = [None] * len(prompts) if seeds is None else list(seeds)
        answers = [self._answer(prompt, seed) for prompt, seed in zip(prompts, seeds, strict=True)]
        return GenerationOutput([ids for ids, _ in answers], [lps for _, lps in answers])

    def submit(self, prompt_ids, sampling, seed=None):
        if not self.request_level:
            raise AttributeError("submit needs SeededScriptGenerator(request_level=True)")
        from concurrent.futures import ThreadPoolExecutor

        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(max_workers=256, thread_name_prefix="seeded-generator")
        return self._executor.submit(self.generate, [list(prompt_ids)], sampling, [seed])


def latency_seconds(key, median: float = 0.1, sigma: float = 1.0, low: float = 0.01, high: float = 2.0) -> float:
    """A step latency drawn from a hash of `key`: clip(lognormal(log median, sigma), low, high) seconds, the same for
    the same key in any process and under any schedule."""
    import math
    from statistics import NormalDist

    unit = (_unit_hash(key) + 0.5) / 2**64
    return min(max(median * math.exp(sigma * NormalDist().inv_cdf(unit)), low), high)


@register_env
class CountdownEnv(AgentEnv):
    """A toy task of exactly `turns` turns (task row `turns`, default 8): each turn asks for a direction word and
    rewards a valid one (`trl_agents.envs.parsing.parse_direction`) with 1/turns; success when every answer was valid.
    Episodes never end early, so a rollout is `turns` turns of every episode (a fixed workload for benchmarks).

    Example:
        >>> env = CountdownEnv()
        >>> env.reset({"seed": 3, "turns": 2})
        'Task 3, turn 1 of 2: name a direction.'
        >>> env.step("```left```")[1:3], env.step("no")[1:3]
        ((0.5, False), (0.0, True))
    """

    name = "test-countdown"
    instructions = "Answer every turn with one direction word (up, down, left or right) in a ``` fenced block."
    task_keys = ("seed",)

    def reset(self, task):
        self.seed, self.turns, self.turn, self.valid = task["seed"], int(task.get("turns", 8)), 0, 0
        return self._observation()

    def _observation(self) -> str:
        return f"Task {self.seed}, turn {self.turn + 1} of {self.turns}: name a direction."

    def step(self, action_text):
        from .envs.parsing import parse_direction

        valid = parse_direction(action_text) is not None
        self.turn += 1
        self.valid += valid
        done = self.turn >= self.turns
        info = {"valid": valid, "success": done and self.valid == self.turns}
        return self._observation(), (1.0 / self.turns) if valid else 0.0, done, info


@register_env
class LatencyEnv(AgentEnv):
    """Another environment (`inner`, by name) whose every step first sleeps a latency drawn from a keyed random
    stream (`latency_seconds`): key = (task, turn, the actions so far), so two schedules that play the same episode
    see the same latencies, and episodes of a task that act differently see independent ones. Sleeping uses no CPU:
    what it measures is the schedule. `median=0` makes it instantaneous; `sigma=0` a constant latency. State keys,
    snapshots and restores are the inner environment's (`supports` says what it has).

    Example:
        >>> env = LatencyEnv(inner="frozenlake", median=0.001)
        >>> env.reset({"seed": 0}).splitlines()[0]
        'P F F F'
        >>> env.step("```right```")[1:3]
        (0.0, False)
    """

    name = "test-latency"

    def __init__(self, inner: str = "frozenlake", median: float = 0.1, sigma: float = 1.0, low: float = 0.01,
                 high: float = 2.0, **inner_kwargs):
        from .envs import make_env

        self.inner = make_env(inner, **inner_kwargs)
        self.latency = {"median": median, "sigma": sigma, "low": low, "high": high}
        self.instructions = self.inner.instructions
        self.tools = getattr(self.inner, "tools", ())
        self.task_keys = getattr(self.inner, "task_keys", ())
        self._task_key, self._actions = "", []

    def reset(self, task):
        import json

        self._task_key = json.dumps(task, sort_keys=True, default=str)
        self._actions = []
        return self.inner.reset(task)

    def task_description(self):
        return self.inner.task_description()

    def step(self, action_text):
        import time

        self._actions.append(action_text)
        if self.latency["median"] > 0:
            time.sleep(latency_seconds((self._task_key, len(self._actions), tuple(self._actions)), **self.latency))
        return self.inner.step(action_text)

    def supports(self, capability: str) -> bool:
        return self.inner.supports(capability)

    def state_key(self):
        return self.inner.state_key()

    def snapshot(self):
        return self.inner.snapshot(), self._task_key, list(self._actions)

    def restore(self, snapshot):
        inner, self._task_key, actions = snapshot
        self._actions = list(actions)
        self.inner.restore(inner)

    def close(self):
        self.inner.close()


# Programs for `python -c PROGRAM ARGS...` that run `trl-agents train ARGS...` with one run-level fault patched in
# (tests/io/test_runlock.py, tests/training/test_preemption.py, benchmarks/faults_run.py).
HELD_OPEN_TRAIN = """
import os, sys, time
from trl_agents import run
plot = run.plot_learning_curve
def held(*args, **kwargs):  # the job stays open (after training) until the file $RELEASE exists
    deadline = time.monotonic() + 600
    while not os.path.exists(os.environ["RELEASE"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return plot(*args, **kwargs)
run.plot_learning_curve = held
from trl_agents.cli import main
main(["train", *sys.argv[1:]])
"""


def failing_save_train(error: str) -> str:
    """A program that runs `trl-agents train` whose `torch.save` of `checkpoint-2/optimizer.pt` writes 2000 bytes and
    then raises `error` (Python source, e.g. `'OSError(errno.ENOSPC, "No space left on device")'`): a disk that
    fills up while a checkpoint is written."""
    return f"""
import errno, os, sys, torch
save = torch.save
def full(obj, f, *args, **kwargs):
    if str(f).endswith(os.path.join("checkpoint-2", "optimizer.pt")):
        with open(f, "wb") as handle:
            handle.write(b"PK" * 1000)
        raise {error}
    return save(obj, f, *args, **kwargs)
torch.save = full
from trl_agents.cli import main
main(["train", *sys.argv[1:]])
"""


def run_fault_case(fault: str, backend: str, output_dir, model, tokenizer, *, num_tasks: int = 4,
                   step_timeout: float | None = 2.0, max_steps: int = 2) -> dict:
    """Train `max_steps` steps of GRPO on `FaultyEnv` tasks whose first episode misbehaves with `fault` (one episode
    per task, in the first rollout), on the env `backend`; return the accounting of the fault matrix.

    Returns:
        {"faults": faults injected (markers claimed), "failed_episodes": episodes recorded with an error,
        "completed": whether training ran all its steps, "expected_episodes" / "recorded_episodes": episodes the
        rollouts played and those the trajectory records hold, "rows_lost": their difference (must be 0),
        "errors": the distinct error messages, "steps_with_nothing_to_train": steps whose rollout left no row to
        train (every group of the faulty rollout keeps one healthy episode: below `min_healthy_episodes`), "error":
        the exception that stopped training, if any}.
    """
    from datasets import Dataset
    from transformers.trainer_callback import PrinterCallback

    from .records import load_trajectories
    from .trainers import AgentGRPOConfig, AgentGRPOTrainer

    output_dir = str(output_dir)
    os.makedirs(output_dir, exist_ok=True)
    markers = [os.path.join(output_dir, f"marker-{i}") for i in range(num_tasks)]
    tasks = [{"env": "test-faulty", "seed": i, "fault": fault, "marker": markers[i]} for i in range(num_tasks)]
    config = tiny_training_config(
        AgentGRPOConfig, os.path.join(output_dir, "run"), env_name="test-faulty", max_steps=max_steps, max_turns=3,
        per_device_train_batch_size=2 * num_tasks, num_generations=2, max_completion_length=4,
        # "inline": the thread backend with one worker and no timeout, whose calls run on the training thread
        env_backend="thread" if backend == "inline" else backend, env_workers=1,
        env_step_timeout=None if backend == "inline" else step_timeout,
    )
    trainer = AgentGRPOTrainer(model=model, args=config, train_dataset=Dataset.from_list(tasks),
                               processing_class=tokenizer)
    trainer.remove_callback(PrinterCallback)  # the matrix reports its own numbers
    error = None
    try:
        trainer.train()
    except Exception as err:  # noqa: BLE001 — reported in the matrix, not raised
        error = f"{type(err).__name__}: {err}"
    finally:
        trainer.env_pool.close()
    rows = load_trajectories(config.output_dir).to_list() if os.path.isdir(
        os.path.join(config.output_dir, "trajectories")) else []
    episodes = {(row["rollout"], row["episode_uid"]) for row in rows}
    logs = [entry for entry in trainer.state.log_history if "train_rows" in entry]
    failed = {(row["rollout"], row["episode_uid"]) for row in rows if row["error"]}
    expected = trainer.state.global_step * 2 * num_tasks if error is None else len(episodes)
    return {
        "faults": sum(os.path.exists(marker) for marker in markers),
        "failed_episodes": len(failed),
        "completed": error is None and trainer.state.global_step == max_steps,
        "expected_episodes": expected,
        "recorded_episodes": len(episodes),
        "rows_lost": expected - len(episodes),
        "errors": sorted({row["error"] for row in rows if row["error"]}),
        "steps_with_nothing_to_train": sum(entry["train_rows"] == 0 for entry in logs),
        "error": error,
    }
