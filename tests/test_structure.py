"""The shape of the package: an import graph without cycles, small modules and functions, one
place that plans the sharding, no library module that runs the package's own command, and a
README that lists every module.

The import graph has an edge A -> B for every ``import`` or ``from ... import`` of B written in
A, at any depth (function bodies included); imports under ``if TYPE_CHECKING:`` never run and
are left out. ``from P import name`` points at ``P.name`` when that is a module, else at ``P``.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "neuron_port"
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 80


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST) -> list[tuple[str, list[str]]]:
    """(module, imported names) of every import statement outside TYPE_CHECKING blocks."""
    found: list[tuple[str, list[str]]] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.extend((alias.name, []) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.module, [alias.name for alias in node.names]))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for module, names in _imports(ast.parse(path.read_text())):
            targets = [f"{module}.{n}" for n in names if f"{module}.{n}" in modules] or [module]
            graph[name].update(t for t in targets if t in modules and t != name)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path (first node repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def dfs(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                cycle = dfs(nxt)
                if cycle:
                    return cycle
        state[node] = 2
        path.pop()
        return None

    for start in sorted(graph):
        if start not in state:
            cycle = dfs(start)
            if cycle:
                return cycle
    return None


def test_the_cycle_finder_finds_a_planted_cycle():
    graph = import_graph()
    planted = {k: set(v) for k, v in graph.items()}
    planted["neuron_port.shapes"].add("neuron_port.runtime")  # runtime imports shapes
    assert find_cycle(planted) is not None
    assert "neuron_port.shapes" in graph["neuron_port.runtime"]


def test_no_import_cycles():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_modules_and_functions_stay_small():
    too_long = []
    for name, path in _modules().items():
        lines = path.read_text().splitlines()
        if len(lines) > MAX_MODULE_LINES:
            too_long.append(f"{name}: {len(lines)} lines")
        for node in ast.walk(ast.parse("\n".join(lines))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    too_long.append(f"{name}.{node.name}: {length} lines")
    assert not too_long, too_long


def test_the_shard_plan_is_made_in_few_places():
    """``plan_model`` is called from at most three modules besides ``sharding`` itself."""
    callers = set()
    for name, path in _modules().items():
        if name == "neuron_port.sharding":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "plan_model":
                callers.add(name)
    assert "neuron_port.ranks" in callers
    assert len(callers) <= 3, sorted(callers)


def _runs_the_command(tree: ast.AST) -> bool:
    """A list or tuple literal that spells ``[..., "-m", "neuron_port..."]`` or ``["neuron-port", ...]``."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.List, ast.Tuple)):
            words = [e.value if isinstance(e, ast.Constant) else None for e in node.elts]
            if words[:1] == ["neuron-port"] and not any(isinstance(w, (int, float)) for w in words):
                return True
            if any(a == "-m" and isinstance(b, str) and b.startswith("neuron_port") for a, b in zip(words, words[1:])):
                return True
    return False


def test_no_library_module_runs_the_command():
    """Library results never depend on what the command prints: no library module spawns the
    command or imports it (only ``__main__`` does)."""
    graph = import_graph()
    offenders = []
    for name, path in _modules().items():
        if name in ("neuron_port.cli", "neuron_port.__main__") or name.startswith("neuron_port.commands"):
            continue
        if _runs_the_command(ast.parse(path.read_text())) or graph[name] & {"neuron_port.cli", "neuron_port.commands"}:
            offenders.append(name)
    assert not offenders, offenders
    assert _runs_the_command(ast.parse('cmd = [sys.executable, "-m", "neuron_port", "generate"]'))


def test_readme_module_table_lists_every_module():
    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("## Modules"):]
    listed = set(re.findall(r"`([a-z0-9_.]+)`", table))
    missing = [name.removeprefix("neuron_port.") for name in _modules()
               if name != "neuron_port" and name.removeprefix("neuron_port.") not in listed]
    assert not missing, missing
