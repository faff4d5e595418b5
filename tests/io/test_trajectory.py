"""The data model and its round trip through datasets rows."""

from __future__ import annotations

import pytest

from trl_agents.trajectory import Group, RolloutBatch, Step, Trajectory, task_id


def make_batch():
    steps = [
        Step("o0", "up", prompt_ids=[1, 2], action_ids=[3, 4], action_logprobs=[-0.1, -0.2], state_key=(0, 0),
             info={"valid": True, "moved": False}),
        Step("o1", "jump", prompt_ids=[1, 2, 5], action_ids=[6], action_logprobs=[-1.0], reward=1.0, done=True,
             valid=False, env_ids=[7, 8], info={"valid": False}),
    ]
    good = Trajectory(task={"env": "x", "seed": 1}, steps=steps, success=True, episode_id=0)
    crashed = Trajectory(task={"env": "x", "seed": 1}, steps=[], error="reset failed", episode_id=1)
    other = Trajectory(task={"env": "x", "seed": 2}, steps=[Step("p0", "down", action_ids=[9])], episode_id=0)
    return RolloutBatch([Group(good.task, [good, crashed]), Group(other.task, [other])])


def test_properties():
    batch = make_batch()
    good, crashed = batch.groups[0].trajectories
    assert good.episode_return == 1.0 and good.num_steps == 2 and not good.failed
    assert crashed.failed and batch.groups[0].healthy().trajectories == [good]
    assert len(batch.trajectories) == 3 and batch.groups[0].task_id == task_id({"seed": 1, "env": "x"})
    assert task_id({"task_id": "abc", "seed": 3}) == "abc"


def test_rows_round_trip_through_a_dataset():
    batch = make_batch()
    rows = batch.to_rows(extra={"advantage": [0.5, -0.5, None, 0.0]})
    assert len(rows) == 4  # 2 steps + 1 row for the episode without steps + 1 step
    assert rows[2]["step"] == -1 and rows[2]["error"] == "reset failed"
    assert rows[0]["state_key"] == "(0, 0)" and rows[1]["valid"] is False
    restored = RolloutBatch.from_dataset(batch.to_dataset(extra={"advantage": [0.5, -0.5, None, 0.0]}))
    assert [len(g.trajectories) for g in restored.groups] == [2, 1]
    good = restored.groups[0].trajectories[0]
    original = batch.groups[0].trajectories[0]
    for mine, theirs in zip(good.steps, original.steps, strict=True):
        assert mine.action_ids == theirs.action_ids and mine.prompt_ids == theirs.prompt_ids
        assert mine.env_ids == theirs.env_ids and mine.info == theirs.info and mine.valid == theirs.valid
        assert mine.action_logprobs == pytest.approx(theirs.action_logprobs)
    assert good.success and restored.groups[0].trajectories[1].steps == []
    assert restored.groups[0].trajectories[1].error == "reset failed"


def test_extra_column_length_is_checked():
    with pytest.raises(ValueError, match="extra column 'advantage' has 1 values for 4 rows"):
        make_batch().to_rows(extra={"advantage": [1.0]})
