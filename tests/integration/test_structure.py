"""The shape of the package: folders that are layers (no module imports a higher one), an import
graph without cycles, small modules and functions, one place that plans the sharding, no library
module that runs the package's own command, and a README table of the layers.

The import graph has an edge A -> B for every ``import`` or ``from ... import`` of B written in
A, at any depth (function bodies included); imports under ``if TYPE_CHECKING:`` never run and
are counted only where a check asks for them. ``from P import name`` points at ``P.name`` when that is a module, else at ``P``.
"""


from __future__ import annotations

import ast
import itertools
import re
from pathlib import Path

from tests.helpers import ROOT

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


def _imports(tree: ast.AST, type_checking: bool = False) -> list[tuple[str, list[str]]]:
    """(module, imported names) of every import statement; under ``if TYPE_CHECKING:`` only when
    ``type_checking``."""
    found: list[tuple[str, list[str]]] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node) and not type_checking:
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


def import_graph(type_checking: bool = False) -> dict[str, set[str]]:
    """Module -> the package modules it imports (``type_checking``: annotation-only imports too)."""
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for module, names in _imports(ast.parse(path.read_text()), type_checking):
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
    planted["neuron_port.graph.shapes"].add("neuron_port.generation.slots")  # slots imports shapes
    assert find_cycle(planted) is not None
    assert "neuron_port.graph.shapes" in graph["neuron_port.generation.slots"]


def test_no_import_cycles():
    """None at run time, and none once the imports written for annotations are counted too."""
    for type_checking in (False, True):
        cycle = find_cycle(import_graph(type_checking))
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
        if name == "neuron_port.parallel.sharding":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "plan_model":
                callers.add(name)
    assert "neuron_port.parallel.ranks" in callers
    assert len(callers) <= 3, sorted(callers)


def _runs_the_command(tree: ast.AST) -> bool:
    """A list or tuple literal that spells ``[..., "-m", "neuron_port..."]`` or ``["neuron-port", ...]``."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.List, ast.Tuple)):
            words = [e.value if isinstance(e, ast.Constant) else None for e in node.elts]
            if words[:1] == ["neuron-port"] and not any(isinstance(w, (int, float)) for w in words):
                return True
            if any(a == "-m" and isinstance(b, str) and b.startswith("neuron_port") for a, b in itertools.pairwise(words)):
                return True
    return False


def test_no_library_module_runs_the_command():
    """Library results never depend on what the command prints: no library module spawns the
    command or imports it (only ``__main__`` does)."""
    graph = import_graph()
    offenders = []
    for name, path in _modules().items():
        if name in ("neuron_port.cli.command", "neuron_port.cli.reference", "neuron_port.__main__") \
                or name.startswith("neuron_port.cli.commands"):
            continue
        commands = {"neuron_port.cli.command", "neuron_port.cli.commands"}
        if _runs_the_command(ast.parse(path.read_text())) or graph[name] & commands:
            offenders.append(name)
    assert not offenders, offenders
    assert _runs_the_command(ast.parse('cmd = [sys.executable, "-m", "neuron_port", "generate"]'))


# The layers, bottom to top: a module may import its own layer and the ones below it, never one
# above. The package root (``__init__``, ``__main__``) sits above them all.
LAYERS = [
    ("base", ["errors", "versions", "progress"]),
    ("families", ["families"]),
    ("model", ["model"]),
    ("parallel", ["parallel"]),
    ("graph", ["graph"]),
    ("backends", ["backends"]),
    ("artifacts", ["artifacts"]),
    ("generation", ["generation"]),
    ("checks", ["checks"]),
    ("planner", ["planner"]),
    ("auto", ["auto"]),
    ("serve", ["serve"]),
    ("cli", ["cli"]),
]
ROOT_MODULES = {"neuron_port", "neuron_port.__main__"}


def layer_of(module: str) -> int:
    """Index in :data:`LAYERS` of the layer holding ``module`` (a dotted name under neuron_port)."""
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            dotted = "neuron_port." + prefix
            if module == dotted or module.startswith(dotted + "."):
                return index
    raise LookupError(f"{module} is in no layer of tests/integration/test_structure.py's LAYERS; place it in one")


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Every edge of ``graph`` from a module to a module of a higher layer, as readable lines."""
    found = []
    for module, targets in sorted(graph.items()):
        if module in ROOT_MODULES:
            continue
        for target in sorted(targets - ROOT_MODULES):
            if layer_of(target) > layer_of(module):
                found.append(f"{module} ({LAYERS[layer_of(module)][0]}) imports {target} ({LAYERS[layer_of(target)][0]})")
    return found


