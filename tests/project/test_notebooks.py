"""The notebooks in notebooks/ run top to bottom (the tiny CPU settings they ship with), in a real Jupyter kernel.

The quickstart's push cell pushes for real, to a loopback Hub (`trl_agents.loopback.LoopbackHubServer`) that the
kernel reaches through HF_ENDPOINT / HF_TOKEN, exactly as a user's kernel reaches the Hub.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

from trl_agents.loopback import LoopbackHubServer  # noqa: E402

pytestmark = pytest.mark.slow

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
TOKEN = "hf_notebook_token"


def execute(name: str, workdir: Path) -> nbformat.NotebookNode:
    notebook = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    client = nbclient.NotebookClient(notebook, timeout=900, kernel_name="python3",
                                     resources={"metadata": {"path": str(workdir)}})
    client.execute()
    return notebook


def outputs_of(cell) -> list[dict]:
    return [dict(output) for output in cell.get("outputs", [])]


def text_of(notebook) -> str:
    parts = []
    for cell in notebook.cells:
        for output in outputs_of(cell):
            parts.append(output.get("text", "") + json.dumps(output.get("data", {}).get("text/plain", "")))
    return "\n".join(parts)


def test_the_notebooks_are_valid_and_carry_no_outputs():
    names = sorted(path.stem for path in NOTEBOOKS.glob("*.ipynb"))
    assert names == ["compare_methods", "custom_environment", "quickstart"]
    for name in names:
        notebook = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
        nbformat.validate(notebook)
        assert all(not cell.get("outputs") for cell in notebook.cells if cell.cell_type == "code"), name


def test_quickstart_trains_evaluates_pushes_and_ends_with_the_learning_curve(tmp_path, monkeypatch):
    (tmp_path / "home").mkdir()
    with LoopbackHubServer(token=TOKEN) as hub:
        for key, value in hub.client_env(str(tmp_path / "home"), TOKEN).items():
            monkeypatch.setenv(key, value)
        monkeypatch.setenv("QUICKSTART_REPO_ID", "tester/frozenlake-gigpo-tiny")
        notebook = execute("quickstart", tmp_path)
        assert hub.unknown_requests == []
        model_files = hub.files("tester/frozenlake-gigpo-tiny")
        dataset_files = hub.files("tester/frozenlake-gigpo-tiny-trajectories", repo_type="dataset")
    run_dir = tmp_path / "outputs" / "quickstart-notebook"
    assert (run_dir / "eval" / "frozenlake-eval-greedy.json").is_file() and (run_dir / "run_info.json").is_file()
    assert {"model.safetensors", "README.md", "eval/frozenlake-eval-greedy.json"} <= set(model_files)
    assert any(path.endswith(".parquet") for path in dataset_files)
    assert "held-out success before RL" in text_of(notebook)
    last = [cell for cell in notebook.cells if cell.cell_type == "code"][-1]
    images = [output["data"]["image/png"] for output in outputs_of(last) if "image/png" in output.get("data", {})]
    assert images and base64.b64decode(images[0]).startswith(b"\x89PNG")  # the learning curve, as an image


def test_compare_methods_plots_every_method(tmp_path):
    notebook = execute("compare_methods", tmp_path)
    text = text_of(notebook)
    for name in ("grpo", "gigpo", "ecpo"):
        assert f"{name}: held-out success" in text
    assert (tmp_path / "outputs" / "compare-notebook" / "comparison.png").is_file()
    last = [cell for cell in notebook.cells if cell.cell_type == "code"][-1]
    assert any("image/png" in output.get("data", {}) for output in outputs_of(last))


def test_custom_environment_passes_the_contract_trains_and_plays(tmp_path):
    notebook = execute("custom_environment", tmp_path)
    text = text_of(notebook)
    assert "contract checks passed" in text
    assert "'Guess a number between 1 and 16.'" in text and "success:" in text
