"""The layout keeps reading top-down: no import cycles among sandcell's modules (imports
made at module level; those under TYPE_CHECKING and inside functions are deliberate late
bindings), and nothing on the host side imports the daemon's package."""

from __future__ import annotations

import ast
from pathlib import Path

import sandcell

SRC = Path(sandcell.__file__).parent.parent


def _modules() -> dict[str, Path]:
    found = {}
    for path in (SRC / "sandcell").rglob("*.py"):
        name = ".".join(path.relative_to(SRC).with_suffix("").parts)
        found[name.removesuffix(".__init__")] = path
    return found


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """The sandcell modules `path` imports when it is loaded."""
    found: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in modules)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            subs = {f"{node.module}.{a.name}" for a in node.names} & modules.keys()
            found |= subs
            if len(subs) < len(node.names) and node.module in modules:
                found.add(node.module)  # a name defined in the package itself
    return found


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while (w := stack.pop()) != v:
                component.append(w)
            if component:
                cycles.append(sorted([v, *component]))

    for v in graph:
        if v not in index:
            visit(v)
    return cycles


def test_no_import_cycles() -> None:
    modules = _modules()
    graph = {name: _imports(path, modules) - {name} for name, path in modules.items()}
    assert len(graph) > 100  # the walk found the package
    assert _cycles(graph) == []


def test_the_host_side_never_imports_the_daemon() -> None:
    modules = _modules()
    host_side = [n for n in modules if not n.startswith(("sandcell.daemon", "sandcell.cli"))]
    for name in host_side:
        daemon = {m for m in _imports(modules[name], modules) if m.startswith("sandcell.daemon")}
        assert not daemon, (name, daemon)