def test_every_module_sits_in_a_layer():
    unplaced = []
    for module in _modules():
        if module in ROOT_MODULES:
            continue
        try:
            layer_of(module)
        except LookupError as exc:
            unplaced.append(str(exc))
    assert not unplaced, unplaced


def test_no_module_imports_a_higher_layer():
    """Run-time, function-level and annotation-only (``TYPE_CHECKING``) imports all count."""
    found = upward_imports(import_graph(type_checking=True))
    assert not found, found


def test_the_layer_check_catches_a_planted_upward_import():
    graph = {k: set(v) for k, v in import_graph(type_checking=True).items()}
    graph["neuron_port.graph.kv"].add("neuron_port.generation.slots")
    assert upward_imports(graph) == ["neuron_port.graph.kv (graph) imports neuron_port.generation.slots (generation)"]
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from neuron_port.serve import app\n")
    assert _imports(tree) == [("typing", ["TYPE_CHECKING"])]
    assert ("neuron_port.serve", ["app"]) in _imports(tree, type_checking=True)


def test_readme_layers_table_names_every_folder_and_top_module():
    """README's layers table names every folder and top-level module, in the order of LAYERS."""
    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("## Layers") :]
    table = table[: table.index("\n## ")]
    rows = re.findall(r"^\| `([a-z0-9_]+/|[a-z0-9_]+\.py)`", table, flags=re.M)
    listed = set(re.findall(r"`([a-z0-9_]+/|[a-z0-9_]+\.py)`", table))
    entries = {
        p.name + "/" if p.is_dir() else p.name
        for p in PACKAGE.iterdir()
        if p.name not in ("__init__.py", "__main__.py", "__pycache__")
    }
    assert entries - listed == set(), sorted(entries - listed)
    assert [r.removesuffix("/").removesuffix(".py") for r in rows][1:] == [name for name, _ in LAYERS][1:]


def test_each_layer_exports_its_public_names():
    """Every layer package but the command's (``cli``) exports a handful of names: each resolves, is in the
    ``__all__`` of the module that defines it, and the API reference opens the layer's section with it."""
    import importlib

    api = (ROOT / "docs" / "api.md").read_text()
    for layer, _ in LAYERS[1:]:
        if not (PACKAGE / layer / "__init__.py").is_file() or layer == "cli":
            continue
        package = importlib.import_module(f"neuron_port.{layer}")
        names = getattr(package, "__all__", [])
        assert 0 < len(names) <= 20, f"neuron_port.{layer} exports {len(names)} names"
        for name in names:
            value = getattr(package, name)
            home = importlib.import_module(getattr(value, "__module__", None) or f"neuron_port.{layer}")
            if home.__name__.startswith(f"neuron_port.{layer}.") and hasattr(home, "__all__"):
                assert name in home.__all__, f"neuron_port.{layer}.{name} is not in {home.__name__}.__all__"
        assert f"::: neuron_port.{layer}\n" in api, f"docs/api.md has no section opening for neuron_port.{layer}"


def _exception_classes_outside_errors(sources: dict[str, str] | None = None) -> list[str]:
    """Classes defined outside ``errors.py`` whose bases name an exception type (a builtin one, one of
    the library's errors, or any ``*Error``/``*Exception`` name)."""
    import builtins

    import neuron_port.errors as errors

    exception_names = {n for n, v in vars(builtins).items() if isinstance(v, type) and issubclass(v, BaseException)}
    exception_names |= {n for n, v in vars(errors).items() if isinstance(v, type) and issubclass(v, BaseException)}
    found = []
    sources = sources if sources is not None else {name: path.read_text() for name, path in _modules().items()}
    for name, text in sources.items():
        if name == "neuron_port.errors":
            continue
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef):
                bases = [ast.unparse(b).rpartition(".")[2] for b in node.bases]
                if any(b in exception_names or b.endswith(("Error", "Exception")) for b in bases):
                    found.append(f"{name}.{node.name}")
    return found


