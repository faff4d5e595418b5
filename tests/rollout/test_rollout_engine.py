"""The turn loop with scripted generators: grouping, batching, stopping, both row formats, failures."""

from __future__ import annotations

import pytest

from trl_agents.envs import AgentEnv, register_env
from trl_agents.envs.frozenlake import FrozenLake
from trl_agents.rollout import EnvPool, PromptRenderer, RolloutEngine, SamplingParams
from trl_agents.training.rows import build_rows

TASKS = [{"env": "frozenlake", "seed": 3}, {"env": "frozenlake", "seed": 11}]


def observation_of(tokenizer, prompt_ids):
    """The last user message of a rendered prompt (with history_length=0 that is the current grid)."""
    text = tokenizer.decode(prompt_ids)
    return text.rsplit("<|im_start|>user\n", 1)[1].split("<|im_end|>", 1)[0]


def solver_action(grid: str) -> str:
    """An optimal FrozenLake move from the grid text alone (the player's cell becomes the start)."""
    layout = grid.replace("S", "F").replace("P", "S")
    env = FrozenLake()
    env.reset({"layout": layout})
    return env.optimal_plan()[0]


def make_engine(generator, tokenizer, row_format="step", max_turns=10, signals=(), **kwargs):
    return RolloutEngine(
        generator,
        PromptRenderer(tokenizer, history_length=kwargs.pop("history_length", 0), **kwargs),
        max_turns=max_turns,
        sampling=SamplingParams(max_new_tokens=4),
        row_format=row_format,
        signals=signals,
    )


def half_solvers(tokenizer):
    """Rows 0-1 of a full 4-episode batch follow the solver; everybody else says 'up' (ineffective at the top)."""

    def policy(prompt_ids, call, row, batch_size):
        if batch_size == 4 and row < 2:
            return solver_action(observation_of(tokenizer, prompt_ids))
        return "up"

    return policy


def test_identical_initial_states_within_a_group(tokenizer, scripted):
    engine = make_engine(scripted(lambda *a: "left"), tokenizer, max_turns=1)
    batch = engine.run(TASKS, num_generations=4)
    assert [len(g.trajectories) for g in batch.groups] == [4, 4]
    for group in batch.groups:
        firsts = {t.steps[0].observation for t in group.trajectories}
        keys = {t.steps[0].state_key for t in group.trajectories}
        assert len(firsts) == 1 and len(keys) == 1
        assert [t.episode_id for t in group.trajectories] == [0, 1, 2, 3]
    assert batch.groups[0].trajectories[0].steps[0].observation != batch.groups[1].trajectories[0].steps[0].observation


def test_finished_episodes_stop_and_one_call_per_turn(tokenizer, scripted):
    generator = scripted(half_solvers(tokenizer))
    engine = make_engine(generator, tokenizer, max_turns=10)
    batch = engine.run(TASKS[:1], num_generations=4)
    trajectories = batch.groups[0].trajectories
    # FrozenLake 4x4 maps need exactly 6 moves (envs/frozenlake/README.md): the two solvers finish after 6 turns.
    assert [t.num_steps for t in trajectories] == [6, 6, 10, 10]
    assert [t.success for t in trajectories] == [True, True, False, False]
    assert trajectories[0].steps[-1].done and trajectories[0].episode_return == 1.0
    # One generation call per turn, for the active episodes only.
    assert [len(call) for call in generator.calls] == [4] * 6 + [2] * 4


def test_step_and_conversation_rows_carry_the_same_action_tokens(tokenizer, scripted):
    batches = {}
    for row_format in ("step", "conversation"):
        generator = scripted(half_solvers(tokenizer))
        batches[row_format] = make_engine(generator, tokenizer, row_format=row_format).run(TASKS[:1], 4)
    step_actions = [[s.action_ids for s in t.steps] for t in batches["step"].trajectories]
    conversation_actions = [[s.action_ids for s in t.steps] for t in batches["conversation"].trajectories]
    assert step_actions == conversation_actions

    groups = batches["conversation"].groups
    advantages = [[[float(i)] * t.num_steps for i, t in enumerate(groups[0].trajectories)]]
    rows = build_rows(groups, advantages, "conversation")
    step_rows = build_rows(batches["step"].groups, advantages, "step")
    assert len(rows) == 4 and len(step_rows) == sum(t.num_steps for t in batches["step"].trajectories)
    for index, trajectory in enumerate(groups[0].trajectories):
        completion, mask = rows.completion_ids[index], rows.env_mask[index]
        trained = [token for token, m in zip(completion, mask, strict=True) if m == 1]
        assert trained == [token for step in trajectory.steps for token in step.action_ids]
        # Environment tokens are masked: they decode to the observations shown to the policy.
        masked_text = tokenizer.decode([token for token, m in zip(completion, mask, strict=True) if m == 0])
        for step in trajectory.steps[1:]:
            assert step.observation in masked_text
        assert set(rows.advantages[index][k] for k, m in enumerate(mask) if m == 1) == {float(index)}
        assert all(rows.advantages[index][k] == 0.0 for k, m in enumerate(mask) if m == 0)


