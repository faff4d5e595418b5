"""GRSD's wiring (trainers/grsd.py, its signal phase training/grsd_phase.py) and the judges (trl_agents/judges.py):
judges over a loopback HTTP server, start-up errors, the prompts, the post-rollout pipeline (reflections, judge,
guidance, teacher only on mixed groups), the reflection term over micro-batches, and 2 training steps end to end on
the tiny model.

The modulation math is in tests/methods/grsd/test_grsd_math.py.
"""

from __future__ import annotations

import math
import time

import pytest
import torch
from datasets import Dataset
from helpers import JudgeServer, free_port, train_and_check_moved

from trl_agents.distill.grsd import reflection_token_terms
from trl_agents.judges import (
    CallableJudge,
    EndpointJudge,
    JudgeUnavailable,
    LocalJudge,
    coerce_score,
    parse_score,
)
from trl_agents.testing import tiny_training_config
from trl_agents.trainers import METHODS
from trl_agents.trainers.grsd import GRSDConfig, GRSDTrainer
from trl_agents.training.forward import sequence_logps
from trl_agents.training.grsd_phase import (
    GUIDANCE,
    JUDGE_SCORE,
    REFLECTION,
    STUDENT,
    episode_history,
    reflection_messages,
    reflection_share,
)
from trl_agents.trajectory import PromptParts, Step, Trajectory

TASKS = [{"env": "test-keyword", "seed": s} for s in range(2)]


# ---- a loopback OpenAI-compatible judge server --------------------------------------------------------------------


CHAT = [{"role": "system", "content": "grade"}, {"role": "user", "content": "reflection"}]


# ---- judges -------------------------------------------------------------------------------------------------------


def test_scores_are_parsed_from_the_first_number_on_the_scale():
    assert [parse_score(t) for t in ["3", "Score: 2/3", "0\n", "Grade 4", "-1", "1.5", "", "none"]] == [
        3.0, 2.0, 0.0, None, None, None, None, None]
    assert [coerce_score(v) for v in [2, 2.0, 3.5, True, None, float("nan"), "1"]] == [2.0, 2.0, None, None, None,
                                                                                     None, 1.0]
    judge = CallableJudge(lambda prompts: [1] * (len(prompts) + 1))
    with pytest.raises(ValueError, match="returned 2 answers for 1 prompts"):
        judge([CHAT])


@pytest.mark.parametrize("api", ["chat", "completions"])
def test_endpoint_judge_scores_through_a_loopback_server(api):
    with JudgeServer() as server:
        judge = EndpointJudge(server.url + "/v1/", api=api, timeout=5)
        assert judge.probe() == ["loopback-judge"] and judge.model == "loopback-judge"
        scores = judge([CHAT] * 3)
    assert sorted(scores) == [1.0, 2.0, 3.0]
    path, payload = server.requests[0]
    assert path == f"/v1/{'chat/completions' if api == 'chat' else 'completions'}"
    assert payload["temperature"] == 0.0 and payload["max_tokens"] == 16 and payload["model"] == "loopback-judge"
    assert ("messages" in payload) == (api == "chat")


@pytest.mark.parametrize("mode", ["garbage", "slow", "error"])
def test_a_judge_that_times_out_errs_or_answers_garbage_gives_invalid_scores(mode):
    with JudgeServer(mode, delay=1.0) as server:
        judge = EndpointJudge(server.url, timeout=0.3, workers=4, backoff=0.001, max_backoff=0.001)
        judge.probe()
        start = time.perf_counter()
        assert judge([CHAT] * 4) == [None] * 4
        assert time.perf_counter() - start < 2.0  # the 4 requests ran at once, each cut at 0.3 s
    # a 500 is tried 4 times (the default attempts); a timeout and a garbage answer are not retried
    assert len(server.requests) == (16 if mode == "error" else 4)
    assert judge.last_retries == (12 if mode == "error" else 0)
    if mode != "garbage":
        assert len(judge.last_errors) == 4
    if mode == "error":
        assert all(e == "HTTPError: HTTP Error 500: Internal Server Error (after 4 attempts)" for e in judge.last_errors)


# ---- retries of the endpoint judge: a loaded server's 429/5xx and dropped connections --------------------------