def test_every_error_class_is_in_errors_py_and_a_neuron_port_error():
    import neuron_port.errors as errors

    assert _exception_classes_outside_errors() == []
    planted = {
        "neuron_port.serve.x": "class Refused(Exception):\n    pass\nclass Fine:\n    pass\n",
        "neuron_port.model.y": "from neuron_port import errors\nclass Bad(errors.ConfigError):\n    pass\n",
    }
    assert _exception_classes_outside_errors(planted) == ["neuron_port.serve.x.Refused", "neuron_port.model.y.Bad"]
    classes = [v for v in vars(errors).values() if isinstance(v, type) and issubclass(v, BaseException)]
    assert len(classes) >= 18
    assert all(issubclass(c, errors.NeuronPortError) for c in classes)


def test_the_engines_import_without_the_serve_extra():
    """serve.engine and serve.lockstep run in environments without FastAPI (the torch-xla stage)."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "sys.modules['fastapi'] = None\n"  # makes any import of it fail
        "sys.modules['uvicorn'] = None\n"
        "import neuron_port.serve.engine, neuron_port.serve.lockstep\n"
        "import neuron_port.serve as serve\n"
        "try:\n"
        "    serve.build_app\n"
        "except ImportError:\n"
        "    sys.exit(0)\n"
        "sys.exit(3)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]


RETIRED_GENERATION_NAMES = (
    "generate_with_port",
    "generate_from_artifact",
    "run_artifact",
    "greedy_generate",
    "Generator",
    "GreedyResult",
    "BatchRun",
    "Completion",
    "StaticEngine",
)


def _generation_entry_points(sources: dict[str, str] | None = None) -> tuple[list[str], list[str]]:
    """(retired generation names defined anywhere, result classes defined under ``generation``)."""
    sources = sources or {name: path.read_text() for name, path in _modules().items()}
    retired, results = [], []
    for name, text in sources.items():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in RETIRED_GENERATION_NAMES:
                retired.append(f"{name}.{node.name}")
            if isinstance(node, ast.ClassDef) and name.startswith("neuron_port.generation") and node.name.endswith("Result"):
                results.append(f"{name}.{node.name}")
    return retired, results


def test_one_generate_one_request_one_result():
    """The public way to generate is ``generate(source, request)``; the old entry points and
    result types are gone, and ``generation`` defines one result class."""
    retired, results = _generation_entry_points()
    assert retired == []
    assert results == ["neuron_port.generation.request.GenerationResult"]
    planted = {"neuron_port.generation.x": "def greedy_generate(port):\n    pass\nclass BatchResult:\n    pass\n"}
    assert _generation_entry_points(planted) == (
        ["neuron_port.generation.x.greedy_generate"],
        ["neuron_port.generation.x.BatchResult"],
    )


MODEL_COPIERS = {
    "neuron_port.graph.port.Port.over_model",  # a port over a model copies it (its graphs switch attention)
    "neuron_port.graph.drafter.DrafterGraph.over",  # a drafter graph over a drafter copies it (the same)
    "neuron_port.parallel.ranks.make_rank",  # a rank's own model at tp 1
    "neuron_port.parallel.shard_model.shard_model",  # a rank's shard
    "neuron_port.backends.spmd.spmd_model",  # the model laid out for SPMD
    "neuron_port.backends.nxd.device_copy",  # the device half for NxD's trace
    "neuron_port.families.phi3.Phi3Family.set_attention_projections",  # an attention module's config, not a model
    "benchmarks.nxd_build_memory._deep_copy_per_key",  # the peer: the earlier factory's residency, reproduced
}


def _deepcopy_sites(sources: dict[str, str]) -> set[str]:
    """``module.Class.function`` of every ``copy.deepcopy`` / ``deepcopy`` call."""
    sites = set()

    def visit(module: str, node: ast.AST, scope: list[str]) -> None:
        for child in ast.iter_child_nodes(node):
            inner = scope + [child.name] if isinstance(child, (ast.FunctionDef, ast.ClassDef)) else scope
            if isinstance(child, ast.Call):
                f = child.func
                if (isinstance(f, ast.Attribute) and f.attr == "deepcopy") or (isinstance(f, ast.Name) and f.id == "deepcopy"):
                    sites.add(".".join([module, *scope]))
            visit(module, child, inner)

    for name, text in sources.items():
        visit(name, ast.parse(text), [])
    return sites


def test_models_are_deep_copied_only_by_the_constructors_that_take_one():
    """No caller copies a model before handing it to a port: the constructors that take a model
    copy it themselves (package, tests, benchmarks and examples scanned)."""
    sources = {name: path.read_text() for name, path in _modules().items()}
    for folder in ("tests", "benchmarks", "examples"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            sources[".".join(path.relative_to(ROOT).with_suffix("").parts)] = path.read_text()
    assert _deepcopy_sites(sources) <= MODEL_COPIERS
    planted = {"tests.test_x": "import copy\ndef test_a(model):\n    return Port.over_model(copy.deepcopy(model), s)\n"}
    assert _deepcopy_sites(planted) == {"tests.test_x.test_a"}


def test_port_is_a_small_value():
    """``Port`` holds its inputs, runners and graphs; one constructor per source; no list forms."""
    import inspect

    from neuron_port.graph.port import Port

    assert len(inspect.signature(Port.__init__).parameters) - 1 <= 5
    for retired in (
        "host_inputs_prefill",
        "host_inputs_decode",
        "decode_inputs",
        "example_inputs_prefill",
        "example_inputs_decode",
        "new_store",
        "grow_store",
        "prefill_runners",
        "decode_runners",
    ):
        assert not hasattr(Port, retired), retired
    forwarding = [n for n, v in vars(Port).items() if isinstance(v, property)]
    assert len(forwarding) <= 5, forwarding


def test_one_place_starts_process_groups():
    sources = {name: path.read_text() for name, path in _modules().items()}
    starters = sorted(name for name, text in sources.items() if "init_process_group(" in text)
    assert starters == ["neuron_port.parallel.launch"]
    assert sources["neuron_port.parallel.launch"].count("init_process_group(") == 1


def _reexports(sources: dict[str, str]) -> list[str]:
    """``module.name`` for every name a module lists in ``__all__`` but imports from another
    neuron_port module (a package's ``__init__`` is its public face and may)."""
    found = []
    for name, text in sources.items():
        tree = ast.parse(text)
        imported = {
            alias.asname or alias.name
            for node in tree.body
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("neuron_port")
            for alias in node.names
        }
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
                found += [f"{name}.{e.value}" for e in node.value.elts if e.value in imported]
    return found


def test_no_module_re_exports_another_modules_names():
    modules = _modules()
    sources = {name: path.read_text() for name, path in modules.items() if path.name != "__init__.py"}
    assert _reexports(sources) == []
    planted = {"neuron_port.graph.x": "from neuron_port.graph.shapes import select_bucket\n__all__ = ['select_bucket']\n"}
    assert _reexports(planted) == ["neuron_port.graph.x.select_bucket"]


def test_one_check_type():
    """Self-checks, lint findings, artifact checks and the doctor all report ``checks.check.Check``."""
    from neuron_port.checks.check import Check

    classes = sorted(
        f"{name}.{node.name}"
        for name, path in _modules().items()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef) and node.name in ("Check", "Finding")
    )
    assert classes == ["neuron_port.checks.check.Check"]
    finding = Check.finding("xla-fallback", "error", "aten::nonzero", "ran on the CPU", "move it")
    assert finding.failed and finding.to_finding() == {
        "rule": "xla-fallback",
        "severity": "error",
        "where": "aten::nonzero",
        "detail": "ran on the CPU",
        "fix": "move it",
    }
    assert Check("port", "pass", "equal").to_json() == {"name": "port", "status": "pass", "detail": "equal", "fix": ""}
    assert Check(**Check("logits", "fail", "off", "fix it").to_json()) == Check("logits", "fail", "off", "fix it")
    import pytest

    with pytest.raises(ValueError, match="status is one of"):
        Check("x", "error", "a severity is not a status")


