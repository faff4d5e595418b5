"""The corridor test-bed: rules by hand, solver, splits, the env contract, and the README's signal-to-noise estimate."""

import math

import pytest

from trl_agents.envs import make_env
from trl_agents.envs.checks import check_env
from trl_agents.envs.corridor import WORDS, Corridor, credit_snr, door_of, generate_corridor


def test_the_code_maps_the_ith_word_to_door_i_mod_doors():
    # WORDS = north south east west up down left right; with 3 doors: 0,3,6 -> a; 1,4,7 -> b; 2,5 -> c
    assert [door_of(w, 3) for w in WORDS] == ["a", "b", "c", "a", "b", "c", "a", "b"]
    assert [door_of(w, 2) for w in WORDS] == ["a", "b"] * 4
    assert door_of("right", 8) == "h"


def test_a_walk_by_hand_setbacks_and_the_move_limit():
    env = make_env("corridor", rooms=4, doors=3, setback=2, slack=3)  # 7 moves
    obs = env.reset({"seed": 3})
    signs = generate_corridor(3, 4)
    assert obs == f"room 1 of 4\nsign: {signs[0]}\ndoors: a b c"
    right = [door_of(s, 3) for s in signs]
    wrong = [next(d for d in "abc" if d != r) for r in right]
    assert env.optimal_plan() == right and env.solver_value() == 4
    # rooms 1, 2, 3 right (3 moves), then a wrong door in room 4: back 2 rooms to room 2 (index 1)
    for k in range(3):
        obs, reward, done, info = env.step(right[k])
        assert (reward, done, info["correct"], info["room"]) == (0.0, False, True, k)
    obs, reward, done, info = env.step(wrong[3])
    assert (reward, done, info["correct"], env.state_key()) == (0.0, False, False, 1)
    assert obs.startswith("room 2 of 4")
    # 4 moves used, 3 left, 3 rooms to go: still solvable, exactly
    assert env.solver_value() == 3 and env.optimal_plan() == right[1:]
    env.step(right[1])
    env.step(right[2])
    obs, reward, done, info = env.step(right[3])
    assert (obs, reward, done, info["success"]) == ("The vault opens.", 1.0, True, True)


def test_running_out_of_moves_ends_the_episode_unsolved():
    env = make_env("corridor", rooms=3, doors=2, setback=1, slack=1)  # 4 moves
    env.reset({"seed": 0})
    right = env.optimal_plan()
    wrong = "b" if right[0] == "a" else "a"
    env.step(right[0])                      # room 2, 3 moves left, 2 rooms to go
    env.step("a" if right[1] == "b" else "b")  # wrong: back to room 1, 2 moves left, 3 rooms to go
    assert env.state_key() == 0 and math.isinf(env.solver_value()) and env.optimal_plan() is None
    env.step(wrong)
    obs, reward, done, info = env.step(wrong)
    assert (reward, done, info["success"]) == (0.0, True, False)
    assert obs.startswith("You are out of moves.")
    with pytest.raises(RuntimeError, match="reset"):
        env.step("a")


@pytest.mark.parametrize("answer", ["", "hello", "a or b", "d", "door ab"])
def test_an_answer_without_exactly_one_door_letter_is_invalid_and_free(answer):
    env = make_env("corridor", rooms=3, doors=3)
    env.reset({"seed": 1})
    before = env.snapshot()
    obs, reward, done, info = env.step(answer)
    assert info["valid"] is False and (reward, done) == (0.0, False)
    assert obs.startswith("Invalid answer. Reply with one door letter: a, b, c.")
    assert env.snapshot() == before  # no move spent


def test_answers_are_read_from_the_action_block():
    env = make_env("corridor", rooms=3, doors=3)
    env.reset({"seed": 1})
    right = env.optimal_plan()[0]
    assert env.step(f"<think>a maybe</think><action>{right.upper()}</action>")[3]["correct"] is True


def test_rooms_recur_and_look_the_same():
    env = make_env("corridor", rooms=5, doors=3, setback=5, slack=10)
    first = env.reset({"seed": 7})
    right = env.optimal_plan()
    env.step(right[0])
    env.step("a" if right[1] != "a" else "b")  # wrong in room 2: back to room 1
    assert env.state_key() == 0 and env.render() == first


