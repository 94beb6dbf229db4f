import functools
import io
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch
import yaml
from golden import SMOKE_RUN

# Tests never reach a model hub: the hub code paths are exercised against local caches.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The suite runs on the CPU, also on a GPU node (its golden results and exact comparisons are CPU
# numbers); GNA_TEST_DEVICE=cuda runs it, Snakemake's jobs included, with models on the GPU.
os.environ["GNA_DEVICE"] = os.environ.get("GNA_TEST_DEVICE", "cpu")
# `make test` runs two pytest workers (pytest-xdist): one thread each, else they oversubscribe the cores
torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else min(2, os.cpu_count() or 1))

REPO = Path(__file__).resolve().parents[1]
MINI_MMLU = REPO / "tests" / "data" / "mini_mmlu.jsonl"


@pytest.fixture(scope="session")
def tiny_llama():
    from gna.models.tiny import tiny_random_model

    return tiny_random_model({"arch": "llama", "layers": 3, "hidden": 48, "heads": 4, "kv_heads": 2, "seed": 3})


def planned_jobs(text: str) -> dict[str, int]:
    """Parse the 'Job stats' table of a dry run into {rule: count}."""
    if "Nothing to be done" in text:
        return {}
    table = text.split("Job stats:")[1]
    jobs = {}
    for line in table.splitlines()[3:]:
        match = re.match(r"^(\w+)\s+(\d+)$", line.strip())
        if not match:
            break
        if match.group(1) != "total":
            jobs[match.group(1)] = int(match.group(2))
    return jobs


SNAKEMAKE = [sys.executable, "-m", "snakemake"]


@functools.cache
def _parse_workflow_code() -> None:
    """Parse the workflow scripts and the gna modules they import once, in the parent: the rules'
    code fingerprints (gna.core.provenance, whose parses are kept per source text, so an edited
    module is parsed again) then cost each forked dry run 0.1 s instead of 0.8."""
    from gna.core.provenance import script_fingerprint

    for script in sorted((REPO / "workflow_scripts").glob("*.py")):
        script_fingerprint(script)


def snakemake_cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """Snakemake's command line with `args` in `cwd`. A dry run (-n) runs in a fork of this
    process, which has torch and Snakemake imported already (1.2 s instead of 4.7 s on Zen 4): no
    job starts, so nothing else differs from a subprocess. Everything else runs as a subprocess."""
    if "-n" not in args:
        return subprocess.run(SNAKEMAKE + args, cwd=cwd, capture_output=True, text=True)
    import snakemake.cli  # in the parent: each fork starts with it

    _parse_workflow_code()
    with tempfile.TemporaryFile() as out:
        pid = os.fork()
        if pid == 0:  # the child: Snakemake's main, its output into `out`, then exit without cleanup
            code = 70
            try:
                os.chdir(cwd)
                os.dup2(out.fileno(), 1)
                os.dup2(out.fileno(), 2)
                sys.stdout = sys.stderr = io.TextIOWrapper(os.fdopen(1, "wb", closefd=False), write_through=True)
                try:
                    snakemake.cli.main(args)
                    code = 0
                except SystemExit as stop:
                    code = stop.code if isinstance(stop.code, int) else int(stop.code is not None)
            finally:
                os._exit(code)
        deadline = time.monotonic() + 600  # a dry run takes seconds; a hung fork must not hang the suite
        while (done := os.waitpid(pid, os.WNOHANG))[0] == 0:
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                raise AssertionError(f"snakemake {' '.join(args)} did not end within 600 s")
            time.sleep(0.02)
        status = done[1]
        out.seek(0)
        text = out.read().decode(errors="replace")
    return subprocess.CompletedProcess(SNAKEMAKE + args, os.waitstatus_to_exitcode(status), stdout=text, stderr="")


SMOKE = yaml.safe_load((REPO / "config" / "smoke.yaml").read_text())


def smk(workdir: Path, *args: str, config: dict | None = None, check: bool = True) -> subprocess.CompletedProcess:
    """The real Snakemake CLI on this workflow in the working folder `workdir` with `config`
    (default: the smoke config) written there; raises with its output when it fails and `check`."""
    workdir.mkdir(parents=True, exist_ok=True)
    cfg_path = workdir / "config.yaml"
    cfg_path.write_text(yaml.safe_dump(config if config is not None else SMOKE))
    cmd = ["--snakefile", str(REPO / "Snakefile"), "--directory", str(workdir), "--configfile", str(cfg_path)]
    proc = snakemake_cli([*cmd, *SMOKE_RUN, *args], cwd=REPO)
    if check and proc.returncode != 0:
        raise AssertionError(f"snakemake failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    return proc


# `make test` runs two pytest-xdist workers. The modules here share a costly fixture (session or
# module scope): each runs whole in one worker, so that it is built once. pytest-xdist's own
# xdist_group marker does not group under pytest 9 (it renames the node ids pytest 9 no longer reads).
SHARED = {
    "tests/workflow/test_workflow.py": "the smoke run",
    "tests/workflow/test_dvc.py": "the smoke run",
    "tests/workflow/test_slurm.py": "a local SLURM",
    "tests/workflow/test_dvc_ssh.py": "an sshd",
    "tests/workflow/test_real_model.py": "the real model",
    "tests/unit/report/test_report.py": "a report render",
}


def pytest_xdist_make_scheduler(config, log):
    """Load scheduling in which the tests of a SHARED module (the two that read the smoke run
    together) are one unit of work, sent to one worker; every other test goes on its own."""
    from xdist.scheduler import LoadScopeScheduling

    class SharedFixtureScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return SHARED.get(nodeid.split("::")[0], nodeid)

    return SharedFixtureScheduling(config, log)


def pytest_collection_modifyitems(items):
    """The smoke run's tests first, as the longest chain (about 6 minutes on 2 cores), then the
    other shared modules, then the rest, which spread over the workers meanwhile."""

    def order(item) -> int:
        shared = SHARED.get(item.nodeid.split("::")[0])
        return 0 if shared == "the smoke run" else 1 if shared else 2

    items.sort(key=order)


@pytest.fixture(scope="session")
def smoke(tmp_path_factory):
    """A finished run of config/smoke.yaml, shared by the workflow and DVC tests, which copy it
    before changing anything."""
    workdir = tmp_path_factory.mktemp("smoke")
    smk(workdir)
    return workdir
