# Score every model on every task; lm-eval tasks by name; one tidy table of all scores.


rule baseline:
    input:
        model="data/models/{model}",
        task=lambda wc: task_file(wc.task, wc.model),
    output:
        summary="data/results/baseline/{model}/{task}.parquet",
        per_item="data/results/baseline/{model}/{task}.items.parquet",
    params:
        evaluation=EVALUATION,
        code=code_of("baseline"),
    log:
        "data/logs/baseline/{model}/{task}.log",
    benchmark:
        "data/benchmarks/baseline/{model}/{task}.tsv"
    threads: 2
    resources:
        mem_mb=job_mem_mb("baseline"),
        runtime=120,
    script:
        "../workflow_scripts/baseline.py"


rule lm_eval:
    input:
        model="data/models/{model}",
    output:
        "data/results/lmeval/{model}/{lmtask}.parquet",
    params:
        options={k: v for k, v in config["lm_eval"].items() if k != "tasks"},
        include_path=(get_path(config["lm_eval"]["include_path"]) if config["lm_eval"]["include_path"] else None),
        evaluation=EVALUATION,
        code=code_of("lm_eval"),
    log:
        "data/logs/lm_eval/{model}/{lmtask}.log",
    benchmark:
        "data/benchmarks/lm_eval/{model}/{lmtask}.tsv"
    threads: 2
    resources:
        mem_mb=job_mem_mb("lm_eval"),
        runtime=240,
    script:
        "../workflow_scripts/lm_eval.py"


rule lmeval_crosscheck_task:
    input:
        get_mmlu_file,
    output:
        directory("data/tasks/lmeval_crosscheck"),
    params:
        mmlu={k: v for k, v in config["tasks"]["mmlu"].items() if k not in ("formats", "data")},
        sha256=config["tasks"]["mmlu"]["data"].get("sha256"),
        code=code_of("lmeval_crosscheck_task"),
    log:
        "data/logs/lmeval_crosscheck_task.log",
    script:
        "../workflow_scripts/lmeval_crosscheck_task.py"


rule lm_eval_crosscheck:
    input:
        model="data/models/{model}",
        task_dir="data/tasks/lmeval_crosscheck",
    output:
        "data/results/lmeval/{model}/crosscheck_mmlu_letter.parquet",
    params:
        evaluation=EVALUATION,
        code=code_of("lm_eval_crosscheck"),
    log:
        "data/logs/lm_eval/{model}/crosscheck_mmlu_letter.log",
    benchmark:
        "data/benchmarks/lm_eval/{model}/crosscheck_mmlu_letter.tsv"
    threads: 2
    resources:
        mem_mb=job_mem_mb("lm_eval_crosscheck"),
        runtime=240,
    script:
        "../workflow_scripts/lm_eval_crosscheck.py"


rule collect_baseline:
    input:
        get_baseline_results,
    output:
        "data/results/baseline.parquet",
    params:
        code=code_of("collect_baseline"),
    log:
        "data/logs/collect_baseline.log",
    script:
        "../workflow_scripts/collect_baseline.py"


rule facts_formats:
    input:
        model="data/models/{model}",
        facts="data/downloads/facts.parquet",
        # the task's own formats are read from the baseline, not scored again
        tasks=lambda wc: task_files(FACTS_TASKS, wc.model),
        baseline=expand("data/results/baseline/{{model}}/{task}.items.parquet", task=FACTS_TASKS),
    output:
        "data/results/facts/{model}/formats.parquet",
    params:
        facts={k: v for k, v in config["tasks"]["facts"].items() if k not in ("formats", "data", "known_margin")},
        evaluation=EVALUATION,
        code=code_of("facts_formats"),
    log:
        "data/logs/facts_formats/{model}.log",
    benchmark:
        "data/benchmarks/facts_formats/{model}.tsv"
    threads: 2
    resources:
        mem_mb=job_mem_mb("facts_formats"),
        runtime=60,
    script:
        "../workflow_scripts/facts_formats.py"
