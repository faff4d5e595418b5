"""Deal-or-No-Deal: parsing, roles and role rewards, the scripted partner, OpenSpiel agreement, contract checks."""

from __future__ import annotations

import random

import pytest

from trl_agents.envs import make_env
from trl_agents.envs.checks import check_env
from trl_agents.envs.dealnodeal import (
    ROLES,
    DealInstance,
    DealOrNoDeal,
    Move,
    _valid_instances,
    openspiel_instance,
    parse_move,
    sample_instance,
    scripted_proposal,
)

# OpenSpiel's instance 0, written out: pool 1 book, 2 hats, 3 balls; alice values 8/1/0, bob 4/0/2.
TASK = {"pool": [1, 2, 3], "values": {"alice": [8, 1, 0], "bob": [4, 0, 2]}}
BAD = "[Propose: book=9, hat=9, ball=9]"  # plain talk is a valid message here, so the bad action is an impossible offer


# ---- contract checks -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"self_play_reward": "acting"},
        {"opponent": "scripted"},
        {"opponent": "scripted", "agent_role": "bob"},
    ],
)
@pytest.mark.parametrize("task", [{"instance": 5}, {"seed": 11}, TASK])
def test_check_env(kwargs, task):
    report = check_env(lambda: DealOrNoDeal(**kwargs), task, bad_action=BAD)
    assert "expert_episode" in report
    # A longer dialogue with talk for the determinism and snapshot checks.
    dialogue = ["Hello.", "[Propose: book=0, hat=1, ball=1]", "Hmm, let me think.", "[Propose: book=1, hat=0, ball=0]"]
    report = check_env(lambda: DealOrNoDeal(**kwargs), task, actions=dialogue, expert_actions=(), bad_action=BAD)
    assert "snapshot_restore" in report


def test_registered_and_capabilities():
    env = make_env("dealnodeal", opponent="scripted")
    assert isinstance(env, DealOrNoDeal) and env.roles == ("alice", "bob")
    assert {"roles", "snapshot", "restore", "state_key", "privileged_context", "optimal_plan"} <= env.capabilities()


# ---- a hand-played dialogue ----------------------------------------------------------------------------------------


def test_hand_played_dialogue_roles_and_rewards():
    env = DealOrNoDeal()
    observation = env.reset(TASK)
    assert env.current_role() == "alice"
    assert "You are Alice" in observation and "book=8, hat=1, ball=0" in observation
    assert "book=4, hat=0, ball=2" not in observation  # bob's values are private

    turns = [
        ("alice", "Hello Bob, what do you need?", "talk"),
        ("bob", "I want the book and the balls. [Propose: book=1, hat=0, ball=3]", "propose"),
        ("alice", "No way. <think>hats are cheap for me</think>[propose: Book=1, HATS=2, ball=0]", "propose"),
        ("bob", "Fine. [Accept]", "accept"),
    ]
    for i, (role, message, kind) in enumerate(turns):
        assert env.current_role() == role
        observation, reward, done, info = env.step(message)
        assert info["valid"] and info["role"] == role and info["move"] == kind
        assert done == (i == len(turns) - 1)
        if not done:
            assert reward == 0.0 and "role_rewards" not in info
            other = ROLES[1 - ROLES.index(role)]
            assert observation.startswith(f"You are {other.capitalize()}")  # the next role's private view
    # Bob's view after his offer: what alice would get (2 hats) and what it is worth to her (2).
    # Alice keeps the book and 2 hats (8 + 2 = 10), bob gets 3 balls (3 * 2 = 6).
    assert info["success"] is True
    assert info["utilities"] == {"alice": 10, "bob": 6}
    assert info["role_rewards"] == {"alice": 1.0, "bob": 0.6}
    assert info["deal"] == {"alice": {"book": 1, "hat": 2, "ball": 0}, "bob": {"book": 0, "hat": 0, "ball": 3}}
    assert reward == pytest.approx(0.8)  # self-play default: the mean of both roles' rewards
    assert "Alice: No way. [Propose: book=1, hat=2, ball=0]" in observation  # canonical tag, think removed
    with pytest.raises(RuntimeError):
        env.step("[Accept]")