@pytest.fixture
def waits(monkeypatch):
    """The seconds the endpoint judge waits before its retries, recorded instead of slept."""
    import types

    import trl_agents.judges as judges

    recorded = []
    monkeypatch.setattr(judges, "time", types.SimpleNamespace(sleep=recorded.append))
    return recorded


def test_backoff_delays_and_retry_after_headers():
    from datetime import datetime, timezone

    from trl_agents.judges import backoff_delay, parse_retry_after

    # d = min(cap, base·2^retry), the wait d/2·(1 + jitter): base 1, cap 30
    assert [backoff_delay(r, 1.0, 30.0, jitter=0.0) for r in range(7)] == [0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 15.0]
    assert [backoff_delay(r, 1.0, 30.0, jitter=1.0) for r in range(7)] == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    assert backoff_delay(2, 1.0, 30.0, jitter=0.5) == 3.0  # d = 4, 4/2·1.5
    assert backoff_delay(3, 0.25, 30.0, jitter=0.5) == 1.5  # d = 0.25·8 = 2, 2/2·1.5
    assert all(4.0 <= backoff_delay(3, 1.0, 30.0) <= 8.0 for _ in range(50))  # random jitter: within [d/2, d]
    # a Retry-After wins over the exponential wait, capped at max_backoff
    assert [backoff_delay(3, 1.0, 30.0, retry_after=a) for a in (0.0, 7.0, 120.0)] == [0.0, 7.0, 30.0]
    now = datetime(2015, 10, 21, 7, 27, 50, tzinfo=timezone.utc)
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now=now) == 10.0  # 07:28:00 − 07:27:50
    assert parse_retry_after("Wed, 21 Oct 2015 07:27:00 GMT", now=now) == 0.0  # in the past
    assert [parse_retry_after(v) for v in ("120", " 3 ", "-1", "1.5", "later", "", None)] == [
        120.0, 3.0, None, None, None, None, None]


@pytest.mark.parametrize(("fail_status", "retry_after"), [(503, None), (429, "0"), (502, None), (None, None)])
def test_the_endpoint_judge_retries_a_loaded_server(fail_status, retry_after, waits):
    # the first 3 requests fail (503, 429 with Retry-After: 0, 502, or a connection closed without an answer)
    with JudgeServer(fail_first=3, fail_status=fail_status, retry_after=retry_after) as server:
        judge = EndpointJudge(server.url, "loopback-judge", workers=1)
        assert judge([CHAT]) == [2.0]  # the 4th request (of the 4 default attempts) is answered: answers[4 % 3]
    assert len(server.requests) == 4 and judge.last_retries == 3 and judge.last_errors == []
    if retry_after is not None:
        assert waits == [0.0, 0.0, 0.0]  # the server's Retry-After, not the backoff
    else:  # backoff 1 s, doubled, jittered within [d/2, d]: [0.5, 1], [1, 2], [2, 4]
        assert len(waits) == 3 and all(d / 2 <= w <= d for w, d in zip(waits, [1.0, 2.0, 4.0], strict=True)), waits


def test_retries_are_bounded_honour_retry_after_up_to_the_cap_and_the_failure_is_logged(waits, caplog):
    with JudgeServer(fail_first=100, fail_status=429, retry_after="120") as server:
        judge = EndpointJudge(server.url, "loopback-judge", workers=2, attempts=3, max_backoff=30.0)
        with caplog.at_level("WARNING", logger="trl_agents.judges"):
            assert judge([CHAT, CHAT]) == [None, None]
    assert len(server.requests) == 6 and judge.last_retries == 4  # 2 requests × 3 attempts
    assert waits == [30.0] * 4  # Retry-After: 120, capped at max_backoff
    assert judge.last_errors == ["HTTPError: HTTP Error 429: Too Many Requests (after 3 attempts)"] * 2
    (record,) = [r for r in caplog.records if r.name == "trl_agents.judges"]
    assert record.levelname == "WARNING" and "failed 2 of 2 requests (4 retries in all)" in record.getMessage()
    assert "429" in record.getMessage()


@pytest.mark.parametrize("fail_status", [400, 404, 501])
def test_a_client_error_is_not_retried(fail_status, waits):
    with JudgeServer(fail_first=1, fail_status=fail_status) as server:
        judge = EndpointJudge(server.url, "loopback-judge", workers=1)
        assert judge([CHAT]) == [None]
    assert len(server.requests) == 1 and waits == [] and judge.last_retries == 0
    assert judge.last_errors[0].startswith(f"HTTPError: HTTP Error {fail_status}") and "attempts" not in (
        judge.last_errors[0])


