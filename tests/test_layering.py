"""Dependencies go one way: nat_kd uses fairseq_plugins, and the plugin works without nat_kd installed; inside the
generator (nat_kd.distill), no module imports one that imports it back."""
import ast
import subprocess
import sys
from pathlib import Path

from conftest import ROOT

# Every module of the plugin imported with nat_kd made unimportable; then what fairseq's --user-dir loads.
WITHOUT_NAT_KD = """
import importlib, pkgutil, sys

class BlockNatKd:
    def find_spec(self, name, path=None, target=None):
        if name == "nat_kd" or name.startswith("nat_kd."):
            raise ImportError("nat_kd is blocked in this test: " + name)
        return None

sys.meta_path.insert(0, BlockNatKd())
from argparse import Namespace
from fairseq import utils
utils.import_user_module(Namespace(user_dir="fairseq_plugins"))  # as fairseq-train --user-dir does
import fairseq_plugins
modules = [m.name for m in pkgutil.walk_packages(fairseq_plugins.__path__, "fairseq_plugins.")]
for name in modules:
    importlib.import_module(name)
from fairseq.criterions import CRITERION_REGISTRY
from fairseq.models import ARCH_MODEL_REGISTRY
assert {"word_kd", "nat_word_kd"} <= set(CRITERION_REGISTRY), sorted(CRITERION_REGISTRY)
assert {"kd_transformer_tiny", "kd_cmlm_tiny"} <= set(ARCH_MODEL_REGISTRY)
assert not [m for m in sys.modules if m == "nat_kd" or m.startswith("nat_kd.")]
print(len(modules), "modules")
"""


def test_fairseq_plugins_import_without_nat_kd():
    proc = subprocess.run([sys.executable, "-c", WITHOUT_NAT_KD], cwd=ROOT, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "criterions.word_kd" not in proc.stdout  # no import error named a module
    count = int(proc.stdout.strip().splitlines()[-1].split()[0])
    assert count >= 10  # the walk saw the whole plugin: criterions, models, teacher, counting, ...


def test_the_blocker_blocks():
    """The same blocker makes a nat_kd import fail, so the test above would see one."""
    code = WITHOUT_NAT_KD.split("from argparse")[0] + "import nat_kd.corpus\n"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True)
    assert proc.returncode != 0 and "nat_kd is blocked" in proc.stdout


def import_graph(package_dir: Path, package: str) -> dict[str, set[str]]:
    """Which of ``package``'s modules each of its modules imports: every import statement, at module level,
    inside functions or under TYPE_CHECKING alike. ``from . import name`` counts as importing the submodule
    ``name`` when there is one, else the package. A package's own __init__ is not counted as imported by its
    submodules (Python runs it first, but the submodule does not depend on what it holds)."""
    files = {}
    for file in package_dir.rglob("*.py"):
        parts = list(file.relative_to(package_dir).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        files[".".join([package, *parts])] = (file, is_package)
    graph = {}
    for module, (file, is_package) in files.items():
        here = module if is_package else module.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = here.rsplit(".", node.level - 1)[0] if node.level > 1 else here
                    base = f"{anchor}.{base}" if base else anchor
                names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in files else base for alias in node.names]
            else:
                continue
            for name in names:
                while name and name not in files:  # a name inside a module: the module
                    name = name.rpartition(".")[0]
                if name and name != module:
                    targets.add(name)
        graph[module] = targets
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph (its modules, the first repeated at the end), or None (depth-first search)."""
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        state[node] = "done"
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_generator_imports_one_way():
    """nat_kd.distill's modules import each other without a cycle: backends take plain settings, the loaded run
    loads what they are given, the chunk decoder drives a backend, the pool runs chunk decoders, the pipeline
    uses the pool."""
    graph = import_graph(ROOT / "nat_kd" / "distill", "nat_kd.distill")
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))
    d = "nat_kd.distill."
    assert {d + "pool", d + "loaded", d + "config"} <= graph[d + "pipeline"]
    assert {d + "loaded", d + "chunk_decoder"} <= graph[d + "pool"]
    assert d + "backends" in graph[d + "chunk_decoder"] and d + "backends" in graph[d + "loaded"]
    assert d + "backends.base" in graph[d + "backends.fairseq"]
    for backend in ("backends", "backends.base", "backends.fairseq", "backends.ctranslate2"):
        assert not any(m.startswith(tuple(d + name for name in ("loaded", "chunk_decoder", "pool", "pipeline")))
                       for m in graph[d + backend]), backend


def test_a_cycle_is_found(tmp_path):
    """A toy package whose modules import each other both ways, one of them inside a function and one under
    TYPE_CHECKING: the walk sees both."""
    toy = tmp_path / "toy"
    (toy / "sub").mkdir(parents=True)
    (toy / "__init__.py").write_text("")
    (toy / "sub" / "__init__.py").write_text("from .base import Thing\n")
    (toy / "sub" / "base.py").write_text("class Thing:\n    pass\n")
    (toy / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import f\n")
    (toy / "b.py").write_text("import os\nfrom .sub import Thing\n\ndef f():\n    from . import c\n")
    (toy / "c.py").write_text("from toy.a import *\n")
    graph = import_graph(toy, "toy")
    assert graph["toy.b"] == {"toy.sub", "toy.c"} and graph["toy.sub"] == {"toy.sub.base"}
    assert find_cycle(graph) == ["toy.a", "toy.b", "toy.c", "toy.a"]
    (toy / "c.py").write_text("import toy.sub.base\n")
    assert find_cycle(import_graph(toy, "toy")) is None
