"""Tests of WebShop-lite (catalogue, pages, actions, WebShop's reward, verifier, splits) and of the client for a real
WebShop server, run against a loopback server that serves WebShop's routes from the WebShop-lite catalogue."""

import ast
import html
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from trl_agents.envs import make_env
from trl_agents.envs.checks import check_env
from trl_agents.envs.webshop import (
    Goal,
    Product,
    WebShopLite,
    WebShopServer,
    _build_products,
    get_catalogue,
    parse_action,
    parse_webshop_html,
    token_set_ratio,
    webshop_reward,
)

SMALL = {"num_products": 600}


def small_env(**kwargs):
    return WebShopLite(**SMALL, **kwargs)


def play(env, actions):
    return [env.step(action) for action in actions]


# ---- catalogue and goals -------------------------------------------------------------------------------------------


def test_same_seed_same_catalogue_goals_and_observations():
    assert _build_products(0, 300) == _build_products(0, 300)
    assert _build_products(0, 300) != _build_products(1, 300)
    first, second = small_env(), small_env()
    for seed in (0, 5, 1_000_003):
        assert first.reset({"seed": seed}) == second.reset({"seed": seed})
        assert first.goal == second.goal and first.task_description() == second.task_description()
        plan = first.expert_plan()
        assert plan == second.expert_plan()
        assert [o[:3] for o in play(first, plan)] == [o[:3] for o in play(second, plan)]
    env = small_env()
    assert len({(env.reset({"seed": s}), env.task_description())[1] for s in range(30)}) >= 28


def test_catalogue_products_and_goals_are_well_formed():
    catalogue = get_catalogue(0, 600)
    assert len(catalogue.products) == 600 and len(catalogue.by_asin) == 600  # unique ASINs
    for product in catalogue.products:
        assert len(product.asin) == 10 and product.asin.startswith("B0") and product.asin.isupper()
        values = [v for _, vs in product.options for v in vs]
        assert len(values) == len(set(values)) and all(v == v.lower() for v in values)
        assert product.price > 0 and len(product.attributes) >= 3
        assert product.query in product.title.lower()
    for seed in range(50):
        goal = catalogue.goal(seed)
        target = catalogue.by_asin[goal.asin]
        assert set(goal.attributes) <= set(target.attributes)
        assert [name for name, _ in goal.options] == list(target.option_names())
        assert all(value in dict(target.options)[name] for name, value in goal.options)
        # WebShop's price bound: the larger of two of the four multiples of $10 above the price.
        assert target.price < goal.price_upper <= target.price + 40 and goal.price_upper % 10 == 0
        assert goal.instruction.endswith(f", and price lower than {goal.price_upper:.2f} dollars")
        assert goal.instruction.startswith("i ") and target.query in goal.instruction
        assert all(a in goal.instruction for a in goal.attributes)
        assert all(f"{name}: {value}" in goal.instruction for name, value in goal.options)


def test_search_lists_top_50_in_pages_of_10():
    env = small_env()
    env.reset({"seed": 1})
    query = env.catalogue.expert_query(1)
    assert env.goal.asin in env.catalogue.search(query, 10)
    observation, reward, done, info = env.step(f"search[{query}]")
    assert info["valid"] and info["page"] == "results" and not done and reward == 0.0
    results = env.catalogue.search(query)
    assert 10 < len(results) <= 50
    assert observation.startswith(f"Back to Search [SEP] Page 1 (Total results: {len(results)}) [SEP] Next > [SEP] ")
    product = env.catalogue.by_asin[results[0]]
    assert f"{product.asin} [SEP] {product.title} [SEP] {product.price_text}" in observation
    assert env.admissible_actions() == ["click[back to search]", "click[next >]"] + [
        f"click[{a.lower()}]" for a in results[:10]
    ]
    second = env.step("click[next >]")[0]
    assert "Page 2" in second and "< Prev" in second and results[10] in second and results[0] not in second
    assert env.step("click[< prev]")[0] == observation
    # The search page accepts only a search; clicking there is invalid.
    env.step("click[back to search]")
    assert env.admissible_actions() == ["search[<your query>]"]
    assert env.step("click[next >]")[3]["valid"] is False


