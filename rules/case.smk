# The study's MMLU case study (gna.phases.case_study), per model of case_study.models: the minimal
# model cut where its letter format breaks, its critical layers, the heads found in them by an exact
# sweep, and the heads-kept table. Selections on development items (case_dev_items), results on the
# evaluation items.
CASE = config["case_study"]
MARGIN = config["report"]["equivalence_margin"]


rule case_dev_items:
    # development MMLU letter questions: a draw of their own from the questions not evaluated
    input:
        mmlu=get_mmlu_file,
    output:
        table="data/tasks/prompts/case_dev.parquet",
    params:
        settings=lambda wc: {
            "task": "mmlu_letter",
            "n": CASE["development"]["n"],
            "seed": CASE["development"]["seed"],
            "mmlu": MMLU_SELECTION,
            "sha256": config["tasks"]["mmlu"]["data"].get("sha256"),
        },
        code=code_of("case_dev_items"),
    log:
        "data/logs/case_dev_items.log",
    script:
        "../workflow_scripts/case_dev_items.py"


rule case_prune:
    input:
        model="data/models/{model}",
        development="data/tasks/prompts/case_dev.parquet",
        tasks=task_files(CASE["tasks"], None),
    output:
        summary="data/results/case/{model}/gradual.parquet",
        per_item="data/results/case/{model}/gradual.items.parquet",
        comparisons="data/results/case/{model}/gradual.comparisons.parquet",
    params:
        settings=lambda wc: {"model": wc.model, "max_items": CASE["max_items"], "evaluation": EVALUATION},
        code=code_of("case_prune"),
    log:
        "data/logs/case_prune/{model}.log",
    benchmark:
        "data/benchmarks/case_prune/{model}.tsv"
    threads: 2
    resources:
        mem_mb=job_mem_mb("case_prune"),
        runtime=120,
    script:
        "../workflow_scripts/case_prune.py"


rule case_minimal:
    # the minimal model: a fixed sequence on the development questions, clear of chance on the evaluation ones
    input:
        summary="data/results/case/{model}/gradual.parquet",
        comparisons="data/results/case/{model}/gradual.comparisons.parquet",
    output:
        minimal="data/results/case/{model}/minimal.json",
    params:
        settings=lambda wc: {"model": wc.model, "margin": MARGIN},
        code=code_of("case_minimal"),
    log:
        "data/logs/case_minimal/{model}.log",
    script:
        "../workflow_scripts/case_minimal.py"


rule case_layers:
    input:
        model="data/models/{model}",
        development="data/tasks/prompts/case_dev.parquet",
        minimal="data/results/case/{model}/minimal.json",
    output:
        comparisons="data/results/case/{model}/layers.comparisons.parquet",
        critical="data/results/case/{model}/critical.json",
    params:
        settings=lambda wc: {"model": wc.model, "deepest": CASE["deepest"], "margin": MARGIN, "evaluation": EVALUATION},
        code=code_of("case_layers"),
    log:
        "data/logs/case_layers/{model}.log",
    benchmark:
        "data/benchmarks/case_layers/{model}.tsv"
    threads: 2
    resources:
        mem_mb=job_mem_mb("case_layers"),
        runtime=120,
    script:
        "../workflow_scripts/case_layers.py"


rule case_sweep:
    input:
        model="data/models/{model}",
        development="data/tasks/prompts/case_dev.parquet",
        minimal="data/results/case/{model}/minimal.json",
        critical="data/results/case/{model}/critical.json",
    output:
        sweep="data/results/case/{model}/sweep.parquet",
        found="data/results/case/{model}/found.json",
    params:
        settings=lambda wc: {"model": wc.model, "evaluation": EVALUATION},
        code=code_of("case_sweep"),
    log:
        "data/logs/case_sweep/{model}.log",
    benchmark:
        "data/benchmarks/case_sweep/{model}.tsv"
    threads: 2
    resources:
        mem_mb=job_mem_mb("case_sweep"),
        runtime=120,
    script:
        "../workflow_scripts/case_sweep.py"


rule case_kept:
    input:
        model="data/models/{model}",
        minimal="data/results/case/{model}/minimal.json",
        found="data/results/case/{model}/found.json",
        tasks=task_files(CASE["tasks"], None),
        kv="data/tasks/kv_retrieval.parquet",
    output:
        summary="data/results/case/{model}/kept.parquet",
        comparisons="data/results/case/{model}/kept.comparisons.parquet",
    params:
        settings=lambda wc: {
            "model": wc.model,
            "max_items": CASE["max_items"],
            "kv_per_size": CASE["kv_per_size"],
            "control": CASE["control"],
            "evaluation": EVALUATION,
        },
        code=code_of("case_kept"),
    log:
        "data/logs/case_kept/{model}.log",
    benchmark:
        "data/benchmarks/case_kept/{model}.tsv"
    threads: 2
    resources:
        mem_mb=job_mem_mb("case_kept"),
        runtime=180,
    script:
        "../workflow_scripts/case_kept.py"


rule case_gna:
    input:
        model="data/models/{model}",
        minimal="data/results/case/{model}/minimal.json",
        found="data/results/case/{model}/found.json",
        mmlu_letter="data/tasks/mmlu_letter.parquet",
    output:
        roles="data/results/case/{model}/roles.parquet",
        maps="data/results/case/{model}/maps.parquet",
        masking="data/results/case/{model}/masking.parquet",
        masking_comparisons="data/results/case/{model}/masking.comparisons.parquet",
    params:
        settings=lambda wc: {
            "model": wc.model,
            "items": CASE["gna_items"],
            "gna": {k: config["gna"][k] for k in ("gather_min", "aggregate_min")},
            "evaluation": EVALUATION,
        },
        code=code_of("case_gna"),
    log:
        "data/logs/case_gna/{model}.log",
    benchmark:
        "data/benchmarks/case_gna/{model}.tsv"
    threads: 2
    resources:
        mem_mb=job_mem_mb("case_gna"),
        runtime=60,
    script:
        "../workflow_scripts/case_gna.py"
