"""The import graph of `src/trl_agents` has no cycle, imports inside functions included.

A lazy import that runs back up the layers (a record that asks the trainer registry for a method name, a trainer that
imports the outer search loop) hides a cycle from Python but not from a reader; this test builds the graph from the
source with `ast` and fails on any strongly connected component of two or more modules. Only the package's lazy
public face, `trl_agents/__init__.py`, is exempt. Also pinned: no rollout topology imports credit math.
"""

from __future__ import annotations

import ast
from pathlib import Path

SOURCE = Path(__file__).resolve().parents[2] / "src"
PACKAGE = "trl_agents"
EXEMPT = {PACKAGE}  # the lazy public face resolves names on first use


def module_files() -> dict[str, Path]:
    """Module name -> file, for every module of the package (a package is its `__init__.py`)."""
    modules = {}
    for path in sorted((SOURCE / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(SOURCE).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def import_graph() -> dict[str, dict[str, int]]:
    """module -> {imported module of the package: line}, from every `import` / `from ... import` anywhere in the file
    (module level, functions, `if TYPE_CHECKING:` blocks). `from .pkg import name` points at the submodule
    `pkg.name` when there is one, else at `pkg`."""
    modules = module_files()
    graph: dict[str, dict[str, int]] = {name: {} for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                candidates = [f"{target}.{alias.name}" if f"{target}.{alias.name}" in modules else target
                              for alias in node.names]
            elif isinstance(node, ast.Import):
                candidates = [alias.name for alias in node.names]
            else:
                continue
            for candidate in candidates:
                if candidate in modules and candidate != name:
                    graph[name].setdefault(candidate, node.lineno)
    return graph


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of two or more modules (Tarjan's algorithm, iterative), exempt modules
    left out."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in graph:
        if root in index or root in EXEMPT:
            continue
        work = [(root, iter(graph[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next((c for c in children if c not in EXEMPT), None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(graph[child])))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_cycle_finder_finds_a_planted_cycle():
    graph = {"a": {"b": 1}, "b": {"c": 2}, "c": {"a": 3, "d": 4}, "d": {}, PACKAGE: {"a": 1}, "e": {PACKAGE: 1}}
    assert cycles(graph) == [["a", "b", "c"]]


def test_the_graph_sees_function_level_and_submodule_imports():
    graph = import_graph()
    assert "trl_agents.rollout.fast_generation" in graph["trl_agents.rollout.generators"]  # inside a method
    assert "trl_agents.envs.alfworld_gen" in graph["trl_agents.envs.alfworld"]  # `from . import alfworld_gen`
    assert "trl_agents.envs" not in graph["trl_agents.envs.alfworld"]


def test_no_import_cycle_in_the_package():
    graph = import_graph()
    found = cycles(graph)
    detail = [" -> ".join(cycle) + ": " + "; ".join(f"{a}:{graph[a][b]} imports {b}" for a in cycle for b in cycle
                                                    if b in graph[a]) for cycle in found]
    assert not found, "import cycles:\n" + "\n".join(detail)


def test_no_rollout_topology_imports_credit_math():
    graph = import_graph()
    offending = {name: sorted(t for t in targets if t.startswith(f"{PACKAGE}.credit"))
                 for name, targets in graph.items() if name.startswith(f"{PACKAGE}.rollout.topologies")}
    assert not {name: targets for name, targets in offending.items() if targets}
