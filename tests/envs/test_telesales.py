"""TeleSales: the rubric by hand, parsing, roles and private views, the scripted partners, seeds and splits."""

from __future__ import annotations

import pytest

from trl_agents.envs import make_env
from trl_agents.envs.checks import check_env
from trl_agents.envs.telesales import (
    CATALOGUE_SIZE,
    PRICE_STEP,
    ROLES,
    Move,
    TeleSales,
    acceptable_price,
    parse_move,
    sample_instance,
)

# A hand-written call. Only Aster and Corvo have the 7 seats the customer needs; Aster has its priority (safety).
TASK = {
    "catalogue": [
        {"name": "Aster", "seats": 7, "fuel": "hybrid", "features": ["cargo", "safety"], "list_price": 30000,
         "floor_price": 26000},
        {"name": "Brio", "seats": 5, "fuel": "petrol", "features": ["tech", "economy"], "list_price": 20000,
         "floor_price": 17000},
        {"name": "Corvo", "seats": 7, "fuel": "diesel", "features": ["comfort", "tech"], "list_price": 34000,
         "floor_price": 29000},
    ],
    "customer": {"min_seats": 7, "fuel": "any", "budget": 31000, "priority": "safety"},
}
BAD = "[Offer: Zeppelin at 1]"  # talk is always valid, so the bad action is an offer of a model nobody sells
ASK_ALL = "Hello! [Ask: seats, fuel, budget, priority]"


def _instance():
    env = TeleSales()
    env.reset(TASK)
    return env.instance


# ---- contract checks -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"self_play_reward": "acting", "customer_style": "tough"},
        {"opponent": "scripted"},
        {"opponent": "scripted", "customer_style": "tough"},
        {"opponent": "scripted", "agent_role": "customer"},
    ],
)
@pytest.mark.parametrize("task", [{"seed": 0}, {"seed": 7}, TASK])
def test_check_env(kwargs, task):
    report = check_env(lambda: TeleSales(**kwargs), task, bad_action=BAD)
    assert "expert_episode" in report and "snapshot_restore" in report


def test_registered_and_capabilities():
    env = make_env("telesales", opponent="scripted")
    assert isinstance(env, TeleSales) and env.roles == ("salesperson", "customer")
    assert {"roles", "snapshot", "restore", "state_key", "privileged_context", "optimal_plan"} <= env.capabilities()


# ---- a hand-played dialogue and the rubric -------------------------------------------------------------------------


def test_hand_played_dialogue_roles_private_views_and_rewards():
    env = TeleSales()
    observation = env.reset(TASK)
    assert env.current_role() == "salesperson"
    assert "Corvo: 7 seats, diesel, comfort+tech, 34000 / 29000" in observation  # catalogue with lowest prices
    assert "31000" not in observation and "nothing known yet" in observation  # the budget is the customer's
    turns = [
        ("salesperson", ASK_ALL, "ask"),
        ("customer", "I need seven seats, budget 31000.", "talk"),
        ("salesperson", "This one is roomy. [Offer: corvo at $31,000]", "offer"),
        ("customer", "<think>7 seats, within budget</think>OK. [accept]", "accept"),
    ]
    for i, (role, message, kind) in enumerate(turns):
        assert env.current_role() == role
        observation, reward, done, info = env.step(message)
        assert info["valid"] and info["role"] == role and info["move"] == kind
        assert done == (i == len(turns) - 1)
        if not done:
            assert reward == 0.0 and "role_rewards" not in info
            other = ROLES[1 - ROLES.index(role)]
            assert observation.startswith(f"You are the {other}")  # the next role's private view
        if i == 0:  # the customer's view: its own profile, nothing of the catalogue yet, no lowest prices
            assert "You need at least 7 seats and any fuel; budget 31000; you care most about safety." in observation
            assert "Aster" not in observation and "29000" not in observation
        if i == 1:  # the salesperson now sees the true answers to its questions
            assert "Customer: at least 7 seats; any fuel; budget 31000; cares most about safety." in observation
        if i == 2:  # the offered model's specs are shown to the customer, without its lowest price
            assert "  Corvo: 7 seats, diesel, comfort+tech, list 34000" in observation
            assert "Standing offer: Corvo at 31000 (fits you)." in observation and "29000" not in observation
    # margin = (31000 - 29000) / (34000 - 29000) = 0.4; salesperson 0.5 + 0.5 * 0.4 = 0.7;
    # customer 0.6 + 0.2 * 0 (Corvo lacks safety) + 0.2 * (1 - 0.4) = 0.72; self-play default: the mean 0.71.
    assert info["success"] and info["sale"] == {"model": "Corvo", "price": 31000}
    assert info["role_rewards"] == {"salesperson": pytest.approx(0.7), "customer": pytest.approx(0.72)}
    assert reward == pytest.approx(0.71)
    assert "Salesperson: This one is roomy. [Offer: Corvo at 31000]" in observation  # canonical tag
    with pytest.raises(RuntimeError):
        env.step("[Accept]")


