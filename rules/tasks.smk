# Evaluation sets as Parquet: seeded KV-retrieval, MMLU in letter and cloze format, and the facts
# (knowledge) in cloze and multiple-choice format with each model's known items.

# which MMLU questions are evaluated (gna.tasks.tables.MmluSelection): the formats list and the
# few-shot count are left out (adding a format must not rebuild the others; mmlu_task adds its few-shot count)
MMLU_SELECTION = {k: config["tasks"]["mmlu"][k] for k in ("n", "seed", "topics")}
# which facts are asked (gna.tasks.facts.FactSelection): the lists of formats and of compared
# forms, the development split and the draws compared are left out: editing them rebuilds no task
FACTS_SELECTION = {k: config["tasks"]["facts"][k] for k in ("relations", "n", "seed")}


def get_local_facts(wildcards):
    """The local facts CSV resolved against the workflow folder; none for the pinned wheels."""
    data = config["tasks"]["facts"]["data"]
    return get_path(data["path"]) if data["source"] == "local" else []


def facts_comparison(model):
    """What `model`'s format comparison asks (gna.phases.knowledge.FormatComparison): the compared
    forms and draws may be the model's own (models.<name>.overrides.facts)."""
    facts = model_facts(config, model)
    return {
        "selection": {**FACTS_SELECTION, "dev_n": facts["dev"]["n"]},
        "choice": facts["choice"],
        "compare": facts["compare"],
        "draws": facts["draws"],
    }


rule fetch_mmlu:
    output:
        mmlu="data/downloads/mmlu.jsonl",
    params:
        settings={"spec": config["tasks"]["mmlu"]["data"]},
        code=code_of("fetch_mmlu"),
    log:
        "data/logs/fetch_mmlu.log",
    resources:
        mem_mb=1000,
        runtime=30,
    script:
        "../workflow_scripts/fetch_mmlu.py"


rule kv_task:
    wildcard_constraints:
        kv_set=_alternation(KV_SETS),
    output:
        table="data/tasks/{kv_set}.parquet",
    params:
        settings=lambda wildcards: {"prompts": KV_SETS[wildcards.kv_set]},
        code=code_of("kv_task"),
    log:
        "data/logs/kv_task/{kv_set}.log",
    script:
        "../workflow_scripts/kv_task.py"


rule mmlu_task:
    input:
        mmlu=get_mmlu_file,
    output:
        table="data/tasks/mmlu_{fmt}.parquet",
    params:
        settings=lambda wildcards: {
            "fmt": wildcards.fmt,
            "mmlu": MMLU_SELECTION,
            "num_fewshot": config["tasks"]["mmlu"]["num_fewshot"],
            "sha256": config["tasks"]["mmlu"]["data"].get("sha256"),
        },
        code=code_of("mmlu_task"),
    log:
        "data/logs/mmlu_task/{fmt}.log",
    script:
        "../workflow_scripts/mmlu_task.py"


rule fetch_facts:
    output:
        facts="data/downloads/facts.parquet",
    input:
        local=get_local_facts,
    params:
        settings={"data": config["tasks"]["facts"]["data"]},
        code=code_of("fetch_facts"),
    log:
        "data/logs/fetch_facts.log",
    resources:
        mem_mb=1000,
        runtime=30,
    script:
        "../workflow_scripts/fetch_facts.py"


rule facts_task:
    input:
        facts="data/downloads/facts.parquet",
    output:
        table="data/tasks/facts_{facts_fmt}.parquet",
    params:
        settings=lambda wildcards: {
            "fmt": wildcards.facts_fmt,
            "selection": FACTS_SELECTION,
            "choice": config["tasks"]["facts"]["choice"],
        },
        code=code_of("facts_task"),
    log:
        "data/logs/facts_task/{facts_fmt}.log",
    script:
        "../workflow_scripts/facts_task.py"


rule facts_known:
    input:
        choice="data/tasks/facts_choice.parquet",
        cloze="data/results/baseline/{model}/facts_cloze.items.parquet",
    output:
        table="data/tasks/known/{model}/facts_choice.parquet",
    params:
        settings={"margin": config["tasks"]["facts"]["known_margin"]},
        code=code_of("facts_known"),
    log:
        "data/logs/facts_known/{model}.log",
    resources:
        mem_mb=1000,
        runtime=10,
    script:
        "../workflow_scripts/facts_known.py"
