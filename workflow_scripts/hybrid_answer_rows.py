"""Rule hybrid_answer_rows: a hybrid's attention heads with their answer rows masked."""

from gna.core.runtime import setup
from gna.core.settings import Evaluation
from gna.students.student_masking import run_hybrid_answer_rows

setup(snakemake.log[0], snakemake.threads, outputs=snakemake.output)
p = snakemake.params
run_hybrid_answer_rows(
    snakemake.wildcards.model,
    snakemake.wildcards.variant,
    snakemake.input.model,
    list(snakemake.input.tasks),
    snakemake.output[0],
    max_items=p.max_items,
    evaluation=Evaluation(**p.evaluation),
    teacher_summary_path=snakemake.input.teacher_summary or None,
    teacher_checks=p.teacher_checks,
    answers_path=snakemake.input.answers,
    skip_at_chance=p.skip_at_chance,
)