def test_the_tree_is_lint_clean_and_ci_lints_it():
    """``ruff check .`` with pyproject's rules finds nothing, and ``.ci/run`` runs it."""
    import shutil
    import subprocess

    import pytest

    assert "\nruff check .\n" in (ROOT / ".ci" / "run").read_text()
    assert "[tool.ruff]" in (ROOT / "pyproject.toml").read_text()
    ruff = shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff is not installed (the test extra installs it)")
    proc = subprocess.run([ruff, "check", "."], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:]


# tests/ mirrors the package: a folder per layer of LAYERS for that layer's unit tests, and these beside them.
TEST_FOLDERS_BEYOND_LAYERS = {
    "integration": "end-to-end flows: commands, recipes, the server, artifacts across processes, real checkpoints",
    "xla": "the torch-xla stage (its own virtualenv)",
    "nxd": "neuronx-distributed's own code (the torch-xla virtualenv)",
    "support": "what tests install or import: the stand-in Neuron SDK, plugin packages",
}
TOP_LEVEL_TEST_FILES = {"__init__.py", "conftest.py", "helpers.py"}
# Modules no unit test in their layer's folder imports yet (they run through other layers' tests and the
# integration tests). The list only shrinks: a new module comes with its unit tests.
UNIT_TESTS_TO_WRITE: set[str] = set()


