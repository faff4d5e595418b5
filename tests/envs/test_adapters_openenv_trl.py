"""Adapters to OpenEnv (client and server) and to TRL's `environment_factory` (both directions).

OpenEnv: our envs served with openenv-core's server and played by both openenv-core's own client and ours; a
foreign (non trl-agents) OpenEnv server played by ours; the error paths (refused port, silent server, silent
session, bad rows, bad arguments). TRL: tool-call parsing, a TRL tool environment played as an AgentEnv (and trained
with AgentGRPOTrainer), and our Sokoban trained with TRL's own GRPOTrainer through `environment_factory`.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import pytest
from helpers import free_port

from trl_agents.envs import make_env
from trl_agents.envs.adapters.openenv import (
    OpenEnvClient,
    _serve_app_in_thread,
    create_openenv_app,
    default_observation_to_text,
    openenv_types,
    start_openenv_server,
)
from trl_agents.envs.adapters.trl import (
    ToolCallError,
    TRLEnvironment,
    from_trl_environment,
    parse_tool_calls,
    to_trl_environment,
    trl_environment_reward,
)
from trl_agents.envs.checks import check_env
from trl_agents.envs.sokoban import Sokoban

CORRIDOR = "# # # # # # #\n# P X _ _ O #\n# # # # # # #"  # solved by right, right, right


def solver_plan(task):
    env = Sokoban()
    env.reset(task)
    return env.optimal_plan()


def local_episode(task, actions):
    env = Sokoban()
    observations = [env.reset(task)]
    for action in actions:
        observations.append(env.step(action)[0])
    return observations


def tool_call(name, **arguments):
    import json

    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


# ---- OpenEnv: our envs served, played by both clients ---------------------------------------------------------------


@pytest.fixture(scope="module")
def sokoban_server():
    server = start_openenv_server("sokoban")
    yield server
    server.stop()


def test_our_client_plays_the_solver_plan_to_success(sokoban_server):
    task = {"env": "openenv", "seed": 5, "task_id": "sokoban-train-5"}
    plan = solver_plan({"seed": 5})
    expected = local_episode({"seed": 5}, plan)
    env = make_env("openenv", base_url=sokoban_server.base_url)
    try:
        assert env.reset(task) == expected[0]
        assert env.instructions == Sokoban.instructions  # asked from the server's /trl_agents/info
        for t, action in enumerate(plan):
            observation, reward, done, info = env.step(f"<action>{action}</action>")
            assert observation == expected[t + 1]
            assert info["valid"] is True and info["action"] == action and "boxes_on_target" in info
            assert done == (t == len(plan) - 1)
        assert reward == 1.0 and info["success"] is True
        with pytest.raises(RuntimeError, match="over"):
            env.step("up")
        # The same connection serves the next episode.
        assert env.reset({"seed": 6}) == local_episode({"seed": 6}, [])[0]
    finally:
        env.close()


def test_openenv_core_client_plays_our_server(sokoban_server):
    from openenv.core import GenericEnvClient

    plan = solver_plan({"layout": CORRIDOR})
    client = GenericEnvClient(base_url=sokoban_server.base_url).sync()
    with client:
        result = client.reset(layout=CORRIDOR)
        assert result.observation["text"] == CORRIDOR and result.done is False
        result = client.step(openenv_types().action(message=plan[0]))  # the typed action model works too
        assert result.observation["info"]["pushed"] is True and result.reward == 0.0
        for action in plan[1:]:
            result = client.step({"message": action})
        assert result.done is True and result.reward == 1.0 and result.observation["success"] is True
        bad = client.reset(layout=CORRIDOR) and client.step({"message": "jump"})
        assert bad.observation["valid"] is False and "Invalid action" in bad.observation["text"]
        assert client.state()["step_count"] == 1
        with pytest.raises(RuntimeError, match="VALIDATION_ERROR"):
            client.step({"text": "right"})  # not the action model's field


def test_check_env_on_the_openenv_client(sokoban_server):
    task = {"seed": 12}
    report = check_env(lambda: OpenEnvClient(base_url=sokoban_server.base_url), task, expert_actions=solver_plan(task))
    assert {"determinism", "bad_action", "info_keys", "expert_episode"} <= set(report)
    assert "snapshot_restore" not in report  # the protocol has no snapshots, and we do not fake them
    assert OpenEnvClient.capabilities() == frozenset()


def test_replay_snapshots_give_a_deterministic_server_snapshots(sokoban_server):
    from trl_agents.envs import replay_snapshots

    ReplayedClient = replay_snapshots(OpenEnvClient)
    task = {"seed": 12}
    report = check_env(lambda: ReplayedClient(base_url=sokoban_server.base_url), task, expert_actions=solver_plan(task))
    assert "snapshot_restore" in report and ReplayedClient.capabilities() == {"snapshot", "restore"}


def test_sessions_are_isolated_and_rows_may_name_the_server(sokoban_server):
    first, second = make_env("openenv"), make_env("openenv", base_url="http://127.0.0.1:9")  # row url wins
    try:
        first.reset({"layout": CORRIDOR, "base_url": sokoban_server.base_url})
        second.reset({"layout": CORRIDOR, "base_url": sokoban_server.base_url})
        first.step("right")
        assert second.step("left")[0] == CORRIDOR  # blocked move: the second session never saw "right"
        assert first.step("right")[0] == "# # # # # # #\n# _ _ P X O #\n# # # # # # #"
    finally:
        first.close()
        second.close()


def test_task_split_from_a_trl_agents_server(sokoban_server):
    rows = OpenEnvClient.task_split("eval", 2, base_url=sokoban_server.base_url)
    assert rows == [
        {"env": "openenv", "seed": 1_000_000, "task_id": "sokoban-eval-1000000"},
        {"env": "openenv", "seed": 1_000_001, "task_id": "sokoban-eval-1000001"},
    ]
    with pytest.raises(ValueError, match="split"):
        OpenEnvClient.task_split("test", base_url=sokoban_server.base_url)
    with pytest.raises(ValueError, match="base_url"):
        OpenEnvClient.task_split("train")


def test_client_side_action_parsing_rejects_without_sending(sokoban_server):
    def directions_only(text):
        word = text.strip().lower()
        return {"message": word} if word in ("up", "down", "left", "right") else None

    env = OpenEnvClient(base_url=sokoban_server.base_url, action_from_text=directions_only)
    try:
        env.reset({"layout": CORRIDOR})
        observation, reward, done, info = env.step("push it")
        assert info == {"valid": False, "success": False} and reward == 0.0 and not done
        assert observation.startswith("Invalid action.") and observation.endswith(CORRIDOR)
        assert env.step("Right")[0] == "# # # # # # #\n# _ P X _ O #\n# # # # # # #"  # the bad one was not sent
    finally:
        env.close()


def test_bad_rows_and_arguments(sokoban_server):
    env = OpenEnvClient(base_url=sokoban_server.base_url)
    try:
        with pytest.raises(ValueError, match=sokoban_server.base_url):
            env.reset({"size": 6})  # the served Sokoban needs a seed or a layout
        with pytest.raises(ValueError, match="JSON"):
            env.reset({"seed": 1, "extra": object()})
        with pytest.raises(RuntimeError, match="reset"):
            OpenEnvClient(base_url=sokoban_server.base_url).step("up")
    finally:
        env.close()
    with pytest.raises(ValueError, match="base_url"):
        OpenEnvClient().reset({"seed": 0})
    for kwargs, field in [
        ({"base_url": ""}, "base_url"),
        ({"action_from_text": 3}, "action_from_text"),
        ({"observation_to_text": 3}, "observation_to_text"),
        ({"connect_timeout": 0}, "connect_timeout"),
        ({"message_timeout": "1"}, "message_timeout"),
        ({"instructions": 1}, "instructions"),
    ]:
        with pytest.raises(ValueError, match=field):
            OpenEnvClient(**kwargs)
    with pytest.raises(ValueError, match="Unknown environment"):
        create_openenv_app("no-such-env")
    with pytest.raises(ValueError, match="size"):
        create_openenv_app("sokoban", {"size": 3})
    with pytest.raises(ValueError, match="max_concurrent_envs"):
        create_openenv_app("sokoban", max_concurrent_envs=0)


def test_a_full_server_refuses_the_session_clearly():
    with start_openenv_server("sokoban", max_concurrent_envs=1) as server:
        first, second = OpenEnvClient(base_url=server.base_url), OpenEnvClient(base_url=server.base_url)
        try:
            first.reset({"seed": 0})
            with pytest.raises(ConnectionError, match=f"{server.base_url}.*CAPACITY_REACHED.*max_concurrent_envs"):
                second.reset({"seed": 0})
            first.close()  # frees the slot
            assert second.reset({"seed": 0}) == Sokoban().reset({"seed": 0})
        finally:
            first.close()
            second.close()


# ---- OpenEnv: error paths without a (working) server ---------------------------------------------------------------


def test_refused_connection_names_the_url_quickly():
    url = f"http://127.0.0.1:{free_port()}"
    env = OpenEnvClient(base_url=url, connect_timeout=2)
    start = time.perf_counter()
    with pytest.raises(ConnectionError, match=url):
        env.reset({"seed": 0})
    assert time.perf_counter() - start < 2


def test_silent_server_times_out_naming_the_url():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()  # TCP connects, but nobody ever answers the WebSocket handshake
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    try:
        start = time.perf_counter()
        with pytest.raises(ConnectionError, match=f"{url}.*within 0.5 s"):
            OpenEnvClient(base_url=url, connect_timeout=0.5).reset({"seed": 0})
        assert time.perf_counter() - start < 3
    finally:
        listener.close()


def test_silent_session_times_out_naming_the_url():
    from websockets.sync.server import serve

    def ignore_everything(connection):
        for _ in connection:  # accept the session, never answer
            pass

    with serve(ignore_everything, "127.0.0.1", 0) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{server.socket.getsockname()[1]}"
        env = OpenEnvClient(base_url=url, message_timeout=0.3, instructions="")
        start = time.perf_counter()
        with pytest.raises(TimeoutError, match=f"{url}.*reset"):
            env.reset({"seed": 0})
        assert time.perf_counter() - start < 3
        env.close()
        server.shutdown()


# ---- OpenEnv: a foreign server (an OpenEnv env that is not ours) ---------------------------------------------------


@pytest.fixture(scope="module")
def echo_server():
    """An OpenEnv environment written against openenv-core only (like its template echo env)."""
    from openenv.core.env_server.http_server import create_fastapi_app
    from openenv.core.env_server.interfaces import Environment
    from openenv.core.env_server.types import Action, Observation, State

    class EchoAction(Action):
        message: str

    class EchoObservation(Observation):
        echoed_message: str = ""
        message_length: int = 0

    class EchoEnvironment(Environment):
        SUPPORTS_CONCURRENT_SESSIONS = True

        def reset(self, seed=None, episode_id=None, **kwargs):
            self._state = State(episode_id=episode_id, step_count=0)
            return EchoObservation(echoed_message=f"ready {seed}")

        def step(self, action, timeout_s=None, **kwargs):
            self._state.step_count += 1
            done = action.message == "bye"
            return EchoObservation(
                echoed_message=action.message,
                message_length=len(action.message),
                done=done,
                reward=1.0 if done else None,
            )

        @property
        def state(self):
            return self._state

    app = create_fastapi_app(EchoEnvironment, EchoAction, EchoObservation, max_concurrent_envs=8)
    server = _serve_app_in_thread(app, "127.0.0.1", 0, 30.0, label="echo")
    yield server
    server.stop()


def test_client_plays_a_foreign_openenv_server(echo_server):
    env = make_env("openenv", base_url=echo_server.base_url)
    try:
        assert env.reset({"env": "openenv", "seed": 4, "task_id": "x"}) == "ready 4"  # bookkeeping keys not sent
        assert env.instructions == ""  # a foreign server has no trl-agents info route
        observation, reward, done, info = env.step("hello")
        assert (observation, reward, done) == ("hello", 0.0, False)  # a missing reward counts 0
        assert info == {
            "observation": {"echoed_message": "hello", "message_length": 5},
            "valid": True,
            "success": False,
        }
        observation, reward, done, info = env.step("bye")
        assert (reward, done, info["success"]) == (1.0, True, True)  # success = done and reward > 0 (our choice)
        with pytest.raises(NotImplementedError, match="task rows"):
            OpenEnvClient.task_split("train", base_url=echo_server.base_url)
    finally:
        env.close()
    env = OpenEnvClient(base_url=echo_server.base_url, observation_to_text="message_length")
    try:
        env.reset({})
        assert env.step("four")[0] == "4"
    finally:
        env.close()
    assert default_observation_to_text({"board": "x", "n": 1}) == "x"
    assert default_observation_to_text({"a": "x", "b": "y"}) == '{"a": "x", "b": "y"}'


@pytest.mark.slow
def test_agent_grpo_one_iteration_through_openenv(sokoban_server, train_one_iteration):
    tasks = [{"seed": 0}, {"seed": 1}]
    trainer = train_one_iteration("openenv", tasks, env_kwargs={"base_url": sokoban_server.base_url})
    episode = trainer.last_rollout.groups[0].trajectories[0]
    assert episode.steps[0].observation == Sokoban().reset({"seed": 0})


# ---- TRL: tool-call parsing ----------------------------------------------------------------------------------------


def test_parse_tool_calls():
    assert parse_tool_calls("I think it is 3.") == []
    assert parse_tool_calls(tool_call("guess", n=3) + " and " + tool_call("hint")) == [
        {"name": "guess", "arguments": {"n": 3}},
        {"name": "hint", "arguments": {}},
    ]
    assert parse_tool_calls('<tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}</tool_call>') == [
        {"name": "f", "arguments": {"x": 1}}
    ]
    assert parse_tool_calls('<think><tool_call>{"name": "f"}</tool_call></think>final answer') == []
    for text, message in [
        ('<tool_call>{"name": "f"', "not closed"),
        ("<tool_call>{name: f}</tool_call>", "not valid JSON"),
        ('<tool_call>{"arguments": {}}</tool_call>', '"name"'),
        ('<tool_call>{"name": "f", "arguments": [1]}</tool_call>', "object"),
    ]:
        with pytest.raises(ToolCallError, match=message):
            parse_tool_calls(text)


# ---- TRL: a TRL tool environment played as an AgentEnv -------------------------------------------------------------


class CounterEnv:
    """A TRL `environment_factory` class: reach the row's target by adding 1-3 at a time."""

    def reset(self, **row):
        self.target, self.value, self.done = int(row["target"]), 0, False
        return f"Reach {self.target}."

    def add(self, amount: int) -> str:
        """Add to the counter.

        Args:
            amount: How much to add, 1 to 3.
        """
        if self.done:
            raise ValueError("Game over.")
        if not 1 <= amount <= 3:
            raise ValueError("amount must be 1, 2 or 3")
        self.value += amount
        self.done = self.value >= self.target
        return f"Counter: {self.value}"

    async def peek(self) -> str:
        """Look at the counter without changing it."""
        await asyncio.sleep(0)
        return f"Counter: {self.value}"


