"""The fault matrix under a real training run: an environment that raises, hangs, kills its worker or breaks the
env contract fails that episode only — visibly — and training goes on; nothing recorded is lost.

`trl_agents.testing.run_fault_case` trains 2 GRPO steps on 4 tasks × 2 episodes of `FaultyEnv`, one episode per task
misbehaving in the first rollout. The whole matrix (every backend, Ray included) is `benchmarks/faults.py`.
"""

from __future__ import annotations

import pytest

from trl_agents.testing import run_fault_case

CONTRACT = {
    "nan_reward": "reward is nan", "inf_reward": "reward is inf", "str_reward": "reward is str '1.0'",
    "none_observation": "observation is None", "list_info": "info is list", "int_done": "done is int 1",
}
CASES = [("thread", fault) for fault in ("raise", "hang", *CONTRACT)] + [("process", "exit"), ("process", "hang"),
                                                                         ("inline", "nan_reward")]


@pytest.mark.slow
@pytest.mark.parametrize(("backend", "fault"), CASES)
def test_a_faulty_env_fails_its_episodes_only_and_nothing_is_lost(backend, fault, tiny_model, tokenizer, tmp_path):
    result = run_fault_case(fault, backend, tmp_path, tiny_model, tokenizer, step_timeout=1.0)
    assert result["error"] is None and result["completed"], result
    assert result["faults"] == 4 and result["failed_episodes"] == 4, result  # one episode of each task
    assert result["rows_lost"] == 0 and result["recorded_episodes"] == 2 * 2 * 4, result
    expected = {"raise": "RuntimeError: injected fault", "hang": "timed out after 1 s",
                "exit": "exit code 7"}.get(fault) or CONTRACT[fault]
    for message in result["errors"]:
        assert expected in message, message
        if fault in CONTRACT:  # the violation names the environment, the task, the episode and the step
            assert message.startswith("environment 'test-faulty' broke its contract on task ") and (
                ", episode 0, step 1: " in message)
    # The first rollout's groups were each left with one healthy episode: that step updated nothing, the next trained.
    assert result["steps_with_nothing_to_train"] == 1
