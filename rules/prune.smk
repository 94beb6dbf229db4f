# Layer pruning: gradual sweep from the end, the minimal model, one-at-a-time removal on it. Each
# model's settings are the prune section with its models.<name>.overrides.prune over it (prune_of).


rule prune_gradual:
    # baseline: the full model's scores, which say whether a task is at chance (then no depth is scored)
    input:
        model="data/models/{model}",
        tasks=lambda wc: task_files(prune_of(wc)["tasks"], wc.model),
        baseline=lambda wc: [f"data/results/baseline/{wc.model}/{task}.items.parquet" for task in prune_of(wc)["tasks"]],
    # per_item: per item and depth; heads_kept and prune_individual read the minimal model's scores here
    output:
        summary="data/results/prune/{model}/gradual.parquet",
        per_item="data/results/prune/{model}/gradual.items.parquet",
        comparisons="data/results/prune/{model}/gradual.comparisons.parquet",
    params:
        settings=lambda wc: {
            "model": wc.model,
            "max_items": prune_of(wc)["max_items"],
            "chance": CHANCE,
            "retrieval_task": prune_of(wc)["retrieval_task"],
            "evaluation": EVALUATION,
        },
        code=code_of("prune_gradual"),
    log:
        "data/logs/prune_gradual/{model}.log",
    benchmark:
        "data/benchmarks/prune_gradual/{model}.tsv"
    threads: 2
    resources:
        mem_mb=job_mem_mb("prune_gradual"),
        runtime=120,
    script:
        "../workflow_scripts/prune_gradual.py"


rule minimal_model:
    input:
        gradual="data/results/prune/{model}/gradual.parquet",
    output:
        minimal="data/results/prune/{model}/minimal_model.json",
    params:
        settings=lambda wc: {
            "model": wc.model,
            "task": prune_of(wc)["retrieval_task"],
            "metric": prune_of(wc)["retrieval_metric"],
            "fraction": prune_of(wc)["minimal_fraction"],
        },
        code=code_of("minimal_model"),
    log:
        "data/logs/minimal_model/{model}.log",
    script:
        "../workflow_scripts/minimal_model.py"


rule prune_individual:
    input:
        model="data/models/{model}",
        tasks=lambda wc: task_files(prune_of(wc)["tasks"], wc.model),
        minimal="data/results/prune/{model}/minimal_model.json",
        gradual_items="data/results/prune/{model}/gradual.items.parquet",
    output:
        individual="data/results/prune/{model}/individual.parquet",
    params:
        settings=lambda wc: {
            "model": wc.model,
            "max_items": prune_of(wc)["max_items"],
            "chance": CHANCE,
            "evaluation": EVALUATION,
        },
        code=code_of("prune_individual"),
    log:
        "data/logs/prune_individual/{model}.log",
    benchmark:
        "data/benchmarks/prune_individual/{model}.tsv"
    threads: 2
    resources:
        mem_mb=job_mem_mb("prune_individual"),
        runtime=240,
    script:
        "../workflow_scripts/prune_individual.py"