def test_item_and_sub_pages():
    env = small_env()
    env.reset({"seed": 2})
    goal = env.goal
    product = env.catalogue.by_asin[goal.asin]
    env.step(f"search[{env.catalogue.expert_query(2)}]")
    observation = env.step(f"click[{goal.asin.lower()}]")[0]
    options = " [SEP] ".join(f"{name} [SEP] " + " [SEP] ".join(values) for name, values in product.options)
    assert observation.split("\n")[0] == (
        f"Back to Search [SEP] < Prev [SEP] {options} [SEP] {product.title} [SEP] Price: {product.price_text} "
        "[SEP] Description [SEP] Features [SEP] Buy Now"
    )
    _, value = goal.options[0]
    chosen = env.step(f"click[{value}]")[0]
    assert chosen.startswith(f"You have clicked {value}. [SEP] Back to Search")
    assert env.step("click[features]")[0].startswith("Back to Search [SEP] < Prev [SEP] " + product.features[0])
    assert env.admissible_actions() == ["click[back to search]", "click[< prev]"]
    assert env.step("click[< prev]")[0] == chosen  # back to the product, the option still selected
    assert product.description in env.step("click[description]")[0]
    env.step("click[< prev]")
    results = env.step("click[< prev]")[0]  # back to the results: options are dropped
    assert results.startswith("Back to Search [SEP] Page 1")
    assert not env.step(f"click[{goal.asin.lower()}]")[0].startswith("You have clicked")


# ---- episodes ------------------------------------------------------------------------------------------------------


def test_check_env_with_expert_plan():
    for seed in (0, 7):
        env = small_env()
        env.reset({"seed": seed})
        plan = env.expert_plan()
        report = check_env(small_env, {"seed": seed}, expert_actions=plan)
        assert set(report) == {"step_outputs", "determinism", "bad_action", "info_keys", "snapshot_restore",
                               "expert_episode"}


def test_expert_plan_reaches_reward_one():
    env = WebShopLite()  # the default 3000-product catalogue
    for task in WebShopLite.task_split("train", 60) + WebShopLite.task_split("eval", 20):
        env.reset(task)
        plan = env.expert_plan()
        assert plan[0].startswith("search[") and plan[1] == f"click[{env.goal.asin.lower()}]"
        assert len(plan) == len(env.goal.options) + 3  # search, product, options, buy: the fewest possible
        for action in plan:
            observation, reward, done, info = env.step(action)
        assert done and reward == 1.0 and info["success"] and info["score"] == 1.0
        assert observation == "Thank you for shopping with us! [SEP] Your score (min 0.0, max 1.0) [SEP] 1.0"
        assert env.admissible_actions() == [] and env.expert_plan() is None
    # From the middle of an episode, the plan finishes the purchase.
    env.reset({"seed": 3})
    env.step("search[something else entirely]")
    if "click[next >]" in env.admissible_actions():
        env.step("click[next >]")
    plan = env.expert_plan()
    assert plan[0] == "click[back to search]"
    assert play(env, plan)[-1][1] == 1.0


def test_bad_actions_are_rejected_without_changing_the_state():
    env = small_env()
    env.reset({"seed": 4})
    env.step(f"search[{env.catalogue.expert_query(4)}]")
    key, page = env.state_key(), env.page().render()
    cases = {
        "click[nonexistent]": "there is no button 'nonexistent' on this page",
        "click[buy now]": "there is no button 'buy now'",  # not on the results page
        "search[running shoes]": "search[...] only works on the search page",
        "click back to search": "reply with exactly one action",  # missing brackets
        "click[next >] click[< prev]": "reply with exactly one action",  # two actions
        "buy[now]": "reply with exactly one action",
    }
    for action, message in cases.items():
        observation, reward, done, info = env.step(action)
        assert info["valid"] is False and info["success"] is False and info["action"] is None, action
        assert reward == 0.0 and not done
        assert observation.startswith(f"Invalid action: {message}") and observation.endswith(page), action
        assert env.state_key() == key
    env.step("click[back to search]")
    _, _, _, info = env.step("search[   ]")
    assert info["valid"] is False
    # Parsing: the last <action> block, case-insensitive names, lowercased arguments.
    assert parse_action("<think>maybe click[b0x]</think>\n<action>Click[ Buy  Now ]</action>") == ("click", "buy now")
    assert parse_action("I will search[Red Shoes] now.") == ("search", "red shoes")
    assert parse_action(None) is None