def test_privileged_context_names_the_right_door():
    env = make_env("corridor", rooms=3, doors=3)
    env.reset({"seed": 2})
    assert env.privileged_context() == f"The door that leads on is {env.optimal_plan()[0]}."


def test_splits_are_seeded_disjoint_and_carry_settings():
    train = Corridor.task_split("train", 5, rooms=6)
    held_out = Corridor.task_split("eval", 5, rooms=6)
    assert [r["seed"] for r in train] == [0, 1, 2, 3, 4]
    assert [r["seed"] for r in held_out] == [1_000_000 + k for k in range(5)]
    assert all(r["rooms"] == 6 and r["env"] == "corridor" for r in train + held_out)
    assert make_env("corridor").reset(train[0]).startswith("room 1 of 6")  # the row's rooms win
    assert len(Corridor.task_split("train")) == 3000


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"rooms": 0}, "`rooms` must be an integer >= 1"),
    ({"doors": 1}, "`doors` must be an integer >= 2"),
    ({"doors": 9}, "`doors`"),
    ({"setback": -1}, "`setback`"),
    ({"slack": 1.5}, "`slack`"),
])
def test_bad_settings_are_one_clear_error(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Corridor(**kwargs)


def test_a_task_without_a_seed_is_a_clear_error():
    with pytest.raises(ValueError, match="needs a 'seed'"):
        make_env("corridor").reset({"layout": "x"})


def test_the_env_contract_holds():
    for seed in range(3):
        report = check_env(lambda: make_env("corridor"), {"seed": seed})
        assert {"step_outputs", "determinism", "bad_action", "info_keys", "snapshot_restore",
                "expert_episode"} <= set(report)


def test_the_snr_estimate_of_the_readme():
    # At p = 0.95 most GRPO groups either all succeed or mix; anchor-state credit still separates right from wrong
    # moves by path length: its SNR is clearly higher, and far fewer of its groups are uninformative.
    high = credit_snr(accuracy=0.95, num_groups=400)
    assert high["anchor_snr"] > 1.15 * high["outcome_snr"] > 0
    assert high["zero_advantage_outcome"] > 2 * high["zero_advantage_anchor"]
    assert 0.8 < high["success_rate"] < 0.95
    # A policy that always picks the right door: every episode takes 20 moves and succeeds; no signal either way.
    perfect = credit_snr(accuracy=1.0, num_groups=20)
    assert perfect["success_rate"] == 1.0 and perfect["zero_advantage_outcome"] == 1.0
    assert perfect["outcome_snr"] == perfect["anchor_snr"] == 0.0


def test_sampled_evaluation_is_seeded_and_leaves_the_training_generator_alone(tiny_model, tokenizer, tmp_path):
    # `eval_temperature` (the test-bed's setting): two evaluations of one model with one seed draw the same numbers
    # (so every method's "before RL" is the same and held-out noise is paired), and the draws of training continue
    # as if no evaluation had run.
    import torch

    from trl_agents import AgentGRPOConfig
    from trl_agents.run import RunArguments, _evaluator
    from trl_agents.testing import tiny_training_config

    config = tiny_training_config(AgentGRPOConfig, tmp_path, env_name="corridor", env_kwargs={"rooms": 3},
                                  max_turns=5, max_completion_length=2, seed=3)
    tasks = Corridor.task_split("eval", 6, rooms=3)
    evaluate = _evaluator(RunArguments(method="grpo", eval_temperature=1.0), config, tokenizer, tasks)
    torch.manual_seed(0)
    expected_next = torch.rand(3)
    torch.manual_seed(0)
    first = evaluate(tiny_model)
    assert torch.equal(torch.rand(3), expected_next)
    second = evaluate(tiny_model)
    assert first == second and first["greedy"] is False and first["num_tasks"] == 6
    greedy = _evaluator(RunArguments(method="grpo"), config, tokenizer, tasks)(tiny_model)
    assert greedy["greedy"] is True
