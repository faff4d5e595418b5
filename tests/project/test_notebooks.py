"""The notebooks in notebooks/ run top to bottom (the tiny CPU settings they ship with), in a real Jupyter kernel.

The quickstart's push cell pushes for real, to a loopback Hub (`trl_agents.loopback.LoopbackHubServer`) that the
kernel reaches through HF_ENDPOINT, with the token stored where `hf auth login` stores it, exactly as a user's kernel
reaches the Hub. The static checks keep the notebooks usable on Colab or a cloud GPU machine: a guarded install
cell first, progress bars on, nothing that pins the machine, a push to the user's own namespace.
"""

from __future__ import annotations

import base64
import json
import os
import re
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

from trl_agents.loopback import LoopbackHubServer  # noqa: E402

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
NAMES = ["compare_methods", "custom_environment", "quickstart"]
TOKEN = "hf_notebook_token"


def read(name: str) -> nbformat.NotebookNode:
    return nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)


def code_cells(notebook) -> list:
    return [cell for cell in notebook.cells if cell.cell_type == "code"]


def markdown_of(notebook) -> str:
    return "\n".join(cell.source for cell in notebook.cells if cell.cell_type == "markdown")


def push_cell(notebook):
    [cell] = [cell for cell in code_cells(notebook) if "push_run(" in cell.source]
    return cell


def execute(notebook: nbformat.NotebookNode, workdir: Path) -> nbformat.NotebookNode:
    client = nbclient.NotebookClient(notebook, timeout=900, kernel_name="python3",
                                     resources={"metadata": {"path": str(workdir)}})
    client.execute()
    return notebook


def kernel_env(monkeypatch, env: dict[str, str]) -> None:
    """The kernel's environment (it inherits ours): `env`, and no other Hugging Face variable (e.g. an HF_TOKEN)."""
    for key in list(os.environ):
        if key.startswith(("HF_", "HUGGINGFACE_")) and key not in env:
            monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)


def outputs_of(cell) -> list[dict]:
    return [dict(output) for output in cell.get("outputs", [])]


def text_of(notebook) -> str:
    parts = []
    for cell in notebook.cells:
        for output in outputs_of(cell):
            parts.append(output.get("text", "") + json.dumps(output.get("data", {}).get("text/plain", "")))
    return "\n".join(parts)


def assert_install_skipped(notebook) -> None:
    """Where the package is installed (here), the install cell only says so."""
    install = code_cells(notebook)[0]
    assert [output.get("output_type") for output in outputs_of(install)] == ["stream"]
    assert re.fullmatch(r"trl-agents \S+ is installed\n", outputs_of(install)[0]["text"])


# ---- static checks (fast) ----------------------------------------------------------------------------------------


def test_the_notebooks_are_valid_and_carry_no_outputs():
    names = sorted(path.stem for path in NOTEBOOKS.glob("*.ipynb"))
    assert names == NAMES
    for name in names:
        notebook = read(name)
        nbformat.validate(notebook)
        assert all(not cell.get("outputs") for cell in code_cells(notebook)), name


@pytest.mark.parametrize("name", NAMES)
def test_the_first_code_cell_installs_trl_agents_from_source_only_when_it_is_missing(name):
    """trl-agents is not on PyPI: on Colab the notebook installs it from a clone or an uploaded sdist, keeping the
    runtime's torch; where it is installed (these tests, a checkout's venv) the cell installs nothing."""
    notebook = read(name)
    source = code_cells(notebook)[0].source
    lines = source.splitlines()
    guard = lines.index('if importlib.util.find_spec("trl_agents") is None:')
    [pip] = [line for line in lines if "%pip install" in line or "!pip install" in line]
    assert lines.index(pip) > guard and pip.startswith("    "), "the install runs only under the guard"
    assert '"{TRL_AGENTS_SOURCE}"' in pip and '"{KEEP_TORCH}"' in pip
    assert re.search(r'^TRL_AGENTS_SOURCE = "\./trl-agents"', source, re.M)
    assert "KEEP_TORCH = f\"torch=={importlib.metadata.version('torch')}\"" in source
    notes = notebook.cells[notebook.cells.index(code_cells(notebook)[0]) - 1]
    assert notes.cell_type == "markdown" and "## 0. Install" in notes.source
    for needed in ("git clone", "python -m build --sdist", "trl_agents-", "TRL_AGENTS_SOURCE", "torch"):
        assert needed in notes.source, needed
    assert not re.search(r"https?://(?!\.\.\.)", notes.source + source), "no invented URLs: the user gives theirs"


@pytest.mark.parametrize("name", NAMES)
def test_the_notebooks_keep_progress_bars_and_leave_the_machine_to_the_environment(name):
    """Progress bars stay on (TRL's default); device and offline mode come from the environment, not the notebook."""
    code = "\n".join(cell.source for cell in code_cells(read(name)))
    assert "disable_tqdm" not in code
    for pinned in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "use_cpu", "no_cuda", "CUDA_VISIBLE_DEVICES", '"cpu"',
                   "'cpu'", '"cuda"', "'cuda'"):
        assert pinned not in code, pinned


