"""Rule hybrid_ablation: one student trained with one ingredient of the distillation recipe removed, scored."""

from gna.core.runtime import setup
from gna.core.settings import Evaluation
from gna.students.recipe import run_hybrid_ablation

setup(snakemake.log[0], snakemake.threads, outputs=snakemake.output)
p = snakemake.params
i = snakemake.input
run_hybrid_ablation(
    snakemake.wildcards.model,
    snakemake.wildcards.ablation,
    p.variant,
    i.model,
    i.teacher,
    i.aligned,
    i.ranking,
    i.task,
    snakemake.output[0],
    align=p.align,
    kd=p.kd,
    align_windows=p.align_windows,
    seed=p.seed,
    dict_size=p.dict_size,
    swap_items=p.swap_items,
    evaluation=Evaluation(**p.evaluation),
)
