"""The real user's path, walked offline: a model published on the Hub, trained with LoRA from the command line, and
published again with its card, eval results, adapter and trajectories (against the loopback Hub,
`LoopbackHubServer`); plus the model-loading settings of `trl-agents train` (TRL's script flags) one by one.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from trl import ModelConfig

from helpers import checkout_env
from trl_agents.loopback import LoopbackHubServer

TOKEN = "hf_loopback_user_path"
SYSTEM = "Push the box X onto the target O. Answer up, down, left or right."

PUBLISH_A_BASE_MODEL = """
    import sys
    from huggingface_hub import HfApi
    from trl_agents.testing import build_tiny_model, build_tiny_tokenizer, env_corpus

    folder, repo, system = sys.argv[1:]
    tokenizer = build_tiny_tokenizer([*env_corpus("sokoban", size=5, num_boxes=1), system], vocab_size=512)
    build_tiny_model(tokenizer, architecture="qwen3").save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    api = HfApi()
    api.create_repo(repo)
    api.upload_folder(repo_id=repo, folder_path=folder)
"""

READ_WHAT_WAS_PUBLISHED = """
    import json, sys, yaml
    from datasets import load_dataset
    from huggingface_hub import DatasetCard, HfApi, ModelCard, hf_hub_download, parse_eval_result_entries
    from peft import AutoPeftModelForCausalLM

    repo = sys.argv[1]
    api = HfApi()
    files = api.list_repo_files(repo)
    card = ModelCard.load(repo)
    model = AutoPeftModelForCausalLM.from_pretrained(repo)  # fetches the base the adapter names, from the Hub
    entries = {name: [(e.dataset_id, e.task_id) for e in parse_eval_result_entries(
                   yaml.safe_load(open(hf_hub_download(repo, name))))]
               for name in files if name.startswith(".eval_results/")}
    benchmarks = sorted({dataset for found in entries.values() for dataset, _ in found})
    steps = load_dataset(repo + "-trajectories", split="train")
    print("RESULT " + json.dumps({
        "files": files,
        "base_model": card.data.base_model,
        "card_text": card.text,
        "card_results": len(card.data.eval_results or []),
        "adapter_base": json.load(open(hf_hub_download(repo, "adapter_config.json")))["base_model_name_or_path"],
        "loaded_base": model.base_model.model.config._name_or_path,
        "loaded_class": type(model.base_model.model).__name__,
        "run_info": json.load(open(hf_hub_download(repo, "run_info.json"))),
        "eval_entries": entries,
        "benchmark_files": {b: api.list_repo_files(b, repo_type="dataset") for b in benchmarks},
        "dataset_card": DatasetCard.load(repo + "-trajectories").data.to_dict(),
        "columns": steps.column_names,
        "first_prompt": steps[0]["prompt"],
        "first_completion": steps[0]["completion"],
        "first_action": steps[0]["action_text"],
    }))
