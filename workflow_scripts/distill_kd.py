"""Rule distill_kd: build one student variant from the ranking and the aligned heads, distil it."""

from gna.core.runtime import setup
from gna.students.distill import run_distill_kd

setup(snakemake.log[0], snakemake.threads, outputs=snakemake.output)
p = snakemake.params
run_distill_kd(
    snakemake.wildcards.model,
    snakemake.input.model,
    snakemake.input.teacher,
    snakemake.input.aligned,
    snakemake.input.ranking,
    int(snakemake.wildcards.k),
    int(snakemake.wildcards.n),
    snakemake.output.student,
    snakemake.output.curve,
    snakemake.output.checkpoints,
    kd=p.kd,
    checkpoints=list(p.checkpoints),
    seed=p.seed,
    dtype=p.dtype,
)
