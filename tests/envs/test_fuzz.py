"""Fuzzing with hypothesis: whatever the policy writes, every built-in environment answers within its contract; a
malformed task row or config value is one clear error.

* Action texts — unicode, empty, whitespace, very long, nested or unclosed tags, tool syntax — against every built-in
  environment (each reset once, then restored to the same state before every input): `step` never raises, returns
  (str, finite number, bool, dict) (`envs.checks.step_violation`), and an action the environment rejects
  (`info["valid"] is False`) leaves its state key unchanged.
* Task rows with missing fields or fields of the wrong type: `reset` succeeds or raises a ValueError with a one-line
  message — never a TypeError, KeyError, IndexError, ... from deep inside.
* Config values of the wrong type or out of range: `AgentGRPOConfig` raises a one-line ValueError or TypeError.

The number of inputs tried is printed per test (`pytest -s` shows it) and counted in `INPUTS`.
"""

from __future__ import annotations

import copy
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trl_agents.envs import get_env_class, list_envs
from trl_agents.envs.checks import step_violation

INPUTS: Counter = Counter()
HEAVY = {"alfworld", "textworld", "scienceworld", "webshop", "textcraft"}  # slower steps: fewer inputs each
SPLIT_KWARGS = {"textarena": {"game": "2048-v0"}, "gymnasium": {"env_id": "FrozenLake-v1"}}
TAGS = ["action", "answer", "think", "predict", "env_1", "search", "tool_call"]


def built_in_envs() -> list[str]:
    return sorted(name for name, cls in list_envs().items() if cls.__module__.startswith("trl_agents.envs"))


def tagged(tag: str, inner: str, closed: bool, depth: int) -> str:
    text = inner
    for _ in range(depth):
        text = f"<{tag}>{text}" + (f"</{tag}>" if closed else "")
    return text


ACTION_TEXTS = st.one_of(
    st.text(max_size=80),  # any unicode, the empty string included
    st.sampled_from(["", " ", "\n\n", "\x00", "up" * 3, "search[]", "answer[", "]]]", "<>", "</action>", "💥" * 5]),
    st.builds(tagged, st.sampled_from(TAGS), st.text(max_size=20), st.booleans(), st.integers(1, 4)),
    st.builds(lambda piece, n: piece * n, st.text(min_size=1, max_size=8), st.integers(500, 3000)),  # very long
    st.builds(lambda a, b: f"{a}[{b}]", st.sampled_from(["search", "answer", "click", "buy", "reveal"]),
              st.text(max_size=30)),
)


class Played:
    """One environment per name, reset on its first train task, with a way back to that state."""

    cache: dict[str, tuple] = {}

    @classmethod
    def get(cls, name: str):
        if name not in cls.cache:
            env_cls = get_env_class(name)
            if env_cls.missing_requirements():
                pytest.skip(f"needs {env_cls.missing_requirements()}")
            kwargs = SPLIT_KWARGS.get(name, {})
            try:
                [task] = env_cls.task_split("train", 1, **kwargs)
            except (NotImplementedError, ValueError) as err:
                pytest.skip(f"no built-in task split: {err}")
            env = env_cls(**kwargs)
            try:
                first = env.reset(copy.deepcopy(task))
            except ConnectionError as err:
                pytest.skip(f"needs a server: {err}")
            snapshot = env.snapshot() if env.supports("snapshot") else None
            cls.cache[name] = (env, task, first, snapshot)
        return cls.cache[name]

    @classmethod
    def fresh(cls, name: str):
        env, task, first, snapshot = cls.get(name)
        if snapshot is not None:
            env.restore(snapshot)
        else:
            env.reset(copy.deepcopy(task))
        return env


@pytest.mark.slow
@pytest.mark.parametrize("name", built_in_envs())
def test_any_action_text_is_answered_within_the_contract(name):
    examples = 25 if name in HEAVY else 150

    @settings(max_examples=examples, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(ACTION_TEXTS)
    def play(text):
        INPUTS[name] += 1
        env = Played.fresh(name)
        key = env.state_key() if env.supports("state_key") else None
        try:
            outputs = env.step(text)
        except Exception as err:  # noqa: BLE001 — the contract: an env answers, it does not raise
            raise AssertionError(f"{name}.step({text[:60]!r}) raised {type(err).__name__}: {err}") from err
        assert isinstance(outputs, tuple) and len(outputs) == 4, outputs
        assert step_violation(*outputs) is None, (text[:60], step_violation(*outputs))
        observation, _, _, info = outputs
        if info.get("valid", True) is False:
            assert observation.strip(), f"{name}: a rejected action needs feedback"
            if key is not None:
                assert env.state_key() == key, f"{name}: the rejected action {text[:60]!r} changed the state"

    play()
    print(f"{name}: {INPUTS[name]} action texts")
    assert INPUTS[name] >= examples // 2


TASK_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-10**12, 10**12), st.floats(allow_nan=True),
                        st.text(max_size=12), st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=3),
                                                                                                   st.integers(),
                                                                                                   max_size=2))
CHEAP = ["frozenlake", "sokoban", "minesweeper", "rushhour", "searchqa", "dealnodeal", "telesales", "corridor"]


@pytest.mark.parametrize("name", CHEAP)
def test_a_malformed_task_row_is_one_clear_error(name):
    env_cls = get_env_class(name)
    [good] = env_cls.task_split("train", 1)
    keys = sorted(good)

    @settings(max_examples=60, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(st.dictionaries(st.sampled_from(keys), TASK_VALUES, max_size=len(keys)), st.sets(st.sampled_from(keys)))
    def reset(changes, removed):
        INPUTS[f"{name} tasks"] += 1
        task = {k: v for k, v in {**good, **changes}.items() if k not in removed}
        env = env_cls()
        try:
            observation = env.reset(task)
        except ValueError as err:
            message = str(err)
            assert message and "\n" not in message.strip(), message
            return
        except Exception as err:  # noqa: BLE001
            raise AssertionError(f"{name}.reset({task!r}) raised {type(err).__name__}: {err}") from err
        assert isinstance(observation, str)

    reset()
    print(f"{name}: {INPUTS[f'{name} tasks']} task rows")


CONFIG_FIELDS = {
    "max_turns": st.one_of(st.integers(-5, 0), st.text(max_size=4), st.floats()),
    "history_length": st.one_of(st.integers(-5, -1), st.text(max_size=4)),
    "num_generations": st.integers(-3, 1),
    "topology": st.text(max_size=8),
    "row_format": st.text(max_size=8),
    "env_step_timeout": st.one_of(st.floats(max_value=0), st.text(max_size=3)),
    "teacher_ema_decay": st.one_of(st.floats(min_value=1.0), st.floats(max_value=-1e-9)),
    "min_healthy_episodes": st.integers(-3, 0),
}


def test_a_bad_config_value_is_one_clear_error(tmp_path):
    from trl_agents import AgentGRPOConfig

    @settings(max_examples=150, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(st.sampled_from(sorted(CONFIG_FIELDS)).flatmap(lambda f: st.tuples(st.just(f), CONFIG_FIELDS[f])))
    def build(field_and_value):
        field, value = field_and_value
        INPUTS["config values"] += 1
        try:
            AgentGRPOConfig(str(tmp_path), report_to="none", **{field: value})
        except (ValueError, TypeError) as err:
            message = str(err).strip()
            assert message and "\n" not in message, message
            assert field in message or field.split("_")[0] in message, (field, message)
            return
        raise AssertionError(f"AgentGRPOConfig accepted {field}={value!r}")

    build()
    print(f"config: {INPUTS['config values']} values")
