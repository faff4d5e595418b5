"""Shared test fixtures: offline settings, a temporary HOME, a tiny tokenizer/model, a scripted generator and a toy
text env.

HOME is pointed at a temporary directory before anything else is imported: some third-party environments
(alfworld, textworld, matplotlib) write into $HOME on import or use, and tests must not.
"""

from __future__ import annotations

import os
import tempfile

_REAL_HOME = os.environ.get("HOME", "")
os.environ["HOME"] = tempfile.mkdtemp(prefix="trl-agents-test-home-")
os.environ.pop("TRL_AGENTS_CACHE", None)  # environment caches go under the temporary HOME too


def _home_entries() -> set[str]:
    """Top-level entries of the real HOME and of its .cache (where third-party envs would write)."""
    entries = set()
    for folder in (_REAL_HOME, os.path.join(_REAL_HOME, ".cache")):
        if folder and os.path.isdir(folder):
            entries |= {os.path.join(folder, name) for name in os.listdir(folder)}
    return entries


_HOME_BEFORE = _home_entries()


def pytest_sessionfinish(session, exitstatus):
    """Fail the run if anything appeared in the real HOME: environments must write only to their cache dir."""
    new = sorted(_home_entries() - _HOME_BEFORE)
    if new:
        session.config.pluginmanager.get_plugin("terminalreporter").write_line(
            f"FAILED: the test run wrote into the real HOME: {new}", red=True
        )
        session.exitstatus = 1

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# (imported after the variables above are set)
import random  # noqa: E402
from collections.abc import Sequence  # noqa: E402

import pytest  # noqa: E402

from trl_agents.envs import AgentEnv, register_env  # noqa: E402
from trl_agents.rollout.generators import GenerationOutput, SamplingParams  # noqa: E402


@register_env
class KeywordEnv(AgentEnv):
    """A toy text env for training tests: reward 1 when the answer contains the letter 'a', for `length` turns
    (task field, default 2).

    A random tiny model hits it about half of the time, so groups have reward variance and training moves weights.
    """

    name = "test-keyword"
    instructions = "Say something with the letter a."
    task_keys = ("seed",)

    def reset(self, task):
        self.turn = 0
        self.seed = task["seed"]
        self.length = task.get("length", 2)
        return f"Round 0 of task {self.seed}."

    def step(self, action_text):
        self.turn += 1
        reward = 1.0 if "a" in action_text else 0.0
        done = self.turn >= self.length
        return f"Round {self.turn} of task {self.seed}.", reward, done, {"valid": True, "success": done and reward > 0}

    def state_key(self):
        return (self.seed, self.turn)

    @classmethod
    def task_split(cls, split, count=None, **env_kwargs):
        start = 0 if split == "train" else 10_000
        return [{"env": cls.name, "seed": start + i} for i in range(count or 64)]


class ScriptedGenerator:
    """A `Generator` that answers with scripted texts and records every call.

    `policy(prompt_ids, call_index, row_index, batch_size) -> str` chooses the text; it is tokenised and closed
    with EOS.
    """

    def __init__(self, tokenizer, policy):
        self.tokenizer = tokenizer
        self.policy = policy
        self.eos_token_ids = [tokenizer.eos_token_id]
        self.calls: list[list[list[int]]] = []

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams) -> GenerationOutput:
        self.calls.append([list(p) for p in prompts])
        completion_ids, logprobs = [], []
        for row, prompt in enumerate(prompts):
            text = self.policy(list(prompt), len(self.calls) - 1, row, len(prompts))
            ids = self.tokenizer.encode(text, add_special_tokens=False) + [self.tokenizer.eos_token_id]
            completion_ids.append(ids)
            logprobs.append([-0.5] * len(ids))
        return GenerationOutput(completion_ids, logprobs)


@pytest.fixture(scope="session")
def tokenizer():
    from trl_agents.testing import build_tiny_tokenizer, env_corpus

    corpus = env_corpus("frozenlake", num_tasks=32) + env_corpus("sokoban", num_tasks=16)
    return build_tiny_tokenizer(corpus, vocab_size=512)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tokenizer):
    from trl_agents.testing import build_tiny_model

    path = tmp_path_factory.mktemp("tiny-model")
    model = build_tiny_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture
def tiny_model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir)


@pytest.fixture
def scripted(tokenizer):
    """Factory of ScriptedGenerator for a policy function."""

    def make(policy):
        return ScriptedGenerator(tokenizer, policy)

    return make


@pytest.fixture
def rng():
    return random.Random(0)


@pytest.fixture
def train_one_iteration(tiny_model, tokenizer, tmp_path):
    """Run one AgentGRPOTrainer iteration on `env_name` with the tiny model; returns the trainer.

    Usage: `trainer = train_one_iteration("minesweeper", tasks, env_kwargs={...}, max_turns=3)`. Each task row is
    played by 2 episodes; extra keyword arguments override the AgentGRPOConfig fields.
    """
    from datasets import Dataset

    from trl_agents import AgentGRPOConfig, AgentGRPOTrainer
    from trl_agents.testing import tiny_training_config

    def run(env_name, tasks, env_kwargs=None, **overrides):
        rows = [{"env": env_name, **task} for task in tasks]
        values = {
            "env_name": env_name,
            "env_kwargs": env_kwargs or {},
            "max_steps": 1,
            "per_device_train_batch_size": 2 * len(rows),
            "num_generations": 2,
            "max_completion_length": 8,
            "max_turns": 2,
            **overrides,
        }
        trainer = AgentGRPOTrainer(
            model=tiny_model,
            args=tiny_training_config(AgentGRPOConfig, tmp_path / f"out-{env_name}", **values),
            train_dataset=Dataset.from_list(rows),
            processing_class=tokenizer,
        )
        trainer.train()
        assert trainer.state.global_step == 1
        logs = [h for h in trainer.state.log_history if "env/success_rate" in h]
        assert logs and logs[0]["train_rows"] > 0, logs
        return trainer

    return run


@pytest.fixture
def server_model(tiny_model_dir):
    """The conftest tiny model, loaded for a loopback vLLM server (tests/rollout/test_vllm*.py)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir)


@pytest.fixture
def server(server_model, tokenizer):
    """A loopback vLLM server on `server_model`, with TRL's client patched to speak to it."""
    from trl_agents.loopback import LoopbackVLLMServer, loopback_trl_vllm

    with LoopbackVLLMServer(server_model, tokenizer) as running, loopback_trl_vllm():
        yield running
