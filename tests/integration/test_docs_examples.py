"""The docs build offline with warnings as errors, every snippet in them runs, and the recipes print SEQ_MATCH True."""


import re
import shutil
import subprocess
import sys

import pytest

from tests.helpers import ROOT

DOCS = sorted((ROOT / "docs").glob("*.md"))
SNIPPETS = [(page, i, code) for page in DOCS
            for i, code in enumerate(re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S))]


def test_every_docs_page_has_a_runnable_snippet_or_is_the_reference():
    with_snippets = {page.name for page, _, _ in SNIPPETS}
    assert {p.name for p in DOCS} - with_snippets == {"api.md"}


@pytest.mark.parametrize("page,index,code", SNIPPETS, ids=[f"{p.name}#{i}" for p, i, _ in SNIPPETS])
def test_docs_snippet_runs(page, index, code, tmp_path, monkeypatch, capsys):
    """Each snippet runs as written, in a fresh namespace (its asserts are part of the check)."""
    monkeypatch.chdir(tmp_path)
    exec(compile(code, f"{page.name}#{index}", "exec"), {"__name__": "__snippet__"})
    assert capsys.readouterr().out  # every snippet shows something


def test_docs_build_offline_strict(tmp_path):
    mkdocs = shutil.which("mkdocs")
    if mkdocs is None:
        pytest.skip("mkdocs is not installed (the 'docs' extra)")
    proc = subprocess.run([mkdocs, "build", "--strict", "-d", str(tmp_path / "site")], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "site" / "api" / "index.html").read_text().count("plan_attention") > 0


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["gemma4_e2b.py", "gemma4_e4b.py", "gemma4_12b.py", "port_llama.py"])
def test_recipe_prints_seq_match(recipe, tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / recipe), "--out", str(tmp_path), "--max-new-tokens", "16"],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "SEQ_MATCH True" in proc.stdout
    assert (tmp_path / "artifact" / "manifest.json").exists()
    # a newcomer's first screen carries the library's lines only: no warning or notice that the
    # library's own calls into transformers and TorchScript provoke
    noise = [line for line in proc.stderr.splitlines() if "Warning" in line or "loss_type" in line]
    assert not noise, noise


def test_recipes_use_only_the_public_api_and_stay_short():
    for recipe in (ROOT / "examples").glob("*.py"):
        text = recipe.read_text()
        assert len(text.splitlines()) < 200, recipe.name
        assert not re.search(r"from neuron_port[.\w]* import [^\n]*\b_\w", text), f"{recipe.name} imports a private name"
        assert not re.search(r"\.\_[a-z]\w*\(", text), f"{recipe.name} calls a private helper"


def _names_the_docs_use() -> dict[str, set[str]]:
    """Module -> names imported from it in the docs, the README and the recipes (modules named in
    backticks count with no names)."""
    texts = [p.read_text() for p in [*DOCS, ROOT / "README.md", *sorted((ROOT / "examples").glob("*.py"))]]
    used: dict[str, set[str]] = {}
    for text in texts:
        for module, grouped, line in re.findall(r"from (neuron_port(?:\.\w+)*) import (?:\(([^)]*)\)|([^\n]*))", text):
            names = re.split(r"[,\s]+", (grouped or line).split("#")[0].strip())
            used.setdefault(module, set()).update(n for n in names if n and n != "as")
        for module in re.findall(r"`(neuron_port(?:\.\w+)+)", text):
            used.setdefault(module, set())
    return used


def test_api_reference_lists_every_module_and_name_the_docs_use():
    import importlib

    listed = set(re.findall(r"^::: (\S+)", (ROOT / "docs" / "api.md").read_text(), flags=re.M))
    problems = []
    for module, names in sorted(_names_the_docs_use().items()):
        try:
            mod = importlib.import_module(module)
        except ImportError:  # `neuron_port.module.attribute`
            module, _, attribute = module.rpartition(".")
            mod, names = importlib.import_module(module), names | {attribute}
        if module not in listed:
            problems.append(f"{module} is not in docs/api.md")
            continue
        public = set(getattr(mod, "__all__", ()))
        problems += [f"{module}.{name} is not in its __all__" for name in sorted(names) if name not in public]
    assert not problems, problems


def test_ci_runs_the_readmes_test_command_verbatim():
    readme = (ROOT / "README.md").read_text()
    block = readme[readme.index("Run the tests"):]
    command = block[block.index("```bash\n") + len("```bash\n"):block.index("\n```", block.index("```bash"))]
    assert len(command.splitlines()) == 1 and "python -m pytest" in command, command
    assert command in (ROOT / ".ci" / "run").read_text().splitlines()