def counter_reward(environments, completions, prompts, target, **kwargs):
    """1 for landing exactly on the target; records what TRL-style reward functions receive."""
    counter_reward.seen = {"completions": completions, "prompts": prompts, "target": target, "keys": sorted(kwargs)}
    return [1.0 if env.value == env.target else 0.0 for env in environments]


def test_trl_environment_plays_tool_calls():
    env = TRLEnvironment(CounterEnv, reward_funcs=counter_reward)
    assert env.tool_names == ["add", "peek"]
    assert '"name": "add"' in env.instructions and "<tool_call>" in env.instructions
    row = {"env": "trl-environment", "target": 4, "task_id": "t4", "prompt": [{"role": "user", "content": "Hi. "}]}
    assert env.reset(row) == "Hi. Reach 4."  # TRL appends reset's text to the prompt's last message
    observation, reward, done, info = env.step("<think>two then two</think>" + tool_call("add", amount=2))
    assert observation == "<tool_response>\nCounter: 2\n</tool_response>"
    assert (reward, done) == (0.0, False) and info["valid"] is True and info["tools"] == ["add"]
    observation, reward, done, info = env.step(tool_call("peek") + tool_call("add", amount=2))  # async tool too
    assert observation == "<tool_response>\nCounter: 2\n</tool_response>\n<tool_response>\nCounter: 4\n</tool_response>"
    assert (reward, done, info["success"]) == (1.0, True, True)  # `done` attribute ends the episode
    assert counter_reward.seen["target"] == [4] and counter_reward.seen["keys"] == ["task_id"]
    assert counter_reward.seen["prompts"] == [[{"role": "user", "content": "Hi. Reach 4."}]]
    messages = counter_reward.seen["completions"][0]
    assert [m["role"] for m in messages] == ["assistant", "tool", "assistant", "tool", "tool"]
    assert messages[0]["tool_calls"] == [{"type": "function", "function": {"name": "add", "arguments": {"amount": 2}}}]


