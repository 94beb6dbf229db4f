"""What produced a result: code version, config hash, git commit, machine."""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import platform
import subprocess
from pathlib import Path

import gna

PACKAGE_DIR = Path(gna.__file__).parent


@functools.cache  # the workflow fingerprints ~36 scripts whose closures share most modules: parse each once
def _code(source: str) -> ast.Module:
    """The syntax tree of `source` without its docstrings (not to be changed by callers)."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            value = first.value if isinstance(first, ast.Expr) else None
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                node.body = node.body[1:] or [ast.Pass()]
    return tree


@functools.cache
def _imported_names(source: str, package: str = "") -> frozenset[str]:
    """Every dotted module name an `import` / `from ... import` statement of `source` names
    (also imports inside functions), with each imported name as a possible submodule.
    Relative imports are resolved against `package`, the dotted package the source lives in."""
    names = set()
    for node in ast.walk(_code(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if package else ""
                module = ".".join(filter(None, (base, module)))
            if module:
                names.add(module)
                names.update(f"{module}.{alias.name}" for alias in node.names)
    return frozenset(names)


@functools.cache  # asked ~20k times per workflow parse, for a few hundred names
def _module_file(name: str, package_dir: Path) -> Path | None:
    """The source file of module `name` ('gna.x.y') inside `package_dir`, if it is one of ours."""
    parts = name.split(".")
    if parts[0] != "gna":
        return None
    base = package_dir.joinpath(*parts[1:])
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def import_closure(script: str | Path, package_dir: Path = PACKAGE_DIR) -> list[Path]:
    """The gna modules `script` imports, directly or through other gna modules (sorted).
    A package's __init__ counts for each of its submodules, as Python runs it first."""
    package_dir = Path(package_dir)
    seen: set[Path] = set()
    todo = [Path(script)]
    while todo:
        path = todo.pop()
        # the package a module lives in, for its relative imports (a script has none)
        package = ".".join(("gna", *path.relative_to(package_dir).parent.parts)) if path in seen else ""
        for name in _imported_names(path.read_text(), package):
            parts = name.split(".")
            for depth in range(1, len(parts) + 1):  # gna, gna.engine, gna.engine.stack
                found = _module_file(".".join(parts[:depth]), package_dir)
                if found is not None and found not in seen:
                    seen.add(found)
                    todo.append(found)
    return sorted(seen)


@functools.cache
def code_tree(source: str) -> str:
    """What Python runs of `source`: its syntax tree without comments and docstrings, so that
    editing either changes no fingerprint (and reruns nothing)."""
    return ast.dump(_code(source))


def script_fingerprint(script: str | Path, package_dir: Path = PACKAGE_DIR) -> str:
    """Short hash of a workflow script and of the code (`code_tree`) of every gna module in its
    import closure.

    Snakemake reruns a rule when its script changes but does not see the library code the
    script imports; rules pass this as a param, so that a change to the code of any module a
    rule runs reruns exactly that rule and its dependents. Computed, never listed by hand."""
    package_dir = Path(package_dir)
    digest = hashlib.sha256(gna.__version__.encode())
    digest.update(Path(script).read_bytes())
    for module in import_closure(script, package_dir):
        digest.update(str(module.relative_to(package_dir)).encode())
        digest.update(code_tree(module.read_text()).encode())
    return digest.hexdigest()[:12]


# the workflow's code, relative to its folder: what decides every result besides the config
WORKFLOW_CODE = ("Snakefile", "rules", "workflow_scripts", "config/schema.yaml")


def workflow_code_hash(workflow_dir: str | Path, package_dir: Path = PACKAGE_DIR) -> str:
    """Short hash of the workflow's code (WORKFLOW_CODE under `workflow_dir`, and every file of
    the gna package): equal for equal code whatever the commit, checkout folder or machine."""
    files = []
    for name in WORKFLOW_CODE:
        path = Path(workflow_dir) / name
        files += (
            [
                (f"{name}/{f.relative_to(path).as_posix()}", f)
                for f in sorted(path.rglob("*"))
                if f.is_file() and "__pycache__" not in f.parts
            ]
            if path.is_dir()
            else [(name, path)]
        )
    files += [(f"gna/{f.relative_to(package_dir).as_posix()}", f) for f in sorted(Path(package_dir).rglob("*.py"))]
    digest = hashlib.sha256()
    for name, path in files:
        digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


def config_hash(config: dict) -> str:
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:12]


def git_commit(folder: str | Path) -> str:
    try:
        commit = subprocess.run(
            ["git", "-C", str(folder), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(folder), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        return commit + ("-dirty" if dirty else "")
    except (subprocess.CalledProcessError, FileNotFoundError):
        return "unknown"


def cpu_name(cpuinfo: str | None = None) -> str:
    """The CPU's model name and family ('AMD Ryzen 9 9950X, family 26'; the family tells CPU
    generations apart where timings are compared), from /proc/cpuinfo where there is one."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return platform.processor() or "unknown"
    fields = dict(line.split(":", 1) for line in cpuinfo.splitlines()[:40] if ":" in line)
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    name = fields.get("model name", platform.processor() or "unknown")
    return f"{name}, family {fields['cpu family']}" if "cpu family" in fields else name


def cpu_kernels(cpuinfo: str | None = None) -> str:
    """The widest matmul instructions the CPU offers, which decide a run's speed and its bf16
    rounding: 'AMX', 'AVX-512 + BF16', 'AVX-512', 'AVX2' or 'unknown' (no /proc/cpuinfo)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return "unknown"
    line = next((line for line in cpuinfo.splitlines() if line.startswith("flags")), "")
    flags = set(line.split(":", 1)[-1].split())
    for flag, name in (("amx_bf16", "AMX"), ("avx512_bf16", "AVX-512 + BF16"), ("avx512f", "AVX-512")):
        if flag in flags:
            return name
    return "AVX2" if "avx2" in flags else "unknown"


def machine() -> dict:
    import torch

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "platform": platform.platform(),
        "cpu": cpu_name(),
        "kernels": cpu_kernels(),
        "cpu_count": __import__("os").cpu_count(),
        "cuda": torch.cuda.is_available(),
    }
