"""Which way the package's modules may import: each layer only from itself and the layers below.

    core → engine → models → tasks → students → phases → report → workflow

A rule's code fingerprint covers what its script imports (gna.core.provenance), so an import that
runs upward makes a low-level edit rerun steps that never run the changed code; a circle between
files does the same for both. Imports inside functions count: they run as well.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

LAYERS = ("core", "engine", "models", "tasks", "students", "phases", "report", "workflow")


@dataclass(frozen=True)
class Import:
    module: str  # the importing module, dotted (gna.core.io)
    imported: str  # the imported module or package, dotted
    line: int


def _module_name(path: Path, package_dir: Path) -> str:
    parts = (package_dir.name, *path.relative_to(package_dir).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(package_dir: str | Path) -> list[Import]:
    """Every import of the package by its own modules (relative imports resolved), in file order."""
    package_dir = Path(package_dir)
    found = []
    for path in sorted(package_dir.rglob("*.py")):
        module = _module_name(path, package_dir)
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, *([base] if base else [])])
                # `from gna.engine import ssm_kernel` imports the module gna.engine.ssm_kernel
                names = [f"{base}.{a.name}" for a in node.names if _is_module(package_dir, f"{base}.{a.name}")]
                targets = names or [base]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            found += [
                Import(module, t, node.lineno) for t in targets if t.split(".")[0] == package_dir.name and t != module
            ]
    return found


def _is_module(package_dir: Path, dotted: str) -> bool:
    rel = Path(*dotted.split(".")[1:])
    return (package_dir / rel).with_suffix(".py").is_file() or (package_dir / rel / "__init__.py").is_file()


def layer_of(dotted: str) -> int | None:
    """The index in LAYERS of a module's layer; None for the package root."""
    parts = dotted.split(".")
    return LAYERS.index(parts[1]) if len(parts) > 1 and parts[1] in LAYERS else None


def upward_imports(package_dir: str | Path) -> list[str]:
    """One message per import from a higher layer (file and line, both layers); a module outside
    LAYERS (other than the package root) is reported too, so that a new layer gets a place."""
    problems = []
    for imp in imports(package_dir):
        here, there = layer_of(imp.module), layer_of(imp.imported)
        for name, layer in ((imp.module, here), (imp.imported, there)):
            if layer is None and "." in name:
                problems.append(f"{name}: not in a layer of gna.workflow.layers.LAYERS ({', '.join(LAYERS)})")
        if here is not None and there is not None and there > here:
            problems.append(
                f"{imp.module} (line {imp.line}) imports {imp.imported}: layer {LAYERS[there]} is above "
                f"{LAYERS[here]} ({' → '.join(LAYERS)})"
            )
    return list(dict.fromkeys(problems))


def import_cycles(package_dir: str | Path) -> list[list[str]]:
    """Groups of modules that import each other in a circle (strongly connected, two or more
    modules; each sorted)."""
    graph: dict[str, set[str]] = {}
    for imp in imports(package_dir):
        graph.setdefault(imp.module, set()).add(imp.imported)
        graph.setdefault(imp.imported, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups = []

    def connect(node: str) -> None:  # Tarjan's algorithm
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return sorted(groups)