def test_trl_environment_rejects_bad_calls_without_running_them():
    env = TRLEnvironment(CounterEnv, reward_funcs=counter_reward)
    env.reset({"target": 5})
    for text, feedback in [
        (tool_call("multiply", factor=2), "Unknown tool 'multiply'. Available tools: add, peek."),
        (tool_call("add", amount=1) + tool_call("add", amont=1), "Bad arguments for tool 'add'"),
        ("<tool_call>{'name': 'add'}</tool_call>", "not valid JSON"),
        ('<tool_call>{"name": "add", "arguments": {"amount": 1}}', "not closed"),
    ]:
        observation, reward, done, info = env.step(text)
        assert info["valid"] is False and feedback in observation and observation.startswith("Invalid tool call.")
        assert (reward, done) == (0.0, False)
        assert env.environment.value == 0  # nothing ran, not even the well-formed first call
    # A tool that raises: TRL's error response, an invalid action.
    observation, reward, done, info = env.step(tool_call("add", amount=7))
    assert observation == "<tool_response>\n{'error': 'amount must be 1, 2 or 3'}\n</tool_response>"
    assert info["valid"] is False and info["tool_errors"] == 1 and not done
    # Answering without a tool call ends the episode (TRL's rule); the reward is read then.
    observation, reward, done, info = env.step("I give up.")
    assert done and reward == 0.0 and info["success"] is False and info["valid"] is True


