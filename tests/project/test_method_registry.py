"""The method registry reads the trainer classes; every method has its five parts; the seams stay clean.

A new method is five files — its math (credit/ or distill/), its trainer, its config(s), its test file, its docs page —
and nothing else to edit: these tests walk the registry and the repository to keep it so.
"""

from __future__ import annotations

import ast
import glob
import importlib
import inspect
import os
import re
import subprocess
import sys

import pytest
import yaml

from trl_agents.trainers import METHODS, AgentGRPOTrainer

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))
SRC = os.path.join(ROOT, "src", "trl_agents")
SEEDED = ("opsd", "sdar", "canopy", "bpo")  # the methods of the method-seams issue, with the earlier twelve
DISTILLATION = ("ocsd", "adrs", "pcsd", "grsd", "envrl", "dark_room")  # self-distillation and auxiliary objectives
TOPOLOGY = ("patr", "igrpo", "appo", "dpepo")  # tree, branching and parallel rollouts (and 3spo's allocation)
DYNAMICS = ("eppo", "llmzero")  # training dynamics and the strategy controller
SECTIONS = ("What it does", "Equations", "Defaults", "Our choices", "Hand-computed case", "Headline number", "Use it")


def configs_of(name: str) -> list[str]:
    found = []
    for path in sorted(glob.glob(os.path.join(ROOT, "configs", "*.yaml"))):
        with open(path) as handle:
            if (yaml.safe_load(handle) or {}).get("method") == name:
                found.append(os.path.basename(path))
    return found


def test_every_method_comes_from_a_trainer_declaration():
    assert {"grpo", "dr_grpo", "rloo", "gigpo", "bepo", "ecpo", "progpo", "scpo", "bipace", "3spo", "vict", "cast",
            *SEEDED, *DISTILLATION, *TOPOLOGY, *DYNAMICS} <= set(METHODS)
    for name, method in METHODS.items():
        assert method.info in vars(method.trainer_class)["methods"], name  # declared by the class itself
        assert method.paper.startswith("arXiv "), name


@pytest.mark.parametrize("name", sorted(METHODS))
def test_each_method_has_its_five_parts(name):
    method = METHODS[name]
    # 1. the math: a module of credit/ or distill/
    assert re.fullmatch(r"trl_agents\.(credit|distill)\.\w+", method.info.math), method.info.math
    importlib.import_module(method.info.math)
    # 2. the trainer file
    trainer_file = inspect.getsourcefile(method.trainer_class)
    assert os.path.dirname(trainer_file) == os.path.join(SRC, "trainers"), trainer_file
    # 3. at least one config that names it
    assert configs_of(name), f"no configs/*.yaml with `method: {name}`"
    # 4. its test files
    assert method.info.tests, f"{name} declares no test file"
    for test in method.info.tests:  # a test file, or the method's folder of tests (tests/methods/<name>/)
        path = os.path.join(ROOT, test)
        assert os.path.isfile(path) or glob.glob(os.path.join(path, "test_*.py")), test
    # 5. its docs page, with the sections every page has
    page = os.path.join(ROOT, method.docs)
    assert os.path.isfile(page), method.docs
    headings = re.findall(r"^## (.+)$", open(page).read(), re.MULTILINE)
    assert [h for h in headings if h in SECTIONS] == list(SECTIONS), (method.docs, headings)


@pytest.mark.parametrize("name", sorted(METHODS))
def test_our_choices_are_documented_on_the_method_page(name):
    # Every field the method's config adds whose help says "our choice" is named in the page's "Our choices" (the
    # shared AgentGRPOConfig fields are documented in docs/concepts and docs/signals.md).
    method = METHODS[name]
    shared = set(AgentGRPOTrainer.config_class.__dataclass_fields__)
    page = open(os.path.join(ROOT, method.docs)).read()
    section = page.split("## Our choices", 1)[1].split("\n## ", 1)[0]
    for field_name, field in method.config_class.__dataclass_fields__.items():
        if field_name not in shared and "our choice" in field.metadata.get("help", "").lower():
            assert field_name in section, f"{method.docs}: 'Our choices' does not name {field_name}"


def test_new_methods_need_no_edit_outside_their_files():
    # trainers/__init__.py imports no new method (the registry discovers trainers/*.py); the package resolves their
    # classes by name through the registry.
    init = open(os.path.join(SRC, "trainers", "__init__.py")).read()
    for module in ("opsd", "sdar", "canopy", "bpo", "ocsd", "adrs", "pcsd", "grsd", "envrl", "dark_room"):
        assert f"from .{module} import" not in init
    import trl_agents

    assert trl_agents.BPOTrainer is METHODS["bpo"].trainer_class
    assert trl_agents.CANOPYConfig is METHODS["canopy"].config_class


