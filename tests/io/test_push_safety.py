"""No secret in what a run writes or what `trl-agents push` uploads (issue 29, probe rows S6 and S7).

S6: a `--hub_token` given to `trl-agents train` reaches no file of the run (`training_args.bin`, pickled by
`Trainer._save`, holds it masked), nor the Hub. S7: a push uploads only the files it documents (`hub.PUSHED_FILES`),
skips any other one with a warning, and never follows a link out of RUN_DIR; `--dry_run` lists the plan without any
network call or token.
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers import checkout_env

from trl_agents.cli import main
from trl_agents.hub import push_run
from trl_agents.loopback import LoopbackHubServer

TRAIN_TOKEN = "hf_probeSECRET456"  # given to `trl-agents train --hub_token`, and the loopback Hub's token there
LINKED_SECRET = "hf_probeSECRET_LINKED"  # in a token file under HOME that a link in RUN_DIR points to
STRAY_SECRET = "hf_probeSECRET_STRAY"  # in a stray file of RUN_DIR
PUSH_TOKEN = "hf_loopback_push_safety"


def files_holding(folder: Path, secret: str) -> list[str]:
    """The files below `folder` whose bytes contain `secret` (links are followed, as an upload would)."""
    return sorted(str(path.relative_to(folder)) for path in folder.rglob("*")
                  if path.is_file() and secret.encode() in path.read_bytes())


def add_stray_file_and_link(run_dir: Path, home: Path) -> Path:
    """A stray file in RUN_DIR, and `notes.txt`: a link to a token file under `home` (outside RUN_DIR)."""
    token_file = home / ".cache" / "huggingface" / "token_copy"
    token_file.parent.mkdir(parents=True, exist_ok=True)
    token_file.write_text(LINKED_SECRET)
    (run_dir / "notes.txt").symlink_to(token_file)
    (run_dir / "stray.txt").write_text(f"my notes, and a token {STRAY_SECRET}\n")
    return token_file


def fake_run(run_dir: Path) -> Path:
    """A run directory as far as a push reads it: a saved model (fake weights) and its tokenizer files."""
    run_dir.mkdir(parents=True)
    (run_dir / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    (run_dir / "model.safetensors").write_bytes(b"weights")
    (run_dir / "tokenizer.json").write_text("{}")
    (run_dir / "agent_config.json").write_text(json.dumps({"env_name": "test-keyword"}))
    return run_dir


# ---- S7 without training: what a push takes from RUN_DIR ------------------------------------------------------------


def test_dry_run_lists_only_documented_files_without_network_or_token(tmp_path, monkeypatch, capsys, caplog):
    run_dir = fake_run(tmp_path / "run")
    add_stray_file_and_link(run_dir, tmp_path / "home")
    monkeypatch.delenv("HF_TOKEN", raising=False)
    import trl_agents.hub

    def no_network(*args, **kwargs):
        raise AssertionError("a dry run made a Hub client")

    monkeypatch.setattr(trl_agents.hub, "HfApi", no_network)  # and this process runs offline (conftest)
    with caplog.at_level(logging.WARNING, logger="trl_agents.hub"):
        main(["push", str(run_dir), "--repo", "me/agent", "--dry_run"])
    out, err = capsys.readouterr()
    plan = push_run(str(run_dir), "me/agent", dry_run=True)
    pushed = [file["path"] for file in plan["model"]["files"]]
    assert pushed == ["agent_config.json", "config.json", "model.safetensors", "tokenizer.json", "README.md"]
    assert plan["dataset"] is None and plan["benchmarks"] == []
    assert dict(plan["skipped"]) == {"notes.txt": "a link out of RUN_DIR", "stray.txt": "not a file push publishes"}
    assert "dry run: nothing was uploaded" in out and "model repo me/agent:" in out
    assert "  model.safetensors  (7 bytes; from " in out
    assert "notes.txt" not in out and "stray.txt" not in out
    assert LINKED_SECRET not in out + err + caplog.text and STRAY_SECRET not in out + err + caplog.text
    assert "skipped 2 file(s)" in caplog.text and "notes.txt (a link out of RUN_DIR)" in caplog.text
    assert "stray.txt (not a file push publishes)" in caplog.text
    # A results table (`trl-agents push TABLE.parquet`) too.
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"run": ["a", "b"]}), tmp_path / "results.parquet")
    main(["push", str(tmp_path / "results.parquet"), "--repo", "me/results", "--dry_run"])
    out = capsys.readouterr().out
    assert "dataset me/results:\n  data/train-*.parquet  (made by the push; from " in out


def test_a_file_to_push_that_links_out_of_the_run_is_refused(tmp_path):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "vocab.json").write_text(LINKED_SECRET)
    (outside / "x.json").write_text("{}")
    run_dir = fake_run(tmp_path / "run")
    (run_dir / "vocab.json").symlink_to(outside / "vocab.json")  # a name push publishes
    with pytest.raises(SystemExit, match=r"trl-agents push: error: .*/run/vocab.json is a link to .*/elsewhere/vocab"
                                         r".json, outside RUN_DIR .*: a push uploads only files inside the run; "
                                         r"replace the link by a copy of the file, or remove it\.$"):
        main(["push", str(run_dir), "--repo", "me/agent", "--dry_run"])
    (run_dir / "vocab.json").unlink()
    (run_dir / "eval").mkdir()
    (run_dir / "eval" / "x.json").symlink_to(outside / "x.json")  # an eval record
    with pytest.raises(ValueError, match=r"eval/x.json is a link to .*, outside RUN_DIR"):
        push_run(str(run_dir), "me/agent", dry_run=True)
    (run_dir / "eval" / "x.json").unlink()
    (run_dir / "warm-start").symlink_to(outside, target_is_directory=True)  # a folder to --include
    with pytest.raises(ValueError, match=r"warm-start/vocab.json is a link to .*, outside RUN_DIR"):
        push_run(str(run_dir), "me/agent", dry_run=True, include_folders=["warm-start"])
    (run_dir / "kept").mkdir()
    (run_dir / "kept" / "merges.txt").write_text("a b\n")
    (run_dir / "merges.txt").symlink_to(run_dir / "kept" / "merges.txt")  # a link inside the run is fine
    plan = push_run(str(run_dir), "me/agent", dry_run=True)
    assert [file["path"] for file in plan["model"]["files"]] == [
        "agent_config.json", "config.json", "merges.txt", "model.safetensors", "tokenizer.json", "README.md"]


def test_training_args_holding_a_token_are_skipped_and_custom_code_is_kept(tmp_path, caplog):
    import torch
    from transformers import TrainingArguments

    run_dir = fake_run(tmp_path / "run")
    masked = TrainingArguments(output_dir=str(run_dir), report_to="none")
    torch.save(masked, run_dir / "training_args.bin")
    config = {"model_type": "x", "auto_map": {"AutoModelForCausalLM": "modeling_x.XModel",
                                              "AutoConfig": "org/other--configuration_x.XConfig"}}
    (run_dir / "config.json").write_text(json.dumps(config))
    for name in ("modeling_x.py", "configuration_x.py", "helper.py"):
        (run_dir / name).write_text("# code\n")
    plan = push_run(str(run_dir), "me/agent", dry_run=True)
    pushed = {file["path"] for file in plan["model"]["files"]}
    assert {"training_args.bin", "modeling_x.py"} <= pushed and not {"configuration_x.py", "helper.py"} & pushed
    # A run saved before AgentGRPOTrainer._save masked the token (the probe's S6): that file is left out.
    torch.save(TrainingArguments(output_dir=str(run_dir), report_to="none", hub_token=TRAIN_TOKEN),
               run_dir / "training_args.bin")
    with caplog.at_level(logging.WARNING, logger="trl_agents.hub"):
        plan = push_run(str(run_dir), "me/agent", dry_run=True)
    assert "training_args.bin" not in {file["path"] for file in plan["model"]["files"]}
    assert ("training_args.bin", "it holds hub_token in clear, saved by an older trl-agents: delete it") in \
        plan["skipped"]
    assert TRAIN_TOKEN not in caplog.text


# ---- S6 and S7 on a real run, trained and pushed from the command line ----------------------------------------------


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A run of `trl-agents train --hub_token TOKEN`, checkpointed every step and pushed (during training and at the
    end) to a loopback Hub that accepts that token only: {"run_dir", "home", "hub_files", "unknown"}."""
    root = tmp_path_factory.mktemp("trained")
    with LoopbackHubServer(token=TRAIN_TOKEN, user="tester") as hub:
        env = hub.client_env(str(root / "home"), token=False)  # the push can use only --hub_token
        command = [
            sys.executable, "-m", "trl_agents.cli", "train", "--config", "gigpo_sokoban_tiny", "--max_steps", "2",
            "--save_strategy", "steps", "--save_steps", "1", "--num_train_tasks", "40", "--num_eval_tasks", "4",
            "--warm_start_steps", "0", "--hub_token", TRAIN_TOKEN, "--push_to_hub", "true", "--hub_model_id",
            "secret-run", "--output_dir", str(root / "run"),
        ]
        done = subprocess.run(command, env=checkout_env(env), capture_output=True, text=True, timeout=900,
                              check=False, cwd=root)
        assert done.returncode == 0, done.stderr[-6000:]
        hub_files = {key: hub.files(key[1], key[0]) for key in hub.repos}
        unknown = hub.unknown_requests
    return {"run_dir": root / "run", "home": root / "home", "hub_files": hub_files, "unknown": unknown}