def test_trl_environment_reward_options_and_get_reward():
    class OwnsReward(CounterEnv):
        def get_reward(self):
            return self.value / 10

    env = TRLEnvironment(OwnsReward, reward_at="every_step")  # get_reward alone is a reward source, as in TRL
    env.reset({"target": 3})
    rewards = [env.step(tool_call("add", amount=1))[1] for _ in range(3)]
    assert rewards == pytest.approx([0.1, 0.1, 0.1])  # changes of get_reward, summing to its final value
    env = TRLEnvironment(OwnsReward, reward_funcs=[counter_reward], reward_at="end", end_on_answer=False)
    env.reset({"target": 2})
    assert env.step(tool_call("add", amount=1))[1] == 0.0
    observation, _, done, info = env.step("no tool")
    assert not done and info["valid"] is False and "Call one of the tools" in observation
    assert env.step(tool_call("add", amount=1))[1:3] == (pytest.approx(1.2), True)


def test_trl_environment_bad_arguments():
    class NoDocstring(CounterEnv):
        def hint(self, level: int) -> str:
            return "no"

    class NoReset:
        def act(self, x: int) -> str:
            """Act.

            Args:
                x: A number.
            """

    for kwargs, message in [
        ({"environment_class": 3}, "environment_class"),
        ({"environment_class": "no_such_module_xyz:Env"}, "Cannot import"),
        ({"environment_class": CounterEnv}, "No reward source"),
        ({"environment_class": CounterEnv, "reward_funcs": [3]}, "not callable"),
        ({"environment_class": CounterEnv, "reward_funcs": counter_reward, "reward_at": "later"}, "reward_at"),
        ({"environment_class": CounterEnv, "reward_funcs": counter_reward, "done_attribute": "1x"}, "done_attribute"),
        ({"environment_class": CounterEnv, "reward_funcs": counter_reward, "end_on_answer": "yes"}, "end_on_answer"),
        ({"environment_class": NoDocstring, "reward_funcs": counter_reward}, "Tool `hint`.*docstring"),
        ({"environment_class": NoReset, "reward_funcs": counter_reward}, "reset"),
    ]:
        with pytest.raises(ValueError, match=message):
            TRLEnvironment(**kwargs)
    env = TRLEnvironment(f"{__name__}:CounterEnv", reward_funcs=f"{__name__}:counter_reward")  # import paths
    with pytest.raises(RuntimeError, match="reset"):
        env.step("x")