def test_buying_ends_the_episode_with_webshop_score():
    env = small_env()
    env.reset({"seed": 5})
    goal = env.goal
    product = env.catalogue.by_asin[goal.asin]
    env.step(f"search[{env.catalogue.expert_query(5)}]")
    env.step(f"click[{goal.asin.lower()}]")
    # Pick a wrong value for the first option, nothing for the others.
    name, value = goal.options[0]
    wrong = next(v for v in dict(product.options)[name] if v != value)
    env.step(f"click[{wrong}]")
    observation, reward, done, info = env.step("click[buy now]")
    expected, _ = webshop_reward(product, goal, {name: wrong})
    assert done and reward == expected < 1.0 and not info["success"]
    assert info["options"] == {name: wrong} and info["r_type"] == 1.0 and info["r_price"] is True
    # Attributes and price hold; no goal option is matched.
    assert expected == pytest.approx((len(goal.attributes) + 1) / (len(goal.attributes) + len(goal.options) + 1))
    assert observation.endswith(f"[SEP] {expected}")
    binary = small_env(reward="binary")
    binary.reset({"seed": 5})
    rewards = [r for _, r, _, _ in play(binary, binary.expert_plan())]
    assert rewards[:-1] == [0.0] * (len(rewards) - 1) and rewards[-1] == 1.0
    with pytest.raises(RuntimeError, match="reset"):
        env.step("click[buy now]")


# ---- WebShop's reward, by hand -------------------------------------------------------------------------------------


def make_goal(**overrides):
    fields = {
        "asin": "B0GOAL0000",
        "instruction": "...",
        "query": "shampoo",
        "category_path": ("beauty", "hair care", "shampoo"),
        "nouns": ("argan", "shampoo", "bottle", "travel", "pump", "set"),
        "attributes": ("long lasting", "vegan", "argan oil"),
        "options": (("color", "navy"), ("size", "large")),
        "price_upper": 40.0,
    }
    return Goal(**{**fields, **overrides})


def make_product(**overrides):
    fields = {
        "asin": "B0PROD0000",
        "title": "Kestra Shampoo Bar",
        "query": "soap bar",
        "category_path": ("beauty", "bath", "soap bar"),
        "nouns": ("shampoo", "bar"),
        "price": 45.0,
        "attributes": ("long-lasting formula",),
        "options": (("color", ("navy blue", "red")), ("size", ("x-large", "small"))),
        "description": "A vegan bar for every day.",
        "features": ("Gentle",),
    }
    return Product(**{**fields, **overrides})


def test_token_set_ratio_by_hand():
    assert token_set_ratio("long lasting", "long-lasting formula") == 100  # subset of words
    assert token_set_ratio("navy", "navy blue") == 100
    assert token_set_ratio("Vegan", "vegan") == 100
    # No word in common: difflib's ratio 2*M/T of the phrases; "soap"/"soup" share "so" and "p": 2*3/8 -> 75,
    # "soap"/"towel" only "o": 2*1/9 -> 22.
    assert token_set_ratio("soap", "soup") == 75 and token_set_ratio("soap", "towel") == 22
    assert token_set_ratio("", "vegan") == 0


def test_reward_partial_match_by_hand():
    goal, product = make_goal(), make_product()
    # r_type: query differs, one category level in common (< 2), title nouns: 1 of the goal's 6 ("shampoo") =
    #   0.167 -> not > 0.2, so 0.5; not < 0.1, so it stays 0.5.
    # attributes: "long lasting" ~ "long-lasting formula" (100 > 85); "vegan" in the description; "argan oil"
    #   nowhere -> 2 of 3.
    # options: color "navy blue" ~ goal "navy" (100); size "x-large" is not exactly a goal value and is not in
    #   the product's text -> 1.
    # price: 45 > 40 -> 0.
    # total = (2 + 1 + 0) / (3 + 2 + 1) * 0.5 = 0.25
    score, details = webshop_reward(product, goal, {"color": "navy blue", "size": "x-large"})
    assert details["title_score"] == pytest.approx(1 / 6)
    assert (details["r_type"], details["num_attribute_matches"], details["num_option_matches"]) == (0.5, 2, 1)
    assert details["r_price"] is False and details["attribute_matches"] == [True, True, False]
    assert score == pytest.approx(0.25)
    # Same product at $39, and size "large" chosen (sizes match exactly): (2 + 2 + 1) / 6 * 0.5.
    cheaper = make_product(price=39.0, options=(("color", ("navy blue",)), ("size", ("large",))))
    assert webshop_reward(cheaper, goal, {"color": "navy blue", "size": "large"})[0] == pytest.approx(5 / 12)
    # The query matches: r_type 1.0 -> (2 + 2 + 1) / 6.
    same_query = make_product(price=39.0, query="shampoo")
    assert webshop_reward(same_query, goal, {"color": "navy blue", "size": "large"})[0] == pytest.approx(5 / 6)