def test_a_refused_connection_is_retried_then_reported(waits, caplog):
    judge = EndpointJudge(f"http://127.0.0.1:{free_port()}", "gone", attempts=2, backoff=0.5, max_backoff=0.5)
    with caplog.at_level("WARNING", logger="trl_agents.judges"):
        assert judge([CHAT]) == [None]
    assert len(waits) == 1 and 0.25 <= waits[0] <= 0.5  # one retry, d = min(0.5, 0.5·2^0) = 0.5, jittered
    assert judge.last_errors[0].startswith("URLError") and judge.last_errors[0].endswith("(after 2 attempts)")
    assert "failed 1 of 1 requests" in caplog.text


def test_retry_settings_are_checked():
    with pytest.raises(ValueError, match="attempts must be a whole number >= 1"):
        EndpointJudge("http://127.0.0.1:1", attempts=0)
    with pytest.raises(ValueError, match="backoff must satisfy"):
        EndpointJudge("http://127.0.0.1:1", backoff=5.0, max_backoff=1.0)


def test_an_unreachable_endpoint_fails_the_probe_in_one_line():
    judge = EndpointJudge(f"http://127.0.0.1:{free_port()}")
    with pytest.raises(JudgeUnavailable, match="did not answer GET /v1/models") as info:
        judge.probe(timeout=1.0)
    assert "\n" not in str(info.value)
    with pytest.raises(JudgeUnavailable, match="must start with http"):
        EndpointJudge("localhost:8000")


def test_local_judge_loads_a_transformers_model(tiny_model_dir):
    judge = LocalJudge(tiny_model_dir, max_tokens=3)
    scores = judge([CHAT, CHAT])
    assert len(scores) == 2 and all(s is None or 0 <= s <= 3 for s in scores)
    with pytest.raises(JudgeUnavailable, match="could not be loaded"):
        LocalJudge("/nonexistent/judge-model")


# ---- configuration and start-up ----------------------------------------------------------------------------------


def test_config_errors_are_one_line(tmp_path):
    for overrides, message in [
        ({"grsd_judge": "endpoint"}, "grsd_judge='endpoint' needs grsd_judge_url"),
        ({"grsd_judge": "local"}, "grsd_judge='local' needs grsd_judge_model"),
        ({"grsd_judge": "gpt"}, "grsd_judge must be one of"),
        ({"grsd_lambda": -0.1}, "grsd_lambda must be"),
        ({"grsd_g_max": 0.0}, "grsd_g_max must be"),
        ({"grsd_judge_timeout": 0.0}, "grsd_judge_timeout must be"),
        ({"grsd_obs_chars": 0}, "grsd_obs_chars must be >= 1"),
        ({"grsd_warmdown_steps": -1}, "grsd_warmdown_steps must be"),
        ({"grsd_reflection_max_prompt_tokens": 0}, "grsd_reflection_max_prompt_tokens must be"),
        ({"grsd_student_logprobs": "old"}, "grsd_student_logprobs must be one of"),
        ({"privileged_source": "future"}, "is not used by GRSD"),
        ({"num_iterations": 2}, "on-policy update"),
    ]:
        with pytest.raises(ValueError, match=message) as info:
            tiny_training_config(GRSDConfig, tmp_path, **overrides)
        assert "\n" not in str(info.value)


def test_an_unreachable_endpoint_judge_stops_the_trainer_at_construction(tokenizer, tmp_path):
    config = tiny_training_config(GRSDConfig, tmp_path, grsd_judge="endpoint",
                                  grsd_judge_url=f"http://127.0.0.1:{free_port()}")
    with pytest.raises(ValueError, match="did not answer GET /v1/models") as info:
        # the probe runs before the model is loaded: a model id that does not exist is never reached
        GRSDTrainer(model="no-such/model", args=config, train_dataset=TASKS, processing_class=tokenizer)
    assert "\n" not in str(info.value)


