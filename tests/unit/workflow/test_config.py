import copy

import pytest
import yaml
from conftest import REPO

from gna.core.settings import model_facts
from gna.tasks.tables import heads_table_kv, kv_prompt_sets
from gna.workflow.config import ConfigError, load_schema, validate_config

SCHEMA = load_schema(REPO / "config" / "schema.yaml")


def default():
    return yaml.safe_load((REPO / "config" / "config.yaml").read_text())


@pytest.mark.parametrize("name", ["config.yaml", "smoke.yaml", "paper.yaml", "paper-shapes.yaml"])
def test_shipped_configs_are_valid(name):
    validate_config(yaml.safe_load((REPO / "config" / name).read_text()), SCHEMA)


def test_students_long_overlay_merges_into_the_default_config():
    """`--configfile config/config.yaml config/students-long.yaml`: Snakemake merges the files
    key by key (snakemake.utils.update_config), so the overlay changes only its own keys."""
    from snakemake.utils import update_config

    cfg = default()
    update_config(cfg, yaml.safe_load((REPO / "config" / "students-long.yaml").read_text()))
    out = validate_config(cfg, SCHEMA)
    hybrid = out["hybrid"]
    assert hybrid["corpus"]["train_windows"] == 512 and hybrid["corpus"]["seq_len"] == 256
    assert hybrid["kd"]["steps"] == 4 * default()["hybrid"]["kd"]["steps"] and hybrid["kd"]["answer_weight"] == 10
    assert hybrid["budget_curve"]["points"] == 8 and hybrid["budget_curve"]["variants"] == ["k0-n16", "k10-n16"]
    assert out["models"] == validate_config(default(), SCHEMA)["models"]


def test_defaults_are_filled():
    cfg = default()
    del cfg["eval"]
    out = validate_config(cfg, SCHEMA)
    assert out["eval"]["batch_size"] == 8
    assert out["lm_eval"]["tasks"] == []


@pytest.mark.parametrize(
    "mutate, expected",
    [
        (lambda c: c.update(bogus=1), "config key 'bogus' is not allowed"),
        (lambda c: c["tasks"]["kv_retrieval"].update(sizes=["x"]), "tasks.kv_retrieval.sizes[0]"),
        (lambda c: c["tasks"]["kv_retrieval"].update(n_per_size="ten"), "tasks.kv_retrieval.n_per_size"),
        (
            lambda c: c["models"]["smollm2-135m"].update(source="ftp"),
            "allowed values: pypi-file, hf, local, tiny-random",
        ),
        (lambda c: c["models"]["smollm2-135m"].pop("sha256"), "'sha256' is a required property"),
        (lambda c: c["models"].update(x={"source": "hf", "id": "a/b", "revison": "v1"}), "models.x.revison"),
        (lambda c: c["tasks"]["kv_retrieval"].update(template="prose"), "allowed values: lookup, study"),
        (lambda c: c["tasks"]["kv_retrieval"].update(sizes=[5, 5]), "duplicate sizes"),
        # names that become file names may not climb out of data/
        (lambda c: c["lm_eval"].update(tasks=["../../x"]), "config key 'lm_eval.tasks[0]': '../../x' does not match"),
        (lambda c: c["models"].update({"../evil": c["models"]["smollm2-135m"]}), "config key 'models': '../evil'"),
        (lambda c: c["models"].update({"a/b": c["models"]["smollm2-135m"]}), "'a/b' does not match"),
        (lambda c: c["tasks"]["kv_retrieval"].update(n_per_size=10**9), "is greater than the maximum of 10000"),
        (
            lambda c: c["models"].update(t={"source": "tiny-random", "heads": 4, "kv_heads": 3}),
            "config key 'models.t': heads (4) must be a multiple of kv_heads (3)",
        ),
        (lambda c: c.setdefault("heads", {}).update(sweep_mode="fast"), "config key 'heads.sweep_mode'"),
        # the hybrid section's cross-key checks
        (
            lambda c: c["hybrid"].update(gna_variants=["k3-n8"]),
            "config key 'hybrid.gna_variants': ['k3-n8'] are not students of this config",
        ),
        (
            lambda c: c["hybrid"]["budget_curve"].update(variants=["k5-n8"]),
            "config key 'hybrid.budget_curve.variants': ['k5-n8'] are not students",
        ),
        (lambda c: c["hybrid"].update(dict_size=4), "config key 'hybrid.dict_size': 4 is not a KV dictionary size"),
        (
            lambda c: c["hybrid"].update(knowledge_heads_kept=[0, 7]),
            "config key 'hybrid.knowledge_heads_kept': [7] are not in hybrid.heads_kept",
        ),
        (
            lambda c: c["hybrid"]["ablation"].update(kd_steps=3),
            "config key 'hybrid.ablation.kd_steps': 3 must be a budget of the budget curve",
        ),
        (
            lambda c: c["models"].update(m={"source": "tiny-random", "arch": "mamba"}),
            "config key 'models.m.skip': students cannot be distilled from mamba",
        ),
        (  # a moved key names its new place
            lambda c: c["hybrid"]["budget_curve"].update(dict_size=10),
            "config key 'hybrid.budget_curve.dict_size' is now 'hybrid.dict_size'",
        ),
        (  # the chance policy is one block now: each old switch names it
            lambda c: c.setdefault("heads", {}).update(skip_at_chance=False),
            "config key 'heads.skip_at_chance' is now 'chance.skip' (one switch for every phase)",
        ),
        (
            lambda c: c["hybrid"].update(skip_where_teacher_degenerate=True),
            "config key 'hybrid.skip_where_teacher_degenerate' is now 'chance.skip'",
        ),
        (lambda c: c.setdefault("heads", {}).update(verify_budget=0), "config key 'heads.verify_budget'"),
        (lambda c: c.setdefault("heads", {}).update(verify_order="abs"), "allowed values: signed, magnitude, graddrop"),
        (
            lambda c: c.setdefault("heads", {}).update(top_k=[0, 1, 2], control_k=[5]),
            "config key 'heads.control_k': [5] not in heads.top_k",
        ),
        (
            lambda c: c.setdefault("heads", {}).update(curve_tasks=["mmlu_letter"], control_k=None),
            "config key 'heads.curve_tasks': the tasks off the curve are scored at the k of heads.control_k",
        ),
    ],
)
def test_bad_config_names_the_key(mutate, expected):
    cfg = default()
    mutate(cfg)
    with pytest.raises(ConfigError) as err:
        validate_config(cfg, SCHEMA)
    assert expected in str(err.value)