def test_reward_type_factor_by_hand():
    goal = make_goal(nouns=tuple(f"n{i}" for i in range(12)))
    chosen = {"color": "navy blue", "size": "large"}
    base = {"price": 39.0, "options": (("color", ("navy blue",)), ("size", ("large",)))}
    # 1 noun in 12 (0.083 < 0.1): r_type 0.1 even though the query matches.
    score, details = webshop_reward(make_product(query="shampoo", nouns=("n0",), **base), goal, chosen)
    assert details["r_type"] == 0.1 and score == pytest.approx(5 / 6 * 0.1)
    # No noun in common: r_type 0, whatever else matches.
    score, details = webshop_reward(make_product(query="shampoo", nouns=("x",), **base), goal, chosen)
    assert details["r_type"] == 0.0 and score == 0.0
    # Three nouns in 12 (0.25 > 0.2): r_type 1.0 without query or category match.
    score, details = webshop_reward(make_product(nouns=("n0", "n1", "n2"), **base), goal, chosen)
    assert details["r_type"] == 1.0 and score == pytest.approx(5 / 6)
    # Two category levels in common: r_type 1.0 with a noun overlap of 2/12.
    shared = make_product(nouns=("n0", "n1"), category_path=("beauty", "hair care", "oil"), **base)
    assert webshop_reward(shared, goal, chosen)[1]["r_type"] == 1.0


def test_reward_option_rules_by_hand():
    goal = make_goal()
    product = make_product(price=39.0, query="shampoo", title="Kestra Red Shampoo Bar")
    # A wrong colour named in the title still counts (WebShop's rule); whole words only ("red" not in "covered").
    assert webshop_reward(product, goal, {"color": "red"})[1]["num_option_matches"] == 1
    covered = make_product(price=39.0, query="shampoo", description="A vegan bar, covered.")
    assert webshop_reward(covered, goal, {"color": "red"})[1]["num_option_matches"] == 0
    # No option chosen: nothing matched; r_option is the fraction of goal options.
    score, details = webshop_reward(covered, goal, {})
    assert details["r_option"] == 0.0 and score == pytest.approx((2 + 0 + 1) / 6)


# ---- verifier, teacher context, state ------------------------------------------------------------------------------


def test_verify_atoms_and_witness_steps_on_the_expert_path():
    env = small_env()
    env.reset({"seed": 6})
    goal = env.goal
    option_atoms = [f"option:{name}" for name, _ in goal.options]
    names = ["searched", "clicked_target_product", *option_atoms, "price_ok", "bought"]
    atoms = env.verify()
    assert [a.name for a in atoms] == names
    assert all(a.status == "unsat" and a.witness_step is None for a in atoms)
    deps = {a.name: a.depends_on for a in atoms}
    assert deps["searched"] == [] and deps["clicked_target_product"] == ["searched"]
    assert all(deps[o] == ["clicked_target_product"] for o in option_atoms + ["price_ok"])
    assert deps["bought"] == names[:-1]
    env.step("hello")  # step 0: invalid, still a step
    play(env, env.expert_plan())  # steps 1 (search), 2 (product), 3.. (options), last (buy)
    atoms = {a.name: a for a in env.verify()}
    assert all(a.status == "sat" for a in atoms.values())
    assert atoms["searched"].witness_step == 1 and atoms["clicked_target_product"].witness_step == 2
    assert [atoms[o].witness_step for o in option_atoms] == list(range(3, 3 + len(option_atoms)))
    assert atoms["price_ok"].witness_step == 2 and atoms["bought"].witness_step == 3 + len(option_atoms)