@pytest.mark.parametrize(
    "offer,rewards,success",
    [
        # Aster at list: margin (30000 - 26000) / 4000 = 1 -> 0.5 + 0.5 = 1.0; customer 0.6 + 0.2 (safety) + 0 = 0.8
        ("[Offer: Aster at 30000]", {"salesperson": 1.0, "customer": 0.8}, True),
        # Aster at its lowest: margin 0 -> 0.5; customer 0.6 + 0.2 + 0.2 * 1 = 1.0
        ("[Offer: Aster at 26000]", {"salesperson": 0.5, "customer": 1.0}, True),
        # Aster at 27000: margin 0.25 -> 0.625; customer 0.6 + 0.2 + 0.2 * 0.75 = 0.95
        ("[Offer: Aster at 27000]", {"salesperson": 0.625, "customer": 0.95}, True),
        ("[Offer: Brio at 20000]", {"salesperson": 0.0, "customer": 0.0}, False),  # 5 seats < 7: breaks a need
        ("[Offer: Corvo at 33000]", {"salesperson": 0.0, "customer": 0.0}, False),  # 33000 > budget 31000
    ],
)
def test_rubric_by_hand(offer, rewards, success):
    env = TeleSales(self_play_reward="acting")
    env.reset(TASK)
    env.step(offer)
    _, reward, done, info = env.step("[Accept]")
    assert done and info["success"] is success and info["sale"] is not None
    assert info["role_rewards"] == pytest.approx(rewards)
    assert reward == pytest.approx(rewards["customer"])  # "acting": the customer accepted, its reward
    assert all(0.0 <= r <= 1.0 for r in info["role_rewards"].values())


@pytest.mark.parametrize("max_turns", [2, 5, 10])
def test_no_sale_after_max_turns(max_turns):
    env = TeleSales(max_turns=max_turns)
    env.reset({"seed": 3})
    for turn in range(max_turns):
        _, reward, done, info = env.step(f"Let us talk ({turn}).")
        assert done == (turn == max_turns - 1)
    assert reward == 0.0 and info["success"] is False and info["sale"] is None
    assert info["role_rewards"] == {"salesperson": 0.0, "customer": 0.0}
    assert env.optimal_plan() is None and "without a sale" in env.render()


def test_reject_and_counter_change_the_standing_offer():
    env = TeleSales()
    env.reset(TASK)
    env.step("[Offer: Brio at 20000]")
    observation, *_ = env.step("Too small. [Reject]")
    assert "No offer on the table." in observation
    env.step("[Offer: Aster at 30000]")
    observation, _, _, info = env.step("[Counter: 27,000]")
    assert info["move"] == "counter" and "Standing offer: Aster at 30000; the customer countered 27000." in observation
    env.step("[Offer: Aster at 27000]")
    _, _, done, info = env.step("[Accept]")
    assert done and info["role_rewards"] == pytest.approx({"salesperson": 0.625, "customer": 0.95})