def test_the_judge_follows_the_config(tiny_model, tiny_model_dir, tokenizer, tmp_path):
    from trl_agents.judges import GeneratorJudge

    assert isinstance(make_trainer(tiny_model, tokenizer, tmp_path).judge, GeneratorJudge)  # the policy
    trainer = make_trainer(tiny_model, tokenizer, tmp_path, grsd_judge="local", grsd_judge_model=tiny_model_dir)
    assert isinstance(trainer.judge, LocalJudge)
    with JudgeServer() as server:
        trainer = make_trainer(tiny_model, tokenizer, tmp_path, grsd_judge="endpoint", grsd_judge_url=server.url)
    assert isinstance(trainer.judge, EndpointJudge) and trainer.judge.model == "loopback-judge"


def test_registry_lists_grsd():
    method = METHODS["grsd"]
    assert method.trainer_class is GRSDTrainer and method.paper == "arXiv 2607.28076"
    assert method.signals == ("teacher_logprobs",) and method.env_capabilities == ()  # no env capability needed


# ---- prompts ------------------------------------------------------------------------------------------------------


def test_the_reflection_prompt_cuts_observations_and_turns(tmp_path):
    args = tiny_training_config(GRSDConfig, tmp_path)
    parts = PromptParts("Reach the goal.", "", (), "obs")
    steps = [Step("x" * 1000, f"move {i}", prompt_parts=parts, next_observation="y" * 1000) for i in range(60)]
    trajectory = Trajectory(task={}, steps=steps, success=False)
    system, user = reflection_messages(trajectory, args)
    text = user["content"]
    assert system["role"] == "system" and "Outcome: this episode FAILED." in text
    assert "Reach the goal." in text  # the task: the environment's instructions when it has no task text
    assert "x" * 400 + " [...]" in text and "x" * 401 not in text  # observations cut to 400 characters
    assert "Turn 50 action: move 49" in text and "Turn 51" not in text and "(10 later turns not shown)" in text
    trajectory.success = True
    assert "SUCCEEDED" in reflection_messages(trajectory, args)[1]["content"]
    assert episode_history(Trajectory(task={}, steps=[])) == ""


def test_a_long_reflection_prompt_shows_fewer_turns(tiny_model, tokenizer, tmp_path):
    trainer = make_trainer(tiny_model, tokenizer, tmp_path, grsd_reflection_max_prompt_tokens=400)
    parts = PromptParts("Reach the goal.", "", (), "obs")
    steps = [Step("x" * 50, f"move {i}", prompt_parts=parts) for i in range(20)]
    ids, turns = trainer.grsd_phase.reflection_prompt(Trajectory(task={}, steps=steps))
    assert len(ids) <= 400 and 1 <= turns < 20
    assert f"Turn {turns} action: move {turns - 1}" in tokenizer.decode(ids)
    assert f"Turn {turns + 1} " not in tokenizer.decode(ids)


def test_reflection_shares_cover_the_batch_once():
    batch = list(range(7))
    for chunks in (1, 2, 3, 8):
        shares = [reflection_share(batch, k, chunks) for k in range(chunks)]
        assert [r for share in shares for r in share] == batch and max(map(len, shares)) - min(map(len, shares)) <= 1


# ---- the pipeline after a rollout (scripted generator) -------------------------------------------------------------


def scripted_policy(tokenizer, judge_answer="2"):
    """Env actions: group 0 (rows 0-3) alternates success/failure, group 1 always fails. Reflections, judgements
    and guidance are recognised by their prompts."""

    def policy(prompt, call, row, size):
        text = tokenizer.decode(prompt)
        if "Grade the reflection" in text:
            return judge_answer
        if "Write guidance" in text:
            return "What to do: say a. Mistakes to avoid: b."
        if "numbered points" in text:
            return f"1. Row {row} said {'a' if 'this episode SUCCEEDED' in text else 'b'}."
        return "a" if row < 4 and row % 2 == 0 else "b b"

    return policy


def make_trainer(tiny_model, tokenizer, tmp_path, generator=None, judge=None, **overrides):
    values = {"max_turns": 2, "max_completion_length": 4, "grsd_reflection_max_tokens": 6,
              "grsd_guidance_max_tokens": 6, "grsd_judge_max_tokens": 2, **overrides}
    config = tiny_training_config(GRSDConfig, tmp_path / "out", **values)
    return GRSDTrainer(model=tiny_model, args=config, train_dataset=Dataset.from_list(TASKS * 4),
                       processing_class=tokenizer, generator=generator, judge=judge)