def test_verify_wrong_option_and_wrong_product():
    env = small_env()
    env.reset({"seed": 8})
    goal = env.goal
    product = env.catalogue.by_asin[goal.asin]
    env.step(f"search[{env.catalogue.expert_query(8)}]")
    env.step(f"click[{goal.asin.lower()}]")
    name, value = goal.options[0]
    wrong = next(v for v in dict(product.options)[name] if v != value)
    env.step(f"click[{value}]")  # step 2
    env.step(f"click[{wrong}]")  # step 3: overrides the right value
    atoms = {a.name: a for a in env.verify()}
    assert (atoms[f"option:{name}"].status, atoms[f"option:{name}"].witness_step) == ("unsat", 3)
    assert atoms["clicked_target_product"].status == "sat" and atoms["bought"].status == "unsat"
    # A product of another type: clicked_target_product is unsat, witnessed by the click on it.
    env.reset({"seed": 8})
    other = next(p for p in env.catalogue.products if p.query != goal.query)
    env.step(f"search[{other.title}]")
    env.step(f"click[{other.asin.lower()}]")
    atoms = {a.name: a for a in env.verify()}
    assert (atoms["clicked_target_product"].status, atoms["clicked_target_product"].witness_step) == ("unsat", 1)


def test_success_exactly_when_every_atom_is_sat():
    import random

    rng = random.Random(0)
    outcomes = set()
    env = small_env()
    for episode in range(120):
        env.reset({"seed": episode % 30})
        plan = env.expert_plan()
        done = False
        for t in range(12):
            if t < len(plan) and rng.random() < 0.85:
                action = plan[t]  # mostly the expert, sometimes a random button
            else:
                action = rng.choice(env.admissible_actions() or ["search[x]"])
                if action == "search[<your query>]":
                    action = f"search[{env.catalogue.expert_query(episode % 30)}]"
            _, _, done, info = env.step(action)
            if done:
                break
            plan = env.expert_plan()
        if done:
            all_sat = all(a.status == "sat" for a in env.verify())
            assert info["success"] == all_sat
            outcomes.add(all_sat)
    assert outcomes == {True, False}


def test_privileged_context_names_the_target():
    env = small_env()
    env.reset({"seed": 9})
    product = env.catalogue.by_asin[env.goal.asin]
    text = env.privileged_context()
    assert product.asin in text and product.title in text and env.catalogue.expert_query(9) in text
    assert all(f"{name}: {value}" in text for name, value in env.goal.options)


def test_snapshot_restore_and_state_key():
    env = small_env()
    env.reset({"seed": 10})
    assert env.state_key() == ("search",)
    plan = env.expert_plan()
    env.step(plan[0])
    key = env.state_key()
    assert key[0] == "results" and key[2] == 1
    env.step(plan[1])
    assert env.state_key() == ("item", env.goal.asin, ())
    snapshot, observation = env.snapshot(), env.page().render()
    future = play(env, plan[2:])
    env.restore(snapshot)
    assert env.page().render() == observation and play(env, plan[2:]) == future
    env.reset({"seed": 11})
    env.restore(snapshot)
    assert env.page().render() == observation


# ---- splits and arguments ------------------------------------------------------------------------------------------


def test_splits_and_bad_arguments():
    train, eval_rows = WebShopLite.task_split("train", 40, **SMALL), WebShopLite.task_split("eval", 40, **SMALL)
    assert train[0] == {"env": "webshop-lite", "seed": 0, "task_id": "webshop-lite-train-0", "num_products": 600}
    assert not {r["seed"] for r in train} & {r["seed"] for r in eval_rows}
    env = make_env("webshop-lite")  # the rows carry the catalogue size, so any instance plays the same task
    env.reset(train[3])
    other = small_env()
    other.reset({"seed": 3})
    assert env.goal == other.goal and len(env.catalogue.products) == 600
    with pytest.raises(ValueError, match="Unknown webshop-lite split"):
        WebShopLite.task_split("test")
    for kwargs, field in [
        ({"num_products": 0}, "num_products"),
        ({"catalogue_seed": -1}, "catalogue_seed"),
        ({"reward": "dense"}, "reward"),
    ]:
        with pytest.raises(ValueError, match=field):
            WebShopLite(**kwargs)
    with pytest.raises(ValueError, match="seed"):
        small_env().reset({"goal": 1})
    for kwargs, field in [
        ({"base_url": "localhost:3000"}, "base_url"),
        ({"timeout": 0}, "timeout"),
        ({"session_prefix": "a_b"}, "session_prefix"),
    ]:
        with pytest.raises(ValueError, match=field):
            WebShopServer(**kwargs)
    rows = WebShopServer.task_split("eval", 3)
    assert rows == [{"env": "webshop", "goal_index": i, "task_id": f"webshop-eval-{i}"} for i in range(3)]
    assert WebShopServer.task_split("train", 2)[0]["goal_index"] == 500
    assert len(WebShopServer.task_split("eval")) == 500


