"""Tests of the Search-QA environment: the seeded knowledge base, questions, BM25 retrieval, rewards, the verifier
and the splits."""

import time

import pytest

from trl_agents.envs import make_env
from trl_agents.envs.checks import check_env
from trl_agents.envs.searchqa import (
    MAX_HOPS,
    SearchQA,
    _build_entities,
    exact_match,
    get_knowledge_base,
    normalize_answer,
    parse_action,
    token_f1,
)

SMALL = {"num_entities": 400}  # builds in a few ms; the default (2000) is used where the size matters


def small_env(**kwargs):
    return SearchQA(**SMALL, **kwargs)


def play(env, actions):
    return [env.step(action) for action in actions]


# ---- generation ----------------------------------------------------------------------------------------------------


def test_same_seed_same_knowledge_base_and_questions():
    assert _build_entities(0, 400) == _build_entities(0, 400)
    assert _build_entities(0, 400) != _build_entities(1, 400)
    first, second = small_env(), small_env()
    for task in ({"seed": 0}, {"seed": 7, "hops": 3}, {"seed": 1_000_001}):
        assert first.reset(task) == second.reset(task)
        assert first.task_description() == second.task_description()
        plan = first.expert_plan()
        assert plan == second.expert_plan()
        assert [o[:3] for o in play(first, plan)] == [o[:3] for o in play(second, plan)]
    # A different seed gives a different question (almost always: check a batch).
    env = small_env()
    assert len({(env.reset({"seed": s}), env.task_description())[1] for s in range(30)}) >= 28


def test_knowledge_base_facts_are_consistent():
    kb = get_knowledge_base(0, 400)
    kinds = {e.kind for e in kb.entities}
    assert kinds == {"person", "city", "country", "organisation", "book"}
    assert len({e.name.lower() for e in kb.entities}) == len(kb.entities)  # unique names
    for i, entity in enumerate(kb.entities):
        facts = dict(entity.facts)
        assert entity.name in entity.text
        if entity.kind == "country":  # a country's capital lies in that country
            assert kb.value(facts["capital"], "country") == i
        for relation, value in facts.items():
            if not relation.endswith("year"):
                assert kb.entities[value].name in entity.text  # every fact is stated in the document
            else:
                assert str(value) in entity.text


def test_questions_follow_the_gold_chain():
    env = small_env()
    for seed in range(40):
        for hops in range(1, MAX_HOPS + 1):
            env.reset({"seed": seed, "hops": hops})
            question = env.question
            assert question.hops == hops and len(question.supporting_docs) == hops
            assert len(set(question.chain[:-1])) == hops  # no entity visited twice
            # Walking the relations from the first entity reaches the answer.
            kb = env.knowledge_base
            entity = question.chain[0]
            for relation in question.relations[:-1]:
                entity = kb.value(entity, relation)
            assert kb.value_text(entity, question.relations[-1]) == question.answer
            assert question.text.endswith("?") and question.answer not in question.text


def test_bm25_retrieves_the_supporting_document_of_every_hop():
    env = SearchQA()  # the default 2000-entity knowledge base
    kb = None
    for seed in range(60):
        env.reset({"seed": seed, "hops": 1 + seed % MAX_HOPS})
        kb, question = env.knowledge_base, env.question
        for query, doc in zip(question.queries, question.supporting_docs):
            assert kb.search(query, 3)[0] == doc
    # A plain-language query for one entity's fact finds that entity's document too.
    person = next(i for i, e in enumerate(kb.entities) if e.kind == "person")
    assert person in kb.search(f"where was {kb.entities[person].name} born", 3)
    assert kb.search("zzzz qqqq", 3) == []  # unknown words: no result, no error


def test_bm25_index_ranking_rules():
    from trl_agents.envs.bm25 import BM25Index, tokenize

    assert tokenize("The Fox-like 2 cats of Port-Tir") == ["fox", "like", "cats", "port", "tir"]
    index = BM25Index(["", "red dog", "red dog", "blue cat", "the of and"])  # empty and stop-word-only documents
    assert index.search("red dog", k=5) == [1, 2]  # equal scores keep corpus order; no zero-score documents
    assert index.search("dog cat", k=5) == [3, 1, 2]  # "cat" is in one document, "dog" in two: rarer ranks first
    assert index.search("the of") == [] and index.search("") == []
    with pytest.raises(ValueError, match="k"):
        index.search("dog", k=0)
    with pytest.raises(ValueError, match="at least one document"):
        BM25Index([])


