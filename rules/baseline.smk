# Score every model on every task; lm-eval tasks by name; one tidy table of all scores.

# how lm-eval runs (gna.tasks.lmeval_bridge.LmEvalOptions): the lm_eval section without its task
# list and the cross-check switch, the include path resolved against the workflow folder
LM_EVAL_OPTIONS = {
    "include_path": get_path(config["lm_eval"]["include_path"]) if config["lm_eval"]["include_path"] else None,
    "include_defaults": config["lm_eval"]["include_defaults"],
    "limit": config["lm_eval"]["limit"],
    "num_fewshot": config["lm_eval"]["num_fewshot"],
}


rule baseline:
    input:
        model="data/models/{model}",
        task=lambda wc: task_file(wc.task, wc.model),
    output:
        summary="data/results/baseline/{model}/{task}.parquet",
        per_item="data/results/baseline/{model}/{task}.items.parquet",
    params:
        settings=lambda wildcards: {"model": wildcards.model, "evaluation": EVALUATION},
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
        metrics="data/results/lmeval/{model}/{lmtask}.parquet",
    params:
        # the job's memory (memory_mb), which lm-eval's logits must fit in, comes from its mem_mb
        # resource through run_rule, not from params: a profile's memory reruns nothing
        settings=lambda wildcards: {
            "model": wildcards.model,
            "task": wildcards.lmtask,
            "options": LM_EVAL_OPTIONS,
            "evaluation": EVALUATION,
        },
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
        mmlu=get_mmlu_file,
    output:
        task_dir=directory("data/tasks/lmeval_crosscheck"),
    params:
        settings={"mmlu": MMLU_SELECTION, "sha256": config["tasks"]["mmlu"]["data"].get("sha256")},
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
        metrics="data/results/lmeval/{model}/crosscheck_mmlu_letter.parquet",
    params:
        settings=lambda wildcards: {"model": wildcards.model, "evaluation": EVALUATION},
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
        tables=get_baseline_results,
    output:
        table="data/results/baseline.parquet",
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
        tasks=lambda wc: task_files(FACTS_TASKS, wc.model),  # their own formats: read from the baseline
        baseline=expand("data/results/baseline/{{model}}/{task}.items.parquet", task=FACTS_TASKS),
    output:
        formats="data/results/facts/{model}/formats.parquet",
    params:
        settings=lambda wildcards: {"model": wildcards.model, "facts": facts_comparison(wildcards.model), "evaluation": EVALUATION},
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