@pytest.mark.slow
def test_a_hub_token_given_to_train_reaches_no_file_of_the_run(trained):
    import torch

    run_dir = trained["run_dir"]
    assert files_holding(run_dir, TRAIN_TOKEN) == []
    saved = sorted(run_dir.rglob("training_args.bin"))
    assert [str(path.relative_to(run_dir)) for path in saved] == [
        "checkpoint-1/training_args.bin", "checkpoint-2/training_args.bin", "training_args.bin"]
    for path in saved:
        args = torch.load(path, weights_only=False)
        assert args.hub_token is None and args.output_dir == str(run_dir) and args.max_steps == 2
    assert json.loads((run_dir / "run_info.json").read_text())["config"]["hub_token"] == "<HUB_TOKEN>"


@pytest.mark.slow
def test_the_pushes_made_with_that_token_carry_no_token(trained):
    files = trained["hub_files"]
    assert trained["unknown"] == []
    # The token was still there for the pushes: during training (a checkpoint per step) and at the end.
    model = files[("model", "tester/secret-run")]
    assert {"model.safetensors", "training_args.bin", "README.md", "run_info.json"} <= set(model)
    assert ("dataset", "tester/secret-run-trajectories") in files
    leaks = [(repo, name) for repo, repo_files in files.items() for name, content in repo_files.items()
             if TRAIN_TOKEN.encode() in content]
    assert leaks == []