def test_conversation_prompts_are_prefixes_of_each_other(tokenizer, scripted):
    generator = scripted(half_solvers(tokenizer))
    batch = make_engine(generator, tokenizer, row_format="conversation").run(TASKS[:1], 4)
    for trajectory in batch.trajectories:
        for previous, step in zip(trajectory.steps, trajectory.steps[1:]):
            assert step.prompt_ids == previous.prompt_ids + previous.action_ids + previous.env_ids
    # The token-appended conversation equals the chat template rendering of the same conversation.
    trajectory = batch.trajectories[0]
    messages = [{"role": "system", "content": FrozenLake.instructions}]
    for step in trajectory.steps[:3]:
        messages += [{"role": "user", "content": step.observation}, {"role": "assistant", "content": step.action_text}]
    messages.append({"role": "user", "content": trajectory.steps[3].observation})
    rendered = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, return_dict=False)
    assert list(rendered) == trajectory.steps[3].prompt_ids


def test_step_prompts_show_the_history_window(tokenizer, scripted):
    generator = scripted(lambda *a: "up")
    make_engine(generator, tokenizer, max_turns=4, history_length=2).run(TASKS[:1], 2)
    last_prompt = tokenizer.decode(generator.calls[3][0])
    assert last_prompt.count("Action: up") == 2 and "Current observation:" in last_prompt
    first_prompt = tokenizer.decode(generator.calls[0][0])
    assert "Recent history" not in first_prompt


def test_max_prompt_length_drops_old_history(tokenizer, scripted):
    generator = scripted(lambda *a: "up")
    renderer = PromptRenderer(tokenizer, history_length=3)
    grid = FrozenLake().reset(TASKS[0])
    short = len(renderer.step_prompt_ids(FrozenLake.instructions, "", [(grid, "up")], grid))  # room for 1 entry
    engine = make_engine(generator, tokenizer, max_turns=5, history_length=3, max_prompt_length=short)
    batch = engine.run(TASKS[:1], 1)
    assert batch.trajectories[0].num_steps == 5 and not batch.trajectories[0].failed
    assert all(len(p) <= short for call in generator.calls for p in call)
    assert tokenizer.decode(generator.calls[4][0]).count("Action: up") == 1


def test_invalid_actions_are_recorded(tokenizer, scripted):
    batch = make_engine(scripted(lambda *a: "jump"), tokenizer, max_turns=3).run(TASKS[:1], 2)
    steps = batch.trajectories[0].steps
    assert [s.valid for s in steps] == [False, False, False]
    assert steps[1].observation.startswith("Invalid action")
    generator = scripted(lambda *a: "jump")
    make_engine(generator, tokenizer, max_turns=2, history_length=1).run(TASKS[:1], 1)
    assert "Action: jump" in tokenizer.decode(generator.calls[1][0])  # the raw answer when nothing parsed


@register_env
class FlakyEnv(AgentEnv):
    """Crashes on the second step of odd seeds."""

    name = "test-flaky"

    def reset(self, task):
        self.seed, self.turn = task["seed"], 0
        return "start"

    def step(self, action_text):
        self.turn += 1
        if self.seed % 2 and self.turn == 2:
            raise RuntimeError("simulator crashed")
        return f"turn {self.turn}", 0.0, self.turn >= 3, {"valid": True}


def test_a_crashing_env_fails_only_its_episode(tokenizer, scripted):
    engine = make_engine(scripted(lambda *a: "go"), tokenizer, max_turns=5)
    batch = engine.run([{"env": "test-flaky", "seed": 0}, {"env": "test-flaky", "seed": 1}], num_generations=2)
    healthy, crashed = batch.groups
    assert [t.failed for t in healthy.trajectories] == [False, False]
    assert [t.num_steps for t in healthy.trajectories] == [3, 3]
    assert all(t.failed and "simulator crashed" in t.error for t in crashed.trajectories)
    assert [t.num_steps for t in crashed.trajectories] == [2, 2]  # what was recorded is kept
    assert crashed.healthy().trajectories == []


@register_env
class MoodyEnv(AgentEnv):
    """Ignores the task and starts somewhere random: group-relative credit would be meaningless."""

    name = "test-moody"
    count = 0

    def reset(self, task):
        MoodyEnv.count += 1
        return f"start {MoodyEnv.count}"

    def step(self, action_text):
        return "end", 0.0, True, {}


def test_non_deterministic_reset_is_an_error(tokenizer, scripted):
    engine = make_engine(scripted(lambda *a: "go"), tokenizer)
    with pytest.raises(ValueError, match="same task"):
        engine.run([{"env": "test-moody"}], num_generations=2)