# ---- parsing and invalid moves -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text,expected",
    [
        ("[Ask: budget, seats]", Move("ask", "", attributes=("seats", "budget"))),  # canonical order
        ("What about [ask: Seat and fuel]?", Move("ask", "What about ?", attributes=("seats", "fuel"))),
        ("[Recommend: aster]", Move("recommend", "", model="Aster")),
        ("Deal? [OFFER: Corvo for $31,000]", Move("offer", "Deal?", model="Corvo", price=31000)),
        ("[Offer: Brio @ 19500 dollars]", Move("offer", "", model="Brio", price=19500)),
        ("[Counter: 25000]", Move("counter", "", price=25000)),
        ("<think>[Reject]?</think>Let me think.", Move("talk", "Let me think.")),
        ("blah <action>[accept]</action>", Move("accept", "")),
        ("I accept, sounds good", Move("talk", "I accept, sounds good")),
    ],
)
def test_parse_valid_messages(text, expected):
    assert parse_move(text, _instance()) == expected


@pytest.mark.parametrize(
    "text,fragment",
    [
        ("[Ask: colour]", "Unknown question 'colour'"),
        ("[Ask: ]", "Say what you ask about"),
        ("[Offer: Zeppelin at 100]", "Unknown model 'Zeppelin'; the catalogue has Aster, Brio, Corvo"),
        ("[Offer: Aster]", "Malformed offer"),
        ("[Offer: Aster at 27.5k]", "Malformed offer"),
        ("[Recommend: Aster at 100]", "Malformed recommendation"),
        ("[Counter: cheaper]", "Malformed counter"),
        ("[Counter: 0]", "Malformed counter"),
        ("[Accept the offer]", "takes nothing inside"),
        ("[Offer: Aster at 30000] [Accept]", "only one move"),
        ("[Offer: Aster at 30000", "Malformed move tag"),
        ("", "empty"),
        ("<think>only thinking</think>", "empty"),
    ],
)
def test_parse_invalid_messages(text, fragment):
    error = parse_move(text, _instance())
    assert isinstance(error, str) and fragment in error


@pytest.mark.parametrize(
    "before,message,fragment",
    [
        ([], "[Accept]", "Only the customer can accept"),
        ([], "[Counter: 100]", "Only the customer can counter"),
        ([], "[Offer: Aster at 25999]", "between 26000 (lowest) and 30000 (list)"),
        ([], "[Offer: Aster at 30001]", "between 26000 (lowest) and 30000 (list)"),
        (["hi"], "[Ask: seats]", "Only the salesperson can ask"),
        (["hi"], "[Offer: Aster at 30000]", "Only the salesperson can offer"),
        (["hi"], "[Accept]", "no offer to accept"),
        (["hi"], "[Reject]", "no offer to reject"),
        (["hi"], "[Counter: 20000]", "no offer to counter"),
    ],
)
def test_invalid_moves_leave_the_state_unchanged(before, message, fragment):
    env = TeleSales()
    env.reset(TASK)
    for text in before:
        env.step(text)
    key, role, view = env.state_key(), env.current_role(), env.render()
    observation, reward, done, info = env.step(message)
    assert info["valid"] is False and fragment in info["error"] and reward == 0.0 and not done
    assert info["role"] == role and observation == f"Invalid message: {info['error']}\n\n{view}"
    assert env.state_key() == key and env.current_role() == role  # the same role writes again


def test_long_talk_is_cut_and_talk_does_not_change_the_state_key():
    env = TeleSales(max_message_chars=10)
    env.reset(TASK)
    observation, *_ = env.step("x" * 50 + " [Ask: seats]")
    assert "Salesperson: " + "x" * 10 + "... [Ask: seats]" in observation
    a, b = TeleSales(), TeleSales()
    a.reset(TASK), b.reset(TASK)
    a.step("Hello there [Ask: seats]"), b.step("[Ask: seats] good morning")
    assert a.state_key() == b.state_key()


# ---- the scripted partners -----------------------------------------------------------------------------------------


