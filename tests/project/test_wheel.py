"""The package as a user gets it: the sdist and the wheel build and pass `twine check`, they hold every file the
package reads at runtime, and the wheel, installed in a fresh virtual environment (torch first, then the wheel with
its dependencies resolved by pip from the registry, as a user would), trains from a directory with no checkout.

Slow: a few minutes, nearly all of it pip installing the dependencies (the pip cache makes reruns faster).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "src" / "trl_agents"
# The CPU build on our CI machines (README, "Installing torch"): an unpinned torch would pull a multi-GB CUDA build.
TORCH = "torch==2.13.0"
CONFIG = "gigpo_sokoban_tiny"
# The smallest run of the packaged config that still evaluates, trains one step and writes every output.
OVERRIDES = ["--max_steps", "1", "--num_train_tasks", "16", "--num_eval_tasks", "4", "--warm_start_steps", "0",
             "--per_device_train_batch_size", "8", "--num_generations", "4"]


def run(command: list, **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run([str(part) for part in command], capture_output=True, text=True, **kwargs)
    assert result.returncode == 0, (
        f"{' '.join(map(str, command))} exited {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}"
    )
    return result


def clean_env(**overrides: str) -> dict[str, str]:
    """This process's environment without what would point the fresh venv at the checkout, at this venv, or at the
    user's Hugging Face caches and token (pip's own settings stay: the registry, its cache)."""
    dropped = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "HF_", "HUGGING_FACE_", "TRANSFORMERS_", "TRL_", "XDG_")
    env = {key: value for key, value in os.environ.items() if not key.startswith(dropped)}
    return {**env, "PIP_DISABLE_PIP_VERSION_CHECK": "1", **overrides}


def package_files() -> set[str]:
    """Every file of the package as its path in the wheel (`trl_agents/...`): the modules and what they read at
    runtime (the configs and model cards, symlinked from the repository's folders; the `evaluate` metric's script)."""
    files = set()
    for root, dirs, names in os.walk(PACKAGE, followlinks=True):
        dirs[:] = [name for name in dirs if name != "__pycache__"]
        files |= {(Path(root) / name).relative_to(PACKAGE.parent).as_posix() for name in names
                  if not name.endswith(".pyc")}
    return files


@pytest.mark.timeout(1800)
def test_wheel_installs_in_a_fresh_venv_and_trains_outside_the_checkout(tmp_path):
    dist = tmp_path / "dist"
    run([sys.executable, "-m", "build", "--outdir", dist, REPO], env=clean_env())
    [wheel], [sdist] = list(dist.glob("*.whl")), list(dist.glob("*.tar.gz"))
    run([sys.executable, "-m", "twine", "check", "--strict", wheel, sdist])

    expected = package_files()
    assert {f"trl_agents/configs/{CONFIG}.yaml", "trl_agents/configs/accelerate/ddp.yaml",
            "trl_agents/model_cards/model_card.md", "trl_agents/metrics/agent_success/agent_success.py"} <= expected
    in_wheel = set(zipfile.ZipFile(wheel).namelist())
    assert expected <= in_wheel, f"missing from the wheel: {sorted(expected - in_wheel)}"
    assert any(name.endswith(".dist-info/licenses/LICENSE") for name in in_wheel)
    with tarfile.open(sdist) as archive:
        in_sdist = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    needed = {"pyproject.toml", "README.md", "LICENSE", *(f"src/{name}" for name in expected)}
    assert needed <= in_sdist, f"missing from the sdist: {sorted(needed - in_sdist)}"

    venv = tmp_path / "venv"
    python = venv / "bin" / "python"
    run([sys.executable, "-m", "venv", venv], env=clean_env())
    run([python, "-m", "pip", "install", TORCH], env=clean_env())
    run([python, "-m", "pip", "install", wheel], env=clean_env())

    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    env = clean_env(HOME=str(home), HF_HUB_OFFLINE="1", PATH=f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}")
    where = run([python, "-c", "import trl_agents; print(trl_agents.__file__)"], cwd=work, env=env).stdout.strip()
    assert Path(where).is_relative_to(venv) and not Path(where).is_relative_to(REPO), where
    # The packaged config by its bare name, as the installed package resolves it (no configs/ folder here).
    config = run([venv / "bin" / "trl-agents", "configs", CONFIG], cwd=work, env=env).stdout.strip()
    assert Path(config).is_relative_to(venv) and Path(config).is_file(), config

    output_dir = work / "out"
    run([venv / "bin" / "trl-agents", "train", "--config", CONFIG, *OVERRIDES, "--output_dir", output_dir],
        cwd=work, env=env)
    for name in ["run_info.json", "agent_config.json", "config.json", "model.safetensors", "tokenizer_config.json",
                 "metrics.json", "eval_results.json", "learning_curve.png"]:
        assert (output_dir / name).is_file(), name
    assert list((output_dir / "trajectories").glob("*.parquet"))
    assert list((output_dir / "eval").glob("*.json"))