def test_validation_does_not_mutate_input():
    cfg = default()
    before = copy.deepcopy(cfg)
    validate_config(cfg, SCHEMA)
    assert cfg == before


def test_a_models_heads_overrides_are_checked_by_their_key():
    config = yaml.safe_load((REPO / "config" / "smoke.yaml").read_text())
    name = next(iter(config["models"]))
    config["models"][name]["overrides"] = {"heads": {"top_k": [0, 2], "control_k": [5]}}
    with pytest.raises(ConfigError, match=rf"'models.{name}.overrides.heads.control_k': \[5\] not in"):
        validate_config(config, SCHEMA)
    config["models"][name]["overrides"] = {"heads": {"sweep_task": "mmlu_cloze"}}
    with pytest.raises(ConfigError, match=rf"models.{name}.overrides.heads.sweep_task': 'mmlu_cloze' is not allowed"):
        validate_config(config, SCHEMA)
    config["models"][name]["overrides"] = {"heads": {"sweeps": 3}}
    with pytest.raises(ConfigError, match="sweeps' is not allowed"):
        validate_config(config, SCHEMA)


def test_a_models_own_format_comparison_takes_the_sections_other_keys_and_is_checked_by_its_key():
    config = yaml.safe_load((REPO / "config" / "smoke.yaml").read_text())
    name = next(iter(config["models"]))
    config["models"][name]["overrides"] = {"facts": {"compare": [{"answer": "letter", "shots": 3}], "draws": 1}}
    validated = validate_config(config, SCHEMA)
    facts = model_facts(validated, name)
    # the form's defaults filled as in the section's list; the rest from the section
    assert facts["compare"] == [{"answer": "letter", "chat": False, "marker": "dot", "prefix": False, "shots": 3}]
    assert (facts["draws"], facts["dev"], facts["choice"]) == (
        1,
        validated["tasks"]["facts"]["dev"],
        validated["tasks"]["facts"]["choice"],
    )
    assert validated["tasks"]["facts"]["compare"] != facts["compare"]  # the section itself unchanged
    config["models"][name]["overrides"] = {"facts": {"compare": [{"answer": "letter", "shots": 0, "prefix": True}]}}
    with pytest.raises(ConfigError, match=rf"'models.{name}.overrides.facts.compare\[0\].prefix': the reply's"):
        validate_config(config, SCHEMA)
    config["models"][name]["overrides"] = {"facts": {"n": 10}}  # which facts are asked is the task's, not a model's
    with pytest.raises(
        ConfigError, match=rf"'models.{name}.overrides.facts.n' is not allowed; allowed keys here: compare, draws"
    ):
        validate_config(config, SCHEMA)