def test_reflections_judge_and_guidance_run_once_each_and_the_teacher_scores_mixed_groups_only(
        tiny_model, tokenizer, scripted, tmp_path):
    generator = scripted(scripted_policy(tokenizer))
    trainer = make_trainer(tiny_model, tokenizer, tmp_path, generator=generator, max_steps=1)
    trainer.train()
    # 2 env turns, then ONE call each for the 8 reflections, the 8 judgements (the policy judge) and 1 guidance
    kinds = []
    for call in generator.calls:
        text = tokenizer.decode(call[0]) if call else ""
        kinds.append("judge" if "Grade the reflection" in text else "guidance" if "Write guidance" in text else
                     "reflect" if "numbered points" in text else "turn")
    assert kinds == ["turn", "turn", "reflect", "judge", "guidance"]
    assert [len(c) for c in generator.calls[2:]] == [8, 8, 1]
    mixed, plain = trainer.last_rollout.groups
    assert {t.success for t in mixed.trajectories} == {True, False} and not any(t.success for t in plain.trajectories)
    for trajectory in mixed.trajectories:
        assert trajectory.steps[0].signals[GUIDANCE].startswith("What to do")
        assert trajectory.steps[-1].signals[JUDGE_SCORE] == 2.0 and trajectory.steps[-1].signals[REFLECTION]
        for step in trajectory.steps:
            assert len(step.signals["teacher_logprobs"]) == len(step.action_ids) == len(step.signals[STUDENT])
    for trajectory in plain.trajectories:
        assert GUIDANCE not in trajectory.steps[0].signals
        assert all("teacher_logprobs" not in s.signals and STUDENT not in s.signals for s in trajectory.steps)
    # the guidance is in the teacher's view, under GRSD's heading, and the reflections of both outcomes in Stage B
    guidance_prompt = tokenizer.decode(generator.calls[4][0])
    assert "Row 0 said a" in guidance_prompt and "Row 1 said b" in guidance_prompt
    view = trainer.model_signals[0].view(trainer.signal_context)
    teacher_text = tokenizer.decode(view.prompt_ids(mixed.trajectories[0], 0))
    assert "[Privileged Skill Information]\nWhat to do: say a." in teacher_text
    log = next(h for h in trainer.state.log_history if "grsd/mixed_groups" in h)
    assert log["grsd/mixed_groups"] == 1 and log["grsd/invalid_judgements"] == 0 and log["grsd/mean_judge_score"] == 2
    assert math.isfinite(log["grsd/mean_modulation"]) and 0.9 - 1e-9 <= log["grsd/mean_modulation"] <= 1.1 + 1e-9
    for name in ("reflection", "judge", "guidance"):
        assert log[f"grsd/{name}_seconds"] >= 0
    assert log["grsd/reflect_loss"] == 0.0  # every score is 2: A_refl = 0, the term runs with a zero value


def test_the_modulation_changes_the_mixed_groups_advantages_only(tiny_model, tokenizer, scripted, tmp_path):
    trainer = make_trainer(tiny_model, tokenizer, tmp_path, generator=scripted(scripted_policy(tokenizer)),
                           max_steps=1, grsd_g_max=3.0, learning_rate=0.0)
    trainer.train()
    mixed, plain = trainer.last_rollout.groups
    from helpers import group_credit

    def grpo(group):
        return group_credit("grpo", group)

    modulated = trainer.compute_advantages([mixed, plain])
    assert modulated[1] == grpo(plain)  # no mix: A unchanged (all failures: zeros)
    base = grpo(mixed)
    changed = [(a, b) for row_a, row_b in zip(base, modulated[0]) for a, b in zip(row_a, row_b)]
    assert any(abs(a - b) > 1e-9 for a, b in changed)
    assert all(a * b > 0 and 0.1 * abs(a) - 1e-9 <= abs(b) <= 2.5 * abs(a) + 1e-9 for a, b in changed)


