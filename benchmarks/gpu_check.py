"""One command that checks the pipeline on a CUDA machine and writes one JSON.

    python benchmarks/gpu_check.py [--out gpu_check.json] [--parts machine,kernel,smoke,stages,tests] [--budget 540]

Runs on a bare, offline GPU node that has torch, transformers, pyarrow and pytest (no Snakemake,
DVC or lm-eval; it needs the wheels of `make gpu-wheels`, README "GPUs"), from the repository's
root, without installing it (src/ is put on the path). It refuses a transformers older than
pyproject.toml's `transformers>=` (transformers 5.18 and older run Gemma 2 on sdpa, which drops its
attention soft-capping). No downloads: every model is random, every table built here. Parts, run in
this order, each timed and written to the JSON as soon as it ends (a part that fails records its
error and the next one runs):

- machine: GPU, CUDA, Python, the commit and the version of every library the checks use (torch,
  transformers, tokenizers, safetensors, huggingface-hub, triton, mamba-ssm, polars, pyarrow, numpy,
  jsonschema, pytest, pytest-xdist).
- kernel: mamba-ssm's Triton SSD kernel against the torch scan (ssd_chunked) at paper shapes
  (batch 4, length 2048, 32 heads, head dim 64, state 16): largest difference and speed-up.
- paper: a Llama-3.2-1B-shaped random model (16 layers, hidden 2048, 32/8 heads, vocab 128256):
  150 KV prompts scored at batch 32 and 8; the exact per-head sweep against the naive per-head loop
  on three layers' heads (equal mean log-probs) and its extrapolation to all 512 heads; a k = 10
  student built from it, aligned, distilled (KD steps) and scored. `--big` adds the same scoring and
  sweep for a Llama-3.1-8B shape.
- smoke: every job of the smoke config (tests/data/smoke_plan.json, the workflow's own plan) run
  script by script on CUDA (gna.core.replay), its results compared with the golden files
  (tests/data/smoke_results) as a device's (tests/golden.py): the teacher's rules within a
  relative 1e-4, the students' within the spread recorded from one-ulp reruns of their chain on
  the recording CPU (device_spread.json: alignment, realignment and KD compound a device's float32
  summation order beyond the 1e-3 that holds between CPU kinds). The students run the reference SSM
  scan there (--smoke-scan torch); `--smoke-scan triton` runs mamba-ssm's kernel instead, whose
  TF32 dots move trained students by more than 1e-3. Cut at its limit, it compares what finished
  and names the jobs that did not.
- stages: each student rule replayed alone from the golden run's own inputs (the teacher file, the
  aligned students: tests/data/smoke_stage_inputs), its results within 1e-3 of the golden ones:
  each stage's own arithmetic on the device, without the noise it inherits from the stages before.
- tests: the unit tests that put a model on CUDA (UNIT_TESTS) with GNA_TEST_DEVICE=cuda, on the
  reference SSM scan (GNA_SSM_KERNEL=torch; the kernel's own GPU test sets the kernel), pytest-xdist
  workers where installed, the family matrix handed out one family at a time; each test's seconds,
  pass/fail counts and every failure's message, kept as each test ends (benchmarks/_failures.py),
  so a run cut off at its limit still says why. A test still running after --test-alarm seconds
  fails with its name.

The budget: before running, the parts are planned into --budget seconds (default 540: a node's
10-minute command with a minute to spare) from what each takes on an H200 (ESTIMATES_S: machine
6 s, kernel 40 s, paper about 3 min, smoke 184 s at --parallel 8; stages about 2 min and tests
about 3 min, estimated: the tests took 6 min before they were narrowed to the model-on-CUDA ones on
the torch scan). Served in PRIORITY order, a part run to its end (machine, kernel, paper) that no
longer fits is left out; smoke, stages and tests get time limits (their share of what is left, at
least MIN_LIMIT_S), re-derived before each from the time really left. The plan, the limits and
what was left out to fit are printed and written to the JSON. `--device cpu` checks this script on
a CPU machine, at small shapes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
import traceback
import xml.etree.ElementTree as ET
from pathlib import Path

STARTED = time.monotonic()  # the budget counts from here, importing torch included

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "src"), str(REPO / "tests"), str(REPO / "benchmarks")]

import torch  # noqa: E402

from gna.engine.scoring import Scorer

PARTS = ("machine", "kernel", "paper", "smoke", "stages", "tests")
# seconds on an H200 (module docstring); tests: estimated, not yet measured since they were narrowed
ESTIMATES_S = {"machine": 6, "kernel": 40, "paper": 180, "smoke": 184, "stages": 120, "tests": 180}
CUT = ("smoke", "stages", "tests")  # run under a time limit: cut off, they still report what finished
PRIORITY = ("machine", "tests", "smoke", "kernel", "stages", "paper")  # served first when the budget is short
MARGIN_S = 30  # a cut part's stopping and judging what finished, the last JSON
MIN_LIMIT_S = 60  # a cut part given less would report too little to be worth its time
# The tests that put a model on CUDA under GNA_TEST_DEVICE=cuda (through gna.models.prepare.load_model
# or gna.students.spec.load_any), the device and SSM kernel tests, and the SSM heads' ablation
# tests; the other unit tests build their models on the CPU, where `make test` runs them.
UNIT_TESTS = [
    "tests/unit/engine/test_attention_path.py",
    "tests/unit/engine/test_device.py",
    "tests/unit/engine/test_ssm_kernel.py",
    "tests/unit/engine/test_ssm.py::test_student_round_trip_through_load_any",
    "tests/unit/engine/test_ssm.py::test_a_student_with_a_tied_output_head_round_trips",
    "tests/unit/models/test_families.py",
    "tests/unit/models/test_models.py",
    "tests/unit/phases/test_head_ablation.py::test_ssm_heads",
    "tests/unit/phases/test_head_ablation.py::test_zamba2_heads_are_ablated_where_they_are",
    "tests/unit/phases/test_head_ablation.py::test_sweep_phase_in_each_mode_says_what_it_measured",
    "tests/unit/students",
]
# what the machine part records the version of (distribution names)
LIBRARIES = (
    "torch",
    "transformers",
    "tokenizers",
    "safetensors",
    "huggingface-hub",
    "triton",
    "mamba-ssm",
    "polars",
    "pyarrow",
    "numpy",
    "jsonschema",
    "pytest",
    "pytest-xdist",
)
LLAMA_1B = {
    "arch": "llama",
    "layers": 16,
    "hidden": 2048,
    "intermediate": 8192,
    "heads": 32,
    "kv_heads": 8,
    "vocab": 128256,
    "seed": 0,
}
LLAMA_8B = {
    "arch": "llama",
    "layers": 32,
    "hidden": 4096,
    "intermediate": 14336,
    "heads": 32,
    "kv_heads": 8,
    "vocab": 128256,
    "seed": 0,
}


# where the check runs: cuda; `--device cpu` checks this script itself on small shapes (SMALL)
DEVICE = "cuda"
SMALL = {"layers": 4, "hidden": 128, "intermediate": 256, "heads": 4, "kv_heads": 2, "vocab": 1000}


def synced(fn):
    """(fn(), seconds), the GPU's queue drained before and after."""
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    out = fn()
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    return out, round(time.perf_counter() - start, 3)


