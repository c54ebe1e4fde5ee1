"""The import graph of `src/rlhfkit` follows the layering that README's Layout states."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "rlhfkit"


def stated_layers() -> list[set[str]]:
    """README's layer line: `a -> b, c -> d`, left to right."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Layout", 1)[1]
    line = next(x for x in section.splitlines() if x.startswith("ops ->"))
    return [{u.strip() for u in layer.split(",")} for layer in line.split("->")]


def unit_of(module: str) -> str:
    """`rlhfkit.models.lora` -> `models`; `rlhfkit.config` -> `config`."""
    return module.split(".")[1]


def imports(path: Path) -> set[str]:
    """Every rlhfkit module `path` imports, at any depth of the file (function bodies too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("rlhfkit"):
            if node.module == "rlhfkit":
                found |= {f"rlhfkit.{alias.name}" for alias in node.names}
            else:
                found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("rlhfkit.")}
    return found


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def graph() -> dict[str, set[str]]:
    return {module_name(p): imports(p) for p in PACKAGE.rglob("*.py")}


def test_every_unit_is_in_the_stated_layers():
    named = set().union(*stated_layers())
    units = {unit_of(m) for m in graph() if m != "rlhfkit"}
    assert units == named, f"README's Layout misses {units - named}, names {named - units}"


def test_each_unit_imports_only_from_layers_to_its_left():
    layers = stated_layers()
    rank = {unit: i for i, layer in enumerate(layers) for unit in layer}
    wrong = []
    for module, targets in graph().items():
        if module == "rlhfkit":
            continue
        me = unit_of(module)
        for target in targets:
            other = unit_of(target)
            if other != me and rank[other] >= rank[me]:
                wrong.append(f"{module} imports {target}")
    assert not wrong, "imports against README's Layout:\n" + "\n".join(sorted(wrong))


def test_no_import_cycle_between_modules():
    edges = {m: {t for t in ts if t != m} for m, ts in graph().items()}
    # A package's __init__ that re-exports its modules is not a cycle of concerns.
    edges = {m: {t for t in ts if not m.startswith(t + ".")} for m, ts in edges.items()}
    state: dict[str, int] = {}
    cycles = []

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in edges.get(module, ()):
            if state.get(target) == 1:
                cycles.append(" -> ".join([*path[path.index(target) :], target]))
            elif target in edges and target not in state:
                visit(target, [*path, target])
        state[module] = 2

    for module in sorted(edges):
        if module not in state:
            visit(module, [module])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_ops_is_math_only():
    for path in (PACKAGE / "ops").rglob("*.py"):
        external = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                external |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                external.add(node.module.split(".")[0])
        assert external <= {"torch", "rlhfkit", "__future__", "math", "typing", "collections"}, (
            path,
            external,
        )
        assert all(re.fullmatch(r"rlhfkit(\.ops.*)?", m) for m in imports(path) | {"rlhfkit"})


def test_no_function_is_longer_than_sixty_lines():
    long = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > 60:
                    long.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name} ({lines})")
    assert not long, "functions over 60 lines (split them along their steps):\n" + "\n".join(long)
