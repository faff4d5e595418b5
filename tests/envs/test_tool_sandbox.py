"""The sandboxed tool environments `shell-tasks` and `code-tasks`: the contract, tools offered through the chat
template, expert plans, snapshots, warm-start demonstrations, the TRL adapter, and two training steps end to end.

The sandbox runs with bubblewrap when it is installed (CI installs it), else with `sandbox_backend="none"` (only
the tasks' own expert commands run here)."""

from __future__ import annotations

import json

import pytest

from trl_agents.envs import get_env_class, make_env
from trl_agents.envs.checks import check_env
from trl_agents.envs.sandbox import bubblewrap_available
from trl_agents.envs.adapters.trl import format_tool_call
from trl_agents.envs.tool_sandbox import TOOL_SCHEMAS
from trl_agents.rollout.engine import RolloutEngine
from trl_agents.rollout.env_pool import EnvPool
from trl_agents.rollout.prompts import PromptRenderer

BACKEND = "bwrap" if bubblewrap_available() else "none"
KWARGS = {"sandbox_backend": BACKEND}
FAMILIES = ("shell-tasks", "code-tasks")


def call(name, **arguments):
    return format_tool_call({"name": name, "arguments": arguments})


@pytest.fixture(params=FAMILIES)
def family(request):
    return request.param


@pytest.fixture
def env(family):
    env = make_env(family, **KWARGS)
    yield env
    env.close()


def test_both_families_pass_the_env_contract(family):
    for seed in (0, 1_000_003):
        env = make_env(family, **KWARGS)
        env.reset({"seed": seed})
        plan = env.expert_plan()
        env.close()
        report = check_env(lambda: make_env(family, **KWARGS), {"seed": seed}, expert_actions=plan)
        assert {"determinism", "bad_action", "snapshot_restore", "expert_episode"} <= set(report)


def test_the_expert_solves_every_kind_and_doing_nothing_solves_none(family):
    cls = get_env_class(family)
    env = make_env(family, **KWARGS)
    try:
        for kind in cls.KINDS:
            for seed in (11, 12):
                env.reset({"seed": seed, "kind": kind})
                for action in env.expert_plan():
                    observation, reward, done, info = env.step(action)
                assert (reward, done, info["success"], info["kind"]) == (1.0, True, True, kind), (kind, observation)
                env.reset({"seed": seed, "kind": kind})
                observation, reward, done, info = env.step(call("submit"))
                assert (reward, done, info["success"]) == (0.0, True, False), kind
                assert "hidden check failed" in observation
    finally:
        env.close()


def test_invalid_calls_are_feedback_and_run_nothing(env):
    env.reset({"seed": 5})
    before = env.snapshot()[1]
    for text, feedback in [
        ("I would list the files.", "Call a tool"),
        ('<tool_call>{"name": "bash", "arguments": {"command": "touch x"}', "not closed"),
        ('<tool_call>{"name": "rm", "arguments": {}}</tool_call>', "Unknown tool 'rm'"),
        ('<tool_call>{"name": "bash", "arguments": {"cmd": "touch x"}}</tool_call>', "takes command"),
        ('<tool_call>{"name": "write_file", "arguments": {"path": "x", "content": 3}}</tool_call>', "must be a string"),
        # one bad call rejects the whole turn: the valid first call does not run either
        (call("bash", command="touch x") + call("bash"), "takes command"),
    ]:
        observation, reward, done, info = env.step(text)
        assert observation.startswith("Invalid tool call.") and feedback in observation, observation
        assert (reward, done, info["valid"], info["tools"]) == (0.0, False, False, [])
    assert "x" not in env.files()
    assert env.snapshot()[1] == before or env.files() == sorted(env._task.files)
    assert env.expert_plan() is None  # off the expert's path