def test_from_trl_environment_registers_with_snapshots():
    with_splits = from_trl_environment(
        CounterEnv, counter_reward, snapshots="replay", splits={"train": [{"target": 5}, {"target": 7}]}
    )
    assert with_splits.name == "trl:CounterEnv" and {"snapshot", "restore"} <= with_splits.capabilities()
    assert with_splits.task_split("train", 1) == [{"target": 5, "env": "trl:CounterEnv"}]
    env = make_env("trl:CounterEnv", reward_at="end")  # settings bound by name; overridable
    assert env.reward_at == "end"
    plan = [tool_call("add", amount=2), tool_call("add", amount=2), tool_call("add", amount=1)]
    for snapshots in ("replay", "deepcopy"):
        cls = from_trl_environment(CounterEnv, counter_reward, snapshots=snapshots)
        report = check_env(cls, {"target": 5}, expert_actions=plan, bad_action=tool_call("jump"))
        assert {"determinism", "bad_action", "snapshot_restore", "expert_episode"} <= set(report), snapshots
    assert "snapshot" not in from_trl_environment(CounterEnv, counter_reward, name="counter-plain").capabilities()
    with pytest.raises(ValueError, match="Unknown option"):
        from_trl_environment(CounterEnv, counter_reward, reward_timing="end")
    with pytest.raises(ValueError, match="snapshots"):
        from_trl_environment(CounterEnv, counter_reward, snapshots="fork")
    with pytest.raises(ValueError, match="split"):
        with_splits.task_split("eval")
    with pytest.raises(NotImplementedError, match="no task splits"):
        cls.task_split("train")