def test_missing_bm25s_names_the_extra(monkeypatch):
    import importlib.util

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "bm25s" else real_find_spec(name, *a)
    )
    with pytest.raises(ImportError, match=r"trl-agents\[envs\]"):
        SearchQA()


# ---- episodes ------------------------------------------------------------------------------------------------------


def test_check_env_with_expert_plan():
    for task in ({"seed": 3, "hops": 2}, {"seed": 11, "hops": 4}):
        env = small_env()
        env.reset(task)
        plan = env.expert_plan()
        assert len(plan) == task["hops"] + 1
        report = check_env(small_env, task, expert_actions=plan)
        assert set(report) == {"step_outputs", "determinism", "bad_action", "info_keys", "snapshot_restore",
                               "expert_episode"}


def test_expert_reaches_exact_match_on_every_split():
    env = SearchQA()
    for split in ("train", "eval", "unseen"):
        for task in SearchQA.task_split(split, 25):
            env.reset(task)
            for action in env.expert_plan():
                _, reward, done, info = env.step(action)
            assert done and reward == 1.0 and info["success"] and info["em"]


def test_observation_after_search_shows_passages():
    env = small_env()
    assert env.reset({"seed": 5, "hops": 2}) == "No documents retrieved yet."
    question, kb = env.question, env.knowledge_base
    observation, reward, done, info = env.step(f"search[{question.queries[0]}]")
    assert not done and reward == 0.0 and info["valid"] and info["action"] == f"search[{question.queries[0]}]"
    assert info["results"][0] == kb.doc_id(question.supporting_docs[0])
    assert observation.startswith(f"Last search returned: {', '.join(info['results'])} (3 new)\nRetrieved documents:")
    assert kb.passage(question.supporting_docs[0]) in observation
    # The same search again adds nothing; "all" keeps every document, "last" only the last results.
    repeated = env.step(f"search[{question.queries[0]}]")[0]
    assert "(0 new)" in repeated
    second = env.step(f"search[{question.queries[1]}]")[0]
    assert kb.passage(question.supporting_docs[0]) in second and kb.passage(question.supporting_docs[1]) in second
    last = small_env(observation="last")
    last.reset({"seed": 5, "hops": 2})
    last.step(f"search[{question.queries[0]}]")
    only_last = last.step(f"search[{question.queries[1]}]")[0]
    assert only_last.startswith("Search results:\n")
    assert kb.passage(question.supporting_docs[1]) in only_last
    assert only_last.count("\n[D") == 3  # exactly top_k=3 passages
    assert last.step("search[zzzz qqqq]")[0] == "Search results: no document matches this query."
    env = small_env(top_k=1)
    env.reset({"seed": 5, "hops": 2})
    assert len(env.step(f"search[{question.queries[0]}]")[3]["results"]) == 1


def test_bad_actions_are_rejected_without_changing_the_state():
    env = small_env()
    env.reset({"seed": 2, "hops": 2})
    env.step(f"search[{env.question.queries[0]}]")
    key, before = env.state_key(), env.render()
    cases = {
        "answer Port Zandria": "reply with exactly one action",  # no brackets
        "search for the founder": "reply with exactly one action",
        "search[a] then answer[b]": "reply with exactly one action",  # two actions
        "answer[]": "the answer text is empty",
        "search[   ]": "the search text is empty",
        "": "reply with exactly one action",
    }
    for action, message in cases.items():
        observation, reward, done, info = env.step(action)
        assert info["valid"] is False and info["success"] is False and info["action"] is None
        assert reward == 0.0 and done is False
        assert observation == f"Invalid action: {message}" + observation.split(message, 1)[1]
        assert observation.endswith(before)
        assert env.state_key() == key
    # Parsing reads the answer region: the last <action> block, or the text without <think>.
    assert parse_action("<think>search[x]</think>answer[Lodairdvale]") == ("answer", "Lodairdvale")
    assert parse_action("<action>SEARCH[ a   b ]</action>") == ("search", "a b")
    assert parse_action(None) is None


