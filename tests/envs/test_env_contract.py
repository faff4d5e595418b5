"""The contract helpers every environment relies on: replay snapshots, `check_env`, `requires`, roles defaults."""

from __future__ import annotations

import random

import pytest

from trl_agents.envs import AgentEnv, make_env, replay_snapshots
from trl_agents.envs.checks import EnvContractError, check_env
from trl_agents.envs.replay import ReplayMismatchError, ReplaySnapshot


class Walk(AgentEnv):
    """A 1-D walk to position 3; 'noise' makes it non-deterministic across resets (for the failure tests)."""

    name = "test-walk"
    task_keys = ("start",)

    def __init__(self, noise=False, bad_action_raises=False, invalid_flag=True):
        self.noise, self.bad_action_raises, self.invalid_flag = noise, bad_action_raises, invalid_flag

    def reset(self, task):
        self.pos = task["start"] + (random.random() if self.noise else 0)
        self.resets = getattr(self, "resets", 0) + 1
        return f"at {self.pos}"

    def step(self, action_text):
        if action_text not in ("+", "-"):
            if self.bad_action_raises:
                raise KeyError(action_text)
            return f"at {self.pos}; say + or -", 0.0, False, {"valid": not self.invalid_flag}
        self.pos += 1 if action_text == "+" else -1
        done = self.pos >= 3
        return f"at {self.pos}", float(done), done, {"valid": True, "success": done}

    def admissible_actions(self):
        return ["+", "-"]


ReplayWalk = replay_snapshots(Walk)


def test_replay_snapshot_restores_by_replaying():
    env = ReplayWalk()
    env.reset({"start": 0})
    env.step("+")
    snap = env.snapshot()
    assert isinstance(snap, ReplaySnapshot) and snap.actions == ("+",) and snap.observation == "at 1"
    env.step("+")
    env.restore(snap)
    assert env.pos == 1 and env.resets == 2
    assert env.step("+")[0] == "at 2"
    # a snapshot survives further restores: replay from it again
    env.restore(snap)
    assert env.snapshot().actions == ("+",)
    assert ReplayWalk.capabilities() == {"snapshot", "restore"} and ReplayWalk.__name__ == "Walk"


def test_replay_detects_non_deterministic_env():
    env = ReplayWalk(noise=True)
    env.reset({"start": 0})
    env.step("+")
    snap = env.snapshot()
    with pytest.raises(ReplayMismatchError, match="deterministic"):
        env.restore(snap)


def test_replay_errors():
    with pytest.raises(TypeError, match="AgentEnv subclass"):
        replay_snapshots(int)
    with pytest.raises(RuntimeError, match="before reset"):
        ReplayWalk().snapshot()
    env = ReplayWalk()
    env.reset({"start": 0})
    with pytest.raises(TypeError, match="ReplaySnapshot"):
        env.restore({"start": 0})


def test_check_env_passes_and_reports():
    report = check_env(ReplayWalk, {"start": 0})
    assert set(report) == {"step_outputs", "determinism", "bad_action", "info_keys", "snapshot_restore"}
    assert "expert_episode" in check_env(ReplayWalk, {"start": 0}, expert_actions=["+", "+", "+"])


@pytest.mark.parametrize(
    "factory, match",
    [
        (lambda: Walk(noise=True), "determinism"),
        (lambda: Walk(bad_action_raises=True), "bad action: .* raised KeyError"),
        (lambda: Walk(invalid_flag=False), "did not set info\\['valid'\\] = False"),
    ],
)
def test_check_env_names_the_broken_property(factory, match):
    with pytest.raises(EnvContractError, match=match):
        check_env(factory, {"start": 0})


def test_check_env_rejects_a_failing_expert():
    with pytest.raises(EnvContractError, match="expert_episode"):
        check_env(Walk, {"start": 0}, expert_actions=["-", "-"])


def test_builtin_envs_pass_the_contract():
    for seed in range(3):
        check_env(lambda: make_env("sokoban"), {"seed": seed})
        check_env(lambda: make_env("frozenlake"), {"seed": seed})
        check_env(lambda: make_env("frozenlake", slippery=True), {"seed": seed}, expert_actions=())