def test_a_callable_judge_replaces_the_configured_one(tiny_model, tokenizer, scripted, tmp_path):
    seen = []

    def judge(prompts):
        seen.append(len(prompts))
        return [3, "1", None, "nonsense"] * (len(prompts) // 4)

    trainer = make_trainer(tiny_model, tokenizer, tmp_path, generator=scripted(scripted_policy(tokenizer)),
                           judge=judge, max_steps=1)
    trainer.train()
    assert seen == [8]
    log = next(h for h in trainer.state.log_history if "grsd/mixed_groups" in h)
    assert log["grsd/invalid_judgements"] == 4 and log["grsd/mean_judge_score"] == 2.0
    assert math.isfinite(log["grsd/reflect_loss"])
    with pytest.raises(TypeError, match="judge must be callable"):
        make_trainer(tiny_model, tokenizer, tmp_path, judge="gpt-4o-mini")


def test_the_reflection_term_is_the_token_mean_over_the_micro_batches(tiny_model, tokenizer, tmp_path):
    trainer = make_trainer(tiny_model, tokenizer, tmp_path, per_device_train_batch_size=4,
                           gradient_accumulation_steps=2, grsd_reflect_coef=0.5)
    assert trainer.args.steps_per_generation == 2
    batch = [([5, 6, 7], [8, 9], 1.0), ([5, 6], [10, 11, 12], -0.5), ([7], [13], 2.0)]
    trainer._reflection_batch, trainer._reflection_tokens = batch, 6.0
    trainer.model.train()
    total = 0.0
    for step in range(2):
        trainer._step = step
        # the trainer divides each micro-batch's auxiliary loss by the accumulation steps
        total += trainer.compute_auxiliary_loss(trainer.model, {}, None) / trainer.args.gradient_accumulation_steps
    logps, mask = sequence_logps(trainer.model, [p for p, _, _ in batch], [c for _, c, _ in batch],
                                 tokenizer.pad_token_id, trainer.temperature)
    terms = reflection_token_terms(logps, torch.tensor([a for _, _, a in batch]))
    expected = 0.5 * (terms * mask).sum() / mask.sum()  # α·token mean over the 6 reflection tokens
    assert torch.allclose(total, expected, atol=1e-6)
    # sequence_logps equals a direct unpadded forward
    direct = torch.log_softmax(trainer.model(input_ids=torch.tensor([[5, 6, 10, 11, 12]])).logits[0, 1:-1], -1)
    assert torch.allclose(logps[1, :3], direct.gather(-1, torch.tensor([[10], [11], [12]])).squeeze(-1), atol=1e-5)


# ---- end to end on the tiny model -----------------------------------------------------------------------------------




@pytest.mark.slow
def test_grsd_trains_two_steps_with_the_policy_judge(tiny_model, tokenizer, tmp_path):
    trainer = make_trainer(tiny_model, tokenizer, tmp_path)
    logs = train_and_check_moved(trainer)
    for log in logs:
        assert log["grsd/invalid_judgements"] >= 0 and math.isfinite(log["grsd/mixed_groups"])
        assert all(math.isfinite(log[f"grsd/{n}_seconds"]) for n in ("reflection", "judge", "guidance"))
        assert math.isfinite(log["loss"])


@pytest.mark.slow
@pytest.mark.parametrize("row_format", ["step", "conversation"])
def test_grsd_trains_two_steps_with_an_endpoint_judge(row_format, tiny_model, tokenizer, tmp_path):
    with JudgeServer() as server:
        trainer = make_trainer(tiny_model, tokenizer, tmp_path, grsd_judge="endpoint", grsd_judge_url=server.url,
                               row_format=row_format)
        logs = train_and_check_moved(trainer)
    assert server.requests and all(path == "/v1/chat/completions" for path, _ in server.requests)
    for log in logs:
        assert log["grsd/invalid_judgements"] == 0 and 1.0 <= log["grsd/mean_judge_score"] <= 3.0
        assert math.isfinite(log["grsd/reflect_loss"])


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["garbage", "slow"])
def test_training_goes_on_when_every_judgement_is_invalid(mode, tiny_model, tokenizer, tmp_path):
    with JudgeServer(mode, delay=0.5) as server:
        trainer = make_trainer(tiny_model, tokenizer, tmp_path, grsd_judge="endpoint", grsd_judge_url=server.url,
                               grsd_judge_timeout=0.2)
        logs = train_and_check_moved(trainer)
    judged = len(server.requests)
    assert judged > 0
    assert sum(log["grsd/invalid_judgements"] for log in logs) == judged  # every judgement counted as invalid
    # invalid judgements give advantage 0: the reflections stay in the loss's token mean (the reference's rule) and
    # the reflection term is exactly 0
    assert all(log.get("grsd/reflect_loss", 0.0) == 0.0 and "grsd/mean_judge_score" not in log for log in logs)
