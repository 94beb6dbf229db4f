"""The whole DAG on config/smoke.yaml (tiny random model, 16-question MMLU fixture), run by the
real Snakemake CLI in a temporary working directory, plus incremental-rerun and bad-input checks."""

import base64
import copy
import json
import os
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import polars as pl
import pytest
import yaml
from conftest import REPO, SMOKE, SNAKEMAKE, planned_jobs, smk, snakemake_cli
from golden import compare, cpu_kind


def planned_jobs_of(proc):
    return planned_jobs(proc.stdout + proc.stderr)


pytestmark = [pytest.mark.workflow, pytest.mark.slow]  # Snakemake: minutes


def smoke_config() -> dict:
    """A fresh, editable copy of the smoke config."""
    return copy.deepcopy(SMOKE)


def fails_before_any_job(workdir: Path, config: dict, *args: str) -> str:
    """Run with a bad config; it must fail without creating any output. Returns the output text."""
    proc = smk(workdir, *args, config=config, check=False)
    assert proc.returncode != 0
    assert not (workdir / "data").exists()
    return proc.stderr + proc.stdout


def test_smoke_run_writes_results_and_report(smoke):
    baseline = pl.read_parquet(smoke / "data/results/baseline.parquet")
    ours = baseline.filter(pl.col("engine") == "gna")
    assert set(ours["task"]) == {"kv_retrieval", "mmlu_letter", "mmlu_cloze", "facts_cloze", "facts_choice"}
    assert set(ours.filter(pl.col("task") == "kv_retrieval")["group"]) == {"3", "6", "all"}
    # the facts: cloze per relation, multiple choice split into the model's known and unknown items
    assert set(ours.filter(pl.col("task") == "facts_cloze")["group"]) == {
        "capital",
        "continent",
        "demonym",
        "symbol",
        "all",
    }
    choice = ours.filter((pl.col("task") == "facts_choice") & (pl.col("metric") == "acc"))
    n = dict(zip(choice["group"], choice["n"]))
    assert set(n) <= {"known", "unknown", "all"} and n["all"] == 8 and n.get("known", 0) + n.get("unknown", 0) == 8
    # the development split: cloze and the two compared forms; the evaluation split: the two draws of the own form
    assert pl.read_parquet(smoke / "data/results/facts/tiny-llama/formats.parquet").height == 5
    acc = ours.filter(pl.col("metric") == "acc")["value"]
    assert ((acc >= 0) & (acc <= 1)).all()
    # the lm-eval cross-check scores the same letter items as our engine, so accuracies agree
    ours_letter = ours.filter(
        (pl.col("task") == "mmlu_letter") & (pl.col("metric") == "acc") & (pl.col("group") == "all")
    )
    cross = baseline.filter((pl.col("task") == "gna_mmlu_letter") & (pl.col("metric") == "acc"))
    assert len(cross) == 1 and cross["value"][0] == pytest.approx(ours_letter["value"][0])
    html = (smoke / "data/report/index.html").read_text()
    for needle in (
        "gna smoke run",
        "tiny-llama",
        "Template: <b>lookup</b>",
        "KV-retrieval",
        "letter",
        "Cross-check with lm-evaluation-harness",
        "data:image/png;base64",
        "code hash",
        "run record",
        "Layer pruning",
        "Minimal model",
        "Individual layer removal",
        "Per-head ablation",
        "Removing the top-k heads (or key/value groups) together",
        "Heads kept in the critical layers",
        "Attribution pre-ranking vs the exact sweep",
        "Gather-and-Aggregate roles",
        "SSM and hybrid students",
        "attention heads kept vs knowledge",
        "layer swap",
        "inference memory",
        "Knowledge vs retrieval",
        "Which multiple-choice form the model can answer",
        "Checkpoint selection and what distillation did",
        "Which SSM parameters distillation moved",
    ):
        assert needle in html, needle
    model_dir = smoke / "data/models/tiny-llama"
    assert {"model.safetensors", "config.json", "tokenizer.json", "gna_source.json"} <= {
        p.name for p in model_dir.iterdir()
    }
    assert not list((smoke / "data").rglob("*.tmp")), "temporary files left behind"
    # every file is in a folder DVC tracks, or in the run's own records (logs, timings)
    from gna.core.sharing import UNTRACKED, tracked_outs

    homes = tracked_outs(REPO / "dvc.yaml") + list(UNTRACKED)
    stray = [
        p
        for p in (smoke / "data").rglob("*")
        if p.is_file() and not any(p.relative_to(smoke).as_posix().startswith(home) for home in homes)
    ]
    assert not stray, stray
    record = (smoke / "data/run/index.html").read_text()
    assert "heads_sweep/tiny-llama" in record and "heads_attribution/tiny-llama" in record and "git commit" in record
    gradual = pl.read_parquet(smoke / "data/results/prune/tiny-llama/gradual.parquet")
    assert set(gradual["layers_kept"]) == {1, 2, 3, 4} and set(gradual["task"]) == set(ours["task"])
    minimal = json.loads((smoke / "data/results/prune/tiny-llama/minimal_model.json").read_text())
    individual = pl.read_parquet(smoke / "data/results/prune/tiny-llama/individual.parquet")
    assert set(individual["removed_layer"]) == {-1, *minimal["kept_layers"]}
    ranking = pl.read_parquet(smoke / "data/results/heads/tiny-llama/ranking.parquet")
    assert len(ranking) == 16 and sorted(ranking["rank"]) == list(range(1, 17))
    topk = pl.read_parquet(smoke / "data/results/heads/tiny-llama/topk.parquet")
    assert set(topk["k"]) == {0, 1, 2, 4} and set(topk["condition"]) == {"top", "random"}
    # distilled students are model folders (load_any loads them like any other model)
    from gna.students.mixer import mixers
    from gna.students.spec import load_any

    student, _ = load_any(smoke / "data/models/tiny-llama-hybrid-k2-n8")
    kept = {(m.layer_idx, h) for m in mixers(student) for h in m.attention_heads}
    assert kept == {tuple(x) for x in ranking.sort("rank").select("layer", "head").head(2).rows()}
    scores = pl.concat([pl.read_parquet(p) for p in (smoke / "data/results/hybrid/tiny-llama").glob("k*.parquet")])
    assert set(scores["variant"]) == {"k0-n8", "k2-n8", "k0-n4"}
    assert {"kv_retrieval", "mmlu_letter", "mmlu_cloze", "heldout"} <= set(scores["task"])
    student_roles = pl.read_parquet(smoke / "data/results/gna/tiny-llama-hybrid-k2-n8/roles.parquet")
    assert student_roles.filter(pl.col("kind") == "attention").height == 2 and student_roles.height == 16
    answer_rows = pl.read_parquet(smoke / "data/results/hybrid/tiny-llama/answer-rows-k2-n8.parquet")
    assert set(answer_rows["condition"]) == {"unmodified", "attention answer rows masked"}
    memory = pl.read_parquet(smoke / "data/results/hybrid/tiny-llama/memory.parquet")
    measured = memory.filter(pl.col("source") == "measured")
    assert measured["total_bytes"][0] == measured["formula_bytes"][0]
    budget = pl.read_parquet(smoke / "data/results/hybrid/tiny-llama/budget-k2-n8.parquet")
    assert sorted(set(budget["kd_steps"])) == [0, 1, 2] and set(budget["group"]) == {"3", "all"}
    ablations = [
        pl.read_parquet(smoke / f"data/results/hybrid/tiny-llama/ablation-{a}.parquet")
        for a in ("no_first_token", "small_corpus")
    ]
    assert [set(a["ablation"]) for a in ablations] == [{"no_first_token"}, {"small_corpus"}]