def test_scripted_easy_customer_buys_at_list():
    env = TeleSales(opponent="scripted")
    env.reset(TASK)
    _, reward, done, info = env.step(ASK_ALL)
    assert info["partner_message"] == (
        "Customer: I need at least 7 seats. Any fuel is fine. My budget is 31000. I care most about safety."
    )
    _, reward, done, info = env.step("[Offer: Brio at 20000]")
    assert info["partner_message"] == "Customer: No thanks: it has 5 seats and I need at least 7. [Reject]"
    _, reward, done, info = env.step("[Offer: Aster at 30000]")  # 30000 <= budget 31000: the easy customer buys
    assert done and info["success"] and reward == pytest.approx(1.0)  # margin 1 -> the salesperson's 1.0
    assert info["role_rewards"] == {"salesperson": pytest.approx(1.0), "customer": pytest.approx(0.8)}


def test_scripted_tough_customer_counters_once():
    env = TeleSales(opponent="scripted", customer_style="tough")
    env.reset(TASK)
    # The tough customer pays at most min(budget 31000, 92% of 30000 = 27600 rounded down to 500) = 27500.
    assert acceptable_price(env.instance, env.instance.vehicle("Aster"), "tough") == 27500
    _, _, done, info = env.step("[Offer: Aster at 30000]")
    assert not done and info["partner_message"].endswith("[Counter: 27500]")
    _, _, done, info = env.step("[Offer: Aster at 29000]")  # above its price again: it rejects the model
    assert not done and info["partner_message"] == "Customer: That is still too much for the Aster. [Reject]"
    _, _, done, info = env.step("[Offer: Aster at 27500]")
    # margin (27500 - 26000) / 4000 = 0.375: salesperson 0.6875, customer 0.6 + 0.2 + 0.2 * 0.625 = 0.925
    assert done and info["role_rewards"] == pytest.approx({"salesperson": 0.6875, "customer": 0.925})


OPEN = "Happy to help! What do you need? [Ask: seats, fuel, budget, priority]"


@pytest.mark.parametrize(
    "style,plan",
    [
        ("easy", [OPEN, "The Aster fits you well. [Offer: Aster at 30000]"]),
        ("tough", [OPEN, "The Aster fits you well. [Offer: Aster at 30000]",
                   "Alright, you have a deal at that price. [Offer: Aster at 27500]"]),
    ],
)
def test_optimal_plan_is_the_scripted_salespersons_side(style, plan):
    env = TeleSales(opponent="scripted", customer_style=style)
    env.reset(TASK)
    assert env.optimal_plan() == plan  # asks first, then Aster (fits, has safety) at min(list, budget)
    for message in plan:
        _, _, done, info = env.step(message)
    assert done and info["success"] and env.optimal_plan() == []


def test_self_play_plan_covers_both_roles_and_warm_starts_both():
    from trl_agents.warmstart import solver_demonstrations

    env = TeleSales(customer_style="tough")
    env.reset(TASK)
    plan = env.optimal_plan()
    roles = []
    for message in plan:
        roles.append(env.current_role())
        _, _, done, info = env.step(message)
    assert roles == ["salesperson", "customer"] * 3 and done and info["success"]
    assert plan[3] == "That is too much for me. I can pay 27500. [Counter: 27500]"
    rows = solver_demonstrations("telesales", [TASK], env_kwargs={"customer_style": "tough"}, history_length=0)
    assert len(rows) == 6
    assert rows[1]["prompt"][-1]["content"].startswith("You are the customer")
    assert rows[1]["completion"][0]["content"].startswith("I need at least 7 seats.")