def test_standing_offer_is_described_to_the_other_role():
    env = DealOrNoDeal()
    env.reset(TASK)
    observation, *_ = env.step("[Propose: book=1, hat=0, ball=3]")  # alice keeps 8; bob would get 2 hats = 0 to him
    assert "you would get book=0, hat=2, ball=0, worth 0 to you" in observation
    assert env.admissible_actions()[-1] == "[Accept]"


@pytest.mark.parametrize("self_play_reward,expected", [("mean", 8.0), ("acting", 6.0)])
def test_self_play_reward_modes_and_raw_points(self_play_reward, expected):
    env = DealOrNoDeal(self_play_reward=self_play_reward, normalize_rewards=False)
    env.reset(TASK)
    env.step("[Propose: book=1, hat=2, ball=0]")
    _, reward, done, info = env.step("[Accept]")  # bob accepts: bob is the acting role
    assert done and reward == expected
    assert info["role_rewards"] == {"alice": 10.0, "bob": 6.0}


@pytest.mark.parametrize("max_turns", [2, 4, 10])
def test_no_deal_after_max_turns(max_turns):
    env = DealOrNoDeal(max_turns=max_turns)
    env.reset({"instance": 3})
    for turn in range(max_turns):
        _, reward, done, info = env.step(f"Let us talk ({turn}).")
        assert done == (turn == max_turns - 1)
    assert reward == 0.0 and info["success"] is False and info["deal"] is None
    assert info["role_rewards"] == {"alice": 0.0, "bob": 0.0}
    assert env.optimal_plan() is None


def test_last_message_can_only_accept():
    env = DealOrNoDeal(max_turns=3)
    env.reset(TASK)
    env.step("hi")
    env.step("[Propose: book=0, hat=2, ball=3]")  # bob keeps hats and balls
    assert env.optimal_plan() == ["[Accept]"]  # one message left: a new proposal could not be answered
    _, _, done, info = env.step("[Accept]")
    assert done and info["role_rewards"] == {"alice": 0.8, "bob": 0.6}


# ---- parsing -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text,expected",
    [
        ("[Propose: book=1, hat=2, ball=0]", Move("propose", "", (1, 2, 0))),
        ("ok then [PROPOSE: balls=3; hats=0, books=1] deal?", Move("propose", "ok then deal?", (1, 0, 3))),
        ("[Propose book: 0 hat: 1 basketball: 2]", Move("propose", "", (0, 1, 2))),
        ("<think>[Accept]?</think>Let me think.", Move("talk", "Let me think.")),
        ("blah <action>[accept]</action>", Move("accept", "")),
        ("I accept your offer, sounds good", Move("talk", "I accept your offer, sounds good")),
        ("  many    spaces\nand lines  ", Move("talk", "many spaces and lines")),
    ],
)
def test_parse_valid_messages(text, expected):
    assert parse_move(text, (1, 2, 3)) == expected


@pytest.mark.parametrize(
    "text,fragment",
    [
        ("[Propose: book=2, hat=0, ball=0]", "pool has only 1"),
        ("[Propose: book=1, hat=2]", "name every item exactly once"),
        ("[Propose: book=1, book=0, hat=1, ball=0]", "names book twice"),
        ("[Propose: book=1, hat=1, ball=0, car=1]", "Unknown item 'car'"),
        ("[Propose: book=-1, hat=1, ball=0]", "name every item exactly once"),
        ("[Propose: all the books]", "name every item exactly once"),
        ("[Propose: book=1, hat=0, ball=0] [Accept]", "only one move"),
        ("[Propose: book=1, hat=0, ball=0][Propose: book=0, hat=0, ball=0]", "only one move"),
        ("[Accept the offer]", "Malformed move tag"),
        ("[Propose book=1, hat=0, ball=0", "Malformed move tag"),
        ("", "empty"),
        ("<think>only thinking</think>", "empty"),
    ],
)
def test_parse_invalid_messages(text, fragment):
    error = parse_move(text, (1, 2, 3))
    assert isinstance(error, str) and fragment in error


