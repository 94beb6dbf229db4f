"""Rule hybrid_budget: one student scored after increasing amounts of distillation (its KD checkpoints)."""

from gna.core.runtime import setup
from gna.core.settings import Evaluation
from gna.students.student_evaluation import run_hybrid_budget

setup(snakemake.log[0], snakemake.threads, outputs=snakemake.output)
p = snakemake.params
run_hybrid_budget(
    snakemake.wildcards.model,
    snakemake.wildcards.variant,
    snakemake.input.model,
    snakemake.input.checkpoints,
    snakemake.input.teacher,
    snakemake.input.task,
    snakemake.output[0],
    dict_size=p.dict_size,
    swap_items=p.swap_items,
    evaluation=Evaluation(**p.evaluation),
    summary_path=snakemake.input.summary,
    answers_path=snakemake.input.answers,
)
