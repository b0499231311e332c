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


PURE = ["dapo.config", "dapo.yaml_io", "dapo.yaml_checks", "dapo.logs", "dapo.eval_records", "dapo.preflight",
        "dapo.sweep.cluster", "dapo.sweep.spec", "dapo.sweep.plan", "dapo.commands.runs",
        "dapo.data.prompts", "dapo.data.readers", "dapo.data.datasets", "dapo.data.sampler", "dapo.data.minitask",
        "dapo.algo.eval_metrics"]


def _with_parents(module: str) -> list[str]:
    """``a.b.c`` -> ``[a.b.c, a.b, a]``: importing a module runs its packages' ``__init__`` first."""
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(len(parts), 0, -1) if ".".join(parts[:i]) in FILES]


@pytest.mark.parametrize("module", PURE)
def test_pure_modules_import_neither_torch_nor_submitit(module):
    """Not in the module itself (anywhere), nor at import time through what it imports from dapo."""
    heavy = {"torch", "submitit", "transformers", "vllm"}
    assert not {i.split(".")[0] for i in _all_imports(module)} & heavy
    seen, todo = set(), _with_parents(module)
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        at_import = _imported(FILES[m], at_import=True)
        found = heavy & {i.split(".")[0] for i in at_import}
        assert not found, f"{module} imports {m}, which imports {sorted(found)} when imported"
        todo += sorted(p for i in at_import if i in FILES for p in _with_parents(i))


def test_analysis_reads_no_training_code():
    """analysis/ may use dapo's pure config layer (config, sweep specs) and the eval-record readers, never the training side."""
    allowed = {"dapo.config", "dapo.yaml_io", "dapo.sweep.spec", "dapo.yaml_checks", "dapo.eval_records", "dapo.store_checks",
               "dapo.algo.eval_metrics", "dapo.sweep.declaration"}
    for m in GRAPH:
        if m.startswith("analysis"):
            used = {i for i in GRAPH[m] if i.startswith("dapo")}
            assert used <= allowed, f"{m} imports {sorted(used - allowed)}"


# --------------------------------------------------------------------------- the layers of docs/ARCHITECTURE.md
LAYERS = [
    # 0 foundation: configs, files, logs; no torch at import
    {"dapo", "dapo.config", "dapo.yaml_io", "dapo.yaml_checks", "dapo.helptext", "dapo.hardware", "dapo.file_lock",
     "dapo.faults", "dapo.logs", "dapo.eval_records", "dapo.store_checks", "dapo.run_dir"},
    {"dapo.algo", "dapo.data", "dapo.tracking", "dapo.models"},      # 1 the math, the data, MLflow, model files
    {"dapo.base_model", "dapo.dist"},                                 # 2 the tiny base model; process groups, FSDP2
    {"dapo.engines"},                                                 # 3 rollout engines (vLLM in one module)
    {"dapo.preflight", "dapo.train"},                                 # 4 input checks; one training run
    {"dapo.sweep"},                                                   # 5 specs, cluster profiles, plans, jobs
    {"analysis"},                                                     # 6 runs -> statistics, figures, reports
    {"dapo.cli", "dapo.commands"},                                    # 7 the `dapo` command and its subcommands
]
"""Each unit (a package, or a top-level module of dapo/) may import its own layer and those below."""


def _unit(module: str) -> str:
    """The package or top-level module a module belongs to: dapo.train.loop -> dapo.train; analysis.x -> analysis."""
    parts = module.split(".")
    if parts[0] == "analysis":
        return "analysis"
    return ".".join(parts[:2])


def _layer(unit: str) -> int:
    return next(i for i, layer in enumerate(LAYERS) if unit in layer)


def _upward(graph: dict[str, set[str]]) -> list[str]:
    """Imports from a lower layer into a higher one: 'a (layer i) imports b (layer j > i)'. ``__main__``
    modules are entry points (``python -m dapo.train``) and sit above every layer."""
    return [f"{m} (layer {_layer(_unit(m))}) imports {d} (layer {_layer(_unit(d))})"
            for m in sorted(graph) if not m.endswith(".__main__")
            for d in sorted(graph[m]) if _layer(_unit(d)) > _layer(_unit(m))]


def test_every_module_has_a_layer():
    units = {_unit(m) for m in FILES}
    assert not units - set().union(*LAYERS), f"add to LAYERS (and docs/ARCHITECTURE.md): {sorted(units - set().union(*LAYERS))}"


def test_the_packages_are_layered():
    assert not _upward(GRAPH), "\n".join(_upward(GRAPH))


def test_the_layering_check_can_fail():
    """An import of the training loop from the math, or of a command from a sweep module, is reported."""
    assert _upward({"dapo.algo.losses": {"dapo.train.loop"}}) == [
        "dapo.algo.losses (layer 1) imports dapo.train.loop (layer 4)"]
    assert _upward({"dapo.sweep.launcher": {"dapo.commands.sweep"}, "dapo.sweep.__main__": {"dapo.commands.sweep"}}) == [
        "dapo.sweep.launcher (layer 5) imports dapo.commands.sweep (layer 7)"]


MAX_LINES = 450


def _long_modules_allowed() -> set[str]:
    """The modules docs/ARCHITECTURE.md lists under "Longer than 450 lines" (each with its reason)."""
    text = (REPO / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    section = text.split("## Longer than 450 lines", 1)[1].split("\n## ", 1)[0]
    return {line.split("`")[1] for line in section.splitlines() if line.startswith("- `")}


def test_no_module_is_over_450_lines_but_those_the_architecture_map_names():
    long = {str(p.relative_to(REPO)) for p in FILES.values() if len(p.read_text(encoding="utf-8").splitlines()) > MAX_LINES}
    allowed = _long_modules_allowed()
    assert long <= allowed, f"over {MAX_LINES} lines, not in docs/ARCHITECTURE.md: {sorted(long - allowed)}"
    assert not allowed - long, f"docs/ARCHITECTURE.md lists modules no longer over {MAX_LINES} lines: {sorted(allowed - long)}"
