"""benchmarks/gpu_check.py on the CPU: its plan fits the parts into the budget, it refuses an older
transformers, and its tests part (the real command, in a subprocess) records the versions, the
plan, each test's seconds, and fails a hanging test by its per-test alarm, by name."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "benchmarks"))

from _failures import scope  # noqa: E402
from gpu_check import (  # noqa: E402
    CUT,
    ESTIMATES_S,
    LIBRARIES,
    MARGIN_S,
    UNIT_TESTS,
    minimum_transformers,
    not_replayed,
    plan,
    transformers_refused,
)

ALL = ["machine", "kernel", "paper", "smoke", "stages", "tests"]


def _used_s(planned: dict) -> float:
    """What a plan can take at most: the run-to-end parts' estimates, the cut parts' limits, the margin."""
    return planned["margin_s"] + sum(
        p["limit_s"] if p["limit_s"] is not None else p["estimate_s"] for p in planned["parts"].values()
    )


def test_the_plan_fits_the_parts_into_the_budget_and_names_what_it_left_out():
    fits = plan(["machine", "kernel", "smoke", "tests"], 540)
    assert fits["left_out"] == [] and list(fits["parts"]) == ["machine", "kernel", "smoke", "tests"]
    assert fits["parts"]["kernel"] == {"estimate_s": ESTIMATES_S["kernel"], "limit_s": None}
    for part in set(CUT) & set(fits["parts"]):  # the time over is shared: each gets at least its estimate
        assert fits["parts"][part]["limit_s"] >= ESTIMATES_S[part]
    assert plan(ALL, 540)["left_out"] == ["paper"]  # the timings give way to the checks
    assert plan(ALL, 540)["parts"]["stages"]["limit_s"] >= 60  # the stage replays get what is left
    for budget in range(0, 1200, 7):
        planned = plan(ALL, budget)
        assert set(planned["parts"]) | set(planned["left_out"]) == set(ALL)
        assert not planned["parts"] or _used_s(planned) <= budget, planned


def test_a_budget_too_small_for_every_part_leaves_out_the_least_needed_first():
    planned = plan(["machine", "kernel", "smoke", "tests"], 200)
    assert planned["left_out"] == ["smoke", "kernel"]
    assert planned["parts"]["tests"]["limit_s"] == 200 - MARGIN_S - ESTIMATES_S["machine"]
    assert plan(["machine", "tests"], 60)["left_out"] == ["tests"]  # under a minute it would say too little
    assert plan(["machine", "kernel", "smoke", "tests"], 10) == {
        "budget_s": 10,
        "margin_s": MARGIN_S,
        "parts": {},
        "left_out": ["machine", "tests", "smoke", "kernel"],
    }


def test_an_older_transformers_is_refused_naming_its_version_and_why():
    minimum = minimum_transformers()
    assert re.search(rf'"transformers\s*>=\s*{re.escape(minimum)}', (REPO / "pyproject.toml").read_text())
    assert transformers_refused(minimum, minimum) is None
    refused = transformers_refused("5.17.0", "5.23")
    assert "5.17.0" in refused and "5.23" in refused and "soft-capping" in refused and "Gemma 2" in refused


def test_the_tests_part_names_tests_that_exist():
    for entry in UNIT_TESTS:
        path, _, name = entry.partition("::")
        assert (REPO / path).exists(), entry
        assert not name or re.search(rf"^def {name}\(", (REPO / path).read_text(), re.M), entry


def test_the_family_matrix_goes_to_the_workers_one_family_at_a_time():
    matrix = "tests/unit/models/test_families.py"
    assert scope(f"{matrix}::test_a[llama]") == scope(f"{matrix}::test_b[llama]") != scope(f"{matrix}::test_a[gpt2]")
    assert scope(f"{matrix}::test_unparametrized") == f"{matrix}::test_unparametrized"
    other = "tests/unit/phases/test_head_ablation.py::test_ssm_heads[mamba]"
    assert scope(other) == other


def test_the_check_on_the_cpu_records_versions_plan_durations_and_a_hang_by_name(tmp_path):
    tests = tmp_path / "test_two.py"
    tests.write_text(
        "import os, time\n"
        "def test_ok():\n"
        "    assert os.environ['GNA_SSM_KERNEL'] == 'torch' and os.environ['GNA_TEST_DEVICE'] == 'cpu'\n"
        "def test_hangs(): time.sleep(600)\n"
    )
    out = tmp_path / "check.json"
    cmd = [sys.executable, "benchmarks/gpu_check.py", "--device", "cpu", "--parts", "machine,tests"]
    cmd += ["--tests", str(tests), "--budget", "120", "--test-alarm", "5", "--out", str(out)]
    start = time.monotonic()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert time.monotonic() - start < 120
    assert "of the 120-s budget" in proc.stdout and "left out to fit: nothing" in proc.stdout
    result = json.loads(out.read_text())
    assert all(result["machine"][name] for name in ("torch", "transformers", "tokenizers", "numpy", "python"))
    assert set(LIBRARIES) <= set(result["machine"])
    assert result["plan"]["budget_s"] <= 120 and result["plan"]["left_out"] == []
    assert set(result["plan"]["parts"]) == {"machine", "tests"} and result["tests"]["limit_s"] > 5
    part = result["tests"]
    assert (part["passed"], part["failed"]) == (1, 1), part
    [hang] = part["failures"]
    assert hang["test"].endswith("test_hangs") and "per-test alarm" in hang["message"]
    seconds = {d["test"].split("::")[-1]: d["s"] for d in part["durations"]}
    assert set(seconds) == {"test_ok", "test_hangs"} and 4 < seconds["test_hangs"] < 30


def test_a_file_of_a_job_not_replayed_is_not_a_difference_but_a_failed_jobs_is():
    from gna.core.replay import job_label, read_plan

    jobs = read_plan(REPO / "tests" / "data" / "smoke_plan.json")["jobs"]
    by_rule = {job["rule"]: job for job in jobs}
    skipped, failed = by_rule["lm_eval_crosscheck"], by_rule["collect_baseline"]
    names = [p.removeprefix("data/") for job in (skipped, failed) for p in job["output"]["items"]]
    files = dict.fromkeys(names, "missing") | {"results/other.parquet": "bit for bit"}
    records = [{"label": job_label(skipped), "status": "skipped"}, {"label": job_label(failed), "status": "failed"}]
    marked = not_replayed(files, records, jobs)
    assert marked[names[0]] == "not replayed" and marked[names[1]] == "missing"
    assert marked["results/other.parquet"] == "bit for bit" and files[names[0]] == "missing"