def version(name: str) -> str | None:
    """The installed version of distribution `name`, or None where it is absent."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    for spelling in (name, name.replace("-", "_")):
        try:
            return installed(spelling)
        except PackageNotFoundError:
            pass
    return None


def machine() -> dict:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    props = torch.cuda.get_device_properties(0) if DEVICE == "cuda" else None
    return {
        "gpu": props and props.name,
        "gpu_memory_gb": props and round(props.total_memory / 2**30, 1),
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        **{name: version(name) for name in LIBRARIES},
        "transformers_minimum": minimum_transformers(),
        "cpu_cores": os.cpu_count(),
        "commit": commit.stdout.strip() or "unknown",
    }


def minimum_transformers() -> str:
    """The lowest transformers that pyproject.toml's dependencies allow (its `transformers>=`)."""
    # read as text: tomllib is Python 3.11's, and a node may run 3.10
    return re.search(r'"transformers\s*>=\s*([\w.]+)', (REPO / "pyproject.toml").read_text()).group(1)


def transformers_refused(installed: str, minimum: str) -> str | None:
    """Why the check refuses transformers `installed` (None from `minimum` on)."""
    from packaging.version import Version

    if Version(installed) >= Version(minimum):
        return None
    return (
        f"gpu_check: transformers {installed} is installed; pyproject.toml needs {minimum} or later. "
        "transformers 5.18 and older run Gemma 2 on sdpa, which silently drops its attention "
        "soft-capping, so every Gemma 2 evaluation there is wrong. Bring the wheels of "
        "`make gpu-wheels` (README 'GPUs')."
    )