PUSH_WITH_THE_CLI = """
    import sys
    from trl_agents.cli import main

    main(["push", *sys.argv[1:]])
"""


@pytest.mark.slow
def test_push_uploads_no_stray_file_and_follows_no_link_out_of_the_run(trained, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(trained["run_dir"], run_dir, symlinks=True, ignore=shutil.ignore_patterns("checkpoint-*"))
    home = tmp_path / "home"
    add_stray_file_and_link(run_dir, home)
    with LoopbackHubServer(token=PUSH_TOKEN, user="tester") as hub:
        env = checkout_env(hub.client_env(str(home)))

        def push(*args: str) -> subprocess.CompletedProcess:
            return subprocess.run([sys.executable, "-c", textwrap.dedent(PUSH_WITH_THE_CLI), str(run_dir), *args],
                                  env=env, capture_output=True, text=True, timeout=600, check=False)

        dry = push("--repo", "tester/agent", "--dry_run")
        assert dry.returncode == 0, dry.stderr[-4000:]
        assert hub.requests == []  # no network call at all
        done = push("--repo", "tester/agent")
        assert done.returncode == 0, done.stderr[-4000:]
        assert hub.unknown_requests == []
        files = {key: hub.files(key[1], key[0]) for key in hub.repos}
    listed = [line.split()[0] for line in dry.stdout.splitlines() if line.startswith("  ")]
    model = files[("model", "tester/agent")]
    assert sorted(listed[:len(model)]) == sorted(model)  # the dry run listed the model repo's files, in order
    assert "notes.txt" not in dry.stdout + "".join(model) and "stray.txt" not in dry.stdout + "".join(model)
    assert {"model.safetensors", "training_args.bin", "tokenizer.json", "eval/sokoban-eval-greedy.json"} <= set(model)
    for secret in (LINKED_SECRET, STRAY_SECRET, TRAIN_TOKEN):
        assert secret not in dry.stdout + dry.stderr + done.stdout + done.stderr
        assert [(repo, name) for repo, repo_files in files.items() for name, content in repo_files.items()
                if secret.encode() in content] == []
    for output in (dry.stderr, done.stderr):
        assert "notes.txt (a link out of RUN_DIR); stray.txt (not a file push publishes)" in output