def test_methods_command_lists_signals_capabilities_and_topology():
    out = subprocess.run([sys.executable, "-m", "trl_agents.cli", "methods"], capture_output=True, text=True,
                         check=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}).stdout
    blocks = {block.split()[0]: block for block in re.split(r"\n(?=\S)", out.strip())}
    assert {"opsd", "sdar", "canopy", "bpo"} <= set(blocks)
    assert "signals: teacher_logprobs, privileged_context" in blocks["sdar"]
    assert "signals: teacher_prompt, privileged_context" in blocks["opsd"]
    assert "topology: adaptive" in blocks["canopy"] and "topology: branching" in blocks["bpo"]
    assert "signals: entropy" in blocks["bpo"] and "env capabilities: snapshot" in blocks["bpo"]
    assert "env capabilities: privileged_context" in blocks["sdar"]
    assert "docs/methods/bpo.md" in blocks["bpo"]
    # the self-distillation and auxiliary-objective methods, with the signals each computes
    assert "signals: ocsd_residual;" in blocks["ocsd"]
    for name in ("adrs", "pcsd"):
        assert "signals: teacher_logprobs, privileged_context;" in blocks[name]
    assert "signals: teacher_logprobs;" in blocks["grsd"]  # under the group's guidance: no env capability
    for name in ("envrl", "dark_room"):
        assert "signals: envrl_examples;" in blocks[name]
    # the rollout-topology methods: each with its topology, the signals it computes and the capabilities it needs
    assert "signals: solver_value; topology: patr" in blocks["patr"] and "snapshot" in blocks["patr"]
    assert "signals: gold_likelihood, privileged_context; topology: info_gain" in blocks["igrpo"]
    assert "signals: policy_logprobs; topology: token_branching" in blocks["appo"]
    assert "topology: independent" in blocks["dpepo"] and "parallel environment" in blocks["dpepo"]
    assert "sspo_allocation='adaptive'" in blocks["3spo"] and "state_score" in blocks["3spo"]
    assert "signals: eppo_task_type;" in blocks["eppo"] and "controller (outer loop)" in blocks["llmzero"]


def test_readme_method_table_lists_every_registered_method():
    readme = open(os.path.join(ROOT, "README.md")).read()
    table = readme.split("## Methods", 1)[1].split("\n## ", 1)[0]
    for name, method in METHODS.items():
        row = next((line for line in table.splitlines() if f"`{name}`" in line), None)
        assert row, f"README's method table has no row for `{name}`"
        assert method.paper.split()[-1] in row and method.docs in row, row


# ---------------------------------------------------------------- the seams stay clean


def test_the_engine_names_no_method_and_no_signal():
    engine = open(os.path.join(SRC, "rollout", "engine.py")).read()
    names = {*METHODS, "gigpo", "cast", "vict", "bipace", "sspo", "opsd", "sdar", "canopy", "bpo"}
    for word in re.findall(r"[A-Za-z_]+", engine):
        assert word.lower() not in names, f"rollout/engine.py mentions the method {word!r}"
    for signal in ("solver_value", "verifier_atoms", "verify", "privileged_context", "hidden", "entropy",
                   "teacher", "record_signals"):
        assert signal not in engine, f"rollout/engine.py mentions the signal {signal!r}"


def _trl_private_names() -> set[str]:
    from trl import GRPOTrainer

    return {name for cls in GRPOTrainer.__mro__ for name in vars(cls) if name.startswith("_") and
            not name.startswith("__")}


def test_no_trainer_but_agent_grpo_defines_a_trl_private_method():
    private = _trl_private_names()
    for path in sorted(glob.glob(os.path.join(SRC, "trainers", "*.py"))):
        if os.path.basename(path) == "agent_grpo.py":
            continue
        tree = ast.parse(open(path).read())
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name in private:
                        pytest.fail(f"{os.path.relpath(path, ROOT)}: {node.name}.{item.name} overrides TRL's "
                                    "private method; only trainers/agent_grpo.py may")


def _private_attribute_names() -> tuple[set[str], set[str]]:
    """(TRL's private names: class attributes of GRPOTrainer's classes and `self._x` they assign, AgentGRPOTrainer's
    own private names: class attributes and `self._x` it assigns)."""
    from trl import GRPOTrainer

    from trl_agents.trainers import agent_grpo

    def assigned(source: str) -> set[str]:
        return {node.attr for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name) and node.value.id == "self" and isinstance(node.ctx, ast.Store)
                and node.attr.startswith("_") and not node.attr.startswith("__")}

    trl = set(_trl_private_names())
    for cls in GRPOTrainer.__mro__:
        module = inspect.getmodule(cls)
        if module is not None and module.__name__.startswith(("trl.", "transformers.")):
            trl |= assigned(inspect.getsource(module))
    ours = {name for name in vars(agent_grpo.AgentGRPOTrainer) if name.startswith("_") and not name.startswith("__")}
    ours |= assigned(open(agent_grpo.__file__).read())
    return trl, ours


