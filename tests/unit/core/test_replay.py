"""gna.core.replay: the recorded smoke plan is the workflow's own, and replaying it runs the jobs'
scripts as Snakemake does (same results, failures contained)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from golden import cpu_kind, outcomes

from gna.core.replay import Names, Rules, job_label, read_plan, record_plan, replay, write_plan

REPO = Path(__file__).resolve().parents[3]
PLAN = REPO / "tests" / "data" / "smoke_plan.json"
# the first jobs of the smoke config: inputs, the model and the teacher's baseline scores
EARLY_RULES = {"fetch_facts", "kv_task", "mmlu_task", "facts_task", "prepare_model", "baseline", "facts_known"}


@pytest.mark.slow
def test_smoke_plan_is_the_workflows(tmp_path):
    recorded = json.loads(json.dumps(record_plan(REPO / "config" / "smoke.yaml", tmp_path / "work")))
    assert recorded == read_plan(PLAN), (
        "the smoke config's jobs differ from tests/data/smoke_plan.json (gpu_check replays it): "
        "refresh it with `make smoke-plan`"
    )
    assert {job["rule"] for job in recorded["jobs"]} >= EARLY_RULES | {"report", "distill_kd", "hybrid_score"}
    assert str(REPO) not in PLAN.read_text(), "the plan holds this checkout's path: it must run from any folder"


def test_names_read_like_snakemakes():
    names = Names({"items": ["a", "b", "c", "d"], "names": {"model": [0, None], "tables": [1, 3]}})
    assert names.model == "a" and list(names.tables) == ["b", "c"] and names[3] == "d" and list(names) == list("abcd")
    assert [(k, v if isinstance(v, str) else list(v)) for k, v in names.items()] == [
        ("model", "a"),
        ("tables", ["b", "c"]),
    ]


def early_plan(tmp_path: Path, edit=None) -> Path:
    plan = read_plan(PLAN)
    plan["jobs"] = [job for job in plan["jobs"] if job["rule"] in EARLY_RULES]
    if edit:
        edit(plan)
    path = tmp_path / "plan.json"
    write_plan(plan, path)
    return path


@pytest.mark.slow
def test_replayed_jobs_give_the_golden_results(tmp_path):
    """The KV table, the model and its KV baseline, replayed (the smoke workflow test runs them all)."""

    def kv_only(plan):
        wanted = {"kv_task[kv_set=kv_retrieval]", "baseline[model=tiny-llama, task=kv_retrieval]"}
        plan["jobs"] = [job for job in plan["jobs"] if job["rule"] == "prepare_model" or job_label(job) in wanted]

    results = replay(early_plan(tmp_path, kv_only), tmp_path / "work", parallel=2)
    assert len(results) == 3 and {r["status"] for r in results} == {"ok"}, results
    written = {
        name: outcome
        for name, outcome in outcomes(tmp_path / "work" / "data", kind=cpu_kind()).items()
        if outcome != "missing"
    }
    assert any(name.startswith("results/baseline/") for name in written), written
    # bit for bit where the golden results were recorded on this kind of machine
    assert all(outcome in ("bit for bit", "within 0.0001") for outcome in written.values()), written


def broken_template(param):
    """A kv_task param with its prompt set's template replaced by one that does not exist (the
    prompt set in its settings, or, in a plan recorded before the rule passed settings, itself)."""
    if isinstance(param, dict) and isinstance(param.get("prompts"), dict):
        return {**param, "prompts": broken_template(param["prompts"])}
    return {**param, "template": "no-such-template"} if isinstance(param, dict) and "template" in param else param


@pytest.mark.slow
def test_failed_and_skipped_jobs_stop_their_dependents(tmp_path):
    """A job that fails is reported with its log; the jobs that read its outputs, or a skipped job's,
    are not run; the others run (the task tables alone here: no model is needed)."""

    def break_kv(plan):
        readers = ("baseline[model=tiny-llama, task=kv_retrieval]", "baseline[model=tiny-llama, task=facts_cloze]")
        plan["jobs"] = [
            job
            for job in plan["jobs"]
            if job["rule"] in ("kv_task", "fetch_facts", "facts_task") or job_label(job) in readers
        ]
        for job in plan["jobs"]:
            if job_label(job) == "kv_task[kv_set=kv_retrieval]":
                job["params"]["items"] = [broken_template(p) for p in job["params"]["items"]]
        for job in plan["jobs"]:  # the model is not built here: its baselines wait on what is tested
            if job["rule"] == "baseline":
                job["input"]["items"] = [p for p in job["input"]["items"] if not p.startswith("data/models/")]
                job["input"]["names"] = {"task": [0, None]}

    plan = early_plan(tmp_path, break_kv)
    if not any("no-such-template" in json.dumps(j["params"]) for j in read_plan(plan)["jobs"]):
        pytest.fail("the kv_task job's params hold no template to break")
    results = {r["label"]: r for r in replay(plan, tmp_path / "work", rules=Rules(skip=("facts_task",)), parallel=2)}
    broken = results["kv_task[kv_set=kv_retrieval]"]
    assert broken["status"] == "failed" and "no-such-template" in broken["error"]
    assert results["kv_task[kv_set=prompts/head_sweep]"]["status"] == "ok"
    assert results["baseline[model=tiny-llama, task=kv_retrieval]"]["status"] == "not run"
    assert results["facts_task[facts_fmt=cloze]"]["status"] == "skipped"
    assert results["baseline[model=tiny-llama, task=facts_cloze]"]["status"] == "not run"


def test_gpu_check_names_the_failures_of_a_test_run_cut_off(tmp_path):
    """gpu_check's tests part, on its real path (pytest in a subprocess, xdist workers where
    installed): a run that ends gives counts and messages from its JUnit file; a run its time limit
    cuts off (a device lease ends before the suite does) still names each failed test and keeps
    its message, logged as it failed."""
    import sys

    sys.path.insert(0, str(REPO / "benchmarks"))
    from gpu_check import unit_tests

    tests = tmp_path / "test_four.py"
    tests.write_text(
        "import os, pytest, time\n"
        "def test_ok(): pass\n"
        "def test_bad(): assert 1 == 2, 'one is not two'\n"
        "@pytest.mark.skip(reason='x')\n"
        "def test_skip(): pass\n"
        "def test_slow(): time.sleep(float(os.environ.get('SLOW_S', '0')))\n"
    )
    ended = unit_tests([str(tests)], timeout=120)
    assert (ended["passed"], ended["failed"], ended["skipped"]) == (2, 1, 1), ended
    assert [f["test"].split("::")[-1] for f in ended["failures"]] == ["test_bad"]
    assert "one is not two" in ended["failures"][0]["message"]
    os.environ["SLOW_S"] = "600"
    try:
        cut = unit_tests([str(tests)], timeout=20)
    finally:
        del os.environ["SLOW_S"]
    assert "timed_out" in cut and (cut["passed"], cut["failed"], cut["skipped"]) == (1, 1, 1), cut
    assert [name.split("::")[-1] for name in cut["failed_tests"]] == ["test_bad"]
    assert [f["test"].split("::")[-1] for f in cut["failures"]] == ["test_bad"]
    assert "one is not two" in cut["failures"][0]["text"]


def test_only_the_named_rules_run_the_others_given_and_a_missing_given_input_is_named(tmp_path):
    """Rules(only=...): the KV table task runs, the other rules are given; a job of the named rule whose
    given input is missing is not run and names the file; a skipped rule wins over only."""

    def kv_and_its_baseline(plan):
        wanted = {"kv_task[kv_set=kv_retrieval]", "baseline[model=tiny-llama, task=kv_retrieval]"}
        plan["jobs"] = [job for job in plan["jobs"] if job["rule"] == "prepare_model" or job_label(job) in wanted]

    plan = early_plan(tmp_path, kv_and_its_baseline)
    results = {r["label"]: r for r in replay(plan, tmp_path / "work", rules=Rules(only=("baseline",)))}
    assert results["kv_task[kv_set=kv_retrieval]"]["status"] == "given"
    assert results["prepare_model[model=tiny-llama]"]["status"] == "given"
    baseline = results["baseline[model=tiny-llama, task=kv_retrieval]"]
    assert baseline["status"] == "not run" and "given inputs missing" in baseline["error"]
    assert "data/tasks/kv_retrieval.parquet" in baseline["error"]
    results = replay(plan, tmp_path / "work2", rules=Rules(only=("baseline",), skip=("baseline",)))
    assert {r["status"] for r in results} == {"given", "skipped"}