def test_tools_report_output_exit_codes_and_timeouts(tmp_path):
    env = make_env("shell-tasks", sandbox_backend=BACKEND, sandbox_limits={"timeout": 1.0}, max_output_chars=200)
    try:
        env.reset({"seed": 2})
        observation, reward, done, info = env.step(call("bash", command="echo hi; echo oops >&2; exit 3"))
        assert observation == "<tool_response>\nhi\noops\n[exit code 3]\n</tool_response>"
        assert (reward, done, info["valid"], info["exit_codes"]) == (0.0, False, True, [3])
        observation, *_ = env.step(call("python", code="print(sum(range(10)))"))
        assert observation == "<tool_response>\n45\n[exit code 0]\n</tool_response>"
        observation, *_ = env.step(call("write_file", path="a/b.txt", content="x" * 10)
                                   + call("bash", command="cat a/b.txt"))
        assert observation == ("<tool_response>\nwrote 10 bytes to a/b.txt\n</tool_response>\n"
                               "<tool_response>\nxxxxxxxxxx\n[exit code 0]\n</tool_response>")
        observation, *_ = env.step(call("bash", command="sleep 30"))
        assert "[timed out after 1 s: every process of the command was killed]" in observation
        observation, *_ = env.step(call("bash", command="seq 1 1000"))
        assert "more characters not shown" in observation and len(observation) < 300
        observation, _, _, info = env.step(call("write_file", path="../escape.txt", content="x"))
        assert "leads out of the working directory" in observation and info["valid"]
    finally:
        env.close()


def test_calls_after_submit_do_not_run(env):
    env.reset({"seed": 4})
    plan = env.expert_plan()
    observation, reward, done, info = env.step("".join(plan) + call("bash", command="rm -rf *"))
    assert (reward, done, info["success"]) == (1.0, True, True)
    assert observation.count("<tool_response>") == len(plan)


def test_a_snapshot_restores_into_a_fresh_env_and_sandbox(env, family):
    env.reset({"seed": 9})
    plan = env.expert_plan()
    env.step(call("bash", command="echo scratch > scratch.txt"))
    snapshot = env.snapshot()
    other = make_env(family, **KWARGS)  # never reset: a fork restores into an env of another episode
    try:
        other.restore(snapshot)
        assert "scratch.txt" in other.files()
        other.restore(snapshot)  # reusable
        assert other.task_description() == env.task_description()
        env.close()
        assert other.expert_plan() is None  # the scratch step left the expert's path
        other.restore((snapshot[0], snapshot[1], False, False, 0))
        for action in plan:
            _, reward, done, info = other.step(action)
        assert (reward, done, info["success"]) == (1.0, True, True)
    finally:
        other.close()


def test_splits_are_disjoint_seeded_rows_and_kinds_can_be_restricted(family):
    cls = get_env_class(family)
    train, held_out = cls.task_split("train", 50, **KWARGS), cls.task_split("eval", 50, **KWARGS)
    assert {r["seed"] for r in train}.isdisjoint(r["seed"] for r in held_out)
    assert train[0] == {"env": family, "seed": 0, "task_id": f"{family}-train-0"}
    kind = cls.KINDS[1]
    env = make_env(family, kinds=[kind], **KWARGS)
    try:
        assert {env.reset(r) and env._task.kind for r in train[:6]} == {kind}
    finally:
        env.close()
    with pytest.raises(ValueError, match="unknown .* kinds"):
        make_env(family, kinds=["no-such-kind"], **KWARGS)
    with pytest.raises(ValueError, match="sandbox limit timeout"):
        make_env(family, sandbox_limits={"timeout": 0}, **KWARGS)


def test_tools_reach_the_prompt_through_the_chat_template(tokenizer, scripted, family):
    # The rollout renders the tool schemas with the template's own `tools=` block (Qwen2.5: "# Tools ... <tools>"),
    # and the prompt parts keep them, so that every view of the step re-renders the same prompt.
    seen = []

    def policy(prompt, *args):
        seen.append(tokenizer.decode(prompt))
        return call("submit")

    engine = RolloutEngine(scripted(policy), PromptRenderer(tokenizer, history_length=0), max_turns=2,
                           env_pool=EnvPool(env_kwargs=KWARGS))
    batch = engine.run([{"env": family, "seed": 1}], num_generations=1)
    prompt = seen[0]
    assert "<tools>" in prompt and all(json.dumps(tool) in prompt for tool in TOOL_SCHEMAS)
    assert prompt.index("<tools>") < prompt.index("<|im_start|>user")  # in the system turn
    parts = batch.trajectories[0].steps[0].prompt_parts
    assert [json.loads(tool) for tool in parts.tools] == list(TOOL_SCHEMAS)