@pytest.mark.slow
def test_agent_grpo_one_iteration_on_a_trl_environment(train_one_iteration):
    from_trl_environment(CounterEnv, counter_reward, name="trl-counter")
    trainer = train_one_iteration("trl-counter", [{"target": 2}, {"target": 3}], max_completion_length=16)
    trajectories = [t for g in trainer.last_rollout.groups for t in g.trajectories]
    assert len(trajectories) == 4 and all(t.steps for t in trajectories)


# ---- TRL: our environments as environment_factory classes ----------------------------------------------------------


def test_to_trl_environment_plays_sokoban():
    import inspect

    from transformers.utils import get_json_schema

    SokobanTools = to_trl_environment("sokoban")
    tools = [
        n for n, _ in inspect.getmembers(SokobanTools, inspect.isfunction) if n != "reset" and not n.startswith("_")
    ]
    assert tools == ["act"]  # what TRL exposes: exactly one tool, with a schema TRL can build
    env = SokobanTools()
    schema = get_json_schema(env.act)["function"]
    assert schema["name"] == "act" and schema["parameters"]["required"] == ["action"]
    text = env.reset(prompt=[{"role": "user", "content": "Solve it."}], layout=CORRIDOR, env="sokoban")
    assert text.startswith("\n\n" + Sokoban.instructions) and "`act` tool" in text and text.endswith(CORRIDOR)
    feedback = env.act("jump")  # a rejected action is feedback, not an exception
    assert feedback.startswith("Invalid action") and env.num_invalid == 1 and not env.done
    for _ in range(3):
        observation = env.act("right")
    assert observation.endswith("The episode is over: solved.")
    assert (env.episode_return, env.done, env.success, env.num_steps) == (1.0, True, True, 4)
    with pytest.raises(ValueError, match="episode is over"):
        env.act("left")
    assert trl_environment_reward([env, CounterEnv()]) == [1.0, None]
    assert env.reset(seed=3).startswith(Sokoban.instructions)  # no prompt: nothing to separate from
    assert env.episode_return == 0.0 and not env.done
    with pytest.raises(ValueError, match="frozenlake"):
        env.reset(env="frozenlake", seed=3)
    with pytest.raises(ValueError, match="size"):
        to_trl_environment("sokoban", size=3)
    with pytest.raises(ValueError, match="tool_name"):
        to_trl_environment("sokoban", tool_name="reset")
    assert to_trl_environment("sokoban", tool_name="move")().move.__name__ == "move"


