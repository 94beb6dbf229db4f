"""Real DVC on the smoke config, through a networked S3 remote (moto's S3 server, started here on
localhost): a missing remote is named before anything is sent; repro → `make push` → a rerun of
the same code and config hashes the same → fresh clone → `make pull` → Snakemake has nothing to
do, and a later config edit still reruns exactly what it affects."""

import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, planned_jobs, snakemake_cli
from golden import SMOKE_RUN

pytestmark = [pytest.mark.workflow, pytest.mark.slow]  # Snakemake, DVC: minutes
BIN = Path(sys.executable).parent
BUCKET = "gna-results"
# moto accepts any key; real ones must never be needed here
S3_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


def env():
    return dict(
        os.environ,
        PATH=f"{BIN}:{os.environ['PATH']}",
        GIT_AUTHOR_NAME="t",
        GIT_AUTHOR_EMAIL="t@t",
        GIT_COMMITTER_NAME="t",
        GIT_COMMITTER_EMAIL="t@t",
        **S3_ENV,
    )


def run(cmd, cwd, ok=True):
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=env(), shell=isinstance(cmd, str))
    assert (proc.returncode == 0) == ok, (
        f"{cmd} returned {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    )
    return proc.stdout + proc.stderr


def make(target, cwd, ok=True):
    return run(["make", "-o", ".venv/.installed-stamp", target], cwd, ok)


@pytest.fixture(scope="module")
def s3_endpoint():
    """moto's S3 server on a free localhost port, with an empty bucket; stopped afterwards."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env(),
    )
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        endpoint = f"http://127.0.0.1:{port}"
        import boto3

        boto3.client(
            "s3",
            endpoint_url=endpoint,
            **{k.lower(): v for k, v in S3_ENV.items() if k != "AWS_DEFAULT_REGION"},
            region_name="us-east-1",
        ).create_bucket(Bucket=BUCKET)
        yield endpoint
    finally:
        server.terminate()
        server.wait(timeout=10)


def project_copy(dest: Path) -> Path:
    """The project's tracked files (no results, no dvc.lock) with the smoke config as default."""
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    for name in files:
        if name in ("dvc.lock",) or not (REPO / name).exists():
            continue
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, dest / name)
    shutil.copy(dest / "config" / "smoke.yaml", dest / "config" / "config.yaml")
    (dest / ".venv").symlink_to(BIN.parent)
    run(["git", "init", "-q"], dest)
    return dest


def recorded_project(dest: Path, smoke: Path) -> Path:
    """The project at `dest` with the smoke run's results, recorded for Snakemake (as `make pull`
    does) and by `dvc repro`, which runs Snakemake and finds nothing to do instead of a second run.
    (Not a copy of one recorded project: Snakemake records the MMLU file's path, which is absolute.)"""
    origin = project_copy(dest)
    shutil.copytree(smoke / "data", origin / "data")
    run([sys.executable, "-m", "snakemake", "--touch", "--forceall", "--cores", "1", "--quiet"], origin)
    assert "Nothing to be done" in run(["dvc", "repro"], origin)
    return origin


def test_s3_push_clone_pull_then_nothing_to_do(tmp_path, s3_endpoint, smoke):
    origin, clone = recorded_project(tmp_path / "origin", smoke), tmp_path / "clone"
    # no remote yet: both directions say what to configure, before DVC runs
    assert "no DVC remote is configured" in make("push", origin, ok=False)
    # a local folder remote that does not exist is never created by a push
    run(["dvc", "remote", "add", "-f", "-d", "lab", str(tmp_path / "typo")], origin)
    out = make("push", origin, ok=False)
    assert "does not exist on this machine" in out and "dvc remote add -d lab s3://" in out
    assert not (tmp_path / "typo").exists()

    run(["dvc", "remote", "add", "-f", "-d", "lab", f"s3://{BUCKET}/smoke"], origin)
    run(["dvc", "remote", "modify", "lab", "endpointurl", s3_endpoint], origin)
    assert "holds nothing yet" in make("pull", origin, ok=False)
    run(["git", "add", "-A"], origin)
    run(["git", "commit", "-qm", "smoke results"], origin)
    assert "every tracked output of dvc.lock is there" in make("push", origin)
    assert "Data and pipelines are up to date." in run(["dvc", "status"], origin)
    # the steps whose results carried wall times (scores, attribution, the report) run again:
    # same code and config, so the same hashes. The report alone in a second run, without the
    # modification-time trigger: else everything between them would run again too (minutes)
    forced = {
        "baseline": "data/results/baseline/tiny-llama/kv_retrieval.parquet",
        "lm_eval_crosscheck": "data/results/lmeval/tiny-llama/crosscheck_mmlu_letter.parquet",
        "heads_attribution": "data/results/heads/tiny-llama/attribution.parquet",
    }
    out = run([sys.executable, "-m", "snakemake", *SMOKE_RUN, "--force", *forced.values()], origin)
    assert {rule for rule in re.findall(r"\(Rule: (\w+)\)", out)} == set(forced), out[-3000:]
    report = [sys.executable, "-m", "snakemake", *SMOKE_RUN, "--force", "--rerun-triggers", "params", "input", "code"]
    out = run([*report, "--", "data/report/index.html"], origin)
    assert {rule for rule in re.findall(r"\(Rule: (\w+)\)", out)} == {"report"}, out[-3000:]
    assert "Data and pipelines are up to date." in run(["dvc", "status"], origin)

    run(["git", "clone", "-q", str(origin), str(clone)], tmp_path)
    (clone / ".venv").symlink_to(BIN.parent)
    out = make("pull", clone)
    assert "pulled from DVC remote 'lab' (s3://gna-results/smoke)" in out
    assert "Nothing to be done (all requested files are present and up to date)." in out
    assert (clone / "data" / "report" / "index.html").exists()
    assert planned_jobs(snakemake_cli(["-n"], clone).stdout) == {}

    config = (clone / "config" / "config.yaml").read_text()
    (clone / "config" / "config.yaml").write_text(config.replace('title: "gna smoke run"', 'title: "edited"'))
    assert planned_jobs(snakemake_cli(["-n"], clone).stdout) == {"report": 1, "all": 1}


