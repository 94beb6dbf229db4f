"""Rule hybrid_swap: the pure-SSM student scored with its most critical layer run as attention."""

from gna.core.runtime import setup
from gna.core.settings import Evaluation
from gna.students.student_evaluation import run_hybrid_swap

setup(snakemake.log[0], snakemake.threads, outputs=snakemake.output)
p = snakemake.params
run_hybrid_swap(
    snakemake.wildcards.model,
    p.variant,
    snakemake.input.model,
    snakemake.input.ranking,
    snakemake.input.teacher,
    list(snakemake.input.tasks),
    snakemake.output.summary,
    snakemake.output.answers,
    max_items=p.max_items,
    swap_items=p.swap_items,
    evaluation=Evaluation(**p.evaluation),
    teacher_summary_path=snakemake.input.teacher_summary or None,
    teacher_checks=p.teacher_checks,
    swap_dict_size=p.swap_dict_size,
)