def test_a_group_ranking_is_refused_where_a_phase_keeps_single_heads_of_it():
    config = yaml.safe_load((REPO / "config" / "smoke.yaml").read_text())
    name = next(iter(config["models"]))
    config["models"][name]["overrides"] = {"heads": {"sweep_unit": "group"}}
    config["models"][name]["skip"] = ["hybrid"]
    with pytest.raises(ConfigError, match=rf"'models.{name}': heads.sweep_unit group .* but prune keep"):
        validate_config(config, SCHEMA)
    config["models"][name]["skip"] = ["prune", "hybrid"]
    validated = validate_config(config, SCHEMA)
    # its remove-top-k KV items: a prompt set of its own, where heads.table_kv names one
    config["models"][name]["overrides"]["heads"]["table_kv"] = {"dict_size": 30, "n": 4}
    sets = kv_prompt_sets(validate_config(config, SCHEMA))
    assert sets[heads_table_kv(name)] == {
        "sizes": [30],
        "n_per_size": 4,
        "seed": "heads_table-4321",
        "template": "lookup",
    }
    assert heads_table_kv(name) not in kv_prompt_sets(validated)
    # a seed of its own: a fresh draw of the same setting
    config["models"][name]["overrides"]["heads"]["table_kv"] = {"dict_size": 30, "n": 4, "seed": 7}
    assert kv_prompt_sets(validate_config(config, SCHEMA))[heads_table_kv(name)]["seed"] == "heads_table-7"


def test_a_models_prune_settings_are_its_own_over_the_section_and_checked_by_their_key():
    from gna.core.settings import model_prune

    config = yaml.safe_load((REPO / "config" / "smoke.yaml").read_text())
    name = next(iter(config["models"]))
    config["models"][name]["overrides"] = {"prune": {"retrieval_task": "mmlu_letter", "minimal_fraction": 0.8}}
    own = validate_config(copy.deepcopy(config), SCHEMA)
    prune = model_prune(own, name)
    assert (prune["retrieval_task"], prune["minimal_fraction"]) == ("mmlu_letter", 0.8)
    assert prune["tasks"] == own["prune"]["tasks"] and own["prune"]["retrieval_task"] == "kv_retrieval"
    config["models"][name]["overrides"] = {"prune": {"tasks": ["kv_retrieval"], "retrieval_task": "facts_cloze"}}
    with pytest.raises(ConfigError, match=rf"'models.{name}.overrides.prune.retrieval_task': 'facts_cloze' must be"):
        validate_config(copy.deepcopy(config), SCHEMA)
    config["models"][name]["overrides"] = {"prune": {"retrieval_metric": "f1"}}
    with pytest.raises(ConfigError, match=rf"models.{name}.overrides.prune.retrieval_metric': 'f1' is not allowed"):
        validate_config(copy.deepcopy(config), SCHEMA)


def test_the_case_study_runs_on_named_models_that_build_its_tasks_and_is_refused_by_key_otherwise():
    config = default()
    own = validate_config(copy.deepcopy(config), SCHEMA)["case_study"]
    assert own["models"] == ["qwen2.5-coder-1.5b"] and own["deepest"] == 8 and own["control"]["draws"] == 1
    config["case_study"]["models"] = ["llama-9000"]
    with pytest.raises(ConfigError, match=r"'case_study.models': \['llama-9000'\] are not models"):
        validate_config(copy.deepcopy(config), SCHEMA)
    config["case_study"]["models"] = ["qwen2.5-coder-1.5b"]
    config["tasks"]["mmlu"]["formats"] = ["cloze"]
    config["prune"] = {"tasks": ["kv_retrieval"]}
    with pytest.raises(ConfigError, match=r"'case_study.tasks': \['mmlu_letter'\] not built"):
        validate_config(copy.deepcopy(config), SCHEMA)
    config["case_study"] = {"models": [], "deepest": 0}
    with pytest.raises(ConfigError, match=r"case_study.deepest"):
        validate_config(copy.deepcopy(config), SCHEMA)
