# Evaluation sets as Parquet: seeded KV-retrieval, MMLU in letter and cloze format, and the facts
# (knowledge) in cloze and multiple-choice format with each model's known items.


rule fetch_mmlu:
    output:
        "data/downloads/mmlu.jsonl",
    params:
        spec=config["tasks"]["mmlu"]["data"],
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
        "data/tasks/{kv_set}.parquet",
    params:
        kv=lambda wc: KV_SETS[wc.kv_set],
        code=code_of("kv_task"),
    log:
        "data/logs/kv_task/{kv_set}.log",
    script:
        "../workflow_scripts/kv_task.py"


rule mmlu_task:
    input:
        get_mmlu_file,
    output:
        "data/tasks/mmlu_{fmt}.parquet",
    params:
        # the formats list is left out on purpose: adding a format must not rebuild the others
        mmlu={k: v for k, v in config["tasks"]["mmlu"].items() if k not in ("formats", "data")},
        sha256=config["tasks"]["mmlu"]["data"].get("sha256"),
        code=code_of("mmlu_task"),
    log:
        "data/logs/mmlu_task/{fmt}.log",
    script:
        "../workflow_scripts/mmlu_task.py"


rule fetch_facts:
    output:
        "data/downloads/facts.parquet",
    input:
        lambda wc: [get_path(config["tasks"]["facts"]["data"]["path"])]
        if config["tasks"]["facts"]["data"]["source"] == "local" else [],
    params:
        data=config["tasks"]["facts"]["data"],
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
        "data/downloads/facts.parquet",
    output:
        "data/tasks/facts_{facts_fmt}.parquet",
    params:
        # the lists of formats and of compared forms, the development split and the draws compared
        # are left out: editing them rebuilds no task
        facts={
            k: v
            for k, v in config["tasks"]["facts"].items()
            if k not in ("formats", "compare", "dev", "draws", "data", "known_margin")
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
        "data/tasks/known/{model}/facts_choice.parquet",
    params:
        margin=config["tasks"]["facts"]["known_margin"],
        code=code_of("facts_known"),
    log:
        "data/logs/facts_known/{model}.log",
    resources:
        mem_mb=1000,
        runtime=10,
    script:
        "../workflow_scripts/facts_known.py"