def _test_layer_folder(module: str) -> str:
    """The folder under tests/ for ``module``'s unit tests: the name of its layer."""
    return LAYERS[layer_of(module)][0]


def _imported_modules(path: Path) -> set[str]:
    """Every module (and module.name) ``path`` imports from."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def layout_problems(tests: Path, modules: dict[str, Path]) -> tuple[list[str], set[str]]:
    """(what is out of place under ``tests``, the modules of ``modules`` that no test in their layer's folder
    imports, without the ``neuron_port.`` prefix)."""
    problems = [f"tests/{p.name} sits at the top level: move it into its layer's folder or integration/"
                for p in sorted(tests.glob("*.py")) if p.name not in TOP_LEVEL_TEST_FILES]
    wanted = {name for name, _ in LAYERS} | set(TEST_FOLDERS_BEYOND_LAYERS)
    folders = {d.name for d in tests.iterdir() if d.is_dir() and not d.name.startswith(("__", "."))}
    problems += [f"tests/{name}/ is not a layer of the package nor one of {sorted(TEST_FOLDERS_BEYOND_LAYERS)}"
                 for name in sorted(folders - wanted)]
    problems += [f"tests/{name}/ is missing" for name in sorted(wanted - folders)]
    untested = set()
    for module in modules:
        if module in ROOT_MODULES or modules[module].name == "__init__.py":
            continue
        folder = tests / _test_layer_folder(module)
        imported = set().union(*(_imported_modules(p) for p in folder.rglob("test_*.py"))) if folder.is_dir() else set()
        if module not in imported:
            untested.add(module.removeprefix("neuron_port."))
    return problems, untested


def test_tests_mirror_the_package():
    problems, untested = layout_problems(ROOT / "tests", _modules())
    assert not problems, problems
    assert untested <= UNIT_TESTS_TO_WRITE, f"no unit tests in their layer's folder: {untested - UNIT_TESTS_TO_WRITE}"
    assert UNIT_TESTS_TO_WRITE <= untested, f"unit-tested now, strike from UNIT_TESTS_TO_WRITE: {UNIT_TESTS_TO_WRITE - untested}"


def test_the_mirror_check_catches_a_misplaced_test_and_an_untested_module(tmp_path):
    tests = tmp_path / "tests"
    for name in [name for name, _ in LAYERS] + list(TEST_FOLDERS_BEYOND_LAYERS):
        (tests / name).mkdir(parents=True)
    (tests / "graph" / "test_kv.py").write_text("from neuron_port.graph.kv import KVStore\n")
    assert layout_problems(tests, {"neuron_port.graph.kv": Path("kv.py")}) == ([], set())
    (tests / "test_stray.py").write_text("")
    (tests / "misc").mkdir()
    problems, untested = layout_problems(tests, {"neuron_port.graph.kv": Path("kv.py"),
                                                       "neuron_port.graph.masks": Path("masks.py")})
    assert problems == ["tests/test_stray.py sits at the top level: move it into its layer's folder or integration/",
                        f"tests/misc/ is not a layer of the package nor one of {sorted(TEST_FOLDERS_BEYOND_LAYERS)}"]
    assert untested == {"graph.masks"}