"""


def run_python(env: dict[str, str], code: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], env=checkout_env(env),
                          capture_output=True, text=True, timeout=900, check=False)


@pytest.mark.slow
def test_a_hub_model_trained_with_lora_from_the_cli_is_published_ready_to_use(tmp_path):
    with LoopbackHubServer(token=TOKEN, user="tester") as hub:
        env = hub.client_env(str(tmp_path / "home"))
        done = run_python(env, PUBLISH_A_BASE_MODEL, str(tmp_path / "base"), "org/tiny-qwen3", SYSTEM)
        assert done.returncode == 0, done.stderr[-4000:]
        train = [
            sys.executable, "-m", "trl_agents.cli", "train", "--config", "gigpo_sokoban_tiny",
            "--model_name_or_path", "org/tiny-qwen3", "--attn_implementation", "eager",
            "--use_peft", "true", "--lora_r", "4", "--lora_alpha", "8",
            "--warm_start_steps", "2", "--warm_start_tasks", "16", "--warm_start_val_tasks", "4",
            "--warm_start_eval_every", "2", "--num_train_tasks", "40", "--num_eval_tasks", "4",
            "--max_steps", "2", "--per_device_train_batch_size", "8", "--num_generations", "4",
            "--save_strategy", "steps", "--save_steps", "1",  # a checkpoint push during training too
            "--push_to_hub", "true", "--hub_model_id", "sokoban-agent", "--output_dir", str(tmp_path / "run"),
        ]
        done = subprocess.run(train, env=checkout_env(env), capture_output=True, text=True, timeout=900,
                              check=False, cwd=tmp_path)
        assert done.returncode == 0, done.stderr[-6000:]
        assert "pushed to" in done.stdout and f"outputs in {tmp_path / 'run'}" in done.stdout
        # Under LoRA the warm start trained an adapter (RL continued it), not the whole model.
        warm = tmp_path / "run" / "warm-start"
        assert (warm / "adapter_config.json").is_file() and not (warm / "model.safetensors").exists()
        read = run_python(env, READ_WHAT_WAS_PUBLISHED, "tester/sokoban-agent")
        assert read.returncode == 0, read.stderr[-6000:]
        assert hub.unknown_requests == []
    result = json.loads(read.stdout.strip().splitlines()[-1].removeprefix("RESULT "))

    # The named model was trained, as loaded with the flags given, and its Hub id survives the warm start.
    assert result["run_info"]["base_model"] == "org/tiny-qwen3"
    assert result["run_info"]["config"]["model_init_kwargs"]["attn_implementation"] == "eager"
    assert result["base_model"] == "org/tiny-qwen3" and "org/tiny-qwen3" in result["card_text"], result["card_text"]
    # The adapter names the Hub base, so the card's own snippet loads it for anyone.
    assert result["adapter_base"] == "org/tiny-qwen3" == result["loaded_base"]
    assert result["loaded_class"] == "Qwen3ForCausalLM"
    # The final push came after the evaluation: the card has the eval table, and .eval_results name a benchmark
    # dataset that exists (with its eval.yaml).
    assert "No evaluation results" not in result["card_text"] and result["card_results"] > 0
    [(name, entries)] = result["eval_entries"].items()
    assert name == ".eval_results/sokoban-eval-greedy.yaml" and ("success_rate" in {t for _, t in entries})
    [(benchmark, benchmark_files)] = result["benchmark_files"].items()
    assert benchmark.startswith("tester/sokoban-eval-tasks-") and "eval.yaml" in benchmark_files
    # No trajectories and no side weights in the model repo, from the checkpoint pushes or the final one.
    files = result["files"]
    assert {"adapter_config.json", "adapter_model.safetensors", "README.md", "run_info.json"} <= set(files)
    assert not [f for f in files if f.endswith(".parquet") or f.startswith(("trajectories/", "warm-start/",
                                                                            "base-model/"))], files
    # The trajectories went to the dataset repo, with a described card and SFT-ready chat columns.
    card = result["dataset_card"]
    assert card["pretty_name"] and {"trl-agents", "sokoban", "gigpo"} <= set(card["tags"])
    assert card["task_categories"] and card["size_categories"]
    assert {"prompt", "completion"} <= set(result["columns"])
    assert [m["role"] for m in result["first_prompt"]] == ["system", "user"]
    assert result["first_prompt"][0]["content"] == SYSTEM
    assert result["first_completion"] == [{"role": "assistant", "content": result["first_action"]}]


# ---- model loading, flag by flag -----------------------------------------------------------------------------------


def test_load_in_4bit_on_a_machine_without_a_gpu_is_a_one_line_error():
    from trl_agents.run import _quantization_config

    with pytest.raises(ValueError, match=r"--load_in_4bit .* needs a CUDA GPU"):
        _quantization_config(ModelConfig(model_name_or_path="org/name", load_in_4bit=True, use_peft=True))
    with pytest.raises(ValueError, match=r"--load_in_8bit"):
        _quantization_config(ModelConfig(model_name_or_path="org/name", load_in_8bit=True, use_peft=True))
    assert _quantization_config(ModelConfig(model_name_or_path="org/name")) is None


def test_the_named_model_is_loaded_with_the_flags_given(tmp_path):
    """`--attn_implementation` and `--trust_remote_code` reach the loading (TRL's `model_init_kwargs`), and a named
    model wins over a config's `tiny_model: true`."""
    from trl_agents import GiGPOConfig
    from trl_agents.run import RunArguments, _load_model
    from trl_agents.testing import save_tiny_model

    base = save_tiny_model(tmp_path / "base", ["up down left right"], vocab_size=300, architecture="qwen3")
    config = GiGPOConfig(str(tmp_path / "out"), env_name="frozenlake", report_to="none", use_cpu=True)
    run = RunArguments(method="gigpo", tiny_model=True, warm_start_steps=1)
    model, tokenizer, reference = _load_model(run, config, ModelConfig(model_name_or_path=base,
                                                                       attn_implementation="eager"))
    assert reference == base and type(model).__name__ == "Qwen3ForCausalLM"
    assert model.config._attn_implementation == "eager"
    assert config.model_init_kwargs["attn_implementation"] == "eager"
    assert config.model_init_kwargs["trust_remote_code"] is False
    assert not (tmp_path / "out" / "base-model").exists()  # the tiny model was not built


def test_a_warm_started_folder_names_the_hub_model_it_came_from(tmp_path):
    from trl_agents.records import hub_base_model
    from trl_agents.run import _write_provenance

    _write_provenance(str(tmp_path), "org/tiny-qwen3")
    assert hub_base_model(str(tmp_path)) == "org/tiny-qwen3"
    (tmp_path / "adapter").mkdir()
    (tmp_path / "adapter" / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": str(tmp_path)}))
    assert hub_base_model(str(tmp_path / "adapter")) == "org/tiny-qwen3"  # followed through the local folder


def test_tasks_come_from_a_dataset_by_name(tmp_path):
    """`--dataset_name` (TRL scripts' flag): task rows published as a dataset, its train split trained on and its
    `dataset_test_split` evaluated; a split it lacks is a one-line error."""
    from datasets import Dataset, DatasetDict

    from trl_agents import GiGPOConfig
    from trl_agents.envs import get_env_class
    from trl_agents.run import RunArguments, _tasks

    env = get_env_class("frozenlake")
    splits = DatasetDict({"train": Dataset.from_list(env.task_split("train", 6)),
                          "test": Dataset.from_list(env.task_split("eval", 3))})
    for split, rows in splits.items():  # a folder of data files, as a dataset repo holds them
        rows.to_json(str(tmp_path / "files" / f"{split}.jsonl"))
    config = GiGPOConfig(str(tmp_path / "out"), env_name="frozenlake", report_to="none", use_cpu=True)
    run = RunArguments(dataset_name=str(tmp_path / "files"), dataset_test_split="test", num_train_tasks=4)
    train, held_out = _tasks(run, config, env)
    assert [row["seed"] for row in train] == [row["seed"] for row in env.task_split("train", 4)]
    assert [row["seed"] for row in held_out] == [row["seed"] for row in env.task_split("eval", 3)]
    with pytest.raises(ValueError, match="dataset_test_split"):
        _tasks(RunArguments(dataset_name=str(tmp_path / "files"), dataset_test_split="validation"), config, env)


def test_sft_subset_keeps_valid_steps_of_solved_episodes_as_chats():
    from datasets import Dataset

    from trl_agents.hub import sft_rows

    chat = [{"role": "user", "content": "o"}]
    reply = [{"role": "assistant", "content": "a"}]
    rows = Dataset.from_list([
        {"success": True, "valid": True, "step": 0, "prompt": chat, "completion": reply},   # kept
        {"success": True, "valid": False, "step": 1, "prompt": chat, "completion": reply},  # invalid action
        {"success": False, "valid": True, "step": 0, "prompt": chat, "completion": reply},  # unsolved episode
        {"success": True, "valid": True, "step": -1, "prompt": [], "completion": []},       # failed before step 0
    ])
    kept = sft_rows(rows)
    assert kept.column_names == ["prompt", "completion"] and kept.to_list() == [{"prompt": chat, "completion": reply}]
    # an environment with tools: its schemas go along, for SFTTrainer to render them as the rollout did
    tools = '[{"type": "function", "function": {"name": "bash"}}]'
    with_tools = Dataset.from_list([{"success": True, "valid": True, "step": 0, "prompt": chat, "completion": reply,
                                     "tools": tools}])
    assert sft_rows(with_tools).to_list() == [{"prompt": chat, "completion": reply, "tools": tools}]


def test_a_conversation_step_is_recorded_as_the_chat_so_far():
    from trl_agents.records import step_chat
    from trl_agents.trajectory import PromptParts, Step, Trajectory

    first = PromptParts("Rules.", "Task.", (), "o0")
    steps = [Step("o0", "a0", prompt_parts=first), Step("o1", "a1", prompt_parts=first),
             Step("o2", "a2", prompt_parts=first)]
    prompt, completion = step_chat(Trajectory(task={}, steps=steps), 2, conversation=True)
    assert prompt == [{"role": "system", "content": "Rules."}, {"role": "user", "content": "Task.\no0"},
                      {"role": "assistant", "content": "a0"}, {"role": "user", "content": "o1"},
                      {"role": "assistant", "content": "a1"}, {"role": "user", "content": "o2"}]
    assert completion == [{"role": "assistant", "content": "a2"}]
    assert step_chat(Trajectory(task={}, steps=[Step("o", "a")]), 0) == ([], [])  # rebuilt from rows: no prompt
