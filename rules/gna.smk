# Gather-and-Aggregate: attention maps and role scores of the heads (attention models).


def get_teacher_roles(wildcards):
    """A student draws the maps of its teacher's heads (the teacher's G&A heads included): its
    teacher's roles table; none for a teacher."""
    if wildcards.model in GNA_STUDENTS:
        return [f"data/results/gna/{teacher_of(wildcards.model)}/roles.parquet"]
    return []


rule gna_roles:
    wildcard_constraints:
        model=_alternation(GNA_MODELS),
    input:
        model="data/models/{model}",
        ranking=get_ranking,
        teacher_roles=get_teacher_roles,
        mmlu_letter=["data/tasks/mmlu_letter.parquet"] if "letter" in config["tasks"]["mmlu"]["formats"] else [],
        prompts="data/tasks/prompts/gna_roles.parquet",
        map_prompt="data/tasks/prompts/gna_map.parquet",
    output:
        roles="data/results/gna/{model}/roles.parquet",
        maps="data/results/gna/{model}/maps.parquet",
    params:
        settings=lambda wc: {
            "model": wc.model,
            "gna": {k: config["gna"][k] for k in ("gather_min", "aggregate_min", "map_heads")},
            "evaluation": EVALUATION_UNBATCHED,
        },
        code=code_of("gna_roles"),
    log:
        "data/logs/gna_roles/{model}.log",
    benchmark:
        "data/benchmarks/gna_roles/{model}.tsv"
    threads: 2
    resources:
        mem_mb=job_mem_mb("gna_roles"),
        runtime=60,
    script:
        "../workflow_scripts/gna_roles.py"


def get_masking_scores(wildcards):
    """The model's per-item scores on the masking's knowledge and choice tables, read for condition
    (a): a teacher's baseline; a student's own answers (hybrid_score), where it is scored on those
    tasks (hybrid.knowledge_heads_kept), else it scores them itself."""
    tasks = [t for t in ("mmlu_cloze", "facts_cloze", "mmlu_letter", "facts_choice") if t in TASKS]
    if wildcards.model in GNA_STUDENTS:
        teacher, variant = split_student_name(wildcards.model)
        knowledge = [t for t in tasks if t in scored_tasks(HYBRID, variant, TASKS)]
        return [f"data/results/hybrid/{teacher}/answers/{variant}.parquet"] if knowledge else []
    return expand("data/results/baseline/{model}/{task}.items.parquet", model=wildcards.model, task=tasks)


rule gna_masking:
    wildcard_constraints:
        model=_alternation(GNA_MODELS),
    # roles: students mask their teacher's Gather and Aggregate heads: the same heads, now SSM or kept attention;
    # knowledge (cloze) tables get (a) and (b); choice (multiple-choice) ones all three, option lines as segments;
    # scores: condition (a) on those tables is a teacher's baseline: read, not scored again
    input:
        model="data/models/{model}",
        roles=lambda wc: f"data/results/gna/{teacher_of(wc.model)}/roles.parquet",
        knowledge=lambda wc: task_files([t for t in ("mmlu_cloze", "facts_cloze") if t in TASKS], wc.model),
        choice=lambda wc: task_files([t for t in ("mmlu_letter", "facts_choice") if t in TASKS], wc.model),
        scores=get_masking_scores,
        prompts="data/tasks/prompts/gna_masking.parquet",
    output:
        summary="data/results/gna/{model}/masking.parquet",
        comparisons="data/results/gna/{model}/masking.comparisons.parquet",
    params:
        settings=lambda wc: {
            "model": wc.model,
            "gna": {k: config["gna"][k] for k in ("knowledge_items", "mmlu_min_acc")},
            "chance": CHANCE,
            "evaluation": EVALUATION,
        },
        code=code_of("gna_masking"),
    log:
        "data/logs/gna_masking/{model}.log",
    benchmark:
        "data/benchmarks/gna_masking/{model}.tsv"
    threads: 2
    resources:
        mem_mb=job_mem_mb("gna_masking"),
        runtime=60,
    script:
        "../workflow_scripts/gna_masking.py"