def test_pull_from_a_remote_that_exists_only_on_another_machine_names_it(tmp_path):
    """As on a fresh clone whose committed remote is a folder on the machine that made the results."""
    project = project_copy(tmp_path / "project")
    run(["dvc", "remote", "add", "-d", "lab", "/nonexistent/gna-dvc-remote"], project)
    out = make("pull", project, ok=False)
    assert "DVC remote 'lab' (/nonexistent/gna-dvc-remote) does not exist on this machine" in out
    assert "results pushed there on another machine are not here" in out
    assert not (project / "data").exists()


def test_make_reproduce_never_records_an_output_no_job_wrote(tmp_path, smoke):
    """The drills: a result edited by hand (still valid Parquet), one deleted, one added, then a
    config edit run by Snakemake directly. `make reproduce` restores the first two from the DVC
    cache, sets the edited and added files aside, names each, and records only the pipeline's own
    outputs: dvc.lock is unchanged by the drills and takes the direct run's new report."""
    import polars as pl

    origin = recorded_project(tmp_path / "origin", smoke)
    lock = (origin / "dvc.lock").read_text()
    topk, gradual = (
        origin / "data/results/heads/tiny-llama/topk.parquet",
        origin / "data/results/prune/tiny-llama/gradual.parquet",
    )
    recorded = {p: p.read_bytes() for p in (topk, gradual)}
    halved = pl.read_parquet(topk).with_columns(pl.col("value") / 2)
    halved.write_parquet(topk)
    gradual.unlink()
    extra = origin / "data/results/heads/tiny-llama/extra.parquet"
    extra.write_bytes(recorded[topk])

    out = make("reproduce", origin)
    assert "data/results/heads/tiny-llama/topk.parquet edited outside the pipeline: restored from the DVC cache" in out
    assert (
        "data/results/prune/tiny-llama/gradual.parquet deleted outside the pipeline: restored from the DVC cache" in out
    )
    assert "data/results/heads/tiny-llama/extra.parquet added outside the pipeline: to be computed again" in out
    assert {p: p.read_bytes() for p in recorded} == recorded and not extra.exists()
    aside = origin / "data/run/set-aside/data/results/heads/tiny-llama"
    assert pl.read_parquet(aside / "topk.parquet").equals(halved)  # the edit, kept for the user
    assert (aside / "extra.parquet").exists()  # nothing is lost
    assert (origin / "dvc.lock").read_text() == lock
    assert "Data and pipelines are up to date." in run(["dvc", "status"], origin)

    # what a job writes is the pipeline's: a direct run after a config edit is recorded as it is
    config = (origin / "config/config.yaml").read_text()
    (origin / "config/config.yaml").write_text(config.replace('title: "gna smoke run"', 'title: "edited"'))
    run([sys.executable, "-m", "snakemake", "--cores", "1", "--quiet"], origin)
    out = make("reproduce", origin)
    assert "outside the pipeline" not in out
    assert (origin / "dvc.lock").read_text() != lock and "edited" in (origin / "data/report/index.html").read_text()
    assert "Data and pipelines are up to date." in run(["dvc", "status"], origin)
