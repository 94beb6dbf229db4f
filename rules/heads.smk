# Per-head ablation: exact sweep + ranking, attribution pre-ranking, and the head tables. Each model's
# settings are the heads section with its models.<name>.overrides.heads over it (heads_of).


rule sweep_prompts:
    # a model's own sweep prompts, where its heads settings make other ones than the shared KV set
    input:
        mmlu=lambda wc: get_mmlu_file(wc) if sweep_prompts(config, wc.model)[1]["task"] == "mmlu_letter" else [],
    output:
        table="data/tasks/prompts/head_sweep/{model}.parquet",
    params:
        settings=lambda wc: sweep_prompts(config, wc.model)[1],
        code=code_of("sweep_prompts"),
    log:
        "data/logs/sweep_prompts/{model}.log",
    script:
        "../workflow_scripts/sweep_prompts.py"


rule heads_sweep:
    input:
        model="data/models/{model}",
        prompts=get_sweep_prompts,
    output:
        sweep="data/results/heads/{model}/sweep.parquet",
        ranking="data/results/heads/{model}/ranking.parquet",
    params:
        # verified mode only: its budget and the attribution order; the unit where it is a group
        settings=lambda wc: {
            "model": wc.model,
            "sweep": {
                "mode": heads_of(wc)["sweep_mode"],
                # only where it is not the head: adding the key reran no head sweep
                **({"unit": "group"} if heads_of(wc)["sweep_unit"] == "group" else {}),
                **(
                    {"budget": heads_of(wc)["verify_budget"], "order": heads_of(wc)["verify_order"]}
                    if heads_of(wc)["sweep_mode"] == "verified"
                    else {}
                ),
            },
            "evaluation": EVALUATION,
        },
        code=code_of("heads_sweep"),
    log:
        "data/logs/heads_sweep/{model}.log",
    benchmark:
        "data/benchmarks/heads_sweep/{model}.tsv"
    threads: 2
    resources:
        mem_mb=job_mem_mb("heads_sweep"),
        runtime=240,
    script:
        "../workflow_scripts/heads_sweep.py"


rule heads_attribution:
    input:
        model="data/models/{model}",
        ranking="data/results/heads/{model}/ranking.parquet",
        prompts=get_sweep_prompts,
    output:
        attribution="data/results/heads/{model}/attribution.parquet",
    params:
        settings=lambda wc: {
            "model": wc.model,
            "top_n": heads_of(wc)["attribution_top_n"],
            "order": heads_of(wc)["verify_order"],
            "evaluation": EVALUATION,
        },
        code=code_of("heads_attribution"),
    log:
        log="data/logs/heads_attribution/{model}.log",
        # the wall times of its two parts, for the run record (a log: timings are not results)
        timings="data/logs/heads_attribution/{model}.timings.json",
    benchmark:
        "data/benchmarks/heads_attribution/{model}.tsv"
    threads: 2
    resources:
        mem_mb=job_mem_mb("heads_attribution"),
        runtime=120,
    script:
        "../workflow_scripts/heads_attribution.py"


rule heads_topk:
    # baseline: k = 0 is the unmodified model: its baseline's per-item scores, read instead of scored again
    input:
        model="data/models/{model}",
        ranking="data/results/heads/{model}/ranking.parquet",
        tasks=lambda wc: topk_tasks(wc)[0],
        baseline=lambda wc: topk_tasks(wc)[1],
    output:
        summary="data/results/heads/{model}/topk.parquet",
        comparisons="data/results/heads/{model}/topk.comparisons.parquet",
    params:
        settings=lambda wc: {
            "model": wc.model,
            "top_k": TopK.from_heads(heads_of(wc)).as_params(),
            "max_items": heads_of(wc)["table_max_items"],
            **({"own_kv": True} if heads_of(wc)["table_kv"] else {}),  # its n kept whole; absent: no rerun elsewhere
            "chance": CHANCE,
            "evaluation": EVALUATION,
        },
        code=code_of("heads_topk"),
    log:
        "data/logs/heads_topk/{model}.log",
    benchmark:
        "data/benchmarks/heads_topk/{model}.tsv"
    threads: 2
    resources:
        mem_mb=job_mem_mb("heads_topk"),
        runtime=240,
    script:
        "../workflow_scripts/heads_topk.py"


rule heads_kept:
    # gradual_items: the minimal model's own scores, read where they hold the items
    input:
        model="data/models/{model}",
        ranking="data/results/heads/{model}/ranking.parquet",
        minimal="data/results/prune/{model}/minimal_model.json",
        gradual_items="data/results/prune/{model}/gradual.items.parquet",
        tasks=lambda wc: task_files(TASKS, wc.model),
    output:
        summary="data/results/heads/{model}/kept.parquet",
        comparisons="data/results/heads/{model}/kept.comparisons.parquet",
    params:
        settings=lambda wc: {
            "model": wc.model,
            "max_items": heads_of(wc)["table_max_items"],
            "chance": CHANCE,
            "evaluation": EVALUATION,
        },
        code=code_of("heads_kept"),
    log:
        "data/logs/heads_kept/{model}.log",
    benchmark:
        "data/benchmarks/heads_kept/{model}.tsv"
    threads: 2
    resources:
        mem_mb=job_mem_mb("heads_kept"),
        runtime=120,
    script:
        "../workflow_scripts/heads_kept.py"


rule heads_dictsize:
    input:
        model="data/models/{model}",
        ranking="data/results/heads/{model}/ranking.parquet",
        prompts="data/tasks/prompts/dict_size_curves.parquet",
    output:
        curves="data/results/heads/{model}/dictsize.parquet",
    params:
        settings=lambda wc: {"model": wc.model, "evaluation": EVALUATION},
        code=code_of("heads_dictsize"),
    log:
        "data/logs/heads_dictsize/{model}.log",
    benchmark:
        "data/benchmarks/heads_dictsize/{model}.tsv"
    threads: 2
    resources:
        mem_mb=job_mem_mb("heads_dictsize"),
        runtime=120,
    script:
        "../workflow_scripts/heads_dictsize.py"
