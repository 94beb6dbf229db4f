"""Run the workflow's jobs without Snakemake: a recorded plan, replayed script by script.

A bare GPU node (torch and transformers, no Snakemake) can still run every rule of a config end to
end: `record_plan` asks Snakemake, where it is installed, for every job of a config in a fresh
working folder (rule, script, input, output, log, params, wildcards, threads, resources) and
`replay` runs each job's script as Snakemake's `script:` directive does — in its own Python
process, in the working folder, with a `snakemake` object holding the job's values — as soon as the
jobs that write its inputs have finished. benchmarks/gpu_check.py replays the smoke config's plan
(tests/data/smoke_plan.json, kept equal to the workflow by a test) on CUDA.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

from gna.core.io import write_text

PLAN_VERSION = 1
REPO_TOKEN = "{repo}"
# params that only decide reruns (code fingerprints); no script reads them, and recording them
# would make the plan stale at every library edit
RERUN_ONLY_PARAMS = ("code",)


def _named(values, skip: tuple[str, ...] = ()) -> dict:
    """A Snakemake Namedlist as {"items": [...], "names": {name: [start, end or None]}}."""
    items = [str(v) if isinstance(v, os.PathLike) else v for v in values]
    names = {name: list(span) for name, span in values._names.items() if name not in skip}
    if skip:  # drop the skipped items and shift the spans after them
        keep = [
            i
            for i in range(len(items))
            if not any(n in skip and s <= i < (s + 1 if e is None else e) for n, (s, e) in values._names.items())
        ]
        where = {old: new for new, old in enumerate(keep)}
        items = [items[i] for i in keep]
        names = {n: [where[s], None if e is None else where[e - 1] + 1] for n, (s, e) in names.items()}
    return {"items": items, "names": names}


def _portable(value, repo: str, workdir: str = ""):
    """`value` with the repository's absolute path, and paths inside it, written as {repo}...; a
    path relative to `workdir` that leads into the repository (a config path the workflow gives
    relative to its working folder) too."""
    if isinstance(value, str) and workdir and value.startswith(".."):
        absolute = os.path.normpath(os.path.join(workdir, value))
        if absolute == repo or absolute.startswith(repo + os.sep):
            value = absolute
    if isinstance(value, str) and (value == repo or value.startswith(repo + os.sep)):
        return REPO_TOKEN + value[len(repo) :]
    if isinstance(value, dict):
        return {k: _portable(v, repo, workdir) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_portable(v, repo, workdir) for v in value]
    return value


def record_plan(configfile: str | Path, workdir: str | Path, cores: int = 2) -> dict:
    """Every job Snakemake would run for `configfile` in the empty folder `workdir` with `--cores
    cores` (which caps each job's threads), in an order that runs each job after the jobs writing
    its inputs. Needs Snakemake; nothing is run."""
    from snakemake.api import SnakemakeApi
    from snakemake.settings.types import (
        ConfigSettings,
        DAGSettings,
        OutputSettings,
        Quietness,
        ResourceSettings,
        StorageSettings,
    )

    repo = str(Path(__file__).resolve().parents[3])
    workdir = Path(workdir).resolve()
    if workdir.exists() and any(workdir.iterdir()):
        raise ValueError(f"{workdir}: not empty; a plan is recorded for a fresh working folder")
    workdir.mkdir(parents=True, exist_ok=True)
    with SnakemakeApi(OutputSettings(quiet={Quietness.ALL})) as api:
        workflow_api = api.workflow(
            resource_settings=ResourceSettings(cores=cores),
            config_settings=ConfigSettings(configfiles=[Path(configfile).resolve()]),
            storage_settings=StorageSettings(),
            workdir=workdir,
            snakefile=Path(repo) / "Snakefile",
        )
        dag_api = workflow_api.dag(DAGSettings())
        dag_api.execute_workflow(executor="dryrun")
        workflow = workflow_api._workflow  # the API exposes no job list; the DAG is read, not changed
        jobs = [
            job
            for level in workflow.dag.toposorted()  # one level's jobs in a stable order
            for job in sorted(level, key=lambda j: (j.rule.name, sorted(j.wildcards_dict.items())))
        ]
        config = json.loads(json.dumps(workflow.config, default=str))
    records = []
    for job in jobs:
        if job.rule.script is None:  # `rule all` and other rules that only gather files
            continue
        script = Path(job.rule.basedir.get_path_or_uri(secret_free=True)) / job.rule.script
        records.append(
            _portable(
                {
                    "rule": job.rule.name,
                    "script": os.path.normpath(script),
                    "input": _named(job.input),
                    "output": _named(job.output),
                    "log": _named(job.log),
                    "params": _named(job.params, skip=RERUN_ONLY_PARAMS),
                    "wildcards": _named(job.wildcards),
                    "threads": job.threads,
                    "resources": {
                        k: v for k, v in job.resources.items() if not k.startswith("_") and isinstance(v, int)
                    },
                },
                repo,
                str(workdir),
            )
        )
    return {
        "version": PLAN_VERSION,
        "configfile": _portable(str(Path(configfile).resolve()), repo),
        "config": _portable(config, repo),
        "jobs": records,
    }


def write_plan(plan: dict, path: str | Path) -> None:
    write_text(json.dumps(plan, indent=1, sort_keys=True) + "\n", path)


def read_plan(path: str | Path) -> dict:
    plan = json.loads(Path(path).read_text())
    if plan.get("version") != PLAN_VERSION:
        raise ValueError(f"{path}: plan version {plan.get('version')!r}, this library reads {PLAN_VERSION}")
    return plan


def _resolved(value, repo: str):
    if isinstance(value, str) and value.startswith(REPO_TOKEN):
        return repo + value[len(REPO_TOKEN) :]
    if isinstance(value, dict):
        return {k: _resolved(v, repo) for k, v in value.items()}
    if isinstance(value, list):
        return [_resolved(v, repo) for v in value]
    return value


class Names(list):
    """Snakemake's Namedlist as a script reads it: a list whose named items are also attributes."""

    def __init__(self, record: dict):
        super().__init__(record["items"])
        self._names = list(record["names"])
        for name, (start, end) in record["names"].items():
            setattr(self, name, self[start] if end is None else Names({"items": self[start:end], "names": {}}))

    def items(self) -> list[tuple[str, object]]:
        """(name, value) of every named item, as Namedlist.items() gives them."""
        return [(name, getattr(self, name)) for name in self._names]


class Resources:
    def __init__(self, values: dict):
        self.__dict__.update(values)


def job_object(job: dict, config: dict, repo: str):
    """The `snakemake` object a job's script reads (input, output, log, params, wildcards,
    threads, resources, config, rule), with {repo} paths resolved."""
    from types import SimpleNamespace

    job = _resolved(job, repo)
    return SimpleNamespace(
        **{k: Names(job[k]) for k in ("input", "output", "log", "params", "wildcards")},
        threads=job["threads"],
        resources=Resources(job["resources"]),
        config=_resolved(config, repo),
        rule=job["rule"],
        scriptdir=os.path.dirname(job["script"]),
    )


def run_job(plan_path: str, index: int, repo: str) -> None:
    """Run job `index` of the plan at `plan_path` in this process (cwd: the working folder)."""
    import runpy

    plan = read_plan(plan_path)
    job = plan["jobs"][index]
    obj = job_object(job, plan["config"], repo)
    for path in [*obj.output, *obj.log]:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    runpy.run_path(_resolved(job["script"], repo), init_globals={"snakemake": obj}, run_name="__main__")


def job_label(job: dict) -> str:
    wildcards = ", ".join(f"{k}={job['wildcards']['items'][s]}" for k, (s, _) in job["wildcards"]["names"].items())
    return f"{job['rule']}[{wildcards}]" if wildcards else job["rule"]


@dataclass(frozen=True)
class Rules:
    """Which jobs of a plan replay runs: only those of `only` (None: every rule; the others' outputs
    are given, already in the working folder), never those of `skip` (nor what needs their outputs)."""

    only: tuple[str, ...] | None = None
    skip: tuple[str, ...] = ()


def replay(
    plan_path: str | Path,
    workdir: str | Path,
    *,
    parallel: int = 1,
    env: dict | None = None,
    rules: Rules = Rules(),
    progress=None,
) -> list[dict]:
    """Run every job of the plan at `plan_path` in `workdir`, each in its own Python process, up to
    `parallel` at a time, each as soon as the jobs writing its inputs have succeeded; the jobs of
    `rules.skip` are not run, nor is a job whose input a skipped or failed job should have written.
    With `rules.only`, only their jobs run: every other job is given (status 'given'), what they read
    of its outputs already in `workdir` (a job missing one is 'not run', naming it). Returns one
    record per job: rule, label, status (ok, failed, skipped, given, not run), seconds, the end of
    its log where it failed."""
    plan_path = Path(plan_path).resolve()
    plan = read_plan(plan_path)
    jobs = plan["jobs"]
    repo = str(Path(__file__).resolve().parents[3])
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    writer = {path: i for i, job in enumerate(jobs) for path in job["output"]["items"]}
    needs = [{writer[p] for p in job["input"]["items"] if p in writer} for job in jobs]
    env = {
        **os.environ,
        **(env or {}),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(repo) / "src"), os.environ.get("PYTHONPATH")])),
    }
    results = [{"rule": job["rule"], "label": job_label(job), "status": "waiting"} for job in jobs]

    def run(i: int) -> dict:
        start = time.perf_counter()
        code = f"from gna.core.replay import run_job; run_job({str(plan_path)!r}, {i}, {repo!r})"
        proc = subprocess.run([sys.executable, "-c", code], cwd=workdir, env=env, capture_output=True, text=True)
        record = {
            "status": "ok" if proc.returncode == 0 else "failed",
            "seconds": round(time.perf_counter() - start, 2),
        }
        if proc.returncode:
            logs = [workdir / _resolved(p, repo) for p in jobs[i]["log"]["items"]]
            text = "".join(p.read_text() for p in logs if p.exists()) + proc.stderr
            record["error"] = text[-3000:]
        return record

    only = rules.only
    for i, job in enumerate(jobs):
        if job["rule"] in rules.skip:
            results[i]["status"] = "skipped"
        elif only is not None and job["rule"] not in only:
            results[i]["status"] = "given"
        elif only is not None:
            missing = [
                p
                for p in job["input"]["items"]
                if p in writer and jobs[writer[p]]["rule"] not in only and not (workdir / _resolved(p, repo)).exists()
            ]
            if missing:
                results[i].update(status="not run", error=f"given inputs missing in {workdir}: {missing}")
    pending, running = {i for i, r in enumerate(results) if r["status"] == "waiting"}, {}
    with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
        while pending or running:
            for i in sorted(pending):
                if any(results[d]["status"] in ("failed", "skipped", "not run") for d in needs[i]):
                    results[i]["status"] = "not run"
                    pending.discard(i)
                elif len(running) < parallel and all(results[d]["status"] in ("ok", "given") for d in needs[i]):
                    running[pool.submit(run, i)] = i
                    pending.discard(i)
            if not running:
                continue
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                i = running.pop(future)
                results[i].update(future.result())
                if progress:
                    progress(results[i])
    return results


def main(argv: list[str] | None = None) -> None:
    """python -m gna.core.replay record CONFIG PLAN | run PLAN WORKDIR [PARALLEL]"""
    import tempfile

    args = sys.argv[1:] if argv is None else argv
    if len(args) >= 3 and args[0] == "record":
        with tempfile.TemporaryDirectory(prefix="gna-plan-") as tmp:
            plan = record_plan(args[1], tmp)
        write_plan(plan, args[2])
        print(f"{args[2]}: {len(plan['jobs'])} jobs of {args[1]}")
    elif len(args) >= 3 and args[0] == "run":
        results = replay(
            args[1],
            args[2],
            parallel=int(args[3]) if len(args) > 3 else 1,
            progress=lambda r: print(f"{r['label']}: {r['status']} ({r.get('seconds', 0):.1f} s)", flush=True),
        )
        failed = [r for r in results if r["status"] != "ok"]
        for r in failed:
            print(f"{r['label']}: {r['status']}\n{r.get('error', '')}")
        sys.exit(1 if failed else 0)
    else:
        raise SystemExit(main.__doc__)


if __name__ == "__main__":
    main()
