"""Rule distill_align: fit every SSM head of one state size to its teacher attention head."""

from gna.core.runtime import setup
from gna.core.settings import Files
from gna.students.alignment import run_distill_align

setup(snakemake.log[0], snakemake.threads, outputs=snakemake.output)
p = snakemake.params
run_distill_align(
    snakemake.wildcards.model,
    int(snakemake.wildcards.n),
    Files.of(snakemake.input),
    Files.of(snakemake.output),
    align=p.align,
    seed=p.seed,
    dtype=p.dtype,
)
