"""The layering the architecture promises, checked from the source: no import cycles inside engine/,
audio/ or service/, and no upward imports (engine/ or audio/ → service/, litestar or granian; engine/ →
audio/; service/ → mlx). Imports inside functions and under `if TYPE_CHECKING:` count too: a cycle that
only the type checker sees still ties two modules' concepts together."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("engine", "audio", "service")

# package → top-level modules it must never import.
FORBIDDEN = {
    "engine": ("service", "audio", "litestar", "granian"),
    "audio": ("service", "litestar", "granian"),
    "service": ("mlx", "mlx_lm", "mlx_whisper"),
}


@dataclass(frozen=True)
class Import:
    target: str
    line: int
    type_only: bool


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports_of(source: str, module: str, known: set[str]) -> list[Import]:
    """Every import in `source` (module `module`), resolved to the deepest known module it names."""
    found: list[Import] = []
    package = module if f"{module}.__init__" in known else module.rsplit(".", 1)[0]

    def visit(node: ast.AST, type_only: bool) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                visit(child, True)
            for child in node.orelse:
                visit(child, type_only)
            return
        if isinstance(node, ast.Import):
            found.extend(Import(alias.name, node.lineno, type_only) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                found.append(Import(candidate if candidate in known else base, node.lineno, type_only))
        for child in ast.iter_child_nodes(node):
            visit(child, type_only)

    visit(ast.parse(source), False)
    return found


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle in `graph` (module → modules it imports), as a path that ends where it starts."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)) is not None:
                return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start)) is not None:
            return cycle
    return None


def _graph() -> tuple[dict[str, set[str]], dict[str, list[Import]]]:
    modules = _modules()
    known = set(modules) | {f"{m}.__init__" for m, p in modules.items() if p.name == "__init__.py"}
    all_imports = {m: imports_of(p.read_text(), m, known) for m, p in modules.items()}
    graph = {m: {i.target for i in imps if i.target in modules and i.target != m}
             for m, imps in all_imports.items()}
    return graph, all_imports


def test_the_checker_finds_a_cycle_and_resolves_imports() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
    source = "from x import y\nimport z\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import w\n"
    got = imports_of(source, "x.m", {"x.y", "x.m"})
    assert [(i.target, i.type_only) for i in got] == [("x.y", False), ("z", False), ("typing", False), ("w", True)]


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycle(package: str) -> None:
    graph, _ = _graph()
    inside = {m: {t for t in targets if t.split(".")[0] == package} for m, targets in graph.items()
              if m.split(".")[0] == package}
    assert find_cycle(inside) is None, f"import cycle: {' -> '.join(find_cycle(inside) or [])}"


def test_no_import_cycle_across_packages() -> None:
    graph, _ = _graph()
    assert find_cycle(graph) is None, f"import cycle: {' -> '.join(find_cycle(graph) or [])}"


@pytest.mark.parametrize("package", PACKAGES)
def test_no_upward_import(package: str) -> None:
    _, all_imports = _graph()
    bad = [f"{m}:{i.line} imports {i.target}" for m, imps in all_imports.items() if m.split(".")[0] == package
           for i in imps if i.target.split(".")[0] in FORBIDDEN[package]]
    assert bad == []


@pytest.mark.parametrize("package", PACKAGES)
def test_every_module_declares_its_public_names(package: str) -> None:
    missing = [name for name, path in _modules().items() if name.split(".")[0] == package
               and not any(isinstance(node, (ast.Assign, ast.AnnAssign)) and "__all__" in ast.unparse(node).split("=")[0]
                           for node in ast.parse(path.read_text()).body)]
    assert missing == []