def test_episode_ends_on_answer():
    env = small_env()
    env.reset({"seed": 4})
    observation, reward, done, info = env.step("answer[somebody]")
    assert done and reward == 0.0 and info["valid"] and not info["success"] and info["em"] is False
    assert observation == "You answered: somebody (incorrect)."
    assert env.expert_plan() is None
    with pytest.raises(RuntimeError, match="reset"):
        env.step("answer[again]")


# ---- reward ---------------------------------------------------------------------------------------------------------


def test_exact_match_and_f1_by_hand():
    assert normalize_answer("The  Port-Zandria!") == "portzandria"  # punctuation is removed, not spaced
    assert normalize_answer("An apple, a pear") == "apple pear"
    assert exact_match("the Port Zandria.", "Port Zandria")
    assert not exact_match("Port Zandria city", "Port Zandria")
    assert exact_match("1987", " 1987 ")
    # F1: precision = common / predicted tokens, recall = common / gold tokens.
    assert token_f1("Port Zandria city", "Port Zandria") == pytest.approx(0.8)  # p=2/3, r=1
    assert token_f1("Zandria", "Port Zandria") == pytest.approx(2 / 3)  # p=1, r=1/2
    assert token_f1("port port", "port zandria") == pytest.approx(0.5)  # one shared token: p=1/2, r=1/2
    assert token_f1("Lodairdvale", "Port Zandria") == 0.0
    assert token_f1("the", "Port Zandria") == 0.0  # nothing left after normalisation


def test_reward_modes():
    env = small_env(reward="f1")
    env.reset({"seed": 8, "hops": 1})
    gold = env.question.answer
    wrong = f"{gold} and more words"
    _, reward, done, info = env.step(f"answer[{wrong}]")
    assert done and not info["success"] and reward == pytest.approx(token_f1(wrong, gold)) and 0 < reward < 1
    env.reset({"seed": 8, "hops": 1})
    assert env.step(f"answer[{gold.upper()}]")[1] == 1.0
    em = small_env()
    em.reset({"seed": 8, "hops": 1})
    _, reward, _, info = em.step(f"answer[{wrong}]")
    assert reward == 0.0 and info["f1"] == pytest.approx(token_f1(wrong, gold))


# ---- verifier, teacher context, state ------------------------------------------------------------------------------


def test_verify_atoms_and_witness_steps():
    env = small_env()
    env.reset({"seed": 6, "hops": 3})
    question, kb = env.question, env.knowledge_base
    names = [f"retrieved:{kb.doc_id(d)}" for d in question.supporting_docs]
    atoms = env.verify()
    assert [a.name for a in atoms] == names + ["answered_correctly"]
    assert all(a.status == "unsat" and a.witness_step is None for a in atoms)
    assert [a.depends_on for a in atoms] == [[], names[:1], names[1:2], names]
    env.step("search[zzzz qqqq]")  # step 0: nothing
    env.step("not an action")  # step 1: invalid, still counts as a step
    env.step(f"search[{question.queries[0]}]")  # step 2: hop 1
    env.step(f"search[{question.queries[1]}]")  # step 3: hop 2
    atoms = {a.name: a for a in env.verify()}
    assert (atoms[names[0]].status, atoms[names[0]].witness_step) == ("sat", 2)
    assert (atoms[names[1]].status, atoms[names[1]].witness_step) == ("sat", 3)
    assert atoms[names[2]].status == "unsat"
    env.step(f"search[{question.queries[2]}]")  # step 4
    env.step(f"search[{question.queries[0]}]")  # step 5: repeats hop 1; the witness stays the first retrieval
    env.step(f"answer[{question.answer}]")  # step 6
    atoms = env.verify()
    assert [(a.status, a.witness_step) for a in atoms] == [("sat", 2), ("sat", 3), ("sat", 4), ("sat", 6)]
    # A wrong answer: the answer atom is unsat, witnessed by the answer step.
    env.reset({"seed": 6, "hops": 3})
    env.step("answer[nobody]")
    assert [(a.status, a.witness_step) for a in env.verify()][-1] == ("unsat", 0)