@pytest.mark.slow
def test_trl_grpo_trainer_trains_on_sokoban_through_environment_factory(tiny_model, tokenizer, tmp_path):
    """TRL's own GRPOTrainer with environment_factory=to_trl_environment("sokoban"), one step on CPU.

    A random tiny model never writes a parseable tool call (docs/concepts/trl_internals.md, pitfall 5), so its
    `generate` is scripted: in the first generation call, even rows call `act("right")` on a one-push corridor and odd
    rows answer in prose; after a tool response, every row answers in prose. TRL's own tool loop must then run `act`,
    and the reward function must read the solved episodes.
    """
    import torch
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    prompts_seen = []

    def scripted_generate(input_ids=None, attention_mask=None, generation_config=None, **kwargs):
        completions = []
        for row, ids in enumerate(input_ids):
            prompt = tokenizer.decode(ids)
            prompts_seen.append(prompt)
            if "<tool_response>" in prompt:
                text = "Done."
            else:
                text = tool_call("act", action="right") if row % 2 == 0 else "No idea."
            completions.append(tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id])
        width = max(map(len, completions))
        padded = [c + [tokenizer.pad_token_id] * (width - len(c)) for c in completions]
        return torch.cat([input_ids, torch.tensor(padded, dtype=input_ids.dtype)], dim=1)

    tiny_model.generate = scripted_generate
    rows = [{"env": "sokoban", "layout": "# # # # #\n# P X O #\n# # # # #", "task_id": "corridor"}] * 4
    args = GRPOConfig(
        output_dir=str(tmp_path / "grpo"),
        max_steps=1,
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=128,
        learning_rate=1e-2,
        bf16=False,
        use_cpu=True,
        gradient_checkpointing=False,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
    )
    trainer = GRPOTrainer(
        model=tiny_model,
        reward_funcs=trl_environment_reward,
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        environment_factory=to_trl_environment("sokoban"),
    )
    before = [p.detach().clone() for p in tiny_model.parameters()]
    trainer.train()
    assert trainer.state.global_step == 1
    logs = trainer.state.log_history[0]
    assert logs["tools/call_frequency"] == 0.5 and logs["tools/failure_frequency"] == 0.0
    assert logs["rewards/trl_environment_reward/mean"] == 0.5
    assert sorted((e.episode_return, e.num_steps, e.success) for e in trainer.environments) == [
        (0.0, 0, False),
        (0.0, 0, False),
        (1.0, 1, True),
        (1.0, 1, True),
    ]
    # TRL rendered our tool schema and appended reset's text (instructions + grid) to the (empty) user message.
    assert '"name": "act"' in prompts_seen[0] and Sokoban.instructions.splitlines()[0] in prompts_seen[0]
    assert any(not torch.equal(a, b) for a, b in zip(before, tiny_model.parameters()))
