"""The study's plan as a validated config decides it, read by the rules while the Snakefile is
parsed: which models teach students, which get G&A maps, and every result a run ends with (rule
`all`). Plain functions of the config, so that they are tested without Snakemake.
"""

from __future__ import annotations

from itertools import product

from gna.core.settings import model_facts, model_heads, model_prune  # noqa: F401 (the Snakefile imports them from here)
from gna.students.spec import TEACHER_VARIANT, parse_variant, student_name, student_variants, variant_name


def _paths(pattern: str, **values: list) -> list[str]:
    """`pattern` filled with every combination of `values` (first key outermost), as Snakemake's
    expand does."""
    keys = list(values)
    return [pattern.format(**dict(zip(keys, combo))) for combo in product(*(values[k] for k in keys))]


def _not_skipping(config: dict, phase: str) -> list[str]:
    return [m for m, spec in config["models"].items() if phase not in spec.get("skip", [])]


# heads keys whose values make the sweep's prompts (the rest decide what is done with them)
SWEEP_PROMPT_KEYS = ("sweep_task", "sweep_dict_size", "sweep_n", "seed")


def sweep_prompts(config: dict, model: str) -> tuple[str, dict | None]:
    """(path, settings of rule sweep_prompts) of the prompts every head of `model` is ablated on:
    the shared KV set data/tasks/prompts/head_sweep.parquet (settings None: rule kv_task builds it)
    where the model's sweep prompts are the heads section's; else its own set
    data/tasks/prompts/head_sweep/<model>.parquet."""
    heads = model_heads(config, model)
    if all(heads[k] == config["heads"][k] for k in SWEEP_PROMPT_KEYS) and heads["sweep_task"] == "kv_retrieval":
        return "data/tasks/prompts/head_sweep.parquet", None
    settings = {
        "task": heads["sweep_task"],
        "n": heads["sweep_n"],
        "seed": heads["seed"],
        "dict_size": heads["sweep_dict_size"],
        "template": config["tasks"]["kv_retrieval"]["template"],
    }
    if heads["sweep_task"] == "mmlu_letter":
        mmlu = config["tasks"]["mmlu"]
        settings |= {"mmlu": {k: mmlu[k] for k in ("n", "seed", "topics")}, "sha256": mmlu["data"].get("sha256")}
    return f"data/tasks/prompts/head_sweep/{model}.parquet", settings


def teachers(config: dict) -> list[str]:
    """The models students are distilled from (models.<name>.skip without hybrid)."""
    return _not_skipping(config, "hybrid")


def pruned_models(config: dict) -> list[str]:
    """The models that go through layer pruning and the heads-kept table built on its minimal model
    (models.<name>.skip without prune)."""
    return _not_skipping(config, "prune")


def gna_students(config: dict) -> list[str]:
    """The students that also go through the G&A rules (hybrid.gna_variants), named like models."""
    hybrid = config["hybrid"]
    return [student_name(m, v) for m in teachers(config) for v in hybrid["gna_variants"]] if hybrid["enabled"] else []


def gna_models(config: dict) -> list[str]:
    """The models that get G&A roles, maps and masking: those not skipping gna, then gna_students."""
    return _not_skipping(config, "gna") + gna_students(config)


def answer_row_variants(hybrid: dict) -> list[str]:
    """The hybrids (k > 0) among the students that get G&A maps (hybrid.gna_variants)."""
    return [v for v in hybrid["gna_variants"] if parse_variant(v)[0] > 0]


def pure_ssm_variant(hybrid: dict) -> str:
    """The pure SSM student (no head kept) at hybrid.state_size: what the comparisons set against."""
    return variant_name(0, hybrid["state_size"])


def hybrid_results(config: dict) -> list[str]:
    """Every result of the students phase (none where hybrid.enabled is false)."""
    hybrid = config["hybrid"]
    if not hybrid["enabled"]:
        return []
    models = teachers(config)
    root = "data/results/hybrid/{model}"
    results = _paths(root + "/{variant}.parquet", model=models, variant=[TEACHER_VARIANT, *student_variants(hybrid)])
    results += _paths(root + "/memory.parquet", model=models)
    results += _paths(root + "/comparisons.parquet", model=models)
    results += _paths(root + "/answer-rows-{variant}.parquet", model=models, variant=answer_row_variants(hybrid))
    if hybrid["swap"]:
        results += _paths(root + "/swap.parquet", model=models)
    results += _paths(root + "/budget-{variant}.parquet", model=models, variant=hybrid["budget_curve"]["variants"])
    results += _paths(root + "/ablation-{ablation}.parquet", model=models, ablation=hybrid["ablation"]["remove"])
    return results


# the case study's files per model (rules/case.smk): the report reads each
CASE_RESULTS = [
    "gradual.parquet",
    "gradual.comparisons.parquet",
    "minimal.json",
    "layers.comparisons.parquet",
    "critical.json",
    "sweep.parquet",
    "found.json",
    "kept.parquet",
    "kept.comparisons.parquet",
    "roles.parquet",
    "maps.parquet",
    "masking.parquet",
    "masking.comparisons.parquet",
]


def all_results(config: dict) -> list[str]:
    """Every phase's results, listed explicitly so that a phase added to an existing run is
    scheduled even when the report it feeds is already up to date."""
    pruned = [
        "data/results/prune/{model}/gradual.parquet",
        "data/results/prune/{model}/gradual.comparisons.parquet",
        "data/results/prune/{model}/individual.parquet",
        # the minimal model's heads
        "data/results/heads/{model}/kept.parquet",
        "data/results/heads/{model}/kept.comparisons.parquet",
    ]
    per_model = [
        "data/results/heads/{model}/ranking.parquet",
        "data/results/heads/{model}/attribution.parquet",
        "data/results/heads/{model}/topk.parquet",
        "data/results/heads/{model}/topk.comparisons.parquet",
        "data/results/heads/{model}/dictsize.parquet",
    ]
    if "choice" in config["tasks"]["facts"]["formats"]:
        per_model.append("data/results/facts/{model}/formats.parquet")
    models = list(config["models"])
    gna = _paths(
        "data/results/gna/{model}/{kind}.parquet",
        model=gna_models(config),
        kind=["roles", "masking", "masking.comparisons"],
    )
    prune = [p for t in pruned for p in _paths(t, model=pruned_models(config))]
    # the attribution check compares the pre-ranking with the exact sweep, so it needs one
    exact = [m for m in models if model_heads(config, m)["sweep_mode"] == "exact"]
    listed = [p for t in per_model for p in _paths(t, model=exact if t.endswith("attribution.parquet") else models)]
    case = _paths("data/results/case/{model}/{name}", model=config["case_study"]["models"], name=CASE_RESULTS)
    return ["data/results/baseline.parquet", *listed, *prune, *case, *gna] + (hybrid_results(config))