def test_env_pool_reuses_instances(tokenizer, scripted):
    pool = EnvPool()
    engine = RolloutEngine(scripted(lambda *a: "up"), PromptRenderer(tokenizer), max_turns=1, env_pool=pool)
    engine.run(TASKS, 2)
    first = {id(env) for envs in pool._free.values() for env in envs}
    engine.run(TASKS, 2)
    assert {id(env) for envs in pool._free.values() for env in envs} == first


def test_recorded_solver_values_follow_the_trajectory(tokenizer, scripted):
    generator = scripted(half_solvers(tokenizer))
    engine = make_engine(generator, tokenizer, max_turns=8, signals=("solver_value",))
    batch = engine.run(TASKS[:1], num_generations=4)
    for trajectory in batch.groups[0].trajectories:
        values = [s.signals["solver_value"] for s in trajectory.steps]
        assert all("solver_value" not in s.info for s in trajectory.steps)  # signals live in step.signals
        assert values[0][0] == 6.0  # 4x4 maps need 6 moves
        for (_, after), (before, _) in zip(values, values[1:]):
            assert after == before  # N(s_{t+1}) of a step is N(s_t) of the next
        if trajectory.success:
            assert [v for v, _ in values] == [6, 5, 4, 3, 2, 1] and values[-1][1] == 0


def test_recorded_verifier_atoms_land_on_the_last_step(tokenizer, scripted):
    from trl_agents.envs import VerifierAtom

    @register_env
    class Verified(FrozenLake):
        name = "test-frozenlake-verified"

        def verify(self):
            return [VerifierAtom("at_goal", "sat" if self.solver_value() == 0 else "unsat", None, [])]

    engine = make_engine(scripted(half_solvers(tokenizer)), tokenizer, max_turns=8, signals=("verifier_atoms",))
    batch = engine.run([{**TASKS[0], "env": "test-frozenlake-verified"}], num_generations=4)
    for trajectory in batch.groups[0].trajectories:
        atoms = trajectory.steps[-1].signals["verifier_atoms"]
        assert atoms == [{"name": "at_goal", "status": "sat" if trajectory.success else "unsat",
                          "witness_step": None, "depends_on": []}]
        assert all("verifier_atoms" not in s.signals for s in trajectory.steps[:-1])
    with pytest.raises(ValueError, match="Unknown signal 'hidden'"):
        RolloutEngine(engine.generator, engine.renderer, signals=("hidden",))
    with pytest.raises(ValueError, match="model signal"):  # computed by the trainer, not recorded by the engine
        RolloutEngine(engine.generator, engine.renderer, signals=("entropy",))


def test_trainer_checks_required_capabilities_at_start_up(tiny_model, tokenizer, tmp_path):
    from trl_agents import AgentGRPOConfig, AgentGRPOTrainer

    class NeedsSolver(AgentGRPOTrainer):
        required_env_capabilities = ("solver_value",)

    config = AgentGRPOConfig(output_dir=str(tmp_path), report_to="none", num_generations=2,
                             per_device_train_batch_size=2, max_steps=1)
    with pytest.raises(ValueError, match="'test-keyword' .* lacks solver_value.*frozenlake"):
        NeedsSolver(model=tiny_model, args=config, train_dataset=[{"env": "test-keyword", "seed": 0}],
                    processing_class=tokenizer)
    NeedsSolver(model=tiny_model, args=config, train_dataset=[{"env": "frozenlake", "seed": 0}],
                processing_class=tokenizer)


def test_verify_runs_once_per_episode_with_its_last_step_and_a_failing_one_fails_the_episode(tokenizer, scripted):
    from trl_agents.envs import VerifierAtom

    calls = []

    @register_env
    class CountedVerify(FrozenLake):
        name = "test-frozenlake-counted-verify"

        def verify(self):
            calls.append(len(calls))
            if self.solver_value() != 0:
                raise RuntimeError("no proof")
            return [VerifierAtom("at_goal", "sat", None, [])]

    engine = make_engine(scripted(half_solvers(tokenizer)), tokenizer, max_turns=8, signals=("verifier_atoms",))
    batch = engine.run([{**TASKS[0], "env": "test-frozenlake-counted-verify"}], num_generations=4)
    trajectories = batch.groups[0].trajectories
    assert len(calls) == len(trajectories)  # once per episode, at its end, not after every step
    for trajectory in trajectories:
        if trajectory.success:
            assert trajectory.steps[-1].signals["verifier_atoms"][0]["status"] == "sat"
        else:  # the unsolved episodes' verify raised: an infrastructure failure of that episode only
            assert trajectory.error == "signal 'verifier_atoms' failed: RuntimeError: no proof"
            assert trajectory.steps[-1].reward == 0.0 and trajectory.steps[-1].done is False  # the step is kept
    assert {t.success for t in trajectories} == {True, False}