def test_privileged_context_states_the_chain():
    env = small_env()
    env.reset({"seed": 9, "hops": 3})
    text = env.privileged_context()
    question, kb = env.question, env.knowledge_base
    assert text.startswith("Reasoning chain:\n1. [")
    for doc in question.supporting_docs:
        assert f"[{kb.doc_id(doc)}]" in text
    assert text.endswith(f"Answer: {question.answer}")
    assert len(text.splitlines()) == 3 + 2


def test_snapshot_restore_and_state_key():
    env = small_env()
    env.reset({"seed": 1, "hops": 2})
    start = env.state_key()
    assert start == ((), None, 0, None)
    env.step(f"search[{env.question.queries[0]}]")
    snapshot, key, observation = env.snapshot(), env.state_key(), env.render()
    assert key != start and key[0] == key[1]
    future = play(env, env.expert_plan())
    env.restore(snapshot)
    assert env.state_key() == key and env.render() == observation
    assert play(env, env.expert_plan()) == future
    # Snapshots survive a reset to another task.
    env.reset({"seed": 2})
    env.restore(snapshot)
    assert env.render() == observation
    # The same evidence reached by different routes is the same state.
    a, b = small_env(), small_env()
    for e in (a, b):
        e.reset({"seed": 1, "hops": 2})
    a.step("search[zzzz]")
    a.step(f"search[{a.question.queries[0]}]")
    b.step(f"search[{b.question.queries[0]}]")
    assert a.state_key() == b.state_key() and a.render() == b.render()


# ---- splits and arguments ------------------------------------------------------------------------------------------


def test_splits():
    train, eval_rows, unseen = (SearchQA.task_split(s, 50, **SMALL) for s in ("train", "eval", "unseen"))
    assert train[0] == {"env": "searchqa", "seed": 0, "task_id": "searchqa-train-0", "num_entities": 400}
    seeds = [{r["seed"] for r in rows} for rows in (train, eval_rows, unseen)]
    assert not (seeds[0] & seeds[1]) and not (seeds[0] & seeds[2]) and not (seeds[1] & seeds[2])
    assert all(r["hops"] == MAX_HOPS for r in unseen) and all("hops" not in r for r in train)
    env = make_env("searchqa", **SMALL)
    train_hops = set()
    for row in train:
        env.reset(row)
        train_hops.add(env.question.hops)
    assert train_hops == {1, 2, 3}  # the default range; unseen questions are longer than any of them
    env.reset(unseen[0])
    assert env.question.hops == MAX_HOPS
    assert len(SearchQA.task_split("eval")) == 200
    with pytest.raises(ValueError, match="Unknown searchqa split"):
        SearchQA.task_split("test")


def test_bad_arguments():
    for kwargs, field in [
        ({"num_entities": 5}, "num_entities"),
        ({"hops": 0}, "hops"),
        ({"hops": (2, 1)}, "hops"),
        ({"hops": 5}, "hops"),
        ({"top_k": 0}, "top_k"),
        ({"reward": "accuracy"}, "reward"),
        ({"observation": "history"}, "observation"),
    ]:
        with pytest.raises(ValueError, match=field):
            SearchQA(**kwargs)
    env = small_env()
    with pytest.raises(ValueError, match="seed"):
        env.reset({"question": "?"})
    with pytest.raises(ValueError, match="hops"):
        env.reset({"seed": 0, "hops": 9})
    with pytest.raises(RuntimeError, match="reset"):
        SearchQA().step("answer[x]")


def test_latency():
    get_knowledge_base.cache_clear()
    start = time.perf_counter()
    get_knowledge_base(0, 2000)
    build = time.perf_counter() - start
    env = SearchQA()
    start = time.perf_counter()
    for seed in range(100):
        env.reset({"seed": 50_000 + seed})
    reset = (time.perf_counter() - start) / 100
    start = time.perf_counter()
    for i in range(200):
        env.step(f"search[{env.question.queries[0]} {i}]")
    search = (time.perf_counter() - start) / 200
    assert build < 5.0 and reset < 0.05 and search < 0.01, (build, reset, search)


@pytest.mark.slow
def test_one_training_iteration(train_one_iteration):
    tasks = SearchQA.task_split("train", 2, **SMALL)
    trainer = train_one_iteration("searchqa", tasks, env_kwargs=SMALL, max_turns=2)
    assert trainer.state.global_step == 1