def test_missing_bm25s_names_the_extra(monkeypatch):
    import importlib.util

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "bm25s" else real_find_spec(name, *a)
    )
    with pytest.raises(ImportError, match=r"trl-agents\[envs\]"):
        WebShopLite()
    WebShopServer()  # the server client needs no optional package


def test_latency():
    get_catalogue.cache_clear()
    start = time.perf_counter()
    get_catalogue(0, 3000)
    build = time.perf_counter() - start
    env = WebShopLite()
    start = time.perf_counter()
    for seed in range(100):
        env.reset({"seed": 70_000 + seed})
    reset = (time.perf_counter() - start) / 100
    steps, start = 0, time.perf_counter()
    for seed in range(50):
        env.reset({"seed": seed})
        for action in env.expert_plan():
            env.step(action)
            steps += 1
    step = (time.perf_counter() - start) / steps
    assert build < 5.0 and reset < 0.05 and step < 0.02, (build, reset, step)


# ---- the client of a real WebShop server, against a loopback server ------------------------------------------------

CATALOGUE_ARGS = (0, 600)


def _q(value) -> str:
    return urllib.parse.quote(str(value), safe="")


class _WebShopSite(BaseHTTPRequestHandler):
    """Serves WebShop's routes (web_agent_site/app.py) with HTML shaped like its templates, from the WebShop-lite
    catalogue; session `fixed_<i>` plays the goal of WebShop-lite seed i."""

    def log_message(self, *args):  # keep the test output quiet
        pass

    def do_GET(self):
        self._route(b"")

    def do_POST(self):
        self._route(self.rfile.read(int(self.headers.get("Content-Length") or 0)))

    def _send(self, body: str, status: int = 200, location: str | None = None):
        data = body.encode()
        self.send_response(status)
        if location:
            self.send_header("Location", location)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _route(self, body: bytes):
        catalogue = get_catalogue(*CATALOGUE_ARGS)
        parts = [urllib.parse.unquote(p) for p in self.path.split("?")[0].strip("/").split("/")]
        session = parts[0] if len(parts) == 1 else parts[1]
        if "fixed_" not in session:
            return self._send("unknown session", status=404)
        goal = catalogue.goal(int(session.split("_")[-1]))
        header = f'<div id="instruction-text"><h4>Instruction: {html.escape(goal.instruction)}</h4></div>'
        back = f'<form method="post" action="/{session}"><button class="btn btn-success">Back to Search</button></form>'
        if len(parts) == 1:
            form = urllib.parse.parse_qs(body.decode())
            if "search_query" in form:
                keywords = form["search_query"][0].lower().split(" ")
                return self._send("", status=302, location=f"/search_results/{session}/{_q(keywords)}/1")
            return self._send(
                "<html><head><title>WebShop</title><style>h2 {}</style></head><body>"
                '<div id="logo"><h2>WebShop</h2></div>'
                f'<div id="instruction-text"><h4>Instruction: <br>{html.escape(goal.instruction)}</h4></div>'
                f'<form method="post" action="/{session}"><input id="search_input" type="text" name="search_query">'
                '<button class="btn btn-success" type="submit"><i class="icon"></i>Search</button></form>'
                "</body></html>"
            )
        kind = parts[0]
        if kind == "search_results":
            keywords, page = ast.literal_eval(parts[2]), int(parts[3])
            results = catalogue.search(" ".join(keywords))
            items = "".join(
                f'<div class="grid-item"><h4 class="product-asin"><a class="product-link" '
                f'href="/item_page/{session}/{asin}/{_q(keywords)}/{page}/{_q({})}">{asin}</a></h4>'
                f'<h4 class="product-title">{html.escape(catalogue.by_asin[asin].title)}</h4>'
                f'<h5 class="product-price">{catalogue.by_asin[asin].price_text}</h5></div>'
                for asin in results[(page - 1) * 10 : page * 10]
            )
            prev = (
                (
                    f'<form method="post" action="/search_results/{session}/{_q(keywords)}/{page - 1}">'
                    '<button class="btn btn-primary">&lt; Prev</button></form>'
                )
                if page > 1
                else ""
            )
            nxt = (
                (
                    f'<form method="post" action="/search_results/{session}/{_q(keywords)}/{page + 1}">'
                    '<button class="btn btn-primary">Next &gt;</button></form>'
                )
                if page * 10 < len(results)
                else ""
            )
            return self._send(
                f"<html><body>{header}{back}<p>Page {page} (Total results: {len(results)})</p>{prev}{nxt}"
                f"{items}</body></html>"
            )
        if kind == "done":
            asin, options = parts[2], ast.literal_eval(parts[3])
            score, _ = webshop_reward(catalogue.by_asin[asin], goal, options)
            return self._send(
                '<html><body><div id="thankyou"><h1>Thank you for shopping with us!</h1></div>'
                f'<div style="display:none"><h4 id="goal-asin">asin<pre>{goal.asin}</pre></h4></div>'
                f'<h3 id="reward">Your score (min 0.0, max 1.0)<pre>{score}</pre></h3></body></html>'
            )
        asin, keywords, page = parts[2], parts[3], parts[4]
        product = catalogue.by_asin[asin]
        options = ast.literal_eval(parts[-1])
        if kind == "item_sub_page":
            sub = parts[5]
            body_html = (
                f'<p class="product-info">{html.escape(product.description)}</p>'
                if sub == "Description"
                else "<ul>" + "".join(f"<li>{html.escape(f)}</li>" for f in product.features) + "</ul>"
            )
            return self._send(
                f'<html><body>{header}{back}<form method="post" action="/item_page/{session}/{asin}/'
                f'{_q(keywords)}/{page}/{_q(options)}"><button class="btn">&lt; Prev</button></form>'
                f"{body_html}</body></html>"
            )
        radios = ""
        for name, values in product.options:
            radios += f"<h4>{name}</h4>"
            for i, value in enumerate(values):
                url = f"/item_page/{session}/{asin}/{_q(keywords)}/{page}/{_q({**options, name: value})}"
                radios += (
                    f'<input type="radio" id="radio_{name}{i}" name="{name}" value="{value}" data-url="{url}">'
                    f'<label for="radio_{name}{i}">{value}</label>'
                )
        subs = "".join(
            f'<form method="post" action="/item_sub_page/{session}/{asin}/{_q(keywords)}/{page}/{sub}/{_q(options)}">'
            f'<button class="btn btn-primary" type="submit">{sub}</button></form>'
            for sub in ("Description", "Features")
        )
        return self._send(
            f'<html><body>{header}{back}<form method="post" action="/search_results/{session}/{_q(keywords)}/'
            f'{page}"><button class="btn">&lt; Prev</button></form>{radios}'
            f"<h2>{html.escape(product.title)}</h2><h4>Price: {product.price_text}</h4>{subs}"
            f'<form method="post" action="/done/{session}/{asin}/{_q(options)}"><button class="btn purchase">'
            "Buy Now</button></form><script>var options = {};</script></body></html>"
        )


