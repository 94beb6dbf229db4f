"""The study's plan from a validated config (gna.workflow.plan): the lists the rules read while the
Snakefile is parsed."""

from pathlib import Path

import pytest
import yaml

from gna.workflow.config import load_schema, validate_config
from gna.workflow.plan import all_results, answer_row_variants, gna_models, hybrid_results, pure_ssm_variant, teachers

REPO = Path(__file__).resolve().parents[3]


def _config(**changes) -> dict:
    raw = yaml.safe_load((REPO / "config" / "smoke.yaml").read_text())
    for dotted, value in changes.items():
        *path, key = dotted.split(".")
        node = raw
        for part in path:
            node = node.setdefault(part, {})
        node[key] = value
    return validate_config(raw, load_schema(REPO / "config" / "schema.yaml"))


def test_teachers_and_gna_models_follow_each_models_skip_list():
    config = _config()
    names = list(config["models"])
    skipping = {m for m, s in config["models"].items() if "hybrid" in s.get("skip", [])}
    assert teachers(config) == [m for m in names if m not in skipping]
    students = [f"{m}-hybrid-{v}" for m in teachers(config) for v in config["hybrid"]["gna_variants"]]
    assert gna_models(config)[-len(students) :] == students
    off = _config(**{"hybrid.enabled": False})
    assert not [m for m in gna_models(off) if "-hybrid-" in m] and hybrid_results(off) == []


def test_every_student_result_is_listed_once_and_the_phase_can_be_left_out():
    config = _config()
    hybrid = config["hybrid"]
    results = hybrid_results(config)
    assert len(results) == len(set(results))
    for model in teachers(config):
        root = f"data/results/hybrid/{model}"
        assert f"{root}/teacher.parquet" in results and f"{root}/comparisons.parquet" in results
        assert {f"{root}/ablation-{a}.parquet" for a in hybrid["ablation"]["remove"]} <= set(results)
        assert {f"{root}/answer-rows-{v}.parquet" for v in answer_row_variants(hybrid)} <= set(results)
    assert all(int(v.split("-")[0][1:]) > 0 for v in answer_row_variants(hybrid))
    assert pure_ssm_variant(hybrid) == f"k0-n{hybrid['state_size']}"
    everything = all_results(config)
    assert everything[0] == "data/results/baseline.parquet" and everything[-len(results) :] == results
    exact = _config(**{"heads.sweep_mode": "exact"})
    assert any(p.endswith("attribution.parquet") for p in all_results(exact))
    assert not any(p.endswith("attribution.parquet") for p in all_results(_config(**{"heads.sweep_mode": "verified"})))


def test_a_model_skipping_prune_has_no_pruning_nor_heads_kept_and_its_own_heads_settings():
    from gna.workflow.plan import model_heads, pruned_models, sweep_prompts

    config = _config()
    name = next(iter(config["models"]))
    base = all_results(config)
    assert f"data/results/prune/{name}/gradual.parquet" in base and f"data/results/heads/{name}/kept.parquet" in base
    assert sweep_prompts(config, name) == ("data/tasks/prompts/head_sweep.parquet", None)
    raw = yaml.safe_load((REPO / "config" / "smoke.yaml").read_text())
    raw["models"][name]["skip"] = ["prune", *raw["models"][name].get("skip", [])]
    raw["models"][name]["overrides"] = {
        "heads": {"sweep_task": "mmlu_letter", "sweep_mode": "verified", "sweep_n": 6, "top_k": [0, 3]}
    }
    own = validate_config(raw, load_schema(REPO / "config" / "schema.yaml"))
    results = all_results(own)
    assert name not in pruned_models(own)
    assert not [p for p in results if f"/prune/{name}/" in p or p.endswith(f"heads/{name}/kept.parquet")]
    assert f"data/results/heads/{name}/topk.parquet" in results
    heads = model_heads(own, name)
    # the model's keys over the section's; the rest from the section
    assert (heads["sweep_n"], heads["top_k"], heads["seed"]) == (6, [0, 3], config["heads"]["seed"])
    assert not any(p.endswith(f"{name}/attribution.parquet") for p in results)  # verified: nothing exact to check
    path, settings = sweep_prompts(own, name)
    assert path == f"data/tasks/prompts/head_sweep/{name}.parquet"
    assert settings["task"] == "mmlu_letter" and settings["n"] == 6
    assert settings["mmlu"] == {k: own["tasks"]["mmlu"][k] for k in ("n", "seed", "topics")}


@pytest.mark.slow
def test_each_models_prune_rules_read_its_own_settings_and_the_others_the_sections(tmp_path):
    """A second tiny model pruned on another task (models.<name>.overrides.prune): its pruning jobs
    carry its settings and read its tasks; the first model's jobs are those of the smoke plan, which
    the golden results come from."""
    from gna.core.replay import job_label, read_plan, record_plan

    raw = yaml.safe_load((REPO / "config" / "smoke.yaml").read_text())
    first = next(iter(raw["models"]))
    raw["models"]["tiny-second"] = {
        **raw["models"][first],
        "seed": 1,
        "overrides": {"prune": {"tasks": ["mmlu_letter", "facts_cloze"], "retrieval_task": "mmlu_letter"}},
    }
    (tmp_path / "two.yaml").write_text(yaml.safe_dump(raw))
    jobs = {job_label(j): j for j in record_plan(tmp_path / "two.yaml", tmp_path / "work")["jobs"]}
    smoke = {job_label(j): j for j in read_plan(REPO / "tests" / "data" / "smoke_plan.json")["jobs"]}

    def settings(rule, model):
        return jobs[f"{rule}[model={model}]"]["params"]["items"][0]

    assert settings("prune_gradual", "tiny-second")["retrieval_task"] == "mmlu_letter"
    assert settings("minimal_model", "tiny-second")["task"] == "mmlu_letter"
    second_inputs = jobs["prune_gradual[model=tiny-second]"]["input"]["items"]
    assert "data/results/baseline/tiny-second/mmlu_letter.items.parquet" in second_inputs
    assert not any("kv_retrieval" in p for p in second_inputs)
    for rule in ("prune_gradual", "minimal_model", "prune_individual"):
        label = f"{rule}[model={first}]"
        assert jobs[label]["params"] == smoke[label]["params"] and jobs[label]["input"] == smoke[label]["input"]
