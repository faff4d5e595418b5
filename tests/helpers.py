"""Plain helpers shared by test modules: `from helpers import free_port, checkout_env, assert_close` (pytest's default import mode
puts this folder on sys.path, as for `envs_for_pools`)."""

from __future__ import annotations

import http.server
import json
import math
import os
import socket
import threading
import time
from collections.abc import Mapping
from pathlib import Path

import trl_agents

# The folder holding the trl_agents under test (this checkout's `src`), whatever the installed one is.
PACKAGE_PARENT = str(Path(trl_agents.__file__).resolve().parents[1])


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on (free when this returns; tests may run side by side)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def checkout_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """`env` (default: this process's environment) for a subprocess that must import the trl_agents under test: its
    package folder goes first on PYTHONPATH."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join(path for path in (PACKAGE_PARENT, env.get("PYTHONPATH")) if path)
    return env


def assert_close(actual, expected, tol: float = 1e-4) -> None:
    """Advantages `actual` (one list per trajectory) equal `expected` within `tol`, row lengths included."""
    import pytest

    assert [len(row) for row in actual] == [len(row) for row in expected], actual
    for row_a, row_e in zip(actual, expected, strict=True):
        for a, e in zip(row_a, row_e, strict=True):
            assert a == pytest.approx(e, abs=tol), (actual, expected)


def all_finite(advantages) -> bool:
    """No NaN or infinity in advantages (one list per trajectory)."""
    return all(math.isfinite(a) for row in advantages for a in row)


def group_of(*trajectories):
    """The group of `trajectories`, all of task "t" (the hand-computed credit cases)."""
    from trl_agents.trajectory import Group

    return Group(task={"task_id": "t"}, trajectories=list(trajectories))


def group_credit(name: str, group, **params):
    """The advantages of the credit estimator registered as `name` on ONE group, with `XParams(**params)` (the
    estimators take a batch of groups: this is that batch of one)."""
    from trl_agents.credit import get_estimator

    estimator = get_estimator(name)
    (advantages,), _ = estimator([group], estimator.params(**params))
    return advantages


def group_credit_and_stats(name: str, group, **params):
    """(advantages, the value Σ total / Σ count of each stat) of the estimator `name` on ONE group."""
    from trl_agents.credit import get_estimator, stat_means

    estimator = get_estimator(name)
    (advantages,), stats = estimator([group], estimator.params(**params))
    return advantages, stat_means(stats)


def observation_episode(*steps: tuple, success: bool = False):
    """A trajectory from (state, reward[, valid[, action]]) tuples; the state is the observation (no state_key)."""
    from trl_agents.trajectory import Step, Trajectory

    made = []
    for spec in steps:
        state, reward, valid, action = (*spec, True, None)[:4] if len(spec) == 2 else (*spec, None)[:4]
        made.append(
            Step(observation=state, action_text=action or "act", reward=float(reward), valid=valid,
                 info={"action": action} if action else {})
        )
    return Trajectory(task={"task_id": "t"}, steps=made, success=success)


def train_and_check_moved(trainer, steps: int = 2) -> list[dict]:
    """Train `trainer` (configured for `steps` optimizer steps), assert that it ran them and that some parameter
    moved; return the per-step log entries (those with `env/success_rate`)."""
    import torch

    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    assert trainer.state.global_step == steps
    assert any(not torch.equal(p.detach(), before[n]) for n, p in trainer.model.named_parameters()), "no parameter moved"
    logs = [h for h in trainer.state.log_history if "env/success_rate" in h]
    assert len(logs) == steps
    return logs


def dying_shard_writer(shard: int, exit_code: int = 17) -> str:
    """Python source, to run before a training script in a subprocess, that makes the parquet writer die halfway
    through the `shard`-th shard it writes (1-based): half the bytes written, then `os._exit(exit_code)`, as a crash
    in the middle of a write."""
    return f"""
import io, os
import pyarrow.parquet as pq
real_write_table, shards = pq.write_table, []