def kernel() -> dict:
    from ssm_scan_speed import kernel_vs_chunked

    from gna.engine.ssm_kernel import load_kernel

    if load_kernel() is None:
        return {"kernel": "mamba-ssm not importable (README 'GPUs': the wheel built by make gpu)"}
    shapes = {"batch": 4, "L": 2048, "H": 32, "P": 64, "N": 16, "chunk": 64}
    return {"shapes": shapes, **kernel_vs_chunked(**shapes, device=DEVICE)}


def random_llama(spec: dict, dtype: torch.dtype):
    from gna.models.tiny import tiny_random_model

    with torch.device(DEVICE):  # initialised on the GPU: seconds instead of minutes on the CPU
        model, tok = tiny_random_model(spec)
    return model.to(dtype), tok


def scoring_and_sweep(spec: dict, heads_layers: list[int]) -> dict:
    """Scoring at two batch sizes and the exact sweep against the naive loop, bf16 weights."""
    from _common import extrapolated_fast_sweep_s

    from gna.engine.anatomy import head_sites, heads_per_layer
    from gna.engine.scoring import score_table
    from gna.phases.head_ablation import sweep_heads, sweep_heads_naive
    from gna.tasks.tables import build_kv_retrieval

    out = {}
    (model, tok), out["build_s"] = synced(lambda: random_llama(spec, torch.bfloat16))
    out["params_b"] = round(sum(p.numel() for p in model.parameters()) / 1e9, 2)
    table = build_kv_retrieval([10, 20, 40], 50, seed=0, template="lookup")
    score_table(Scorer(model, tok, batch_size=8, progress=False), table.head(8))  # first call: CUDA set-up
    for batch in (32, 8):
        _, out[f"score_150_batch{batch}_s"] = synced(
            lambda b=batch: score_table(Scorer(model, tok, batch_size=b, progress=False), table)
        )
    few = build_kv_retrieval([10, 20, 40], 11, seed=1, template="lookup").head(32)
    n_heads = model.config.num_attention_heads
    heads = [(layer, h) for layer in heads_layers for h in range(n_heads)]
    fast, out["sweep_s"] = synced(
        lambda: sweep_heads(Scorer(model, tok, batch_size=32, progress=False), few, heads=heads)
    )
    naive, out["naive_s"] = synced(
        lambda: sweep_heads_naive(Scorer(model, tok, batch_size=32, progress=False), few, heads)
    )
    diffs = [
        abs(
            fast.filter((fast["layer"] == layer) & (fast["head"] == h))["mean_logp"][0]
            - float(naive[(layer, h)]["logp_target"].mean())
        )
        for layer, h in heads
    ]
    per_layer = heads_per_layer(head_sites(model))
    out.update(
        heads_swept=len(heads),
        layers_swept=heads_layers,
        prompts=len(few),
        sweep_max_abs_mean_logp_diff=max(diffs),
        sweep_vs_naive=round(out["naive_s"] / out["sweep_s"], 2),
        all_heads=sum(per_layer.values()),
        all_heads_sweep_extrapolated_s=round(extrapolated_fast_sweep_s(out["sweep_s"], heads, per_layer), 1),
    )
    return out