@pytest.fixture(scope="module")
def webshop_site():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _WebShopSite)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_server_client_plays_like_webshop_lite(webshop_site):
    lite, client = WebShopLite(num_products=CATALOGUE_ARGS[1]), make_env("webshop", base_url=webshop_site)
    for seed in (0, 3, 12):
        assert client.reset({"goal_index": seed}) == lite.reset({"seed": seed})
        assert client.task_description() == lite.task_description()
        assert client.admissible_actions() == lite.admissible_actions() == ["search[<your query>]"]
        plan = lite.expert_plan()
        # Wander first (pages, sub-pages, options in reverse order), then follow the expert.
        _, value = lite.goal.options[-1]
        actions = [
            plan[0],
            "click[next >]",
            "click[< prev]",
            plan[1],
            "click[description]",
            "click[< prev]",
            f"click[{value}]",
            "click[features]",
            "click[< prev]",
            *plan[2:],
        ]
        for action in actions:
            expected, got = lite.step(action), client.step(action)
            assert got[0] == expected[0], action
            assert got[1:3] == expected[1:3] and got[3]["valid"] and got[3]["action"] == expected[3]["action"]
            assert client.admissible_actions() == lite.admissible_actions()
        assert got[1] == 1.0 and got[3]["success"] and got[3]["score"] == 1.0