def test_scripted_salesperson_opens_when_the_agent_is_the_customer():
    env = TeleSales(opponent="scripted", agent_role="customer")
    observation = env.reset(TASK)
    assert env.current_role() == "customer" and observation.startswith("You are the customer")
    assert "Salesperson: Happy to help! What do you need? [Ask: seats, fuel, budget, priority]" in observation
    _, _, done, info = env.step("Seven seats, 31000 at most, safety matters.")
    assert info["partner_message"] == "Salesperson: The Aster fits you well. [Offer: Aster at 30000]"
    _, _, _, info = env.step("[Counter: 25000]")  # below Aster's lowest 26000: the salesperson moves on to Corvo
    assert info["partner_message"] == "Salesperson: The Corvo fits you well. [Offer: Corvo at 31000]"
    _, _, _, info = env.step("[Counter: 30000]")  # >= Corvo's lowest 29000: met
    assert info["partner_message"].endswith("[Offer: Corvo at 30000]")
    _, reward, done, info = env.step("[Accept]")
    # margin (30000 - 29000) / 5000 = 0.2: customer 0.6 + 0 + 0.2 * 0.8 = 0.76 (its own reward is the step's)
    assert done and reward == pytest.approx(0.76) and info["role"] == "customer"


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"customer_style": "tough"}, {"opponent": "scripted"}, {"opponent": "scripted", "agent_role": "customer"},
     {"opponent": "scripted", "customer_style": "tough", "agent_role": "customer"}],
)
def test_the_scripted_pair_makes_a_good_sale_on_every_seed(kwargs):
    env = TeleSales(**kwargs)
    for seed in range(150):
        env.reset({"seed": seed})
        plan = env.optimal_plan()
        assert plan, seed
        for message in plan:
            _, _, done, info = env.step(message)
            assert info["valid"], (seed, message, info)
        assert done and info["success"], seed


@pytest.mark.parametrize("kwargs", [{"customer_style": "tough"}, {"opponent": "scripted"},
                                    {"opponent": "scripted", "agent_role": "customer"}])
def test_plans_from_random_reachable_states_are_valid_and_succeed(kwargs):
    """Random dialogues (valid and invalid moves of both roles): rewards stay in [0, 1], and from every state the
    plan is None or valid messages that end in a good sale (played from a snapshot, then restored)."""
    import random

    env, plans = TeleSales(**kwargs), 0
    for seed in range(40):
        rng = random.Random(seed)
        env.reset({"seed": seed})
        done = False
        while not done:
            start, plan = env.snapshot(), env.optimal_plan()
            if plan is not None:
                plans += 1
                for message in plan:
                    _, _, end, info = env.step(message)
                    assert info["valid"], (seed, message, info)
                assert end and info["success"], (seed, plan)
                env.restore(start)
            v = rng.choice(env.instance.catalogue)
            message = rng.choice([
                "hi", "[Ask: seats]", "[Ask: budget, priority]", f"[Recommend: {v.name}]", "[Accept]", "[Reject]",
                f"[Offer: {v.name} at {rng.randint(v.floor_price, v.list_price)}]", "[Offer: Nope at 3]",
                f"[Counter: {rng.randint(10_000, 40_000)}]",
            ])
            _, reward, done, info = env.step(message)
            assert 0.0 <= reward <= 1.0
        assert all(0.0 <= r <= 1.0 for r in info["role_rewards"].values())
    assert plans > 100


# ---- instances, determinism and splits -----------------------------------------------------------------------------


def test_sampler_is_seeded_and_always_has_a_good_sale():
    assert sample_instance(5) == sample_instance(5) and sample_instance(5) != sample_instance(6)
    assert TeleSales().reset({"seed": 5}) == TeleSales().reset({"seed": 5})
    profiles = set()
    for seed in range(300):
        instance = sample_instance(seed)
        customer = instance.customer
        profiles.add((customer.min_seats, customer.fuel, customer.priority))
        assert len(instance.catalogue) == CATALOGUE_SIZE == len({v.name for v in instance.catalogue})
        for v in instance.catalogue:
            assert v.list_price % PRICE_STEP == 0 == v.floor_price % PRICE_STEP and v.floor_price < v.list_price
        assert any(customer.need_problem(v) is None and v.floor_price <= customer.budget for v in instance.catalogue)
    assert len(profiles) > 40  # 3 seat needs x 5 fuel needs x 5 priorities = 75 possible


def test_observations_stay_short():
    env = TeleSales()
    longest = 0
    for seed in range(50):
        longest = max(longest, len(env.reset({"seed": seed})))
        for message in env.optimal_plan():
            longest = max(longest, len(env.step(message)[0]))
    assert longest < 1100  # characters; about 300 tokens on the dialogue's last turn


