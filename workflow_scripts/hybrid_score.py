"""Rule hybrid_score: task scores, per-item answers and held-out perplexity of the teacher or one student."""

from gna.core.runtime import setup
from gna.core.settings import Evaluation
from gna.students.student_evaluation import run_hybrid_score

setup(snakemake.log[0], snakemake.threads, outputs=snakemake.output)
p = snakemake.params
run_hybrid_score(
    snakemake.wildcards.model,
    snakemake.wildcards.variant,
    snakemake.input.model,
    snakemake.input.teacher,
    list(snakemake.input.tasks),
    snakemake.output.summary,
    snakemake.output.answers,
    max_items=p.max_items,
    swap_items=p.swap_items,
    evaluation=Evaluation(**p.evaluation),
    baseline_paths=list(snakemake.input.baseline),
    teacher_summary_path=snakemake.input.teacher_summary or None,
    teacher_checks=p.teacher_checks,
    kv_dict_size=p.kv_dict_size,
    swap_dict_size=p.swap_dict_size,
)