@pytest.mark.parametrize(
    "before,message,fragment",
    [
        ([], "[Accept]", "no proposal to accept"),
        (["[Propose: book=1, hat=0, ball=0]", "hmm"], "[Accept]", "latest proposal is your own"),
        ([], "[Propose: book=1, hat=3, ball=0]", "pool has only 2"),
    ],
)
def test_invalid_moves_leave_the_state_unchanged(before, message, fragment):
    env = DealOrNoDeal()
    env.reset(TASK)
    for text in before:
        env.step(text)
    key, role, view = env.state_key(), env.current_role(), env.render()
    observation, reward, done, info = env.step(message)
    assert info["valid"] is False and fragment in info["error"] and reward == 0.0 and not done
    assert observation == f"Invalid message: {info['error']}\n\n{view}"
    assert env.state_key() == key and env.current_role() == role


def test_long_talk_is_cut_in_the_dialogue():
    env = DealOrNoDeal(max_message_chars=20)
    env.reset(TASK)
    observation, *_ = env.step("x" * 100 + " [Propose: book=1, hat=0, ball=0]")
    assert "Alice: " + "x" * 20 + "... [Propose: book=1, hat=0, ball=0]" in observation


# ---- instances -----------------------------------------------------------------------------------------------------


def test_sampler_reproduces_the_openspiel_scheme():
    valid = set(_valid_instances())
    assert len(valid) == 5793
    for k in range(1000):  # every OpenSpiel instance is one our sampler can draw
        instance = openspiel_instance(k)
        assert (instance.pool, *instance.values) in valid
    samples = [sample_instance(seed) for seed in range(300)]
    assert samples[7] == sample_instance(7)  # seeded
    assert len({(s.pool, s.values) for s in samples}) > 250
    for s in samples:
        assert 5 <= sum(s.pool) <= 7 and all(1 <= c <= 7 for c in s.pool)
        assert s.max_utility(0) == s.max_utility(1) == 10
        assert all(a or b for a, b in zip(*s.values)) and any(a and b for a, b in zip(*s.values))


def test_instances_without_openspiel(monkeypatch):
    import sys

    from trl_agents.envs import dealnodeal

    monkeypatch.setitem(sys.modules, "pyspiel", None)  # as if open-spiel were not installed
    dealnodeal._openspiel_instances.cache_clear()
    try:
        with pytest.raises(ImportError, match=r"pip install \"trl-agents\[envs\]\""):
            DealOrNoDeal().reset({"instance": 0})
        assert DealOrNoDeal().reset({"seed": 0})  # the sampler needs nothing
        monkeypatch.setattr(dealnodeal, "_openspiel_available", lambda: False)
        assert DealOrNoDeal.task_split("train", 2) == DealOrNoDeal.task_split("train", 2, source="sampled")
    finally:
        dealnodeal._openspiel_instances.cache_clear()


def test_openspiel_instances_match_pyspiel():
    pyspiel = pytest.importorskip("pyspiel")
    game = pyspiel.load_game("bargaining")
    for k in (0, 17, 999):
        state = game.new_initial_state()
        state.apply_action(k)
        text = state.information_state_string(0)
        instance = openspiel_instance(k)
        assert f"Pool: Book: {instance.pool[0]}, Hat: {instance.pool[1]}, Basketball: {instance.pool[2]}" in text
        values = instance.values[0]
        assert f"My values: Book: {values[0]}, Hat: {values[1]}, Basketball: {values[2]}" in text
    assert openspiel_instance(0) == DealInstance((1, 2, 3), ((8, 1, 0), (4, 0, 2)), "openspiel:0")