def test_server_client_bad_actions_snapshot_and_partial_score(webshop_site):
    client = WebShopServer(base_url=webshop_site)
    client.reset({"goal_index": 5})
    goal = get_catalogue(*CATALOGUE_ARGS).goal(5)
    query = get_catalogue(*CATALOGUE_ARGS).expert_query(5)
    client.step(f"search[{query}]")
    key, page = client.state_key(), client.admissible_actions()
    for action in ("click[nonexistent]", "search[more shoes]", "click next"):
        observation, _, done, info = client.step(action)
        assert info["valid"] is False and not done and observation.startswith("Invalid action:")
        assert client.state_key() == key and client.admissible_actions() == page
    client.step(f"click[{goal.asin.lower()}]")
    snapshot = client.snapshot()
    future = play(client, ["click[buy now]"])
    assert future[0][2] and 0 < future[0][1] < 1 and not future[0][3]["success"]  # no option chosen
    client.restore(snapshot)
    assert play(client, ["click[buy now]"]) == future
    binary = WebShopServer(base_url=webshop_site, reward="binary")
    binary.reset({"goal_index": 5})
    assert play(binary, [f"search[{query}]", f"click[{goal.asin.lower()}]", "click[buy now]"])[-1][1] == 0.0


def test_server_client_errors(webshop_site):
    with pytest.raises(ValueError, match="goal_index"):
        WebShopServer(base_url=webshop_site).reset({"seed": 1})
    with pytest.raises(RuntimeError, match="answered 404"):
        WebShopServer(base_url=webshop_site).reset({"session": "nobody"})
    with pytest.raises(ConnectionError, match="Cannot reach the WebShop server"):
        WebShopServer(base_url="http://127.0.0.1:9", timeout=2).reset({"goal_index": 0})
    with pytest.raises(RuntimeError, match="reset"):
        WebShopServer(base_url=webshop_site).step("click[buy now]")


def test_parse_webshop_html_reads_the_real_templates_layout():
    # A results page shaped like WebShop's results_page.html (grid layout, old layout commented out).
    page = parse_webshop_html(
        "http://h/search_results/fixed_1/%5B%27tea%27%5D/1",
        '<div id="instruction-text"><h4 style="x">Instruction: i need tea</h4><h4>Current Query: tea</h4></div>'
        "<h1>Results</h1><p>Page 1 (1-10) of 12 total results</p>"
        '<form method="post" action="/fixed_1"><button type="submit" class="btn btn-success">Back to Search</button>'
        '</form><form method="post" action="/search_results/fixed_1/x/2"><button class="btn">Next &gt;</button></form>'
        '<!-- <a class="product-link" href="/old">B0OLD</a> -->'
        '<div class="grid-item"><img src="i.jpg" class="result-img"><h4><a class="product-link" '
        'href="/item_page/fixed_1/B0TEA/x/1/%7B%7D">B0TEA</a></h4><h4>Green Tea</h4><h5>$4.00</h5></div>',
    )
    assert page.instruction == "i need tea" and page.page.kind == "results"
    assert page.page.segments == (
        "Results",
        "Page 1 (1-10) of 12 total results",
        "Back to Search",
        "Next >",
        "B0TEA",
        "Green Tea",
        "$4.00",
    )
    assert page.page.clickables == ("back to search", "next >", "b0tea")
    targets = dict(page.targets)
    assert targets["b0tea"].method == "GET" and targets["b0tea"].url == "http://h/item_page/fixed_1/B0TEA/x/1/%7B%7D"
    assert targets["back to search"].method == "POST" and targets["back to search"].url == "http://h/fixed_1"


@pytest.mark.slow
def test_one_training_iteration(train_one_iteration):
    tasks = WebShopLite.task_split("train", 2, **SMALL)
    trainer = train_one_iteration("webshop-lite", tasks, env_kwargs=SMALL, max_turns=2)
    assert trainer.state.global_step == 1


@pytest.mark.slow
def test_one_training_iteration_through_the_server_client(webshop_site, train_one_iteration):
    tasks = [{"goal_index": 0}, {"goal_index": 3}]
    trainer = train_one_iteration("webshop", tasks, env_kwargs={"base_url": webshop_site}, max_turns=2)
    assert trainer.state.global_step == 1