def test_warm_start_demonstrations_carry_the_tools_and_match_the_rollout_prompts(tokenizer, scripted, family):
    from trl_agents.warmstart import solver_demonstrations

    tasks = get_env_class(family).task_split("train", 4, **KWARGS)
    examples = solver_demonstrations(family, tasks, env_kwargs=KWARGS, history_length=1)
    assert all(json.loads(e["tools"]) == list(TOOL_SCHEMAS) for e in examples)
    # The policy answers by looking its prompt up among the demonstrations, rendered as SFTTrainer renders them
    # (the `tools` column passed to the chat template): a KeyError means the warm start trains on other prompts.
    demos = {
        tuple(tokenizer.apply_chat_template(e["prompt"], tools=json.loads(e["tools"]), tokenize=True,
                                            add_generation_prompt=True, return_dict=False)):
        e["completion"][0]["content"]
        for e in examples
    }
    engine = RolloutEngine(scripted(lambda prompt, *a: demos[tuple(prompt)]),
                           PromptRenderer(tokenizer, history_length=1), max_turns=4, env_pool=EnvPool(env_kwargs=KWARGS))
    batch = engine.run(tasks, num_generations=1)
    assert all(t.success for t in batch.trajectories)
    assert sum(t.num_steps for t in batch.trajectories) == len(examples)


def test_trl_environment_factory_offers_the_same_tools(family):
    from trl_agents.envs.adapters.trl import to_trl_environment, trl_environment_reward

    from transformers.utils import get_json_schema

    tools_class = to_trl_environment(family, **KWARGS)
    assert {"bash", "python", "write_file", "submit"} <= set(vars(tools_class)) and "act" not in vars(tools_class)
    game = tools_class()
    try:
        # TRL builds each tool's schema from the bound method: it must be the environment's own
        for schema in TOOL_SCHEMAS:
            rebuilt = get_json_schema(getattr(game, schema["function"]["name"]))
            assert rebuilt["function"]["parameters"] == schema["function"]["parameters"]
        text = game.reset(seed=6)
        assert game.agent_env.task_description() in text
        for action in game.agent_env.expert_plan():
            parsed = json.loads(action.split("<tool_call>\n")[1].split("\n</tool_call>")[0])
            result = getattr(game, parsed["name"])(**parsed["arguments"])
        assert result.endswith("The episode is over: solved.")
        assert trl_environment_reward([game]) == [1.0]
    finally:
        game.agent_env.close()


@pytest.mark.slow
@pytest.mark.parametrize("family_name", FAMILIES)
def test_each_family_trains_two_steps_after_a_warm_start_on_expert_solutions(family_name, tmp_path):
    from datasets import Dataset

    from trl_agents import AgentGRPOConfig, AgentGRPOTrainer
    from trl_agents.testing import build_tiny_model, build_tiny_tokenizer, env_corpus, tiny_training_config
    from trl_agents.warmstart import solver_demonstrations, warm_start

    tokenizer = build_tiny_tokenizer(env_corpus(family_name, num_tasks=16, **KWARGS), vocab_size=512)
    model = build_tiny_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1)
    cls = get_env_class(family_name)
    demos = solver_demonstrations(family_name, cls.task_split("train", 16, **KWARGS), env_kwargs=KWARGS,
                                  history_length=0)
    trainer = warm_start(model, tokenizer, demos, output_dir=str(tmp_path / "warm"), max_steps=3, batch_size=8)
    assert trainer.state.global_step == 3
    config = tiny_training_config(AgentGRPOConfig, tmp_path / "rl", env_name=family_name, env_kwargs=KWARGS,
                                  max_steps=2, max_turns=2, history_length=0, max_completion_length=24,
                                  per_device_train_batch_size=4, num_generations=4)
    rl = AgentGRPOTrainer(model=model, args=config, processing_class=tokenizer,
                          train_dataset=Dataset.from_list(cls.task_split("train", 8, **KWARGS)))
    before = [p.detach().clone() for p in model.parameters()]
    rl.train()
    assert rl.state.global_step == 2
    assert any(not (a == b).all() for a, b in zip(before, model.parameters()))
    # every episode ran in its own sandbox and none was lost to an infrastructure failure
    assert [log["env/failed_episode_rate"] for log in rl.state.log_history if "env/failed_episode_rate" in log] \
        == [0.0, 0.0]
    # the recorded rows carry the tool schemas the prompts were rendered with (TRL's SFTTrainer reads `tools`)
    from datasets import load_dataset

    rows = load_dataset("parquet", data_files=str(tmp_path / "rl" / "trajectories" / "*.parquet"), split="train")
    assert len(rows) > 0 and all(json.loads(value) == list(TOOL_SCHEMAS) for value in rows["tools"])