def test_requires_and_roles_defaults():
    class NeedsNothing(Walk):
        requires = ("json",)

    class NeedsMissing(Walk):
        requires = ("json", "no_such_package_xyz")

    assert NeedsNothing.missing_requirements() == []
    assert NeedsMissing.missing_requirements() == ["no_such_package_xyz"]
    assert Walk().current_role() == ""

    class TwoRoles(Walk):
        roles = ("alice", "bob")

    assert TwoRoles().current_role() == "alice" and "roles" in TwoRoles.capabilities()


# ---- step outputs that break the contract: the episode fails, named and recorded; nothing is coerced


class Misbehaving(AgentEnv):
    """Plays like the toy keyword env, except that on task seed 1 its second step returns `bad` in one slot."""

    name = "test-misbehaving"
    task_keys = ("seed",)
    BAD = {"reward": float("nan")}

    def reset(self, task):
        self.seed, self.turn = task["seed"], 0
        return f"Round 0 of task {self.seed}."

    def step(self, action_text):
        if action_text != "go":
            return "Say go.", 0.0, False, {"valid": False}
        self.turn += 1
        outputs = {"observation": f"Round {self.turn}.", "reward": 1.0, "done": self.turn >= 3,
                   "info": {"valid": True, "success": self.turn >= 3}}
        if self.seed == 1 and self.turn == 2:
            outputs.update(self.BAD)
        return outputs["observation"], outputs["reward"], outputs["done"], outputs["info"]


VIOLATIONS = [
    ({"reward": float("nan")}, "reward is nan (it must be a finite number)"),
    ({"reward": float("inf")}, "reward is inf (it must be a finite number)"),
    ({"reward": "1.0"}, "reward is str '1.0' (it must be a finite number)"),
    ({"observation": None}, "observation is None (it must be a str)"),
    ({"observation": 42}, "observation is int 42 (it must be a str)"),
    ({"info": ["valid"]}, "info is list ['valid'] (it must be a dict)"),
    ({"done": 1}, "done is int 1 (it must be a bool)"),
]


@pytest.mark.parametrize(("bad", "expected"), VIOLATIONS)
def test_a_step_that_breaks_the_contract_fails_its_episode_only(bad, expected, tokenizer, scripted, monkeypatch):
    from trl_agents.envs import register_env
    from trl_agents.rollout import PromptRenderer, RolloutEngine, SamplingParams

    register_env(Misbehaving)
    monkeypatch.setattr(Misbehaving, "BAD", bad)
    engine = RolloutEngine(scripted(lambda *args: "go"), PromptRenderer(tokenizer, history_length=0), max_turns=4,
                           sampling=SamplingParams(4))
    tasks = [{"env": "test-misbehaving", "seed": seed} for seed in (0, 1)]
    batch = engine.run(tasks, num_generations=2)
    good, bad_group = batch.groups
    assert all(not t.failed and len(t.steps) == 3 for t in good.trajectories)  # the other task plays on
    for trajectory in bad_group.trajectories:
        assert trajectory.failed and len(trajectory.steps) == 2  # the offending step stays in the record
        assert trajectory.error == (f"environment 'test-misbehaving' broke its contract on task {bad_group.task_id}, "
                                    f"episode {trajectory.episode_id}, step 1: step failed: env contract: {expected}")
    rows = batch.to_rows()
    assert sum(row["error"] is not None for row in rows) == 4  # 2 episodes × 2 recorded steps


@pytest.mark.parametrize(("bad", "expected"), VIOLATIONS)
def test_check_env_names_the_actual_violation(bad, expected, monkeypatch):
    monkeypatch.setattr(Misbehaving, "BAD", bad)
    with pytest.raises(EnvContractError, match=r"^step_outputs: step 1 \('go'\): " + expected.replace("(", r"\(")
                       .replace(")", r"\)").replace("[", r"\[").replace("]", r"\]")):
        check_env(Misbehaving, {"seed": 1}, actions=["go", "go", "go"], expert_actions=())
    assert "step_outputs" in check_env(Misbehaving, {"seed": 0}, actions=["go", "go", "go"], expert_actions=())