def test_only_agent_grpo_reads_or_writes_private_trainer_attributes():
    # TRL's private attributes (and AgentGRPOTrainer's) are touched in trainers/agent_grpo.py only, so that the
    # contract test pins all of TRL we rely on; everything else goes through public hooks and accessors
    # (`text_tokenizer`, `sampling_params`, `model_signal`, `install_lr_scheduler`, `card_metadata`, `config_class`).
    # Class-level declarations (`_tag_names = [...]`, `_name = ...` in a trainer's body) are names, not attributes.
    trl, ours = _private_attribute_names()
    offenders = []
    for path in sorted(glob.glob(os.path.join(SRC, "**", "*.py"), recursive=True)):
        if path.endswith(os.path.join("trainers", "agent_grpo.py")):
            continue
        for node in ast.walk(ast.parse(open(path).read())):
            if isinstance(node, ast.Attribute) and node.attr in trl | ours:
                owner = "TRL" if node.attr in trl else "AgentGRPOTrainer"
                offenders.append(f"{os.path.relpath(path, ROOT)}:{node.lineno}: {owner}'s {node.attr}")
    assert not offenders, "\n".join(offenders)


def test_no_trainer_defines_a_removed_hook():
    # Hooks of earlier versions that nothing calls any more: a trainer defining one would silently do nothing.
    removed = {"prepare_signals", "record_signals", "advantages_with_stats"}
    for path in sorted(glob.glob(os.path.join(SRC, "trainers", "*.py"))):
        for node in ast.walk(ast.parse(open(path).read())):
            if isinstance(node, ast.ClassDef):
                defined = {item.name for item in node.body if isinstance(item, ast.FunctionDef)}
                defined |= {t.id for item in node.body if isinstance(item, ast.Assign) for t in item.targets
                            if isinstance(t, ast.Name)}
                assert not defined & removed, f"{os.path.relpath(path, ROOT)}: {node.name} defines {defined & removed}"


# A path outside the repository: the research notes, the build machine's folders, or going up from the repository.
# Each name is written in two pieces joined at import, so that this file, which looks for them, cites none of them.
_OUTSIDE_NAMES = [
    ("methods", "_specs"), ("methods", "_with_code"), ("anchor", "_verl_agent"), ("anchor", "_frameworks"),
    ("trl", "_groundwork"), ("gpu", "_notes"), ("quickstart", "_probe"), ("DESIGN", r"\.md"),
    ("shared", "/research"), ("shared", "/seeds"), ("/wo", "rk/"), (r"\.\./", "shared"),
]
OUTSIDE = re.compile("|".join(head + tail for head, tail in _OUTSIDE_NAMES) + r"""|(?<![\w/"'])envs\.md""")


def test_nothing_cites_a_path_outside_the_repository():
    files = [os.path.join(ROOT, "README.md")]
    for folder in ("src", "tests", "configs", "docs", "envs", "benchmarks", "notebooks"):
        for path in glob.glob(os.path.join(ROOT, folder, "**", "*"), recursive=True):
            if os.path.isfile(path) and path.endswith((".py", ".md", ".yaml", ".ipynb", ".txt", ".json")) and (
                    ".egg-info" not in path and "__pycache__" not in path and "/results/" not in path):
                files.append(path)
    me = os.path.abspath(__file__)
    offenders = []
    for path in files:
        if os.path.abspath(path) == me:
            continue
        for number, line in enumerate(open(path, errors="replace"), start=1):
            if OUTSIDE.search(line):
                offenders.append(f"{os.path.relpath(path, ROOT)}:{number}: {line.strip()[:100]}")
    assert not offenders, "\n".join(offenders)


def _overrides_by_trainer() -> dict[str, set[str]]:
    """name defined in a method trainer class's body (a method or a class attribute) -> the trainers defining it,
    each named by the methods it declares ("sdar/grpo_opsd"), read from the source with `ast`."""
    found: dict[str, set[str]] = {}
    for path in sorted(glob.glob(os.path.join(SRC, "trainers", "*.py"))):
        if os.path.basename(path) in ("agent_grpo.py", "agent_grpo_config.py", "registry.py", "__init__.py"):
            continue
        source = open(path).read()
        for node in ast.parse(source).body:
            if not (isinstance(node, ast.ClassDef) and node.name.endswith("Trainer")):
                continue
            label = "/".join(re.findall(r'MethodInfo\(\s*"([a-z0-9_]+)"', ast.get_source_segment(source, node)))
            for item in node.body:
                names = [item.name] if isinstance(item, ast.FunctionDef) else []
                names += [t.id for t in getattr(item, "targets", []) if isinstance(t, ast.Name)]
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    names.append(item.target.id)
                for name in names:
                    found.setdefault(name, set()).add(label or node.name)
    return found


def test_the_hooks_page_lists_who_overrides_each_hook():
    # docs/concepts/hooks.md is the one list of hooks: its "overridden by" column is what the trainers define.
    page = open(os.path.join(ROOT, "docs", "concepts", "hooks.md")).read()
    rows = re.findall(r"^\| `([a-z_]+)[^|]*\| [^|]+\| [^|]+\| ([^|]+) \|$", page, re.MULTILINE)
    assert len(rows) >= 20, rows
    found = _overrides_by_trainer()
    every = found.get("methods", set())
    for hook, column in rows:
        expected = found.get(hook, set())
        if column.strip() == "every method trainer":
            assert expected == every, (hook, sorted(every - expected))
        else:
            listed = set() if column.strip() == "—" else {name.strip() for name in column.split(",")}
            assert listed == expected, (hook, sorted(listed ^ expected))