def students(spec: dict) -> dict:
    """A k = 10 student of a float32 random model: teacher activations, alignment, KD, scoring."""
    from gna.engine.scoring import score_table
    from gna.students.alignment import Align, align_layers, load_aligned
    from gna.students.kd import KD, Watch, distill_logits
    from gna.students.spec import make_hybrid
    from gna.students.teacher_file import teacher_activations
    from gna.tasks.tables import build_kv_retrieval

    out = {}
    model, tok = random_llama(spec, torch.float32)
    model.requires_grad_(False)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, len(tok), (8, 256), generator=gen).to(DEVICE)
    acts, out["teacher_activations_s"] = synced(
        lambda: teacher_activations(model, ids, top_k=32, hidden_windows=4, progress=False)
    )
    (aligned, _), out["align_4_steps_s"] = synced(
        lambda: align_layers(
            model,
            acts["hidden"],
            state_size=16,
            align=Align(steps=4, batch=2, lr=1e-3, compute_dtype="bfloat16"),
            seed=0,
            progress=False,
        )
    )
    n_layers = model.config.num_hidden_layers
    kept = [(i * n_layers // 10, i % spec["heads"]) for i in range(10)]
    student = load_aligned(make_hybrid(model, kept, 16), aligned)
    _, out["kd_3_steps_s"] = synced(
        lambda: distill_logits(
            student,
            {"ids": ids, "top_logp": acts["top_logp"], "top_idx": acts["top_idx"]},
            KD(steps=3, batch=2, lr=1e-3, compute_dtype="bfloat16"),
            seed=0,
            watch=Watch(progress=False),
        )
    )
    table = build_kv_retrieval([10, 20, 40], 50, seed=0, template="lookup")
    with torch.no_grad():
        _, out["student_score_150_batch32_s"] = synced(
            lambda: score_table(Scorer(student, tok, batch_size=32, progress=False), table)
        )
    if DEVICE == "cuda":
        out["peak_gpu_gb"] = round(torch.cuda.max_memory_allocated() / 2**30, 1)
    return out


def paper(big: bool) -> dict:
    spec = LLAMA_1B if DEVICE == "cuda" else {**LLAMA_1B, **SMALL}
    out = {
        "llama_1b_shape": {"spec": spec, **scoring_and_sweep(spec, [0, spec["layers"] // 2, spec["layers"] - 1])},
        "students_1b_shape": students(spec),
    }
    if big:
        out["llama_8b_shape"] = {"spec": LLAMA_8B, **scoring_and_sweep(LLAMA_8B, [0, 31])}
    return out


def smoke(parallel: int, keep: str | None, limit_s: float | None, scan: str) -> dict:
    """The smoke plan's jobs on the device, compared with the golden files; `scan` is
    GNA_SSM_KERNEL for the students ('torch': the reference scan, whose results the CPU goldens can
    judge; 'triton': mamba-ssm's kernel, whose TF32 dots move trained students' numbers by more
    than the goldens' 1e-3, measured on an H200). With `limit_s`, the
    comparison is made on the jobs that finished by then and the jobs still running are named (a
    node's command limit then still yields a result instead of nothing)."""
    import threading

    from golden import cpu_kind, outcomes

    from gna.core.replay import Rules, job_label, read_plan, replay

    workdir = Path(keep or tempfile.mkdtemp(prefix="gna-gpu-smoke-"))
    # lm-eval's own harness needs lm-eval (not on a bare node): its rules are skipped there
    skip = () if _has("lm_eval") else ("lm_eval", "lm_eval_crosscheck")
    plan_path = REPO / "tests" / "data" / "smoke_plan.json"
    plan_jobs = read_plan(plan_path)["jobs"]
    finished: list[dict] = []

    stop = threading.Event()

    def progress(record: dict) -> None:
        if stop.is_set():  # the limit has passed: leave replay before it starts another job
            raise _Stopped
        finished.append(record)
        print(f"  {record['label']}: {record['status']} ({record.get('seconds', 0):.1f} s)", flush=True)

    def run() -> None:
        try:
            box["jobs"] = replay(
                plan_path,
                workdir,
                parallel=parallel,
                env={"GNA_DEVICE": DEVICE, "GNA_SSM_KERNEL": scan},
                rules=Rules(skip=skip),
                progress=progress,
            )
        except _Stopped:
            pass

    start = time.perf_counter()
    box: dict = {}
    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(limit_s)
    cut = "jobs" not in box
    if cut:  # the time limit came first: stop the jobs, then judge what finished
        stop.set()
        _stop_children()
        worker.join(60)
        _stop_children()  # one started as the first were killed
        done = {r["label"]: r for r in finished}
        jobs = []
        for job in plan_jobs:
            label = job_label(job)
            status = "skipped" if job["rule"] in skip else "not finished"
            jobs.append(done.get(label, {"label": label, "status": status}))
    else:
        jobs = box["jobs"]
    out = {
        "workdir": str(workdir),
        "wall_s": round(time.perf_counter() - start, 1),
        "cut_at_limit_s": limit_s if cut else None,
        "jobs_not_finished": [j["label"] for j in jobs if j["status"] == "not finished"],
        "parallel": parallel,
        "scan": scan,
        "jobs": len(jobs),
        "jobs_ok": sum(j["status"] == "ok" for j in jobs),
        "jobs_failed": [j for j in jobs if j["status"] == "failed"],
        "jobs_skipped": [j["label"] for j in jobs if j["status"] == "skipped"],
        "jobs_not_run": [j["label"] for j in jobs if j["status"] == "not run"],
        "slowest_jobs": sorted(
            ({"job": j["label"], "s": j["seconds"]} for j in jobs if "seconds" in j), key=lambda j: -j["s"]
        )[:8],
    }
    files = outcomes(workdir / "data", kind=DEVICE if DEVICE == "cuda" else cpu_kind())
    files = not_replayed(files, jobs, plan_jobs)
    out["golden"] = {
        "files": len(files),
        **{o: sum(v == o for v in files.values()) for o in sorted(set(files.values())) if not o.startswith("differs")},
        "differs": {k: v for k, v in files.items() if v.startswith("differs") or v == "missing"},
    }
    return out


def not_replayed(files: dict[str, str], records: list[dict], plan_jobs: list[dict]) -> dict[str, str]:
    """`files` ({result file: golden outcome}) with each 'missing' file that a job not run in this
    replay was to write (skipped, not replayed, cut off: not a failure) marked 'not replayed': a
    difference only where its job ran."""
    from gna.core.replay import job_label

    unrun = {r["label"] for r in records if r["status"] not in ("ok", "failed")}
    out = dict(files)
    for job in plan_jobs:
        for path in job["output"]["items"] if job_label(job) in unrun else []:
            name = path.removeprefix("data/")
            if out.get(name) == "missing":
                out[name] = "not replayed"
    return out


def stages(parallel: int, limit_s: float | None) -> dict:
    """Each student rule of the smoke replayed alone from the golden run's own inputs (the teacher
    file, the aligned students: tests/data/smoke_stage_inputs) on the device, its results judged on
    that stage's arithmetic (tests/golden.py replay_stages: within 1e-3 of the CPU's), where the
    smoke part judges the whole chain by the recorded device spread. Rules not started by
    `limit_s` are named."""
    from golden import cpu_kind, replay_stages

    start = time.perf_counter()
    outcomes = replay_stages(
        tempfile.mkdtemp(prefix="gna-gpu-stages-"),
        kind=DEVICE if DEVICE == "cuda" else cpu_kind(),
        env={"GNA_DEVICE": DEVICE, "GNA_SSM_KERNEL": "torch"},
        parallel=parallel,
        deadline=None if limit_s is None else time.monotonic() + limit_s,
    )
    counts: dict[str, int] = {}
    for outcome in outcomes.values():
        counts[outcome.split(":")[0]] = counts.get(outcome.split(":")[0], 0) + 1
    return {
        "wall_s": round(time.perf_counter() - start, 1),
        "counts": counts,
        "not_as_golden": {k: v for k, v in outcomes.items() if not v.startswith(("bit for bit", "within "))},
    }


class _Stopped(Exception):
    """Raised into gna.core.replay by the smoke part's progress callback once its time is up."""


def _stop_children() -> None:
    """Kill this process's descendants (the smoke jobs still running when its time ran out)."""
    import signal

    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    todo, seen = [os.getpid()], []
    while todo:
        for child in children.get(todo.pop(), []):
            seen.append(child)
            todo.append(child)
    for pid in seen:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def unit_tests(paths: list[str], timeout: int, alarm_s: int | None = None) -> dict:
    """pytest on `paths` in a subprocess with models on DEVICE, stopped after `timeout` seconds;
    with `alarm_s`, a test still running after that long fails with its name."""
    from _failures import read_durations, read_failures

    junit = Path(tempfile.mkdtemp()) / "junit.xml"
    log = junit.with_name("tests.jsonl")
    env = {
        **os.environ,
        "GNA_TEST_DEVICE": DEVICE,
        "GNA_SSM_KERNEL": "torch",  # the reference scan: the kernel is judged by its own test
        "GNA_TESTS_LOG": str(log),
        "GNA_TEST_ALARM_S": str(alarm_s or ""),
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(REPO / "src"), str(REPO / "benchmarks"), os.environ.get("PYTHONPATH")])
        ),
    }
    workers = ["-n", str(min(16, os.cpu_count() or 1))] if _has("xdist") else []
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        *paths,
        "-p",
        "no:cacheprovider",
        "-p",
        "_failures",
        "-m",
        "not extended",
        "-v",  # one line per finished test (not with -q: they cancel): a run cut off still names its failures
        f"--junitxml={junit}",
        *workers,
    ]
    start = time.perf_counter()
    # its own session, so that a timeout stops pytest's workers too, not only pytest
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        tail = proc.communicate(timeout=timeout)[0][-2000:]
    except subprocess.TimeoutExpired:
        import signal

        os.killpg(proc.pid, signal.SIGKILL)
        lines = proc.communicate()[0].splitlines()
        return {
            **finished_tests(lines),
            "timed_out": f"after {timeout} s: the counts are the tests that finished",
            "failures": read_failures(str(log)),
            "durations": read_durations(str(log)),
            "output": "\n".join(lines[-20:]),
        }
    out = {
        "wall_s": round(time.perf_counter() - start, 1),
        "workers": workers[1:] or ["1"],
        "summary": tail.splitlines()[-1:],
    }
    if junit.exists():
        out.update(junit_results(junit))
    else:
        out["output"] = tail
    return {**out, "durations": read_durations(str(log))}


def junit_results(junit: Path) -> dict:
    """Pass/fail/skip counts and each failure's message from pytest's JUnit file."""
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    failures = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        bad = case.find("failure") if case.find("failure") is not None else case.find("error")
        if bad is not None:
            counts["failed"] += 1
            failures.append(
                {
                    "test": f"{case.get('classname')}::{case.get('name')}",
                    "message": (bad.get("message") or "")[:600],
                    "text": (bad.text or "")[-1500:],
                }
            )
        elif case.find("skipped") is not None:
            counts["skipped"] += 1
        else:
            counts["passed"] += 1
    return {**counts, "failures": failures}


def finished_tests(lines: list[str]) -> dict:
    """Counts and failed tests' names from pytest's verbose lines (a test's name beside PASSED,
    FAILED, ERROR or SKIPPED; the closing summary repeats a failure, counted once)."""
    outcomes = ("PASSED", "FAILED", "ERROR", "SKIPPED")
    seen = {}
    for line in lines:
        words = line.split()
        name = next((w for w in words if "::" in w), None)
        word = next((w for w in words if w in outcomes), None)
        if name and word:
            seen[name] = word
    counts = {o.lower(): sum(w == o for w in seen.values()) for o in outcomes}
    return {**counts, "failed_tests": [n for n, w in seen.items() if w in ("FAILED", "ERROR")]}


def plan(parts: list[str], budget_s: float, estimates: dict[str, float] = ESTIMATES_S) -> dict:
    """Each part's estimate and time limit within `budget_s` seconds, MARGIN_S kept aside. Parts are
    served in PRIORITY order, each its estimate while that fits: a part run to its end that no
    longer fits is left out; a cut part (CUT) gets what is left, or is left out below MIN_LIMIT_S.
    The time still over is shared by the cut parts in proportion to what they got: their limits."""
    left = budget_s - MARGIN_S
    given, left_out = {}, []
    for part in sorted(parts, key=PRIORITY.index):
        if estimates[part] <= left or (part in CUT and left >= MIN_LIMIT_S):
            given[part] = min(estimates[part], left)
            left -= given[part]
        else:
            left_out.append(part)
    cut = sum(s for part, s in given.items() if part in CUT)
    return {
        "budget_s": round(budget_s, 1),
        "margin_s": MARGIN_S,
        "parts": {
            part: {
                "estimate_s": estimates[part],
                "limit_s": int(given[part] + left * given[part] / cut) if part in CUT else None,
            }
            for part in PARTS
            if part in given
        },
        "left_out": left_out,
    }


def print_plan(planned: dict, budget_s: float) -> None:
    print(
        f"[gpu_check] plan: {planned['budget_s']:g} s left of the {budget_s:g}-s budget, "
        f"{planned['margin_s']} s of it kept for stopping cut parts:"
    )
    for part, p in planned["parts"].items():
        limit = f", limit {p['limit_s']} s" if p["limit_s"] is not None else ", runs to its end"
        print(f"  {part:8} ~{p['estimate_s']} s{limit}")
    left_out = ", ".join(f"{part} (~{ESTIMATES_S[part]} s)" for part in planned["left_out"])
    print(f"  left out to fit: {left_out or 'nothing'}", flush=True)


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="gpu_check.json")
    ap.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    ap.add_argument("--budget", type=float, default=540, help="seconds the whole run must end within")
    ap.add_argument("--big", action="store_true", help="also a Llama-3.1-8B shape (about 16 GB of bf16 weights)")
    ap.add_argument("--parallel", type=int, default=min(8, os.cpu_count() or 1), help="smoke jobs at a time")
    ap.add_argument("--keep", help="run the smoke jobs in this folder and keep it")
    ap.add_argument(
        "--smoke-scan",
        default="torch",
        choices=["torch", "triton"],
        help="the students' SSM scan in the smoke jobs (torch: the reference, judged by the goldens)",
    )
    ap.add_argument("--smoke-timeout", type=float, help="seconds, at most (default: the plan's limit)")
    ap.add_argument("--tests", default=",".join(UNIT_TESTS), help="comma-separated test paths of the tests part")
    ap.add_argument("--tests-timeout", type=int, help="seconds, at most (default: the plan's limit)")
    ap.add_argument("--test-alarm", type=int, default=90, help="seconds: a test still running then fails")
    ap.add_argument(
        "--device",
        default="cuda",
        choices=["cuda", "cpu"],
        help="cpu: check this script on a CPU machine, at small shapes",
    )
    args = ap.parse_args()
    global DEVICE
    DEVICE = args.device
    if DEVICE == "cuda" and not torch.cuda.is_available():
        sys.exit("gpu_check: torch sees no CUDA device (this check is for a GPU node; the CPU suite is `make test`)")
    parts = args.parts.split(",")
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        sys.exit(f"gpu_check: unknown part(s) {', '.join(unknown)}; allowed: {', '.join(PARTS)}")
    import transformers

    refused = transformers_refused(transformers.__version__, minimum_transformers())
    if refused:
        sys.exit(refused)
    runs = {  # each part given its time limit (None: it runs to its end)
        "machine": lambda limit: machine(),
        "kernel": lambda limit: kernel(),
        "paper": lambda limit: paper(args.big),
        "smoke": lambda limit: smoke(args.parallel, args.keep, at_most(args.smoke_timeout, limit), args.smoke_scan),
        "stages": lambda limit: stages(args.parallel, limit),
        "tests": lambda limit: unit_tests(args.tests.split(","), at_most(args.tests_timeout, limit), args.test_alarm),
    }
    planned = plan(parts, args.budget - (time.monotonic() - STARTED))
    print_plan(planned, args.budget)
    result = {"plan": planned}
    todo = list(planned["parts"])
    while todo:
        # planned again on the time really left: a part that ran long shortens the later limits
        now = plan(todo, args.budget - (time.monotonic() - STARTED))
        part = todo.pop(0)
        if part in now["left_out"]:
            print(f"[gpu_check] {part}: left out, {now['budget_s']} s left of the budget", flush=True)
            planned["left_out"].append(part)
            continue
        limit = now["parts"][part]["limit_s"]
        print(f"[gpu_check] {part} ..." + (f" (limit {limit} s)" if limit is not None else ""), flush=True)
        start = time.perf_counter()
        try:
            result[part] = runs[part](limit)
        except Exception as e:  # noqa: BLE001 - one part's failure is recorded; the others still run
            result[part] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-3000:]}
        result[part].update(limit_s=limit, part_s=round(time.perf_counter() - start, 1))
        write(result, args.out)
        print(json.dumps({part: result[part]}, default=str)[:3000], flush=True)
    write(result, args.out)
    left_out = ", ".join(planned["left_out"]) or "nothing"
    print(f"[gpu_check] wrote {args.out} in {result['total_s']} s of its {args.budget:g} s (left out: {left_out})")


def write(result: dict, out: str) -> None:
    """The JSON as it stands, with the seconds since the start."""
    result["total_s"] = round(time.monotonic() - STARTED, 1)
    Path(out).write_text(json.dumps(result, indent=1, default=str) + "\n")


def at_most(given: float | None, limit: float) -> float:
    """The plan's limit, or the one given on the command line where that is shorter."""
    return limit if given is None else min(given, limit)


if __name__ == "__main__":
    main()