@pytest.mark.parametrize("name", NAMES)
def test_the_notes_on_a_real_model_name_lora_and_qlora_as_trl_takes_them(name):
    notebook = read(name)
    notes = markdown_of(notebook)
    assert "Qwen/Qwen2.5-0.5B-Instruct" in notes and "peft_config=LoraConfig(" in notes
    assert 'model_init_kwargs={"quantization_config": BitsAndBytesConfig(load_in_4bit=True)}' in notes
    for block in re.findall(r"```python\n(.*?)```", notes, re.S):
        compile(block, f"{name} markdown", "exec")


def test_the_qlora_note_is_a_config_field_the_trainers_accept(tmp_path):
    from transformers import BitsAndBytesConfig

    from trl_agents import AgentGRPOConfig, GiGPOConfig

    for config_class in (AgentGRPOConfig, GiGPOConfig):
        config = config_class(output_dir=str(tmp_path), report_to="none",
                              model_init_kwargs={"quantization_config": BitsAndBytesConfig(load_in_4bit=True)})
        assert config.model_init_kwargs["quantization_config"].load_in_4bit


def test_the_push_cell_finds_the_token_like_huggingface_hub_and_pushes_to_the_users_namespace():
    """`get_token()` finds HF_TOKEN, the token `hf auth login` / `notebook_login()` stored and Colab's secret; a bare
    repo name is created in the token owner's namespace (no namespace the user does not own)."""
    notebook = read("quickstart")
    source = push_cell(notebook).source
    assert "get_token()" in source and "HF_TOKEN\")" not in source and "HF_TOKEN\"]" not in source
    assert 'REPO_ID = "frozenlake-gigpo-tiny"' in source and "push_run(RUN_DIR, REPO_ID)" in source
    assert "notebook_login()" in markdown_of(notebook)
    for name in NAMES:
        assert "trl-agents-user/" not in json.dumps(read(name)), name


# ---- execution (slow) --------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_without_a_token_the_push_cell_skips_with_a_clear_line(tmp_path, monkeypatch):
    (tmp_path / "home").mkdir()
    with LoopbackHubServer(token=TOKEN) as hub:
        kernel_env(monkeypatch, hub.client_env(str(tmp_path / "home"), token=None))
        notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell('RUN_DIR = "outputs/quickstart-notebook"'),
                                                   nbformat.v4.new_code_cell(push_cell(read("quickstart")).source)])
        execute(notebook, tmp_path)
        assert hub.requests == []
    printed = [output["text"] for output in outputs_of(notebook.cells[-1]) if output.get("name") == "stdout"]
    assert len(printed) == 1 and printed[0].startswith("No Hugging Face token found: skipping the push")
    assert not [output for output in outputs_of(notebook.cells[-1]) if output["output_type"] == "error"]


@pytest.mark.slow
def test_quickstart_trains_evaluates_pushes_and_ends_with_the_learning_curve(tmp_path, monkeypatch):
    home = tmp_path / "home"
    with LoopbackHubServer(token=TOKEN, user="tester") as hub:
        env = hub.client_env(str(home), token=None)
        kernel_env(monkeypatch, env)
        Path(env["HF_HOME"]).mkdir(parents=True)
        Path(env["HF_HOME"], "token").write_text(TOKEN)  # where `hf auth login` and `notebook_login()` store it
        notebook = execute(read("quickstart"), tmp_path)
        assert hub.unknown_requests == []
        # The bare repo name landed in the token owner's namespace.
        model_files = hub.files("tester/frozenlake-gigpo-tiny")
        dataset_files = hub.files("tester/frozenlake-gigpo-tiny-trajectories", repo_type="dataset")
    assert_install_skipped(notebook)
    run_dir = tmp_path / "outputs" / "quickstart-notebook"
    assert (run_dir / "eval" / "frozenlake-eval-greedy.json").is_file() and (run_dir / "run_info.json").is_file()
    assert {"model.safetensors", "README.md", "eval/frozenlake-eval-greedy.json"} <= set(model_files)
    assert any(path.endswith(".parquet") for path in dataset_files)
    assert "held-out success before RL" in text_of(notebook)
    pushed = "".join(output.get("text", "") for output in outputs_of(push_cell(notebook)))
    assert "/tester/frozenlake-gigpo-tiny" in pushed  # the URLs push_run returned, printed
    last = code_cells(notebook)[-1]
    images = [output["data"]["image/png"] for output in outputs_of(last) if "image/png" in output.get("data", {})]
    assert images and base64.b64decode(images[0]).startswith(b"\x89PNG")  # the learning curve, as an image


@pytest.mark.slow
def test_compare_methods_plots_every_method(tmp_path):
    notebook = execute(read("compare_methods"), tmp_path)
    assert_install_skipped(notebook)
    text = text_of(notebook)
    for name in ("grpo", "gigpo", "ecpo"):
        assert f"{name}: held-out success" in text
    assert (tmp_path / "outputs" / "compare-notebook" / "comparison.png").is_file()
    last = code_cells(notebook)[-1]
    assert any("image/png" in output.get("data", {}) for output in outputs_of(last))


@pytest.mark.slow
def test_custom_environment_passes_the_contract_trains_and_plays(tmp_path):
    notebook = execute(read("custom_environment"), tmp_path)
    assert_install_skipped(notebook)
    text = text_of(notebook)
    assert "contract checks passed" in text
    assert "'Guess a number between 1 and 16.'" in text and "success:" in text
