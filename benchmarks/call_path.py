"""Where one command goes through the library, and how much of it re-reads what it knew: this checkout against a
git revision, in one run.

For each tree (this checkout, and ``--rev REV`` exported from git), a fresh interpreter runs the ``neuron-port``
command given after ``--`` with that tree first on its path, under a profiler that sees every Python call into
``neuron_port``: the modules it enters, the calls it makes, and the calls that go back up a layer (a module of a
lower layer calling into a higher one: DESIGN's layers, base at the bottom, serve and cli at the top). Beside the
path, read from each tree's source: the call sites of ``family_for``, ``family_of``, ``describe`` and
``load_config`` (what a command re-derives), and the largest module and class.

    neuron-port compile gemma-4-e2b --tiny --out /tmp/e2b
    python benchmarks/call_path.py --rev b62c4b7 -- generate /tmp/e2b --prompt-len 8 --max-new-tokens 4 --json

Prints JSON: ``trees`` (one object per tree: ``modules_entered``, ``calls``, ``calls_up_a_layer``, ``up_pairs``,
``call_sites``, ``largest_module``, ``largest_class``) and ``ratio`` (the revision's figure over this checkout's,
per figure, when a revision is given).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import threading
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYERS = {"errors": 0, "versions": 0, "progress": 0, "families": 1, "model": 2, "parallel": 3, "graph": 4, "backends": 5,
          "artifacts": 6, "generation": 7, "checks": 8}
"""Each layer package's height (DESIGN.md's table); anything else under neuron_port (serve, cli, the planner,
the top-level API) is the top."""
TOP = 9
RE_DERIVED = ("family_for", "family_of", "describe", "load_config")


def layer_of(module: str) -> int | None:
    """The layer height of a ``neuron_port`` module (None for any other module)."""
    parts = module.split(".")
    if parts[0] != "neuron_port":
        return None
    return LAYERS.get(parts[1], TOP) if len(parts) > 1 else TOP


def trace_command(argv: list[str]) -> dict:
    """Run ``neuron-port ARGV`` in this process under a profiler; what it entered and called."""
    from neuron_port.cli.command import main

    entered: Counter[str] = Counter()
    up: Counter[str] = Counter()
    calls = 0

    def profile(frame, event, arg):
        nonlocal calls
        if event != "call":
            return
        callee = frame.f_globals.get("__name__", "")
        height = layer_of(callee)
        if height is None:
            return
        calls += 1
        entered[callee] += 1
        caller = frame.f_back.f_globals.get("__name__", "") if frame.f_back is not None else ""
        below = layer_of(caller)
        if below is not None and height > below:
            up[f"{caller} -> {callee}"] += 1

    threading.setprofile(profile)
    sys.setprofile(profile)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            code = main(argv)
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    import neuron_port

    return {"exit_code": code, "library": str(Path(neuron_port.__file__).parent), "modules_entered": len(entered),
            "calls": calls, "calls_up_a_layer": sum(up.values()), "up_pairs": dict(up.most_common(12))}


def source_facts(tree: Path) -> dict:
    """Call sites of what a command re-derives, and the largest module and class, read from ``tree``'s source."""
    sites = Counter()
    largest_module, largest_class = ("", 0), ("", 0)
    for path in sorted((tree / "neuron_port").rglob("*.py")):
        text = path.read_text()
        name = str(path.relative_to(tree))
        for function in RE_DERIVED:
            sites[function] += len(re.findall(rf"\b{function}\(", text)) - len(re.findall(rf"def {function}\(", text))
        lines = len(text.splitlines())
        if lines > largest_module[1]:
            largest_module = (name, lines)
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > largest_class[1]:
                largest_class = (f"{name}:{node.name}", node.end_lineno - node.lineno + 1)
    return {"call_sites": dict(sites), "largest_module": {"file": largest_module[0], "lines": largest_module[1]},
            "largest_class": {"class": largest_class[0], "lines": largest_class[1]}}


def run_tree(tree: Path, label: str, argv: list[str]) -> dict:
    """:func:`trace_command` in a fresh interpreter with ``tree`` first on the path, and ``tree``'s source facts."""
    with tempfile.TemporaryDirectory(prefix="call_path_") as tmp:
        out = Path(tmp) / "trace.json"
        env = {**os.environ, "PYTHONPATH": str(tree)}
        proc = subprocess.run([sys.executable, __file__, "--child", str(out), "--", *argv], env=env, cwd=tmp,
                              capture_output=True, text=True, timeout=900)
        if proc.returncode != 0 or not out.exists():
            raise SystemExit(f"{label}: the traced command failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
        traced = json.loads(out.read_text())
    if traced["exit_code"] != 0:
        raise SystemExit(f"{label}: neuron-port {' '.join(argv)} exited {traced['exit_code']} (an artifact of a newer "
                         "format than that tree reads? compile it with that tree); no path to compare")
    if Path(traced["library"]).resolve() != (tree / "neuron_port").resolve():
        raise SystemExit(f"{label}: the child imported neuron_port from {traced['library']}, not {tree}")
    return {"tree": label, **traced, **source_facts(tree)}


def export_rev(rev: str, into: Path) -> Path:
    """The files of git revision ``rev`` of this checkout, written under ``into``."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rev", default=None, help="a git revision to measure beside this checkout (e.g. a commit)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- then a neuron-port command line")
    args = ap.parse_args()
    argv = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not argv:
        ap.error("give the neuron-port command after --, e.g. -- generate DIR --prompt-len 8 --json")
    if args.child:
        Path(args.child).write_text(json.dumps(trace_command(argv)))
        return 0
    trees = [run_tree(ROOT, "this checkout", argv)]
    with tempfile.TemporaryDirectory(prefix="call_path_rev_") as tmp:
        if args.rev:
            trees.append(run_tree(export_rev(args.rev, Path(tmp)), args.rev, argv))
    result = {"command": ["neuron-port", *argv], "trees": trees}
    if args.rev:
        now, then = trees
        figures = ["modules_entered", "calls", "calls_up_a_layer"]
        result["ratio"] = {f: round(then[f] / now[f], 3) if now[f] else None for f in figures}
        result["ratio"].update({f"{f}_sites": round(then["call_sites"][f] / now["call_sites"][f], 3)
                                for f in RE_DERIVED if now["call_sites"][f]})
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