@pytest.mark.slow
@pytest.mark.parametrize("config", ["grpo_shell_tasks_tiny", "grpo_code_tasks_tiny"])
def test_the_tiny_config_of_each_family_trains_through_the_cli(config, tmp_path):
    import yaml

    from trl_agents.cli import main, packaged_config

    with open(packaged_config(f"{config}.yaml")) as handle:
        env_kwargs = {**yaml.safe_load(handle)["env_kwargs"], **KWARGS}
    main(["train", "--config", config, "--output_dir", str(tmp_path), "--max_steps", "1", "--num_train_tasks", "12",
          "--num_eval_tasks", "4", "--warm_start_steps", "2", "--warm_start_min_steps", "0", "--warm_start_tasks", "8",
          "--warm_start_val_tasks", "4", "--warm_start_eval_every", "2", "--per_device_train_batch_size", "8",
          "--env_kwargs", json.dumps(env_kwargs), "--disable_tqdm", "true"])
    results = json.loads((tmp_path / "eval_results.json").read_text())
    assert results["env"] == config.split("_", 1)[1].rsplit("_", 1)[0].replace("_", "-")
    assert results["eval_before_rl"]["num_tasks"] == results["eval_after_rl"]["num_tasks"] == 4
    assert results["rl_steps"] == 1


@pytest.mark.slow
def test_trl_grpo_trainer_trains_on_shell_tasks_through_environment_factory(tiny_model, tokenizer, tmp_path):
    """TRL's own GRPOTrainer with environment_factory=to_trl_environment("shell-tasks"), one step on CPU: TRL sees
    the environment's tools (bash, python, write_file, submit), runs them in the sandbox, and the reward function
    reads the solved episodes. A random tiny model writes no tool call, so `generate` is scripted: in the first call
    even rows make the task's expert calls and odd rows answer in prose; after tool responses every row answers."""
    import torch
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from trl_agents.envs.adapters.trl import to_trl_environment, trl_environment_reward
    from trl_agents.envs.tool_sandbox import ShellTasks

    rows = ShellTasks.task_split("train", 2, **KWARGS)
    experts = {}
    for row in rows:
        env = make_env("shell-tasks", **KWARGS)
        env.reset(row)
        experts[env.task_description()] = "".join(env.expert_plan())
        env.close()
    prompts_seen = []

    def scripted_generate(input_ids=None, attention_mask=None, generation_config=None, **kwargs):
        completions = []
        for index, ids in enumerate(input_ids):
            prompt = tokenizer.decode(ids)
            prompts_seen.append(prompt)
            if "<tool_response>" in prompt or index % 2:
                text = "Done."
            else:
                text = next(plan for instruction, plan in experts.items() if instruction in prompt)
            completions.append(tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id])
        width = max(map(len, completions))
        padded = [c + [tokenizer.pad_token_id] * (width - len(c)) for c in completions]
        return torch.cat([input_ids, torch.tensor(padded, dtype=input_ids.dtype)], dim=1)

    tiny_model.generate = scripted_generate
    args = GRPOConfig(output_dir=str(tmp_path / "grpo"), max_steps=1, per_device_train_batch_size=4, num_generations=2,
                      max_completion_length=256, learning_rate=1e-2, bf16=False, use_cpu=True,
                      gradient_checkpointing=False, report_to="none", save_strategy="no", logging_steps=1,
                      disable_tqdm=True)
    trainer = GRPOTrainer(model=tiny_model, reward_funcs=trl_environment_reward, args=args,
                          train_dataset=Dataset.from_list(rows * 2), processing_class=tokenizer,
                          environment_factory=to_trl_environment("shell-tasks", **KWARGS))
    trainer.train()
    assert trainer.state.global_step == 1
    assert sorted((e.episode_return, e.success) for e in trainer.environments) == [
        (0.0, False), (0.0, False), (1.0, True), (1.0, True)]
    assert all(f'"name": "{name}"' in prompts_seen[0] for name in ("bash", "python", "write_file", "submit"))
    for environment in trainer.environments:
        environment.agent_env.close()


def test_without_bubblewrap_the_env_fails_at_once_in_one_line_naming_the_package(monkeypatch, family):
    from trl_agents.envs import sandbox

    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None)
    sandbox._bwrap_path.cache_clear()
    try:
        for build in (lambda: make_env(family), lambda: get_env_class(family).task_split("train", 2)):
            with pytest.raises(ValueError, match="install the `bubblewrap` package") as caught:
                build()
            assert "\n" not in str(caught.value) and "sandbox_backend='none'" in str(caught.value)
        make_env(family, sandbox_backend="none").close()  # the explicit choice still works
    finally:
        sandbox._bwrap_path.cache_clear()
