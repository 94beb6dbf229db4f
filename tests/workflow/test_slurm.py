"""The SLURM profile on a real SLURM: a single-node cluster started on this machine by
tests/cluster/local_slurm.sh (munge, MariaDB + slurmdbd, slurmctld, slurmd), the smoke config's
baseline (its tiny model made locally first) submitted through `snakemake --profile profiles/slurm`
unchanged; every model-loading job
must have run as a SLURM job (sacct) and the results must match the golden smoke results as the
golden test matches them (bit for bit on their CPU kind, else within its tolerance). Needs root
and Debian packages (installed by the script when missing); skipped elsewhere, and with
GNA_SLURM_TESTS=0. Plus the paper config's dry run through the profile: resources that fit
an 8B model."""

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest
import yaml
from conftest import REPO, planned_jobs, smk, snakemake_cli
from golden import GOLDEN_DIR, check, cpu_kind, recorded_kind, stable

pytestmark = [pytest.mark.workflow, pytest.mark.slow]  # Snakemake, SLURM: minutes
SCRIPT = REPO / "tests" / "cluster" / "local_slurm.sh"
STATE = Path(os.environ.get("GNA_SLURM_DIR", "/var/tmp/gna-slurm"))
SNAKEMAKE = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile")]


def why_no_slurm() -> str | None:
    if os.environ.get("GNA_SLURM_TESTS") == "0":
        return "GNA_SLURM_TESTS=0"
    if os.geteuid() != 0:
        return "a local SLURM needs root (packages and daemons)"
    if not shutil.which("sbatch") and not shutil.which("apt-get"):
        return "no SLURM and no apt-get to install it"
    return None