def report_object(html: str, name: str):
    """The JSON object Snakemake's HTML report embeds as `<script id="NAME"> var NAME = {...};`
    (results: {path: {filename, caption, mime_type, data_uri, job_properties, ...}}; categories:
    {category: {subcategory: [path, ...]}})."""
    start = re.search(rf'<script id="{name}">\s*var {name} = ', html)
    assert start, f"no {name} in the Snakemake report"
    value, _ = json.JSONDecoder().raw_decode(html, start.end())
    return value


class _TextOf(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.parts = []

    def handle_data(self, data):
        self.parts.append(data)


def html_text(fragment: str) -> str:
    """The text of an HTML fragment: tags dropped, entities decoded, whitespace collapsed."""
    parser = _TextOf()
    parser.feed(fragment)
    parser.close()
    return " ".join("".join(parser.parts).split())


def rst_caption_text(rst: str) -> str:
    """The text a caption's RST renders to: inline literals (``x``) and emphasis (*x*, **x**)
    without their markers, whitespace collapsed."""
    text = re.sub(r"``(.+?)``", r"\1", rst, flags=re.S)
    text = re.sub(r"\*\*(.+?)\*\*|\*(.+?)\*", lambda m: m.group(1) or m.group(2), text, flags=re.S)
    return " ".join(text.split())


def is_output(key: str, path: str) -> bool:
    """Whether a path in Snakemake's report names the workflow output `path`."""
    return key == path or key.endswith("/" + path)


def report_entry(results: dict, path: str) -> dict:
    """The one result of Snakemake's report for the output `path` (keys are output paths)."""
    keys = [key for key in results if is_output(key, path)]
    assert len(keys) == 1, f"{path}: {keys} among {sorted(results)}"
    return results[keys[0]]


def test_snakemake_report_renders_every_figure_with_its_caption(smoke):
    """Snakemake's own report (--report) holds every figure of the registry
    (gna.report.registry.FIGURES) and no other image: each embedded byte for byte as the PNG the
    report rule wrote, from the report rule, under its category, with the text of its caption
    (rules/captions/<figure>.rst) rendered."""
    from gna.report.registry import FIGURES

    out = smoke / "snakemake-report.html"
    smk(smoke, "--report", str(out))
    html = out.read_text()
    results, categories = report_object(html, "results"), report_object(html, "categories")
    images = [key for key, entry in results.items() if entry["mime_type"] == "image/png"]
    assert len(images) == len(FIGURES) == len({f.name for f in FIGURES}), images
    for figure in FIGURES:
        entry = report_entry(results, figure.path)
        assert entry["filename"] == f"{figure.name}.png" and entry["job_properties"]["rule"] == "report", entry
        header, _, payload = entry["data_uri"].partition(";base64,")
        assert header.startswith("data:image/png") and payload, (figure.name, header)
        assert base64.b64decode(payload) == (smoke / figure.path).read_bytes(), figure.name
        in_category = [p for paths in categories[figure.category].values() for p in paths]
        assert sum(is_output(p, figure.path) for p in in_category) == 1, (figure.name, figure.category)
        caption = rst_caption_text((REPO / figure.caption_file).read_text())
        assert caption and html_text(entry["caption"]) == caption, (figure.name, entry["caption"][:500])


def test_second_dry_run_has_nothing_to_do(smoke):
    assert planned_jobs_of(smk(smoke, "-n")) == {}


def _reversed_keys(value):
    if isinstance(value, dict):
        return {key: _reversed_keys(value[key]) for key in reversed(list(value))}
    return [_reversed_keys(v) for v in value] if isinstance(value, list) else value


def test_the_same_config_in_another_key_order_and_style_reruns_nothing(smoke):
    """Params compare by content: the smoke run's config (written with sorted keys) written again
    with every mapping's keys reversed, in flow style with other line breaks, plans no job."""
    work = smoke / "reordered.yaml"
    work.write_text(
        yaml.dump(
            _reversed_keys(smoke_config()), sort_keys=False, default_flow_style=True, explicit_start=True, width=60
        )
    )
    proc = snakemake_cli(
        ["--snakefile", str(REPO / "Snakefile"), "--directory", str(smoke), "--configfile", str(work), "-n"], cwd=REPO
    )
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert planned_jobs_of(proc) == {}, proc.stdout[-2000:]
    work.unlink()


def test_the_snakefile_parses_without_torch(tmp_path):
    """Every Snakemake start parses the Snakefile (each dry run, each SLURM job): it imports no torch
    (1.4 s of a 3 s parse on 2 cores); the rules' scripts import it when they run."""
    cfg_path = tmp_path / "config.yaml"
    cfg_path.write_text(yaml.safe_dump(SMOKE))
    code = (
        "import sys, snakemake.cli\n"
        "try:\n    snakemake.cli.main(sys.argv[1:])\nexcept SystemExit as stop:\n    assert not stop.code\n"
        "print('torch imported:', 'torch' in sys.modules)"
    )
    args = ["--snakefile", str(REPO / "Snakefile"), "--directory", str(tmp_path), "--configfile", str(cfg_path), "-n"]
    proc = subprocess.run([sys.executable, "-c", code, *args], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert planned_jobs_of(proc)["baseline"] == 5
    assert "torch imported: False" in proc.stdout, proc.stdout[-500:]


def test_report_only_edit_reruns_only_the_report(smoke):
    cfg = smoke_config()
    cfg["report"]["title"] = "a new title"
    assert planned_jobs_of(smk(smoke, "-n", config=cfg)) == {"report": 1, "all": 1}


def test_task_size_edit_reruns_only_dependents(smoke):
    cfg = smoke_config()
    cfg["tasks"]["kv_retrieval"]["sizes"] = [3, 6, 8]
    assert planned_jobs_of(smk(smoke, "-n", config=cfg)) == {
        "kv_task": 1,
        "baseline": 1,
        "collect_baseline": 1,
        "prune_gradual": 1,
        "minimal_model": 1,
        "prune_individual": 1,
        "heads_topk": 1,
        "heads_kept": 1,
        "distill_corpus_check": 1,
        "hybrid_score": 4,
        "hybrid_swap": 1,
        "hybrid_answer_rows": 1,
        "hybrid_budget": 2,
        "hybrid_ablation": 3,
        "hybrid_comparisons": 1,
        "report": 1,
        "gna_masking": 2,
        "all": 1,
    }
    # the corpus is checked again against the new items; nothing is distilled again; the students'
    # masking reads condition (a) of the knowledge tasks from their answers, which hold the KV rows too


def test_prompt_set_edit_reruns_only_its_readers(smoke):
    """Each phase's KV prompts are their own data/tasks artifact: the masking's count rebuilds that set
    and reruns the masking of the teacher and of the students, and nothing that reads another set."""
    cfg = smoke_config()
    cfg["gna"]["masking_n"] = 5
    assert planned_jobs_of(smk(smoke, "-n", config=cfg)) == {"kv_task": 1, "gna_masking": 3, "report": 1, "all": 1}
    cfg = smoke_config()
    cfg["heads"]["sweep_n"] = 5  # the sweep's prompts: the sweep, its attribution, and all that reads the ranking
    planned = planned_jobs_of(smk(smoke, "-n", config=cfg))
    assert planned["kv_task"] == 1 and planned["heads_sweep"] == 1 and planned["heads_attribution"] == 1
    assert "baseline" not in planned and "prune_gradual" not in planned


def test_checkpoint_selection_prompts_are_their_own_and_never_evaluation_items(smoke):
    """The students' validation prompts (hybrid.validation) are a data/tasks artifact that shares no
    prompt with the evaluation set; every student names the step it was taken at and its validation
    curve marks that step; editing how often it is scored reruns KD, not the teacher file or alignment."""
    data = smoke / "data"
    validation = pl.read_parquet(data / "tasks/prompts/kd_validation.parquet")
    evaluation = pl.read_parquet(data / "tasks/kv_retrieval.parquet")
    assert len(validation) == smoke_config()["hybrid"]["validation"]["n"]
    assert not set(validation["context"]) & set(evaluation["context"])
    assert json.loads((data / "distill/corpus-check.json").read_text())["validation_kv_prompts"] == len(validation)
    for student in sorted((data / "models").glob("tiny-llama-hybrid-*")):
        spec = json.loads((student / "gna_hybrid.json").read_text())
        curve = pl.read_parquet(data / f"distill/tiny-llama/kd-{spec['variant']}-validation.parquet")
        assert curve.filter(pl.col("chosen"))["after_steps"].to_list() == [spec["chosen_step"]], student.name
    cfg = smoke_config()
    cfg["hybrid"]["validation"]["every"] = 2
    planned = planned_jobs_of(smk(smoke, "-n", config=cfg))
    assert planned["distill_kd"] == 3 and not {"distill_teacher", "distill_align", "kv_task"} & set(planned), planned
    cfg = smoke_config()
    cfg["hybrid"]["realign"]["lr"] = 0.01  # realignment is per student: KD and the ablations that realign
    planned = planned_jobs_of(smk(smoke, "-n", config=cfg))
    assert planned["distill_kd"] == 3 and not {"distill_teacher", "distill_align"} & set(planned), planned


def test_batch_size_edit_reruns_the_rules_that_batch_and_not_the_teachers_distillation_files(smoke):
    """eval.batch_size reaches every rule that batches through its Evaluation settings, but not the
    rules that do not (the teacher's distillation file, alignment): they are not computed again.
    KD and the G&A roles rerun as readers of the head sweep's ranking, which batches."""
    cfg = smoke_config()
    cfg["eval"]["batch_size"] = 3
    planned = planned_jobs_of(smk(smoke, "-n", config=cfg))
    assert planned["baseline"] == 5 and planned["heads_sweep"] == 1 and planned["hybrid_score"] == 4
    assert not {"distill_teacher", "distill_align", "prepare_model", "kv_task"} & set(planned), planned


def test_state_size_edit_reruns_only_the_affected_variants(smoke):
    cfg = smoke_config()
    cfg["hybrid"]["state_sizes"] = [4, 6]  # 8 stays as the heads-kept sweep's size; 6 replaces nothing else
    assert planned_jobs_of(smk(smoke, "-n", config=cfg)) == {
        "distill_align": 1,
        "distill_kd": 1,
        "hybrid_score": 1,
        "hybrid_memory": 1,
        "hybrid_comparisons": 1,  # the students compared again, the new one among them
        "report": 1,
        "all": 1,
    }


def test_top_k_edit_reruns_only_the_top_k_table(smoke):
    cfg = smoke_config()
    cfg["heads"]["top_k"] = [0, 1, 3]
    assert planned_jobs_of(smk(smoke, "-n", config=cfg)) == {"heads_topk": 1, "report": 1, "all": 1}


def test_minimal_fraction_edit_reruns_only_individual_removal(smoke):
    cfg = smoke_config()
    cfg.setdefault("prune", {})["minimal_fraction"] = 0.5
    assert planned_jobs_of(smk(smoke, "-n", config=cfg)) == {
        "minimal_model": 1,
        "prune_individual": 1,
        "heads_kept": 1,
        "report": 1,
        "all": 1,
    }


def test_rerun_after_edit_then_nothing_to_do(tmp_path, smoke):
    # a real (not dry) rerun on a copy, of one output of the edit's dependents (the dry run above
    # lists them all): the job runs, records the new setting, and the output is then up to date
    work = tmp_path / "copy"
    shutil.copytree(smoke, work, symlinks=True)
    target = "data/results/prune/tiny-llama/minimal_model.json"
    before = json.loads((work / target).read_text())
    cfg = smoke_config()
    cfg.setdefault("prune", {})["minimal_fraction"] = 0.5
    log = smk(work, target, config=cfg)
    ran = set(re.findall(r"^(?:local)?rule (\w+):", log.stderr + log.stdout, re.M))
    assert ran == {"minimal_model"}, ran
    assert planned_jobs_of(smk(work, "-n", target, config=cfg)) == {}
    rest = {"prune_individual": 1, "heads_kept": 1, "report": 1, "all": 1}
    assert planned_jobs_of(smk(work, "-n", config=cfg)) == rest
    after = json.loads((work / target).read_text())
    assert after != before


def test_a_phase_missing_from_an_existing_run_is_scheduled(tmp_path, smoke):
    """As after an upgrade that adds a phase: its results are missing while the report exists."""
    work = tmp_path / "copy"
    shutil.copytree(smoke, work, symlinks=True)
    shutil.rmtree(work / "data/results/gna")
    # the teacher and the two students of hybrid.gna_variants
    assert planned_jobs_of(smk(work, "-n")) == {"gna_roles": 3, "gna_masking": 3, "report": 1, "all": 1}


def test_bad_config_fails_before_any_job(tmp_path):
    cfg = smoke_config()
    cfg["tasks"]["kv_retrieval"]["sizez"] = [3]
    assert "config key 'tasks.kv_retrieval.sizez' is not allowed" in fails_before_any_job(tmp_path, cfg)


def test_unknown_model_source_names_allowed_values(tmp_path):
    cfg = smoke_config()
    cfg["models"]["tiny-llama"]["source"] = "s3"
    assert (
        "models.tiny-llama.source': 's3' is not allowed; allowed values: pypi-file, hf, local, tiny-random"
        in fails_before_any_job(tmp_path, cfg, "-n")
    )


def test_missing_local_file_is_named_before_any_job(tmp_path):
    cfg = smoke_config()
    cfg["tasks"]["mmlu"]["data"]["path"] = "tests/data/no_such_mmlu.jsonl"
    assert "no_such_mmlu.jsonl" in fails_before_any_job(tmp_path, cfg)


def test_a_device_as_local_source_is_named_before_any_job(tmp_path):
    """/dev/zero as the MMLU file kept a job reading at 100% CPU forever."""
    cfg = smoke_config()
    cfg["tasks"]["mmlu"]["data"]["path"] = "/dev/zero"
    assert (
        "config key 'tasks.mmlu.data.path': /dev/zero is neither a regular file nor a folder"
        in fails_before_any_job(tmp_path, cfg, "-n")
    )


def test_checksum_mismatch_fails_that_job_and_leaves_no_output(tmp_path):
    cfg = smoke_config()
    cfg["tasks"]["mmlu"]["data"]["sha256"] = "0" * 64
    proc = smk(tmp_path, "--until", "mmlu_task", config=cfg, check=False)
    assert proc.returncode != 0
    log = "".join(p.read_text() for p in (tmp_path / "data/logs/mmlu_task").glob("*.log"))
    assert "checksum mismatch for" in log and "mini_mmlu.jsonl" in log
    assert not list((tmp_path / "data/tasks").glob("mmlu_*.parquet"))


def test_relative_local_model_path_is_read_from_the_workflow_folder_under_directory(tmp_path):
    """README: relative paths in the config are relative to the workflow folder, also when the
    run's working folder is elsewhere (`snakemake --directory`)."""
    from gna.models.prepare import load_model, prepare_model

    prepare_model("source", SMOKE["models"]["tiny-llama"], tmp_path / "source")
    cfg = smoke_config()
    cfg["models"] = {"mine": {"source": "local", "path": os.path.relpath(tmp_path / "source", REPO)}}
    smk(tmp_path / "work", "data/models/mine", config=cfg)
    assert (
        load_model(tmp_path / "work/data/models/mine")[0].config.num_hidden_layers
        == load_model(tmp_path / "source")[0].config.num_hidden_layers
    )


def test_slurm_profile_dry_run_without_slurm(tmp_path):
    cfg_path = tmp_path / "config.yaml"
    cfg_path.write_text(yaml.safe_dump(SMOKE))
    proc = snakemake_cli(
        [
            *("--snakefile", str(REPO / "Snakefile"), "--directory", str(tmp_path), "--configfile", str(cfg_path)),
            *("--profile", str(REPO / "profiles/slurm"), "-n"),
        ],
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert planned_jobs_of(proc)["baseline"] == 5  # KV, MMLU letter and cloze, facts cloze and choice


def test_unknown_student_is_named_before_any_job(tmp_path):
    """One of the config's cross-key checks through the workflow (every one: tests/unit/core/test_config.py)."""
    cfg = smoke_config()
    cfg["hybrid"]["gna_variants"] = ["k3-n8"]
    message = "config key 'hybrid.gna_variants': ['k3-n8'] are not students of this config"
    assert message in fails_before_any_job(tmp_path, cfg)


def test_every_tracked_output_records_the_md5_the_job_wrote(smoke):
    """make reproduce's guard trusts data/run/written/: every file under a DVC-tracked output of
    the smoke run has the record its job left (gna.core.runtime.setup(outputs=...)), with the md5
    the file has now. (Snakemake's own .snakemake_timestamp markers of folder outputs aside.)"""
    from gna.core.guard import file_md5, written_md5

    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    outs = [next(iter(out)) if isinstance(out, dict) else out for stage in stages.values() for out in stage["outs"]]
    root = smoke.resolve()
    files = [
        f
        for out in outs
        for f in ([root / out] if (root / out).is_file() else sorted((root / out).rglob("*")))
        if f.is_file() and f.name != ".snakemake_timestamp"
    ]
    assert len(files) > 100, files  # every phase's outputs, the students and the report among them
    unrecorded = [str(f.relative_to(root)) for f in files if written_md5(root, f) != file_md5(f)]
    assert not unrecorded, f"outputs without the record of the job that wrote them: {unrecorded}"


def test_smoke_results_equal_golden(smoke):
    try:
        compare(smoke / "data", kind=cpu_kind())  # the run was made on this machine
    except AssertionError as error:
        raise AssertionError(
            f"{error}\nThe smoke results differ from tests/data/smoke_results. If the change is "
            "intended, refresh them with `make smoke-golden` (python tests/golden.py refresh) "
            "and commit tests/data/smoke_results."
        ) from None


@pytest.mark.slow
def test_library_edit_reruns_exactly_the_rules_that_import_it(tmp_path, smoke):
    """Dry runs with the gna package taken from an edited copy (PYTHONPATH): a code edit in a module
    plans the rules whose scripts import it, directly or through other modules, and what depends on
    them; a docstring or comment edit plans nothing."""
    src = tmp_path / "src"
    shutil.copytree(REPO / "src", src, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    env = {**os.environ, "PYTHONPATH": str(src)}
    found = subprocess.run(
        [sys.executable, "-c", "import gna; print(gna.__file__)"],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert found == str(src / "gna" / "__init__.py")
    cfg_path = tmp_path / "config.yaml"  # the smoke folder's config.yaml is rewritten by other tests
    cfg_path.write_text(yaml.safe_dump(SMOKE))
    cmd = SNAKEMAKE + [
        "--snakefile",
        str(REPO / "Snakefile"),
        "--directory",
        str(smoke),
        "--configfile",
        str(cfg_path),
        "--cores",
        "2",
        "-n",
    ]
    proc = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0 and planned_jobs_of(proc) == {}, proc.stderr[-3000:]
    checks = {
        "page": lambda jobs: jobs == {"report": 1, "all": 1},
        "head_ablation": lambda jobs: (
            "heads_sweep" in jobs and not {"baseline", "prune_gradual", "distill_teacher"} & set(jobs)
        ),
        "stack": lambda jobs: {"baseline", "prune_gradual", "heads_sweep", "hybrid_score"} <= set(jobs),
    }
    # a docstring and a comment in the module nearly every rule runs: no change in what runs
    stack = next(src.rglob("stack.py"))
    original = stack.read_text()
    stack.write_text(original.replace('"""', '"""Edited. ', 1) + "# a comment\n")
    proc = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True)
    stack.write_text(original)
    assert proc.returncode == 0 and planned_jobs_of(proc) == {}, proc.stderr[-3000:]
    for name, check in checks.items():
        module = next(src.rglob(f"{name}.py"))
        original = module.read_text()
        module.write_text(original + "EDITED = 1\n")
        proc = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True)
        module.write_text(original)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert check(planned_jobs_of(proc)), (name, planned_jobs_of(proc))


def test_knowledge_tasks_score_only_the_students_of_knowledge_heads_kept(tmp_path):
    """hybrid.knowledge_heads_kept: the heads-kept sweep's other students are scored on KV retrieval
    only, and a student's masking reads condition (a) from its own answers where they hold the
    knowledge tasks (dry run: the planned jobs' inputs)."""
    cfg = smoke_config()
    cfg["hybrid"]["knowledge_heads_kept"] = [0]
    targets = [
        "data/results/hybrid/tiny-llama/k0-n8.parquet",
        "data/results/hybrid/tiny-llama/k2-n8.parquet",
        *[f"data/results/gna/tiny-llama-hybrid-{v}/masking.parquet" for v in ("k0-n8", "k2-n8")],
    ]
    text = smk(tmp_path, "-n", *targets, config=cfg).stdout
    inputs = {}
    for block in text.split("\nrule ")[1:]:
        lines = dict(line.strip().split(": ", 1) for line in block.splitlines()[1:] if ": " in line)
        if "output" in lines:
            inputs[lines["output"].split(", ")[0]] = lines.get("input", "").split(", ")
    tasks = {"kv_retrieval", "mmlu_letter", "mmlu_cloze", "facts_cloze", "facts_choice"}

    def tasks_of(output):
        return {Path(p).stem for p in inputs[output] if "/tasks/" in p}

    assert tasks_of(targets[0]) == tasks
    assert tasks_of(targets[1]) == {"kv_retrieval"}
    assert "data/results/hybrid/tiny-llama/answers/k0-n8.parquet" in inputs[targets[2]]
    assert not any("/answers/" in p for p in inputs[targets[3]])


def test_a_project_moved_as_a_whole_reruns_nothing(tmp_path):
    """Snakemake records inputs and params as written: a config path resolved to an absolute one
    (the local MMLU and facts files, the lm-eval cross-check's task, the report's workflow folder)
    reran every rule reading it once the project was moved. The workflow, its config and its data
    in one folder, the task rules run, the folder renamed: a dry run there plans nothing."""
    project = tmp_path / "here"
    for part in ("Snakefile", "dvc.yaml", "rules", "workflow_scripts", "config", "tests/data"):
        copy = shutil.copytree if (REPO / part).is_dir() else shutil.copy2
        (project / part).parent.mkdir(parents=True, exist_ok=True)
        copy(REPO / part, project / part)
    cfg = smoke_config()
    cfg["lm_eval"]["crosscheck_mmlu"] = True
    (project / "config.yaml").write_text(yaml.safe_dump(cfg))
    targets = ["data/tasks/mmlu_letter.parquet", "data/tasks/facts_cloze.parquet", "data/tasks/lmeval_crosscheck"]

    def run(where: Path, *args: str) -> subprocess.CompletedProcess:
        cmd = ["--snakefile", str(where / "Snakefile"), "--directory", str(where), "--configfile", "config.yaml"]
        proc = snakemake_cli([*cmd, "--cores", "1", *args, *targets], cwd=where)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        return proc

    run(project)
    assert planned_jobs_of(run(project, "-n")) == {}
    moved = tmp_path / "elsewhere" / "there"
    moved.parent.mkdir()
    project.rename(moved)
    assert planned_jobs_of(run(moved, "-n")) == {}
