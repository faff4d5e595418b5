"""Publishing to the Hub, round trip against the loopback Hub server: model, LoRA adapter, card with eval results,
`.eval_results/`, trajectories, TRL's own `push_to_hub`, and the errors (bad repo id, no token, refused token,
unreachable endpoint) that must leave the run directory as it was.

huggingface_hub, datasets and transformers read `HF_ENDPOINT` when they are imported, and this test process imported
them already (in offline mode), so every check that talks to a server runs its client code in a subprocess with
`LoopbackHubServer.client_env()`; the assertions stay here.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from datasets import Dataset
from helpers import checkout_env, free_port

import trl_agents
from trl_agents.cli import main
from trl_agents.evaluation import EVAL_METRICS, to_eval_result, write_eval_result
from trl_agents.hub import METRIC_NAMES, eval_result_files, push_run, render_model_card
from trl_agents.loopback import LoopbackHubServer
from trl_agents.records import load_trajectories

TOKEN = "hf_loopback_token"
EVAL_RESULTS = {
    "keyword-eval-greedy": {"greedy": True, "num_samples": 1, "num_episodes": 8,
                            "metrics": {"success_rate": 0.375, "episode_return": 0.5, "episode_length": 2.0,
                                        "valid_action_rate": 1.0}},
    "keyword-eval-sampled": {"greedy": False, "num_samples": 4, "num_episodes": 32,
                             "metrics": {"success_rate": 0.25, "episode_return": 0.4, "episode_length": 1.5,
                                         "valid_action_rate": 0.75, "pass_at_4": 0.625}},
}


# ---- a realistic run directory ------------------------------------------------------------------------------------


def write_run_records(run_dir: Path, method: str = "gigpo", base_model: str = "Qwen/Qwen2.5-0.5B-Instruct") -> None:
    """What a finished run has besides the model: run_info.json, eval/*.json (the shared formats) and the plot."""
    from trl_agents.run import plot_learning_curve

    config = {"env_name": "test-keyword", "max_turns": 2, "num_generations": 2, "learning_rate": 0.01,
              "step_advantage_w": 1.0, "system_prompt": "Say a | b"}
    from trl_agents.trainers import get_method

    run_info = {"method": method, "method_card": get_method(method).card_info(), "env": "test-keyword", "model": base_model, "config": config,
                "config_hash": "0123456789abcdef", "trl_agents_version": trl_agents.__version__,
                "trl_version": "1.16.0", "created": "2026-01-02T03:04:05+00:00"}
    (run_dir / "run_info.json").write_text(json.dumps(run_info))
    for name, values in EVAL_RESULTS.items():
        settings = {key: value for key, value in values.items() if key != "metrics"}
        result = {"env": "test-keyword", "split": "eval", "num_tasks": 8, "temperature": 1.0, "max_turns": 2,
                  "train_max_turns": 2, **settings, **values["metrics"]}  # as evaluate_policy returns it
        write_eval_result(run_dir, to_eval_result(result, model=str(run_dir), name=name))
    history = {"rl": [{"step": 1, "env/success_rate": 0.25}]}
    evals = {"method": method, "env": "test-keyword", "seed": 0, "eval_before_rl": {"success_rate": 0.25},
             "eval_after_rl": {"success_rate": 0.375}}
    plot_learning_curve(history, evals, str(run_dir / "learning_curve.png"))


@pytest.fixture(scope="module")
def runs(tiny_model_dir, tmp_path_factory):
    """{"full": RUN_DIR, "lora": RUN_DIR}: one GiGPO step on the tiny model, saved, plus run_info and eval results."""
    from peft import LoraConfig

    from trl_agents import GiGPOConfig, GiGPOTrainer
    from trl_agents.testing import tiny_training_config

    tasks = Dataset.from_list([{"env": "test-keyword", "seed": seed} for seed in range(2)])
    runs = {}
    for kind in ("full", "lora"):
        run_dir = tmp_path_factory.mktemp(f"run-{kind}")
        config = tiny_training_config(GiGPOConfig, run_dir, env_name="test-keyword", max_steps=1, max_turns=2,
                                      per_device_train_batch_size=4, num_generations=2)
        peft_config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
        trainer = GiGPOTrainer(model=tiny_model_dir, args=config, train_dataset=tasks,
                               peft_config=peft_config if kind == "lora" else None)
        trainer.train()
        trainer.save_model()
        write_run_records(run_dir)
        runs[kind] = run_dir
    return runs


def tree_hash(folder: Path) -> str:
    """Names, contents and modification times of every file below `folder`."""
    digest = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            digest.update(f"{path.relative_to(folder)}:{path.stat().st_mtime_ns}:".encode() + path.read_bytes())
    return digest.hexdigest()


def run_python(env: dict[str, str], code: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], env=checkout_env(env),
                          capture_output=True, text=True, timeout=600, check=False)


def result_of(done: subprocess.CompletedProcess) -> dict:
    """The JSON the client printed on its last line (`RESULT {...}`)."""
    assert done.returncode == 0, done.stderr[-6000:]
    return json.loads(done.stdout.strip().splitlines()[-1].removeprefix("RESULT "))


# ---- round trips ---------------------------------------------------------------------------------------------------

KEYWORD_ENV = textwrap.dedent("""
    from trl_agents.envs import AgentEnv, register_env

    @register_env
    class KeywordEnv(AgentEnv):  # conftest.py's test-keyword, as far as a push reads it
        name, instructions = "test-keyword", "Say something with the letter a."

        @classmethod
        def task_split(cls, split, count=None, **env_kwargs):
            return [{"env": cls.name, "seed": 10_000 + i} for i in range(count or 64)]
""")

PUSH_AND_READ_BACK = """
    import json, sys, yaml
    import torch
    from datasets import load_dataset
    from huggingface_hub import DatasetCard, HfApi, ModelCard, hf_hub_download, parse_eval_result_entries
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl_agents.hub import push_run
    from trl_agents.checkpoints import load_agent_config

    def edited_card(repo, run_dir, name):
        # Edit the card on the Hub (a license, a tag, its own body), push the run again, read it back.
        own = "---\\nlicense: mit\\ntags: [mine]\\n---\\nMy own words about this agent.\\n"
        HfApi().upload_file(path_or_fileobj=own.encode(), path_in_repo="README.md", repo_id=repo)
        push_run(run_dir, name)
        card = ModelCard.load(repo)
        return {"license": card.data.license, "tags": card.data.tags, "text": card.text,
                "results": len(card.data.eval_results or [])}

    run_dir, name, repo, env = sys.argv[1:]
    exec(env)  # the tests' toy env, whose held-out tasks become a benchmark dataset
    urls = push_run(run_dir, name)  # no namespace: the token's user
    pushed, local = AutoModelForCausalLM.from_pretrained(repo), AutoModelForCausalLM.from_pretrained(run_dir)
    weights_equal = all(torch.equal(a, b) for a, b in zip(pushed.state_dict().values(), local.state_dict().values()))
    tokenizer = AutoTokenizer.from_pretrained(repo)
    card = ModelCard.load(repo)
    files = HfApi().list_repo_files(repo)
    entries = {name: [(e.dataset_id, e.task_id, e.value) for e in parse_eval_result_entries(
                   yaml.safe_load(open(hf_hub_download(repo, name))))]
               for name in files if name.startswith(".eval_results/")}
    print("RESULT " + json.dumps({
        "urls": urls, "weights_equal": weights_equal, "files": files,
        "chat_template": tokenizer.chat_template == AutoTokenizer.from_pretrained(run_dir).chat_template,
        "rows": load_dataset(repo + "-trajectories", split="train").to_list(),
        "card_results": [(r.dataset_config, r.metric_type, r.metric_value) for r in card.data.eval_results],
        "tags": card.data.tags, "base_model": card.data.base_model, "datasets": card.data.datasets,
        "card_text": card.text, "eval_entries": entries, "agent_config": load_agent_config(repo),
        "benchmark": HfApi().list_repo_files("tester/test-keyword-eval-tasks", repo_type="dataset"),
        "eval_yaml": yaml.safe_load(open(hf_hub_download("tester/test-keyword-eval-tasks", "eval.yaml",
                                                         repo_type="dataset"))),
        "benchmark_rows": load_dataset("tester/test-keyword-eval-tasks", split="test").to_list(),
        "dataset_card": DatasetCard.load(repo + "-trajectories").data.to_dict(),
        "edited": edited_card(repo, run_dir, name),
    }))
"""


@pytest.mark.slow
def test_push_run_round_trip(runs, tmp_path):
    run_dir = runs["full"]
    before = tree_hash(run_dir)
    with LoopbackHubServer(token=TOKEN) as hub:
        result = result_of(run_python(hub.client_env(str(tmp_path)), PUSH_AND_READ_BACK, str(run_dir),
                                      "tiny-agent", "tester/tiny-agent", KEYWORD_ENV))
        assert hub.unknown_requests == []
        assert hub.count("lfs-upload") >= 2  # model.safetensors and the trajectories' parquet went through LFS
    assert tree_hash(run_dir) == before

    assert result["urls"]["model"].endswith("/tester/tiny-agent")
    assert result["urls"]["dataset"].endswith("/datasets/tester/tiny-agent-trajectories")
    # checkpoint -> from_pretrained
    assert result["weights_equal"] and result["chat_template"]
    assert {"config.json", "model.safetensors", "agent_config.json", "run_info.json", "learning_curve.png",
            "README.md", "eval/keyword-eval-greedy.json"} <= set(result["files"])
    assert not any(name.startswith("trajectories/") for name in result["files"])
    assert result["agent_config"] == json.loads((run_dir / "agent_config.json").read_text())
    # trajectories -> load_dataset returns identical rows
    assert result["rows"] == load_trajectories(str(run_dir)).to_list() and len(result["rows"]) == 8
    # eval results -> model-index parsed by huggingface_hub, and .eval_results/*.yaml
    expected = sorted((name, metric, value) for name, values in EVAL_RESULTS.items()
                      for metric, value in values["metrics"].items())
    assert sorted(map(tuple, result["card_results"])) == expected
    # .eval_results name the benchmark dataset push_run published: the 8 held-out tasks played, and an eval.yaml
    greedy = result["eval_entries"][".eval_results/keyword-eval-greedy.yaml"]
    assert ["tester/test-keyword-eval-tasks", "success_rate", 0.375] in greedy and len(greedy) == 4
    assert ["tester/test-keyword-eval-tasks", "pass_at_4", 0.625] in result["eval_entries"][
        ".eval_results/keyword-eval-sampled.yaml"]
    assert "eval.yaml" in result["benchmark"]
    assert {task["id"] for task in result["eval_yaml"]["tasks"]} >= {"success_rate", "pass_at_4"}
    assert [json.loads(row["task"])["seed"] for row in result["benchmark_rows"]] == list(range(10_000, 10_008))
    # The trajectory dataset's card says what it is.
    data = result["dataset_card"]
    assert data["pretty_name"] == "gigpo trajectories on test-keyword" and data["size_categories"] == ["n<1K"]
    assert {"trl", "trl-agents", "trajectories", "gigpo", "test-keyword"} <= set(data["tags"])
    # A second push keeps what was edited on the Hub (the license, a tag, the body) and updates the rest.
    edited = result["edited"]
    assert edited["license"] == "mit" and {"mine", "trl-agents", "gigpo"} <= set(edited["tags"])
    assert edited["text"].strip() == "My own words about this agent." and edited["results"] == len(expected)
    assert result["tags"][:3] == ["trl", "trl-agents", "gigpo"] and "test-keyword" in result["tags"]
    assert result["base_model"] == "Qwen/Qwen2.5-0.5B-Instruct"
    assert result["datasets"] == ["tester/tiny-agent-trajectories"]
    assert "datasets/tester/tiny-agent-trajectories" in result["card_text"]
    assert "![Learning curve" in result["card_text"] and "(run_info.json)" in result["card_text"]


PUSH_LORA_WITH_THE_CLI = """
    import json, sys
    import torch
    from huggingface_hub import HfApi, ModelCard
    from peft import AutoPeftModelForCausalLM
    from safetensors.torch import load_file
    from trl_agents.cli import main

    run_dir, repo, env = sys.argv[1:]
    exec(env)
    main(["push", run_dir, "--repo", repo, "--no_trajectories", "--no_eval_tasks", "--private",
          "--include", "trajectories"])
    model = AutoPeftModelForCausalLM.from_pretrained(repo)
    saved = load_file(run_dir + "/adapter_model.safetensors")
    loaded = {name.replace(".default", ""): p for name, p in model.named_parameters() if "lora_" in name}
    same = saved.keys() == loaded.keys() and all(torch.equal(saved[k], loaded[k].detach()) for k in saved)
    card = ModelCard.load(repo)
    print("RESULT " + json.dumps({"lora_weights_equal": same, "files": HfApi().list_repo_files(repo),
                                  "library_name": card.data.library_name, "tags": card.data.tags,
                                  "text": card.text}))
"""


@pytest.mark.slow
def test_lora_run_pushes_an_adapter_that_peft_loads(runs, tmp_path):
    run_dir = runs["lora"]
    before = tree_hash(run_dir)
    with LoopbackHubServer(token=TOKEN) as hub:
        done = run_python(hub.client_env(str(tmp_path)), PUSH_LORA_WITH_THE_CLI, str(run_dir), "tester/tiny-lora",
                          KEYWORD_ENV)
        result = result_of(done)
        assert hub.unknown_requests == []
        # --no_trajectories, --no_eval_tasks: no dataset repo, no .eval_results
        assert list(hub.repos) == [("model", "tester/tiny-lora")]
        assert not [name for name in hub.files("tester/tiny-lora") if name.startswith(".eval_results/")]
        assert hub.repos[("model", "tester/tiny-lora")].private
    assert tree_hash(run_dir) == before
    assert "model: http://127.0.0.1" in done.stdout and "trajectories:" not in done.stdout
    assert result["lora_weights_equal"]
    assert {"adapter_config.json", "adapter_model.safetensors"} <= set(result["files"])
    assert "model.safetensors" not in result["files"]
    # a side folder goes in only when asked (--include): here the shards, as they are
    assert sorted(f for f in result["files"] if f.startswith("trajectories/")) == [
        f"trajectories/{path.name}" for path in sorted((run_dir / "trajectories").glob("shard-*.parquet"))]
    assert result["library_name"] == "peft" and "lora" in result["tags"]
    assert "AutoPeftModelForCausalLM" in result["text"] and "adapter" in result["text"]


TRL_PUSH_TO_HUB = """
    import json, sys
    from huggingface_hub import HfApi
    from datasets import Dataset
    from trl_agents import GiGPOConfig, GiGPOTrainer
    from trl_agents.envs import get_env_class
    from trl_agents.testing import tiny_training_config

    base_model, output_dir, repo = sys.argv[1:]
    tasks = Dataset.from_list(get_env_class("frozenlake").task_split("train", 2))
    config = tiny_training_config(GiGPOConfig, output_dir, env_name="frozenlake", max_steps=1, max_turns=2,
                                  per_device_train_batch_size=4, num_generations=2, push_to_hub=True,
                                  hub_model_id=repo)
    trainer = GiGPOTrainer(model=base_model, args=config, train_dataset=tasks)
    trainer.train()
    trainer.push_to_hub()
    print("RESULT " + json.dumps({"tags": GiGPOTrainer._tag_names,
                                  "trajectories": HfApi().list_repo_files(repo + "-trajectories",
                                                                          repo_type="dataset")}))
"""


@pytest.mark.slow
def test_trainer_push_to_hub_publishes_the_run_as_trl_agents_push_does(tiny_model_dir, tmp_path):
    from huggingface_hub import ModelCard

    with LoopbackHubServer(token=TOKEN) as hub:
        result = result_of(run_python(hub.client_env(str(tmp_path / "home")), TRL_PUSH_TO_HUB, tiny_model_dir,
                                      str(tmp_path / "out"), "tester/trl-push"))
        assert hub.unknown_requests == []
        files = hub.files("tester/trl-push")
    assert {"model.safetensors", "config.json", "agent_config.json", "README.md"} <= set(files)
    assert json.loads(files["agent_config.json"])["env_name"] == "frozenlake"
    card = ModelCard(files["README.md"].decode())
    assert set(result["tags"]) == {"trl", "trl-agents", "gigpo"} <= set(card.data.tags)
    assert "frozenlake" in card.data.tags
    assert "on the **frozenlake** environment with **gigpo**" in card.text  # trl-agents' card, not TRL's
    # push_run, not an upload of the whole output_dir: the trajectories went to their dataset repo.
    assert not [name for name in files if name.startswith(("trajectories/", "base-model/", "warm-start/"))]
    assert any(name.endswith(".parquet") for name in result["trajectories"])


# ---- errors leave the run as it was --------------------------------------------------------------------------------

PUSH_WITH_THE_CLI = """
    import sys
    from trl_agents.cli import main

    main(["push", *sys.argv[1:]])
"""


@pytest.mark.slow
def test_unreachable_endpoint_and_refused_token_are_clear_errors(runs, tmp_path):
    run_dir = runs["full"]
    before = tree_hash(run_dir)
    with LoopbackHubServer(token=TOKEN) as hub:
        env = hub.client_env(str(tmp_path))
        endpoint = f"http://127.0.0.1:{free_port()}"  # nothing listens there
        unreachable = run_python({**env, "HF_ENDPOINT": endpoint}, PUSH_WITH_THE_CLI, str(run_dir), "--repo", "a/b")
        refused = run_python(hub.client_env(str(tmp_path), token="hf_wrong"), PUSH_WITH_THE_CLI, str(run_dir),
                             "--repo", "tester/tiny-agent")
        assert hub.repos == {} and hub.count("repos/create") == 1
    assert unreachable.returncode != 0 and refused.returncode != 0
    assert f"trl-agents push: error: Cannot reach the Hub at {endpoint}" in unreachable.stderr
    assert "Traceback" not in unreachable.stderr + refused.stderr
    assert "refused the token (401 Unauthorized): run `hf auth login`, or pass --token" in refused.stderr
    assert f"Nothing in {run_dir} was changed" in refused.stderr
    assert tree_hash(run_dir) == before


PUSH_RESULTS_WITH_THE_CLI = """
    import json, sys
    from datasets import load_dataset
    from trl_agents.cli import main

    path, repo = sys.argv[1:]
    main(["push", path, "--repo", repo])
    print("RESULT " + json.dumps({"rows": load_dataset(repo, split="train").to_list()}))
"""


def test_a_results_table_is_pushed_as_a_dataset(tmp_path):
    # benchmarks/evidence.py's per-seed rows (`evidence_runs.parquet`): `trl-agents push TABLE.parquet --repo ...`
    rows = [{"method": "grpo", "seed": 0, "success_after": 0.25}, {"method": "gigpo", "seed": 0, "success_after": 0.5}]
    path = tmp_path / "evidence_runs.parquet"
    Dataset.from_list(rows).to_parquet(str(path))
    with LoopbackHubServer(token=TOKEN) as hub:
        done = run_python(hub.client_env(str(tmp_path)), PUSH_RESULTS_WITH_THE_CLI, str(path), "tester/evidence")
        result = result_of(done)
        assert hub.unknown_requests == []
    assert "results: " in done.stdout and "/datasets/tester/evidence" in done.stdout
    assert result["rows"] == rows
    with pytest.raises(ValueError, match="is not a parquet file: give a results table"):
        from trl_agents.hub import push_results

        push_results(str(tmp_path / "missing.parquet"), "me/results")


def test_bad_repo_id_and_bad_run_dir_fail_before_any_network_call(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.json").write_text("{}")
    (run_dir / "model.safetensors").write_bytes(b"weights")
    (run_dir / "trajectories").mkdir()
    (run_dir / "trajectories" / "shard-000000-rank00.parquet").write_bytes(b"")
    before = tree_hash(run_dir)
    with pytest.raises(ValueError, match=r"--repo 'not a repo' is not a valid Hub repo id: use 'user/name'"):
        push_run(str(run_dir), "not a repo")
    with pytest.raises(ValueError, match=r"--dataset_repo 'me/x--y' is not a valid Hub repo id"):
        push_run(str(run_dir), "me/model", dataset_repo_id="me/x--y")
    with pytest.raises(ValueError, match="holds no saved model: expected config.json"):
        push_run(str(tmp_path), "me/model")
    with pytest.raises(ValueError, match="is not a directory"):
        push_run(str(tmp_path / "missing"), "me/model")
    with pytest.raises(ValueError, match=r"--include 'warm-start' is not a folder of RUN_DIR .*: choose among "
                                         r"trajectories"):
        push_run(str(run_dir), "me/model", include_folders=["warm-start"])
    with pytest.raises(SystemExit, match="trl-agents push: error: --repo 'a/b/c' is not a valid Hub repo id"):
        main(["push", str(run_dir), "--repo", "a/b/c"])
    assert tree_hash(run_dir) == before


def test_no_token_for_the_hub_and_offline_mode(tmp_path, monkeypatch):
    from huggingface_hub import constants

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "adapter_config.json").write_text("{}")
    (run_dir / "adapter_model.safetensors").write_bytes(b"weights")
    before = tree_hash(run_dir)
    # The Hub itself and no token anywhere: not in the environment, none stored by `hf auth login`.
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    monkeypatch.setattr(constants, "ENDPOINT", "https://huggingface.co")
    with pytest.raises(PermissionError, match=r"No Hugging Face token: run `hf auth login`, or pass --token / set"):
        push_run(str(run_dir), "me/model")
    # This test process runs with HF_HUB_OFFLINE=1 (conftest).
    with pytest.raises(ConnectionError, match="HF_HUB_OFFLINE is set, so nothing can be pushed"):
        push_run(str(run_dir), "me/model", token="hf_anything")
    assert tree_hash(run_dir) == before


# ---- the card ------------------------------------------------------------------------------------------------------


def test_model_card_shows_method_env_settings_results_and_links(tmp_path):
    from huggingface_hub import ModelCard

    write_run_records(tmp_path, method="gigpo")
    (tmp_path / "agent_config.json").write_text(json.dumps({"env_name": "test-keyword", "max_turns": 2}))
    card = ModelCard(str(render_model_card(str(tmp_path), "me/kw-agent", dataset_repo_id="me/kw-steps")))
    text = card.text
    assert "on the **test-keyword** environment with **gigpo** ([arXiv 2505.10978](https://arxiv.org/abs/2505.10978))" \
        in text
    assert "| keyword-eval-greedy | eval | 8 | 8 | greedy | 2 | 0.375 | 0.500 | 2.000 | 1.000 | - |" in text
    assert "| keyword-eval-sampled | eval | 8 | 32 | sampled (T=1.0), 4 samples | 2 | 0.250 | 0.400 | 1.500 | 0.750 " \
           "| 0.625 |" in text
    assert "| `max_turns` | 2 |" in text and "| `step_advantage_w` | 1.0 |" in text  # common + the method's own
    assert "[`run_info.json`](run_info.json) (config hash `0123456789abcdef`)" in text
    assert "![Learning curve: training success per RL step and held-out success](learning_curve.png)" in text
    assert "[me/kw-steps](https://huggingface.co/datasets/me/kw-steps)" in text
    assert 'AutoModelForCausalLM.from_pretrained("me/kw-agent")' in text
    assert "trl-agents eval --model_name_or_path me/kw-agent --env_name test-keyword" in text
    data = card.data
    assert data.library_name == "transformers" and data.base_model == "Qwen/Qwen2.5-0.5B-Instruct"
    assert data.datasets == ["me/kw-steps"] and data.model_name == "kw-agent"
    values = {(r.dataset_config, r.metric_type): r.metric_value for r in data.eval_results}
    assert values[("keyword-eval-greedy", "success_rate")] == 0.375
    assert values[("keyword-eval-sampled", "pass_at_4")] == 0.625
    assert {r.task_type for r in data.eval_results} == {"reinforcement-learning"}


def test_model_card_of_a_grpo_adapter_cites_the_paper_and_skips_local_base_models(tmp_path):
    from huggingface_hub import ModelCard

    write_run_records(tmp_path, method="grpo", base_model=str(tmp_path))  # a local path is no Hub base model
    (tmp_path / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": str(tmp_path)}))
    card = ModelCard(str(render_model_card(str(tmp_path))))
    assert card.data.library_name == "peft" and card.data.base_model is None and "lora" in card.data.tags
    assert "agent-grpo" in card.data.tags
    assert "@article{shao2024deepseekmath" in card.text  # TRL's GRPO citation: the same arXiv id as our grpo
    assert "AutoPeftModelForCausalLM" in card.text and "holds the adapter only" in card.text


def test_card_without_records_has_no_empty_sections(tmp_path):
    from huggingface_hub import ModelCard

    card = ModelCard(str(render_model_card(str(tmp_path), "me/bare")))
    assert "No evaluation results were recorded" in card.text
    assert "Citation" not in card.text and "run_info.json" not in card.text and "load_dataset" not in card.text
    assert card.data.eval_results is None and card.data.tags == ["trl", "trl-agents", "reinforcement-learning"]


def test_every_eval_metric_has_a_display_name():
    assert set(METRIC_NAMES) == set(EVAL_METRICS)


def test_eval_result_files_parse_back():
    from huggingface_hub import parse_eval_result_entries

    result = {"name": "sokoban-eval-greedy", "env": "sokoban", "split": "eval", "num_tasks": 100, "greedy": True,
              "num_samples": 1, "max_turns": 20, "created": "2026-01-02T03:04:05+00:00",
              "metrics": {"success_rate": 0.41, "episode_length": 9.2}}
    assert eval_result_files([result], "https://huggingface.co/me/agent") == {}  # no benchmark dataset, no entry
    files = eval_result_files([result], "https://huggingface.co/me/agent", {"sokoban-eval-greedy": "me/sk-tasks"})
    entries = parse_eval_result_entries(yaml.safe_load(files["sokoban-eval-greedy"]))
    assert [(e.dataset_id, e.task_id, e.value) for e in entries] == [
        ("me/sk-tasks", "success_rate", 0.41), ("me/sk-tasks", "episode_length", 9.2)]
    assert entries[0].notes == "greedy, 100 tasks, max 20 turns" and entries[0].date == "2026-01-02T03:04:05+00:00"
    assert entries[0].source_url == "https://huggingface.co/me/agent"


# ---- the server itself ---------------------------------------------------------------------------------------------


def call(hub: LoopbackHubServer, method: str, path: str, body=None, token: str | None = TOKEN,
         raw: bytes | None = None):
    """(status, headers, JSON or bytes) of one request, without huggingface_hub."""
    import urllib.error
    import urllib.request

    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    request = urllib.request.Request(hub.url + path, data=data, method=method)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request) as response:
            status, headers, content = response.status, response.headers, response.read()
    except urllib.error.HTTPError as err:
        status, headers, content = err.code, err.headers, err.read()
    is_json = "json" in headers.get("Content-Type", "")
    return status, headers, json.loads(content) if is_json and content else content


def test_server_auth_unknown_routes_and_conflicts():
    with LoopbackHubServer(token=TOKEN, user="alice") as hub:
        assert call(hub, "GET", "/api/whoami-v2", token=None)[0] == 401
        assert call(hub, "GET", "/api/whoami-v2", token="hf_wrong")[0] == 401
        assert call(hub, "GET", "/api/whoami-v2")[2]["name"] == "alice"
        status, _, answer = call(hub, "GET", "/api/models/alice/x/discussions")
        assert status == 404 and "no route for GET /api/models/alice/x/discussions" in answer["error"]
        assert hub.unknown_requests == ["GET /api/models/alice/x/discussions"]
        assert call(hub, "POST", "/api/repos/create", {"name": "x", "type": "model"})[0] == 200
        status, _, answer = call(hub, "POST", "/api/repos/create", {"name": "x", "type": "model"})
        assert status == 409 and answer["url"] == f"{hub.url}/alice/x"
        assert call(hub, "POST", "/api/repos/create", {"name": "bad--name"})[0] == 400
        status, headers, _ = call(hub, "GET", "/api/models/alice/missing")
        assert status == 404 and headers["X-Error-Code"] == "RepoNotFound"
        assert hub.count("repos/create") == 3 and hub.count("whoami-v2") == 3


def test_server_upload_modes_commit_tree_and_downloads():
    import base64

    with LoopbackHubServer() as hub:
        call(hub, "POST", "/api/repos/create", {"name": "d", "type": "dataset"})
        files = [{"path": "README.md", "sample": base64.b64encode(b"# hi").decode(), "size": 4},
                 {"path": "data/train.parquet", "sample": "", "size": 10},
                 {"path": "blob", "sample": base64.b64encode(b"a\0b").decode(), "size": 3},
                 {"path": "big.txt", "sample": "", "size": 11 * 1024 * 1024}]
        answer = call(hub, "POST", "/api/datasets/tester/d/preupload/main", {"files": files})[2]
        assert [f["uploadMode"] for f in answer["files"]] == ["regular", "lfs", "lfs", "lfs"]
        payload = b"PAR1 fake parquet"
        oid = hashlib.sha256(payload).hexdigest()
        batch = call(hub, "POST", "/datasets/tester/d.git/info/lfs/objects/batch",
                     {"operation": "upload", "objects": [{"oid": oid, "size": len(payload)}]})[2]
        href = batch["objects"][0]["actions"]["upload"]["href"].removeprefix(hub.url)
        assert call(hub, "PUT", href, raw=b"not the announced bytes")[0] == 400
        assert call(hub, "PUT", href, raw=payload)[0] == 200
        lines = [{"key": "header", "value": {"summary": "add"}},
                 {"key": "file", "value": {"path": "README.md", "content": base64.b64encode(b"# hi").decode(),
                                           "encoding": "base64"}},
                 {"key": "lfsFile", "value": {"path": "data/train.parquet", "algo": "sha256", "oid": oid,
                                              "size": len(payload)}}]
        ndjson = b"".join(json.dumps(line).encode() + b"\n" for line in lines)
        commit = call(hub, "POST", "/api/datasets/tester/d/commit/main", raw=ndjson)[2]
        assert hub.files("tester/d", "dataset") == {"README.md": b"# hi", "data/train.parquet": payload}

        tree = call(hub, "GET", "/api/datasets/tester/d/tree/main")[2]
        assert [(e["type"], e["path"]) for e in tree] == [("file", "README.md"), ("directory", "data")]
        listed = call(hub, "GET", "/api/datasets/tester/d/tree/main/data")[2]
        assert listed[0]["lfs"]["oid"] == oid and listed[0]["size"] == len(payload)
        status, headers, _ = call(hub, "GET", "/api/datasets/tester/d/tree/main/nothing")
        assert status == 404 and headers["X-Error-Code"] == "EntryNotFound"

        status, headers, _ = call(hub, "HEAD", "/datasets/tester/d/resolve/main/data%2Ftrain.parquet")
        assert status == 200 and headers["X-Repo-Commit"] == commit["commitOid"] and headers["ETag"] == f'"{oid}"'
        request_range = {"Range": "bytes=5-8"}
        import urllib.request

        ranged = urllib.request.Request(f"{hub.url}/datasets/tester/d/resolve/main/data/train.parquet",
                                        headers=request_range)
        with urllib.request.urlopen(ranged) as response:
            assert response.status == 206 and response.read() == payload[5:9]

        deletion = [{"key": "header", "value": {"summary": "rm"}},
                    {"key": "deletedFolder", "value": {"path": "data"}}]
        ndjson = b"\n".join(json.dumps(line).encode() for line in deletion)
        call(hub, "POST", "/api/datasets/tester/d/commit/main", raw=ndjson)
        assert set(hub.files("tester/d", "dataset")) == {"README.md"}
        earlier = hub.files("tester/d", "dataset", revision=commit["commitOid"])
        assert set(earlier) == {"README.md", "data/train.parquet"}
        history = call(hub, "GET", "/api/datasets/tester/d/commits/main")[2]
        assert [c["title"] for c in history] == ["rm", "add", "initial commit"]


def test_server_validates_card_metadata():
    card = "---\nmodel-index:\n- name: m\n  results:\n  - task: {type: reinforcement-learning}\n" \
           "    dataset: {type: a/b, name: b}\n    metrics: [{type: success_rate}]\n---\ntext"
    with LoopbackHubServer() as hub:
        status, _, answer = call(hub, "POST", "/api/validate-yaml", {"content": card, "repoType": "model"})
        assert status == 400 and answer["errors"] == [{"message": '"model-index.results.metric.value" is required'}]
        fixed = card.replace("{type: success_rate}", "{type: success_rate, value: 0.5}")
        assert call(hub, "POST", "/api/validate-yaml", {"content": fixed, "repoType": "model"})[0] == 200
        assert call(hub, "POST", "/api/validate-yaml", {"content": "---\n: [\n---\n"})[0] == 400


# ---- online (opt-in) -----------------------------------------------------------------------------------------------

PUSH_TO_THE_REAL_HUB = """
    import json, sys, uuid
    from huggingface_hub import HfApi, ModelCard
    from trl_agents.hub import push_run

    run_dir = sys.argv[1]
    api = HfApi()
    repo = f"{api.whoami()['name']}/trl-agents-smoke-{uuid.uuid4().hex[:8]}"
    try:
        urls = push_run(run_dir, repo, private=True)
        card = ModelCard.load(repo)
        files = api.list_repo_files(repo)
        rows = len(api.list_repo_files(repo + "-trajectories", repo_type="dataset"))
    finally:
        api.delete_repo(repo, missing_ok=True)
        api.delete_repo(repo + "-trajectories", repo_type="dataset", missing_ok=True)
    print("RESULT " + json.dumps({"urls": urls, "files": files, "dataset_files": rows,
                                  "results": [(r.metric_type, r.metric_value) for r in card.data.eval_results]}))
"""


@pytest.mark.online
@pytest.mark.skipif(
    not (os.environ.get("TRL_AGENTS_ONLINE_TESTS") == "1" and os.environ.get("HF_TOKEN")),
    reason="pushes to huggingface.co: set TRL_AGENTS_ONLINE_TESTS=1 and HF_TOKEN (a write token) to run it",
)
def test_push_to_the_real_hub_and_delete(runs, tmp_path):
    env = {key: value for key, value in os.environ.items() if key not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env.update(HOME=str(tmp_path), HF_HOME=str(tmp_path / "hf"), HF_HUB_DISABLE_TELEMETRY="1")
    result = result_of(run_python(env, PUSH_TO_THE_REAL_HUB, str(runs["full"])))
    assert "model.safetensors" in result["files"] and "README.md" in result["files"]
    assert result["dataset_files"] >= 2  # README.md + data/train-*.parquet
    assert ["success_rate", 0.375] in result["results"]
