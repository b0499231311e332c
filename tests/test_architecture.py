"""The layering of docs/ARCHITECTURE.md, checked on the source: imports are read with ``ast``
(nothing is imported), so a violation fails here before it can hide behind a lazy import.

Every ``import`` counts, at the top of a module or inside a function, except those under
``if TYPE_CHECKING:`` (annotations only).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("dapo", "analysis")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _imported(path: Path, *, at_import: bool = False) -> set[str]:
    """Absolute names of the modules ``path`` imports (``from a import b``: ``a`` and ``a.b``).

    ``at_import``: only the imports run when the module is imported (not those inside functions).
    """
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if at_import and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(base + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            out.add(base)
            out.update(f"{base}.{alias.name}" for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)))
    return out


FILES = {_module_name(p): p for pkg in PACKAGES for p in sorted((REPO / pkg).rglob("*.py"))}
GRAPH = {name: {m for m in _imported(path) if m in FILES and m != name} for name, path in FILES.items()}
"""Module → the modules of dapo/ and analysis/ it imports."""


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a path ``[a, b, ..., a]``, or None (depth-first search)."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def dfs(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = dfs(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = dfs(node)
            if found:
                return found
    return None


def _all_imports(module: str) -> set[str]:
    return _imported(FILES[module])


def test_the_checker_sees_cycles_and_lazy_imports():
    """The checks below can fail: a two-module cycle is found, and an import inside a function counts."""
    assert _cycle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert "dapo.models" in GRAPH["dapo.base_model"]          # base_model imports models inside functions


def test_no_import_cycle():
    assert _cycle(GRAPH) is None, " -> ".join(_cycle(GRAPH))


def test_vllm_only_in_the_vllm_engine():
    users = sorted(m for m in GRAPH if any(i == "vllm" or i.startswith("vllm.") for i in _all_imports(m)))
    assert users == ["dapo.engines.vllm_engine"], users


def test_minitask_imports_nothing_from_dapo():
    assert not {i for i in _all_imports("dapo.data.minitask") if i.split(".")[0] == "dapo"}


def test_runs_is_a_leaf_of_analysis():
    assert not {i for i in _all_imports("analysis.runs") if i.startswith("analysis.")}


@pytest.mark.parametrize("module", ["dapo.sweep.cluster", "dapo.sweep.spec", "dapo.yaml_checks", "dapo.yaml_io", "dapo.config", "dapo.sweep.plan",
                                    "dapo.preflight", "dapo.commands.runs", "dapo.logs",
                                    "dapo.data.prompts", "dapo.data.readers", "dapo.data.datasets", "dapo.data.sampler", "dapo.data.minitask",
                                    "dapo.eval_records", "dapo.algo.eval_metrics"])
def test_pure_modules_import_neither_torch_nor_submitit(module):
    """Not in the module itself (anywhere), nor at import time through what it imports from dapo."""
    heavy = {"torch", "submitit", "transformers", "vllm"}
    assert not {i.split(".")[0] for i in _all_imports(module)} & heavy
    seen, todo = set(), [module]
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        at_import = _imported(FILES[m], at_import=True)
        found = heavy & {i.split(".")[0] for i in at_import}
        assert not found, f"{module} imports {m}, which imports {sorted(found)} when imported"
        todo += sorted(i for i in at_import if i in FILES)


def test_analysis_reads_no_training_code():
    """analysis/ may use dapo's pure config layer (config, sweep specs) and the eval-record readers, never the training side."""
    allowed = {"dapo.config", "dapo.yaml_io", "dapo.sweep.spec", "dapo.yaml_checks", "dapo.eval_records", "dapo.store_checks",
               "dapo.algo.eval_metrics", "dapo.declaration"}
    for m in GRAPH:
        if m.startswith("analysis"):
            used = {i for i in GRAPH[m] if i.startswith("dapo")}
            assert used <= allowed, f"{m} imports {sorted(used - allowed)}"