def test_outcomes_agree_with_openspiel():
    """Random offer/accept games played in our env and in OpenSpiel's `bargaining` end with the same returns."""
    pyspiel = pytest.importorskip("pyspiel")
    game = pyspiel.load_game("bargaining")
    env = DealOrNoDeal(normalize_rewards=False)
    for k in range(40):
        rng = random.Random(k)
        state = game.new_initial_state()
        state.apply_action(k)
        env.reset({"instance": k})
        done = False
        while not done:
            legal = state.legal_actions()
            action = rng.choice(legal) if rng.random() < 0.8 else legal[-1]
            text = state.action_to_string(action)
            if text == "Agree":
                message = "[Accept]"
            else:  # "Offer: Book: 1, Hat: 0, Basketball: 2" = what the offering player keeps
                counts = [int(part.split(": ")[1]) for part in text[len("Offer: ") :].split(", ")]
                message = f"[Propose: book={counts[0]}, hat={counts[1]}, ball={counts[2]}]"
            state.apply_action(action)
            _, _, done, info = env.step(message)
            assert info["valid"]
            assert done == state.is_terminal()
        assert [info["role_rewards"][r] for r in ROLES] == state.returns()


# ---- the scripted partner ------------------------------------------------------------------------------------------


def test_scripted_partner_counter_proposes_and_accepts():
    env = DealOrNoDeal(opponent="scripted")
    env.reset(TASK)
    assert env.current_role() == "alice"
    # Bob demands 6 of his 10 points; his cheapest such split keeps the book and one ball (4 + 2).
    assert scripted_proposal(openspiel_instance(0), 1, 0.6) == (1, 0, 1)
    observation, reward, done, info = env.step("Hello!")
    assert (
        info["partner_message"] == "Bob: I would like to keep book=1, hat=0, ball=1; you get the rest. "
        "[Propose: book=1, hat=0, ball=1]"
    )
    assert not done and env.current_role() == "alice" and "Messages left (both players): 8" in observation
    # An offer leaving bob one ball (2 points < 6) is refused with the same counter-offer.
    _, _, done, info = env.step("[Propose: book=1, hat=2, ball=2]")
    assert not done and info["partner_message"].endswith("[Propose: book=1, hat=0, ball=1]")
    # Accepting bob's offer: alice gets 2 hats and 2 balls = 2 points.
    _, reward, done, info = env.step("[Accept]")
    assert done and info["success"] and reward == pytest.approx(0.2)
    assert info["role_rewards"] == {"alice": pytest.approx(0.2), "bob": pytest.approx(0.6)}


def test_scripted_partner_opens_when_the_agent_is_bob():
    env = DealOrNoDeal(opponent="scripted", agent_role="bob")
    observation = env.reset(TASK)
    assert env.current_role() == "bob" and observation.startswith("You are Bob")
    assert "Alice: I would like to keep" in observation
    env.step("hmm")
    assert env.current_role() == "bob"


@pytest.mark.parametrize("agent_role", ["alice", "bob"])
def test_scripted_optimal_plan_is_the_best_accepted_deal(agent_role):
    """Brute force from a snapshot: no proposal earns the agent more than the optimal plan does."""
    env = DealOrNoDeal(opponent="scripted", agent_role=agent_role)
    for k in range(0, 60, 6):
        env.reset({"instance": k})
        start = env.snapshot()
        best = 0.0
        for proposal in env.admissible_actions():
            env.restore(start)
            _, reward, done, _ = env.step(proposal)
            best = max(best, reward if done else 0.0)
        env.restore(start)
        plan = env.optimal_plan()
        for message in plan:
            _, reward, done, info = env.step(message)
        assert done and info["success"] and reward == pytest.approx(best)


def test_privileged_context_names_the_other_values():
    env = DealOrNoDeal()
    env.reset(TASK)
    assert env.privileged_context().startswith("Bob's private values per item: book=4, hat=0, ball=2")
    env.step("hi")
    assert env.privileged_context().startswith("Alice's private values per item: book=8, hat=1, ball=0")
    env = DealOrNoDeal(opponent="scripted")
    env.reset(TASK)
    assert "accepts any proposal that leaves it at least 6 points" in env.privileged_context()