def write_then_die(table, where, **kwargs):
    shards.append(where)
    if len(shards) < {shard}:
        return real_write_table(table, where, **kwargs)
    buffer = io.BytesIO()
    real_write_table(table, buffer, **kwargs)
    where.write(buffer.getvalue()[: len(buffer.getvalue()) // 2])
    where.flush()
    os._exit({exit_code})

pq.write_table = write_then_die
"""


# ---- shared by the state-keyed methods' tests (BEPO, ECPO): configs, the start-up check, a scripted FrozenLake run --


def check_method_yaml(path: str, method_name: str, config_class, capability: str | None = None):
    """The YAML config at `path` names `method_name`, parses into its `config_class` through TRL's parser with an env
    and a model, and (when given) that env has `capability`; returns the parsed config."""
    import yaml
    from trl import ModelConfig, TrlParser

    from trl_agents.envs import get_env_class
    from trl_agents.run import RunArguments
    from trl_agents.trainers import get_method

    with open(path) as handle:
        assert yaml.safe_load(handle)["method"] == method_name
    method = get_method(method_name)
    run, config, model = TrlParser((RunArguments, method.config_class, ModelConfig)).parse_args_and_config(
        ["--config", path]
    )
    assert isinstance(config, config_class) and config.env_name and (run.tiny_model or model.model_name_or_path)
    if capability is not None:
        assert capability in get_env_class(config.env_name).capabilities()
    return config


def register_env_without_state_key(name: str, doc: str):
    """Register (once) and return an environment named `name` that has no `state_key` capability."""
    from trl_agents.envs import AgentEnv, get_env_class, register_env

    try:
        return get_env_class(name)
    except ValueError:
        pass

    class NoStateKeyEnv(AgentEnv):
        instructions = "Say anything."
        task_keys = ("seed",)

        def reset(self, task):
            return "start"

        def step(self, action_text):
            return "end", 0.0, True, {"valid": True, "success": False}

    NoStateKeyEnv.name, NoStateKeyEnv.__doc__ = name, doc
    return register_env(NoStateKeyEnv)


# A 3x3 FrozenLake map and 4 scripted episodes of exactly 4 turns (none ends early, so the row index of every
# generation call is the episode): two successes, a truncated detour, and a truncated run that starts invalid.
#   P F H     E0: down right down right   (0,0) (1,0) (1,1) (2,1) -> goal
#   F F F     E1: right down right down   (0,0) (0,1) (1,1) (1,2) -> goal
#   H F G     E2: down right right left   (0,0) (1,0) (1,1) (1,2) -> time-out
#             E3: jump down right up      (0,0) (0,0) (1,0) (1,1) -> time-out
FROZENLAKE_LAYOUT = "SFH\nFFF\nHFG"
FROZENLAKE_PLANS = [["down", "right", "down", "right"], ["right", "down", "right", "down"],
                    ["down", "right", "right", "left"], ["jump", "down", "right", "up"]]


def two_scripted_frozenlake_steps(trainer_class, config_class, tiny_model, tokenizer, scripted, output_dir,
                                  metric: str) -> tuple:
    """Two training steps of `trainer_class` on the scripted FrozenLake episodes above (step rows); asserts that they
    ran and moved a parameter, and that each step's log has `metric`, success 0.5 and length 4; returns (the trainer,
    those logs)."""
    from trl_agents.testing import tiny_training_config

    generator = scripted(lambda prompt, call, row, size: FROZENLAKE_PLANS[row][call % 4])
    config = tiny_training_config(config_class, output_dir, env_name="frozenlake", per_device_train_batch_size=4,
                                  max_turns=4, row_format="step")
    trainer = trainer_class(model=tiny_model, args=config, train_dataset=[{"env": "frozenlake",
                                                                           "layout": FROZENLAKE_LAYOUT}],
                            processing_class=tokenizer, generator=generator)
    logs = [log for log in train_and_check_moved(trainer) if metric in log]
    assert len(logs) == 2
    for log in logs:
        assert log["env/success_rate"] == 0.5 and log["env/episode_length"] == 4.0
    return trainer, logs


# ---- a loopback OpenAI-compatible judge (GRSD's and PATR's judge tests) -------------------------------------


class JudgeServer:
    """`/v1/models`, `/v1/chat/completions`, `/v1/completions` on 127.0.0.1. `mode`: "score" (answers cycle through
    "Score: 1", "2", "3"), "garbage" (no number), "slow" (sleeps `delay` s first), "error" (HTTP 500).

    A loaded server: the first `fail_first` POSTs answer HTTP `fail_status` (with a `Retry-After: retry_after` header
    when given), or, when `fail_status` is None, the connection is closed without an answer. Every POST, failed or
    not, is in `requests`."""

    def __init__(self, mode: str = "score", delay: float = 1.0, *, fail_first: int = 0, fail_status: int | None = 503,
                 retry_after: str | None = None):
        self.mode, self.delay, self.requests = mode, delay, []
        self.fail_first, self.fail_status, self.retry_after = fail_first, fail_status, retry_after
        self.posts, lock = 0, threading.Lock()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, code, body, headers=()):
                data = json.dumps(body).encode()
                self.send_response(code)
                for name, value in headers:
                    self.send_header(name, value)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if self.path == "/v1/models":
                    self._send(200, {"object": "list", "data": [{"id": "loopback-judge", "object": "model"}]})
                else:
                    self._send(404, {"error": "not found"})

            def do_POST(self):
                payload = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append((self.path, payload))
                with lock:
                    fail, server.posts = server.posts < server.fail_first, server.posts + 1
                if fail and server.fail_status is None:
                    self.close_connection = True  # no answer: the client sees the connection closed
                    return None
                if fail:
                    headers = [("Retry-After", server.retry_after)] if server.retry_after is not None else []
                    return self._send(server.fail_status, {"error": "overloaded"}, headers)
                if server.mode == "slow":
                    time.sleep(server.delay)
                if server.mode == "error":
                    return self._send(500, {"error": "boom"})
                answers = ["Score: 1", "2", "3"]
                text = "I cannot tell." if server.mode == "garbage" else answers[len(server.requests) % 3]
                if self.path == "/v1/chat/completions":
                    self._send(200, {"choices": [{"message": {"role": "assistant", "content": text}}]})
                elif self.path == "/v1/completions":
                    self._send(200, {"choices": [{"text": text}]})
                else:
                    self._send(404, {"error": "not found"})

        class Server(http.server.ThreadingHTTPServer):
            request_queue_size = 64  # the judge connects up to 16 at once (socketserver's default backlog is 5)

            def handle_error(self, request, client_address):
                pass  # a client that timed out closed its socket before the slow answer: nothing to report

        self.httpd = Server(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self):
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


# A tiny end-to-end `trl-agents train` run (the CLI's and the resume tests).
TINY_RUN = {
    "method": "gigpo",
    "tiny_model": True,
    "tiny_model_kwargs": {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1, "vocab_size": 400},
    "env_name": "frozenlake",
    "num_train_tasks": 40,
    "num_eval_tasks": 8,
    "max_turns": 4,
    "history_length": 0,
    "system_prompt": "Walk from P to G. Avoid H.",
    "max_completion_length": 3,
    "warm_start_steps": 4,
    "warm_start_tasks": 24,
    "warm_start_val_tasks": 8,
    "warm_start_eval_every": 2,
    "warm_start_batch_size": 16,
    "max_steps": 2,
    "per_device_train_batch_size": 8,
    "num_generations": 4,
    "logging_steps": 1,
    "report_to": "none",
    "save_strategy": "no",
    "gradient_checkpointing": False,
    "disable_tqdm": True,
}


def cli_error_line(capsys, argv) -> str:
    """The one-line error `trl-agents ARGV` exits with (no traceback, no usage dump), asserted as such."""
    import pytest

    from trl_agents.cli import main

    with pytest.raises(SystemExit) as raised:
        main(argv)
    message = str(raised.value.code) if isinstance(raised.value.code, str) else capsys.readouterr().err
    assert "Traceback" not in message and "usage:" not in message, message
    assert len(message.strip().splitlines()) == 1, message
    return message
