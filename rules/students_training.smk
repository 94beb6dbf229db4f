# The students phase, training: SSM and hybrid students by distillation stage (teacher file →
# alignment per state size → realignment and KD per student) and the recipe's ablations; what
# students_scoring.smk reads is defined here. Students are written to
# data/models/<model>-hybrid-k<heads kept>-n<state size> (names from gna.students.spec), loadable
# like any prepared model.
from gna.students.spec import (ABLATIONS, TEACHER_VARIANT, VARIANT_PATTERN, ablation_kd, checkpoint_steps,
                               parse_variant, scored_dict_size, scored_tasks, student_name, variant_name)

from gna.core.settings import StudentScoring
from gna.tasks.tables import KD_VALIDATION, PROMPT_SETS_DIR

# how the phase scores the teacher and its students (each rule passes the fields it reads)
SCORING = StudentScoring.from_config(config)
# the students are scored only once the corpus they were distilled on is known to hold no evaluation item
CORPUS_CHECK = "data/distill/corpus-check.json"
# the KV prompts of the students' checkpoint selection (hybrid.select: validation)
KD_VALIDATION_SET = f"data/tasks/{PROMPT_SETS_DIR}/{KD_VALIDATION}.parquet"
# how a student's KD checkpoint is chosen (gna.students.kd.Select)
SELECT = {
    "by": HYBRID["select"],
    "every": HYBRID["validation"]["every"],
    # scored as the evaluation scores the student: its batch and its linears' precision
    "batch_size": EVALUATION["batch_size"],
    "compute_dtype": EVALUATION["compute_dtype"],
}
# the tasks.mmlu keys that choose the evaluation subset, which the corpus stays out of
MMLU_SELECTION = {k: v for k, v in config["tasks"]["mmlu"].items() if k in ("n", "seed", "topics")}


def get_checkpoint_steps(wildcards):
    """KD step counts whose SSM parameters distill_kd keeps: the budget curve's, for its variants."""
    curve = HYBRID["budget_curve"]
    if variant_name(wildcards.k, wildcards.n) not in curve["variants"]:
        return []
    return checkpoint_steps(HYBRID["kd"]["steps"], curve["points"])


def get_teacher_summary(wildcards):
    """A student is not scored where its teacher is degenerate or at chance (chance.skip), so
    its scoring reads the teacher's."""
    if wildcards.get("variant") == TEACHER_VARIANT or not SCORING.chance.skip:
        return []
    return f"data/results/hybrid/{wildcards.model}/{TEACHER_VARIANT}.parquet"


def get_scored_model(wildcards):
    if wildcards.variant == TEACHER_VARIANT:
        return f"data/models/{wildcards.model}"
    return f"data/models/{student_name(wildcards.model, wildcards.variant)}"


wildcard_constraints:
    variant=f"{TEACHER_VARIANT}|{VARIANT_PATTERN}",
    ablation="|".join(ABLATIONS),
    k=r"\d+",
    n=r"\d+",


rule distill_teacher:
    input:
        model="data/models/{model}",
        mmlu=get_mmlu_file,
    output:
        teacher="data/distill/{model}/teacher.safetensors",
    params:
        settings={
            "corpus": HYBRID["corpus"],
            "top_k": HYBRID["top_k_logits"],
            "seed": HYBRID["seed"],
            "mmlu": MMLU_SELECTION,
            "template": config["tasks"]["kv_retrieval"]["template"],
            "evaluation": EVALUATION_UNBATCHED,
        },
        code=code_of("distill_teacher"),
    log:
        "data/logs/distill_teacher/{model}.log",
    benchmark:
        "data/benchmarks/distill_teacher/{model}.tsv"
    threads: 2
    resources:
        mem_mb=job_mem_mb("distill_teacher"),
        runtime=60,
    script:
        "../workflow_scripts/distill_teacher.py"


# Model-free and apart from the teacher file: an edit of the evaluation tasks reruns this check
# (and the scoring that reads its result), never the distillation.
rule distill_corpus_check:
    input:
        mmlu=get_mmlu_file,
        kv="data/tasks/kv_retrieval.parquet",
        validation=KD_VALIDATION_SET,
    output:
        check=CORPUS_CHECK,
    params:
        settings={
            "corpus": HYBRID["corpus"],
            "seed": HYBRID["seed"],
            "mmlu": MMLU_SELECTION,
            "template": config["tasks"]["kv_retrieval"]["template"],
        },
        code=code_of("distill_corpus_check"),
    log:
        "data/logs/distill_corpus_check.log",
    benchmark:
        "data/benchmarks/distill_corpus_check/all.tsv"
    threads: 1
    resources:
        mem_mb=2000,
        runtime=30,
    script:
        "../workflow_scripts/distill_corpus_check.py"


