# The students phase, scoring: every student and its teacher on the tasks, the budget curve from
# KD's checkpoints, the layer swap, the inference-memory table, answer-row masking and the paired
# comparisons (settings and input functions: students_training.smk).


rule hybrid_score:
    input:
        model=get_scored_model,
        teacher="data/distill/{model}/teacher.safetensors",
        tasks=lambda wc: task_files(scored_tasks(HYBRID, wc.variant, TASKS), wc.model),
        baseline=lambda wc: (  # the teacher's per-item scores are its baseline's: read, not scored again
            expand("data/results/baseline/{model}/{task}.items.parquet", model=wc.model,
                   task=scored_tasks(HYBRID, wc.variant, TASKS))
            if wc.variant == TEACHER_VARIANT else []),
        teacher_summary=get_teacher_summary,
        corpus_check=CORPUS_CHECK,
    output:
        summary="data/results/hybrid/{model}/{variant}.parquet",
        answers="data/results/hybrid/{model}/answers/{variant}.parquet",
    params:
        settings=lambda wildcards: {
            "model": wildcards.model,
            "variant": wildcards.variant,
            "scoring": SCORING.as_params(),
            "kv_dict_size": scored_dict_size(HYBRID, wildcards.variant),
        },
        code=code_of("hybrid_score"),
    log:
        "data/logs/hybrid_score/{model}-{variant}.log",
    benchmark:
        "data/benchmarks/hybrid_score/{model}-{variant}.tsv"
    threads: 2
    resources:
        mem_mb=job_mem_mb("hybrid_score"),
        runtime=120,
    script:
        "../workflow_scripts/hybrid_score.py"


rule hybrid_budget:
    input:
        model="data/models/" + student_name("{model}", "{variant}"),
        checkpoints="data/distill/{model}/kd-{variant}-checkpoints.safetensors",
        teacher="data/distill/{model}/teacher.safetensors",
        task="data/tasks/kv_retrieval.parquet",
        corpus_check=CORPUS_CHECK,
        summary="data/results/hybrid/{model}/{variant}.parquet",  # the full budget's point: the student's own
        answers="data/results/hybrid/{model}/answers/{variant}.parquet",  # scores (degeneracy check at dict_size)
        aligned=lambda wc: f"data/distill/{wc.model}/align-n{parse_variant(wc.variant)[1]}.safetensors",  # facts through training
        facts=["data/tasks/facts_cloze.parquet"] if "facts_cloze" in TASKS else [],
        teacher_answers=(["data/results/hybrid/{model}/answers/" + TEACHER_VARIANT + ".parquet"]
                         if "facts_cloze" in TASKS else []),
    output:
        budget="data/results/hybrid/{model}/budget-{variant}.parquet",
        knowledge="data/results/hybrid/{model}/training-facts-{variant}.comparisons.parquet",
        comparisons="data/results/hybrid/{model}/budget-{variant}.comparisons.parquet",  # each KD step vs realigned
    params:
        settings=lambda wildcards: {
            "model": wildcards.model,
            "variant": wildcards.variant,
            "scoring": SCORING.as_params("dict_size", "degeneracy_items", "evaluation"),
        },
        code=code_of("hybrid_budget"),
    log:
        "data/logs/hybrid_budget/{model}-{variant}.log",
    benchmark:
        "data/benchmarks/hybrid_budget/{model}-{variant}.tsv"
    threads: 2
    resources:
        mem_mb=job_mem_mb("hybrid_budget"),
        runtime=120,
    script:
        "../workflow_scripts/hybrid_budget.py"


rule hybrid_swap:
    input:
        model=lambda wc: f"data/models/{student_name(wc.model, pure_ssm_variant(HYBRID))}",
        ranking="data/results/heads/{model}/ranking.parquet",
        teacher="data/distill/{model}/teacher.safetensors",
        tasks=lambda wc: task_files(TASKS, wc.model),
        teacher_summary=get_teacher_summary,
        corpus_check=CORPUS_CHECK,
    output:
        summary="data/results/hybrid/{model}/swap.parquet",
        answers="data/results/hybrid/{model}/answers/swap.parquet",
    params:
        settings=lambda wildcards: {
            "model": wildcards.model,
            "variant": pure_ssm_variant(HYBRID),
            "scoring": SCORING.as_params(),
        },
        code=code_of("hybrid_swap"),
    log:
        "data/logs/hybrid_swap/{model}.log",
    benchmark:
        "data/benchmarks/hybrid_swap/{model}.tsv"
    threads: 2
    resources:
        mem_mb=job_mem_mb("hybrid_swap"),
        runtime=120,
    script:
        "../workflow_scripts/hybrid_swap.py"


rule hybrid_memory:
    input:
        model="data/models/{model}",
        students=lambda wc: [f"data/models/{student_name(wc.model, v)}" for v in hybrid_variants()],
    output:
        memory="data/results/hybrid/{model}/memory.parquet",
    params:
        settings=lambda wildcards: {"model": wildcards.model, "memory": HYBRID["memory"]},
        code=code_of("hybrid_memory"),
    log:
        "data/logs/hybrid_memory/{model}.log",
    benchmark:
        "data/benchmarks/hybrid_memory/{model}.tsv"
    threads: 2
    resources:
        mem_mb=job_mem_mb("hybrid_memory"),
        runtime=60,
    script:
        "../workflow_scripts/hybrid_memory.py"


rule hybrid_answer_rows:
    input:
        model="data/models/" + student_name("{model}", "{variant}"),
        answers="data/results/hybrid/{model}/answers/{variant}.parquet",  # the unmodified condition, read
        tasks=lambda wc: task_files(TASKS, wc.model),
        teacher_summary=get_teacher_summary,
        corpus_check=CORPUS_CHECK,
    output:
        answer_rows="data/results/hybrid/{model}/answer-rows-{variant}.parquet",
    params:
        settings=lambda wildcards: {
            "model": wildcards.model,
            "variant": wildcards.variant,
            "scoring": StudentScoring.from_config(config, "answer_rows_items").as_params("items", "chance", "evaluation"),
        },
        code=code_of("hybrid_answer_rows"),
    log:
        "data/logs/hybrid_answer_rows/{model}-{variant}.log",
    benchmark:
        "data/benchmarks/hybrid_answer_rows/{model}-{variant}.tsv"
    threads: 2
    resources:
        mem_mb=job_mem_mb("hybrid_answer_rows"),
        runtime=120,
    script:
        "../workflow_scripts/hybrid_answer_rows.py"


rule hybrid_comparisons:
    input:
        answers=lambda wc: expand("data/results/hybrid/{model}/answers/{variant}.parquet", model=wc.model,
                                  variant=[TEACHER_VARIANT] + hybrid_variants()),
        swap=lambda wc: [f"data/results/hybrid/{wc.model}/answers/swap.parquet"] if HYBRID["swap"] else [],
    output:
        comparisons="data/results/hybrid/{model}/comparisons.parquet",
    params:
        settings=lambda wildcards: {"model": wildcards.model, "pure_ssm": pure_ssm_variant(HYBRID)},
        code=code_of("hybrid_comparisons"),
    log:
        "data/logs/hybrid_comparisons/{model}.log",
    script:
        "../workflow_scripts/hybrid_comparisons.py"
