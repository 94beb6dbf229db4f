"""What produced a result: code version, config hash, git commit, machine."""

from __future__ import annotations

import hashlib
import json
import platform
import subprocess
from pathlib import Path

import gna

PACKAGE_DIR = Path(gna.__file__).parent


def code_version(*modules: str) -> str:
    """Short hash of the named modules of src/gna (e.g. 'scoring'), plus the package version.

    Snakemake does not see code imported by scripts; rules pass this as a param so that a change
    to the modules a rule uses reruns exactly that rule and its dependents.
    """
    digest = hashlib.sha256(gna.__version__.encode())
    for name in sorted(set(modules)):
        digest.update(name.encode())
        digest.update((PACKAGE_DIR / f"{name}.py").read_bytes())
    return digest.hexdigest()[:12]


def config_hash(config: dict) -> str:
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:12]


def git_commit(folder: str | Path) -> str:
    try:
        commit = subprocess.run(["git", "-C", str(folder), "rev-parse", "HEAD"], capture_output=True,
                                text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(folder), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip()
        return commit + ("-dirty" if dirty else "")
    except (subprocess.CalledProcessError, FileNotFoundError):
        return "unknown"


def machine() -> dict:
    import torch

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "platform": platform.platform(),
        "cpu_count": __import__("os").cpu_count(),
        "cuda": torch.cuda.is_available(),
    }