rule distill_align:
    input:
        model="data/models/{model}",
        teacher="data/distill/{model}/teacher.safetensors",
    output:
        weights="data/distill/{model}/align-n{n}.safetensors",
        curve="data/distill/{model}/align-n{n}.parquet",
        heads="data/distill/{model}/align-n{n}-heads.parquet",
    params:
        settings=lambda wildcards: {
            "model": wildcards.model,
            "state_size": int(wildcards.n),
            "align": HYBRID["align"],
            "seed": HYBRID["seed"],
            "dtype": config["dtype"],
        },
        code=code_of("distill_align"),
    log:
        "data/logs/distill_align/{model}-n{n}.log",
    benchmark:
        "data/benchmarks/distill_align/{model}-n{n}.tsv"
    threads: 2
    resources:
        mem_mb=job_mem_mb("distill_align"),
        runtime=240,
    script:
        "../workflow_scripts/distill_align.py"


rule distill_kd:
    input:
        model="data/models/{model}",
        teacher="data/distill/{model}/teacher.safetensors",
        aligned="data/distill/{model}/align-n{n}.safetensors",
        ranking="data/results/heads/{model}/ranking.parquet",
        validation=KD_VALIDATION_SET if HYBRID["select"] == "validation" else [],
    output:
        student=directory("data/models/" + student_name("{model}", variant_name("{k}", "{n}"))),
        curve="data/distill/{model}/kd-" + variant_name("{k}", "{n}") + ".parquet",
        validation_curve="data/distill/{model}/kd-" + variant_name("{k}", "{n}") + "-validation.parquet",
        changes="data/distill/{model}/kd-" + variant_name("{k}", "{n}") + "-changes.parquet",
        checkpoints="data/distill/{model}/kd-" + variant_name("{k}", "{n}") + "-checkpoints.safetensors",
    params:
        settings=lambda wildcards: {
            "model": wildcards.model,
            "variant": variant_name(wildcards.k, wildcards.n),
            "kd": HYBRID["kd"],
            "realign": HYBRID["realign"],
            "checkpoints": get_checkpoint_steps(wildcards),
            "seed": HYBRID["seed"],
            "select": SELECT,
            "dtype": config["dtype"],
        },
        code=code_of("distill_kd"),
    log:
        "data/logs/distill_kd/{model}-k{k}-n{n}.log",
    benchmark:
        "data/benchmarks/distill_kd/{model}-k{k}-n{n}.tsv"
    threads: 2
    resources:
        mem_mb=job_mem_mb("distill_kd"),
        runtime=240,
    script:
        "../workflow_scripts/distill_kd.py"


# the ablations that train as long as the student choose their KD checkpoint as it does (at a
# budget of the curve, hybrid.ablation.kd_steps, they are compared with that checkpoint: none)
ABLATION_SELECT = SELECT if HYBRID["select"] == "validation" and HYBRID["ablation"].get("kd_steps") is None else None


rule hybrid_ablation:
    input:
        model="data/models/{model}",
        teacher="data/distill/{model}/teacher.safetensors",
        aligned=f"data/distill/{{model}}/align-n{parse_variant(HYBRID['ablation']['variant'])[1]}.safetensors",
        ranking="data/results/heads/{model}/ranking.parquet",
        task="data/tasks/kv_retrieval.parquet",
        corpus_check=CORPUS_CHECK,
        validation=KD_VALIDATION_SET if ABLATION_SELECT else [],
    output:
        ablation="data/results/hybrid/{model}/ablation-{ablation}.parquet",
    params:
        settings=lambda wildcards: {
            "model": wildcards.model,
            "ablation": wildcards.ablation,
            "variant": HYBRID["ablation"]["variant"],
            "recipe": {"align": HYBRID["align"], "realign": HYBRID["realign"], "kd": ablation_kd(HYBRID),
                       "align_windows": HYBRID["corpus"]["align_windows"], "seed": HYBRID["seed"]},
            "scoring": SCORING.as_params("dict_size", "degeneracy_items", "evaluation"),
            "select": ABLATION_SELECT,
        },
        code=code_of("hybrid_ablation"),
    log:
        "data/logs/hybrid_ablation/{model}-{ablation}.log",
    benchmark:
        "data/benchmarks/hybrid_ablation/{model}-{ablation}.tsv"
    threads: 2
    resources:
        mem_mb=job_mem_mb("hybrid_ablation"),
        runtime=240,
    script:
        "../workflow_scripts/hybrid_ablation.py"
