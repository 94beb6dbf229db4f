"""One command that checks the pipeline on a CUDA machine and writes one JSON.

    python benchmarks/gpu_check.py [--out gpu_check.json] [--parts machine,kernel,paper,smoke,tests]

Runs on a bare, offline GPU node that has torch, transformers, pyarrow and pytest (no Snakemake,
DVC or lm-eval; polars and jsonschema are the only wheels to bring, README "GPUs"), from the
repository's root, without installing it (src/ is put on the path). No downloads: every model is
random, every table built here. Parts, each timed and written to the JSON as soon as it ends (a
part that fails records its error and the next one runs):

- machine: GPU, CUDA, torch, transformers, Triton, mamba-ssm, commit.
- kernel: mamba-ssm's Triton SSD kernel against the torch scan (ssd_chunked) at paper shapes
  (batch 4, length 2048, 32 heads, head dim 64, state 16): largest difference and speed-up.
- paper: a Llama-3.2-1B-shaped random model (16 layers, hidden 2048, 32/8 heads, vocab 128256):
  150 KV prompts scored at batch 32 and 8; the exact per-head sweep against the naive per-head loop
  on three layers' heads (equal mean log-probs) and its extrapolation to all 512 heads; a k = 10
  student built from it, aligned, distilled (KD steps) and scored. `--big` adds the same scoring and
  sweep for a Llama-3.1-8B shape.
- smoke: every job of the smoke config (tests/data/smoke_plan.json, the workflow's own plan) run
  script by script on CUDA (gna.core.replay), its results compared with the golden files
  (tests/data/smoke_results) as for another kind of processor: the teacher's rules within a
  relative 1e-4, the students' within 1e-3 (tests/golden.py). The students run the reference SSM
  scan there (--smoke-scan torch); `--smoke-scan triton` runs mamba-ssm's kernel instead, whose
  TF32 dots move trained students by more than 1e-3. `--smoke-timeout` compares what finished in
  time and names the jobs that did not.
- tests: the engine, students, phases and models unit tests with models on CUDA
  (GNA_TEST_DEVICE=cuda), pass/fail counts and every failure's message, kept as each test fails
  (benchmarks/_failures.py), so a run cut off by --tests-timeout still says why.

On an H200 the parts take about 0.1 + 0.6 + 3 + 5 + 6 minutes (smoke at --parallel 8): run them in
two calls where one command may last 10 minutes, or smoke and tests side by side in one.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "src"), str(REPO / "tests"), str(REPO / "benchmarks")]

import torch  # noqa: E402

from gna.engine.scoring import Scorer

PARTS = ("machine", "kernel", "paper", "smoke", "tests")
UNIT_TESTS = ["tests/unit/engine", "tests/unit/students", "tests/unit/phases", "tests/unit/models"]
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


def machine() -> dict:
    import transformers

    def version(name):
        try:
            from importlib.metadata import version as v

            return v(name)
        except Exception:  # noqa: BLE001 - absent packages are reported, not fatal
            return None

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    props = torch.cuda.get_device_properties(0) if DEVICE == "cuda" else None
    return {
        "gpu": props and props.name,
        "gpu_memory_gb": props and round(props.total_memory / 2**30, 1),
        "cuda": torch.version.cuda,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "triton": version("triton"),
        "mamba_ssm": version("mamba-ssm") or version("mamba_ssm"),
        "polars": version("polars"),
        "python": platform.python_version(),
        "cpu_cores": os.cpu_count(),
        "commit": commit.stdout.strip() or "unknown",
    }


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

    from gna.core.replay import job_label, read_plan, replay

    workdir = Path(keep or tempfile.mkdtemp(prefix="gna-gpu-smoke-"))
    # lm-eval's own harness needs lm-eval (not on a bare node): its rules are skipped there
    skip = () if _has("lm_eval") else ("lm_eval", "lm_eval_crosscheck")
    plan_path = REPO / "tests" / "data" / "smoke_plan.json"
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
                skip_rules=skip,
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
        for job in read_plan(plan_path)["jobs"]:
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
    out["golden"] = {
        "files": len(files),
        **{o: sum(v == o for v in files.values()) for o in sorted(set(files.values())) if not o.startswith("differs")},
        "differs": {k: v for k, v in files.items() if v.startswith("differs") or v == "missing"},
    }
    return out


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


def unit_tests(paths: list[str], timeout: int) -> dict:
    from _failures import read_failures

    junit = Path(tempfile.mkdtemp()) / "junit.xml"
    failures_log = junit.with_name("failures.jsonl")
    env = {
        **os.environ,
        "GNA_TEST_DEVICE": DEVICE,
        "GNA_FAILURES_LOG": str(failures_log),
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
            "failures": read_failures(str(failures_log)),
            "output": "\n".join(lines[-20:]),
        }
    out = {
        "wall_s": round(time.perf_counter() - start, 1),
        "workers": workers[1:] or ["1"],
        "summary": tail.splitlines()[-1:],
    }
    if junit.exists():
        cases = ET.parse(junit).getroot().iter("testcase")
        counts = {"passed": 0, "failed": 0, "skipped": 0}
        failures = []
        for case in cases:
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
        out.update(counts, failures=failures)
    else:
        out["output"] = tail
    return out


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


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="gpu_check.json")
    ap.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    ap.add_argument("--big", action="store_true", help="also a Llama-3.1-8B shape (about 16 GB of bf16 weights)")
    ap.add_argument("--parallel", type=int, default=4, help="smoke jobs at a time")
    ap.add_argument("--keep", help="run the smoke jobs in this folder and keep it")
    ap.add_argument(
        "--smoke-scan",
        default="torch",
        choices=["torch", "triton"],
        help="the students' SSM scan in the smoke jobs (torch: the reference, judged by the goldens)",
    )
    ap.add_argument("--smoke-timeout", type=float, help="seconds: compare the jobs finished by then, name the others")
    ap.add_argument("--tests", default=",".join(UNIT_TESTS), help="comma-separated test paths of the tests part")
    ap.add_argument("--tests-timeout", type=int, default=300)
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
    runs = {
        "machine": machine,
        "kernel": kernel,
        "paper": lambda: paper(args.big),
        "smoke": lambda: smoke(args.parallel, args.keep, args.smoke_timeout, args.smoke_scan),
        "tests": lambda: unit_tests(args.tests.split(","), args.tests_timeout),
    }
    result, total = {}, time.perf_counter()
    for part in parts:
        print(f"[gpu_check] {part} ...", flush=True)
        start = time.perf_counter()
        try:
            result[part] = runs[part]()
        except Exception as e:  # noqa: BLE001 - one part's failure is recorded; the others still run
            result[part] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-3000:]}
        result[part]["part_s"] = round(time.perf_counter() - start, 1)
        result["total_s"] = round(time.perf_counter() - total, 1)
        Path(args.out).write_text(json.dumps(result, indent=1, default=str) + "\n")
        print(json.dumps({part: result[part]}, default=str)[:3000], flush=True)
    print(f"[gpu_check] wrote {args.out} in {result['total_s']} s")


if __name__ == "__main__":
    main()