@pytest.fixture(scope="module")
def slurm_env():
    reason = why_no_slurm()
    if reason:
        pytest.skip(reason)
    env = dict(os.environ, SLURM_CONF=str(STATE / "slurm.conf"), GNA_SLURM_DIR=str(STATE))
    start = time.perf_counter()
    proc = subprocess.run(["bash", str(SCRIPT), "start"], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, f"local SLURM did not start:\n{proc.stdout}\n{proc.stderr}"
    print(f"local SLURM up in {time.perf_counter() - start:.1f}s: {proc.stderr.strip()}")
    yield env
    subprocess.run(["bash", str(SCRIPT), "stop"], capture_output=True, text=True, env=env)


def test_smoke_baseline_runs_as_slurm_jobs_and_equals_the_local_results(tmp_path, slurm_env):
    # the tiny model is made here first: its conversion job would only add a SLURM job's wait (the
    # plugin's status checks back off by 10 s); that the conversion asks for no GPU is checked in
    # the paper config's plan below
    smk(tmp_path, "data/models/tiny-llama")
    tasks = ("kv_retrieval", "mmlu_letter", "mmlu_cloze")
    targets = [f"data/results/baseline/tiny-llama/{task}.parquet" for task in tasks]
    submitted = subprocess.run(
        ["sacct", "-n", "-X", "-P", "-o", "JobID"], capture_output=True, text=True, env=slurm_env
    ).stdout.split()
    start = time.perf_counter()
    proc = subprocess.run(
        SNAKEMAKE
        + [
            "--directory",
            str(tmp_path),
            "--configfile",
            str(tmp_path / "config.yaml"),
            "--profile",
            str(REPO / "profiles" / "slurm"),
            # a cluster's scheduler wants few status queries; this one answers at once
            "--slurm-init-seconds-before-status-checks",
            "1",
            "--seconds-between-status-checks",
            "1",
            *targets,
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=slurm_env,
        timeout=900,
    )
    seconds = time.perf_counter() - start
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    print(f"baseline through SLURM in {seconds:.0f}s")

    # every job that loads a model ran in SLURM; the quick model-free steps ran locally (localrules).
    # slurmdbd writes the accounting after the job ends, asynchronously: on a busy host it can lag
    # the plugin's own status check, so read it until the jobs appear (at most 60 s)
    deadline = time.monotonic() + 60
    while True:
        jobs = subprocess.run(
            ["sacct", "-n", "-X", "-P", "-o", "JobID,Comment,Partition,State,AllocTRES"],
            capture_output=True,
            text=True,
            env=slurm_env,
        ).stdout.splitlines()
        ours = [line.split("|") for line in jobs if line.split("|")[0] not in submitted]
        if (ours and all(job[3] == "COMPLETED" for job in ours)) or time.monotonic() > deadline:
            break
        time.sleep(2)
    print("\n".join("|".join(job) for job in ours))
    # the three baseline tasks as one group job (profile `groups`): one GPU (the fake GRES here) on
    # the GPU partition, the threads and memory of one job, the three run one after another inside it
    assert [job[1] for job in ours] == ["rule_baseline_baseline"], ours
    assert all(job[3] == "COMPLETED" and "cpu=8" in job[4] and "mem=4000M" in job[4] for job in ours), ours
    assert all(job[2] == "gpu" and "gres/gpu=1" in job[4] for job in ours), ours

    for task in tasks:
        for suffix in ("parquet", "items.parquet"):
            name = f"results/baseline/tiny-llama/{task}.{suffix}"
            # as the golden test compares: bit for bit on the golden files' CPU kind, else within its tolerance
            check(
                name,
                stable(pl.read_parquet(tmp_path / "data" / name)),
                stable(pl.read_parquet(GOLDEN_DIR / name)),
                same_kind=cpu_kind() == recorded_kind(),
            )


def test_paper_config_through_the_profile_asks_for_what_an_8b_model_needs(tmp_path):
    """Dry run (no SLURM needed): the 8B model's jobs ask for at least its bf16 weights plus
    working memory, a GPU through the plugin's `gpu` resource (no GRES hidden in slurm_extra)
    for every rule but the conversion."""
    proc = snakemake_cli(
        [
            *("--snakefile", str(REPO / "Snakefile"), "--configfile", str(REPO / "config" / "paper.yaml")),
            *("--profile", str(REPO / "profiles" / "slurm"), "--directory", str(tmp_path), "-n"),
        ],
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stdout[-3000:]
    # a job's block: "rule x:" then indented "key: value" lines; jobs of a group job are indented once more
    jobs = re.findall(r"(local)?rule (\w+):\n((?: {4,}\w+: .*\n)+)", proc.stdout + proc.stderr)
    local_rules = re.search(r"localrules:\n((?:    \w+,\n)+)", (REPO / "Snakefile").read_text()).group(1).split()
    assert len(jobs) == sum(planned_jobs(proc.stdout + proc.stderr).values())  # every job, local ones too
    weights_mb = 8.03e9 * 2 / 2**20
    big = 0
    for local, rule, block in jobs:
        if local or rule + "," in local_rules or "model=llama-3.1-8b-instruct" not in block:
            continue  # a local rule runs in the Snakemake process, not as a SLURM job
        if not re.search(r"input: .*data/models/", block):
            continue  # a model's job that does not load it (facts_known splits a task table)
        mem = int(re.search(r"mem_mb=(\d+)", block).group(1))
        assert weights_mb < mem < 200_000, (rule, mem)
        assert "slurm_extra" not in block, block
        gpu = rule != "prepare_model"
        assert ("slurm_partition=gpu" in block and "gpu=1" in block) == gpu, block
        big += 1
    assert big >= 10
    # the many short jobs go to SLURM as group jobs (profile `groups`)
    assert all(f"Group job {group}" in proc.stdout for group in ("baseline", "head-tables", "gna", "student-scores"))


def test_every_group_job_fits_the_longest_single_job_limit():
    """A group job's wall-time limit is the sum of its jobs' limits; `group-components` must keep it
    within the longest limit one job asks (a cluster's partition limit is sized for that job)."""
    profile = yaml.safe_load((REPO / "profiles" / "slurm" / "config.yaml").read_text())
    limits = {
        rule: res.get("runtime", profile["default-resources"]["runtime"])
        for rule, res in profile["set-resources"].items()
    }
    for group, components in profile["group-components"].items():
        rules = [rule for rule, g in profile["groups"].items() if g == group]
        # each component is one job of a rule of the group; the worst case takes the longest ones
        worst = sum(sorted((limits[rule] for rule in rules), reverse=True)[:1] * components)
        assert worst <= max(limits.values()), f"group {group}: {components} x up to {worst // components} min"