def test_task_splits_are_disjoint():
    train, validation, test = (TeleSales.task_split(s) for s in ("train", "validation", "test"))
    assert (len(train), len(validation), len(test)) == (1000, 200, 200)
    assert train[0] == {"env": "telesales", "seed": 0, "task_id": "telesales-train-0"}
    seeds = [{r["seed"] for r in rows} for rows in (train, validation, test)]
    assert not seeds[0] & seeds[1] and not seeds[0] & seeds[2] and not seeds[1] & seeds[2]
    assert [r["seed"] for r in TeleSales.task_split("eval", 2)] == [1_000_000, 1_000_001]  # eval = validation
    with pytest.raises(ValueError, match="split"):
        TeleSales.task_split("unseen")
    with pytest.raises(ValueError, match="customer_style"):
        TeleSales.task_split("train", customer_style="rude")


def test_privileged_context_names_the_other_side():
    env = TeleSales()
    env.reset(TASK)
    assert env.privileged_context() == (
        "The customer needs at least 7 seats, any fuel, budget 31000, and cares most about safety."
    )
    env.step("hi")
    assert env.privileged_context() == "The dealer's lowest prices: Aster 26000, Brio 17000, Corvo 29000."
    env = TeleSales(opponent="scripted", customer_style="tough")
    env.reset(TASK)
    assert env.privileged_context().endswith("The most it pays for a fitting model: Aster 27500, Corvo 31000.")


def test_snapshot_survives_a_reset():
    env = TeleSales()
    env.reset(TASK)
    env.step("[Offer: Aster at 30000]")
    saved, view = env.snapshot(), env.render()
    env.reset({"seed": 3})
    env.restore(saved)
    assert env.render() == view and env.current_role() == "customer"
    assert env.step("[Accept]")[3]["role_rewards"] == {"salesperson": 1.0, "customer": pytest.approx(0.8)}


@pytest.mark.parametrize(
    "kwargs,name",
    [
        ({"opponent": "human"}, "opponent"),
        ({"agent_role": "customer"}, "agent_role"),
        ({"opponent": "scripted", "agent_role": "dealer"}, "agent_role"),
        ({"customer_style": "rude"}, "customer_style"),
        ({"max_turns": 1}, "max_turns"),
        ({"self_play_reward": "sum"}, "self_play_reward"),
        ({"max_message_chars": -1}, "max_message_chars"),
    ],
)
def test_bad_arguments(kwargs, name):
    with pytest.raises(ValueError, match=name):
        TeleSales(**kwargs)


def _with(customer=None, **vehicle):
    """TASK with the first vehicle's fields (and the customer's) changed."""
    task = {"catalogue": [dict(v) for v in TASK["catalogue"]], "customer": dict(TASK["customer"])}
    task["catalogue"][0].update(vehicle)
    task["customer"].update(customer or {})
    return task


@pytest.mark.parametrize(
    "task,fragment",
    [
        ({}, "needs a 'seed' or a 'catalogue'"),
        ({"seed": 1.5}, "'seed' must be an integer"),
        ({"seed": True}, "'seed' must be an integer"),
        ({"catalogue": []}, "non-empty list"),
        ({"catalogue": TASK["catalogue"]}, "'customer' must be a dict"),
        (_with(fuel="steam"), "fuel' must be one of"),
        (_with(name="Aster 2"), "one word of letters"),
        (_with(name="brio"), "must not repeat"),
        (_with(floor_price=31000), "must be <= its list_price"),
        (_with(seats=0), "positive integer"),
        (_with(features=["wings"]), "features' must list"),
        (_with(customer={"priority": "speed"}), "customer.priority"),
        (_with(customer={"budget": "lots"}), "customer.budget"),
    ],
)
def test_bad_task_rows(task, fragment):
    with pytest.raises(ValueError, match=fragment):
        TeleSales().reset(task)


# ---- training ------------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_one_training_iteration_in_self_play(train_one_iteration):
    trainer = train_one_iteration("telesales", [{"seed": 0}, TASK], max_turns=3)
    assert trainer.state.global_step == 1