def test_snapshot_survives_a_reset():
    env = DealOrNoDeal()
    env.reset(TASK)
    env.step("[Propose: book=1, hat=2, ball=0]")
    saved, view = env.snapshot(), env.render()
    env.reset({"seed": 3})
    env.restore(saved)
    assert env.render() == view and env.current_role() == "bob"
    assert env.step("[Accept]")[3]["role_rewards"] == {"alice": 1.0, "bob": 0.6}


# ---- splits and arguments ------------------------------------------------------------------------------------------


def test_task_splits():
    train = DealOrNoDeal.task_split("train", source="openspiel")
    evaluation = DealOrNoDeal.task_split("eval", source="openspiel")
    assert len(train) == 800 and len(evaluation) == 200
    assert train[0] == {"env": "dealnodeal", "task_id": "dealnodeal-train-0", "instance": 0}
    assert not {r["instance"] for r in train} & {r["instance"] for r in evaluation}
    sampled = DealOrNoDeal.task_split("eval", 3, source="sampled")
    assert [r["seed"] for r in sampled] == [1_000_000, 1_000_001, 1_000_002]
    assert DealOrNoDeal.task_split("train", 2) == train[:2]  # auto: OpenSpiel is installed here
    with pytest.raises(ValueError, match="exceeds the 200 OpenSpiel instances"):
        DealOrNoDeal.task_split("eval", 201, source="openspiel")
    with pytest.raises(ValueError, match="split"):
        DealOrNoDeal.task_split("test")
    with pytest.raises(ValueError, match="source"):
        DealOrNoDeal.task_split("train", source="lewis")
    with pytest.raises(ValueError, match="opponent"):
        DealOrNoDeal.task_split("train", opponent="human")


@pytest.mark.parametrize(
    "kwargs,name",
    [
        ({"opponent": "human"}, "opponent"),
        ({"agent_role": "bob"}, "agent_role"),
        ({"opponent": "scripted", "agent_role": "carol"}, "agent_role"),
        ({"max_turns": 1}, "max_turns"),
        ({"normalize_rewards": "yes"}, "normalize_rewards"),
        ({"self_play_reward": "sum"}, "self_play_reward"),
        ({"partner_threshold": 1.5}, "partner_threshold"),
        ({"partner_threshold": "high"}, "partner_threshold"),
        ({"max_message_chars": -1}, "max_message_chars"),
    ],
)
def test_bad_arguments(kwargs, name):
    with pytest.raises(ValueError, match=name):
        DealOrNoDeal(**kwargs)


@pytest.mark.parametrize(
    "task,fragment",
    [
        ({}, "needs an 'instance'"),
        ({"instance": 1000}, "'instance' must be in"),
        ({"instance": "3"}, "'instance' must be an integer"),
        ({"seed": 1.5}, "'seed' must be an integer"),
        ({"pool": [1, 2]}, "3 counts"),
        ({"pool": [1, 2, -3], "values": TASK["values"]}, "non-negative"),
        ({"pool": [1, 2, 3], "values": {"alice": [1, 1, 1]}}, "'values' must map"),
        ({"pool": [1, 2, 3], "values": {"alice": [0, 0, 0], "bob": [1, 1, 1]}}, "worth something to alice"),
    ],
)
def test_bad_task_rows(task, fragment):
    with pytest.raises(ValueError, match=fragment):
        DealOrNoDeal().reset(task)


# ---- training ------------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_one_training_iteration_against_the_scripted_partner(train_one_iteration):
    trainer = train_one_iteration(
        "dealnodeal", [{"instance": 0}, {"seed": 4}], env_kwargs={"opponent": "scripted"}, max_turns=3
    )
    assert trainer.state.global_step == 1
