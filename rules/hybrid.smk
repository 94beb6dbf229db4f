# SSM and hybrid students: distillation stages (teacher → align per state size → KD per
# variant), scoring, the layer swap and the inference-memory table. Students are written to
# data/models/<model>-hybrid-k<heads kept>-n<state size>, loadable like any prepared model.

TASK_FILES = {task: f"data/tasks/{task}.parquet" for task in TASKS}


def answer_row_variants():
    """Hybrids with attention heads (the heads-kept sweep, k > 0)."""
    return [f"k{k}-n{HYBRID['state_size']}" for k in HYBRID["heads_kept"] if k > 0]


def pure_ssm_variant():
    return f"k0-n{HYBRID['state_size']}"


def get_hybrid_results():
    if not HYBRID["enabled"]:
        return []
    results = expand("data/results/hybrid/{model}/{variant}.parquet", model=MODELS,
                     variant=["teacher"] + hybrid_variants())
    results += expand("data/results/hybrid/{model}/memory.parquet", model=MODELS)
    results += expand("data/results/hybrid/{model}/answer-rows-{variant}.parquet", model=MODELS,
                      variant=answer_row_variants())
    if HYBRID["swap"]:
        results += expand("data/results/hybrid/{model}/swap.parquet", model=MODELS)
    return results


def get_scored_model(wildcards):
    if wildcards.variant == "teacher":
        return f"data/models/{wildcards.model}"
    return f"data/models/{wildcards.model}-hybrid-{wildcards.variant}"


def _hybrid_code():
    return code_version("distill", "hybrid", "ssm", "hybrid_eval", "tasks", "words", "scoring", "stack", "packing",
                        "models", "io")


wildcard_constraints:
    variant=r"teacher|k\d+-n\d+",
    k=r"\d+",
    n=r"\d+",


rule distill_teacher:
    input:
        model="data/models/{model}",
        mmlu=get_mmlu_file,
    output:
        "data/distill/{model}/teacher.safetensors",
    params:
        corpus=HYBRID["corpus"],
        top_k=HYBRID["top_k_logits"],
        seed=HYBRID["seed"],
        mmlu={k: v for k, v in config["tasks"]["mmlu"].items() if k in ("n", "seed", "topics")},
        template=config["tasks"]["kv_retrieval"]["template"],
        dtype=config["dtype"],
        code=_hybrid_code(),
    log:
        "data/logs/distill_teacher/{model}.log",
    benchmark:
        "data/benchmarks/distill_teacher/{model}.tsv"
    threads: 2
    resources:
        mem_mb=6000,
        runtime=60,
    script:
        "../workflow_scripts/distill.py"


rule distill_align:
    input:
        model="data/models/{model}",
        teacher="data/distill/{model}/teacher.safetensors",
    output:
        weights="data/distill/{model}/align-n{n}.safetensors",
        curve="data/distill/{model}/align-n{n}.parquet",
    params:
        align=HYBRID["align"],
        seed=HYBRID["seed"],
        dtype=config["dtype"],
        code=_hybrid_code(),
    log:
        "data/logs/distill_align/{model}-n{n}.log",
    benchmark:
        "data/benchmarks/distill_align/{model}-n{n}.tsv"
    threads: 2
    resources:
        mem_mb=8000,
        runtime=240,
    script:
        "../workflow_scripts/distill.py"


rule distill_kd:
    input:
        model="data/models/{model}",
        teacher="data/distill/{model}/teacher.safetensors",
        aligned="data/distill/{model}/align-n{n}.safetensors",
        ranking="data/results/heads/{model}/ranking.parquet",
    output:
        student=directory("data/models/{model}-hybrid-k{k}-n{n}"),
        curve="data/distill/{model}/kd-k{k}-n{n}.parquet",
    params:
        kd=HYBRID["kd"],
        seed=HYBRID["seed"],
        dtype=config["dtype"],
        code=_hybrid_code(),
    log:
        "data/logs/distill_kd/{model}-k{k}-n{n}.log",
    benchmark:
        "data/benchmarks/distill_kd/{model}-k{k}-n{n}.tsv"
    threads: 2
    resources:
        mem_mb=8000,
        runtime=240,
    script:
        "../workflow_scripts/distill.py"


rule hybrid_score:
    input:
        model=get_scored_model,
        teacher="data/distill/{model}/teacher.safetensors",
        tasks=list(TASK_FILES.values()),
    output:
        "data/results/hybrid/{model}/{variant}.parquet",
    params:
        max_items=HYBRID["eval_items"],
        batch_size=config["eval"]["batch_size"],
        dtype=config["dtype"],
        code=_hybrid_code(),
    log:
        "data/logs/hybrid_score/{model}-{variant}.log",
    benchmark:
        "data/benchmarks/hybrid_score/{model}-{variant}.tsv"
    threads: 2
    resources:
        mem_mb=6000,
        runtime=120,
    script:
        "../workflow_scripts/distill.py"


rule hybrid_swap:
    input:
        model=lambda wc: f"data/models/{wc.model}-hybrid-{pure_ssm_variant()}",
        ranking="data/results/heads/{model}/ranking.parquet",
        teacher="data/distill/{model}/teacher.safetensors",
        tasks=list(TASK_FILES.values()),
    output:
        "data/results/hybrid/{model}/swap.parquet",
    params:
        max_items=HYBRID["eval_items"],
        batch_size=config["eval"]["batch_size"],
        dtype=config["dtype"],
        code=_hybrid_code(),
    log:
        "data/logs/hybrid_swap/{model}.log",
    benchmark:
        "data/benchmarks/hybrid_swap/{model}.tsv"
    threads: 2
    resources:
        mem_mb=6000,
        runtime=120,
    script:
        "../workflow_scripts/distill.py"


rule hybrid_memory:
    input:
        model="data/models/{model}",
        students=lambda wc: expand("data/models/{model}-hybrid-{variant}", model=wc.model, variant=hybrid_variants()),
    output:
        "data/results/hybrid/{model}/memory.parquet",
    params:
        memory=HYBRID["memory"],
        dtype=config["dtype"],
        code=_hybrid_code(),
    log:
        "data/logs/hybrid_memory/{model}.log",
    benchmark:
        "data/benchmarks/hybrid_memory/{model}.tsv"
    threads: 2
    resources:
        mem_mb=6000,
        runtime=60,
    script:
        "../workflow_scripts/distill.py"


rule hybrid_answer_rows:
    input:
        model="data/models/{model}-hybrid-{variant}",
        tasks=list(TASK_FILES.values()),
    output:
        "data/results/hybrid/{model}/answer-rows-{variant}.parquet",
    params:
        max_items=HYBRID["eval_items"],
        batch_size=config["eval"]["batch_size"],
        dtype=config["dtype"],
        code=code_version("gna_masking", "gather_aggregate", "heads", "hybrid", "ssm", "scoring", "stack", "packing",
                          "models", "io"),
    log:
        "data/logs/hybrid_answer_rows/{model}-{variant}.log",
    benchmark:
        "data/benchmarks/hybrid_answer_rows/{model}-{variant}.tsv"
    threads: 2
    resources:
        mem_mb=6000,
        runtime=120,
    script:
        "../workflow_scripts/distill.py"
