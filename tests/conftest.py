import os
import re
import subprocess
import sys
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
torch.set_num_threads(min(2, os.cpu_count() or 1))

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
SMOKE = yaml.safe_load((REPO / "config" / "smoke.yaml").read_text())


def smk(workdir: Path, *args: str, config: dict | None = None, check: bool = True) -> subprocess.CompletedProcess:
    """The real Snakemake CLI on this workflow in the working folder `workdir` with `config`
    (default: the smoke config) written there; raises with its output when it fails and `check`."""
    workdir.mkdir(parents=True, exist_ok=True)
    cfg_path = workdir / "config.yaml"
    cfg_path.write_text(yaml.safe_dump(config if config is not None else SMOKE))
    cmd = SNAKEMAKE + [
        "--snakefile",
        str(REPO / "Snakefile"),
        "--directory",
        str(workdir),
        "--configfile",
        str(cfg_path),
        *SMOKE_RUN,
        *args,
    ]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise AssertionError(f"snakemake failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    return proc


@pytest.fixture(scope="session")
def smoke(tmp_path_factory):
    """A finished run of config/smoke.yaml, shared by the workflow and DVC tests, which copy it
    before changing anything."""
    workdir = tmp_path_factory.mktemp("smoke")
    smk(workdir)
    return workdir
