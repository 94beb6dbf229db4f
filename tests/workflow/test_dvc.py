"""Real DVC round trip on the smoke config: repro → push → fresh clone → `make pull` → Snakemake
has nothing to do, and a later config edit still reruns exactly what it affects."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, planned_jobs

pytestmark = pytest.mark.workflow
BIN = Path(sys.executable).parent


def run(cmd, cwd, **kw):
    env = dict(os.environ, PATH=f"{BIN}:{os.environ['PATH']}", GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t",
               GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t")
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=env, shell=isinstance(cmd, str), **kw)
    assert proc.returncode == 0, f"{cmd} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout + proc.stderr


def test_dvc_push_clone_pull_then_nothing_to_do(tmp_path):
    origin, clone, remote = tmp_path / "origin", tmp_path / "clone", tmp_path / "remote"
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    for name in files:
        if name in ("dvc.lock",) or not (REPO / name).exists():
            continue
        (origin / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, origin / name)
    # the sandbox's default config is the smoke config, so `dvc repro` runs the tiny DAG
    shutil.copy(origin / "config" / "smoke.yaml", origin / "config" / "config.yaml")
    run(["git", "init", "-q"], origin)
    run(["dvc", "remote", "add", "-f", "-d", "local", str(remote)], origin)
    run(["dvc", "repro"], origin)
    run(["git", "add", "-A"], origin)
    run(["git", "commit", "-qm", "smoke results"], origin)
    run(["dvc", "push"], origin)

    run(["git", "clone", "-q", str(origin), str(clone)], tmp_path)
    (clone / ".venv").symlink_to(BIN.parent)
    out = run(["make", "-o", ".venv/.installed-stamp", "pull"], clone)
    assert "Nothing to be done (all requested files are present and up to date)." in out
    assert (clone / "data" / "report" / "index.html").exists()
    assert planned_jobs(run([sys.executable, "-m", "snakemake", "-n"], clone)) == {}

    config = (clone / "config" / "config.yaml").read_text()
    (clone / "config" / "config.yaml").write_text(config.replace('title: "gna smoke run"', 'title: "edited"'))
    assert planned_jobs(run([sys.executable, "-m", "snakemake", "-n"], clone)) == {"report": 1, "all": 1}
